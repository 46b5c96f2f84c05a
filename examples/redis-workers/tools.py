"""The example's one tool: which worker process answered (its pid)."""

import os

from mcpipe.tools import ToolRegistry

tools = ToolRegistry()


@tools.tool
def worker() -> dict[str, int]:
    """The pid of the worker process that served the call."""
    return {"pid": os.getpid()}
