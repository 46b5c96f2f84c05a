"""mcpipe's Trio NATS client against a real nats-server started for the tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from kit.realservers import free_port, nats_server
from mcpipe.backends._connections import Connections, NotRunning
from mcpipe.backends.nats import NatsClient, NatsError, parse_nats_url


@pytest.fixture
async def client(nats_url: str) -> AsyncIterator[NatsClient]:
    async with trio.open_nursery() as nursery:
        c = NatsClient(nats_url)
        await nursery.start(c.run)
        yield c
        await c.aclose()


async def responder(
    c: NatsClient, subject: str, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Answer every request on ``subject`` with its payload reversed and its headers echoed."""
    async with c.subscribe(subject) as messages:
        task_status.started()
        async for msg in messages:
            assert msg.reply is not None
            await c.publish(msg.reply, msg.data[::-1], headers=msg.headers or None)


async def test_a_request_gets_its_reply_through_the_inbox(client: NatsClient) -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(responder, client, "svc.reverse")
            replies = []
            for text in (b"abc", b"hello", b""):
                replies.append((await client.request("svc.reverse", text, 5)).data)
            with_headers = await client.request("svc.reverse", b"xy", 5, headers={"Trace": "t-1"})
            nursery.cancel_scope.cancel()
    assert replies == [b"cba", b"olleh", b""]
    assert with_headers.data == b"yx" and with_headers.headers == {"Trace": "t-1"}


async def test_concurrent_requests_each_get_their_own_reply(client: NatsClient) -> None:
    got: dict[int, bytes] = {}
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(responder, client, "svc.many")

            async def ask(i: int) -> None:
                got[i] = (await client.request("svc.many", str(i).encode(), 5)).data

            async with trio.open_nursery() as askers:
                for i in range(50):
                    askers.start_soon(ask, i)
            nursery.cancel_scope.cancel()
    assert got == {i: str(i).encode()[::-1] for i in range(50)}


async def test_a_request_nobody_listens_to_fails_at_once_with_no_responders(client: NatsClient) -> None:
    with trio.fail_after(2), pytest.raises(NatsError, match=r"no responders on subject 'nobody\.home'") as info:
        await client.request("nobody.home", b"?", 30)
    assert info.value.code == "TOOL_ERROR"


async def test_a_request_without_a_reply_times_out(client: NatsClient) -> None:
    with trio.fail_after(10):
        async with client.subscribe("svc.silent"):
            with pytest.raises(NatsError, match=r"no reply on subject 'svc\.silent' within 200 ms") as info:
                await client.request("svc.silent", b"?", 0.2)
    assert info.value.code == "TIMEOUT"


async def test_a_published_message_reaches_a_subscriber(client: NatsClient) -> None:
    with trio.fail_after(10):
        async with client.subscribe("events.>") as messages:
            await client.publish("events.order.created", b'{"id": 1}')
            msg = await messages.receive()
    assert (msg.subject, msg.data) == ("events.order.created", b'{"id": 1}')


async def test_connecting_to_a_port_where_nothing_listens_is_a_clear_error() -> None:
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            with pytest.raises(NatsError, match=r"cannot connect to NATS at nats://127\.0\.0\.1:\d+: all attempts"):
                await nursery.start(NatsClient(f"nats://127.0.0.1:{free_port()}").run)


async def test_a_connection_lost_fails_pending_requests_and_the_next_use_reconnects() -> None:
    conns = Connections()
    with nats_server() as url:
        async with conns.running():
            with trio.fail_after(10):
                first = await conns.get(("nats", url), lambda: NatsClient(url))
                assert await conns.get(("nats", url), lambda: NatsClient(url)) is first
                async with first.subscribe("svc.hang"), trio.open_nursery() as nursery:

                    async def ask() -> None:
                        with pytest.raises(NatsError, match=r"broke|closed"):
                            await first.request("svc.hang", b"?", 30)

                    nursery.start_soon(ask)
                    await trio.testing.wait_all_tasks_blocked()
                    assert first._stream is not None
                    await first._stream.aclose()  # the network goes away under the client
                assert first.closed
                second = await conns.get(("nats", url), lambda: NatsClient(url))
                assert second is not first and not second.closed


async def test_connections_are_refused_when_nothing_runs_them() -> None:
    with pytest.raises(NotRunning):
        await Connections().get("x", lambda: NatsClient("nats://127.0.0.1:1"))


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("nats://127.0.0.1:4222", ("127.0.0.1", 4222, None, None, None)),
        ("nats://u:p%40ss@h", ("h", 4222, "u", "p@ss", None)),
        ("nats://s3cret@h:1", ("h", 1, None, None, "s3cret")),
        ("tls://h:4222", ValueError),
        ("http://h", ValueError),
    ],
)
def test_nats_urls(url: str, expected: object) -> None:
    if expected is ValueError:
        with pytest.raises(ValueError):
            parse_nats_url(url)
        return
    u = parse_nats_url(url)
    assert (u.host, u.port, u.user, u.password, u.token) == expected


@pytest.mark.parametrize("subject", ["", "a..b", "a.*", "a.>", "has space", ".a"])
async def test_a_subject_that_cannot_be_sent_to_is_refused(client: NatsClient, subject: str) -> None:
    with pytest.raises(NatsError, match="invalid NATS subject"):
        await client.publish(subject, b"x")


async def test_the_nats_kinds_request_runs_on_the_connection_its_steps_share(nats_url: str) -> None:
    from mcpipe.kinds.nats import client as shared_client
    from mcpipe.kinds.nats import request

    with trio.fail_after(10):
        async with Connections().running() as conns, trio.open_nursery() as nursery:
            c = await shared_client(conns, nats_url)
            await nursery.start(responder, c, "svc.shared")
            reply = await request(conns, nats_url, "svc.shared", b"abc", 5, {"Trace": "t-2"})
            assert await shared_client(conns, nats_url) is c  # one connection per URL, the steps' and the format's
            nursery.cancel_scope.cancel()
    assert reply.data == b"cba" and reply.headers == {"Trace": "t-2"}
