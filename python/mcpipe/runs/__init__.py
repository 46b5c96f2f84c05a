"""Runs that outlive a request: background pipelines on a durable queue, the workers that execute them,
and the tools that watch them (``docs/runs.md``).

The queue itself (:class:`~mcpipe.store.RunQueue`: SQLite, Redis Streams) and the events API
(:mod:`mcpipe.store.events`) live in :mod:`mcpipe.store`; this package executes runs through the gateway.
"""

from mcpipe.runs._record import RunRecord
from mcpipe.runs._service import MAX_WAIT_MS, RUN_TOOL_NAMES, Runs
from mcpipe.runs._worker import LEASE_S, Worker, cancelled_answer, new_worker_id

__all__ = [
    "LEASE_S",
    "MAX_WAIT_MS",
    "RUN_TOOL_NAMES",
    "RunRecord",
    "Runs",
    "Worker",
    "cancelled_answer",
    "new_worker_id",
]
