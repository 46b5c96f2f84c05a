"""Parallel groups: concurrency, its bounds, failures and the cancellation of siblings (section 6)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from mcpipe.compile import Limits
from mcpipe.runtime import process_limiter, run_pipeline


def waits(n: int, ms: float = 50, prefix: str = "c") -> list[dict]:
    return [{"id": f"{prefix}{i}", "tool": "wait", "args": {"ms": ms, "label": f"{prefix}{i}"}} for i in range(n)]


async def test_eight_parallel_tools_of_50_ms_finish_in_about_50_ms_not_400(run, probe, autojump_clock):
    t0 = trio.current_time()
    answer = await run({"steps": [{"id": "g", "parallel": waits(8)}]})
    elapsed = trio.current_time() - t0
    assert answer["ok"]
    assert elapsed == pytest.approx(0.05)
    assert probe.max_in_flight == 8
    assert answer["summary"] == {"total": 8, "succeeded": 8, "failed": 0, "skipped": 0, "cancelled": 0}


async def test_parallel_children_are_bounded_by_max_concurrency(run, probe, autojump_clock):
    t0 = trio.current_time()
    answer = await run({"steps": [{"id": "g", "parallel": waits(10)}]}, limits=Limits(max_concurrency=3))
    assert answer["ok"]
    assert probe.max_in_flight == 3
    assert trio.current_time() - t0 == pytest.approx(0.2)  # ceil(10 / 3) rounds of 50 ms


async def test_the_bound_is_shared_by_every_group_of_one_call_and_nested_groups_do_not_deadlock(
    run, probe, autojump_clock
):
    inner = {"steps": [{"id": "g", "parallel": waits(4, prefix="i")}]}
    spec = {
        "steps": [
            {
                "id": "outer",
                "parallel": [
                    {"id": "a", "pipe": inner},
                    {"id": "b", "pipe": inner},
                    {"id": "c", "parallel": waits(4, prefix="n")},
                ],
            }
        ]
    }
    answer = await run(spec, limits=Limits(max_concurrency=2))
    assert answer["ok"], answer["error"]
    assert probe.max_in_flight == 2
    assert answer["summary"]["succeeded"] == 12


async def test_a_process_wide_limiter_bounds_calls_across_pipelines(tools, probe, autojump_clock):
    process_limiter().total_tokens = 3
    answers = []

    async def one() -> None:
        answers.append(await run_pipeline({"steps": [{"id": "g", "parallel": waits(4)}]}, tools))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            nursery.start_soon(one)
    assert all(a["ok"] for a in answers) and len(answers) == 2
    assert probe.max_in_flight == 3


async def test_a_run_nested_in_a_parallel_step_lends_the_steps_process_slot_back_while_it_runs(
    tools, probe, autojump_clock
):
    # Issue 27: each step held a process slot while the run it started waited for slots of its own; with as
    # many such steps as slots, nothing ran again (70 calls of a 3-level playbook chain on 64 slots).
    process_limiter().total_tokens = 2

    @tools.tool
    async def nested(label: str) -> dict[str, Any]:
        """Run a pipeline of its own: two parallel waits."""
        answer = await run_pipeline({"steps": [{"id": "g", "parallel": waits(2, prefix=label)}]}, tools)
        return {"ok": answer["ok"]}

    spec = {
        "steps": [
            {"id": "g", "parallel": [{"id": f"n{i}", "tool": "nested", "args": {"label": f"n{i}"}} for i in range(4)]}
        ]
    }
    with trio.fail_after(5):
        answer = await run_pipeline(spec, tools)
    assert answer["ok"], answer["error"]
    assert answer["summary"]["succeeded"] == 4
    assert probe.max_in_flight == 2  # the slots still bound the calls that run


async def test_children_see_the_groups_list_and_are_reachable_through_children(run):
    spec = {
        "vars": {"x": 1},
        "steps": [
            {"id": "a", "tool": "echo", "args": {"value": "${vars.x}"}},
            {
                "id": "g",
                "parallel": [
                    {"id": "c1", "tool": "echo", "args": {"value": "${steps.a.output.value}"}},
                    {"id": "c2", "tool": "echo", "args": {"value": "${last.id}"}},
                ],
            },
            {"id": "b", "tool": "echo", "args": {"value": "${steps.g.children.c2.structured.value}"}},
        ],
        "return": "${steps.g.output.c1.value}",
    }
    answer = await run(spec)
    assert answer["ok"]
    assert answer["steps"]["b"]["output"] == {"value": "a"}
    assert answer["result"] == 1


async def test_a_sibling_reference_inside_a_group_is_rejected_before_anything_runs(run, probe):
    spec = {
        "steps": [
            {
                "id": "g",
                "parallel": [
                    {"id": "c1", "tool": "echo"},
                    {"id": "c2", "tool": "echo", "args": {"value": "${steps.c1.output}"}},
                ],
            }
        ]
    }
    answer = await run(spec)
    assert answer["error_code"] == "INVALID_SPEC"
    assert answer["problems"][0]["location"] == "steps[0].parallel[1].args.value"
    assert probe.log == []


async def test_parallel_failure_cancels_running_siblings_and_stops_the_pipeline(run, probe, autojump_clock):
    spec = {
        "steps": [
            {
                "id": "g",
                "parallel": [
                    *waits(2, ms=1000),
                    {"id": "bad", "tool": "fail", "args": {"message": "nope", "after_ms": 10}},
                ],
            },
            {"id": "after", "tool": "echo"},
        ]
    }
    t0 = trio.current_time()
    answer = await run(spec)
    assert trio.current_time() - t0 == pytest.approx(0.01)  # the siblings did not run on
    group = answer["steps"]["g"]
    assert group["ok"] is False
    assert (group["error_code"], group["error"]) == ("TOOL_ERROR", "step 'bad' failed: nope")
    assert [group["children"][c]["error_code"] for c in ("c0", "c1", "bad")] == ["CANCELLED", "CANCELLED", "TOOL_ERROR"]
    assert sorted(probe.cancelled) == ["c0", "c1"]
    assert answer["error"] == "step 'g' failed: step 'bad' failed: nope"
    assert answer["error_code"] == "TOOL_ERROR"
    assert "after" not in answer["steps"]
    assert answer["summary"] == {"total": 4, "succeeded": 0, "failed": 1, "skipped": 1, "cancelled": 2}


async def test_children_still_waiting_for_a_slot_when_cancelled_never_started_and_are_skipped(
    run, probe, autojump_clock
):
    # One slot, four tool steps wanting it (trio may start them in any order): whichever gets it runs,
    # the rest wait until `bad` (a pipe, which holds no slot itself) times out and fails the group.
    bad = {"id": "bad", "timeout_ms": 50, "pipe": {"steps": [{"id": "in", "tool": "wait", "args": {"ms": 1000}}]}}
    spec = {"steps": [{"id": "g", "parallel": [*waits(3, ms=1000), bad]}]}
    answer = await run(spec, limits=Limits(max_concurrency=1))
    group = answer["steps"]["g"]
    assert group["error_code"] == "TIMEOUT"
    children = group["children"]
    assert children["bad"]["error_code"] == "TIMEOUT"
    started = [c for c in children.values() if c["id"] != "bad"] + list(children["bad"]["steps"].values())
    assert [c["error_code"] for c in started] == ["CANCELLED"]  # the one that had the slot
    assert len(probe.log) == 1
    assert answer["summary"] == {"total": 4, "succeeded": 0, "failed": 0, "skipped": 3, "cancelled": 1}


async def test_with_continue_on_error_a_failed_child_leaves_its_siblings_running(run, probe, autojump_clock):
    spec = {
        "continue_on_error": True,
        "steps": [
            {"id": "g", "parallel": [{"id": "bad", "tool": "fail"}, *waits(2)]},
            {"id": "after", "tool": "echo", "args": {"value": "${steps.g.children.c1.output.label}"}},
        ],
    }
    answer = await run(spec)
    group = answer["steps"]["g"]
    assert group["ok"] is False and group["error_code"] == "TOOL_ERROR"
    assert [group["children"][c]["ok"] for c in ("bad", "c0", "c1")] == [False, True, True]
    assert answer["steps"]["after"]["output"] == {"value": "c1"}
    assert answer["ok"] is False and answer["error"] == "step 'g' failed: step 'bad' failed: it failed"
    assert answer["summary"] == {"total": 4, "succeeded": 3, "failed": 1, "skipped": 0, "cancelled": 0}


async def test_a_failure_inside_a_nested_pipe_in_a_group_cancels_the_groups_other_children(run, probe, autojump_clock):
    spec = {
        "steps": [
            {
                "id": "g",
                "parallel": [
                    {"id": "p", "pipe": {"steps": [{"tool": "wait", "args": {"ms": 10}}, {"id": "f", "tool": "boom"}]}},
                    *waits(1, ms=500),
                ],
            }
        ]
    }
    answer = await run(spec)
    group = answer["steps"]["g"]
    assert group["children"]["p"]["error_code"] == "TOOL_FAILED"
    assert group["children"]["c0"]["error_code"] == "CANCELLED"
    assert answer["error"] == "step 'g' failed: step 'p' failed: step 'f' failed: RuntimeError: boom"


async def test_caller_cancellation_cancels_every_running_step_promptly(tools, probe, autojump_clock):
    spec = {
        "steps": [
            {
                "id": "g",
                "parallel": [*waits(3, ms=10_000), {"id": "p", "pipe": {"steps": waits(1, ms=10_000, prefix="n")}}],
            },
        ]
    }
    answers = []
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:

            async def caller() -> None:
                answers.append(await run_pipeline(spec, tools))

            nursery.start_soon(caller)
            await trio.sleep(0.1)
            assert probe.in_flight == 4
            t0 = trio.current_time()
            nursery.cancel_scope.cancel()
    assert trio.current_time() == t0  # no virtual time passed: the cancellation was immediate
    assert sorted(probe.cancelled) == ["c0", "c1", "c2", "n0"]
    assert probe.in_flight == 0
    assert answers == []  # a cancelled caller gets trio.Cancelled, not an answer
