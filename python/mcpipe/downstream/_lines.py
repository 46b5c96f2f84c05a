"""A linear line reader under the SDK's stdio client (issue 9).

The SDK's stdio client reads a server's stdout in chunks of at most 64 KiB and splits
``(buffer + chunk)`` on every chunk, so a line of n bytes costs n²/64 KiB of copying: a 32 MiB result
took about 10 s (4 MiB 0.2 s, 16 MiB 2.3 s; ``benches/test_bench_stdio_lines.py``). :class:`LineChunks`
hands the SDK text that ends at a line end, gathered in a list until one arrives, so its split runs once
per line and reading a line costs its length. A line past :data:`MAX_LINE_CHARS` breaks the connection
(the downstream is reconnected) instead of growing without bound.

A line answering ``tools/list`` is cut to the first ``ListingCap.max_items`` tools before the SDK parses it
(:class:`ListingCap`, issue 27: 100 000 tools were parsed and validated whole before mcpipe kept 1000); the
same cap runs on an HTTP downstream's answer as it streams (``mcpipe.downstream``).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import InitVar, dataclass, field

import anyio
from anyio.streams.text import TextReceiveStream

from mcpipe._core import ArrayCap

__all__ = ["LISTING_CAP", "MAX_LINE_CHARS", "LineChunks", "ListingCap", "install"]

MAX_LINE_CHARS = 256 * 1024 * 1024
"""The longest line (one JSON-RPC message) read from a stdio downstream."""


class ListingCap:
    """How many tools one ``tools/list`` answer of a downstream keeps as it is read, and how many the last
    answer cut had (``seen``: the warning says how many were left out)."""

    def __init__(self, max_items: int) -> None:
        self.max_items = max_items
        self.seen = 0

    def cutter(self) -> ArrayCap:
        return ArrayCap(self.max_items)

    def note(self, cap: ArrayCap) -> None:
        if cap.total > self.max_items:
            self.seen = cap.total

    def cut_line(self, line: str) -> str:
        """One JSON-RPC message (a line), its ``result.tools`` cut."""
        cap = self.cutter()
        out = cap.feed(line.encode()).decode()
        self.note(cap)
        return out


LISTING_CAP: ContextVar[ListingCap | None] = ContextVar("mcpipe_listing_cap", default=None)
"""The cap of the downstream whose transport is being opened (read when its stdout reader starts)."""


@dataclass(eq=False)
class LineChunks(TextReceiveStream):
    """A :class:`TextReceiveStream` whose every chunk ends at a line end (but the last, at EOF)."""

    encoding: InitVar[str] = "utf-8"
    errors: InitVar[str] = "strict"
    _pending: list[str] = field(init=False, default_factory=list)
    _pending_chars: int = field(init=False, default=0)
    _cap: ListingCap | None = field(init=False, default_factory=LISTING_CAP.get)

    async def receive(self) -> str:
        text = await self._receive()
        if self._cap is not None and '"tools"' in text:
            # Split where the SDK splits, at "\n" only (a JSON string may hold U+2028 and such raw).
            text = "\n".join(self._cap.cut_line(line) if '"tools"' in line else line for line in text.split("\n"))
        return text

    async def _receive(self) -> str:
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
    """Make the SDK's stdio client read through :class:`LineChunks` (idempotent; the SDK's stdio client is
    imported here, by the first stdio server connected)."""
    import mcp.client.stdio

    mcp.client.stdio.TextReceiveStream = LineChunks  # type: ignore[misc]
