"""Tools: what pipelines call. Python functions, declared backends and downstream MCP servers."""

from mcpipe.tools._base import Era, LogFn, ProgressFn, Request, Tool, ToolCaller, ToolContext, ToolResult
from mcpipe.tools._registry import FunctionTool, ToolRegistry, UnknownToolError

__all__ = [
    "Era",
    "FunctionTool",
    "LogFn",
    "ProgressFn",
    "Request",
    "Tool",
    "ToolCaller",
    "ToolContext",
    "ToolRegistry",
    "ToolResult",
    "UnknownToolError",
]
