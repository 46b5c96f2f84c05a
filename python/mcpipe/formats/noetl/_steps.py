"""How a NoETL step runs inside the plan: its scope, its tasks, its result, its ``set`` and its arcs.

:func:`run_step` is the executor of every step's leaf (``run(step, inputs, env, ctx)``): it builds the
step's template scope (:mod:`mcpipe.formats.noetl._scope`) from the run's environment (the call's
arguments, the results so far, the arcs it was reached by, its loop item), runs its task or pipeline of
tasks with their policy rules (``retry``, ``jump``, ``break``, ``fail``, ``continue``), and answers NoETL's
result for the step; the variables its ``set`` writes go beside the result (``noetl_set``), where the next
steps' scopes find them. :class:`ArcWhen` decides an arc (the graph asks it once the step is done) and
:class:`LoopItems` gives a loop's items.

A tool's result is NoETL's: ``python``'s ``result``, ``http``'s ``{status_code, headers, url, elapsed,
data}``, a pipeline's last result with ``_prev``, ``results`` and ``ctx`` laid over it. A result whose
``status`` is ``error`` or ``failed`` fails the step, as NoETL's worker decides.
"""

from __future__ import annotations

import contextvars
import os
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

import orjson
import trio

from mcpipe._describe import json_type
from mcpipe.errors import ErrorCode, ExpressionError
from mcpipe.expr._jinja import Compiled, render_async
from mcpipe.formats.noetl import toolkinds
from mcpipe.formats.noetl._catalog import MAX_DEPTH, identity
from mcpipe.formats.noetl._layout import ArcSpec, CaseRetry, OutputSpec, Rule
from mcpipe.formats.noetl._save import as_text, column_name, duckdb_table_sql, insert_sql
from mcpipe.formats.noetl._scope import (
    SET_FACT,
    Environ,
    Keychain,
    apply_set,
    loop_result,
    loop_runs,
    output_view,
    secret_value,
    wrap,
)
from mcpipe.formats.noetl._sqlbind import SqlTemplate, rendered_sql, sql_template
from mcpipe.formats.noetl._tmpl import RenderError, Tmpl, truthy
from mcpipe.formats.noetl._workflow import ArcPlan, NoetlPlaybook, PaginatePlan, RulePlan, SavePlan, StepPlan, TaskPlan
from mcpipe.kinds import ForbiddenError
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = [
    "EVENTS",
    "ArcWhen",
    "LoopItems",
    "latest",
    "run_loop_save",
    "run_save",
    "run_step",
    "scope_of",
    "step_of",
    "step_results",
    "with_save",
]

EVENTS: contextvars.ContextVar[Callable[[dict[str, Any]], None] | None] = contextvars.ContextVar(
    "mcpipe_playbook_events", default=None
)
"""The running playbook's event sink: each step's ``step_exit`` (its NoETL result) goes through it, and seed
004's turns report their tool calls through it (:mod:`._run`). A context variable: the run's tasks inherit it,
and nothing else sees it."""

_RUNNING: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("mcpipe_noetl_running", default=())
"""The playbooks a sub-playbook runs in (their :func:`~mcpipe.formats.noetl._catalog.identity`, outermost
first): a ``playbook`` task refuses one of them (a cycle, whatever spelling its path used) and a chain deeper
than :data:`~mcpipe.formats.noetl._catalog.MAX_DEPTH`."""


# --- the scope ---


def step_results(pb: NoetlPlaybook, env: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(variables, results)`` from the run so far: the workload with the call's arguments and every
    finished step's ``set`` laid over it, in the order the steps finished; each successful step's result
    by name (a loop step's: ``{results, stats}``)."""
    args = env.get("args") or {}
    variables: dict[str, Any] = dict(pb.workload)
    for k, v in args.items():
        if k == EXECUTION_ID:
            continue
        if k == "ctx" and isinstance(v, Mapping):
            variables.update(v)
        else:
            variables[k] = v
    results: dict[str, Any] = {}
    for key, r in (env.get("steps") or {}).items():
        sid = step_of(key)
        if sid not in pb.steps or not isinstance(r, Mapping):
            continue
        if r.get("kind") == "for_each":
            runs = loop_runs(r)
            for ch in runs:
                if ch.get(SET_FACT):
                    apply_set(variables, ch[SET_FACT])
            value: Any = loop_result(runs)
        else:
            if r.get(SET_FACT):
                apply_set(variables, r[SET_FACT])
            if not r.get("ok") or sid in pb.routers:
                continue
            value = r.get("output")
            if value is None:
                continue
            if pb.layout == "v1" and isinstance(value, Mapping) and "data" in value:
                value = value["data"]  # NoETL 1.x reads a result's `data` as the result
        results[sid] = value
        variables[sid] = value
    return variables, results


def step_of(key: str) -> str:
    """The step a result of the run is of: ``fetch#3`` (the third run of ``fetch``, reached again by an arc
    back to it) is ``fetch``'s."""
    base, mark, n = key.rpartition("#")
    return base if mark and n.isdigit() else key


def _runs(steps: Mapping[str, object], name: str) -> int:
    """How many times ``name`` has run (``name``, ``name#2``, ``name#3``... in ``steps``)."""
    if name not in steps:
        return 0
    n = 2
    while f"{name}#{n}" in steps:
        n += 1
    return n - 1


def latest(steps: Mapping[str, object], name: str) -> Any:
    """The result of ``name``'s latest run (``name``, ``name#2``, ``name#3``... in ``steps``), or None."""
    n = _runs(steps, name)
    return steps.get(name if n < 2 else f"{name}#{n}")


_PROTECTED = ("execution_id", "catalog_id", "job")


EXECUTION_ID = "_noetl_execution_id"
"""The argument a run's execution id travels in (set by :func:`mcpipe.formats.noetl._serve.run_noetl`,
never a variable)."""


def execution_id(env: Mapping[str, Any]) -> str:
    """The run's id, as NoETL writes its execution ids (a number of 18 digits)."""
    return str((env.get("args") or {}).get(EXECUTION_ID) or "")


def scope_of(
    pb: NoetlPlaybook,
    env: Mapping[str, object],
    iterator: str | None = None,
    extra: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    """The names a template of a step sees (NoETL's ``get_render_context``)."""
    variables, results = step_results(pb, env)
    if extra:
        variables.update(extra)
    ctx = wrap(variables)
    scope: dict[str, Any] = {"ctx": ctx, "workload": ctx, "vars": ctx, "iter": {}}
    if iterator is not None and "item" in env:
        item, index = env["item"], env.get("index", 0)
        scope["iter"] = {iterator: wrap(item), "_index": index, "_first": index == 0}
        scope["loop"] = {"index": index, "first": index == 0, "done": False}
        variables[iterator] = item
    for name, value in (*results.items(), *variables.items()):  # a step's result before a variable of its name
        if name not in scope and name not in _PROTECTED:
            scope[name] = wrap(value)
    run_id = execution_id(env)
    scope.update(execution_id=run_id, catalog_id=None, job={"uuid": run_id, "execution_id": run_id, "id": run_id})
    scope["env"] = Environ()
    scope["keychain"] = Keychain(pb.keychain, lambda v: _render_plain(v, scope))
    if pb.mcp is not None:
        from mcpipe.formats.noetl._run import roots

        for k, v in roots(pb.mcp, env, {}).items():
            scope.setdefault(k, v)
    return scope


def _render_plain(value: object, scope: Mapping[str, object]) -> Any:
    from mcpipe.formats.noetl._tmpl import compile_tmpl

    problems: list[tuple[str, str]] = []
    t = compile_tmpl(value, "keychain", problems)
    if problems:
        raise KeyError(problems[0][1])
    return t.render(scope)


def _source_view(env: Mapping[str, Any], source: str, loop: bool) -> dict[str, Any]:
    """``output``, ``event``, ``result`` and ``error`` of a finished step (for its ``set`` and arcs)."""
    r = latest(env.get("steps") or {}, source) or {}
    ok = loop or bool(r.get("ok"))
    result: Any = loop_result(loop_runs(r)) if loop else r.get("output")
    event = "loop.done" if loop else "call.done" if ok else "call.error"
    error = None if ok else (r.get("error") or "failed")
    return {**_view(result, ok, error, event, source), "error": error}


def _view(result: object, ok: bool, error: object, event: str, step: str) -> dict[str, Any]:
    """``output``, ``event`` and ``result`` of a step's outcome, as its ``set`` and arcs see them."""
    return {
        "output": wrap(output_view(result, ok, error)),
        "event": {"name": event, "step": step},
        "result": wrap(result),
    }


# --- arcs and loops, as the graph asks them ---


@dataclass(frozen=True, slots=True)
class ArcWhen:
    """Whether an arc of ``next`` is taken, once its step is done: its ``when`` holds (``else``: no
    conditional arc before it in the list held; no ``when``: always). As in NoETL, a failed step's arcs are
    decided too (``event.name`` is ``call.error``, ``output.status`` is ``error``), and the run ends failed
    whatever runs after it. A loop step's arcs are decided once every item is done (``event.name`` is
    ``loop.done``)."""

    step: StepPlan
    arc: ArcSpec
    when: Tmpl | None
    loop: bool
    earlier: tuple[tuple[ArcSpec, Tmpl | None], ...]

    @property
    def source(self) -> str | None:
        return self.arc.when if isinstance(self.arc.when, str) else None

    def evaluate(self, env: Mapping[str, object]) -> bool:
        raise ExpressionError("a NoETL arc is decided off the event loop")  # the graph awaits evaluate_async

    async def evaluate_async(self, env: Mapping[str, object]) -> bool:
        """Whether the arc is taken, rendering off the event loop (the graph awaits this one)."""
        if self.when is None and not self.arc.otherwise:
            return True
        scope = self._scope(env)
        try:
            if self.arc.otherwise:
                for prior, when in self.earlier:
                    if prior.otherwise or when is None or self._spent(prior, env):
                        continue
                    case = prior.retry is not None
                    try:
                        if truthy(await when.render_async(self._case_scope(scope) if case else scope)):
                            return False
                    except RenderError:
                        if not case:  # NoETL: a case's condition that fails to evaluate is false
                            raise
                return True
            assert self.when is not None
            if self.arc.retry is not None:
                return await self._retries(self.arc.retry, self.when, scope, env)
            if self.arc.case:  # asked at each of the step's events: its call's, then its exit
                return await _at_events(self.when, scope, lenient=False)
            return truthy(await self.when.render_async(scope))
        except RenderError as e:
            raise ExpressionError(str(e)) from None

    def _spent(self, arc: ArcSpec, env: Mapping[str, Any]) -> bool:
        """A case's retry whose step has run ``max_attempts`` times: NoETL skips the action (and routes as
        if no case had matched)."""
        return arc.retry is not None and _runs(env.get("steps") or {}, self.step.name) >= arc.retry.max_attempts

    async def _retries(self, retry: CaseRetry, when: Tmpl, scope: Mapping[str, object], env: Mapping[str, Any]) -> bool:
        """A case's retry: within ``max_attempts`` runs, when the case's ``when`` holds at the call's event or
        the step's exit (NoETL's ``_evaluate_condition``: a condition that cannot be evaluated, or a name it
        reads that the event lacks, is false; ``error`` is there only after a failure); then waits its delay."""
        n = _runs(env.get("steps") or {}, self.step.name)
        if n >= retry.max_attempts:
            return False
        held = await _at_events(when, self._case_scope(scope), lenient=True)
        if held:
            wait = retry.delay * n if retry.backoff == "linear" else retry.delay * 2 ** (n - 1)
            if wait > 0:
                await trio.sleep(wait)
        return held

    @staticmethod
    def _case_scope(scope: Mapping[str, object]) -> dict[str, Any]:
        """NoETL's render context of a case: ``error`` only after a failure."""
        out = dict(scope)
        if out.get("error") is None:
            out.pop("error", None)
        return out

    def _scope(self, env: Mapping[str, object]) -> dict[str, Any]:
        scope = scope_of(self.step.playbook, env)
        scope.update(_source_view(env, self.step.name, self.loop))
        return scope


async def _at_events(when: Tmpl, scope: dict[str, Any], lenient: bool) -> bool:
    """Whether a case's ``when`` holds at one of its step's events: its call's, then its exit. ``lenient``: a
    condition that cannot be evaluated is false there (NoETL's ``_evaluate_condition``)."""
    for name in (scope["event"]["name"], "step.exit"):
        scope["event"] = {**scope["event"], "name": name}
        try:
            if truthy(await when.render_async(scope)):
                return True
        except RenderError:
            if not lenient:
                raise
    return False


@dataclass(frozen=True, slots=True)
class Admit:
    """A step's admission (``spec.policy.admit.rules``), decided when the step is reached: the first rule
    whose ``when`` holds (an ``else`` rule always) says ``allow``; none: admitted. A step not admitted is
    passed over, and so are the arcs out of it."""

    step: StepPlan
    rules: tuple[tuple[Tmpl | None, Any, bool], ...]

    @property
    def source(self) -> str | None:
        return "spec.policy.admit"

    def evaluate(self, env: Mapping[str, object]) -> bool:
        raise ExpressionError("a NoETL admission is decided off the event loop")  # the graph awaits evaluate_async

    async def evaluate_async(self, env: Mapping[str, object]) -> bool:
        """Whether the step is admitted, rendering off the event loop (issue 20: a condition is caller-reachable
        Jinja)."""
        scope = scope_of(self.step.playbook, env)
        for t, when, allow in self.rules:
            if when is None or when is True:
                return allow
            if t is None:
                continue
            try:
                if truthy(await t.render_async(scope)):
                    return allow
            except RenderError as e:
                raise ExpressionError(str(e)) from None
        return True


def _normalized(value: object) -> list[Any]:
    """A loop's collection as NoETL normalizes it: a list as it is, null as none, any other value as one item."""
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


@dataclass(frozen=True, slots=True)
class LoopItems:
    """A loop's items: ``in`` rendered in the step's scope (NoETL's normalization: a list as it is, null
    as none, any other value as one item), the ``filter`` applied to each."""

    step: StepPlan
    items: Tmpl
    filter: Tmpl | None
    iterator: str

    @property
    def source(self) -> str | None:
        return self.items.sources[0] if self.items.sources else None

    async def evaluate_async(self, env: Mapping[str, object]) -> list[Any]:
        """The items, rendering the collection off the event loop."""
        scope = scope_of(self.step.playbook, env)
        try:
            items = _normalized(await self.items.render_async(scope))
            if self.filter is None:
                return items
            # The filter of every item in one rendering off the event loop, under one deadline and byte budget:
            # rendered item by item, each its own thread hop and deadline, a caller's 400 000 items (1.2 MB)
            # took 76 s of the server's work before the loop's size was checked.
            filter_, iterator = self.filter, self.iterator
            whole = Compiled(lambda roots: _kept(items, filter_, iterator, dict(roots)), filter_.sources)
            kept: list[Any] = await render_async(whole, scope, filter_.location)
        except RenderError as e:
            raise ExpressionError(str(e)) from None
        return kept

    def evaluate(self, env: Mapping[str, object]) -> list[Any]:
        raise ExpressionError("a NoETL loop's items are evaluated off the event loop")  # the graph awaits


def _kept(items: list[Any], filter_: Tmpl, iterator: str, scope: dict[str, Any]) -> list[Any]:
    """The items a loop's ``filter`` keeps, each rendered with the item under the iterator's name."""
    kept = []
    for item in items:
        scope[iterator] = wrap(item)
        scope["iter"] = {iterator: wrap(item)}
        try:
            if truthy(filter_.render(scope)):
                kept.append(item)
        except RenderError as e:
            raise ExpressionError(str(e)) from None
    return kept


# --- a step ---


async def run_step(
    step: Leaf[None, StepPlan], inputs: Mapping[str, object], env: Mapping[str, Any], ctx: ToolContext
) -> StepOutput:
    """One NoETL step (one iteration of a loop step): its tasks, then its ``set``."""
    plan: StepPlan = step.built
    pb = plan.playbook
    writes: dict[str, Any] = {}
    passed: dict[str, Any] = {}
    for arc in env.get("via") or ():
        data: ArcPlan | None = arc.data if isinstance(arc.data, ArcPlan) else None
        if data is None or (data.set is None and data.data is None):
            continue
        source_scope = scope_of(pb, env, extra=writes)
        source_scope.update(_source_view(env, data.source, data.source in pb.loops))
        try:
            if data.set is not None:
                apply_set(writes, await data.set.render_async(source_scope))
            if data.data is not None:
                passed.update(await data.data.render_async(source_scope))
        except RenderError as e:
            raise StepFailure(str(e), ErrorCode.INTERPOLATION_FAILED, facts=_facts(writes)) from None
    if plan.iterator is not None:
        _thread_loop(writes, step, env)
    scope = scope_of(pb, env, plan.iterator, {**writes, **passed})
    writes_full: dict[str, Any] = {}
    if plan.iterator is not None and pb.layout == "v1" and "item" in env:
        scope[plan.name] = wrap({"result_index": env.get("index", 0)})  # NoETL 1.x's `<step>.result_index`
    emit = EVENTS.get()
    t0 = perf_counter()
    if plan.router:
        result: Any = None
    else:
        try:
            result = await _run_tasks(plan, scope, env, ctx)
            if plan.result is not None and not plan.tasks:
                result = await _rendered(plan.result, scope)
            if (plan.pipeline or any(t.rules for t in plan.tasks)) and isinstance(result, Mapping):
                seq_ctx = result.get("ctx")
                if isinstance(seq_ctx, Mapping) and seq_ctx:
                    apply_set(writes, seq_ctx)  # NoETL syncs a pipeline's `ctx` into the execution's
            if plan.save is not None and plan.name not in pb.loops:
                saved = await run_save(plan.save, scope, result, env, ctx)
                result = with_save(result, saved) if plan.tasks else saved
            if plan.output is not None:
                result, full = stored_view(plan.output, result, plan.name, execution_id(env), step.id)
                if full is not None:
                    writes_full[step.id] = full
        except StepFailure as e:
            failed = _error_result(e)
            if emit is not None:
                emit(_exit(step, plan, "error", failed, str(e), t0))
            raise StepFailure(str(e), e.code, failed, _facts(writes)) from None
    if plan.set is not None:
        after = dict(scope)
        if result is not None:
            after[plan.name] = wrap(result)
        after.update(_view(result, True, None, "call.done", plan.name))
        try:
            apply_set(writes, await plan.set.render_async(after))
        except RenderError as e:
            raise StepFailure(str(e), ErrorCode.INTERPOLATION_FAILED, result, _facts(writes)) from None
    if emit is not None and not plan.router:
        emit(_exit(step, plan, "ok", result, "", t0))
    out = StepOutput.of(result)
    if writes or writes_full:
        out.facts = {**_facts(writes), **({FULL_FACT: writes_full} if writes_full else {})}
    return out


def _thread_loop(writes: dict[str, Any], step: Leaf[None, StepPlan], env: Mapping[str, object]) -> None:
    """In a sequential loop an item sees what the items before it wrote: the writes of the item before it
    (each item's writes hold its predecessors', so the last one is the loop's state) over the arcs'.

    NoETL 4.26 renders every item in the variables of the loop's start (``heavy_loop_aggregation``'s items
    each append to the list they were given, and its total is 0: the author meant the count of items); a
    loop that runs its items one after the other is a fold, and each item's writes are the next one's
    starting point. A parallel loop's items have no order: each sees the variables of the loop's start,
    and their writes apply after the loop in item order."""
    before, index = env.get("before"), env.get("index")
    if not isinstance(before, list) or not isinstance(index, int) or index < 1:
        return
    previous = before[index - 1].get(step.id)
    if isinstance(previous, Mapping) and isinstance(previous.get(SET_FACT), Mapping):
        apply_set(writes, previous[SET_FACT])


_PYTHON_FAILED = re.compile(
    r"^(?:.*?: )?the python step failed: (?:[A-Za-z_][A-Za-z0-9_.]*: )?(?P<text>.*?)(?: \(line \d+ of the code\))?$",
    re.S,
)


def _error_result(e: StepFailure) -> dict[str, Any]:
    """A failed step's result as NoETL's worker reports it: ``{id, status: error, error}`` (a tool's own
    error result, such as an HTTP status, as it is); the error is the exception's text, as NoETL gives it."""
    out = e.output
    if isinstance(out, Mapping) and out.get("status") in ("error", "failed"):
        return dict(out)
    text = str(e)
    if isinstance(out, Mapping) and isinstance(out.get("error_text"), str):
        text = out["error_text"]  # a python step's exception, its own text
    elif (m := _PYTHON_FAILED.match(text)) is not None:
        text = m.group("text")
    return {"id": str(uuid.uuid4()), "status": "error", "error": text}


def _facts(writes: Mapping[str, object]) -> dict[str, Any]:
    return {SET_FACT: dict(writes)} if writes else {}


def _exit(
    step: Leaf[None, StepPlan], plan: StepPlan, status: str, result: object, error: str, t0: float
) -> dict[str, Any]:
    event = {"type": "step_exit", "id": step.id, "step": plan.name, "status": status, "result": result}
    return {**event, "duration_ms": round((perf_counter() - t0) * 1000, 3), **({"error": error} if error else {})}


def _error_status(result: object) -> str | None:
    """NoETL's worker: a result whose ``status`` is ``error``/``failed`` is the tool's failure."""
    if isinstance(result, Mapping) and result.get("status") in ("error", "failed"):
        err = result.get("error") or result.get("message")
        if isinstance(err, Mapping):
            return f"the tool answered status `{result['status']}`: {err.get('message') or err}"
        return f"the tool answered status `{result['status']}`" + (f": {err}" if err else "")
    return None


async def _run_tasks(plan: StepPlan, scope: dict[str, Any], env: Mapping[str, object], ctx: ToolContext) -> Any:
    if not plan.tasks:
        return None
    if not plan.pipeline and not plan.tasks[0].rules:
        task = plan.tasks[0]
        result = await _run_task(task, plan, scope, env, ctx)
        why = _error_status(result)
        if why is not None:
            raise StepFailure(f"{task.location}: {why}", ErrorCode.TOOL_ERROR, result)
        return result
    return await _sequence(plan, scope, env, ctx)


def _outcome(status: str, result: object, error: object, kind: str, attempt: int, ms: float) -> dict[str, Any]:
    """NoETL's ``build_outcome``: the ``output`` a task's policy rules read."""
    out: dict[str, Any] = {"status": status, "meta": {"attempt": attempt, "duration_ms": int(ms)}}
    if status == "ok":
        out["data"] = result
    else:
        out["error"] = error
    if kind == "http":
        code = _status_code(result)
        if isinstance(error, Mapping) and error.get("status_code") is not None:
            code = error["status_code"]
        out["http"] = {"status": code, "headers": result.get("headers", {}) if isinstance(result, Mapping) else {}}
    return out


def _status_code(result: object) -> Any:
    """An HTTP result's status: its ``status_code``, else its ``data``'s (an error result wraps the response)."""
    if not isinstance(result, Mapping):
        return None
    data = result.get("data")
    return result.get("status_code") or (data.get("status_code") if isinstance(data, Mapping) else None)


async def _sequence(plan: StepPlan, base: dict[str, Any], env: Mapping[str, object], ctx: ToolContext) -> Any:
    """A pipeline of tasks (or one task with policy rules), as NoETL's ``TaskSequenceExecutor`` runs it:
    ``_prev`` threads each result into the next task, the rules decide after each task."""
    tasks = plan.tasks
    prev: Any = None
    results: dict[str, Any] = {}
    seq_ctx: dict[str, Any] = {}
    seq_iter: dict[str, Any] = {}
    retries: dict[str, int] = {}
    i = 0
    steps_run = 0
    started = perf_counter()
    while i < len(tasks):
        steps_run += 1
        if steps_run > 10_000:
            raise StepFailure(f"{plan.location}.tool: more than 10000 task runs (a `jump` loop?)", "LIMIT_EXCEEDED")
        task = tasks[i]
        attempt = retries.get(task.name, 0) + 1
        scope = {**base, **{k: wrap(v) for k, v in results.items()}, "_task": task.name, "_prev": wrap(prev)}
        scope.update(_attempt=attempt, results=wrap(results), ctx=wrap({**(base.get("ctx") or {}), **seq_ctx}))
        scope["iter"] = {**(base.get("iter") or {}), **{k: wrap(v) for k, v in seq_iter.items()}}
        t0 = perf_counter()
        error: Any = None
        result: Any = None
        try:
            result = await _run_task(task, plan, scope, env, ctx)
            # A python task's own `status` is its data: NoETL's python tool answers `{status: success, data}`
            # whatever the code's result holds (NoETL 4.26's golden `test_vars_template_access`).
            why = _error_status(result) if task.kind != "python" else None
            if why is not None:
                error = _error_info(result, why)
        except StepFailure as e:
            error = {"kind": "tool_error", "retryable": False, "code": e.code, "message": str(e)}
            if isinstance(e.output, Mapping):
                result = e.output
                status_code = e.output.get("status_code")
                if isinstance(status_code, int):
                    error["status_code"] = status_code
                    error["retryable"] = status_code == 429 or status_code >= 500
        ms = (perf_counter() - t0) * 1000
        ok = error is None
        output = _outcome("ok" if ok else "error", result, error, task.kind, attempt, ms)
        if ok:
            prev = result
            results[task.name if plan.pipeline else f"{plan.name}_task"] = result
        scope["output"] = wrap(output)
        scope["_prev"] = wrap(prev)
        scope["results"] = wrap(results)
        action = await _decide(task, scope, ok, attempt, error, result)
        if action.set is not None:
            for key, value in ((await _rendered(action.set, scope)) or {}).items():
                scope_name, dot, bare = key.partition(".")
                if dot and scope_name == "iter":
                    seq_iter[bare] = value  # the iteration's own (TaskSequenceContext.iter)
                else:
                    seq_ctx[bare if dot and scope_name in ("ctx", "step") else key] = value
        rule = action.rule
        do = rule.do if rule is not None else ("continue" if ok else "fail")
        if do == "continue":
            i += 1
        elif do == "retry" and rule is not None:
            retries[task.name] = retries.get(task.name, 0) + 1
            if retries[task.name] >= rule.attempts:
                raise StepFailure(
                    f"{task.location}: still failing after {rule.attempts} attempts: {_bare(_message(error), task)}",
                    _code(error),
                    _failed(prev, results, seq_ctx, error, task.name),
                )
            await trio.sleep(_delay(rule, retries[task.name]))
        elif do == "jump" and rule is not None:
            target = str(rule.to)
            if target.lower() in ("previous", "prev", "_previous", "@previous"):
                if i == 0:
                    raise StepFailure(f"{rule.location}.then.to: no task before the first", ErrorCode.TOOL_FAILED)
                i -= 1
            else:
                i = next(j for j, t in enumerate(tasks) if t.name == target)
        elif do == "break":
            break
        else:  # fail
            raise StepFailure(
                f"{task.location}: {_bare(_message(error), task) if error is not None else 'failed by its policy'}",
                _code(error),
                _failed(prev, results, seq_ctx, error, task.name),
            )
    metrics = {"task_count": len(tasks), "tasks_run": steps_run, "duration_ms": int((perf_counter() - started) * 1000)}
    summary = {"status": "ok", "_prev": prev, "results": results, "ctx": seq_ctx, "metrics": metrics}
    if results:
        last = list(results.values())[-1]
        if isinstance(last, Mapping):
            return {**last, **summary}
    return summary


def _bare(message: str, task: TaskPlan) -> str:
    """A task's error message without its location (the caller puts it in front once)."""
    prefix = f"{task.location}: "
    while message.startswith(prefix):
        message = message[len(prefix) :]
    return message


def _message(error: object) -> str:
    if isinstance(error, Mapping):
        return str(error.get("message") or error)
    return str(error)


def _code(error: object) -> str:
    code = error.get("code") if isinstance(error, Mapping) else None  # every member's name is upper case
    return code if isinstance(code, str) and code in ErrorCode.__members__ else ErrorCode.TOOL_ERROR


def _failed(
    prev: object, results: Mapping[str, object], seq_ctx: Mapping[str, object], error: object, task: str
) -> dict[str, Any]:
    return {"status": "failed", "_prev": prev, "results": results, "ctx": seq_ctx, "error": error, "failed_task": task}


def _error_info(result: object, why: str) -> dict[str, Any]:
    raw = _status_code(result)
    status_code = raw if isinstance(raw, int) else None
    code = f"HTTP_{raw}" if status_code is not None else None
    retryable = status_code is not None and (status_code == 429 or status_code >= 500)
    return {"kind": "tool_error", "retryable": retryable, "code": code, "status_code": status_code, "message": why}


def _delay(rule: Rule, attempt: int) -> float:
    """The wait before retry ``attempt`` (NoETL's ``_calculate_delay``; 1.x: ``initial_delay *
    backoff_multiplier ** (attempt - 1)`` up to ``max_delay``, without its random jitter)."""
    if rule.backoff == "none":
        return 0.0
    if rule.backoff == "linear":
        return float(rule.delay * attempt)
    if rule.backoff == "fixed":
        return float(rule.delay)
    if rule.backoff == "multiplier":
        return float(min(rule.delay * rule.multiplier ** (attempt - 1), rule.max_delay))
    return float(rule.delay * (2 ** (attempt - 1)))


@dataclass(frozen=True, slots=True)
class _Action:
    rule: Rule | None
    set: Tmpl | None


async def _decide(
    task: TaskPlan, scope: Mapping[str, object], ok: bool, attempt: int, error: object, result: object
) -> _Action:
    """The first rule whose ``when`` holds (an ``else`` rule always); none: continue after a success, fail
    after an error (NoETL's defaults). NoETL 1.x's ``retry:`` block comes first, with its own rules."""
    for rp in task.rules:
        rule = rp.rule
        if rule.legacy:
            if await _legacy_retries(rp, ok, attempt, error, result):
                return _Action(rule, None)
            continue
        if rule.when is None or rule.when is True:
            return _Action(rule, rp.set)
        if rule.when is False or rp.when is None:
            continue
        try:
            value = await rp.when.render_async(scope)
        except RenderError:
            continue  # NoETL skips a rule whose condition cannot be evaluated
        if value is True or (not isinstance(value, bool) and str(value).lower() in ("true", "1", "yes")):
            return _Action(rule, rp.set)
    return _Action(None, None)


async def _legacy_retries(rp: RulePlan, ok: bool, attempt: int, error: object, result: object) -> bool:
    """NoETL 1.x's ``RetryPolicy.should_retry``: within ``max_attempts``, unless ``stop_when`` holds, when
    ``retry_when`` holds (or the error's kind is in ``retry_on``; by default, on an error)."""
    rule = rp.rule
    if attempt + 1 > rule.attempts:
        return False
    body = result if isinstance(result, Mapping) else {}
    data = body.get("data")
    names = {
        "result": wrap(body),
        "attempt": attempt + 1,
        "error": _message(error) if error is not None else None,
        "status_code": body.get("status_code", data.get("status_code") if isinstance(data, Mapping) else None),
        "success": ok,
        "data": wrap(data),
    }
    if rp.stop is not None:
        try:
            if truthy(await rp.stop.render_async(names)):
                return False
        except RenderError:
            return False
    if rp.when is not None:
        try:
            return truthy(await rp.when.render_async(names))
        except RenderError:
            return False
    if rule.retry_on:
        if ok:
            return False
        text = f"{_code(error)} {_message(error)}".lower()
        kinds = {"timeout": ("timeout", "timed out"), "connection_error": ("connect", "connection", "unavailable")}
        return any(any(w in text for w in kinds.get(k, (k.lower(),))) for k in rule.retry_on)
    return not ok


# --- saves ---


def with_save(result: object, saved: Mapping[str, object]) -> Any:
    """A result with its save's outcome under ``meta.save``, as NoETL 1.x's worker records it."""
    if not isinstance(result, Mapping):
        return result
    meta = result.get("meta")
    return {**result, "meta": {**(meta if isinstance(meta, Mapping) else {}), "save": dict(saved)}}


async def run_save(
    save: SavePlan,
    scope: Mapping[str, object],
    result: object,
    env: Mapping[str, object],
    ctx: ToolContext,
    roots: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    """Write a save (:mod:`mcpipe.formats.noetl._save`); answers NoETL's save result. Its templates see the
    scope with ``result`` (the result's ``data``, else the result), ``this`` and ``data`` (``roots``, for a
    loop's save, in their place); a failure is the step's, located at the save."""
    spec = save.spec
    where = spec.location
    names = dict(scope)
    if roots is not None:
        names.update(roots)
    else:
        current = result.get("data") if isinstance(result, Mapping) and result.get("data") is not None else result
        names["result"] = wrap(current)
        names["this"] = wrap(result)
        names.setdefault("data", wrap(current))
    data = await _rendered(save.data, names)
    meta: dict[str, Any] = {"storage_kind": spec.kind}
    if spec.kind in ("event", "event_log", ""):
        return {"status": "success", "data": {"saved": "event", "data": data}, "meta": meta}
    if save.step is None:
        raise StepFailure(f"{where}: the save did not compile", ErrorCode.TOOL_FAILED)
    with_data = {**names, "data": wrap(data), "params": wrap(data)}
    inputs: dict[str, Any] = {}
    try:
        if spec.kind == "postgres":
            inputs = await _connection(save.conn, names)
            if save.statement is not None:
                params: dict[str, Any] | None = None
                if save.sql is not None:
                    inputs["command"], params = await rendered_sql(save.statement, with_data, save.sql)
                else:
                    inputs["command"] = await _rendered(save.statement, with_data)
                if save.binds:
                    given = data if isinstance(data, Mapping) else {}
                    missing = [b for b in save.binds if b not in given]
                    if missing:
                        raise ValueError(f"{where}.statement: `:{missing[0]}` has no value in the save's `data`")
                    params = {b: given[b] for b in save.binds}
                inputs["params"] = params or None
            else:
                if not isinstance(data, Mapping) or not data or spec.table is None:
                    raise ValueError(
                        f"{where}.data: a save into a table needs `data`: a mapping, got {json_type(data)}"
                    )
                columns = [column_name(k, f"{where}.data") for k in data]
                inputs["command"] = insert_sql(spec.table, columns, spec.mode, spec.keys)
                inputs["params"] = {f"noetl_c{i}": as_text(v) for i, v in enumerate(data.values())}
            meta["save_spec"] = dict(mode=spec.mode, key=list(spec.keys), statement_present=spec.statement is not None)
            saved: dict[str, Any] = {"saved": "postgres", "table": spec.table}
        else:
            if save.statement is not None:
                assert save.sql is not None
                inputs["commands"], inputs["params"] = await rendered_sql(save.statement, with_data, save.sql)
            else:
                if not isinstance(data, Mapping) or not data:
                    raise ValueError(f"{where}.data: a duckdb save needs `commands` or `data`: a mapping")
                inputs["commands"] = duckdb_table_sql(spec.table or "save_data", data)
            inputs["database"] = await _rendered(save.database, names)
            saved = {"saved": "duckdb"}
        out = await _call_kind(save.step, inputs, env, ctx, where)
    except ValueError as e:
        raise StepFailure(str(e), ErrorCode.TOOL_FAILED) from None
    return {"status": "success", "data": {**saved, "task_result": out}, "meta": meta}


async def run_loop_save(
    step: Leaf[None, StepPlan], inputs: Mapping[str, object], env: Mapping[str, Any], ctx: ToolContext
) -> StepOutput:
    """A loop step's ``save``, once its last item is done (a node of its own after the loop): its templates
    see ``results``/``items``/``result`` (each item's result), ``errors`` and ``count``, as NoETL 1.x's
    iterator gives them. Its output is the loop's, so the workflow's final result is the loop's."""
    plan: StepPlan = step.built
    assert plan.save is not None
    r = latest(env.get("steps") or {}, plan.name) or {}
    runs = loop_runs(r)
    outputs = [ch.get("output") for ch in runs if ch.get("ok")]
    errors = [{"index": i, "message": ch.get("error")} for i, ch in enumerate(runs) if not ch.get("ok")]
    roots = {"results": outputs, "items": outputs, "result": outputs, "errors": errors, "count": len(outputs)}
    scope = scope_of(plan.playbook, env)
    emit = EVENTS.get()
    t0 = perf_counter()
    try:
        saved = await run_save(plan.save, scope, None, env, ctx, {k: wrap(v) for k, v in roots.items()})
    except StepFailure as e:
        if emit is not None:
            emit(_exit(step, plan, "error", _error_result(e), str(e), t0))
        raise
    if emit is not None:
        emit({"type": "step_save", "id": step.id, "step": plan.name, "result": saved})
    return StepOutput.of(r.get("output"))


# --- result storage (`output`) ---

FULL_FACT = "noetl_stored"
"""The field of a step's result (in mcpipe's answer) holding a result kept behind a ``_ref``: the run is its
store (NoETL's ``kv``/``disk`` tiers)."""

MAX_SELECTED_TEXT = 500
"""NoETL's ``_truncate_value``: a selected text longer than this is cut (``...`` appended)."""


def _select(result: object, paths: tuple[str, ...]) -> dict[str, Any]:
    """NoETL's ``extract_output_select`` with explicit paths: each path's value (``a.b``, ``items[0]``) under
    its last segment's name, texts cut at 500 characters."""
    out: dict[str, Any] = {}
    for path in paths:
        current: Any = result
        for part in path.replace("]", "").split("."):
            key, _, index = part.partition("[")
            if key:
                current = current.get(key) if isinstance(current, Mapping) else None
            if index and isinstance(current, list) and index.isdigit() and int(index) < len(current):
                current = current[int(index)]
            elif index:
                current = None
            if current is None:
                break
        if current is not None:
            if isinstance(current, str) and len(current) > MAX_SELECTED_TEXT:
                current = current[:MAX_SELECTED_TEXT] + "..."
            out[path.split(".")[-1].split("[")[0]] = current
    return out


def stored_view(output: OutputSpec, result: object, step_name: str, run_id: str, sid: str) -> tuple[Any, Any]:
    """``(what later steps see, the result kept behind a _ref or None)``: NoETL's ``ResultHandler``. A result
    of at most ``inline_max_bytes`` stays (with ``output_select``: the fields, and ``_inline``, the result); a
    larger one is kept in the run, and the step's result is the fields, ``_ref`` (``noetl://execution/ID/
    result/STEP``) and ``_size_bytes``."""
    size = len(orjson.dumps(result, default=str))
    if size <= output.inline_max_bytes:
        if not output.select:
            return result, None
        return {**_select(result, output.select), "_inline": result}, None
    uri = f"noetl://execution/{run_id}/result/{step_name}/{sid}"
    ref = {"kind": "result_ref", "ref": uri, "store": output.store, "size_bytes": size}
    return {**_select(result, output.select), "_ref": ref, "_size_bytes": size}, result


async def _artifact_get(task: TaskPlan, scope: Mapping[str, object], env: Mapping[str, Any]) -> Any:
    """NoETL's ``artifact`` ``get``: a result a step kept behind a ``_ref`` (``noetl://`` in this run)."""
    given = await _rendered(task.parts["input"], scope) or {}
    ref = given.get("result_ref")
    uri = ref.get("ref") if isinstance(ref, Mapping) else given.get("uri") or ref
    where = f"{task.location}.input.result_ref"
    if not isinstance(uri, str) or not uri.startswith("noetl://execution/"):
        raise StepFailure(
            f"{where}: not a result stored in this run (`noetl://execution/...`): {uri!r}", ErrorCode.TOOL_FAILED
        )
    parts = uri.split("/")
    step_id = parts[-1] if len(parts) >= 7 else ""
    for r in (env.get("steps") or {}).values():
        stored = r.get(FULL_FACT) if isinstance(r, Mapping) else None
        if isinstance(stored, Mapping) and step_id in stored:
            return {"status": "success", "data": stored[step_id], "uri": uri, "source": "result_store"}
    raise StepFailure(f"{where}: no result stored at {uri}", ErrorCode.TOOL_FAILED)


# --- transfers ---


async def _pg(
    part: Any,
    scope: Mapping[str, object],
    command: str,
    params: object,
    env: Mapping[str, object],
    ctx: ToolContext,
    where: str,
) -> Any:
    step, conn = part
    inputs: dict[str, Any] = {"command": command, "params": params or None}
    inputs.update(await _connection(conn, scope))
    return await _call_kind(step, inputs, env, ctx, where)


async def _connection(conn: Mapping[str, Tmpl], scope: Mapping[str, object]) -> dict[str, Any]:
    """A postgres connection's fields (``backend``: the config's ``[sql.NAME]``, or ``dsn``), rendered."""
    return {k: await _rendered(t, scope) for k, t in conn.items()}


async def _run_transfer(
    task: TaskPlan, scope: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> Any:
    """NoETL's ``transfer`` (:mod:`mcpipe.formats.noetl._transfer`): the source's records, then the target's
    inserts, ``chunk_size`` rows a statement, every value bound."""
    from mcpipe.formats.noetl import _transfer as tr

    spec: tr.TransferSpec = task.parts["spec"]
    where = task.location
    if spec.source_type == "http":
        response = await _run_http(task.parts["http"], scope, env, ctx)
        why = _error_status(response)
        if why is not None:
            raise StepFailure(f"{where}.source: {why}", ErrorCode.TOOL_ERROR, response)
        found = tr.records(response.get("data"), spec.data_path)
        columns = list(spec.mapping)
        rows = [[tr.field_of(rec, f) for f in spec.mapping.values()] for rec in found]
    else:
        query, bound = await rendered_sql(task.parts["query"], scope, task.parts["query_sql"])
        out = await _pg(task.parts["source"], scope, str(query), bound or None, env, ctx, f"{where}.source")
        found = list(out.get("rows") or [])
        columns = list(spec.mapping) or list(out.get("columns") or (found[0].keys() if found else []))
        fields = list(spec.mapping.values()) or columns
        rows = [[r.get(f) if isinstance(r, Mapping) else None for f in fields] for r in found]
    try:
        tr.check_columns(columns, f"{where}.target.mapping")
    except ValueError as e:
        raise StepFailure(str(e), ErrorCode.TOOL_FAILED) from None
    target = task.parts["target"]
    if spec.mode == "replace" and spec.table:
        await _pg(target, scope, f"TRUNCATE TABLE {spec.table}", None, env, ctx, f"{where}.target")
    custom = task.parts.get("target_query")
    chunks = range(0, len(rows), spec.chunk_size)
    for i in chunks:
        chunk = rows[i : i + spec.chunk_size]
        if custom is not None:
            text, bound = await rendered_sql(custom, scope, task.parts["target_sql"])
            for row in chunk:
                values = {**dict(zip(columns, row, strict=False)), **bound}
                await _pg(target, scope, str(text), values, env, ctx, f"{where}.target")
        else:
            assert spec.table is not None
            sql, params = tr.insert_chunk(spec.table, columns, chunk, spec.mode)
            await _pg(target, scope, sql, params, env, ctx, f"{where}.target")
    direction = f"{spec.source_type}_to_{spec.target_type}"
    data: dict[str, Any] = {"direction": direction, "source_type": spec.source_type, "target_type": spec.target_type}
    mode = spec.mode if custom is None else "custom"
    data.update(mode=mode, rows_transferred=len(rows), chunks_processed=len(chunks))
    if spec.source_type == "http":
        data["records_fetched"] = len(found)
    else:
        data.update(status="success", target_table=spec.table or "custom_query", columns=columns)
    return {"status": "success", "data": data}


# --- tasks ---


async def _run_task(
    task: TaskPlan, plan: StepPlan, scope: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> Any:
    if task.paginate is not None:
        result = await _paginate(task, task.paginate, plan, scope, env, ctx)
    else:
        result = await _run_one(task, plan, scope, env, ctx)
    if task.save is not None and _error_status(result) is None:
        result = with_save(result, await run_save(task.save, scope, result, env, ctx))
    return result


async def _paginate(
    task: TaskPlan,
    pg: PaginatePlan,
    plan: StepPlan,
    scope: Mapping[str, object],
    env: Mapping[str, object],
    ctx: ToolContext,
) -> Any:
    """NoETL's success-side retry (``_execute_with_success_retry``): the request runs, its page is collected
    (``collect.path`` of the response's body), its ``per_iteration.sink`` saves it, and while ``while`` holds
    (at most ``max_attempts`` times) it runs again with ``next_call`` laid over it; a page that fails is tried
    again up to ``on_error.max_attempts`` times. The result is ``{id, status, data: the pages collected, meta}``.
    The templates see ``response``/``page`` (the body), ``iteration``, ``_retry`` and the pages so far."""
    spec = pg.spec
    accumulated: Any = None
    overrides: dict[str, Any] = {}
    response: Any = None
    iteration = 0
    while iteration < spec.max_attempts:
        iteration += 1
        names = {**scope, "_retry": {"index": iteration, "count": iteration}}
        if accumulated is not None:
            names[spec.into] = wrap(accumulated)
        attempt = 0
        while True:
            attempt += 1
            response = await _run_one(task, plan, names, env, ctx, overrides)
            if _error_status(response) is None or attempt >= spec.error_attempts:
                break
            await trio.sleep(min(spec.initial_delay * spec.multiplier ** (attempt - 1), spec.max_delay))
        if _error_status(response) is not None:
            return response  # the page failed after its retries: the task's error result
        body = response.get("data") if isinstance(response, Mapping) else response
        page: Any = body
        for part in spec.path.split(".") if spec.path else ():
            page = page.get(part) if isinstance(page, Mapping) else None
        if spec.strategy == "append":
            accumulated = [*(accumulated or []), *(page if isinstance(page, list) else [page])]
        elif spec.strategy == "merge" and isinstance(accumulated, Mapping) and isinstance(page, Mapping):
            accumulated = {**accumulated, **page}
        else:
            accumulated = page
        names.update({"response": wrap(body), "page": wrap(body), "iteration": iteration})
        if pg.sink is not None:
            roots = {"page": wrap({"data": page}), "response": wrap(response), "_retry": names["_retry"]}
            await run_save(pg.sink, names, response, env, ctx, roots)
        if iteration >= spec.max_attempts:
            break
        try:
            more = truthy(await pg.while_.render_async(names))
        except RenderError:
            more = False  # NoETL stops paging when its `while` cannot be evaluated
        if not more:
            break
        for key, value in ((await _rendered(pg.next_call, names)) or {}).items():
            overrides[key] = {**(overrides.get(key) or {}), **value} if isinstance(value, Mapping) else value
    meta = {"iterations": iteration, "collect_strategy": spec.strategy}
    rid = response.get("id") if isinstance(response, Mapping) else None
    return {"id": rid or str(uuid.uuid4()), "status": "success", "data": accumulated, "meta": meta}


async def _run_one(
    task: TaskPlan,
    plan: StepPlan,
    scope: Mapping[str, object],
    env: Mapping[str, object],
    ctx: ToolContext,
    overrides: Mapping[str, object] | None = None,
) -> Any:
    runner = task.runner
    if runner == "noop":
        return {"status": "noop", "step": plan.name}
    if runner == "kind":
        return await _run_kind(task, scope, env, ctx)
    if runner == "http":
        return await _run_http(task, scope, env, ctx, overrides)
    if runner == "playbook":
        return await _run_playbook(task, plan, scope, env, ctx)
    if runner == "turn":
        return await _run_turn(task, plan, env, ctx)
    if runner == "save":
        return await run_save(task.parts["save"], scope, None, env, ctx)
    if runner == "transfer":
        return await _run_transfer(task, scope, env, ctx)
    if runner == "artifact":
        return await _artifact_get(task, scope, env)
    if runner == "fails":  # python code that does not compile: NoETL's error result, as its exec raises it
        return {"id": str(uuid.uuid4()), "status": "error", "error": task.parts["error"]}
    if runner == "nats":
        return await _run_nats(task, scope)
    if runner == "gcp_secret":
        return await _run_gcp_secret(task, scope, env, ctx)
    if runner == "secrets":
        return {"value": _environ(task.parts["name"], task.location)}
    raise StepFailure(f"{task.location}: no runner for kind `{task.kind}`", ErrorCode.TOOL_FAILED)


def _environ(name: str, where: str) -> str:
    """The environment variable ``name`` (NoETL's ``source: env``); a failure located at ``where`` when unset."""
    value = os.environ.get(name)
    if value is None:
        raise StepFailure(f"{where}: the environment variable {name} is not set", ErrorCode.TOOL_FAILED)
    return value


async def _run_nats(task: TaskPlan, scope: Mapping[str, object]) -> Any:
    """NoETL's ``nats`` tool (:mod:`mcpipe.formats.noetl._nats`): its fields rendered, the server from its
    credential, one connection of its own for the operation (as NoETL's executor connects per task)."""
    from mcpipe.backends.jetstream import JetStream
    from mcpipe.backends.nats import NatsError, open_nats
    from mcpipe.formats.noetl import _nats

    parts = task.parts
    operation = await _rendered(parts["operation"], scope)
    if operation not in _nats.OPERATIONS:
        raise StepFailure(
            f"{task.location}.operation: unknown NATS operation {operation!r} (NoETL's: {', '.join(_nats.OPERATIONS)})",
            ErrorCode.TOOL_FAILED,
        )
    fields = await _rendered(parts["fields"], scope)
    auth = await _rendered(parts["auth"], scope)
    url = _nats.server_url(auth, parts["constant"], secret_value, task.location)
    shown = re.sub(r"//[^@/]*@", "//***@", url)  # an error never shows the credential's user, password or token
    try:
        async with open_nats(url, connect_timeout_s=_nats.TIMEOUT_S) as client:
            return await _nats.run_nats(operation, fields, JetStream(client, timeout_s=_nats.TIMEOUT_S), task.location)
    except NatsError as e:
        raise StepFailure(f"{task.location}: {str(e).replace(url, shown)}", e.code) from None


async def _run_gcp_secret(
    task: TaskPlan, scope: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> Any:
    """NoETL 1.0's ``secrets`` task of ``provider: google`` (:mod:`mcpipe.formats.noetl._gcp`): a token for the
    application default credentials, then the secret's version; its result NoETL's ``{id, status, data:
    {secret_value, version, provider}}`` (``{id, status: error, error}`` when it cannot be read)."""
    from mcpipe.formats.noetl import _gcp

    parts = task.parts
    tid = str(uuid.uuid4())
    fields = await _rendered(parts["fields"], scope) or {}
    version = str(fields.get("version") or "latest")
    try:
        creds = await trio.to_thread.run_sync(_gcp.credentials)
        variables = scope.get("ctx")
        known = variables if isinstance(variables, Mapping) else {}
        project, name = _gcp.project_of(fields.get("project_id"), str(fields.get("secret_name") or ""), known, creds)
        url = str(fields.get("api_endpoint") or _gcp.access_url(project, name, version))
        token_uri, form = _gcp.token_request(creds)
        form_type = {"content-type": "application/x-www-form-urlencoded"}
        asked = {"url": token_uri, "headers": form_type, "query": None, "body": form}
        answer = await _call_kind(parts["token"], asked, env, ctx, task.location)
        token = answer.get("body", {}).get("access_token") if isinstance(answer.get("body"), Mapping) else None
        if answer.get("status") != 200 or not isinstance(token, str):
            raise _gcp.GoogleError.auth(f"the token endpoint answered {answer.get('status')}")
        auth = {"Authorization": f"Bearer {token}"}
        out = await _call_kind(parts["access"], {"url": url, "headers": auth, "query": None}, env, ctx, task.location)
        status, body = out.get("status"), out.get("body")
        if status == 404:
            # NoETL's SecretManager answers a stand-in value for a secret Google does not have.
            data = {"secret_value": f"fallback-value-for-{name}", "version": "fallback", "provider": "google"}
            return {"id": tid, "status": "success", "data": data}
        if not (isinstance(status, int) and 200 <= status < 300):
            text = body if isinstance(body, str) else orjson.dumps(body).decode()
            raise _gcp.GoogleError(f"HTTP error: {status} - {text}")
        return {"id": tid, "status": "success", "data": {**_gcp.secret_of(body, version), "provider": "google"}}
    except _gcp.GoogleError as e:
        return {"id": tid, "status": "error", "error": str(e)}


async def _rendered(t: Tmpl | None, scope: Mapping[str, object]) -> Any:
    """``t`` rendered off the event loop; a failure is the step's ``INTERPOLATION_FAILED`` (or the budget's
    code, ``TIMEOUT``/``LIMIT_EXCEEDED``)."""
    if t is None:
        return None
    try:
        return await t.render_async(scope)
    except RenderError as e:
        raise StepFailure(str(e), e.code) from None


async def _with_params(t: Tmpl | None, scope: Mapping[str, object]) -> Mapping[str, object]:
    """The scope with NoETL 1.x's ``with`` parameters (rendered in it) laid over it: names a tool's templates
    read (its SQL's, its request's)."""
    given = await _rendered(t, scope)
    return {**scope, **{str(k): wrap(v) for k, v in given.items()}} if isinstance(given, Mapping) and given else scope


async def _call_kind(
    step: Any, inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext, location: str
) -> Any:
    """Run a compiled mcpipe step kind's executor with ``inputs``, under its deadline."""
    try:
        out = None
        with trio.move_on_after(float("inf") if step.timeout_ms is None else step.timeout_ms / 1000):
            out = await step.run(step, inputs, env, ctx)
        if out is None:  # only a timeout leaves it unset
            raise StepFailure(f"{location}: timed out after {step.timeout_ms:g} ms", ErrorCode.TIMEOUT)
    except ForbiddenError as e:
        raise StepFailure(f"{location}: {e}", ErrorCode.FORBIDDEN) from None
    except ExpressionError as e:
        raise StepFailure(f"{location}: {e}", e.code) from None
    except StepFailure as e:
        text = str(e)
        raise StepFailure(text if text.startswith(f"{location}") else f"{location}: {text}", e.code, e.output) from None
    if not out.ok:
        raise StepFailure(f"{location}: {out.error}", out.error_code or ErrorCode.TOOL_FAILED, out.output)
    return out.output


async def _run_kind(task: TaskPlan, scope: Mapping[str, object], env: Mapping[str, Any], ctx: ToolContext) -> Any:
    guarded = task.parts.get("code_from")
    if guarded is not None:
        name, where = guarded
        given = env.get("args") or {}
        nested = given.get("ctx")
        if name in given or (isinstance(nested, Mapping) and name in nested):
            # NoETL lays the call's arguments over the workload, so its code would be the caller's text.
            raise StepFailure(
                f"{where}: the argument `{name}` is this step's code (the workload's `{name}`): a call may not set it",
                ErrorCode.FORBIDDEN,
            )
    step = task.parts["step"]
    fields: dict[str, Tmpl] = task.parts["fields"]
    scope = await _with_params(task.parts.get("with"), scope)
    inputs = {name: t.resolve({}) for name, t in step.templates if name not in fields}
    script = task.parts.get("script")
    if script:
        step = await _script_step(task, script, step, scope, inputs)
        fields = {k: t for k, t in fields.items() if k not in inputs}
    sql: tuple[str, SqlTemplate] | None = task.parts.get("sql_text")
    for name, t in fields.items():
        if sql is not None and name == sql[0]:
            inputs[name], inputs["params"] = await rendered_sql(t, scope, sql[1])
        else:
            inputs[name] = await _rendered(t, scope)
    if task.parts.get("context"):
        inputs["context"] = context_data(scope)
    if inputs.get("secrets") and task.kind == "duckdb":
        inputs["secrets"] = [_duckdb_secret(s, task) for s in inputs["secrets"]]
    out = await _call_kind(step, inputs, env, ctx, task.location)
    if task.kind == "duckdb" and isinstance(out, Mapping) and "task_id" in out:
        # NoETL's duckdb result names its execution after the task (noetl/tools/duckdb/__init__.py, 4.26.0).
        items, at = list(out.items()), list(out).index("task_id") + 1
        return dict([*items[:at], ("execution_id", scope.get("execution_id")), *items[at:]])
    return out


def _script_file(pb: NoetlPlaybook, uri: str) -> Path | None:
    """A script's file: ``uri`` under the playbook's directory, else under each parent up to the catalog's
    roots (NoETL resolves it from its working directory, the repository's root); its real path inside a root
    (the catalog's, :mod:`mcpipe.formats.noetl._catalog`), never outside them."""
    here = Path(pb.file).resolve().parent if pb.file else Path.cwd()
    if pb.catalog is not None:
        roots = [Path(r) for r in pb.catalog.roots]
    else:
        roots = [Path(pb.root).resolve() if pb.root else here]

    def inside(path: Path) -> bool:
        return any(path.is_relative_to(r) for r in roots)

    for d in (here, *(p for p in here.parents if inside(p))):
        candidate = (d / uri).resolve()
        if inside(candidate) and candidate.is_file():
            return candidate
    return None


def _duckdb_secret(secret: Mapping[str, object], task: TaskPlan) -> dict[str, Any]:
    """A NoETL DuckDB secret with its credential resolved (``generate_duckdb_secrets``): a postgres one from
    the config's ``[sql.NAME]`` backend of that name (its URL's host, port, database, user, password), a
    ``hmac``/``gcs``/``s3`` one from ``NOETL_SECRET_<NAME>`` (a JSON object: ``key_id``, ``secret_key``,
    ``region``, ``endpoint``), with its ``scope``."""
    from urllib.parse import unquote, urlsplit

    name, kind, key = secret.get("name"), str(secret.get("type")), secret.get("credential")
    where = f"{task.location}.auth.{name}"
    if kind == "postgres":
        backends = task.parts.get("sql") or {}
        backend = backends.get(str(key))
        url = getattr(getattr(backend, "config", None), "url", None)
        if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
            raise StepFailure(
                f"{where}: no PostgreSQL backend [sql.{key}] for the credential `{key}`", ErrorCode.TOOL_FAILED
            )
        u = urlsplit(url)
        params: dict[str, Any] = {
            "host": u.hostname or "localhost",
            "port": u.port or 5432,
            "database": unquote(u.path.lstrip("/")) or "postgres",
            "user": unquote(u.username or ""),
            "password": unquote(u.password or ""),
        }
        return {"name": name, "type": "postgres", "params": params}
    value = secret_value(str(key))
    fields: Mapping[str, Any] = value if isinstance(value, Mapping) else {}
    key_id = fields.get("key_id") or fields.get("access_key_id")
    secret_key = fields.get("secret_key") or fields.get("secret") or fields.get("secret_access_key")
    if not key_id or not secret_key:
        raise StepFailure(
            f"{where}: the credential `{key}` needs `key_id` and `secret_key` (HMAC)", ErrorCode.TOOL_FAILED
        )
    params = {"key_id": key_id, "secret": secret_key, "scope": secret.get("scope")}
    if kind == "s3":
        params.update(region=fields.get("region"), endpoint=fields.get("endpoint"))
    return {"name": name, "type": "s3" if kind == "s3" else "gcs", "params": params}


MAX_SCRIPT_BYTES = 1024 * 1024
"""The largest script file a step reads (NoETL's ``script`` with ``source.type: file``)."""


async def _script_step(
    task: TaskPlan, script: Mapping[str, Any], step: object, scope: Mapping[str, object], inputs: dict[str, Any]
) -> Any:
    """The code (or SQL) of a ``script`` file, read now: its ``uri`` under the playbook's directory (no absolute
    path, nothing outside it). Python code compiles into the step run in place of ``step``; SQL is rendered as
    the tool's command, its quoted values bound."""
    where = f"{task.location}.script.uri"
    uri = await _rendered(script["uri"], scope)
    if not isinstance(uri, str) or not uri or Path(uri).is_absolute() or ".." in Path(uri).parts:
        raise StepFailure(
            f"{where}: must be a relative path under the playbook's directory, got {uri!r}", ErrorCode.FORBIDDEN
        )
    path = _script_file(script["playbook"], uri)
    if path is None:
        raise StepFailure(
            f"{where}: no file `{uri}` under the playbook's directory or its parents up to the catalog's root",
            ErrorCode.TOOL_FAILED,
        )
    try:
        data = await trio.Path(path).read_bytes()
    except OSError as e:
        raise StepFailure(f"{where}: cannot read `{uri}`: {e.strerror or e}", ErrorCode.TOOL_FAILED) from None
    if len(data) > MAX_SCRIPT_BYTES:
        raise StepFailure(f"{where}: `{uri}` is larger than {MAX_SCRIPT_BYTES} bytes", ErrorCode.LIMIT_EXCEEDED)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise StepFailure(f"{where}: `{uri}` is not UTF-8 text", ErrorCode.TOOL_FAILED) from None
    if script["kind"] == "python":
        from mcpipe.declared import StepScope, compile_step

        raw = {**task.parts["raw"], "code": text}
        compiled, problems = compile_step(raw, f"{task.location}.script", StepScope(policy=script["policy"]))
        if compiled is None:
            raise StepFailure(
                f"{where}: `{uri}`: {problems[0].message if problems else 'does not compile'}", ErrorCode.TOOL_FAILED
            )
        return compiled
    from mcpipe.formats.noetl._tmpl import compile_tmpl

    tpl, why = sql_template(text, script["kind"], script["playbook"].workload)
    if why is not None:
        raise StepFailure(f"{where}: `{uri}`: {why}", ErrorCode.TOOL_FAILED)
    found: list[tuple[str, str]] = []
    sql = compile_tmpl(tpl.source, where, found, "text")
    if found:
        raise StepFailure(f"{found[0][0]}: `{uri}`: {found[0][1]}", ErrorCode.TOOL_FAILED)
    inputs[script["field"]], inputs["params"] = await rendered_sql(sql, scope, tpl)
    return step


_NOT_DATA = ("env", "keychain")
_DATA = (str, int, float, bool, list, dict, type(None))


def context_data(scope: Mapping[str, object]) -> dict[str, Any]:
    """A step's scope as data (NoETL's ``context`` global of python code): its variables, the results so
    far by name, its loop item, ``execution_id``, ``job``; never the keychain or the environment."""
    out = {k: v for k, v in scope.items() if k not in _NOT_DATA and isinstance(v, _DATA)}
    # Only data crosses into the code's process: anything else a result may hold becomes its text.
    return dict(orjson.loads(orjson.dumps(out, default=str)))


async def _run_http(
    task: TaskPlan,
    scope: Mapping[str, object],
    env: Mapping[str, object],
    ctx: ToolContext,
    overrides: Mapping[str, Any] | None = None,
) -> Any:
    """NoETL's ``http`` tool: ``data`` routed to the query (GET/DELETE) or the body (others) unless it
    names ``query``/``body``, then ``params``/``payload``; the result NoETL's (``{status_code, headers,
    url, elapsed, data}``), an error status answered as NoETL's error result."""
    parts = task.parts
    t: dict[str, Tmpl | None] = parts["tmpl"]
    method: str = parts["method"]
    scope = await _with_params(t.get("with"), scope)
    over = overrides or {}
    url = over["url"] if "url" in over else await _rendered(t["url"], scope)
    if not isinstance(url, str):
        raise StepFailure(f"{task.location}.url: must be a string, got {json_type(url)}", ErrorCode.TOOL_FAILED)
    headers = await _rendered(t["headers"], scope) or {}
    if not isinstance(headers, Mapping):
        raise StepFailure(f"{task.location}.headers: must be an object", ErrorCode.TOOL_FAILED)
    headers = {str(k): v if isinstance(v, str) else str(v) for k, v in headers.items() if v is not None}
    headers.update({str(k): str(v) for k, v in (over.get("headers") or {}).items()})
    data = await _rendered(t["data"], scope) or {}
    params = await _rendered(t["params"], scope) or {}
    if isinstance(params, Mapping) and isinstance(over.get("params"), Mapping):
        params = {**params, **over["params"]}  # a page's `next_call` (success-side retry)
    payload = await _rendered(t["payload"], scope)
    if payload is None:
        payload = await _rendered(t["body"], scope)
    for key in ("payload", "body", "json"):
        if key in over:
            payload = over[key]
    if not isinstance(data, Mapping):
        raise StepFailure(f"{task.location}.data: must be an object, got {json_type(data)}", ErrorCode.TOOL_FAILED)
    # `data` naming neither `query` nor `body` is the whole query (GET, DELETE) or body (the others).
    plain = dict(data) if data and "query" not in data and "body" not in data else None
    query: Any = data["query"] if isinstance(data.get("query"), Mapping) else None
    body: Any = data.get("body")
    if method in ("GET", "DELETE"):
        query = plain if plain is not None else query
        if not query and isinstance(params, Mapping) and params:
            query = params
    else:
        body = plain if plain is not None else body
        if body is None and payload not in (None, {}):
            body = payload
        if query is None and isinstance(params, Mapping) and params:
            query = params
    if t["auth"] is not None:
        headers.update(_auth_headers(await _rendered(t["auth"], scope), task.location))
    inputs = {"url": url, "headers": headers, "query": _query(query), "body": body}
    t0 = perf_counter()
    out = await _call_kind(parts["step"], inputs, env, ctx, task.location)
    status = out.get("status")
    response = {
        "status_code": status,
        "headers": out.get("headers", {}),
        "url": _full_url(url, inputs["query"]),
        "elapsed": round(perf_counter() - t0, 6),
        "data": out.get("body"),
    }
    if isinstance(status, int) and 200 <= status < 300:
        return response
    return {"id": os.urandom(8).hex(), "status": "error", "data": response, "error": f"HTTP {status}"}


def _full_url(url: str, query: object) -> str:
    """The URL requested, its query included (NoETL reports the response's URL)."""
    if not isinstance(query, Mapping) or not query:
        return url
    from urllib.parse import urlencode

    return url + ("&" if "?" in url else "?") + urlencode(query, doseq=True)


def _query(query: object) -> Any:
    if not isinstance(query, Mapping):
        return query
    return {str(k): v if isinstance(v, str | list) else ("" if v is None else _scalar(v)) for k, v in query.items()}


def _scalar(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _auth_headers(auth: object, location: str) -> dict[str, str]:
    """The request headers of NoETL's http ``auth``: a credential by name is a bearer token (its ``token``,
    ``access_token`` or ``value``, read from ``NOETL_SECRET_<NAME>``); a map of aliases, each one's headers."""
    if isinstance(auth, str) and auth.strip():
        auth = {"type": "bearer", "credential": auth.strip()}
    if not isinstance(auth, Mapping):
        raise StepFailure(f"{location}.auth: must be an object, got {json_type(auth)}", ErrorCode.TOOL_FAILED)
    if auth and not toolkinds.single_auth(auth) and "token" not in auth and "credential" not in auth:
        headers: dict[str, str] = {}
        for entry in auth.values():
            headers.update(_auth_headers(entry, location))
        return headers
    kind = auth.get("type", "bearer")
    token: Any
    if auth.get("source") == "env":
        token = _environ(str(auth.get("name") or ""), f"{location}.auth")
    elif auth.get("credential") is not None or auth.get("key") is not None:
        secret = secret_value(str(auth.get("credential") or auth.get("key")))
        if isinstance(secret, Mapping):
            token = secret.get("token") or secret.get("access_token") or secret.get("value") or secret.get("api_key")
            if kind == "basic":
                auth = {**auth, "username": secret.get("username", ""), "password": secret.get("password", "")}
        else:
            token = secret
    else:
        token = auth.get("token") or auth.get("value")
    if kind == "basic":
        import base64

        user, password = auth.get("username", ""), auth.get("password", "")
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    if kind in ("header", "api_key"):
        return {str(auth.get("header") or "X-API-Key"): str(token)}
    return {"Authorization": f"Bearer {token}"}


async def _run_playbook(
    task: TaskPlan, plan: StepPlan, scope: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> Any:
    """A sub-playbook, run to its end on the same scheduler, under the same limits; its result is
    ``{status, completed, failed, completed_steps, variables, result}`` (``result``: the ``return_step``'s
    result, else the sub-playbook's final result)."""
    from mcpipe.formats.noetl._serve import run_noetl

    parts = task.parts
    pb = plan.playbook
    running = _RUNNING.get() or (identity(pb),)  # the playbooks this one runs in, outermost first
    child: NoetlPlaybook | None = parts["child"]
    if child is None:
        path = await _rendered(parts["path"], scope)
        if not isinstance(path, str) or pb.catalog is None:
            raise StepFailure(f"{task.location}.path: no playbook `{path}` in the catalog", ErrorCode.TOOL_FAILED)
        # A playbook compiled now reads its file (and a catalog its directories): off the event loop.
        child, why = await trio.to_thread.run_sync(pb.catalog.child, path, pb, running[:-1])
        if child is None:
            raise StepFailure(f"{task.location}.path: {why}", ErrorCode.TOOL_FAILED)
    elif identity(child) in running:  # reached again through another's templated path
        names = " -> ".join(os.path.basename(k) for k in (*running, identity(child)))
        raise StepFailure(
            f"{task.location}.path: playbook `{child.path}` runs itself again through its `playbook` tasks ({names})",
            ErrorCode.TOOL_FAILED,
        )
    if len(running) > MAX_DEPTH:
        raise StepFailure(
            f"{task.location}.path: sub-playbooks nest deeper than {MAX_DEPTH} (playbook `{child.path}`)",
            ErrorCode.LIMIT_EXCEEDED,
        )
    given = await _rendered(parts["input"], scope) or {}
    if child.registry is None:
        child.registry = plan.playbook.registry
    token = _RUNNING.set((*running, identity(child)))
    try:
        answer = await run_noetl(child, dict(given), ctx, limits=plan.playbook.limits)
    finally:
        _RUNNING.reset(token)
    shaped = answer["noetl"]
    ret = parts["return_step"]
    result = (shaped["steps"].get(ret) or [None])[-1] if ret is not None else shaped["final"]
    variables, _ = step_results(child, {"args": given, "steps": answer["steps"]})
    done = shaped["status"] == "completed"
    out = {"status": shaped["status"] if done else "error", "completed": done, "failed": not done}
    out.update(completed_steps=[s for s, runs in shaped["steps"].items() if runs], variables=variables)
    out.update(result=result, path=child.path)
    if not done:
        out["error"] = answer.get("error") or "the sub-playbook failed"
    return out


async def _run_turn(task: TaskPlan, plan: StepPlan, env: Mapping[str, Any], ctx: ToolContext) -> Any:
    """A seed 004 turn (``mcp:`` section) as a step: its resources first, then the model call."""
    from mcpipe.formats.noetl import _run

    mcp = plan.playbook.mcp
    assert mcp is not None
    turn = mcp.turns[task.parts["turn"]]
    done: dict[str, str] = {}
    steps = dict(env.get("steps") or {})
    for rname in turn.resources:
        sid = f"resource_{rname}"
        if sid not in steps:
            action = mcp.resources[rname]
            value = await _run.perform(mcp, action, _run.roots(mcp, {**env, "steps": steps}, {}), env, ctx)
            steps[sid] = {"ok": True, "output": value}
        done[rname] = sid
    mcp.turn_steps.setdefault(turn.name, plan.name)
    leaf = _TurnLeaf(plan.name, _run.TurnPlan(mcp, turn, done))
    out = await _run.run_turn(leaf, {}, {**env, "steps": steps}, ctx)
    return out.output


@dataclass
class _TurnLeaf:
    id: str
    built: Any
