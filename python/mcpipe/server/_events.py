"""Resumable SSE streams (2025-11-25 streamable HTTP): a bounded in-memory event store, one view per session.

The SDK's transport stores every message it sends on an SSE stream (and a priming event when the stream
opens) in an ``EventStore``, and replays them to a client that reconnects with ``Last-Event-ID``. Its
stream ids are the requests' JSON-RPC ids, which every session reuses (``1``, ``2``, ...), so one store
shared by all sessions would mix their streams: :class:`ResumableSessionManager` gives each new session
its own :class:`SessionEvents` view of one :class:`InMemoryEventStore`. A view replays only its own
session's events, so an event id of another session finds nothing.

A replay goes on until its stream has nothing newer, so a message stored while it sends (which the SDK's
transport routes to no live stream yet) goes out with it. The transport's last step before tailing, sending
the resumed stream's new priming event, still has such a moment: a message stored then is sent at the
client's next reconnection.

The store is bounded by event count and by bytes (the messages' JSON size): the oldest events go first,
and a client that reconnects after its events were dropped gets no replay (its request's answer is lost,
as it would be without resumability).
"""

from __future__ import annotations

import contextvars
import itertools
import logging
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import orjson
from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.streamable_http import (
    EventCallback,
    EventId,
    EventMessage,
    EventStore,
    StreamableHTTPServerTransport,
    StreamId,
)
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared._context_streams import ContextSendStream
from mcp_types import JSONRPCMessage
from mcp_types.jsonrpc import INTERNAL_ERROR
from starlette.types import Receive, Scope, Send

from mcpipe.server._core import IDENTITY_SCOPE_KEY, PRINCIPAL_SCOPE_KEY

__all__ = [
    "InMemoryEventStore",
    "ResumableSessionManager",
    "SessionEvents",
    "TenantQuotaExceeded",
    "TooManySessions",
    "session_owner",
    "session_tenant",
]

_log = logging.getLogger("mcpipe.http")
T = TypeVar("T")

DEFAULT_MAX_EVENTS = 10_000
DEFAULT_MAX_BYTES = 16 * 1024 * 1024


class InMemoryEventStore:
    """Events of every session, oldest dropped first beyond ``max_events`` or ``max_bytes``.

    Args:
        max_events: the most events kept (priming events included).
        max_bytes: the most bytes of message JSON kept.
    """

    def __init__(self, *, max_events: int = DEFAULT_MAX_EVENTS, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_events < 1 or max_bytes < 1:
            raise ValueError("the event store needs room for at least one event and one byte")
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.bytes = 0
        # (session, seq) -> (stream, message, size), in the order stored: the front is the oldest.
        self._events: OrderedDict[tuple[int, int], tuple[StreamId, JSONRPCMessage | None, int]] = OrderedDict()
        # (session, stream) -> its seqs, oldest first (they leave from the left as the store drops them).
        self._streams: dict[tuple[int, StreamId], deque[int]] = {}
        self._seq = itertools.count(1)
        self._sessions = itertools.count(1)

    def __len__(self) -> int:
        return len(self._events)

    def session(self) -> SessionEvents:
        """A new session's view."""
        return SessionEvents(self, next(self._sessions))

    def _store(self, session: int, stream: StreamId, message: JSONRPCMessage | None) -> EventId:
        seq = next(self._seq)
        size = 0 if message is None else len(message.model_dump_json(by_alias=True, exclude_unset=True))
        self._events[(session, seq)] = (stream, message, size)
        self._streams.setdefault((session, stream), deque()).append(seq)
        self.bytes += size
        while len(self._events) > self.max_events or (self.bytes > self.max_bytes and len(self._events) > 1):
            (old_session, _), (old_stream, _msg, old_size) = self._events.popitem(last=False)
            self.bytes -= old_size
            seqs = self._streams[(old_session, old_stream)]
            seqs.popleft()
            if not seqs:
                del self._streams[(old_session, old_stream)]
        return str(seq)

    async def _replay(self, session: int, last_event_id: EventId, send: EventCallback) -> StreamId | None:
        try:
            last = int(last_event_id)
        except ValueError:
            return None
        found = self._events.get((session, last))
        if found is None:
            return None
        stream = found[0]
        # Until nothing is newer: a message of the stream stored while this replay sends (the SDK routes it
        # to no live stream yet) goes out with the replay instead of being lost between replay and tail.
        while later := [seq for seq in self._streams.get((session, stream), ()) if seq > last]:
            for seq in later:
                event = self._events.get((session, seq))
                if event is not None and event[1] is not None:
                    await send(EventMessage(event[1], str(seq)))
                last = seq
        return stream


class SessionEvents(EventStore):
    """One session's view of an :class:`InMemoryEventStore` (what the SDK's transport is given)."""

    def __init__(self, store: InMemoryEventStore, session: int) -> None:
        self.store = store
        self.id = session

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        return self.store._store(self.id, stream_id, message)

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        return await self.store._replay(self.id, last_event_id, send_callback)


class TooManySessions(Exception):
    """A principal opening a session past ``max_sessions_per_principal``."""

    def __init__(self, owner: str, limit: int) -> None:
        super().__init__(
            f"too many open sessions for {owner}: {limit}, the most one principal may have "
            "([http] max_sessions_per_principal); end one (DELETE) or let one idle out, then try again"
        )


class TenantQuotaExceeded(TooManySessions):
    """A tenant opening a session past ``max_sessions_per_tenant``: answered as mcpg answers it (HTTP 429,
    JSON-RPC -32099 ``per-tenant session quota exceeded``)."""

    code = -32099

    def __init__(self, tenant: str, limit: int) -> None:
        Exception.__init__(self, "per-tenant session quota exceeded")
        self.detail = f"{tenant} has {limit} sessions open, the most one tenant may ([http] max_sessions_per_tenant)"


_OWNER: contextvars.ContextVar[str | None] = contextvars.ContextVar("mcpipe_session_owner", default=None)
_TENANT: contextvars.ContextVar[str | None] = contextvars.ContextVar("mcpipe_session_tenant", default=None)


def session_owner(scope: Scope) -> str:
    """Whose sessions a request's count against: its principal (bearer auth), else its client's address."""
    principal = scope.get(PRINCIPAL_SCOPE_KEY)
    if principal is not None:
        return f"principal {principal!r}"
    client = scope.get("client")
    return f"client {client[0]}" if client else "client unknown"


def session_tenant(scope: Scope) -> str:
    """The tenant a request's sessions count against (mcpg's ``synthetic_principal_key``): the caller's principal,
    which names its subject in the source that established it (``oidc:<issuer>#alice`` and ``header:alice``
    are two tenants: ``mcpipe.access.Principal``); every anonymous caller shares one, ``anonymous``."""
    identity = scope.get(IDENTITY_SCOPE_KEY)
    principal = scope.get(PRINCIPAL_SCOPE_KEY)
    if principal is None or (identity is not None and identity.trust == "unauthenticated"):
        return "anonymous"
    return str(principal)


class ResumableSessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager, giving every new 2025-11-25 session its own view of ``events``, and each
    principal at most ``max_sessions_per_principal`` sessions (:func:`session_owner`: a principal, or without
    auth a client address), so one cannot take every session (the SDK's ``max_sessions``) from the others.

    The manager hands ``self.event_store`` to each session's transport as it creates it; reading it here
    makes a new view each time.
    """

    def __init__(
        self,
        *args: Any,
        events: InMemoryEventStore | None,
        max_sessions_per_principal: int | None = None,
        max_sessions_per_tenant: int | None = None,
        **kw: Any,
    ) -> None:
        self._events = events
        self.max_sessions_per_principal = max_sessions_per_principal
        self.max_sessions_per_tenant = max_sessions_per_tenant
        self._owner_of: dict[str, tuple[str, str]] = {}  # session id -> its owner and its tenant
        self._owned: dict[str, int] = {}  # owner -> how many sessions it has open
        self._tenants: dict[str, int] = {}  # tenant -> how many sessions it has open
        super().__init__(*args, **kw)

    async def _handle_stateful_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = _OWNER.set(session_owner(scope))
        tenant = _TENANT.set(session_tenant(scope))
        try:
            await super()._handle_stateful_request(scope, receive, send)
        except TooManySessions as exc:  # raised before anything was sent
            code = getattr(exc, "code", INTERNAL_ERROR)
            _log.warning("refused a session: %s", getattr(exc, "detail", exc))
            body = orjson.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": str(exc)}})
            await send(
                {
                    "type": "http.response.start",
                    "status": 429,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"retry-after", b"60"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
        finally:
            _OWNER.reset(token)
            _TENANT.reset(tenant)

    async def _discard_session(self, session_id: str, transport: StreamableHTTPServerTransport) -> None:
        found = self._owner_of.pop(session_id, None)
        if found is not None:
            for counts, key in ((self._owned, found[0]), (self._tenants, found[1])):
                left = counts[key] - 1
                if left:
                    counts[key] = left
                else:
                    del counts[key]
        await super()._discard_session(session_id, transport)

    @property
    def event_store(self) -> EventStore | None:
        return None if self._events is None else self._events.session()

    @event_store.setter
    def event_store(self, value: EventStore | None) -> None:
        if value is not None:
            raise TypeError("give ResumableSessionManager its store as `events`")

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        owner, tenant = _OWNER.get(), _TENANT.get()
        limit = self.max_sessions_per_principal
        if owner is not None and limit is not None and self._owned.get(owner, 0) >= limit:
            raise TooManySessions(owner, limit)
        per_tenant = self.max_sessions_per_tenant
        if tenant is not None and per_tenant is not None and self._tenants.get(tenant, 0) >= per_tenant:
            raise TenantQuotaExceeded(tenant, per_tenant)
        transport = super()._admit_session(requestor)
        if transport is not None:
            transport.__class__ = SessionTransport
            if owner is not None and tenant is not None and transport.mcp_session_id is not None:
                self._owner_of[transport.mcp_session_id] = (owner, tenant)
                self._owned[owner] = self._owned.get(owner, 0) + 1
                self._tenants[tenant] = self._tenants.get(tenant, 0) + 1
        return transport


class SessionTransport(StreamableHTTPServerTransport):
    """The SDK's session transport, dropping a message posted to a session as it closes.

    A client may post a notification (a cancellation, say) while its session ends: the SDK has answered
    202 when it finds the session's stream closed, then logs an error and tries to answer a second time.
    Nothing is lost that the session could still act on, so the message is dropped with a debug line.
    """

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[Any]:
        async with super().connect() as streams:
            writer = self._read_stream_writer
            if writer is not None:
                self._read_stream_writer = _Dropping(writer._inner)
            yield streams


class _Dropping(ContextSendStream[T]):
    __slots__ = ()

    async def send(self, item: T) -> None:
        try:
            await super().send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            _log.debug("dropped a message posted to a session that has closed")
