"""Scheduler overhead: pipelines of no-op async tools against calling the same tools directly.

Each benchmarked call is one ``trio.run`` doing the work ``REPEAT`` times, so trio's start-up is shared
out; divide by ``REPEAT`` for one pipeline. Pairs in one group compare side by side:

    pytest benches/test_scheduler.py --benchmark-enable --benchmark-only

Targets (issue 3): under 25 us of overhead per sequential step; the 50-step pipeline within 3x of the
plain loop; 8 parallel tools that each wait 50 ms in about 50 ms.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio

from mcpipe.runtime import run_pipeline
from mcpipe.tools import ToolContext, ToolRegistry

REPEAT = 20
STEPS = 50
WIDTH = 8

registry = ToolRegistry()


@registry.tool
async def noop(i: int = 0) -> dict[str, Any]:
    """Do nothing, asynchronously."""
    return {"i": i}


@registry.tool
async def nap(ms: float, i: int = 0) -> dict[str, Any]:
    """Wait ``ms`` milliseconds."""
    await trio.sleep(ms / 1000)
    return {"i": i}


SEQUENTIAL = {"steps": [{"tool": "noop", "args": {"i": i}} for i in range(STEPS)]}
# The same 50 steps, each passing the previous step's output on: the resolver at work too.
CHAINED = {
    "steps": [
        {"tool": "noop", "args": {"i": 0}},
        *({"tool": "noop", "args": {"i": {"$ref": "last.structured.i"}}} for _ in range(STEPS - 1)),
    ]
}
PARALLEL = {"steps": [{"id": "g", "parallel": [{"tool": "noop", "args": {"i": i}} for i in range(WIDTH)]}]}
WAITING = {"steps": [{"id": "g", "parallel": [{"tool": "nap", "args": {"ms": 50, "i": i}} for i in range(WIDTH)]}]}


def run_spec(spec: dict[str, Any], repeat: int = REPEAT) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        for _ in range(repeat):
            answer = await run_pipeline(spec, registry)
        return answer

    answer = trio.run(main)
    assert answer["ok"], answer["error"]
    return answer


def direct_loop() -> None:
    async def main() -> None:
        ctx = ToolContext()
        for _ in range(REPEAT):
            for i in range(STEPS):
                await registry.call("noop", {"i": i}, ctx)

    trio.run(main)


def direct_nursery(tool: str, args: Any, repeat: int = REPEAT) -> None:
    async def main() -> None:
        ctx = ToolContext()
        for _ in range(repeat):
            async with trio.open_nursery() as nursery:
                for i in range(WIDTH):
                    nursery.start_soon(registry.call, tool, {**args, "i": i}, ctx)

    trio.run(main)


@pytest.mark.benchmark(group="scheduler: 50 sequential no-op steps (x20 per round)")
def test_bench_direct_loop_of_50_calls(benchmark):
    benchmark(direct_loop)


@pytest.mark.benchmark(group="scheduler: 50 sequential no-op steps (x20 per round)")
def test_bench_pipeline_of_50_sequential_steps(benchmark):
    answer = benchmark(run_spec, SEQUENTIAL)
    assert answer["summary"]["succeeded"] == STEPS


@pytest.mark.benchmark(group="scheduler: 50 sequential no-op steps (x20 per round)")
def test_bench_pipeline_of_50_chained_steps(benchmark):
    answer = benchmark(run_spec, CHAINED)
    assert answer["result"] == {"i": 0}


@pytest.mark.benchmark(group="scheduler: parallel group of 8 no-op steps (x20 per round)")
def test_bench_direct_nursery_of_8_calls(benchmark):
    benchmark(direct_nursery, "noop", {})


@pytest.mark.benchmark(group="scheduler: parallel group of 8 no-op steps (x20 per round)")
def test_bench_pipeline_with_a_parallel_group_of_8(benchmark):
    answer = benchmark(run_spec, PARALLEL)
    assert answer["summary"]["succeeded"] == WIDTH


@pytest.mark.benchmark(group="scheduler: 8 tools waiting 50 ms in parallel (x1 per round)")
def test_bench_direct_nursery_of_8_waits(benchmark):
    benchmark.pedantic(direct_nursery, args=("nap", {"ms": 50}, 1), rounds=10, iterations=1)


@pytest.mark.benchmark(group="scheduler: 8 tools waiting 50 ms in parallel (x1 per round)")
def test_bench_pipeline_of_8_parallel_waits_takes_about_50_ms(benchmark):
    t0 = time.perf_counter()
    answer = benchmark.pedantic(run_spec, args=(WAITING, 1), rounds=10, iterations=1)
    assert answer["summary"]["succeeded"] == WIDTH
    # One round in the smoke run, ten when benchmarking: either way far from 8 x 50 ms per round.
    rounds = 1 if benchmark.disabled else 10
    assert (time.perf_counter() - t0) / rounds < 0.2


# --- for_each (issue 17): one step over 100 items against the same 100 calls in a nursery ---

ITEMS = 100
FOR_EACH = {
    "vars": {"xs": list(range(ITEMS))},
    "steps": [{"id": "each", "for_each": "${vars.xs}", "step": {"tool": "noop", "args": {"i": "${item}"}}}],
}


def direct_nursery_of_items(repeat: int = REPEAT) -> None:
    async def main() -> None:
        ctx = ToolContext()
        for _ in range(repeat):
            async with trio.open_nursery() as nursery:
                for i in range(ITEMS):
                    nursery.start_soon(registry.call, "noop", {"i": i}, ctx)

    trio.run(main)


@pytest.mark.benchmark(group="scheduler: 100 no-op calls, for_each vs a nursery (x20 per round)")
def test_bench_direct_nursery_of_100_calls(benchmark):
    benchmark(direct_nursery_of_items)


@pytest.mark.benchmark(group="scheduler: 100 no-op calls, for_each vs a nursery (x20 per round)")
def test_bench_for_each_over_100_items(benchmark):
    answer = benchmark(run_spec, FOR_EACH)
    assert answer["result"] == [{"i": i} for i in range(ITEMS)]
