"""Resolver benchmarks: ``Template.resolve`` against the oracle and against building the output alone.

For every workload of ``../shared/bench/workloads.py`` three figures sit side by side in one group:

- ``core``: ``mcpipe._core.Template.resolve`` (compiled outside the timed part);
- ``oracle``: the pure-Python oracle's resolve, the obviously-correct baseline;
- ``orjson``: ``orjson.loads(orjson.dumps(x))`` of the resolved output, what it costs just to build the
  output objects.

Run them with ``make bench`` (``pytest benches --benchmark-enable --benchmark-only``); in the normal suite
they run once each as smoke tests. Figures and targets are in docs/performance.md, "Resolver".
"""

from __future__ import annotations

import orjson
import pytest

from mcpipe._core import Template

NAMES = ["seed_example", "wide_args", "large_subtree", "wildcard", "tiny"]

# Warm up before pytest-benchmark calibrates, for all three alike. The first resolve of a template is
# cold (several microseconds: caches, the first allocation of its output); calibrating on it makes the
# fastest functions run one call per round, and then every sample also counts the timer's own ~0.1 us.
pytestmark = pytest.mark.benchmark(warmup=True, warmup_iterations=10_000)


@pytest.mark.parametrize("name", NAMES)
def test_core_resolve(benchmark, workloads, oracle, name):
    template, env = workloads[name]
    t = Template(template)
    benchmark.group = name
    benchmark.name = "core"
    result = benchmark(t.resolve, env)
    assert result == oracle.Template(template).resolve(env)


@pytest.mark.parametrize("name", NAMES)
def test_oracle_resolve(benchmark, workloads, oracle, name):
    template, env = workloads[name]
    t = oracle.Template(template)
    benchmark.group = name
    benchmark.name = "oracle"
    benchmark(t.resolve, env)


@pytest.mark.parametrize("name", NAMES)
def test_orjson_round_trip_of_the_output(benchmark, workloads, name):
    template, env = workloads[name]
    output = Template(template).resolve(env)
    benchmark.group = name
    benchmark.name = "orjson"
    result = benchmark(lambda: orjson.loads(orjson.dumps(output)))
    assert result == output
