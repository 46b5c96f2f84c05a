"""The run queue: pipelines that outlive the request that started them.

A :class:`RunQueue` holds runs (a target, its arguments, who asked), hands them to workers under a lease,
keeps the results of the steps a run has finished (so a run taken over from a dead worker resumes after
its last recorded step), takes the final answer exactly once, and keeps each run's events. Two queues
implement it: SQLite (the embedded default: in memory for one process, or one file shared by the processes
of one box) and Redis Streams (``redis://``, shared by many boxes). Both register their URL scheme with
:func:`register_queue`. Both bound what one run keeps (``max_run_bytes``); SQLite also bounds how many runs,
and bytes of runs, it keeps (``max_runs``, ``max_bytes``), dropping the oldest finished runs first.

Leases, not locks: a worker holds a run for ``lease_s`` and renews it while it runs. A worker that dies
stops renewing, and once the lease has run out another worker takes the run over. Finishing is a
compare-and-set on (run, worker): a worker whose lease was taken over cannot finish the run a second time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import urlsplit

import msgspec
import orjson
import trio

from mcpipe._json import dumps

__all__ = [
    "ACTIVE",
    "EVENT_TYPES",
    "TERMINAL",
    "QueueFactory",
    "Renewal",
    "RunEvent",
    "RunInfo",
    "RunQueue",
    "RunRefused",
    "RunStatus",
    "cancelled_answer",
    "merge_answers",
    "open_queue",
    "outcome_of",
    "pack_answer",
    "queue_schemes",
    "register_queue",
    "too_large_answer",
    "unpack_answer",
]

RunStatus = Literal["queued", "running", "input_required", "completed", "failed", "cancelled"]

TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
"""The statuses a run never leaves."""

ACTIVE: frozenset[str] = frozenset({"queued", "running", "input_required"})

EVENT_TYPES: tuple[str, ...] = (
    "enqueued",
    "leased",
    "step_started",
    "step_finished",
    "input_required",
    "resumed",
    "completed",
    "failed",
    "cancelled",
)
"""The events mcpipe itself writes; other producers (playbooks) may add their own types."""


class RunInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One run, as the queue keeps it.

    Attributes:
        id: the run id.
        target: what runs: ``mcp_pipe`` (``args`` is the spec) or a tool's name (a declared pipeline).
        args: the arguments of the call.
        principal: who asked (the worker calls tools as this principal).
        status: ``queued``, ``running``, ``completed``, ``failed`` or ``cancelled``.
        created, updated: Unix seconds.
        worker: the worker holding (or that last held) the run.
        attempts: how many times a worker leased it (above 1: taken over after a worker died).
        lapses: how many of those leases ran out while the run was running: its worker died or stalled past
            the lease. A worker fails a run leased with ``[runs] max_lapses`` lapses instead of running it again.
        cancel: cancelling was asked while it ran; the worker holding it stops it.
        answer: the final answer (a ``CallToolResult`` wire dict), once terminal.
        meta: what a run of an MCP task keeps besides: the client's ``capabilities`` (so the run can ask
            it), the ``pending`` questions of a run waiting for input (``input_required``), by wire key,
            and the ``answers`` given so far, by question key.
    """

    id: str
    target: str
    args: Any = None
    principal: str | None = None
    status: RunStatus = "queued"
    created: float = 0.0
    updated: float = 0.0
    worker: str | None = None
    attempts: int = 0
    cancel: bool = False
    answer: Any = None
    meta: dict[str, Any] = msgspec.field(default_factory=dict)
    lapses: int = 0

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    def summary(self) -> dict[str, Any]:
        """What ``pipe_status`` and ``mcpipe runs`` show (no arguments, no answer)."""
        return {
            "run_id": self.id,
            "target": self.target,
            "status": self.status,
            "principal": self.principal,
            "created": self.created,
            "updated": self.updated,
            "worker": self.worker,
            "attempts": self.attempts,
            "lapses": self.lapses,
            "cancel_requested": self.cancel,
        }


class RunEvent(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One event of a run.

    Attributes:
        cursor: the event's position in its run's log (opaque; pass it back as ``after``).
        at: Unix seconds.
        type: ``enqueued``, ``leased``, ``step_started``, ``step_finished``, ``completed``, ``failed``,
            ``cancelled``, or a producer's own type.
        worker: the id of the worker (or server) that wrote it.
        data: what else the event says (a step's ``path``, ``ok``, ``error_code``, ...).
    """

    cursor: str
    at: float
    type: str
    worker: str | None = None
    data: dict[str, Any] = msgspec.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor, "at": self.at, "type": self.type, "worker": self.worker, **self.data}


class Renewal(msgspec.Struct, frozen=True):
    """What renewing a lease found: ``held`` (still this worker's) and ``cancel`` (cancelling was asked)."""

    held: bool
    cancel: bool = False


class RunRefused(Exception):
    """The queue does not take the run: its arguments are past ``[runs] max_run_bytes``, or the queue is
    full of live runs (``max_runs``, ``max_bytes``). The message says which, for the caller."""


NewEvent = tuple[str, dict[str, Any]]
"""An event to append: ``(type, data)``; the queue stamps the time, worker and cursor."""


@runtime_checkable
class RunQueue(Protocol):
    """Runs, their leases, their recorded steps and their events. Times are Unix seconds."""

    async def enqueue(
        self,
        target: str,
        args: Any,
        *,
        principal: str | None = None,
        run_id: str | None = None,
        by: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> RunInfo:
        """Add a run (status ``queued``) and its ``enqueued`` event; answers it."""
        ...

    async def suspend(self, run_id: str, worker: str, pending: dict[str, Any]) -> bool:
        """The run waits for its client's input (status ``input_required``, ``pending`` in its meta) and
        leaves ``worker``, if ``worker`` holds it; writes an ``input_required`` event."""
        ...

    async def answer(self, run_id: str, responses: dict[str, Any], *, by: str | None = None) -> RunInfo | None:
        """Take the client's answers to pending questions (by wire key); once none is pending, the run is
        queued again (a ``resumed`` event). None: no such run."""
        ...

    async def lease(self, worker: str, lease_s: float, wait_s: float) -> RunInfo | None:
        """Take the oldest queued run, or a running one whose lease has run out (its worker died), for
        ``lease_s``; waits up to ``wait_s`` for one. Writes a ``leased`` event. None when there is none."""
        ...

    async def renew(self, run_id: str, worker: str, lease_s: float) -> Renewal:
        """Extend ``worker``'s lease; says whether it still holds the run and whether cancel was asked."""
        ...

    async def save(self, run_id: str, worker: str, steps: dict[str, dict[str, Any]], events: list[NewEvent]) -> bool:
        """Record finished steps (by path) and append events, if ``worker`` still holds the run."""
        ...

    async def recorded(self, run_id: str) -> dict[str, dict[str, Any]]:
        """The results of the steps the run has finished, by path."""
        ...

    async def finish(self, run_id: str, worker: str, status: RunStatus, answer: Any) -> bool:
        """Make the run terminal with ``answer`` if ``worker`` still holds it (compare-and-set); writes the
        terminal event. False when another worker took it over, or it is terminal already."""
        ...

    async def cancel(self, run_id: str, *, by: str | None = None) -> RunInfo | None:
        """Cancel a run: a queued one at once, a running one by flagging it for its worker. None: no run."""
        ...

    async def get(self, run_id: str) -> RunInfo | None: ...

    async def runs(self, *, limit: int = 50, status: str | None = None) -> list[RunInfo]:
        """The newest runs first."""
        ...

    async def emit(self, run_id: str, worker: str | None, events: list[NewEvent]) -> None:
        """Append events to a run's log (see :mod:`mcpipe.store.events`)."""
        ...

    async def events(
        self, run_id: str, *, after: str | None = None, limit: int = 1000, wait_s: float = 0
    ) -> list[RunEvent]:
        """The run's events after cursor ``after`` (from the first when None), oldest first; when there are
        none yet, waits up to ``wait_s`` for one."""
        ...

    async def sweep(self) -> int:
        """Drop terminal runs (and their steps and events) older than the retention; answers how many."""
        ...

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Background work (connections, the retention sweeper): ``await nursery.start(queue.run)``."""
        ...

    def wake(self) -> None:
        """A run was enqueued in this process: wake this process's workers waiting in :meth:`lease`."""
        ...


QueueFactory = Callable[[str, dict[str, Any]], RunQueue]

_FACTORIES: dict[str, QueueFactory] = {}


def register_queue(scheme: str, factory: QueueFactory) -> None:
    """Make :func:`open_queue` build ``factory(url, options)`` for URLs of ``scheme``."""
    _FACTORIES[scheme] = factory


def queue_schemes() -> list[str]:
    return sorted(_FACTORIES)


def open_queue(url: str, **options: Any) -> RunQueue:
    """The run queue ``url`` names: ``sqlite:///PATH`` (or a bare path) or ``redis://HOST:PORT/DB``.

    Options: ``retention_s`` (how long terminal runs and their events are kept), ``prefix`` (Redis keys),
    ``timeout_s`` (Redis commands), ``poll_s`` (SQLite: how often an idle worker looks for work).

    Raises:
        ValueError: no queue is registered for the URL's scheme.
    """
    scheme = urlsplit(url).scheme
    if not scheme or len(scheme) == 1:  # a bare path (or a Windows drive letter): SQLite
        scheme = "sqlite"
    factory = _FACTORIES.get(scheme)
    if factory is None:
        raise ValueError(f"no run queue for {url!r} (known: {', '.join(f'{s}:' for s in queue_schemes())})")
    return factory(url, options)


def outcome_of(answer: Any) -> dict[str, Any]:
    """What a terminal event says of a run's answer: ``ok`` (and the pipeline's ``error_code``)."""
    if isinstance(answer, dict):
        s = answer.get("structuredContent")
        if isinstance(s, dict) and "error_code" in s:
            return {"ok": s.get("ok"), "error_code": s.get("error_code")}
        return {"ok": not answer.get("isError", False)}
    return {}


def cancelled_answer(message: str) -> dict[str, Any]:
    """The answer of a cancelled run (a ``CallToolResult`` wire dict)."""
    return {"content": [{"type": "text", "text": f"CANCELLED: {message}"}], "isError": True}


def merge_answers(meta: dict[str, Any], responses: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """``meta`` with ``responses`` (by wire key) moved from ``pending`` to ``answers`` (by question key);
    and whether nothing is pending any more."""
    pending = dict(meta.get("pending") or {})
    answers = dict(meta.get("answers") or {})
    for wire, response in responses.items():
        question = pending.pop(wire, None)
        if question is not None:
            answers[question["key"]] = response
    return {**meta, "pending": pending, "answers": answers}, not pending


_TEXT_OF_STRUCTURED = "mcpipe_text_is_structured"


def pack_answer(answer: Any) -> bytes:
    """``answer`` as the queue stores it: an answer whose one text block is the JSON of its structured content
    (``mcp_pipe``'s section-7 answer) keeps the structured content only (the text is written back by
    :func:`unpack_answer`), so a run's answer is not stored twice."""
    if isinstance(answer, dict):
        content = answer.get("content")
        structured = answer.get("structuredContent")
        if (
            structured is not None
            and isinstance(content, list)
            and len(content) == 1
            and isinstance(content[0], dict)
            and set(content[0]) == {"type", "text"}
            and content[0]["type"] == "text"
            and content[0]["text"] == dumps(structured).decode()
        ):
            rest = {k: v for k, v in answer.items() if k != "content"}
            return dumps({**rest, _TEXT_OF_STRUCTURED: True})
    return dumps(answer)


def unpack_answer(data: bytes | str | None) -> Any:
    """What :func:`pack_answer` stored, as it was."""
    if data is None:
        return None
    answer = orjson.loads(data)
    if isinstance(answer, dict) and answer.pop(_TEXT_OF_STRUCTURED, False):
        answer = {"content": [{"type": "text", "text": dumps(answer["structuredContent"]).decode()}], **answer}
    return answer


def too_large_answer(size: int, limit: int) -> dict[str, Any]:
    """The answer kept instead of one past ``[runs] max_run_bytes`` (a ``CallToolResult`` wire dict)."""
    message = (
        f"OUTPUT_TOO_LARGE: the run's answer is {size} bytes; a background run keeps at most {limit} with its "
        "arguments ([runs] max_run_bytes)"
    )
    return {"content": [{"type": "text", "text": message}], "isError": True}
