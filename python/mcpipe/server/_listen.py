"""Serving connections within the process's file descriptors: hypercorn's trio worker, with an accept loop
of mcpipe's own.

hypercorn's worker accepts with ``trio.serve_listeners``, which accepts for as long as the kernel hands it
connections: once the process is out of descriptors (``EMFILE``), every accept fails, is logged with a
traceback ten times a second, and nothing else can open a file or a socket either (a downstream, the run
queue's database). Here the worker is the same (hypercorn's lifespan, ``TCPServer`` and shutdown), and the
accept loop keeps to ``max_connections``, a bound below the descriptor limit:

- up to ``max_connections`` connections are served as usual;
- past it, up to ``SPARE`` more are accepted and answered at once by a small handler that reads the request
  head (within ``OVERFLOW_READ_S``): ``GET /healthz`` gets ``{"ok": true, "busy": true}``, anything else
  ``503`` with ``Retry-After``; then it closes them. So a health check is answered in the middle of a flood,
  and a client is told why it is turned away;
- past both, nothing is accepted until a connection ends (new ones wait in the kernel's backlog);
- an accept that fails for want of descriptors or memory backs off (``BACKOFF_S``) and says so in one line
  per minute, without a traceback;
- each request head has a deadline of its own (``head_timeout_s``, :class:`_HeadTimedServer`): the first from
  the accept, each later one from its first byte. A head that has not arrived by then is answered ``408``
  and its connection closed, so heads dripping a byte at a time hold a slot that long, not hypercorn's
  keep-alive (75 s);
- a connection resting between requests (keep-alive) keeps its slot until ``keep_alive_timeout`` unless the
  slots are all taken: then the one resting longest is closed for the new connection.
"""

from __future__ import annotations

import errno
import logging
import resource
import time
from collections.abc import Awaitable, Callable
from math import inf
from typing import Any

import orjson
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import ShutdownError, raise_shutdown, repr_socket_addr, wrap_app

from mcpipe.server._front import OwnConnection

__all__ = [
    "BACKOFF_S",
    "HEAD_TIMEOUT_S",
    "OVERFLOW_READ_S",
    "SPARE",
    "default_max_connections",
    "serve_bounded",
]

_log = logging.getLogger("mcpipe.http")

SPARE = 32
"""Connections accepted past ``max_connections`` only to be answered at once (``/healthz``, or 503)."""
OVERFLOW_READ_S = 0.5
"""How long such a connection may take to send its request head."""
BACKOFF_S = 0.1
"""How long accepting pauses after the system refused one (no descriptors, no memory)."""
HEAD_TIMEOUT_S = 10.0
"""How long a request head may take to arrive, by default (``[http] head_timeout_s``)."""
_SAY_EVERY_S = 60.0
_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}


def default_max_connections() -> int:
    """The bound the process's descriptor limit allows: the limit less a reserve for everything else the
    server opens (a quarter of it, at most 256), at most 4096, at least 16."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return 4096
    return max(16, min(4096, soft - min(256, soft // 4) - SPARE))


class _Eviction:
    """How a connection resting between requests is closed for a new one: :meth:`set` ends its keep-alive wait
    (the cancel scope its timer waits in, once the timer has begun; at once when the timer begins, if it was set
    before). One per rest, so a stale one cannot end a later wait. No task of its own: the timer restarts on
    every exchange, and a task and nursery each time cost a proxied call about 2% of its CPU."""

    __slots__ = ("evicted", "scope")

    def __init__(self) -> None:
        self.evicted = False
        self.scope: trio.CancelScope | None = None

    def set(self) -> None:
        self.evicted = True
        if self.scope is not None:
            self.scope.cancel()


class _Slots:
    """Counts of connections being served and being turned away, and a wake-up when either goes down; and the
    served connections resting between requests (keep-alive), oldest first, each with the event that closes
    it when a new connection needs its slot."""

    def __init__(self, limit: int, spare: int) -> None:
        self.limit = limit
        self.spare = spare
        self.serving = 0
        self.turning = 0
        self._freed = trio.Event()
        self._resting: dict[object, _Eviction] = {}
        self._waiting: dict[object, _Eviction] = {}
        self.terminated = False

    def free(self) -> bool:
        return self.serving < self.limit or self.turning < self.spare

    async def wait(self) -> None:
        while not self.free():
            await self._freed.wait()

    async def served_slot(self) -> None:
        """Until a served connection ends."""
        while self.serving >= self.limit:
            await self._freed.wait()

    def rest(self, connection: object, evict: _Eviction | None = None) -> _Eviction:
        """Count ``connection`` as resting (evicted with ``evict``, a new one if none); closed at once at
        shutdown (:meth:`terminate`)."""
        evict = _Eviction() if evict is None else evict
        self._resting.pop(connection, None)
        self._resting[connection] = evict
        if self.terminated:
            evict.set()
        return evict

    def waiting(self, connection: object) -> _Eviction:
        """Count ``connection`` (the own front's) as reading a head: not evicted for a new connection, but
        closed at shutdown, as hypercorn closes a connection outside a request."""
        evict = self._waiting[connection] = _Eviction()
        if self.terminated:
            evict.set()
        return evict

    def unwait(self, connection: object) -> None:
        self._waiting.pop(connection, None)

    def terminate(self) -> None:
        """Shutdown: close the connections resting or reading a head (the own front's; hypercorn's close on
        its own ``terminated`` event)."""
        self.terminated = True
        for evict in [*self._resting.values(), *self._waiting.values()]:
            evict.set()

    def wake(self, connection: object) -> None:
        self._resting.pop(connection, None)

    def evict_resting(self) -> bool:
        """Close the connection resting longest, for a new one; False when none rests."""
        if not self._resting:
            return False
        connection = next(iter(self._resting))
        self._resting.pop(connection).set()
        return True

    def done(self, served: bool) -> None:
        if served:
            self.serving -= 1
        else:
            self.turning -= 1
        self._freed.set()
        self._freed = trio.Event()


class _Say:
    """One log line per kind of trouble per minute, saying how often it happened since the last."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._count: dict[str, int] = {}

    def __call__(self, kind: str, message: str, *args: object) -> None:
        now = time.monotonic()
        self._count[kind] = self._count.get(kind, 0) + 1
        if now - self._last.get(kind, -_SAY_EVERY_S) >= _SAY_EVERY_S:
            times = self._count[kind]
            self._last[kind], self._count[kind] = now, 0
            suffix = f" ({times} times in the last minute)" if times > 1 else ""
            _log.warning(message + suffix, *args)


_BUSY_HEALTH = orjson.dumps({"ok": True, "busy": True})


def _busy_body(limit: int) -> bytes:
    return orjson.dumps(
        {
            "error": "busy",
            "error_description": f"the server is serving {limit} connections, the most it serves at once "
            "([http] max_connections); try again",
        }
    )


async def _turn_away(stream: trio.abc.Stream, limit: int) -> None:
    """Answer a connection past the bound: ``/healthz`` briefly, anything else 503; then close it."""
    head = b""
    with trio.move_on_after(OVERFLOW_READ_S):
        while b"\r\n" not in head and len(head) < 4096:
            try:
                chunk = await stream.receive_some(4096)
            except (trio.BrokenResourceError, OSError):
                break
            if not chunk:
                break
            head += chunk
    if head.startswith((b"GET /healthz ", b"GET /healthz?", b"HEAD /healthz ")):
        status, body, extra = b"200 OK", _BUSY_HEALTH, b""
    else:
        status, body, extra = b"503 Service Unavailable", _busy_body(limit), b"retry-after: 1\r\n"
    reply = (
        b"HTTP/1.1 "
        + status
        + b"\r\ncontent-type: application/json\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\nconnection: close\r\n"
        + extra
        + b"\r\n"
        + body
    )
    with trio.move_on_after(OVERFLOW_READ_S):
        try:
            await stream.send_all(reply)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
    with trio.CancelScope(shield=True), trio.move_on_after(OVERFLOW_READ_S):
        await stream.aclose()


def _head_timeout_reply(timeout_s: float) -> bytes:
    body = orjson.dumps(
        {
            "error": "request_timeout",
            "error_description": f"the request head did not arrive within {timeout_s:g} s ([http] head_timeout_s)",
        }
    )
    return (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\nconnection: close\r\n\r\n"
        + body
    )


class _HeadTimedServer(TCPServer):
    """hypercorn's ``TCPServer`` (plain HTTP or TLS) with a deadline on each request head.

    The head of the connection's first request must arrive within ``head_timeout_s`` of the accept; between
    requests the connection is idle (hypercorn's keep-alive bounds that), and the next head must arrive
    within ``head_timeout_s`` of its first byte. hypercorn tells when a request's head is in and when its
    exchange is over (``Updated(idle=False)`` / ``Updated(idle=True)``, sent from inside ``protocol.handle``),
    which is how the deadline knows a head is pending; a body is the front's (``http.body_timeout_s``).
    """

    def __init__(
        self,
        *args: Any,
        head_timeout_s: float,
        slots: _Slots,
        initial: bytes = b"",
        head_deadline: float | None = None,
    ) -> None:
        super().__init__(*args)
        self.head_timeout_s = head_timeout_s
        self.slots = slots
        # The bytes the own front read before handing the connection over, and their head's deadline.
        self._initial = initial
        self._first_deadline = head_deadline
        self._head_deadline = inf
        self._busy = False
        self._evict = _Eviction()

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, Updated):
            # A head is in (the request is served), or an exchange is over (idle: the next head's deadline
            # starts with its first byte; meanwhile the connection rests, and yields its slot under pressure).
            self._busy = not event.idle
            self._head_deadline = inf
            if event.idle:
                self._evict = _Eviction()  # before hypercorn restarts the keep-alive timer, which waits on it
                self.slots.rest(self, self._evict)
            else:
                self.slots.wake(self)
        await super().protocol_send(event)

    async def _idle_timeout(self) -> None:
        """hypercorn's keep-alive timer, which also ends when the connection is evicted for a new one."""
        evict = self._evict
        with trio.move_on_after(self.config.keep_alive_timeout) as evict.scope:
            if evict.evicted:
                evict.scope.cancel()
            await self.context.terminated.wait()
        with trio.CancelScope(shield=True):
            await self._initiate_server_close()

    async def _read_data(self) -> None:
        try:
            await self._read_heads()
        finally:
            self.slots.wake(self)

    async def _read_heads(self) -> None:
        if self._first_deadline is None:
            self._head_deadline = trio.current_time() + self.head_timeout_s
        else:
            self._head_deadline = self._first_deadline
        read_timeout = self.config.read_timeout or inf
        if self._initial:
            first, self._initial = self._initial, b""
            await self.protocol.handle(RawData(first))
        while True:
            with trio.move_on_at(min(trio.current_time() + read_timeout, self._head_deadline)) as waited:
                try:
                    data = await self.stream.receive_some(MAX_RECV)
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    break
            if waited.cancelled_caught:
                if trio.current_time() >= self._head_deadline:
                    await self._head_too_slow()
                    # The keep-alive timer would hold the connection (and its slot) open until it fires.
                    await self.idle_task.stop()
                break
            if data and not self._busy and self._head_deadline == inf:
                self._head_deadline = trio.current_time() + self.head_timeout_s
                self.slots.wake(self)  # a head has begun: no longer resting (its deadline bounds it)
            await self.protocol.handle(RawData(bytes(data)))
            if data == b"":
                break
        await self.protocol.handle(Closed())

    async def _head_too_slow(self) -> None:
        """Tell an HTTP/1 client its head came too slowly (an HTTP/2 connection is closed: it has no such
        status line to send)."""
        if isinstance(self.protocol.protocol, H2Protocol):
            return
        async with self.send_lock:
            with trio.move_on_after(OVERFLOW_READ_S), trio.CancelScope(shield=True):
                try:
                    await self.stream.send_all(_head_timeout_reply(self.head_timeout_s))
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass


async def _accept_loop(
    listener: trio.abc.Listener[trio.abc.Stream],
    handler: Callable[[trio.abc.Stream], Awaitable[None]],
    nursery: trio.Nursery,
    slots: _Slots,
    say: _Say,
) -> None:
    async with listener:  # closed when the server stops
        await _accept_until_cancelled(listener, handler, nursery, slots, say)


async def _accept_until_cancelled(
    listener: trio.abc.Listener[trio.abc.Stream],
    handler: Callable[[trio.abc.Stream], Awaitable[None]],
    nursery: trio.Nursery,
    slots: _Slots,
    say: _Say,
) -> None:
    while True:
        await slots.wait()
        try:
            stream = await listener.accept()
        except OSError as exc:
            if exc.errno not in _CAPACITY_ERRNOS:
                raise
            say(
                "accept",
                "accepting a connection failed: %s (%d connections open); backing off %g s",
                exc.strerror or errno.errorcode.get(exc.errno or 0, "?"),
                slots.serving + slots.turning,
                BACKOFF_S,
            )
            await trio.sleep(BACKOFF_S)
            continue
        if slots.serving >= slots.limit and slots.evict_resting():
            # A connection resting between requests gives its slot to this one (it closes at once).
            with trio.move_on_after(OVERFLOW_READ_S):
                await slots.served_slot()
        if slots.serving < slots.limit:
            slots.serving += 1
            nursery.start_soon(_serve_one, handler, stream, slots)
        else:
            slots.turning += 1
            say("busy", "turning connections away: %d are open ([http] max_connections)", slots.limit)
            nursery.start_soon(_turn_away_one, stream, slots)


async def _serve_one(
    handler: Callable[[trio.abc.Stream], Awaitable[None]], stream: trio.abc.Stream, slots: _Slots
) -> None:
    try:
        await handler(stream)
    finally:
        # hypercorn returns without closing a TLS stream whose handshake failed or was cancelled: the socket
        # would stay open until collected. Closing a closed stream is a no-op.
        await trio.aclose_forcefully(stream)
        slots.done(True)


async def _turn_away_one(stream: trio.abc.Stream, slots: _Slots) -> None:
    try:
        await _turn_away(stream, slots.limit)
    finally:
        slots.done(False)


async def serve_bounded(
    app: Any,
    config: HypercornConfig,
    *,
    max_connections: int,
    head_timeout_s: float = HEAD_TIMEOUT_S,
    front: str = "own",
    shutdown_trigger: Callable[..., Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """hypercorn's ``serve`` (the trio worker, plain HTTP or TLS) with the bounded accept loop and the head
    deadline above; reports the bound URLs through ``task_status`` once listening. ``front``: ``"own"``
    serves plain HTTP/1.1 connections with :mod:`mcpipe.server._front` (hypercorn's protocol for the rest),
    ``"hypercorn"`` every connection with hypercorn's protocol (``[http] front``)."""
    config.set_statsd_logger_class(StatsdLogger)
    wrapped = wrap_app(app, config.wsgi_max_body_size, "asgi")
    lifespan_state: dict[str, Any] = {}
    lifespan = Lifespan(wrapped, config, lifespan_state)
    context = WorkerContext(None)
    slots = _Slots(max_connections, SPARE)
    say = _Say()

    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()

        async with trio.open_nursery() as server_nursery:
            sockets = config.create_sockets()
            listeners: list[trio.abc.Listener[trio.abc.Stream]] = []
            binds = []
            if sockets.secure_sockets:  # `[http] tls`: hypercorn's own TLS listeners, bounded the same way
                ssl_context = config.create_ssl_context()
                assert ssl_context is not None  # hypercorn makes secure sockets only when it has a context
                for sock in sockets.secure_sockets:
                    sock.listen(config.backlog)
                    plain = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
                    listeners.append(trio.SSLListener(plain, ssl_context, https_compatible=True))
                    binds.append(f"https://{repr_socket_addr(sock.family, sock.getsockname())}")
            for sock in sockets.insecure_sockets:
                sock.listen(config.backlog)
                listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
                bind = repr_socket_addr(sock.family, sock.getsockname())
                binds.append(f"http://{bind}")
            state = ConnectionState(lifespan_state.copy())

            async def on_hypercorn(
                stream: trio.abc.Stream, initial: bytes = b"", deadline: float | None = None
            ) -> None:
                server = _HeadTimedServer(
                    wrapped,
                    config,
                    context,
                    state,
                    stream,
                    head_timeout_s=head_timeout_s,
                    slots=slots,
                    initial=initial,
                    head_deadline=deadline,
                )
                await server.run()

            # The own front serves plain HTTP/1.1; what it leaves to hypercorn's protocol: TLS, and the
            # options only hypercorn's reads (`server_names`, raw header names).
            own = front == "own" and not config.server_names and not config.h11_pass_raw_headers

            async def handler(stream: trio.abc.Stream) -> None:
                if own and isinstance(stream, trio.SocketStream):
                    connection = OwnConnection(
                        wrapped,
                        config,
                        context,
                        state,
                        stream,
                        head_timeout_s=head_timeout_s,
                        slots=slots,
                        fallback=on_hypercorn,
                    )
                    await connection.run()
                else:
                    await on_hypercorn(stream)

            task_status.started(binds)
            try:
                async with trio.open_nursery(strict_exception_groups=True) as nursery:
                    if shutdown_trigger is not None:
                        nursery.start_soon(raise_shutdown, shutdown_trigger)
                    nursery.start_soon(raise_shutdown, context.terminate.wait)
                    for listener in listeners:
                        nursery.start_soon(_accept_loop, listener, handler, server_nursery, slots, say)
                    await trio.sleep_forever()
            except BaseExceptionGroup as error:
                _, other_errors = error.split((ShutdownError, KeyboardInterrupt))
                if other_errors is not None:
                    raise other_errors from None
            finally:
                await context.terminated.set()
                slots.terminate()
                server_nursery.cancel_scope.deadline = trio.current_time() + config.graceful_timeout

        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()
