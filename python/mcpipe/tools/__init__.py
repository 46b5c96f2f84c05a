"""Tools: what pipelines call: Python functions and declared backends (downstream servers: ``mcpipe.downstream``)."""

from mcpipe.tools._base import PURE, Era, LogFn, ProgressFn, Request, Tool, ToolCaller, ToolContext, ToolResult
from mcpipe.tools._identity import Identity, TrustLevel
from mcpipe.tools._registry import FunctionTool, ToolRegistry, UnknownToolError

__all__ = [
    "PURE",
    "Era",
    "FunctionTool",
    "Identity",
    "LogFn",
    "ProgressFn",
    "Request",
    "Tool",
    "ToolCaller",
    "ToolContext",
    "ToolRegistry",
    "ToolResult",
    "TrustLevel",
    "UnknownToolError",
]
