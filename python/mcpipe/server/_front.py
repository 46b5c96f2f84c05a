"""mcpipe's own HTTP/1.1 front: the caller's side of every plain HTTP call, with hypercorn's protocol for the
rare cases (``[http] front = "own"``, the default; ``"hypercorn"`` serves every connection with hypercorn's).

hypercorn's HTTP/1.1 path spends most of a trivial call's CPU on the way in and out: h11's pure-Python
parser and event objects, an ``HTTPStream``, a task and a channel per request, a keep-alive timer task
restarted on every exchange. Here one task serves a connection: the request head is parsed in the Rust core
(``mcpipe._core.http1_head``), the ASGI app (the same one: ``_fast``, ``_early``, the SDK) is called in that
task with the scope hypercorn builds, and its answer is written with one ``send_all`` when it has a
``Content-Length`` (head and body together), chunked and flushed per message when it streams (SSE).
``receive`` gives the body as it arrives, then waits on the socket itself for the client to go away, so an
app's disconnect watcher (``_fast`` cancels a running call with it) costs no task of the front's.

What the core does not take as a *plain* head (it is narrower than h11, never wider: an ``Upgrade``/h2c, a
chunked body, obs-fold, a repeated ``Content-Length``, HTTP/2's preface, whatever h11 would refuse) is
handed, with the bytes read so far and the head's deadline, to hypercorn's own protocol on the same
connection (:class:`mcpipe.server._listen._HeadTimedServer`), which answers it as it always has: a 400 for
a bad head, a 101 for h2c. TLS connections stay on hypercorn throughout.

The connection keeps ``_listen``'s rules: the head deadline (``408``), the keep-alive timeout, eviction of
the connection resting longest when the slots are taken, and closing at shutdown when it is not in a
request.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from math import inf
from time import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.protocol.http_stream import ASGIHTTPState
from hypercorn.typing import ASGIVersions, ConnectionState, HTTPScope, ResponseSummary
from hypercorn.utils import UnexpectedMessageError, parse_socket_addr

from mcpipe._core import http1_head

if TYPE_CHECKING:
    from hypercorn.trio.worker_context import WorkerContext

    from mcpipe.server._listen import _Eviction, _Slots

__all__ = ["FRONTS", "OwnConnection"]

FRONTS = ("own", "hypercorn")
"""The values of ``[http] front``."""

MAX_RECV = 2**16
_STREAK = 16
"""Reads and writes in a row that did not wait, after which a connection passes through the scheduler once."""
SKIP_MAX = 2**22
"""The most bytes of a body the app did not read that are read and dropped to keep the connection."""
_CLOSE = 1
_EXPECT_CONTINUE = 2
_ASGI: ASGIVersions = {"spec_version": "2.1", "version": "3.0"}
_SEND_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
_REQUEST, _RESPONSE, _CLOSED = ASGIHTTPState.REQUEST, ASGIHTTPState.RESPONSE, ASGIHTTPState.CLOSED

Fallback = Callable[[trio.abc.Stream, bytes, float], Awaitable[None]]
"""Serve the rest of a connection with hypercorn's protocol: (stream, the bytes read so far, the deadline of
the head they begin)."""


class _Date:
    """The ``date`` header hypercorn writes (``format_date_time`` of now), made once a second."""

    __slots__ = ("second", "value")

    def __init__(self) -> None:
        self.second = -1
        self.value = b""

    def now(self) -> bytes:
        second = int(time())
        if second != self.second:
            self.second = second
            self.value = formatdate(second, usegmt=True).encode("ascii")
        return self.value


_DATE = _Date()


class _Gone(Exception):
    """The client went away (or sent nothing in time): the connection ends without an answer."""


class OwnConnection:
    """One plain-HTTP connection served by the front (see the module's docstring).

    Args:
        app: hypercorn's wrapped ASGI app (``wrap_app``), called as hypercorn calls it.
        config: hypercorn's config (keep-alive timeout, root path, ``date``/``server`` headers, limits).
        context: the worker's context: its ``terminated`` event ends keep-alive.
        state: the lifespan state each request's scope gets a copy of.
        stream: the accepted connection.
        head_timeout_s: how long a request head may take (from the accept, then from its first byte).
        slots: the accept loop's slots (resting connections, eviction, shutdown).
        fallback: serves the connection on with hypercorn's protocol, from the bytes read so far.
    """

    __slots__ = (
        "app",
        "buf",
        "client",
        "config",
        "context",
        "fallback",
        "head_timeout_s",
        "lock",
        "requests",
        "scheme_server",
        "slots",
        "state",
        "streak",
        "stream",
        "waiting",
    )

    def __init__(
        self,
        app: Callable[..., Awaitable[None]],
        config: HypercornConfig,
        context: WorkerContext,
        state: ConnectionState,
        stream: trio.SocketStream,
        *,
        head_timeout_s: float,
        slots: _Slots,
        fallback: Fallback,
    ) -> None:
        self.app = app
        self.config = config
        self.context = context
        self.state = ConnectionState(state)
        self.stream = stream
        self.head_timeout_s = head_timeout_s
        self.slots = slots
        self.fallback = fallback
        self.buf = b""
        self.requests = 0
        self.lock = trio.Lock()  # an app may send from two tasks (an SSE answer and its keep-alive pings)
        self.client: Any = None
        self.scheme_server: Any = None
        self.waiting: _Eviction | None = None
        self.streak = 0  # reads and writes done without passing through the scheduler (see _pass)

    async def run(self) -> None:
        socket = self.stream.socket
        try:
            self.client = parse_socket_addr(socket.family, socket.getpeername())
            self.scheme_server = parse_socket_addr(socket.family, socket.getsockname())
        except OSError:
            return
        handed = False
        try:
            handed = await self._serve()
        except _Gone:
            pass
        finally:
            self.slots.wake(self)
            self.slots.unwait(self)
            if not handed:
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await self.close()

    async def _serve(self) -> bool:
        """Serve requests until the connection ends; True when it was handed to hypercorn's protocol (which
        closed it)."""
        deadline = trio.current_time() + self.head_timeout_s
        max_head = self.config.h11_max_incomplete_size
        while True:
            head = http1_head(self.buf, max_head) if self.buf else None
            while head is None:
                await self._read_head_bytes(deadline)
                head = http1_head(self.buf, max_head)
            if head is False:
                data, self.buf = self.buf, b""
                await self.fallback(self.stream, data, deadline)
                return True
            if not await self._exchange(head):
                return False
            if self.buf:
                deadline = trio.current_time() + self.head_timeout_s  # a pipelined head: begun already
            else:
                await self._rest()
                deadline = trio.current_time() + self.head_timeout_s

    async def _read_head_bytes(self, deadline: float) -> None:
        """Read more of a head, within its deadline (then ``408``); closed at shutdown (no answer)."""
        evict = self.slots.waiting(self)
        read_timeout = self.config.read_timeout or inf
        with trio.move_on_at(min(deadline, trio.current_time() + read_timeout)) as evict.scope:
            if evict.evicted:
                evict.scope.cancel()
            data = await self._receive()
        self.slots.unwait(self)
        if evict.scope.cancelled_caught:
            if not evict.evicted and trio.current_time() >= deadline:
                await self._head_too_slow()
            raise _Gone
        if not data:
            raise _Gone
        self.buf += data

    async def _rest(self) -> None:
        """Between requests: wait for the next head's first byte, up to the keep-alive timeout, yielding the
        slot to a new connection when the slots are taken (as ``_HeadTimedServer`` does)."""
        evict = self.slots.rest(self)
        with trio.move_on_after(self.config.keep_alive_timeout) as evict.scope:
            if evict.evicted:
                evict.scope.cancel()
            data = await self._receive()
        self.slots.wake(self)
        if evict.scope.cancelled_caught or not data:
            raise _Gone
        self.buf = data

    async def _receive(self) -> bytes:
        """What the client sent next (b"" once it is gone). A plain ``read`` while there is something to read:
        trio's socket methods pass through the scheduler even when they need not wait; only a wait does."""
        await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled scope still stops the read, as trio's
        socket = self.stream.socket
        while True:
            try:
                data = os.read(socket.fileno(), MAX_RECV)  # -1 once closed: EBADF, gone
            except BlockingIOError:
                self.streak = 0
                try:
                    await trio.lowlevel.wait_readable(socket)
                except (trio.ClosedResourceError, OSError):
                    return b""
                continue
            except OSError:
                return b""
            await self._pass()
            return data

    async def _pass(self) -> None:
        """Every ``_STREAK``-th read or write that did not wait, one pass through the scheduler: a client that
        keeps the socket full (pipelined requests) cannot starve the others."""
        self.streak += 1
        if self.streak >= _STREAK:
            self.streak = 0
            await trio.lowlevel.cancel_shielded_checkpoint()

    async def _head_too_slow(self) -> None:
        from mcpipe.server._listen import OVERFLOW_READ_S, _head_timeout_reply

        with trio.move_on_after(OVERFLOW_READ_S), trio.CancelScope(shield=True):
            try:
                await self.stream.send_all(_head_timeout_reply(self.head_timeout_s))
            except _SEND_ERRORS:
                pass

    async def write(self, data: bytes) -> bool:
        """Write to the client (shielded, as hypercorn writes); False once it is gone. A plain ``write`` when no
        other write is under way and the socket takes it all; the rest through trio."""
        if not self.lock.locked():
            try:
                sent = os.write(self.stream.socket.fileno(), data)
            except BlockingIOError:
                sent = 0
            except OSError:
                return False
            if sent == len(data):
                await self._pass()
                return True
            data = data[sent:]
        try:
            with trio.CancelScope(shield=True):  # the lock too: a response begun is never cut by a cancel
                async with self.lock:
                    await self.stream.send_all(data)
        except _SEND_ERRORS:
            return False
        return True

    def response_headers(self) -> list[tuple[bytes, bytes]]:
        """hypercorn's ``config.response_headers("h11")``, with the date made once a second."""
        config = self.config
        headers = []
        if config.include_date_header:
            headers.append((b"date", _DATE.now()))
        if config.include_server_header:
            headers.append((b"server", b"hypercorn-h11"))
        for alt_svc in config.alt_svc_headers:
            headers.append((b"alt-svc", alt_svc.encode()))
        return headers

    async def _exchange(self, head: tuple[str, bytes, str, list[tuple[bytes, bytes]], int, int, int]) -> bool:
        """Serve one request; whether the connection is kept for the next."""
        method, target, version, headers, head_len, length, flags = head
        body = self.buf[head_len : head_len + length]
        self.buf = self.buf[head_len + length :]
        path, _, query = target.partition(b"?")
        scope: HTTPScope = {
            "type": "http",
            "http_version": version,
            "asgi": _ASGI,
            "method": method,
            "scheme": "http",
            "path": unquote(path.decode("ascii")),
            "raw_path": path,
            "query_string": query,
            "root_path": self.config.root_path,
            "headers": headers,
            "client": self.client,
            "server": self.scheme_server,
            "state": ConnectionState(self.state.copy()),
            "extensions": {},
        }
        self.requests += 1
        if self.context.max_requests is not None:
            await self.context.mark_request()
        if flags & _EXPECT_CONTINUE:
            continue_head = b"".join(n + b": " + v + b"\r\n" for n, v in self.response_headers())
            if not await self.write(b"HTTP/1.1 100 \r\n" + continue_head + b"\r\n"):
                raise _Gone
        exchange = _Exchange(self, method, version, body, length - len(body), bool(flags & _CLOSE))
        start = time()
        try:
            await self.app(scope, exchange.receive, exchange.send, trio.to_thread.run_sync, trio.from_thread.run)
        except trio.Cancelled:
            raise
        except BaseExceptionGroup as error:
            _, other = error.split(trio.Cancelled)
            if other is None:
                raise
            await self.config.log.exception("Error in ASGI Framework")
        except Exception:
            await self.config.log.exception("Error in ASGI Framework")
        finally:
            exchange.finished = True
        if exchange.state is _REQUEST:
            await exchange.error_response(500)
        if self.config.log.access_logger is not None:
            status = exchange.status if exchange.status is not None else 500
            await self.config.log.access(scope, ResponseSummary(status=status, headers=[]), time() - start)
        keep = exchange.state is _CLOSED and not exchange.close and not exchange.gone
        if keep and exchange.remaining:
            keep = await exchange.skip_body(self.head_timeout_s)
        return keep and not self.context.terminated.is_set()

    async def close(self) -> None:
        """End the connection as hypercorn does: its end of the stream first (so what was written goes before
        the close), then the socket."""
        try:
            await self.stream.send_eof()
        except (trio.BrokenResourceError, trio.BusyResourceError, trio.ClosedResourceError, OSError):
            pass
        await self.stream.aclose()


class _Exchange:
    """One request's ``receive`` and ``send``."""

    __slots__ = (
        "body",
        "chunked",
        "close",
        "conn",
        "finished",
        "gone",
        "head_only",
        "method",
        "remaining",
        "response",
        "state",
        "status",
        "version",
        "watching",
    )

    def __init__(
        self, conn: OwnConnection, method: str, version: str, body: bytes, remaining: int, close: bool
    ) -> None:
        self.conn = conn
        self.method = method
        self.version = version
        self.body: bytes | None = body
        self.remaining = remaining
        self.close = close
        self.state = _REQUEST
        self.finished = False
        self.gone = False
        self.chunked = False
        self.head_only = False
        self.response: dict[str, Any] | None = None
        self.status: int | None = None
        self.watching: trio.Event | None = None

    async def receive(self) -> dict[str, Any]:
        body = self.body
        if body is not None:
            self.body = None
            return {"type": "http.request", "body": body, "more_body": self.remaining > 0}
        if self.gone or self.finished:
            return {"type": "http.disconnect"}
        conn = self.conn
        if self.remaining > 0:
            data = await conn._receive()
            if not data:
                self.gone = True
                return {"type": "http.disconnect"}
            if len(data) > self.remaining:
                data, extra = data[: self.remaining], data[self.remaining :]
                conn.buf += extra
            self.remaining -= len(data)
            return {"type": "http.request", "body": data, "more_body": self.remaining > 0}
        # The body is in: what comes now is the client going away, or its next request (kept for later).
        # One task reads; another that asks meanwhile (an app may watch from two) waits for what it finds.
        while self.watching is not None:
            await self.watching.wait()
            if self.gone:
                return {"type": "http.disconnect"}
        self.watching = watching = trio.Event()
        try:
            while len(conn.buf) <= conn.config.h11_max_incomplete_size:
                data = await conn._receive()
                if not data:
                    self.gone = True
                    return {"type": "http.disconnect"}
                conn.buf += data
            await trio.sleep_forever()  # as hypercorn, which stops reading a client that sends too far ahead
            raise AssertionError("unreachable")
        finally:
            self.watching = None
            watching.set()

    async def skip_body(self, timeout_s: float) -> bool:
        """Read the rest of a body the app left unread (h11 reads a body whether the app asks for it or not,
        and keeps the connection), within ``timeout_s``; False (close the connection) past ``SKIP_MAX``
        bytes, or when it does not come in time."""
        if self.remaining > SKIP_MAX:
            return False
        conn = self.conn
        with trio.move_on_after(timeout_s):
            while self.remaining > 0:
                data = await conn._receive()
                if not data:
                    return False
                if len(data) > self.remaining:
                    conn.buf += data[self.remaining :]
                self.remaining -= min(len(data), self.remaining)
            return True
        return False

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.body" and self.state is _RESPONSE:
            body = message.get("body", b"")
            more = message.get("more_body", False)
            if self.head_only:
                body = b""
            out = self._head() if self.response is not None else b""
            if self.chunked:
                if body:
                    out += b"%x\r\n" % len(body) + bytes(body) + b"\r\n"
                if not more:
                    out += b"0\r\n\r\n"
            elif body:
                out += bytes(body)
            if not more:
                self.state = _CLOSED
            if out and not self.gone and not await self.conn.write(out):
                self.gone = True
        elif kind == "http.response.start" and self.state is _REQUEST:
            headers = message.get("headers", [])
            for name, _ in headers:
                if name[0] == 58:  # b":"
                    raise ValueError("Pseudo headers are not valid")
            self.response = {**message, "headers": [(bytes(n).strip(), bytes(v).strip()) for n, v in headers]}
            self.state = _RESPONSE
            if not any(name.lower() == b"content-length" for name, _ in self.response["headers"]):
                # A streaming answer: its head goes now (a client waits for it before the first event).
                out = self._head()
                if not await self.conn.write(out):
                    self.gone = True
        else:
            raise UnexpectedMessageError(self.state, kind)

    def _head(self) -> bytes:
        """The response head as h11 writes it (once; ``self.response`` is then spent)."""
        response = self.response
        assert response is not None
        self.response = None
        conn = self.conn
        status = self.status = int(response["status"])
        headers: list[tuple[bytes, bytes]] = list(response["headers"])
        headers += conn.response_headers()
        if conn.requests >= conn.config.keep_alive_max_requests:
            headers.append((b"connection", b"close"))
        names = [name.lower() for name, _ in headers]
        if any(
            name == b"connection" and b"close" in (t.strip().lower() for t in value.split(b","))
            for name, (_, value) in zip(names, headers, strict=True)
        ):
            self.close = True
        self.head_only = self.method == "HEAD" or 100 <= status < 200 or status in (204, 304)
        if not (100 <= status < 200 or status in (204, 304)) and b"content-length" not in names:
            # h11's framing (for HEAD, a GET's): chunked to an HTTP/1.1 client, else to the close.
            headers = [h for h, name in zip(headers, names, strict=True) if name != b"transfer-encoding"]
            if self.version == "1.1":
                headers.append((b"Transfer-Encoding", b"chunked"))
                self.chunked = not self.head_only
            elif self.method != "HEAD":
                self.close = True
        if self.close:
            tokens = {
                t.strip().lower()
                for name, value in headers
                if name.lower() == b"connection"
                for t in value.split(b",")
                if t.strip()
            }
            tokens.discard(b"keep-alive")
            tokens.add(b"close")
            headers = [h for h in headers if h[0].lower() != b"connection"]
            headers += [(b"Connection", t) for t in sorted(tokens)]
        lines = [b"HTTP/1.1 %d \r\n" % status]
        lines += [name + b": " + value + b"\r\n" for name, value in headers if name.lower() == b"host"]
        lines += [name + b": " + value + b"\r\n" for name, value in headers if name.lower() != b"host"]
        lines.append(b"\r\n")
        return b"".join(lines)

    async def error_response(self, status: int) -> None:
        """What hypercorn answers for an app that ended before its answer began (or for one it refused)."""
        self.response = {"status": status, "headers": [(b"content-length", b"0"), (b"connection", b"close")]}
        self.close = True
        out = self._head()
        self.state = _CLOSED
        if not self.gone and not await self.conn.write(out):
            self.gone = True
