"""Tools: what pipelines call. Python functions, declared backends and downstream MCP servers."""

from mcpipe.tools._base import PURE, LogFn, ProgressFn, Tool, ToolContext, ToolResult
from mcpipe.tools._registry import FunctionTool, ToolRegistry, UnknownToolError

__all__ = [
    "PURE",
    "FunctionTool",
    "LogFn",
    "ProgressFn",
    "Tool",
    "ToolContext",
    "ToolRegistry",
    "ToolResult",
    "UnknownToolError",
]
