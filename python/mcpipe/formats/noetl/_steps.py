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

import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import orjson
import trio

from mcpipe._describe import json_type
from mcpipe.errors import ErrorCode, ExpressionError
from mcpipe.formats.noetl._layout import ArcSpec
from mcpipe.formats.noetl._run import EVENTS as _run_events
from mcpipe.formats.noetl._scope import (
    SET_FACT,
    Environ,
    Keychain,
    apply_set,
    loop_result,
    output_view,
    secret_value,
    wrap,
)
from mcpipe.formats.noetl._tmpl import RenderError, Tmpl, truthy
from mcpipe.formats.noetl._workflow import ArcPlan, NoetlPlaybook, StepPlan, TaskPlan
from mcpipe.kinds import ForbiddenError
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools._base import ToolContext

__all__ = ["EVENTS", "ArcWhen", "LoopItems", "run_step", "scope_of", "step_results"]

EVENTS = _run_events
"""The running playbook's event sink (the one seed 004's turns use): each step's ``step_exit`` (its NoETL
result) goes through it."""


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
    for sid, r in (env.get("steps") or {}).items():
        if sid not in pb.steps or not isinstance(r, Mapping):
            continue
        if r.get("kind") == "for_each":
            children = [ch for ch in r.get("children") or [] if ch is not None]
            for ch in children:
                if ch.get(SET_FACT):
                    apply_set(variables, ch[SET_FACT])
            outputs = [ch.get("output") for ch in children if ch.get("ok")]
            value: Any = loop_result(outputs, sum(1 for ch in children if not ch.get("ok")))
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


_RESERVED = ("event", "ctx", "iter", "workload", "vars")
_PROTECTED = ("execution_id", "catalog_id", "job")


EXECUTION_ID = "_noetl_execution_id"
"""The argument a run's execution id travels in (set by :func:`mcpipe.formats.noetl._serve.run_noetl`,
never a variable)."""


def execution_id(env: Mapping[str, Any]) -> str:
    """The run's id, as NoETL writes its execution ids (a number of 18 digits)."""
    return str((env.get("args") or {}).get(EXECUTION_ID) or "")


def scope_of(
    pb: NoetlPlaybook,
    env: Mapping[str, Any],
    iterator: str | None = None,
    extra: Mapping[str, Any] | None = None,
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
    for name, value in results.items():
        if name not in scope and name not in _PROTECTED:
            scope[name] = wrap(value)
    for name, value in variables.items():
        if name not in scope and name not in _PROTECTED:
            scope[name] = wrap(value)
    run_id = execution_id(env)
    scope["execution_id"] = run_id
    scope["catalog_id"] = None
    scope["job"] = {"uuid": run_id, "execution_id": run_id, "id": run_id}
    scope["env"] = Environ()
    scope["keychain"] = Keychain(pb.keychain, lambda v: _render_plain(v, scope))
    if pb.mcp is not None:
        from mcpipe.formats.noetl._run import roots

        for k, v in roots(pb.mcp, env, {}).items():
            scope.setdefault(k, v)
    return scope


def _render_plain(value: Any, scope: Mapping[str, Any]) -> Any:
    from mcpipe.formats.noetl._tmpl import compile_tmpl

    problems: list[tuple[str, str]] = []
    t = compile_tmpl(value, "keychain", problems)
    if problems:
        raise KeyError(problems[0][1])
    return t.render(scope)


def _source_view(env: Mapping[str, Any], source: str, loop: bool) -> dict[str, Any]:
    """``output``, ``event``, ``result`` and ``error`` of a finished step (for its ``set`` and arcs)."""
    r = (env.get("steps") or {}).get(source) or {}
    ok = bool(r.get("ok"))
    if loop:
        children = [ch for ch in r.get("children") or [] if ch is not None]
        outputs = [ch.get("output") for ch in children if ch.get("ok")]
        result: Any = loop_result(outputs, sum(1 for ch in children if not ch.get("ok")))
        event = "loop.done"
        ok = True
    else:
        result = r.get("output")
        event = "call.done" if ok else "call.error"
    error = None if ok else (r.get("error") or "failed")
    return {
        "output": wrap(output_view(result, ok, error)),
        "event": {"name": event, "step": source},
        "result": wrap(result),
        "error": error,
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

    def evaluate(self, env: Mapping[str, Any]) -> bool:
        scope = self._scope(env)
        if self.arc.otherwise:
            for prior, when in self.earlier:
                if prior.otherwise or when is None:
                    continue
                if self._holds(when, scope):
                    return False
            return True
        if self.when is None:
            return True
        return self._holds(self.when, scope)

    async def evaluate_async(self, env: Mapping[str, Any]) -> bool:
        """:meth:`evaluate`, rendering off the event loop (the graph awaits this one)."""
        if self.when is None and not self.arc.otherwise:
            return True
        scope = self._scope(env)
        try:
            if self.arc.otherwise:
                for prior, when in self.earlier:
                    if not prior.otherwise and when is not None and truthy(await when.render_async(scope)):
                        return False
                return True
            assert self.when is not None
            return truthy(await self.when.render_async(scope))
        except RenderError as e:
            raise ExpressionError(str(e)) from None

    def _scope(self, env: Mapping[str, Any]) -> dict[str, Any]:
        scope = scope_of(self.step.playbook, env)
        scope.update(_source_view(env, self.step.name, self.loop))
        return scope

    def _holds(self, when: Tmpl, scope: Mapping[str, Any]) -> bool:
        try:
            return truthy(when.render(scope))
        except RenderError as e:
            raise ExpressionError(str(e)) from None


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

    def evaluate(self, env: Mapping[str, Any]) -> bool:
        scope = scope_of(self.step.playbook, env)
        for t, when, allow in self.rules:
            if when is None or when is True:
                return allow
            if t is None:
                continue
            try:
                if truthy(t.render(scope)):
                    return allow
            except RenderError as e:
                raise ExpressionError(str(e)) from None
        return True

    async def evaluate_async(self, env: Mapping[str, Any]) -> bool:
        """:meth:`evaluate`, rendering off the event loop (issue 20: a condition is caller-reachable Jinja)."""
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


def _normalized(value: Any) -> list[Any]:
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

    async def evaluate_async(self, env: Mapping[str, Any]) -> list[Any]:
        """:meth:`evaluate`, rendering the collection off the event loop."""
        scope = scope_of(self.step.playbook, env)
        try:
            value = await self.items.render_async(scope)
        except RenderError as e:
            raise ExpressionError(str(e)) from None
        if self.filter is None:
            return self._items(value, scope)
        kept = []
        for item in _normalized(value):  # the filter too, off the event loop, item by item
            scope[self.iterator] = wrap(item)
            scope["iter"] = {self.iterator: wrap(item)}
            try:
                if truthy(await self.filter.render_async(scope)):
                    kept.append(item)
            except RenderError as e:
                raise ExpressionError(str(e)) from None
        return kept

    def evaluate(self, env: Mapping[str, Any]) -> list[Any]:
        scope = scope_of(self.step.playbook, env)
        try:
            value = self.items.render(scope)
        except RenderError as e:
            raise ExpressionError(str(e)) from None
        return self._items(value, scope)

    def _items(self, value: Any, scope: dict[str, Any]) -> list[Any]:
        items = _normalized(value)
        if self.filter is None:
            return items
        kept = []
        for item in items:
            scope[self.iterator] = wrap(item)
            scope["iter"] = {self.iterator: wrap(item)}
            try:
                if truthy(self.filter.render(scope)):
                    kept.append(item)
            except RenderError as e:
                raise ExpressionError(str(e)) from None
        return kept


# --- a step ---


async def run_step(step: Any, inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext) -> StepOutput:
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
                muts = await data.set.render_async(source_scope)
                apply_set(writes, muts)
            if data.data is not None:
                passed.update(await data.data.render_async(source_scope))
        except RenderError as e:
            raise StepFailure(str(e), ErrorCode.INTERPOLATION_FAILED, facts=_facts(writes)) from None
    scope = scope_of(pb, env, plan.iterator, {**writes, **passed})
    emit = EVENTS.get()
    t0 = perf_counter()
    if plan.router:
        result: Any = None
    else:
        try:
            result = await _run_tasks(plan, scope, env, ctx)
            if (plan.pipeline or any(t.rules for t in plan.tasks)) and isinstance(result, Mapping):
                seq_ctx = result.get("ctx")
                if isinstance(seq_ctx, Mapping) and seq_ctx:
                    apply_set(writes, seq_ctx)  # NoETL syncs a pipeline's `ctx` into the execution's
        except StepFailure as e:
            failed = _error_result(e)
            if emit is not None:
                emit(_exit(step, plan, "error", failed, str(e), t0))
            raise StepFailure(str(e), e.code, failed, _facts(writes)) from None
    if plan.set is not None:
        after = dict(scope)
        if result is not None:
            after[plan.name] = wrap(result)
        after.update(
            {
                "output": wrap(output_view(result, True, None)),
                "event": {"name": "call.done", "step": plan.name},
                "result": wrap(result),
            }
        )
        try:
            apply_set(writes, await plan.set.render_async(after))
        except RenderError as e:
            raise StepFailure(str(e), ErrorCode.INTERPOLATION_FAILED, result, _facts(writes)) from None
    if emit is not None and not plan.router:
        emit(_exit(step, plan, "ok", result, "", t0))
    out = StepOutput.of(result)
    if writes:
        out.facts = _facts(writes)
    return out


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
    m = _PYTHON_FAILED.match(text)
    if m is not None:
        text = m.group("text")
    return {"id": str(uuid.uuid4()), "status": "error", "error": text}


def _facts(writes: Mapping[str, Any]) -> dict[str, Any]:
    return {SET_FACT: dict(writes)} if writes else {}


def _exit(step: Any, plan: StepPlan, status: str, result: Any, error: str, t0: float) -> dict[str, Any]:
    event = {
        "type": "step_exit",
        "id": step.id,
        "step": plan.name,
        "status": status,
        "result": result,
        "duration_ms": round((perf_counter() - t0) * 1000, 3),
    }
    if error:
        event["error"] = error
    return event


def _error_status(result: Any) -> str | None:
    """NoETL's worker: a result whose ``status`` is ``error``/``failed`` is the tool's failure."""
    if isinstance(result, Mapping) and result.get("status") in ("error", "failed"):
        err = result.get("error") or result.get("message")
        if isinstance(err, Mapping):
            return f"the tool answered status `{result['status']}`: {err.get('message') or err}"
        return f"the tool answered status `{result['status']}`" + (f": {err}" if err else "")
    return None


async def _run_tasks(plan: StepPlan, scope: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext) -> Any:
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


def _outcome(status: str, result: Any, error: Any, kind: str, attempt: int, ms: float) -> dict[str, Any]:
    """NoETL's ``build_outcome``: the ``output`` a task's policy rules read."""
    out: dict[str, Any] = {"status": status, "meta": {"attempt": attempt, "duration_ms": int(ms)}}
    if status == "ok":
        out["data"] = result
    else:
        out["error"] = error
    if kind == "http":
        code = None
        source = result if isinstance(result, Mapping) else None
        if source is not None:
            data = source.get("data")
            code = source.get("status_code") or (data.get("status_code") if isinstance(data, Mapping) else None)
        if isinstance(error, Mapping) and error.get("status_code") is not None:
            code = error["status_code"]
        out["http"] = {"status": code, "headers": (source or {}).get("headers", {})}
    return out


async def _sequence(plan: StepPlan, base: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext) -> Any:
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
        scope = dict(base)
        scope.update({k: wrap(v) for k, v in results.items()})
        merged_ctx = wrap({**(base.get("ctx") or {}), **seq_ctx})
        merged_iter = {**(base.get("iter") or {}), **{k: wrap(v) for k, v in seq_iter.items()}}
        scope.update(
            {
                "_task": task.name,
                "_prev": wrap(prev),
                "_attempt": attempt,
                "results": wrap(results),
                "ctx": merged_ctx,
                "iter": merged_iter,
            }
        )
        t0 = perf_counter()
        error: Any = None
        result: Any = None
        try:
            result = await _run_task(task, plan, scope, env, ctx)
            why = _error_status(result)
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
        do = action.rule.do if action.rule is not None else ("continue" if ok else "fail")
        if do == "continue":
            i += 1
        elif do == "retry":
            rule = action.rule
            assert rule is not None
            retries[task.name] = retries.get(task.name, 0) + 1
            if retries[task.name] >= rule.attempts:
                raise StepFailure(
                    f"{task.location}: still failing after {rule.attempts} attempts: {_bare(_message(error), task)}",
                    _code(error),
                    _failed(prev, results, seq_ctx, error, task.name),
                )
            await trio.sleep(_delay(rule, retries[task.name]))
        elif do == "jump":
            rule = action.rule
            assert rule is not None
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


def _message(error: Any) -> str:
    if isinstance(error, Mapping):
        return str(error.get("message") or error)
    return str(error)


def _code(error: Any) -> str:
    if isinstance(error, Mapping) and isinstance(error.get("code"), str) and error["code"].isupper():
        code = error["code"]
        if code in ErrorCode.__members__:
            return code
    return ErrorCode.TOOL_ERROR


def _failed(prev: Any, results: dict[str, Any], seq_ctx: dict[str, Any], error: Any, task: str) -> dict[str, Any]:
    return {"status": "failed", "_prev": prev, "results": results, "ctx": seq_ctx, "error": error, "failed_task": task}


def _error_info(result: Any, why: str) -> dict[str, Any]:
    code = None
    status_code = None
    if isinstance(result, Mapping):
        data = result.get("data")
        raw = result.get("status_code") or (data.get("status_code") if isinstance(data, Mapping) else None)
        if isinstance(raw, int):
            status_code = raw
            code = f"HTTP_{raw}"
    retryable = status_code is not None and (status_code == 429 or status_code >= 500)
    return {"kind": "tool_error", "retryable": retryable, "code": code, "status_code": status_code, "message": why}


def _delay(rule: Any, attempt: int) -> float:
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
    rule: Any
    set: Tmpl | None


async def _decide(task: TaskPlan, scope: Mapping[str, Any], ok: bool, attempt: int, error: Any, result: Any) -> _Action:
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


async def _legacy_retries(rp: Any, ok: bool, attempt: int, error: Any, result: Any) -> bool:
    """NoETL 1.x's ``RetryPolicy.should_retry``: within ``max_attempts``, unless ``stop_when`` holds, when
    ``retry_when`` holds (or the error's kind is in ``retry_on``; by default, on an error)."""
    rule = rp.rule
    if attempt + 1 > rule.attempts:
        return False
    body = result if isinstance(result, Mapping) else {}
    names = {
        "result": wrap(body),
        "attempt": attempt + 1,
        "error": _message(error) if error is not None else None,
        "status_code": body.get(
            "status_code",
            (body.get("data") or {}).get("status_code") if isinstance(body.get("data"), Mapping) else None,
        ),
        "success": ok,
        "data": wrap(body.get("data")),
    }
    for when in (rp.stop,):
        if when is not None:
            try:
                if truthy(await when.render_async(names)):
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


# --- tasks ---


async def _run_task(task: TaskPlan, plan: StepPlan, scope: dict[str, Any], env: Mapping[str, Any], ctx: Any) -> Any:
    runner = task.runner
    if runner == "noop":
        return {"status": "noop", "step": plan.name}
    if runner == "kind":
        return await _run_kind(task, scope, env, ctx)
    if runner == "http":
        return await _run_http(task, scope, env, ctx)
    if runner == "playbook":
        return await _run_playbook(task, plan, scope, env, ctx)
    if runner == "turn":
        return await _run_turn(task, plan, env, ctx)
    if runner == "secrets":
        value = os.environ.get(task.parts["name"])
        if value is None:
            raise StepFailure(
                f"{task.location}: the environment variable {task.parts['name']} is not set", "TOOL_FAILED"
            )
        return {"value": value}
    raise StepFailure(f"{task.location}: no runner for kind `{task.kind}`", ErrorCode.TOOL_FAILED)


async def _rendered(t: Tmpl | None, scope: Mapping[str, Any]) -> Any:
    """``t`` rendered off the event loop; a failure is the step's ``INTERPOLATION_FAILED`` (or the budget's
    code, ``TIMEOUT``/``LIMIT_EXCEEDED``)."""
    if t is None:
        return None
    try:
        return await t.render_async(scope)
    except RenderError as e:
        raise StepFailure(str(e), e.code) from None


async def _call_kind(step: Any, inputs: dict[str, Any], env: Mapping[str, Any], ctx: Any, location: str) -> Any:
    """Run a compiled mcpipe step kind's executor with ``inputs``, under its deadline."""
    try:
        work = step.run(step, inputs, env, ctx)
        if step.timeout_ms is None:
            out = await work
        else:
            out = None
            with trio.move_on_after(step.timeout_ms / 1000):
                out = await work
            if out is None:
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


async def _run_kind(task: TaskPlan, scope: Mapping[str, Any], env: Mapping[str, Any], ctx: Any) -> Any:
    step = task.parts["step"]
    fields: dict[str, Tmpl] = task.parts["fields"]
    inputs = {name: t.resolve({}) for name, t in step.templates if name not in fields}
    for name, t in fields.items():
        inputs[name] = await _rendered(t, scope)
    if task.parts.get("context"):
        inputs["context"] = context_data(scope)
    return await _call_kind(step, inputs, env, ctx, task.location)


_NOT_DATA = ("env", "keychain")


def context_data(scope: Mapping[str, Any]) -> dict[str, Any]:
    """A step's scope as data (NoETL's ``context`` global of python code): its variables, the results so
    far by name, its loop item, ``execution_id``, ``job``; never the keychain or the environment."""
    out: dict[str, Any] = {}
    for k, v in scope.items():
        if k in _NOT_DATA or not isinstance(v, str | int | float | bool | list | dict | type(None)):
            continue
        out[k] = v
    # Only data crosses into the code's process: anything else a result may hold becomes its text.
    return dict(orjson.loads(orjson.dumps(out, default=str)))


async def _run_http(task: TaskPlan, scope: Mapping[str, Any], env: Mapping[str, Any], ctx: Any) -> Any:
    """NoETL's ``http`` tool: ``data`` routed to the query (GET/DELETE) or the body (others) unless it
    names ``query``/``body``, then ``params``/``payload``; the result NoETL's (``{status_code, headers,
    url, elapsed, data}``), an error status answered as NoETL's error result."""
    parts = task.parts
    t: dict[str, Tmpl | None] = parts["tmpl"]
    method: str = parts["method"]
    given = await _rendered(t.get("with"), scope)
    if isinstance(given, Mapping):  # NoETL 1.x's `with`: names the request's templates read
        scope = {**scope, **{str(k): wrap(v) for k, v in given.items()}}
    url = await _rendered(t["url"], scope)
    if not isinstance(url, str):
        raise StepFailure(f"{task.location}.url: must be a string, got {json_type(url)}", ErrorCode.TOOL_FAILED)
    headers = await _rendered(t["headers"], scope) or {}
    if not isinstance(headers, Mapping):
        raise StepFailure(f"{task.location}.headers: must be an object", ErrorCode.TOOL_FAILED)
    headers = {str(k): v if isinstance(v, str) else str(v) for k, v in headers.items() if v is not None}
    data = await _rendered(t["data"], scope) or {}
    params = await _rendered(t["params"], scope) or {}
    payload = await _rendered(t["payload"], scope)
    if payload is None:
        payload = await _rendered(t["body"], scope)
    if not isinstance(data, Mapping):
        raise StepFailure(f"{task.location}.data: must be an object, got {json_type(data)}", ErrorCode.TOOL_FAILED)
    query: Any = None
    body: Any = None
    if "query" in data and isinstance(data.get("query"), Mapping):
        query = data["query"]
    if "body" in data:
        body = data["body"]
    if method in ("GET", "DELETE"):
        if query is None and "query" not in data and "body" not in data and data:
            query = dict(data)
        if not query and isinstance(params, Mapping) and params:
            query = params
    else:
        if body is None and "query" not in data and "body" not in data and data:
            body = dict(data)
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


def _full_url(url: str, query: Any) -> str:
    """The URL requested, its query included (NoETL reports the response's URL)."""
    if not isinstance(query, Mapping) or not query:
        return url
    from urllib.parse import urlencode

    return url + ("&" if "?" in url else "?") + urlencode(query, doseq=True)


def _query(query: Any) -> Any:
    if not isinstance(query, Mapping):
        return query
    return {str(k): v if isinstance(v, str | list) else ("" if v is None else _scalar(v)) for k, v in query.items()}


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _auth_headers(auth: Any, location: str) -> dict[str, str]:
    if not isinstance(auth, Mapping):
        raise StepFailure(f"{location}.auth: must be an object, got {json_type(auth)}", ErrorCode.TOOL_FAILED)
    kind = auth.get("type", "bearer")
    token: Any
    if auth.get("source") == "env":
        name = str(auth.get("name") or "")
        value = os.environ.get(name)
        if value is None:
            raise StepFailure(f"{location}.auth: the environment variable {name} is not set", ErrorCode.TOOL_FAILED)
        token = value
    elif auth.get("credential") is not None or auth.get("key") is not None:
        secret = secret_value(str(auth.get("credential") or auth.get("key")))
        token = secret.get("token") or secret.get("value") if isinstance(secret, Mapping) else secret
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
    task: TaskPlan, plan: StepPlan, scope: Mapping[str, Any], env: Mapping[str, Any], ctx: Any
) -> Any:
    """A sub-playbook, run to its end on the same scheduler, under the same limits; its result is
    ``{status, completed, failed, completed_steps, variables, result}`` (``result``: the ``return_step``'s
    result, else the sub-playbook's final result)."""
    from mcpipe.formats.noetl._serve import run_noetl

    parts = task.parts
    child: NoetlPlaybook | None = parts["child"]
    if child is None:
        path = await _rendered(parts["path"], scope)
        pb = plan.playbook
        if not isinstance(path, str) or pb.catalog is None:
            raise StepFailure(f"{task.location}.path: no playbook `{path}`", ErrorCode.TOOL_FAILED)
        child, why = pb.catalog.child(path, pb, parts["stack"][:-1])
        if child is None:
            raise StepFailure(f"{task.location}.path: {why}", ErrorCode.TOOL_FAILED)
    given = await _rendered(parts["input"], scope) or {}
    if child.registry is None:
        child.registry = plan.playbook.registry
    sub_ctx = ctx
    answer = await run_noetl(child, dict(given), sub_ctx, limits=plan.playbook.limits)
    shaped = answer["noetl"]
    ret = parts["return_step"]
    if ret is not None:
        runs = shaped["steps"].get(ret) or []
        result = runs[-1] if runs else None
    else:
        result = shaped["final"]
    variables, _ = step_results(child, {"args": given, "steps": answer["steps"]})
    out = {
        "status": shaped["status"],
        "completed": shaped["status"] == "completed",
        "failed": shaped["status"] != "completed",
        "completed_steps": [s for s, runs in shaped["steps"].items() if runs],
        "variables": variables,
        "result": result,
        "path": child.path,
    }
    if shaped["status"] != "completed":
        out["status"] = "error"
        out["error"] = answer.get("error") or "the sub-playbook failed"
    return out


async def _run_turn(task: TaskPlan, plan: StepPlan, env: Mapping[str, Any], ctx: Any) -> Any:
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
