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
from mcpipe.tools import ToolCaller, ToolContext

__all__ = ["KIND", "ToolFields", "call_tool", "run_tool"]


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
        raise StepFailure("no tool registry to call tools through", ErrorCode.TOOL_FAILED)
    try:
        res = await registry.call(name, args, ctx)
    except UnknownToolError as e:
        raise StepFailure(str(e), ErrorCode.UNKNOWN_TOOL) from None
    except MCPipeError as e:
        raise StepFailure(f"{type(e).__name__}: {e}", e.code, facts=e.step_fields()) from None
    return StepOutput.from_tool(res)


async def run_tool(
    step: Leaf[ToolFields, ToolCaller | None], inputs: dict[str, Any], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Call the tool through the run's registry (``ctx.tools``), else the one the step was compiled with."""
    registry = ctx.tools if ctx.tools is not None else step.built
    return await call_tool(registry, step.fields.tool, inputs["args"], ctx)


def _tool_name(fields: ToolFields) -> str:
    return fields.tool


KIND = Kind("tool", ToolFields, run_tool, templates=("args",), build=build_tool, tool_name=_tool_name)
