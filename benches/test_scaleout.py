"""Scale-out benchmarks, ratios measured side by side in one run (figures in docs/performance.md):

- ``mcpipe serve --workers 2`` against ``--workers 1``: 16 raw-HTTP clients calling a 5-step ``mcp_pipe``;
- 2025-11-25 ``tools/call`` on an established session: server CPU per call on the lean path against the
  SDK's path;
- metrics and tracing on (spans into a provider with no exporter) against both off: server CPU per call.

    pytest benches/test_scaleout.py --benchmark-enable --benchmark-only -s    # for real, with the tables

Under the default ``--benchmark-disable`` each test runs once, on a few hundred calls, as a smoke test.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import orjson
import trio

from server_load import (
    HERE,
    Blast,
    Load,
    median_cpu_ratio,
    run_blast,
    run_load,
    server_process,
    tools_call,
    tree_cpu_seconds,
)
from test_server import _calls, _chain, _table

PIPE = tools_call("mcp_pipe", _chain(5))
LEGACY = "2025-11-25"


ROUNDS = 7
"""Variants compared on CPU per call are loaded in turn, this many rounds each; the ratio is the median of
the rounds' ratios (robust to the machine's load drifting between rounds), the figures per variant its best
round."""


def _best(loads: list[Load]) -> Load:
    return min(loads, key=lambda load: load.cpu_ms_per_call)


def test_a_round_whose_base_counted_no_cpu_is_left_out_of_the_median_ratio():
    # A smoke round of a few calls can finish inside one 10 ms tick of /proc: its base's CPU reads 0.
    loads = [Load(100, 1.0, 0.02), Load(100, 1.0, 0.03), Load(100, 1.0, 0.01)]
    base = [Load(100, 1.0, 0.0), Load(100, 1.0, 0.01), Load(100, 1.0, 0.02)]
    assert math.isclose(median_cpu_ratio(loads, base), statistics.median([3.0, 0.5]))
    assert math.isnan(median_cpu_ratio(loads[:1], base[:1]))


@asynccontextmanager
async def mcpipe_serve(tmp: Path, workers: int) -> AsyncIterator[tuple[str, int]]:
    """``mcpipe serve --workers N`` on a free port with the benchmark's tools; yields (URL, pid)."""
    config = tmp / f"bench-{workers}.json"
    doc = {"python_tools": ["server_load:bench_tools"], "builtins": False, "audit": {"enabled": False}}
    config.write_text(json.dumps(doc))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    args = [sys.executable, "-m", "mcpipe", "serve", "--config", str(config), "--http", "127.0.0.1:0"]
    args += ["--workers", str(workers), "--log-level", "info"]
    proc = await trio.lowlevel.open_process(args, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    log = b""
    ready = 1 if workers == 1 else workers + 1  # the supervisor's line, then each worker's
    try:
        with trio.fail_after(60):
            while log.count(b"serving MCP at ") < ready or not log.endswith(b"\n"):
                chunk = await proc.stderr.receive_some()
                if not chunk:
                    raise RuntimeError(f"mcpipe serve exited: {log.decode(errors='replace')}")
                log += chunk
        url = log.split(b"serving MCP at ", 1)[1].split()[0].decode()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_drain, proc.stderr)
            yield url, proc.pid
            proc.terminate()
            with trio.fail_after(60):
                await proc.wait()
            nursery.cancel_scope.cancel()
    finally:
        if proc.returncode is None:
            proc.kill()


async def _drain(stream: trio.abc.ReceiveStream) -> None:
    async for _ in stream:
        pass


WORKER_CLIENTS = 16
WORKERS_BUDGET_S = 40.0
"""No new round of the workers comparison starts after this long (servers' start not counted)."""


async def _workers(calls: int, tmp: Path) -> tuple[dict[int, list[Blast]], list[float]]:
    """Both servers up at once, loaded in turn (:data:`ROUNDS` rounds after one warm-up round each), so the
    machine's load drifting between rounds falls on both alike. The load is :func:`server_load.blast`: one
    thread driving raw sockets, whose own CPU per call is measured (it competes with the workers for the
    same cores, so it must stay small against the server's). Answers the rounds and the 1-minute load
    averages seen before each round."""
    rounds: dict[int, list[Blast]] = {1: [], 2: []}
    loadavg: list[float] = []
    per_round = max(64, 2 * calls // ROUNDS)  # about a second per round on a quiet 2-core machine
    async with mcpipe_serve(tmp, 1) as (url1, pid1), mcpipe_serve(tmp, 2) as (url2, pid2):
        served = ((1, url1, pid1), (2, url2, pid2))
        start = time.perf_counter()
        for _, url, pid in served:  # warm-up: every worker's imports, caches, first-call paths
            await run_blast(url, pid, PIPE, clients=WORKER_CLIENTS, calls=per_round // 2, check=b'"ok":true')
        for n in range(ROUNDS):
            if n >= 3 and time.perf_counter() - start > WORKERS_BUDGET_S:
                break  # a loaded machine: fewer rounds, so the run stays under a minute
            loadavg.append(os.getloadavg()[0])
            for workers, url, pid in served:
                load = await run_blast(
                    url, pid, PIPE, clients=WORKER_CLIENTS, calls=per_round, check=b'"ok":true', cpu=tree_cpu_seconds
                )
                rounds[workers].append(load)
    return rounds, loadavg


def test_two_workers_serve_more_pipeline_calls_per_second_than_one(benchmark, tmp_path):
    calls = _calls(benchmark)
    result: dict[int, list[Blast]] = {}
    loadavg: list[float] = []

    def run() -> None:
        rounds, seen = trio.run(_workers, calls, tmp_path)
        result.update(rounds)
        loadavg.extend(seen)

    started = time.perf_counter()
    benchmark.pedantic(run, rounds=1, iterations=1)
    took = time.perf_counter() - started
    ratios = [two.calls_per_s / one.calls_per_s for one, two in zip(result[1], result[2], strict=True)]
    ratio = statistics.median(ratios)
    rows = [("workers", "clients", "calls/s (median)", "server CPU ms/call", "load generator CPU ms/call")]
    for w, loads in result.items():
        rows.append(
            (
                str(w),
                str(WORKER_CLIENTS),
                f"{statistics.median(load.calls_per_s for load in loads):.0f}",
                f"{statistics.median(load.cpu_ms_per_call for load in loads):.3f}",
                f"{statistics.median(load.client_cpu_ms_per_call for load in loads):.3f}",
            )
        )
        benchmark.extra_info[f"workers{w}_calls_per_s"] = round(statistics.median(x.calls_per_s for x in loads), 1)
    benchmark.extra_info["ratio"] = round(ratio, 2)
    benchmark.extra_info["ratios"] = [round(r, 2) for r in ratios]
    benchmark.extra_info["loadavg"] = [round(x, 2) for x in loadavg]
    print("\n" + _table(rows))
    print("per-round ratios: " + ", ".join(f"{r:.2f}" for r in ratios))
    print("1-minute load average before each round: " + ", ".join(f"{x:.2f}" for x in loadavg))
    print(
        f"SUMMARY --workers 2 vs --workers 1: {ratio:.2f}x calls/s (median of {len(ratios)} rounds, "
        f"min {min(ratios):.2f}, max {max(ratios):.2f}; target >= 1.6), {os.cpu_count()} CPUs, "
        f"load average {min(loadavg):.2f}-{max(loadavg):.2f}, took {took:.0f} s"
    )
    assert all(load.calls > 0 for loads in result.values() for load in loads)


def legacy_request(url: str, sid: str, body: bytes) -> bytes:
    hostport, _, path = url.removeprefix("http://").partition("/")
    head = (
        f"POST /{path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {LEGACY}\r\n"
        f"Mcp-Session-Id: {sid}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def legacy_session(url: str) -> str:
    """Open a 2025-11-25 session (initialize, initialized, tools/list); answers its id."""
    base = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    init = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}
    async with httpx2.AsyncClient() as http:
        r = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}, headers=base)
        sid = r.headers["mcp-session-id"]
        hdrs = {**base, "mcp-session-id": sid, "mcp-protocol-version": LEGACY}
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=hdrs)
        await http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=hdrs)
    return sid


async def _interleaved(
    variants: dict[str, str], body: bytes, calls: int, check: bytes, legacy: bool = False
) -> dict[str, list[Load]]:
    """Start one mcpipe server per variant, then load them in turn, :data:`ROUNDS` rounds of ``calls``."""
    rounds: dict[str, list[Load]] = {label: [] for label in variants}
    async with AsyncExitStack() as stack:
        served = {}
        for label, variant in variants.items():
            url, pid = await stack.enter_async_context(server_process("mcpipe", os.devnull, variant))
            # One session per client: a session's requests in flight need ids of their own.
            requests = [legacy_request(url, await legacy_session(url), body) for _ in range(8)] if legacy else None
            served[label] = (url, pid, requests)
        for _ in range(ROUNDS):
            for label, (url, pid, requests) in served.items():
                load = await run_load(url, pid, body, clients=8, calls=calls, check=check, request=requests)
                rounds[label].append(load)
    return rounds


async def _legacy(calls: int) -> dict[str, list[Load]]:
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "ping", "arguments": {"text": "hi"}}}
    variants = {"SDK path": "sdk-path", "lean path": ""}
    return await _interleaved(variants, orjson.dumps(call), max(50, calls // ROUNDS), b'"hi"', legacy=True)


def _compare(result: dict[str, list[Load]], base: str, title: str, benchmark: object) -> dict[str, float]:
    """Print the best round of each variant and the median ratio of its CPU per call to ``base``'s."""
    ratios = {label: median_cpu_ratio(loads, result[base]) for label, loads in result.items()}
    rows = [(title, "calls/s (best round)", "server CPU ms/call (best round)", f"CPU vs {base} (median of rounds)")]
    for label, loads in result.items():
        best = _best(loads)
        rows.append((label, f"{best.calls_per_s:.0f}", f"{best.cpu_ms_per_call:.3f}", f"{ratios[label]:.3f}"))
        benchmark.extra_info[f"{label}_cpu_ratio"] = round(ratios[label], 3)  # type: ignore[attr-defined]
    print("\n" + _table(rows))
    return ratios


def test_the_lean_2025_path_costs_less_server_cpu_than_the_sdk_path(benchmark):
    calls = _calls(benchmark)
    result: dict[str, list[Load]] = {}
    benchmark.pedantic(lambda: result.update(trio.run(_legacy, calls)), rounds=1, iterations=1)
    ratios = _compare(result, "SDK path", "2025-11-25 tools/call", benchmark)
    if not benchmark.disabled:
        assert ratios["lean path"] < 1


async def _telemetry(calls: int) -> dict[str, list[Load]]:
    variants = {
        "off": "bare",
        "metrics": "",
        "metrics + traces (API, no SDK)": "traced",
        "metrics + SDK spans": "recorded",
    }
    return await _interleaved(variants, PIPE, max(50, calls // ROUNDS), b'"ok":true')


SDK_OBJECTS = "metrics + SDK spans, the SDK's span objects"
"""The in-process variant that makes the SDK record mcpipe's spans itself (a processor that looks at span
starts), for comparison: what recorded spans cost before mcpipe's recorder."""


def _watches_starts() -> Any:
    from opentelemetry.sdk.trace import SpanProcessor

    class WatchesStarts(SpanProcessor):
        def on_start(self, span: Any, parent_context: Any = None) -> None:
            pass

    return WatchesStarts()


async def _telemetry_in_process(rounds: int, calls: int) -> dict[str, list[float]]:
    """CPU microseconds per ``mcp_pipe`` call through the handlers (no HTTP), per telemetry variant,
    interleaved: the telemetry's own cost, without the transport's noise around it."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from mcpipe import telemetry
    from mcpipe.config import parse_config
    from mcpipe.server import open_app
    from mcpipe.tools import ToolContext

    doc = {"python_tools": ["server_load:bench_tools"], "builtins": False, "audit": {"enabled": False}}
    spec = _chain(5)
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"  # every call continues a caller's trace
    watched = TracerProvider()
    watched.add_span_processor(_watches_starts())
    async with open_app(parse_config(json.dumps(doc), "json")) as app:
        current = telemetry.current()
        known = current.known if current is not None else None
        variants = {
            "off": None,
            "metrics": telemetry.Telemetry(known=known),
            "metrics + traces (API, no SDK)": telemetry.Telemetry(known=known, tracer=trace.get_tracer("bench")),
            "metrics + SDK spans": telemetry.Telemetry(known=known, tracer_provider=TracerProvider()),
            SDK_OBJECTS: telemetry.Telemetry(known=known, tracer_provider=watched),
        }
        out: dict[str, list[float]] = {label: [] for label in variants}
        try:
            for _ in range(rounds):
                for label, tel in variants.items():
                    telemetry.install(tel)
                    t0 = time.process_time()
                    for _ in range(calls):
                        await app.handlers.call("mcp_pipe", spec, ToolContext(request_id="1", traceparent=parent))
                    out[label].append((time.process_time() - t0) / calls * 1e6)
        finally:
            telemetry.install(current)
    return out


def test_metrics_and_traces_cost_little_cpu_per_call(benchmark):
    calls = _calls(benchmark)
    result: dict[str, list[Load]] = {}
    benchmark.pedantic(lambda: result.update(trio.run(_telemetry, calls)), rounds=1, iterations=1)
    _compare(result, "off", "5-step mcp_pipe, telemetry", benchmark)
    assert all(load.calls > 0 for loads in result.values() for load in loads)
    # The same variants in process: what telemetry adds per call, against the server's CPU per call.
    micro = trio.run(_telemetry_in_process, 61 if not benchmark.disabled else 1, 60 if not benchmark.disabled else 20)
    server_us = _best(result["off"]).cpu_ms_per_call * 1000
    rows = [
        ("in process", "CPU us/call (best)", "added (best)", "added (median)", "added (best) / server CPU per call")
    ]
    for label, samples in micro.items():
        added = statistics.median(a - b for a, b in zip(samples, micro["off"], strict=True))
        best = min(samples) - min(micro["off"])
        rows.append((label, f"{min(samples):.1f}", f"{best:.1f}", f"{added:.1f}", f"{best / server_us:.1%}"))
        benchmark.extra_info[f"{label}_added_us"] = round(added, 1)
        benchmark.extra_info[f"{label}_added_best_us"] = round(best, 1)
    print("\n" + _table(rows))
    load = os.getloadavg()[0]
    print(f"server CPU per call over HTTP (off, best round): {server_us:.0f} us; 1-minute load average {load:.2f}")
