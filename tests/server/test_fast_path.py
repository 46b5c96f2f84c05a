"""The lean 2026-07-28 ``tools/call`` path answers exactly as the SDK path would, and hands the SDK
every request it does not fully understand."""

from __future__ import annotations

from typing import Any

import httpx2
import orjson
import pytest
import trio

from kit.audit import WatchedAudit
from kit.servers import http_server, make_config, running
from kit.tools import BLOCKED
from mcpipe.gateway import PIPE_TOOL
from mcpipe.server import _fast as fast_module
from mcpipe.server._fast import FastToolCall

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

V = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}}


@pytest.fixture
def served(monkeypatch) -> list[bool]:
    """Whether each request that reached the lean path was served by it (True) or handed on (False)."""
    log: list[bool] = []
    original = FastToolCall.__call__

    async def spy(self, scope, receive, send):
        result = await original(self, scope, receive, send)
        log.append(result[0])
        return result

    monkeypatch.setattr(FastToolCall, "__call__", spy)
    return log


def call(name: str, arguments: Any, *, meta: dict[str, Any] | None = None, rid: Any = 7) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments, "_meta": {**META, **(meta or {})}}
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}


def headers(name: str | None, **extra: str) -> dict[str, str]:
    h = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": V,
        "mcp-method": "tools/call",
        **extra,
    }
    if name is not None:
        h["mcp-name"] = name
    return h


async def post_both(body: dict[str, Any], hdrs: dict[str, str]) -> tuple[httpx2.Response, httpx2.Response]:
    """The same request to a server with the lean path and to one without."""
    answers = []
    for fast in (True, False):
        async with running() as app, http_server(app, fast_path=fast) as url, httpx2.AsyncClient() as http:
            answers.append(await http.post(url, content=orjson.dumps(body), headers=hdrs))
    return answers[0], answers[1]


def _result(r: httpx2.Response) -> Any:
    if r.headers["content-type"].startswith("text/event-stream"):
        data = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:")]
        return orjson.loads(data[-1])
    return r.json()


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("echo", {"a": [1, 2, {"b": None}]}),
        ("text_join", {"items": ["x", 2]}),
        ("text_join", {"items": "not a list"}),
        ("fail", {}),
        ("boom", {}),
        ("no_such_tool", {}),
        ("echo", None),
        (PIPE_TOOL, {"steps": [{"tool": "echo", "args": {"v": 1}}], "return": "${steps.step1.structured.v}"}),
        (PIPE_TOOL, {"steps": []}),
    ],
)
async def test_the_lean_path_answers_byte_for_byte_what_the_sdk_path_answers(name, arguments, served):
    fast, sdk = await post_both(call(name, arguments), headers(name))
    assert served == [True]
    assert fast.status_code == sdk.status_code == 200
    a, b = _result(fast), _result(sdk)
    for answer in (a, b):
        structured = answer["result"].get("structuredContent")
        if isinstance(structured, dict) and "duration_ms" in structured:  # timings differ between runs
            structured["duration_ms"] = 0
            for step in structured.get("steps", {}).values():  # a failed run's summaries (answer: result)
                step["duration_ms"] = 0
            answer["result"]["content"] = []
    assert a == b


@pytest.mark.parametrize(
    ("body", "hdrs"),
    [
        (call("echo", {}), headers("text_join")),  # Mcp-Name disagrees with the body
        (call("echo", {}), headers("echo", **{"mcp-protocol-version": "2025-11-25"})),
        ({**call("echo", {}), "params": {"name": "echo", "arguments": {}, "_meta": {}}}, headers("echo")),
        (
            {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": META}},
            headers(None, **{"mcp-method": "tools/list"}),
        ),
        ({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}}, headers(None)),
        (call("echo", {}, rid=True), headers("echo")),
    ],
)
async def test_requests_the_lean_path_does_not_serve_get_the_sdk_answer(body, hdrs, served):
    fast, sdk = await post_both(body, hdrs)
    assert served == [False]
    assert (fast.status_code, fast.text) == (sdk.status_code, sdk.text)


async def test_a_request_asking_for_progress_goes_to_the_sdk_and_gets_its_notifications(served):
    body = call(
        PIPE_TOOL, {"steps": [{"tool": "echo", "args": {}}, {"tool": "echo", "args": {}}]}, meta={"progressToken": "t"}
    )
    async with running() as app, http_server(app) as url, httpx2.AsyncClient() as http:
        r = await http.post(url, content=orjson.dumps(body), headers=headers(PIPE_TOOL))
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.text.count('"notifications/progress"') == 2 and _result(r)["result"]["structuredContent"]["ok"]
    assert served == [False]


async def test_the_lean_path_checks_the_host_header_like_the_sdk():
    fast, sdk = await post_both(call("echo", {}), headers("echo", host="evil.example"))
    assert fast.status_code == sdk.status_code == 421


async def test_a_client_that_disconnects_cancels_its_call_on_the_lean_path(served):
    audit = WatchedAudit()
    started = BLOCKED["fast"] = trio.Event()
    body = orjson.dumps(call("block", {"tag": "fast"}))
    async with running(audit=audit) as app, http_server(app) as url:
        with trio.fail_after(10):
            async with httpx2.AsyncClient() as http, trio.open_nursery() as nursery:
                nursery.start_soon(lambda: http.post(url, content=body, headers=headers("block")))
                await started.wait()
                nursery.cancel_scope.cancel()
            records = await audit.until(lambda rs: len(rs) == 1)
    assert records[0]["tool"] == "block" and records[0]["error_code"] == "CANCELLED"
    assert served == [True]


async def test_a_long_answer_on_the_lean_path_becomes_an_sse_stream_with_keep_alive_pings(monkeypatch, served):
    monkeypatch.setattr(fast_module, "PING_INTERVAL_S", 0.05)
    body = orjson.dumps(call("slow", {"seconds": 0.3}))
    async with running() as app, http_server(app) as url, httpx2.AsyncClient() as http:
        r = await http.post(url, content=body, headers=headers("slow"))
    assert r.headers["content-type"].startswith("text/event-stream") and ": ping" in r.text
    assert _result(r)["result"]["content"] == [{"type": "text", "text": "done"}] and served == [True]


async def test_a_call_outlasting_the_watchers_delay_but_not_the_ping_interval_is_answered_as_plain_json(served):
    # Past WATCH_AFTER_S the watcher reads the socket; the call's end stops it, and the answer is the JSON one.
    body = orjson.dumps(call("slow", {"seconds": fast_module.WATCH_AFTER_S * 3}))
    async with running() as app, http_server(app) as url, httpx2.AsyncClient() as http:
        r = await http.post(url, content=body, headers=headers("slow"))
        again = await http.post(url, content=body, headers=headers("slow"))  # the connection still serves
    assert r.headers["content-type"].startswith("application/json") and ": ping" not in r.text
    assert _result(r)["result"]["content"] == [{"type": "text", "text": "done"}] and served == [True, True]
    assert again.status_code == 200 and _result(again) == _result(r)


SYNC_STEPS = {
    "name": "echo_twice",
    "steps": [
        {"kind": "tool", "id": "a", "tool": "echo", "args": {"value": "${args.v}"}},
        {"kind": "tool", "id": "b", "tool": "echo", "args": {"value": "${steps.a.output.value}"}},
    ],
}


async def test_a_declared_pipeline_of_synchronous_tool_steps_answers_inline_as_the_sdk_path_does(served):
    # No task watches such a call on the lean path (it runs inline, as a synchronous Python tool does).
    answers = []
    for fast in (True, False):
        cfg = make_config(pipelines=[SYNC_STEPS])
        async with running(cfg) as app, http_server(app, fast_path=fast) as url, httpx2.AsyncClient() as http:
            r = await http.post(url, content=orjson.dumps(call("echo_twice", {"v": 3})), headers=headers("echo_twice"))
            answers.append((r.status_code, _result(r)))
    assert served == [True]
    assert answers[0] == answers[1] and answers[0][1]["result"]["structuredContent"] == {"value": 3}


async def test_a_declared_pipeline_with_a_step_that_yields_is_still_cancelled_when_its_client_leaves(served):
    audit = WatchedAudit()
    started = BLOCKED["declared"] = trio.Event()
    pipeline = {"name": "echo_then_block", "steps": [*SYNC_STEPS["steps"][:1]]}
    pipeline["steps"].append({"kind": "tool", "id": "b", "tool": "block", "args": {"tag": "declared"}})
    body = orjson.dumps(call("echo_then_block", {"v": 1}))
    cfg = make_config(python_tools=["kit.tools:test_tools"], pipelines=[pipeline])
    async with running(cfg, audit=audit) as app, http_server(app) as url:
        with trio.fail_after(10):
            async with httpx2.AsyncClient() as http, trio.open_nursery() as nursery:
                nursery.start_soon(lambda: http.post(url, content=body, headers=headers("echo_then_block")))
                await started.wait()
                nursery.cancel_scope.cancel()
            records = await audit.until(lambda rs: any(r["tool"] == "echo_then_block" for r in rs))
    assert [(r["tool"], r["error_code"]) for r in records] == [
        ("echo", None),
        ("block", "CANCELLED"),
        ("echo_then_block", "CANCELLED"),
    ]
    assert served == [True]
