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
ERAS = ["2026-07-28", "legacy"]
"""The two protocol eras: a modern version pin (stateless), and the 2025-11-25 initialize handshake."""


def make_config(environ: dict[str, str] | None = None, **doc: Any) -> Config:
    return parse_config(json.dumps(doc), "json", environ=environ or {})


def stdio_downstream(**extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [DOWNSTREAM], **extra}


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
    async with open_app(config or Config(), extra_sources=[test_tools], audit=audit, **kw) as app:
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
