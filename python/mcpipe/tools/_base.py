"""What a tool is, to mcpipe: a name, schemas, and an async ``call(args, ctx) -> ToolResult``.

Content blocks are kept as plain JSON-ready dicts in MCP's shape (``{"type": "text", "text": ...}``), so
the hot path never builds SDK models; the server converts at its edge.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from mcpipe._util import RateLimit, log_safe
from mcpipe.tools._identity import Identity

__all__ = [
    "PURE",
    "Era",
    "LogFn",
    "ProgressFn",
    "Request",
    "StepRecord",
    "Tool",
    "ToolCaller",
    "ToolContext",
    "ToolResult",
]

Era = Literal["2025-11-25", "2026-07-28"]
"""The protocol era of a request: 2025-11-25 (a live session the server can send requests on) or
2026-07-28 (stateless; asking the client suspends the call)."""

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
        meta: the result's ``_meta``, or None.
        terse: leave ``isError`` out when it is false (as some systems answer; MCP's default is false).
        any_json: the structured value is sent as it is where the protocol lets it be any JSON value
            (2026-07-28); elsewhere a value that is not an object is wrapped as ``{"result": value}``.
    """

    content: list[dict[str, Any]] = field(default_factory=list)
    structured: Any = None
    is_error: bool = False
    meta: dict[str, Any] | None = None
    terse: bool = False
    any_json: bool = False

    @classmethod
    def text(cls, text: str, *, is_error: bool = False) -> ToolResult:
        """A result holding one text block."""
        return cls([{"type": "text", "text": text}], None, is_error)

    @classmethod
    def error(cls, message: str) -> ToolResult:
        """A handled failure: one text block and ``is_error`` set."""
        return cls([{"type": "text", "text": message}], None, True)

    def wire(self, *, any_json: bool = False) -> dict[str, Any]:
        """A ``CallToolResult`` wire dict (non-object structured values wrapped as ``result``, but where
        ``any_json``, the request's protocol allowing any JSON value there, for a result that says so)."""
        out: dict[str, Any] = {"content": self.content}
        if self.is_error or not self.terse:
            out["isError"] = self.is_error
        s = self.structured
        if s is not None:
            out["structuredContent"] = s if isinstance(s, dict) or (any_json and self.any_json) else {"result": s}
        if self.meta:
            out["_meta"] = self.meta
        return out

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> ToolResult:
        """The result a ``CallToolResult`` wire dict holds."""
        return cls(list(wire.get("content") or []), wire.get("structuredContent"), bool(wire.get("isError", False)))

    def joined_text(self) -> str:
        """The concatenated text of the text blocks (``""`` when there are none)."""
        return "".join(b.get("text", "") for b in self.content if b.get("type") == "text")


async def _no_progress(progress: float, total: float | None, message: str | None) -> None:
    return None


_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "notice": logging.INFO}
_NO_CALLER_LOG = RateLimit(rate=20.0, burst=100.0)


async def _no_log(level: str, data: object, /, logger: str | None = None) -> None:
    """A call with nobody to send its log messages to (a background run, a call from ``/workflow``): they go to
    mcpipe's log, one line each, escaped and cut (``log_safe``), at most at WARNING whatever level they name,
    and at most 20 a second (a burst of 100); the dropped ones are counted on the next line."""
    if not _NO_CALLER_LOG.take():
        return
    dropped = _NO_CALLER_LOG.dropped()
    _log.log(
        _LEVELS.get(level, logging.WARNING) if isinstance(level, str) else logging.WARNING,
        "log message%s%s: %s",
        f" of {log_safe(logger, 128)}" if logger else "",
        f" ({dropped} more dropped: more than 20 a second)" if dropped else "",
        log_safe(data),
    )


class StepRecord(Protocol):
    """What the scheduler needs of a call's interaction (:class:`mcpipe.interaction.Interaction`): the
    record of finished steps, so a call resumed on 2026-07-28 does not run them again."""

    @property
    def resumable(self) -> bool:
        """Whether finished steps are recorded."""
        ...

    def nested(self, ctx: ToolContext) -> ToolContext:
        """The context of a pipeline run inside step ``ctx.step``, its steps recorded under it."""
        ...

    def get(self, path: str) -> dict[str, Any] | None:
        """The recorded result of the step at ``path``."""
        ...

    def put(self, path: str, result: dict[str, Any]) -> None:
        """Record a finished step."""
        ...

    @property
    def durable(self) -> bool:
        """Whether the record outlives the process (a queued run's): the scheduler then awaits
        :meth:`starting` before every leaf step, so what finished is saved before anything else runs."""
        ...

    async def starting(self, path: str, kind: str, detail: dict[str, Any] | None = None) -> None:
        """The step at ``path``, of kind ``kind`` (``tool`` for a tool call), is about to run (called only
        when :attr:`durable`); ``detail``: what its ``step_started`` event may say of it (``args``, a preview
        of its arguments, and their ``args_bytes``; ``via``, the locations of the graph arcs it was reached
        by)."""
        ...

    async def keep(self, path: str, value: dict[str, Any]) -> None:
        """Record what a side effect inside a step gave (a model's tool call, an API request), so a resumed
        or taken-over run answers it from the record instead of doing it again; a durable record saves it
        now. Not a step: no step event is written for it."""
        ...


@runtime_checkable
class ToolCaller(Protocol):
    """What pipelines call tools through (a :class:`~mcpipe.tools.ToolRegistry`, the server's gateway)."""

    def __contains__(self, name: object) -> bool: ...

    async def call(self, name: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult: ...


@dataclass(slots=True)
class Request:
    """What the transport knows about one inbound request, typed; shared by every call the request makes
    (a pipeline's steps get their own :class:`ToolContext` around the same ``Request``).

    Attributes:
        wants_progress: the caller listens to progress (a token on the wire, or an in-memory caller's
            progress callback), as the server found it.
        era: the request's protocol era, when served over MCP.
        interaction: the call's :class:`mcpipe.interaction.Interaction` (asking the client), if any.
        sdk_context: the MCP SDK's request context, when served by the SDK (for tools that need it).
        identity: who is calling, as the HTTP front resolved it (``docs/access.md``), or None.
        client_addresses: the caller's address as each ``ip_allowlist`` gate reads it, by the header it reads
            (None: the TCP peer); empty when the request came over no HTTP front.
        session_id: the caller's 2025-11-25 session (``Mcp-Session-Id``), or None (no session: stdio, in
            memory, a 2026-07-28 request); content a pipeline stores is bound to it.
        transport: ``http`` for a request of the HTTP front, else ``stdio`` (stdio, in memory).
    """

    wants_progress: bool = False
    era: Era | None = None
    interaction: StepRecord | None = None
    sdk_context: Any = None
    identity: Identity | None = None
    client_addresses: dict[str | None, str | None] = field(default_factory=dict)
    session_id: str | None = None
    transport: Literal["http", "stdio"] = "stdio"


@dataclass(slots=True)
class ToolContext:
    """What a tool call knows about the request it serves: the typed request context.

    Attributes:
        request_id: the MCP request id (or a generated one), as a string.
        client: ``{"name": ..., "version": ...}`` of the calling client.
        principal: who is calling (from auth), or None.
        pipeline: the id of the ``mcp_pipe``/declared-pipeline call this call belongs to, or None.
        step: the id of the pipeline step making this call, or None.
        progress: async ``(progress, total, message)`` sink for progress notifications.
        log: async ``(level, data)`` sink for log notifications to the caller.
        extras: free for tools and their hosts (mcpipe itself keeps nothing there; its own facts are the
            typed fields below).
        progress_token: the caller's progress token, or None when it asked for no progress.
        request: the request's typed facts (``wants_progress``, ``era``, ``interaction``, ``sdk_context``,
            also readable and settable on the context itself).
        traceparent: the caller's W3C trace context (``_meta.traceparent``), for the call's span.
        tools: what this call's pipeline steps call tools through (the server's gateway), if known.
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
    request: Request = field(default_factory=Request)
    tools: ToolCaller | None = None
    traceparent: str | None = None

    @property
    def wants_progress(self) -> bool:
        """The caller listens to progress (``request.wants_progress``)."""
        return self.request.wants_progress

    @wants_progress.setter
    def wants_progress(self, value: bool) -> None:
        self.request.wants_progress = value

    @property
    def era(self) -> Era | None:
        """The request's protocol era (``request.era``)."""
        return self.request.era

    @era.setter
    def era(self, value: Era | None) -> None:
        self.request.era = value

    @property
    def interaction(self) -> StepRecord | None:
        """The call's interaction with its client (``request.interaction``)."""
        return self.request.interaction

    @interaction.setter
    def interaction(self, value: StepRecord | None) -> None:
        self.request.interaction = value

    @property
    def sdk_context(self) -> Any:
        """The MCP SDK's request context (``request.sdk_context``)."""
        return self.request.sdk_context

    @sdk_context.setter
    def sdk_context(self, value: object) -> None:
        self.request.sdk_context = value

    @property
    def has_progress(self) -> bool:
        """Did the call carry a progress token (or an in-memory progress callback)?"""
        if self.progress_token is not None or self.wants_progress:
            return True
        meta = getattr(self.sdk_context, "meta", None)
        return isinstance(meta, Mapping) and meta.get("progressToken", meta.get("progress_token")) is not None

    async def report_progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        """Send a progress notification to the caller (a no-op when the caller asked for none)."""
        await self.progress(progress, total, message)

    async def send_log(self, level: str, data: object, logger: str | None = None) -> None:
        """Send a log message (``notifications/message``) to the caller, naming its ``logger`` when given."""
        if logger is None:
            await self.log(level, data)
        else:
            await self.log(level, data, logger=logger)

    @property
    def identity(self) -> Identity | None:
        """Who is calling (``request.identity``), when the HTTP front resolved it."""
        return self.request.identity

    def facts(self) -> dict[str, Any]:
        """The request facts pipelines see as their ``context`` root (``identity`` when one was resolved)."""
        out: dict[str, Any] = {
            "request_id": self.request_id,
            "client": {"name": self.client.get("name"), "version": self.client.get("version")},
            "principal": self.principal,
            "session_id": self.request.session_id,
            "transport": self.request.transport,
        }
        identity = self.request.identity
        if identity is not None:
            out["identity"] = identity.facts()
        return out

    def for_step(self, pipeline: str | None, step: str | None, tools: ToolCaller | None = None) -> ToolContext:
        """A copy for a call made by pipeline step ``step`` (same request, same sinks), calling tools
        through ``tools`` (default: the same registry)."""
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
            self.request,
            self.tools if tools is None else tools,
        )


@runtime_checkable
class Tool(Protocol):
    """Anything callable as a tool. ``input_schema``/``output_schema`` are JSON Schema dicts."""

    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None

    async def call(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult: ...
