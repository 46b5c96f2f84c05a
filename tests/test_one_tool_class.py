"""One tool class serves every format's plans: a config holding a declared pipeline, discord-mcp's
``mcp_pipeline``, a NoETL playbook and a piraeus flow serves four :class:`mcpipe.declared.PlanTool`s, each in
its format's dialect, and each answers a call through the SDK's client in its own format's shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
from mcp import Client

from kit.noetl import UPSTREAM
from mcpipe.config import parse_config
from mcpipe.declared import DeclaredDialect, PlanTool
from mcpipe.formats.discord import DiscordDialect
from mcpipe.formats.noetl import PlaybookDialect
from mcpipe.formats.piraeus import FlowDialect
from mcpipe.server import open_app

HELLO = UPSTREAM / "tests/fixtures/playbooks/hello_world/hello_world.yaml"
WAIT_S = 60  # a bound on a hang, not a timing: the first app of a session pays its imports

GREET = {
    "name": "greet",
    "description": "Greet someone.",
    "input_schema": {"type": "object", "properties": {"who": {"type": "string"}}, "required": ["who"]},
    "steps": [{"kind": "transform", "id": "hello", "expression": '{"greeting": "hello " + args.who}'}],
}
GREET_FLOW = {
    "name": "greet_flow",
    "description": "Greet through a flow.",
    "steps": [{"step": 1, "type": "tool", "name": "greet", "inputs": {"who": "${who}"}}],
}


def _config(directory: Path) -> Any:
    (directory / "flows").mkdir()
    (directory / "flows" / "greet_flow.json").write_text(json.dumps(GREET_FLOW))
    doc = {
        "audit": {"enabled": False},
        "builtins": False,
        "pipelines": [GREET],
        "pipe": {"mcp_pipeline": True},
        "playbooks": [str(HELLO)],
        "piraeus": {"flows": "flows/*.json"},
    }
    return parse_config(json.dumps(doc), "json", base_dir=str(directory), environ={})


async def test_every_formats_plan_is_served_by_the_one_tool_class_in_its_own_dialect(tmp_path: Path) -> None:
    dialects = {
        "greet": DeclaredDialect,
        "mcp_pipeline": DiscordDialect,
        "hello_world": PlaybookDialect,
        "greet_flow": FlowDialect,
    }
    with trio.fail_after(WAIT_S):
        async with open_app(_config(tmp_path)) as app:
            served = {name: app.gateway.get(name) for name in dialects}
    for name, dialect in dialects.items():
        tool = served[name]
        assert isinstance(tool, PlanTool), (name, tool)
        assert type(tool.dialect) is dialect, (name, tool.dialect)


async def test_each_format_answers_in_its_own_shape_through_the_one_tool_class(tmp_path: Path) -> None:
    with trio.fail_after(WAIT_S):
        async with open_app(_config(tmp_path)) as app, Client(app.server) as client:
            declared = await client.call_tool("greet", {"who": "ada"})
            refused = await client.call_tool("greet", {})
            discord = await client.call_tool(
                "mcp_pipeline", {"steps": [{"id": "g", "tool": "greet", "args": {"who": "bob"}}]}
            )
            playbook = await client.call_tool("hello_world", {"message": "hi"})
            flow = await client.call_tool("greet_flow", {"who": "cy"})
            flow_missing = await client.call_tool("greet_flow", {})
    # mcpipe's own: the output, structured.
    assert not declared.is_error and declared.structured_content == {"greeting": "hello ada"}
    assert refused.is_error and "invalid arguments for tool 'greet': args: 'who' is a required property" in str(
        refused.content[0]
    )
    # discord's: every step with its status, the variables, and whether it aborted.
    assert not discord.is_error and discord.structured_content is not None
    assert discord.structured_content["aborted"] is False
    assert [(s["id"], s["status"]) for s in discord.structured_content["steps"]] == [("g", "success")]
    # NoETL's: the run as NoETL reports it.
    assert not playbook.is_error and playbook.structured_content is not None
    assert playbook.structured_content["playbook"] == "hello_world"
    assert playbook.structured_content["status"] == "completed"
    # piraeus's: FlowExecuteResponse, its missing input refused in that shape too.
    assert not flow.is_error and flow.structured_content is not None
    assert flow.structured_content["status"] == "success" and flow.structured_content["steps_executed"] == 1
    assert flow.structured_content["outputs"]["step_1_output"] == {"greeting": "hello cy"}
    assert flow_missing.is_error and flow_missing.structured_content is not None
    assert flow_missing.structured_content["error"] == "inputs: who: is required (read as ${who})"
