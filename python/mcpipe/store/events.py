"""Events of queued runs: the one API every producer writes them through.

mcpipe's workers write ``enqueued``, ``leased``, ``step_started``, ``step_finished`` and ``completed`` /
``failed`` / ``cancelled``; another producer (a playbook engine running on the same queue) writes its own
through the same calls, and ``pipe_events`` / ``mcpipe events RUN_ID`` show them all::

    from mcpipe.store import open_queue
    from mcpipe.store.events import EventLog, emit

    await emit(queue, run_id, "step_started", worker="noetl-1", path="fetch")  # one event, written now

    log = EventLog(queue, run_id, worker="noetl-1")  # many events from synchronous code
    log.add("step_finished", path="fetch", ok=True)
    await log.flush()

Each event is stamped with the time (Unix seconds) and the writer's id, and kept as long as its run
(``[runs] retention_s``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import trio

from mcpipe.store._runs import EVENT_TYPES, TERMINAL, NewEvent, RunEvent, RunQueue

__all__ = ["EVENT_TYPES", "EventLog", "emit", "follow"]


async def emit(queue: RunQueue, run_id: str, type: str, *, worker: str | None = None, **data: object) -> None:
    """Append one event to run ``run_id``'s log now."""
    await queue.emit(run_id, worker, [(type, data)])


class EventLog:
    """Events of one run from one writer, gathered synchronously (``add``) and written in batches
    (``flush``): the scheduler's callbacks cannot await.

    Args:
        queue: the run queue.
        run_id: the run.
        worker: the writer's id, stamped on every event.
    """

    __slots__ = ("_pending", "queue", "run_id", "worker")

    def __init__(self, queue: RunQueue, run_id: str, worker: str | None = None) -> None:
        self.queue = queue
        self.run_id = run_id
        self.worker = worker
        self._pending: list[NewEvent] = []

    def add(self, type: str, **data: object) -> None:
        """Gather one event (written by the next :meth:`flush`)."""
        self._pending.append((type, data))

    def take(self) -> list[NewEvent]:
        """The gathered events, handed over (for a queue call that writes them with other records)."""
        out, self._pending = self._pending, []
        return out

    async def flush(self) -> None:
        """Write the gathered events."""
        if self._pending:
            await self.queue.emit(self.run_id, self.worker, self.take())


async def follow(
    queue: RunQueue, run_id: str, *, after: str | None = None, poll_s: float = 5.0
) -> AsyncIterator[RunEvent]:
    """The run's events from cursor ``after`` on, as they are written, until the run's terminal event.

    Runs until the run ends (or forever, for a run that never does: cancel the caller's scope).
    """
    cursor = after
    while True:
        batch = await queue.events(run_id, after=cursor, wait_s=poll_s)
        for event in batch:
            cursor = event.cursor
            yield event
            if event.type in TERMINAL:
                return
        if not batch:
            info = await queue.get(run_id)
            if info is None:
                return
            if info.done:  # its terminal event went (retention) or it was written before `after`
                await trio.lowlevel.checkpoint()
                return
