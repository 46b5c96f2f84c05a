"""The Trio scheduler: run a compiled pipeline as contract sections 6-8 say.

Shape of a run. The calling task is the run's supervisor: it owns the pipeline's deadline (one cancel
scope) and runs the steps of a list one after another. A parallel group opens a nursery and runs each
child as its own task; a nested pipe runs its list inside the task of its step. Every task is a child of
the supervisor's scope, so cancelling the caller, or the pipeline's deadline passing, reaches every step
and every tool call in flight, and no task outlives its pipeline.

Sequential steps get no task, nursery or cancel scope of their own unless they have a ``timeout_ms``:
those are what per-step overhead is made of, and trio gives sequential code structured concurrency for
free. A step records its result on the way out even when it is cancelled (``CANCELLED``), then lets the
cancellation go on.

Tool calls made under a parallel group hold a slot of the call's ``CapacityLimiter`` (``max_concurrency``)
and then one of the process-wide limiter. The slots are held by tool calls only, never by a group or a
pipe waiting for its children, so nested groups cannot deadlock on the limit.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from time import perf_counter
from typing import Any

import orjson
import trio

from mcpipe import telemetry
from mcpipe._core import json_measure
from mcpipe.compile import (
    DEFAULT_LIMITS,
    CompiledSpec,
    Limits,
    ParallelStep,
    PipelinePlan,
    PipeStep,
    ToolStep,
    compile_spec,
)
from mcpipe.errors import (
    InterpolationError,
    MCPipeError,
    OutputTooLargeError,
    Problem,
    SpecError,
    TemplateSyntaxError,
)
from mcpipe.tools._base import ToolContext, ToolResult
from mcpipe.tools._registry import UnknownToolError

__all__ = ["PROCESS_CONCURRENCY", "EventFn", "process_limiter", "run_compiled", "run_pipeline"]

EventFn = Callable[[dict[str, Any]], None]

PROCESS_CONCURRENCY = 64
"""Default size of the process-wide limiter on parallel tool calls (all calls of all pipelines)."""

_log = logging.getLogger("mcpipe.runtime")
_process_limiter: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("mcpipe_process_limiter")

_CANCELLED = "CANCELLED"
_TOO_LARGE = "OUTPUT_TOO_LARGE"
_INTERACTION = "mcpipe.interaction"  # mcpipe.interaction.INTERACTION_KEY, named here to keep imports one-way


def process_limiter() -> trio.CapacityLimiter:
    """The limiter every parallel tool call of this Trio run passes through, beneath its call's own.

    Made on first use with :data:`PROCESS_CONCURRENCY` slots; a server sets ``total_tokens`` on it from
    its configuration.
    """
    try:
        return _process_limiter.get()
    except LookupError:
        limiter = trio.CapacityLimiter(PROCESS_CONCURRENCY)
        _process_limiter.set(limiter)
        return limiter


async def run_pipeline(
    spec: Any,
    registry: Any,
    *,
    context: ToolContext | None = None,
    limits: Limits | None = None,
    on_event: EventFn | None = None,
    args: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Validate and run a pipeline spec; answer as contract section 7 says.

    Args:
        spec: the spec (dict, JSON text or bytes, or ``{"spec": ...}``), as ``mcp_pipe`` receives it.
        registry: the tools. Only ``name in registry``, ``registry.allows(name, ctx)`` and
            ``await registry.call(name, args, ctx)`` are used, so the server passes its gateway here.
        context: the request's context; each tool call gets ``context.for_step(pipeline, step)``, where
            ``pipeline`` is ``context.pipeline`` if set, else a fresh id, and ``step`` the step's id path
            (``pages.p1`` for child ``p1`` of group ``pages``).
        limits: the server's limits (default: 50 steps, depth 5, 8 parallel calls, no deadline).
        on_event: called with a dict when a step starts and when it finishes (see ``docs/pipelines.md``).
            It runs inline and must not block; exceptions it raises are logged and ignored.
        args: the ``args`` root: the arguments of the call that started a declared pipeline (default
            ``{}``, as for ``mcp_pipe``).

    Returns:
        The answer: ``ok``, ``error``, ``error_code``, ``result``, ``steps``, ``summary``,
        ``duration_ms``; a spec that fails validation also carries ``problems`` (each ``location``,
        ``code``, ``message``), and no step runs.

    Raises:
        trio.Cancelled: when the caller's scope is cancelled (every running step is cancelled first).
    """
    started = perf_counter()
    limits = limits or DEFAULT_LIMITS
    ctx = context if context is not None else ToolContext()
    try:
        compiled = compile_spec(spec, tools=registry, limits=limits)
    except SpecError as e:
        return _invalid(e.problems, started)
    except TemplateSyntaxError as e:  # the compiler reports these as problems; kept as a safety net
        return _invalid([Problem(e.location, e.code, e.reason)], started)
    return await _run_compiled(compiled, registry, ctx, limits, on_event, args, started)


async def run_compiled(
    compiled: CompiledSpec,
    registry: Any,
    *,
    context: ToolContext | None = None,
    limits: Limits | None = None,
    on_event: EventFn | None = None,
    args: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run an already compiled pipeline; answer as :func:`run_pipeline` does.

    This is how declared pipelines run: their plan is compiled once, at load, and its steps are
    :mod:`mcpipe.declared` steps (leaf ``DeclaredStep``, containers ``DeclaredParallel``/``DeclaredPipe``),
    which the scheduler runs beside ``mcp_pipe``'s own with the same semantics. A declared step whose
    ``when`` is false is skipped: its result has ``skipped: true`` and it counts as skipped in the summary.

    Args:
        compiled: the plan, its tool sites (checked with ``registry.allows`` before any step runs) and its
            leaf count (the summary's ``total``).
        registry, context, limits, on_event, args: as for :func:`run_pipeline`; ``limits.timeout_ms``
            caps the plan's own deadline and ``limits.max_concurrency`` bounds parallel groups.
    """
    started = perf_counter()
    return await _run_compiled(
        compiled,
        registry,
        context if context is not None else ToolContext(),
        limits or DEFAULT_LIMITS,
        on_event,
        args,
        started,
    )


async def _run_compiled(
    compiled: CompiledSpec,
    registry: Any,
    ctx: ToolContext,
    limits: Limits,
    on_event: EventFn | None,
    args: Mapping[str, Any] | None,
    started: float,
) -> dict[str, Any]:
    allowed: dict[str, bool] = {}
    denied = []
    for location, name in compiled.tool_sites:
        if name not in allowed:
            allowed[name] = bool(registry.allows(name, ctx))
        if not allowed[name]:
            denied.append(Problem(f"{location}.tool", "FORBIDDEN", f"tool '{name}' is not allowed for this caller"))
    if denied:
        return _invalid(denied, started)
    # One checkpoint per run, so a run of tools that never yield still honours trio's checkpoint rule.
    await trio.lowlevel.checkpoint()
    run = _Run(registry, ctx, limits, on_event, {} if args is None else args, compiled.leaf_count)
    answer = await run.main(compiled.plan, started)
    tel = telemetry.current()
    if tel is not None:
        tel.observe_steps(answer)
    return answer


def _invalid(problems: list[Problem], started: float) -> dict[str, Any]:
    return {
        "ok": False,
        "error": str(SpecError(problems)),
        "error_code": problems[0].code,
        "result": None,
        "steps": {},
        "summary": {"total": 0, "succeeded": 0, "failed": 0, "skipped": 0, "cancelled": 0},
        "duration_ms": _ms_since(started),
        "problems": [{"location": p.location, "code": p.code, "message": p.message} for p in problems],
    }


def _suspends(e: BaseException) -> bool:
    """Whether ``e`` is a step suspending to ask the client (``mcpipe.interaction.Suspended``), alone or as
    the only content of a group."""
    if isinstance(e, BaseExceptionGroup):
        return all(_suspends(x) for x in e.exceptions)
    return getattr(e, "suspends_pipeline", False) is True


async def _take(limiter: trio.CapacityLimiter) -> None:
    try:
        limiter.acquire_nowait()
    except trio.WouldBlock:
        await limiter.acquire()


def _ms_since(t0: float) -> float:
    # Milliseconds to the microsecond; int() rather than round(x, 3), which costs as much as a step.
    return int((perf_counter() - t0) * 1_000_000) / 1000


def _min_ms(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None or a <= b else b


def _timed_out(ms: float) -> str:
    return f"timed out after {ms:g} ms"


def _leaf(
    sid: str, ok: bool, error: str, code: str | None, structured: Any, text: str, content: list[Any], t0: float
) -> dict[str, Any]:
    return {
        "id": sid,
        "kind": "tool",
        "ok": ok,
        "error": error,
        "error_code": code,
        "structured": structured,
        "text": text,
        "content": content,
        "output": structured if structured is not None else text,
        "duration_ms": _ms_since(t0),
    }


def _from_tool(sid: str, res: ToolResult, t0: float) -> dict[str, Any]:
    """A tool step's result from what the tool answered (contract section 3)."""
    content = res.content
    structured = res.structured
    if len(content) == 1:
        block = content[0]
        text = block.get("text", "") if block.get("type") == "text" else ""
        if structured is None and text:
            first = text[0]
            if first == "{" or first == "[" or (first.isspace() and text.lstrip()[:1] in ("{", "[")):
                try:
                    structured = orjson.loads(text)
                except orjson.JSONDecodeError:
                    pass
    else:
        text = "".join(b.get("text", "") for b in content if b.get("type") == "text")
    if res.is_error:
        return _leaf(sid, False, text or "the tool reported an error", "TOOL_ERROR", structured, text, content, t0)
    # The common case, written out: this runs once per step.
    return {
        "id": sid,
        "kind": "tool",
        "ok": True,
        "error": "",
        "error_code": None,
        "structured": structured,
        "text": text,
        "content": content,
        "output": structured if structured is not None else text,
        "duration_ms": int((perf_counter() - t0) * 1_000_000) / 1000,
    }


def _declared_leaf(step: Any, ok: bool, error: str, code: str | None, t0: float) -> dict[str, Any]:
    """A declared step's result when the step itself could not answer (cancelled, skipped, a failed
    ``when``): no output."""
    return {
        "id": step.id,
        "kind": step.kind,
        "ok": ok,
        "error": error,
        "error_code": code,
        "structured": None,
        "text": "",
        "content": [],
        "output": None,
        "skipped": False,
        "duration_ms": _ms_since(t0),
    }


_DECLARED: tuple[Any, Any, Any] | None = None


def _declared_api() -> tuple[Any, Any, Any]:
    """``prelude``, ``SKIP`` and ``ExpressionError`` of :mod:`mcpipe.declared`, imported on first use, so
    ``mcp_pipe`` alone never loads the CEL and JSONata libraries."""
    global _DECLARED
    if _DECLARED is None:
        from mcpipe.declared._expr import ExpressionError
        from mcpipe.declared._step import SKIP, prelude

        _DECLARED = (prelude, SKIP, ExpressionError)
    return _DECLARED


def _group(step: Any, children: dict[str, Any], ok: bool, error: str, code: str | None, t0: float) -> dict[str, Any]:
    # Children finish in any order; show them in the order they were written.
    ordered = {c.id: children[c.id] for c in step.children if c.id in children}
    return {
        "id": step.id,
        "kind": "parallel",
        "ok": ok,
        "error": error,
        "error_code": code,
        "structured": None,
        "text": "",
        "content": [],
        "output": {cid: r["output"] for cid, r in ordered.items()},
        "children": ordered,
        "duration_ms": _ms_since(t0),
    }


def _pipe(
    sid: str, ok: bool, error: str, code: str | None, result: Any, steps: dict[str, Any], t0: float
) -> dict[str, Any]:
    return {
        "id": sid,
        "kind": "pipe",
        "ok": ok,
        "error": error,
        "error_code": code,
        "structured": None,
        "text": "",
        "content": [],
        "output": result,
        "result": result,
        "steps": steps,
        "duration_ms": _ms_since(t0),
    }


class _Run:
    """The state of one run: the tools, the counts, the limiters."""

    __slots__ = (
        "answer_bytes",
        "args",
        "call",
        "call_limiter",
        "cancelled",
        "ctx",
        "facts",
        "failed",
        "limits",
        "memo",
        "on_event",
        "pid",
        "proc_limiter",
        "registry",
        "succeeded",
        "total",
    )

    def __init__(
        self,
        registry: Any,
        ctx: ToolContext,
        limits: Limits,
        on_event: EventFn | None,
        args: Mapping[str, Any],
        total: int,
    ) -> None:
        self.call = registry.call
        self.registry = registry
        # A call that can suspend to ask its client (2026-07-28, see mcpipe.interaction) records every finished
        # leaf step, and a resumed call answers those from the record instead of running them again.
        memo = ctx.extras.get(_INTERACTION)
        if memo is not None and not memo.resumable:
            memo = None
        if memo is not None and ctx.step:
            ctx = memo.nested(ctx)  # a pipeline run by a step: its steps are recorded under that step
            memo = ctx.extras[_INTERACTION]
        self.memo = memo
        self.ctx = ctx
        self.pid = ctx.pipeline or os.urandom(8).hex()
        self.facts = ctx.facts()
        self.limits = limits
        self.on_event = on_event
        self.args = args
        self.total = total
        self.succeeded = self.failed = self.cancelled = 0
        self.answer_bytes = 0  # what the outputs kept so far weigh (bounded by limits.max_answer_bytes)
        self.call_limiter: trio.CapacityLimiter | None = None
        self.proc_limiter: trio.CapacityLimiter | None = None

    # --- the whole run ---

    async def main(self, plan: PipelinePlan, started: float) -> dict[str, Any]:
        env: dict[str, Any] = {"vars": {}, "steps": {}, "last": None, "args": self.args, "context": self.facts}
        try:
            env["vars"] = plan.vars.resolve(env)
        except InterpolationError as e:
            return self.answer(False, str(e), "INTERPOLATION_FAILED", None, env, started)
        except OutputTooLargeError as e:
            return self.answer(False, str(e), _TOO_LARGE, None, env, started)
        deadline = _min_ms(plan.timeout_ms, self.limits.timeout_ms)
        if deadline is None:
            ok, error, code, result = await self.pipeline(plan, env, False, "")
        else:
            with trio.move_on_after(deadline / 1000) as scope:
                ok, error, code, result = await self.pipeline(plan, env, False, "")
            if scope.cancelled_caught:
                return self.answer(False, f"the pipeline {_timed_out(deadline)}", "TIMEOUT", None, env, started)
        return self.answer(ok, error, code, result, env, started)

    def answer(
        self, ok: bool, error: str, code: str | None, result: Any, env: dict[str, Any], started: float
    ) -> dict[str, Any]:
        done = self.succeeded + self.failed + self.cancelled
        return {
            "ok": ok,
            "error": error,
            "error_code": code,
            "result": result,
            "steps": env["steps"],
            "summary": {
                "total": self.total,
                "succeeded": self.succeeded,
                "failed": self.failed,
                "skipped": self.total - done,
                "cancelled": self.cancelled,
            },
            "duration_ms": _ms_since(started),
        }

    # --- lists ---

    async def pipeline(
        self, plan: PipelinePlan, env: dict[str, Any], parallel: bool, prefix: str
    ) -> tuple[bool, str, str | None, Any]:
        """Run a list, then resolve its return. Answers (ok, error, error_code, result)."""
        results = env["steps"]
        failure = None
        keep_going = plan.continue_on_error
        for step in plan.steps:
            if isinstance(step, ToolStep):
                r = await (
                    self.tool(step, env, results, prefix) if parallel else self._tool(step, env, results, prefix)
                )
            elif isinstance(step, ParallelStep):
                r = await self.group(step, env, results, prefix, not keep_going)
            elif isinstance(step, PipeStep):
                r = await self.pipe(step, env, results, parallel, prefix)
            else:
                r = await self.declared(step, env, results, parallel, prefix, not keep_going)
            env["last"] = r
            if not r["ok"] and failure is None:
                failure = r
                if not keep_going:
                    return False, f"step '{r['id']}' failed: {r['error']}", r["error_code"], None
        # Every step ran (possibly with failures, under continue_on_error): the return is resolved.
        try:
            if plan.ret is None:
                last = env["last"]
                result = last["output"] if last is not None else None
            else:
                result = plan.ret.resolve(env)
                too_large = self.weigh(result, f"{plan.location}.return" if plan.location else "return", "the result")
                if too_large is not None:
                    return False, str(too_large), _TOO_LARGE, None
        except InterpolationError as e:
            if failure is None:
                return False, str(e), "INTERPOLATION_FAILED", None
            result = None
        except OutputTooLargeError as e:
            return False, str(e), _TOO_LARGE, None
        if failure is not None:
            return False, f"step '{failure['id']}' failed: {failure['error']}", failure["error_code"], result
        return True, "", None, result

    # --- steps ---

    async def tool(self, step: ToolStep, env: dict[str, Any], results: dict[str, Any], prefix: str) -> dict[str, Any]:
        """A tool step under a parallel group: it runs holding a slot of both limiters."""
        return await self.slotted(self._tool, step, env, results, prefix)

    async def slotted(
        self,
        run: Callable[..., Awaitable[dict[str, Any]]],
        step: Any,
        env: dict[str, Any],
        results: dict[str, Any],
        prefix: str,
    ) -> dict[str, Any]:
        """Run a leaf of a parallel group holding a slot of the call's limiter, then of the process's."""
        if self.call_limiter is None:
            self.call_limiter = trio.CapacityLimiter(self.limits.max_concurrency)
            self.proc_limiter = process_limiter()
        call_limiter, proc_limiter = self.call_limiter, self.proc_limiter
        # Waiting for a slot is not running: a step cancelled while it waits never started. A free slot
        # is taken without yielding (`acquire` always yields, twice per child adds up).
        await _take(call_limiter)
        try:
            await _take(proc_limiter)  # type: ignore[arg-type]
            try:
                # A slot handed over by a sibling that has just failed comes with the group already
                # cancelled: give up here, before the step counts as started.
                await trio.lowlevel.checkpoint_if_cancelled()
                return await run(step, env, results, prefix)
            finally:
                proc_limiter.release()  # type: ignore[union-attr]
        finally:
            call_limiter.release()

    async def _tool(self, step: ToolStep, env: dict[str, Any], results: dict[str, Any], prefix: str) -> dict[str, Any]:
        t0 = perf_counter()
        path = prefix + step.id
        if self.memo is not None and (done := self.memo.get(path)) is not None:
            return self.recall(step, done, results)
        if self.on_event is not None:
            self.started(step, "tool", path)
        r = None
        try:
            try:
                args = step.args.resolve(env)
            except InterpolationError as e:
                r = _leaf(step.id, False, str(e), "INTERPOLATION_FAILED", None, "", [], t0)
                _log.info("step %s: %s", path, e.with_step(path), extra={"interpolation": e.to_dict()})
            except OutputTooLargeError as e:
                r = _leaf(step.id, False, str(e), _TOO_LARGE, None, "", [], t0)
            else:
                ctx = self.ctx.for_step(self.pid, path)
                if step.timeout_ms is None:
                    r = _from_tool(step.id, await self.call(step.tool, args, ctx), t0)
                else:
                    with trio.move_on_after(step.timeout_ms / 1000) as scope:
                        r = _from_tool(step.id, await self.call(step.tool, args, ctx), t0)
                    if scope.cancelled_caught:
                        r = _leaf(step.id, False, _timed_out(step.timeout_ms), "TIMEOUT", None, "", [], t0)
        except Exception as e:
            code = "UNKNOWN_TOOL" if isinstance(e, UnknownToolError) else "TOOL_FAILED"
            if isinstance(e, MCPipeError):  # a failure mcpipe describes (a server down, its error): no traceback
                _log.info("step %s (%s): tool '%s' failed: %s", path, step.location, step.tool, e)
            else:
                _log.exception("step %s (%s): tool '%s' raised", path, step.location, step.tool)
            message = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            r = _leaf(step.id, False, message, code, None, "", [], t0)
        finally:
            if r is None:  # cancelled from outside: record it, and let the cancellation go on
                r = _leaf(step.id, False, "cancelled", _CANCELLED, None, "", [], t0)
            self.settle(step, r, path, results)
        return r

    def recall(self, step: Any, done: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
        """A leaf step that finished in an earlier round of this call: its recorded result, not run again."""
        results[step.id] = done
        if done.get("skipped"):
            pass
        elif done["error_code"] is None:
            self.succeeded += 1
        else:
            self.failed += 1
        return done

    async def group(
        self, step: Any, env: dict[str, Any], results: dict[str, Any], prefix: str, stop: bool
    ) -> dict[str, Any]:
        t0 = perf_counter()
        path = prefix + step.id
        if self.on_event is not None:
            self.started(step, "parallel", path)
        children: dict[str, Any] = {}
        first: list[dict[str, Any]] = []
        r = None
        try:
            if step.timeout_ms is None:
                await self.children(step, env, children, path + ".", stop, first)
            else:
                with trio.move_on_after(step.timeout_ms / 1000) as scope:
                    await self.children(step, env, children, path + ".", stop, first)
                if scope.cancelled_caught:
                    r = _group(step, children, False, _timed_out(step.timeout_ms), "TIMEOUT", t0)
            if r is None:
                if first:
                    f = first[0]
                    r = _group(step, children, False, f"step '{f['id']}' failed: {f['error']}", f["error_code"], t0)
                else:
                    r = _group(step, children, True, "", None, t0)
        finally:
            if r is None:
                r = _group(step, children, False, "cancelled", _CANCELLED, t0)
            results[step.id] = r
            if self.on_event is not None:
                self.finished(step, r, path)
        return r

    async def children(
        self,
        step: ParallelStep,
        env: dict[str, Any],
        children: dict[str, Any],
        prefix: str,
        stop: bool,
        first: list[dict[str, Any]],
    ) -> None:
        held: list[BaseException] = []
        async with trio.open_nursery() as nursery:
            for child in step.children:
                nursery.start_soon(self.child, child, env, children, prefix, stop, first, nursery.cancel_scope, held)
        # A child that suspended to ask the client let its siblings finish (or ask too): the call resumes
        # later without running them again. A failure that stopped the group wins over the suspension.
        if held and not (stop and first):
            raise held[0]

    async def child(
        self,
        step: Any,
        env: dict[str, Any],
        children: dict[str, Any],
        prefix: str,
        stop: bool,
        first: list[dict[str, Any]],
        siblings: trio.CancelScope,
        held: list[BaseException],
    ) -> None:
        try:
            if isinstance(step, ToolStep):
                r = await self.tool(step, env, children, prefix)
            elif isinstance(step, ParallelStep):
                r = await self.group(step, env, children, prefix, stop)
            elif isinstance(step, PipeStep):
                r = await self.pipe(step, env, children, True, prefix)
            else:
                r = await self.declared(step, env, children, True, prefix, stop)
        except BaseException as e:
            if self.memo is None or not _suspends(e):
                raise
            held.append(e)
            return
        if not r["ok"] and not first:
            first.append(r)
            if stop:
                siblings.cancel()

    async def pipe(
        self, step: Any, env: dict[str, Any], results: dict[str, Any], parallel: bool, prefix: str
    ) -> dict[str, Any]:
        t0 = perf_counter()
        path = prefix + step.id
        if self.on_event is not None:
            self.started(step, "pipe", path)
        plan = step.pipe
        # `args` comes from the enclosing environment: a declared step's `input_transform` may replace it.
        inner: dict[str, Any] = {"vars": None, "steps": {}, "last": None, "args": env["args"], "context": self.facts}
        r = None
        try:
            try:
                inner["vars"] = plan.vars.resolve(env)
            except InterpolationError as e:
                r = _pipe(step.id, False, str(e), "INTERPOLATION_FAILED", None, inner["steps"], t0)
            except OutputTooLargeError as e:
                r = _pipe(step.id, False, str(e), _TOO_LARGE, None, inner["steps"], t0)
            else:
                deadline = _min_ms(step.timeout_ms, plan.timeout_ms)
                if deadline is None:
                    ok, error, code, result = await self.pipeline(plan, inner, parallel, path + ".")
                    r = _pipe(step.id, ok, error, code, result, inner["steps"], t0)
                else:
                    with trio.move_on_after(deadline / 1000) as scope:
                        ok, error, code, result = await self.pipeline(plan, inner, parallel, path + ".")
                        r = _pipe(step.id, ok, error, code, result, inner["steps"], t0)
                    if scope.cancelled_caught:
                        r = _pipe(step.id, False, _timed_out(deadline), "TIMEOUT", None, inner["steps"], t0)
        finally:
            if r is None:
                r = _pipe(step.id, False, "cancelled", _CANCELLED, None, inner["steps"], t0)
            results[step.id] = r
            if self.on_event is not None:
                self.finished(step, r, path)
        return r

    # --- declared steps (mcpipe.declared) ---

    async def declared(
        self, step: Any, env: dict[str, Any], results: dict[str, Any], parallel: bool, prefix: str, stop: bool
    ) -> dict[str, Any]:
        """A declared step: a leaf (``DeclaredStep``) or a container (``DeclaredParallel``/``DeclaredPipe``)."""
        kind = step.kind
        if kind == "parallel" or kind == "pipe":
            return await self.container(step, env, results, parallel, prefix, stop)
        if parallel:
            return await self.slotted(self.leaf, step, env, results, prefix)
        return await self.leaf(step, env, results, prefix)

    async def leaf(self, step: Any, env: dict[str, Any], results: dict[str, Any], prefix: str) -> dict[str, Any]:
        t0 = perf_counter()
        path = prefix + step.id
        if self.memo is not None and (done := self.memo.get(path)) is not None:
            return self.recall(step, done, results)
        if self.on_event is not None:
            self.started(step, step.kind, path)
        r = None
        try:
            # `execute` answers every failure of the step as an output; only a cancellation goes through.
            out = await step.execute(env, self.ctx.for_step(self.pid, path), tools=self.registry)
            r = out.result(step.id, step.kind, _ms_since(t0))
        finally:
            if r is None:
                r = _declared_leaf(step, False, "cancelled", _CANCELLED, t0)
            self.settle(step, r, path, results)
        return r

    def settle(self, step: Any, r: dict[str, Any], path: str, results: dict[str, Any]) -> None:
        """Record a leaf's result: in its list's results, the summary counts, the memo and the events."""
        if r["structured"] is not None or r["content"]:
            too_large = self.weigh((r["structured"], r["content"]), step.location, f"the output of step '{step.id}'")
            if too_large is not None:
                # Dropped, not kept: the step fails, located, and the answer stays small.
                r.update(ok=False, error=str(too_large), error_code=_TOO_LARGE, structured=None, text="", content=[])
                r["output"] = None
        results[step.id] = r
        code = r["error_code"]
        if r.get("skipped"):
            pass  # counted as skipped: total - (succeeded + failed + cancelled)
        elif code is None:
            self.succeeded += 1
        elif code == _CANCELLED:
            self.cancelled += 1
        else:
            self.failed += 1
        if self.memo is not None and code != _CANCELLED:
            self.memo.put(path, r)
        if self.on_event is not None:
            self.finished(step, r, path)

    def weigh(self, value: Any, location: str, what: str) -> OutputTooLargeError | None:
        """Count ``value`` towards the answer; the error when it passes ``max_output_bytes``, the room left
        under ``max_answer_bytes`` or ``max_json_depth`` (measured no further than the limits)."""
        limits = self.limits
        room = limits.max_answer_bytes - self.answer_bytes
        cap = limits.max_output_bytes if limits.max_output_bytes < room else room
        # +2: the pair (structured, content) and a content block nest two levels themselves.
        size, depth = json_measure(value, max_bytes=cap, max_depth=limits.max_json_depth + 2)
        if size <= cap and depth <= limits.max_json_depth + 2:
            self.answer_bytes += size
            return None
        if depth > limits.max_json_depth + 2:
            return OutputTooLargeError(
                size, cap, location, what, f"nests more than {limits.max_json_depth} levels deep"
            )
        if cap == limits.max_output_bytes:
            return OutputTooLargeError(size, cap, location, what)
        why = (
            f"would take the answer past its limit of {limits.max_answer_bytes} bytes "
            f"({self.answer_bytes} bytes kept before it)"
        )
        return OutputTooLargeError(size, limits.max_answer_bytes, location, what, why)

    async def container(
        self, step: Any, env: dict[str, Any], results: dict[str, Any], parallel: bool, prefix: str, stop: bool
    ) -> dict[str, Any]:
        """``when`` and ``input_transform`` first, then the group or nested pipe as for ``mcp_pipe``."""
        t0 = perf_counter()
        prelude, skip, expression_error = _declared_api()
        try:
            inner = await prelude(step, env)
        except expression_error as e:
            r = _declared_leaf(step, False, f"{step.location}: {e}" if e.timeout else str(e), e.code, t0)
            results[step.id] = r
            return r
        if inner is skip:
            r = _declared_leaf(step, True, "", None, t0)
            r["skipped"] = True
            results[step.id] = r
            return r
        if step.kind == "parallel":
            r = await self.group(step, inner, results, prefix, stop)
        else:
            r = await self.pipe(step, inner, results, parallel, prefix)
        r["skipped"] = False
        return r

    # --- events ---

    def started(self, step: Any, kind: str, path: str) -> None:
        self.emit(
            {
                "type": "step_started",
                "id": step.id,
                "path": path,
                "location": step.location,
                "kind": kind,
                "completed": self.succeeded + self.failed + self.cancelled,
                "total": self.total,
            }
        )

    def finished(self, step: Any, r: dict[str, Any], path: str) -> None:
        self.emit(
            {
                "type": "step_finished",
                "id": step.id,
                "path": path,
                "location": step.location,
                "kind": r["kind"],
                "ok": r["ok"],
                "error": r["error"],
                "error_code": r["error_code"],
                "duration_ms": r["duration_ms"],
                "completed": self.succeeded + self.failed + self.cancelled,
                "total": self.total,
            }
        )

    def emit(self, event: dict[str, Any]) -> None:
        try:
            self.on_event(event)  # type: ignore[misc]
        except Exception:
            _log.exception("on_event callback failed on %s", event["type"])
