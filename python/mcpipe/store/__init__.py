"""Storage shared by every instance that may resume a suspended pipeline: the interface, the in-memory
default, and :func:`open_store`, which builds the configured store from its URL (``memory:``; other
stores register their scheme)."""

from typing import Any

from mcpipe.store._base import PipelineStore, ServedStore, StoreFactory, open_store, register_store, store_schemes
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
    "SWEEP_INTERVAL_S",
    "InMemoryPipelineStore",
    "PipelineStore",
    "ServedStore",
    "StateTooLarge",
    "StoreFactory",
    "open_store",
    "register_store",
    "store_schemes",
]


def _memory(url: str, options: dict[str, Any]) -> InMemoryPipelineStore:
    return InMemoryPipelineStore(
        interval_s=options.get("sweep_interval_s", SWEEP_INTERVAL_S),
        max_states=options.get("max_states", MAX_STORED_STATES),
        max_bytes=options.get("max_bytes", MAX_STORED_BYTES),
    )


register_store("memory", _memory)
