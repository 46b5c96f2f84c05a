"""mcpipe: run whole pipelines of MCP tool calls in one request.

The public surface is small: compile templates and specs, run pipelines against tools, serve them.
"""

from mcpipe._template import Template
from mcpipe._version import __version__ as __version__
from mcpipe.compile import CompiledSpec, Limits, compile_spec
from mcpipe.errors import (
    ConfigError,
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
    "ConfigError",
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
    "attach",
    "compile_spec",
    "run_pipeline",
]


def __getattr__(name: str) -> object:
    # `attach` pulls in the MCP SDK (about a second to import); load it only when asked for, so
    # `import mcpipe` and `mcpipe run` stay fast.
    if name == "attach":
        from mcpipe.server import attach

        return attach
    raise AttributeError(f"module 'mcpipe' has no attribute {name!r}")
