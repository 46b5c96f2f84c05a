"""Resumable SSE streams (2025-11-25 streamable HTTP): a bounded in-memory event store, one view per session.

The SDK's transport stores every message it sends on an SSE stream (and a priming event when the stream
opens) in an ``EventStore``, and replays them to a client that reconnects with ``Last-Event-ID``. Its
stream ids are the requests' JSON-RPC ids, which every session reuses (``1``, ``2``, ...), so one store
shared by all sessions would mix their streams: :class:`ResumableSessionManager` gives each new session
its own :class:`SessionEvents` view of one :class:`InMemoryEventStore`. A view replays only its own
session's events, so an event id of another session finds nothing.

The store is bounded by event count and by bytes (the messages' JSON size): the oldest events go first,
and a client that reconnects after its events were dropped gets no replay (its request's answer is lost,
as it would be without resumability).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from typing import Any

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types import JSONRPCMessage

__all__ = ["InMemoryEventStore", "ResumableSessionManager", "SessionEvents"]

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
        later = [seq for seq in self._streams.get((session, stream), ()) if seq > last]
        for seq in later:
            event = self._events.get((session, seq))
            if event is not None and event[1] is not None:
                await send(EventMessage(event[1], str(seq)))
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


class ResumableSessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager, giving every new 2025-11-25 session its own view of ``events``.

    The manager hands ``self.event_store`` to each session's transport as it creates it; reading it here
    makes a new view each time.
    """

    def __init__(self, *args: Any, events: InMemoryEventStore | None, **kw: Any) -> None:
        self._events = events
        super().__init__(*args, **kw)

    @property
    def event_store(self) -> EventStore | None:
        return None if self._events is None else self._events.session()

    @event_store.setter
    def event_store(self, value: EventStore | None) -> None:
        if value is not None:
            raise TypeError("give ResumableSessionManager its store as `events`")
