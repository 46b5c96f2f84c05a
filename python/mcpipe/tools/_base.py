"""What a tool is, to mcpipe: a name, schemas, and an async ``call(args, ctx) -> ToolResult``.

Content blocks are kept as plain JSON-ready dicts in MCP's shape (``{"type": "text", "text": ...}``), so
the hot path never builds SDK models; the server converts at its edge.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["PURE", "LogFn", "ProgressFn", "Tool", "ToolContext", "ToolResult"]

ProgressFn = Callable[[float, "float | None", "str | None"], Awaitable[None]]


class LogFn(Protocol):
    """An async ``(level, data, logger=None)`` sink for log messages to the caller (``logger`` is the name of
    the logger that wrote it, when it has one: a downstream server's, forwarded)."""

    def __call__(self, level: str, data: Any, /, logger: str | None = None) -> Awaitable[None]: ...


_log = logging.getLogger("mcpipe.tools")

PURE: dict[str, Any] = {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}
"""MCP tool annotations of a tool that only computes from its arguments (a tool's optional ``annotations``
attribute is listed as its ``annotations``; absent hints mean what the MCP spec says: may write, may
destroy, not idempotent, open world)."""


@dataclass(slots=True)
class ToolResult:
    """The result of one tool call, MCP-shaped.

    Attributes:
        content: MCP content blocks as dicts (``{"type": "text", "text": "..."}``, image, audio, resource).
        structured: the tool's ``structuredContent`` (any JSON value), or None.
        is_error: True when the tool reports a failure it handled (``isError`` in MCP).
    """

    content: list[dict[str, Any]] = field(default_factory=list)
    structured: Any = None
    is_error: bool = False

    @classmethod
    def text(cls, text: str, *, is_error: bool = False) -> ToolResult:
        """A result holding one text block."""
        return cls([{"type": "text", "text": text}], None, is_error)

    @classmethod
    def error(cls, message: str) -> ToolResult:
        """A handled failure: one text block and ``is_error`` set."""
        return cls([{"type": "text", "text": message}], None, True)

    def joined_text(self) -> str:
        """The concatenated text of the text blocks (``""`` when there are none)."""
        return "".join(b.get("text", "") for b in self.content if b.get("type") == "text")


async def _no_progress(progress: float, total: float | None, message: str | None) -> None:
    return None


async def _no_log(level: str, data: Any, /, logger: str | None = None) -> None:
    _log.log(logging.getLevelName(level.upper()) if isinstance(level, str) else logging.INFO, "%s", data)


@dataclass(slots=True)
class ToolContext:
    """What a tool call knows about the request it serves.

    Attributes:
        request_id: the MCP request id (or a generated one), as a string.
        client: ``{"name": ..., "version": ...}`` of the calling client.
        principal: who is calling (from auth), or None.
        pipeline: the id of the ``mcp_pipe``/declared-pipeline call this call belongs to, or None.
        step: the id of the pipeline step making this call, or None.
        progress: async ``(progress, total, message)`` sink for progress notifications.
        log: async ``(level, data)`` sink for log notifications to the caller.
        extras: transport-specific objects (the server session, for instance) for tools that need them.
        progress_token: the caller's progress token, or None when it asked for no progress.
    """

    request_id: str | None = None
    client: dict[str, Any] = field(default_factory=dict)
    principal: str | None = None
    pipeline: str | None = None
    step: str | None = None
    progress: ProgressFn = _no_progress
    log: LogFn = _no_log
    extras: dict[str, Any] = field(default_factory=dict)
    progress_token: str | int | None = None

    async def report_progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        """Send a progress notification to the caller (a no-op when the caller asked for none)."""
        await self.progress(progress, total, message)

    async def send_log(self, level: str, data: Any, logger: str | None = None) -> None:
        """Send a log message (``notifications/message``) to the caller, naming its ``logger`` when given."""
        if logger is None:
            await self.log(level, data)
        else:
            await self.log(level, data, logger=logger)

    def facts(self) -> dict[str, Any]:
        """The request facts pipelines see as their ``context`` root."""
        return {
            "request_id": self.request_id,
            "client": {"name": self.client.get("name"), "version": self.client.get("version")},
            "principal": self.principal,
        }

    def for_step(self, pipeline: str | None, step: str | None) -> ToolContext:
        """A copy for a call made by pipeline step ``step`` (same request, same sinks)."""
        return ToolContext(
            self.request_id,
            self.client,
            self.principal,
            pipeline,
            step,
            self.progress,
            self.log,
            self.extras,
            self.progress_token,
        )


@runtime_checkable
class Tool(Protocol):
    """Anything callable as a tool. ``input_schema``/``output_schema`` are JSON Schema dicts."""

    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None

    async def call(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult: ...
