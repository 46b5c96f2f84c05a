"""A server written with fastmcp 3 (on ``mcp`` 1.x), run in its own environment as mcpipe's stdio downstream.

fastmcp 3 cannot be imported beside mcpipe (it needs ``mcp`` 1.x, mcpipe ``mcp`` 2.x), so this script imports
nothing of mcpipe: ``tests/server/test_fastmcp3_downstream.py`` runs it with the Python of a separate
environment holding ``fastmcp>=3,<4``, as the ``command`` of an ``mcpServers`` entry.

Its tools: ``forecast`` (sync), ``shout`` (async; the middleware refuses the text ``forbidden``), ``wait``
(async, sleeps, for parallel steps), ``calls_seen`` (each tool call the middleware saw, in order, with its
arguments) and ``versions`` (the fastmcp and mcp versions it runs on). Run: ``python fastmcp3_server.py``.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import anyio
import anyio.lowlevel
from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server.middleware import Middleware, MiddlewareContext
from meeting import Meeting  # beside this script, which runs as one (no `kit` package on its path)

UNSEEN = {"calls_seen", "versions"}


class Recorder(Middleware):
    """FastMCP middleware: records each tool call it sees, and refuses ``shout`` of ``forbidden``."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def on_call_tool(self, context: MiddlewareContext[Any], call_next: Any) -> Any:
        message = context.message
        if message.name not in UNSEEN:
            self.seen.append({"tool": message.name, "args": dict(message.arguments or {})})
        if message.name == "shout" and (message.arguments or {}).get("text") == "forbidden":
            raise ToolError("refused by the fastmcp 3 server's middleware")
        return await call_next(context)


recorder = Recorder()
app: FastMCP[Any] = FastMCP("weather", middleware=[recorder])


@app.tool
def forecast(city: str) -> dict[str, Any]:
    """Tomorrow's forecast for a city."""
    return {"city": city, "high": 21 if city == "Lyon" else 12}


@app.tool
async def shout(text: str) -> str:
    """Upper-case the text."""
    await anyio.lowlevel.checkpoint()
    return text.upper()


meeting = Meeting()


@app.tool
async def wait(ms: int, together: int = 1) -> dict[str, int]:
    """Sleep ``ms`` milliseconds; then stay until ``together`` waits were in at once (at most 10 s); ``met``: how
    many were."""
    return await meeting.wait(ms, together)


@app.tool
def calls_seen() -> dict[str, list[dict[str, Any]]]:
    """The tool calls the middleware saw, in order, with their arguments."""
    return {"calls": list(recorder.seen)}


@app.tool
def versions() -> dict[str, str]:
    """The fastmcp and mcp versions this server runs on."""
    return {"fastmcp": version("fastmcp"), "mcp": version("mcp")}


if __name__ == "__main__":
    app.run(show_banner=False, log_level="warning")
