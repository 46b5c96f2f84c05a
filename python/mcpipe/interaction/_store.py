"""Where suspended pipelines wait: the :class:`PipelineStore` interface and the in-memory default.

A store keeps two things, both with an expiry: blobs (a suspended pipeline's state too large to travel
inline in ``requestState``, kept behind an opaque handle) and claims (the one-time ids of the states that
have been resumed, so a replayed state is refused). A shared store (Redis, a later issue) implements the
same four methods (``mcpipe.store.redis``); nothing else in the runtime knows which store it talks to.

The in-memory store is capped (entries and bytes) so a client that suspends pipelines and never resumes
them cannot pin the server's memory: past the cap the oldest blobs go first, and a claim that would not fit
is refused (:class:`StoreUnavailable`) rather than forgotten, since a forgotten claim would let its state be
replayed.
"""

from __future__ import annotations

import heapq
import logging
import time
from typing import Any, Protocol, runtime_checkable

import trio

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_ENTRIES",
    "SWEEP_INTERVAL_S",
    "InMemoryPipelineStore",
    "PipelineStore",
    "StoreUnavailable",
]

SWEEP_INTERVAL_S = 30.0
"""How often the in-memory store's sweeper drops expired entries."""
DEFAULT_MAX_ENTRIES = 100_000
"""The in-memory store's cap on blobs, and separately on claims."""
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
"""The in-memory store's cap on the bytes of its blobs."""

_log = logging.getLogger("mcpipe.interaction")


class StoreUnavailable(Exception):
    """The pipeline store cannot answer now (a shared store is unreachable, or the in-memory store is
    full of claims); the call that needed it fails with this message, and a later one may succeed."""


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
    """The single-instance default: dicts and an expiry heap, capped.

    Run :meth:`run` in a nursery (``await nursery.start(store.run)``) to sweep expired entries in the
    background; without it, entries are still refused once expired, they only linger in memory.

    Args:
        clock: the time source (``time.time``); tests pass their own.
        interval_s: the sweeper's period.
        max_entries: at most this many blobs (the oldest are dropped to make room), and at most this many
            claims (one more is refused with :class:`StoreUnavailable`).
        max_bytes: at most this many bytes of blobs (the oldest are dropped to make room).
    """

    def __init__(
        self,
        *,
        clock: Any = time.time,
        interval_s: float = SWEEP_INTERVAL_S,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self._clock = clock
        self.interval_s = interval_s
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._blobs: dict[str, tuple[bytes, float]] = {}
        self._blob_bytes = 0
        self._claims: dict[str, float] = {}
        self._expiries: list[tuple[float, int, str]] = []  # (expires_at, 0 blob | 1 claim, key)

    def __len__(self) -> int:
        return len(self._blobs) + len(self._claims)

    @property
    def blob_bytes(self) -> int:
        """The bytes the blobs held now take."""
        return self._blob_bytes

    async def put(self, handle: str, blob: bytes, expires_at: float) -> None:
        await trio.lowlevel.checkpoint()
        if len(blob) > self.max_bytes:
            raise StoreUnavailable(f"a suspended state of {len(blob)} bytes exceeds the store's {self.max_bytes}")
        self._drop_blob(handle)
        if len(self._blobs) >= self.max_entries or self._blob_bytes + len(blob) > self.max_bytes:
            self.sweep_now()
            self._make_room(len(blob))
        self._blobs[handle] = (blob, expires_at)
        self._blob_bytes += len(blob)
        heapq.heappush(self._expiries, (expires_at, 0, handle))

    async def take(self, handle: str) -> bytes | None:
        await trio.lowlevel.checkpoint()
        entry = self._drop_blob(handle)
        if entry is None or entry[1] <= self._clock():
            return None
        return entry[0]

    async def claim(self, state_id: str, expires_at: float) -> bool:
        await trio.lowlevel.checkpoint()
        seen = self._claims.get(state_id)
        if seen is not None and seen > self._clock():
            return False
        if seen is None and len(self._claims) >= self.max_entries:
            self.sweep_now()
            if len(self._claims) >= self.max_entries:
                raise StoreUnavailable(f"the pipeline store holds {self.max_entries} claims already; try again later")
        self._claims[state_id] = expires_at
        heapq.heappush(self._expiries, (expires_at, 1, state_id))
        return True

    def _drop_blob(self, handle: str) -> tuple[bytes, float] | None:
        entry = self._blobs.pop(handle, None)
        if entry is not None:
            self._blob_bytes -= len(entry[0])
        return entry

    def _make_room(self, size: int) -> None:
        # The oldest blobs go first (dicts keep insertion order; with the one TTL a server uses, the oldest
        # are also the closest to expiring, the likeliest to be abandoned already).
        dropped = 0
        while self._blobs and (len(self._blobs) >= self.max_entries or self._blob_bytes + size > self.max_bytes):
            self._drop_blob(next(iter(self._blobs)))
            dropped += 1
        if dropped:
            _log.warning("pipeline store full: dropped the %d oldest suspended states", dropped)

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
                    self._drop_blob(key)
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
