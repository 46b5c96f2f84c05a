"""The ``tool`` step kind: call a tool the server knows, through the run's tool registry (the gateway)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from mcpipe._util import PIPE_TOOL
from mcpipe.errors import ErrorCode, MCPipeError, UnknownToolError
from mcpipe.kinds._base import Build, Kind, StepFields
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolCaller, ToolContext, ToolResult

__all__ = ["KIND", "ToolFields", "call_tool", "run_tool", "tool_step"]


class ToolFields(StepFields, tag="tool"):
    """Call a tool the server knows: ``{kind: tool, tool: <name>, args: <template>}``."""

    tool: Annotated[str, msgspec.Meta(min_length=1)]
    args: Any = msgspec.field(default_factory=dict)


def build_tool(b: Build[ToolFields]) -> ToolCaller | None:
    """Check the tool exists; answers the registry it was compiled with, if that can call tools."""
    name = b.raw.get("tool")
    if isinstance(name, str):
        if name == PIPE_TOOL:
            b.problem(f"{b.location}.tool", f"`{PIPE_TOOL}` cannot be called as a tool; use a `pipe` step")
            b.fail()
        if b.tools is not None and name not in b.tools:
            b.problem(f"{b.location}.tool", f"unknown tool '{name}'", ErrorCode.UNKNOWN_TOOL)
            b.fail()
    tools = b.tools
    return tools if isinstance(tools, ToolCaller) else None


async def call_tool(registry: ToolCaller | None, name: str, args: Any, ctx: ToolContext) -> StepOutput:
    """Call tool ``name`` through ``registry`` as a step does: an unknown tool fails as ``UNKNOWN_TOOL``, a
    failure mcpipe describes (a server down, its JSON-RPC error) keeps its code and facts, with no traceback."""
    if registry is None:
        raise _no_registry()
    try:
        res = await registry.call(name, args, ctx)
    except MCPipeError as e:
        raise _failure(e) from None
    return StepOutput.from_tool(res)


def _failure(e: MCPipeError) -> StepFailure:
    """How a step fails when its tool call raised ``e``."""
    if isinstance(e, UnknownToolError):
        return StepFailure(str(e), ErrorCode.UNKNOWN_TOOL)
    return StepFailure(f"{type(e).__name__}: {e}", e.code, facts=e.step_fields())


async def run_tool(
    step: Leaf[ToolFields, ToolCaller | None], inputs: dict[str, Any], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Call the tool through the run's registry (``ctx.tools``), else the one the step was compiled with."""
    registry = ctx.tools if ctx.tools is not None else step.built
    return await call_tool(registry, step.fields.tool, inputs["args"], ctx)


async def tool_step(
    step: Leaf[ToolFields, ToolCaller | None], env: Mapping[str, Any], ctx: ToolContext
) -> ToolResult | StepOutput:
    """A step of this kind with no ``when``, ``input_transform`` or deadline, as the scheduler runs it: the
    tool's answer itself, which the scheduler makes the step's result (``mcpipe.results.tool_result``), or
    the failed output ``Leaf.execute`` would answer (``Leaf.failed``). What :meth:`Leaf.execute` and
    :func:`run_tool` do, without their two coroutine frames and the ``StepOutput`` of a success."""
    try:
        ((_, template),) = step.templates  # the kind's one template, `args` (its default when absent)
        args = template.resolve(env)
        registry = ctx.tools if ctx.tools is not None else step.built
        if registry is None:
            raise _no_registry()
        try:
            return await registry.call(step.fields.tool, args, ctx)
        except MCPipeError as e:
            raise _failure(e) from None
    except Exception as e:
        return step.failed(e)


def _no_registry() -> StepFailure:
    return StepFailure("no tool registry to call tools through", ErrorCode.TOOL_FAILED)


def _tool_name(fields: ToolFields) -> str:
    return fields.tool


KIND = Kind("tool", ToolFields, run_tool, templates=("args",), build=build_tool, tool_name=_tool_name)
