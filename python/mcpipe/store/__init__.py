"""Storage shared by every instance: where suspended pipelines wait (:class:`PipelineStore`, the in-memory
default, and :func:`open_store`, which builds the configured store from its URL) and where queued runs
wait for a worker (:class:`RunQueue`: SQLite by default, Redis Streams; :func:`open_queue`). Stores and
queues register their URL scheme."""

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
from mcpipe.store._contentconfig import ContentConfig, ContentStoreConfig
from mcpipe.store._memory import (
    MAX_CLAIMS,
    MAX_STORED_BYTES,
    MAX_STORED_STATES,
    SWEEP_INTERVAL_S,
    ClaimUnverifiable,
    InMemoryPipelineStore,
    StateTooLarge,
)
from mcpipe.store._runs import (
    EVENT_TYPES,
    TERMINAL,
    Bounds,
    Renewal,
    RunEvent,
    RunInfo,
    RunPage,
    RunQueue,
    RunRefused,
    RunStatus,
    open_queue,
    queue_schemes,
    register_queue,
)

__all__ = [
    "EVENT_TYPES",
    "MAX_CLAIMS",
    "MAX_STORED_BYTES",
    "MAX_STORED_STATES",
    "SCHEMES",
    "SWEEP_INTERVAL_S",
    "TERMINAL",
    "Bounds",
    "ClaimUnverifiable",
    "ContentConfig",
    "ContentStoreConfig",
    "InMemoryPipelineStore",
    "PipelineStore",
    "Renewal",
    "RunEvent",
    "RunInfo",
    "RunPage",
    "RunQueue",
    "RunRefused",
    "RunStatus",
    "ServedStore",
    "StateTooLarge",
    "StoreFactory",
    "StoreUnavailable",
    "open_pipeline_store",
    "open_queue",
    "open_store",
    "queue_schemes",
    "register_queue",
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
        max_claims=options.get("max_claims", MAX_CLAIMS),
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
            max_claims=interaction.max_claims,
        )
    return open_store(getattr(store, "url", "memory://"), **options)


_BOUNDS = (
    "retention_s",
    "max_run_bytes",
    "max_run_events",
    "max_runs",
    "max_bytes",
    "max_runs_per_principal",
    "max_bytes_per_principal",
    "parked_ttl_s",
)
"""The options both queues take as their :class:`Bounds`."""


def _sqlite(url: str, options: dict[str, Any]) -> RunQueue:
    from mcpipe.store._sqlite import SqliteRunQueue

    path = url[len("sqlite://") :] if url.startswith("sqlite://") else url
    keep = {k: options[k] for k in ("poll_s", *_BOUNDS) if options.get(k) is not None}
    return SqliteRunQueue(path, **keep)


def _redis_queue(url: str, options: dict[str, Any]) -> RunQueue:
    from mcpipe.store._redis_runs import RedisRunQueue  # imports coredis: only when a config names Redis

    keep = {k: options[k] for k in ("prefix", "timeout_s", *_BOUNDS) if options.get(k) is not None}
    return RedisRunQueue(url, **keep)


register_queue("sqlite", _sqlite)
register_queue("redis", _redis_queue)
register_queue("rediss", _redis_queue)
