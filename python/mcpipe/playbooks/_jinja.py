"""The playbooks' Jinja templates, which live in :mod:`mcpipe.expr._jinja` (an expression language a caller
reaches, bounded like CEL and JSONata); this module re-exports them under their old names."""

from mcpipe.expr._jinja import (
    GLOBALS,
    MAX_BUILT,
    MAX_RENDER_BYTES,
    MAX_RENDER_DEPTH,
    ROOTS,
    Compiled,
    PromptSource,
    RenderError,
    compile_value,
    environment,
    references,
    render,
    render_async,
)

__all__ = [
    "GLOBALS",
    "MAX_BUILT",
    "MAX_RENDER_BYTES",
    "MAX_RENDER_DEPTH",
    "ROOTS",
    "Compiled",
    "PromptSource",
    "RenderError",
    "compile_value",
    "environment",
    "references",
    "render",
    "render_async",
]
