"""The ``roots_list`` step kind: ask the client for its roots (MCP ``roots/list``)."""

from __future__ import annotations

from collections.abc import Mapping

from mcpipe.kinds._ask import ask_step
from mcpipe.kinds._base import Kind, StepFields
from mcpipe.plan import Leaf
from mcpipe.results import StepOutput
from mcpipe.tools import ToolContext

__all__ = ["KIND", "RootsListFields", "run_roots_list"]


class RootsListFields(StepFields, tag="roots_list"):
    """Ask the client for its roots (MCP roots/list). The output is ``{roots: [{uri, name}]}``."""

    skip_if_unsupported: bool = False


async def run_roots_list(
    step: Leaf[RootsListFields, None], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Ask the client for its roots (``roots/list``); the output is ``{roots: [...]}``."""
    return await ask_step(step, "roots", None, ctx, step.fields.skip_if_unsupported)


KIND = Kind("roots_list", RootsListFields, run_roots_list)
