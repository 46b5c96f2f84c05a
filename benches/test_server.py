"""Server benchmarks: mcpipe vs the SDK's MCPServer on hypercorn's trio worker, and one mcp_pipe call vs
the same calls one by one. Ratios are measured side by side in one run.

    pytest benches/test_server.py --benchmark-enable --benchmark-only -s    # for real, with the table

Under the default ``--benchmark-disable`` each test runs once, on a few hundred calls, as a smoke test.
"""

from __future__ import annotations

import time

import orjson
import trio

from server_load import WARMUP, Load, run_load, server_process, tools_call

TRIVIAL = tools_call("ping", {"text": "hi"})


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def _calls(benchmark: object) -> int:
    return 300 if getattr(benchmark, "disabled", True) else 4000


async def _throughput(calls: int, audit: str) -> dict[str, dict[int, Load]]:
    out: dict[str, dict[int, Load]] = {}
    for kind, extra in (("sdk", ()), ("mcpipe", (audit,))):
        async with server_process(kind, *extra) as (url, pid):
            out[kind] = {c: await run_load(url, pid, TRIVIAL, clients=c, calls=calls, check=b'"hi"') for c in (1, 8)}
    return out


def test_trivial_tool_calls_cost_less_server_cpu_on_mcpipe_than_on_the_sdk_mcpserver(benchmark, tmp_path):
    calls = _calls(benchmark)
    result: dict[str, dict[int, Load]] = {}

    def run() -> None:
        result.update(trio.run(_throughput, calls, str(tmp_path / "audit.jsonl")))

    benchmark.pedantic(run, rounds=1, iterations=1)
    rows = [("server", "clients", "calls/s", "server CPU ms/call", "CPU vs SDK")]
    for kind in ("sdk", "mcpipe"):
        for c, load in result[kind].items():
            ratio = load.cpu_ms_per_call / result["sdk"][c].cpu_ms_per_call
            rows.append((kind, str(c), f"{load.calls_per_s:.0f}", f"{load.cpu_ms_per_call:.3f}", f"{ratio:.2f}"))
            benchmark.extra_info[f"{kind}_c{c}_calls_per_s"] = round(load.calls_per_s, 1)
            benchmark.extra_info[f"{kind}_c{c}_cpu_ms_per_call"] = round(load.cpu_ms_per_call, 3)
    print("\n" + _table(rows))
    audited = (tmp_path / "audit.jsonl").read_bytes().count(b"\n")
    answered = sum(load.calls for load in result["mcpipe"].values())
    assert answered > 0 and audited >= answered + 2 * WARMUP  # each answered call (and warm-up) was audited
    if not benchmark.disabled:
        for c in (1, 8):
            assert result["mcpipe"][c].cpu_ms_per_call < result["sdk"][c].cpu_ms_per_call


def _chain(n: int) -> dict[str, object]:
    steps = [{"id": "s1", "tool": "inc", "args": {"n": 0}}]
    steps += [
        {"id": f"s{i}", "tool": "inc", "args": {"n": f"${{steps.s{i - 1}.structured.n}}"}} for i in range(2, n + 1)
    ]
    return {"steps": steps, "return": f"${{steps.s{n}.structured.n}}"}


async def _pipeline_vs_calls(rounds: int, audit: str) -> tuple[float, float]:
    from server_load import _Conn, request_bytes

    async with server_process("mcpipe", audit) as (url, _pid):
        hostport, _, path = url.removeprefix("http://").partition("/")
        host, _, port = hostport.rpartition(":")
        conn = _Conn(host, int(port))

        async def call(name: str, args: dict[str, object]) -> dict[str, object]:
            status, body = await conn.roundtrip(request_bytes(host, int(port), "/" + path, tools_call(name, args)))
            assert status == 200, body
            return orjson.loads(body)["result"]

        async def one_by_one() -> int:
            n = 0
            for _ in range(5):  # each call takes the previous answer, as the pipeline's steps do
                n = (await call("inc", {"n": n}))["structuredContent"]["n"]
            return n

        async def piped() -> int:
            answer = (await call("mcp_pipe", _chain(5)))["structuredContent"]
            assert answer["ok"], answer
            return answer["result"]

        timings = {}
        for fn in (one_by_one, piped) * 2:  # the first round of each warms up
            assert await fn() == 5
            t0 = time.perf_counter()
            for _ in range(rounds):
                await fn()
            timings[fn.__name__] = (time.perf_counter() - t0) / rounds
        await conn.close()
    return timings["one_by_one"], timings["piped"]


def test_a_five_step_pipeline_in_one_call_beats_five_calls_one_by_one(benchmark, tmp_path):
    rounds = 30 if benchmark.disabled else 400
    result: list[float] = []

    def run() -> None:
        result.extend(trio.run(_pipeline_vs_calls, rounds, str(tmp_path / "audit.jsonl")))

    benchmark.pedantic(run, rounds=1, iterations=1)
    calls, piped = result
    speedup = calls / piped
    benchmark.extra_info.update(
        five_calls_ms=round(calls * 1000, 3), one_pipe_ms=round(piped * 1000, 3), speedup=round(speedup, 2)
    )
    header = ("5 calls one by one, ms", "1 mcp_pipe call, ms", "speedup")
    print("\n" + _table([header, (f"{calls * 1000:.2f}", f"{piped * 1000:.2f}", f"{speedup:.2f}x")]))
    if not benchmark.disabled:
        assert speedup >= 3
