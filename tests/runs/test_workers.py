"""Queued runs across worker processes: 100 runs, three ``mcpipe worker`` processes, one killed with
SIGKILL mid-run (and, on SQLite, every worker killed and new ones started: a restart of the box). Every run
completes exactly once, and no step runs twice except one that was in flight on a killed worker
(at-least-once), counted by the tools themselves."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import trio

from kit.redis import redis_url as redis_server
from kit.run_workers import Workers
from mcpipe.gateway import PIPE_TOOL
from mcpipe.store import RunQueue, open_queue

RUNS = 100
STEPS = 3


def _spec(i: int) -> dict[str, Any]:
    return {
        "steps": [{"id": f"s{j}", "tool": "mark", "args": {"tag": f"r{i:03d}/s{j}", "ms": 40}} for j in range(STEPS)]
    }


async def _count(queue: RunQueue, status: str) -> int:
    return len(await queue.runs(limit=RUNS * 2, status=status))


async def _until_completed(queue: RunQueue, n: int) -> None:
    """Wait until ``n`` runs completed, following the last run's events between looks."""
    while await _count(queue, "completed") < n:
        await queue.events("r099", wait_s=0.2, after="999999999")  # a bounded wait for news on the queue


async def _check(queue: RunQueue, marks: Path, killed: set[str]) -> None:
    runs = {r.id: r for r in await queue.runs(limit=RUNS * 2)}
    assert len(runs) == RUNS and {r.status for r in runs.values()} == {"completed"}
    text = await trio.Path(marks).read_text()
    ran = Counter(line.split()[0] for line in text.splitlines())
    taken_over = 0
    for i in range(RUNS):
        run_id = f"r{i:03d}"
        events = await queue.events(run_id)
        assert [e.type for e in events].count("completed") == 1, run_id  # completed exactly once
        finished_by: dict[str, str] = {}
        for e in events:
            if e.type == "step_finished":
                finished_by.setdefault(e.data["path"], e.worker or "")
        assert sorted(finished_by) == [f"s{j}" for j in range(STEPS)]
        # A finished step is recorded once: one taken over is recalled, never finished (so run) again.
        finishes = Counter(e.data["path"] for e in events if e.type == "step_finished")
        assert finishes == {f"s{j}": 1 for j in range(STEPS)}, (run_id, finishes)
        again = [f"s{j}" for j in range(STEPS) if ran[f"{run_id}/s{j}"] != 1]
        assert all(ran[f"{run_id}/s{j}"] >= 1 for j in range(STEPS)), run_id
        if runs[run_id].attempts > 1:
            taken_over += 1
            leases = [e.worker for e in events if e.type == "leased"]
            assert set(leases[:-1]) <= killed, (run_id, leases)  # only a killed worker's runs were taken over
        # At-least-once: only the one step in flight on a killed worker ran again, never a recorded one.
        assert len(again) <= runs[run_id].attempts - 1, (run_id, again)
        for path in again:
            assert ran[f"{run_id}/{path}"] == 2
    assert taken_over >= 1


def _config(tmp_path: Path, store: str) -> Path:
    config = tmp_path / "mcpipe.toml"
    config.write_text(
        'python_tools = ["kit.run_tools:registry"]\n'
        "[audit]\nenabled = false\n"
        '[runs]\npath = "runs.sqlite3"\nlease_s = 2.0\nconcurrency = 3\n' + store
    )
    return config


async def test_sqlite_queue_completes_100_runs_exactly_once_through_a_sigkill_and_a_restart(tmp_path):
    config, marks = _config(tmp_path, ""), tmp_path / "marks"
    queue = open_queue(str(tmp_path / "runs.sqlite3"), poll_s=0.05)
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            await nursery.start(queue.run)
            async with Workers(nursery, config, marks) as workers:
                for w in ("w1", "w2", "w3"):
                    await workers.start(w)
                for i in range(RUNS):
                    await queue.enqueue(PIPE_TOOL, _spec(i), run_id=f"r{i:03d}")
                await _until_completed(queue, 15)
                workers.kill("w1")
                await _until_completed(queue, 45)
                await workers.stop_all()  # the whole box goes down mid-run ...
                assert await _count(queue, "completed") < RUNS
                for w in ("w4", "w5"):  # ... and comes back
                    await workers.start(w)
                await _until_completed(queue, RUNS)
            await _check(queue, marks, {"w1", "w2", "w3"})
            nursery.cancel_scope.cancel()


async def test_redis_streams_complete_100_runs_exactly_once_when_a_worker_is_killed(tmp_path):
    marks = tmp_path / "marks"
    with trio.fail_after(90):
        async with redis_server(tmp_path) as url, trio.open_nursery() as nursery:
            config = _config(tmp_path, f'[store]\nurl = "{url}"\nprefix = "t"\n')
            queue = open_queue(url, prefix="t")
            await nursery.start(queue.run)
            async with Workers(nursery, config, marks) as workers:
                for w in ("w1", "w2", "w3"):
                    await workers.start(w)
                for i in range(RUNS):
                    await queue.enqueue(PIPE_TOOL, _spec(i), run_id=f"r{i:03d}")
                await _until_completed(queue, 20)
                workers.kill("w1")
                await _until_completed(queue, RUNS)
            await _check(queue, marks, {"w1"})
            nursery.cancel_scope.cancel()
