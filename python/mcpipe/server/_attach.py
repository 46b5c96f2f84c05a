"""``attach(server)``: add ``mcp_pipe`` to an existing SDK server, composing the tools it already has.

Works on an ``MCPServer``, on a low-level ``Server`` and on a server of the ``fastmcp`` package (``FastMCP``,
whose low-level server is an SDK ``Server``): the server's own ``tools/list`` and ``tools/call`` handlers are
wrapped, so ``mcp_pipe`` appears in the listing and its steps call the server's tools through the server's own
handler (with the caller's request context), exactly as a direct call would. On a FastMCP server that handler
is FastMCP's: its middleware, its per-tool auth checks and its visibility rules apply to every step's call.

The host may run on Trio (native) or asyncio (the SDK's default: ``app.run()``): on asyncio the pipeline runs
in a Trio guest run on the host's loop and calls the host's tools, progress and log back on asyncio
(``server/_guest.py``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import weakref
from collections.abc import Iterator
from typing import Any, TypeVar

import trio
from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolRequestParams, PaginatedRequestParams
from pydantic import BaseModel

from mcpipe.compile import Limits
from mcpipe.gateway import PIPE_TOOL, AuditLog, Gateway
from mcpipe.server._context import RequestContext
from mcpipe.server._core import _MODERN, PIPE_TOOL_WIRE, PipeRunner, pipe_annotations, pipe_envelope, tool_context
from mcpipe.server._guest import AsyncioHost, run_in_guest
from mcpipe.tools import Tool, ToolContext, ToolResult

__all__ = ["attach"]


def _dump(result: Any) -> dict[str, Any]:
    if isinstance(result, BaseModel):
        return result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dict(result or {})


class _ServerTool:
    """One of the host server's tools, called through the host's own ``tools/call`` handler."""

    __slots__ = ("_handler", "annotations", "description", "input_schema", "name", "output_schema")

    def __init__(self, entry: dict[str, Any], handler: Any) -> None:
        self.name = entry["name"]
        self.description = entry.get("description") or ""
        self.input_schema = entry.get("inputSchema") or {"type": "object"}
        self.output_schema = entry.get("outputSchema")
        self.annotations = entry.get("annotations")
        self._handler = handler

    async def call(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        params = CallToolRequestParams(name=self.name, arguments=args)
        host: AsyncioHost | None = ctx.extras.get(_HOST)
        if host is None:
            result = await self._handler(ctx.sdk_context, params)
        else:
            result = await host.call(self._handler, ctx.sdk_context, params)
        out = _dump(result)
        return ToolResult(out.get("content", []), out.get("structuredContent"), bool(out.get("isError")))


_HOST = "asyncio_host"
"""Where an asyncio host's bridge sits in the ToolContext's extras (absent on a Trio host)."""

_ATTACHED: weakref.WeakSet[Server[Any]] = weakref.WeakSet()
"""The low-level servers ``mcp_pipe`` is attached to (attaching twice is refused)."""


def _on_asyncio(ctx: ToolContext) -> AsyncioHost:
    """Bridge the context's sinks (the host session's progress and log) to the asyncio host."""
    host = AsyncioHost(asyncio.get_running_loop(), contextvars.copy_context())
    progress, log = ctx.progress, ctx.log

    async def to_progress(value: float, total: float | None, message: str | None) -> None:
        await host.call(progress, value, total, message)

    async def to_log(level: str, data: Any, logger: str | None = None) -> None:
        await host.call(functools.partial(log, logger=logger), level, data)

    ctx.progress, ctx.log = to_progress, to_log
    ctx.extras[_HOST] = host
    return host


class _Snapshot:
    def __init__(self, tools: list[_ServerTool]) -> None:
        self.tools = {t.name: t for t in tools}

    def get(self, name: str) -> Tool | None:
        return self.tools.get(name)

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self.tools.values()))


def _low_level(server: Any) -> Server[Any]:
    """The SDK low-level ``Server`` that answers ``server``'s requests.

    Raises:
        ValueError: ``server`` is none of the servers attach knows.
    """
    if isinstance(server, Server):
        return server
    if isinstance(server, MCPServer):
        return server._lowlevel_server
    # A fastmcp.FastMCP (fastmcp 4, on this SDK): its requests are answered by `_mcp_server`, a low-level Server
    # whose handlers run FastMCP's own middleware and auth. Looked up by attribute: fastmcp is not a dependency.
    low = getattr(server, "_mcp_server", None)
    if isinstance(low, Server):
        return low
    kind = f"{type(server).__module__}.{type(server).__qualname__}"
    raise ValueError(f"attach() takes an MCP server (an SDK MCPServer or Server, or a fastmcp.FastMCP), not {kind}")


S = TypeVar("S")


def attach(
    server: S,
    *,
    limits: Limits | None = None,
    audit: AuditLog | None = None,
) -> S:
    """Add ``mcp_pipe`` to ``server``, whose steps may call every tool the server lists.

    Args:
        server: an ``mcp`` SDK ``MCPServer`` or low-level ``Server`` with tools, or a ``fastmcp.FastMCP``
            server (fastmcp 4 and later): its steps' calls then go through FastMCP's own ``tools/call``
            (its middleware and auth apply to each).
        limits: the pipeline limits (default: 50 steps, depth 5, 8 parallel calls).
        audit: where to write one record per call made by a pipeline (and per ``mcp_pipe`` call);
            default: none.

    Returns:
        The same server, for chaining.

    Raises:
        ValueError: ``server`` is not a server attach knows, has no ``tools/list`` and ``tools/call`` handlers,
            or already has ``mcp_pipe``.
    """
    low = _low_level(server)
    list_entry = low.get_request_handler("tools/list")
    call_entry = low.get_request_handler("tools/call")
    if list_entry is None or call_entry is None:
        raise ValueError("attach() needs a server with tools (tools/list and tools/call handlers)")
    if low in _ATTACHED:
        raise ValueError("mcp_pipe is already attached to this server")
    list_tools, call_tool = list_entry.handler, call_entry.handler
    audit = audit or AuditLog(None)

    async def own_tools(ctx: RequestContext) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        cursor = None
        for _ in range(100):
            page = _dump(await list_tools(ctx, PaginatedRequestParams(cursor=cursor)))
            entries += page.get("tools", [])
            cursor = page.get("nextCursor")
            if not cursor:
                break
        return [e for e in entries if e.get("name") != PIPE_TOOL]

    async def on_list_tools(ctx: RequestContext, params: PaginatedRequestParams | None) -> Any:
        out = _dump(await list_tools(ctx, params))
        if params is None or params.cursor is None:
            pipe = {**PIPE_TOOL_WIRE, "annotations": pipe_annotations(await own_tools(ctx))}
            out["tools"] = [pipe, *out.get("tools", [])]
        return out

    async def on_call_tool(ctx: RequestContext, params: CallToolRequestParams) -> Any:
        if params.name != PIPE_TOOL:
            return await call_tool(ctx, params)
        gateway = Gateway([_Snapshot([_ServerTool(e, call_tool) for e in await own_tools(ctx)])], audit=audit)
        runner, tctx = PipeRunner(gateway, limits), tool_context(ctx)
        if trio.lowlevel.in_trio_task():
            answer = await runner.run(params.arguments or {}, tctx)
        else:  # an asyncio host: the pipeline runs in a Trio guest run on its loop
            _on_asyncio(tctx)
            answer = await run_in_guest(runner.run, params.arguments or {}, tctx)
        out = pipe_envelope(answer)
        if ctx.protocol_version in _MODERN:
            out["resultType"] = "complete"
        return out

    low.add_request_handler("tools/list", list_entry.params_type, on_list_tools)  # type: ignore[arg-type]
    low.add_request_handler("tools/call", call_entry.params_type, on_call_tool)  # type: ignore[arg-type]
    lookup = low.get_tool_input_schema
    if lookup is not None:
        low.get_tool_input_schema = lambda name: PIPE_TOOL_WIRE["inputSchema"] if name == PIPE_TOOL else lookup(name)
    _ATTACHED.add(low)
    return server
