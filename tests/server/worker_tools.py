"""Tools for ``mcpipe serve --workers`` tests: which process answered, and a call that stays in flight."""

from __future__ import annotations

import os

import trio

from mcpipe.tools import ToolContext, ToolRegistry

tools = ToolRegistry()


@tools.tool
def whoami() -> dict[str, int]:
    """The pid of the worker that served the call."""
    return {"pid": os.getpid()}


@tools.tool
async def nap(seconds: float, ctx: ToolContext) -> dict[str, int]:
    """Say it started (progress), sleep (a call in flight), then answer the worker's pid."""
    await ctx.report_progress(0, 1, "started")
    await trio.sleep(seconds)
    return {"pid": os.getpid()}
