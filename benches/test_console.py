"""The console's cost, side by side in one run (docs/performance.md, "The console"):

- the server's CPU per trivial tool call (``/proc/PID/stat`` over a fixed number of calls, sent by the Rust
  load generator ``benches/loadgen`` in a process of its own) while it is busy with a background run (a step
  every few milliseconds, two events each): console off; console on with nobody looking; console on with a
  page open on that run (its event stream followed). The phases take turns round by round and the figure is
  the median of each round's ratio to console off: a calls/s drop, that the machine's other work does not
  move as it moves a rate of calls;
- the runs list's page with 100 000 runs in the queue (SQLite), by filter.

    pytest benches/test_console.py --benchmark-enable --benchmark-only -s    # for real, with the tables

Under the default ``--benchmark-disable`` each test runs once, briefly, as a smoke test.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import time
from pathlib import Path
from typing import Any

import httpx2
import orjson
import trio

from server_load import _Conn, cpu_seconds, request_bytes, run_load, server_process, tools_call

TRIVIAL = tools_call("ping", {"text": "hi"})


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def _busy(ms: float) -> bytes:
    """A background run of 1000 steps (100 elements of 10 steps one after the other, 8 elements at once: the
    server's ``max_concurrency``), each waiting ``ms``: two events per step, hundreds a second."""
    inner = [{"id": f"t{j}", "tool": "tick", "args": {"ms": ms, "i": j}} for j in range(10)]
    spec = {
        "background": True,
        "vars": {"items": list(range(100))},
        "steps": [{"id": "loop", "for_each": "${vars.items}", "step": {"id": "p", "pipe": {"steps": inner}}}],
    }
    return tools_call("mcp_pipe", spec)


async def _submit(url: str, body: bytes) -> str:
    hostport, _, path = url.removeprefix("http://").partition("/")
    host, _, port = hostport.rpartition(":")
    conn = _Conn(host, int(port))
    try:
        status, answer = await conn.roundtrip(request_bytes(host, int(port), "/" + path, body))
    finally:
        await conn.close()
    assert status == 200, answer
    result = orjson.loads(answer)["result"]["structuredContent"]
    assert result["ok"], result
    return str(result["result"]["run_id"])


async def _watch(base: str, run_id: str, seen: list[int], task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """A page open on the run: the page once, then its event stream followed (as the page's script does)."""
    async with httpx2.AsyncClient(timeout=None) as http:
        page = await http.get(f"{base}/console/runs/{run_id}")
        assert page.status_code == 200, page.text[:300]
        async with http.stream("GET", f"{base}/api/v1/streams/runs/{run_id}") as r:
            assert r.status_code == 200
            task_status.started()
            async for line in r.aiter_lines():
                if line.startswith("event: run-event"):
                    seen[0] += 1


PHASES = ("off", "none", "page")
"""Console off; console on, nobody looking; console on, a page open on the busy run."""


async def _load(gen: Path | None, url: str, pid: int, calls: int) -> tuple[float, float]:
    """``calls`` trivial calls from 8 connections, by the Rust load generator in a process of its own (the
    Python client in this one without cargo): the server's CPU ms per call (utime + stime of ``/proc/PID/stat``
    over the calls) and the calls/s."""
    if gen is None:
        load = await run_load(url, pid, TRIVIAL, clients=8, calls=calls, max_seconds=600, check=b'"hi"')
        return load.cpu_ms_per_call, load.calls_per_s
    cpu0 = cpu_seconds(pid)
    done = await trio.run_process(
        [str(gen), url, "8", str(calls), '"hi"'], stdin=TRIVIAL, capture_stdout=True, capture_stderr=True
    )
    cpu1 = cpu_seconds(pid)
    n, seconds, _ = done.stdout.split()
    assert int(n) == calls, done.stdout
    return (cpu1 - cpu0) * 1000 / int(n), int(n) / float(seconds)


async def _phases(rounds: int, calls: int, ms: float) -> dict[str, dict[str, list[float]]]:
    """Each phase's server CPU ms per call and calls/s, round by round: two servers side by side (console off,
    console on), each phase on a fresh busy run, the phases of a round in turn (their order rotating round by
    round, so no phase is always first), a fixed number of calls each."""
    from proxy_peer import loadgen

    gen = loadgen()
    out: dict[str, dict[str, list[float]]] = {k: {"cpu_ms": [], "calls_per_s": []} for k in PHASES}
    events: list[int] = [0]
    async with (
        server_process("mcpipe", os.devnull) as (off_url, off_pid),
        server_process("mcpipe", os.devnull, "console") as (on_url, on_pid),
    ):
        for url, pid in ((off_url, off_pid), (on_url, on_pid)):
            await _load(gen, url, pid, 400)  # warm up
        server = {"off": (off_url, off_pid), "none": (on_url, on_pid), "page": (on_url, on_pid)}
        for r in range(rounds):
            for phase in PHASES[r % 3 :] + PHASES[: r % 3]:
                url, pid = server[phase]
                run_id = await _submit(url, _busy(ms))  # 5 s at least: it outlasts the calls
                async with trio.open_nursery() as nursery:
                    if phase == "page":
                        await nursery.start(_watch, url.rsplit("/mcp", 1)[0], run_id, events)
                    await trio.sleep(0.2)  # the run under way (and the page's stream following it)
                    cpu_ms, rate = await _load(gen, url, pid, calls)
                    nursery.cancel_scope.cancel()
                out[phase]["cpu_ms"].append(cpu_ms)
                out[phase]["calls_per_s"].append(rate)
                await _submit_cancel(url, run_id)
    assert events[0] > 0, "the page's stream saw no event"
    return out


async def _submit_cancel(url: str, run_id: str) -> None:
    hostport, _, path = url.removeprefix("http://").partition("/")
    host, _, port = hostport.rpartition(":")
    conn = _Conn(host, int(port))
    try:
        await conn.roundtrip(request_bytes(host, int(port), "/" + path, tools_call("pipe_cancel", {"run_id": run_id})))
    finally:
        await conn.close()


def test_the_console_costs_nothing_unwatched_and_a_watched_busy_run_costs_under_5_percent(benchmark):
    quick = getattr(benchmark, "disabled", True)
    rounds, calls = (1, 200) if quick else (15, 1200)
    load_before = os.getloadavg()
    result: dict[str, dict[str, list[float]]] = {}

    def run() -> None:
        result.update(trio.run(_phases, rounds, calls, 40.0))

    benchmark.pedantic(run, rounds=1, iterations=1)
    load_after = os.getloadavg()
    med = {k: {m: statistics.median(v) for m, v in r.items()} for k, r in result.items()}
    # A server's calls/s is what a core gives divided by the CPU a call takes: the ratio of CPU per call is the
    # ratio of calls/s a busy server keeps, whatever else the machine runs. Each round's phases run seconds
    # apart, so the ratio within a round leaves out most of the machine's drift; the median of those ratios.
    ratio = {k: [x / o for x, o in zip(result[k]["cpu_ms"], result["off"]["cpu_ms"], strict=True)] for k in PHASES}
    names = {"off": ("console off", "-"), "none": ("console on", "nobody looks"), "page": ("console on", "a page open")}
    rows = [("server", "phase", "CPU ms/call", "ratio to off (median; range)", "calls/s drop", "calls/s")]
    for k, (name, phase) in names.items():
        r = statistics.median(ratio[k])
        rows.append((
            name, phase, f"{med[k]['cpu_ms']:.3f}", f"{r:.3f} ({min(ratio[k]):.3f}-{max(ratio[k]):.3f})",
            f"{(1 - 1 / r) * 100:.1f}%", f"{med[k]['calls_per_s']:.0f}",
        ))  # fmt: skip
    print(f"\n{rounds} rounds of {calls} calls a phase; load average {load_before[0]:.1f} before, "
          f"{load_after[0]:.1f} after\n" + _table(rows))  # fmt: skip
    for k in PHASES:
        benchmark.extra_info[f"{k}_cpu_ms_per_call"] = round(med[k]["cpu_ms"], 4)
        benchmark.extra_info[f"{k}_vs_off"] = round(statistics.median(ratio[k]), 4)
    benchmark.extra_info.update(load_average=(round(load_before[0], 2), round(load_after[0], 2)))
    assert all(v > 0 for k in PHASES for v in result[k]["cpu_ms"])
    if not quick:
        assert 1 - 1 / statistics.median(ratio["page"]) <= 0.05


async def _watching_cost(rounds: int, seconds: float, ms: float) -> dict[str, list[float]]:
    """The server's CPU (ms per second) while it runs the busy run and serves no calls: with nobody looking, and
    with a page open on the run; and the events the page received per second. The difference is what looking
    costs, whatever else the machine runs (a rate of calls cannot be told apart from the machine's load)."""
    out: dict[str, list[float]] = {"none": [], "page": [], "events_per_s": []}
    async with server_process("mcpipe", os.devnull, "console") as (url, pid):
        await run_load(url, pid, TRIVIAL, clients=2, calls=200, check=b'"hi"')  # warm up
        for _ in range(rounds):
            for phase in ("none", "page"):
                run_id = await _submit(url, _busy(ms))
                seen = [0]
                async with trio.open_nursery() as nursery:
                    if phase == "page":
                        await nursery.start(_watch, url.rsplit("/mcp", 1)[0], run_id, seen)
                    await trio.sleep(0.2)  # the run under way
                    cpu0, t0, n0 = cpu_seconds(pid), time.perf_counter(), seen[0]
                    await trio.sleep(seconds)  # the window measured
                    cpu1, t1, n1 = cpu_seconds(pid), time.perf_counter(), seen[0]
                    nursery.cancel_scope.cancel()
                out[phase].append((cpu1 - cpu0) / (t1 - t0) * 1000)
                if phase == "page":
                    out["events_per_s"].append((n1 - n0) / (t1 - t0))
                await _submit_cancel(url, run_id)
    return out


def test_a_page_open_on_a_busy_run_costs_the_server_a_few_ms_of_cpu_a_second(benchmark):
    quick = getattr(benchmark, "disabled", True)
    rounds, seconds = (1, 0.5) if quick else (8, 2.0)
    result: dict[str, list[float]] = {}

    def run() -> None:
        result.update(trio.run(_watching_cost, rounds, seconds, 40.0))

    benchmark.pedantic(run, rounds=1, iterations=1)
    none, page = statistics.median(result["none"]), statistics.median(result["page"])
    events = statistics.median(result["events_per_s"])
    rows = [("phase", "server CPU ms/s (median)", "each round")]
    rows.append(("busy run, nobody looks", f"{none:.1f}", ", ".join(f"{v:.0f}" for v in result["none"])))
    rows.append(("busy run, a page open", f"{page:.1f}", ", ".join(f"{v:.0f}" for v in result["page"])))
    print("\n" + _table(rows))
    cost = page - none
    print(f"looking costs {cost:.1f} ms of CPU a second ({cost / 10:.2f}% of a core), for {events:.0f} events/s")
    benchmark.extra_info.update(none_cpu_ms_per_s=round(none, 2), page_cpu_ms_per_s=round(page, 2), events_per_s=events)
    assert events > 0


def _fill(path: Path, n: int) -> float:
    """``n`` runs written straight into the queue's own tables (its schema, made by the queue): four principals,
    three targets, mostly finished, created one a second up to now. Answers the oldest run's creation time."""
    from mcpipe.store._sqlite import SqliteRunQueue

    q = SqliteRunQueue(str(path))
    q._with_db(lambda db: None)  # the schema and indexes
    q.close()
    now = time.time()
    statuses = ["completed"] * 7 + ["failed", "cancelled", "queued"]
    rows = []
    for i in range(n):
        created = now - (n - i)
        rows.append((
            f"run{i:08d}", ("mcp_pipe", "report", "nightly")[i % 3], b"{}", ("alice", "bob", "carol", None)[i % 4],
            statuses[i % 10], created, created + 0.5, b"{}", 100,
        ))  # fmt: skip
    db = sqlite3.connect(path)
    db.executemany(
        "INSERT INTO runs (id, target, args, principal, status, created, updated, meta, bytes)"
        " VALUES (?,?,?,?,?,?,?,?,?)",
        rows,
    )
    db.commit()
    db.close()
    return now - n


async def _pages(path: Path, oldest: float, n: int) -> list[tuple[str, float, int]]:
    from mcpipe.store._sqlite import SqliteRunQueue

    q = SqliteRunQueue(str(path), max_runs=n + 10)
    cases: list[tuple[str, dict[str, Any]]] = [
        ("newest 50", {}),
        ("status=failed", {"status": "failed"}),
        ("tool=report", {"target": "report"}),
        ("principal=carol", {"principals": ("carol",)}),
        ("anonymous", {"principals": (None,)}),
        ("last hour", {"since": time.time() - 3600}),
        ("a day's window, long ago", {"since": oldest + 3600, "until": oldest + 3600 + 86400}),
        ("status=queued tool=nightly principal=bob", {"status": "queued", "target": "nightly", "principals": ("bob",)}),
        ("nothing matches", {"target": "nope"}),
    ]
    out = []
    for name, filters in cases:
        await q.page(limit=50, **filters)  # the file's pages in the cache, as a page in use has them
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            page = await q.page(limit=50, **filters)
            times.append(time.perf_counter() - t0)
        out.append((name, statistics.median(times) * 1000, len(page.runs)))
    # The 20th page of the newest, by cursor.
    before = None
    for _ in range(19):
        before = (await q.page(limit=50, before=before)).next
    t0 = time.perf_counter()
    page = await q.page(limit=50, before=before)
    out.append(("page 20 (cursor)", (time.perf_counter() - t0) * 1000, len(page.runs)))
    counts = await q.counts()
    assert sum(counts.values()) == n
    q.close()
    return out


def test_the_runs_list_with_100000_runs_answers_a_page_in_milliseconds(benchmark, tmp_path):
    n = 5_000 if getattr(benchmark, "disabled", True) else 100_000
    path = tmp_path / "runs.sqlite3"
    oldest = _fill(path, n)
    result: list[tuple[str, float, int]] = []

    def run() -> None:
        result[:] = trio.run(_pages, path, oldest, n)

    benchmark.pedantic(run, rounds=1, iterations=1)
    rows = [("filter", "ms (median of 5)", "runs on the page")]
    rows += [(name, f"{ms:.2f}", str(k)) for name, ms, k in result]
    print(f"\n{n} runs in the queue\n" + _table(rows))
    for name, ms, _ in result:
        benchmark.extra_info[name] = round(ms, 3)
    assert all(k == 50 for name, _, k in result if name in ("newest 50", "tool=report", "page 20 (cursor)"))
    assert dict((name, k) for name, _, k in result)["nothing matches"] == 0
