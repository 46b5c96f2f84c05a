"""Running pipelines: the Trio scheduler behind ``mcp_pipe`` and declared pipelines."""

from mcpipe.runtime._scheduler import (
    PROCESS_CONCURRENCY,
    EventFn,
    check_pipeline,
    inline_tool_calls,
    process_limiter,
    run_compiled,
    run_pipeline,
)

__all__ = [
    "PROCESS_CONCURRENCY",
    "EventFn",
    "check_pipeline",
    "inline_tool_calls",
    "process_limiter",
    "run_compiled",
    "run_pipeline",
]
