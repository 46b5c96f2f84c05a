"""Tools: what pipelines call. Python functions, declared backends and downstream MCP servers."""

from mcpipe.tools._base import LogFn, ProgressFn, Tool, ToolContext, ToolResult
from mcpipe.tools._registry import FunctionTool, ToolRegistry, UnknownToolError

__all__ = [
    "FunctionTool",
    "LogFn",
    "ProgressFn",
    "Tool",
    "ToolContext",
    "ToolRegistry",
    "ToolResult",
    "UnknownToolError",
]
