"""Resumable SSE streams on 2025-11-25 streamable HTTP: a priming event with ``retry``, an in-memory event
store (bounded, one view per session), and a client that lost its connection getting the rest of its
answer by reconnecting with ``Last-Event-ID``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx2
import mcp_types as t
import orjson
import pytest
import trio
from mcp.server.mcpserver import Context, MCPServer

from kit.servers import everything_downstream, http_server, make_config, running
from mcpipe.downstream import StreamWatch
from mcpipe.server import open_app
from mcpipe.server._events import InMemoryEventStore
from mcpipe.tools import Request, ToolContext, ToolRegistry

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

WAIT_S = 20
GO_ON: dict[str, trio.Event] = {}

paced = ToolRegistry()


@paced.tool
async def two_halves(tag: str, ctx: ToolContext) -> str:
    """Report the first half, wait until the test lets it go on, report the second half, answer."""
    await ctx.report_progress(1, 2, "first half")
    await GO_ON.setdefault(tag, trio.Event()).wait()
    await ctx.report_progress(2, 2, "second half")
    return f"{tag} done"


def message(n: int, text: str = "x") -> Any:
    return t.JSONRPCNotification(jsonrpc="2.0", method="notifications/message", params={"n": n, "text": text})


async def replayed(view: Any, last: str) -> tuple[str | None, list[Any]]:
    got: list[Any] = []

    async def collect(event: Any) -> None:
        got.append(event.message.params["n"])

    return await view.replay_events_after(last, collect), got


async def test_a_reconnecting_stream_gets_what_came_after_its_last_event_and_only_its_stream() -> None:
    store = InMemoryEventStore()
    view = store.session()
    prime = await view.store_event("1", None)
    first = await view.store_event("1", message(1))
    await view.store_event("2", message(99))  # another request's stream
    await view.store_event("1", message(2))
    await view.store_event("1", message(3))
    assert await replayed(view, prime) == ("1", [1, 2, 3])
    assert await replayed(view, first) == ("1", [2, 3])


async def test_a_message_stored_while_a_replay_is_sending_goes_out_with_the_replay() -> None:
    # The SDK routes a message arriving during a replay to no live stream (it registers one afterwards):
    # without this it would be stored only, behind the replay, and lost to the reconnected client.
    store = InMemoryEventStore()
    view = store.session()
    prime = await view.store_event("1", None)
    await view.store_event("1", message(1))
    got: list[Any] = []

    async def send(event: Any) -> None:
        got.append(event.message.params["n"])
        if len(got) == 1:
            await view.store_event("1", message(2))  # the answer, arriving mid-replay

    assert await view.replay_events_after(prime, send) == "1"
    assert got == [1, 2]


async def test_another_sessions_event_id_replays_nothing() -> None:
    store = InMemoryEventStore()
    alice, bob = store.session(), store.session()
    event = await alice.store_event("1", message(1))
    await alice.store_event("1", message(2))
    await bob.store_event("1", message(7))
    assert await replayed(bob, event) == (None, [])
    assert await replayed(alice, "not-a-number") == (None, [])


async def test_the_store_drops_its_oldest_events_beyond_its_count_and_byte_bounds() -> None:
    by_count = InMemoryEventStore(max_events=3)
    view = by_count.session()
    ids = [await view.store_event("1", message(n)) for n in range(5)]
    assert len(by_count) == 3
    assert await replayed(view, ids[0]) == (None, [])  # dropped: nothing to resume from
    assert await replayed(view, ids[2]) == ("1", [3, 4])

    size = len(message(0, "y" * 100).model_dump_json(by_alias=True, exclude_unset=True))
    by_bytes = InMemoryEventStore(max_bytes=size * 2 + size // 2)
    view = by_bytes.session()
    for n in range(4):
        await view.store_event("1", message(n, "y" * 100))
    assert len(by_bytes) == 2 and by_bytes.bytes <= by_bytes.max_bytes


def sse_events(text: str) -> list[dict[str, str]]:
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.split("\n"):
            name, sep, value = line.partition(":")
            if sep and name:
                fields[name] = fields.get(name, "") + value.removeprefix(" ")
        if fields:
            events.append(fields)
    return events


async def read_events(lines: AsyncIterator[str], count: int, until: str | None = None) -> list[dict[str, str]]:
    """Read SSE lines until ``count`` events (blank-line terminated) have arrived, or one whose data holds
    ``until``, or the stream ends."""
    buf: list[str] = []
    events: list[dict[str, str]] = []
    async for line in lines:
        if line == "":
            events += sse_events("\n".join(buf))
            buf = []
            if len(events) >= count or (until is not None and until in events[-1].get("data", "")):
                return events
        else:
            buf.append(line)
    return events


BASE = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}},
}


async def open_session(
    http: httpx2.AsyncClient, url: str, capabilities: dict[str, Any] | None = None
) -> dict[str, str]:
    init = {**INIT, "params": {**INIT["params"], "capabilities": capabilities or {}}}
    opened = await http.post(url, json=init, headers=BASE)
    assert opened.status_code == 200, opened.text
    headers = {**BASE, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    return headers


async def test_a_dropped_call_stream_is_resumed_with_last_event_id_and_gets_the_rest_and_the_answer() -> None:
    GO_ON["a"] = trio.Event()
    call = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "two_halves", "arguments": {"tag": "a"}, "_meta": {"progressToken": "p"}},
    }
    with trio.fail_after(WAIT_S):
        async with (
            open_app(make_config(), extra_sources=[paced]) as app,
            http_server(app) as url,
            httpx2.AsyncClient(timeout=WAIT_S) as http,
        ):
            headers = await open_session(http, url)
            async with http.stream("POST", url, json=call, headers=headers) as response:
                assert response.headers["content-type"].startswith("text/event-stream")
                before = await read_events(response.aiter_lines(), 2)
            # The connection is gone; the call goes on, and what it sends is kept for the client.
            GO_ON["a"].set()
            last = before[-1]["id"]
            async with http.stream("GET", url, headers={**headers, "last-event-id": last}) as resumed:
                assert resumed.status_code == 200
                after = await read_events(resumed.aiter_lines(), 2)
    priming, first = before
    assert priming["data"] == "" and priming["retry"] == "1000" and priming["id"]
    assert '"first half"' in first["data"]
    second, answer = after
    assert '"second half"' in second["data"]
    assert '"id":7' in answer["data"] and "a done" in answer["data"]
    assert int(priming["id"]) < int(first["id"]) < int(second["id"]) < int(answer["id"])


async def test_resumability_can_be_turned_off() -> None:
    config = make_config(http={"resumable_streams": False})
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "arguments": {"x": 1}}}
    with trio.fail_after(WAIT_S):
        async with running(config) as app, http_server(app) as url, httpx2.AsyncClient(timeout=WAIT_S) as http:
            headers = await open_session(http, url)
            r = await http.post(url, json=call, headers=headers)
    events = sse_events(r.text)
    assert len(events) == 1 and "id" not in events[0] and '"x":1' in events[0]["data"]


polling = MCPServer("polling")


@polling.tool()
async def poll(ctx: Context) -> str:
    """Close this call's SSE stream (the client comes back with Last-Event-ID), then answer."""
    await ctx.report_progress(1, 2, "ready")
    await GO_ON.setdefault("poll", trio.Event()).wait()
    await ctx.close_sse_stream()
    # Answer once the client is back: the SDK's transport loses an answer sent while a reconnection is
    # between replaying and tailing (its own known window), which is not what this test is about.
    await GO_ON.setdefault("finish", trio.Event()).wait()
    return "polled"


@asynccontextmanager
async def polling_server() -> AsyncIterator[str]:
    """The ``polling`` server on its own hypercorn on 127.0.0.1, with an event store and a 50 ms retry."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    cfg = Config()
    cfg.bind = ["127.0.0.1:0"]
    cfg.accesslog = None
    cfg.graceful_timeout = 0.5
    app = polling.streamable_http_app(event_store=InMemoryEventStore().session(), retry_interval=50)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, app, cfg, shutdown_trigger=stop.wait))
        try:
            yield binds[0] + "/mcp"
        finally:
            stop.set()


async def test_a_downstream_closing_its_stream_mid_call_closes_the_callers_and_both_resume() -> None:
    GO_ON["poll"], GO_ON["finish"] = trio.Event(), trio.Event()
    params = {"name": "ds.poll", "arguments": {}, "_meta": {"progressToken": "t"}}
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params}
    with trio.fail_after(WAIT_S):
        async with polling_server() as ds_url:
            config = make_config(mcpServers={"ds": {"url": ds_url, "protocol": "2025-11-25"}})
            async with (
                open_app(config) as app,
                http_server(app) as url,
                httpx2.AsyncClient(timeout=WAIT_S) as http,
            ):
                headers = await open_session(http, url)
                async with http.stream("POST", url, json=call, headers=headers) as response:
                    lines = response.aiter_lines()
                    before = await read_events(lines, 2)  # the priming event, then the downstream's progress
                    GO_ON["poll"].set()  # the downstream's stream is up: now it closes it
                    before += await read_events(lines, 99)  # until mcpipe closes its own
                async with http.stream("GET", url, headers={**headers, "last-event-id": before[-1]["id"]}) as again:
                    lines = again.aiter_lines()
                    after = await read_events(lines, 1)  # mcpipe's priming event: the caller is back
                    GO_ON["finish"].set()
                    after += await read_events(lines, 99, until='"id":3')
                watching = len(app.downstreams.servers[0].streams)
    assert before[0]["data"] == "" and '"ready"' in before[1]["data"]
    assert not any('"id":3' in e.get("data", "") for e in before)
    assert '"id":3' in after[-1]["data"] and "polled" in after[-1]["data"]
    assert watching == 0


async def test_a_stdio_downstreams_long_call_has_its_callers_stream_closed_after_sse_poll_ms_and_polled() -> None:
    # A stdio server cannot close the caller's stream (its SDK's close_sse_stream does nothing there):
    # with sse_poll_ms mcpipe closes it for that server's calls. The tool waits for the caller's answer to
    # its question, which the test sends only once the call's stream was closed and the test is back on a
    # resumed one (past its priming event: a message arriving while the SDK's transport sends it reaches
    # the client only at its next reconnection).
    ds = everything_downstream(prefix="", protocol="2025-11-25", sse_poll_ms=300)
    call = {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "test_elicitation"}}
    call["params"]["arguments"] = {"message": "go on?"}
    answer_of = '"id":5,"result"'
    streams: list[list[dict[str, str]]] = []
    asked: list[Any] = []
    with trio.fail_after(WAIT_S):
        async with (
            open_app(make_config(mcpServers={"ev": ds})) as app,
            http_server(app) as url,
            httpx2.AsyncClient(timeout=WAIT_S) as http,
        ):
            headers = await open_session(http, url, capabilities={"elicitation": {}})

            async def answer() -> None:
                for e in (e for s in streams for e in s):
                    if "elicitation/create" in e.get("data", "") and not asked:
                        asked.append(orjson.loads(e["data"]))
                        reply = {"jsonrpc": "2.0", "id": asked[0]["id"]}
                        reply["result"] = {"action": "accept", "content": {"response": "yes"}}
                        accepted = await http.post(url, json=reply, headers=headers)
                        assert accepted.status_code == 202, accepted.text

            async with http.stream("POST", url, json=call, headers=headers) as response:
                streams.append(await read_events(response.aiter_lines(), 99))  # until mcpipe closes it
            # A polling client: back with the last event id until the answer has come (the call's stream may
            # be closed again meanwhile, later each time).
            while not any(answer_of in e.get("data", "") for e in streams[-1]):
                last = [e for s in streams for e in s][-1]["id"]
                async with http.stream("GET", url, headers={**headers, "last-event-id": last}) as again:
                    assert again.status_code == 200
                    lines = again.aiter_lines()
                    streams.append([])
                    tailing = False
                    while not any(answer_of in e.get("data", "") for e in streams[-1]):
                        more = await read_events(lines, 1)
                        if not more:
                            break  # closed again: poll again
                        streams[-1] += more
                        tailing = tailing or more[0].get("data") == ""  # the resumed stream's priming event
                        if tailing:
                            await answer()
    events = [e for s in streams for e in s]
    assert streams[0][0]["data"] == "" and streams[0][0]["retry"] == "1000"
    assert not any(answer_of in e.get("data", "") for e in streams[0])  # the call's own stream was closed
    assert len(streams) >= 2 and answer_of in events[-1]["data"] and "action=accept" in events[-1]["data"]
    assert len(asked) == 1 and sum("elicitation/create" in e.get("data", "") for e in events) == 1
    ids = [int(e["id"]) for e in events]
    assert ids == sorted(set(ids))  # nothing replayed twice, nothing out of order


class _Request:
    """What the SDK's request context gives a 2025-11-25 HTTP call that can resume: its stream's closer."""

    def __init__(self) -> None:
        self.closed_at: list[float] = []

    async def close_sse_stream(self) -> None:
        self.closed_at.append(trio.current_time())


async def test_polling_closes_the_callers_stream_at_1x_2x_4x_the_interval_and_stops_with_the_call(
    autojump_clock: trio.abc.Clock,
) -> None:
    request = _Request()
    ctx = ToolContext(request_id="1", request=Request(sdk_context=request))
    start = trio.current_time()
    assert await StreamWatch().polled(ctx, 1.0, partial(trio.sleep, 9.5)) is None
    assert [round(t - start, 3) for t in request.closed_at] == [1.0, 2.0, 4.0, 8.0]
    await trio.sleep(100)
    assert len(request.closed_at) == 4  # nothing outlives the call


async def boom() -> None:
    await trio.sleep(2.5)
    raise ValueError("downstream went away")


async def test_a_polled_call_fails_and_is_cancelled_as_it_would_unpolled(autojump_clock: trio.abc.Clock) -> None:
    request = _Request()
    ctx = ToolContext(request_id="1", request=Request(sdk_context=request))
    with pytest.raises(ValueError, match="went away"):  # the call's own error, not a group
        await StreamWatch().polled(ctx, 1.0, boom)
    assert len(request.closed_at) == 2
    with trio.move_on_after(1.5) as scope:
        await StreamWatch().polled(ctx, 1.0, trio.sleep_forever)
    assert scope.cancelled_caught and len(request.closed_at) == 3


async def test_a_call_is_not_polled_without_an_interval_or_a_stream_to_close(autojump_clock: trio.abc.Clock) -> None:
    request = _Request()
    assert (
        await StreamWatch().polled(
            ToolContext(request_id="1", request=Request(sdk_context=request)), None, partial(trio.sleep, 5)
        )
        is None
    )
    assert await StreamWatch().polled(ToolContext(request_id="1"), 1.0, partial(trio.sleep, 5)) is None
    assert request.closed_at == []
