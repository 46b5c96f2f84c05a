"""Expressions a caller reaches run under the expression deadline, off the event loop (issue 20, point 1):
attacks over HTTP on a real ``mcpipe serve``, ``/healthz`` probed while they run."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import trio

from kit.attack import TESTS, served, write_config
from mcpipe.gateway import PIPE_TOOL

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

QUADRATIC = "vars.x.map(i, vars.x.filter(j, j == i).size()).size() > 0"
"""The issue's ``when``: 8000 ints froze /healthz 18 s (20 000: 106 s)."""


def quadratic_when(n: int = 8000) -> dict:
    return {"vars": {"x": list(range(n))}, "steps": [{"tool": "echo", "args": {"a": 1}, "when": QUADRATIC}]}


async def test_a_quadratic_when_times_out_off_the_event_loop_and_healthz_keeps_answering():
    async with served() as server:
        result, slowest = await server.probed(lambda: server.call(PIPE_TOOL, quadratic_when()))
        answer = result["structuredContent"]
        assert answer["error_code"] == "TIMEOUT"
        assert answer["steps"]["step1"]["error"] == "steps[0].when: the CEL expression timed out after 1000 ms"
        assert slowest < server.stall_s, server.health
        alive = await server.call("echo", {"alive": True})
        assert alive["structuredContent"] == {"alive": True}


DECLARED = """
pipe:
  expression_timeout_ms: 2000
outbound:
  expression_max_ms: 2000
pipelines:
  - name: pairs
    steps:
      - kind: transform
        id: t
        expression: "sets.contains(args.x, args.x)"
  - name: shape
    steps:
      - kind: plugin_transform
        id: j
        plugin: jsonata
        config:
          expression: "$count($filter(args.x, function($v) {$count($filter(args.x, function($w) {$w = $v})) > 0}))"
"""


async def test_declared_expressions_over_caller_input_run_off_the_event_loop(tmp_path):
    cases = [
        # sets.contains compares every pair in Python: it ran inline, on the loop, as "not iterating".
        ("pairs", 40_000, "the CEL expression timed out after 2000 ms"),
        # JSONata checked its own deadline, but on the event loop: the loop stood still until then.
        ("shape", 4000, "the JSONata expression timed out after 2000 ms"),
    ]
    async with served(write_config(tmp_path, DECLARED)) as server:
        for tool, n, message in cases:
            result, slowest = await server.probed(lambda tool=tool, n=n: server.call(tool, {"x": list(range(n))}))
            assert result["isError"] is True
            assert message in result["content"][0]["text"]
            assert slowest < server.stall_s, (tool, server.health)
        assert (await server.call("echo", {"alive": 1}))["structuredContent"] == {"alive": 1}


async def test_an_expression_that_builds_a_huge_value_fails_its_step_within_the_worker_memory_bound():
    # replace multiplies a text: 3000 x 3000 x 3000 characters (27 GB) from a 3 KB argument.
    spec = {
        "vars": {"s": "a" * 3000},
        "steps": [{"tool": "echo", "when": "vars.s.replace('a', vars.s).replace('a', vars.s).size() > 0"}],
    }
    async with served() as server:
        before = server.rss_mb()
        result, slowest = await server.probed(lambda: server.call(PIPE_TOOL, spec))
        step = result["structuredContent"]["steps"]["step1"]
        assert step["ok"] is False and step["error"].startswith("steps[0].when: ")
        assert "MemoryError" in step["error"] or "ran out of memory" in step["error"]
        assert slowest < server.stall_s, server.health
        assert server.rss_mb() - before < 100


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(c) for c in text]
    return found


def _cel_workers(pid: int) -> list[int]:
    out = []
    for child in _children(pid):
        try:
            if b"_celexec.py" in Path(f"/proc/{child}/cmdline").read_bytes():
                out.append(child)
        except FileNotFoundError:
            pass
    return out


async def test_sigterm_stops_the_server_while_a_hostile_expression_runs(tmp_path):
    # Before: the expression ran on the event loop, so the signal waited for it (18 s and more).
    config = write_config(tmp_path, "pipe:\n  expression_timeout_ms: 60000\n")
    async with served(config) as server, trio.open_nursery() as nursery:

        async def attack() -> None:
            try:
                await server.call(PIPE_TOOL, quadratic_when(20_000))
            except Exception:  # the server goes away under the call: what this test wants
                pass

        nursery.start_soon(attack)
        with trio.fail_after(30):
            while not _cel_workers(server.proc.pid):  # noqa: ASYNC110 (another process: nothing to wait on)
                await trio.sleep(0.05)
        workers = _cel_workers(server.proc.pid)
        server.proc.send_signal(signal.SIGTERM)
        # Held by the expression, the signal waited for it (minutes at 20 000 ints); served, the server stops
        # in a second or two (more on a loaded host): 30 s tells them apart.
        with trio.fail_after(30):
            await server.proc.wait()
        nursery.cancel_scope.cancel()
    assert server.proc.returncode == 0
    assert not any(_running(pid) for pid in workers)  # the worker evaluating it was killed with the server


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


POISON = """
python_tools: ["kit.attack_tools:attack_tools"]
runs:
  path: {path}
  lease_s: 0.5
  max_lapses: 1
"""


def _worker_command(config: Path) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return [sys.executable, "-m", "mcpipe", "worker", "--config", str(config)], env


async def test_a_run_that_kills_every_worker_that_takes_it_is_failed_after_max_lapses(tmp_path):
    # Before: each worker that leased it died, the lease ran out, the next worker took it again: for ever.
    config = write_config(tmp_path, POISON.format(path=tmp_path / "runs.db"))
    command, env = _worker_command(config)
    # Two workers on the queue (started with the server, which only submits): the first to lease the run
    # dies with it; the other takes it over once the lease has run out, and fails it.
    workers = [await trio.lowlevel.open_process(command, env=env) for _ in range(2)]
    try:
        async with served(config, args=["--no-worker"]) as server:
            submitted = await server.call(PIPE_TOOL, {"background": True, "steps": [{"id": "pill", "tool": "die"}]})
            run_id = submitted["structuredContent"]["result"]["run_id"]
            result = await server.call("pipe_result", {"run_id": run_id, "wait_ms": 30000})
            status = (await server.call("pipe_status", {"run_id": run_id}))["structuredContent"]
    finally:
        for w in workers:
            if w.returncode is None:
                w.send_signal(signal.SIGTERM)
        with trio.fail_after(20):
            for w in workers:
                await w.wait()
    assert sorted(w.returncode for w in workers) == [-signal.SIGKILL, 0]  # one died; the other failed the run
    assert result["isError"] is True
    text = result["content"][0]["text"]
    assert text.startswith(f"LIMIT_EXCEEDED: run {run_id} was not run again: its lease ran out 1 time while it ran")
    assert "at step `pill`" in text and "[runs] max_lapses is 1" in text
    assert (status["status"], status["lapses"], status["attempts"]) == ("failed", 1, 2)
