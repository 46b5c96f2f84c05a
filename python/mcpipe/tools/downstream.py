"""Tools of other MCP servers: one long-lived actor per server owns its client session.

:class:`DownstreamServer` is the actor. Started with ``await nursery.start(server.run)``, it connects
(at start, or on first use when ``connect = "lazy"``), lists the server's tools, and keeps the session
until the connection ends; then it marks the server down and reconnects with exponential backoff. While
the server is down, a call fails at once with a clear :class:`~mcpipe.gateway.CallError` naming the
server and the last failure, never hanging.

Calls run in the caller's task on the actor's session (the SDK's session multiplexes requests), so a
cancelled caller cancels its downstream request in the same moment: the SDK sends
``notifications/cancelled`` (or closes the HTTP response stream) as the cancellation unwinds. Progress
notifications of a downstream call are forwarded to the caller's progress sink.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
import trio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INVALID_REQUEST, Implementation

from mcpipe import telemetry
from mcpipe.config import McpServerConfig, glob_matcher
from mcpipe.gateway import CallError, is_cancellation
from mcpipe.tools._base import Tool, ToolContext, ToolResult

__all__ = ["DownstreamServer", "DownstreamTool", "Downstreams"]

_log = logging.getLogger("mcpipe.downstream")

BACKOFF_FIRST = 0.2
BACKOFF_MAX = 10.0
HEALTHY_AFTER = 5.0
"""A connection that lived this long resets the backoff; one that dies sooner doubles it."""

_CLIENT_INFO = Implementation(name="mcpipe-gateway", version="1")

_SESSION_GONE = frozenset({"Session not found", "Session terminated"})
"""How a 2025-11-25 HTTP server (and the SDK client, for a bare 404) says it does not know the session."""


class _SessionLost(Exception):
    """The server refused a call because it no longer knows the session (the call did not run)."""


_TRANSPORT_ERRORS = (
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    httpx2.TransportError,
    OSError,
)


@dataclass(slots=True)
class DownstreamTool:
    """One tool of a downstream server, served under ``name`` (its remote name with the server's prefix)."""

    name: str
    remote_name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    server: DownstreamServer

    async def call(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await self.server.call(self.remote_name, args, ctx)


class _WatchedRead:
    """A read stream that sets ``closed`` when the transport reaches its end (the server went away)."""

    def __init__(self, inner: Any, closed: trio.Event) -> None:
        self._inner = inner
        self._closed = closed

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._closed.set()
            raise

    def __aiter__(self) -> _WatchedRead:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _WatchedRead:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@asynccontextmanager
async def _http_transport(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    async with (
        create_mcp_http_client(headers=headers or None) as http,
        streamable_http_client(url, http_client=http) as s,
    ):
        yield s


@asynccontextmanager
async def _watched(transport: Any, closed: trio.Event) -> AsyncIterator[Any]:
    async with transport as (read, write):
        yield _WatchedRead(read, closed), write


class DownstreamServer:
    """The actor owning one downstream server's session.

    Args:
        name: the server's name in ``mcpServers``.
        config: its config.
        errlog: where a stdio server's stderr goes.
    """

    def __init__(self, name: str, config: McpServerConfig, *, errlog: Any = None) -> None:
        self.name = name
        self.config = config
        self.prefix = name if config.prefix is None else config.prefix
        self.tools: dict[str, DownstreamTool] = {}
        self.state = "idle"
        self.last_error: str | None = None
        self.connections = 0
        self._client: Client | None = None
        self._closed: trio.Event | None = None
        self._wanted = trio.Event()
        self._attempted = trio.Event()
        self._connected = trio.Event()
        self._errlog = errlog
        self._include = glob_matcher(config.include) if config.include is not None else None
        self._exclude = glob_matcher(config.exclude) if config.exclude else None
        self._timeout = config.timeout_ms / 1000 if config.timeout_ms else None

    # -- naming ------------------------------------------------------------------------------------

    def exposed(self, remote: str) -> str:
        return f"{self.prefix}.{remote}" if self.prefix else remote

    def _keeps(self, remote: str) -> bool:
        if self._include is not None and not self._include(remote):
            return False
        return not (self._exclude is not None and self._exclude(remote))

    # -- lifecycle -----------------------------------------------------------------------------------

    def _transport(self, closed: trio.Event) -> Any:
        c = self.config
        if c.command is not None:
            params = StdioServerParameters(command=c.command, args=c.args, env=c.env or None, cwd=c.cwd)
            inner = stdio_client(params, errlog=self._errlog or sys.stderr)
        else:
            inner = _http_transport(c.url or "", c.headers)
        return _watched(inner, closed)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the session for as long as the server runs: connect, serve, reconnect with backoff.

        Reports started at once for a lazy server, after the first connection attempt otherwise.
        """
        lazy = self.config.connect == "lazy"
        if lazy:
            task_status.started()
            await self._wanted.wait()
        backoff = BACKOFF_FIRST
        started = not lazy
        while True:
            t0 = trio.current_time()
            await self._session_once(task_status if started else None)
            started = False
            lived = trio.current_time() - t0
            backoff = BACKOFF_FIRST if lived >= HEALTHY_AFTER else min(backoff * 2, BACKOFF_MAX)
            _log.info("downstream %s is down (%s); reconnecting in %.1fs", self.name, self.last_error, backoff)
            await trio.sleep(backoff)

    async def _session_once(self, task_status: trio.TaskStatus[None] | None) -> None:
        closed = trio.Event()
        self.state = "connecting"
        try:
            # One scope around the whole session: its deadline bounds connecting and listing, and is lifted
            # once the server is up (the client's nurseries live inside it, so it must enclose them).
            with trio.CancelScope(deadline=trio.current_time() + self.config.connect_timeout_ms / 1000) as scope:
                mode = {"auto": "auto", "2025-11-25": "legacy"}.get(self.config.protocol, self.config.protocol)
                async with Client(self._transport(closed), client_info=_CLIENT_INFO, mode=mode) as client:
                    await self._list_tools(client)
                    scope.deadline = math.inf
                    self._up(client, closed)
                    if task_status is not None:
                        task_status.started()
                        task_status = None
                    try:
                        await closed.wait()
                    finally:
                        self._client = None
            if scope.cancelled_caught:
                raise trio.TooSlowError
            self._down(ConnectionError("the connection ended") if self.last_error is None else None)
        except BaseException as exc:  # connect failures come in many kinds (OSError, MCPError, groups)
            if is_cancellation(exc) or isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            self._down(exc)
        finally:
            self._client = None
            if task_status is not None:
                task_status.started()

    def _up(self, client: Client, closed: trio.Event) -> None:
        self._client, self._closed = client, closed
        self.state = "up"
        self.last_error = None
        self.connections += 1
        self._connected.set()
        self._attempted.set()
        _log.info("downstream %s connected: %d tools", self.name, len(self.tools))

    def _down(self, exc: BaseException | None) -> None:
        if exc is not None:
            self.last_error = _describe(exc)
        self._gone()
        self._attempted.set()

    def _gone(self) -> None:
        self.state = "down"
        self._client = None
        if self._connected.is_set():  # an unset one may have waiters: keep it for the next _up
            self._connected = trio.Event()

    async def _list_tools(self, client: Client) -> None:
        tools: dict[str, DownstreamTool] = {}
        cursor: str | None = None
        for _ in range(100):
            page = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
            for t in page.tools:
                if self._keeps(t.name):
                    name = self.exposed(t.name)
                    tools[name] = DownstreamTool(
                        name, t.name, t.description or "", t.input_schema, t.output_schema, self
                    )
            cursor = page.next_cursor
            if not cursor:
                break
        self.tools = tools

    async def wait_connected(self) -> None:
        """Wait until the server is up (asking a lazy server to connect)."""
        self._wanted.set()
        while self._client is None:
            await self._connected.wait()

    async def first_attempt(self) -> None:
        """Ask a lazy server to connect and wait for its first attempt to end (either way)."""
        self._wanted.set()
        await self._attempted.wait()

    # -- calls ---------------------------------------------------------------------------------------

    async def call(self, remote: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Forward one call; raises CallError at once when the server is down.

        A 2025-11-25 HTTP server that restarted while the gateway was idle no longer knows the session:
        it refuses the call before running it, so the actor reconnects and the call is made once more.
        """
        try:
            return await self._call_once(remote, args, ctx)
        except _SessionLost:
            with trio.move_on_after(self.config.connect_timeout_ms / 1000):
                await self.wait_connected()
            try:
                return await self._call_once(remote, args, ctx)
            except _SessionLost:
                raise CallError(f"MCP server '{self.name}' lost the session and could not open a new one") from None

    async def _call_once(self, remote: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        client = self._client
        if client is None and not self._attempted.is_set():
            with trio.move_on_after(self.config.connect_timeout_ms / 1000):
                await self.first_attempt()
            client = self._client
        if client is None:
            why = f": {self.last_error}" if self.last_error else ""
            raise CallError(f"MCP server '{self.name}' is unavailable{why}")

        step = ctx.step

        async def forward(progress: float, total: float | None, message: str | None) -> None:
            await ctx.report_progress(progress, total, f"{step}: {message}" if step and message else message)

        tel = telemetry.current()
        try:
            if tel is None or tel.tracer is None:
                r = await client.call_tool(remote, args, read_timeout_seconds=self._timeout, progress_callback=forward)
            else:  # a client span, whose traceparent the downstream request carries in its _meta
                with tel.span(f"downstream {self.name} {remote}", {"mcp.server": self.name}, client=True):
                    r = await client.call_tool(
                        remote,
                        args,
                        read_timeout_seconds=self._timeout,
                        progress_callback=forward,
                        meta=tel.trace_meta(),
                    )
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self._lost(exc)
                raise CallError(f"MCP server '{self.name}' closed the connection during the call") from None
            if exc.code == INVALID_REQUEST and str(exc) in _SESSION_GONE:
                self._lost(exc)
                raise _SessionLost from None
            raise CallError(f"MCP server '{self.name}' answered an error: {exc}") from None
        except _TRANSPORT_ERRORS as exc:
            self._lost(exc)
            raise CallError(f"MCP server '{self.name}' is unreachable: {_describe(exc)}") from None
        return ToolResult(
            [b.model_dump(by_alias=True, mode="json", exclude_none=True) for b in r.content],
            r.structured_content,
            bool(r.is_error),
        )

    def _lost(self, exc: BaseException) -> None:
        """A call found the connection gone: down at once (the actor reconnects when it wakes)."""
        self.last_error = _describe(exc)
        self._gone()
        if self._closed is not None:
            self._closed.set()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        leaves = exc.exceptions
        if len(leaves) == 1:
            return _describe(leaves[0])
    if isinstance(exc, trio.TooSlowError):
        return "timed out connecting"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Downstreams:
    """Every configured downstream server, as one tool source for the gateway.

    Args:
        configs: name -> config (disabled ones are skipped).
    """

    def __init__(self, configs: dict[str, McpServerConfig], *, errlog: Any = None) -> None:
        self.servers = [DownstreamServer(n, c, errlog=errlog) for n, c in configs.items() if c.enabled]

    async def start(self, nursery: trio.Nursery) -> None:
        """Start every actor in ``nursery``: eager ones concurrently, returning when each has tried once."""
        async with trio.open_nursery() as starting:
            for server in self.servers:
                starting.start_soon(self._start_one, nursery, server)

    @staticmethod
    async def _start_one(nursery: trio.Nursery, server: DownstreamServer) -> None:
        await nursery.start(server.run)

    @property
    def lazy(self) -> bool:
        return any(s.config.connect == "lazy" for s in self.servers)

    async def ready(self) -> None:
        """Let every lazy server try once (concurrently, each bounded by its connect timeout)."""
        pending = [s for s in self.servers if not s._attempted.is_set()]
        if not pending:
            return
        async with trio.open_nursery() as n:
            for s in pending:
                n.start_soon(_bounded_first_attempt, s)

    def get(self, name: str) -> Tool | None:
        for s in self.servers:
            t = s.tools.get(name)
            if t is not None:
                return t
        return None

    def __iter__(self) -> Iterator[Tool]:
        for s in self.servers:
            yield from list(s.tools.values())

    def why_unknown(self, name: str) -> str | None:
        """Why ``name`` is unknown when it names a server that never came up (its tools were never listed)."""
        for s in self.servers:
            if not s.tools and s.state != "up" and s.prefix and name.startswith(s.prefix + "."):
                return f"MCP server '{s.name}' is unavailable" + (f": {s.last_error}" if s.last_error else "")
        return None

    def status(self) -> dict[str, str]:
        return {s.name: s.state for s in self.servers}


async def _bounded_first_attempt(server: DownstreamServer) -> None:
    with trio.move_on_after(server.config.connect_timeout_ms / 1000 + 1):
        await server.first_attempt()
