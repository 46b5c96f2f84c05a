"""Two ``mcpipe serve`` processes sharing one real Redis: a 2026-07-28 pipeline suspended by one resumes on
the other, a replayed state runs once even when both get it at once, and Redis going away mid-traffic costs
only clear, retryable errors: nothing crashes and nothing Redis acknowledged is lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2 as httpx
import mcp_types as t
import pytest
import trio
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS

from kit.redis import RedisServer, redis_server

WAIT_S = 60
KEY = "k" * 32
SPEC = {
    "steps": [
        {"id": "hold", "tool": "charge", "args": {"amount": 1}},
        {"id": "ok", "tool": "ask_user", "args": {"message": "Go on?"}},
        {"id": "pay", "tool": "charge", "args": {"amount": 2}},
    ]
}
HERE = Path(__file__).parent


class Instance:
    """One ``mcpipe serve`` process; its stderr is kept for the failure message."""

    def __init__(self, proc: trio.Process, url: str, log: bytearray) -> None:
        self.proc, self.url, self.log = proc, url, log

    async def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        with trio.fail_after(WAIT_S):
            return await self.proc.wait()


async def start_instance(nursery: trio.Nursery, config: Path, env: dict[str, str]) -> Instance:
    args = [sys.executable, "-m", "mcpipe", "serve", "--config", str(config), "--http", "127.0.0.1:0"]
    proc = await trio.lowlevel.open_process(args, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    log = bytearray()
    found: list[str] = []
    listening = trio.Event()

    async def drain(out: trio.abc.ReceiveStream) -> None:
        async for chunk in out:
            log.extend(chunk)
            if not listening.is_set() and b"serving MCP at " in log:
                line = bytes(log).split(b"serving MCP at ", 1)[1]
                if b"\n" in line:
                    found.append(line.split(b"\n", 1)[0].decode().strip())
                    listening.set()
        listening.set()

    nursery.start_soon(drain, proc.stderr)
    with trio.fail_after(WAIT_S):
        await listening.wait()
    assert found, f"the server exited before listening:\n{log.decode(errors='replace')}"
    return Instance(proc, found[0], log)


@asynccontextmanager
async def two_instances(tmp_path: Path) -> AsyncIterator[tuple[RedisServer, list[Instance], Path]]:
    """Redis and two servers pointed at it, with the same state key; yields them and the charges file."""
    charges = tmp_path / "charges"
    charges.touch()
    config = tmp_path / "mcpipe.json"
    (tmp_path / "redis").mkdir()
    async with redis_server(tmp_path / "redis") as redis, trio.open_nursery() as nursery:
        doc: dict[str, Any] = {
            "audit": {"enabled": False},
            "python_tools": ["side_tools:tools"],
            # A stopped Redis refuses at once; the timeout is for a slow answer, which a loaded host gives now
            # and then: 5 s, so an answer merely late is not a store_unavailable.
            "store": {"url": redis.url, "timeout_ms": 5000},
            "interaction": {"inline_max_bytes": 0},  # every state lives in Redis, not in the token
        }
        config.write_text(json.dumps(doc))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
            "MCPIPE_STATE_KEY": KEY,
            "MCPIPE_TEST_CHARGES": str(charges),
        }
        instances = [await start_instance(nursery, config, env) for _ in range(2)]
        try:
            yield redis, instances, charges
        finally:
            codes = [await i.stop() for i in instances]
            assert codes == [0, 0], "\n".join(i.log.decode(errors="replace") for i in instances)


async def elicit(context: Any, params: Any) -> t.ElicitResult:
    raise AssertionError("2026-07-28 questions travel in the result, not as requests")


def modern(url: str) -> Client:
    return Client(url, mode="2026-07-28", elicitation_callback=elicit)


async def suspend(url: str) -> str:
    """The first round; an MCPError (a JSON-RPC error) is raised as is."""
    async with modern(url) as c:
        try:
            r = await c.session.call_tool("mcp_pipe", SPEC, allow_input_required=True)
        except MCPError as exc:
            error = exc
        else:
            error = None
    if error is not None:
        raise error
    assert isinstance(r, t.InputRequiredResult) and set(r.input_requests or {}) == {"ok"}, r
    assert r.request_state is not None and len(r.request_state) < 400  # a handle: the state is in Redis
    return r.request_state


async def resume(url: str, state: str) -> t.CallToolResult:
    """The retry with the answer; an MCPError is raised as is."""
    async with modern(url) as c:
        answer = {"ok": t.ElicitResult(action="accept", content={})}
        try:
            r = await c.session.call_tool("mcp_pipe", SPEC, input_responses=answer, request_state=state)
        except MCPError as exc:
            error = exc
        else:
            error = None
    if error is not None:
        raise error
    assert isinstance(r, t.CallToolResult)
    return r


def charged(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()]


async def test_a_pipeline_suspended_by_one_instance_resumes_on_the_other(tmp_path: Path) -> None:
    with trio.fail_after(WAIT_S):
        async with two_instances(tmp_path) as (_, (a, b), charges):
            state = await suspend(a.url)
            assert charged(charges) == [1]
            done = await resume(b.url, state)
            assert not done.is_error, done.content
            assert done.structured_content is not None and done.structured_content["ok"] is True
            assert charged(charges) == [1, 2]  # the first step answered from the state, not run again


async def test_one_state_replayed_on_both_instances_at_once_runs_once(tmp_path: Path) -> None:
    outcomes: list[Any] = []

    async def attempt(url: str, state: str) -> None:
        try:
            outcomes.append(await resume(url, state))
        except MCPError as exc:
            outcomes.append(exc)

    with trio.fail_after(WAIT_S):
        async with two_instances(tmp_path) as (_, (a, b), charges):
            for _ in range(3):
                state = await suspend(a.url)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(attempt, a.url, state)
                    nursery.start_soon(attempt, b.url, state)
    wins = [o for o in outcomes if isinstance(o, t.CallToolResult)]
    refusals = [o for o in outcomes if isinstance(o, MCPError)]
    assert len(wins) == 3 and all(not w.is_error for w in wins)
    assert [(e.code, e.data) for e in refusals] == [(INVALID_PARAMS, {"reason": "replayed"})] * 3
    assert charged(charges).count(2) == 3  # each state paid once, though sent twice


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_redis_restarting_mid_traffic_loses_no_acknowledged_state_and_crashes_nothing(tmp_path: Path) -> None:
    committed: list[tuple[str, str]] = []  # (state, the instance that suspended it)
    unavailable: list[MCPError] = []
    warmed_up, refused, after_restart = trio.Event(), trio.Event(), trio.Event()
    restarted = False

    async def traffic(instances: list[Any], stop: trio.Event) -> None:
        i = 0
        while not stop.is_set():
            url = instances[i % 2].url
            i += 1
            try:
                committed.append((await suspend(url), url))
            except MCPError as exc:
                unavailable.append(exc)
                refused.set()
                await trio.sleep(0.05)  # pacing while Redis is down, not a wait for a condition
                continue
            if len(committed) >= 3:
                warmed_up.set()
            if restarted and len(committed) >= 6:
                after_restart.set()

    with trio.fail_after(WAIT_S):
        async with two_instances(tmp_path) as (redis, instances, charges), trio.open_nursery() as nursery:
            stop = trio.Event()
            nursery.start_soon(traffic, instances, stop)
            await warmed_up.wait()
            await redis.stop()
            await refused.wait()  # the servers notice, and answer the clear error
            async with httpx.AsyncClient() as http:
                for inst in instances:  # alive and serving what needs no store
                    health = await http.get(inst.url.rsplit("/", 1)[0] + "/healthz")
                    assert health.status_code == 200
            await redis.start()
            restarted = True
            await after_restart.wait()
            stop.set()
            # Every state whose suspension was answered resumes, on the other instance, exactly once.
            for state, url in committed:
                other = next(i.url for i in instances if i.url != url)
                done = await resume(other, state)
                assert not done.is_error, done.content
            assert all(inst.proc.returncode is None for inst in instances)
    assert unavailable and all(e.code == INTERNAL_ERROR for e in unavailable)
    assert all(e.data == {"reason": "store_unavailable"} for e in unavailable)
    assert "pipeline store at redis://127.0.0.1" in unavailable[0].message
    assert charged(charges).count(2) == len(committed)
