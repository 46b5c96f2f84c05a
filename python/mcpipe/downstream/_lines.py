"""A linear line reader under the SDK's stdio client (issue 9).

The SDK's stdio client reads a server's stdout in chunks of at most 64 KiB and splits
``(buffer + chunk)`` on every chunk, so a line of n bytes costs n²/64 KiB of copying: a 32 MiB result
took about 10 s (4 MiB 0.2 s, 16 MiB 2.3 s; ``benches/test_bench_stdio_lines.py``). :class:`LineChunks`
hands the SDK text that ends at a line end, gathered in a list until one arrives, so its split runs once
per line and reading a line costs its length. A line past :data:`MAX_LINE_CHARS` breaks the connection
(the downstream is reconnected) instead of growing without bound.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field

import anyio
import mcp.client.stdio
from anyio.streams.text import TextReceiveStream

__all__ = ["MAX_LINE_CHARS", "LineChunks", "install"]

MAX_LINE_CHARS = 256 * 1024 * 1024
"""The longest line (one JSON-RPC message) read from a stdio downstream."""


@dataclass(eq=False)
class LineChunks(TextReceiveStream):
    """A :class:`TextReceiveStream` whose every chunk ends at a line end (but the last, at EOF)."""

    encoding: InitVar[str] = "utf-8"
    errors: InitVar[str] = "strict"
    _pending: list[str] = field(init=False, default_factory=list)
    _pending_chars: int = field(init=False, default=0)

    async def receive(self) -> str:
        while True:
            try:
                chunk = await super().receive()
            except anyio.EndOfStream:
                if not self._pending:
                    raise
                return self._take("")
            cut = chunk.rfind("\n") + 1
            if cut == 0:
                self._pending.append(chunk)
                self._pending_chars += len(chunk)
                if self._pending_chars > MAX_LINE_CHARS:
                    raise anyio.BrokenResourceError(f"a line longer than {MAX_LINE_CHARS} characters")
                continue
            if not self._pending and cut == len(chunk):
                return chunk
            out = self._take(chunk[:cut])
            if cut < len(chunk):
                self._pending.append(chunk[cut:])
                self._pending_chars = len(chunk) - cut
            return out

    def _take(self, head: str) -> str:
        self._pending.append(head)
        out = "".join(self._pending)
        self._pending.clear()
        self._pending_chars = 0
        return out


def install() -> None:
    """Make the SDK's stdio client read through :class:`LineChunks` (idempotent)."""
    mcp.client.stdio.TextReceiveStream = LineChunks  # type: ignore[misc]
