"""Hostile requests against a real server on 127.0.0.1, on both HTTP paths (issue 9, points 2, 3, 6, 7)."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import orjson
import pytest
import trio

from kit.hostile import call, doubling_spec, headers, http_app, make_config, nested_text, result_of
from mcpipe.gateway import PIPE_TOOL

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


async def post(url: str, body: bytes, name: str) -> tuple[int, Any]:
    async with httpx2.AsyncClient(timeout=60) as http:
        r = await http.post(url, content=body, headers=headers(name))
    return r.status_code, (result_of(r.text, r.headers.get("content-type", "")) if r.content else None)


ERAS = ["2026-07-28", "2025-11-25"]


async def post_2025(url: str, body: bytes) -> tuple[int, Any]:
    """``body`` posted on an established 2025-11-25 session (initialized, and one request served by the
    SDK, as every client does before calling: the lean path serves such sessions' calls)."""
    base = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    async with httpx2.AsyncClient(timeout=60) as http:
        opened = await http.post(
            url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}, headers=base
        )
        hdrs = {**base, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=hdrs)
        await http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=hdrs)
        r = await http.post(url, content=body, headers=hdrs)
    return r.status_code, (result_of(r.text, r.headers.get("content-type", "")) if r.content else None)


async def post_both(body: bytes, name: str, era: str = "2026-07-28") -> list[tuple[int, Any]]:
    """The same request to a server with the lean path and to one without it, in ``era``: a stateless
    2026-07-28 call, or a call on an established 2025-11-25 session."""
    answers = []
    for fast in (True, False):
        async with http_app(fast_path=fast) as url:
            answers.append(await (post(url, body, name) if era == "2026-07-28" else post_2025(url, body)))
    return answers


def raw_call(name: str, arguments_json: str) -> bytes:
    """A tools/call body whose arguments are given as JSON text (for values ``json`` cannot write)."""
    envelope = orjson.dumps(call(name, {})).decode()
    return envelope.replace('"arguments":{}', f'"arguments":{arguments_json}').encode()


def without_timings(answer: Any) -> Any:
    structured = answer.get("result", {}).get("structuredContent")
    if isinstance(structured, dict) and "duration_ms" in structured:
        structured["duration_ms"] = 0
        for step in structured["steps"].values():
            step["duration_ms"] = 0
        answer["result"]["content"] = []
    return answer


# --- 2. nesting ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("era", ERAS)
@pytest.mark.parametrize("depth", [100, 190])
async def test_arguments_nested_past_the_limit_get_a_located_error_on_both_paths_not_an_empty_500(depth, era):
    # Before: an empty HTTP 500 on the lean path, JSON-RPC error code 0 or -32603 on the SDK's.
    answers = await post_both(raw_call("echo", '{"v":' + nested_text(depth) + "}"), "echo", era)
    for status, answer in answers:
        assert status == 200
        result = answer["result"]
        assert result["isError"] is True
        assert result["content"][0]["text"].startswith("LIMIT_EXCEEDED: arguments: the arguments nests more than 64")


async def test_a_body_nested_1000_deep_gets_the_same_clean_answer_on_both_paths():
    # Deeper than the lean path reads: the SDK answers on both paths, a parse error or (when its parser
    # reads that deep, which depends on Python's recursion limit) the located limit error.
    fast, sdk = await post_both(raw_call("echo", '{"v":' + nested_text(1000) + "}"), "echo")
    assert fast == sdk
    status, answer = fast
    if status == 400:
        assert answer["error"]["code"] == -32700
    else:
        assert status == 200 and answer["result"]["content"][0]["text"].startswith("LIMIT_EXCEEDED: arguments")


async def test_a_pipeline_spec_nested_past_the_limit_answers_its_located_problem_on_both_paths():
    spec = '{"vars":{"x":' + nested_text(150) + '},"steps":[{"tool":"echo"}]}'
    answers = await post_both(raw_call(PIPE_TOOL, spec), PIPE_TOOL)
    for status, answer in answers:
        assert status == 200
        problems = answer["result"]["structuredContent"]["problems"]
        assert problems[0]["location"] == "vars" and problems[0]["code"] == "LIMIT_EXCEEDED"
    assert without_timings(answers[0][1]) == without_timings(answers[1][1])


# --- 3. output size -------------------------------------------------------------------------------------


async def test_the_doubling_attack_over_http_is_a_clean_output_too_large_and_the_server_lives_on():
    async with http_app() as url:
        status, answer = await post(url, orjson.dumps(call(PIPE_TOOL, doubling_spec())), PIPE_TOOL)
        assert status == 200
        structured = answer["result"]["structuredContent"]
        assert structured["error_code"] == "OUTPUT_TOO_LARGE" and structured["ok"] is False
        status, answer = await post(url, orjson.dumps(call("echo", {"alive": True})), "echo")
        assert answer["result"]["structuredContent"] == {"alive": True}


@pytest.mark.parametrize("fast", [True, False], ids=["lean", "sdk"])
@pytest.mark.parametrize(
    "spec",
    [
        {"vars": {"v": "x" * 10_000}, "steps": [{"tool": "echo", "args": {"v": "${vars.v}"}}] * 8},
        {
            "vars": {"items": list(range(100)), "v": "x" * 2000},
            "steps": [{"id": "e", "for_each": "${vars.items}", "step": {"tool": "echo", "args": {"v": "${vars.v}"}}}],
        },
    ],
    ids=["8 echo steps", "for_each"],
)
async def test_the_json_rpc_result_of_a_pipeline_stays_under_the_answer_limit(spec, fast):
    # Before: the limit counted each output once; the answer sent was 2-8 times the limit.
    limit = 200_000
    config = make_config(pipe={"max_answer_bytes": limit, "max_output_bytes": 150_000})
    async with http_app(config, fast_path=fast) as url, httpx2.AsyncClient(timeout=60) as http:
        r = await http.post(url, content=orjson.dumps(call(PIPE_TOOL, spec)), headers=headers(PIPE_TOOL))
    message = r.content
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        message = [line[5:].strip() for line in message.splitlines() if line.startswith(b"data:")][-1]
    answer = orjson.loads(message)["result"]
    assert answer["structuredContent"]["error_code"] == "OUTPUT_TOO_LARGE"
    assert "as sent" in answer["structuredContent"]["error"]
    assert len(message) <= limit


# --- 6. expression deadline -----------------------------------------------------------------------------


async def test_a_runaway_cel_expression_times_out_located_while_the_server_keeps_answering():
    # Before: this expression on a 58 KB list held the event loop for 31 s.
    config = make_config(
        pipe={"expression_timeout_ms": 500},
        pipelines=[
            {
                "name": "count",
                "steps": [
                    {
                        "kind": "transform",
                        "id": "counts",
                        "expression": "args.items.map(x, args.items.filter(y, y == x).size())",
                    }
                ],
            }
        ],
    )
    items = list(range(12_000))
    answered: list[float] = []
    async with http_app(config) as url:

        async def meanwhile() -> None:
            # Other requests are answered while the expression runs.
            for _ in range(3):
                await post(url, orjson.dumps(call("echo", {})), "echo")
                answered.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(meanwhile)
            status, answer = await post(url, orjson.dumps(call("count", {"items": items})), "count")
    assert status == 200 and answer["result"]["isError"] is True
    text = answer["result"]["content"][0]["text"]
    assert "steps[0]: the CEL expression timed out after 500 ms" in text and "TIMEOUT" in text
    assert len(answered) == 3


# --- 7. both paths agree; slow bodies --------------------------------------------------------------------


@pytest.mark.parametrize("era", ERAS)
async def test_integers_of_2_64_and_more_stay_integers_on_both_paths(era):
    # Before: the lean path read 18446744073709551616 as a float.
    big = "18446744073709551616"
    answers = await post_both(raw_call("echo", '{"n":' + big + ',"m":-' + big + "0}"), "echo", era)
    for status, answer in answers:
        assert status == 200
        assert answer["result"]["structuredContent"] == {"n": 2**64, "m": -(2**64) * 10}
    assert answers[0] == answers[1]


@pytest.mark.parametrize("era", ERAS)
async def test_a_body_with_a_byte_order_mark_is_accepted_with_the_same_answer_on_both_paths(era):
    # Before: refused with 400 on a 2025-11-25 session, accepted on 2026-07-28.
    body = b"\xef\xbb\xbf" + orjson.dumps(call("echo", {"a": 1}))
    fast, sdk = await post_both(body, "echo", era)
    assert fast == sdk
    status, answer = fast
    assert status == 200 and answer["result"]["structuredContent"] == {"a": 1}


async def test_a_body_that_arrives_too_slowly_is_answered_408():
    config = make_config(http={"body_timeout_s": 0.5})
    body = orjson.dumps(call("echo", {"a": 1}))
    async with http_app(config) as url:
        port = int(url.split(":")[2].split("/")[0])
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            head = (
                f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
                f"accept: application/json, text/event-stream\r\nmcp-protocol-version: 2026-07-28\r\n"
                f"mcp-method: tools/call\r\nmcp-name: echo\r\ncontent-length: {len(body)}\r\n\r\n"
            )
            await stream.send_all(head.encode() + body[:10])  # ... and the rest never comes
            reply = b""
            with trio.fail_after(10):
                while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
                    chunk = await stream.receive_some()
                    if not chunk:
                        break
                    reply += chunk
    assert reply.startswith(b"HTTP/1.1 408")
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"] == "request_timeout"


async def test_a_direct_call_whose_result_passes_the_answer_limit_is_an_error_result_on_both_paths():
    config = make_config(pipe={"max_answer_bytes": 1000})
    body = orjson.dumps(call("echo", {"blob": "x" * 600}))  # echo answers it twice: structured and as text
    answers = []
    for fast in (True, False):
        async with http_app(config, fast_path=fast) as url:
            answers.append(await post(url, body, "echo"))
    for status, answer in answers:
        assert status == 200 and answer["result"]["isError"] is True
        assert answer["result"]["content"][0]["text"].startswith("OUTPUT_TOO_LARGE: the result of 'echo' would be")
