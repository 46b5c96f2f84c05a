"""What mcpipe passes through from its downstream servers besides tools: resources, resource templates,
prompts, completion, subscriptions, list changes, and logging (the level a client sets).

One :class:`Passthrough` per app answers these requests by routing each to the server that listed the
resource, template or prompt, and carries the servers' notifications back: a list change to every connected
client (2025-11-25: ``notifications/*/list_changed`` on each session; 2026-07-28: ``subscriptions/listen``
streams, through the SDK's :class:`ListenHandler`), a resource update to its subscribers.

Names follow the tools' rules: prompts take their server's prefix; resource URIs stay as they are. When two
servers list the same URI or prompt name, the first in config order wins and a warning says so.

The config's own prompts, resources and resource templates (declared pipelines with a ``surface``) come
first: listed before the downstream servers', and a read or get they answer never reaches a server. Each runs
its pipeline through the gateway (the caller's rights, the audit) and its answer shape turns the answer into
the result (:mod:`mcpipe.declared._answers`).
"""

from __future__ import annotations

import logging
import warnings
import weakref
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import mcp_types as types
import trio
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcpipe._core import Regex
from mcpipe.errors import MCPipeError
from mcpipe.gateway import CallError, Policy
from mcpipe.interaction._relay import request_asking
from mcpipe.server._guide import Guide
from mcpipe.tools._catalog import Change, DownstreamError
from mcpipe.tools.downstream import Downstreams, DownstreamServer

__all__ = ["LOG_LEVELS", "Passthrough", "log_allowed"]

_log = logging.getLogger("mcpipe.server")

_MODERN = frozenset(MODERN_PROTOCOL_VERSIONS)
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
_RANK = {name: i for i, name in enumerate(LOG_LEVELS)}
_ERA_FIELDS = ("ttlMs", "cacheScope", "resultType")
"""2026-07-28 result fields a 2025-11-25 client does not know."""

Principal = Callable[[ServerRequestContext[Any, Any]], "str | None"]
RunSurface = Callable[[ServerRequestContext[Any, Any], Any, dict[str, Any]], Awaitable[Any]]
"""Runs a local surface's pipeline for a request: ``(ctx, pipeline, arguments) -> ToolResult``."""


def log_allowed(levels: weakref.WeakKeyDictionary[Any, str], ctx: ServerRequestContext[Any, Any], level: str) -> bool:
    """Whether a 2025-11-25 client wants a message at ``level`` (the level it set with ``logging/setLevel``;
    every level before it set one). 2026-07-28 requests carry their own level, applied by the SDK."""
    return level_allows(levels.get(_connection(ctx)), level)


def level_allows(wanted: str | None, level: str) -> bool:
    """Whether a message at ``level`` passes the level a client set (None: it set none, all pass)."""
    return wanted is None or _RANK.get(level, 0) >= _RANK.get(wanted, 0)


def _connection(ctx: ServerRequestContext[Any, Any]) -> Any:
    # The SDK's ServerSession is built per request; its connection is the client's (one per 2025-11-25 session).
    return getattr(ctx.session, "_connection", ctx.session)


def _for_era(ctx: ServerRequestContext[Any, Any], result: dict[str, Any]) -> dict[str, Any]:
    if ctx.protocol_version not in _MODERN:
        for k in _ERA_FIELDS:
            result.pop(k, None)
    return result


def _rpc_error(exc: CallError) -> MCPError:
    """A downstream failure as the JSON-RPC error to answer: the server's own, or an internal error naming why."""
    if isinstance(exc, DownstreamError):
        return MCPError(exc.error.code, exc.error.message, exc.error.data)
    return MCPError(types.INTERNAL_ERROR, str(exc))


class Passthrough:
    """Handlers for the non-tool requests, over the downstream servers.

    Args:
        downstreams: the servers.
        policy: who may see what: a principal sees a server's resources and prompts when it may call at
            least one of that server's tools (or every tool).
        principal: the principal of a request.
    """

    def __init__(
        self,
        downstreams: Downstreams,
        policy: Policy,
        principal: Principal,
        *,
        surfaces: list[Any] | None = None,
        run_surface: RunSurface | None = None,
        guide: Guide | None = None,
        caching: Any = None,
    ) -> None:
        self.downstreams = downstreams
        self.guide = guide
        """mcpipe's own guide to its pipeline language (resources and a prompt), listed after the config's own."""
        self.caching = caching
        """The config's ``caching`` hints, or None."""
        self.surfaces = list(surfaces or ())
        """The config's own prompts, resources and resource templates (declared pipelines), in config order."""
        self.run_surface = run_surface
        self._templates = [
            (t, _template_matcher(t.uri_template)) for t in self.surfaces if t.surface == "resource_template"
        ]
        self.policy = policy
        self.principal = principal
        self.levels: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self.bus = InMemorySubscriptionBus()
        self._listen = ListenHandler(self.bus)
        self._sessions: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        """connection -> the latest request's ServerSession (its standalone channel reaches the client)."""
        self._subscribers: dict[str, weakref.WeakKeyDictionary[Any, Any]] = {}
        self._warned: set[tuple[str, str]] = set()
        for server in downstreams.servers:
            server.feed.changed = self._changed

    # -- who sees what ---------------------------------------------------------------------------------

    def seen(self, ctx: ServerRequestContext[Any, Any]) -> None:
        """Remember the client of a request, to tell it when lists change."""
        self._sessions[_connection(ctx)] = ctx.session

    def _servers(self, ctx: ServerRequestContext[Any, Any]) -> list[DownstreamServer]:
        self._sessions[_connection(ctx)] = ctx.session
        principal = self.principal(ctx)
        if principal is None:
            return self.downstreams.servers
        return [s for s in self.downstreams.servers if self._may_use(principal, s)]

    def _may_use(self, principal: str, server: DownstreamServer) -> bool:
        probe = server.exposed("*")
        return self.policy.allows(principal, probe) or any(self.policy.allows(principal, t) for t in server.tools)

    def _clash(self, kind: str, key: str, winner: DownstreamServer, loser: DownstreamServer) -> None:
        if (kind, key) not in self._warned:
            self._warned.add((kind, key))
            _log.warning(
                "%s %r is served by MCP servers '%s' and '%s': '%s' wins (the first in config order)",
                kind,
                key,
                winner.name,
                loser.name,
                winner.name,
            )

    # -- lists -----------------------------------------------------------------------------------------

    def _merged(self, ctx: ServerRequestContext[Any, Any], kind: str) -> list[dict[str, Any]]:
        out: dict[str, tuple[DownstreamServer, dict[str, Any]]] = {}
        for s in self._servers(ctx):
            c = s.catalog
            items: list[tuple[str, dict[str, Any]]]
            if kind == "resource":
                items = list(c.resources.items())
            elif kind == "template":
                items = [(t["uriTemplate"], t) for _, t in c.templates]
            else:
                items = [(name, entry) for name, (_, entry) in c.prompts.items()]
            for key, entry in items:
                if key in out:
                    self._clash(kind, key, out[key][0], s)
                else:
                    out[key] = (s, entry)
        return [entry for _, entry in out.values()]

    def _local(self, ctx: ServerRequestContext[Any, Any], kind: str) -> list[dict[str, Any]]:
        surface = {"resource": "resource", "template": "resource_template", "prompt": "prompt"}[kind]
        principal = self.principal(ctx)
        own = [
            _descriptor(t)
            for t in self.surfaces
            if t.surface == surface and (principal is None or self.policy.allows(principal, t.name))
        ]
        if self.guide is not None and kind in ("resource", "prompt"):
            taken = {e.get("uri") or e.get("name") for e in own}
            guide = self.guide.resources() if kind == "resource" else self.guide.prompts()
            own += [e for e in guide if (e.get("uri") or e.get("name")) not in taken]
        return own

    async def _list(self, ctx: ServerRequestContext[Any, Any], key: str, kind: str) -> dict[str, Any]:
        await self.downstreams.ready()
        local = self._local(ctx, kind)
        seen = {e.get("uri") or e.get("uriTemplate") or e.get("name") for e in local}
        out: dict[str, Any] = {
            key: [
                *local,
                *(
                    e
                    for e in self._merged(ctx, kind)
                    if (e.get("uri") or e.get("uriTemplate") or e.get("name")) not in seen
                ),
            ]
        }
        if ctx.protocol_version in _MODERN:
            # A merged list of servers that come and go: never cached by the client.
            out.update(resultType="complete", ttlMs=0, cacheScope="private")
        if self.caching is not None:
            out.update(ttlMs=self.caching.list_ttl_ms, cacheScope=self.caching.scope)
        return out

    async def list_resources(self, ctx: ServerRequestContext[Any, Any], params: Any) -> dict[str, Any]:
        return await self._list(ctx, "resources", "resource")

    async def list_resource_templates(self, ctx: ServerRequestContext[Any, Any], params: Any) -> dict[str, Any]:
        return await self._list(ctx, "resourceTemplates", "template")

    async def list_prompts(self, ctx: ServerRequestContext[Any, Any], params: Any) -> dict[str, Any]:
        return await self._list(ctx, "prompts", "prompt")

    # -- routing ---------------------------------------------------------------------------------------

    def _owner(self, ctx: ServerRequestContext[Any, Any], uri: str) -> DownstreamServer:
        servers = self._servers(ctx)
        for s in servers:
            if s.catalog.owns(uri):
                return s
        for s in servers:
            if s.catalog.matches(uri):
                return s
        raise MCPError(INVALID_PARAMS, "Resource not found", {"uri": uri})

    def _prompt(self, ctx: ServerRequestContext[Any, Any], name: str) -> tuple[DownstreamServer, str]:
        for s in self._servers(ctx):
            found = s.catalog.prompts.get(name)
            if found is not None:
                return s, found[0]
        raise MCPError(INVALID_PARAMS, f"Unknown prompt: {name}", {"name": name})

    async def _forward(self, server: DownstreamServer, request: Callable[[Any], Awaitable[Any]]) -> dict[str, Any]:
        try:
            result = await request(server.client())
        except CallError as exc:
            raise _rpc_error(exc) from None
        except (MCPError, OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            failure = server.failure(exc)
            raise _rpc_error(failure if isinstance(failure, CallError) else CallError(str(failure))) from None
        out: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        return out

    async def _run_local(self, ctx: ServerRequestContext[Any, Any], tool: Any, args: dict[str, Any]) -> Any:
        if self.run_surface is None:
            raise MCPError(types.INTERNAL_ERROR, f"'{tool.name}' cannot run here")
        return await self.run_surface(ctx, tool, args)

    def _local_resource(self, uri: str) -> tuple[Any, dict[str, Any]] | None:
        for t in self.surfaces:
            if t.surface == "resource" and t.uri == uri:
                return t, {"uri": uri}
        for t, match in self._templates:
            found = match(uri)
            if found is not None:
                return t, {"uri": uri, **found, "template_vars": dict(found)}
        return None

    async def read_resource(
        self, ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> dict[str, Any]:
        uri = str(params.uri)
        local = self._local_resource(uri)
        if local is not None:
            tool, args = local
            result = await self._run_local(ctx, tool, args)
            try:
                out = _local_result(ctx, tool.answer.resource(tool, result, uri))
            except MCPipeError as exc:
                raise _surface_error(exc) from None
            if self.caching is not None:
                out.update(ttlMs=self.caching.read_ttl_ms, cacheScope=self.caching.scope)
            return out
        guide = self.guide.read(uri) if self.guide is not None else None
        if guide is not None:
            out = _local_result(ctx, guide)
            if self.caching is not None:
                out.update(ttlMs=self.caching.read_ttl_ms, cacheScope=self.caching.scope)
            return out
        await self.downstreams.ready()
        server = self._owner(ctx, uri)

        async def read(c: Any, **kw: Any) -> Any:
            return await c.read_resource(uri, **kw)

        return _for_era(ctx, await self._forward(server, lambda _: self._asking(ctx, server, params, read)))

    async def get_prompt(
        self, ctx: ServerRequestContext[Any, Any], params: types.GetPromptRequestParams
    ) -> dict[str, Any]:
        tool = next((t for t in self.surfaces if t.surface == "prompt" and t.name == params.name), None)
        if tool is not None:
            result = await self._run_local(ctx, tool, dict(params.arguments or {}))
            try:
                return _local_result(ctx, tool.answer.prompt(tool, result))
            except MCPipeError as exc:
                raise _surface_error(exc) from None
        guide = self.guide.get(ctx, params.name, params.arguments) if self.guide is not None else None
        if guide is not None:
            return _local_result(ctx, guide)
        await self.downstreams.ready()
        server, remote = self._prompt(ctx, params.name)

        async def get(c: Any, **kw: Any) -> Any:
            return await c.get_prompt(remote, params.arguments, **kw)

        return _for_era(ctx, await self._forward(server, lambda _: self._asking(ctx, server, params, get)))

    async def _asking(
        self, ctx: ServerRequestContext[Any, Any], server: DownstreamServer, params: Any, request: Any
    ) -> Any:
        """A request whose answer may be input-required: relayed like a tool's (``interaction._relay``)."""
        return await request_asking(ctx, server, params, request, modern=ctx.protocol_version in _MODERN)

    def _local_completion(self, params: types.CompleteRequestParams) -> dict[str, Any] | None:
        """A local prompt's or template's static completions: the values starting with what the client typed,
        less those it already gave for other arguments, at most 100."""
        ref = params.ref
        if isinstance(ref, types.PromptReference):
            tool = next((t for t in self.surfaces if t.surface == "prompt" and t.name == ref.name), None)
        else:
            tool = next(
                (t for t in self.surfaces if t.surface == "resource_template" and t.uri_template == ref.uri), None
            )
        if tool is None:
            return None
        values = tool.completions.get(params.argument.name, [])
        used = set((params.context.arguments or {}).values()) if params.context is not None else set()
        found = [v for v in values if v.startswith(params.argument.value) and v not in used]
        return {"completion": {"values": found[:100], "total": len(found), "hasMore": len(found) > 100}}

    async def complete(
        self, ctx: ServerRequestContext[Any, Any], params: types.CompleteRequestParams
    ) -> dict[str, Any]:
        local = self._local_completion(params)
        if local is not None:
            return _local_result(ctx, local)
        await self.downstreams.ready()
        ref = params.ref
        if isinstance(ref, types.PromptReference):
            server, remote = self._prompt(ctx, ref.name)
            ref = types.PromptReference(type="ref/prompt", name=remote)
        else:
            found = [s for s in self._servers(ctx) if s.catalog.has_template(ref.uri)]
            if not found:
                raise MCPError(INVALID_PARAMS, f"Unknown resource template: {ref.uri}", {"uri": ref.uri})
            server = found[0]
        argument = {"name": params.argument.name, "value": params.argument.value}
        context = params.context.arguments if params.context is not None else None
        target = ref
        return _for_era(ctx, await self._forward(server, lambda c: c.complete(target, argument, context)))

    # -- subscriptions -----------------------------------------------------------------------------------

    async def subscribe(
        self, ctx: ServerRequestContext[Any, Any], params: types.SubscribeRequestParams
    ) -> dict[str, Any]:
        uri = str(params.uri)
        server = self._owner(ctx, uri)
        subs = self._subscribers.setdefault(uri, weakref.WeakKeyDictionary())
        conn = _connection(ctx)
        if conn not in subs:
            subs[conn] = ctx.session
            if server.feed.subscribe(uri):
                await self._subscribe_downstream(server, uri, True)
        return {}

    async def unsubscribe(
        self, ctx: ServerRequestContext[Any, Any], params: types.UnsubscribeRequestParams
    ) -> dict[str, Any]:
        uri = str(params.uri)
        subs = self._subscribers.get(uri)
        if subs is not None and subs.pop(_connection(ctx), None) is not None:
            server = self._owner(ctx, uri)
            if server.feed.unsubscribe(uri):
                await self._subscribe_downstream(server, uri, False)
        return {}

    async def _subscribe_downstream(self, server: DownstreamServer, uri: str, on: bool) -> None:
        client = server.client()
        if server.modern:
            # Its subscriptions/listen stream is opened again with the new set (tools._catalog): wait for that.
            if on:
                with trio.move_on_after(5):
                    await server.feed.acked.wait()
            return
        caps = client.server_capabilities
        if not (caps.resources and caps.resources.subscribe):
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # resources/subscribe is the 2025-11-25 way, used towards such servers
            fn = client.subscribe_resource if on else client.unsubscribe_resource
            await self._forward(server, lambda _c: fn(uri))

    async def listen(
        self, ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """A 2026-07-28 client's change stream: the SDK's handler, with its resource URIs subscribed
        downstream for as long as it stays open."""
        uris = [str(u) for u in params.notifications.resource_subscriptions or ()]
        held: list[tuple[DownstreamServer, str]] = []
        for uri in uris:
            try:
                server = self._owner(ctx, uri)
            except MCPError:
                continue  # a URI nobody lists: honored, and never fires (as the spec says)
            held.append((server, uri))
            if server.feed.subscribe(uri):
                with trio.move_on_after(5):
                    await self._subscribe_downstream(server, uri, True)
        try:
            return await self._listen(ctx, params)
        finally:
            for server, uri in held:
                if server.feed.unsubscribe(uri):
                    with trio.CancelScope(shield=True), trio.move_on_after(5):
                        try:
                            await self._subscribe_downstream(server, uri, False)
                        except (MCPError, CallError):
                            pass  # the server went away: nothing to undo there

    # -- notifications from downstream ------------------------------------------------------------------

    async def _changed(self, server: DownstreamServer, change: Change) -> None:
        kind, uri = change
        event: ServerEvent
        if kind == "updated" and uri is not None:
            event = ResourceUpdated(uri=uri)
            targets = list((self._subscribers.get(uri) or {}).values())
        else:
            event = (
                ToolsListChanged()
                if kind == "tools"
                else PromptsListChanged()
                if kind == "prompts"
                else ResourcesListChanged()
            )
            targets = list(self._sessions.values())
        await self.bus.publish(event)
        for session in targets:
            if session.protocol_version in _MODERN:
                continue  # 2026-07-28 clients hear it on their listen streams
            try:
                if kind == "updated":
                    await session.send_resource_updated(uri)
                elif kind == "tools":
                    await session.send_tool_list_changed()
                elif kind == "prompts":
                    await session.send_prompt_list_changed()
                else:
                    await session.send_resource_list_changed()
            except Exception as exc:  # a client that went away: it misses nothing it can still use
                _log.debug("cannot tell a client that %s changed: %s", kind, exc)

    # -- logging ------------------------------------------------------------------------------------------

    async def set_level(
        self, ctx: ServerRequestContext[Any, Any], params: types.SetLevelRequestParams
    ) -> dict[str, Any]:
        """``logging/setLevel`` (2025-11-25): this client's messages at that level and above from now on."""
        self.levels[_connection(ctx)] = params.level
        self._sessions[_connection(ctx)] = ctx.session
        return {}

    def register(self, server: Any) -> None:
        """Register the handlers on the SDK server (its capabilities follow): logging always; resources (with
        subscribe and listChanged), prompts, completions and change streams when there are downstream servers,
        the config's own surfaces, or the guide (whenever ``mcp_pipe`` is served)."""
        add = server.add_request_handler
        add("logging/setLevel", types.SetLevelRequestParams, self.set_level)
        if not self.downstreams.servers and not self.surfaces and self.guide is None:
            return
        add("resources/list", types.PaginatedRequestParams, self.list_resources)
        add("resources/templates/list", types.PaginatedRequestParams, self.list_resource_templates)
        add("resources/read", types.ReadResourceRequestParams, self.read_resource)
        add("resources/subscribe", types.SubscribeRequestParams, self.subscribe)
        add("resources/unsubscribe", types.UnsubscribeRequestParams, self.unsubscribe)
        add("prompts/list", types.PaginatedRequestParams, self.list_prompts)
        add("prompts/get", types.GetPromptRequestParams, self.get_prompt)
        add("completion/complete", types.CompleteRequestParams, self.complete)
        add("subscriptions/listen", types.SubscriptionsListenRequestParams, self.listen)


def _local_result(ctx: ServerRequestContext[Any, Any], result: dict[str, Any]) -> dict[str, Any]:
    """A local surface's result, for the request's era (2026-07-28: complete, never cached)."""
    if ctx.protocol_version in _MODERN:
        return {**result, "resultType": "complete", "ttlMs": 0, "cacheScope": "private"}
    return result


def _surface_error(exc: MCPipeError) -> MCPError:
    """A surface's refusal (``SurfaceError``, ``AccessDenied``: they carry their JSON-RPC code) as the error sent."""
    code = getattr(exc, "rpc_code", None)
    return MCPError(code if isinstance(code, int) else types.INTERNAL_ERROR, str(exc))


def _descriptor(tool: Any) -> dict[str, Any]:
    """The ``resources/list``, ``resources/templates/list`` or ``prompts/list`` entry of a local surface."""
    entry: dict[str, Any] = {"name": tool.name}
    if tool.surface == "resource":
        entry["uri"] = tool.uri
    elif tool.surface == "resource_template":
        entry["uriTemplate"] = tool.uri_template
    if tool.title:
        entry["title"] = tool.title
    if tool.description:
        entry["description"] = tool.description
    if tool.surface == "prompt":
        if tool.arguments:  # optional in MCP: a prompt without arguments lists none
            entry["arguments"] = tool.arguments
    elif tool.mime_type:
        entry["mimeType"] = tool.mime_type
    if tool.meta:
        entry["_meta"] = tool.meta
    return entry


MAX_TEMPLATE_URI_CHARS = 16_384
"""The longest URI matched against a resource template (a longer one matches none: it is not found)."""

_RUST_META = frozenset("\\.+*?()|[]{}^$#&-~")
_SEGMENT_STOPS = frozenset("/?#")


def _rust_escape(text: str) -> str:
    """``text`` as a literal of the Rust core's :class:`~mcpipe._core.Regex` (the ``regex`` crate's
    ``escape``: its meta characters only)."""
    return "".join("\\" + c if c in _RUST_META else c for c in text)


def _template_matcher(template: str) -> Callable[[str], dict[str, str] | None]:
    """A matcher of URIs against an RFC 6570 template's simple form: each ``{name}`` (or ``{+name}``, which
    may span ``/``) matches one segment (a run of at least one character), the rest must be equal; where
    several splits fit, each variable takes the longest it can, the first first (as a backtracking regex's
    ``(.+)``/``([^/?#]+)`` would).

    The URI is the caller's: matched by Python's backtracking ``re``, ``{name}.{ext}`` took time quadratic in
    it (a 32 KB URI of dots held the event loop 4.6 s) and adjacent variables worse, also on URIs that
    match. So whether a URI matches is decided by the Rust core's linear-time engine, and the variables of a
    URI that does are found by :func:`_captures`, in time linear in it; URIs past
    :data:`MAX_TEMPLATE_URI_CHARS` match no template."""
    literals: list[str] = []
    spans: list[bool] = []  # per variable: may it span `/` (`{+name}`)
    names: list[str] = []
    linear = ""
    for literal, expression in _split_template(template):
        literals.append(literal)
        linear += _rust_escape(literal)
        if expression:
            reserved = expression.startswith("+")
            names.append(expression.lstrip("+"))
            spans.append(reserved)
            linear += "(.+)" if reserved else "([^/?#]+)"
    if len(literals) == len(names):  # the template ends with a variable
        literals.append("")
    whole = Regex(f"^(?:{linear})$")

    def match(uri: str) -> dict[str, str] | None:
        if len(uri) > MAX_TEMPLATE_URI_CHARS:
            return None
        try:
            if not whole.search(uri):
                return None
        except UnicodeEncodeError:  # a lone surrogate: no URI
            return None
        found = _captures(literals, spans, uri)
        if found is None:
            return None
        return {name: unquote(value) for name, value in zip(names, found, strict=True)}

    return match


def _stops(c: str, spanning: bool) -> bool:
    """Whether ``c`` ends a variable's run: ``.`` stops at a newline, ``[^/?#]`` at ``/``, ``?`` and ``#``."""
    return c == "\n" if spanning else c in _SEGMENT_STOPS


def _captures(literals: list[str], spans: list[bool], uri: str) -> list[str] | None:
    """The variables' values of ``uri`` (``literals[0] v1 literals[1] ... vk literals[k]``), each variable the
    longest it can be given those before it (the split a backtracking regex finds first), or None.

    Dynamic programming, O(len(uri)) per variable: ``ends[i][e]`` says variable i may end at ``e`` (the
    literal after it is there, and the rest of the template matches what follows), ``starts[p]`` that
    variable i may start at ``p`` (a run of its characters from ``p`` reaches such an end)."""
    n, k = len(uri), len(spans)
    if k == 0:
        return [] if uri == literals[0] else None
    ends: list[bytearray] = []
    starts = bytearray(n + 1)
    for i in range(k - 1, -1, -1):
        lit = literals[i + 1]
        size = len(lit)
        end = bytearray(n + 1)
        if i == k - 1:
            if n >= size and uri.endswith(lit):
                end[n - size] = 1
        else:
            for e in range(n - size + 1):
                if starts[e + size] and uri.startswith(lit, e):
                    end[e] = 1
        ends.append(end)
        starts = bytearray(n + 1)
        reach = False  # an end lies after p, within the run of the variable's characters from p
        for p in range(n - 1, -1, -1):
            if _stops(uri[p], spans[i]):
                reach = False
                continue
            reach = reach or bool(end[p + 1])
            starts[p] = reach
    ends.reverse()
    p = len(literals[0])
    if not uri.startswith(literals[0]) or not starts[p]:
        return None
    out: list[str] = []
    for i in range(k):
        q = p
        while q < n and not _stops(uri[q], spans[i]):
            q += 1
        last = next((e for e in range(q, p, -1) if ends[i][e]), None)
        if last is None:  # cannot be: variable i may start at p
            return None
        out.append(uri[p:last])
        p = last + len(literals[i + 1])
    return out


def _split_template(template: str) -> list[tuple[str, str]]:
    parts = []
    rest = template
    while True:
        start = rest.find("{")
        end = rest.find("}", start + 1) if start >= 0 else -1
        if start < 0 or end < 0:
            parts.append((rest, ""))
            return parts
        parts.append((rest[:start], rest[start + 1 : end]))
        rest = rest[end + 1 :]
