"""Tools of other MCP servers: one long-lived actor per server owns its client session.

:class:`DownstreamServer` is the actor. Started with ``await nursery.start(server.run)``, it connects
(at start, or on first use when ``connect = "lazy"``), lists the server's tools, and keeps the session
until the connection ends; then it marks the server down and reconnects with exponential backoff. While
the server is down, a call fails at once with a clear :class:`~mcpipe.gateway.CallError` naming the
server and the last failure, never hanging.

Calls run in the caller's task on the actor's session (the SDK's session multiplexes requests), so a
cancelled caller cancels its downstream request in the same moment: the SDK sends
``notifications/cancelled`` (or closes the HTTP response stream) as the cancellation unwinds. Progress
notifications of a downstream call are forwarded to the caller's progress sink. Over plain HTTP, a call's
first round is sent on the same session without the SDK client's request machinery (``_leancall``), its
answer read in the caller's task; what that path does not handle goes to the SDK's own code.
"""

from __future__ import annotations

import logging
import math
import re
import sys
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, cast

import anyio
import httpx2
import msgspec
import orjson
import trio

from mcpipe import _mcp, telemetry
from mcpipe._jsonschema import errors_async, needs_thread, validator
from mcpipe._mcp import (
    CLIENT_CAPABILITIES_META_KEY,
    CONNECTION_CLOSED,
    HEADER_MISMATCH,
    INVALID_REQUEST,
    MODERN_PROTOCOL_VERSIONS,
)
from mcpipe._util import glob_matcher
from mcpipe.access import CredentialError, Credentials, oauth_bearer
from mcpipe.config import McpServerConfig
from mcpipe.downstream._catalog import Catalog, DownstreamError, Feed, feed_of, list_changes
from mcpipe.downstream._lines import LISTING_CAP, ListingCap
from mcpipe.downstream._lines import install as _linear_stdio_lines
from mcpipe.downstream._oauth import OPERATOR, OAuthClients, ServerAuth, SignInError, SignInRequired
from mcpipe.downstream._polling import StreamWatch
from mcpipe.downstream._wire import LeanResult, LeanTransport, lean_for
from mcpipe.gateway import CallError, is_cancellation
from mcpipe.interaction import AskFailed, interaction_of
from mcpipe.tools import Tool, ToolContext, ToolResult

if TYPE_CHECKING:
    from mcp import Client
    from mcp.shared.exceptions import MCPError
    from mcp_types import CallToolResult, Implementation, RequestParamsMeta

    from mcpipe.downstream._leancall import Wire

__all__ = ["DownstreamError", "DownstreamServer", "DownstreamTool", "Downstreams"]

_log = logging.getLogger("mcpipe.downstream")

BACKOFF_FIRST = 0.2
BACKOFF_MAX = 10.0
LIST_GRACE = 1.0
"""The most a listing waits for lazy servers' first connection (a call of one of their tools waits longer)."""
HEALTHY_AFTER = 5.0
"""A connection that lived this long resets the backoff; one that dies sooner doubles it."""

_MODERN = frozenset(MODERN_PROTOCOL_VERSIONS)


@lru_cache(maxsize=1)
def _client_info() -> Implementation:
    """What mcpipe says it is to a downstream server (the SDK's model: built once the SDK is loaded)."""
    from mcp_types import Implementation

    return Implementation(name="mcpipe-gateway", version="1")


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


class TransportError(CallError):
    """The server is down or the connection failed: the call may succeed if made again."""

    retryable = True


@dataclass(slots=True)
class DownstreamTool:
    """One tool of a downstream server, served under ``name`` (its remote name with the server's prefix).

    Its declaration is kept as the server gave it (``title``, ``annotations``, ``icons`` and ``_meta`` as wire
    JSON), so mcpipe lists it unchanged but for the name (``docs/gateway.md``). The server's ``execution`` is
    left out: mcpipe runs a downstream tool's calls itself and says its own task support."""

    name: str
    remote_name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    server: DownstreamServer
    annotations: dict[str, Any] | None = None
    title: str | None = None
    icons: list[dict[str, Any]] | None = None
    meta: dict[str, Any] | None = None

    async def call(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await self.server.call(self.remote_name, args, ctx)


def _declared(name: str, t: Any, server: DownstreamServer) -> DownstreamTool:
    """A listed ``Tool`` of ``server`` served as ``name``, every field of its declaration in wire form
    (camelCase annotations, the icons' and ``_meta``'s JSON)."""
    hints = t.annotations.model_dump(by_alias=True, exclude_none=True, mode="json") if t.annotations else None
    icons = [i.model_dump(by_alias=True, exclude_none=True, mode="json") for i in t.icons] if t.icons else None
    return DownstreamTool(
        name,
        t.name,
        t.description or "",
        t.input_schema,
        t.output_schema,
        server,
        hints or None,
        title=t.title,
        icons=icons,
        meta=dict(t.meta) if t.meta else None,
    )


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


_CALL_HEADERS: ContextVar[dict[str, str] | None] = ContextVar("mcpipe_downstream_call_headers", default=None)
"""Headers the downstream request being sent by this task carries (a per-caller credential's token)."""


class _SharedCredential(httpx2.Auth):
    """Every request to a downstream server carries the token of a credential shared by all callers."""

    def __init__(self, credentials: Credentials, name: str) -> None:
        self.credentials, self.name = credentials, name

    async def async_auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        try:
            issued = await self.credentials.issue(self.name, None)
        except CredentialError as exc:
            raise httpx2.RequestError(str(exc), request=request) from None
        request.headers["Authorization"] = issued.authorization()
        yield request


class _OAuthBearer(httpx2.Auth):
    """Every request to a downstream server carries one principal's OAuth token (refreshed as it nears its
    expiry); none when the principal has not signed in (the server may list anonymously)."""

    def __init__(self, auth: ServerAuth, principal: str) -> None:
        self.auth, self.principal = auth, principal

    async def async_auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        try:
            token = await self.auth.token(self.principal)
        except SignInError as exc:
            raise httpx2.RequestError(str(exc), request=request) from None
        if token is not None:
            request.headers["Authorization"] = f"Bearer {token}"
        response = yield request
        if response.status_code in (401, 403) and token is not None:
            # Revoked, expired early, or not enough scope: the next call signs in again (with the scope).
            await self.auth.rejected(self.principal, response.status_code, response.headers.get("www-authenticate", ""))


def _asks_urls(ix: Any) -> bool:
    """Whether the caller declared URL-mode elicitation (``capabilities.elicitation.url``)."""
    caps = ix.capabilities
    elicitation = caps.get("elicitation") if isinstance(caps, dict) else getattr(caps, "elicitation", None)
    if elicitation is None:
        return False
    if isinstance(elicitation, dict):
        return elicitation.get("url") is not None
    return getattr(elicitation, "url", None) is not None


def carry_call_headers(session: Any) -> None:
    """Let the headers of :data:`_CALL_HEADERS` through the SDK session's stamp onto the request being sent
    (the stamp runs in the caller's task; the transport sends per-message headers with the POST)."""
    if not isinstance(session._stamp, _CarryingHeaders):
        session._stamp = _CarryingHeaders(session._stamp)


class _CarryingHeaders:
    """An SDK session's stamp that adds the call's :data:`_CALL_HEADERS` to the request's options."""

    __slots__ = ("stamp",)

    def __init__(self, stamp: Callable[[dict[str, Any], Any], None]) -> None:
        self.stamp = stamp

    def __call__(self, data: dict[str, Any], opts: Any) -> None:
        self.stamp(data, opts)
        extra = _CALL_HEADERS.get()
        if extra:
            opts.setdefault("headers", {}).update(extra)


LISTED_PER_KEPT = 4
"""One ``tools/list`` answer is cut, as it is read, to this many times ``max_tools`` tools: room for the
``include``/``exclude`` filters to choose from, and a bound on what a listing of 100 000 costs."""


class _CappedStream(httpx2.AsyncByteStream):
    """An answer's body, its ``result.tools`` cut as the bytes come (``ArrayCap``)."""

    def __init__(self, inner: Any, listing: ListingCap) -> None:
        self._inner = inner
        self._listing = listing
        self._cap = listing.cutter()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            out = self._cap.feed(chunk)
            if out:
                yield out
        self._listing.note(self._cap)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _is_listing(request: httpx2.Request) -> bool:
    try:
        body = request.content
    except httpx2.RequestNotRead:
        return False
    if not body.startswith(b"{") or len(body) > 65_536 or b"tools/list" not in body:
        return False
    try:
        return bool(orjson.loads(body).get("method") == "tools/list")
    except (orjson.JSONDecodeError, AttributeError):
        return False


def _cap_listings(http: httpx2.AsyncClient, listing: ListingCap) -> Callable[[httpx2.Response], Awaitable[None]]:
    """Cut the ``tools/list`` answers ``http`` receives while they stream, before the SDK reads them (the hook
    added, returned)."""

    async def on_response(response: httpx2.Response) -> None:
        if _is_listing(response.request):
            response.stream = _CappedStream(response.stream, listing)
            response.headers.pop("content-length", None)

    http.event_hooks["response"].append(on_response)
    return on_response


def _http_client(url: str, headers: dict[str, str], auth: httpx2.Auth | None) -> httpx2.AsyncClient:
    """The SDK's client (``create_mcp_http_client``: its timeouts, headers, auth), on the lean transport for a
    plain-http server reached directly (``_wire``)."""
    # The SDK's client stack loads with the first downstream server connected, not with the server's start.
    from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT, create_mcp_http_client

    if not lean_for(url):
        return create_mcp_http_client(headers=headers or None, auth=auth)
    timeout = httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT)
    return httpx2.AsyncClient(headers=headers or None, auth=auth, timeout=timeout, transport=LeanTransport())


@asynccontextmanager
async def _http_transport(
    url: str,
    headers: dict[str, str],
    watch: StreamWatch,
    listing: ListingCap,
    auth: httpx2.Auth | None = None,
    keep: Callable[[Wire | None], None] | None = None,
) -> AsyncIterator[Any]:
    from mcp.client.streamable_http import streamable_http_client

    from mcpipe.downstream._leancall import streamable_http_wire

    async with _http_client(url, headers, auth) as http:
        watch.install(http)
        capped = _cap_listings(http, listing)
        if keep is None or not lean_for(url):
            async with streamable_http_client(url, http_client=http) as s:
                yield s
        else:
            # The lean call does these hooks' work itself when they are the client's only ones: the watch's on
            # a call's SSE answer, the cap's on a listing (never a call's).
            async with streamable_http_wire(url, http, keep, watch=watch, own_hooks=(*watch.hooks, capped)) as s:
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

    oauth: ServerAuth | None = None
    """Its OAuth, when it requires it (``oauth``), set by :class:`Downstreams`."""
    principal: str | None = None
    """The principal whose own session this is (a per-user server's), or None (the shared session)."""
    spawn: Callable[[DownstreamServer], Any] | None = None
    """Starts a per-user session (set by :class:`Downstreams`)."""

    def __init__(
        self, name: str, config: McpServerConfig, *, errlog: Any = None, credentials: Credentials | None = None
    ) -> None:
        self.name = name
        self.config = config
        self.credentials = credentials
        self.prefix = name if config.prefix is None else config.prefix
        self.tools: dict[str, DownstreamTool] = {}
        self._by_remote: tuple[Any, dict[str, Any]] = (None, {})
        self._capped: int | None = None  # the tools were cut to this many (said once, not at every relist)
        self.state = "idle"
        self.last_error: str | None = None
        self.connections = 0
        self._client: Client | None = None
        self._closed: trio.Event | None = None
        self._wanted = trio.Event()
        self._attempted = trio.Event()
        self._connected = trio.Event()
        self._errlog = errlog
        self._warned = False  # "down" is a warning the first time and after each time it was up, not every retry
        self._was_up = False
        self._include = glob_matcher(config.include) if config.include is not None else None
        self._exclude = glob_matcher(config.exclude) if config.exclude else None
        self._timeout = config.timeout_ms / 1000 if config.timeout_ms else None
        self._poll = config.sse_poll_ms / 1000 if config.sse_poll_ms else None
        # Its resources, templates and prompts, and what it sends outside calls (logs, changes, updates).
        self.catalog = Catalog(self)
        self.feed: Feed = feed_of(self)
        # Questions it asks during calls, relayed to their callers; its SSE polling, passed on to them.
        from mcpipe.interaction import Askers  # the relay (the SDK) loads with the first downstream server

        self.askers = Askers(name)
        self.streams = StreamWatch()
        self._users: OrderedDict[str, tuple[DownstreamServer, trio.CancelScope]] = OrderedDict()
        self._user_lock = trio.Lock()
        self.max_user_sessions = 256
        self.listing = ListingCap(LISTED_PER_KEPT * config.max_tools)
        """How many tools one ``tools/list`` answer keeps as it is read (stdio and HTTP alike)."""
        self._wire: Wire | None = None
        """The live HTTP session's transport, for calls sent the lean way (``_leancall``); None otherwise."""
        self.twin: DownstreamServer | None = None
        """With ``protocol = "auto"`` over HTTP: a 2025-11-25 session of the same server for 2025-11-25 callers
        (opened on first use), so a tool asking its client mid-call the 2025-11-25 way reaches them."""

    # -- naming ------------------------------------------------------------------------------------

    def exposed(self, remote: str) -> str:
        return f"{self.prefix}.{remote}" if self.prefix else remote

    def keeps(self, remote: str) -> bool:
        if self._include is not None and not self._include(remote):
            return False
        return not (self._exclude is not None and self._exclude(remote))

    # -- lifecycle -----------------------------------------------------------------------------------

    def _keep_wire(self, wire: Wire | None) -> None:
        self._wire = wire

    def _transport(self, closed: trio.Event) -> Any:
        c = self.config
        if c.command is not None:
            from mcp.client.stdio import StdioServerParameters, stdio_client

            _linear_stdio_lines()  # the SDK's stdio reader is quadratic in a line's length (see _lines)
            params = StdioServerParameters(command=c.command, args=c.args, env=c.env or None, cwd=c.cwd)
            inner = stdio_client(params, errlog=self._errlog or sys.stderr)
        else:
            auth: httpx2.Auth | None = None
            if self.oauth is not None:
                auth = _OAuthBearer(self.oauth, self.principal or OPERATOR)
            elif (
                c.credential is not None
                and self.credentials is not None
                and not self.credentials.per_caller(c.credential)
            ):
                auth = _SharedCredential(self.credentials, c.credential)
            inner = _http_transport(c.url or "", c.headers, self.streams, self.listing, auth, self._keep_wire)
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
            # Only a connection that came up and lived resets the backoff (a slow failure to start is no better).
            backoff = BACKOFF_FIRST if self._was_up and lived >= HEALTHY_AFTER else min(backoff * 2, BACKOFF_MAX)
            _log.log(  # a retry that fails the same way again is not news: debug only
                logging.WARNING if self._was_up or not self._warned else logging.DEBUG,
                "downstream %s is down (%s); reconnecting in %.1fs",
                self.name,
                self.last_error,
                backoff,
            )
            self._warned, self._was_up = True, False
            await trio.sleep(backoff)

    async def _session_once(self, task_status: trio.TaskStatus[None] | None) -> None:
        closed = trio.Event()
        self.state = "connecting"
        listing = LISTING_CAP.set(self.listing)  # the stdio reader, started in the client, reads it
        try:
            # One scope around the whole session: its deadline bounds connecting and listing, and is lifted
            # once the server is up (the client's nurseries live inside it, so it must enclose them).
            with trio.CancelScope(deadline=trio.current_time() + self.config.connect_timeout_ms / 1000) as scope:
                from mcp.client.client import Client  # the SDK's client (and its in-memory server): on first use

                mode = {"auto": "auto", "2025-11-25": "legacy"}.get(self.config.protocol, self.config.protocol)
                async with Client(
                    self._transport(closed),
                    client_info=_client_info(),
                    mode=mode,
                    cache=None,
                    **self.feed.hooks(),
                    **self.askers.callbacks(),
                ) as client:
                    # mcpipe checks results against outputSchema itself, patterns matched safely (the SDK's
                    # check ran them with `re` on the event loop: issue 20). `_checked_output` below.
                    client.session.validate_tool_result = _skip_sdk_check  # type: ignore[method-assign]
                    await self._list_tools(client)
                    await self.catalog.refresh(client)
                    scope.deadline = math.inf
                    self._up(client, closed)
                    if task_status is not None:
                        task_status.started()
                        task_status = None
                    try:
                        async with trio.open_nursery() as watching:
                            watching.start_soon(list_changes, self, client)  # 2026-07-28 servers: listen
                            await closed.wait()
                            watching.cancel_scope.cancel()
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
            LISTING_CAP.reset(listing)
            self._client = None
            if task_status is not None:
                task_status.started()

    def _up(self, client: Client, closed: trio.Event) -> None:
        self._client, self._closed = client, closed
        self.state = "up"
        self.last_error = None
        self.connections += 1
        self._was_up = True
        self._connected.set()
        self._attempted.set()
        _log.info("downstream %s connected: %d tools", self.name, len(self.tools))
        self.feed.connected()

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
        limit = self.config.max_tools
        left_out = 0
        for _ in range(100):
            self.listing.seen = 0
            page = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
            if self.listing.seen:  # cut while it was read: the rest of it was never parsed
                left_out += self.listing.seen - len(page.tools)
            for t in page.tools:
                if "tools" in self.config.expose and self.keeps(t.name):
                    name = self.exposed(t.name)
                    if len(tools) >= limit and name not in tools:
                        left_out += 1
                        continue
                    tools[name] = _declared(name, t, self)
            cursor = page.next_cursor
            del page
            if not cursor or left_out:
                break  # no more pages, or no room for them
        if left_out and (self._capped != limit or len(self.tools) != len(tools)):
            _log.warning(
                "downstream %s lists more than %d tools: keeping the first %d, leaving out %s more "
                "(mcpServers.%s.max_tools)",
                self.name,
                limit,
                limit,
                f"{left_out}" + (" or" if cursor else ""),
                self.name,
            )
        self._capped = limit if left_out else None
        self.tools = tools

    async def relist(self, what: str) -> None:
        """Fetch one list again after the server said it changed (``tools``, ``prompts``, ``resources``)."""
        client = self._client
        if client is None:
            return
        try:
            if what == "tools":
                await self._list_tools(client)
            else:
                await self.catalog.refresh(client, what)
        except (_mcp.MCPError, *_TRANSPORT_ERRORS) as exc:
            _log.warning("downstream %s: cannot list its %s again: %s", self.name, what, _describe(exc))

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
        if self.oauth is not None and self.oauth.per_user and self.principal is None:
            user = await self._user_session(ctx)
            try:
                return await user.call(remote, args, ctx)
            except CallError:
                # The server refused the principal's token (revoked, or a scope to step up to): one more
                # sign-in, asked of the caller as the first was, and the call once more.
                if await self.oauth.token(ctx.principal or OPERATOR) is not None:
                    raise
            held = self._users.pop(ctx.principal or OPERATOR, None)
            if held is not None:
                held[1].cancel()  # its connection was refused: a new one, with the new token
            user = await self._user_session(ctx)
            return await user.call(remote, args, ctx)
        twin = self.twin
        if twin is not None and _handshake_caller(ctx) and not self._speaks_handshake():
            return await twin.call(remote, args, ctx)
        try:
            return await self._call_once(remote, args, ctx)
        except _SessionLost:
            with trio.move_on_after(self.config.connect_timeout_ms / 1000):
                await self.wait_connected()
            try:
                return await self._call_once(remote, args, ctx)
            except _SessionLost:
                lost = f"MCP server '{self.name}' lost the session and could not open a new one"
                raise TransportError(lost) from None

    # -- per-user OAuth ------------------------------------------------------------------------------

    async def _user_session(self, ctx: ToolContext) -> DownstreamServer:
        """The caller's own session of this server, signed in as the caller (asked to sign in first when it has
        no token: URL-mode elicitation). Sessions are kept per principal, ``max_user_sessions`` at most (the
        least recently used is closed)."""
        auth = self.oauth
        assert auth is not None
        principal = ctx.principal or OPERATOR
        if await auth.token(principal) is None:
            await self._sign_in(auth, principal, ctx)
        async with self._user_lock:
            held = self._users.get(principal)
            if held is not None and not held[1].cancel_called:
                self._users.move_to_end(principal)
                return held[0]
            while len(self._users) >= self.max_user_sessions:
                _, (_, scope) = self._users.popitem(last=False)
                scope.cancel()
            config = msgspec.structs.replace(self.config, connect="lazy")
            user = DownstreamServer(self.name, config, errlog=self._errlog, credentials=None)
            user.oauth, user.principal = auth, principal
            assert self.spawn is not None, "a per-user server is started by its Downstreams"
            scope = await self.spawn(user)
            self._users[principal] = (user, scope)
            return user

    async def _sign_in(self, auth: ServerAuth, principal: str, ctx: ToolContext) -> None:
        """Ask the caller to sign in (URL-mode elicitation of the authorization URL) and wait until it has.

        Raises:
            SignInRequired: the caller cannot be asked (it declared no URL-mode elicitation).
            CallError: it declined, or the sign-in did not complete in time.
        """
        try:
            url, elicitation_id = await auth.begin(principal, ctx.request_id)
        except SignInError as exc:
            raise CallError(str(exc)) from None
        ix = interaction_of(ctx)
        if ix is None or not _asks_urls(ix):
            raise SignInRequired(self.name, url, elicitation_id)
        params = {
            "mode": "url",
            "message": f"Sign in to {self.name} to continue.",
            "url": url,
            "elicitationId": elicitation_id,
        }
        try:
            answer = await ix.ask(ix.key(ctx, f"sign_in.{self.name}"), "elicitation", params)
        except AskFailed as exc:
            raise CallError(f"MCP server '{self.name}': cannot ask the caller to sign in: {exc}") from None
        if answer.get("action") != "accept":
            raise CallError(f"MCP server '{self.name}': the user did not sign in ({answer.get('action')})")
        if not await auth.wait_signed_in(principal, auth.clients.sign_in_timeout_s):
            raise CallError(
                f"MCP server '{self.name}': the sign-in did not complete within {auth.clients.sign_in_timeout_s:g} s"
            )

    async def _call_once(self, remote: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        client = self._client
        if client is None and not self._attempted.is_set():
            with trio.move_on_after(self.config.connect_timeout_ms / 1000):
                await self.first_attempt()
            client = self._client
        if client is None:
            why = f": {self.last_error}" if self.last_error else ""
            raise TransportError(f"MCP server '{self.name}' is unavailable{why}")

        forward = _Progress(ctx)
        headers = await self._caller_headers(client, ctx)
        token = _CALL_HEADERS.set(headers) if headers else None

        tel = telemetry.current()
        # The lean path: a first round on a plain-http session, no SSE polling, no span whose context the
        # SDK would inject (``_leancall``). Anything else is sent the SDK's way.
        wire = self._wire if self._poll is None and (tel is None or tel.tracer is None) else None

        async def send(responses: Any, state: str | None) -> Any:
            if wire is not None and responses is None and state is None and wire is self._wire:
                lean = await wire.call(client.session, remote, args, meta, forward, self._timeout)
                if lean is not None:
                    return lean
            return await client.session.call_tool(
                remote,
                args,
                read_timeout_seconds=self._timeout,
                progress_callback=forward,
                input_responses=responses,
                request_state=state,
                meta=meta,
                allow_input_required=True,
            )

        t0 = time.perf_counter()
        answered = False
        try:
            with (
                self.feed.in_call(ctx),
                self.askers.calling(ctx) as asking,
                self.streams.watching(ctx) as watched,
            ):
                meta = self._meta(client, ctx, watched)

                async def relayed() -> CallToolResult:
                    from mcpipe.interaction import call_relaying

                    return await call_relaying(self._relisting(client, remote, send), ctx)

                if tel is None or tel.tracer is None:
                    r = await self.streams.polled(ctx, self._poll, relayed)
                else:  # a client span, whose traceparent the downstream request carries in its _meta
                    with tel.span(f"downstream {self.name} {remote}", {"mcp.server": self.name}, client=True):
                        traced = tel.trace_meta()
                        if traced:
                            meta = cast("RequestParamsMeta", {**(meta or {}), **traced})
                        r = await self.streams.polled(ctx, self._poll, relayed)
                if not isinstance(r, LeanResult) or forward.busy or self.feed.busy:
                    # The SDK's client runs progress and log callbacks in tasks of their own; a lean call's ran in
                    # this task as they came (nothing spawned to let start: two scheduler passes saved a call).
                    await forward.drain()
                    await self.feed.drain()
            answered = not r.is_error
        except AskFailed as exc:
            raise self._unrelayed(str(exc)) from None
        except (_mcp.MCPError, *_TRANSPORT_ERRORS) as exc:
            if isinstance(exc, _mcp.MCPError) and asking.refused is not None:
                # It failed on a question mcpipe could not relay (mid-call, 2025-11-25): say so, as a tool error.
                raise self._unrelayed(asking.refused) from None
            raise self.failure(exc) from None
        finally:
            if token is not None:
                _CALL_HEADERS.reset(token)
            if tel is not None and tel.metrics is not None:
                tel.observe_downstream(self.name, time.perf_counter() - t0, answered)
        if isinstance(r, LeanResult):
            if not r.is_error:
                await self._checked_output(remote, r.structured_content, r.sent)
            return ToolResult(r.content, r.structured_content, r.is_error)
        if not r.is_error:
            await self._checked_output(remote, r.structured_content, "structured_content" in r.model_fields_set)
        return ToolResult(
            [b.model_dump(by_alias=True, mode="json", exclude_none=True) for b in r.content],
            r.structured_content,
            bool(r.is_error),
        )

    async def _checked_output(self, remote: str, structured: Any, sent: bool) -> None:
        """Check a result against the tool's ``outputSchema`` as the SDK's client does, the schema's patterns
        matched in linear time (or under the deadline, off the event loop): a ``CallError`` when it does not
        match."""
        schema = self._output_schema(remote)
        if schema is None:
            return
        if structured is None and not sent:
            raise CallError(
                f"MCP server '{self.name}': tool {remote} has an output schema but did not return structured content"
            )
        from jsonschema import SchemaError  # loaded by _output_checker: cheap here
        from jsonschema.exceptions import best_match

        try:
            checker, in_thread = _output_checker(msgspec.json.encode(schema))
            errors = await errors_async(checker, structured, in_thread=in_thread)
        except (re.error, SchemaError) as exc:
            raise CallError(f"MCP server '{self.name}': invalid output schema for tool {remote}: {exc}") from None
        if errors:
            best = best_match(errors)
            raise CallError(
                f"MCP server '{self.name}': invalid structured content returned by tool {remote}: "
                f"{best.message if best is not None else errors[0].message}"
            )

    def _output_schema(self, remote: str) -> dict[str, Any] | None:
        tools = self.tools
        if self._by_remote[0] is not tools:
            self._by_remote = (tools, {t.remote_name: t.output_schema for t in tools.values()})
        return self._by_remote[1].get(remote)

    async def _caller_headers(self, client: Client, ctx: ToolContext) -> dict[str, str] | None:
        """The ``Authorization`` of a credential minted for this caller (``token_exchange``, ``id_jag``)."""
        name = self.config.credential
        if self.config.forward_bearer:
            identity = ctx.identity
            token = getattr(identity, "token", None)
            if not token:
                return None
            if oauth_bearer(identity):
                # An access token minted for mcpipe is never passed through to another server (the MCP
                # authorization spec forbids token passthrough): a token_exchange credential exchanges it.
                raise CallError(
                    f"MCP server '{self.name}': forward_bearer would pass the caller's OAuth access token through "
                    "(tokens are for mcpipe alone); give the server a `token_exchange` credential instead"
                )
            carry_call_headers(client.session)
            return {"Authorization": f"Bearer {token}"}
        if name is None or self.credentials is None or not self.credentials.per_caller(name):
            return None
        try:
            issued = await self.credentials.issue(name, ctx.identity)
        except CredentialError as exc:
            raise CallError(f"MCP server '{self.name}': {exc}") from None
        carry_call_headers(client.session)
        return {"Authorization": issued.authorization()}

    def _unrelayed(self, why: str) -> CallError:
        return CallError(f"MCP server '{self.name}' asked the client a question mcpipe could not relay: {why}")

    def _meta(self, client: Client, ctx: ToolContext, meta: RequestParamsMeta | None) -> RequestParamsMeta | None:
        """A call's ``_meta``: on a 2026-07-28 session, the caller's capabilities (the downstream asks only
        what the caller can answer, as it would directly)."""
        if client.protocol_version not in _MODERN:
            return meta
        from mcpipe.interaction import caller_capabilities, keep_caller_capabilities

        keep_caller_capabilities(client.session)
        return cast("RequestParamsMeta", {**(meta or {}), CLIENT_CAPABILITIES_META_KEY: caller_capabilities(ctx)})

    def _speaks_handshake(self) -> bool:
        """Whether the live session is a 2025-11-25 one."""
        client = self._client
        return client is not None and client.protocol_version not in _MODERN

    @staticmethod
    def _relisting(client: Client, remote: str, send: Any) -> Any:
        """``send``, sent once more after re-listing when a 2026-07-28 server says the client's listing of the
        tool is stale (``HEADER_MISMATCH``), as the SDK's ``Client.call_tool`` does."""

        async def once(responses: Any, state: str | None) -> Any:
            try:
                return await send(responses, state)
            except _mcp.MCPError as exc:
                if exc.code != HEADER_MISMATCH:
                    raise
            cursor: str | None = None
            for _ in range(100):
                page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                cursor = page.next_cursor
                if cursor is None or any(t.name == remote for t in page.tools):
                    break
            return await send(responses, state)

        return once

    @property
    def modern(self) -> bool:
        """Whether the live session speaks the 2026-07-28 era (changes come on a listen stream)."""
        return self._client is not None and self._client.protocol_version in _MODERN

    def client(self) -> Client:
        """The live session's client, for a request other than a tool call; CallError when the server is down."""
        if self._client is None:
            why = f": {self.last_error}" if self.last_error else ""
            raise TransportError(f"MCP server '{self.name}' is unavailable{why}")
        return self._client

    def failure(self, exc: MCPError | OSError | Exception) -> Exception:
        """What a request's failure becomes: the server's own JSON-RPC error (DownstreamError, its code, message
        and data kept), or a CallError when the connection failed (the server is marked down)."""
        if isinstance(exc, _mcp.MCPError):
            if exc.code == CONNECTION_CLOSED:
                self._lost(exc)
                return TransportError(f"MCP server '{self.name}' closed the connection during the call")
            if exc.code == INVALID_REQUEST and str(exc) in _SESSION_GONE:
                self._lost(exc)
                return _SessionLost()
            return DownstreamError(self.name, exc.error)
        self._lost(exc)
        return TransportError(f"MCP server '{self.name}' is unreachable: {_describe(exc)}")

    def _lost(self, exc: BaseException) -> None:
        """A call found the connection gone: down at once (the actor reconnects when it wakes)."""
        self.last_error = _describe(exc)
        self._gone()
        if self._closed is not None:
            self._closed.set()


async def _skip_sdk_check(name: str, result: Any) -> None:
    """In place of the SDK session's ``validate_tool_result`` (see ``DownstreamServer._checked_output``)."""


@lru_cache(maxsize=256)
def _output_checker(schema_json: bytes) -> tuple[Any, bool]:
    from jsonschema.validators import validator_for  # on first use: jsonschema is slow to import

    schema = msgspec.json.decode(schema_json)
    cls = validator_for(schema)
    cls.check_schema(schema)
    return validator(schema, default=cls), needs_thread(schema)


def _handshake_caller(ctx: ToolContext) -> bool:
    """Whether the call comes from a 2025-11-25 client (one that can be asked in the middle of a call)."""
    ix = interaction_of(ctx)
    return ix is not None and not ix.modern


class _Progress:
    """Forwards a call's progress to its caller, and lets the call wait for the last one before it answers.

    The SDK client runs each progress callback in a task of its own, spawned as the notification is read, so
    the answer (read just after) can wake the caller first; answering then would close the caller's stream
    before its last progress notification went out.
    """

    __slots__ = ("_ctx", "_idle", "_running")

    def __init__(self, ctx: ToolContext) -> None:
        self._ctx = ctx
        self._running = 0
        self._idle: trio.Event | None = None  # made by a drain that waits (most calls never do)

    @property
    def busy(self) -> bool:
        """Whether a callback is forwarding progress now."""
        return self._running > 0

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        step = self._ctx.step
        self._running += 1
        try:
            await self._ctx.report_progress(progress, total, f"{step}: {message}" if step and message else message)
        finally:
            self._running -= 1
            if self._running == 0 and self._idle is not None:
                self._idle.set()
                self._idle = None

    async def drain(self) -> None:
        """Let callbacks spawned before the answer start (one scheduling round), then wait for them to end."""
        await trio.lowlevel.checkpoint()
        while self._running:
            if self._idle is None:
                self._idle = trio.Event()
            await self._idle.wait()


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

    def __init__(
        self,
        configs: dict[str, McpServerConfig],
        *,
        errlog: Any = None,
        credentials: Credentials | None = None,
        oauth: OAuthClients | None = None,
        max_user_sessions: int = 256,
    ) -> None:
        self.errlog, self.credentials = errlog, credentials
        self.oauth = oauth
        self.max_user_sessions = max_user_sessions
        self.servers = [self._server(n, c) for n, c in configs.items() if c.enabled]
        self._nursery: trio.Nursery | None = None
        self._held: dict[str, trio.CancelScope] = {}
        self.on_added: Callable[[DownstreamServer], None] | None = None
        """Called with each server :meth:`add` brings (the passthrough listens to its changes)."""

    def _server(self, name: str, config: McpServerConfig) -> DownstreamServer:
        server = DownstreamServer(name, config, errlog=self.errlog, credentials=self.credentials)
        if self.oauth is not None and name in self.oauth.servers:
            server.oauth = self.oauth.servers[name]
            server.spawn = self._spawn
            server.max_user_sessions = self.max_user_sessions
            # A per-user server's shared session (listing) speaks one era; each user's session, its own.
            config = msgspec.structs.replace(config, session_per_era=False)
            server.config = config
        # By default over HTTP only: a second stdio session is a second process, with state of its own.
        per_era = config.session_per_era
        if config.protocol == "auto" and (config.transport == "http" if per_era is None else per_era):
            handshake = msgspec.structs.replace(config, protocol="2025-11-25", connect="lazy")
            server.twin = DownstreamServer(name, handshake, errlog=self.errlog, credentials=self.credentials)
        return server

    async def start(self, nursery: trio.Nursery) -> None:
        """Start every actor in ``nursery``: eager ones concurrently, returning when each has tried once."""
        self._nursery = nursery
        async with trio.open_nursery() as starting:
            for server in self.servers:
                starting.start_soon(self._start_one, nursery, server)

    async def add(self, name: str, config: McpServerConfig) -> DownstreamServer:
        """Serve one more server from now on (after :meth:`start`): its tools, resources and prompts join the
        others' once it is up (it connects in the background, as a server that came back would)."""
        assert self._nursery is not None, "Downstreams.add before start"
        server = self._server(name, config)
        self.servers.append(server)
        if self.on_added is not None:
            self.on_added(server)
        scope = trio.CancelScope()
        self._held[name] = scope
        await self._nursery.start(self._hold, server, scope)
        return server

    async def remove(self, name: str) -> None:
        """Stop serving the server :meth:`add` brought under ``name`` (its connection closed)."""
        scope = self._held.pop(name, None)
        self.servers = [s for s in self.servers if s.name != name]
        if scope is not None:
            scope.cancel()

    async def _spawn(self, server: DownstreamServer) -> trio.CancelScope:
        """Start a per-user session (lazy: it connects on its first call); its scope stops it."""
        assert self._nursery is not None, "Downstreams started"
        scope = trio.CancelScope()
        await self._nursery.start(self._hold, server, scope)
        return scope

    async def _hold(
        self, server: DownstreamServer, scope: trio.CancelScope, *, task_status: trio.TaskStatus[None]
    ) -> None:
        with scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._start_one, nursery, server)
                task_status.started()

    @staticmethod
    async def _start_one(nursery: trio.Nursery, server: DownstreamServer) -> None:
        if server.twin is not None:
            await nursery.start(server.twin.run)  # lazy: started at once, connects on first use
        await nursery.start(server.run)

    @property
    def lazy(self) -> bool:
        return any(s.config.connect == "lazy" for s in self.servers)

    async def ready(self, name: str | None = None) -> None:
        """Let lazy servers try to connect once.

        With ``name`` (a tool about to be called), wait for the server that would serve it, bounded by its
        connect timeout. Without (a listing), ask every lazy server and wait at most :data:`LIST_GRACE`
        seconds: a list answers promptly with what is up, and clients are told when the rest comes.
        """
        if name is not None:
            server = self.server_for(name)
            if server is not None and not server._attempted.is_set():
                await _bounded_first_attempt(server)
            return
        pending = [s for s in self.servers if not s._attempted.is_set()]
        if not pending:
            return
        with trio.move_on_after(LIST_GRACE):
            async with trio.open_nursery() as n:
                for s in pending:
                    n.start_soon(_bounded_first_attempt, s)
        for s in pending:
            if not s._attempted.is_set():
                _log.warning("downstream %s is still connecting: its tools are listed when it is up", s.name)

    def server_for(self, name: str) -> DownstreamServer | None:
        """The server whose prefix ``name`` carries (None for a bare name)."""
        for s in self.servers:
            if s.prefix and name.startswith(s.prefix + "."):
                return s
        return None

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
        s = self.server_for(name)
        if s is not None and not s.tools and s.state != "up":
            return f"MCP server '{s.name}' is unavailable" + (f": {s.last_error}" if s.last_error else "")
        return None

    def unavailable(self) -> dict[str, str]:
        """The servers that are not up (not idle lazy ones), each with why."""
        return {
            s.name: s.last_error or s.state for s in self.servers if s.state not in ("up", "idle") and s.config.enabled
        }

    def status(self) -> dict[str, str]:
        return {s.name: s.state for s in self.servers}


async def _bounded_first_attempt(server: DownstreamServer) -> None:
    with trio.move_on_after(server.config.connect_timeout_ms / 1000 + 1):
        await server.first_attempt()
