"""The run queue: pipelines that outlive the request that started them.

A :class:`RunQueue` holds runs (a target, its arguments, who asked), hands them to workers under a lease,
keeps the results of the steps a run has finished (so a run taken over from a dead worker resumes after
its last recorded step), takes the final answer exactly once, and keeps each run's events. Two queues
implement it: SQLite (the embedded default: in memory for one process, or one file shared by the processes
of one box) and Redis Streams (``redis://``, shared by many boxes). Both register their URL scheme with
:func:`register_queue`. Both apply the same bounds (:class:`Bounds`): what one run keeps (``max_run_bytes``,
its events included, and ``max_run_events``), how many runs and bytes of runs the queue keeps (``max_runs``,
``max_bytes``: the oldest finished runs are dropped first), how many live runs one principal may have
(``max_runs_per_principal``, ``max_bytes_per_principal``), and how long a run may wait for its client's
input (``parked_ttl_s``: then it fails, and its room is freed).

Leases, not locks: a worker holds a run for ``lease_s`` and renews it while it runs. A worker that dies
stops renewing, and once the lease has run out another worker takes the run over. Finishing is a
compare-and-set on (run, worker): a worker whose lease was taken over cannot finish the run a second time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import urlsplit

import msgspec
import orjson
import trio

from mcpipe._json import dumps

__all__ = [
    "ACTIVE",
    "EVENT_TYPES",
    "LIFECYCLE",
    "TERMINAL",
    "Bounds",
    "QueueFactory",
    "Renewal",
    "RunEvent",
    "RunInfo",
    "RunPage",
    "RunQueue",
    "RunRefused",
    "RunStatus",
    "cancelled_answer",
    "event_blob",
    "expired_answer",
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

LIFECYCLE: frozenset[str] = frozenset(
    {"enqueued", "leased", "input_required", "resumed", "completed", "failed", "cancelled", "events_dropped"}
)
"""Events a run's log keeps past its event bounds (there are few of them: they say where the run is)."""

RETENTION_S = 7 * 86400.0
MAX_RUN_BYTES = 16 * 1024 * 1024
MAX_RUNS = 1000
MAX_BYTES = 256 * 1024 * 1024
MAX_RUNS_PER_PRINCIPAL = 250
MAX_BYTES_PER_PRINCIPAL = 64 * 1024 * 1024
MAX_RUN_EVENTS = 10_000
PARKED_TTL_S = 3600.0

MAX_EVENT_BYTES = 4096
"""The most one event's data keeps (its JSON): longer strings in it are cut (a step path of a 40 KB id)."""
EVENT_OVERHEAD = 64
"""What one event is charged beyond its type and data (its time, writer, cursor, and the store's own)."""


class Bounds(msgspec.Struct, frozen=True, kw_only=True):
    """What a run queue keeps, at most (``[runs]`` in the config; ``docs/runs.md``).

    Attributes:
        max_run_bytes: one run: its arguments, recorded steps, events and answer (stored JSON).
        max_run_events: events of one run (its lifecycle events are kept past it).
        max_runs, max_bytes: runs, and bytes of runs, the queue keeps (the oldest finished are dropped first).
        max_runs_per_principal, max_bytes_per_principal: live runs (queued, running, waiting for input), and
            their bytes, of one principal.
        parked_ttl_s: how long a run may wait for its client's input (``input_required``); then it fails.
        retention_s: how long a finished run is kept.
    """

    max_run_bytes: int = MAX_RUN_BYTES
    max_run_events: int = MAX_RUN_EVENTS
    max_runs: int = MAX_RUNS
    max_bytes: int = MAX_BYTES
    max_runs_per_principal: int = MAX_RUNS_PER_PRINCIPAL
    max_bytes_per_principal: int = MAX_BYTES_PER_PRINCIPAL
    parked_ttl_s: float = PARKED_TTL_S
    retention_s: float = RETENTION_S

    def too_large(self, size: int) -> RunRefused:
        return RunRefused(
            f"the run's arguments are {size} bytes; a background run keeps at most {self.max_run_bytes}"
            " ([runs] max_run_bytes)"
        )

    def full_count(self, live: int) -> RunRefused:
        runs = "1 run is" if live == 1 else f"{live} runs are"
        return RunRefused(
            f"the run queue is full: {runs} queued or running, the most it keeps is {self.max_runs} "
            "([runs] max_runs); try again once some have finished"
        )

    def full_bytes(self, live: int, total: int, size: int) -> RunRefused:
        return RunRefused(
            f"the run queue is full: its queued or running runs ({live}) hold {total} bytes, and this one {size} "
            f"more; the most it keeps is {self.max_bytes} ([runs] max_bytes); try again once some have finished"
        )

    def principal_count(self, principal: str | None, live: int) -> RunRefused:
        return RunRefused(
            f"{_whose(principal)} {live} runs queued, running or waiting for input; one principal may have at most "
            f"{self.max_runs_per_principal} ([runs] max_runs_per_principal); try again once some have finished"
        )

    def principal_bytes(self, principal: str | None, total: int, size: int) -> RunRefused:
        return RunRefused(
            f"{_whose(principal)} runs queued, running or waiting for input holding {total} bytes, and this one "
            f"{size} more; one principal may have at most {self.max_bytes_per_principal} "
            "([runs] max_bytes_per_principal); try again once some have finished"
        )


def _whose(principal: str | None) -> str:
    return "this caller has" if principal is None else f"principal {principal!r} has"


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


class RunPage(msgspec.Struct, kw_only=True):
    """One page of a filtered list of runs, newest first (:meth:`RunQueue.page`).

    Attributes:
        runs: the runs of the page, without their arguments, answers or meta (what :meth:`RunInfo.summary`
            shows).
        next: the cursor of the next (older) page, or None on the last one.
        scanned: how many runs were looked at to fill the page; a queue that filters as it reads (Redis)
            stops at ``max_scan`` and says so with ``partial``.
        partial: the scan stopped before the page was full or the runs ran out: older runs may still match.
    """

    runs: list[RunInfo]
    next: str | None = None
    scanned: int = 0
    partial: bool = False


MAX_PAGE = 500
"""The most runs one :meth:`RunQueue.page` answers."""

MAX_SCAN = 20_000
"""The most runs a queue that filters as it reads (Redis) looks at for one page."""


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

    async def page(
        self,
        *,
        status: str | None = None,
        target: str | None = None,
        principals: tuple[str | None, ...] | None = None,
        since: float | None = None,
        until: float | None = None,
        before: str | None = None,
        limit: int = 50,
    ) -> RunPage:
        """The newest runs matching every filter given, ``limit`` at most (up to :data:`MAX_PAGE`), after
        cursor ``before`` (a page's ``next``): ``status``, ``target`` (the tool or ``mcp_pipe``),
        ``principals`` (the run's principal is one of them; None among them is the anonymous caller), created
        at or after ``since`` and before ``until`` (Unix seconds). Runs come without their arguments and
        answers."""
        ...

    async def counts(self) -> dict[str, int]:
        """How many runs the queue holds, by status (``queued``, ``running``, ``input_required``, and the
        finished ones): its depth."""
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


def open_queue(url: str, **options: object) -> RunQueue:
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


def outcome_of(answer: object) -> dict[str, Any]:
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


def pack_answer(answer: object) -> bytes:
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
        "arguments and events ([runs] max_run_bytes)"
    )
    return {"content": [{"type": "text", "text": message}], "isError": True}


REQUEST_TIMEOUT = -32001


def expired_answer(ttl_s: float) -> dict[str, Any]:
    """The answer of a run that waited for its client's input longer than ``[runs] parked_ttl_s``: a failed
    call (a task reports it ``failed`` with this JSON-RPC error)."""
    message = (
        f"TIMEOUT: the run waited for its client's input for more than {ttl_s:g} s ([runs] parked_ttl_s); it was ended"
    )
    return {
        "content": [{"type": "text", "text": message}],
        "isError": True,
        "error": {"code": REQUEST_TIMEOUT, "message": message},
    }


_CUT = 256


def _cut(value: object) -> Any:
    if isinstance(value, str):
        return value if len(value) <= _CUT else f"{value[:_CUT]}... ({len(value)} characters)"
    if isinstance(value, dict):
        return {str(k)[:_CUT]: _cut(v) for k, v in list(value.items())[:32]}
    if isinstance(value, list):
        return [_cut(v) for v in value[:32]]
    return value


def event_blob(data: Mapping[str, object]) -> bytes:
    """An event's data as a queue stores it: its JSON, at most about :data:`MAX_EVENT_BYTES` (long strings,
    many keys or items are cut, saying how long they were)."""
    blob = orjson.dumps(data)
    if len(blob) <= MAX_EVENT_BYTES:
        return blob
    cut = _cut(data)
    blob = orjson.dumps(cut)
    if len(blob) <= MAX_EVENT_BYTES:
        return blob
    # Still too large: the short scalars stay (a step event's path, ok, error_code), the rest goes.
    kept = {
        k: v
        for k, v in cut.items()
        if v is None or isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= _CUT)
    }
    return orjson.dumps({**kept, "truncated": len(blob)})
