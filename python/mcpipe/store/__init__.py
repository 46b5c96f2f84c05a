"""Storage shared by every instance that may resume a suspended pipeline: the interface, the stores, and
:func:`open_store`, which builds the configured store from its URL's scheme.

``memory:`` (the default; also ``memory://``) is :class:`InMemoryPipelineStore`, private to one process and
bounded by ``interaction.max_suspended`` / ``max_suspended_bytes``; ``redis://HOST:PORT/DB`` (also
``rediss://`` and ``unix://``) is :class:`~mcpipe.store.redis.RedisPipelineStore`, shared by every instance
pointed at the same database. Other stores register their scheme with :func:`register_store`.
"""

from __future__ import annotations

from typing import Any

from mcpipe.store._base import (
    PipelineStore,
    ServedStore,
    StoreFactory,
    StoreUnavailable,
    open_store,
    register_store,
    store_schemes,
)
from mcpipe.store._memory import (
    MAX_STORED_BYTES,
    MAX_STORED_STATES,
    SWEEP_INTERVAL_S,
    InMemoryPipelineStore,
    StateTooLarge,
)

__all__ = [
    "MAX_STORED_BYTES",
    "MAX_STORED_STATES",
    "SCHEMES",
    "SWEEP_INTERVAL_S",
    "InMemoryPipelineStore",
    "PipelineStore",
    "ServedStore",
    "StateTooLarge",
    "StoreFactory",
    "StoreUnavailable",
    "open_pipeline_store",
    "open_store",
    "register_store",
    "store_schemes",
]

SCHEMES = ("memory", "redis", "rediss", "unix")
"""The URL schemes a ``[store] url`` may use."""


def _memory(url: str, options: dict[str, Any]) -> InMemoryPipelineStore:
    return InMemoryPipelineStore(
        interval_s=options.get("sweep_interval_s", SWEEP_INTERVAL_S),
        max_states=options.get("max_states", MAX_STORED_STATES),
        max_bytes=options.get("max_bytes", MAX_STORED_BYTES),
    )


def _redis(url: str, options: dict[str, Any]) -> ServedStore:
    from mcpipe.store.redis import RedisPipelineStore  # coredis: only when a config names Redis

    return RedisPipelineStore(url, prefix=options.get("prefix", "mcpipe"), timeout_s=options.get("timeout_s", 2.0))


register_store("memory", _memory)
for _scheme in ("redis", "rediss", "unix"):
    register_store(_scheme, _redis)


def open_pipeline_store(store: Any, interaction: Any = None) -> ServedStore:
    """The store the config's ``[store]`` section names (``url``, ``timeout_ms``, ``prefix``); the in-memory
    one takes its sweep period and bounds from the ``[interaction]`` section. Start its ``run`` with
    ``nursery.start`` before use."""
    options: dict[str, Any] = {
        "prefix": getattr(store, "prefix", "mcpipe"),
        "timeout_s": getattr(store, "timeout_ms", 2000) / 1000,
    }
    if interaction is not None:
        options.update(
            sweep_interval_s=interaction.sweep_interval_s,
            max_states=interaction.max_suspended,
            max_bytes=interaction.max_suspended_bytes,
        )
    return open_store(getattr(store, "url", "memory://"), **options)
