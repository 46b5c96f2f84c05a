"""python steps' overhead: a declared pipeline of 10 python steps (each its own sandbox worker) against the
same 10 functions called in process (issues 22 and 32).

Each step runs ``def main(x): return {"x": x + 1, ...}`` on the previous step's output; in process, the same
code (compiled once) is called 10 times in a row. The difference, over 10, is what a python step costs beyond
its code: a fresh worker (forked warm by the sandbox's fork server: a uid, a PID namespace and a ``/proc`` of
its own), the request and the reply over a socket, the limits, the worker killed, and the step's own
scheduling. "ten warm workers" keeps as many spares as the pipeline has steps (one call a round, the spares
forked again between rounds: the figure of a step that finds a warm worker); the default keeps 2, which a
30-step round uses up, so most of its steps wait for a fork; ``fork_server=False`` keeps none.

    pytest benches/test_python_steps.py --benchmark-enable --benchmark-only

Under the default ``--benchmark-disable`` each runs once, as a smoke test.

**A/B against another tree**, interleaved in one run: with ``MCPIPE_BASELINE_PYTHON`` set to the interpreter
of another checkout (main's ``.venv/bin/python``, say), ``test_python_steps_side_by_side_with_a_baseline``
runs ``benches/python_step_probe.py`` in that interpreter and in this one by turns (``AB_ROUNDS`` turns each,
default 6), prints the median per step of each with the machine's load average at the start and the end,
and the ratio of the two::

    MCPIPE_BASELINE_PYTHON=/work/main/.venv/bin/python pytest benches/test_python_steps.py -k side_by_side -s

**Reuse** (``outbound.python.reuse: run``, issue 32): with ``MCPIPE_AB_REUSE=1``,
``test_python_steps_reusing_the_runs_worker_side_by_side_with_a_fresh_worker_per_step`` runs the probe in
this tree with a fresh worker per step and with the run's worker reused, by turns.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpipe.tools import ToolContext, ToolRegistry
from python_step_probe import CODE, STEPS, pipeline

REPEAT = 3


def run_pipeline(tool: Any, repeat: int = REPEAT) -> None:
    async def main() -> None:
        ctx = ToolContext(tools=ToolRegistry())
        for _ in range(repeat):
            result = await tool.call({"x": 1, "label": "bench"}, ctx)
            assert not result.is_error, result.content
            assert result.structured["x"] == 1 + STEPS

    trio.run(main)


def run_in_process() -> None:
    namespace: dict[str, Any] = {}
    exec(compile(CODE, "<python step>", "exec"), namespace)
    main = namespace["main"]
    for _ in range(REPEAT):
        out = {"x": 1, "label": "bench"}
        for _ in range(STEPS):
            out = main(out["x"], out["label"])
        assert out["x"] == 1 + STEPS


@pytest.mark.benchmark(group="python-steps")
def test_ten_python_steps_in_worker_processes(benchmark):
    tool = pipeline(fork_server=True)
    run_pipeline(tool, 1)  # the fork server starts
    benchmark.pedantic(run_pipeline, args=(tool,), rounds=5, iterations=1)


@pytest.mark.benchmark(group="python-steps")
def test_ten_python_steps_with_ten_warm_workers(benchmark):
    tool = pipeline(fork_server=True, prefork=STEPS)
    run_pipeline(tool, 1)
    benchmark.pedantic(run_pipeline, args=(tool, 1), rounds=15, iterations=1, warmup_rounds=1)


@pytest.mark.benchmark(group="python-steps")
def test_ten_python_steps_each_waiting_for_its_own_fork(benchmark):
    tool = pipeline(fork_server=False)
    run_pipeline(tool, 1)
    benchmark.pedantic(run_pipeline, args=(tool,), rounds=5, iterations=1)


@pytest.mark.benchmark(group="python-steps")
def test_ten_python_steps_reusing_the_runs_worker(benchmark):
    tool = pipeline(fork_server=True, reuse="run")
    run_pipeline(tool, 1)
    benchmark.pedantic(run_pipeline, args=(tool, 1), rounds=15, iterations=1, warmup_rounds=1)


@pytest.mark.benchmark(group="python-steps")
def test_the_same_ten_functions_called_in_process(benchmark):
    benchmark(run_in_process)


PROBE = Path(__file__).with_name("python_step_probe.py")


def _probe(python: str, prefork: int, rounds: int = 8, reuse: str = "step") -> dict[str, Any]:
    argv = [python, str(PROBE), str(rounds), str(prefork), reuse]
    done = subprocess.run(argv, capture_output=True, timeout=300, check=True)
    return dict(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.skipif(not os.environ.get("MCPIPE_AB_REUSE"), reason="MCPIPE_AB_REUSE is not set")
def test_python_steps_reusing_the_runs_worker_side_by_side_with_a_fresh_worker_per_step():
    """``outbound.python.reuse`` ``step`` (the default) against ``run``, in this tree, by turns (``AB_ROUNDS``
    each, default 6), 10 warm spares and 2: the median per step, its CPU, and the ratio."""
    turns = int(os.environ.get("AB_ROUNDS", "6"))
    for prefork in (10, 2):
        load0 = os.getloadavg()[0]
        times: dict[str, list[float]] = {"step": [], "run": []}
        cpu: dict[str, list[float]] = {"step": [], "run": []}
        for turn in range(turns):
            for reuse in ("step", "run") if turn % 2 == 0 else ("run", "step"):
                got = _probe(sys.executable, prefork, reuse=reuse)
                times[reuse] += got["per_step_ms"]
                cpu[reuse].append(got["cpu_ms_per_step"]["server"] + got["cpu_ms_per_step"]["fork_server"])
        load1 = os.getloadavg()[0]
        print(f"\nprefork {prefork}, load {load0:.1f} -> {load1:.1f}")
        for reuse, values in times.items():
            v = sorted(values)
            print(
                f"  reuse {reuse:4s} per step: best {v[0]:.2f} ms, median {statistics.median(v):.2f} ms, p90 "
                f"{v[int(len(v) * 0.9)]:.2f} ms, CPU {statistics.median(cpu[reuse]):.2f} ms ({len(v)} of 10 steps)"
            )
        ratio = statistics.median(times["run"]) / statistics.median(times["step"])
        print(f"  run / step (medians): {ratio:.2f}")


@pytest.mark.skipif(not os.environ.get("MCPIPE_BASELINE_PYTHON"), reason="MCPIPE_BASELINE_PYTHON is not set")
def test_python_steps_side_by_side_with_a_baseline():
    baseline = os.environ["MCPIPE_BASELINE_PYTHON"]
    turns = int(os.environ.get("AB_ROUNDS", "6"))
    for prefork in (10, 2):
        load0 = os.getloadavg()[0]
        times: dict[str, list[float]] = {"baseline": [], "this tree": []}
        in_process: list[float] = []
        for _ in range(turns):
            for name, python in (("baseline", baseline), ("this tree", sys.executable)):
                got = _probe(python, prefork)
                times[name] += got["per_step_ms"]
                in_process.append(got["in_process_us"])
        load1 = os.getloadavg()[0]
        base, new = (statistics.median(times[k]) for k in ("baseline", "this tree"))
        inproc = statistics.median(in_process)
        print(f"\nprefork {prefork}, load {load0:.1f} -> {load1:.1f}, in process {inproc:.2f} us per step")
        for name, values in times.items():
            v = sorted(values)
            print(
                f"  {name:10s} per step: best {v[0]:.2f} ms, median {statistics.median(v):.2f} ms, p90 "
                f"{v[int(len(v) * 0.9)]:.2f} ms ({len(v)} calls of 10 steps)"
            )
        print(f"  this tree / baseline (medians): {new / base:.2f}")
