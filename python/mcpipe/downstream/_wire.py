"""A lean HTTP/1.1 transport for the SDK's streamable-HTTP client, in place of httpcore's pool and h11.

A proxied ``tools/call`` spent about a sixth of the gateway's CPU in httpcore and h11 (profiled under load:
the pool's bookkeeping, a readability poll of every pooled connection per request, h11's header validation
and event objects, two socket writes per request). :class:`LeanTransport` keeps the same contract, below
httpx's client (so auth flows, event hooks, the SDK's redirects within the origin, SSE streaming and
timeouts are all unchanged): each request is written in one ``send`` (head and body together) on a
keep-alive connection, the answer's head is parsed once, and its body streamed as it comes (by
``Content-Length``, chunked, or to the end of the connection). A connection goes back to the pool only
when its answer was read to the end; a cancelled or failed one is closed.

Only plain ``http://`` to a server reached directly takes it (``lean_for``): https and proxied URLs keep
httpx's own transport.
"""

from __future__ import annotations

import math
import os
import select
import urllib.request
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx2
import trio

__all__ = ["LeanBody", "LeanResult", "LeanTransport", "Timeouts", "head_of", "lean_for"]

MAX_HEAD = 65_536
"""The most bytes an answer's status line and headers may take (httpcore's h11 allows about as much)."""
MAX_IDLE = 20
"""Idle keep-alive connections kept per transport (httpcore's default)."""
MAX_CONNECTIONS = 100
"""Connections open at once per transport (httpcore's default); a request past it waits (pool timeout)."""
_READ = 65_536


def lean_for(url: str) -> bool:
    """Whether ``url`` is one :class:`LeanTransport` serves: plain http, no proxy configured for it."""
    if not url.startswith("http://"):
        return False
    proxies = urllib.request.getproxies_environment()
    if not ({"http", "all"} & proxies.keys()):
        return True
    host = httpx2.URL(url).host
    return bool(urllib.request.proxy_bypass(host))  # reads no_proxy from the environment


class _Conn:
    """A keep-alive connection. Its socket is written and read with plain system calls while they need not wait
    (trio's socket methods pass through the scheduler even then); only a wait goes through trio."""

    __slots__ = ("buf", "fd", "key", "poller", "stream")

    def __init__(self, key: tuple[str, int], stream: trio.SocketStream) -> None:
        self.key = key
        self.stream = stream
        self.fd = stream.socket.fileno()
        self.buf = bytearray()
        self.poller = select.poll()  # for stale(): registered once, asked at each reuse
        self.poller.register(self.fd, select.POLLIN)

    async def send(self, message: bytes) -> None:
        try:
            sent = os.write(self.fd, message)
        except BlockingIOError:
            sent = 0
        if sent < len(message):
            await self.stream.send_all(memoryview(message)[sent:])

    async def receive(self) -> bytes:
        while True:
            try:
                return os.read(self.fd, _READ)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.stream.socket)

    def close(self) -> None:
        self.stream.socket.close()

    def stale(self) -> bool:
        """An idle connection with something to read has been closed by the server (or is out of step)."""
        if self.buf:
            return True
        if self.stream.socket.fileno() != self.fd:
            return True  # closed
        try:
            return bool(self.poller.poll(0))
        except (OSError, ValueError):
            return True


Timeouts = Mapping[str, "float | None"]
"""httpx's timeouts of a request (``Timeout.as_dict()``: pool, connect, write, read), None for none."""


def _timeout(timeouts: Timeouts, which: str) -> float:
    value = timeouts.get(which)
    return math.inf if value is None else float(value)


def head_of(request: httpx2.Request) -> bytes:
    """The request line and headers :class:`LeanTransport` writes for ``request``, up to its body."""
    lines = [request.method.encode(), b" ", request.url.raw_path, b" HTTP/1.1\r\n"]
    for name, value in request.headers.raw:
        lines += (name, b": ", value, b"\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


class LeanTransport(httpx2.AsyncBaseTransport):
    """Keep-alive HTTP/1.1 over trio sockets, for the requests of one downstream client."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._slots = trio.Semaphore(MAX_CONNECTIONS)
        self._closed = False

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        if url.scheme != "http":
            raise httpx2.UnsupportedProtocol(f"the lean transport speaks http only, not {url.scheme}", request=request)
        try:
            body = request.content
        except httpx2.RequestNotRead:
            body = await request.aread()
        timeouts = request.extensions.get("timeout", {})
        status, reason, headers, stream = await self.exchange(
            (url.host, url.port or 80), head_of(request) + body, timeouts, request, head_only=request.method == "HEAD"
        )
        return httpx2.Response(
            status,
            headers=headers,
            stream=stream,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason},
        )

    async def exchange(
        self,
        key: tuple[str, int],
        message: bytes,
        timeouts: Timeouts,
        request: httpx2.Request | None = None,
        *,
        head_only: bool = False,
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]], LeanBody]:
        """Send ``message`` (a whole HTTP/1.1 request, head and body) to ``key`` and read the answer's head: its
        status, reason, headers and body as it comes. The transport's own request path, and the lean call's
        without httpx's ``Request`` (``request`` only names the request in errors, when there is one).

        Raises:
            httpx2.TransportError: a timeout, or the connection failing, as httpx's transports raise them.
        """
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            with trio.move_on_after(_timeout(timeouts, "pool")) as waited:
                await self._slots.acquire()
            if waited.cancelled_caught:
                raise httpx2.PoolTimeout("no connection to the server came free in time", request=request) from None
        released = False
        try:
            conn = await self._connection(key, timeouts, request)
            try:
                status, reason, headers = await self._exchange(conn, message, timeouts, request)
            except _Stale:
                conn.close()  # the server closed it between requests: once more, on a new connection
                conn = await self._connect(key, timeouts, request)
                status, reason, headers = await self._exchange(conn, message, timeouts, request, fresh=True)
            body = LeanBody(self, conn, headers, timeouts, request, head_only or status in (204, 304))
            released = True
            return status, reason, headers, body
        finally:
            if not released:
                self._slots.release()

    async def _connection(self, key: tuple[str, int], timeouts: Timeouts, request: httpx2.Request | None) -> _Conn:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.stale():
                return conn
            conn.close()
        return await self._connect(key, timeouts, request)

    async def _connect(self, key: tuple[str, int], timeouts: Timeouts, request: httpx2.Request | None) -> _Conn:
        try:
            with trio.fail_after(_timeout(timeouts, "connect")):
                stream = await trio.open_tcp_stream(*key)
        except trio.TooSlowError:
            raise httpx2.ConnectTimeout(f"connecting to {key[0]}:{key[1]} timed out", request=request) from None
        except OSError as exc:
            raise httpx2.ConnectError(str(exc) or type(exc).__name__, request=request) from None
        return _Conn(key, stream)

    async def _exchange(
        self,
        conn: _Conn,
        message: bytes,
        timeouts: Timeouts,
        request: httpx2.Request | None,
        *,
        fresh: bool = False,
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        """Send ``message`` and read the answer's head, under one deadline (the write timeout, then the read
        timeout once written). Raises _Stale when a reused connection turns out closed before any byte of the
        answer came."""
        reading = False
        with trio.CancelScope(deadline=trio.current_time() + _timeout(timeouts, "write")) as limit:
            try:
                await conn.send(message)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                if not fresh:
                    raise _Stale from None
                conn.close()
                raise httpx2.WriteError(str(exc) or type(exc).__name__, request=request) from None
            reading = True
            limit.deadline = trio.current_time() + _timeout(timeouts, "read")
            try:
                while True:
                    head = await _read_head(conn, request, fresh)
                    status, reason, headers = _parse_head(head, request)
                    if status >= 200 or status == 101:
                        return status, reason, headers
                    fresh = True  # an interim answer (100 Continue): the real one follows
            except _Stale:
                raise
            except BaseException:
                conn.close()
                raise
        conn.close()  # the deadline passed
        if reading:
            raise httpx2.ReadTimeout("reading the answer timed out", request=request)
        raise httpx2.WriteTimeout("writing the request timed out", request=request)

    def _release(self, conn: _Conn, reusable: bool) -> None:
        self._slots.release()
        if not reusable or self._closed:
            conn.close()
            return
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= MAX_IDLE:
            conn.close()
        else:
            idle.append(conn)

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


class _Stale(Exception):
    """A reused connection was closed by the server before it answered (the request never reached it)."""


async def _fill(conn: _Conn, request: httpx2.Request | None) -> bool:
    try:
        chunk = await conn.receive()
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise httpx2.ReadError(str(exc) or type(exc).__name__, request=request) from None
    if not chunk:
        return False
    conn.buf += chunk
    return True


async def _read_head(conn: _Conn, request: httpx2.Request | None, fresh: bool) -> bytes:
    while True:
        end = conn.buf.find(b"\r\n\r\n")
        if end >= 0:
            head = bytes(conn.buf[:end])
            del conn.buf[: end + 4]
            return head
        if len(conn.buf) > MAX_HEAD:
            raise httpx2.RemoteProtocolError("the answer's head is over 64 KiB", request=request)
        empty = not conn.buf
        try:
            filled = await _fill(conn, request)
        except httpx2.ReadError:
            if empty and not fresh:
                raise _Stale from None  # reset by a server that had closed it: our request was never read
            raise
        if not filled:
            if empty and not fresh:
                raise _Stale
            raise httpx2.RemoteProtocolError("the server closed the connection without an answer", request=request)


def _parse_head(head: bytes, request: httpx2.Request | None) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    lines = head.split(b"\r\n")
    status_line = lines[0].split(b" ", 2)
    try:
        if not status_line[0].startswith(b"HTTP/1."):
            raise ValueError
        status = int(status_line[1])
    except (ValueError, IndexError):
        raise httpx2.RemoteProtocolError(f"not an HTTP/1.1 answer: {lines[0][:80]!r}", request=request) from None
    reason = status_line[2] if len(status_line) > 2 else b""
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise httpx2.RemoteProtocolError(f"a malformed header line: {line[:80]!r}", request=request)
        headers.append((name, value.strip()))
    return status, reason, headers


class LeanBody(httpx2.AsyncByteStream):
    """An answer's body as it comes; its connection back to the pool once read to the end.

    Its head's ``content_type`` (lowercased) and whether it is ``plain`` (no ``Content-Encoding`` to undo, no
    cookie to keep, a UTF-8 text if text) are noted as the head is read, for a reader without httpx's
    ``Response`` (the lean call's direct path, which leaves anything not plain to httpx's ``Response``).
    """

    def __init__(
        self,
        transport: LeanTransport,
        conn: _Conn,
        headers: list[tuple[bytes, bytes]],
        timeouts: Timeouts,
        request: httpx2.Request | None,
        empty: bool,
    ) -> None:
        self._transport = transport
        self._conn: _Conn | None = conn
        self._request = request
        self._read_timeout = _timeout(timeouts, "read")
        self._length: int | None = None
        self._chunked = False
        self._keep = True
        self.content_type = b""
        self.plain = True
        for name, value in headers:
            lower = name.lower()
            if lower == b"content-length":
                try:
                    self._length = int(value)
                except ValueError:
                    self._length = -1
            elif lower == b"transfer-encoding":
                self._chunked = b"chunked" in value.lower()
            elif lower == b"connection":
                self._keep = b"close" not in value.lower()
            elif lower == b"content-type":
                self.content_type = value.lower()
                if b"charset=" in self.content_type and b"utf-8" not in self.content_type:
                    self.plain = False
            elif lower == b"set-cookie" or (lower == b"content-encoding" and value.lower() != b"identity"):
                self.plain = False
        if self._length is not None and self._length < 0:
            raise httpx2.RemoteProtocolError("a malformed Content-Length", request=request)
        if empty:
            self._length, self._chunked = 0, False

    async def read(self) -> bytes:
        """The whole body (a sized one gathered in the connection's buffer, each wait under the read timeout)."""
        conn, length = self._conn, self._length
        if conn is None or length is None or self._chunked:
            return b"".join([part async for part in self])
        with _Reading(self):
            while len(conn.buf) < length:
                await self._more(conn, self._read_timeout)
        data = bytes(conn.buf[:length])
        del conn.buf[:length]
        self._done(self._keep)
        return data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            return
        read_timeout = self._read_timeout
        with _Reading(self):
            if self._chunked:
                parts = self._chunks(conn, read_timeout)
            elif self._length is not None:
                parts = self._sized(conn, self._length, read_timeout)
            else:
                self._keep = False
                parts = self._to_end(conn, read_timeout)
            async for part in parts:
                yield part
        self._done(self._keep)

    async def _more(self, conn: _Conn, limit: float) -> None:
        with trio.CancelScope(deadline=trio.current_time() + limit) as scope:
            if not await _fill(conn, self._request):
                raise httpx2.RemoteProtocolError(
                    "the server closed the connection in the middle of the answer", request=self._request
                )
        if scope.cancelled_caught:
            raise trio.TooSlowError

    async def _sized(self, conn: _Conn, left: int, limit: float) -> AsyncIterator[bytes]:
        while left > 0:
            if not conn.buf:
                await self._more(conn, limit)
            take = bytes(conn.buf[:left])
            del conn.buf[: len(take)]
            left -= len(take)
            yield take

    async def _chunks(self, conn: _Conn, limit: float) -> AsyncIterator[bytes]:
        while True:
            while (end := conn.buf.find(b"\r\n")) < 0:
                if len(conn.buf) > MAX_HEAD:
                    raise httpx2.RemoteProtocolError("a malformed chunk size line", request=self._request)
                await self._more(conn, limit)
            try:
                size = int(bytes(conn.buf[:end]).split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise httpx2.RemoteProtocolError("a malformed chunk size line", request=self._request) from None
            del conn.buf[: end + 2]
            if size == 0:
                while (end := conn.buf.find(b"\r\n")) != 0:  # trailers, then the empty line
                    if end > 0:
                        del conn.buf[: end + 2]
                    else:
                        await self._more(conn, limit)
                del conn.buf[:2]
                return
            async for part in self._sized(conn, size, limit):
                yield part
            while len(conn.buf) < 2:
                await self._more(conn, limit)
            if conn.buf[:2] != b"\r\n":
                raise httpx2.RemoteProtocolError("a chunk not ended by CRLF", request=self._request)
            del conn.buf[:2]

    async def _to_end(self, conn: _Conn, limit: float) -> AsyncIterator[bytes]:
        if conn.buf:
            yield bytes(conn.buf)
            conn.buf.clear()
        while True:
            with trio.fail_after(limit):
                more = await _fill(conn, self._request)
            if not more:
                return
            yield bytes(conn.buf)
            conn.buf.clear()

    def _done(self, reusable: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._transport._release(conn, reusable)

    async def aclose(self) -> None:
        self._done(False)  # not read to the end: the connection is out of step, so it is closed


class _Reading:
    """Around a body's reads: one that fails closes the connection (out of step), a deadline passed is httpx's
    ``ReadTimeout``. A class rather than a generator context manager: it is on every call's path."""

    __slots__ = ("body",)

    def __init__(self, body: LeanBody) -> None:
        self.body = body

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if kind is None:
            return
        self.body._done(False)
        if kind is trio.TooSlowError:
            raise httpx2.ReadTimeout("reading the answer timed out", request=self.body._request) from None


@dataclass(slots=True)
class LeanResult:
    """A plain ``CallToolResult`` (text content only) as read off the wire, in the form mcpipe answers with."""

    content: list[dict[str, Any]]
    structured_content: Any
    is_error: bool
    sent: bool
    """Whether the answer carried ``structuredContent`` (even null)."""
