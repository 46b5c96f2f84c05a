"""A NoETL playbook run on the scheduler, and its answer in NoETL's shape.

:func:`run_noetl` runs a compiled playbook's plan (the call's arguments are NoETL's execution payload, laid
over the ``workload``) and adds ``noetl`` to the scheduler's answer: the run as NoETL reports it (the shape
``noetl-oracle``'s ``normalize.py`` gives a real NoETL run, so the two compare)::

    {"playbook": NAME, "status": "completed" | "failed",
     "steps": {STEP: [RESULT, ...]},    # each step's result; a loop step's, one per item, in order
     "failed_steps": [STEP, ...],        # sorted
     "final": RESULT}                     # the result of the step that ended the workflow
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from mcpipe.formats.noetl._scope import loop_runs
from mcpipe.formats.noetl._steps import EVENTS, EXECUTION_ID, step_of
from mcpipe.formats.noetl._workflow import NoetlPlaybook
from mcpipe.formats.noetl.toolkinds import NOETL_DUCKDB_DIR
from mcpipe.plan import CompiledSpec, Limits
from mcpipe.tools import ToolContext, ToolResult

__all__ = ["NoTools", "noetl_answer", "registry_of", "run_noetl", "run_plan"]

EventFn = Callable[[dict[str, Any]], None]


class NoTools:
    """The registry of a playbook run without tools: every name unknown."""

    def __contains__(self, name: object) -> bool:
        return False

    def allows(self, name: str, ctx: ToolContext) -> bool:
        return True

    async def call(self, name: str, args: Mapping[str, object], ctx: ToolContext) -> ToolResult:
        return ToolResult.error(f"UNKNOWN_TOOL: no tools here ('{name}')")


async def run_noetl(
    pb: NoetlPlaybook,
    args: Mapping[str, object],
    ctx: ToolContext | None = None,
    *,
    limits: Limits | None = None,
    on_event: EventFn | None = None,
) -> dict[str, Any]:
    """Run the playbook; answers the scheduler's answer (``ok``, ``result``, ``steps``, ``summary``...) with
    ``noetl``, the run in NoETL's shape (see the module)."""
    base = ctx if ctx is not None else ToolContext()
    assert pb.plan is not None
    given = dict(args)
    run_id = given[EXECUTION_ID] = str(10**17 + secrets.randbelow(9 * 10**17))
    # A sub-playbook is an execution of its own, as in NoETL: its steps' events are not its parent's.
    try:
        answer = await run_plan(pb.plan, registry_of(pb, base), base, limits or pb.limits, given, on_event, on_event)
    finally:
        _drop_execution_database(run_id)
    answer["noetl"] = noetl_answer(pb, answer)
    return answer


async def run_plan(
    plan: CompiledSpec,
    registry: Any,
    ctx: ToolContext,
    limits: Limits | None,
    args: dict[str, Any],
    on_event: EventFn | None,
    events: EventFn | None,
) -> dict[str, Any]:
    """A playbook's plan run on the scheduler, its tools called through ``registry``: the scheduler's events go
    to ``on_event``, the playbook's own (a step's ``step_exit``, a turn's tool calls, :data:`~._steps.EVENTS`)
    to ``events``."""
    from mcpipe.runtime import run_compiled

    run_ctx = replace(ctx.for_step(None, ctx.step), tools=registry)
    token = EVENTS.set(events)
    try:
        return await run_compiled(plan, registry, context=run_ctx, limits=limits, on_event=on_event, args=args)
    finally:
        EVENTS.reset(token)


def registry_of(pb: object, ctx: ToolContext) -> Any:
    """What a playbook's ``tool`` tasks call through: the registry it is bound to, else the call's, else none
    at all (every tool unknown)."""
    registry = getattr(pb, "registry", None)
    registry = registry if registry is not None else ctx.tools
    return registry if registry is not None else NoTools()


def _drop_execution_database(run_id: str) -> None:
    """Remove the DuckDB file a ``duckdb`` task without a ``database`` used (NoETL's file per execution): once
    the run is over nothing reads it, and kept, every call left one more file behind (a caller's loop of calls
    filled the disk with them, their tables included)."""
    for suffix in ("", ".wal"):
        with contextlib.suppress(OSError):
            os.unlink(NOETL_DUCKDB_DIR / f"duckdb_{run_id}.duckdb{suffix}")


def noetl_answer(pb: NoetlPlaybook, answer: Mapping[str, Any]) -> dict[str, Any]:
    """The run in NoETL's shape (see the module) from the scheduler's answer."""
    steps: dict[str, list[Any]] = {}
    failed: set[str] = set()
    for key, r in (answer.get("steps") or {}).items():
        sid = step_of(key)  # a step run again (an arc back to it): each run's results after the last's
        if sid not in pb.steps or sid in pb.routers or not isinstance(r, Mapping):
            continue
        loop = r.get("kind") == "for_each"
        if r.get("skipped") and not loop:
            continue
        results = steps.setdefault(sid, [])
        for run in loop_runs(r) if loop else [r]:
            results.append(_result_of(run))
            if not run.get("ok"):
                failed.add(sid)
    ok = bool(answer.get("ok"))
    graph = (answer.get("steps") or {}).get(pb.graph_id) or {}
    final = _context(graph.get("output"))
    last = pb.steps.get(step_of(str(graph.get("output_from"))))
    if last is not None and (last.pipeline or any(t.rules for t in last.tasks)):
        final = None  # NoETL 4.26 reports no final result when the last step was a pipeline (a task sequence)
    if final is None and not graph.get("ran"):  # the run failed before any step ran
        final = {"status": "failed", "error": answer.get("error"), "error_code": answer.get("error_code")}
    return {
        "playbook": pb.name,
        "status": "completed" if ok else "failed",
        "steps": steps,
        "failed_steps": sorted(failed),
        "final": final,
    }


def _context(result: object) -> Any:
    """A result as NoETL's events report it: its ``context`` (NoETL keeps a result's own ``context`` key as
    its context, and adds the result itself as ``context`` when it has none)."""
    if isinstance(result, Mapping) and isinstance(result.get("context"), Mapping):
        return result["context"]
    return result


def _result_of(r: Mapping[str, object]) -> Any:
    """A step's result as NoETL reports it: its result (its context), or for a failed step its error result."""
    out = r.get("output")
    if r.get("ok"):
        return _context(out)
    if isinstance(out, Mapping) and out.get("status") in ("error", "failed"):
        return dict(out)
    return {"status": "error", "error": r.get("error"), "error_code": r.get("error_code")}
