"""The server in memory, through the SDK's own Client, in both protocol eras."""

from __future__ import annotations

import orjson
import pytest
import trio
from mcp import Client

from kit.servers import ERAS, make_config, running
from kit.tools import BLOCKED
from mcpipe.gateway import PIPE_TOOL
from mcpipe.runs import RUN_TOOL_NAMES
from mcpipe.server._schema import PIPE_INPUT_SCHEMA, PIPE_OUTPUT_SCHEMA
from mcpipe.tools.builtin import BUILTIN_NAMES

TWO_STEPS = {
    "vars": {"who": "world"},
    "steps": [
        {"id": "a", "tool": "echo", "args": {"greeting": "hello ${vars.who}"}},
        {"id": "b", "tool": "text_replace", "args": {"text": "{{a.greeting}}", "old": "hello", "new": "goodbye"}},
    ],
    "return": {"$ref": "steps.b.structured.text"},
}


@pytest.mark.parametrize("mode", ERAS)
async def test_tools_list_serves_mcp_pipe_with_its_schemas_beside_every_tool(mode):
    async with running() as app, Client(app.server, mode=mode) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    asking = {"ask_user", "sample", "list_roots"}  # mcpipe.interaction's built-in tools
    kit = {"slow", "boom", "fail", "hang", "block", PIPE_TOOL}
    assert set(BUILTIN_NAMES) | asking | set(RUN_TOOL_NAMES) | kit == set(tools)
    pipe = tools[PIPE_TOOL]
    assert pipe.input_schema == PIPE_INPUT_SCHEMA and pipe.output_schema == PIPE_OUTPUT_SCHEMA
    assert "steps" in pipe.input_schema["properties"] and "$defs" in pipe.input_schema
    assert "${vars.q}" in (pipe.description or "")


@pytest.mark.parametrize("mode", ERAS)
async def test_mcp_pipe_answers_structured_content_one_text_block_and_is_error_false(mode):
    async with running() as app, Client(app.server, mode=mode) as client:
        r = await client.call_tool(PIPE_TOOL, TWO_STEPS)
    answer = r.structured_content
    assert r.is_error is False and answer["ok"] is True and answer["result"] == "goodbye world"
    # The default answer (issue 23) is the result: no step records when the run succeeded.
    assert set(answer) == {"ok", "error", "error_code", "result", "summary", "duration_ms"}
    assert answer["summary"] == {"total": 2, "succeeded": 2, "failed": 0, "skipped": 0, "cancelled": 0}
    assert len(r.content) == 1 and orjson.loads(r.content[0].text) == answer


@pytest.mark.parametrize("wrap", [lambda s: {"spec": s}, lambda s: {"spec": orjson.dumps(s).decode()}])
async def test_mcp_pipe_takes_the_spec_wrapped_as_an_object_or_as_json_text(wrap):
    async with running() as app, Client(app.server) as client:
        r = await client.call_tool(PIPE_TOOL, wrap(TWO_STEPS))
    assert r.structured_content["result"] == "goodbye world"


@pytest.mark.parametrize("mode", ERAS)
async def test_an_invalid_spec_is_an_is_error_answer_with_located_problems_not_a_protocol_error(mode):
    spec = {"steps": [{"tool": "echo", "args": {"x": "${steps.later.text}"}}, {"id": "later", "tool": "nope"}]}
    async with running() as app, Client(app.server, mode=mode) as client:
        r = await client.call_tool(PIPE_TOOL, spec)
    answer = r.structured_content
    assert r.is_error is True and answer["ok"] is False and answer["steps"] == {}
    assert answer["error_code"] in ("INVALID_SPEC", "UNKNOWN_TOOL")
    assert {p["location"] for p in answer["problems"]} >= {"steps[1].tool"}


async def test_a_failing_step_makes_the_answer_an_error_with_the_step_code():
    spec = {"steps": [{"tool": "echo", "args": {}}, {"id": "f", "tool": "fail"}, {"tool": "echo", "args": {}}]}
    async with running() as app, Client(app.server) as client:
        r = await client.call_tool(PIPE_TOOL, spec)
    answer = r.structured_content
    assert r.is_error and answer["error_code"] == "TOOL_ERROR" and answer["steps"]["f"]["error"] == "it did not work"
    assert answer["summary"]["skipped"] == 1


@pytest.mark.parametrize("mode", ERAS)
async def test_direct_calls_answer_tool_errors_as_results_not_protocol_errors(mode):
    async with running() as app, Client(app.server, mode=mode) as client:
        ok = await client.call_tool("text_join", {"items": ["a", 1], "sep": "-"})
        unknown = await client.call_tool("no_such_tool", {})
        raised = await client.call_tool("boom", {})
        handled = await client.call_tool("fail", {})
    assert ok.structured_content == {"text": "a-1"} and not ok.is_error
    assert unknown.is_error and unknown.content[0].text == "UNKNOWN_TOOL: unknown tool 'no_such_tool'"
    assert raised.is_error and raised.content[0].text.startswith("TOOL_FAILED: RuntimeError: kaput")
    assert handled.is_error and handled.content[0].text == "it did not work"


@pytest.mark.parametrize("mode", ERAS)
async def test_progress_reports_each_finished_leaf_step_monotonically_with_the_leaf_total(mode):
    spec = {
        "steps": [
            {"id": "first", "tool": "echo", "args": {}},
            {
                "id": "group",
                "parallel": [{"id": "x", "tool": "echo", "args": {}}, {"id": "y", "tool": "now", "args": {}}],
            },
            {"id": "inner", "pipe": {"steps": [{"id": "z", "tool": "echo", "args": {}}]}},
        ]
    }
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress, total, message):
        seen.append((progress, total, message))

    async with running() as app, Client(app.server, mode=mode) as client:
        r = await client.call_tool(PIPE_TOOL, spec, progress_callback=on_progress)
    assert r.structured_content["ok"]
    values = [p for p, _, _ in seen]
    assert values == sorted(values) and len(set(values)) == len(values) and values[-1] == 4
    assert {t for _, t, _ in seen} == {4}
    messages = " ".join(m or "" for _, _, m in seen)
    assert all(f"step {s} finished" in messages for s in ("first", "group.x", "group.y", "inner.z"))


async def test_every_call_is_audited_and_mcp_pipe_costs_zero_while_its_steps_cost_as_direct_calls(audit):
    config = make_config(costs={"echo": 1.5, "text_*": 0.25})
    async with running(config, audit) as app, Client(app.server) as client:
        await client.call_tool("echo", {"direct": True})
        await client.call_tool(PIPE_TOOL, TWO_STEPS)
    direct, step_a, step_b, pipe = audit.records
    assert (direct["tool"], direct["cost"], direct["pipeline"], direct["ok"]) == ("echo", 1.5, None, True)
    assert pipe["tool"] == PIPE_TOOL and pipe["cost"] == 0 and pipe["ok"] is True and pipe["error_code"] is None
    assert step_a["pipeline"] == step_b["pipeline"] == pipe["pipeline"] is not None
    assert (step_a["tool"], step_a["step"], step_a["cost"]) == ("echo", "a", 1.5)
    assert (step_b["tool"], step_b["step"], step_b["cost"]) == ("text_replace", "b", 0.25)
    assert app.gateway.totals[None].cost == 3.25 and app.gateway.totals[None].calls == 3
    assert all(isinstance(r["duration_ms"], float) and r["ts"].endswith("Z") for r in audit.records)


async def test_a_failed_pipeline_still_bills_the_steps_that_completed(audit):
    config = make_config(costs={"*": 1})
    spec = {"steps": [{"tool": "echo", "args": {}}, {"tool": "boom"}, {"tool": "echo", "args": {}}]}
    async with running(config, audit) as app, Client(app.server) as client:
        r = await client.call_tool(PIPE_TOOL, spec)
    assert r.structured_content["error_code"] == "TOOL_FAILED"
    assert [(x["tool"], x["ok"], x["error_code"], x["cost"]) for x in audit.records] == [
        ("echo", True, None, 1.0),
        ("boom", False, "TOOL_FAILED", 0.0),
        (PIPE_TOOL, False, "TOOL_FAILED", 0.0),
    ]


async def test_a_principal_gets_forbidden_before_any_step_runs_and_sees_only_its_tools(audit):
    config = make_config({"BOB": "t"}, auth={"tokens": [{"env": "BOB", "principal": "bob", "tools": ["echo", "now"]}]})
    spec = {"steps": [{"tool": "echo", "args": {}}, {"tool": "text_join", "args": {"items": []}}]}
    async with running(config, audit) as app:
        app.handlers.default_principal = "bob"
        async with Client(app.server) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            r = await client.call_tool(PIPE_TOOL, spec)
            direct = await client.call_tool("text_join", {"items": []})
    assert names == {PIPE_TOOL, "echo", "now"}
    answer = r.structured_content
    assert answer["error_code"] == "FORBIDDEN" and answer["steps"] == {}
    assert answer["problems"][0]["location"] == "steps[1].tool"
    assert direct.is_error and direct.content[0].text == "FORBIDDEN: principal 'bob' may not call 'text_join'"
    assert [(x["tool"], x["principal"], x["error_code"]) for x in audit.records] == [
        (PIPE_TOOL, "bob", "FORBIDDEN"),
        ("text_join", "bob", "FORBIDDEN"),
    ]


async def test_pipe_limits_come_from_the_config_and_a_spec_cannot_raise_them():
    config = make_config(pipe={"max_steps": 2})
    spec = {"steps": [{"tool": "echo", "args": {}}] * 3}
    async with running(config) as app, Client(app.server) as client:
        r = await client.call_tool(PIPE_TOOL, spec)
    assert r.structured_content["error_code"] == "LIMIT_EXCEEDED"


async def test_mcp_pipe_can_be_disabled():
    async with running(make_config(pipe={"enabled": False})) as app, Client(app.server) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        r = await client.call_tool(PIPE_TOOL, TWO_STEPS)
    assert PIPE_TOOL not in names and r.is_error and "UNKNOWN_TOOL" in r.content[0].text


@pytest.mark.parametrize("mode", ERAS)
async def test_cancelling_an_mcp_pipe_call_cancels_its_running_steps_and_audits_cancelled(mode, audit):
    tag = f"cancelled-{mode}"
    started = BLOCKED[tag] = trio.Event()
    spec = {"steps": [{"id": "s", "tool": "block", "args": {"tag": tag}}]}
    async with running(audit=audit) as app, Client(app.server, mode=mode) as client:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client.call_tool, PIPE_TOOL, spec)
                await started.wait()  # cancelled once its step runs, however slowly the host got there
                nursery.cancel_scope.cancel()
            r = await client.call_tool("echo", {"after": True})
    assert r.structured_content == {"after": True}
    codes = [(x["tool"], x["error_code"]) for x in audit.records]
    assert ("block", "CANCELLED") in codes and (PIPE_TOOL, "CANCELLED") in codes
