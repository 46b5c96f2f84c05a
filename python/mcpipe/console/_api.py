"""The console's JSON API, version 1: what each page shows, built from the run queue, the gateway and the metrics.

Every function here answers plain JSON data (the API's contract, ``docs/console.md``); the pages are templates
over the same data. Rights are the ``pipe_*`` tools': a viewer sees, cancels and retries its own runs (those
submitted under its principal); an operator (``[console] operators``, or an identity holding one of
``operator_roles``) sees every run and may act on any.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from mcpipe._util import PIPE_TOOL
from mcpipe.access import principal_key
from mcpipe.config import Config
from mcpipe.errors import ErrorCode, SpecError
from mcpipe.gateway import CallError, Gateway
from mcpipe.plan import Pipeline, plan_of

if TYPE_CHECKING:
    from mcpipe.plan import Drawing
from mcpipe.results import preview
from mcpipe.runs import Runs
from mcpipe.store import TERMINAL, RunEvent, RunInfo, RunRefused
from mcpipe.tools import Identity, Request, ToolContext

__all__ = ["API_VERSION", "ApiError", "ConsoleData", "Served", "Viewer", "parse_time"]

API_VERSION = "v1"

STATUSES = ("queued", "running", "input_required", "completed", "failed", "cancelled")
MAX_EVENTS = 20_000
"""The most events of one run the console reads for its page."""
SHOWN_EVENTS = 500
"""The most events a run's page lists (the newest); the steps and timeline use them all."""


class Served(Protocol):
    """What the console needs of the running server (:class:`mcpipe.server.App` is one)."""

    config: Config
    gateway: Gateway
    runs: Runs
    downstreams: Any


class ApiError(Exception):
    """A request the API refuses: ``status`` (400, 403, 404, 409, 503) and a one-line located message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.message}


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who is looking: the principal runs are submitted under (None: the anonymous caller), its identity, and
    whether it is an operator (sees and acts on every run)."""

    principal: str | None
    identity: Identity | None = None
    operator: bool = False
    roles: tuple[str, ...] = field(default=())

    def sees(self, info: RunInfo) -> bool:
        return self.operator or info.principal == self.principal

    def facts(self) -> dict[str, Any]:
        return {"principal": self.principal, "operator": self.operator, "roles": list(self.roles)}


def iso(t: float | None) -> str | None:
    """A Unix time as ISO 8601 in UTC, to the second (``2025-12-01T23:20:11Z``)."""
    if not t:
        return None
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(value: str, where: str, *, now: float | None = None) -> float:
    """A time filter: Unix seconds, an ISO 8601 date-time (UTC unless it says; a browser's ``datetime-local``
    value too), or an age (``30m``, ``2h``, ``1d``: that long ago).

    Raises:
        ApiError: none of these (400, located at ``where``).
    """
    text = value.strip()
    m = _RELATIVE.match(text)
    if m:
        return (time.time() if now is None else now) - float(m.group(1)) * _UNITS[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ApiError(
            400, "INVALID_ARGUMENTS", f"{where}: expected a date-time (2025-12-01T10:00), Unix seconds or an age (2h)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _json_text(value: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode()


def row_of(info: RunInfo) -> dict[str, Any]:
    """A run as the runs list shows it."""
    done = info.status in TERMINAL
    return {
        "run_id": info.id,
        "target": info.target,
        "status": info.status,
        "principal": info.principal,
        "created": iso(info.created),
        "created_at": info.created,
        "updated": iso(info.updated),
        "duration_s": round(info.updated - info.created, 3) if done else None,
        "worker": info.worker,
        "attempts": info.attempts,
        "cancel_requested": info.cancel,
    }


class ConsoleData:
    """The API's data (one per served app).

    Args:
        app: the running server.
        operators: the principals that are operators.
        operator_roles: the roles (of an OIDC identity's claims) that make one.
        config_path: the config file served, whose check's warnings the servers page shows.
    """

    def __init__(
        self,
        app: Served,
        *,
        operators: tuple[str, ...] = (),
        operator_roles: tuple[str, ...] = (),
        config_path: str | None = None,
        page_size: int = 50,
    ) -> None:
        from mcpipe.console._metrics import Sampler

        self.app = app
        self.queue = app.runs.queue
        self.operators = frozenset(operators)
        self.operator_roles = frozenset(operator_roles)
        self.config_path = config_path
        self.page_size = page_size
        self.sampler = Sampler()
        self._warnings: list[str] | None = None

    def viewer(self, identity: Identity | None) -> Viewer:
        """The viewer an identity is (None: the anonymous caller of a server without auth)."""
        if identity is None:
            return Viewer(None)
        principal = principal_key(identity)  # the subject in its source, as the runs' owners are named
        operator = principal in self.operators or bool(self.operator_roles & set(identity.roles))
        return Viewer(principal, identity, operator, tuple(identity.roles))

    # --- runs ---

    async def runs(self, viewer: Viewer, query: Mapping[str, str]) -> dict[str, Any]:
        """``GET /api/v1/runs``: a page of runs, newest first (filters ``status``, ``tool``, ``principal``,
        ``since``, ``until``; ``limit``; ``before``, the previous page's ``next``)."""
        status = query.get("status") or None
        if status is not None and status not in STATUSES:
            raise ApiError(400, "INVALID_ARGUMENTS", f"status: expected one of {', '.join(STATUSES)}")
        tool = (query.get("tool") or "").strip() or None
        if tool is not None and len(tool) > 256:
            raise ApiError(400, "INVALID_ARGUMENTS", "tool: at most 256 characters")
        who = query.get("principal")
        principals: tuple[str | None, ...] | None
        if not viewer.operator:
            principals = (viewer.principal,)  # a viewer's own runs, whatever it asks for
        elif who is None or who == "":
            principals = None
        else:
            principals = (None,) if who == "-" else (who,)
        since = parse_time(query["since"], "since") if query.get("since") else None
        until = parse_time(query["until"], "until") if query.get("until") else None
        try:
            limit = int(query.get("limit") or self.page_size)
        except ValueError:
            raise ApiError(400, "INVALID_ARGUMENTS", "limit: expected a number from 1 to 500") from None
        if not 1 <= limit <= 500:
            raise ApiError(400, "INVALID_ARGUMENTS", "limit: expected a number from 1 to 500")
        before = query.get("before") or None
        page = await self.queue.page(
            status=status, target=tool, principals=principals, since=since, until=until, before=before, limit=limit
        )
        filters = {
            "status": status,
            "tool": tool,
            "principal": who if viewer.operator else viewer.principal,
            "since": query.get("since") or None,
            "until": query.get("until") or None,
            "limit": limit,
        }
        return {
            "version": API_VERSION,
            "viewer": viewer.facts(),
            "filters": filters,
            "runs": [row_of(r) for r in page.runs],
            "next": page.next,
            "partial": page.partial,
        }

    async def _visible(self, viewer: Viewer, run_id: str) -> RunInfo:
        info = await self.queue.get(run_id) if len(run_id) <= 128 else None
        if info is None or not viewer.sees(info):
            # Another principal's run is not found, not forbidden: its existence is not told either.
            raise ApiError(404, "NOT_FOUND", f"no run {run_id!r}")
        return info

    async def _events(self, run_id: str) -> list[RunEvent]:
        out: list[RunEvent] = []
        after = None
        while len(out) < MAX_EVENTS:
            batch = await self.queue.events(run_id, after=after, limit=1000)
            out += batch
            if len(batch) < 1000:
                break
            after = batch[-1].cursor
        return out

    def drawing_of(self, info: RunInfo) -> tuple[Drawing | None, str | None]:
        """The drawing of a run's plan, and why there is none (a spec that does not compile, a tool that is no
        pipeline)."""
        plan, why = self._plan(info)
        from mcpipe.plan import drawn  # drawing is loaded with the first run page, not at start

        return (None, why) if plan is None else (drawn(plan), None)

    def _plan(self, info: RunInfo) -> tuple[Pipeline | None, str | None]:
        if info.target == PIPE_TOOL:
            from mcpipe.compile import compile_spec

            spec = info.args
            if isinstance(spec, dict) and "spec" in spec and "steps" not in spec:
                spec = spec["spec"]
            try:
                return compile_spec(spec).plan, None
            except SpecError as e:
                return None, f"the spec does not compile: {e}"
            except (TypeError, ValueError) as e:
                return None, f"the spec does not compile: {e}"
        tool = self.app.gateway.get(info.target)
        if tool is None:
            return None, f"tool {info.target!r} is not served now"
        plan = plan_of(tool)
        if plan is not None:
            return plan, None
        return None, f"{info.target!r} is a tool, not a pipeline: its run is one call"

    async def run(self, viewer: Viewer, run_id: str) -> dict[str, Any]:
        """``GET /api/v1/runs/{id}``: the run, its plan drawn and marked, its steps, timeline, errors and
        events."""
        info = await self._visible(viewer, run_id)
        events = await self._events(run_id)
        d, why = self.drawing_of(info)
        steps, marks, taken = _steps(events, d, info)
        args, args_bytes = preview(info.args)
        answer = None
        if info.answer is not None:
            shown, size = preview(_answer_body(info.answer), budget=6000)
            answer = {"value": shown, "text": _json_text(shown), "bytes": size, "is_error": _is_error(info.answer)}
        errors = _errors(info, steps)
        timeline = _timeline(info, events, steps)
        can_act = viewer.sees(info)
        return {
            "version": API_VERSION,
            "viewer": viewer.facts(),
            "run": {
                **row_of(info),
                "lapses": info.lapses,
                "args": args,
                "args_text": _json_text(args),
                "args_bytes": args_bytes,
                "answer": answer,
                "task": "capabilities" in info.meta,
            },
            "plan": None
            if d is None
            else {
                "mermaid": d.mermaid(),
                "states": marks,
                "taken": sorted(taken),
                "each": sorted(d.each),
                "svg": d.svg(
                    states=marks, taken=taken, standalone=False, title=f"plan of run {info.id}", link="#step-"
                ),
            },
            "plan_missing": why,
            "steps": steps,
            "timeline": timeline,
            "errors": errors,
            "events": [e.to_dict() for e in events[-SHOWN_EVENTS:]],
            "events_total": len(events),
            "next": events[-1].cursor if events else None,
            "can_cancel": can_act and info.status not in TERMINAL and not info.cancel,
            "can_retry": can_act and info.status in TERMINAL,
        }

    async def events(self, viewer: Viewer, run_id: str, after: str | None, limit: int = 1000) -> dict[str, Any]:
        """``GET /api/v1/runs/{id}/events``: the run's events after cursor ``after``."""
        info = await self._visible(viewer, run_id)
        batch = await self.queue.events(run_id, after=after, limit=max(1, min(limit, 1000)))
        return {
            "version": API_VERSION,
            "run_id": run_id,
            "status": info.status,
            "events": [e.to_dict() for e in batch],
            "next": batch[-1].cursor if batch else after,
        }

    async def cancel(self, viewer: Viewer, run_id: str) -> dict[str, Any]:
        """``POST /api/v1/runs/{id}/cancel``: as ``pipe_cancel`` (a queued run never starts; a running one is
        stopped by its worker)."""
        info = await self._visible(viewer, run_id)
        if info.status in TERMINAL:
            raise ApiError(409, "CONFLICT", f"run {run_id!r} is {info.status} already")
        done = await self.queue.cancel(run_id, by=self.app.runs.server_id)
        if done is None:
            raise ApiError(404, "NOT_FOUND", f"no run {run_id!r}")
        return {"version": API_VERSION, "run": row_of(done)}

    async def retry(self, viewer: Viewer, run_id: str) -> dict[str, Any]:
        """``POST /api/v1/runs/{id}/retry``: a new run of the same target and arguments, submitted by the
        viewer (its principal, its identity: the gates judge it as they would its own call)."""
        info = await self._visible(viewer, run_id)
        if info.status not in TERMINAL:
            raise ApiError(409, "CONFLICT", f"run {run_id!r} is {info.status}: cancel it first, or wait")
        ctx = ToolContext(
            request_id=f"console-retry-{run_id}",
            client={"name": "mcpipe-console", "version": API_VERSION},
            principal=viewer.principal,
            request=Request(identity=viewer.identity),
            tools=self.app.gateway,
        )
        gateway = self.app.gateway
        if info.target != PIPE_TOOL and gateway.get(info.target) is None:
            raise ApiError(409, "CONFLICT", f"tool {info.target!r} is not served now")
        if not gateway.allows(info.target, ctx):
            raise ApiError(403, ErrorCode.FORBIDDEN, f"tool {info.target!r} is not allowed for this caller")
        try:
            gateway.admit(info.target, info.args if isinstance(info.args, dict) else {}, ctx)
        except CallError as exc:
            raise ApiError(403, exc.code, str(exc)) from None
        try:
            new = await self.app.runs.submit(info.target, info.args, ctx, meta={"retry_of": info.id})
        except RunRefused as exc:
            raise ApiError(503, ErrorCode.LIMIT_EXCEEDED, str(exc)) from None
        return {"version": API_VERSION, "run": row_of(new), "retry_of": info.id}

    # --- servers and tools ---

    def servers(self, viewer: Viewer) -> dict[str, Any]:
        """``GET /api/v1/servers``: each downstream server's health, latency and error rate, the tools the viewer
        may call (by where they come from), the declared pipelines, playbooks and formats loaded, and the
        config check's warnings."""
        gateway = self.app.gateway
        ctx = ToolContext(principal=viewer.principal, request=Request(identity=viewer.identity))
        summary = self.sampler.summary()
        latency = {row["server"]: row for row in summary["downstream"]}
        servers = []
        for s in getattr(self.app.downstreams, "servers", []):
            row = latency.get(s.name, {})
            servers.append(
                {
                    "name": s.name,
                    "state": s.state,
                    "last_error": s.last_error,
                    "transport": "stdio" if s.config.command else "http",
                    "tools": sorted(t for t in s.tools if gateway.allows(t, ctx)),
                    "calls": row.get("calls", 0),
                    "error_rate": row.get("error_rate"),
                    "p50_ms": row.get("p50_ms"),
                    "p99_ms": row.get("p99_ms"),
                }
            )
        tools: list[dict[str, Any]] = []
        pipelines: list[dict[str, Any]] = []
        playbooks: list[dict[str, Any]] = []
        for t in gateway:
            name = getattr(t, "name", "")
            if not gateway.allows(name, ctx):
                continue
            origin = _origin(t)
            tools.append({"name": name, "origin": origin, "description": _first_line(getattr(t, "description", ""))})
            if origin == "pipeline":
                pipelines.append({"name": name, "location": getattr(t, "location", None)})
            elif origin == "playbook":
                pb = getattr(t, "playbook", None)
                playbooks.append(
                    {"name": name, "path": getattr(pb, "path", None), "layout": getattr(pb, "layout", None)}
                )
        cfg = self.app.config
        if cfg.pipe.enabled and gateway.allows(PIPE_TOOL, ctx) and all(t["name"] != PIPE_TOOL for t in tools):
            tools.append({"name": PIPE_TOOL, "origin": "mcp_pipe", "description": "Run a pipeline of tool calls"})
        formats = sorted({f for t in tools if (f := _format_of(t)) is not None})
        return {
            "version": API_VERSION,
            "viewer": viewer.facts(),
            "name": cfg.name,
            "servers": servers,
            "tools": sorted(tools, key=lambda t: (t["origin"], t["name"])),
            "pipelines": pipelines,
            "playbooks": playbooks,
            "formats": formats,
            "warnings": self.warnings(),
        }

    def warnings(self) -> list[str]:
        """The warnings ``mcpipe check --config`` says of the served file (read once)."""
        if self._warnings is None:
            self._warnings = []
            if self.config_path:
                from mcpipe.config import ConfigError, load_config
                from mcpipe.errors import Problem

                found: list[Problem] = []
                try:
                    load_config(self.config_path, warnings=found)
                except ConfigError as exc:
                    self._warnings = [f"the file no longer loads: {exc.problems[0]}"] if exc.problems else []
                self._warnings += list(dict.fromkeys(str(w) for w in found))
        return self._warnings

    # --- metrics ---

    def metrics(self, viewer: Viewer) -> dict[str, Any]:
        """``GET /api/v1/metrics``: the metrics at a glance (read from what ``/metrics`` counts); a viewer who is
        not an operator sees only its own principal's row among the principals."""
        out = self.sampler.summary()
        if not viewer.operator:
            mine = viewer.principal or ""
            out["principals"] = [p for p in out["principals"] if (p["principal"] or "") == mine]
        return {"version": API_VERSION, "viewer": viewer.facts(), **out}


def _first_line(text: str) -> str:
    return (text or "").strip().split("\n", 1)[0][:200]


def _origin(tool: object) -> str:
    if getattr(tool, "server", None) is not None and hasattr(tool, "remote_name"):
        return "downstream"
    if getattr(tool, "compiled", None) is not None:
        return "pipeline"
    if getattr(tool, "playbook", None) is not None:
        return "playbook"
    if getattr(tool, "name", "") == PIPE_TOOL:
        return "mcp_pipe"
    return "function"


def _format_of(tool: dict[str, Any]) -> str | None:
    return {"playbook": "noetl", "pipeline": "declared pipelines", "downstream": "mcpServers"}.get(tool["origin"])


def _answer_body(answer: object) -> Any:
    if isinstance(answer, dict):
        if answer.get("structuredContent") is not None:
            return answer["structuredContent"]
        content = answer.get("content")
        if isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict):
            return content[0].get("text", content[0])
    return answer


def _is_error(answer: object) -> bool:
    return isinstance(answer, dict) and bool(answer.get("isError"))


def _state(row: Mapping[str, object]) -> str:
    if row["finished_at"] is None:
        return "running"
    if row.get("skipped"):
        return "skipped"
    if row["ok"]:
        return "ok"
    return "cancelled" if row.get("error_code") == ErrorCode.CANCELLED else "failed"


_RANK = {"pending": 0, "skipped": 1, "ok": 2, "cancelled": 3, "running": 4, "failed": 5}


def _steps(
    events: list[RunEvent], d: Drawing | None, info: RunInfo
) -> tuple[list[dict[str, Any]], dict[str, str], set[str]]:
    """The run's steps from its events (each run of a step a row, in the order they started), the state of
    each drawn step, and the arcs taken (by location)."""
    rows: list[dict[str, Any]] = []
    open_: dict[str, dict[str, Any]] = {}
    row: dict[str, Any] | None
    taken: set[str] = set()
    where = {s.key: s.location for s in d.shapes} if d is not None else {}
    base = info.created
    for e in events:
        data = e.data
        path = data.get("path")
        if not isinstance(path, str):
            continue
        if e.type == "step_started":
            key = d.key_of(path) if d is not None else path
            row = {
                "path": path,
                "key": key,
                "anchor": "step-" + key,
                "depth": path.count("/"),
                "location": where.get(key),
                "kind": data.get("kind"),
                "started_at": e.at,
                "start_ms": round((e.at - base) * 1000, 1),
                "finished_at": None,
                "duration_ms": None,
                "ok": None,
                "error": None,
                "error_code": None,
                "attempts": None,
                "args": data.get("args"),
                "args_text": _json_text(data["args"]) if "args" in data else None,
                "args_bytes": data.get("args_bytes"),
                "output": None,
                "output_text": None,
                "output_bytes": None,
                "via": data.get("via") or [],
                "worker": e.worker,
            }
            via = data.get("via")
            for loc in via if isinstance(via, list) else ():
                if isinstance(loc, str):
                    taken.add(loc)
            rows.append(row)
            open_[path] = row
        elif e.type == "step_finished":
            row = open_.pop(path, None)
            if row is None:  # finished without a start we kept (events dropped past the bounds)
                key = d.key_of(path) if d is not None else path
                row = {"path": path, "key": key, "anchor": "step-" + key, "depth": path.count("/"),
                       "location": where.get(key), "kind": data.get("kind"), "started_at": None, "start_ms": None,
                       "args": None, "args_text": None, "args_bytes": None, "via": [], "worker": e.worker}  # fmt: skip
                rows.append(row)
            row.update(
                finished_at=e.at,
                duration_ms=data.get("duration_ms"),
                ok=bool(data.get("ok")),
                error=data.get("error"),
                error_code=data.get("error_code"),
                attempts=data.get("attempts"),
                skipped=bool(data.get("skipped")),
                output=data.get("output"),
                output_text=_json_text(data["output"]) if "output" in data else None,
                output_bytes=data.get("output_bytes"),
            )
            if row.get("kind") is None:
                row["kind"] = data.get("kind")
    ended = info.status in TERMINAL
    marks: dict[str, str] = {}
    anchors: set[str] = set()
    for row in rows:
        row["first"] = row["anchor"] not in anchors
        anchors.add(row["anchor"])
        state = _state(row)
        if state == "running" and ended:
            state = "cancelled"  # started, never finished: the run ended under it
        row["state"] = state
        if row["depth"]:
            continue  # a step of a pipeline a step ran: its row is shown, the drawing marks the calling step
        key = row["key"]
        if _RANK[state] > _RANK.get(marks.get(key, "pending"), 0):
            marks[key] = state
    return rows, marks, taken


def _errors(info: RunInfo, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where the run failed: each failed step (its path, location, code and message), then the run's own error
    and the problems of a spec that did not compile (each located)."""
    out: list[dict[str, Any]] = []
    for row in steps:
        if row.get("state") == "failed":
            out.append(
                {
                    "path": row["path"],
                    "anchor": row["anchor"],
                    "location": row["location"],
                    "code": row["error_code"],
                    "message": row["error"] or "",
                }
            )
    body = _answer_body(info.answer) if info.answer is not None else None
    if isinstance(body, dict) and body.get("ok") is False:
        for p in body.get("problems") or []:
            if isinstance(p, dict):
                out.append({"path": None, "anchor": None, "location": p.get("location"), "code": p.get("code"),
                            "message": p.get("message")})  # fmt: skip
        if body.get("error"):
            out.append({"path": None, "anchor": None, "location": "the run", "code": body.get("error_code"),
                        "message": str(body["error"])[:2000]})  # fmt: skip
    elif _is_error(info.answer) and not out:
        text = body if isinstance(body, str) else _json_text(body)
        out.append({"path": None, "anchor": None, "location": "the run", "code": None, "message": text[:2000]})
    return out


def _timeline(info: RunInfo, events: list[RunEvent], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's time: when it waited in the queue, each step's span, and each wait on its client (from
    ``input_required`` to ``resumed``), in milliseconds from the run's creation."""
    base = info.created
    end = info.updated if info.status in TERMINAL else time.time()
    waits: list[dict[str, Any]] = []
    queued: list[dict[str, Any]] = []
    waiting_since: float | None = None
    queued_since: float | None = base
    for e in events:
        if e.type == "leased" and queued_since is not None:
            queued.append(
                {"start_ms": round((queued_since - base) * 1000, 1), "end_ms": round((e.at - base) * 1000, 1)}
            )
            queued_since = None
        elif e.type == "input_required":
            waiting_since = e.at
        elif e.type == "resumed":
            if waiting_since is not None:
                waits.append({"start_ms": round((waiting_since - base) * 1000, 1),
                              "end_ms": round((e.at - base) * 1000, 1)})  # fmt: skip
            waiting_since = None
            queued_since = e.at
    if waiting_since is not None:
        waits.append({"start_ms": round((waiting_since - base) * 1000, 1), "end_ms": None})
    total_ms = round(max(end - base, 0.001) * 1000, 1)
    bars = []
    for row in steps:
        if row["start_ms"] is None:
            continue
        if row["finished_at"] is not None:
            length = (row["finished_at"] - row["started_at"]) * 1000
        else:
            length = (end - row["started_at"]) * 1000
        bars.append(
            {
                "path": row["path"],
                "anchor": row["anchor"],
                "state": row["state"],
                "start_ms": row["start_ms"],
                "length_ms": round(max(length, 0.0), 1),
                "attempts": row["attempts"],
            }
        )
    return {"total_ms": total_ms, "queued": queued, "waits": waits, "steps": bars}
