"""The killable worker processes' overhead (issue 31): a CEL evaluation that iterates and a fallback pattern
search, each against a warm worker of :mod:`mcpipe._workerpool`.

    pytest benches/test_workers.py --benchmark-enable --benchmark-only

**A/B against another tree**, interleaved in one run: with ``MCPIPE_BASELINE_PYTHON`` set to the interpreter
of another checkout, ``test_workers_side_by_side_with_a_baseline`` runs ``benches/worker_probe.py`` in that
interpreter and in this one by turns (``AB_ROUNDS`` turns each, default 6) and prints the median per call of
each, with the ratio::

    MCPIPE_BASELINE_PYTHON=/work/main/.venv/bin/python pytest benches/test_workers.py -k side_by_side -s
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

from mcpipe._pattern import compile_pattern
from mcpipe.expr._celworker import evaluate_in_worker
from worker_probe import CEL, CONTEXT, PATTERN, TEXT

PROBE = Path(__file__).with_name("worker_probe.py")


@pytest.mark.benchmark(group="workers")
def test_a_cel_evaluation_in_a_warm_worker(benchmark):
    async def evaluate() -> Any:
        return await evaluate_in_worker(CEL, CONTEXT, [], 30.0)

    assert trio.run(evaluate) == {"value": 50}
    assert benchmark(trio.run, evaluate) == {"value": 50}


@pytest.mark.benchmark(group="workers")
def test_a_fallback_pattern_search_in_a_warm_worker(benchmark):
    pattern = compile_pattern(PATTERN)
    assert not pattern.linear
    assert benchmark(pattern.search, TEXT) is True


def _probe(python: str, rounds: int = 40) -> dict[str, Any]:
    done = subprocess.run([python, str(PROBE), str(rounds)], capture_output=True, timeout=300, check=True)
    return dict(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.skipif(not os.environ.get("MCPIPE_BASELINE_PYTHON"), reason="MCPIPE_BASELINE_PYTHON is not set")
def test_workers_side_by_side_with_a_baseline():
    baseline = os.environ["MCPIPE_BASELINE_PYTHON"]
    turns = int(os.environ.get("AB_ROUNDS", "6"))
    load0 = os.getloadavg()[0]
    times: dict[str, dict[str, list[float]]] = {k: {"baseline": [], "this tree": []} for k in ("cel_ms", "pattern_ms")}
    for _ in range(turns):
        for name, python in (("baseline", baseline), ("this tree", sys.executable)):
            got = _probe(python)
            for what in times:
                times[what][name] += got[what]
    load1 = os.getloadavg()[0]
    print(f"\nload {load0:.1f} -> {load1:.1f}")
    for what, by_tree in times.items():
        for name, values in by_tree.items():
            v = sorted(values)
            p90 = v[int(len(v) * 0.9)]
            print(f"  {what} {name:10s}: best {v[0]:.3f}, median {statistics.median(v):.3f}, p90 {p90:.3f}")
        base, new = (statistics.median(by_tree[k]) for k in ("baseline", "this tree"))
        print(f"  {what} this tree / baseline (medians): {new / base:.2f}")
