"""The Trio scheduler: run a compiled pipeline as contract sections 6-8 say.

Shape of a run. The calling task is the run's supervisor: it owns the pipeline's deadline (one cancel
scope) and runs the steps of a list one after another. A parallel group opens a nursery and runs each
child as its own task; a nested pipe runs its list inside the task of its step. Every task is a child of
the supervisor's scope, so cancelling the caller, or the pipeline's deadline passing, reaches every step
and every tool call in flight, and no task outlives its pipeline.

A run whose steps are all leaves and that has no deadline opens no scope: the one thing the run's scope does
without a deadline, stopping the steps once the answer is full, a cancelled scope around what is left then does
the same (``_Run.pipeline``).

Sequential steps get no task, nursery or cancel scope of their own unless they have a ``timeout_ms``:
those are what per-step overhead is made of, and trio gives sequential code structured concurrency for
free. A step records its result on the way out even when it is cancelled (``CANCELLED``), then lets the
cancellation go on.

Tool calls made under a parallel group hold a slot of the call's ``CapacityLimiter`` (``max_concurrency``)
and then one of the process-wide limiter. The slots are held by tool calls only, never by a group or a
pipe waiting for its children, so nested groups cannot deadlock on the limit. A run started inside a step
that holds a process slot (a sub-playbook, a pipeline served as a tool and called by a step) lends that slot
back while it runs, and the step takes one again after: a step waiting for its sub-run holds none, so
sub-runs cannot starve each other of slots (issue 27: 70 calls of a 3-level playbook chain held all 64 at
their first level, each waiting for one for its second).
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping
from time import perf_counter
from typing import Any, Protocol, TypeAlias, assert_never

import trio

from mcpipe import _runscope
from mcpipe._core import json_measure
from mcpipe._describe import json_type
from mcpipe._template import Template
from mcpipe._util import RunLimiter, glob_matcher, is_suspension
from mcpipe.compile import compile_spec_async
from mcpipe.errors import (
    ErrorCode,
    ExpressionError,
    InterpolationError,
    MCPipeError,
    OutputTooLargeError,
    Problem,
    SpecError,
    TemplateSyntaxError,
)
from mcpipe.plan import (
    DEFAULT_LIMITS,
    SKIP,
    Arc,
    CompiledSpec,
    ForEach,
    Graph,
    Leaf,
    Limits,
    Node,
    Parallel,
    Pipe,
    Pipeline,
    Step,
    evaluate,
    explain,
    measure_output,
    prelude,
    problem_order,
    referenced_step,
    walk,
)
from mcpipe.results import (
    AnswerMode,
    StepOutput,
    each_result,
    graph_result,
    group_result,
    invalid_answer,
    leaf_result,
    ms_since,
    pipe_result,
    preview,
    shape_answer,
    tool_result,
)
from mcpipe.tools import ToolCaller, ToolContext, ToolResult, UnknownToolError

__all__ = [
    "PROCESS_CONCURRENCY",
    "EventFn",
    "check_pipeline",
    "inline_tool_calls",
    "process_limiter",
    "run_compiled",
    "run_pipeline",
]

EventFn = Callable[[dict[str, Any]], None]

PROCESS_CONCURRENCY = 64
"""Default size of the process-wide limiter on parallel tool calls (all calls of all pipelines)."""

_log = logging.getLogger("mcpipe.runtime")

Container: TypeAlias = Parallel | Pipe | ForEach | Graph
"""A step that holds other steps (every node but a leaf)."""
_process_limiter = RunLimiter("mcpipe_process_limiter", PROCESS_CONCURRENCY)

_CANCELLED = ErrorCode.CANCELLED
_TOO_LARGE = ErrorCode.OUTPUT_TOO_LARGE
# What an answer weighs as sent before any step's result: its own fields (summary, counts, duration) twice
# over, and the tool result and JSON-RPC response around it; a generous bound.
_ANSWER_FRAME = 1024
# Kept under max_answer_bytes (at most a quarter of it) for the records a full answer still makes.
_RECORDS_ROOM = 64 * 1024
# A result weighing at most max_output_bytes / this as sent is checked and charged in one walk (`_Run.bound`).
_ONE_WALK_MARGIN = 10


class _Slot:
    """A process slot held by one step (on the step's behalf, not its task's: any task may lend it).

    ``lent`` counts the runs nested in the step that run now; while it is not zero the slot is back in the
    limiter."""

    __slots__ = ("held", "lent", "limiter")

    def __init__(self, limiter: trio.CapacityLimiter) -> None:
        self.limiter = limiter
        self.held = False
        self.lent = 0

    async def take(self) -> None:
        try:
            self.limiter.acquire_on_behalf_of_nowait(self)
        except trio.WouldBlock:
            await self.limiter.acquire_on_behalf_of(self)
        self.held = True
        if self.lent:  # a nested run started while this waited: it runs without the slot
            self.drop()

    def drop(self) -> None:
        if self.held:
            self.held = False
            self.limiter.release_on_behalf_of(self)

    def lend(self) -> None:
        self.lent += 1
        self.drop()

    async def take_back(self) -> None:
        self.lent -= 1
        if not self.lent and not self.held:
            await self.take()


_HELD: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar("mcpipe_held_slot", default=None)
"""The process slot of the step running in this context (see the module's docstring)."""


def process_limiter() -> trio.CapacityLimiter:
    """The limiter every parallel tool call of this Trio run passes through, beneath its call's own.

    Made on first use with :data:`PROCESS_CONCURRENCY` slots; a server sets ``total_tokens`` on it from
    its configuration.
    """
    return _process_limiter()


class Registry(ToolCaller, Protocol):
    """What a pipeline calls its tools through (the server's gateway, a :class:`~mcpipe.tools.ToolRegistry`):
    ``name in registry``, ``registry.allows(name, ctx)`` and ``await registry.call(name, args, ctx)``."""

    def allows(self, name: str, ctx: ToolContext) -> bool: ...


async def run_pipeline(
    spec: object,
    registry: Registry,
    *,
    context: ToolContext | None = None,
    limits: Limits | None = None,
    on_event: EventFn | None = None,
    args: Mapping[str, object] | None = None,
    answer: AnswerMode = "full",
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
        answer: what the answer holds when the spec does not say (its ``answer``): ``full`` records (the
            default here), a summary per step (``steps``, what the server answers a model by default), or the
            ``result`` alone (:func:`mcpipe.results.shape_answer`).

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
        compiled = await compile_spec_async(spec, tools=registry, limits=limits)
    except SpecError as e:
        return invalid_answer(e.problems, started)
    except TemplateSyntaxError as e:  # the compiler reports these as problems; kept as a safety net
        return invalid_answer([Problem(e.location, e.code, e.reason)], started)
    return await _run_compiled(compiled, registry, ctx, limits, on_event, args, started, answer)


async def check_pipeline(
    spec: object,
    registry: Registry,
    *,
    context: ToolContext | None = None,
    limits: Limits | None = None,
) -> CompiledSpec:
    """Every check :func:`run_pipeline` makes before a step runs, and nothing run: what ``mcpipe check``
    and a background submission answer, so a spec they call ok is one a run does not refuse.

    Args:
        spec, registry, context, limits: as for :func:`run_pipeline` (``registry.get(name)`` gives a tool's
            input schema and annotations, ``registry.allows(name, ctx)`` the caller's rights).

    Returns:
        The compiled spec.

    Raises:
        SpecError: every problem, located: the spec's own (shape, references, limits), unknown tools and
            arguments their schemas refuse, tools the caller may not call, and retries of tools not marked
            idempotent.
    """
    limits = limits or DEFAULT_LIMITS
    try:
        compiled = await compile_spec_async(spec, tools=registry, limits=limits)
    except TemplateSyntaxError as e:  # as run_pipeline: the compiler reports these as problems
        raise SpecError([Problem(e.location, e.code, e.reason)]) from None
    problems = _preflight(compiled, registry, context if context is not None else ToolContext(), limits)
    if problems:
        raise SpecError(problems)
    return compiled


def _preflight(compiled: CompiledSpec, registry: Any, ctx: ToolContext, limits: Limits) -> list[Problem]:
    """The problems of a compiled plan with the tools it will call, in location order: a tool the caller may
    not call, a retry of a tool not marked idempotent. A run answers them before any step runs."""
    allowed: dict[str, str | None] = {}
    denied = []
    denial = getattr(registry, "denial", None)  # the gateway's names the scopes a token lacks
    for location, name in compiled.tool_sites:
        if name not in allowed:
            if denial is not None:
                allowed[name] = denial(name, ctx)
            else:
                allowed[name] = None if registry.allows(name, ctx) else f"tool '{name}' is not allowed for this caller"
        why = allowed[name]
        if why is not None:
            denied.append(Problem(f"{location}.tool", ErrorCode.FORBIDDEN, why))
    for location, name in compiled.retry_sites:
        if not _idempotent(registry, name, limits):
            denied.append(
                Problem(
                    f"{location}.retry",
                    ErrorCode.INVALID_SPEC,
                    f"tool '{name}' is not marked idempotent, so it cannot be retried (its annotations say "
                    "idempotentHint, or the operator lists it in pipe.idempotent_tools)",
                )
            )
    return sorted(denied, key=problem_order)


@functools.cache
def _tool_step() -> Callable[[Leaf[Any, Any], Mapping[str, Any], ToolContext], Awaitable[ToolResult | StepOutput]]:
    """The ``tool`` kind's direct path (``mcpipe.kinds.tool.tool_step``), imported once a run meets one."""
    from mcpipe.kinds.tool import tool_step

    return tool_step


def inline_tool_calls(compiled: CompiledSpec) -> tuple[str, ...] | None:
    """The tools a run of ``compiled`` calls, when calling them is all it does: one list of tool steps (bare
    tool calls, or the ``tool`` kind), none with a ``when``, an ``input_transform``, a ``retry`` or a
    deadline of its own. Else None. Known once, when the plan is compiled (``CompiledSpec.calls``).

    Such a run yields only where its tools yield (its one checkpoint is a cancellation point, not a schedule
    point): when none of them does, the server runs a call of it inline, as it runs a synchronous Python tool
    (``mcpipe.server._fast``).
    """
    return compiled.calls


async def run_compiled(
    compiled: CompiledSpec,
    registry: object,
    *,
    context: ToolContext | None = None,
    limits: Limits | None = None,
    on_event: EventFn | None = None,
    args: Mapping[str, object] | None = None,
    answer: AnswerMode = "full",
) -> dict[str, Any]:
    """Run an already compiled pipeline; answer as :func:`run_pipeline` does.

    This is how declared pipelines run: their plan is compiled once, at load (:mod:`mcpipe.declared`), into
    the same plan ``mcp_pipe`` specs compile to, and runs with the same semantics. A step whose ``when`` is
    false is skipped: its result has ``skipped: true`` and it counts as skipped in the summary.

    Args:
        compiled: the plan, its tool sites (checked with ``registry.allows`` before any step runs) and its
            leaf count (the summary's ``total``).
        registry, context, limits, on_event, args, answer: as for :func:`run_pipeline`; ``limits.timeout_ms``
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
        answer,
    )


async def _run_compiled(
    compiled: CompiledSpec,
    registry: object,
    ctx: ToolContext,
    limits: Limits,
    on_event: EventFn | None,
    args: Mapping[str, object] | None,
    started: float,
    answer_mode: AnswerMode = "full",
) -> dict[str, Any]:
    denied = _preflight(compiled, registry, ctx, limits)
    if denied:
        return invalid_answer(denied, started)
    if compiled.calls is None:
        # One checkpoint per run, so a run of steps that never yield still honours trio's checkpoint rule.
        await trio.lowlevel.checkpoint()
    else:
        # A run of tool calls only, which yields where its tools yield, as a synchronous tool does when they
        # do not: a caller cancelled before it starts is cancelled, without a pass of the event loop.
        await trio.lowlevel.checkpoint_if_cancelled()
    if compiled.dry_run:
        return _dry_run(compiled, ctx, limits, {} if args is None else args, started)
    run = _Run(registry, ctx, limits, on_event, {} if args is None else args, compiled.leaf_count)
    held = _HELD.get()
    scope = _runscope.enter()  # what the run's steps keep for each other, released when it ends (however)
    try:
        if held is None:
            answer = await run.main(compiled.plan, started, compiled.leaves_only)
        else:
            # A run inside a step holding a process slot: the slot goes back while this run's own steps take theirs.
            token = _HELD.set(None)
            held.lend()
            try:
                answer = await run.main(compiled.plan, started, compiled.leaves_only)
            finally:
                _HELD.reset(token)
                await held.take_back()
    finally:
        _runscope.leave(scope)
    # Telemetry is installed through its module, so a process that never imported it (a command's run) has none:
    # the scheduler does not import it (OpenTelemetry's API) to learn so.
    module = sys.modules.get("mcpipe.telemetry")
    tel = None if module is None else module.current()
    if tel is not None:
        tel.observe_steps(answer)
    # The run keeps (and `max_answer_bytes` bounds) every full record whatever the caller asked for: the answer
    # is sized for the model that reads it only now.
    return shape_answer(answer, compiled.answer or answer_mode)


async def _take(limiter: trio.CapacityLimiter) -> None:
    try:
        limiter.acquire_nowait()
    except trio.WouldBlock:
        await limiter.acquire()


def _min_ms(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None or a <= b else b


def _timed_out(ms: float) -> str:
    return f"timed out after {ms:g} ms"


class _Run:
    """The state of one run: the tools, the counts, the limiters."""

    __slots__ = (
        "answer_bytes",
        "args",
        "call",
        "call_limiter",
        "cancelled",
        "ctx",
        "durable",
        "facts",
        "failed",
        "full",
        "limits",
        "memo",
        "on_event",
        "pid",
        "proc_limiter",
        "registry",
        "retries",
        "scope",
        "scoped",
        "succeeded",
        "total",
    )

    def __init__(
        self,
        registry: Any,
        ctx: ToolContext,
        limits: Limits,
        on_event: EventFn | None,
        args: Mapping[str, object],
        total: int,
    ) -> None:
        self.call = registry.call
        self.registry = registry
        # A call that can suspend to ask its client (2026-07-28, see mcpipe.interaction) records every finished
        # leaf step, and a resumed call answers those from the record instead of running them again.
        memo = ctx.interaction
        if memo is not None and not memo.resumable:
            memo = None
        if memo is not None and ctx.step:
            ctx = memo.nested(ctx)  # a pipeline run by a step: its steps are recorded under that step
            memo = ctx.interaction
        self.memo = memo
        # A queued run's record is saved before each leaf step starts: a worker that dies mid-run leaves
        # every finished step recorded, and the worker that takes the run over does not run them again.
        self.durable = memo is not None and memo.durable
        self.ctx = ctx
        self.pid = ctx.pipeline or os.urandom(8).hex()
        self.facts = ctx.facts()
        self.limits = limits
        self.on_event = on_event
        self.args = args
        self.total = total
        # Tool calls made again after a retryable failure: they count towards limits.max_calls with the
        # leaf executions (issue 20: 10 attempts in a for_each of 10 x 100 made 7096 calls under 1000).
        self.retries = 0
        self.succeeded = self.failed = self.cancelled = 0
        # What the answer holds so far as it will be sent (both representations, see `keep`), starting with
        # its own fields and the tool result around it; bounded by limits.max_answer_bytes.
        self.answer_bytes = _ANSWER_FRAME
        self.full: OutputTooLargeError | None = None  # the step that found the answer full
        self.scope: trio.CancelScope | None = None
        self.scoped = False  # the run's steps run under a scope the run cancels when its answer is full
        self.call_limiter: trio.CapacityLimiter | None = None
        self.proc_limiter: trio.CapacityLimiter | None = None

    # --- the whole run ---

    async def main(self, plan: Pipeline, started: float, leaves_only: bool) -> dict[str, Any]:
        env: dict[str, Any] = {"vars": {}, "steps": {}, "last": None, "args": self.args, "context": self.facts}
        try:
            env["vars"] = plan.vars.resolve(env)
        except InterpolationError as e:
            return self.answer(False, str(e), ErrorCode.INTERPOLATION_FAILED, None, env, started)
        except OutputTooLargeError as e:
            return self.answer(False, str(e), _TOO_LARGE, None, env, started)
        deadline = _min_ms(plan.timeout_ms, self.limits.timeout_ms)
        ok, error, code, result = False, "", None, None
        if deadline is None and leaves_only:
            # No scope of its own (opening one costs about what a step's record does): its one use, stopping the
            # steps once the answer is full, is made by a cancelled scope around what is left then (`pipeline`).
            ok, error, code, result = await self.pipeline(plan, env, False, "")
        else:
            self.scoped = True
            with trio.CancelScope() as self.scope:
                if deadline is None:
                    ok, error, code, result = await self.pipeline(plan, env, False, "")
                else:
                    with trio.move_on_after(deadline / 1000) as scope:
                        ok, error, code, result = await self.pipeline(plan, env, False, "")
                    if scope.cancelled_caught and self.full is None:
                        return self.answer(
                            False, f"the pipeline {_timed_out(deadline)}", ErrorCode.TIMEOUT, None, env, started
                        )
        if self.full is not None:
            return self.answer(False, str(self.full), _TOO_LARGE, None, env, started)
        where = "return" if plan.ret is not None else "result"
        too_large = self.charge((error, result), where, "the result")
        if too_large is not None:
            return self.answer(False, str(too_large), _TOO_LARGE, None, env, started)
        return self.answer(ok, error, code, result, env, started)

    def answer(
        self, ok: bool, error: str, code: str | None, result: object, env: dict[str, Any], started: float
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
            "duration_ms": ms_since(started),
        }

    # --- lists ---

    async def pipeline(
        self,
        plan: Pipeline,
        env: dict[str, Any],
        parallel: bool,
        prefix: str,
        start: int = 0,
        failure: dict[str, Any] | None = None,
    ) -> tuple[bool, str, str | None, Any]:
        """Run a list (from its step ``start``, after ``failure``), then resolve its return. Answers (ok, error,
        error_code, result)."""
        results = env["steps"]
        keep_going = plan.continue_on_error
        steps = plan.steps
        for i in range(start, len(steps)):
            if self.full is not None and not self.scoped:
                # A run without a scope of its own whose answer is full: what is left runs under a cancelled
                # scope, as it would have under the run's (a step that yields is cancelled and ends the run).
                with trio.CancelScope() as self.scope:
                    self.scoped = True
                    self.scope.cancel()
                    return await self.pipeline(plan, env, parallel, prefix, i, failure)
                return False, "", None, None  # cancelled: the run answers that its answer is full
            step = steps[i]
            go_on = keep_going if step.continue_on_error is None else step.continue_on_error
            if type(step) is Leaf and step.when is None:  # the fast paths of `node`: a bare tool call, a leaf
                if step.run is None:
                    r = await (
                        self.tool(step, env, results, prefix) if parallel else self._tool(step, env, results, prefix)
                    )
                elif parallel:
                    r = await self.slotted(self.leaf, step, env, results, prefix)
                else:
                    r = await self.leaf(step, env, results, prefix)
            else:
                r = await self.node(step, env, results, parallel, prefix, not go_on)
                if step.when is not None and not step.skippable and r.get("skipped"):
                    continue  # a skipped step is not `last`: it did not run
            env["last"] = r
            if not r["ok"]:
                if failure is None:
                    failure = r
                # Every failure is weighed by its own step's policy, not only the first one: a failure the
                # pipeline may not go on after stops it, even after earlier tolerated failures.
                if not go_on:
                    return False, f"step '{failure['id']}' failed: {failure['error']}", failure["error_code"], None
        # Every step ran (possibly with failures, under continue_on_error): the return is resolved.
        try:
            if plan.ret is None:
                last = env["last"]
                result = last["output"] if last is not None else None
            else:
                result = plan.ret.resolve(env)
                where = f"{plan.location}.return" if plan.location else "return"
                too_large = self.check_output(result, where, "the result", 0)
                if too_large is not None:
                    return False, str(too_large), _TOO_LARGE, None
        except InterpolationError as e:
            if failure is None:
                return False, str(e), ErrorCode.INTERPOLATION_FAILED, None
            result = None
        except OutputTooLargeError as e:
            return False, str(e), _TOO_LARGE, None
        if failure is not None:
            return False, f"step '{failure['id']}' failed: {failure['error']}", failure["error_code"], result
        return True, "", None, result

    # --- steps ---

    async def node(
        self, step: Node, env: dict[str, Any], results: dict[str, Any], parallel: bool, prefix: str, stop: bool
    ) -> dict[str, Any]:
        """Any step: a bare tool call, a kind's leaf, a parallel group, a nested pipe, a for_each."""
        if step.when is not None and not step.skippable:
            return await self.gated(step, env, results, parallel, prefix, stop)
        return await self.dispatch(step, env, results, parallel, prefix, stop)

    async def dispatch(
        self, step: Node, env: dict[str, Any], results: dict[str, Any], parallel: bool, prefix: str, stop: bool
    ) -> dict[str, Any]:
        match step:
            case Leaf(run=None):  # a bare tool call: the scheduler calls the tool itself
                if parallel:
                    return await self.tool(step, env, results, prefix)
                return await self._tool(step, env, results, prefix)
            case Leaf():
                if parallel:
                    return await self.slotted(self.leaf, step, env, results, prefix)
                return await self.leaf(step, env, results, prefix)
            case _ if step.skippable:
                return await self.container(step, env, results, parallel, prefix, stop)
            case ForEach():
                return await self.each(step, env, results, prefix, stop)
            case Graph():
                return await self.graph(step, env, results, prefix, stop)
            case Parallel():
                return await self.group(step, env, results, prefix, stop)
            case Pipe():
                return await self.pipe(step, env, results, parallel, prefix)
            case _:
                assert_never(step)

    async def tool(
        self, step: Leaf[Any, Any], env: dict[str, Any], results: dict[str, Any], prefix: str
    ) -> dict[str, Any]:
        """A tool step under a parallel group: it runs holding a slot of both limiters."""
        return await self.slotted(self._tool, step, env, results, prefix)

    async def slotted(
        self,
        run: Callable[[Leaf[Any, Any], dict[str, Any], dict[str, Any], str], Awaitable[dict[str, Any]]],
        step: Leaf[Any, Any],
        env: dict[str, Any],
        results: dict[str, Any],
        prefix: str,
    ) -> dict[str, Any]:
        """Run a leaf of a parallel group holding a slot of the call's limiter, then of the process's."""
        if self.call_limiter is None:
            self.call_limiter = trio.CapacityLimiter(self.limits.max_concurrency)
            self.proc_limiter = process_limiter()
        call_limiter, proc_limiter = self.call_limiter, self.proc_limiter
        assert proc_limiter is not None
        # Waiting for a slot is not running: a step cancelled while it waits never started. A free slot
        # is taken without yielding (`acquire` always yields, twice per child adds up).
        await _take(call_limiter)
        try:
            slot = _Slot(proc_limiter)
            await slot.take()
            token = _HELD.set(slot)
            try:
                # A slot handed over by a sibling that has just failed comes with the group already
                # cancelled: give up here, before the step counts as started.
                await trio.lowlevel.checkpoint_if_cancelled()
                return await run(step, env, results, prefix)
            finally:
                _HELD.reset(token)
                slot.drop()
        finally:
            call_limiter.release()

    async def _tool(
        self, step: Leaf[Any, Any], env: dict[str, Any], results: dict[str, Any], prefix: str
    ) -> dict[str, Any]:
        t0 = perf_counter()
        path = prefix + step.id
        if self.memo is not None:
            if (done := self.memo.get(path)) is not None:
                return self.recall(step, done, results)
            if self.durable:
                await self.memo.starting(path, "tool", _started_detail(step, env))
        if self.on_event is not None:
            self.started(step, "tool", path)
        r = None
        try:
            try:
                args = step.args.resolve(env)  # type: ignore[union-attr]
            except InterpolationError as e:
                r = leaf_result(step.id, False, _unresolved(e, env), ErrorCode.INTERPOLATION_FAILED, t0)
                _log.info("step %s: %s", path, e.with_step(path), extra={"interpolation": e.to_dict()})
            except OutputTooLargeError as e:
                r = leaf_result(step.id, False, str(e), _TOO_LARGE, t0)
            else:
                ctx = self.ctx.for_step(self.pid, path, self.registry)
                if step.retry is not None:
                    r = await self.retried(step, args, ctx, t0)
                elif step.timeout_ms is None:
                    r = tool_result(step.id, await self.call(step.tool, args, ctx), t0)
                else:
                    with trio.move_on_after(step.timeout_ms / 1000) as scope:
                        r = tool_result(step.id, await self.call(step.tool, args, ctx), t0)
                    if scope.cancelled_caught:
                        r = leaf_result(step.id, False, _timed_out(step.timeout_ms), ErrorCode.TIMEOUT, t0)
        except Exception as e:
            code = ErrorCode.UNKNOWN_TOOL if isinstance(e, UnknownToolError) else ErrorCode.TOOL_FAILED
            if isinstance(e, MCPipeError):  # a failure mcpipe describes (a server down, its error): no traceback
                _log.info("step %s (%s): tool '%s' failed: %s", path, step.location, step.tool, e)
            else:
                _log.exception("step %s (%s): tool '%s' raised", path, step.location, step.tool)
            message = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            refused = getattr(e, "code", None) if isinstance(e, MCPipeError) else None
            if refused in (ErrorCode.FORBIDDEN, ErrorCode.LIMIT_EXCEEDED):  # a gate refused the call
                code, message = refused, str(e)
            r = leaf_result(step.id, False, message, code, t0)
            if isinstance(e, MCPipeError):
                r.update(e.step_fields())
        finally:
            if r is None:  # cancelled from outside: record it, and let the cancellation go on
                r = leaf_result(step.id, False, "cancelled", _CANCELLED, t0)
            self.settle(step, r, path, results)
        return r

    async def retried(self, step: Leaf[Any, Any], args: object, ctx: ToolContext, t0: float) -> dict[str, Any]:
        """A tool call made again after a retryable failure (a transport failure, the server down, the
        step's own deadline), up to ``retry.attempts`` calls, each one audited by the registry."""
        retry = step.retry
        assert retry is not None
        delay = retry.backoff_ms
        attempt = 1
        while True:
            last = attempt >= retry.attempts
            if attempt > 1:
                calls = self.total + self.retries + 1
                if calls > self.limits.max_calls:
                    why = (
                        f"{step.location}.retry: attempt {attempt} would bring the run to {calls} tool executions; "
                        f"the limit is {self.limits.max_calls}"
                    )
                    refused = leaf_result(step.id, False, why, ErrorCode.LIMIT_EXCEEDED, t0)
                    refused["attempts"] = attempt - 1
                    return refused
                self.retries += 1
            try:
                if step.timeout_ms is None:
                    r = tool_result(step.id, await self.call(step.tool, args, ctx), t0)
                else:
                    r = None
                    with trio.move_on_after(step.timeout_ms / 1000):
                        r = tool_result(step.id, await self.call(step.tool, args, ctx), t0)
                    if r is None and last:
                        r = leaf_result(step.id, False, _timed_out(step.timeout_ms), ErrorCode.TIMEOUT, t0)
                if r is not None:
                    r["attempts"] = attempt
                    return r
            except Exception as e:
                if last or not _retryable(e):
                    raise
                _log.info("step %s: attempt %d of %d failed (%s); retrying", step.location, attempt, retry.attempts, e)
            await trio.sleep(delay / 1000)
            delay *= 2
            attempt += 1

    def recall(self, step: Step, done: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
        """A leaf step that finished in an earlier round of this call: its recorded result, not run again."""
        self.answer_bytes += json_measure(done, wire=True)[0]  # kept once already: it fitted then
        results[step.id] = done
        if done.get("skipped"):
            pass
        elif done["error_code"] is None:
            self.succeeded += 1
        else:
            self.failed += 1
        return done

    async def group(
        self, step: Parallel, env: dict[str, Any], results: dict[str, Any], prefix: str, stop: bool
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
                    r = group_result(
                        step.id, step.children, children, False, _timed_out(step.timeout_ms), ErrorCode.TIMEOUT, t0
                    )
            if r is None:
                if first:
                    f = first[0]
                    r = group_result(
                        step.id,
                        step.children,
                        children,
                        False,
                        f"step '{f['id']}' failed: {f['error']}",
                        f["error_code"],
                        t0,
                    )
                else:
                    r = group_result(step.id, step.children, children, True, "", None, t0)
        finally:
            if r is None:
                r = group_result(step.id, step.children, children, False, "cancelled", _CANCELLED, t0)
            self.keep(step, r, results)
            if self.on_event is not None:
                self.finished(step, r, path)
        return r

    async def children(
        self,
        step: Parallel,
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
        # later without running them again. A failure that stopped the group (it cancelled the siblings) wins over
        # the suspension.
        if held and not nursery.cancel_scope.cancel_called:
            raise held[0]

    async def child(
        self,
        step: Node,
        env: dict[str, Any],
        children: dict[str, Any],
        prefix: str,
        stop: bool,
        first: list[dict[str, Any]],
        siblings: trio.CancelScope,
        held: list[BaseException],
    ) -> None:
        if step.continue_on_error is not None:
            stop = not step.continue_on_error
        try:
            if type(step) is Leaf and step.run is None and step.when is None:  # a bare tool call: the fast path
                r = await self.tool(step, env, children, prefix)
            else:
                r = await self.node(step, env, children, True, prefix, stop)
        except BaseException as e:
            if self.memo is None or not is_suspension(e):
                raise
            held.append(e)
            return
        if not r["ok"]:
            if not first:
                first.append(r)
            # `stop` is this child's own policy (or its group's): any failure it may not go on after
            # cancels the siblings, not only the group's first failure.
            if stop:
                siblings.cancel()

    async def pipe(
        self, step: Pipe, env: dict[str, Any], results: dict[str, Any], parallel: bool, prefix: str
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
                r = pipe_result(step.id, False, str(e), ErrorCode.INTERPOLATION_FAILED, None, inner["steps"], t0)
            except OutputTooLargeError as e:
                r = pipe_result(step.id, False, str(e), _TOO_LARGE, None, inner["steps"], t0)
            else:
                deadline = _min_ms(step.timeout_ms, plan.timeout_ms)
                if deadline is None:
                    ok, error, code, result = await self.pipeline(plan, inner, parallel, path + ".")
                    r = pipe_result(step.id, ok, error, code, result, inner["steps"], t0)
                else:
                    with trio.move_on_after(deadline / 1000) as scope:
                        ok, error, code, result = await self.pipeline(plan, inner, parallel, path + ".")
                        r = pipe_result(step.id, ok, error, code, result, inner["steps"], t0)
                    if scope.cancelled_caught:
                        r = pipe_result(
                            step.id, False, _timed_out(deadline), ErrorCode.TIMEOUT, None, inner["steps"], t0
                        )
        finally:
            if r is None:
                r = pipe_result(step.id, False, "cancelled", _CANCELLED, None, inner["steps"], t0)
            self.keep(step, r, results)
            if self.on_event is not None:
                self.finished(step, r, path)
        return r

    # --- kinds' leaves, and steps whose results say whether they were skipped ---

    async def leaf(
        self, step: Leaf[Any, Any], env: dict[str, Any], results: dict[str, Any], prefix: str
    ) -> dict[str, Any]:
        t0 = perf_counter()
        path = prefix + step.id
        if self.memo is not None:
            if (done := self.memo.get(path)) is not None:
                return self.recall(step, done, results)
            if self.durable:
                await self.memo.starting(path, step.kind, _started_detail(step, env))
        if self.on_event is not None:
            self.started(step, step.kind, path)
        r = None
        try:
            ctx = self.ctx.for_step(self.pid, path, self.registry)
            if step.direct:
                # The tool kind's direct path: the tool's answer is made the step's result here (no StepOutput,
                # no `execute`); a failure comes back as the output `execute` would answer.
                res = await _tool_step()(step, env, ctx)
                if isinstance(res, StepOutput):
                    r = _leaf_record(step, res, t0)
                else:
                    r = tool_result(step.id, res, t0, kind=step.kind, skippable=step.skippable)
            else:
                # `execute` answers every failure of the step as an output; only a cancellation goes through.
                r = _leaf_record(step, await step.execute(env, ctx), t0)
        finally:
            if r is None:
                r = leaf_result(step.id, False, "cancelled", _CANCELLED, t0, kind=step.kind, skippable=step.skippable)
            self.settle(step, r, path, results)
        return r

    def settle(self, step: Step, r: dict[str, Any], path: str, results: dict[str, Any]) -> None:
        """Record a leaf's result: in its list's results, the summary counts, the memo and the events."""
        too_large = self.bound(r, step)
        if too_large is not None:
            # Dropped, not kept: the step fails, located, and the answer stays small.
            r.update(ok=False, error=str(too_large), error_code=_TOO_LARGE, structured=None, text="", content=[])
            r["output"] = None
            self.answer_bytes += json_measure(r, wire=True)[0]
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

    def bound(self, r: dict[str, Any], step: Step) -> OutputTooLargeError | None:
        """Check a leaf's result against the output's bounds (``max_output_bytes``, ``max_json_depth``) and
        charge it to the answer (:meth:`charge`), in one walk of the result when it is small: the error,
        else None. The same answer as :meth:`bound_exactly`, which a large or deep result takes.

        One walk suffices when the result weighs at most a tenth of ``max_output_bytes`` as sent, and nests no
        deeper than the output may: the output check's measure of a value (its JSON, each string at the widest
        UTF-8 of its storage, each number at 20 or 24 bytes) is at most twice the answer's measure of it (every
        character, digit and punctuation there twice, an integer at 20 digits), the result holds the output's
        pair, and it nests at least as deeply. Ten, not two, so that neither measure can grow past the margin
        unnoticed; larger results (800 KiB at the default 8 MiB) are walked again, exactly."""
        limits = self.limits
        room = self.room()
        deepest = limits.max_json_depth + 2  # +2: the pair (structured, content) and a content block
        size, depth = json_measure(r, max_bytes=room, max_depth=deepest, wire=True)
        if size <= room and depth <= deepest and size * _ONE_WALK_MARGIN <= limits.max_output_bytes:
            self.answer_bytes += size
            return None
        return self.bound_exactly(r, step)

    def bound_exactly(self, r: dict[str, Any], step: Step) -> OutputTooLargeError | None:
        """:meth:`bound` by two walks: the output's pair measured against its bounds, then the result charged."""
        what = f"the output of step '{step.id}'"
        too_large = None
        if r["structured"] is not None or r["content"]:
            # +2: the pair (structured, content) and a content block nest two levels themselves.
            too_large = self.check_output((r["structured"], r["content"]), step.location, what, 2)
        if too_large is None:
            too_large = self.charge(r, step.location, what)
        return too_large

    def check_output(self, value: object, location: str, what: str, wrapping: int) -> OutputTooLargeError | None:
        """The error when ``value`` (one step's output, or a ``return``) passes ``max_output_bytes`` or nests
        past ``max_json_depth`` (``wrapping``: the levels the caller's own containers add), else None."""
        limits = self.limits
        return measure_output(
            value,
            max_bytes=limits.max_output_bytes,
            max_depth=limits.max_json_depth,
            location=location,
            what=what,
            wrapping=wrapping,
        )

    def charge(self, value: object, location: str, what: str) -> OutputTooLargeError | None:
        """Count ``value`` towards the answer as it will be sent: its JSON with escapes, and that JSON again
        as the tool result's text block (``json_measure(wire=True)``, which stops past the room left). The
        error, without counting it, when it does not fit under ``max_answer_bytes``."""
        limit = self.limits.max_answer_bytes
        room = self.room()
        size = json_measure(value, max_bytes=room, wire=True)[0]
        if size <= room:
            self.answer_bytes += size
            return None
        why = (
            f"would take the answer past its limit of {limit} bytes as sent ({self.answer_bytes} bytes kept before it)"
        )
        full = OutputTooLargeError(size, limit, location, what, why)
        if self.full is None:
            # Nothing more fits: the run stops here (whatever `continue_on_error` says), and answers this.
            self.full = full
            if self.scope is not None:
                self.scope.cancel()
        return full

    def room(self) -> int:
        """What the answer may still take under ``max_answer_bytes``; room is kept for what a full answer still
        records: the failed step, the steps it cancels."""
        limit = self.limits.max_answer_bytes
        return max(limit - min(limit // 4, _RECORDS_ROOM) - self.answer_bytes, 0)

    def keep(self, step: Step, r: dict[str, Any], results: dict[str, Any]) -> None:
        """Record a container's (or a skipped step's) result: what it adds to the answer beyond its children,
        counted already, is charged; past the room, the result fails ``OUTPUT_TOO_LARGE`` without its
        output (a group's, a ``for_each``'s, a pipe's copies of its children's outputs)."""
        own = {k: v for k, v in r.items() if k != "children" and k != "steps"}
        too_large = self.charge(own, step.location, f"the output of step '{step.id}'")
        if too_large is not None:
            r.update(ok=False, error=str(too_large), error_code=_TOO_LARGE, structured=None, output=None)
            if "result" in r:
                r["result"] = None
            self.answer_bytes += json_measure({k: v for k, v in r.items() if k in own}, wire=True)[0]
        results[step.id] = r

    async def container(
        self, step: Container, env: dict[str, Any], results: dict[str, Any], parallel: bool, prefix: str, stop: bool
    ) -> dict[str, Any]:
        """``when`` and ``input_transform`` first, then the group or nested pipe as for ``mcp_pipe``."""
        t0 = perf_counter()
        try:
            inner = await prelude(step, env)
        except ExpressionError as e:
            error = f"{step.location}: {e}" if e.timeout else str(e)
            r = leaf_result(step.id, False, error, e.code, t0, kind=step.kind, skippable=True)
            self.keep(step, r, results)
            return r
        if inner is SKIP:
            r = leaf_result(step.id, True, "", None, t0, kind=step.kind, skippable=True)
            r["skipped"] = True
            self.keep(step, r, results)
            return r
        match step:
            case Parallel():
                r = await self.group(step, inner, results, prefix, stop)
            case Pipe():
                r = await self.pipe(step, inner, results, parallel, prefix)
            case ForEach():
                r = await self.each(step, inner, results, prefix, stop)
            case Graph():
                r = await self.graph(step, inner, results, prefix, stop)
            case _:
                assert_never(step)
        r["skipped"] = False
        return r

    # --- conditions and fan-out (mcp_pipe's `when` and `for_each`) ---

    async def gated(
        self, step: Node, env: dict[str, Any], results: dict[str, Any], parallel: bool, prefix: str, stop: bool
    ) -> dict[str, Any]:
        """A step with a ``when``: skipped (no output, not counted as run) when it is false."""
        t0 = perf_counter()
        try:
            assert step.when is not None
            # Under the expression deadline, off the event loop when it iterates (issue 20: evaluated inline,
            # an 8000-int comprehension froze the server 18 s).
            verdict = await evaluate(step.when, env)
            if not isinstance(verdict, bool):
                raise ExpressionError(f"`when` must be a boolean, got {json_type(verdict)}")
        except ExpressionError as e:
            r = leaf_result(step.id, False, f"{step.location}.when: {e}", e.code, t0, kind=step.kind)
            if type(step) is Leaf:
                self.settle(step, r, prefix + step.id, results)
            else:
                self.keep(step, r, results)
            return r
        if verdict:
            return await self.dispatch(step, env, results, parallel, prefix, stop)
        r = {
            "id": step.id,
            "kind": step.kind,
            "ok": True,
            "error": "",
            "error_code": None,
            "skipped": True,
            "duration_ms": ms_since(t0),
        }
        self.keep(step, r, results)
        if self.on_event is not None:
            self.started(step, step.kind, prefix + step.id)
            self.finished(step, r, prefix + step.id)
        return r

    async def each(
        self, step: ForEach, env: dict[str, Any], results: dict[str, Any], prefix: str, stop: bool
    ) -> dict[str, Any]:
        """Run the step once per element, concurrently under the call's limit; outputs in order."""
        t0 = perf_counter()
        path = prefix + step.id
        if self.on_event is not None:
            self.started(step, "for_each", path)
        leaves = sum(1 for n in walk((step.step,)) if type(n) is Leaf)
        slots: list[dict[str, Any]] = []
        first: list[dict[str, Any]] = []
        r = None
        try:
            try:
                source = step.items
                items = source.resolve(env) if isinstance(source, Template) else await evaluate(source, env)
            except InterpolationError as e:
                r = each_result(step.id, [], False, _unresolved(e, env), ErrorCode.INTERPOLATION_FAILED, t0)
                items = None
            except ExpressionError as e:
                why = f"{step.location}.for_each: {e}"
                r = each_result(step.id, [], False, why, e.code, t0)
                items = None
            if items is None:
                pass
            elif not isinstance(items, list):
                why = f"{step.location}.for_each: expected an array, got {json_type(items)}"
                r = each_result(step.id, [], False, why, ErrorCode.INTERPOLATION_FAILED, t0)
            elif len(items) > self.limits.max_items:
                why = f"{step.location}.for_each: {len(items)} items; the limit is {self.limits.max_items}"
                r = each_result(step.id, [], False, why, ErrorCode.LIMIT_EXCEEDED, t0)
            elif self.total + self.retries + (len(items) - 1) * leaves > self.limits.max_calls:
                why = (
                    f"{step.location}.for_each: {len(items)} items would bring the run to "
                    f"{self.total + self.retries + (len(items) - 1) * leaves} step executions; the limit is "
                    f"{self.limits.max_calls}"
                )
                r = each_result(step.id, [], False, why, ErrorCode.LIMIT_EXCEEDED, t0)
            else:
                self.total += (len(items) - 1) * leaves
                slots = [{} for _ in items]
                if step.timeout_ms is None:
                    await self.items(step, env, items, slots, path, stop, first)
                else:
                    with trio.move_on_after(step.timeout_ms / 1000) as scope:
                        await self.items(step, env, items, slots, path, stop, first)
                    if scope.cancelled_caught:
                        why = _timed_out(step.timeout_ms)
                        r = each_result(step.id, _each_children(step, slots), False, why, ErrorCode.TIMEOUT, t0)
                if r is None:
                    children = _each_children(step, slots)
                    if first:
                        f = first[0]
                        at = next(i for i, slot in enumerate(slots) if slot.get(step.step.id) is f)
                        why = f"item {at} failed: {f['error']}"
                        r = each_result(step.id, children, False, why, f["error_code"], t0)
                    else:
                        r = each_result(step.id, children, True, "", None, t0)
        finally:
            if r is None:
                r = each_result(step.id, _each_children(step, slots), False, "cancelled", _CANCELLED, t0)
            self.keep(step, r, results)
            if self.on_event is not None:
                self.finished(step, r, path)
        return r

    async def items(
        self,
        step: ForEach,
        env: dict[str, Any],
        items: list[Any],
        slots: list[dict[str, Any]],
        path: str,
        stop: bool,
        first: list[dict[str, Any]],
    ) -> None:
        # A pool of at most `max_concurrency` workers takes the elements in order: the call's limiter
        # would let no more run at once, and a task per element parked on it costs a wake-up each.
        held: list[BaseException] = []
        todo = iter(enumerate(items))
        width = self.limits.max_concurrency
        if step.max_concurrency is not None:
            width = max(1, min(width, step.max_concurrency))
        async with trio.open_nursery() as nursery:
            for _ in range(min(len(items), width)):
                nursery.start_soon(self.worker, step, env, todo, slots, path, stop, first, nursery.cancel_scope, held)
        if held and not nursery.cancel_scope.cancel_called:
            raise held[0]

    async def worker(
        self,
        step: ForEach,
        env: dict[str, Any],
        todo: Iterator[tuple[int, Any]],
        slots: list[dict[str, Any]],
        path: str,
        stop: bool,
        first: list[dict[str, Any]],
        siblings: trio.CancelScope,
        held: list[BaseException],
    ) -> None:
        one_by_one = step.max_concurrency == 1
        for i, item in todo:
            inner = dict(env)
            inner["item"] = item
            inner["index"] = i
            if one_by_one:
                inner["before"] = slots  # the items before `index` are done (a front-end's loop state reads them)
            if step.as_name != "item":
                inner[step.as_name] = item  # what expressions read it as (templates read `item`)
            await self.child(step.step, inner, slots[i], f"{path}.{i}.", stop, first, siblings, held)

    # --- graphs: steps joined by conditional arcs ---

    async def graph(
        self, step: Graph, env: dict[str, Any], results: dict[str, Any], prefix: str, stop: bool
    ) -> dict[str, Any]:
        """Run the nodes reached from the entry, each once its incoming arcs are decided (see
        :class:`mcpipe.plan.Graph`); nodes ready together run concurrently."""
        t0 = perf_counter()
        path = prefix + step.id
        if self.on_event is not None:
            self.started(step, "graph", path)
        run = _GraphRun(step)
        keep_going = (not stop) if step.continue_on_error is None else step.continue_on_error
        r = None
        try:
            if step.timeout_ms is None:
                await self.graph_nodes(step, run, env, results, prefix, keep_going)
            else:
                with trio.move_on_after(step.timeout_ms / 1000) as scope:
                    await self.graph_nodes(step, run, env, results, prefix, keep_going)
                if scope.cancelled_caught:
                    why = _timed_out(step.timeout_ms)
                    r = graph_result(step.id, False, why, ErrorCode.TIMEOUT, None, run.ran, t0, None)
            if r is None:
                if run.failure is not None:
                    error, code = run.failure
                    r = graph_result(step.id, False, error, code, run.output, run.ran, t0, run.output_from)
                else:
                    r = graph_result(step.id, True, "", None, run.output, run.ran, t0, run.output_from)
        finally:
            if r is None:
                r = graph_result(step.id, False, "cancelled", _CANCELLED, None, run.ran, t0, None)
            self.keep(step, r, results)
            if self.on_event is not None:
                self.finished(step, r, path)
        return r

    async def graph_nodes(
        self, step: Graph, run: _GraphRun, env: dict[str, Any], results: dict[str, Any], prefix: str, go_on: bool
    ) -> None:
        held: list[BaseException] = []
        async with trio.open_nursery() as nursery:

            def reach(i: int, via: tuple[Arc, ...]) -> None:
                n = run.runs[i] = run.runs[i] + 1
                if n > 1 and not self.again(step, run, i, via, n):
                    nursery.cancel_scope.cancel()
                    return
                nursery.start_soon(self.graph_node, step, run, i, via, env, results, prefix, go_on, nursery, held, n)

            run.reach = reach
            run.fired[step.entry] = True
            reach(step.entry, ())
        if held and run.failure is None:
            raise held[0]

    def again(self, step: Graph, run: _GraphRun, i: int, via: tuple[Arc, ...], n: int) -> bool:
        """Whether node ``i`` may run its ``n``-th time (an arc back to it was taken): within
        ``limits.max_step_runs`` and, its leaves counted again, ``limits.max_calls``; else the graph fails."""
        node = step.nodes[i]
        where = via[-1].location if via and via[-1].location else f"{step.location}.arcs"
        leaves = sum(1 for x in walk((node,)) if isinstance(x, Leaf))
        if n > self.limits.max_step_runs:
            why = (
                f"{where}: step '{node.id}' would run {n} times; the limit is {self.limits.max_step_runs} runs "
                "of a step (pipe.max_step_runs)"
            )
        elif self.total + self.retries + leaves > self.limits.max_calls:
            why = (
                f"{where}: running step '{node.id}' again would bring the run to "
                f"{self.total + self.retries + leaves} step executions; the limit is {self.limits.max_calls}"
            )
        else:
            self.total += leaves
            return True
        run.failure = run.failure or (why, ErrorCode.LIMIT_EXCEEDED)
        return False

    async def graph_node(
        self,
        step: Graph,
        run: _GraphRun,
        i: int,
        via: tuple[Arc, ...],
        env: dict[str, Any],
        results: dict[str, Any],
        prefix: str,
        go_on: bool,
        nursery: trio.Nursery,
        held: list[BaseException],
        n: int = 1,
    ) -> None:
        node = step.nodes[i]
        keep_going = go_on if node.continue_on_error is None else node.continue_on_error
        inner = dict(env)
        inner["via"] = via
        # A node run again records its result as `ID#n` (the first run's stays `ID`), in the order runs finish.
        sid = node.id if n == 1 else f"{node.id}#{n}"
        store = results if n == 1 else {}
        where = prefix if n == 1 else f"{prefix}{sid}/"
        try:
            r = await self.node(node, inner, store, True, where, not keep_going)
        except BaseException as e:
            if self.memo is None or not is_suspension(e):
                raise
            held.append(e)  # asked the client: the siblings finish, the call resumes later
            return
        if n > 1:
            results[sid] = store.get(node.id, r)
        if r.get("skipped"):  # its `when` was false: passed over, as is every arc out of it
            for arc in step.arcs[i]:
                run.decide(arc, False)
            return
        run.ran.append(sid)
        failed_here = False
        if not r["ok"]:
            if run.failure is None:
                run.failure = (f"step '{r['id']}' failed: {r['error']}", r["error_code"])
                failed_here = True
            if not keep_going:
                nursery.cancel_scope.cancel()
                return
        inner["last"] = r
        chosen: list[Arc] = []
        for arc in step.arcs[i]:
            if arc.when is None:
                verdict: Any = True
            else:
                try:
                    verdict = await evaluate(arc.when, inner)
                    if not isinstance(verdict, bool):
                        raise ExpressionError(f"`when` must be a boolean, got {json_type(verdict)}")
                except ExpressionError as e:
                    where = arc.location or f"{step.location}.arcs"
                    run.failure = run.failure or (f"{where}.when: {e}", e.code)
                    nursery.cancel_scope.cancel()
                    return
            if verdict:
                chosen.append(arc)
                if not step.inclusive[i]:
                    break
        if not chosen:
            run.output, run.output_from = r.get("output"), node.id
        # The arcs forward first; an arc back then starts the part of the graph after its target anew.
        for arc in step.arcs[i]:
            if not arc.back:
                run.decide(arc, any(arc is c for c in chosen))
        if failed_here and any(arc.retry and arc.to == i for arc in chosen):
            run.failure = None  # retried: the node's next run decides
        for arc in chosen:
            if arc.back:
                run.restart(arc)

    # --- events ---

    def started(self, step: Step, kind: str, path: str) -> None:
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

    def finished(self, step: Step, r: dict[str, Any], path: str) -> None:
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


class _GraphRun:
    """What a graph's run knows: the arcs decided into each node, what ran, the output and first failure.

    ``decisions`` holds the forward arcs decided so far (taken or not); a node fires (runs, or is passed over)
    once all the forward arcs into it are decided. Taking an arc back to a node forgets the decisions of the
    nodes after it (:meth:`restart`), so they wait and fire again."""

    __slots__ = (
        "after",
        "decisions",
        "failure",
        "fired",
        "graph",
        "incoming",
        "output",
        "output_from",
        "ran",
        "reach",
        "runs",
    )

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        n = len(graph.nodes)
        self.incoming: list[list[Arc]] = [[] for _ in range(n)]
        self.after: list[frozenset[int] | None] = [None] * n
        for arcs in graph.arcs:
            for arc in arcs:
                if not arc.back:
                    self.incoming[arc.to].append(arc)
                elif self.after[arc.to] is None:
                    self.after[arc.to] = _forward_from(graph, arc.to)
        self.decisions: dict[int, bool] = {}  # id(arc) -> taken
        self.fired = [False] * n
        self.runs = [0] * n
        self.ran: list[str] = []
        self.output: Any = None
        self.output_from: str | None = None
        self.failure: tuple[str, str | None] | None = None
        self.reach: Callable[[int, tuple[Arc, ...]], None] = lambda i, via: None

    def decide(self, arc: Arc, taken: bool) -> None:
        """One forward arc into ``arc.to`` is decided; when all are, the node runs (some taken) or is passed
        over, and then so are the arcs out of it."""
        j = arc.to
        self.decisions[id(arc)] = taken
        if self.fired[j]:
            return
        into = self.incoming[j]
        if any(id(a) not in self.decisions for a in into):
            return
        self.fired[j] = True
        taken_arcs = tuple(a for a in into if self.decisions[id(a)])
        if taken_arcs:
            self.reach(j, taken_arcs)
            return
        for out in self.graph.arcs[j]:  # never reached: neither are the nodes only it leads to
            if not out.back:
                self.decide(out, False)

    def restart(self, arc: Arc) -> None:
        """An arc back to ``arc.to`` was taken: the nodes after it (``to`` included) forget the arcs decided
        from within that part, and ``to`` runs again."""
        j = arc.to
        part = self.after[j] or frozenset({j})
        for k in part:
            self.fired[k] = False
            for a in self.graph.arcs[k]:
                self.decisions.pop(id(a), None)
        self.fired[j] = True
        self.reach(j, (arc,))


def _started_detail(step: Leaf[Any, Any], env: Mapping[str, Any]) -> dict[str, Any]:
    """What a durable record's ``step_started`` event says of a leaf about to run (a queued run's: the
    console shows it): a preview of its arguments as far as they resolve now (a tool call's ``args``, a kind's
    templates), and the graph arcs it was reached by (``via``, by location). Only durable runs pay for it."""
    out: dict[str, Any] = {}
    via = env.get("via")
    if via:
        out["via"] = [a.location for a in via if isinstance(a, Arc)]
    try:
        if step.args is not None:
            args: Any = step.args.resolve(env)
        elif step.templates and step.input_transform is None:
            args = {name: t.resolve(env) for name, t in step.templates}
        else:
            return out
    except (InterpolationError, OutputTooLargeError):  # resolved again when the step runs, which reports it
        return out
    out["args"], out["args_bytes"] = preview(args)
    return out


def _leaf_record(step: Leaf[Any, Any], out: StepOutput, t0: float) -> dict[str, Any]:
    """A kind's leaf's result from its output (``skipped`` only when the step's results carry it)."""
    r = out.result(step.id, step.kind, ms_since(t0))
    if not step.skippable:
        del r["skipped"]
    return r


def _forward_from(graph: Graph, start: int) -> frozenset[int]:
    """The nodes reached from ``start`` by forward arcs (``start`` included)."""
    seen = {start}
    todo = [start]
    while todo:
        for arc in graph.arcs[todo.pop()]:
            if not arc.back and arc.to not in seen:
                seen.add(arc.to)
                todo.append(arc.to)
    return frozenset(seen)


def _each_children(step: ForEach, slots: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """Each element's result in order (None for one cancelled before it started)."""
    sid = step.step.id
    return [slot.get(sid) for slot in slots]


def _dry_run(
    compiled: CompiledSpec, ctx: ToolContext, limits: Limits, args: Mapping[str, object], started: float
) -> dict[str, Any]:
    """The answer of a dry run: every check passed (the spec, the tools, the permissions, retries), and
    the plan; no step runs."""
    env: dict[str, Any] = {"vars": {}, "steps": {}, "last": None, "args": args, "context": ctx.facts()}
    try:
        env["vars"] = compiled.plan.vars.resolve(env)
    except InterpolationError as e:
        env = {}
        error = str(e)
    else:
        error = ""
    plan = explain(compiled.plan, env, limits)
    return {
        "ok": not error,
        "error": error,
        "error_code": ErrorCode.INTERPOLATION_FAILED if error else None,
        "result": None,
        "steps": {},
        "summary": {
            "total": compiled.leaf_count,
            "succeeded": 0,
            "failed": 0,
            "skipped": compiled.leaf_count,
            "cancelled": 0,
        },
        "duration_ms": ms_since(started),
        "dry_run": True,
        "plan": plan,
    }


def _retryable(e: BaseException) -> bool:
    """Whether a call that raised ``e`` may succeed if made again: a transport failure, a server down."""
    if isinstance(e, (OSError, trio.BrokenResourceError, trio.ClosedResourceError)):
        return True
    return bool(getattr(e, "retryable", False))


def _idempotent(registry: object, name: str, limits: Limits) -> bool:
    """Whether the operator marks tool ``name`` idempotent, or its annotations say ``idempotentHint``."""
    if limits.idempotent_tools and glob_matcher(list(limits.idempotent_tools))(name):
        return True
    get = getattr(registry, "get", None)
    tool = get(name) if get is not None else None
    hints = getattr(tool, "annotations", None)
    return isinstance(hints, Mapping) and hints.get("idempotentHint") is True


def _unresolved(e: InterpolationError, env: Mapping[str, Any]) -> str:
    """The message of a reference that could not resolve, saying so when it reads a skipped step."""
    ref = e.reference
    sid = referenced_step(ref) if ref else None
    done = env["steps"].get(sid) if sid is not None else None
    if isinstance(done, dict) and done.get("skipped") is True and "output" not in done:
        where = f"{e.location}: " if e.location else ""
        return (
            f"{where}cannot resolve `{ref}`: step '{sid}' was skipped (its `when` was false); "
            f'give the reference a default: `${{{ref} ?? "..."}}`'
        )
    return str(e)
