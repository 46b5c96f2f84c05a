"""The one tool class every front-end's plans are served by, and the dialect a format gives it.

A plan served as a tool runs the same way whatever file it came from: its arguments are checked, the tools
its steps name are looked up, the plan runs on the scheduler (:func:`mcpipe.runtime.run_compiled`), and the
run becomes the answer. :class:`PlanTool` does that once. A format says only what differs in a
:class:`ToolDialect` (sqlglot's dialects override what differs and share the rest the same way): how its
arguments are checked and refused, which unknown tools it refuses before running, and how its answer reads.
mcpipe's declared pipelines, discord-mcp's ``mcp_pipeline``, NoETL's playbooks and piraeus's flows are each
a dialect over this class.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from mcpipe._describe import json_type
from mcpipe.errors import ErrorCode
from mcpipe.plan import CompiledSpec, Limits
from mcpipe.runtime import run_compiled
from mcpipe.tools import ToolContext, ToolResult

__all__ = ["PlanCall", "PlanTool", "ToolDialect"]

EventFn = Callable[[dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class PlanCall:
    """One call, as its dialect's argument check leaves it.

    Attributes:
        args: the run's arguments (defaults filled in by the check, when the dialect fills them).
        plan: the call's own plan, for a dialect whose plan is built from its arguments (discord's
            ``mcp_pipeline``); None runs the tool's plan.
        state: what the dialect keeps from its check for its refusals and its answer.
    """

    args: dict[str, Any]
    plan: CompiledSpec | None = None
    state: Any = None


class ToolDialect(ABC):
    """How one format serves a plan as a tool: its argument check, the unknown tools it refuses, and its answer
    shape. Everything else (the registry a run calls through, the run on the scheduler, progress) is
    :class:`PlanTool`'s. A format subclasses this and overrides only what differs.

    Attributes:
        may_ask: a call may ask the caller something mid-call (elicitation, sampling), which on 2025-11-25
            only the SDK's session carries.
        reports_progress: a call with a progress token reports each finished step (and tool call) as
            progress.
        in_thread: the argument check runs in a thread (a schema pattern only the fallback engine takes).
    """

    may_ask = False
    reports_progress = False
    in_thread = False
    answer_shape: Any = None
    """How the answer of a plan served as a resource or a prompt reads (``resource``, ``prompt``: the declared
    pipelines' :class:`~mcpipe.declared._answers.AnswerShape`); None for a format that serves only tools."""

    def check_args(self, tool: PlanTool, args: Any) -> tuple[dict[str, Any], list[str]]:
        """The arguments as the run takes them, and every way they are wrong (located, one line each).

        The default takes any object as it is.
        """
        if not isinstance(args, dict):
            return {}, [f"args: {json_type(args)} is not of type 'object'"]
        return args, []

    def invalid(self, tool: PlanTool, errors: list[str], args: Any) -> ToolResult:
        """The answer to arguments :meth:`check_args` refused (``args``: as the caller gave them)."""
        return ToolResult.error(f"invalid arguments for tool '{tool.name}': " + "; ".join(errors))

    async def check(self, tool: PlanTool, args: Any) -> PlanCall | ToolResult:
        """The call to run, or the answer refusing it; by default :meth:`check_args` (in a thread when
        :attr:`in_thread`), then :meth:`invalid`."""
        if self.in_thread:
            checked, errors = await tool.check_args_async(args)
        else:
            checked, errors = self.check_args(tool, args)
        if errors:
            return self.invalid(tool, errors, args)
        return PlanCall(checked)

    def registry(self, tool: PlanTool, ctx: ToolContext) -> Any:
        """What the run's ``tool`` steps call through: the registry the tool is bound to, or else the one the
        call came in by (the gateway); None when neither is set."""
        return tool.registry if tool.registry is not None else ctx.tools

    def bind(self, tool: PlanTool, registry: Any) -> None:
        """Make the tool's ``tool`` steps call through ``registry`` (the gateway)."""
        tool.registry = registry

    def reaches(self, tool: PlanTool) -> tuple[str, ...]:
        """The gateway tools the plan's steps call (its tool sites): a call needs their scopes too."""
        sites = tool.compiled.tool_sites if tool.compiled is not None else None
        return tuple(name for _, name in sites) if sites else ()

    def unbound(self, tool: PlanTool) -> ToolResult:
        """The answer when there is no registry to call tools through."""
        return ToolResult.error(f"{ErrorCode.TOOL_FAILED}: {tool.name} is not bound to a tool registry")

    def refuse(self, tool: PlanTool, call: PlanCall, registry: Any) -> ToolResult | None:
        """The answer refusing a call before it runs (the tools its steps name that ``registry`` does not
        have), or None to run it. By default nothing is refused here: the scheduler's own checks run first."""
        return None

    async def execute(
        self, tool: PlanTool, call: PlanCall, registry: Any, ctx: ToolContext, on_event: EventFn | None = None
    ) -> dict[str, Any]:
        """Run the call's plan: a run of its own (a fresh pipeline id) on behalf of the same caller and request;
        the calling step (if a step called the tool) stays known, so a run that asks the client keys its steps
        under it. Answers the scheduler's answer (``ok``, ``result``, ``steps``, ``summary``, ...)."""
        plan = call.plan if call.plan is not None else tool.compiled
        assert plan is not None, "a dialect whose tools have no plan gives each call its own"
        return await run_compiled(
            plan, registry, context=ctx.for_step(None, ctx.step), limits=tool.limits, on_event=on_event, args=call.args
        )

    def inline_tools(self, tool: PlanTool) -> tuple[str, ...] | None:
        """The tools a call calls when calling them, in the event loop, is all it does (the lean path then
        runs it inline, as a synchronous Python tool: ``mcpipe.server._fast``); None: it may yield."""
        return None

    @abstractmethod
    async def answer(self, tool: PlanTool, call: PlanCall, answer: dict[str, Any]) -> ToolResult:
        """The tool's answer (the format's answer shape) from the run's answer (``ok``, ``error``,
        ``error_code``, ``result``, ``steps``, ``summary``, ``duration_ms``: :func:`mcpipe.runtime.run_compiled`)."""


class PlanTool:
    """A compiled plan served as a tool (or as a resource or prompt): the one class every format's plans are
    served by, each through its :class:`ToolDialect`.

    A call goes the same way for every format: the dialect checks the arguments (refusing with its own
    answer), the registry is the tool's own or the caller's, the dialect refuses unknown tools, the plan runs
    on the scheduler, and the dialect shapes the answer.

    Args:
        dialect: what the tool's format says (its argument check and answer shape).
        name, description, input_schema: as ``tools/list`` shows them.
        compiled: the plan, compiled once (None for a dialect whose plan is built from each call's arguments).
        limits: the server's limits the plan runs under.

    Attributes:
        name, title, description, input_schema, output_schema, annotations, meta: as ``tools/list`` shows them.
        compiled: the plan, with its tool sites and leaf count.
        limits: the server's limits it runs under.
        registry: what its ``tool`` steps call through (None: the registry the call came in by).
        dialect: the format's :class:`ToolDialect`.
        location: where it was declared (``pipelines.charge``), or None.
        background: a direct call is queued as a background run (the server answers its run id).
        task_support: how it runs as an MCP task (``optional``, ``required``, ``forbidden``; None: it runs
            synchronously only).
        ask_before_task: a task call asks its client synchronously first.
        surface: what it is served as: ``tool``, ``resource``, ``resource_template``, ``prompt`` or ``hidden``.
        uri, uri_template, mime_type, arguments, completions, listing, watch: how a resource or prompt is
            served (:class:`~mcpipe.declared.PipelineConfig`).
    """

    __slots__ = (
        "annotations",
        "arguments",
        "ask_before_task",
        "background",
        "compiled",
        "completions",
        "description",
        "dialect",
        "input_schema",
        "limits",
        "listing",
        "location",
        "meta",
        "mime_type",
        "name",
        "output_schema",
        "registry",
        "surface",
        "task_support",
        "title",
        "uri",
        "uri_template",
        "watch",
    )

    def __init__(
        self,
        dialect: ToolDialect,
        *,
        name: str,
        description: str,
        input_schema: dict[str, Any],
        compiled: CompiledSpec | None,
        limits: Limits,
        output_schema: dict[str, Any] | None = None,
        title: str | None = None,
        annotations: object = None,
        meta: object = None,
        registry: object = None,
        location: str | None = None,
        background: bool = False,
        task_support: str | None = None,
        ask_before_task: bool = False,
        surface: str = "tool",
        uri: str | None = None,
        uri_template: str | None = None,
        mime_type: str | None = None,
        arguments: Sequence[object] | None = None,
        completions: Mapping[str, object] | None = None,
        listing: str | None = None,
        watch: object = None,
    ) -> None:
        self.dialect = dialect
        self.name = name
        self.title = title
        self.description = description
        self.input_schema = input_schema
        self.output_schema = output_schema
        self.annotations = annotations
        self.meta = meta
        self.compiled = compiled
        self.limits = limits
        self.registry = registry
        self.location = location
        self.background = background
        self.task_support = task_support
        self.ask_before_task = ask_before_task
        self.surface = surface
        self.uri = uri
        self.uri_template = uri_template
        self.mime_type = mime_type
        self.arguments = list(arguments or ())
        self.completions = dict(completions or {})
        self.listing = listing
        self.watch = watch

    def __repr__(self) -> str:
        return f"<PlanTool {self.name} ({type(self.dialect).__name__})>"

    @property
    def may_ask(self) -> bool:
        """Whether a call may ask the caller something mid-call (its dialect says)."""
        return self.dialect.may_ask

    @property
    def answer(self) -> Any:
        """How its answer reads served as a resource or prompt (its dialect's ``answer_shape``), as the server's
        resources and prompts read every surface's."""
        return self.dialect.answer_shape

    @property
    def reaches(self) -> tuple[str, ...]:
        """The gateway tools its steps call, checked before a call runs
        (:meth:`mcpipe.gateway.Gateway.needed_scopes`)."""
        return self.dialect.reaches(self)

    def inline_tools(self) -> tuple[str, ...] | None:
        """What the dialect says of the tools a call calls inline (:meth:`ToolDialect.inline_tools`)."""
        return self.dialect.inline_tools(self)

    def bind(self, registry: object) -> None:
        """Make its ``tool`` steps call through ``registry`` (the gateway)."""
        self.dialect.bind(self, registry)

    def check_args(self, args: object) -> tuple[dict[str, Any], list[str]]:
        """The arguments as the run takes them, and every way they are wrong (the dialect's check)."""
        return self.dialect.check_args(self, args)

    async def check_args_async(self, args: object) -> tuple[dict[str, Any], list[str]]:
        """:meth:`check_args`, in a thread when the dialect says so (a check whose deadline must not hold the
        event loop); the server checks a background call's arguments with it before queueing the run."""
        if not self.dialect.in_thread:
            return self.dialect.check_args(self, args)
        return await trio.to_thread.run_sync(self.dialect.check_args, self, args)

    async def run(
        self, args: Mapping[str, object], ctx: ToolContext | None = None, *, on_event: EventFn | None = None
    ) -> dict[str, Any]:
        """Run the plan with ``args`` as they are (unchecked), as the dialect runs it; answers the scheduler's
        answer. Events go to ``on_event`` (``step_started``, ``step_finished``, and the dialect's own)."""
        base = ctx if ctx is not None else ToolContext()
        registry = self.dialect.registry(self, base)
        return await self.dialect.execute(self, PlanCall(dict(args)), registry, base, on_event)

    async def call(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Check the arguments, refuse unknown tools, run the plan and answer in the dialect's shape (never
        raises for a bad call)."""
        dialect = self.dialect
        checked = await dialect.check(self, args)
        if isinstance(checked, ToolResult):
            return checked
        registry = dialect.registry(self, ctx)
        if registry is None:
            return dialect.unbound(self)
        refused = dialect.refuse(self, checked, registry)
        if refused is not None:
            return refused
        if dialect.reports_progress and ctx.has_progress:
            answer = await self._run_with_progress(checked, registry, ctx)
        else:
            answer = await dialect.execute(self, checked, registry, ctx)
        return await dialect.answer(self, checked, answer)

    async def _run_with_progress(self, call: PlanCall, registry: object, ctx: ToolContext) -> dict[str, Any]:
        """Run, turning finished steps and tool calls into progress notifications (strictly increasing: the
        finished steps, plus thousandths for the tool calls of the running step). Events arrive synchronously
        and must not block, so one task sends them, in order."""
        send, recv = trio.open_memory_channel[dict[str, Any]](math.inf)
        done, last, total = 0.0, -1.0, None

        async def pump() -> None:
            nonlocal done, last, total
            async for event in recv:
                kind = event["type"]
                if kind == "step_finished":
                    done, total = float(event["completed"]), event["total"]
                    status = "ok" if event["ok"] else event["error_code"]
                    value, message = done, f"step {event['id']} finished ({status})"
                elif kind == "tool_call_finished":
                    value = min(last + 0.001, done + 0.999)
                    message = f"tool {event['tool']} called ({'ok' if event['ok'] else 'failed'})"
                else:
                    continue
                if value > last:
                    last = value
                    await ctx.report_progress(round(value, 3), total, message)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump)
            try:
                return await self.dialect.execute(self, call, registry, ctx, send.send_nowait)
            finally:
                send.close()
