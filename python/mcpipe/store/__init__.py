"""Pipeline stores behind one factory: :func:`open_pipeline_store` picks the store by the URL's scheme.

``memory://`` (the default) is :class:`~mcpipe.interaction.InMemoryPipelineStore`, private to one process
and bounded by ``interaction.max_suspended`` / ``max_suspended_bytes``; ``redis://HOST:PORT/DB`` (also
``rediss://`` and ``unix://``) is :class:`~mcpipe.store.redis.RedisPipelineStore`, shared by every instance
pointed at the same database.
"""

from __future__ import annotations

from typing import Any

from mcpipe.interaction._store import InMemoryPipelineStore, PipelineStore, StoreUnavailable

__all__ = ["SCHEMES", "PipelineStore", "StoreUnavailable", "open_pipeline_store"]

SCHEMES = ("memory", "redis", "rediss", "unix")
"""The URL schemes a ``[store] url`` may use."""


def open_pipeline_store(store: Any, interaction: Any = None) -> PipelineStore:
    """The store the config's ``[store]`` section names (``url``, ``timeout_ms``, ``prefix``); the in-memory
    one takes its sweep period and bounds from the ``[interaction]`` section. Start its ``run`` with
    ``nursery.start`` before use."""
    url = getattr(store, "url", "memory://")
    if url.partition("://")[0] == "memory":
        if interaction is None:
            return InMemoryPipelineStore()
        return InMemoryPipelineStore(
            interval_s=interaction.sweep_interval_s,
            max_states=interaction.max_suspended,
            max_bytes=interaction.max_suspended_bytes,
        )
    from mcpipe.store.redis import RedisPipelineStore

    return RedisPipelineStore(url, prefix=store.prefix, timeout_s=store.timeout_ms / 1000)
