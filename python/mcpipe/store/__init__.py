"""Pipeline stores behind one factory: :func:`open_pipeline_store` picks the store by the URL's scheme.

``memory://`` (the default) is :class:`~mcpipe.interaction.InMemoryPipelineStore`, private to one process;
``redis://HOST:PORT/DB`` (also ``rediss://`` and ``unix://``) is :class:`~mcpipe.store.redis.RedisPipelineStore`,
shared by every instance pointed at the same database.
"""

from __future__ import annotations

from typing import Any

from mcpipe.interaction._store import InMemoryPipelineStore, PipelineStore, StoreUnavailable

__all__ = ["SCHEMES", "PipelineStore", "StoreUnavailable", "open_pipeline_store"]

SCHEMES = ("memory", "redis", "rediss", "unix")
"""The URL schemes a ``[store] url`` may use."""


def open_pipeline_store(section: Any, *, sweep_interval_s: float | None = None) -> PipelineStore:
    """The store the config's ``[store]`` section names (``url``, ``max_entries``, ``max_bytes``,
    ``timeout_ms``, ``prefix``). Start its ``run`` with ``nursery.start`` before use."""
    url = getattr(section, "url", "memory://")
    scheme = url.partition("://")[0]
    if scheme == "memory":
        extra = {} if sweep_interval_s is None else {"interval_s": sweep_interval_s}
        return InMemoryPipelineStore(max_entries=section.max_entries, max_bytes=section.max_bytes, **extra)
    from mcpipe.store.redis import RedisPipelineStore

    return RedisPipelineStore(url, prefix=section.prefix, timeout_s=section.timeout_ms / 1000)
