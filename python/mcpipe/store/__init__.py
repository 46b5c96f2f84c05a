"""Storage shared by every instance that may resume a suspended pipeline: the interface, the in-memory
default, and :func:`open_store`, which builds the configured store from its URL (``memory:``; other
stores register their scheme)."""

from typing import Any

from mcpipe.store._base import PipelineStore, ServedStore, StoreFactory, open_store, register_store, store_schemes
from mcpipe.store._memory import SWEEP_INTERVAL_S, InMemoryPipelineStore

__all__ = [
    "SWEEP_INTERVAL_S",
    "InMemoryPipelineStore",
    "PipelineStore",
    "ServedStore",
    "StoreFactory",
    "open_store",
    "register_store",
    "store_schemes",
]


def _memory(url: str, options: dict[str, Any]) -> InMemoryPipelineStore:
    interval = options.get("sweep_interval_s")
    return InMemoryPipelineStore() if interval is None else InMemoryPipelineStore(interval_s=interval)


register_store("memory", _memory)
