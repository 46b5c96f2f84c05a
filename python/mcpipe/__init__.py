"""mcpipe: run whole pipelines of MCP tool calls in one request.

The public surface is small: compile templates and specs, run pipelines against tools, serve them.
"""

from mcpipe._template import Template
from mcpipe.compile import CompiledSpec, Limits, compile_spec
from mcpipe.errors import (
    InterpolationError,
    MCPipeError,
    Problem,
    SpecError,
    TemplateSyntaxError,
    UnknownToolError,
)
from mcpipe.runtime import run_pipeline
from mcpipe.tools import Tool, ToolContext, ToolRegistry, ToolResult

__all__ = [
    "CompiledSpec",
    "InterpolationError",
    "Limits",
    "MCPipeError",
    "Problem",
    "SpecError",
    "Template",
    "TemplateSyntaxError",
    "Tool",
    "ToolContext",
    "ToolRegistry",
    "ToolResult",
    "UnknownToolError",
    "compile_spec",
    "run_pipeline",
]
