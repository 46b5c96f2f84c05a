"""Hostile input costs what its limits allow (issue 9), side by side in one run:

    pytest benches/test_hostile.py --benchmark-enable --benchmark-only

- compiling is linear: 1000 and 4000 steps (the limit raised) compile in a ratio of about 4, not 16;
- a spec past the step limit is refused in about the time of a small one: 5000 steps, 20 000 parallel
  children, against a 5-step spec (all cold: the cache is cleared each round);
- the stdio line reader: one 8 MiB line through the SDK's reader, through ``LineChunks``.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import pytest
import trio
from anyio.streams.text import TextReceiveStream

from mcpipe.compile import Limits, clear_cache, compile_spec
from mcpipe.downstream import LineChunks
from mcpipe.errors import SpecError

BIG = Limits(max_steps=10_000)


def steps(n: int) -> dict[str, Any]:
    return {"steps": [{"tool": "echo", "args": {"i": i, "prev": "${last.output}" if i else None}} for i in range(n)]}


def cold(spec: Any, limits: Limits | None = None) -> Any:
    clear_cache()
    try:
        return compile_spec(spec, limits=limits)
    except SpecError as e:
        return e


@pytest.mark.benchmark(group="hostile: compiling is linear in the step count")
@pytest.mark.parametrize("n", [1000, 4000])
def test_bench_compile_steps(benchmark, n):
    spec = steps(n)
    compiled = benchmark(cold, spec, BIG)
    assert compiled.step_count == n


@pytest.mark.benchmark(group="hostile: refusing a spec past the step limit")
@pytest.mark.parametrize(
    ("label", "spec"),
    [
        ("5 steps (compiled)", steps(5)),
        ("5000 steps", {"steps": [{"tool": "echo"}] * 5000}),
        ("20000 parallel children", {"steps": [{"parallel": [{"tool": "echo"}] * 20_000}]}),
    ],
)
def test_bench_refuse_oversized(benchmark, label, spec):
    benchmark(cold, spec)


LINE = 8 * 1024 * 1024


async def read_line(stream_type: type[TextReceiveStream]) -> int:
    """What the SDK's stdout reader does, over a real pipe from a child writing one long line."""
    code = f"import sys; sys.stdout.write('x' * {LINE} + '\\n'); sys.stdout.flush()"
    proc = await anyio.open_process([sys.executable, "-c", code])
    assert proc.stdout is not None
    buffer, total = "", 0
    async for chunk in stream_type(proc.stdout):
        lines = (buffer + chunk).split("\n")
        buffer = lines.pop()
        total += sum(len(line) for line in lines)
    await proc.wait()
    return total


@pytest.mark.benchmark(group="hostile: one 8 MiB line from a stdio downstream")
@pytest.mark.parametrize("stream_type", [TextReceiveStream, LineChunks], ids=["sdk reader", "LineChunks"])
def test_bench_stdio_line(benchmark, stream_type):
    total = benchmark.pedantic(trio.run, args=(read_line, stream_type), rounds=3, iterations=1)
    assert total == LINE
