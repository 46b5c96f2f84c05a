"""Issue 17 over MCP: the additions pass the advertised input schema and their answers the output schema."""

from __future__ import annotations

import jsonschema
import trio
from mcp import Client

from kit.servers import running
from mcpipe.gateway import PIPE_TOOL
from mcpipe.server._schema import PIPE_INPUT_SCHEMA, PIPE_OUTPUT_SCHEMA

SPEC = {
    "vars": {"xs": ["a", "b"], "off": False},
    "steps": [
        {"id": "e", "for_each": "${vars.xs}", "as": "item", "step": {"tool": "echo", "args": {"v": "${item}"}}},
        {"id": "s", "tool": "echo", "args": {"v": 1}, "when": "${vars.off}", "continue_on_error": True},
        {"id": "r", "tool": "echo", "args": {"v": "${steps.s.output ?? 'none'}"}},
    ],
}


async def test_a_spec_with_the_additions_runs_over_mcp_and_its_answer_fits_the_output_schema():
    jsonschema.validate(SPEC, PIPE_INPUT_SCHEMA)
    with trio.fail_after(30):
        async with running() as app, Client(app.server) as client:
            await client.list_tools()  # the client knows the output schema, and checks answers against it
            r = await client.call_tool(PIPE_TOOL, {**SPEC, "answer": "full"})
            dry = await client.call_tool(PIPE_TOOL, {**SPEC, "dry_run": True})
    answer = r.structured_content
    assert answer["ok"] is True, answer
    assert answer["steps"]["e"]["output"] == [{"v": "a"}, {"v": "b"}]
    assert answer["steps"]["s"]["skipped"] is True
    assert answer["result"] == {"v": "none"}
    jsonschema.validate(answer, PIPE_OUTPUT_SCHEMA)
    assert dry.structured_content["dry_run"] is True and dry.structured_content["steps"] == {}
    jsonschema.validate(dry.structured_content, PIPE_OUTPUT_SCHEMA)
