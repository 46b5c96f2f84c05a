"""The step record of a queued run: what the scheduler recalls instead of running a step again.

It is the record input-required resumes use (:class:`mcpipe.tools.StepRecord`), made durable: before each
leaf step starts, the results of the steps that finished since the last save are written to the run queue
with the run's events, in one write, under the worker's lease. A worker that dies mid-run therefore leaves
every finished step recorded; the worker that takes the run over loads the record, the scheduler answers
those steps from it, and only the step that was in flight at the death runs again (at-least-once).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import trio

from mcpipe.interaction import Interaction
from mcpipe.interaction._core import _Round
from mcpipe.results import preview
from mcpipe.store import RunQueue
from mcpipe.store.events import EventLog
from mcpipe.tools import ToolContext

__all__ = ["RunInteraction", "RunRecord"]


class _Shared:
    __slots__ = ("events", "lost", "memo", "on_lost", "pending", "queue", "run_id", "worker")

    def __init__(self, queue: RunQueue, run_id: str, worker: str, memo: dict[str, dict[str, Any]]) -> None:
        self.queue = queue
        self.run_id = run_id
        self.worker = worker
        self.memo = memo
        self.pending: dict[str, dict[str, Any]] = {}
        self.events = EventLog(queue, run_id, worker)
        self.lost = False
        self.on_lost: Callable[[], None] | None = None


class RunRecord:
    """The durable :class:`~mcpipe.tools.StepRecord` of one run on one worker.

    Args:
        queue: the run queue.
        run_id: the run.
        worker: the worker holding its lease.
        recorded: the steps the run finished before (on a worker that died), by path.
    """

    __slots__ = ("_s", "ns")

    def __init__(
        self, queue: RunQueue, run_id: str, worker: str, recorded: dict[str, dict[str, Any]], *, _ns: str = ""
    ) -> None:
        self._s = _Shared(queue, run_id, worker, recorded)
        self.ns = _ns

    @property
    def resumable(self) -> bool:
        return True

    @property
    def durable(self) -> bool:
        return True

    @property
    def lost(self) -> bool:
        """The lease went to another worker (this one stalled past it): the run is no longer ours."""
        return self._s.lost

    @property
    def events(self) -> EventLog:
        """The run's event log (this worker's events, written with the next save)."""
        return self._s.events

    def on_lost(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` when a save finds the lease gone (the worker cancels the run's scope)."""
        self._s.on_lost = fn

    def lose(self) -> None:
        """The lease went to another worker: mark the run lost and stop it."""
        s = self._s
        s.lost = True
        if s.on_lost is not None:
            s.on_lost()

    def nested(self, ctx: ToolContext) -> ToolContext:
        """A declared pipeline run by step ``ctx.step``: its steps are recorded under that step."""
        inner = RunRecord.__new__(RunRecord)
        inner._s = self._s
        inner.ns = f"{self.ns}{ctx.step}/"
        return replace(ctx, request=replace(ctx.request, interaction=inner))

    def get(self, path: str) -> dict[str, Any] | None:
        return self._s.memo.get(self.ns + path)

    def put(self, path: str, result: dict[str, Any]) -> None:
        key = self.ns + path
        s = self._s
        s.memo[key] = result
        s.pending[key] = result
        s.events.add("step_finished", **finished_event(key, result))

    async def starting(self, path: str, kind: str = "tool", detail: dict[str, Any] | None = None) -> None:
        if detail:
            self._s.events.add("step_started", path=self.ns + path, kind=kind, **detail)
        else:
            self._s.events.add("step_started", path=self.ns + path, kind=kind)
        await self.save()

    async def keep(self, path: str, value: dict[str, Any]) -> None:
        """Record a side effect's result and save it now (with the events gathered so far): a worker that
        dies after it leaves it recorded, and the one taking the run over does not do it again."""
        key = self.ns + path
        s = self._s
        s.memo[key] = value
        s.pending[key] = value
        await self.save()

    async def save(self) -> None:
        """Write the steps finished since the last save and the gathered events (one queue write)."""
        s = self._s
        steps, s.pending = s.pending, {}
        events = s.events.take()
        if not (steps or events):
            await trio.lowlevel.checkpoint()
            return
        if not await s.queue.save(s.run_id, s.worker, steps, events):
            self.lose()
            await trio.lowlevel.checkpoint()  # the run's scope is cancelled: stop here


def finished_event(path: str, result: dict[str, Any]) -> dict[str, Any]:
    """What a ``step_finished`` event says of a step's result: ``path``, ``ok``, ``error_code``, ``duration_ms``,
    and when there is one: ``kind``, ``error`` (its message), ``attempts`` (a retried tool call), ``skipped``,
    and ``output``, a preview of its output (:func:`mcpipe.results.preview`), with ``output_bytes`` its size as
    the answer measures it. The console draws a run's steps from these events after the run ended (its
    recorded steps go when it finishes)."""
    data: dict[str, Any] = {
        "path": path,
        "ok": result.get("ok"),
        "error_code": result.get("error_code"),
        "duration_ms": result.get("duration_ms"),
    }
    kind = result.get("kind")
    if kind is not None:
        data["kind"] = kind
    error = result.get("error")
    if error:
        data["error"] = error if len(error) <= 1000 else f"{error[:1000]}... ({len(error)} characters)"
    if "attempts" in result:
        data["attempts"] = result["attempts"]
    if result.get("skipped"):
        data["skipped"] = True
    if kind not in _CONTAINERS:
        output = result.get("output")
        if output is not None and output != "":
            data["output"], data["output_bytes"] = preview(output)
    return data


_CONTAINERS = frozenset({"parallel", "pipe", "for_each", "graph"})


class RunInteraction(Interaction):
    """The record of a run that may ask its client (an MCP task of a client that can be asked): the
    2026-07-28 :class:`~mcpipe.interaction.Interaction` (a question without an answer suspends the run), its
    finished steps saved like :class:`RunRecord`'s.

    Args:
        record: the run's durable record (its queue, lease and events).
        capabilities: the client's capabilities, as it declared them when the task was created.
        answers: the answers the client gave so far, by question key.
    """

    __slots__ = ("record",)

    def __init__(self, record: RunRecord, capabilities: object, answers: dict[str, Any]) -> None:
        # One memo: the record's (the round reads it, the record saves what it puts).
        super().__init__(modern=True, capabilities=capabilities, _round=_Round(record._s.memo, answers, {}))
        self.record = record

    @property
    def durable(self) -> bool:
        return True

    @property
    def events(self) -> EventLog:
        """The run's event log (written with the record's next save)."""
        return self.record.events

    def nested(self, ctx: ToolContext) -> ToolContext:
        inner = RunInteraction.__new__(RunInteraction)
        inner.modern, inner.capabilities, inner.send = self.modern, self.capabilities, self.send
        inner._round, inner.ns = self._round, f"{self.ns}{ctx.step}/"
        inner.until_work = False
        inner.record = self.record
        return replace(ctx, request=replace(ctx.request, interaction=inner))

    def put(self, path: str, result: dict[str, Any]) -> None:
        # The round's memo is the record's: the record saves it (and the event) before the next step.
        self.record.put(self.ns + path, result)

    async def starting(self, path: str, kind: str = "tool", detail: dict[str, Any] | None = None) -> None:
        await self.record.starting(self.ns + path, kind, detail)

    async def keep(self, path: str, value: dict[str, Any]) -> None:
        await self.record.keep(self.ns + path, value)
