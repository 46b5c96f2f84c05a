"""Watched resources: telling a resource's subscribers that it changed (``notifications/resources/updated``).

A declared resource with a ``watch`` (:class:`mcpipe.declared.WatchConfig`) is watched while at least one
client is subscribed to it (``resources/subscribe`` on 2025-11-25, a ``subscriptions/listen`` stream naming it
on 2026-07-28):

- ``poll_ms``: one task per watched URI reads the resource every ``poll_ms`` (as the server itself, through
  :class:`Watches`' ``read``) and hashes its first text content (SHA-256); the first read sets the baseline,
  a different hash later notifies, a failed read changes nothing. The task ends when the last subscriber
  leaves (it checks at each tick, so a client that vanished without unsubscribing stops it too).
- ``webhook_tokens``: ``POST /webhooks/resource-updated/<token>`` (the HTTP front) notifies at once, whoever
  is subscribed.

A notification goes to each subscriber for which the watch's ``notify_if`` holds (CEL over ``subscriber``, its
identity, and ``event``): mcpg's watch engine, its poll and webhook strategies and its notification filter
(``mcpg/src/runtime/watch_engine.rs``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
import trio

from mcpipe.expr import CelExpr, ExpressionError

__all__ = ["Watches", "subscriber_facts"]

_log = logging.getLogger("mcpipe.server")

WATCH_ROOTS = frozenset({"subscriber", "event"})
MAX_DECIDED = 10_000
"""``notify_if`` decisions kept (by URI and subscriber), the oldest dropped first."""

Read = Callable[[Any, str], Awaitable["str | None"]]
"""Reads a watched resource as the server itself: ``(pipeline, uri) -> its first text content, or None``."""
Notify = Callable[[str], Awaitable[int]]
"""Notifies the subscribers of a URI that it changed; answers how many were told."""
Holders = Callable[[str], int]
"""How many clients are subscribed to a URI now."""


def subscriber_facts(identity: object, principal: str | None) -> dict[str, Any]:
    """What a ``notify_if`` reads as ``subscriber``: the subscriber's identity when it subscribed."""
    if identity is None:
        return {
            "principal_id": principal,
            "trust_level": "unauthenticated" if principal is None else "verified",
            "roles": [],
            "groups": [],
            "scopes": [],
            "attributes": {},
        }
    return {
        "principal_id": getattr(identity, "subject", principal),
        "trust_level": getattr(identity, "trust", "verified"),
        "roles": list(getattr(identity, "roles", ()) or ()),
        "groups": list(getattr(identity, "groups", ()) or ()),
        "scopes": list(getattr(identity, "scopes", ()) or ()),
        "attributes": dict(getattr(identity, "attributes", {}) or {}),
    }


class _Watch:
    __slots__ = ("notify_if", "poll_s", "scope", "tool", "uri")

    def __init__(self, tool: object, uri: str, poll_ms: int | None, notify_if: str | None) -> None:
        self.tool = tool
        self.uri = uri
        self.poll_s = poll_ms / 1000 if poll_ms is not None else None
        self.notify_if = CelExpr.compile(notify_if, extra_roots=WATCH_ROOTS) if notify_if else None
        self.scope: trio.CancelScope | None = None


class Watches:
    """The watched resources of a config.

    Args:
        surfaces: the config's declared prompts and resources; those with a ``watch`` are watched.
        read: reads a resource as the server itself.
    """

    def __init__(self, surfaces: list[Any], read: Read) -> None:
        self.read = read
        self._watches: dict[str, _Watch] = {}
        self.tokens: dict[str, str] = {}
        """webhook token -> the URI it notifies."""
        for t in surfaces:
            watch = getattr(t, "watch", None)
            if watch is None or getattr(t, "surface", None) != "resource" or not t.uri:
                continue
            self._watches[t.uri] = _Watch(t, t.uri, watch.poll_ms, watch.notify_if)
            for token in watch.webhook_tokens:
                claimed = self.tokens.get(token)
                if claimed is not None and claimed != t.uri:
                    _log.warning("webhook token of %s also claimed by %s: the later one wins", claimed, t.uri)
                self.tokens[token] = t.uri
        self._nursery: trio.Nursery | None = None
        self.notify: Notify | None = None
        self.holders: Holders = lambda uri: 0
        self._decided: dict[tuple[str, bytes], bool] = {}

    def __bool__(self) -> bool:
        return bool(self._watches)

    def watched(self, uri: str) -> bool:
        return uri in self._watches

    def start(self, nursery: trio.Nursery, notify: Notify, holders: Holders) -> None:
        """Watch from now on in ``nursery``; ``notify`` tells the subscribers, ``holders`` counts them."""
        self._nursery = nursery
        self.notify = notify
        self.holders = holders

    async def decide(self, uri: str, subscriber: Mapping[str, object]) -> bool:
        """Whether a subscriber is told of a change of ``uri`` (its watch's ``notify_if``). The expression reads
        what a caller sent (its subject, its token's claims), so it runs as a caller's expressions do: off the
        event loop, under ``pipe.expression_timeout_ms`` (past it, or failing, the subscriber is not told). A
        decision depends only on the URI and the subscriber's facts: it is kept (at most :data:`MAX_DECIDED`)."""
        watch = self._watches.get(uri)
        if watch is None or watch.notify_if is None:
            return True
        key = (uri, orjson.dumps(subscriber, option=orjson.OPT_SORT_KEYS, default=str))
        known = self._decided.get(key)
        if known is not None:
            return known
        try:
            told = await watch.notify_if.evaluate_async({"subscriber": dict(subscriber), "event": {"uri": uri}}) is True
        except ExpressionError as exc:
            _log.warning("watch of %s: notify_if failed for a subscriber, who is not told: %s", uri, exc)
            told = False
        while len(self._decided) >= MAX_DECIDED:
            self._decided.pop(next(iter(self._decided)))
        self._decided[key] = told
        return told

    def subscribed(self, uri: str) -> None:
        """A client subscribed to ``uri``: its poll task starts if it is not running."""
        watch = self._watches.get(uri)
        if watch is None or watch.poll_s is None or watch.scope is not None or self._nursery is None:
            return
        watch.scope = trio.CancelScope()
        self._nursery.start_soon(self._poll, watch)

    def unsubscribed(self, uri: str) -> None:
        """A client left ``uri``: its poll task stops when nobody is subscribed any more."""
        watch = self._watches.get(uri)
        if watch is not None and watch.scope is not None and self.holders(uri) <= 0:
            watch.scope.cancel()
            watch.scope = None

    async def webhook(self, token: str) -> str | None:
        """A webhook call with ``token``: notifies its resource's subscribers; answers the URI (None: unknown)."""
        uri = self.tokens.get(token)
        if uri is None:
            return None
        _log.info("webhook: %s changed", uri)
        if self.notify is not None:
            await self.notify(uri)
        return uri

    async def _poll(self, watch: _Watch) -> None:
        scope = watch.scope
        assert scope is not None and watch.poll_s is not None
        last: bytes | None = None
        with scope:
            _log.info("watch: polling %s every %g s", watch.uri, watch.poll_s)
            while True:
                await trio.sleep(watch.poll_s)
                if self.holders(watch.uri) <= 0:
                    break
                try:
                    text = await self.read(watch.tool, watch.uri)
                except Exception as exc:  # a failed read is silence, as a transient backend failure is
                    _log.debug("watch: reading %s failed: %s", watch.uri, exc)
                    continue
                if text is None:
                    continue
                digest = hashlib.sha256(text.encode()).digest()
                if last is not None and digest != last and self.notify is not None:
                    told = await self.notify(watch.uri)
                    _log.info("watch: %s changed; %d subscriber(s) told", watch.uri, told)
                last = digest
        if watch.scope is scope:
            watch.scope = None
        _log.info("watch: stopped polling %s", watch.uri)
