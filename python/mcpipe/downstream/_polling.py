"""A downstream's SSE polling passed on to the caller (2025-11-25 streamable HTTP).

A 2025-11-25 server may close the SSE stream of a call in flight and let the client come back for the
rest with ``Last-Event-ID`` (SEP-1699 polling); the SDK's client reconnects by itself. When a downstream
does this during a call made through mcpipe, mcpipe closes its own caller's stream of that request too
(when the caller can resume it: a 2025-11-25 HTTP session with resumable streams), so the caller polls as
it would talking to the downstream directly, and nobody holds a connection the downstream chose to
release.

How the closing is seen, on the downstream HTTP client's hooks (:class:`StreamWatch`): a watched call
carries a token in its ``_meta`` (:data:`CALL_KEY`); the SSE response of its ``POST`` is scanned, as it
streams, for event ids; the client's reconnection is a ``GET`` whose ``Last-Event-ID`` is the last of
them. (The SDK's own per-request resumption callback would tell the ids too, but asking for it turns off
the ``notifications/cancelled`` the SDK sends when the caller gives up, which mcpipe relies on.)

A server that cannot close a stream at all (a stdio server: its SDK's ``close_sse_stream`` does nothing)
can be given the polling by configuration (``sse_poll_ms``): :meth:`StreamWatch.polled` closes the caller's
stream once the call has run that long, and again as it runs on (backing off), as such a server would over
HTTP.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import httpx2
import orjson
import outcome
import trio

from mcpipe.tools import ToolContext

if TYPE_CHECKING:
    from mcp_types import RequestParamsMeta

__all__ = ["CALL_KEY", "StreamWatch"]

CALL_KEY = "io.github.mcpipe/call"
"""The ``_meta`` key of a watched call's token (servers ignore ``_meta`` keys they do not know)."""

Closer = Callable[[], Awaitable[None]]
T = TypeVar("T")

_log = logging.getLogger("mcpipe.downstream")


def _caller_closer(ctx: ToolContext) -> Closer | None:
    """Closes the caller's SSE stream of this request, when it has one it can resume."""
    closer = getattr(ctx.sdk_context, "close_sse_stream", None)
    return closer if callable(closer) else None


class _Scanned(httpx2.AsyncByteStream):
    """A response body passed on unchanged, reporting each SSE event id it carries."""

    def __init__(self, inner: Any, seen: Callable[[str], None]) -> None:
        self._inner = inner
        self._seen = seen

    async def __aiter__(self) -> AsyncIterator[bytes]:
        rest = b""
        async for chunk in self._inner:
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for line in lines:
                if line.startswith(b"id:"):
                    self._seen(line[3:].strip(b"\r").removeprefix(b" ").decode(errors="replace"))
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class StreamWatch:
    """The calls in flight whose caller can be closed, the last event id of each, and the downstream HTTP
    client's hooks (:meth:`install`)."""

    def __init__(self) -> None:
        self._closers: dict[str, Closer] = {}
        self._last: dict[str, str] = {}
        self._by_event: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._closers) + len(self._last) + len(self._by_event)

    def install(self, http: httpx2.AsyncClient) -> None:
        """Watch ``http``'s requests and responses."""
        http.event_hooks["request"].append(self._on_request)
        http.event_hooks["response"].append(self._on_response)

    def watching(self, ctx: ToolContext) -> _Watching:
        """A context manager entering to the ``_meta`` to send a call with (None when its caller has no stream to
        close), the call watched while entered."""
        return _Watching(self, _caller_closer(ctx))

    def _forget(self, token: str) -> None:
        del self._closers[token]
        last = self._last.pop(token, None)
        if last is not None:
            self._by_event.pop(last, None)

    async def polled(self, ctx: ToolContext, every: float | None, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, closing the caller's SSE stream of this request once it has run ``every`` seconds, then
        each time it has run twice as long as at the last close (when ``every`` is set and the caller can
        resume: see :func:`_caller_closer`).

        The call runs in this task (cancelling the caller cancels it, as without polling); only the timer
        is a task of its own, gone when the call ends, however it ends.
        """
        closer = _caller_closer(ctx) if every is not None else None
        if closer is None or every is None:
            return await call()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_close_every, closer, every, ctx.request_id)
            # The call's own outcome, kept out of the nursery so that its errors come out unwrapped.
            result = await outcome.acapture(call)
            nursery.cancel_scope.cancel()
        return result.unwrap()

    def _seen(self, token: str, event_id: str) -> None:
        if token not in self._closers or not event_id:
            return
        old = self._last.get(token)
        if old is not None:
            self._by_event.pop(old, None)
        self._last[token] = event_id
        self._by_event[event_id] = token

    async def _on_request(self, request: httpx2.Request) -> None:
        if request.method != "GET" or not self._by_event:
            return
        last = request.headers.get("last-event-id")
        closer = self._closers.get(self._by_event.get(last, "")) if last else None
        if closer is not None:
            await closer()

    @property
    def hooks(self) -> tuple[Callable[..., Awaitable[None]], ...]:
        """The hooks :meth:`install` adds (a request's sender that does their work itself may skip them)."""
        return (self._on_request, self._on_response)

    def reporter(self, meta: Any) -> Callable[[str], None] | None:
        """Where the SSE event ids of a call sent with ``meta`` (its ``_meta``) go, or None when it is not watched:
        the work of :meth:`install`'s response hook, for a sender without httpx's ``Response``."""
        token = meta.get(CALL_KEY) if isinstance(meta, dict) else None
        if not isinstance(token, str) or token not in self._closers:
            return None
        return lambda event_id: self._seen(token, event_id)

    async def _on_response(self, response: httpx2.Response) -> None:
        request = response.request
        if request.method != "POST" or not self._closers:
            return
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            return
        try:
            meta = orjson.loads(request.content).get("params", {}).get("_meta", {})
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            return
        seen = self.reporter(meta)
        if seen is not None:
            response.stream = _Scanned(response.stream, seen)


class _Watching:
    """A call watched while entered (a class, not a generator: it is entered on every downstream call)."""

    __slots__ = ("_closer", "_token", "_watch")

    def __init__(self, watch: StreamWatch, closer: Closer | None) -> None:
        self._watch, self._closer = watch, closer
        self._token: str | None = None

    def __enter__(self) -> RequestParamsMeta | None:
        if self._closer is None:
            return None
        self._token = token = secrets.token_hex(8)
        self._watch._closers[token] = self._closer
        return cast("RequestParamsMeta", {CALL_KEY: token})

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            self._watch._forget(self._token)


async def _close_every(closer: Closer, first: float, request_id: str | None) -> None:
    """Close at ``first`` seconds into the call, then each time it has run twice as long as at the last close
    (1x, 2x, 4x, ...): a long call costs its caller a few reconnections, never one per ``first``."""
    ran = first
    await trio.sleep(first)
    while True:
        _log.debug("closing the caller's SSE stream of request %s: it polls for the rest", request_id)
        await closer()
        await trio.sleep(ran)
        ran *= 2
