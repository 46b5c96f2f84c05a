"""A small Trio-native NATS client: publish, and request/reply through an inbox.

``nats-py`` runs on asyncio only, and the part of NATS declared steps need is small, so this speaks the
text protocol itself (``INFO``, ``CONNECT``, ``PUB``/``HPUB``, ``SUB``, ``MSG``/``HMSG``, ``PING``/``PONG``).
One connection per server URL is shared by every step; requests go out with a reply subject under one
wildcard inbox subscription (``_INBOX.<id>.*``) and are matched to their callers by the last token.
Headers are on, so a request nobody listens to is answered at once by the server (status 503, "no
responders") instead of waiting out its timeout.

URLs: ``nats://host:4222``, ``nats://user:password@host:4222``, ``nats://token@host:4222``. TLS is not
spoken: a server that requires it is refused with a clear error.
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import orjson
import trio

from mcpipe.backends._errors import BackendError

__all__ = ["NatsClient", "NatsError", "NatsMessage", "open_nats", "parse_header_block", "parse_nats_url"]

_log = logging.getLogger("mcpipe.backends.nats")
_CRLF = b"\r\n"
MAX_CONTROL_LINE = 64 * 1024


class NatsError(BackendError):
    """A NATS operation failed.

    Attributes:
        code: ``TOOL_FAILED`` (cannot connect, the connection broke, a protocol error), ``TOOL_ERROR`` (no
            responders, the server refused), ``TIMEOUT`` (no reply in time).
    """


@dataclass(frozen=True, slots=True)
class NatsMessage:
    """A message received: its subject, payload, reply subject, headers and (for HMSG) status."""

    subject: str
    data: bytes
    reply: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    status: str | None = None
    description: str = ""


@dataclass(frozen=True, slots=True)
class NatsUrl:
    host: str
    port: int
    user: str | None = None
    password: str | None = None
    token: str | None = None


def parse_nats_url(url: str) -> NatsUrl:
    """``nats://[user:password@|token@]host[:port]``.

    Raises:
        ValueError: another scheme, or no host.
    """
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    if parts.scheme != "nats":
        hint = " (TLS is not supported)" if parts.scheme == "tls" else ""
        raise ValueError(f"a NATS URL is nats://host:port, got scheme {parts.scheme!r}{hint}")
    if not parts.hostname:
        raise ValueError("a NATS URL needs a host: nats://host:4222")
    try:
        port = parts.port or 4222
    except ValueError:
        raise ValueError(f"invalid port in NATS URL {url!r}") from None
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    if user is not None and password is None:
        return NatsUrl(parts.hostname, port, token=user)
    return NatsUrl(parts.hostname, port, user, password)


class NatsClient:
    """One connection to a NATS server.

    Run it in a nursery (``await nursery.start(client.run)``): it connects, completes the handshake, reports
    started, then reads until it is cancelled or the connection breaks (then :attr:`closed` is true and every
    pending request fails).

    Args:
        url: the server (see :func:`parse_nats_url`).
        connect_timeout_s: the TCP connection and the handshake.
        name: the client name the server sees.
    """

    def __init__(self, url: str, *, connect_timeout_s: float = 5.0, name: str = "mcpipe") -> None:
        self.url = url
        self.target = parse_nats_url(url)
        self.connect_timeout_s = connect_timeout_s
        self.name = name
        self.info: dict[str, Any] = {}
        self._stream: trio.SocketStream | None = None
        self._send_lock = trio.Lock()
        self._buffer = bytearray()
        self._inbox = f"_INBOX.{secrets.token_hex(8)}"
        self._sids = itertools.count(1)
        self._tokens = itertools.count(1)
        self._waiting: dict[str, trio.MemorySendChannel[NatsMessage | NatsError]] = {}
        self._subs: dict[str, trio.MemorySendChannel[NatsMessage]] = {}
        self._closed = False
        self._error: str | None = None
        self._scope: trio.CancelScope | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def shown_url(self) -> str:
        """The URL without its user, password or token (for messages)."""
        t = self.target
        return f"nats://{'***@' if t.user or t.token else ''}{t.host}:{t.port}"

    def __repr__(self) -> str:
        return f"<NatsClient {self.url}{' closed' if self._closed else ''}>"

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, then read until cancelled or disconnected.

        Raises:
            NatsError: before it reports started (cannot connect, refused, no answer). Afterwards a broken
                connection ends it quietly: it is :attr:`closed`, and the next step opens a new one.
        """
        t = self.target
        started = False
        try:
            with trio.CancelScope() as scope:
                self._scope = scope
                try:
                    with trio.fail_after(self.connect_timeout_s):
                        self._stream = await trio.open_tcp_stream(t.host, t.port)
                        await self._handshake()
                except trio.TooSlowError:
                    raise NatsError(
                        f"cannot connect to NATS at {self.url}: no answer within {self.connect_timeout_s:g} s"
                    ) from None
                task_status.started()
                started = True
                await self._read_loop()
        except (NatsError, trio.BrokenResourceError, trio.ClosedResourceError, OSError, ValueError) as e:
            if isinstance(e, NatsError):
                self._error = str(e)
            elif started:
                self._error = f"the connection to NATS at {self.url} broke: {e}"
            else:
                self._error = f"cannot connect to NATS at {self.url}: {getattr(e, 'strerror', None) or e}"
            if not started:
                raise NatsError(self._error, getattr(e, "code", "TOOL_FAILED")) from None
            _log.warning("%s", self._error)
        finally:
            self._closed = True
            reason = self._error or f"the connection to NATS at {self.url} is closed"
            for chan in list(self._waiting.values()):
                chan.send_nowait(NatsError(reason))
            self._waiting.clear()
            for sub in list(self._subs.values()):
                sub.close()
            if self._stream is not None:
                with trio.CancelScope(shield=True):
                    await self._stream.aclose()

    async def aclose(self) -> None:
        """Close the connection (its :meth:`run` returns)."""
        if self._scope is not None:
            self._scope.cancel()
        await trio.lowlevel.checkpoint()

    # --- the protocol ---

    async def _handshake(self) -> None:
        line = await self._line()
        if not line.startswith(b"INFO "):
            raise NatsError(f"{self.url} is not a NATS server (it said {line[:40]!r})")
        self.info = orjson.loads(line[5:])
        if self.info.get("tls_required"):
            raise NatsError(f"the NATS server at {self.url} requires TLS, which mcpipe's NATS client does not speak")
        connect: dict[str, Any] = {
            "verbose": False,
            "pedantic": False,
            "lang": "python-trio",
            "version": "1",
            "name": self.name,
            "protocol": 1,
            "headers": bool(self.info.get("headers")),
            "no_responders": bool(self.info.get("headers")),
        }
        t = self.target
        if t.token is not None:
            connect["auth_token"] = t.token
        elif t.user is not None:
            connect["user"], connect["pass"] = t.user, t.password
        await self._send(b"CONNECT " + orjson.dumps(connect) + _CRLF + b"PING" + _CRLF)
        while True:
            line = await self._line()
            if line == b"PONG":
                break
            if line.startswith(b"-ERR"):
                raise NatsError(f"the NATS server at {self.url} refused the connection: {_err(line)}", "TOOL_ERROR")
            if line.startswith(b"INFO ") or line == b"+OK":
                continue
        sid = next(self._sids)
        await self._send(f"SUB {self._inbox}.* {sid}\r\n".encode())

    async def publish(
        self, subject: str, data: bytes, *, reply: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        """Publish ``data`` on ``subject``.

        Raises:
            NatsError: the payload is larger than the server allows, or the connection is gone.
        """
        _check_subject(subject)
        limit = self.info.get("max_payload")
        if isinstance(limit, int) and len(data) > limit:
            raise NatsError(f"the message is {len(data)} bytes; the NATS server allows {limit}", "TOOL_ERROR")
        target = f"{subject} {reply}" if reply else subject
        if headers:
            block = "NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
            hdr = block.encode()
            frame = f"HPUB {target} {len(hdr)} {len(hdr) + len(data)}\r\n".encode() + hdr + data + _CRLF
        else:
            frame = f"PUB {target} {len(data)}\r\n".encode() + data + _CRLF
        await self._send(frame)

    @asynccontextmanager
    async def subscribe(
        self, subject: str, *, queue: str | None = None, max_pending: int = 1000
    ) -> AsyncIterator[trio.MemoryReceiveChannel[NatsMessage]]:
        """Receive the messages on ``subject`` (wildcards allowed) while the block runs.

        Messages past ``max_pending`` unread ones are dropped (the reader never waits on a slow consumer).
        """
        sid = str(next(self._sids))
        send, receive = trio.open_memory_channel[NatsMessage](max_pending)
        self._subs[sid] = send
        try:
            await self._send(f"SUB {subject}{' ' + queue if queue else ''} {sid}\r\n".encode())
            yield receive
        finally:
            self._subs.pop(sid, None)
            if not self._closed:
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    try:
                        await self._send(f"UNSUB {sid}\r\n".encode())
                    except NatsError:
                        pass  # the connection is gone: nothing to unsubscribe from

    async def request(
        self, subject: str, data: bytes, timeout_s: float, *, headers: dict[str, str] | None = None
    ) -> NatsMessage:
        """Publish a request and wait for its reply.

        Raises:
            NatsError: no responders (``TOOL_ERROR``), no reply within ``timeout_s`` (``TIMEOUT``), or the
                connection is gone.
        """
        token = str(next(self._tokens))
        send, receive = trio.open_memory_channel[NatsMessage | NatsError](1)
        self._waiting[token] = send
        try:
            await self.publish(subject, data, reply=f"{self._inbox}.{token}", headers=headers)
            with trio.move_on_after(timeout_s):
                answer = await receive.receive()
                if isinstance(answer, NatsError):
                    raise answer
                if answer.status == "503":
                    raise NatsError(f"no responders on subject '{subject}'", "TOOL_ERROR")
                return answer
            raise NatsError(f"no reply on subject '{subject}' within {timeout_s * 1000:g} ms", "TIMEOUT")
        finally:
            self._waiting.pop(token, None)

    async def _send(self, frame: bytes) -> None:
        if self._stream is None or self._closed:
            raise NatsError(self._error or f"the connection to NATS at {self.url} is closed")
        async with self._send_lock:
            try:
                await self._stream.send_all(frame)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
                raise NatsError(f"the connection to NATS at {self.url} broke: {e}") from None

    async def _read_loop(self) -> None:
        while True:
            line = await self._line()
            if line.startswith(b"MSG "):
                await self._on_msg(line, headers=False)
            elif line.startswith(b"HMSG "):
                await self._on_msg(line, headers=True)
            elif line == b"PING":
                await self._send(b"PONG\r\n")
            elif line.startswith(b"-ERR"):
                self._error = f"the NATS server at {self.url} said: {_err(line)}"
            elif line.startswith(b"INFO "):
                self.info = orjson.loads(line[5:])
            # +OK and PONG need nothing

    async def _on_msg(self, line: bytes, *, headers: bool) -> None:
        parts = line.decode().split()
        if headers:
            subject, _sid = parts[1], parts[2]
            reply = parts[3] if len(parts) == 6 else None
            hlen, total = int(parts[-2]), int(parts[-1])
        else:
            subject, _sid = parts[1], parts[2]
            reply = parts[3] if len(parts) == 5 else None
            hlen, total = 0, int(parts[-1])
        body = await self._exactly(total + 2)
        status, description, hdrs = _headers(body[:hlen]) if headers else (None, "", {})
        msg = NatsMessage(subject, bytes(body[hlen:total]), reply, hdrs, status, description)
        sub = self._subs.get(_sid)
        if sub is not None:
            try:
                sub.send_nowait(msg)
            except trio.WouldBlock:
                _log.warning("dropped a message on %s: its subscriber is too slow", subject)
            return
        token = subject.rsplit(".", 1)[-1]
        chan = self._waiting.pop(token, None) if subject.startswith(self._inbox + ".") else None
        if chan is not None:
            chan.send_nowait(msg)

    async def _fill(self) -> None:
        assert self._stream is not None
        chunk = await self._stream.receive_some(65536)
        if not chunk:
            raise trio.BrokenResourceError("the server closed the connection")
        self._buffer += chunk

    async def _line(self) -> bytes:
        while True:
            end = self._buffer.find(_CRLF)
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 2]
                return line
            if len(self._buffer) > MAX_CONTROL_LINE:
                raise NatsError(f"a protocol line from {self.url} is longer than {MAX_CONTROL_LINE} bytes")
            await self._fill()

    async def _exactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            await self._fill()
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data


@asynccontextmanager
async def open_nats(url: str, *, connect_timeout_s: float = 5.0, name: str = "mcpipe") -> AsyncIterator[NatsClient]:
    """A connection of its own for the block (connected when the block starts, closed when it ends): for work
    that connects, does a few requests and leaves, as NoETL's ``nats`` tool does per task.

    Raises:
        NatsError: it cannot connect (refused, no answer, the server wants TLS).
    """
    client = NatsClient(url, connect_timeout_s=connect_timeout_s, name=name)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(client.run)
            try:
                yield client
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The nursery wraps what the block (or the connection) raised: a single error is raised as itself.
        only = _only(group)
        if only is None:
            raise
        raise only  # noqa: B904 - it is the group's own content, with its traceback


def _only(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    inner: BaseException = group
    while isinstance(inner, BaseExceptionGroup):
        if len(inner.exceptions) != 1:
            return None
        inner = inner.exceptions[0]
    return inner


def parse_header_block(block: bytes) -> tuple[str | None, str, dict[str, str]]:
    """A ``NATS/1.0`` header block: ``(status, description, headers)`` (status None when there is none)."""
    return _headers(block)


def _err(line: bytes) -> str:
    return line[4:].decode(errors="replace").strip().strip("'")


def _headers(block: bytes) -> tuple[str | None, str, dict[str, str]]:
    lines = block.decode(errors="replace").split("\r\n")
    first = lines[0].split(" ", 2) if lines else []
    status = first[1] if len(first) > 1 else None
    description = first[2] if len(first) > 2 else ""
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip()] = v.strip()
    return status, description, headers


def _check_subject(subject: str) -> None:
    """A subject messages can be sent to: dot-separated tokens, no spaces, no wildcards."""
    tokens = subject.split(".")
    if not subject or any(not t or t in ("*", ">") or any(c.isspace() for c in t) for t in tokens):
        raise NatsError(f"invalid NATS subject {subject!r} to send to", "TOOL_ERROR")
