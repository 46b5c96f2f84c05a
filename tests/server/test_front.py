"""mcpipe's own HTTP/1.1 front (``mcpipe.server._front``) against hypercorn's: the same bytes sent to both
fronts, each serving the same app on loopback, must get the same status and the app the same scope; and the
front's own duties: the body as it arrives, a disconnect while a call runs, keep-alive, pipelining, a
streaming answer flushed per message."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import h11
import pytest
import trio
from hypercorn.config import Config
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpipe._core import http1_head
from mcpipe.config import HttpConfig
from mcpipe.server._listen import serve_bounded

SEEN: list[dict[str, Any]] = []
GATE: dict[str, trio.Event] = {}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Echoes what it was given; ``/stream`` answers in two SSE messages, the second once ``GATE["next"]`` is
    set; ``/watch`` waits for the client to go away (as ``_fast``'s disconnect watcher does)."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["type"] != "http":
        return  # a websocket: refused (hypercorn answers its handshake 403)
    if scope["path"] == "/unread":  # answers before its body has come, and never reads it (a 401 does)
        await send({"type": "http.response.start", "status": 401, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    SEEN.append({**scope, "client": None, "body": body})
    if scope["path"] == "/a0" and "first" in GATE:
        GATE["first"].set()
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await GATE["next"].wait()
        await send({"type": "http.response.body", "body": b"data: 2\n\n"})
        return
    if scope["path"] == "/watch":
        gone: list[str] = []

        async def watch() -> None:
            gone.append((await receive())["type"])

        async with trio.open_nursery() as nursery:  # two tasks watching, as an app may have
            nursery.start_soon(watch)
            nursery.start_soon(watch)
            GATE["running"].set()
        assert gone == ["http.disconnect", "http.disconnect"]
        GATE["gone"].set()
        return
    out = repr((scope["method"], scope["path"], body)).encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(out)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": out})


@asynccontextmanager
async def serving(front: str) -> AsyncIterator[int]:
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = config.errorlog = None
    config.graceful_timeout = 0.1
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve_bounded(app, config, max_connections=16, front=front, task_status=task_status)
        )
        yield int(binds[0].rsplit(":", 1)[1])
        nursery.cancel_scope.cancel()


def answered(raw: bytes, got: bytes) -> bool:
    """Whether ``got`` holds a whole final answer to one request (read by h11 as a client would)."""
    client = h11.Connection(h11.CLIENT)
    client.send(
        h11.Request(method=b"HEAD" if raw.startswith(b"HEAD") else b"GET", target=b"/", headers=[(b"host", b"a")])
    )
    client.send(h11.EndOfMessage())
    client.receive_data(got)
    try:
        while (event := client.next_event()) is not h11.NEED_DATA:
            if isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return True
    except h11.RemoteProtocolError:
        pass
    return False


async def exchange(port: int, raw: bytes, *, until: bytes | None = None) -> bytes:
    """Send ``raw`` and read what comes back until the server closes, or ``until`` has come (without it: a
    whole answer), or 1 s of quiet."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(raw)
        got = b""
        while (until not in got) if until is not None else not answered(raw, got):
            with trio.move_on_after(1) as quiet:
                try:
                    data = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    break
            if quiet.cancelled_caught or not data:
                break
            got += data
        return got


def statuses(answer: bytes) -> list[int]:
    return [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) \r\n", answer)]


H = b"Host: a\r\n"
ODD_HEADS: list[tuple[str, bytes]] = [
    ("plain GET", b"GET / HTTP/1.1\r\n" + H + b"\r\n"),
    ("query and escapes", b"GET /a%20b/%2F?x=1&y=%20 HTTP/1.1\r\n" + H + b"\r\n"),
    ("absolute form", b"GET http://a/p?q HTTP/1.1\r\n" + H + b"\r\n"),
    ("asterisk", b"OPTIONS * HTTP/1.1\r\n" + H + b"\r\n"),
    ("lower-case method", b"post / HTTP/1.1\r\n" + H + b"Content-Length: 2\r\n\r\nhi"),
    ("odd-cased names, spaced values", b"GET / HTTP/1.1\r\nHOST: a\r\nX-Y:  b c \t\r\nx-y: d\r\n\r\n"),
    ("empty value", b"GET / HTTP/1.1\r\n" + H + b"X-Empty:\r\n\r\n"),
    ("obs-text value", b"GET / HTTP/1.1\r\n" + H + b"X: caf\xe9\r\n\r\n"),
    ("HTTP/1.0 without Host", b"GET / HTTP/1.0\r\n\r\n"),
    ("HTTP/1.0 keep-alive", b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"),
    ("body by Content-Length", b"POST /p HTTP/1.1\r\n" + H + b"Content-Length: 5\r\n\r\nhello"),
    ("Content-Length with spaces", b"POST /p HTTP/1.1\r\n" + H + b"Content-Length:  5 \r\n\r\nhello"),
    ("Content-Length 0", b"POST /p HTTP/1.1\r\n" + H + b"Content-Length: 0\r\n\r\n"),
    ("no Host on HTTP/1.1", b"GET / HTTP/1.1\r\n\r\n"),
    ("two Hosts", b"GET / HTTP/1.1\r\n" + H + b"Host: b\r\n\r\n"),
    ("equal Content-Lengths", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\nhi"),
    ("conflicting Content-Lengths", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\nhi"),
    ("listed Content-Length", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 2, 2\r\n\r\nhi"),
    ("negative Content-Length", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: -2\r\n\r\n"),
    ("signed Content-Length", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: +2\r\n\r\nhi"),
    ("hex Content-Length", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 0x2\r\n\r\nhi"),
    ("chunked body", b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"),
    (
        "chunked and Content-Length",
        b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
    ),
    ("unknown Transfer-Encoding", b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: gzip\r\n\r\n"),
    ("obs-fold", b"GET / HTTP/1.1\r\n" + H + b"X: a\r\n  b\r\n\r\n"),
    ("obs-fold first", b"GET / HTTP/1.1\r\n  b\r\n" + H + b"\r\n"),
    ("space before colon", b"GET / HTTP/1.1\r\nHost : a\r\n\r\n"),
    ("no colon", b"GET / HTTP/1.1\r\n" + H + b"Nonsense\r\n\r\n"),
    ("empty name", b"GET / HTTP/1.1\r\n" + H + b": v\r\n\r\n"),
    ("bad name char", b"GET / HTTP/1.1\r\n" + H + b"X(y): v\r\n\r\n"),
    ("control char in value", b"GET / HTTP/1.1\r\n" + H + b"X: a\x01b\r\n\r\n"),
    ("NUL in value", b"GET / HTTP/1.1\r\n" + H + b"X: a\x00b\r\n\r\n"),
    ("DEL in value", b"GET / HTTP/1.1\r\n" + H + b"X: a\x7fb\r\n\r\n"),
    ("CR in value", b"GET / HTTP/1.1\r\n" + H + b"X: a\rb\r\n\r\n"),
    ("bare LF lines", b"GET / HTTP/1.1\n" + b"Host: a\n\n"),
    ("leading empty line", b"\r\nGET / HTTP/1.1\r\n" + H + b"\r\n"),
    ("two spaces in the request line", b"GET  / HTTP/1.1\r\n" + H + b"\r\n"),
    ("space in the target", b"GET /a b HTTP/1.1\r\n" + H + b"\r\n"),
    ("non-ASCII target", b"GET /caf\xe9 HTTP/1.1\r\n" + H + b"\r\n"),
    ("no version", b"GET /\r\n" + H + b"\r\n"),
    ("HTTP/1.2", b"GET / HTTP/1.2\r\n" + H + b"\r\n"),
    ("HTTP/2.0 line", b"GET / HTTP/2.0\r\n" + H + b"\r\n"),
    ("lower-case version", b"GET / http/1.1\r\n" + H + b"\r\n"),
    ("bad method char", b"G@T / HTTP/1.1\r\n" + H + b"\r\n"),
    ("not HTTP", b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n"),
    ("head past 16 KiB", b"GET / HTTP/1.1\r\n" + H + b"X: " + b"a" * 17000 + b"\r\n\r\n"),
    ("many headers", b"GET / HTTP/1.1\r\n" + H + b"".join(b"X-%d: v\r\n" % i for i in range(100)) + b"\r\n"),
    (
        "h2c upgrade",
        b"GET / HTTP/1.1\r\n"
        + H
        + b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
    ),
    ("Expect: 100-continue", b"POST / HTTP/1.1\r\n" + H + b"Expect: 100-continue\r\nContent-Length: 2\r\n\r\nhi"),
    ("Expect on HTTP/1.0", b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi"),
    ("HEAD", b"HEAD / HTTP/1.1\r\n" + H + b"\r\n"),
    ("HEAD of a stream", b"HEAD /stream HTTP/1.1\r\n" + H + b"\r\n"),
]


@pytest.mark.parametrize(("case", "raw"), ODD_HEADS, ids=[case for case, _ in ODD_HEADS])
async def test_the_own_front_answers_an_odd_head_as_hypercorn_does_and_builds_the_same_scope(
    case: str, raw: bytes
) -> None:
    GATE["next"] = trio.Event()
    GATE["next"].set()
    answers, scopes = {}, {}
    with trio.fail_after(30):
        for front in ("own", "hypercorn"):
            SEEN.clear()
            async with serving(front) as port:
                answers[front] = await exchange(port, raw)
            scopes[front] = [{k: v for k, v in s.items() if k != "server"} for s in SEEN]
    assert statuses(answers["own"]) == statuses(answers["hypercorn"]), (answers["own"], answers["hypercorn"])
    assert statuses(answers["own"])
    assert scopes["own"] == scopes["hypercorn"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"GET / HTTP/1.1\r\nHost: a\r\n", None),
        (b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", ("GET", b"/", "1.1", [(b"host", b"a")], 27, 0, 0)),
        (
            b"PUT /x HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc",
            ("PUT", b"/x", "1.0", [(b"content-length", b"3")], 38, 3, 1),
        ),
        (
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            ("GET", b"/", "1.1", [(b"host", b"a"), (b"connection", b"close")], 46, 0, 1),
        ),
        (b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", False),
    ],
)
def test_the_core_reads_a_head_whole_or_says_it_is_unfinished_or_not_plain(raw: bytes, expected: object) -> None:
    assert http1_head(raw, 16384) == expected


async def test_keep_alive_and_pipelined_requests_are_answered_in_order_on_one_connection() -> None:
    raw = b"".join(b"POST /%d HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\n%d" % (i, i) for i in range(5))
    with trio.fail_after(20):
        async with serving("own") as port:
            answer = await exchange(port, raw, until=b"('POST', '/4', b'4')")
    assert statuses(answer) == [200] * 5
    assert [answer.index(b"('POST', '/%d', b'%d')" % (i, i)) for i in range(5)] == sorted(
        answer.index(b"('POST', '/%d', b'%d')" % (i, i)) for i in range(5)
    )


async def test_a_client_keeping_its_connection_full_of_requests_does_not_hold_off_another_client() -> None:
    # The front reads and writes without passing through trio's scheduler while it need not wait; it still
    # yields every few of them, so the second client is served while the first one's requests are in hand.
    SEEN.clear()
    GATE["first"] = trio.Event()
    many = 300
    raw = b"".join(b"POST /a%d HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n" % i for i in range(many))
    with trio.fail_after(20):
        async with serving("own") as port:
            other = await trio.open_tcp_stream("127.0.0.1", port)
            async with other, trio.open_nursery() as nursery:
                nursery.start_soon(lambda: exchange(port, raw, until=b"'/a%d'" % (many - 1)))
                await GATE["first"].wait()
                await other.send_all(b"POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n")
                got = b""
                while b"'/b'" not in got:
                    got += await other.receive_some(65536)
    paths = [seen["path"] for seen in SEEN]
    assert len(paths) == many + 1 and paths.index("/b") < many - 100, paths.index("/b")


async def test_a_body_arriving_in_pieces_reaches_the_app_whole() -> None:
    with trio.fail_after(20):
        async with serving("own") as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\nhel")
                await trio.sleep(0.05)
                await stream.send_all(b"lo wor")
                await trio.sleep(0.05)
                await stream.send_all(b"ld")
                got = b""
                while b"world" not in got:
                    got += await stream.receive_some(65536)
    assert b"('POST', '/p', b'hello world')" in got


async def test_a_client_going_away_during_a_call_reaches_each_of_the_apps_watchers_as_a_disconnect() -> None:
    GATE.update(running=trio.Event(), gone=trio.Event())
    with trio.fail_after(20):
        async with serving("own") as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"POST /watch HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n")
            await GATE["running"].wait()
            await stream.aclose()
            await GATE["gone"].wait()


async def test_a_streaming_answer_is_written_message_by_message() -> None:
    GATE["next"] = trio.Event()
    with trio.fail_after(20):
        async with serving("own") as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(b"GET /stream HTTP/1.1\r\nHost: a\r\n\r\n")
                got = b""
                while b"data: 1" not in got:  # the first message, before the app sends the second
                    got += await stream.receive_some(65536)
                assert b"transfer-encoding: chunked" in got.lower()
                GATE["next"].set()
                while not got.endswith(b"0\r\n\r\n"):
                    got += await stream.receive_some(65536)
    assert b"9\r\ndata: 2\n\n\r\n0\r\n\r\n" in got


@pytest.mark.parametrize(("value", "ok"), [("own", True), ("hypercorn", True), ("h11", False)])
def test_the_front_is_chosen_in_the_http_section(value: str, ok: bool) -> None:
    import msgspec

    if ok:
        assert msgspec.convert({"front": value}, HttpConfig).front == value
    else:
        with pytest.raises(msgspec.ValidationError, match=r"front"):
            msgspec.convert({"front": value}, HttpConfig)


async def test_a_body_the_app_did_not_read_is_skipped_and_the_connection_kept() -> None:
    with trio.fail_after(20):
        async with serving("own") as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(b"POST /unread HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n")
                got = b""
                while b"\r\n\r\n" not in got:
                    got += await stream.receive_some(65536)
                await stream.send_all(b"hello")  # the body, after the answer
                await stream.send_all(b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi")
                while b"b'hi'" not in got:
                    data = await stream.receive_some(65536)
                    assert data, got
                    got += data
    assert statuses(got) == [401, 200]


_NAMES = st.sampled_from(
    [b"Host", b"Content-Length", b"content-length", b"Transfer-Encoding", b"Connection", b"Expect", b"Upgrade",
     b"X-A", b"x-b", b"A b", b"X(", b"", b" X"]
)  # fmt: skip
_SEPARATORS = st.sampled_from([b":", b": ", b":\t", b":  ", b" :", b""])
_VALUE = st.lists(
    st.sampled_from(
        [b"a", b" ", b"\t", b"0", b"12", b"-1", b",", b"close", b"Keep-Alive", b"100-continue", b"chunked", b"h2c",
         b"\x01", b"\x00", b"\x7f", b"\xe9", b"\r", b"\n", b"\r\n "]
    ),
    max_size=5,
).map(b"".join)  # fmt: skip
_PLAIN_LINE = st.tuples(
    st.sampled_from([b"Content-Length", b"Connection", b"Expect", b"X-A", b"x-b", b"Accept"]),
    st.sampled_from([b":", b": ", b":\t"]),
    st.lists(
        st.sampled_from([b"a", b" ", b"\t", b"12", b",", b"close", b"Keep-Alive", b"100-continue", b"\xe9"]),
        max_size=4,
    ).map(b"".join),
).map(b"".join)  # fmt: skip
_WILD_LINE = st.tuples(_NAMES, _SEPARATORS, _VALUE).map(b"".join)
_LINES = st.lists(st.one_of(_PLAIN_LINE, _PLAIN_LINE, _PLAIN_LINE, _WILD_LINE), max_size=6)


@given(
    st.sampled_from([b"GET", b"POST", b"get", b"HEAD", b"X-Y"]),
    st.sampled_from([b"/", b"/mcp?x=1", b"*", b"/a%20b", b"http://a/p"]),
    st.sampled_from([b"HTTP/1.1", b"HTTP/1.0"]),
    _LINES,
    st.booleans(),
)
@settings(max_examples=1000, deadline=None)
def test_a_head_the_core_takes_as_plain_is_one_h11_reads_the_same_way(
    method: bytes, target: bytes, version: bytes, lines: list[bytes], host: bool
) -> None:
    raw = method + b" " + target + b" " + version + b"\r\n" + (b"Host: a\r\n" if host else b"")
    raw += b"".join(line + b"\r\n" for line in lines) + b"\r\n"
    head = http1_head(raw, 16384)
    if not head:
        return  # unfinished, or for hypercorn's protocol: nothing to compare
    name, got_target, got_version, headers, head_len, length, flags = head
    server = h11.Connection(h11.SERVER)
    server.receive_data(raw[:head_len])
    event = server.next_event()  # h11 must take the head, ending where the core says (a refusal raises here)
    assert isinstance(event, h11.Request)
    assert (name, got_target, got_version) == (
        event.method.decode().upper(),
        event.target,
        event.http_version.decode(),
    )
    assert headers == list(event.headers)
    lengths = [int(v) for n, v in event.headers if n == b"content-length"]
    assert length == (lengths[0] if lengths else 0)
    assert bool(flags & 1) == (not server._cstate.keep_alive or version == b"HTTP/1.0")
    assert bool(flags & 2) == server.they_are_waiting_for_100_continue
