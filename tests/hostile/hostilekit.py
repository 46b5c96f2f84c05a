"""Helpers of the hostile-input tests (imported as ``hostilekit``): attack specs, a real HTTP server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import trio

from mcpipe.config import Config, parse_config
from mcpipe.server import App, open_app, serve_http

V = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}}


def nested(depth: int, leaf: Any = 1) -> Any:
    """``{"a": {"a": ... leaf}}``, ``depth`` objects deep (built without recursion)."""
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


def nested_text(depth: int) -> str:
    """The JSON text of ``nested(depth)`` (``json.dumps`` would hit the recursion limit)."""
    return '{"a":' * depth + "1" + "}" * depth


def doubling_spec(size: int = 1_000_000, rounds: int = 8) -> dict[str, Any]:
    """The issue's attack: a ``size``-byte var doubled by ``rounds`` echo steps (256 MB after 8)."""
    steps = [{"id": "s1", "tool": "echo", "args": {"v": "${vars.v}${vars.v}"}}]
    for i in range(2, rounds + 1):
        ref = f"${{steps.s{i - 1}.structured.v}}"
        steps.append({"id": f"s{i}", "tool": "echo", "args": {"v": ref + ref}})
    return {"vars": {"v": "x" * size}, "steps": steps}


def make_config(**doc: Any) -> Config:
    doc.setdefault("audit", {"enabled": False})
    return parse_config(json.dumps(doc), "json", environ={})


def call(name: str, arguments: Any, rid: int = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments, "_meta": META},
    }


def headers(name: str) -> dict[str, str]:
    return {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": V,
        "mcp-method": "tools/call",
        "mcp-name": name,
    }


def result_of(text: str, content_type: str) -> Any:
    """The JSON-RPC message of a response (the last ``data:`` line of an SSE stream)."""
    if content_type.startswith("text/event-stream"):
        text = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")][-1]
    return json.loads(text)


@asynccontextmanager
async def http_app(config: Config | None = None, **kw: Any) -> AsyncIterator[str]:
    """An app served on a free port of 127.0.0.1; yields the MCP URL."""
    stop = trio.Event()
    async with open_app(config or make_config()) as app, trio.open_nursery() as nursery:
        url = await nursery.start(partial(_serve, app, stop, kw))
        try:
            yield url
        finally:
            stop.set()


async def _serve(app: App, stop: trio.Event, kw: dict[str, Any], task_status: Any) -> None:
    await serve_http(app, host="127.0.0.1", port=0, shutdown_trigger=stop.wait, task_status=task_status, **kw)
