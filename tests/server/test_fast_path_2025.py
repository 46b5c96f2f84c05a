"""The lean 2025-11-25 ``tools/call`` path: on an established session it answers byte for byte what the SDK
answers (headers and SSE body), and leaves the SDK every request it should not serve."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import orjson
import pytest
import trio

from kit.servers import http_server, make_config
from kit.tools import test_tools
from mcpipe.gateway import PIPE_TOOL
from mcpipe.server import open_app
from mcpipe.server._fast import FastToolCall
from mcpipe.tools import ToolContext, ToolRegistry

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

V = "2025-11-25"
BASE = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


logging_tools = ToolRegistry()


@logging_tools.tool
async def chatty(ctx: ToolContext) -> str:
    """Log twice, then answer."""
    await ctx.send_log("info", {"step": 1})
    await ctx.send_log("warning", "two")
    return "said"


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each request that reached the lean path was served by it (True) or handed on (False)."""
    log: list[bool] = []
    original = FastToolCall.__call__

    async def spy(self: FastToolCall, scope: Any, receive: Any, send: Any) -> Any:
        result = await original(self, scope, receive, send)
        log.append(result[0])
        return result

    monkeypatch.setattr(FastToolCall, "__call__", spy)
    return log


@asynccontextmanager
async def session(
    fast: bool, *, learned: bool = True, **config: Any
) -> AsyncIterator[tuple[httpx2.AsyncClient, str, dict[str, str]]]:
    """A server (lean path on or off) and an initialized 2025-11-25 session on it; ``learned``: the SDK
    has served one request of the session (tools/list), as every client does before calling."""
    async with (
        open_app(make_config(**config), extra_sources=[test_tools, logging_tools]) as app,
        http_server(app, fast_path=fast) as url,
        httpx2.AsyncClient() as http,
    ):
        init = {"protocolVersion": V, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
        opened = await http.post(
            url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}, headers=BASE
        )
        hdrs = {**BASE, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": V}
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=hdrs)
        if learned:
            await http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=hdrs)
        yield http, url, hdrs


def call(name: str, arguments: Any, rid: Any = 7, **params: Any) -> bytes:
    return orjson.dumps(
        {
            "jsonrpc": "2.0",
            "id": rid,
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments, **params},
        }
    )


async def post_both(body: bytes, *, log_level: str | None = None, **config: Any) -> list[httpx2.Response]:
    answers = []
    for fast in (True, False):
        async with session(fast, **config) as (http, url, hdrs):
            if log_level is not None:
                set_level = {"jsonrpc": "2.0", "id": 5, "method": "logging/setLevel", "params": {"level": log_level}}
                await http.post(url, json=set_level, headers=hdrs)
            answers.append(await http.post(url, content=body, headers=hdrs))
    return answers


def wire(r: httpx2.Response) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, headers (the session id and date masked: they differ between the two servers), body."""
    masked = {b"mcp-session-id", b"date"}
    return r.status_code, [(k.lower(), b"" if k.lower() in masked else v) for k, v in r.headers.raw], r.content


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("echo", {"a": [1, 2, {"b": None}], "é": "ü"}),
        ("text_join", {"items": ["x", 2]}),
        ("text_join", {"items": "not a list"}),
        ("fail", {}),
        ("boom", {}),
        ("no_such_tool", {}),
        ("echo", None),
    ],
)
async def test_the_lean_2025_path_answers_byte_for_byte_what_the_sdk_answers(
    name: str, arguments: Any, served: list[bool]
) -> None:
    fast, sdk = await post_both(call(name, arguments))
    assert served[-1] is True
    assert wire(fast) == wire(sdk)


async def test_a_pipeline_on_the_lean_2025_path_answers_as_the_sdk_does(served: list[bool]) -> None:
    spec = {
        "steps": [{"tool": "echo", "args": {"v": 1}}, {"tool": "echo", "args": {"w": "${steps.step1.structured.v}"}}]
    }
    fast, sdk = await post_both(call(PIPE_TOOL, spec))
    assert served[-1] is True
    assert wire(fast)[:2] == wire(sdk)[:2]
    answers = []
    for r in (fast, sdk):
        answer = orjson.loads([line for line in r.content.split(b"\r\n") if line.startswith(b"data: {")][-1][6:])
        structured = answer["result"]["structuredContent"]
        structured["duration_ms"] = 0
        for step in structured.get("steps", {}).values():  # none by default when the run succeeds
            step["duration_ms"] = 0
        answer["result"]["content"] = []
        answers.append(answer)
    assert answers[0] == answers[1]


async def test_json_response_mode_answers_byte_for_byte_too(served: list[bool]) -> None:
    fast, sdk = await post_both(call("echo", {"x": 1}), http={"json_response": True})
    assert served[-1] is True
    assert fast.headers["content-type"] == "application/json"
    assert wire(fast) == wire(sdk)


@pytest.mark.parametrize(("level", "expected"), [(None, 2), ("warning", 1), ("error", 0)])
async def test_logs_of_a_call_on_the_lean_2025_path_reach_the_client_as_on_the_sdk_path(
    level: str | None, expected: int, served: list[bool]
) -> None:
    fast, sdk = await post_both(call("chatty", {}), log_level=level)
    assert served[-1] is True

    def events(r: httpx2.Response) -> list[Any]:
        return [orjson.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ") and line[6:]]

    assert events(fast) == events(sdk)
    assert [e.get("method") for e in events(fast)] == ["notifications/message"] * expected + [None]


@pytest.mark.parametrize(
    "body",
    [
        call("ask_user", {"message": "?"}),  # asks the client: only the SDK's stream carries the question
        call(PIPE_TOOL, {"steps": [{"parallel": [{"tool": "ask_user", "args": {"message": "?"}}]}]}),
        call("echo", {}, _meta={"progressToken": 3}),  # progress rides the SDK's stream
        call("echo", {}, rid=True),  # not a valid id: the SDK writes the error
        orjson.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}),
    ],
)
async def test_requests_the_lean_2025_path_should_not_serve_go_to_the_sdk(body: bytes, served: list[bool]) -> None:
    async with session(True) as (http, url, hdrs):
        await http.post(url, content=body, headers=hdrs)
    assert served[-1] is False


async def test_a_session_the_sdk_has_not_served_yet_goes_to_the_sdk_then_the_next_call_is_lean(
    served: list[bool],
) -> None:
    async with session(True, learned=False) as (http, url, hdrs):
        first = await http.post(url, content=call("echo", {"n": 1}), headers=hdrs)
        second = await http.post(url, content=call("echo", {"n": 2}), headers=hdrs)
    assert served[-2:] == [False, True]
    assert b'"structuredContent":{"n":1}' in first.content and b'"structuredContent":{"n":2}' in second.content


async def test_an_unknown_or_ended_session_gets_the_sdks_404(served: list[bool]) -> None:
    async with session(True) as (http, url, hdrs):
        await http.delete(url, headers=hdrs)
        gone = await http.post(url, content=call("echo", {}), headers=hdrs)
        other = await http.post(url, content=call("echo", {}), headers={**hdrs, "mcp-session-id": "nope"})
    assert gone.status_code == other.status_code == 404
    assert served[-2:] == [False, False]


async def test_an_answer_on_the_lean_2025_path_is_replayed_to_a_client_resuming_its_stream(served: list[bool]) -> None:
    with trio.fail_after(20):
        async with session(True) as (http, url, hdrs):
            first = await http.post(url, content=call("echo", {"kept": 1}), headers=hdrs)
            primed = first.text.split("\r\n", 1)[0]
            assert primed.startswith("id: ")
            resume = {**hdrs, "accept": "text/event-stream", "last-event-id": primed[4:]}
            async with http.stream("GET", url, headers=resume) as replay:
                async for line in replay.aiter_lines():
                    if line.startswith("data: {"):
                        again = orjson.loads(line[6:])
                        break
    answered = [line for line in first.text.split("\r\n") if line.startswith("data: {")]
    assert again == orjson.loads(answered[-1][6:])
    assert again["result"]["structuredContent"] == {"kept": 1}
    assert served.count(True) == 1  # the call went the lean way; the replay is the SDK's
