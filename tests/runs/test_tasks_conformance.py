"""The MCP tasks extension under the official conformance suite: ``mcpipe serve`` with the suite's
fixture tools (``kit.tasks_fixture``), every ``tasks-*`` scenario mcpipe serves, each with no failed check.

``tasks-mrtr-composition`` (a tool that asks its client synchronously first, then becomes a task on the
final round) is not served: a call of mcpipe's is a task from its first round or never (docs/runs.md)."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import trio

from kit.redis import free_port
from kit.run_workers import TESTS
from kit.tasks_fixture import CONFIG

SUITE = Path(__file__).resolve().parents[3] / "shared" / "conformance" / "run"
SCENARIOS = [
    "tasks-lifecycle",
    "tasks-capability-negotiation",
    "tasks-wire-fields",
    "tasks-request-state-removal",
    "tasks-request-headers",
    "tasks-dispatch-and-envelope",
    "tasks-status-notifications",
    "tasks-required-task-error",
    "tasks-mrtr-input",
]


async def test_the_conformance_suites_tasks_scenarios_pass_against_mcpipe_serve(tmp_path):
    if not SUITE.is_file() or shutil.which("node") is None:
        pytest.skip(f"the conformance suite ({SUITE}) or node is not there")
    (tmp_path / "mcpipe.toml").write_text(CONFIG)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": TESTS}
    serve = [sys.executable, "-m", "mcpipe", "serve", "--config", "mcpipe.toml", "--http", f"127.0.0.1:{port}"]
    log = (tmp_path / "serve.log").open("wb")
    proc = await trio.lowlevel.open_process(
        [*serve, "--log-level", "warning"], env=env, cwd=tmp_path, stdin=-3, stdout=-3, stderr=log
    )
    results: dict[str, str] = {}
    try:
        with trio.fail_after(30):
            while True:  # until it listens
                try:
                    await (await trio.open_tcp_stream("127.0.0.1", port)).aclose()
                    break
                except OSError:
                    await trio.sleep(0.05)
        url = f"http://127.0.0.1:{port}/mcp"
        for scenario in SCENARIOS:
            with trio.fail_after(120):
                done = await trio.run_process(
                    [str(SUITE), "server", "--url", url, "--scenario", scenario], capture_stdout=True, check=False
                )
            out = done.stdout.decode(errors="replace")
            found = re.findall(r"Passed: (\d+)/(\d+), (\d+) failed", out)
            failures = [line for line in out.splitlines() if "FAILURE" in line]
            results[scenario] = (*found[-1], *failures) if found else out[-500:]
    finally:
        proc.terminate()
        with trio.CancelScope(shield=True):
            await proc.wait()
        log.close()
    failing = {s: r for s, r in results.items() if not (isinstance(r, tuple) and r[0] == r[1] and r[2] == "0")}
    assert not failing, (failing, (tmp_path / "serve.log").read_text()[-3000:])
