"""Serving over stdio: one client, the process's stdin and stdout, until stdin closes or a signal.

The SDK's ``stdio_server`` reads stdin in a worker thread, which a cancellation cannot interrupt, so a
SIGTERM would wait for the client to close stdin. On POSIX mcpipe hands it trio streams on the standard
descriptors instead (non-blocking, cancellable), after moving them aside the way the SDK does: while
serving, fd 0 reads the null device and fd 1 writes to stderr, so stray output cannot corrupt the wire.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
from mcp.server.stdio import stdio_server

from mcpipe.server._app import App
from mcpipe.server._http import signalled

__all__ = ["serve_stdio"]

_log = logging.getLogger("mcpipe.stdio")


class _Lines:
    """Lines of text from a trio stream (what the SDK's stdio transport iterates)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._buf = b""

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        while b"\n" not in self._buf:
            chunk = await self._stream.receive_some(65536)
            if not chunk:
                if not self._buf:
                    raise StopAsyncIteration
                line, self._buf = self._buf, b""
                return line.decode("utf-8", "replace")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode("utf-8", "replace") + "\n"


class _Writer:
    """Text out to a trio stream (what the SDK's stdio transport writes to)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def write(self, text: str) -> None:
        await self._stream.send_all(text.encode())

    async def flush(self) -> None:
        return None


@asynccontextmanager
async def _standard_streams() -> AsyncIterator[tuple[Any, Any]]:
    wire_in, wire_out = os.dup(0), os.dup(1)
    saved_in, saved_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    reader, writer = trio.lowlevel.FdStream(wire_in), trio.lowlevel.FdStream(wire_out)
    try:
        async with reader, writer:
            yield _Lines(reader), _Writer(writer)
    finally:
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)


GRACE_S = 2.0
"""How long calls in flight get to answer ``CANCELLED`` after SIGINT/SIGTERM."""


async def serve_stdio(app: App, *, handle_signals: bool = True) -> None:
    """Serve ``app`` on stdin/stdout (both protocol eras: the client's first request decides).

    Returns when the client closes stdin, or on SIGINT/SIGTERM (at once, even while stdin stays open).
    """
    async with trio.open_nursery() as nursery:
        if handle_signals:

            async def stop_on_signal() -> None:
                await signalled(_log)
                # Calls in flight answer CANCELLED before the streams close (bounded: a stuck write does
                # not hold the shutdown).
                app.handlers.shut_down()
                with trio.move_on_after(GRACE_S):
                    await app.handlers.idle()
                    from trio.testing import wait_all_tasks_blocked  # at shutdown only: slow to import

                    await wait_all_tasks_blocked(0.01)  # their answers written out
                nursery.cancel_scope.cancel()

            nursery.start_soon(stop_on_signal)
        if sys.platform == "win32":  # no non-blocking pipes: the SDK's threaded transport
            async with stdio_server() as (read, write):
                await app.server.run(read, write, app.server.create_initialization_options())
        else:
            async with _standard_streams() as (lines, out), stdio_server(lines, out) as (read, write):
                await app.server.run(read, write, app.server.create_initialization_options())
        nursery.cancel_scope.cancel()
