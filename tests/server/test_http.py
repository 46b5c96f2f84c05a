"""A real hypercorn (trio worker) on 127.0.0.1: both protocol eras, auth, DNS rebinding, health, shutdown."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from functools import partial
from pathlib import Path

import httpx2
import orjson
import pytest
import trio
from mcp import Client

from kit.clients import bearer_client
from kit.servers import http_server, make_config, running, start_process
from mcpipe.gateway import PIPE_TOOL

# The SDK's HTTP client leaves httpx2's SSE async generators to the garbage collector under trio.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

TESTS = Path(__file__).parents[1]  # on PYTHONPATH for a server process that loads `kit.tools`
PIPE = {"steps": [{"id": "a", "tool": "echo", "args": {"n": 1}}, {"id": "b", "tool": "echo", "args": {"m": "{{a.n}}"}}]}
AUTH = {
    "auth": {
        "tokens": [
            {"env": "T_ALICE", "principal": "alice"},
            {"env": "T_BOB", "principal": "bob", "tools": ["echo"]},
        ]
    }
}
TOKENS = {"T_ALICE": "alice-secret", "T_BOB": "bob-secret"}


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy", "auto"])
async def test_both_protocol_eras_list_tools_run_pipelines_and_stream_progress(mode):
    seen = []

    async def on_progress(progress, total, message):
        seen.append(progress)

    async with running() as app, http_server(app) as url, Client(url, mode=mode) as client:
        assert client.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
        names = {t.name for t in (await client.list_tools()).tools}
        r = await client.call_tool(PIPE_TOOL, PIPE, progress_callback=on_progress)
    assert {PIPE_TOOL, "echo", "hang"} <= names
    assert r.structured_content["result"] == {"m": 1} and not r.is_error
    assert seen == [1.0, 2.0]


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
async def test_closing_the_call_cancels_the_pipeline_steps_in_flight(mode, audit):
    started = trio.Event()

    async def on_progress(progress, total, message):
        started.set()

    async with running(audit=audit) as app, http_server(app) as url, Client(url, mode=mode) as client:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:

                async def call():
                    await client.call_tool(PIPE_TOOL, {"steps": [{"tool": "hang"}]}, progress_callback=on_progress)

                nursery.start_soon(call)
                await started.wait()
                nursery.cancel_scope.cancel()
            await audit.until(lambda records: any(r["tool"] == PIPE_TOOL for r in records))
    assert [(r["tool"], r["error_code"]) for r in audit.records] == [("hang", "CANCELLED"), (PIPE_TOOL, "CANCELLED")]


async def test_healthz_answers_ok_with_the_state_of_each_downstream_server():
    async with running() as app, http_server(app) as url, httpx2.AsyncClient() as http:
        r = await http.get(url.replace("/mcp", "/healthz"))
        missing = await http.get(url.replace("/mcp", "/nope"))
    assert r.status_code == 200 and r.json() == {"ok": True, "servers": {}}
    assert missing.status_code == 404


async def test_requests_without_a_valid_bearer_token_are_refused_with_401():
    config = make_config(TOKENS, **AUTH)
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in TOKENS.items():
            mp.setenv(k, v)
        async with running(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
            answers = [
                await http.post(url, json=body, headers=h)
                for h in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic alice-secret"})
            ]
            healthz = await http.get(url.replace("/mcp", "/healthz"))
    assert [a.status_code for a in answers] == [401, 401, 401]
    assert answers[0].headers["www-authenticate"].startswith("Bearer")
    assert "alice-secret" not in answers[1].text and healthz.status_code == 200


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
async def test_a_token_maps_to_a_principal_whose_tool_list_and_calls_are_restricted(mode, tmp_path, monkeypatch):
    for k, v in TOKENS.items():
        monkeypatch.setenv(k, v)
    config = make_config(TOKENS, **AUTH, audit={"path": str(tmp_path / "audit.jsonl")})
    spec = {"steps": [{"tool": "echo", "args": {}}, {"tool": "now"}]}
    async with running(config) as app, http_server(app) as url:
        async with bearer_client(url, "bob-secret", mode) as bob:
            bob_names = {t.name for t in (await bob.list_tools()).tools}
            forbidden = await bob.call_tool(PIPE_TOOL, spec)
            direct = await bob.call_tool("now", {})
            fine = await bob.call_tool("echo", {"x": 1})
        async with bearer_client(url, "alice-secret", mode) as alice:
            allowed = await alice.call_tool(PIPE_TOOL, spec)
    assert bob_names == {PIPE_TOOL, "echo"}
    assert forbidden.structured_content["error_code"] == "FORBIDDEN" and forbidden.structured_content["steps"] == {}
    assert direct.is_error and "FORBIDDEN" in direct.content[0].text and fine.structured_content == {"x": 1}
    assert allowed.structured_content["ok"]
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(r["principal"], r["tool"], r["error_code"]) for r in records] == [
        ("bob", PIPE_TOOL, "FORBIDDEN"),
        ("bob", "now", "FORBIDDEN"),
        ("bob", "echo", None),
        ("alice", "echo", None),
        ("alice", "now", None),
        ("alice", PIPE_TOOL, None),
    ]
    assert "secret" not in (tmp_path / "audit.jsonl").read_text()


async def test_dns_rebinding_protection_refuses_foreign_hosts_and_origins():
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    async with running() as app, http_server(app) as url, httpx2.AsyncClient() as http:
        bad_host = await http.post(url, content=body, headers={**headers, "host": "evil.example"})
        bad_origin = await http.post(url, content=body, headers={**headers, "origin": "http://evil.example"})
    assert bad_host.status_code == 421 and bad_origin.status_code == 403


async def test_sigterm_shuts_down_within_seconds_with_a_call_in_flight_and_a_stream_open(tmp_path):
    config = tmp_path / "mcpipe.toml"
    config.write_text(f'python_tools = ["kit.tools:test_tools"]\n[audit]\npath = "{tmp_path / "a.jsonl"}"\n')
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    args = [sys.executable, "-m", "mcpipe.server", "--config", str(config), "--http", "127.0.0.1:0"]
    proc, url = await start_process(args, env)
    started = trio.Event()

    async def on_progress(progress, total, message):
        started.set()

    try:
        with trio.fail_after(20):
            async with Client(url, mode="legacy") as client, trio.open_nursery() as nursery:

                async def call():
                    try:
                        await client.call_tool("hang", {}, progress_callback=on_progress)
                    except Exception:  # the server went away under the call: what this test wants
                        pass

                nursery.start_soon(call)
                await started.wait()
                t0 = trio.current_time()
                proc.send_signal(signal.SIGTERM)
                await proc.wait()
                elapsed = trio.current_time() - t0
                nursery.cancel_scope.cancel()
    finally:
        if proc.returncode is None:
            proc.kill()
    # Not within seconds is for ever (a call or a stream holding the server open); within is the graceful period
    # (2 s) and the process's teardown, more on a loaded host: 15 s tells them apart.
    assert proc.returncode == 0 and elapsed < 15, elapsed


async def test_configured_tokens_whose_variables_are_unset_let_nobody_in(monkeypatch):
    monkeypatch.delenv("T_ALICE", raising=False)
    monkeypatch.delenv("T_BOB", raising=False)
    config = make_config(TOKENS, **AUTH)  # the variables were set when the config was checked, not now
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with running(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
        r = await http.post(url, json=body, headers={"Authorization": "Bearer alice-secret"})
    assert r.status_code == 401


async def test_a_2025_session_is_bound_to_the_token_that_opened_it(monkeypatch):
    for k, v in TOKENS.items():
        monkeypatch.setenv(k, v)
    config = make_config(TOKENS, **AUTH)
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    base = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    async with running(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
        opened = await http.post(url, json=init, headers={**base, "authorization": "Bearer alice-secret"})
        session = opened.headers["mcp-session-id"]
        with_session = {**base, "mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await http.post(url, json=initialized, headers={**with_session, "authorization": "Bearer alice-secret"})
        as_bob = await http.post(url, json=listing, headers={**with_session, "authorization": "Bearer bob-secret"})
        as_alice = await http.post(url, json=listing, headers={**with_session, "authorization": "Bearer alice-secret"})
    assert opened.status_code == 200
    assert as_bob.status_code == 404 and as_alice.status_code == 200 and "mcp_pipe" in as_alice.text


async def test_notifications_posted_while_a_session_is_deleted_are_dropped_without_an_error(caplog):
    # The SDK answered 202, found the session's stream closed, logged a traceback and tried to answer twice
    # (hypercorn: "Error in ASGI Framework"); seen in the conformance suite's disconnect scenarios.
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    accept = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    cancelled = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 9}}
    statuses: list[int] = []
    async with running() as app, http_server(app) as url, httpx2.AsyncClient(timeout=10) as http:
        for _ in range(20):
            opened = await http.post(url, json=initialize, headers=accept)
            sid = opened.headers["mcp-session-id"]
            session = {**accept, "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"}
            await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)

            async def notify(session: dict[str, str] = session) -> None:
                statuses.append((await http.post(url, json=cancelled, headers=session)).status_code)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(http.delete, url, headers=session))
                for _ in range(5):
                    nursery.start_soon(notify)
    assert set(statuses) <= {202, 404}
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
