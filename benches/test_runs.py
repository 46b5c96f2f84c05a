"""Queued runs: enqueue-to-first-step latency and runs per second with 1 and 2 ``mcpipe worker``
processes, on the SQLite default and on Redis Streams, side by side in one run.

    pytest benches/test_runs.py --benchmark-enable --benchmark-only -s    # for real, with the table

Under the default ``--benchmark-disable`` each case runs once on a handful of runs, as a smoke test.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import trio

from kit.redis import redis_url as redis_server
from kit.run_workers import Workers
from mcpipe.gateway import PIPE_TOOL
from mcpipe.store import TERMINAL, RunQueue, open_queue

SPEC = {"steps": [{"id": "s", "tool": "echo", "args": {"x": 1}}]}


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def _config(tmp_path: Path, store: str) -> Path:
    config = tmp_path / "mcpipe.toml"
    config.write_text(f'[audit]\nenabled = false\n[runs]\npath = "runs.sqlite3"\nconcurrency = 8\n{store}')
    return config


async def _first_step_at(queue: RunQueue, run_id: str) -> float:
    cursor = None
    while True:
        for event in await queue.events(run_id, after=cursor, wait_s=1.0):
            cursor = event.cursor
            if event.type == "step_started":
                return event.at


async def _finished_at(queue: RunQueue, run_id: str) -> float:
    """Follow a run's events to its terminal one; answers when it was written."""
    cursor = None
    while True:
        for event in await queue.events(run_id, after=cursor, wait_s=1.0):
            cursor = event.cursor
            if event.type in TERMINAL:
                return event.at


async def _measure(queue: RunQueue, workers: Workers, n_workers: int, singles: int, bulk: int) -> tuple[float, float]:
    for i in range(n_workers):
        await workers.start(f"w{i}")
    # Latency: one run at a time, every worker idle.
    latencies = []
    for i in range(singles):
        t0 = time.time()
        info = await queue.enqueue(PIPE_TOOL, SPEC, run_id=f"single-{n_workers}-{i}")
        latencies.append((await _first_step_at(queue, info.id)) - t0)
        await _finished_at(queue, info.id)
    # Throughput: many runs queued at once.
    t0 = time.time()
    ids = [(await queue.enqueue(PIPE_TOOL, SPEC, run_id=f"bulk-{n_workers}-{i}")).id for i in range(bulk)]
    last = max([await _finished_at(queue, run_id) for run_id in ids])
    await workers.stop_all()
    return statistics.median(latencies) * 1000, bulk / (last - t0)


async def _sqlite(tmp_path: Path, n_workers: int, singles: int, bulk: int) -> tuple[float, float]:
    async with trio.open_nursery() as nursery:
        queue = open_queue(str(tmp_path / "runs.sqlite3"), poll_s=0.05)
        await nursery.start(queue.run)
        async with Workers(nursery, _config(tmp_path, "")) as workers:
            out = await _measure(queue, workers, n_workers, singles, bulk)
        nursery.cancel_scope.cancel()
    return out


async def _redis(tmp_path: Path, n_workers: int, singles: int, bulk: int) -> tuple[float, float]:
    async with redis_server(tmp_path) as url, trio.open_nursery() as nursery:
        queue = open_queue(url, prefix="bench")
        await nursery.start(queue.run)
        config = _config(tmp_path, f'[store]\nurl = "{url}"\nprefix = "bench"\n')
        async with Workers(nursery, config) as workers:
            out = await _measure(queue, workers, n_workers, singles, bulk)
        nursery.cancel_scope.cancel()
    return out


def test_queued_runs_latency_and_throughput_with_one_and_two_workers_on_sqlite_and_redis(benchmark, tmp_path):
    singles, bulk = (2, 10) if benchmark.disabled else (30, 400)
    counts = (1,) if benchmark.disabled else (1, 2)
    result: dict[tuple[str, int], tuple[float, float]] = {}

    def run() -> None:
        for backend, fn in (("sqlite", _sqlite), ("redis", _redis)):
            for n in counts:
                where = tmp_path / f"{backend}-{n}"
                where.mkdir()
                result[backend, n] = trio.run(fn, where, n, singles, bulk)

    benchmark.pedantic(run, rounds=1, iterations=1)
    rows = [("queue", "workers", "enqueue -> first step (median ms)", "runs/s")]
    for (backend, n), (latency, rate) in result.items():
        rows.append((backend, str(n), f"{latency:.1f}", f"{rate:.0f}"))
        benchmark.extra_info[f"{backend}_w{n}_latency_ms"] = round(latency, 2)
        benchmark.extra_info[f"{backend}_w{n}_runs_per_s"] = round(rate, 1)
    print("\n" + _table(rows))
    assert all(rate > 0 and latency > 0 for latency, rate in result.values())
