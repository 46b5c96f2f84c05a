"""The in-memory :class:`~mcpipe.store.PipelineStore`: one instance's dicts and an expiry heap."""

from __future__ import annotations

import heapq
import time
from typing import Any

import trio

__all__ = [
    "MAX_CLAIMS",
    "MAX_STORED_BYTES",
    "MAX_STORED_STATES",
    "SWEEP_INTERVAL_S",
    "ClaimUnverifiable",
    "InMemoryPipelineStore",
    "StateTooLarge",
]

SWEEP_INTERVAL_S = 30.0
"""How often the in-memory store's sweeper drops expired entries."""

MAX_STORED_STATES = 1000
"""Default: the most suspended states the in-memory store keeps (the oldest is evicted past it)."""

MAX_STORED_BYTES = 64 * 1024 * 1024
"""Default: the most bytes of suspended states the in-memory store keeps (the oldest are evicted past it)."""


MAX_CLAIMS = 100_000
"""Default: the most unexpired claims the in-memory store keeps (each is a few hundred bytes: about 30 MB at
the most); past it the soonest-expiring claims are evicted and the states they covered can no longer be
resumed (:class:`ClaimUnverifiable`)."""


class ClaimUnverifiable(Exception):
    """A claim refused because the store can no longer tell whether the state was resumed before: claims
    expiring no later than this one were evicted to keep the store within ``max_claims``."""

    code = "LIMIT_EXCEEDED"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the pipeline store evicted claims of states expiring as soon as this one, to keep within its "
            f"{limit} claims, so it cannot tell whether this state was already used; call the tool again"
        )
        self.limit = limit


class StateTooLarge(Exception):
    """A suspended pipeline's state larger than the whole store may hold: refused, never stored."""

    code = "LIMIT_EXCEEDED"

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the suspended pipeline's state is {size} bytes; the pipeline store keeps at most {limit}")
        self.size = size
        self.limit = limit


class InMemoryPipelineStore:
    """The single-instance default: dicts and an expiry heap.

    Run :meth:`run` in a nursery (``await nursery.start(store.run)``) to sweep expired entries in the
    background; without it, entries are still refused once expired, they only linger in memory.

    Blobs are bounded in count and in bytes: past either bound the oldest blobs are evicted (their
    pipelines can no longer be resumed, and say so), and a blob larger than the byte bound is refused with
    :class:`StateTooLarge`.

    Claims must outlive their state (a replay stays refused), so they are bounded with care: past
    ``max_claims`` the claim expiring soonest is evicted and the store remembers the latest expiry it
    evicted (its *floor*); from then on a claim expiring no later than the floor is refused with
    :class:`ClaimUnverifiable`, claimed before or not. That is sound because a claim's expiry is the state's
    own, sealed in the token: a replayed state carries the same expiry as its evicted claim, so it falls under
    the floor. Evicting the soonest-expiring first keeps the floor as low as it can be: what is lost is the
    resumption of the states nearest their end, never replay protection (refusing new claims instead would
    refuse every resumption until claims expire). The floor is harmless once the clock passes it (those
    states have expired anyway).

    Args:
        clock: the time source (``time.time``); tests pass their own.
        interval_s: the sweeper's period.
        max_states: the most blobs kept.
        max_bytes: the most bytes of blobs kept.
        max_claims: the most claims kept.
    """

    def __init__(
        self,
        *,
        clock: Any = time.time,
        interval_s: float = SWEEP_INTERVAL_S,
        max_states: int = MAX_STORED_STATES,
        max_bytes: int = MAX_STORED_BYTES,
        max_claims: int = MAX_CLAIMS,
    ) -> None:
        self._clock = clock
        self.interval_s = interval_s
        self.max_states = max_states
        self.max_bytes = max_bytes
        self.stored_bytes = 0
        self._blobs: dict[str, tuple[bytes, float]] = {}  # in insertion order: the oldest first
        self.max_claims = max_claims
        self._claims: dict[str, float] = {}
        self._claims_floor = float("-inf")  # the latest expiry of an evicted claim
        self._expiries: list[tuple[float, str]] = []  # blobs': (expires_at, handle)
        self._claim_expiries: list[tuple[float, str]] = []  # claims': (expires_at, state id), soonest first

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
        heapq.heappush(self._expiries, (expires_at, handle))
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
        """Mark a state as resumed: True the first time, False for a replay.

        Raises:
            ClaimUnverifiable: claims expiring no later than this one were evicted (past ``max_claims``), so
                a replay of this state could not be told apart.
        """
        await trio.lowlevel.checkpoint()
        seen = self._claims.get(state_id)
        if seen is not None and seen > self._clock():
            return False
        if expires_at <= self._claims_floor:
            raise ClaimUnverifiable(self.max_claims)
        self._claims[state_id] = expires_at
        heapq.heappush(self._claim_expiries, (expires_at, state_id))
        if len(self._claims) > self.max_claims:
            self._sweep_claims(self._clock())
            while len(self._claims) > self.max_claims:
                evicted = self._pop_claim()
                self._claims_floor = max(self._claims_floor, evicted)
        return True

    def _pop_claim(self) -> float:
        """Drop the claim expiring soonest; answers its expiry."""
        while True:
            expires_at, key = heapq.heappop(self._claim_expiries)
            if self._claims.get(key) == expires_at:
                del self._claims[key]
                return expires_at

    async def sweep(self) -> int:
        await trio.lowlevel.checkpoint()
        return self.sweep_now()

    def sweep_now(self) -> int:
        """Drop expired entries (synchronously); answers how many went."""
        now = self._clock()
        dropped = 0
        heap = self._expiries
        while heap and heap[0][0] <= now:
            expires_at, key = heapq.heappop(heap)
            current = self._blobs.get(key)
            # A key may have been put again with a later expiry: only the entry that expired goes.
            if current is not None and current[1] == expires_at:
                self._drop(key)
                dropped += 1
        return dropped + self._sweep_claims(now)

    def _sweep_claims(self, now: float) -> int:
        dropped = 0
        heap = self._claim_expiries
        while heap and heap[0][0] <= now:
            expires_at, key = heapq.heappop(heap)
            if self._claims.get(key) == expires_at:
                del self._claims[key]
                dropped += 1
        return dropped

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sweep every ``interval_s`` until cancelled (start it with ``nursery.start``)."""
        task_status.started()
        while True:
            await trio.sleep(self.interval_s)
            self.sweep_now()
