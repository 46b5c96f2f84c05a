"""The in-memory :class:`~mcpipe.store.PipelineStore`: one instance's dicts and an expiry heap."""

from __future__ import annotations

import heapq
import time
from typing import Any

import trio

__all__ = ["SWEEP_INTERVAL_S", "InMemoryPipelineStore"]

SWEEP_INTERVAL_S = 30.0
"""How often the in-memory store's sweeper drops expired entries."""


class InMemoryPipelineStore:
    """The single-instance default: dicts and an expiry heap.

    Run :meth:`run` in a nursery (``await nursery.start(store.run)``) to sweep expired entries in the
    background; without it, entries are still refused once expired, they only linger in memory.

    Args:
        clock: the time source (``time.time``); tests pass their own.
        interval_s: the sweeper's period.
    """

    def __init__(self, *, clock: Any = time.time, interval_s: float = SWEEP_INTERVAL_S) -> None:
        self._clock = clock
        self.interval_s = interval_s
        self._blobs: dict[str, tuple[bytes, float]] = {}
        self._claims: dict[str, float] = {}
        self._expiries: list[tuple[float, int, str]] = []  # (expires_at, 0 blob | 1 claim, key)

    def __len__(self) -> int:
        return len(self._blobs) + len(self._claims)

    async def put(self, handle: str, blob: bytes, expires_at: float) -> None:
        await trio.lowlevel.checkpoint()
        self._blobs[handle] = (blob, expires_at)
        heapq.heappush(self._expiries, (expires_at, 0, handle))

    async def take(self, handle: str) -> bytes | None:
        await trio.lowlevel.checkpoint()
        entry = self._blobs.pop(handle, None)
        if entry is None or entry[1] <= self._clock():
            return None
        return entry[0]

    async def claim(self, state_id: str, expires_at: float) -> bool:
        await trio.lowlevel.checkpoint()
        seen = self._claims.get(state_id)
        if seen is not None and seen > self._clock():
            return False
        self._claims[state_id] = expires_at
        heapq.heappush(self._expiries, (expires_at, 1, state_id))
        return True

    async def sweep(self) -> int:
        await trio.lowlevel.checkpoint()
        return self.sweep_now()

    def sweep_now(self) -> int:
        """Drop expired entries (synchronously); answers how many went."""
        now = self._clock()
        dropped = 0
        heap = self._expiries
        while heap and heap[0][0] <= now:
            expires_at, which, key = heapq.heappop(heap)
            table: dict[str, Any] = self._blobs if which == 0 else self._claims
            current = table.get(key)
            # A key may have been put again with a later expiry: only the entry that expired goes.
            if current is not None and (current[1] if which == 0 else current) == expires_at:
                del table[key]
                dropped += 1
        return dropped

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sweep every ``interval_s`` until cancelled (start it with ``nursery.start``)."""
        task_status.started()
        while True:
            await trio.sleep(self.interval_s)
            self.sweep_now()
