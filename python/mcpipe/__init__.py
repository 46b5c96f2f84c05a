"""mcpipe: run whole pipelines of MCP tool calls in one request.

The public surface is small: compile templates and specs, run pipelines against tools, serve them.

Every name is loaded on first use (module ``__getattr__``): ``mcpipe.cli`` is inside this package, so what
this module imports every command pays for; ``attach`` pulls in the MCP SDK, ``run_pipeline`` the scheduler.
"""

import importlib as _importlib
from typing import TYPE_CHECKING

from mcpipe._sdk import defer_sdk_packages as _defer_sdk_packages

_defer_sdk_packages()  # the MCP SDK's package __init__ files run when a name of theirs is read (see _sdk)
del _defer_sdk_packages

if TYPE_CHECKING:
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
    from mcpipe.server import attach
    from mcpipe.tools import Tool, ToolContext, ToolRegistry, ToolResult

del TYPE_CHECKING

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

_HOME = {
    "Template": "mcpipe._template",
    "__version__": "mcpipe._version",
    "CompiledSpec": "mcpipe.compile",
    "Limits": "mcpipe.compile",
    "compile_spec": "mcpipe.compile",
    "ConfigError": "mcpipe.errors",
    "InterpolationError": "mcpipe.errors",
    "MCPipeError": "mcpipe.errors",
    "Problem": "mcpipe.errors",
    "SpecError": "mcpipe.errors",
    "TemplateSyntaxError": "mcpipe.errors",
    "UnknownToolError": "mcpipe.errors",
    "run_pipeline": "mcpipe.runtime",
    "attach": "mcpipe.server",
    "Tool": "mcpipe.tools",
    "ToolContext": "mcpipe.tools",
    "ToolRegistry": "mcpipe.tools",
    "ToolResult": "mcpipe.tools",
}
"""The module each public name lives in."""


def __getattr__(name: str) -> object:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'mcpipe' has no attribute {name!r}")
    value = getattr(_importlib.import_module(home), name)
    globals()[name] = value  # once: later reads find it without this hook
    return value


def __dir__() -> list[str]:
    # The public names and the submodules loaded so far, as before the names were lazy.
    return sorted({*_HOME, *(n for n, v in globals().items() if n.startswith("_") or isinstance(v, type(_importlib)))})
