"""Where suspended pipelines wait: the :class:`PipelineStore` interface and the in-memory default.

A store keeps two things, both with an expiry: blobs (a suspended pipeline's state too large to travel
inline in ``requestState``, kept behind an opaque handle) and claims (the one-time ids of the states that
have been resumed, so a replayed state is refused). A shared store (Redis, a later issue) implements the
same four methods (``mcpipe.store.redis``); nothing else in the runtime knows which store it talks to.
"""

from __future__ import annotations

import heapq
import time
from typing import Any, Protocol, runtime_checkable

import trio

__all__ = [
    "MAX_STORED_BYTES",
    "MAX_STORED_STATES",
    "SWEEP_INTERVAL_S",
    "InMemoryPipelineStore",
    "PipelineStore",
    "StateTooLarge",
    "StoreUnavailable",
]

SWEEP_INTERVAL_S = 30.0
"""How often the in-memory store's sweeper drops expired entries."""

MAX_STORED_STATES = 1000
"""Default: the most suspended states the in-memory store keeps (the oldest is evicted past it)."""

MAX_STORED_BYTES = 64 * 1024 * 1024
"""Default: the most bytes of suspended states the in-memory store keeps (the oldest are evicted past it)."""


class StoreUnavailable(Exception):
    """The pipeline store cannot answer now (a shared store is unreachable); the call that needed it fails
    with this message, and a later one may succeed."""


class StateTooLarge(Exception):
    """A suspended pipeline's state larger than the whole store may hold: refused, never stored."""

    code = "LIMIT_EXCEEDED"

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the suspended pipeline's state is {size} bytes; the pipeline store keeps at most {limit}")
        self.size = size
        self.limit = limit


@runtime_checkable
class PipelineStore(Protocol):
    """Storage of suspended pipelines, shared by every instance that may resume them.

    Times are Unix seconds (``time.time()``), so instances on different hosts agree.
    """

    async def put(self, handle: str, blob: bytes, expires_at: float) -> None:
        """Keep ``blob`` under ``handle`` until ``expires_at``."""
        ...

    async def take(self, handle: str) -> bytes | None:
        """Remove and answer the blob under ``handle``; None when absent or expired (taken once)."""
        ...

    async def claim(self, state_id: str, expires_at: float) -> bool:
        """Mark a state as resumed. True the first time, False if it was claimed before (a replay);
        atomic across every instance sharing the store."""
        ...

    async def sweep(self) -> int:
        """Drop what has expired; answers how many entries went."""
        ...

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The store's background life (a sweeper, a client's connections) until cancelled; start it with
        ``nursery.start`` before use."""
        ...


class InMemoryPipelineStore:
    """The single-instance default: dicts and an expiry heap.

    Run :meth:`run` in a nursery (``await nursery.start(store.run)``) to sweep expired entries in the
    background; without it, entries are still refused once expired, they only linger in memory.

    Blobs are bounded in count and in bytes: past either bound the oldest blobs are evicted (their
    pipelines can no longer be resumed, and say so), and a blob larger than the byte bound is refused with
    :class:`StateTooLarge`. Claims are small and must outlive their state (a replay stays refused), so they
    are kept until they expire.

    Args:
        clock: the time source (``time.time``); tests pass their own.
        interval_s: the sweeper's period.
        max_states: the most blobs kept.
        max_bytes: the most bytes of blobs kept.
    """

    def __init__(
        self,
        *,
        clock: Any = time.time,
        interval_s: float = SWEEP_INTERVAL_S,
        max_states: int = MAX_STORED_STATES,
        max_bytes: int = MAX_STORED_BYTES,
    ) -> None:
        self._clock = clock
        self.interval_s = interval_s
        self.max_states = max_states
        self.max_bytes = max_bytes
        self.stored_bytes = 0
        self._blobs: dict[str, tuple[bytes, float]] = {}  # in insertion order: the oldest first
        self._claims: dict[str, float] = {}
        self._expiries: list[tuple[float, int, str]] = []  # (expires_at, 0 blob | 1 claim, key)

    def __len__(self) -> int:
        return len(self._blobs) + len(self._claims)

    async def put(self, handle: str, blob: bytes, expires_at: float) -> None:
        """Keep ``blob``, evicting the oldest blobs past ``max_states`` or ``max_bytes``.

        Raises:
            StateTooLarge: the blob alone is larger than ``max_bytes``.
        """
        await trio.lowlevel.checkpoint()
        if len(blob) > self.max_bytes:
            raise StateTooLarge(len(blob), self.max_bytes)
        self._drop(handle)
        self._blobs[handle] = (blob, expires_at)
        self.stored_bytes += len(blob)
        heapq.heappush(self._expiries, (expires_at, 0, handle))
        while len(self._blobs) > self.max_states or self.stored_bytes > self.max_bytes:
            self._drop(next(iter(self._blobs)))

    def _drop(self, handle: str) -> tuple[bytes, float] | None:
        entry = self._blobs.pop(handle, None)
        if entry is not None:
            self.stored_bytes -= len(entry[0])
        return entry

    async def take(self, handle: str) -> bytes | None:
        await trio.lowlevel.checkpoint()
        entry = self._drop(handle)
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
                if which == 0:
                    self._drop(key)
                else:
                    del table[key]
                dropped += 1
        return dropped

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sweep every ``interval_s`` until cancelled (start it with ``nursery.start``)."""
        task_status.started()
        while True:
            await trio.sleep(self.interval_s)
            self.sweep_now()
