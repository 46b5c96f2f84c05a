"""The plan: one intermediate representation every front-end compiles to and the scheduler runs.

A plan is a :class:`Pipeline` (vars, steps, return, failure policy, deadline) whose steps are

- :class:`Leaf`: one unit of work. A bare tool call (``mcp_pipe``'s tool steps) has ``run`` None and
  holds ``tool`` and ``args``: the scheduler calls the tool inline, the fast path. Every other leaf is a
  step kind's (``mcpipe.kinds``): its ``fields``, compiled ``templates``, what the kind ``built`` at compile
  time, and the kind's ``run``;
- :class:`Parallel`: children that run concurrently and see what the group's list sees;
- :class:`Pipe`: a nested pipeline whose ``vars`` resolve in the enclosing environment;
- :class:`ForEach`: one step run once per element of an array;
- :class:`Graph`: steps joined by conditional arcs: each step runs when the arcs into it are decided and at
  least one was taken, and again each time an arc back to it (a cycle) is taken, a bounded number of times.

Every node is a :class:`Step` (id, location, deadline, failure policy) and may carry ``when`` (skip the step
when false) and ``input_transform`` (replace ``args`` for the step); ``skippable`` says the front-end's
results carry ``skipped`` (declared pipelines).

Front-ends: :func:`mcpipe.compile_spec` (``mcp_pipe`` specs) and :mod:`mcpipe.declared` (the config's
``pipelines:``); both check with :class:`mcpipe.plan.Checker`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeAlias, TypeVar

import trio

from mcpipe._deadline import expression_timeout_ms, set_expression_timeout
from mcpipe._describe import json_type
from mcpipe._template import Template
from mcpipe.errors import ErrorCode, ExpressionError, InterpolationError, OutputTooLargeError
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolCaller, ToolContext

if TYPE_CHECKING:
    from mcpipe.plan._types import ArgumentSite, TypedSite

__all__ = [
    "SKIP",
    "Arc",
    "CompiledSpec",
    "Expression",
    "ForEach",
    "Graph",
    "Leaf",
    "Limits",
    "Node",
    "Parallel",
    "Pipe",
    "Pipeline",
    "Retry",
    "RunFn",
    "Step",
    "evaluate",
    "expression_timeout_ms",
    "plan_of",
    "prelude",
    "set_expression_timeout",
    "walk",
]

F = TypeVar("F")
B = TypeVar("B")

_log = logging.getLogger("mcpipe.declared")


@dataclass(frozen=True, slots=True)
class Limits:
    """Server-side limits a spec cannot raise.

    Attributes:
        max_steps: total steps, counting every nested and parallel child.
        max_depth: how deeply ``pipe`` and ``parallel`` steps may nest (top-level steps are depth 0).
        max_concurrency: parallel children running at once within one call.
        timeout_ms: the most a whole pipeline may run; a spec's own ``timeout_ms`` is capped by it.
        max_spec_bytes: the largest spec (its JSON text), refused before anything is compiled.
        max_json_depth: how deeply any JSON value (``args``, ``vars``, ``return``, tool arguments) may nest.
        max_output_bytes: the most one step's output, or one resolved template (its texts and copied values), may
            hold.
        max_answer_bytes: the most one answer may hold as it is sent (every step result with all its copies of
            an output, its result and error, in the structured answer and again in its JSON text block).
        expression_timeout_ms: the deadline of one CEL or JSONata evaluation (declared pipelines).
        max_items: the most elements a ``for_each`` step may run its step for.
        max_calls: the most leaf step executions (tool calls, kinds' steps) one run may make in all, every
            ``for_each`` element and nested fan-out counted: refused at compile time when the sizes are
            known then, else as each ``for_each`` expands (``LIMIT_EXCEEDED``).
        idempotent_tools: names or ``*``-globs of the tools the operator marks idempotent (a step may
            ``retry`` them; so may it a tool whose annotations say ``idempotentHint``).
        max_step_runs: the most times one node of a :class:`Graph` may run in one run, reached again by an
            arc back to it (NoETL's pagination and polling by arcs); each run past the first also counts
            towards ``max_calls`` (``LIMIT_EXCEEDED``, located at the arc).
    """

    max_steps: int = 50
    max_depth: int = 5
    max_concurrency: int = 8
    timeout_ms: float | None = None
    max_spec_bytes: int = 4 * 1024 * 1024
    max_json_depth: int = 64
    max_output_bytes: int = 8 * 1024 * 1024
    max_answer_bytes: int = 32 * 1024 * 1024
    expression_timeout_ms: float = 1000.0
    max_items: int = 100
    idempotent_tools: tuple[str, ...] = ()
    max_calls: int = 1000
    max_step_runs: int = 100


DEFAULT_LIMITS = Limits()


class Expression(Protocol):
    """A compiled expression (CEL, JSONata, an operator's plugin) evaluated over the environment."""

    def evaluate(self, env: Mapping[str, object]) -> Any:
        """The value; raises :class:`mcpipe.errors.ExpressionError` when it fails."""
        ...


async def evaluate(expr: Expression, env: Mapping[str, object]) -> Any:
    """Evaluate a compiled expression under the deadline rules: an expression with an
    ``evaluate_async`` (CEL that iterates runs in a killable worker process, :mod:`mcpipe.expr`) is
    awaited, the others (an operator's plugin) are evaluated inline.

    Raises:
        ExpressionError: the expression failed (``timeout`` set when its deadline passed).
    """
    run = getattr(expr, "evaluate_async", None)
    if run is not None:
        return await run(env)
    return expr.evaluate(env)


RunFn: TypeAlias = Callable[["Leaf[F, B]", dict[str, Any], Mapping[str, Any], ToolContext], Awaitable[StepOutput]]
"""A kind's executor: ``run(step, inputs, env, ctx)``; ``inputs`` are the step's resolved templates and
``env`` the environment after ``input_transform``. Failures are :class:`mcpipe.results.StepFailure`."""

SKIP: Any = object()
"""What :func:`prelude` answers when the step's ``when`` is false."""


@dataclass(frozen=True, slots=True, eq=False)
class Step:
    """What every node of a plan carries; the node classes add their own fields.

    Attributes:
        id: the step id.
        location: where it was written (``steps[2]``, ``pipelines.charge.steps[2]``).
        timeout_ms: the step's deadline, or None.
        when: the compiled ``when`` condition, or None.
        input_transform: the compiled ``input_transform``, or None.
        references: ``(location, reference)`` of every reference it makes.
        skippable: its result carries ``skipped`` (declared steps).
        continue_on_error: the step's own failure policy, or None for its pipeline's.
    """

    id: str
    location: str
    _: KW_ONLY
    timeout_ms: float | None = None
    when: Expression | None = None
    input_transform: Expression | None = None
    references: tuple[tuple[str, str], ...] = ()
    skippable: bool = False
    continue_on_error: bool | None = None


@dataclass(frozen=True, slots=True, eq=False)
class Leaf(Step, Generic[F, B]):
    """One unit of work: a bare tool call, or a step of some kind (the shared fields: :class:`Step`).

    Attributes:
        kind: the kind's name (``tool``, ``http``, ...).
        fields: the kind's decoded fields (its msgspec Struct; None for a bare tool call).
        built: what the kind built at compile time (a CEL program, an argv, the policy it runs under).
        templates: the template fields by name; resolved, they are the runner's ``inputs``.
        run: the kind's executor; None for a bare tool call (the scheduler's inline path).
        tool: the tool a ``tool`` leaf calls (for the per-caller checks), else None.
        args: a bare tool call's arguments template.
        retry: a tool step's retry policy, or None.
        tool_kind: a step of the ``tool`` kind (its own ``run``), known once here: the scheduler runs one with
            no ``when``, ``input_transform`` or deadline by the kind's direct path (``direct``).
        direct: it is run by that path (``mcpipe.kinds.tool.tool_step``).
    """

    kind: str
    fields: F
    built: B
    templates: tuple[tuple[str, Template], ...] = ()
    run: RunFn[F, B] | None = None
    tool: str | None = None
    args: Template | None = None
    retry: Retry | None = None
    tool_kind: bool = field(init=False, default=False)
    direct: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        # Told without importing the kind's module: a plan that has no tool step never loads it.
        tool_kind = self.kind == "tool" and getattr(self.run, "__module__", None) == "mcpipe.kinds.tool"
        object.__setattr__(self, "tool_kind", tool_kind)
        plain = self.timeout_ms is None and self.when is None and self.input_transform is None
        object.__setattr__(self, "direct", tool_kind and plain)

    async def execute(
        self, env: Mapping[str, object], ctx: ToolContext, *, tools: ToolCaller | None = None
    ) -> StepOutput:
        """Run the step: ``when``, then ``input_transform``, then its templates, then the kind, under
        ``timeout_ms``.

        Args:
            env: the pipeline environment (roots ``vars``, ``steps``, ``last``, ``args``, ``context``).
            ctx: the request's context (``log`` and ``progress`` steps send through it; ``ctx.tools`` is
                what ``tool`` steps call through).
            tools: the registry ``tool`` steps call through, instead of ``ctx.tools``.

        Returns:
            The output; failures are outputs with ``ok`` false and an ``error_code``, never exceptions.

        Raises:
            trio.Cancelled: when the caller is cancelled (the step's work is cancelled first).
        """
        run = self.run
        if run is None:
            raise TypeError(f"step '{self.id}' is a bare tool call: the scheduler runs it")
        if tools is not None:
            ctx = replace(ctx, tools=tools)
        try:
            if self.when is None and self.input_transform is None:
                env2 = env
            else:
                env2 = await prelude(self, env)
                if env2 is SKIP:
                    return StepOutput.skip()
            inputs = {name: t.resolve(env2) for name, t in self.templates}
            if self.timeout_ms is None:
                return await run(self, inputs, env2, ctx)
            with trio.move_on_after(self.timeout_ms / 1000):
                return await run(self, inputs, env2, ctx)
            return StepOutput.failure(f"timed out after {self.timeout_ms:g} ms", ErrorCode.TIMEOUT)
        except Exception as e:
            return self.failed(e)

    def failed(self, e: Exception) -> StepOutput:
        """The output of this step when running it raised ``e``: :meth:`execute`'s, and that of a kind's path
        the scheduler takes without it (``mcpipe.kinds.tool.tool_step``), alike."""
        if isinstance(e, InterpolationError):
            e.with_step(self.id)
            return StepOutput.failure(str(e), ErrorCode.INTERPOLATION_FAILED)
        if isinstance(e, OutputTooLargeError):
            return StepOutput.failure(str(e), e.code)
        if isinstance(e, ExpressionError):
            return StepOutput.failure(f"{self.location}: {e}" if e.timeout else str(e), e.code)
        if isinstance(e, StepFailure):
            return StepOutput.failure(str(e), e.code, e.output, e.facts)
        _log.exception("step %s (%s, %s) failed", self.id, self.kind, self.location, exc_info=e)
        return StepOutput.failure(f"{type(e).__name__}: {e}", ErrorCode.TOOL_FAILED)


@dataclass(frozen=True, slots=True, eq=False)
class Parallel(Step):
    """Run ``children`` concurrently; they see the group's list, not each other."""

    children: tuple[Node, ...]
    kind: ClassVar[str] = "parallel"


@dataclass(frozen=True, slots=True, eq=False)
class Pipe(Step):
    """Run the nested ``pipe``; its ``vars`` template is resolved in this step's environment."""

    pipe: Pipeline
    kind: ClassVar[str] = "pipe"


@dataclass(frozen=True, slots=True, eq=False)
class ForEach(Step):
    """Run ``step`` once per element of the array ``items`` resolves to, concurrently under the call's
    limit; the element is the ``item`` root (also named ``as_name``) and its position the ``index`` root of
    the step's templates and expressions.

    ``items`` is a template, or an expression evaluated over the environment (a front-end's own language);
    ``max_concurrency`` bounds the elements running at once below the call's limit (1: one after the
    other). In a loop run one element at a time, the environment's ``before`` holds every element's slot
    (``before[j][step.id]`` is the result of element ``j`` for each ``j < index``, all finished): a front-end
    reads what the earlier elements wrote (NoETL's sequential loop threads its variables through)."""

    items: Template | Expression
    step: Node
    as_name: str = "item"
    max_concurrency: int | None = None
    kind: ClassVar[str] = "for_each"


@dataclass(frozen=True, slots=True, eq=False)
class Arc:
    """An arc of a :class:`Graph`: to the node at index ``to``, taken when ``when`` holds (None: always).

    ``when`` is evaluated over the environment once its source node has finished (``last`` is the source's
    result) and must be a boolean. ``data`` is the front-end's own (what the target reads of the arcs it
    was reached by, through the ``via`` root); the scheduler does not look at it. ``back`` marks an arc back to
    a node on the way from the entry (it closes a cycle): it is not among the arcs a node waits for, and
    taking it runs the node again (see :class:`Graph`). ``retry`` marks an arc back to its own source that
    retries it: taken after the source failed, it withdraws that failure (the next run decides).
    """

    to: int
    when: Expression | None = None
    location: str = ""
    data: Any = None
    back: bool = False
    retry: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class Graph(Step):
    """Steps joined by conditional arcs, run from its ``entry`` node.

    When a node finishes, its arcs (``arcs[i]``, in order) are decided: with ``inclusive[i]`` every arc
    whose ``when`` holds is taken, else the first one. A node runs when every arc into it is decided
    (taken, or known never to be: its source was not reached, or the arc was not chosen) and at least one
    was taken; a node no arc reaches is not run, and the arcs out of it are not taken (nor are they out of
    a node whose ``when`` is false: it is passed over). Nodes ready at the
    same time run concurrently, as a parallel group's children do (their tool calls hold slots of the
    limiters). A node runs in its list's environment with ``via`` the arcs it was reached by; it records
    its result beside the graph's in the list's results, so later nodes read earlier ones by id.

    **Cycles.** An arc marked ``back`` leads back to a node on the way from the entry. Taking it runs that
    node again, and starts the part of the graph after it anew: the arcs its nodes decided are forgotten
    (the arcs into them from nodes before the cycle stay decided), so each node after it waits again for
    its arcs, and runs again when they are taken. The ``n``-th run of a node (``n`` from 2) records its
    result as ``ID#n`` (the first as ``ID``), so the list's results hold every run in the order they
    finished. A node runs at most ``limits.max_step_runs`` times, and each run past the first counts
    towards ``limits.max_calls``: past either, the graph fails ``LIMIT_EXCEEDED``, located at the arc.

    A failed node fails the graph (running nodes are cancelled) unless its ``continue_on_error`` says to go
    on: then its arcs are decided as for a success, and the graph fails at its end with the first failure
    (unless an arc marked ``retry`` back to the node itself is taken: then its next run decides).
    The graph's output is the output of the node that finished last among those that took no arc.
    """

    nodes: tuple[Node, ...]
    arcs: tuple[tuple[Arc, ...], ...]
    inclusive: tuple[bool, ...]
    entry: int = 0
    kind: ClassVar[str] = "graph"


@dataclass(frozen=True, slots=True)
class Retry:
    """A tool step's retry: up to ``attempts`` calls in all, after a retryable failure, waiting
    ``backoff_ms`` before the second and twice as long before each next one."""

    attempts: int
    backoff_ms: float


Node: TypeAlias = Leaf[Any, Any] | Parallel | Pipe | ForEach | Graph
"""A step of a plan."""


@dataclass(frozen=True, slots=True)
class Pipeline:
    """One list of steps with its vars, return template and failure policy."""

    vars: Template
    steps: tuple[Node, ...]
    ret: Template | None
    continue_on_error: bool
    timeout_ms: float | None
    location: str


@dataclass(frozen=True, slots=True)
class CompiledSpec:
    """A validated, compiled plan.

    Attributes:
        plan: the top-level pipeline.
        tool_sites: ``(location, tool)`` of every tool step, for the per-call tool and permission checks.
        leaf_count: how many leaf steps there are, nested and parallel children included.
        step_count: how many steps there are in all.
        retry_sites: ``(location, tool)`` of every tool step with ``retry`` (checked per call: the tool
            must be idempotent).
        dry_run: the spec asks for its plan (:func:`mcpipe.plan.explain`), not for a run.
        typed_sites: the arguments fed by one reference to a tool step's output (checked per call
            against the tools' schemas: :func:`mcpipe.plan.type_problems`).
        argument_sites: the ``args`` objects of the tool steps (checked per call against each tool's
            ``inputSchema``: :func:`mcpipe.plan.argument_problems`).
        answer: what the answer holds (``result``, ``steps``, ``full``: :func:`mcpipe.results.shape_answer`), or
            None for the caller's default.
        leaves_only: every top-level step is a leaf (a run without a deadline then opens no cancel scope).
        calls: the tools a run calls when calling them is all it does (:func:`_calls_only`), else None.
    """

    plan: Pipeline
    tool_sites: tuple[tuple[str, str], ...]
    leaf_count: int
    step_count: int
    retry_sites: tuple[tuple[str, str], ...] = ()
    dry_run: bool = False
    typed_sites: tuple[TypedSite, ...] = ()
    answer: str | None = None
    argument_sites: tuple[ArgumentSite, ...] = ()
    leaves_only: bool = False
    calls: tuple[str, ...] | None = None

    @classmethod
    def of(
        cls,
        plan: Pipeline,
        *,
        dry_run: bool = False,
        typed_sites: tuple[TypedSite, ...] = (),
        answer: str | None = None,
        argument_sites: tuple[ArgumentSite, ...] = (),
    ) -> CompiledSpec:
        """The compiled spec of ``plan``, its sites and counts read from the plan."""
        nodes = list(walk(plan.steps))
        sites = tuple((n.location, n.tool) for n in nodes if isinstance(n, Leaf) and n.tool is not None)
        leaves = sum(1 for n in nodes if isinstance(n, Leaf))
        retries = tuple((n.location, n.tool) for n in nodes if isinstance(n, Leaf) and n.tool and n.retry)
        return cls(
            plan,
            sites,
            leaves,
            len(nodes),
            retries,
            dry_run,
            typed_sites,
            answer,
            argument_sites,
            all(type(step) is Leaf for step in plan.steps),
            None if dry_run else _calls_only(plan),
        )


def _calls_only(plan: Pipeline) -> tuple[str, ...] | None:
    """The tools a run of ``plan`` calls, when calling them is all it does: one list of tool steps (bare
    tool calls, or the ``tool`` kind), none with a ``when``, an ``input_transform``, a ``retry`` or a
    deadline of its own, and no deadline of the plan's. Else None.

    Such a run yields only where its tools yield: when none of them does, the server runs a call of it inline,
    as it runs a synchronous Python tool (``mcpipe.server._fast``).
    """
    if plan.timeout_ms is not None:
        return None
    names = []
    for step in plan.steps:
        if (
            type(step) is not Leaf
            or step.tool is None
            or (step.run is not None and not step.tool_kind)
            or step.when is not None
            or step.input_transform is not None
            or step.retry is not None
            or step.timeout_ms is not None
        ):
            return None
        names.append(step.tool)
    return tuple(names)


def walk(steps: Iterable[Node]) -> Iterator[Node]:
    """Every step, containers first, then their children (parallel children, nested pipe steps)."""
    for step in steps:
        yield step
        if isinstance(step, Parallel):
            yield from walk(step.children)
        elif isinstance(step, Pipe):
            yield from walk(step.pipe.steps)
        elif isinstance(step, ForEach):
            yield from walk((step.step,))
        elif isinstance(step, Graph):
            yield from walk(step.nodes)


def least_calls(plan: Pipeline) -> tuple[int, str]:
    """How many leaf executions a run of ``plan`` makes at least, and the ``for_each`` that multiplies the
    most of them (``""`` if none): a ``for_each`` whose items are known before the run (a constant array,
    or a constant ``vars`` entry of its pipeline) counts its step that many times, any other once."""
    best: list[tuple[int, str]] = [(0, "")]

    def count(steps: Iterable[Node], known: Mapping[str, object] | None) -> int:
        n = 0
        for step in steps:
            if isinstance(step, Leaf):
                n += 1
            elif isinstance(step, Parallel):
                n += count(step.children, known)
            elif isinstance(step, Pipe):
                inner = step.pipe.vars
                n += count(step.pipe.steps, inner.resolve({}) if inner.is_constant else None)
            elif isinstance(step, Graph):
                n += count(step.nodes[step.entry : step.entry + 1], known)  # only the entry surely runs
            else:
                items = _known_items(step.items, known) if isinstance(step.items, Template) else None
                each = count((step.step,), known)
                total = each * (len(items) if isinstance(items, list) and items else 1)
                if total > best[0][0]:
                    best[0] = (total, step.location)
                n += total
        return n

    top = plan.vars.resolve({}) if plan.vars.is_constant else None
    return count(plan.steps, top), best[0][1]


def _known_items(items: Template, known: Mapping[str, object] | None) -> Any:
    """The value ``items`` resolves to when it is known before the run, else None."""
    if items.is_constant:
        return items.resolve({})
    if known is None or any(not r.startswith("vars.") for r in items.references):
        return None
    try:
        return items.resolve({"vars": known})
    except (InterpolationError, OutputTooLargeError):
        return None


def tool_sites(steps: Iterable[Node]) -> Iterator[tuple[str, str]]:
    """``(location, tool)`` of every leaf that calls a tool, nested ones included."""
    for s in walk(steps):
        if isinstance(s, Leaf) and s.tool is not None:
            yield s.location, s.tool


async def prelude(step: Step, env: Mapping[str, object]) -> Any:
    """Apply a step's ``when`` and ``input_transform``.

    Returns:
        :data:`SKIP` when ``when`` is false; else the environment the step runs in: ``env`` itself, or a
        copy whose ``args`` is the ``input_transform``'s value.

    Raises:
        ExpressionError: ``when`` failed or is not a boolean, or ``input_transform`` failed.
    """
    if step.when is not None:
        verdict = await evaluate(step.when, env)
        if not isinstance(verdict, bool):
            raise ExpressionError(f"`when` must be a boolean, got {json_type(verdict)}")
        if not verdict:
            return SKIP
    if step.input_transform is not None:
        transformed = await evaluate(step.input_transform, env)
        new = dict(env)
        new["args"] = transformed
        return new
    return env


def plan_of(tool: object) -> Pipeline | None:
    """The plan a served tool runs (a plan served as a tool holds it as ``compiled.plan``: every format's, by
    ``mcpipe.declared.PlanTool``); None for a tool that is one call."""
    plan = getattr(getattr(tool, "compiled", None), "plan", None)
    return plan if isinstance(plan, Pipeline) else None
