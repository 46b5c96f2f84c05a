"""The console's cost, side by side in one run (docs/performance.md, "The console"):

- the server's CPU per trivial tool call (``/proc/PID/stat`` over a fixed number of calls, sent by the Rust
  load generator ``benches/loadgen`` in a process of its own) while it is busy with a background run (a step
  every few milliseconds, two events each): console off; console on with nobody looking, or with a
  page open on that run (its event stream followed). Two servers (console off, console on) take the same
  calls at the same time, round after round, and the figure is the median of each round's ratio of their CPU
  per call: a calls/s drop, that the machine's other work does not move as it moves a rate of calls;
- the runs list's page with 100 000 runs in the queue, by filter, on SQLite and on a real Redis.

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


KINDS = ("none", "page")
"""What the console-on server has besides its busy run in a round: nobody looking, or a page open on the run."""


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


async def _rounds(rounds: int, calls: int, ms: float) -> dict[str, list[tuple[float, float, float, float]]]:
    """Two servers side by side, console off and console on, each busy with a fresh background run a round and
    loaded with the same calls at the same time (so the machine's other work weighs on both alike); the console
    server has nobody looking, or a page open on its run, in turn. Answers each round's (off CPU ms/call, on CPU
    ms/call, off calls/s, on calls/s), by what the console server had."""
    from proxy_peer import loadgen

    gen = loadgen()
    out: dict[str, list[tuple[float, float, float, float]]] = {k: [] for k in KINDS}
    events: list[int] = [0]
    async with (
        server_process("mcpipe", os.devnull) as (off_url, off_pid),
        server_process("mcpipe", os.devnull, "console") as (on_url, on_pid),
    ):
        for url, pid in ((off_url, off_pid), (on_url, on_pid)):
            await _load(gen, url, pid, 400)  # warm up
        for r in range(2 * rounds):
            kind = KINDS[r % 2]
            off_run, on_run = await _submit(off_url, _busy(ms)), await _submit(on_url, _busy(ms))
            got: dict[str, tuple[float, float]] = {}

            async def load(name: str, url: str, pid: int, got: dict[str, tuple[float, float]] = got) -> None:
                got[name] = await _load(gen, url, pid, calls)

            async with trio.open_nursery() as nursery:
                if kind == "page":
                    await nursery.start(_watch, on_url.rsplit("/mcp", 1)[0], on_run, events)
                await trio.sleep(0.2)  # the runs under way (and the page's stream following one)
                async with trio.open_nursery() as both:
                    both.start_soon(load, "off", off_url, off_pid)
                    both.start_soon(load, "on", on_url, on_pid)
                nursery.cancel_scope.cancel()
            out[kind].append((got["off"][0], got["on"][0], got["off"][1], got["on"][1]))
            await _submit_cancel(off_url, off_run)
            await _submit_cancel(on_url, on_run)
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
    rounds, calls = (1, 200) if quick else (12, 1600)  # a multiple of the 8 connections
    load_before = os.getloadavg()
    result: dict[str, list[tuple[float, float, float, float]]] = {}

    def run() -> None:
        result.update(trio.run(_rounds, rounds, calls, 40.0))

    benchmark.pedantic(run, rounds=1, iterations=1)
    load_after = os.getloadavg()
    # A server's calls/s is what a core gives divided by the CPU a call takes: the ratio of CPU per call is the
    # ratio of calls/s a busy server keeps, whatever else the machine runs. The two servers take their calls at
    # the same time, so the ratio within a round leaves out the machine's drift; the median of those ratios.
    ratio = {k: [on / off for off, on, _, _ in result[k]] for k in KINDS}
    rows = [("console server", "CPU ms/call off, on (medians)", "on / off: median (range)", "calls/s drop",
             "calls/s off, on")]  # fmt: skip
    for k, name in (("none", "nobody looks"), ("page", "a page open on its busy run")):
        r = statistics.median(ratio[k])
        med = [statistics.median(row[i] for row in result[k]) for i in range(4)]
        rows.append((
            name, f"{med[0]:.3f}, {med[1]:.3f}", f"{r:.3f} ({min(ratio[k]):.3f}-{max(ratio[k]):.3f})",
            f"{(1 - 1 / r) * 100:.1f}%", f"{med[2]:.0f}, {med[3]:.0f}",
        ))  # fmt: skip
        benchmark.extra_info[f"{k}_on_vs_off"] = round(r, 4)
    print(f"\n{rounds} rounds of each, {calls} calls a server a round; load average {load_before[0]:.1f} before, "
          f"{load_after[0]:.1f} after\n" + _table(rows))  # fmt: skip
    benchmark.extra_info.update(load_average=(round(load_before[0], 2), round(load_after[0], 2)))
    assert all(v > 0 for k in KINDS for row in result[k] for v in row)
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


STATUSES = ["completed"] * 7 + ["failed", "cancelled", "queued"]


def _runs(n: int, now: float) -> list[tuple[str, str, str | None, str, float]]:
    """``n`` runs (id, target, principal, status, created): four principals, three targets, mostly finished,
    created one a second up to ``now``."""
    return [
        (f"run{i:08d}", ("mcp_pipe", "report", "nightly")[i % 3], ("alice", "bob", "carol", None)[i % 4],
         STATUSES[i % 10], now - (n - i))
        for i in range(n)
    ]  # fmt: skip


def _fill(path: Path, n: int) -> float:
    """``n`` runs written straight into the SQLite queue's own tables (its schema, made by the queue). Answers
    the oldest run's creation time."""
    from mcpipe.store._sqlite import SqliteRunQueue

    q = SqliteRunQueue(str(path))
    q._with_db(lambda db: None)  # the schema and indexes
    q.close()
    now = time.time()
    rows = [(i, t, b"{}", p, st, c, c + 0.5, b"{}", 100) for i, t, p, st, c in _runs(n, now)]
    db = sqlite3.connect(path)
    db.executemany(
        "INSERT INTO runs (id, target, args, principal, status, created, updated, meta, bytes)"
        " VALUES (?,?,?,?,?,?,?,?,?)",
        rows,
    )
    db.commit()
    db.close()
    return now - n


def _resp(*words: str) -> bytes:
    return f"*{len(words)}\r\n".encode() + b"".join(f"${len(w.encode())}\r\n{w}\r\n".encode() for w in words)


async def _fill_redis(url: str, prefix: str, n: int) -> float:
    """``n`` runs written straight into a Redis queue's keys (each run's hash and the index, as the queue's
    scripts write them; ``redis-cli --pipe``), as runs enqueued before there were facets. Answers the oldest
    run's creation time."""
    now = time.time()
    out = []
    for run_id, target, principal, status, created in _runs(n, now):
        fields = {"id": run_id, "target": target, "args": "{}", "principal": principal or "", "status": status,
                  "created": repr(created), "updated": repr(created + 0.5), "attempts": "1", "cancel": "0",
                  "meta": "{}", "nevents": "4", "ebytes": "100", "sbytes": "0"}  # fmt: skip
        out.append(_resp("HSET", f"{prefix}:run:{run_id}", *(x for kv in fields.items() for x in kv)))
        out.append(_resp("ZADD", f"{prefix}:runs:index", repr(created), run_id))
    port = url.rsplit(":", 1)[1].split("/", 1)[0]
    done = await trio.run_process(
        ["redis-cli", "-p", port, "--pipe"], stdin=b"".join(out), capture_stdout=True, capture_stderr=True
    )
    assert b"errors: 0" in done.stdout, done.stdout
    return now - n


Timed = tuple[str, float, int, int, bool, float | None]
"""A page: what it asked for, its ms (median of 5), its runs, how many runs it looked at, partial, and the ms
Redis spent on it (its ``commandstats``; None on SQLite)."""


async def _time_pages(q: Any, oldest: float, redis: Any = None) -> list[Timed]:
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
        await q.page(limit=50, **filters)  # the pages in the cache, as a page in use has them
        if redis is not None:
            await redis.config_resetstat()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            page = await q.page(limit=50, **filters)
            times.append(time.perf_counter() - t0)
        inside = None
        if redis is not None:
            inside = (await redis.info("commandstats"))["cmdstat_evalsha"]["usec_per_call"] / 1000
        out.append((name, statistics.median(times) * 1000, len(page.runs), page.scanned, page.partial, inside))
    # The 20th page of the newest, by cursor.
    before = None
    for _ in range(19):
        before = (await q.page(limit=50, before=before)).next
    t0 = time.perf_counter()
    page = await q.page(limit=50, before=before)
    ms = (time.perf_counter() - t0) * 1000
    out.append(("page 20 (cursor)", ms, len(page.runs), page.scanned, page.partial, None))
    return out


async def _pages(path: Path, oldest: float, n: int) -> list[Timed]:
    from mcpipe.store._sqlite import SqliteRunQueue

    q = SqliteRunQueue(str(path), max_runs=n + 10)
    out = await _time_pages(q, oldest)
    counts = await q.counts()
    assert sum(counts.values()) == n
    q.close()
    return out


def _report(benchmark: Any, title: str, result: list[Timed]) -> None:
    rows = [("filter", "ms (median of 5)", "ms in Redis", "runs on the page", "runs looked at", "partial")]
    rows += [
        (name, f"{ms:.2f}", "" if inside is None else f"{inside:.3f}", str(k), str(seen), "yes" if partial else "")
        for name, ms, k, seen, partial, inside in result
    ]
    print(f"\n{title}\n" + _table(rows))
    for name, ms, *_ in result:
        benchmark.extra_info[name] = round(ms, 3)
    got = {name: k for name, _, k, *_ in result}
    assert all(got[name] == 50 for name in ("newest 50", "tool=report", "status=failed", "page 20 (cursor)"))
    assert got["nothing matches"] == 0
    assert not any(partial for _, _, _, _, partial, _ in result)


def test_the_runs_list_with_100000_runs_answers_a_page_in_milliseconds(benchmark, tmp_path):
    n = 5_000 if getattr(benchmark, "disabled", True) else 100_000
    path = tmp_path / "runs.sqlite3"
    oldest = _fill(path, n)
    result: list[Timed] = []

    def run() -> None:
        result[:] = trio.run(_pages, path, oldest, n)

    benchmark.pedantic(run, rounds=1, iterations=1)
    _report(benchmark, f"{n} runs in the SQLite queue; load average {os.getloadavg()[0]:.1f}", result)


async def _redis_pages(workdir: Path, n: int) -> tuple[float, float, list[Timed]]:
    """(seconds to write the runs, ms of the first page: the facets made for every run, the pages)."""
    import coredis

    from kit.redis import redis_url
    from mcpipe.store import open_queue

    async with redis_url(workdir) as url, trio.open_nursery() as nursery:
        t0 = time.perf_counter()
        oldest = await _fill_redis(url, "b", n)
        filled = time.perf_counter() - t0
        q = open_queue(url, prefix="b", max_runs=n + 10, retention_s=30 * 86400)  # no sweep at these runs
        await nursery.start(q.run)
        t0 = time.perf_counter()
        first = await q.page(limit=50, status="failed")
        backfill_ms = (time.perf_counter() - t0) * 1000
        assert len(first.runs) == 50
        raw: coredis.Redis[str] = coredis.Redis.from_url(url, decode_responses=True)
        async with raw:
            out = await _time_pages(q, oldest, raw)
        nursery.cancel_scope.cancel()
    return filled, backfill_ms, out


def test_the_runs_list_with_100000_runs_on_redis_answers_a_page_in_milliseconds(benchmark, tmp_path):
    n = 5_000 if getattr(benchmark, "disabled", True) else 100_000
    result: list[Timed] = []
    first: list[float] = []

    def run() -> None:
        filled, backfill_ms, pages = trio.run(_redis_pages, tmp_path, n)
        result[:] = pages
        first[:] = [filled, backfill_ms]

    benchmark.pedantic(run, rounds=1, iterations=1)
    print(f"\n{n} runs written in {first[0]:.1f} s; the first page, making the facets of them all: {first[1]:.0f} ms;"
          f" load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    benchmark.extra_info["first page (facets made)"] = round(first[1], 1)
    _report(benchmark, f"{n} runs in the Redis queue", result)
