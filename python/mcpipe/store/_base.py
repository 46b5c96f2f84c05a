"""Where suspended pipelines wait: the :class:`PipelineStore` interface, and the factory that builds the
configured store from a URL.

A store keeps two things, both with an expiry: blobs (a suspended pipeline's state too large to travel
inline in ``requestState``, kept behind an opaque handle) and claims (the one-time ids of the states that
have been resumed, so a replayed state is refused). A shared store (Redis) implements the same four
methods and registers its URL scheme with :func:`register_store`; nothing else in the runtime knows which
store it talks to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

import trio

__all__ = ["PipelineStore", "StoreFactory", "StoreUnavailable", "open_store", "register_store", "store_schemes"]


class StoreUnavailable(Exception):
    """The pipeline store cannot answer now (a shared store is unreachable); the call that needed it fails
    with this message, and a later one may succeed."""


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
        """Mark a state as resumed. True the first time, False if it was claimed before (a replay).

        ``expires_at`` is the state's own expiry (sealed in it, so a replay carries the same). A store bounded
        in claims raises :class:`mcpipe.store.ClaimUnverifiable` for a state it can no longer tell from a
        replay; it never answers True for one.
        """
        ...

    async def sweep(self) -> int:
        """Drop what has expired; answers how many entries went."""
        ...


class ServedStore(PipelineStore, Protocol):
    """A store with background work (sweeping, connections): ``await nursery.start(store.run)``."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None: ...


StoreFactory = Callable[[str, dict[str, Any]], ServedStore]
"""Builds a store from its URL and options (``sweep_interval_s``, ...)."""

_FACTORIES: dict[str, StoreFactory] = {}


def register_store(scheme: str, factory: StoreFactory) -> None:
    """Make ``open_store`` build ``factory(url, options)`` for URLs of ``scheme`` (``redis``, ...)."""
    _FACTORIES[scheme] = factory


def store_schemes() -> list[str]:
    """The URL schemes a store can be built for."""
    return sorted(_FACTORIES)


def open_store(url: str = "memory:", **options: object) -> ServedStore:
    """The store ``url`` names (``memory:`` by default); start its background work with
    ``await nursery.start(store.run)``.

    Raises:
        ValueError: no store is registered for the URL's scheme.
    """
    scheme = urlsplit(url).scheme or url.rstrip(":")
    factory = _FACTORIES.get(scheme)
    if factory is None:
        known = ", ".join(f"{s}:" for s in store_schemes())
        raise ValueError(f"no pipeline store for {url!r} (known: {known})")
    return factory(url, options)
