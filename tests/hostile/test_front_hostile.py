"""The HTTP front under attack, on a real server over HTTP (issue 20, items 7, 9 and 13): every route gets the
Host/Origin checks and the body deadline of ``/mcp``, a flood of connections past the descriptor limit leaves
``/healthz`` and ``/mcp`` answering with one log line, one principal cannot take every 2025-11-25 session, and a
workflow path parameter cannot be a dot segment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest
import trio

from kit.hostile import http_app, make_config
from kit.llm import fake_api, fake_openai, text
from kit.servers import make_config as make_config_in
from kit.siege import base_of, call, probing, rpc, serve_process

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


def workflow_config(model_url: str, api_url: str, path: str = "/search", **extra: Any) -> Any:
    tool = {"name": "search_docs", "description": "Search", "base_url": api_url, "path": path}
    if "{" in path:
        tool["required_params"] = [{"name": "item_id"}]
    return make_config(
        builtins=["echo"],
        models={"gpt": {"base_url": model_url, "json_retries": 0}},
        workflow={"model": "gpt", "tools": [tool]},
        **extra,
    )


ASK = {"user_instructions": "find trio", "tool_ids": ["search_docs"]}


def choose(url: str) -> Any:
    return text(json.dumps({"tool": "search_docs", "method": "GET", "url": url, "query_params": {"q": "trio"}}))


# --- 9. the same front checks on every route ----------------------------------------------------------------


async def test_a_cross_site_post_to_workflow_is_refused_before_the_workflow_runs() -> None:
    # Before: a cross-site text/plain POST (a form a page submits, no preflight) ran the workflow with the
    # server's API key, and a rebinding page could read its raw_response.
    with trio.fail_after(30):
        async with fake_api() as api, fake_openai() as fake:
            fake.says(choose(f"{api.url}/search"))
            async with http_app(workflow_config(fake.url, api.url)) as url, httpx2.AsyncClient(timeout=20) as http:
                base = base_of(url)
                body = json.dumps(ASK)
                plain = await http.post(
                    base + "/workflow",
                    content=body,
                    headers={"content-type": "text/plain", "origin": f"http://{base.split('//')[1]}"},
                )
                cross = await http.post(
                    base + "/workflow",
                    content=body,
                    headers={"content-type": "application/json", "origin": "https://evil.example"},
                )
                rebound = await http.post(
                    base + "/workflow",
                    content=body,
                    headers={"content-type": "application/json", "host": "evil.example"},
                )
                metrics = await http.get(base + "/metrics", headers={"host": "evil.example"})
                health = await http.get(base + "/healthz", headers={"host": "evil.example"})
                own_health = await http.get(base + "/healthz")
                asked = len(fake.requests)
                ok = await http.post(base + "/workflow", json=ASK)  # the same request from the server's own origin
    assert plain.status_code == 400 and plain.text == "Invalid Content-Type header"
    assert cross.status_code == 403 and cross.text == "Invalid Origin header"
    assert rebound.status_code == 421 and rebound.text == "Invalid Host header"
    assert metrics.status_code == 421
    assert health.status_code == 200 and health.json() == {"ok": True}  # a foreign Host learns nothing
    assert own_health.json() == {"ok": True, "servers": {}}
    assert asked == 0 and len(api.requests) == 1  # only the last request reached the model and the API
    assert ok.status_code == 200 and ok.json()["status"] == "success"


async def test_half_sent_workflow_bodies_are_answered_408_at_the_body_deadline() -> None:
    # Before: 800 half-sent /workflow bodies were held 100 s and more (/mcp answered 408 at 30 s).
    config = workflow_config("http://127.0.0.1:9/v1", "http://127.0.0.1:9", http={"body_timeout_s": 1.0})
    replies: list[bytes] = []
    with trio.fail_after(30):
        async with http_app(config) as url, probing(url):
            port = int(url.split(":")[2].split("/")[0])

            async def half_sent() -> None:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                async with stream:
                    head = (
                        f"POST /workflow HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
                        "content-length: 1000\r\n\r\n"
                    )
                    await stream.send_all(head.encode() + b'{"user_instructions": ')
                    reply = b""
                    with trio.move_on_after(10):
                        while not reply.endswith(b"}"):
                            chunk = await stream.receive_some()
                            if not chunk:
                                break
                            reply += chunk
                    replies.append(reply)

            async with trio.open_nursery() as nursery:
                for _ in range(40):
                    nursery.start_soon(half_sent)
    assert len(replies) == 40
    assert all(r.startswith(b"HTTP/1.1 408") and b"request_timeout" in r for r in replies), replies[:1]


FLOOD = """
[audit]
enabled = false
"""


async def test_a_connection_flood_past_the_descriptor_limit_leaves_healthz_and_mcp_answering(tmp_path: Path) -> None:
    # Before: with 1024 descriptors, 800 held connections left /healthz and /mcp dead and the log full of
    # EMFILE tracebacks (ten a second). Here the server has 128 descriptors and 160 connections hold bodies.
    held: list[trio.SocketStream] = []
    turned: list[bytes] = []
    with trio.fail_after(60):
        async with serve_process(FLOOD, tmp_path, nofile=128) as served:
            port = int(served.url.split(":")[2].split("/")[0])
            head = (
                f"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
                "accept: application/json, text/event-stream\r\ncontent-length: 1000\r\n\r\n{"
            ).encode()
            async with probing(served.url, every_s=0.2):
                for _ in range(160):
                    with trio.move_on_after(2) as waited:
                        stream = await trio.open_tcp_stream("127.0.0.1", port)
                        await stream.send_all(head)
                        held.append(stream)
                    if waited.cancelled_caught:
                        break
                await trio.sleep(1.0)  # the probe goes on while they are held
                for stream in held:  # those turned away were told so
                    with trio.move_on_after(0.01):
                        got = await stream.receive_some()
                        if got:
                            turned.append(got)
                async with httpx2.AsyncClient(timeout=10) as http:
                    # Every connection the server may serve is held: /mcp is told so at once, not left hanging.
                    status, answer = await rpc(http, served.url, call("echo", {"during": True}), "echo")
            for stream in held:
                await stream.aclose()
            async with httpx2.AsyncClient(timeout=10) as http:
                # The slots come back as the server reads each closed connection's end: soon, not at once.
                with trio.move_on_after(10):
                    for _ in range(100):
                        after, answer_after = await rpc(http, served.url, call("echo", {"after": True}), "echo")
                        if after != 503:
                            break
                        await trio.sleep(0.1)
            log = served.text()
            alive = served.proc.poll() is None
    assert alive
    assert turned and all(t.startswith(b"HTTP/1.1 503") and b"max_connections" in t for t in turned)
    assert status == 503 and "([http] max_connections)" in answer["error_description"]
    assert after == 200 and answer_after["result"]["structuredContent"] == {"after": True}
    assert "Traceback" not in log
    assert log.count("turning connections away") == 1


# --- 7. sessions per principal ---------------------------------------------------------------------------------

INIT = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}


async def open_session(http: httpx2.AsyncClient, url: str, token: str) -> httpx2.Response:
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "authorization": f"Bearer {token}",
    }
    message = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}
    return await http.post(url, content=orjson.dumps(message), headers=headers)


async def test_one_principal_cannot_take_every_session_and_others_still_get_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before: a principal allowed only `echo` opened all 10 000 sessions in 35 s; everyone else got 503 for
    # the 30-minute idle timeout. Here the server keeps 8 sessions and mallory tries 12.
    env = {"MALLORY_TOKEN": "m-secret", "ALICE_TOKEN": "a-secret"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    tokens = [
        {"env": "MALLORY_TOKEN", "principal": "mallory", "tools": ["echo"]},
        {"env": "ALICE_TOKEN", "principal": "alice"},
    ]
    config = make_config_in(env, auth={"tokens": tokens}, http={"max_sessions": 8, "max_sessions_per_principal": 3})
    with trio.fail_after(30):
        async with http_app(config) as url, httpx2.AsyncClient(timeout=20) as http, probing(url):
            mallory = [await open_session(http, url, "m-secret") for _ in range(12)]
            alice = await open_session(http, url, "a-secret")
            # A session that ends gives its room back.
            sid = mallory[0].headers["mcp-session-id"]
            await http.delete(url, headers={"mcp-session-id": sid, "authorization": "Bearer m-secret"})
            again = await open_session(http, url, "m-secret")
    assert [r.status_code for r in mallory] == [200] * 3 + [429] * 9
    error = mallory[-1].json()["error"]
    assert error["message"] == (
        "too many open sessions for principal 'mallory': 3, the most one principal may have "
        "([http] max_sessions_per_principal); end one (DELETE) or let one idle out, then try again"
    )
    assert mallory[-1].headers["retry-after"] == "60"
    assert alice.status_code == 200 and "mcp-session-id" in alice.headers
    assert again.status_code == 200


# --- 13. workflow path parameters ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["%2E%2E", "%2e", "%252E%252E", "a%5Cb"])
async def test_a_workflow_path_parameter_cannot_be_a_dot_segment(value: str) -> None:
    # Before: `%2E%2E` in a path parameter reached the API as /items/%2E%2E (which servers read as /items/..).
    with trio.fail_after(30):
        async with fake_api() as api, fake_openai() as fake:
            fake.says(choose(f"{api.url}/items/{value}"))
            config = workflow_config(fake.url, api.url, path="/items/{item_id}")
            async with http_app(config) as url, httpx2.AsyncClient(timeout=20) as http, probing(url):
                r = await http.post(base_of(url) + "/workflow", json=ASK)
    out = r.json()
    assert r.status_code == 200 and out["status"] == "error" and out["error_stage"] == "llm_selection", out
    assert "path parameter `item_id` of tool 'search_docs' must be one segment" in out["error"]
    assert api.requests == []


# --- issue 27, item 9: request heads dripping a byte at a time ------------------------------------------------

HEADS = """
[audit]
enabled = false

[http]
max_connections = 20
head_timeout_s = 2.0
"""


async def test_heads_dripping_a_byte_at_a_time_are_cut_at_their_deadline_and_an_innocent_caller_gets_in(
    tmp_path: Path,
) -> None:
    # Before: heads had no deadline of their own, only hypercorn's keep-alive: 60 heads dripping a byte per 2 s
    # (max_connections 20) held every slot, and an innocent caller's call was turned away (503) for 75 s.
    head = b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
    replies: list[bytes] = []
    with trio.fail_after(60):
        async with serve_process(HEADS, tmp_path) as served:
            port = int(served.url.split(":")[2].split("/")[0])
            connected = trio.Semaphore(0)

            async def drip() -> None:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                connected.release()
                async with stream:
                    reply = b""
                    with trio.move_on_after(30):
                        for byte in head:
                            try:
                                await stream.send_all(bytes([byte]))
                            except trio.BrokenResourceError:
                                break  # answered and closed: the answer was read below
                            with trio.move_on_after(2):
                                chunk = await stream.receive_some()
                                reply += chunk
                                if not chunk or reply.endswith(b"}"):
                                    break
                    replies.append(reply)

            async with probing(served.url, every_s=0.2), trio.open_nursery() as nursery:
                for _ in range(60):
                    nursery.start_soon(drip)
                for _ in range(60):
                    await connected.acquire()
                t0 = trio.current_time()
                async with httpx2.AsyncClient(timeout=10) as http:
                    while True:
                        status, answer = await rpc(http, served.url, call("echo", {"innocent": True}), "echo")
                        if status == 200:
                            break
                        assert status == 503, (status, answer)
                        await trio.sleep(0.2)
                waited = trio.current_time() - t0
    assert answer["result"]["structuredContent"] == {"innocent": True}
    assert waited < 30, waited  # the head deadline (2 s) and a retry, not hypercorn's 75 s keep-alive
    assert len(replies) == 60
    timed_out = [r for r in replies if r.startswith(b"HTTP/1.1 408")]
    assert timed_out and all(r.startswith((b"HTTP/1.1 408", b"HTTP/1.1 503")) for r in replies), replies[:3]
    assert all(b"head_timeout_s" in r for r in timed_out), timed_out[:1]


RESTING = """
[audit]
enabled = false

[http]
max_connections = 20
"""


async def test_connections_resting_between_requests_yield_their_slots_to_a_new_caller(tmp_path: Path) -> None:
    # Before: 20 connections that made one request each and kept the connection open held every slot until
    # hypercorn's keep-alive (75 s) closed them: a new caller was turned away (503) all that time.
    with trio.fail_after(60):
        async with serve_process(RESTING, tmp_path) as served:
            port = int(served.url.split(":")[2].split("/")[0])
            resting: list[trio.SocketStream] = []
            for _ in range(20):
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.send_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
                reply = b""
                while not reply.endswith(b"}"):
                    reply += await stream.receive_some()
                assert reply.startswith(b"HTTP/1.1 200"), reply
                resting.append(stream)
            async with probing(served.url, every_s=0.2), httpx2.AsyncClient(timeout=10) as http:
                t0 = trio.current_time()
                status, answer = await rpc(http, served.url, call("echo", {"new": True}), "echo")
                waited = trio.current_time() - t0
            for stream in resting:
                await stream.aclose()
    assert status == 200 and answer["result"]["structuredContent"] == {"new": True}, (status, answer)
    assert waited < 30, waited  # a resting connection closed for it, not hypercorn's 75 s keep-alive
