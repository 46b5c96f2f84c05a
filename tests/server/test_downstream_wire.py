"""The lean HTTP/1.1 transport of downstream clients (``mcpipe.downstream._wire``), against a real HTTP server
on 127.0.0.1 whose framing each test chooses (the MCP behaviour over it is the downstream and conformance
suites', which run through it)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx2
import pytest
import trio

from mcpipe.downstream._wire import LeanTransport, lean_for

Handler = Callable[[trio.SocketStream, bytes], Awaitable[bool]]
"""Answers one request (its head and body); returns whether to keep the connection."""


class Server:
    """A raw HTTP/1.1 server: counts connections, hands each request to ``handler``."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.closed = 0
        self.first_closed = trio.Event()
        self.port = 0

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._conn, listeners)

    async def _conn(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = await stream.receive_some()
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    buf += await stream.receive_some()
                body, buf = buf[:length], buf[length:]
                if not await self.handler(stream, body):
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            self.closed += 1
            self.first_closed.set()
            await stream.aclose()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"


async def _sized(stream: trio.SocketStream, body: bytes) -> bool:
    await stream.send_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    await stream.send_all(body)
    return True


async def echo(stream: trio.SocketStream, body: bytes) -> bool:
    return await _sized(stream, b'{"echo":' + body + b"}")


def _client() -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=LeanTransport(), timeout=httpx2.Timeout(5.0))


async def test_answers_with_a_content_length_reuse_one_keep_alive_connection(nursery):
    server = Server(echo)
    await nursery.start(server.serve)
    async with _client() as client:
        with trio.fail_after(10):
            for i in range(3):
                r = await client.post(server.url, content=b"%d" % i)
                assert r.status_code == 200 and r.json() == {"echo": i}
    assert server.connections == 1


async def test_a_chunked_answer_streams_each_part_before_the_rest_is_sent(nursery):
    go_on = trio.Event()

    async def sse(stream: trio.SocketStream, body: bytes) -> bool:
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"d\r\ndata: first\n\n\r\n"
        )
        await go_on.wait()
        await stream.send_all(b"e\r\ndata: second\n\n\r\n0\r\n\r\n")
        return True

    server = Server(sse)
    await nursery.start(server.serve)
    async with _client() as client:
        with trio.fail_after(10):
            async with client.stream("POST", server.url, content=b"{}") as r:
                parts = r.aiter_bytes()
                assert await parts.__anext__() == b"data: first\n\n"  # before the server sends the rest
                go_on.set()
                assert b"".join([p async for p in parts]) == b"data: second\n\n"
            again = await client.post(server.url, content=b"{}")  # read to the end: the connection is reused
            assert again.text == "data: first\n\ndata: second\n\n"
    assert server.connections == 1


async def test_a_connection_the_server_closed_while_idle_is_replaced(nursery):
    answered = 0

    async def once_then_close(stream: trio.SocketStream, body: bytes) -> bool:
        nonlocal answered
        answered += 1
        await _sized(stream, b'{"n":%d}' % answered)
        return False  # closes after each answer, without saying so (no Connection: close)

    server = Server(once_then_close)
    await nursery.start(server.serve)
    async with _client() as client:
        with trio.fail_after(10):
            assert (await client.post(server.url, content=b"{}")).json() == {"n": 1}
            await server.first_closed.wait()
            assert (await client.post(server.url, content=b"{}")).json() == {"n": 2}
    assert server.connections == 2 and answered == 2


async def test_a_kept_connection_the_server_resets_as_the_next_request_arrives_is_retried_on_a_new_one(nursery):
    import socket
    import struct

    answered = 0

    async def once_then_reset(stream: trio.SocketStream, body: bytes) -> bool:
        nonlocal answered
        answered += 1
        await _sized(stream, b'{"n":%d}' % answered)
        # The next request arrives at a server that is closing the connection: unread, it is answered with a
        # reset (SO_LINGER 0), which the client reads after its write went through.
        await trio.lowlevel.wait_readable(stream.socket)
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return False

    server = Server(once_then_reset)
    await nursery.start(server.serve)
    async with _client() as client:
        with trio.fail_after(10):
            assert (await client.post(server.url, content=b"{}")).json() == {"n": 1}
            assert (await client.post(server.url, content=b"{}")).json() == {"n": 2}
    assert server.connections == 2 and answered == 2


async def test_an_answer_left_unread_closes_its_connection_and_the_next_call_opens_another(nursery):
    async def slow(stream: trio.SocketStream, body: bytes) -> bool:
        if body == b"slow":
            await stream.send_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\none\r\n")
            assert await stream.receive_some() == b""  # the rest never comes: the client closes the connection
            return False
        return await echo(stream, body)

    server = Server(slow)
    await nursery.start(server.serve)
    async with _client() as client:
        with trio.fail_after(10):
            with trio.move_on_after(0.2):  # the caller gives up in the middle of the answer
                async with client.stream("POST", server.url, content=b"slow") as r:
                    async for _ in r.aiter_bytes():
                        pass
            await server.first_closed.wait()  # its connection was closed, not put back out of step
            assert (await client.post(server.url, content=b"7")).json() == {"echo": 7}
    assert server.connections == 2


async def test_an_answer_delimited_by_the_connection_closing_is_read_to_the_end(nursery):
    async def to_end(stream: trio.SocketStream, body: bytes) -> bool:
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of ")
        await stream.send_all(b"it")
        return False

    server = Server(to_end)
    await nursery.start(server.serve)
    async with _client() as client:
        with trio.fail_after(10):
            assert (await client.post(server.url, content=b"{}")).text == "all of it"
            assert (await client.post(server.url, content=b"{}")).text == "all of it"
    assert server.connections == 2


async def test_a_malformed_answer_is_a_protocol_error_and_no_answer_a_read_timeout(nursery):
    async def garbage(stream: trio.SocketStream, body: bytes) -> bool:
        if body == b"quiet":
            await trio.sleep_forever()
        await stream.send_all(b"SMTP ready\r\n\r\n")
        return False

    server = Server(garbage)
    await nursery.start(server.serve)
    async with httpx2.AsyncClient(transport=LeanTransport(), timeout=httpx2.Timeout(5.0, read=0.2)) as client:
        with trio.fail_after(10):
            with pytest.raises(httpx2.RemoteProtocolError, match=r"not an HTTP/1\.1 answer"):
                await client.post(server.url, content=b"{}")
            with pytest.raises(httpx2.ReadTimeout):
                await client.post(server.url, content=b"quiet")


async def test_nothing_listening_is_a_connect_error():
    server = Server(echo)
    async with _client() as client:
        with trio.fail_after(10), pytest.raises(httpx2.ConnectError):
            await client.post(f"http://127.0.0.1:{server.port or 9}/mcp", content=b"{}")


def test_only_plain_http_reached_directly_takes_the_lean_transport(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert lean_for("http://127.0.0.1:8000/mcp")
    assert not lean_for("https://example.com/mcp")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    assert not lean_for("http://api.example.com/mcp")
    monkeypatch.setenv("NO_PROXY", "api.example.com")
    assert lean_for("http://api.example.com/mcp")


async def test_a_sized_body_read_whole_waits_for_each_part_and_a_stalled_one_is_a_read_timeout(nursery):
    # The lean call's direct path: exchange() without httpx's Request, the body read() at once.
    async def parts(stream: trio.SocketStream, body: bytes) -> bool:
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n")
        await stream.send_all(b'{"a":')
        if body == b"stall":
            await trio.sleep_forever()
        await trio.sleep(0.05)
        await stream.send_all(b'"bcde"}')
        return True

    server = Server(parts)
    await nursery.start(server.serve)
    transport = LeanTransport()
    key = ("127.0.0.1", server.port)
    timeouts = {"pool": 5.0, "connect": 5.0, "write": 5.0, "read": 0.5}

    def message(body: bytes) -> bytes:
        return b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)

    with trio.fail_after(10):
        for _ in range(2):  # the second on the connection the first gave back
            status, _, _, body = await transport.exchange(key, message(b"go"), timeouts)
            assert status == 200 and body.plain and body.content_type == b"application/json"
            assert await body.read() == b'{"a":"bcde"}'
        assert server.connections == 1
        status, _, _, body = await transport.exchange(key, message(b"stall"), timeouts)
        with pytest.raises(httpx2.ReadTimeout):
            await body.read()
        status, _, _, body = await transport.exchange(key, message(b"go"), timeouts)  # a new connection
        assert await body.read() == b'{"a":"bcde"}'
    assert server.connections == 2
    await transport.aclose()
