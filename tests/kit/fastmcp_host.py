"""A server written with the ``fastmcp`` package, with ``mcp_pipe`` attached: the host of the FastMCP tests.

Its tools, its middleware and its auth are FastMCP's own: ``forecast`` (sync), ``shout`` (async; FastMCP
middleware refuses the text ``forbidden``), ``wait`` (async, sleeps, for parallel steps), ``secret`` (only for
callers with the ``admin`` scope), and ``calls_seen``, which answers the tool names FastMCP's middleware saw
called, in order.

Run as a process: ``python fastmcp_host.py stdio|http asyncio|trio [PORT]``. Over HTTP, FastMCP's bearer auth
(``StaticTokenVerifier``) admits the tokens ``reader`` (scope ``read``) and ``admin`` (``read``, ``admin``).
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import anyio.lowlevel
from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server.auth import require_scopes
from fastmcp.server.auth.providers.jwt import StaticTokenVerifier
from fastmcp.server.middleware import Middleware, MiddlewareContext

from kit.meeting import Meeting
from mcpipe.server import attach

TOKENS = {
    "reader": {"client_id": "reader", "scopes": ["read"]},
    "admin": {"client_id": "admin", "scopes": ["read", "admin"]},
}


class Recorder(Middleware):
    """FastMCP middleware: records every tool call it sees, and refuses ``shout`` of ``forbidden``."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def on_call_tool(self, context: MiddlewareContext[Any], call_next: Any) -> Any:
        message = context.message
        if message.name != "calls_seen":
            self.seen.append(message.name)
        if message.name == "shout" and (message.arguments or {}).get("text") == "forbidden":
            raise ToolError("refused by the host's middleware")
        return await call_next(context)


def make_app(*, auth: bool = False) -> FastMCP[Any]:
    """The FastMCP server with its tools and middleware, ``mcp_pipe`` attached."""
    recorder = Recorder()
    app: FastMCP[Any] = FastMCP(
        "fastmcp-host", middleware=[recorder], auth=StaticTokenVerifier(tokens=TOKENS) if auth else None
    )

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
        """Sleep ``ms`` milliseconds; then stay until ``together`` waits were in at once (at most 10 s); ``met``:
        how many were."""
        return await meeting.wait(ms, together)

    @app.tool(auth=require_scopes("admin"))
    def secret() -> str:
        """Only for admins."""
        return "the admin's secret"

    @app.tool
    def calls_seen() -> dict[str, list[str]]:
        """The tools FastMCP's middleware saw called, in order."""
        return {"calls": list(recorder.seen)}

    attach(app)
    return app


async def _serve(transport: str, port: int) -> None:
    if transport == "stdio":
        await make_app().run_stdio_async(show_banner=False, log_level="warning")
        return
    app = make_app(auth=True)
    if anyio.get_current_task() and _on_trio():
        from hypercorn.config import Config
        from hypercorn.trio import serve

        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        config.loglevel = "WARNING"
        await serve(app.http_app(path="/mcp"), config)
    else:
        await app.run_http_async(show_banner=False, host="127.0.0.1", port=port, path="/mcp", log_level="warning")


def _on_trio() -> bool:
    import sniffio

    return sniffio.current_async_library() == "trio"


if __name__ == "__main__":
    transport, backend = sys.argv[1], sys.argv[2]
    anyio.run(_serve, transport, int(sys.argv[3]) if len(sys.argv) > 3 else 0, backend=backend)
