"""The run queue under a hostile principal, over HTTP on a real server (issue 20, items 4, 5 and 12): parked
tasks cannot fill the queue for everyone (per-principal quotas, a TTL on parked runs, also across a restart,
on SQLite and on a real Redis), a run's events are charged to it and bounded (the server's memory stays
flat), and Redis stopped mid-traffic is a ``store_unavailable`` answer, not an empty 500."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from kit.hostile import http_app
from kit.redis import redis_server
from kit.siege import call, capabilities, probing, rpc, rss_mb, serve_process, task_request
from kit.tasks_fixture import CONFIG as TASKS_CONFIG
from mcpipe.config import parse_config
from mcpipe.gateway import PIPE_TOOL
from mcpipe.server import open_app
from mcpipe.store import open_queue
from mcpipe.store._redis_runs import RedisRunQueue

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

TOKENS = {"MALLORY_TOKEN": "mallory-secret", "ALICE_TOKEN": "alice-secret"}
ASKING = capabilities(tasks=True, elicitation=True)


def tasks_config(runs: dict[str, Any], store: dict[str, Any] | None = None) -> Any:
    """The tasks fixture's pipelines, two principals, the given ``[runs]`` (and ``[store]``)."""
    doc = TASKS_CONFIG + "\n[auth]\ntokens = [\n"
    doc += '  { env = "MALLORY_TOKEN", principal = "mallory" },\n  { env = "ALICE_TOKEN", principal = "alice" },\n]\n'
    doc += "[runs]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in runs.items())
    if store:
        doc += "[store]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in store.items())
    return parse_config(doc, "toml", environ=TOKENS)


def _toml(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value).lower() if isinstance(value, bool) else repr(value)


async def park(http: httpx2.AsyncClient, url: str, token: str, n: int) -> tuple[list[str], list[str]]:
    """``n`` tasks of ``confirm_delete`` (which asks its client): the task ids created, and the refusals."""
    created, refused = [], []
    for i in range(n):
        status, answer = await rpc(
            http, url, call("confirm_delete", {"filename": f"f{i}"}, ASKING, rid=i), "confirm_delete", token=token
        )
        assert status == 200, answer
        result = answer["result"]
        if result.get("resultType") == "task":
            created.append(result["taskId"])
        else:
            assert result["isError"] is True
            refused.append(result["content"][0]["text"])
    return created, refused


async def task_status(http: httpx2.AsyncClient, url: str, token: str, task_id: str) -> dict[str, Any]:
    status, answer = await rpc(http, url, task_request("tasks/get", task_id, ASKING), task_id, token=token)
    assert status == 200, answer
    return answer["result"]  # type: ignore[no-any-return]


async def until_parked(http: httpx2.AsyncClient, url: str, token: str, ids: list[str]) -> None:
    with trio.fail_after(20):
        for task_id in ids:
            while True:
                if (await task_status(http, url, token, task_id))["status"] == "input_required":
                    break
                await trio.sleep(0.05)


async def background(http: httpx2.AsyncClient, url: str, token: str | None) -> dict[str, Any]:
    spec = {"background": True, "steps": [{"tool": "greet", "args": {"name": "alice"}}]}
    status, answer = await rpc(http, url, call(PIPE_TOOL, spec), PIPE_TOOL, token=token)
    assert status == 200
    return answer["result"]["structuredContent"]  # type: ignore[no-any-return]


# --- 4. parked runs: quotas per principal, a TTL, across restarts ----------------------------------------


async def test_one_principal_parking_tasks_cannot_refuse_everyone_elses_runs_even_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: 1000 tasks parked in input_required (7.8 s) filled the queue; every principal's background runs
    # and tasks were refused, also after a restart. Here the queue keeps 10 runs and mallory tries 14.
    for k, v in TOKENS.items():
        monkeypatch.setenv(k, v)
    runs = {"path": str(tmp_path / "runs.sqlite3"), "max_runs": 10, "max_runs_per_principal": 4, "parked_ttl_s": 4.0}
    config = tasks_config(runs)
    with trio.fail_after(60):
        async with http_app(config) as url, httpx2.AsyncClient(timeout=30) as http, probing(url):
            mine, refused = await park(http, url, TOKENS["MALLORY_TOKEN"], 14)
            await until_parked(http, url, TOKENS["MALLORY_TOKEN"], mine)
            theirs, _ = await park(http, url, TOKENS["ALICE_TOKEN"], 1)
            run = await background(http, url, TOKENS["ALICE_TOKEN"])
        parked_at = trio.current_time()
        # A restart on the same file: mallory's parked tasks are still hers, and still bounded.
        async with http_app(config) as url, httpx2.AsyncClient(timeout=30) as http, probing(url):
            _, refused_again = await park(http, url, TOKENS["MALLORY_TOKEN"], 1)
            after_restart = await background(http, url, TOKENS["ALICE_TOKEN"])
            # Once they have waited past parked_ttl_s they fail, and mallory's room is back.
            await trio.sleep(max(0.0, 4.2 - (trio.current_time() - parked_at)))
            expired = await task_status(http, url, TOKENS["MALLORY_TOKEN"], mine[0])
            again, _ = await park(http, url, TOKENS["MALLORY_TOKEN"], 1)
    assert len(mine) == 4 and len(refused) == 10
    assert refused[0] == (
        "LIMIT_EXCEEDED: principal 'mallory' has 4 runs queued, running or waiting for input; one principal may "
        "have at most 4 ([runs] max_runs_per_principal); try again once some have finished"
    )
    assert len(theirs) == 1 and run["ok"] is True and run["result"]["status"] == "queued"
    assert refused_again and after_restart["ok"] is True
    assert expired["status"] == "failed" and expired["error"]["code"] == -32001
    assert "([runs] parked_ttl_s)" in expired["error"]["message"]
    assert len(again) == 1


async def redis_used_memory(url: str) -> int:
    import coredis

    client: Any = coredis.Redis.from_url(url, decode_responses=True)
    async with client:
        info = await client.info("memory")
    return int(info["used_memory"])


async def test_a_principal_parking_tasks_on_redis_is_bounded_in_count_and_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: Redis had no bound: 2000 parked tasks grew its memory from 1 to 54 MB.
    for k, v in TOKENS.items():
        monkeypatch.setenv(k, v)
    with trio.fail_after(90):
        async with redis_server(tmp_path) as redis:
            config = tasks_config({"max_runs_per_principal": 8, "parked_ttl_s": 600.0}, {"url": redis.url})
            async with http_app(config) as url, httpx2.AsyncClient(timeout=30) as http, probing(url):
                first, _ = await park(http, url, TOKENS["MALLORY_TOKEN"], 8)
                await until_parked(http, url, TOKENS["MALLORY_TOKEN"], first)
                at_quota = await redis_used_memory(redis.url)
                more, refused = await park(http, url, TOKENS["MALLORY_TOKEN"], 40)
                after = await redis_used_memory(redis.url)
                theirs, _ = await park(http, url, TOKENS["ALICE_TOKEN"], 1)
                queue = RedisRunQueue(redis.url, prefix="mcpipe")
                async with trio.open_nursery() as nursery:
                    await nursery.start(queue.run)
                    count, total = await queue.usage()
                    nursery.cancel_scope.cancel()
    assert len(first) == 8 and more == [] and len(refused) == 40
    assert "([runs] max_runs_per_principal)" in refused[0]
    assert len(theirs) == 1
    # 40 more attempts left nothing behind (each parked task costs Redis a few KB).
    assert after - at_quota < 64 * 1024, (at_quota, after)
    assert count == 9 and 0 < total < 9 * 16 * 1024


async def test_parked_tasks_on_redis_expire_after_their_ttl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in TOKENS.items():
        monkeypatch.setenv(k, v)
    with trio.fail_after(60):
        async with redis_server(tmp_path) as redis:
            config = tasks_config({"max_runs_per_principal": 2, "parked_ttl_s": 1.0}, {"url": redis.url})
            async with http_app(config) as url, httpx2.AsyncClient(timeout=30) as http, probing(url):
                mine, _ = await park(http, url, TOKENS["MALLORY_TOKEN"], 2)
                await until_parked(http, url, TOKENS["MALLORY_TOKEN"], mine)
                _, refused = await park(http, url, TOKENS["MALLORY_TOKEN"], 1)
                await trio.sleep(1.2)
                again, _ = await park(http, url, TOKENS["MALLORY_TOKEN"], 1)  # the two expired first
                expired = await task_status(http, url, TOKENS["MALLORY_TOKEN"], mine[0])
    assert refused and len(again) == 1
    assert expired["status"] == "failed" and "([runs] parked_ttl_s)" in expired["error"]["message"]


# --- 5. a run's events are charged to it and bounded ---------------------------------------------------------

EVENT_FLOOD = """
[audit]
enabled = false
[runs]
max_bytes = 8388608
"""


def nested_for_each(step_id: str, n: int) -> dict[str, Any]:
    """Two nested ``for_each`` of ``n`` under a long step id: ``2 n^2`` step events naming that id."""
    inner = {"id": "i", "for_each": "${vars.items}", "step": {"tool": "echo", "args": {"k": "${index}"}}}
    return {
        "background": True,
        "vars": {"items": list(range(n))},
        "steps": [{"id": step_id, "for_each": "${vars.items}", "step": inner}],
    }


async def test_nested_for_each_under_a_long_step_id_leaves_the_servers_memory_flat(tmp_path: Path) -> None:
    # Before: ~2200 events of a 40 KB path per run, never charged to the run: RSS grew 3.3 GB over 101
    # requests, linearly. Now each event is cut to a few hundred bytes, a run keeps at most max_run_events of
    # them, and they count towards max_run_bytes and the queue's max_bytes (8 MiB here).
    spec = nested_for_each("x" * 10_000, 20)  # 800 step events per run, of a 10 KB path each before
    rss: list[float] = []
    with trio.fail_after(120):
        async with serve_process(EVENT_FLOOD, tmp_path) as served, httpx2.AsyncClient(timeout=60) as http:
            async with probing(served.url):
                for i in range(8):
                    _, answer = await rpc(http, served.url, call(PIPE_TOOL, spec, rid=i), PIPE_TOOL)
                    run_id = answer["result"]["structuredContent"]["result"]["run_id"]
                    args = {"run_id": run_id, "wait_ms": 30000}
                    _, done = await rpc(http, served.url, call("pipe_result", args, rid=i), "pipe_result")
                    assert done["result"]["structuredContent"]["ok"] is True
                    rss.append(rss_mb(served.proc.pid))
            _, events = await rpc(
                http, served.url, call("pipe_events", {"run_id": run_id, "limit": 1000}), "pipe_events"
            )
    print("RSS (MB) after each run:", [round(r) for r in rss])
    # After the first few runs (warm-up: imports, the queue filling up to max_bytes) the server grows no more.
    assert rss[-1] - rss[2] < 20, rss
    kept = events["result"]["structuredContent"]["events"]
    assert all(len(e.get("path", "")) < 400 for e in kept)


# --- 12. Redis stopped during a background submit -----------------------------------------------------------


async def test_redis_stopped_mid_traffic_is_a_store_unavailable_answer_on_the_tool_and_task_paths(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: HTTP 500 with an empty body and a traceback in the log; a task got an opaque -32603.
    spec = {"background": True, "steps": [{"tool": "greet", "args": {"name": "x"}}]}
    answers: list[tuple[str, int, Any]] = []
    with trio.fail_after(60):
        async with redis_server(tmp_path) as redis:
            config = parse_config(
                TASKS_CONFIG + f'\n[store]\nurl = "{redis.url}"\ntimeout_ms = 300\n', "toml", environ={}
            )
            for fast in (True, False):
                async with http_app(config, fast_path=fast) as url, httpx2.AsyncClient(timeout=30) as http:
                    async with probing(url):
                        assert (await background(http, url, None))["ok"] is True  # Redis is up
                        await redis.stop()
                        caplog.clear()
                        with caplog.at_level(logging.WARNING):
                            status, answer = await rpc(http, url, call(PIPE_TOOL, spec), PIPE_TOOL)
                            answers.append(("tool", status, answer))
                            tool_log = [r for r in caplog.records if r.name.startswith("mcpipe.server")]
                            caplog.clear()
                            args = {"filename": "f"}
                            status, answer = await rpc(
                                http, url, call("confirm_delete", args, ASKING), "confirm_delete"
                            )
                            answers.append(("task", status, answer))
                            task_log = [r for r in caplog.records if r.name.startswith("mcpipe.server")]
                            traced = [r for r in caplog.records if r.exc_info]
                        await redis.start()
                        with trio.fail_after(10):  # Redis is back: so is the queue
                            while True:
                                if (await background(http, url, None))["ok"] is True:
                                    break
                                await trio.sleep(0.1)
                    for records in (tool_log, task_log):
                        assert len(records) == 1 and "is unavailable" in records[0].getMessage()
                    assert traced == []
    for path, status, answer in answers:
        assert status == 200, (path, answer)
        error = answer["error"]
        assert error["code"] == -32603 and error["data"] == {"reason": "store_unavailable"}, (path, error)
        assert error["message"].startswith(f"the run queue at {redis.url} is unavailable"), (path, error)
        assert error["message"].endswith("; try again")


async def test_the_queue_is_store_unavailable_in_one_line_while_redis_is_down(tmp_path: Path) -> None:
    from mcpipe.store import StoreUnavailable

    with trio.fail_after(30):
        async with redis_server(tmp_path) as redis, trio.open_nursery() as nursery:
            queue = open_queue(redis.url, prefix="t", timeout_s=0.3)
            await nursery.start(queue.run)
            await redis.stop()
            with pytest.raises(StoreUnavailable, match=r"^the run queue at redis://.* is unavailable: "):
                await queue.enqueue("mcp_pipe", {})
            await redis.start()
            await queue.enqueue("mcp_pipe", {})
            nursery.cancel_scope.cancel()


async def test_open_app_on_redis_starts_though_redis_is_down(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with redis_server(tmp_path) as redis:
            await redis.stop()
            config = parse_config(f'[store]\nurl = "{redis.url}"\ntimeout_ms = 300\n', "toml", environ={})
            async with open_app(config) as app:
                assert app.worker is not None
