"""The scheduler running declared steps (``mcpipe.declared``) with ``mcp_pipe``'s semantics."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from mcpipe import Template
from mcpipe.compile import CompiledSpec, Limits, compile_spec
from mcpipe.declared import StepScope, compile_steps
from mcpipe.plan import Pipeline
from mcpipe.runtime import inline_tool_calls, run_compiled, run_pipeline


def plan_of(raw: list[dict[str, Any]], tools: Any = None, timeout_ms: float | None = None) -> CompiledSpec:
    steps, problems = compile_steps(raw, "steps", StepScope(tools=tools))
    assert problems == [], problems
    assert steps is not None
    return CompiledSpec.of(Pipeline(Template({}), steps, None, False, timeout_ms, ""))


async def run(raw: list[dict[str, Any]], registry: Any, **kw: Any) -> dict[str, Any]:
    with trio.fail_after(20):
        return await run_compiled(plan_of(raw, registry), registry, **kw)


async def test_run_compiled_answers_exactly_as_run_pipeline_for_an_mcp_pipe_spec(tools):
    spec = {"steps": [{"id": "a", "tool": "echo", "args": {"value": 1}}, {"tool": "echo", "args": {"value": "{{a}}"}}]}
    direct = await run_pipeline(spec, tools)
    compiled = await run_compiled(compile_spec(spec, tools=tools), tools)
    for answer in (direct, compiled):
        answer.pop("duration_ms")
        for r in answer["steps"].values():
            r.pop("duration_ms")
    assert direct == compiled


async def test_declared_leaves_run_in_order_and_feed_each_other(tools, probe):
    answer = await run(
        [
            {"kind": "tool", "id": "first", "tool": "echo", "args": {"value": "${args.x}"}},
            {"kind": "transform", "id": "double", "expression": "steps.first.output.value * 2"},
            {"kind": "tool", "id": "last", "tool": "echo", "args": {"value": "${steps.double.output}"}},
        ],
        tools,
        args={"x": 21},
    )
    assert answer["ok"], answer["error"]
    assert answer["result"] == {"value": 42}
    assert probe.log == ["echo 21", "echo 42"]
    assert answer["summary"] == {"total": 3, "succeeded": 3, "failed": 0, "skipped": 0, "cancelled": 0}
    assert [r["kind"] for r in answer["steps"].values()] == ["tool", "transform", "tool"]


async def test_a_failed_declared_step_stops_the_list_and_the_rest_count_as_skipped(tools, probe):
    answer = await run(
        [
            {"kind": "mock", "id": "down", "error": True, "error_message": "no backend"},
            {"kind": "tool", "id": "never", "tool": "echo"},
        ],
        tools,
    )
    assert (answer["ok"], answer["error"], answer["error_code"]) == (
        False,
        "step 'down' failed: no backend",
        "TOOL_ERROR",
    )
    assert answer["summary"] == {"total": 2, "succeeded": 0, "failed": 1, "skipped": 1, "cancelled": 0}
    assert probe.log == []


async def test_a_failing_declared_child_cancels_its_running_siblings(tools, probe):
    answer = await run(
        [
            {
                "kind": "parallel",
                "id": "g",
                "steps": [
                    {"kind": "tool", "id": "slow", "tool": "wait", "args": {"ms": 5000, "label": "slow"}},
                    {"kind": "mock", "id": "bad", "delay_ms": 10, "error": True},
                ],
            }
        ],
        tools,
    )
    assert answer["error"] == "step 'g' failed: step 'bad' failed: mock error"
    assert probe.cancelled == ["slow"]
    assert answer["steps"]["g"]["children"]["slow"]["error_code"] == "CANCELLED"
    assert answer["summary"] == {"total": 2, "succeeded": 0, "failed": 1, "skipped": 0, "cancelled": 1}


async def test_declared_children_of_a_group_share_the_calls_concurrency_limit(tools, probe):
    children = [{"kind": "tool", "id": f"c{i}", "tool": "wait", "args": {"ms": 20, "label": str(i)}} for i in range(6)]
    children.append({"kind": "mock", "id": "m", "delay_ms": 20, "response": 1})
    answer = await run([{"kind": "parallel", "id": "g", "steps": children}], tools, limits=Limits(max_concurrency=2))
    assert answer["ok"], answer["error"]
    assert probe.max_in_flight <= 2


async def test_a_declared_pipe_continues_on_error_when_asked(tools):
    answer = await run(
        [
            {
                "kind": "pipe",
                "id": "p",
                "continue_on_error": True,
                "steps": [
                    {"kind": "mock", "id": "bad", "error": True},
                    {"kind": "value", "id": "after", "value": "still ran"},
                ],
                "return": {"after": "${steps.after.output}"},
            }
        ],
        tools,
    )
    assert answer["error"] == "step 'p' failed: step 'bad' failed: mock error"
    assert answer["steps"]["p"]["steps"]["after"]["output"] == "still ran"
    assert answer["steps"]["p"]["output"] == {"after": "still ran"}


async def test_a_container_whose_when_fails_fails_without_running_its_children(tools, probe):
    answer = await run(
        [{"kind": "parallel", "id": "g", "when": "args.flag", "steps": [{"kind": "tool", "tool": "echo"}]}],
        tools,
        args={"flag": "yes"},
    )
    assert answer["error_code"] == "TOOL_FAILED"
    assert answer["error"] == "step 'g' failed: `when` must be a boolean, got string"
    assert probe.log == []


async def test_events_name_declared_kinds_and_skips_are_not_counted_as_done(tools):
    events: list[dict[str, Any]] = []
    answer = await run(
        [
            {"kind": "value", "id": "a", "value": 1},
            {"kind": "log", "id": "quiet", "when": "false", "data": "x"},
            {"kind": "transform", "id": "b", "expression": "1 + 1"},
        ],
        tools,
        on_event=events.append,
    )
    assert answer["summary"] == {"total": 3, "succeeded": 2, "failed": 0, "skipped": 1, "cancelled": 0}
    finished = [(e["id"], e["kind"], e["completed"]) for e in events if e["type"] == "step_finished"]
    assert finished == [("a", "value", 1), ("quiet", "log", 1), ("b", "transform", 2)]


async def test_steps_get_the_run_id_and_their_path_in_their_context(tools, probe):
    answer = await run(
        [{"kind": "pipe", "id": "outer", "steps": [{"kind": "tool", "id": "who", "tool": "whoami"}]}], tools
    )
    assert answer["ok"]
    ctx = probe.contexts[0]
    assert ctx.step == "outer.who" and ctx.pipeline and len(ctx.pipeline) == 16


@pytest.mark.parametrize("deadline", [None, 50])
async def test_a_running_declared_step_is_cancelled_by_the_deadline_or_the_caller(tools, probe, deadline):
    raw = [{"kind": "tool", "id": "w", "tool": "wait", "args": {"ms": 10_000, "label": "w"}}]
    if deadline is not None:
        answer = await run(raw, tools, limits=Limits(timeout_ms=deadline))
        assert answer["error_code"] == "TIMEOUT" and answer["steps"]["w"]["error_code"] == "CANCELLED"
    else:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, raw, tools)
                while "start w" not in probe.log:  # noqa: ASYNC110 (the probe's log: cancelled once w runs)
                    await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
    assert probe.cancelled == ["w"]


async def test_a_tool_the_caller_may_not_call_stops_the_run_before_any_step(tools, probe):
    class Deny:
        def __contains__(self, name: object) -> bool:
            return name in tools

        def allows(self, name: str, ctx: Any) -> bool:
            return name != "echo"

        async def call(self, name: str, args: Any, ctx: Any) -> Any:
            return await tools.call(name, args, ctx)

    answer = await run(
        [{"kind": "value", "value": 1}, {"kind": "parallel", "id": "g", "steps": [{"kind": "tool", "tool": "echo"}]}],
        Deny(),
    )
    assert answer["error_code"] == "FORBIDDEN"
    assert answer["problems"] == [
        {
            "location": "steps[1].steps[0].tool",
            "code": "FORBIDDEN",
            "message": "tool 'echo' is not allowed for this caller",
        }
    ]
    assert probe.log == []


def test_a_list_of_tool_steps_alone_names_its_tools_as_inline_calls(tools):
    plain = [
        {"kind": "tool", "id": "a", "tool": "echo", "args": {"value": 1}},
        {"kind": "tool", "id": "b", "tool": "echo", "args": {"value": "${steps.a.output}"}},
    ]
    assert inline_tool_calls(plan_of(plain, tools)) == ("echo", "echo")
    assert inline_tool_calls(compile_spec({"steps": [{"tool": "echo", "args": {}}]}, tools=tools)) == ("echo",)


@pytest.mark.parametrize(
    "extra",
    [
        {"kind": "tool", "id": "c", "tool": "echo", "when": "true"},
        {"kind": "tool", "id": "c", "tool": "echo", "timeout_ms": 100},
        {"kind": "value", "id": "c", "value": 1},
        {"kind": "pipe", "id": "c", "steps": [{"kind": "tool", "id": "d", "tool": "echo"}]},
    ],
)
def test_a_list_with_anything_but_plain_tool_steps_has_no_inline_calls(tools, extra):
    steps = [{"kind": "tool", "id": "a", "tool": "echo", "args": {"value": 1}}, extra]
    assert inline_tool_calls(plan_of(steps, tools)) is None
    assert inline_tool_calls(plan_of(steps[:1], tools, timeout_ms=100)) is None
