"""mcpipe's ``mcp_pipeline`` beyond discord's own tests: its input checks, references, answers, the config
switches, and the differences ``docs/formats/discord.md`` lists, each shown."""

from __future__ import annotations

import math
import sys

import pytest
from mcp import Client

from kit.discord import SERVER, err, ok
from kit.servers import make_config
from mcpipe.config import ConfigError
from mcpipe.formats.discord import js_truthy, parse_steps
from mcpipe.gateway import AuditLog
from mcpipe.server import open_app
from mcpipe.tools import ToolResult

# --- the input, checked as discord's zod schema checks it -------------------------------------------------


@pytest.mark.parametrize(
    ("args", "issues"),
    [
        ({}, [("steps", "Invalid input: expected array, received undefined", "invalid_type")]),
        ({"steps": []}, [("steps", "Too small: expected array to have >=1 items", "too_small")]),
        (
            {"steps": [{"tool": "x", "args": {}}] * 21},
            [("steps", "Too big: expected array to have <=20 items", "too_big")],
        ),
        (
            {"steps": [{"id": "9a", "tool": "x", "args": {}}]},
            [("steps.0.id", "Invalid string: must match pattern /^[a-z][a-z0-9_]{0,63}$/i", "invalid_format")],
        ),
        (
            {"steps": [{"args": {}}]},
            [("steps.0.tool", "Invalid input: expected string, received undefined", "invalid_type")],
        ),
        (
            {"steps": [{"tool": "x"}]},
            [("steps.0.args", "Invalid input: expected record, received undefined", "invalid_type")],
        ),
        (
            {"steps": [{"tool": "x", "args": {}, "save_as": ""}]},
            [("steps.0.save_as", "Too small: expected string to have >=1 characters", "too_small")],
        ),
        (
            {"steps": [{"tool": "x", "args": {}, "continue_on_error": "yes"}]},
            [("steps.0.continue_on_error", "Invalid input: expected boolean, received string", "invalid_type")],
        ),
        (
            {"steps": [{"tool": "x", "args": {}, "contine_on_error": True}], "dry": 1},
            [
                ("", 'Unrecognized key: "dry"', "unrecognized_keys"),
                ("steps.0", 'Unrecognized key: "contine_on_error"', "unrecognized_keys"),
            ],
        ),
    ],
)
def test_the_input_is_checked_as_discords_schema_checks_it(args, issues):
    _, found = parse_steps(args)
    assert [(i.path, i.message, i.code) for i in found] == issues


def test_the_step_cap_is_the_smaller_of_twenty_and_the_servers_max_steps():
    _, found = parse_steps({"steps": [{"tool": "x", "args": {}}] * 6}, max_steps=5)
    assert [i.message for i in found] == ["Too big: expected array to have <=5 items"]


async def test_a_call_the_schema_refuses_answers_discords_validation_error_and_runs_nothing(pipeline, standins):
    r = await pipeline({"steps": [{"id": "a", "tool": "x", "args": {}}] * 21})
    assert r.is_error is True
    assert r.structured_content == {
        "code": "VALIDATION_FAILED",
        "retriable": False,
        "category": "client",
        "recovery_hint": "Fix `steps`: Too big: expected array to have <=20 items",
        "issues": [{"path": "steps", "message": "Too big: expected array to have <=20 items", "code": "too_big"}],
    }
    assert r.content[0].text.startswith("**Input Error**\n\n- `steps`: Too big")
    assert standins.calls == []


# --- references -------------------------------------------------------------------------------------------


async def test_a_name_resolves_to_the_last_step_that_set_it_before_the_reference(pipeline, standins):
    standins.respond("x", ok({"v": 1}), ok({"v": 2}))
    await pipeline(
        {
            "steps": [
                {"id": "a", "tool": "x", "args": {}, "save_as": "latest"},
                {"id": "b", "tool": "x", "args": {}, "save_as": "latest"},
                {"tool": "fake_tool_1", "args": {"v": "{{latest.v}}", "first": "{{a.v}}"}},
            ]
        }
    )
    assert standins.calls[-1][1] == {"v": 2, "first": 1}


async def test_an_explicit_step_n_id_wins_over_the_nth_position(pipeline, standins):
    standins.respond("x", ok({"v": "first"}), ok({"v": "second"}))
    await pipeline(
        {
            "steps": [
                {"tool": "x", "args": {}},
                {"id": "step1", "tool": "x", "args": {}},
                {"tool": "fake_tool_1", "args": {"v": "{{step1.v}}", "w": "{{step2.v}}"}},
            ]
        }
    )
    # `step1` is the second step's id (discord's variables); `step2` is no name, so the 2nd step (seed 001).
    assert standins.calls[-1][1] == {"v": "second", "w": "second"}


async def test_a_forward_reference_is_refused_before_anything_runs(pipeline, standins):
    out = (
        await pipeline(
            {
                "steps": [
                    {"id": "a", "tool": "x", "args": {"v": "{{b.v}}"}},
                    {"id": "b", "tool": "x", "args": {}},
                ]
            }
        )
    ).structured_content
    assert standins.calls == []
    assert out["aborted"] is True and out["total_duration_ms"] == 0
    assert [s["status"] for s in out["steps"]] == ["error", "skipped"]


async def test_a_reference_to_a_failed_step_fails_even_where_its_error_holds_the_path(pipeline, standins):
    # A failed step sets no variable (discord saves successes only), even when its error payload has the field.
    standins.respond("x", err("DISCORD_NOT_FOUND", "gone"))
    out = (
        await pipeline(
            {
                "steps": [
                    {"id": "a", "tool": "x", "args": {}, "continue_on_error": True},
                    {"id": "b", "tool": "fake_tool_1", "args": {"code": "{{a.code}}"}, "continue_on_error": True},
                    {"id": "c", "tool": "fake_tool_2", "args": {}},
                ]
            }
        )
    ).structured_content
    assert out["steps"][1]["error"] == {
        "code": "INTERPOLATION_FAILED",
        "message": "steps.1.args.code: cannot resolve `{{a.code}}`: step 'a' failed",
        "retriable": False,
    }
    assert out["steps"][2]["status"] == "success" and out["aborted"] is False
    assert standins.called() == ["x", "fake_tool_2"]


async def test_literal_text_that_mcpipes_templates_would_read_passes_through_unchanged(pipeline, standins):
    text = {
        "dollar": "costs ${price} <<here>> $<x>",
        "path": "C:\\Users\\{{a.name}}",
        "ref": {"$ref": "steps.a.output"},
        "empty": "{{}} and {{ x",
    }
    standins.respond("x", ok({"name": "ann"}))
    await pipeline({"steps": [{"id": "a", "tool": "x", "args": {}}, {"tool": "fake_tool_1", "args": text}]})
    assert standins.calls[-1][1] == {
        "dollar": "costs ${price} <<here>> $<x>",
        "path": "C:\\Users\\ann",
        "ref": {"$ref": "steps.a.output"},
        "empty": "{{}} and {{ x",
    }


async def test_mixed_text_renders_values_as_mcpipes_templates_do(pipeline, standins):
    # JavaScript's String() would give "null", "[object Object]" and "1,2": mcpipe writes "", JSON, JSON.
    standins.respond("x", ok({"n": None, "o": {"k": 1}, "l": [1, 2], "f": 1.5, "t": True}))
    await pipeline(
        {
            "steps": [
                {"id": "a", "tool": "x", "args": {}},
                {"tool": "fake_tool_1", "args": {"s": "{{a.n}}|{{a.o}}|{{a.l}}|{{a.f}}|{{a.t}}"}},
            ]
        }
    )
    assert standins.calls[-1][1] == {"s": '|{"k":1}|[1,2]|1.5|true'}


@pytest.mark.parametrize(
    ("value", "truthy"),
    [
        (None, False),
        (False, False),
        (0, False),
        (0.0, False),
        (math.nan, False),
        ("", False),
        (True, True),
        (-1, True),
        ("0", True),
        ([], True),
        ({}, True),
    ],
)
def test_if_is_javascripts_truthiness(value, truthy):
    assert js_truthy(value) is truthy


async def test_an_if_naming_no_step_is_refused_before_anything_runs(pipeline, standins):
    out = (await pipeline({"steps": [{"tool": "x", "args": {}, "if": "{{typo.ok}}"}]})).structured_content
    assert out["steps"][0]["error"]["code"] == "INTERPOLATION_FAILED"
    assert "steps.0.if: `{{typo.ok}}` names no earlier step" in out["steps"][0]["error"]["message"]
    assert standins.calls == []


# --- answers ------------------------------------------------------------------------------------------------


async def test_a_tool_that_raises_is_discords_pipeline_internal(client, standins):
    class Boom:
        name = "boom"
        description = "raises"
        input_schema = {"type": "object"}
        output_schema = None

        async def call(self, args, ctx):
            raise RuntimeError("kaput")

    standins.registry.register(Boom())
    out = (await client.call_tool("mcp_pipeline", {"steps": [{"tool": "boom", "args": {}}]})).structured_content
    assert out["steps"][0]["error"] == {
        "code": "PIPELINE_INTERNAL",
        "message": "RuntimeError: kaput",
        "retriable": False,
    }
    assert out["aborted"] is True


async def test_a_text_only_tools_output_is_its_text_and_an_error_without_code_is_unknown(pipeline, standins):
    standins.respond("x", ToolResult.text("plain words"), ToolResult.error("bad"))
    out = (
        await pipeline(
            {
                "steps": [
                    {"id": "a", "tool": "x", "args": {}},
                    {"id": "b", "tool": "x", "args": {}},
                ]
            }
        )
    ).structured_content
    assert out["steps"][0]["result"] == "plain words"
    assert out["steps"][1]["error"] == {"code": "UNKNOWN", "message": "bad", "retriable": False}


async def test_an_unknown_tool_is_refused_before_anything_runs(pipeline, standins):
    r = await pipeline({"steps": [{"tool": "x", "args": {}}, {"tool": "mesages_send", "args": {}}]})
    out = r.structured_content
    assert r.is_error is False and out["aborted"] is True
    assert out["steps"][1]["error"] == {
        "code": "UNKNOWN_TOOL",
        "message": "Tool 'mesages_send' not found.",
        "retriable": False,
    }
    assert r.content[0].text == "**Pipeline rejected** (UNKNOWN_TOOL): Tool 'mesages_send' not found."
    assert standins.calls == []


async def test_each_step_is_audited_as_a_call_of_its_own(standins):
    audit = AuditLog(keep=True)
    config = make_config(pipe={"mcp_pipeline": True})
    async with open_app(config, extra_sources=[standins.registry], audit=audit) as app, Client(app.server) as c:
        await c.call_tool(
            "mcp_pipeline", {"steps": [{"id": "a", "tool": "x", "args": {}}, {"id": "b", "tool": "x", "args": {}}]}
        )
    records = audit.records or []
    assert [(r["tool"], r["step"]) for r in records] == [("x", "a"), ("x", "b"), ("mcp_pipeline", None)]
    assert records[0]["pipeline"] == records[1]["pipeline"] is not None


async def test_a_step_the_caller_may_not_call_is_forbidden_before_anything_runs(standins):
    environ = {"TOKEN": "t"}
    config = make_config(
        environ,
        pipe={"mcp_pipeline": True},
        auth={"tokens": [{"env": "TOKEN", "principal": "p", "tools": ["mcp_pipeline", "x"]}]},
    )
    async with open_app(config, extra_sources=[standins.registry]) as app:
        tool = app.gateway.get("mcp_pipeline")
        assert tool is not None
        from mcpipe.tools import ToolContext

        result = await tool.call(
            {"steps": [{"tool": "x", "args": {}}, {"tool": "messages_send", "args": {}}]},
            ToolContext(principal="p", tools=app.gateway),
        )
    assert result.structured["steps"][1]["error"]["code"] == "FORBIDDEN"
    assert standins.calls == []


# --- the switches ---------------------------------------------------------------------------------------------


async def test_mcp_pipeline_is_served_only_when_the_config_asks_for_it():
    async with open_app(make_config()) as app, Client(app.server) as c:
        names = {t.name for t in (await c.list_tools()).tools}
    assert "mcp_pipeline" not in names and "mcp_pipe" in names


def test_two_mcp_pipeline_tools_under_one_name_are_a_located_config_error():
    server = {"command": sys.executable, "args": [SERVER], "mcp_pipeline": True, "prefix": ""}
    with pytest.raises(ConfigError) as caught:
        make_config(pipe={"mcp_pipeline": True}, mcpServers={"discord": server})
    assert [p.location for p in caught.value.problems] == ["mcpServers.discord.mcp_pipeline"]


async def test_a_fronted_server_with_no_prefix_serves_mcp_pipeline_under_its_bare_name():
    server = {"command": sys.executable, "args": [SERVER], "mcp_pipeline": True, "prefix": ""}
    async with open_app(make_config(builtins=False, mcpServers={"discord": server})) as app, Client(app.server) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        r = await c.call_tool("mcp_pipeline", {"steps": [{"tool": "channels_list", "args": {"guild_id": "g"}}]})
    assert "1-based" in (tools["mcp_pipeline"].description or "")  # mcpipe's, not the server's own
    assert r.structured_content["steps"][0]["result"]["guild_id"] == "g"
