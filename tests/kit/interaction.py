"""The interaction scenarios' shared pieces: the side-effecting ``charge`` tool, the declared pipelines
that ask, the client's answers, and an app serving them (in memory or over HTTP)."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as t
import trio
from mcp import Client

from kit.servers import http_server
from mcpipe.config import parse_config
from mcpipe.server import App, open_app
from mcpipe.tools import ToolRegistry

ERAS = ["2026-07-28", "legacy"]
TRANSPORTS = ["memory", "http"]
WAIT_S = 20

CHARGES: list[int] = []
"""Every call of the side-effecting `charge` tool, in order."""

side_tools = ToolRegistry()


@side_tools.tool
def charge(amount: int) -> dict[str, Any]:
    """Charge an amount (a side effect: every call is recorded)."""
    CHARGES.append(amount)
    return {"charged": amount, "n": len(CHARGES)}


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}}

PIPELINES: list[dict[str, Any]] = [
    {
        "name": "confirm_pay",
        "description": "Ask, then charge.",
        "input_schema": {"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]},
        "steps": [
            {"kind": "elicitation", "id": "confirm", "message": "Charge ${args.amount}?", "requested_schema": SCHEMA},
            {
                "kind": "cel_gate",
                "id": "gate",
                "expression": "steps.confirm.output.action == 'accept'",
                "error_message": "the user did not accept",
            },
            {"kind": "tool", "id": "pay", "tool": "charge", "args": {"amount": "${args.amount}"}},
        ],
        "output": {"confirm": {"$ref": "steps.confirm.output"}, "paid": {"$ref": "steps.pay.output"}},
    },
    {
        "name": "prep_then_pay",
        "description": "A side effect, a question, a side effect.",
        "input_schema": {"type": "object", "properties": {}},
        "steps": [
            {"kind": "tool", "id": "hold", "tool": "charge", "args": {"amount": 1}},
            {"kind": "elicitation", "id": "confirm", "message": "Go on?", "requested_schema": SCHEMA},
            {"kind": "tool", "id": "pay", "tool": "charge", "args": {"amount": 2}},
        ],
        "output": {"hold": {"$ref": "steps.hold.output.n"}, "pay": {"$ref": "steps.pay.output.n"}},
    },
    {
        "name": "twice",
        "description": "Two samplings in a row, the second fed by the first.",
        "input_schema": {"type": "object", "properties": {}},
        "steps": [
            {"kind": "sampling", "id": "draft", "messages": [{"role": "user", "content": "Write a line"}]},
            {
                "kind": "sampling",
                "id": "polish",
                "messages": [{"role": "user", "content": "Polish: ${steps.draft.output.text}"}],
                "system_prompt": "You polish.",
                "max_tokens": 50,
                "model_preferences": {"intelligence_priority": 0.9},
            },
        ],
        "output": {"draft": {"$ref": "steps.draft.output.text"}, "polish": {"$ref": "steps.polish.output.text"}},
    },
    {
        "name": "collect",
        "description": "Three questions in one round.",
        "input_schema": {"type": "object", "properties": {}},
        "steps": [
            {"kind": "tool", "id": "hold", "tool": "charge", "args": {"amount": 7}},
            {
                "kind": "gather",
                "id": "inputs",
                "inputs": [
                    {
                        "kind": "elicitation",
                        "correlation_token": "confirm",
                        "message": "Sure?",
                        "requested_schema": SCHEMA,
                    },
                    {"kind": "sampling", "correlation_token": "summary", "messages": "Summarize ${steps.hold.output}"},
                    {"kind": "roots", "correlation_token": "where"},
                ],
            },
        ],
        "output": {"$ref": "steps.inputs.output"},
    },
    {
        "name": "roots_or_skip",
        "description": "Roots when the client has them.",
        "input_schema": {"type": "object", "properties": {}},
        "steps": [
            {"kind": "roots_list", "id": "roots", "skip_if_unsupported": True},
            {"kind": "value", "id": "done", "value": {"skipped": {"$ref": "steps.roots.skipped"}}},
        ],
        "output": {"$ref": "steps.done.output"},
    },
    {
        "name": "needs_roots",
        "description": "Roots, or nothing.",
        "input_schema": {"type": "object", "properties": {}},
        "steps": [
            {"kind": "tool", "id": "hold", "tool": "charge", "args": {"amount": 9}},
            {"kind": "roots_list", "id": "roots"},
        ],
        "output": {"$ref": "steps.roots.output"},
    },
    {
        "name": "collect_or_skip",
        "description": "A gather whose roots entry may be skipped.",
        "input_schema": {"type": "object", "properties": {}},
        "steps": [
            {
                "kind": "gather",
                "id": "inputs",
                "inputs": [
                    {
                        "kind": "elicitation",
                        "correlation_token": "confirm",
                        "message": "Sure?",
                        "requested_schema": SCHEMA,
                    },
                    {"kind": "roots", "correlation_token": "where", "skip_if_unsupported": True},
                ],
            },
        ],
        "output": {"$ref": "steps.inputs.output"},
    },
    {
        "name": "side_by_side",
        "description": "A gather beside a side effect, in a parallel group.",
        "input_schema": {"type": "object", "properties": {}},
        "steps": [
            {
                "kind": "parallel",
                "id": "both",
                "steps": [
                    {"kind": "tool", "id": "pay", "tool": "charge", "args": {"amount": 3}},
                    {
                        "kind": "gather",
                        "id": "ask",
                        "inputs": [
                            {"kind": "elicitation", "correlation_token": "a", "message": "A?"},
                            {"kind": "elicitation", "correlation_token": "b", "message": "B?"},
                        ],
                    },
                ],
            },
            {"kind": "tool", "id": "after", "tool": "charge", "args": {"amount": 4}},
        ],
        "output": {"ask": {"$ref": "steps.both.output.ask"}, "after": {"$ref": "steps.after.output.n"}},
    },
]


class Answers:
    """The client's side: real callbacks that answer and count."""

    def __init__(self, action: str = "accept") -> None:
        self.action = action
        self.elicited: list[str] = []
        self.sampled: list[list[Any]] = []
        self.rooted = 0

    async def elicit(self, context: Any, params: Any) -> t.ElicitResult:
        self.elicited.append(params.message)
        content = {"ok": True} if self.action == "accept" else None
        return t.ElicitResult(action=self.action, content=content)  # type: ignore[arg-type]

    async def sample(self, context: Any, params: t.CreateMessageRequestParams) -> t.CreateMessageResult:
        self.sampled.append([m.content for m in params.messages])
        n = len(self.sampled)
        return t.CreateMessageResult(
            role="assistant", content=t.TextContent(type="text", text=f"reply {n}"), model="test-model"
        )

    async def roots(self, context: Any) -> t.ListRootsResult:
        self.rooted += 1
        return t.ListRootsResult(roots=[t.Root(uri="file:///work", name="work")])

    def callbacks(self, *, roots: bool = True) -> dict[str, Any]:
        cb: dict[str, Any] = {"elicitation_callback": self.elicit, "sampling_callback": self.sample}
        if roots:
            cb["list_roots_callback"] = self.roots
        return cb


@asynccontextmanager
async def served(environ: dict[str, str] | None = None, **doc: Any) -> AsyncIterator[App]:
    CHARGES.clear()
    doc = {"audit": {"enabled": False}, "python_tools": [f"{__name__}:side_tools"], "pipelines": PIPELINES, **doc}
    async with open_app(parse_config(json.dumps(doc), "json", environ=environ or {})) as app:
        yield app


@asynccontextmanager
async def client(app: App, era: str, transport: str, answers: Answers, **kw: Any) -> AsyncIterator[Client]:
    callbacks = {**answers.callbacks(), **kw}
    if transport == "memory":
        async with Client(app.server, mode=era, **callbacks) as c:
            yield c
        return
    async with http_server(app) as url, Client(url, mode=era, **callbacks) as c:
        yield c


async def first_round(c: Client, name: str, args: dict[str, Any]) -> t.InputRequiredResult:
    r = await c.session.call_tool(name, args, allow_input_required=True)
    assert isinstance(r, t.InputRequiredResult), r
    return r


def accept() -> t.ElicitResult:
    return t.ElicitResult(action="accept", content={"ok": True})


ASKING = str(Path(__file__).resolve().parents[1] / "interaction" / "asking_server.py")
"""A downstream MCP server whose tools ask their caller (tests/interaction/asking_server.py)."""


@asynccontextmanager
async def http_asking_server() -> AsyncIterator[str]:
    """``asking_server.py`` over streamable HTTP; yields its URL (its first line of output)."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, ASKING, "--http", "0"], stdout=-1, stderr=-3, stdin=-3
    )  # PIPE, DEVNULL
    try:
        assert proc.stdout is not None
        buf = b""
        while b"\n" not in buf:
            chunk = await proc.stdout.receive_some()
            assert chunk, "the asking server exited before listening"
            buf += chunk
        yield buf.split(b"\n", 1)[0].decode().strip()
    finally:
        proc.kill()
        with trio.move_on_after(5):
            await proc.wait()
