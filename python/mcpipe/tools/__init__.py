"""Tools: what pipelines call. Python functions, declared backends and downstream MCP servers."""

from mcpipe.tools._base import LogFn, ProgressFn, Tool, ToolContext, ToolResult

__all__ = ["LogFn", "ProgressFn", "Tool", "ToolContext", "ToolResult"]
