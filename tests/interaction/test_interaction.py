"""Pipelines that ask the client, served by the real server and called with the SDK's Client (real
elicitation, sampling and roots callbacks), in memory and over HTTP, in both protocol eras.

Every scenario runs four ways: {2026-07-28 (suspend and resume), 2025-11-25 (ask over the session)} x
{in memory, HTTP on 127.0.0.1}. Side-effecting steps count their calls, so a resume that ran a finished
step again would show.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import mcp_types as t
import pytest
import trio
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from mcp_types.jsonrpc import MISSING_REQUIRED_CLIENT_CAPABILITY

from mcpipe.config import parse_config
from mcpipe.server import App, open_app, serve_http
from mcpipe.tools import ToolRegistry

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

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
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(partial(serve_http, app, host="127.0.0.1", port=0, shutdown_trigger=stop.wait))
        try:
            async with Client(url, mode=era, **callbacks) as c:
                yield c
        finally:
            stop.set()


both = pytest.mark.parametrize("era", ERAS)
anywhere = pytest.mark.parametrize("transport", TRANSPORTS)


@both
@anywhere
async def test_confirm_then_call_a_tool(era: str, transport: str) -> None:
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, era, transport, answers) as c:
            r = await c.call_tool("confirm_pay", {"amount": 5})
    assert not r.is_error, r.content
    assert r.structured_content == {
        "confirm": {"action": "accept", "content": {"ok": True}},
        "paid": {"charged": 5, "n": 1},
    }
    assert answers.elicited == ["Charge 5?"]
    assert CHARGES == [5]


@both
@anywhere
async def test_a_declined_question_is_an_output_a_gate_can_test(era: str, transport: str) -> None:
    answers = Answers("decline")
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, era, transport, answers) as c:
            r = await c.call_tool("confirm_pay", {"amount": 5})
    assert r.is_error
    assert "GATE_REJECTED" in r.content[0].text and "the user did not accept" in r.content[0].text
    assert CHARGES == []


@both
@anywhere
async def test_a_resume_never_runs_a_finished_step_again(era: str, transport: str) -> None:
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, era, transport, answers) as c:
            r = await c.call_tool("prep_then_pay", {})
    assert not r.is_error, r.content
    assert r.structured_content == {"hold": 1, "pay": 2}
    assert CHARGES == [1, 2]


@both
@anywhere
async def test_sampling_twice_in_a_row(era: str, transport: str) -> None:
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, era, transport, answers) as c:
            r = await c.call_tool("twice", {})
    assert not r.is_error, r.content
    assert r.structured_content == {"draft": "reply 1", "polish": "reply 2"}
    assert [block.text for [block] in answers.sampled] == ["Write a line", "Polish: reply 1"]


@both
@anywhere
async def test_gather_asks_three_questions_in_one_round(era: str, transport: str) -> None:
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, era, transport, answers) as c:
            r = await c.call_tool("collect", {})
    assert not r.is_error, r.content
    out = r.structured_content
    assert out is not None
    assert out["confirm"] == {"action": "accept", "content": {"ok": True}}
    assert out["summary"]["text"] == "reply 1" and out["summary"]["model"] == "test-model"
    assert out["where"] == {"roots": [{"uri": "file:///work", "name": "work"}]}
    assert (len(answers.elicited), len(answers.sampled), answers.rooted) == (1, 1, 1)
    assert CHARGES == [7]


@both
@anywhere
async def test_gather_inside_a_parallel_group_leaves_its_sibling_alone(era: str, transport: str) -> None:
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, era, transport, answers) as c:
            r = await c.call_tool("side_by_side", {})
    assert not r.is_error, r.content
    assert r.structured_content is not None
    assert r.structured_content["ask"]["a"]["action"] == "accept"
    assert sorted(answers.elicited) == ["A?", "B?"]
    assert CHARGES == [3, 4]


@both
@anywhere
async def test_mcp_pipe_asks_with_the_builtin_tools(era: str, transport: str) -> None:
    spec = {
        "steps": [
            {"id": "hold", "tool": "charge", "args": {"amount": 1}},
            {"id": "ok", "tool": "ask_user", "args": {"message": "Go?", "requested_schema": {"$literal": SCHEMA}}},
            {"id": "idea", "tool": "sample", "args": {"messages": "An idea about ${steps.ok.structured.action}"}},
            {"id": "where", "tool": "list_roots", "args": {}},
            {"id": "pay", "tool": "charge", "args": {"amount": 2}},
        ],
        "return": {
            "ok": {"$ref": "steps.ok.structured.action"},
            "idea": {"$ref": "steps.idea.structured.text"},
            "root": {"$ref": "steps.where.structured.roots.0.uri"},
        },
    }
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, era, transport, answers) as c:
            r = await c.call_tool("mcp_pipe", spec)
    assert not r.is_error, r.content
    assert r.structured_content is not None
    assert r.structured_content["result"] == {"ok": "accept", "idea": "reply 1", "root": "file:///work"}
    assert [block.text for [block] in answers.sampled] == ["An idea about accept"]
    assert CHARGES == [1, 2]


@anywhere
async def test_a_missing_capability_fails_the_request_with_32021_on_2026(transport: str) -> None:
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, "2026-07-28", transport, answers, list_roots_callback=None) as c:
            with pytest.raises(MCPError) as caught:
                await c.call_tool("needs_roots", {})
            skipped = await c.call_tool("roots_or_skip", {})
    assert caught.value.code == MISSING_REQUIRED_CLIENT_CAPABILITY
    assert caught.value.data == {"requiredCapabilities": {"roots": {}}}
    assert CHARGES == [9]  # the step before ran; nothing was asked
    assert skipped.structured_content == {"skipped": True}


@anywhere
async def test_a_missing_capability_fails_the_step_on_2025(transport: str) -> None:
    answers = Answers()
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, "legacy", transport, answers, list_roots_callback=None) as c:
            r = await c.call_tool("needs_roots", {})
            skipped = await c.call_tool("roots_or_skip", {})
    assert r.is_error
    assert "did not declare the `roots` capability" in r.content[0].text
    assert skipped.structured_content == {"skipped": True}


async def test_the_missing_capability_error_is_http_400() -> None:
    import httpx2

    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "needs_roots",
            "arguments": {},
            "_meta": {
                "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            },
        },
    }
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "needs_roots",
    }
    stop = trio.Event()
    with trio.fail_after(WAIT_S):
        async with served() as app, trio.open_nursery() as nursery:
            url = await nursery.start(partial(serve_http, app, host="127.0.0.1", port=0, shutdown_trigger=stop.wait))
            async with httpx2.AsyncClient() as http:
                resp = await http.post(url, json=body, headers=headers)
            stop.set()
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == MISSING_REQUIRED_CLIENT_CAPABILITY


# --- the 2026-07-28 rounds, driven by hand ---


async def first_round(c: Client, name: str, args: dict[str, Any]) -> t.InputRequiredResult:
    r = await c.session.call_tool(name, args, allow_input_required=True)
    assert isinstance(r, t.InputRequiredResult), r
    return r


def accept() -> t.ElicitResult:
    return t.ElicitResult(action="accept", content={"ok": True})


@anywhere
async def test_the_input_required_result_keys_questions_by_step_id_and_token(transport: str) -> None:
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, "2026-07-28", transport, Answers()) as c:
            single = await first_round(c, "confirm_pay", {"amount": 3})
            gathered = await first_round(c, "collect", {})
    assert single.result_type == "input_required" and single.request_state
    assert list(single.input_requests or {}) == ["confirm"]
    assert set(gathered.input_requests or {}) == {"confirm", "summary", "where"}
    assert isinstance((gathered.input_requests or {})["where"], t.ListRootsRequest)


@anywhere
async def test_tampered_and_foreign_state_is_invalid_params(transport: str) -> None:
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, "2026-07-28", transport, Answers()) as c:
            ir = await first_round(c, "confirm_pay", {"amount": 3})
            state = ir.request_state or ""
            flipped = state[:-3] + ("A" if state[-3] != "A" else "B") + state[-2:]
            for bad in (flipped, "v1.not-a-state", "plain text"):
                with pytest.raises(MCPError) as caught:
                    await c.session.call_tool(
                        "confirm_pay", {"amount": 3}, input_responses={"confirm": accept()}, request_state=bad
                    )
                assert caught.value.code == INVALID_PARAMS
                assert "Invalid requestState" in caught.value.message
            # A state resumes only the call it was minted for.
            with pytest.raises(MCPError) as other:
                await c.session.call_tool(
                    "confirm_pay", {"amount": 4}, input_responses={"confirm": accept()}, request_state=state
                )
            assert other.value.code == INVALID_PARAMS and other.value.data == {"reason": "other_call"}
    assert CHARGES == []


@anywhere
async def test_a_replayed_state_is_refused(transport: str) -> None:
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, "2026-07-28", transport, Answers()) as c:
            ir = await first_round(c, "confirm_pay", {"amount": 3})
            done = await c.session.call_tool(
                "confirm_pay", {"amount": 3}, input_responses={"confirm": accept()}, request_state=ir.request_state
            )
            assert isinstance(done, t.CallToolResult) and not done.is_error
            with pytest.raises(MCPError) as caught:
                await c.session.call_tool(
                    "confirm_pay", {"amount": 3}, input_responses={"confirm": accept()}, request_state=ir.request_state
                )
    assert caught.value.code == INVALID_PARAMS
    assert caught.value.data == {"reason": "replayed"}
    assert "already used" in caught.value.message
    assert CHARGES == [3]


@anywhere
async def test_a_retry_lacking_an_answer_is_asked_again_for_what_is_missing(transport: str) -> None:
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, "2026-07-28", transport, Answers()) as c:
            ir = await first_round(c, "collect", {})
            partial_answers: dict[str, Any] = {
                "confirm": accept(),
                "where": t.ListRootsResult(roots=[]),
                "nobody_asked": accept(),
            }
            again = await c.session.call_tool(
                "collect",
                {},
                input_responses=partial_answers,
                request_state=ir.request_state,
                allow_input_required=True,
            )
            assert isinstance(again, t.InputRequiredResult)
            assert list(again.input_requests or {}) == ["summary"]
            sample = t.CreateMessageResult(role="assistant", content=t.TextContent(type="text", text="s"), model="m")
            done = await c.session.call_tool(
                "collect", {}, input_responses={"summary": sample}, request_state=again.request_state
            )
    assert isinstance(done, t.CallToolResult) and not done.is_error
    assert done.structured_content is not None
    assert done.structured_content["confirm"]["action"] == "accept"
    assert done.structured_content["summary"]["text"] == "s"
    assert done.structured_content["where"] == {"roots": []}
    assert CHARGES == [7]


async def test_a_large_state_stays_in_the_store_behind_a_handle() -> None:
    with trio.fail_after(WAIT_S):
        async with served(interaction={"inline_max_bytes": 64}) as app:
            store = app.handlers.interactions.store
            async with client(app, "2026-07-28", "memory", Answers()) as c:
                ir = await first_round(c, "prep_then_pay", {})
                assert len(store) == 1  # the state's blob
                assert len(ir.request_state or "") < 400
                done = await c.session.call_tool(
                    "prep_then_pay", {}, input_responses={"confirm": accept()}, request_state=ir.request_state
                )
    assert isinstance(done, t.CallToolResult) and not done.is_error
    assert done.structured_content == {"hold": 1, "pay": 2}


@anywhere
async def test_questions_of_parallel_children_are_asked_in_one_round(transport: str) -> None:
    spec = {
        "steps": [
            {
                "id": "both",
                "parallel": [
                    {"id": "a", "tool": "ask_user", "args": {"message": "A?"}},
                    {"id": "b", "tool": "ask_user", "args": {"message": "B?"}},
                    {"id": "pay", "tool": "charge", "args": {"amount": 1}},
                ],
            }
        ]
    }
    with trio.fail_after(WAIT_S):
        async with served() as app, client(app, "2026-07-28", transport, Answers()) as c:
            ir = await first_round(c, "mcp_pipe", spec)
            assert set(ir.input_requests or {}) == {"both.a", "both.b"}
            assert CHARGES == [1]  # the sibling finished; it is not cancelled by the others' suspension
            done = await c.session.call_tool(
                "mcp_pipe",
                spec,
                input_responses={"both.a": accept(), "both.b": t.ElicitResult(action="decline")},
                request_state=ir.request_state,
            )
    assert isinstance(done, t.CallToolResult) and not done.is_error
    assert done.structured_content is not None
    outputs = done.structured_content["result"]
    assert outputs["a"]["action"] == "accept" and outputs["b"]["action"] == "decline"
    assert CHARGES == [1]
