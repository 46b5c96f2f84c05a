"""What a downstream server offers besides tools, and what it sends outside answers.

:class:`Catalog` holds one server's resources, resource templates and prompts (listed at connect and again
when the server says a list changed), filtered and named by the rules its tools follow: ``include`` and
``exclude`` match their names, prompts take the server's prefix, resource URIs stay as they are.

:class:`Feed` receives the server's notifications on the actor's client session: log messages (forwarded to
the one call in flight, the only caller they can belong to), list changes (the list is fetched again and
mcpipe's clients are told) and resource updates (passed on to the subscribers). On a 2026-07-28 server
changes only come on a ``subscriptions/listen`` stream, which :func:`list_changes` keeps open.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import mcp_types as types
import trio
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcpipe._util import RateLimit, log_safe
from mcpipe.gateway import CallError

if TYPE_CHECKING:
    from mcp import Client

    from mcpipe.downstream._server import DownstreamServer
    from mcpipe.tools import ToolContext

__all__ = ["Catalog", "Change", "DownstreamError", "Feed", "feed_of", "list_changes", "template_regex"]

_log = logging.getLogger("mcpipe.downstream")

LOG_RATE = 50
"""The most log messages one downstream server may send a second, on average (past it they are dropped)."""
LOG_BURST = 200
"""... and at once."""
LOG_MAX_CHARS = 16_384
"""The most characters of one downstream log message passed on (a longer one is cut, as text)."""
LOG_SAY_S = 10.0
"""How often dropped log messages are counted in mcpipe's log."""

_MODERN = frozenset(MODERN_PROTOCOL_VERSIONS)
_PAGES = 100
"""At most this many pages of one list (a server that never stops paging is cut off there)."""

Change = tuple[str, str | None]
"""What changed on a server: ``("tools" | "prompts" | "resources", None)`` or ``("updated", uri)``."""


class DownstreamError(CallError):
    """A downstream server answered a request with a JSON-RPC error: its code, message and data are kept, so a
    direct call answers the caller the same error; a pipeline step fails with it (``TOOL_FAILED``) and
    carries the error object, unchanged, as ``jsonrpc_error`` (``{"code", "message", "data"?}``)."""

    def __init__(self, server: str, error: types.ErrorData) -> None:
        super().__init__(f"MCP server '{server}' answered error {error.code}: {error.message}")
        self.server = server
        self.error = error

    def step_fields(self) -> dict[str, Any]:
        return {"jsonrpc_error": _wire(self.error)}


def _wire(model: Any) -> dict[str, Any]:
    out: dict[str, Any] = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    return out


_EXPRESSION = re.compile(r"\{([+#./;?&]?)([^}]*)\}")


def template_regex(template: str) -> re.Pattern[str]:
    """A regex matching the URIs an RFC 6570 template expands to (loosely: a simple ``{var}`` is one path
    segment, ``{+var}`` and ``{#var}`` anything, query expansions an optional query string)."""
    out, pos = [], 0
    for m in _EXPRESSION.finditer(template):
        out.append(re.escape(template[pos : m.start()]))
        op = m.group(1)
        if op in ("+", "#"):
            out.append(".*")
        elif op in ("?", "&"):
            out.append(r"(?:[?&].*)?")
        elif op in (".", "/", ";"):
            out.append(r"(?:" + re.escape(op) + r"[^?#]*)?")
        else:
            out.append(r"[^/?#]*")
        pos = m.end()
    out.append(re.escape(template[pos:]))
    return re.compile("".join(out) + r"\Z")


class Catalog:
    """One server's resources, templates and prompts as served (wire dicts), with the cache hints it gave."""

    def __init__(self, server: DownstreamServer) -> None:
        self.server = server
        self.resources: dict[str, dict[str, Any]] = {}
        self.templates: list[tuple[re.Pattern[str], dict[str, Any]]] = []
        self.prompts: dict[str, tuple[str, dict[str, Any]]] = {}
        """served name -> (its name on the server, its ``prompts/list`` entry under the served name)"""

    async def refresh(self, client: Client, what: str | None = None) -> None:
        """List the server's resources and templates (``what`` None or ``"resources"``) and prompts (None or
        ``"prompts"``), as far as its capabilities say it has them."""
        caps = client.server_capabilities
        if caps.resources is not None and what in (None, "resources"):
            self.resources = {
                r["uri"]: r
                for r in await _all(client.list_resources, "resources")
                if self.server.keeps(str(r.get("name", "")))
            }
            self.templates = [
                (template_regex(t["uriTemplate"]), t)
                for t in await _all(client.list_resource_templates, "resourceTemplates")
                if self.server.keeps(str(t.get("name", "")))
            ]
        if caps.prompts is not None and what in (None, "prompts"):
            prompts = {}
            for p in await _all(client.list_prompts, "prompts"):
                if self.server.keeps(p["name"]):
                    served = self.server.exposed(p["name"])
                    prompts[served] = (p["name"], {**p, "name": served})
            self.prompts = prompts

    def owns(self, uri: str) -> bool:
        return uri in self.resources

    def matches(self, uri: str) -> bool:
        return any(rx.match(uri) for rx, _ in self.templates)

    def has_template(self, uri_template: str) -> bool:
        return any(t["uriTemplate"] == uri_template for _, t in self.templates)


async def _all(list_fn: Callable[..., Any], key: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(_PAGES):
        page = await (list_fn(cursor=cursor) if cursor else list_fn())
        items += [_wire(x) for x in getattr(page, _ATTRS[key])]
        cursor = page.next_cursor
        if not cursor:
            break
    return items


_ATTRS = {"resources": "resources", "resourceTemplates": "resource_templates", "prompts": "prompts"}


class Feed:
    """The notifications of one server's session, and the calls in flight its log messages can belong to.

    Args:
        server: the actor.
        changed: called with each change, after the server's lists were fetched again (set by
            :class:`~mcpipe.downstream.Downstreams`).
    """

    def __init__(self, server: DownstreamServer) -> None:
        self.server = server
        self.changed: Callable[[DownstreamServer, Change], Awaitable[None]] = _ignore
        self._calls: dict[int, ToolContext] = {}
        self._next = 0
        self._forwarding = 0
        self._idle = trio.Event()
        self._send, self._recv = trio.open_memory_channel[tuple[str, str | None, bool]](256)
        self.subscribed: dict[str, int] = {}
        """URIs some client subscribed to -> how many subscriptions (the server is subscribed once)."""
        self.resubscribe = trio.Event()
        self.acked = trio.Event()
        """Set when the server's listen stream (2026-07-28) has acknowledged the current subscriptions."""
        self._seen: tuple[frozenset[str], frozenset[str], frozenset[str]] | None = None
        self._log_rate = RateLimit(LOG_RATE, LOG_BURST)
        self._log_said = -LOG_SAY_S

    def hooks(self) -> dict[str, Any]:
        """The ``Client`` arguments that route the session's notifications here (and opt in to log messages
        on every 2026-07-28 request: the caller's own level is applied when they are forwarded)."""
        return {"logging_callback": self._log, "message_handler": self._message, "log_level": "debug"}

    def in_call(self, ctx: ToolContext) -> _InCall:
        """``ctx``'s call in flight while entered (a context manager): its server's log messages may go to it."""
        key = self._next
        self._next += 1
        return _InCall(self._calls, key, ctx)

    async def _log(self, params: types.LoggingMessageNotificationParams) -> None:
        # A server's log messages are bounded before they go anywhere: at most LOG_RATE a second (a burst of
        # LOG_BURST), each at most LOG_MAX_CHARS (a longer one is cut, as text); the dropped ones are counted in
        # one line of mcpipe's log every LOG_SAY_S.
        if not self._log_rate.take():
            now = trio.current_time()
            if now >= self._log_said + LOG_SAY_S:
                self._log_said = now
                _log.warning(
                    "downstream %s: dropped %d log messages (more than %d a second)",
                    self.server.name,
                    self._log_rate.dropped(),
                    LOG_RATE,
                )
            return
        data: Any = params.data
        if not isinstance(data, (int, float, bool)) and data is not None:
            text = log_safe(data, LOG_MAX_CHARS) if len(str(data)) > LOG_MAX_CHARS else None
            if text is not None:
                data = text
        # A 2025-11-25 server's log message names no request: it belongs to a call only when exactly one is
        # in flight. With several, any choice could show one client another's messages, so it is dropped.
        if len(self._calls) != 1:
            _log.debug(
                "downstream %s log message with %d calls in flight: %s",
                self.server.name,
                len(self._calls),
                log_safe(data, 256),
            )
            return
        (ctx,) = self._calls.values()
        self._forwarding += 1
        try:
            await ctx.send_log(params.level, data, logger=params.logger)
        finally:
            self._forwarding -= 1
            if self._forwarding == 0:
                self._idle.set()
                self._idle = trio.Event()

    @property
    def busy(self) -> bool:
        """Whether a log callback is forwarding a message now."""
        return self._forwarding > 0

    async def drain(self) -> None:
        """Let log callbacks spawned before a call's answer start (one scheduling round), then wait until
        they have forwarded their messages: the SDK client runs each in a task of its own, so the answer can
        wake the call first, and answering then would close the caller's stream before its last messages."""
        await trio.lowlevel.checkpoint()
        while self._forwarding:
            await self._idle.wait()

    async def _message(self, message: object) -> None:
        # Runs in the session's reader: it must not wait for the session, so changes go to list_changes.
        change: Change | None = None
        if isinstance(message, types.ToolListChangedNotification):
            change = ("tools", None)
        elif isinstance(message, types.PromptListChangedNotification):
            change = ("prompts", None)
        elif isinstance(message, types.ResourceListChangedNotification):
            change = ("resources", None)
        elif isinstance(message, types.ResourceUpdatedNotification):
            change = ("updated", str(message.params.uri))
        if change is not None:
            self._queue(*change, change[0] != "updated")

    def _queue(self, kind: str, uri: str | None, relist: bool) -> None:
        try:
            self._send.send_nowait((kind, uri, relist))
        except trio.WouldBlock:
            _log.warning("downstream %s: too many changes at once; dropped one (%s)", self.server.name, kind)

    def connected(self) -> None:
        """After a (re)connect: a list that differs from what was served before is a change."""
        s = self.server
        now = (frozenset(s.tools), frozenset(s.catalog.prompts), frozenset(s.catalog.resources))
        before, self._seen = self._seen, now
        if before is None:
            return
        for kind, old, new in zip(("tools", "prompts", "resources"), before, now, strict=True):
            if old != new:
                self._queue(kind, None, False)  # listed already, at connect

    async def pump(self) -> None:
        """Apply changes as they come: fetch the changed list again, then tell mcpipe's clients."""
        async for kind, uri, relist in self._recv:
            if relist:
                await self.server.relist(kind)
            await self.changed(self.server, (kind, uri))

    def subscribe(self, uri: str) -> bool:
        """Count a subscription; True when it is the first to ``uri`` (the server must be subscribed)."""
        n = self.subscribed.get(uri, 0)
        self.subscribed[uri] = n + 1
        if n == 0:
            self._relisten()
        return n == 0

    def unsubscribe(self, uri: str) -> bool:
        """Drop a subscription; True when it was the last one to ``uri``."""
        n = self.subscribed.get(uri, 0)
        if n <= 1:
            self.subscribed.pop(uri, None)
            self._relisten()
            return n == 1
        self.subscribed[uri] = n - 1
        return False

    def _relisten(self) -> None:
        self.resubscribe.set()
        self.resubscribe = trio.Event()
        self.acked = trio.Event()


async def _ignore(server: DownstreamServer, change: Change) -> None:
    return None


def feed_of(server: DownstreamServer) -> Feed:
    return Feed(server)


async def list_changes(server: DownstreamServer, client: Client) -> None:
    """For the life of one session: apply the server's changes; on a 2026-07-28 server, also keep a
    ``subscriptions/listen`` stream open for them (its events reach :class:`Feed` as notifications), opened
    again when the set of subscribed resources changes."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.feed.pump)
        if client.protocol_version not in _MODERN:
            return
        caps = client.server_capabilities
        wants = {
            "tools_list_changed": bool(caps.tools and caps.tools.list_changed),
            "prompts_list_changed": bool(caps.prompts and caps.prompts.list_changed),
            "resources_list_changed": bool(caps.resources and caps.resources.list_changed),
        }
        subscribe = bool(caps.resources and caps.resources.subscribe)
        if not any(wants.values()) and not subscribe:
            return
        while True:
            again, acked = server.feed.resubscribe, server.feed.acked
            uris = sorted(server.feed.subscribed) if subscribe else []
            try:
                async with client.listen(**wants, resource_subscriptions=uris) as sub, trio.open_nursery() as n:
                    acked.set()

                    async def drain(sub: Any = sub) -> None:
                        async for _ in sub:
                            pass  # each event also reaches Feed._message as its notification

                    n.start_soon(drain)
                    await again.wait()
                    n.cancel_scope.cancel()
            except Exception as exc:  # the stream failed or was refused: changes are picked up on reconnect
                acked.set()
                _log.warning("downstream %s: no change notifications (%s: %s)", server.name, type(exc).__name__, exc)
                await again.wait()


class _InCall:
    """A call registered in its feed's calls while entered (a class, not a generator: it is entered on every
    downstream call)."""

    __slots__ = ("_calls", "_ctx", "_key")

    def __init__(self, calls: dict[int, ToolContext], key: int, ctx: ToolContext) -> None:
        self._calls, self._key, self._ctx = calls, key, ctx

    def __enter__(self) -> None:
        self._calls[self._key] = self._ctx

    def __exit__(self, *exc: object) -> None:
        del self._calls[self._key]
