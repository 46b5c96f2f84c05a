"""Step and pipeline deadlines (section 6), on trio's autojump clock."""

from __future__ import annotations

import pytest
import trio

from mcpipe.compile import Limits


def wait(sid: str, ms: float, **extra) -> dict:
    return {"id": sid, "tool": "wait", "args": {"ms": ms, "label": sid}, **extra}


async def test_a_step_past_its_timeout_fails_with_timeout_and_stops_the_pipeline(run, probe, autojump_clock):
    t0 = trio.current_time()
    answer = await run({"steps": [wait("slow", 1000, timeout_ms=100), wait("next", 10)]})
    assert trio.current_time() - t0 == pytest.approx(0.1)
    step = answer["steps"]["slow"]
    assert (step["ok"], step["error_code"], step["error"]) == (False, "TIMEOUT", "timed out after 100 ms")
    assert probe.cancelled == ["slow"]
    assert answer["error_code"] == "TIMEOUT" and answer["error"] == "step 'slow' failed: timed out after 100 ms"
    assert answer["summary"] == {"total": 2, "succeeded": 0, "failed": 1, "skipped": 1, "cancelled": 0}


async def test_a_step_within_its_timeout_succeeds(run, autojump_clock):
    answer = await run({"steps": [wait("quick", 50, timeout_ms=100)]})
    assert answer["ok"] and answer["steps"]["quick"]["output"] == {"label": "quick", "value": None}


async def test_with_continue_on_error_a_timed_out_step_lets_the_rest_run(run, probe, autojump_clock):
    answer = await run({"continue_on_error": True, "steps": [wait("slow", 1000, timeout_ms=100), wait("next", 10)]})
    assert answer["steps"]["slow"]["error_code"] == "TIMEOUT"
    assert answer["steps"]["next"]["ok"]
    assert answer["ok"] is False and answer["error_code"] == "TIMEOUT"
    assert answer["summary"] == {"total": 2, "succeeded": 1, "failed": 1, "skipped": 0, "cancelled": 0}


async def test_past_the_pipeline_deadline_running_steps_are_cancelled_and_the_pipeline_times_out(
    run, probe, autojump_clock
):
    spec = {
        "timeout_ms": 150,
        "steps": [wait("first", 100), {"id": "g", "parallel": [wait("a", 1000), wait("b", 1000)]}, wait("never", 1)],
    }
    t0 = trio.current_time()
    answer = await run(spec)
    assert trio.current_time() - t0 == pytest.approx(0.15)
    assert answer["ok"] is False
    assert (answer["error_code"], answer["error"]) == ("TIMEOUT", "the pipeline timed out after 150 ms")
    assert answer["result"] is None
    assert answer["steps"]["first"]["ok"]
    group = answer["steps"]["g"]
    assert group["error_code"] == "CANCELLED"
    assert [group["children"][c]["error_code"] for c in "ab"] == ["CANCELLED", "CANCELLED"]
    assert "never" not in answer["steps"]
    assert sorted(probe.cancelled) == ["a", "b"]
    assert answer["summary"] == {"total": 4, "succeeded": 1, "failed": 0, "skipped": 1, "cancelled": 2}


async def test_the_servers_timeout_caps_the_specs(run, autojump_clock):
    t0 = trio.current_time()
    answer = await run({"timeout_ms": 10_000, "steps": [wait("s", 5000)]}, limits=Limits(timeout_ms=200))
    assert trio.current_time() - t0 == pytest.approx(0.2)
    assert answer["error"] == "the pipeline timed out after 200 ms"


async def test_the_servers_timeout_applies_when_the_spec_has_none(run, autojump_clock):
    answer = await run({"steps": [wait("s", 5000)]}, limits=Limits(timeout_ms=300))
    assert answer["error_code"] == "TIMEOUT"
    assert answer["steps"]["s"]["error_code"] == "CANCELLED"


async def test_a_group_past_its_timeout_cancels_its_children_and_fails_with_timeout(run, probe, autojump_clock):
    spec = {"steps": [{"id": "g", "timeout_ms": 100, "parallel": [wait("fast", 10), wait("slow", 1000)]}]}
    answer = await run(spec)
    group = answer["steps"]["g"]
    assert (group["error_code"], group["error"]) == ("TIMEOUT", "timed out after 100 ms")
    assert group["children"]["fast"]["ok"]
    assert group["children"]["slow"]["error_code"] == "CANCELLED"
    assert answer["summary"] == {"total": 2, "succeeded": 1, "failed": 0, "skipped": 0, "cancelled": 1}


async def test_a_child_past_its_own_timeout_fails_the_group(run, autojump_clock):
    spec = {"steps": [{"id": "g", "parallel": [wait("slow", 1000, timeout_ms=20), wait("other", 500)]}]}
    answer = await run(spec)
    children = answer["steps"]["g"]["children"]
    assert children["slow"]["error_code"] == "TIMEOUT"
    assert children["other"]["error_code"] == "CANCELLED"
    assert answer["steps"]["g"]["error_code"] == "TIMEOUT"


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"id": "p", "timeout_ms": 100, "pipe": {"steps": [wait("in", 1000)]}}, id="step-timeout"),
        pytest.param({"id": "p", "pipe": {"timeout_ms": 100, "steps": [wait("in", 1000)]}}, id="nested-spec-timeout"),
    ],
)
async def test_a_pipe_past_its_deadline_fails_with_timeout_keeping_its_steps(run, spec, autojump_clock):
    t0 = trio.current_time()
    answer = await run({"steps": [spec]})
    assert trio.current_time() - t0 == pytest.approx(0.1)
    step = answer["steps"]["p"]
    assert (step["error_code"], step["error"]) == ("TIMEOUT", "timed out after 100 ms")
    assert step["steps"]["in"]["error_code"] == "CANCELLED"
    assert answer["summary"]["cancelled"] == 1
