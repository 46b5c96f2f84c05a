"""Tools the console's browser tests serve from a real ``mcpipe serve`` (``python_tools = ["console_tools:tools"]``):
a branch that fails, an output holding markup, a step held until the test writes to a FIFO, a step that runs until
it is cancelled."""

from __future__ import annotations

from pathlib import Path

import trio

from mcpipe.tools import ToolRegistry, ToolResult

tools = ToolRegistry()


@tools.tool
def fail_now(why: str = "this branch fails") -> ToolResult:
    """Answer an error result."""
    return ToolResult.error(f"E_BRANCH: {why}")


@tools.tool
def markup() -> str:
    """Answer text that is markup a page must show, not run."""
    return '<script>window.__pwned = 1</script><img src="x" onerror="window.__pwned = 2"><b>bold?</b>'


@tools.tool
async def held(fifo: str) -> str:
    """Wait until the test writes a line to the FIFO ``fifo`` (opening it blocks until the test does)."""
    line = await trio.to_thread.run_sync(lambda: Path(fifo).read_text(), abandon_on_cancel=True)
    return f"released: {line.strip()}"


@tools.tool
async def hang() -> str:
    """Run until cancelled."""
    await trio.sleep_forever()
    return "never"
