"""The gateway in front of real MCP servers (``downstream_server.py``), over stdio and over HTTP."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
from mcp import Client

from kit.servers import DOWNSTREAM, http_server, make_config, running, start_process, stdio_downstream
from mcpipe.gateway import PIPE_TOOL

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@asynccontextmanager
async def http_downstream() -> AsyncIterator[str]:
    """``downstream_server.py`` on its own hypercorn, on a free port; yields its MCP URL."""
    proc, url = await start_process([sys.executable, DOWNSTREAM, "--http", "0"], marker="", stream="stdout")
    try:
        yield url
    finally:
        proc.kill()
        with trio.move_on_after(5):
            await proc.wait()


@asynccontextmanager
async def gateway_to(transport: str, audit=None, **server: object) -> AsyncIterator[tuple[object, Client]]:
    """A gateway whose ``ds`` server is the test downstream over ``transport``, and a client of it."""
    if transport == "stdio":
        cfg = make_config(mcpServers={"ds": stdio_downstream(**server)})
        async with running(cfg, audit) as app, Client(app.server) as client:
            yield app, client
    else:
        async with http_downstream() as url:
            cfg = make_config(mcpServers={"ds": {"url": url, **server}})
            async with running(cfg, audit) as app, Client(app.server) as client:
                yield app, client


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_downstream_tools_are_served_under_the_server_prefix_and_calls_are_forwarded(transport):
    with trio.fail_after(30):
        async with gateway_to(transport, exclude=["secret", "crash"]) as (app, client):
            names = {t.name for t in (await client.list_tools()).tools}
            direct = await client.call_tool("ds.add", {"a": 2, "b": 3})
            first = {"tool": "ds.add", "args": {"a": 1, "b": 1}}
            second = {"tool": "ds.add", "args": {"a": "{{step1.result}}", "b": 10}}
            piped = await client.call_tool(PIPE_TOOL, {"steps": [first, second]})
    assert {"ds.add", "ds.greet", "ds.wait", "ds.events", "ds.progress"} <= names
    assert "ds.secret" not in names and "ds.crash" not in names and "echo" in names
    assert direct.structured_content == {"result": 5}
    assert piped.structured_content["result"] == {"result": 12}
    assert app.downstreams.status() == {"ds": "up"}


async def test_a_stdio_server_gets_its_env_and_an_empty_prefix_serves_bare_names():
    cfg = make_config(
        mcpServers={"ds": stdio_downstream(env={"GREETING": "ahoy"}, prefix="", include=["greet", "add"])}
    )
    with trio.fail_after(30):
        async with running(cfg) as app, Client(app.server) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            r = await client.call_tool("greet", {"name": "crew"})
    assert {"greet", "add"} <= names and not any(n.startswith("ds.") for n in names) and "wait" not in names
    assert r.content[0].text == "ahoy, crew"


async def test_headers_reach_an_http_server_behind_bearer_auth(monkeypatch):
    monkeypatch.setenv("INNER_TOKEN", "inner-secret")
    inner_cfg = make_config({"INNER_TOKEN": "x"}, auth={"tokens": [{"env": "INNER_TOKEN", "principal": "gw"}]})
    with trio.fail_after(30):
        async with running(inner_cfg) as inner, http_server(inner) as url:
            outer_cfg = make_config(
                {"TOKEN": "inner-secret"},
                mcpServers={
                    "inner": {"url": url, "headers": {"Authorization": "Bearer ${TOKEN}"}},
                    "noauth": {"url": url, "connect_timeout_ms": 3000},
                },
            )
            async with running(outer_cfg) as app, Client(app.server) as client:
                r = await client.call_tool("inner.echo", {"via": "gateway"})
                refused = await client.call_tool("noauth.echo", {})
                status = app.downstreams.status()
    assert r.structured_content == {"via": "gateway"}
    assert status == {"inner": "up", "noauth": "down"}
    assert refused.is_error and "MCP server 'noauth' is unavailable" in refused.content[0].text


async def test_downstream_progress_is_forwarded_to_the_caller_inside_a_pipeline():
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, message))

    with trio.fail_after(30):
        async with gateway_to("stdio") as (_, client):
            spec = {"steps": [{"id": "p", "tool": "ds.progress", "args": {"steps": 3}}]}
            r = await client.call_tool(PIPE_TOOL, spec, progress_callback=on_progress)
            direct_seen: list[str | None] = []

            async def on_direct(progress, total, message):
                direct_seen.append(message)

            await client.call_tool("ds.progress", {"steps": 2}, progress_callback=on_direct)
    assert r.structured_content["ok"]
    assert [m for _, m in seen] == ["p: tick 1", "p: tick 2", "p: tick 3", "step p finished (ok)"]
    values = [v for v, _ in seen]
    assert values == sorted(values) and values[-1] == 1
    assert direct_seen == ["tick 1", "tick 2"]


async def test_a_server_crash_mid_pipeline_fails_that_step_cleanly_and_the_server_comes_back(audit):
    add = {"tool": "ds.add", "args": {"a": 1, "b": 1}}
    spec = {"steps": [add, {"id": "c", "tool": "ds.crash"}, add]}
    with trio.fail_after(30):
        async with gateway_to("stdio", audit) as (app, client):
            ds = app.downstreams.servers[0]
            r = await client.call_tool(PIPE_TOOL, spec)
            while_down = await client.call_tool("ds.add", {"a": 1, "b": 1})
            await ds.wait_connected()  # the actor restarts the process by itself
            after = await client.call_tool("ds.add", {"a": 20, "b": 22})
    answer = r.structured_content
    assert answer["error_code"] == "TOOL_FAILED" and answer["steps"]["c"]["error_code"] == "TOOL_FAILED"
    assert "MCP server 'ds' closed the connection during the call" in answer["steps"]["c"]["error"]
    assert answer["summary"] == {"total": 3, "succeeded": 1, "failed": 1, "skipped": 1, "cancelled": 0}
    assert while_down.is_error and "MCP server 'ds' is unavailable" in while_down.content[0].text
    assert after.structured_content == {"result": 42} and ds.connections == 2


async def test_an_http_server_that_dies_mid_call_is_reported_down_and_reconnected_when_it_is_back():
    proc, url = await start_process([sys.executable, DOWNSTREAM, "--http", "0"], marker="", stream="stdout")
    port = url.rsplit(":", 1)[1].split("/")[0]
    try:
        with trio.fail_after(30):
            async with running(make_config(mcpServers={"ds": {"url": url}})) as app, Client(app.server) as client:
                ds = app.downstreams.servers[0]
                r = await client.call_tool(PIPE_TOOL, {"steps": [{"id": "c", "tool": "ds.crash"}]})
                while_down = await client.call_tool("ds.add", {"a": 1, "b": 1})
                await proc.wait()
                proc, _ = await start_process([sys.executable, DOWNSTREAM, "--http", port], marker="", stream="stdout")
                await ds.wait_connected()
                after = await client.call_tool("ds.add", {"a": 1, "b": 2})
    finally:
        proc.kill()
    assert r.structured_content["steps"]["c"]["error_code"] == "TOOL_FAILED"
    assert "MCP server 'ds' closed the connection during the call" in r.structured_content["steps"]["c"]["error"]
    assert while_down.is_error and "MCP server 'ds' is unavailable" in while_down.content[0].text
    assert after.structured_content == {"result": 3} and ds.connections == 2


async def test_a_2025_http_server_restarted_while_idle_gets_a_new_session_and_the_call_goes_through():
    proc, url = await start_process([sys.executable, DOWNSTREAM, "--http", "0"], marker="", stream="stdout")
    port = url.rsplit(":", 1)[1].split("/")[0]
    try:
        with trio.fail_after(30):
            cfg = make_config(mcpServers={"ds": {"url": url, "protocol": "2025-11-25"}})
            async with running(cfg) as app, Client(app.server) as client:
                ds = app.downstreams.servers[0]
                before = await client.call_tool("ds.add", {"a": 1, "b": 1})
                proc.kill()
                await proc.wait()
                proc, _ = await start_process([sys.executable, DOWNSTREAM, "--http", port], marker="", stream="stdout")
                after = await client.call_tool("ds.add", {"a": 2, "b": 2})  # the old session is unknown there
    finally:
        proc.kill()
    assert before.structured_content == {"result": 2}
    assert after.structured_content == {"result": 4} and ds.connections == 2


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_cancelling_a_pipeline_cancels_the_downstream_call_at_once(transport):
    started = trio.Event()
    cancelled_at = 0.0

    async def on_progress(progress, total, message):
        started.set()

    with trio.fail_after(30):
        async with gateway_to(transport) as (_, client):
            async with trio.open_nursery() as nursery:

                async def call():
                    spec = {"steps": [{"tool": "ds.wait", "args": {"tag": transport}}]}
                    await client.call_tool(PIPE_TOOL, spec, progress_callback=on_progress)

                nursery.start_soon(call)
                await started.wait()
                cancelled_at = time.monotonic()
                nursery.cancel_scope.cancel()
            events = None
            while not events or events[-1]["event"] != "cancelled":
                events = (await client.call_tool("ds.events", {})).structured_content["result"]
    assert [e["event"] for e in events] == ["started", "cancelled"]
    # At once is milliseconds (under 100 ms on a quiet host); the bug is never: `ds.wait` waits for ever, so the
    # loop above would run into the 30 s bound. 2 s tells the two apart on a loaded host.
    assert events[-1]["t"] - cancelled_at < 2.0


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
async def test_a_caller_leaving_mcpipe_over_http_cancels_the_downstream_call_at_once(mode):
    started = trio.Event()
    tag = f"http-{mode}"

    async def on_progress(progress, total, message):
        started.set()

    with trio.fail_after(30):
        async with gateway_to("stdio") as (app, local), http_server(app) as url:
            async with Client(url, mode=mode) as remote, trio.open_nursery() as nursery:

                async def call():
                    spec = {"steps": [{"tool": "ds.wait", "args": {"tag": tag}}]}
                    await remote.call_tool(PIPE_TOOL, spec, progress_callback=on_progress)

                nursery.start_soon(call)
                await started.wait()
                cancelled_at = time.monotonic()
                nursery.cancel_scope.cancel()  # 2026-07-28: the stream closes; 2025-11-25: notifications/cancelled
            events = None
            while not events or events[-1]["event"] != "cancelled":
                events = (await local.call_tool("ds.events", {})).structured_content["result"]
    assert [e["event"] for e in events] == ["started", "cancelled"]
    # At once is milliseconds (under 100 ms on a quiet host); the bug is never: `ds.wait` waits for ever, so the
    # loop above would run into the 30 s bound. 2 s tells the two apart on a loaded host.
    assert events[-1]["t"] - cancelled_at < 2.0


async def test_a_lazy_server_connects_on_first_use():
    cfg = make_config(mcpServers={"ds": stdio_downstream(connect="lazy")})
    with trio.fail_after(30):
        async with running(cfg) as app:
            assert app.downstreams.status() == {"ds": "idle"}
            async with Client(app.server) as client:
                r = await client.call_tool(PIPE_TOOL, {"steps": [{"tool": "ds.add", "args": {"a": 1, "b": 2}}]})
            assert app.downstreams.status() == {"ds": "up"}
    assert r.structured_content["result"] == {"result": 3}


async def test_a_server_that_cannot_start_is_reported_unavailable_at_once():
    cfg = make_config(mcpServers={"broken": {"command": sys.executable, "args": ["-c", "import sys; sys.exit(1)"]}})
    with trio.fail_after(30):
        async with running(cfg) as app, Client(app.server) as client:
            t0 = trio.current_time()
            r = await client.call_tool("broken.anything", {})
            elapsed = trio.current_time() - t0
            health = app.downstreams.status()
    assert r.is_error and "MCP server 'broken' is unavailable" in r.content[0].text
    # Not at once is the connect timeout (10 s); at once is milliseconds (seconds on a loaded host).
    assert elapsed < 5, elapsed  # half the connect timeout
    assert health == {"broken": "down"}


async def test_downstream_progress_inside_a_pipeline_moves_within_its_step_by_its_share_of_the_total():
    seen = []

    async def on_progress(progress, total, message):
        seen.append((round(progress, 3), total))

    with trio.fail_after(30):
        async with gateway_to("stdio") as (_, client):
            spec = {
                "steps": [
                    {"id": "p", "tool": "ds.progress", "args": {"steps": 3}},
                    {"id": "q", "tool": "ds.add", "args": {"a": 1, "b": 2}},
                ]
            }
            r = await client.call_tool(PIPE_TOOL, spec, progress_callback=on_progress)
    assert r.structured_content["ok"]
    assert seen == [(0.333, 2), (0.667, 2), (0.999, 2), (1, 2), (2, 2)]


async def test_at_the_default_log_level_a_gateway_writes_no_line_per_downstream_request(tmp_path):
    async with http_downstream() as url:
        config = tmp_path / "gw.json"
        config.write_text(json.dumps({"audit": {"enabled": False}, "mcpServers": {"ds": {"url": url}}}))
        args = [sys.executable, "-m", "mcpipe", "serve", "--config", str(config), "--http", "127.0.0.1:0"]
        proc, gw = await start_process(args)
        try:
            with trio.fail_after(30):
                async with Client(gw) as client:
                    for i in range(5):
                        await client.call_tool("ds.add", {"a": i, "b": 1})
        finally:
            proc.terminate()
            with trio.fail_after(10):
                await proc.wait()
        assert proc.stderr is not None
        rest = b""
        while chunk := await proc.stderr.receive_some():
            rest += chunk
    assert b"HTTP Request" not in rest and b"POST" not in rest


async def test_a_retried_step_waits_out_a_downstream_restart_and_every_attempt_is_audited(audit):
    """Issue 17: `ds.add` is marked idempotent by the operator; the step right after a crash finds the
    server down (retryable), backs off, and succeeds once the actor has restarted it."""
    crash = {"id": "c", "tool": "ds.crash", "continue_on_error": True}
    add = {"id": "a", "tool": "ds.add", "args": {"a": 20, "b": 22}, "retry": {"attempts": 8, "backoff_ms": 200}}
    cfg = make_config(mcpServers={"ds": stdio_downstream()}, pipe={"idempotent_tools": ["ds.*"]})
    with trio.fail_after(60):
        async with running(cfg, audit) as app, Client(app.server) as client:
            r = await client.call_tool(PIPE_TOOL, {"steps": [crash, add], "answer": "full"})
            # `now` is not idempotent (echo is: its annotations say so), and no idempotent_tools glob names it
            refused = await client.call_tool(PIPE_TOOL, {"steps": [{"tool": "now", "retry": {"attempts": 2}}]})
    answer = r.structured_content
    assert answer["steps"]["a"]["ok"] is True and answer["steps"]["a"]["output"] == {"result": 42}
    attempts = answer["steps"]["a"]["attempts"]
    assert attempts >= 2
    adds = [(rec["ok"], rec["error_code"]) for rec in audit.records if rec["tool"] == "ds.add"]
    assert adds == [(False, "TOOL_FAILED")] * (attempts - 1) + [(True, None)]
    assert app.downstreams.servers[0].connections == 2
    assert refused.structured_content["problems"][0]["location"] == "steps[0].retry"


async def test_a_tools_annotations_are_listed_and_kept_by_the_gateway():
    """Issue 17: `idempotentHint` is how a tool says a pipeline step may retry it; tools/list shows a
    tool's annotations and the gateway keeps them for the retry check."""
    from mcpipe.server._app import open_app
    from mcpipe.tools import ToolRegistry

    reg = ToolRegistry()

    @reg.tool(annotations={"idempotentHint": True})
    def lookup(key: str) -> str:
        """Read a key."""
        return key

    @reg.tool
    def store(key: str) -> str:
        """Write a key."""
        return key

    with trio.fail_after(30):
        async with open_app(make_config(), extra_sources=[reg]) as app, Client(app.server) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
    assert listed["lookup"].annotations is not None and listed["lookup"].annotations.idempotent_hint is True
    assert listed["store"].annotations is None
    assert listed["echo"].annotations is not None and listed["echo"].annotations.idempotent_hint is True
    assert app.gateway.get("lookup").annotations == {"idempotentHint": True}
