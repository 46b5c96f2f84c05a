"""Storage shared by every instance: where suspended pipelines wait (:class:`PipelineStore`, the in-memory
default, and :func:`open_store`, which builds the configured store from its URL) and where queued runs
wait for a worker (:class:`RunQueue`: SQLite by default, Redis Streams; :func:`open_queue`). Stores and
queues register their URL scheme."""

from typing import Any

from mcpipe.store._base import PipelineStore, ServedStore, StoreFactory, open_store, register_store, store_schemes
from mcpipe.store._memory import (
    MAX_STORED_BYTES,
    MAX_STORED_STATES,
    SWEEP_INTERVAL_S,
    InMemoryPipelineStore,
    StateTooLarge,
)
from mcpipe.store._runs import (
    EVENT_TYPES,
    TERMINAL,
    Renewal,
    RunEvent,
    RunInfo,
    RunQueue,
    RunStatus,
    open_queue,
    queue_schemes,
    register_queue,
)

__all__ = [
    "EVENT_TYPES",
    "MAX_STORED_BYTES",
    "MAX_STORED_STATES",
    "SWEEP_INTERVAL_S",
    "TERMINAL",
    "InMemoryPipelineStore",
    "PipelineStore",
    "Renewal",
    "RunEvent",
    "RunInfo",
    "RunQueue",
    "RunStatus",
    "ServedStore",
    "StateTooLarge",
    "StoreFactory",
    "open_queue",
    "open_store",
    "queue_schemes",
    "register_queue",
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


def _sqlite(url: str, options: dict[str, Any]) -> RunQueue:
    from mcpipe.store._sqlite import SqliteRunQueue

    path = url[len("sqlite://") :] if url.startswith("sqlite://") else url
    keep = {k: options[k] for k in ("retention_s", "poll_s") if options.get(k) is not None}
    return SqliteRunQueue(path, **keep)


def _redis(url: str, options: dict[str, Any]) -> RunQueue:
    from mcpipe.store._redis_runs import RedisRunQueue  # imports coredis: only when a config names Redis

    keep = {k: options[k] for k in ("retention_s", "prefix", "timeout_s") if options.get(k) is not None}
    return RedisRunQueue(url, **keep)


register_queue("sqlite", _sqlite)
register_queue("redis", _redis)
register_queue("rediss", _redis)
