"""A declared pipeline of 5 value/transform steps vs a hand-written Python tool doing the same work, both
served over streamable HTTP by the same server process (issue 5; target: within 1.5x).

The load is ``server_load``'s raw HTTP/1.1 client (one pre-encoded 2026-07-28 ``tools/call``), so the
figures are the server's: its CPU per call, read from ``/proc``, and calls per second from one client.

    pytest benches/test_declared.py --benchmark-enable --benchmark-only -s    # for real, with the table
    python benches/test_declared.py                                           # serve; prints the MCP URL

Under the default ``--benchmark-disable`` the test runs once, on a few hundred calls, as a smoke test.
"""

from __future__ import annotations

import json
import sys
from contextlib import AbstractAsyncContextManager
from functools import partial
from pathlib import Path
from typing import Any

import trio

from mcpipe.tools import ToolRegistry

HERE = Path(__file__).parent

bench_tools = ToolRegistry()


@bench_tools.tool
def totals_python(x: float, y: float, label: str) -> dict[str, Any]:
    """The five steps' work, by hand: pair the inputs, add, label, double, answer."""
    pair = {"a": x, "b": y}
    total = pair["a"] + pair["b"]
    labelled = {"sum": total, "label": label}
    doubled = labelled["sum"] * 2.0
    return {"total": doubled, "label": labelled["label"]}


@bench_tools.tool
async def totals_python_async(x: float, y: float, label: str) -> dict[str, Any]:
    """The same work as an async function: served like the declared pipeline, with the server's watch for
    the client leaving (a synchronous tool runs inline, without it)."""
    pair = {"a": x, "b": y}
    total = pair["a"] + pair["b"]
    labelled = {"sum": total, "label": label}
    doubled = labelled["sum"] * 2.0
    return {"total": doubled, "label": labelled["label"]}


PIPELINE = {
    "name": "totals_declared",
    "description": "The same work as totals_python, as 5 declared steps.",
    "input_schema": {
        "type": "object",
        "properties": {"x": {"type": "number"}, "y": {"type": "number"}, "label": {"type": "string"}},
        "required": ["x", "y", "label"],
    },
    "steps": [
        {"kind": "value", "id": "pair", "value": {"a": "${args.x}", "b": "${args.y}"}},
        {"kind": "transform", "id": "total", "expression": "steps.pair.output.a + steps.pair.output.b"},
        {"kind": "value", "id": "labelled", "value": {"sum": "${steps.total.output}", "label": "${args.label}"}},
        {"kind": "transform", "id": "doubled", "expression": "steps.labelled.output.sum * 2.0"},
        {"kind": "value", "id": "answer", "value": {"total": "${steps.doubled.output}", "label": "${args.label}"}},
    ],
}
ARGS = {"x": 1.5, "y": 2.5, "label": "bench"}
EXPECTED = b'{"total":8.0,"label":"bench"}'


async def _serve() -> None:
    """Serve both tools on one server (declared pipelines through the config hook when the server has it)."""
    from mcpipe.config import Config, parse_config
    from mcpipe.declared import KnownTools, load_declared
    from mcpipe.server import open_app, serve_http
    from server_load import as_served

    doc: dict[str, Any] = {"python_tools": ["test_declared:bench_tools"], "builtins": False}
    doc["audit"] = {"enabled": False}
    extra = []
    if "pipelines" in Config.__struct_fields__:
        doc["pipelines"] = [PIPELINE]
    else:
        declared, problems = load_declared([PIPELINE], tools=KnownTools(bench_tools))
        assert not problems, problems
        extra.append(declared)
    config = parse_config(json.dumps(doc), "json")
    async with open_app(config, extra_sources=extra) as app, trio.open_nursery() as nursery:
        as_served()
        for source in extra:
            source.bind(app.gateway)
        url = await nursery.start(partial(serve_http, app, host="127.0.0.1", port=0))
        print(url, flush=True)


def _server() -> AbstractAsyncContextManager[tuple[str, int]]:
    from server_load import url_server

    return url_server([__file__], "benchmark server", stderr=None)


async def _compare(calls: int, rounds: int) -> dict[str, list[Any]]:
    from server_load import run_load, tools_call

    out: dict[str, list[Any]] = {"totals_python": [], "totals_python_async": [], "totals_declared": []}
    async with _server() as (url, pid):
        for name in out:  # warm up both (first-call imports, caches)
            await run_load(url, pid, tools_call(name, ARGS), clients=1, calls=50, check=EXPECTED)
        for _ in range(rounds):  # interleaved, so drift in the machine's load hits both alike
            for name in out:
                out[name].append(
                    await run_load(url, pid, tools_call(name, ARGS), clients=1, calls=calls, check=EXPECTED)
                )
    return out


def test_a_declared_pipeline_of_5_value_and_transform_steps_vs_the_same_work_in_python(benchmark):
    sys.path.insert(0, str(HERE))
    smoke = getattr(benchmark, "disabled", True)
    calls, rounds = (200, 1) if smoke else (1500, 9)
    result: dict[str, list[Any]] = {}

    def run() -> None:
        result.update(trio.run(_compare, calls, rounds))

    benchmark.pedantic(run, rounds=1, iterations=1)
    # Each round measures the three side by side; the median of the rounds' ratios is robust to the rest of
    # the machine's load drifting between rounds (figures per tool: the best round).
    cpu = {name: min(load.cpu_ms_per_call for load in loads) for name, loads in result.items()}
    rate = {name: max(load.calls_per_s for load in loads) for name, loads in result.items()}

    from server_load import median_cpu_ratio

    declared = result["totals_declared"]
    ratio = median_cpu_ratio(declared, result["totals_python"])
    ratio_async = median_cpu_ratio(declared, result["totals_python_async"])
    print()
    for name in result:
        print(f"{name:20s} server CPU {cpu[name]:.3f} ms/call, {rate[name]:.0f} calls/s (1 client)")
    print(f"declared / python: {ratio:.2f}x; declared / async python: {ratio_async:.2f}x (medians of {rounds} rounds)")
    benchmark.extra_info.update({f"cpu_ms_{name}": round(v, 3) for name, v in cpu.items()})
    benchmark.extra_info.update(ratio=round(ratio, 3), ratio_async=round(ratio_async, 3))
    if not smoke:
        assert ratio < 1.5


if __name__ == "__main__":
    import logging

    logging.disable(logging.WARNING)
    trio.run(_serve)
