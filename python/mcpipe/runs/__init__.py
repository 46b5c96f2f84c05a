"""Runs that outlive a request: background pipelines on a durable queue, the workers that execute them,
and the tools that watch them (``docs/runs.md``).

The queue itself (:class:`~mcpipe.store.RunQueue`: SQLite, Redis Streams) and the events API
(:mod:`mcpipe.store.events`) live in :mod:`mcpipe.store`; this package executes runs through the gateway.

Runs that outlive a request
---------------------------

A background call (`"background": true`, or a declared pipeline with `background: true`) is checked, then queued
on the `RunQueue` (`mcpipe.store`: SQLite by default, Redis Streams with a `redis://` store URL) and answered
with its run id. A `Worker` (`mcpipe.runs`, started by `open_app` unless `[runs] execute` is off, and by `mcpipe
worker`) leases it, runs it through the gateway as its principal, and finishes it with a compare-and-set on the
worker holding it. The scheduler needs nothing new: the run's `ToolContext.interaction` is a `RunRecord`, the
same `StepRecord` input-required resumes use, marked `durable`; for a durable record the scheduler awaits
`starting(path, kind)` before each leaf step, where the record writes the steps finished so far and the run's
events to the queue. A run taken over from a dead worker loads its record and the scheduler answers the recorded
steps without running them. The MCP tasks extension (`server/_tasks.py`) is a front of the same queue: a task is
a run, and a task's run may ask its client: its context holds a `RunInteraction` (an `Interaction` of the
2026-07-28 kind whose memo is the durable record), so an asking step suspends the run (`input_required`, the
questions kept with the run) and `tasks/update` requeues it with the answers. A declared pipeline with
`ask_before_task` composes the two: its synchronous call gets an `Interaction` with `until_work`, which is
`durable` only to hear `starting`, and raises `Escalated` (a suspension) at the first step of a kind that reaches
out; `Interactions.call` then hands the memo of the rounds so far to `Tasks.create`, and the task's worker starts
from it (the run's `meta.recorded`). The queue bounds what it keeps with one `Bounds` (`mcpipe.store`) both
queues apply: `[runs] max_run_bytes` and `max_run_events` per run (its arguments on enqueue, its steps and events
as they are written, its answer on finish), `max_runs`/`max_bytes` in all (the oldest finished runs dropped in
the enqueueing, recording or finishing transaction, or Lua script), `max_runs_per_principal` and
`max_bytes_per_principal` per principal, and `parked_ttl_s` for a run waiting for input (swept, checked before
refusing, and when the queue starts); the queue raises `RunRefused` and the server fronts answer it as
`LIMIT_EXCEEDED`. A Redis queue that cannot be reached raises `StoreUnavailable`, answered as the pipeline
store's (`store_unavailable`). See docs/runs.md.

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
