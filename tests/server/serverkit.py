"""Helpers for the server tests (imported as `serverkit`): configs, apps in memory, real HTTP servers."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio

from mcpipe.config import Config, parse_config
from mcpipe.gateway import AuditLog
from mcpipe.server import App, open_app, serve_http
from mcpipe.tools import ToolContext, ToolRegistry, ToolResult

DOWNSTREAM = str(Path(__file__).with_name("downstream_server.py"))
EVERYTHING = str(Path(__file__).parent.parent / "conformance" / "everything_server.py")
"""The conformance suite's everything-server, written with the SDK (resources, prompts, logging, ...)."""
ERAS = ["2026-07-28", "legacy"]
"""The two protocol eras: a modern version pin (stateless), and the 2025-11-25 initialize handshake."""


def make_config(environ: dict[str, str] | None = None, **doc: Any) -> Config:
    """A config from keyword sections; no audit file unless ``audit`` is given."""
    doc.setdefault("audit", {"enabled": False})
    return parse_config(json.dumps(doc), "json", environ=environ or {})


def stdio_downstream(**extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [DOWNSTREAM], **extra}


def everything_downstream(**extra: Any) -> dict[str, Any]:
    """The everything-server as a stdio downstream."""
    return {"command": sys.executable, "args": [EVERYTHING], **extra}


class WatchedAudit(AuditLog):
    """Audit records in memory, with a way to wait (event-driven) until they satisfy a condition."""

    def __init__(self) -> None:
        super().__init__(None, keep=True)
        self._changed = trio.Event()

    def write(self, record: dict[str, Any]) -> None:
        super().write(record)
        self._changed.set()
        self._changed = trio.Event()

    async def until(self, predicate: Any) -> list[dict[str, Any]]:
        while not predicate(self.records):
            await self._changed.wait()
        return self.records  # type: ignore[return-value]


test_tools = ToolRegistry()


@test_tools.tool
async def slow(seconds: float, ctx: ToolContext) -> str:
    """Sleep, then answer (for calls in flight)."""
    await trio.sleep(seconds)
    return "done"


@test_tools.tool
def boom() -> str:
    """Raise."""
    raise RuntimeError("kaput")


@test_tools.tool
def fail() -> ToolResult:
    """Answer a tool error."""
    return ToolResult.error("it did not work")


@asynccontextmanager
async def running(config: Config | None = None, audit: AuditLog | None = None, **kw: Any) -> AsyncIterator[App]:
    """An app with the test tools beside the built-ins."""
    async with open_app(config or make_config(), extra_sources=[test_tools], audit=audit, **kw) as app:
        yield app


@asynccontextmanager
async def http_server(app: App, **kw: Any) -> AsyncIterator[str]:
    """Serve ``app`` on a free port of 127.0.0.1; yields the MCP URL; stops gracefully on exit."""
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(partial(serve_http, app, host="127.0.0.1", port=0, shutdown_trigger=stop.wait, **kw))
        try:
            yield url
        finally:
            stop.set()


@test_tools.tool
async def hang(ctx: ToolContext) -> str:
    """Report that it started, then run for a minute (a call in flight)."""
    await ctx.report_progress(0.5, 1, "started")
    await trio.sleep(60)
    return "finished"


def bearer_client(url: str, token: str | None, mode: str = "auto") -> Any:
    """An SDK Client for ``url`` sending ``Authorization: Bearer <token>``."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    @asynccontextmanager
    async def transport() -> AsyncIterator[Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        async with create_mcp_http_client(headers=headers) as http, streamable_http_client(url, http_client=http) as s:
            yield s

    return Client(transport(), mode=mode)


async def start_process(
    args: list[str], env: dict[str, str] | None = None, marker: str = "serving MCP at ", stream: str = "stderr"
) -> tuple[trio.Process, str]:
    """Start a server process and read its ``stream`` up to the line that names its URL (after ``marker``)."""
    import os
    import subprocess

    env = {**os.environ, **(env or {})}
    pipes = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    pipes[stream] = subprocess.PIPE
    proc = await trio.lowlevel.open_process(args, env=env, **pipes)
    buf = b""
    out = proc.stderr if stream == "stderr" else proc.stdout
    assert out is not None
    needle = marker.encode() or b"\n"
    while needle not in buf:
        chunk = await out.receive_some()
        if not chunk:
            raise RuntimeError(f"server exited before listening: {buf.decode(errors='replace')}")
        buf += chunk
    line = (buf.split(needle, 1)[1] if marker else buf).split(b"\n", 1)[0]
    return proc, line.decode().strip()


BLOCKED: dict[str, trio.Event] = {}
"""Events the ``block`` tool sets when a call with that tag has started (create them in the test)."""


@test_tools.tool
async def block(tag: str) -> str:
    """Say (through ``BLOCKED[tag]``) that the call started, then run for a minute."""
    BLOCKED.setdefault(tag, trio.Event()).set()
    await trio.sleep(60)
    return "unblocked"
