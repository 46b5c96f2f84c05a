"""The tools the server tests call: slow, failing, raising and hanging ones (``test_tools``)."""

from __future__ import annotations

import trio

from mcpipe.tools import ToolContext, ToolRegistry, ToolResult

test_tools = ToolRegistry()


@test_tools.tool
async def slow(seconds: float, ctx: ToolContext) -> str:
    """Sleep, then answer (for calls in flight)."""
    await trio.sleep(seconds)
    return "done"


@test_tools.tool
def boom() -> str:
    """Raise."""
    raise RuntimeError("kaput")


@test_tools.tool
def fail() -> ToolResult:
    """Answer a tool error."""
    return ToolResult.error("it did not work")


@test_tools.tool
async def hang(ctx: ToolContext) -> str:
    """Report that it started, then run for a minute (a call in flight)."""
    await ctx.report_progress(0.5, 1, "started")
    await trio.sleep(60)
    return "finished"


BLOCKED: dict[str, trio.Event] = {}
"""Events the ``block`` tool sets when a call with that tag has started (create them in the test)."""


@test_tools.tool
async def block(tag: str) -> str:
    """Say (through ``BLOCKED[tag]``) that the call started, then run for a minute."""
    BLOCKED.setdefault(tag, trio.Event()).set()
    await trio.sleep(60)
    return "unblocked"
