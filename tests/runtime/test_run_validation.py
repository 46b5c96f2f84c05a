"""Specs that fail validation are answered, not raised, and nothing runs (sections 5 and 7)."""

from __future__ import annotations

import pytest

from mcpipe.compile import Limits
from mcpipe.tools import ToolContext, ToolRegistry

ZERO = {"total": 0, "succeeded": 0, "failed": 0, "skipped": 0, "cancelled": 0}


@pytest.mark.parametrize(
    ("spec", "code", "location", "message"),
    [
        ({"steps": []}, "INVALID_SPEC", "steps", None),
        (
            {"steps": [{"tool": "echo"}], "retrun": 1},
            "INVALID_SPEC",
            "retrun",
            "unknown field `retrun` (did you mean `return`?)",
        ),
        ("{not json", "INVALID_SPEC", "", None),
        ({"steps": [{"tool": "nope"}]}, "UNKNOWN_TOOL", "steps[0].tool", "unknown tool 'nope'"),
        (
            {"steps": [{"tool": "mcp_pipe", "args": {"steps": []}}]},
            "INVALID_SPEC",
            "steps[0].tool",
            "`mcp_pipe` cannot be called as a tool; use a `pipe` step",
        ),
        ({"steps": [{"tool": "echo", "args": {"value": "${nope.x}"}}]}, "INVALID_SPEC", "steps[0].args.value", None),
    ],
)
async def test_an_invalid_spec_is_answered_with_located_problems_and_no_step_runs(
    run, probe, spec, code, location, message
):
    answer = await run(spec)
    assert list(answer) == ["ok", "error", "error_code", "result", "steps", "summary", "duration_ms", "problems"]
    assert answer["ok"] is False and answer["error_code"] == code
    assert answer["steps"] == {} and answer["result"] is None and answer["summary"] == ZERO
    first = answer["problems"][0]
    assert (first["code"], first["location"]) == (code, location)
    if message is not None:
        assert first["message"] == message
    assert probe.log == []


async def test_every_problem_is_listed_and_the_error_says_them_all(run):
    answer = await run({"steps": [{"tool": "nope"}, {"tool": "echo", "args": {"value": "${steps.zz}"}}]})
    assert [p["location"] for p in answer["problems"]] == ["steps[0].tool", "steps[1].args.value"]
    assert answer["error"].startswith("2 problems:")


async def test_limits_are_enforced_before_anything_runs(run, probe):
    spec = {"steps": [{"tool": "echo"} for _ in range(4)]}
    answer = await run(spec, limits=Limits(max_steps=3))
    assert answer["error_code"] == "LIMIT_EXCEEDED"
    assert probe.log == []


async def test_a_tool_the_caller_may_not_use_is_forbidden_before_any_step_runs(tools, probe, run):
    class Gateway(ToolRegistry):
        def allows(self, name: str, ctx: ToolContext) -> bool:
            return name != "boom" or ctx.principal == "admin"

    gateway = Gateway(list(tools))
    spec = {"steps": [{"tool": "echo"}, {"id": "g", "parallel": [{"id": "b", "tool": "boom"}]}]}
    answer = await run(spec, gateway, context=ToolContext(principal="guest"))
    assert answer["error_code"] == "FORBIDDEN"
    assert answer["problems"] == [
        {
            "location": "steps[1].parallel[0].tool",
            "code": "FORBIDDEN",
            "message": "tool 'boom' is not allowed for this caller",
        }
    ]
    assert probe.log == []
    admin = await run(spec, gateway, context=ToolContext(principal="admin"))
    assert admin["error_code"] == "TOOL_FAILED"


async def test_the_spec_may_come_wrapped_or_as_json_text(run):
    inner = {"steps": [{"tool": "echo", "args": {"value": 1}}]}
    for spec in ({"spec": inner}, {"spec": '{"steps": [{"tool": "echo", "args": {"value": 1}}]}'}, inner):
        answer = await run(spec)
        assert answer["ok"] and answer["result"] == {"value": 1}


async def test_the_scheduler_uses_only_in_allows_and_call_of_the_registry(tools, run):
    class Minimal:
        def __init__(self) -> None:
            self.calls: list[str] = []

        def __contains__(self, name: object) -> bool:
            return name in tools

        def allows(self, name: str, ctx: ToolContext) -> bool:
            return True

        async def call(self, name, args, ctx):
            self.calls.append(name)
            return await tools.call(name, args, ctx)

    minimal = Minimal()
    answer = await run(
        {"steps": [{"tool": "echo"}, {"id": "g", "parallel": [{"tool": "text", "args": {"value": "x"}}]}]}, minimal
    )
    assert answer["ok"] and minimal.calls == ["echo", "text"]


async def test_a_tool_gone_between_validation_and_the_call_fails_its_step_with_unknown_tool(tools, run):
    from mcpipe.tools import UnknownToolError

    class Vanishing(ToolRegistry):
        async def call(self, name, args, ctx):
            raise UnknownToolError(name)

    answer = await run({"steps": [{"id": "a", "tool": "echo"}]}, Vanishing(list(tools)))
    step = answer["steps"]["a"]
    assert (step["error_code"], step["error"]) == ("UNKNOWN_TOOL", "UnknownToolError: unknown tool 'echo'")
    assert answer["summary"]["failed"] == 1
