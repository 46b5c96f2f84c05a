"""Serving over stdio: one client, the process's stdin and stdout, until stdin closes or a signal."""

from __future__ import annotations

import trio
from mcp.server.stdio import stdio_server

from mcpipe.server._app import App
from mcpipe.server._http import signalled

__all__ = ["serve_stdio"]


async def serve_stdio(app: App, *, handle_signals: bool = True) -> None:
    """Serve ``app`` on stdin/stdout (both protocol eras: the client's first request decides).

    Returns when the client closes stdin, or on SIGINT/SIGTERM.
    """
    async with trio.open_nursery() as nursery:
        if handle_signals:

            async def stop_on_signal() -> None:
                await signalled()
                nursery.cancel_scope.cancel()

            nursery.start_soon(stop_on_signal)
        async with stdio_server() as (read, write):
            await app.server.run(read, write, app.server.create_initialization_options())
        nursery.cancel_scope.cancel()
