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

import base64
import hashlib
import hmac
import logging
import secrets
import warnings
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import mcp_types as types  # deferred (mcpipe._sdk): its models load when one is first read
import orjson
import trio

from mcpipe import _mcp
from mcpipe._core import Regex
from mcpipe._mcp import INTERNAL_ERROR, INVALID_PARAMS, MODERN_PROTOCOL_VERSIONS
from mcpipe.access import INSUFFICIENT_SCOPE, scope_message
from mcpipe.downstream import Change, DownstreamError, Downstreams, DownstreamServer
from mcpipe.errors import MCPipeError
from mcpipe.gateway import CallError, Policy
from mcpipe.server._apps import AppsPolicy
from mcpipe.server._context import RequestContext
from mcpipe.server._guide import Guide
from mcpipe.server._watch import Watches, subscriber_facts

if TYPE_CHECKING:
    from mcp.server.subscriptions import InMemorySubscriptionBus, ServerEvent
    from mcp.shared.exceptions import MCPError

    from mcpipe.declared import PlanTool

__all__ = ["LOG_LEVELS", "Passthrough", "log_allowed"]

_log = logging.getLogger("mcpipe.server")

_MODERN = frozenset(MODERN_PROTOCOL_VERSIONS)
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
_RANK = {name: i for i, name in enumerate(LOG_LEVELS)}
_ERA_FIELDS = ("ttlMs", "cacheScope", "resultType")
"""2026-07-28 result fields a 2025-11-25 client does not know."""

Principal = Callable[[RequestContext], "str | None"]
RunSurface = Callable[[RequestContext, Any, dict[str, Any]], Awaitable[Any]]
"""Runs a local surface's pipeline for a request: ``(ctx, pipeline, arguments) -> ToolResult``."""
CheckSurface = Callable[[RequestContext, Any], None]
"""Refuses a request for a local surface the caller may not use (raises the ``MCPError`` to answer)."""
RunHidden = Callable[["RequestContext | None", Any, dict[str, Any]], Awaitable[Any]]
"""Runs a hidden pipeline (a completion source, a listing, a watch's read): ``(ctx or None, pipeline, args)``
-> ``ToolResult``, as the server itself (no caller's rights are checked; None: no request at all)."""
ScopeCheck = Callable[[str, str], "tuple[tuple[str, ...], tuple[str, ...]]"]
"""``(kind, name) -> (needed, missing)``: the OAuth scopes a ``prompt`` (by name) or a ``resource`` (by URI, a
template by its URI template) needs, and those the request's caller lacks."""
ScopesOf = Callable[[RequestContext], "ScopeCheck | None"]
"""A request's :data:`ScopeCheck`, or None when no scope rule applies to its caller (none configured, or a local
caller: the operator)."""
MAX_LISTEN_STREAMS = 1024
"""The most ``subscriptions/listen`` streams open at once (the SDK's default)."""
HIDDEN_TIMEOUT_S = 3.0
"""How long a completion source or a listing may take (mcpg's 3 s): past it, it offers or lists nothing."""


def log_allowed(levels: weakref.WeakKeyDictionary[Any, str], ctx: RequestContext, level: str) -> bool:
    """Whether a 2025-11-25 client wants a message at ``level`` (the level it set with ``logging/setLevel``;
    every level before it set one). 2026-07-28 requests carry their own level, applied by the SDK."""
    return level_allows(levels.get(_connection(ctx)), level)


def level_allows(wanted: str | None, level: str) -> bool:
    """Whether a message at ``level`` passes the level a client set (None: it set none, all pass)."""
    return wanted is None or _RANK.get(level, 0) >= _RANK.get(wanted, 0)


def _connection(ctx: RequestContext) -> Any:
    # The SDK's ServerSession is built per request; its connection is the client's (one per 2025-11-25 session).
    return getattr(ctx.session, "_connection", ctx.session)


def _for_era(ctx: RequestContext, result: dict[str, Any]) -> dict[str, Any]:
    if ctx.protocol_version not in _MODERN:
        for k in _ERA_FIELDS:
            result.pop(k, None)
    return result


def _rpc_error(exc: CallError) -> MCPError:
    """A downstream failure as the JSON-RPC error to answer: the server's own, or an internal error naming why."""
    if isinstance(exc, DownstreamError):
        return _mcp.MCPError(exc.error.code, exc.error.message, exc.error.data)
    return _mcp.MCPError(INTERNAL_ERROR, str(exc))


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
        check_surface: CheckSurface | None = None,
        run_hidden: RunHidden | None = None,
        identity: Callable[[RequestContext], Any] | None = None,
        apps: AppsPolicy | None = None,
        content: Any = None,
        scopes: ScopesOf | None = None,
    ) -> None:
        self.downstreams = downstreams
        self.scopes = scopes
        """The OAuth scopes (``[[auth.scopes]]``) each prompt and resource needs of a request's caller: every list
        shows only what they allow, every get, read, subscription and completion of another is refused."""
        self.guide = guide
        """mcpipe's own guide to its pipeline language (resources and a prompt), listed after the config's own."""
        self.caching = caching
        """The config's ``caching`` hints, or None."""
        self.surfaces = list(surfaces or ())
        """The config's own prompts, resources and resource templates (declared pipelines), in config order."""
        self.run_surface = run_surface
        self.check_surface = check_surface
        self.run_hidden = run_hidden
        self.identity = identity
        self.content = content
        """The content stores whose content clients read (:class:`mcpipe.store.content.ContentStores`), or None."""
        self.apps = apps
        """MCP Apps' policy, which every ``_meta.ui`` listed or read is held to (None: apps are off)."""
        self.hidden = {t.name: t for t in self.surfaces if t.surface == "hidden"}
        self.watches = Watches(self.surfaces, self._read_watched)
        self._cursor_key = secrets.token_bytes(32)
        """Signs ``resources/list`` cursors (this process's own): a caller cannot forge a listing's cursor."""
        self._facts: dict[str, weakref.WeakKeyDictionary[Any, dict[str, Any]]] = {}
        """uri -> connection -> the subscriber's identity facts (a watch's ``notify_if`` reads them)."""
        self._local_streams: dict[str, int] = {}
        """uri -> how many 2026-07-28 listen streams hold a local resource's subscription."""
        self._listening = 0
        self._templates = [
            (t, _template_matcher(t.uri_template)) for t in self.surfaces if t.surface == "resource_template"
        ]
        self.policy = policy
        self.principal = principal
        self.levels: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._bus: InMemorySubscriptionBus | None = None
        self._sessions: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        """connection -> the latest request's ServerSession (its standalone channel reaches the client)."""
        self._subscribers: dict[str, weakref.WeakKeyDictionary[Any, Any]] = {}
        self._warned: set[tuple[str, str]] = set()
        for server in downstreams.servers:
            server.feed.changed = self._changed
        downstreams.on_added = self._added

    @property
    def bus(self) -> InMemorySubscriptionBus:
        """The SDK's in-memory bus the 2026-07-28 listen streams hear, made (and the SDK's subscriptions module
        imported) on first use."""
        if self._bus is None:
            from mcp.server.subscriptions import InMemorySubscriptionBus

            self._bus = InMemorySubscriptionBus()
        return self._bus

    @bus.setter
    def bus(self, bus: InMemorySubscriptionBus) -> None:
        self._bus = bus

    def _added(self, server: DownstreamServer) -> None:
        server.feed.changed = self._changed

    async def lists_changed(self) -> None:
        """Tell every connected client that the tool, prompt and resource lists changed (servers came or went)."""
        from mcp.server.subscriptions import PromptsListChanged, ResourcesListChanged, ToolsListChanged

        await self.bus.publish(ToolsListChanged())
        await self.bus.publish(PromptsListChanged())
        await self.bus.publish(ResourcesListChanged())
        for session in list(self._sessions.values()):
            if session.protocol_version in _MODERN:
                continue
            try:
                await session.send_tool_list_changed()
                await session.send_prompt_list_changed()
                await session.send_resource_list_changed()
            except Exception as exc:  # a client that went away
                _log.debug("cannot tell a client the lists changed: %s", exc)

    def start(self, nursery: trio.Nursery) -> None:
        """Start the background work of the config's own resources (their watches) in ``nursery``."""
        self.watches.start(nursery, self._notify_local, self._holders)

    # -- who sees what ---------------------------------------------------------------------------------

    def seen(self, ctx: RequestContext) -> None:
        """Remember the client of a request, to tell it when lists change."""
        self._sessions[_connection(ctx)] = ctx.session

    def _servers(self, ctx: RequestContext, expose: str | None = None) -> list[DownstreamServer]:
        """The servers whose resources or prompts this caller may use (those it may call a tool of, and that its
        trust rules admit: a server's rule is the one its ``<prefix>.*`` names fall under); ``expose``: only the
        servers serving that kind (``resources``, ``resource_templates``, ``prompts``)."""
        self._sessions[_connection(ctx)] = ctx.session
        principal = self.principal(ctx)
        servers = [s for s in self.downstreams.servers if expose is None or expose in s.config.expose]
        if principal is not None:
            servers = [s for s in servers if self._may_use(principal, s)]
        if self.check_surface is not None:
            servers = [s for s in servers if self._trusted(ctx, s)]
        return servers

    def _trusted(self, ctx: RequestContext, server: DownstreamServer) -> bool:
        assert self.check_surface is not None
        try:
            self.check_surface(ctx, _Named(server.exposed("*")))
        except _mcp.MCPError:
            return False
        return True

    def _require_scopes(self, ctx: RequestContext, kind: str, name: str, what: str = "") -> None:
        """Refuse a request of a prompt or resource (``kind``) whose scopes the caller lacks: JSON-RPC
        :data:`~mcpipe.access.INSUFFICIENT_SCOPE`, naming the scopes (over HTTP with an OAuth issuer, the front
        has answered the 403 step-up challenge before)."""
        check = self.scopes(ctx) if self.scopes is not None else None
        if check is None:
            return
        needed, missing = check(kind, name)
        if missing:
            data = {"error": "insufficient_scope", "scope": " ".join(needed), "missing": list(missing)}
            raise _mcp.MCPError(INSUFFICIENT_SCOPE, scope_message(what or kind, name, missing), data)

    def _scoped_entries(self, ctx: RequestContext, kind: str, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The entries of a list the caller's scopes allow (prompts by name, resources by URI, templates by
        their URI template)."""
        check = self.scopes(ctx) if self.scopes is not None else None
        if check is None:
            return entries
        rules, key = {"prompt": ("prompt", "name"), "resource": ("resource", "uri")}.get(
            kind, ("resource", "uriTemplate")
        )
        out = []
        for e in entries:
            name = e.get(key)
            if not check(rules, name if isinstance(name, str) else "")[1]:
                out.append(e)
        return out

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

    def _merged(self, ctx: RequestContext, kind: str) -> list[dict[str, Any]]:
        out: dict[str, tuple[DownstreamServer, dict[str, Any]]] = {}
        expose = {"resource": "resources", "template": "resource_templates"}.get(kind, "prompts")
        for s in self._servers(ctx, expose):
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

    def _local(self, ctx: RequestContext, kind: str) -> list[dict[str, Any]]:
        surface = {"resource": "resource", "template": "resource_template", "prompt": "prompt"}[kind]
        # Listed to the callers who may use it, as tools are (their auth limits and trust rules).
        own = [_descriptor(t) for t in self.surfaces if t.surface == surface and self._may_use_local(ctx, t)]
        if self.guide is not None and kind in ("resource", "prompt"):
            taken = {e.get("uri") or e.get("name") for e in own}
            guide = self.guide.resources(ctx) if kind == "resource" else self.guide.prompts()
            own += [e for e in guide if (e.get("uri") or e.get("name")) not in taken]
        return own

    async def _list(self, ctx: RequestContext, key: str, kind: str, cursor: str | None = None) -> dict[str, Any]:
        await self.downstreams.ready()
        out: dict[str, Any] = {}
        more: dict[str, str]
        if cursor is not None:  # a page of the listings that had more (only `resources/list` gives cursors)
            pages = _decode_cursor(cursor, self._cursor_key, self._cursor_binding(ctx))
            entries, more = await self._listings(ctx, pages)
            out[key] = entries
        else:
            local = self._local(ctx, kind)
            seen = {e.get("uri") or e.get("uriTemplate") or e.get("name") for e in local}
            merged = [
                e
                for e in self._merged(ctx, kind)
                if (e.get("uri") or e.get("uriTemplate") or e.get("name")) not in seen
            ]
            more = {}
            if kind == "resource":
                first: dict[str, str | None] = {t.listing: None for t in self._listed(ctx)}
                listed, more = await self._listings(ctx, first)
                merged += listed
            out[key] = [*local, *merged]
        out[key] = self._scoped_entries(ctx, kind, out[key])  # one rule for every list, whoever serves an entry
        if more:
            out["nextCursor"] = _encode_cursor(more, self._cursor_key, self._cursor_binding(ctx))
        if self.apps is not None and kind != "prompt":
            refused = self.apps.apply(out[key], f"{'resources' if kind == 'resource' else 'resources/templates'}/list")
            if refused is not None:
                raise _mcp.MCPError(INTERNAL_ERROR, refused)
        if ctx.protocol_version in _MODERN:
            # A merged list of servers that come and go: never cached by the client.
            out.update(resultType="complete", ttlMs=0, cacheScope="private")
        if self.caching is not None:
            out.update(ttlMs=self.caching.list_ttl_ms, cacheScope=self.caching.scope)
        return out

    async def list_resources(self, ctx: RequestContext, params: types.PaginatedRequestParams | None) -> dict[str, Any]:
        return await self._list(ctx, "resources", "resource", getattr(params, "cursor", None))

    def _cursor_binding(self, ctx: RequestContext) -> bytes:
        """Whom a ``resources/list`` cursor is for (its session and principal; mcpg binds its cursors to the
        session): another caller's cursor is an invalid one."""
        return orjson.dumps([_session_id(ctx), self.principal(ctx)])

    def _listed(self, ctx: RequestContext) -> list[Any]:
        """The config's resources and templates with a listing that this caller may read."""
        principal = self.principal(ctx)
        out = []
        for t in self.surfaces:
            if t.surface not in ("resource", "resource_template") or getattr(t, "listing", None) is None:
                continue
            if principal is not None and not self.policy.allows(principal, t.name):
                continue
            try:
                if self.check_surface is not None:
                    self.check_surface(ctx, t)
            except _mcp.MCPError:
                continue
            out.append(t)
        return out

    async def _listings(
        self, ctx: RequestContext, pages: dict[str, str | None]
    ) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """One page of each listing named in ``pages`` (listing -> its cursor, None for the first page), in
        config order: their resources, and the listings with more to come (-> their next cursor). A listing that
        fails or takes more than 3 s lists nothing and is not paged further (logged)."""
        allowed = {t.listing for t in self._listed(ctx)}
        entries: list[dict[str, Any]] = []
        more: dict[str, str] = {}
        for name, cursor in pages.items():
            lister = self.hidden.get(name)
            if lister is None or name not in allowed or self.run_hidden is None:
                continue
            with trio.move_on_after(HIDDEN_TIMEOUT_S) as timer:
                result = await self.run_hidden(ctx, lister, {"cursor": cursor})
            output = None if timer.cancelled_caught or result.is_error else _output_of(result)
            if not isinstance(output, dict) or not isinstance(output.get("resources"), list):
                why = "timed out" if timer.cancelled_caught else result.joined_text()
                _log.warning("resources/list: the listing '%s' failed; it lists nothing: %s", name, why)
                continue
            entries += [r for r in output["resources"] if isinstance(r, dict) and isinstance(r.get("uri"), str)]
            following = output.get("next_cursor")
            if isinstance(following, str) and following:
                more[name] = following
        return entries, more

    async def list_resource_templates(
        self, ctx: RequestContext, params: types.PaginatedRequestParams | None
    ) -> dict[str, Any]:
        return await self._list(ctx, "resourceTemplates", "template")

    async def list_prompts(self, ctx: RequestContext, params: types.PaginatedRequestParams | None) -> dict[str, Any]:
        return await self._list(ctx, "prompts", "prompt")

    # -- routing ---------------------------------------------------------------------------------------

    def _owner(self, ctx: RequestContext, uri: str) -> DownstreamServer:
        for s in self._servers(ctx, "resources"):
            if s.catalog.owns(uri):
                return s
        for s in self._servers(ctx, "resource_templates"):
            if s.catalog.matches(uri):
                return s
        raise _mcp.MCPError(INVALID_PARAMS, "Resource not found", {"uri": uri})

    def _prompt(self, ctx: RequestContext, name: str) -> tuple[DownstreamServer, str]:
        for s in self._servers(ctx, "prompts"):
            found = s.catalog.prompts.get(name)
            if found is not None:
                return s, found[0]
        raise _mcp.MCPError(INVALID_PARAMS, f"Unknown prompt: {name}", {"name": name})

    async def _forward(self, server: DownstreamServer, request: Callable[[Any], Awaitable[Any]]) -> dict[str, Any]:
        try:
            result = await request(server.client())
        except CallError as exc:
            raise _rpc_error(exc) from None
        except (_mcp.MCPError, OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            failure = server.failure(exc)
            raise _rpc_error(failure if isinstance(failure, CallError) else CallError(str(failure))) from None
        out: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        return out

    async def _run_local(self, ctx: RequestContext, tool: PlanTool, args: dict[str, Any]) -> Any:
        if self.run_surface is None:
            raise _mcp.MCPError(INTERNAL_ERROR, f"'{tool.name}' cannot run here")
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

    async def read_resource(self, ctx: RequestContext, params: types.ReadResourceRequestParams) -> dict[str, Any]:
        uri = str(params.uri)
        self._require_scopes(ctx, "resource", uri)
        if self.content is not None and self.content.owns(uri):
            return _local_result(ctx, await self._read_content(ctx, uri))
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
            return self._clamped(out, uri)
        guide = self.guide.read(uri, ctx) if self.guide is not None else None
        if guide is not None:
            out = _local_result(ctx, guide)
            if self.caching is not None:
                out.update(ttlMs=self.caching.read_ttl_ms, cacheScope=self.caching.scope)
            return out
        await self.downstreams.ready()
        server = self._owner(ctx, uri)

        async def read(c: Any, **kw: Any) -> Any:
            return await c.read_resource(uri, **kw)

        forwarded = await self._forward(server, lambda _: self._asking(ctx, server, params, read))
        return self._clamped(_for_era(ctx, forwarded), uri)

    async def _read_content(self, ctx: RequestContext, uri: str) -> dict[str, Any]:
        """A content store's content, as mcpg serves its ``mcpg-resource://`` reads (``resource_read_managed``):
        the caller's trust rules as for any resource (by its URI); content another session or principal stored,
        or none, or expired, is the same ``unknown resource``; text types that are UTF-8 as text, the rest as
        base64."""
        if self.check_surface is not None:
            self.check_surface(ctx, _Named(uri))
        content = await self.content.get(uri)
        if content is None or not content.readable_by(_session_id(ctx), self.principal(ctx)):
            raise _mcp.MCPError(INVALID_PARAMS, f"unknown resource: {uri}")
        item: dict[str, Any] = {"uri": uri, "mimeType": content.mime_type}
        textual = content.mime_type.startswith("text/") or content.mime_type in ("application/json", "application/xml")
        try:
            if not textual:
                raise UnicodeDecodeError("", b"", 0, 1, "binary")
            item["text"] = content.data.decode("utf-8")
        except UnicodeDecodeError:
            item["blob"] = base64.b64encode(content.data).decode()
        out = {"contents": [item]}
        if self.caching is not None:
            out.update(ttlMs=self.caching.read_ttl_ms, cacheScope=self.caching.scope)
        return out

    def _clamped(self, result: dict[str, Any], uri: str) -> dict[str, Any]:
        """A read's contents held to MCP Apps' policy (when apps are on)."""
        if self.apps is not None and isinstance(result.get("contents"), list):
            refused = self.apps.apply(result["contents"], uri)
            if refused is not None:
                raise _mcp.MCPError(INTERNAL_ERROR, refused)
        return result

    async def get_prompt(self, ctx: RequestContext, params: types.GetPromptRequestParams) -> dict[str, Any]:
        self._require_scopes(ctx, "prompt", params.name)
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

    async def _asking(self, ctx: RequestContext, server: DownstreamServer, params: Any, request: Any) -> Any:
        """A request whose answer may be input-required: relayed like a tool's (``interaction._relay``)."""
        from mcpipe.interaction import request_asking  # the relay (the SDK), loaded by a first prompt

        return await request_asking(ctx, server, params, request, modern=ctx.protocol_version in _MODERN)

    async def _local_completion(
        self, ctx: RequestContext, params: types.CompleteRequestParams
    ) -> dict[str, Any] | None:
        """A local prompt's or template's completions: its static values starting with what the client typed,
        less those it already gave for other arguments, or the values its completion source (a hidden pipeline)
        answers; at most 100."""
        ref = params.ref
        if isinstance(ref, types.PromptReference):
            tool = next((t for t in self.surfaces if t.surface == "prompt" and t.name == ref.name), None)
        else:
            tool = next(
                (t for t in self.surfaces if t.surface == "resource_template" and t.uri_template == ref.uri), None
            )
        if tool is None or not self._may_use_local(ctx, tool):
            return None  # a prompt or template the caller may not use has no completions for it: unknown
        given = dict(params.context.arguments or {}) if params.context is not None else {}
        source = tool.completions.get(params.argument.name, [])
        if isinstance(source, list):
            used = set(given.values())
            found = [v for v in source if v.startswith(params.argument.value) and v not in used]
        else:
            found = await self._completion_source(ctx, tool, source.pipeline, params.argument.name, params, given)
        return {"completion": {"values": found[:100], "total": len(found), "hasMore": len(found) > 100}}

    async def _completion_source(
        self,
        ctx: RequestContext,
        tool: PlanTool,
        pipeline: str,
        argument: str,
        params: types.CompleteRequestParams,
        given: dict[str, str],
    ) -> list[str]:
        """The values a completion source answers; none when it fails or takes more than 3 s (a completion is a
        hint: the failure is logged, not answered)."""
        source = self.hidden.get(pipeline)
        if source is None or self.run_hidden is None:
            return []
        args = {"argument": argument, "value": params.argument.value, "context": given}
        with trio.move_on_after(HIDDEN_TIMEOUT_S) as timer:
            result = await self.run_hidden(ctx, source, args)
        if timer.cancelled_caught:
            _log.warning("completion of %s.%s: '%s' took more than %g s", tool.name, argument, pipeline, 3.0)
            return []
        output = _output_of(result)
        if result.is_error or not isinstance(output, list):
            _log.warning("completion of %s.%s: '%s' failed: %s", tool.name, argument, pipeline, result.joined_text())
            return []
        return [v for v in output if isinstance(v, str)]

    async def complete(self, ctx: RequestContext, params: types.CompleteRequestParams) -> dict[str, Any]:
        if isinstance(params.ref, types.PromptReference):
            self._require_scopes(ctx, "prompt", params.ref.name)
        else:
            self._require_scopes(ctx, "resource", params.ref.uri, "resource template")
        local = await self._local_completion(ctx, params)
        if local is not None:
            return _local_result(ctx, local)
        await self.downstreams.ready()
        ref = params.ref
        if isinstance(ref, types.PromptReference):
            server, remote = self._prompt(ctx, ref.name)
            ref = types.PromptReference(type="ref/prompt", name=remote)
        else:
            found = [s for s in self._servers(ctx, "resource_templates") if s.catalog.has_template(ref.uri)]
            if not found:
                raise _mcp.MCPError(INVALID_PARAMS, f"Unknown resource template: {ref.uri}", {"uri": ref.uri})
            server = found[0]
        argument = {"name": params.argument.name, "value": params.argument.value}
        context = params.context.arguments if params.context is not None else None
        target = ref
        return _for_era(ctx, await self._forward(server, lambda c: c.complete(target, argument, context)))

    # -- subscriptions -----------------------------------------------------------------------------------

    async def subscribe(self, ctx: RequestContext, params: types.SubscribeRequestParams) -> dict[str, Any]:
        uri = str(params.uri)
        self._require_scopes(ctx, "resource", uri)  # a subscription is a read that keeps arriving
        local = self._local_resource(uri)
        if local is not None:
            # A subscription is a read that keeps arriving: the caller must be allowed to read it.
            self._check_local(ctx, local[0])
            conn = _connection(ctx)
            subs = self._subscribers.setdefault(uri, weakref.WeakKeyDictionary())
            subs[conn] = ctx.session
            facts = self._facts.setdefault(uri, weakref.WeakKeyDictionary())
            facts[conn] = self._subscriber(ctx)
            await self.watches.decide(uri, facts[conn])  # decided now, at the subscriber's cost, and kept
            self._sessions[conn] = ctx.session
            self.watches.subscribed(uri)
            return {}
        server = self._owner(ctx, uri)
        subs = self._subscribers.setdefault(uri, weakref.WeakKeyDictionary())
        conn = _connection(ctx)
        if conn not in subs:
            subs[conn] = ctx.session
            if server.feed.subscribe(uri):
                await self._subscribe_downstream(server, uri, True)
        return {}

    async def unsubscribe(self, ctx: RequestContext, params: types.UnsubscribeRequestParams) -> dict[str, Any]:
        uri = str(params.uri)
        subs = self._subscribers.get(uri)
        if self._local_resource(uri) is not None:
            if subs is not None:
                subs.pop(_connection(ctx), None)
                (self._facts.get(uri) or {}).pop(_connection(ctx), None)
            self.watches.unsubscribed(uri)
            return {}
        if subs is not None and subs.pop(_connection(ctx), None) is not None:
            server = self._owner(ctx, uri)
            if server.feed.unsubscribe(uri):
                await self._subscribe_downstream(server, uri, False)
        return {}

    async def _subscribe_downstream(self, server: DownstreamServer, uri: str, on: bool) -> None:
        client = server.client()
        if server.modern:
            # Its subscriptions/listen stream is opened again with the new set (downstream._catalog): wait for that.
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
        self, ctx: RequestContext, params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """A 2026-07-28 client's change stream: the SDK's handler, with its resource URIs subscribed
        downstream for as long as it stays open."""
        uris = [str(u) for u in params.notifications.resource_subscriptions or ()]
        held: list[tuple[DownstreamServer, str]] = []
        local: list[str] = []
        for uri in uris:
            self._require_scopes(ctx, "resource", uri)
        for uri in uris:
            found = self._local_resource(uri)
            if found is not None:
                self._check_local(ctx, found[0])
                local.append(uri)
                continue
            try:
                server = self._owner(ctx, uri)
            except _mcp.MCPError:
                continue  # a URI nobody lists: honored, and never fires (as the spec says)
            held.append((server, uri))
            if server.feed.subscribe(uri):
                with trio.move_on_after(5):
                    await self._subscribe_downstream(server, uri, True)
        if self._listening >= MAX_LISTEN_STREAMS:
            raise _mcp.MCPError(INTERNAL_ERROR, "Subscription limit reached")
        facts = self._subscriber(ctx)
        # A watched resource's notify_if decides per subscriber, once, off the event loop (the bus's listeners
        # are synchronous); every other event reaches every stream.
        told = {uri: await self.watches.decide(uri, facts) for uri in local if self.watches.watched(uri)}
        # The SDK's handler honours every URI asked for: only those this caller may read are heard (a URI of a
        # server it may not use would otherwise fire once another caller subscribed to it).
        readable = frozenset(local).union(uri for _, uri in held)

        from mcp.server.subscriptions import ListenHandler, ResourceUpdated

        def hears(event: ServerEvent) -> bool:
            if not isinstance(event, ResourceUpdated):
                return True
            return event.uri in readable and told.get(event.uri, not self.watches.watched(event.uri))

        self._listening += 1
        for uri in local:
            self._local_streams[uri] = self._local_streams.get(uri, 0) + 1
            self.watches.subscribed(uri)
        try:
            return await ListenHandler(_HearingBus(self.bus, hears))(ctx, params)
        finally:
            self._listening -= 1
            for uri in local:
                left = self._local_streams.get(uri, 1) - 1
                if left:
                    self._local_streams[uri] = left
                else:
                    self._local_streams.pop(uri, None)
                self.watches.unsubscribed(uri)
            for server, uri in held:
                if server.feed.unsubscribe(uri):
                    with trio.CancelScope(shield=True), trio.move_on_after(5):
                        try:
                            await self._subscribe_downstream(server, uri, False)
                        except (_mcp.MCPError, CallError):
                            pass  # the server went away: nothing to undo there

    # -- the config's own resources: who may subscribe, who is told ------------------------------------

    def _check_local(self, ctx: RequestContext, tool: PlanTool) -> None:
        principal = self.principal(ctx)
        if principal is not None and not self.policy.allows(principal, tool.name):
            raise _mcp.MCPError(INVALID_PARAMS, "Resource not found", {"uri": tool.uri or tool.uri_template})
        if self.check_surface is not None:
            self.check_surface(ctx, tool)

    def _may_use_local(self, ctx: RequestContext, tool: PlanTool) -> bool:
        """Whether the caller may use one of the config's resources, templates or prompts (list it, complete
        its arguments): its auth limits and trust rules allow it."""
        try:
            self._check_local(ctx, tool)
        except _mcp.MCPError:
            return False
        return True

    def _subscriber(self, ctx: RequestContext) -> dict[str, Any]:
        identity = self.identity(ctx) if self.identity is not None else None
        return subscriber_facts(identity, self.principal(ctx))

    def _holders(self, uri: str) -> int:
        return len(self._subscribers.get(uri) or ()) + self._local_streams.get(uri, 0)

    async def _notify_local(self, uri: str) -> int:
        """Tell the subscribers of one of the config's resources that it changed (those its watch lets hear)."""
        told = 0
        facts: Mapping[Any, dict[str, Any]] = self._facts.get(uri) or {}
        for conn, session in list((self._subscribers.get(uri) or {}).items()):
            if not await self.watches.decide(uri, facts.get(conn) or subscriber_facts(None, None)):
                continue
            try:
                await session.send_resource_updated(uri)
                told += 1
            except Exception as exc:  # a client that went away: it misses nothing it can still use
                _log.debug("cannot tell a client that %s changed: %s", uri, exc)
        told += self._local_streams.get(uri, 0)
        from mcp.server.subscriptions import ResourceUpdated

        await self.bus.publish(ResourceUpdated(uri=uri))
        return told

    async def _read_watched(self, tool: PlanTool, uri: str) -> str | None:
        """A watched resource read as the server itself: its first text content, or None (a failed read)."""
        if self.run_hidden is None:
            return None
        result = await self.run_hidden(None, tool, {"uri": uri})
        try:
            contents = tool.answer.resource(tool, result, uri).get("contents") or []
        except MCPipeError:
            return None
        return next((c["text"] for c in contents if isinstance(c, dict) and isinstance(c.get("text"), str)), None)

    # -- notifications from downstream ------------------------------------------------------------------

    async def _changed(self, server: DownstreamServer, change: Change) -> None:
        from mcp.server.subscriptions import PromptsListChanged, ResourcesListChanged, ResourceUpdated, ToolsListChanged

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

    async def set_level(self, ctx: RequestContext, params: types.SetLevelRequestParams) -> dict[str, Any]:
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
        if not self.downstreams.servers and not self.surfaces and self.guide is None and self.content is None:
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


_CURSOR = "l."


def _cursor_mac(key: bytes, binding: bytes, body: str) -> str:
    mac = hmac.new(key, binding + b"\0" + body.encode("ascii"), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def _encode_cursor(pages: dict[str, str], key: bytes, binding: bytes) -> str:
    """A ``resources/list`` cursor: the listings with more to come, each with its own cursor, signed for the
    caller ``binding`` names (``l.<base64url(json)>.<base64url(hmac)>``)."""
    body = base64.urlsafe_b64encode(orjson.dumps(pages)).decode().rstrip("=")
    return f"{_CURSOR}{body}.{_cursor_mac(key, binding, body)}"


def _decode_cursor(cursor: str, key: bytes, binding: bytes) -> dict[str, str | None]:
    """The listings' cursors a ``resources/list`` cursor carries; its signature is checked (in constant time)
    before anything of it is decoded: a forged, altered or another caller's cursor is ``Invalid cursor``."""
    body, _, mac = cursor.removeprefix(_CURSOR).partition(".")
    if not cursor.startswith(_CURSOR) or not body.isascii() or not mac.isascii():
        raise _mcp.MCPError(INVALID_PARAMS, "Invalid cursor")
    if not hmac.compare_digest(_cursor_mac(key, binding, body), mac):
        raise _mcp.MCPError(INVALID_PARAMS, "Invalid cursor")
    try:
        pages = orjson.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (ValueError, orjson.JSONDecodeError):
        raise _mcp.MCPError(INVALID_PARAMS, "Invalid cursor") from None
    if not isinstance(pages, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in pages.items()):
        raise _mcp.MCPError(INVALID_PARAMS, "Invalid cursor")
    return dict(pages)


def _session_id(ctx: RequestContext) -> str | None:
    """The caller's 2025-11-25 session id (``Mcp-Session-Id``), or None."""
    try:
        value = ctx.request.headers.get("mcp-session-id") if ctx.request is not None else None
    except AttributeError:
        return None
    return str(value) if value else None


def _output_of(result: Any) -> Any:
    """A hidden pipeline's output: its structured answer, else its text as JSON (a list is answered as its JSON
    text), else the text."""
    if result.structured is not None:
        return result.structured
    text = result.joined_text()
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


class _Named:
    """A name to check trust rules with (a downstream server's ``<prefix>.*``)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class _HearingBus:
    """One listen stream's view of the shared bus: the events ``hears`` lets through."""

    def __init__(self, bus: InMemorySubscriptionBus, hears: Callable[[ServerEvent], bool]) -> None:
        self._bus = bus
        self._hears = hears

    async def publish(self, event: ServerEvent) -> None:
        await self._bus.publish(event)

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        hears = self._hears
        return self._bus.subscribe(lambda event: listener(event) if hears(event) else None)


def _local_result(ctx: RequestContext, result: dict[str, Any]) -> dict[str, Any]:
    """A local surface's result, for the request's era (2026-07-28: complete, never cached)."""
    if ctx.protocol_version in _MODERN:
        return {**result, "resultType": "complete", "ttlMs": 0, "cacheScope": "private"}
    return result


def _surface_error(exc: MCPipeError) -> MCPError:
    """A surface's refusal (``SurfaceError``, ``AccessDenied``: they carry their JSON-RPC code) as the error sent."""
    code = getattr(exc, "rpc_code", None)
    return _mcp.MCPError(code if isinstance(code, int) else INTERNAL_ERROR, str(exc))


def _descriptor(tool: PlanTool) -> dict[str, Any]:
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
