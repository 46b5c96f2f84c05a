"""The in-process kinds: value, mock, transform, cel_gate, plugin_transform, log, progress, tool; and the
common fields when, input_transform and timeout_ms."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from kit.declared import Sink, compiled, env, result_of, run_result
from mcpipe.declared import StepOutput, StepPolicy, StepScope, compile_steps
from mcpipe.tools._base import ToolContext, ToolResult

CTX = ToolContext()


async def test_value_step_resolves_its_template_keeping_types():
    template = {"n": "${args.n}", "s": "n=${args.n}", "l": [1, "${args.n}"]}
    step = compiled({"kind": "value", "id": "v", "value": template})
    out = await step.execute(env({"n": 3}), CTX)
    assert out.ok and out.output == {"n": 3, "s": "n=3", "l": [1, 3]}
    assert out.structured == out.output and out.text == ""


async def test_value_step_with_a_string_output_is_text():
    out = await compiled({"kind": "value", "value": "hello ${args.who}"}).execute(env({"who": "you"}), CTX)
    assert out.output == "hello you" and out.text == "hello you" and out.structured is None


async def test_a_missing_value_fails_with_interpolation_failed_naming_the_step():
    step = compiled({"kind": "value", "id": "v", "value": "${args.nope}"})
    out = await step.execute(env({"n": 1}), CTX)
    assert not out.ok and out.error_code == "INTERPOLATION_FAILED"
    assert "step 'v'" in out.error and "nope" in out.error


async def test_mock_answers_its_fixed_response_untouched_by_templating():
    step = compiled({"kind": "mock", "response": {"items": [1, 2], "raw": "${args.x}"}})
    out = await step.execute(env(), CTX)
    assert out.output == {"items": [1, 2], "raw": "${args.x}"}
    out.output["items"].append(3)  # outputs are copies: the next run is not affected
    assert (await step.execute(env(), CTX)).output == {"items": [1, 2], "raw": "${args.x}"}


async def test_mock_error_fails_with_its_message(autojump_clock):
    step = compiled({"kind": "mock", "error": True, "error_message": "backend down", "delay_ms": 50})
    out = await step.execute(env(), CTX)
    assert (out.ok, out.error, out.error_code) == (False, "backend down", "TOOL_ERROR")


async def test_mock_delay_waits_and_a_shorter_timeout_fails_it(autojump_clock):
    slow = compiled({"kind": "mock", "response": 1, "delay_ms": 5000, "timeout_ms": 100})
    t0 = trio.current_time()
    out = await slow.execute(env(), CTX)
    assert out.error_code == "TIMEOUT" and out.error == "timed out after 100 ms"
    assert trio.current_time() - t0 == pytest.approx(0.1)
    fine = compiled({"kind": "mock", "response": 1, "delay_ms": 5000})
    t0 = trio.current_time()
    assert (await fine.execute(env(), CTX)).output == 1
    assert trio.current_time() - t0 == pytest.approx(5.0)


async def test_transform_evaluates_cel_over_steps_args_vars_and_context():
    step = compiled({"kind": "transform", "expression": '{"total": steps.a.output.n + args.k, "q": vars.q}'})
    e = env({"k": 2}, {"a": result_of(StepOutput.of({"n": 40}))}, {"q": "x"})
    assert (await step.execute(e, CTX)).output == {"total": 42, "q": "x"}


async def test_transform_converts_cel_timestamps_durations_and_bytes_to_json():
    step = compiled({"kind": "transform", "expression": '[timestamp("2026-01-02T03:04:05Z"), duration("90s"), b"hi"]'})
    assert (await step.execute(env(), CTX)).output == ["2026-01-02T03:04:05Z", 90.0, "aGk="]


async def test_transform_has_the_cel_go_extension_functions():
    expression = (
        '[args.name.upperAscii(), math.greatest(args.a, args.b), [3, 1, 2].sort(), "a,b".split(","), [1, 2].sum()]'
    )
    out = await compiled({"kind": "transform", "expression": expression}).execute(
        env({"name": "ada", "a": 1, "b": 5}), CTX
    )
    assert out.output == ["ADA", 5, [1, 2, 3], ["a", "b"], 3]


@pytest.mark.parametrize(
    ("expression", "code", "needle"),
    [
        ("steps.a.output.missing", "INTERPOLATION_FAILED", "missing"),
        ("args.n * 2.5", "TOOL_FAILED", "overload"),
        ("args.n / 0", "TOOL_FAILED", "division by zero"),
        ("string(args.n).frob()", "TOOL_FAILED", "unknown function 'frob'"),
    ],
)
async def test_a_failing_cel_expression_fails_the_step(expression, code, needle):
    step = compiled({"kind": "transform", "expression": expression})
    out = await step.execute(env({"n": 1}, {"a": result_of(StepOutput.of({}))}), CTX)
    assert not out.ok and out.error_code == code and needle in out.error


async def test_cel_gate_passes_when_true_and_rejects_with_its_message_when_false():
    step = compiled({"kind": "cel_gate", "expression": 'args.role == "admin"', "error_message": "admins only"})
    assert (await step.execute(env({"role": "admin"}), CTX)).output is True
    out = await step.execute(env({"role": "guest"}), CTX)
    assert (out.ok, out.error, out.error_code) == (False, "admins only", "GATE_REJECTED")


async def test_cel_gate_without_a_message_uses_a_default_and_a_non_boolean_is_an_error():
    gate = compiled({"kind": "cel_gate", "expression": "false"})
    out = await gate.execute(env(), CTX)
    assert out.error_code == "GATE_REJECTED" and out.error
    out = await compiled({"kind": "cel_gate", "expression": "1"}).execute(env(), CTX)
    assert out.error_code == "TOOL_FAILED" and "boolean" in out.error


@pytest.mark.parametrize("plugin", ["jsonata", "dev.mcpipe.transform.jsonata"])
async def test_plugin_transform_runs_jsonata_over_the_context(plugin):
    expression = '{ "orderIds": steps.fetch.output.orders.id, "total": $sum(steps.fetch.output.orders.amount) }'
    step = compiled({"kind": "plugin_transform", "plugin": plugin, "config": {"expression": expression}})
    orders = {"orders": [{"id": 1, "amount": 2.5}, {"id": 2, "amount": 3}]}
    out = await step.execute(env(steps={"fetch": result_of(StepOutput.of(orders))}), CTX)
    assert out.output == {"orderIds": [1, 2], "total": 5.5}
    assert type(out.output["orderIds"]) is list  # plain JSON data, not the library's list type


async def test_a_jsonata_runtime_error_or_runaway_fails_the_step():
    step = compiled({"kind": "plugin_transform", "plugin": "jsonata", "config": {"expression": '$sum("a")'}})
    out = await step.execute(env(), CTX)
    assert out.error_code == "TOOL_FAILED" and "T0412" in out.error
    policy = StepPolicy(expression_max_ms=1000)
    runaway = "($f := function($x){1 + $f($x)}; $f(1))"  # not a tail call: the recursion bound stops it
    loop = {"kind": "plugin_transform", "plugin": "jsonata", "config": {"expression": runaway}}
    with trio.fail_after(10):
        out = await compiled(loop, policy).execute(env(), CTX)
    assert out.error_code == "TOOL_FAILED" and "D1011" in out.error  # the recursion bound


async def test_a_jsonata_expression_past_its_deadline_fails_the_step_with_timeout():
    # Before: TOOL_FAILED ("Evaluation timeout after 50 milliseconds"), while CEL said TIMEOUT.
    policy = StepPolicy(expression_max_ms=50)
    spin = {"kind": "plugin_transform", "plugin": "jsonata", "config": {"expression": "[1..1000].([1..1000].($ * 2))"}}
    with trio.fail_after(10):
        out = await compiled(spin, policy).execute(env(), CTX)
    assert (out.ok, out.error_code) == (False, "TIMEOUT")
    assert out.error.endswith("the JSONata expression timed out after 50 ms")


async def test_log_sends_the_resolved_data_at_its_level():
    sink = Sink()
    step = compiled({"kind": "log", "level": "warning", "data": {"order": "${args.id}"}})
    out = await step.execute(env({"id": 7}), sink.context())
    assert sink.logs == [("warning", {"order": 7})]
    assert out.output == {"order": 7}


async def test_log_with_a_logger_name_sends_it_as_the_notifications_logger():
    sink = Sink()
    await compiled({"kind": "log", "logger": "billing", "data": "hi"}).execute(env(), sink.context())
    assert sink.logs == [("info", "hi", "billing")]


async def test_progress_reports_when_the_call_has_a_progress_token():
    sink = Sink()
    step = compiled({"kind": "progress", "progress": "${args.done}", "total": 4, "message": "step ${args.done}"})
    out = await step.execute(env({"done": 2}), sink.context(progress_token="tok"))
    assert sink.progress == [(2, 4, "step 2")]
    assert out.ok and not out.skipped and out.output == {"progress": 2, "total": 4, "message": "step 2"}


async def test_progress_is_skipped_without_a_progress_token():
    sink = Sink()
    out = await compiled({"kind": "progress", "progress": 0.5}).execute(env(), sink.context())
    assert sink.progress == [] and out.ok and out.skipped


async def test_progress_that_is_not_a_number_fails():
    out = await compiled({"kind": "progress", "progress": "${args.p}"}).execute(env({"p": "half"}), CTX)
    assert out.error_code == "TOOL_FAILED" and "number" in out.error


async def test_when_false_skips_the_step_without_running_it():
    sink = Sink()
    step = compiled({"kind": "log", "data": "x", "when": "args.verbose"})
    out = await step.execute(env({"verbose": False}), sink.context())
    assert out.skipped and out.ok and out.output is None and sink.logs == []
    out = await step.execute(env({"verbose": True}), sink.context())
    assert not out.skipped and sink.logs == [("info", "x")]


async def test_a_when_that_is_not_a_boolean_fails_the_step():
    out = await compiled({"kind": "value", "value": 1, "when": "args.n"}).execute(env({"n": 1}), CTX)
    assert out.error_code == "TOOL_FAILED" and "`when` must be a boolean" in out.error


async def test_input_transform_replaces_args_for_the_steps_templates_and_expressions():
    reshape = '{"name": args.first + " " + args.last}'
    value = compiled({"kind": "value", "value": "${args.name}", "input_transform": reshape})
    assert (await value.execute(env({"first": "Ada", "last": "Lovelace"}), CTX)).output == "Ada Lovelace"
    transform = compiled({"kind": "transform", "expression": "args * 2", "input_transform": "args.n + 1"})
    assert (await transform.execute(env({"n": 20}), CTX)).output == 42


async def test_when_sees_the_original_args_not_the_transformed_ones():
    step = compiled({"kind": "value", "value": "${args}", "when": "has(args.n)", "input_transform": "[args.n]"})
    assert (await step.execute(env({"n": 1}), CTX)).output == [1]


class FakeTools:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __contains__(self, name: str) -> bool:
        return name in ("echo", "fail")

    async def call(self, name: str, args: Any, ctx: ToolContext) -> ToolResult:
        self.calls.append((name, args))
        if name == "fail":
            return ToolResult.error("it broke")
        return ToolResult([{"type": "text", "text": f'{{"got": {args["n"]}}}'}])


async def test_tool_step_calls_the_tool_with_resolved_args_and_parses_json_text():
    tools = FakeTools()
    step = compiled({"kind": "tool", "tool": "echo", "args": {"n": "${args.n}"}}, tools=tools)
    out = await step.execute(env({"n": 5}), CTX)
    assert tools.calls == [("echo", {"n": 5})]
    assert out.output == {"got": 5} and out.content == [{"type": "text", "text": '{"got": 5}'}]
    failed = await compiled({"kind": "tool", "tool": "fail"}, tools=tools).execute(env(), CTX)
    assert (failed.ok, failed.error, failed.error_code) == (False, "it broke", "TOOL_ERROR")


async def test_tool_step_can_call_through_a_registry_given_at_run_time():
    tools = FakeTools()
    step = compiled({"kind": "tool", "tool": "echo", "args": {"n": 1}})
    assert (await step.execute(env(), CTX, tools=tools)).output == {"got": 1}


async def test_a_list_of_steps_runs_as_a_pipeline_would_run_it():
    steps, problems = compile_steps(
        [
            {"kind": "value", "id": "a", "value": {"n": "${args.n}"}},
            {"kind": "transform", "id": "b", "expression": "steps.a.output.n * 10"},
            {"kind": "cel_gate", "id": "g", "expression": "last.output > 5"},
            {"kind": "value", "id": "c", "value": "{{b}} and ${steps.a.output.n}"},
        ],
        "steps",
        StepScope(),
    )
    assert problems == [] and steps is not None
    e = env({"n": 2})
    for step in steps:
        r = await run_result(step, e, CTX)
        assert r["ok"], r
        e["steps"][step.id] = r
        e["last"] = r
    assert e["last"]["output"] == "20 and 2"
    assert set(e["last"]) >= {"id", "kind", "ok", "error", "error_code", "structured", "text", "content", "output"}


async def test_a_progress_token_is_also_found_in_the_sdk_request_context():
    class SdkContext:
        meta = {"progressToken": 7}

    sink = Sink()
    ctx = sink.context()
    ctx.sdk_context = SdkContext()
    out = await compiled({"kind": "progress", "progress": 1}).execute(env(), ctx)
    assert not out.skipped and sink.progress == [(1, None, None)]


async def test_a_tool_step_without_a_registry_fails_cleanly():
    out = await compiled({"kind": "tool", "tool": "echo"}).execute(env(), CTX)
    assert out.error_code == "TOOL_FAILED" and "no tool registry" in out.error


async def test_a_skipped_step_result_is_ok_with_no_error_and_a_null_output():
    step = compiled({"kind": "value", "id": "v", "value": 1, "when": "false"})
    r = await run_result(step, env(), CTX)
    assert (r["ok"], r["skipped"], r["error"], r["error_code"], r["output"]) == (True, True, "", None, None)


async def test_a_tool_that_vanished_is_unknown_tool():
    from mcpipe.tools import ToolRegistry

    out = await compiled({"kind": "tool", "tool": "gone"}).execute(env(), CTX, tools=ToolRegistry())
    assert out.error_code == "UNKNOWN_TOOL"
