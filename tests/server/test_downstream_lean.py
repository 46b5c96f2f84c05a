"""The lean call path to HTTP downstreams (``mcpipe.downstream._leancall``): a proxied ``tools/call`` over a real
HTTP server sent without the SDK client's request machinery, answering as the SDK's path does (progress,
logging, cancellation, a lost session, a mid-call question, both eras)."""

from __future__ import annotations

import gzip
import json
import sys
import time
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
import trio
from mcp import Client
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

from kit.interaction import http_asking_server
from kit.servers import DOWNSTREAM, make_config, running, start_process
from mcpipe.gateway import PIPE_TOOL

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

ERAS = ["2026-07-28", "2025-11-25"]


@asynccontextmanager
async def http_downstream() -> AsyncIterator[tuple[Any, str]]:
    proc, url = await start_process([sys.executable, DOWNSTREAM, "--http", "0"], marker="", stream="stdout")
    try:
        yield proc, url
    finally:
        proc.kill()
        with trio.move_on_after(5):
            await proc.wait()


@asynccontextmanager
async def debug_logging_client(app: Any, logged: list[Any]) -> AsyncIterator[Client]:
    """A 2025-11-25 client of ``app`` at log level ``debug``, the data of each log message it hears in ``logged``."""

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append(params.data)

    async with Client(app.server, mode="legacy", logging_callback=on_log) as client:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            await client.set_logging_level("debug")
        yield client


class SdkCalls:
    """The requests SDK client sessions send through ``send_request`` (the gateway's and the test's own)."""

    def __init__(self) -> None:
        self.sent: list[tuple[ClientSession, str]] = []

    def clear(self) -> None:
        self.sent.clear()

    def of(self, app: Any) -> list[str]:
        """The methods the gateway's sessions of downstream servers sent."""
        ours = {id(s._client.session) for s in app.downstreams.servers if s._client is not None}
        return [method for session, method in self.sent if id(session) in ours]


@pytest.fixture
def sdk_calls(monkeypatch: pytest.MonkeyPatch) -> SdkCalls:
    calls = SdkCalls()
    original = ClientSession.send_request

    async def counting(self: ClientSession, request: Any, *args: Any, **kwargs: Any) -> Any:
        calls.sent.append((self, request.method))
        return await original(self, request, *args, **kwargs)

    monkeypatch.setattr(ClientSession, "send_request", counting)
    return calls


@pytest.mark.parametrize("protocol", ERAS)
async def test_a_proxied_call_over_a_real_http_downstream_does_not_enter_the_sdk_clients_send_request(
    protocol: str, sdk_calls: SdkCalls
) -> None:
    with trio.fail_after(30):
        async with http_downstream() as (_, url):
            cfg = make_config(mcpServers={"ds": {"url": url, "protocol": protocol}})
            async with running(cfg) as app, Client(app.server) as client:
                await app.downstreams.servers[0].wait_connected()
                sdk_calls.clear()
                direct = await client.call_tool("ds.add", {"a": 2, "b": 3})
                greeted = await client.call_tool("ds.greet", {"name": "crew"})
                piped = await client.call_tool(
                    PIPE_TOOL,
                    {"steps": [{"tool": "ds.add", "args": {"a": 1, "b": 1}}, {"tool": "ds.refuse"}]},
                )
                await app.downstreams.servers[0].client().list_tools()  # the count sees the gateway's session
                seen = sdk_calls.of(app)
    assert direct.structured_content == {"result": 5} and not direct.is_error
    assert greeted.content[0].text == "hello, crew"  # type: ignore[union-attr]
    assert piped.structured_content is not None and piped.structured_content["ok"] is False
    assert seen == ["tools/list"]


@pytest.mark.parametrize("protocol", ERAS)
async def test_progress_and_logging_of_a_lean_call_still_reach_the_caller(protocol: str, sdk_calls: SdkCalls) -> None:
    ticks: list[str | None] = []
    logged: list[Any] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        ticks.append(message)

    with trio.fail_after(30):
        async with http_downstream() as (_, url):
            cfg = make_config(mcpServers={"ds": {"url": url, "protocol": protocol}})
            async with running(cfg) as app:
                await app.downstreams.servers[0].wait_connected()
                async with debug_logging_client(app, logged) as client:
                    sdk_calls.clear()
                    await client.call_tool("ds.progress", {"steps": 3}, progress_callback=on_progress)
                    said = await client.call_tool("ds.chatter", {"tag": "t"})
                    seen = sdk_calls.of(app)
    assert ticks == ["tick 1", "tick 2", "tick 3"]
    assert said.content[0].text == "t"  # type: ignore[union-attr]
    assert logged == [f"t {level}" for level in ("debug", "info", "warning", "error")]
    assert "tools/call" not in seen


@pytest.mark.parametrize("protocol", ERAS)
async def test_cancelling_a_lean_call_cancels_the_downstream_call_at_once(protocol: str, sdk_calls: SdkCalls) -> None:
    started = trio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        started.set()

    with trio.fail_after(30):
        async with http_downstream() as (_, url):
            cfg = make_config(mcpServers={"ds": {"url": url, "protocol": protocol}})
            async with running(cfg) as app, Client(app.server) as client:
                await app.downstreams.servers[0].wait_connected()
                sdk_calls.clear()
                async with trio.open_nursery() as nursery:

                    async def call() -> None:
                        await client.call_tool("ds.wait", {"tag": protocol}, progress_callback=on_progress)

                    nursery.start_soon(call)
                    await started.wait()
                    cancelled_at = time.monotonic()
                    nursery.cancel_scope.cancel()
                assert "tools/call" not in sdk_calls.of(app)
                events = None
                while not events or events[-1]["event"] != "cancelled":
                    events = (await client.call_tool("ds.events", {})).structured_content["result"]  # type: ignore[index]
    assert [e["event"] for e in events] == ["started", "cancelled"]
    assert events[-1]["t"] - cancelled_at < 2.0  # at once; never would hit the 30 s bound


async def test_a_2025_http_downstream_restarted_under_a_lean_call_path_gets_a_new_session(sdk_calls: SdkCalls) -> None:
    with trio.fail_after(60):
        async with http_downstream() as (first, url):
            port = url.rsplit(":", 1)[1].split("/", 1)[0]
            cfg = make_config(mcpServers={"ds": {"url": url, "protocol": "2025-11-25"}})
            async with running(cfg) as app, Client(app.server) as client:
                ds = app.downstreams.servers[0]
                await ds.wait_connected()
                before = await client.call_tool("ds.add", {"a": 1, "b": 1})
                first.kill()
                await first.wait()
                again, _ = await start_process([sys.executable, DOWNSTREAM, "--http", port], marker="", stream="stdout")
                try:
                    after = await client.call_tool("ds.add", {"a": 2, "b": 2})
                finally:
                    again.kill()
                    with trio.move_on_after(5):
                        await again.wait()
    assert before.structured_content == {"result": 2}
    assert after.structured_content == {"result": 4} and ds.connections == 2


@pytest.mark.parametrize(("protocol", "tool"), [("2025-11-25", "old_style"), ("2026-07-28", "delete")])
async def test_a_downstream_question_during_a_lean_call_is_still_relayed_to_the_caller(
    protocol: str, tool: str, sdk_calls: SdkCalls
) -> None:
    asked: list[str] = []

    async def elicit(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"ok": True})

    with trio.fail_after(30):
        async with http_asking_server() as url:
            cfg = make_config(mcpServers={"ds": {"url": url, "protocol": protocol}})
            async with running(cfg) as app:
                await app.downstreams.servers[0].wait_connected()
                async with Client(app.server, mode="legacy", elicitation_callback=elicit) as client:
                    sdk_calls.clear()
                    r = await client.call_tool(f"ds.{tool}", {"item": "logs"})
                    seen = sdk_calls.of(app)
    assert r.content[0].text == "deleted logs"  # type: ignore[union-attr]
    assert asked == ["Delete logs?"]
    # 2025-11-25: asked on the call's own stream, answered through the session; 2026-07-28: the retry carrying
    # the answers is the SDK's send_request (only the first round is lean).
    assert seen == ([] if protocol == "2025-11-25" else ["tools/call"])


PLAIN_OR_NOT = [
    {"content": [{"type": "text", "text": "hi"}]},
    {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "isError": True},
    {"content": [], "structuredContent": {"n": 1}, "_meta": {"k": 1}, "resultType": "complete"},
    {"content": [], "structuredContent": None},
    {"content": [{"type": "text", "text": "x", "annotations": {"priority": 0.5}}]},
    {"content": [{"type": "image", "data": "aGk=", "mimeType": "image/png"}]},
    {"content": [{"type": "text", "text": "x"}], "structuredContent": {"n": 2}, "extra": 1},
]


@pytest.mark.parametrize("raw", PLAIN_OR_NOT)
def test_a_result_read_off_the_wire_answers_what_the_sdk_session_makes_of_it(raw: dict[str, Any]) -> None:
    from mcpipe.downstream._leancall import LeanResult, _result

    send, receive = anyio.create_memory_object_stream[Any](0)
    with send, receive:
        got = _result(ClientSession(receive, send), json.loads(json.dumps(raw)))
    expected = types.CallToolResult.model_validate(raw, by_name=False)
    want = (
        [b.model_dump(by_alias=True, mode="json", exclude_none=True) for b in expected.content],
        expected.structured_content,
        bool(expected.is_error),
        "structured_content" in expected.model_fields_set,
    )
    if isinstance(got, LeanResult):
        assert (got.content, got.structured_content, got.is_error, got.sent) == want
    else:  # not plain: the session's own adapter made it
        assert isinstance(got, types.CallToolResult)
        dumped = [b.model_dump(by_alias=True, mode="json", exclude_none=True) for b in got.content]
        assert (
            dumped,
            got.structured_content,
            bool(got.is_error),
            "structured_content" in got.model_fields_set,
        ) == want


async def test_a_progress_callback_that_raises_is_logged_and_the_lean_call_goes_on(caplog):
    # As the SDK's dispatcher contains a progress callback (`_shielded_progress`): the call is not failed by it.
    from mcpipe.downstream._leancall import _event

    seen: list[float] = []

    async def raising(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)
        raise RuntimeError("the caller is gone")

    note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 7, "progress": 0.5}}
    with caplog.at_level("ERROR", logger="mcpipe.downstream._leancall"):
        outcome = await _event(json.dumps(note), None, 7, raising)  # the wire is not needed for progress
    assert outcome is None and seen == [0.5]
    assert any("progress callback raised" in r.getMessage() for r in caplog.records)


EVERYTHING = Path(__file__).resolve().parents[1] / "conformance" / "everything_server.py"


@pytest.mark.parametrize("protocol", ERAS)
async def test_a_lean_call_whose_stream_the_server_closes_mid_call_resumes_and_answers(
    protocol: str, sdk_calls: SdkCalls
) -> None:
    # The conformance suite's everything-server (an event store, retry 100 ms): its test_reconnection logs,
    # closes the call's SSE stream (SEP-1699), logs again and answers; the lean call resumes from the last event.
    logged: list[Any] = []
    proc, url = await start_process([sys.executable, str(EVERYTHING), "--http", "0"], marker="", stream="stdout")
    try:
        with trio.fail_after(30):
            cfg = make_config(mcpServers={"ev": {"url": url, "protocol": protocol}})
            async with running(cfg) as app:
                await app.downstreams.servers[0].wait_connected()
                async with debug_logging_client(app, logged) as client:
                    sdk_calls.clear()
                    r = await client.call_tool("ev.test_reconnection", {})
                    seen = sdk_calls.of(app)
    finally:
        proc.kill()
        with trio.move_on_after(5):
            await proc.wait()
    assert not r.is_error and r.content[0].text == "Reconnection test completed"  # type: ignore[union-attr]
    assert "Before disconnect" in logged and "After reconnect" in logged
    assert "tools/call" not in seen


# -- straight to the lean wire: no httpx Request/Response for a client without auth flows or foreign hooks --


class ClientSends:
    """The downstream ``tools/call`` POSTs that went through an httpx client's ``send`` (the test's own
    client does not send any: it is in memory)."""

    def __init__(self) -> None:
        self.calls = 0


@pytest.fixture
def client_sends(monkeypatch: pytest.MonkeyPatch) -> ClientSends:
    sends = ClientSends()
    original = httpx2.AsyncClient.send

    async def counting(self: httpx2.AsyncClient, request: httpx2.Request, **kwargs: Any) -> httpx2.Response:
        if request.method == "POST" and b'"tools/call"' in request.content:
            sends.calls += 1
        return await original(self, request, **kwargs)

    monkeypatch.setattr(httpx2.AsyncClient, "send", counting)
    return sends


async def proxied_calls(url: str, protocol: str) -> tuple[list[Any], list[str | None], list[Any]]:
    """A plain call, a call with progress and one with log messages through a gateway of ``url``."""
    ticks: list[str | None] = []
    logged: list[Any] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        ticks.append(message)

    cfg = make_config(mcpServers={"ds": {"url": url, "protocol": protocol}})
    async with running(cfg) as app:
        await app.downstreams.servers[0].wait_connected()
        async with debug_logging_client(app, logged) as client:
            results = [
                await client.call_tool("ds.add", {"a": 2, "b": 3}),
                await client.call_tool("ds.progress", {"steps": 2}, progress_callback=on_progress),
                await client.call_tool("ds.chatter", {"tag": "t"}),
            ]
    return [(r.content, r.structured_content, r.is_error) for r in results], ticks, logged


@pytest.mark.parametrize("protocol", ERAS)
async def test_a_call_on_a_client_without_auth_or_foreign_hooks_goes_straight_to_the_wire_and_answers_the_same(
    protocol: str, client_sends: ClientSends, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(60):
        async with http_downstream() as (_, url):
            direct = await proxied_calls(url, protocol)
            straight = client_sends.calls
            # The same calls with credentials in the URL: httpx's basic auth flow, so through the client's send.
            authed = url.replace("http://", "http://user:secret@", 1)
            through_send = await proxied_calls(authed, protocol)
    assert straight == 0
    assert client_sends.calls == 3
    assert direct == through_send
    results, ticks, logged = direct
    assert results[0][1] == {"result": 5} and ticks == ["tick 1", "tick 2"]
    assert logged == [f"t {level}" for level in ("debug", "info", "warning", "error")]


async def test_a_client_with_a_hook_of_someone_elses_sends_its_calls_through_httpx_and_runs_the_hook(
    client_sends: ClientSends, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mcpipe.downstream._polling import StreamWatch

    heard: list[int] = []
    install = StreamWatch.install

    async def foreign(response: httpx2.Response) -> None:
        heard.append(response.status_code)

    def install_and_add(self: StreamWatch, http: httpx2.AsyncClient) -> None:
        install(self, http)
        http.event_hooks["response"].append(foreign)

    monkeypatch.setattr(StreamWatch, "install", install_and_add)
    with trio.fail_after(30):
        async with http_downstream() as (_, url):
            cfg = make_config(mcpServers={"ds": {"url": url, "protocol": "2026-07-28"}})
            async with running(cfg) as app, Client(app.server) as client:
                await app.downstreams.servers[0].wait_connected()
                heard.clear()
                r = await client.call_tool("ds.add", {"a": 2, "b": 3})
    assert r.structured_content == {"result": 5}
    assert client_sends.calls == 1 and heard == [200]


def lean_wire(url: str, http: httpx2.AsyncClient) -> Any:
    from mcp.client.streamable_http import StreamableHTTPTransport

    from mcpipe.downstream._leancall import Wire

    return Wire(url, http, StreamableHTTPTransport(url), None)


@pytest.mark.parametrize(
    ("session_id", "extra"), [(None, None), ("s-1", None), ("s-1", {"Authorization": "Bearer t", "X-A": "b"})]
)
async def test_a_direct_calls_bytes_are_the_bytes_the_lean_transport_writes_for_the_clients_request(
    session_id: str | None, extra: dict[str, str] | None
) -> None:
    from mcpipe.downstream._wire import LeanTransport, head_of

    async with httpx2.AsyncClient(headers={"X-Team": "ops"}, transport=LeanTransport()) as http:
        wire = lean_wire("http://127.0.0.1:8123/mcp?x=1", http)
        wire.transport.session_id = session_id
        assert wire.lean is not None
        for body in (b'{"jsonrpc":"2.0","id":1}', b'{"id":22,"params":{"a":"' + b"x" * 300 + b'"}}'):
            request = wire.request(body, extra)
            assert wire.message(body, extra) == head_of(request) + request.content


async def test_a_client_with_an_auth_flow_or_a_hook_is_not_sent_on_directly() -> None:
    from mcpipe.downstream._wire import LeanTransport

    async def hook(response: httpx2.Response) -> None:
        pass

    async with (
        httpx2.AsyncClient(transport=LeanTransport(), auth=("u", "p")) as with_auth,
        httpx2.AsyncClient(transport=LeanTransport(), event_hooks={"response": [hook]}) as hooked,
        httpx2.AsyncClient() as pooled,
        httpx2.AsyncClient(transport=LeanTransport()) as plain,
    ):
        assert lean_wire("http://127.0.0.1:1/mcp", with_auth).lean is None
        assert lean_wire("http://u:p@127.0.0.1:1/mcp", plain).lean is None
        assert lean_wire("http://127.0.0.1:1/mcp", hooked).lean is None
        assert lean_wire("http://127.0.0.1:1/mcp", pooled).lean is None
        assert lean_wire("http://127.0.0.1:1/mcp", plain).lean is not None


RESULT = b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"hi"}]}}'


def canned(status: str, headers: list[str], body: bytes) -> bytes:
    head = "".join(f"{h}\r\n" for h in [f"HTTP/1.1 {status}", *headers, f"Content-Length: {len(body)}"])
    return head.encode() + b"\r\n" + body


@asynccontextmanager
async def answering(answer: bytes) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A loopback HTTP server answering every request with ``answer``; the requests it read in the list."""
    got: list[bytes] = []

    async def serve(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        head, _, rest = data.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(rest) < length:
            rest += await stream.receive_some(65536)
        got.append(head + b"\r\n\r\n" + rest)
        await stream.send_all(answer)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        yield f"http://127.0.0.1:{port}/mcp", got
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (canned("200 OK", ["Content-Type: application/json"], RESULT), {"content": [{"type": "text", "text": "hi"}]}),
        (
            canned("200 OK", ["Content-Type: application/json", "Content-Encoding: gzip"], gzip.compress(RESULT)),
            {"content": [{"type": "text", "text": "hi"}]},
        ),
        (
            canned("200 OK", ["Content-Type: application/json", "Set-Cookie: sid=abc; Path=/"], RESULT),
            {"content": [{"type": "text", "text": "hi"}]},
        ),
        (canned("307 Temporary Redirect", ["Location: /elsewhere"], b""), None),
        (canned("200 OK", ["Content-Type: text/html"], b"<p>"), "Unexpected content type: text/html"),
        (canned("500 Oops", ["Content-Type: text/plain"], b"no"), "Server returned an error response"),
    ],
)
async def test_a_direct_answer_that_is_not_plain_is_read_as_the_clients_response_would_be(
    answer: bytes, expected: Any
) -> None:

    from mcpipe.downstream._leancall import _direct
    from mcpipe.downstream._wire import LeanTransport

    async def no_progress(progress: float, total: float | None, message: str | None) -> None:
        raise AssertionError("no progress expected")

    with trio.fail_after(10):
        async with answering(answer) as (url, got), httpx2.AsyncClient(transport=LeanTransport()) as http:
            wire = lean_wire(url, http)
            body = b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x"}}'
            try:
                outcome: Any = await _direct(wire, body, None, 7, no_progress, {})
            except MCPError as exc:
                outcome = exc.error.message
            cookies = dict(http.cookies)
    assert outcome == expected
    assert got == [wire.message(body, None)]
    assert cookies == ({"sid": "abc"} if b"Set-Cookie" in answer else {})


@pytest.mark.parametrize("protocol", ERAS)
async def test_a_lean_call_past_the_servers_timeout_fails_as_timed_out_and_cancels_the_downstream_call(
    protocol: str, client_sends: ClientSends
) -> None:
    with trio.fail_after(30):
        async with http_downstream() as (_, url):
            cfg = make_config(mcpServers={"ds": {"url": url, "protocol": protocol, "timeout_ms": 300}})
            async with running(cfg) as app, Client(app.server) as client:
                await app.downstreams.servers[0].wait_connected()
                with pytest.raises(MCPError, match="timed out"):  # the downstream's JSON-RPC error, passed on
                    await client.call_tool("ds.wait", {"tag": protocol})
                events = None
                while not events or events[-1]["event"] != "cancelled":
                    events = (await client.call_tool("ds.events", {})).structured_content["result"]  # type: ignore[index]
                again = await client.call_tool("ds.add", {"a": 1, "b": 2})  # the session still serves
    assert [e["event"] for e in events] == ["started", "cancelled"]
    assert again.structured_content == {"result": 3}
    assert client_sends.calls == 0  # all of them straight on the wire


async def test_a_cookie_a_direct_answer_set_is_kept_and_the_next_call_carries_it_through_the_client() -> None:
    from mcpipe.downstream._leancall import _sent
    from mcpipe.downstream._wire import LeanTransport

    async def no_progress(progress: float, total: float | None, message: str | None) -> None:
        raise AssertionError("no progress expected")

    answer = canned("200 OK", ["Content-Type: application/json", "Set-Cookie: sid=abc; Path=/"], RESULT)
    body = b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x"}}'
    with trio.fail_after(10):
        async with answering(answer) as (url, got), httpx2.AsyncClient(transport=LeanTransport()) as http:
            wire = lean_wire(url, http)
            first = await _sent(wire, body, None, 7, no_progress, {})
            second = await _sent(wire, body, None, 7, no_progress, {})
    assert first == second == {"content": [{"type": "text", "text": "hi"}]}
    assert b"cookie:" not in got[0].lower()
    assert b"\r\ncookie: sid=abc\r\n" in got[1].lower()
