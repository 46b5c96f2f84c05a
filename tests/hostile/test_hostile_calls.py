"""Every attempt of a retried tool call counts towards ``pipe.max_calls`` (issue 20, point 6): a spec over HTTP on
a real ``mcpipe serve``, the tool executions counted in its audit log."""

from __future__ import annotations

import json

import pytest

from kit.attack import served, write_config
from mcpipe.gateway import PIPE_TOOL

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

CONFIG = """
python_tools: ["kit.attack_tools:attack_tools"]
audit:
  path: {audit}
"""


def fan_out(outer: int, inner: int, attempts: int) -> dict:
    """The issue's spec: ``for_each`` outer x inner over a tool that always fails retryably, ``attempts`` each."""
    call = {"id": "call", "tool": "flaky", "retry": {"attempts": attempts, "backoff_ms": 0}}
    return {
        "vars": {"outer": list(range(outer)), "inner": list(range(inner))},
        "steps": [
            {
                "id": "rows",
                "for_each": "${vars.outer}",
                "continue_on_error": True,
                "step": {"id": "cols", "for_each": "${vars.inner}", "continue_on_error": True, "step": call},
            }
        ],
    }


async def test_retries_count_towards_max_calls_so_a_fan_out_stops_at_the_limit(tmp_path):
    # Before: 10 x 100 elements with 10 attempts each made 7096 tool executions under a limit of 1000.
    audit = tmp_path / "audit.jsonl"
    async with served(write_config(tmp_path, CONFIG.format(audit=audit))) as server:
        result, slowest = await server.probed(lambda: server.call(PIPE_TOOL, fan_out(10, 100, 10)))
        assert server.alive and slowest < server.stall_s
    executed = sum(1 for line in audit.read_text().splitlines() if json.loads(line).get("tool") == "flaky")
    assert executed <= 1000
    text = json.dumps(result["structuredContent"])
    assert "would bring the run to 1001 tool executions; the limit is 1000" in text


async def test_a_retry_past_max_calls_fails_its_step_located_at_its_retry(tmp_path):
    config = CONFIG.format(audit=tmp_path / "audit.jsonl") + "pipe:\n  max_calls: 3\n"
    spec = {"steps": [{"id": "a", "tool": "flaky", "retry": {"attempts": 5, "backoff_ms": 0}}]}
    async with served(write_config(tmp_path, config)) as server:
        answer = (await server.call(PIPE_TOOL, spec))["structuredContent"]
    step = answer["steps"]["a"]
    assert (step["ok"], step["error_code"], step["attempts"]) == (False, "LIMIT_EXCEEDED", 3)
    assert step["error"] == "steps[0].retry: attempt 4 would bring the run to 4 tool executions; the limit is 3"
