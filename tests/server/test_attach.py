"""``attach(server)``: mcp_pipe added to an existing SDK server, composing the tools it already has."""

from __future__ import annotations

import runpy
from pathlib import Path

import mcp_types as types
import pytest
from mcp import Client
from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver import MCPServer

from kit.audit import WatchedAudit
from mcpipe.gateway import PIPE_TOOL
from mcpipe.server import attach
from mcpipe.server._schema import PIPE_INPUT_SCHEMA


def weather_server() -> MCPServer:
    app = MCPServer("weather")

    @app.tool()
    def forecast(city: str) -> dict[str, str | int]:
        """A (very) local forecast."""
        return {"city": city, "high": 21 if city == "Lyon" else 12}

    @app.tool()
    def shout(text: str) -> str:
        """Upper-case the text."""
        return text.upper()

    return app


SPEC = {
    "steps": [
        {"id": "f", "tool": "forecast", "args": {"city": "Lyon"}},
        {"id": "s", "tool": "shout", "args": {"text": "${steps.f.structured.city}: ${steps.f.structured.high}C"}},
    ],
    "return": "{{s.result}}",
}


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
async def test_attach_adds_mcp_pipe_to_an_mcpserver_whose_steps_call_its_own_tools(mode):
    audit = WatchedAudit()
    app = attach(weather_server(), audit=audit)
    async with Client(app, mode=mode) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        r = await client.call_tool(PIPE_TOOL, SPEC)
        direct = await client.call_tool("shout", {"text": "still here"})
    assert set(tools) == {PIPE_TOOL, "forecast", "shout"} and tools[PIPE_TOOL].input_schema == PIPE_INPUT_SCHEMA
    assert r.structured_content["result"] == "LYON: 21C" and not r.is_error
    assert direct.structured_content == {"result": "STILL HERE"}
    assert [(x["tool"], x["step"]) for x in audit.records] == [("forecast", "f"), ("shout", "s"), (PIPE_TOOL, None)]


async def test_attach_works_on_a_low_level_server_and_reports_unknown_tools_in_the_answer():
    async def list_tools(ctx, params):
        return types.ListToolsResult(tools=[types.Tool(name="double", input_schema={"type": "object"})])

    async def call_tool(ctx, params):
        n = int((params.arguments or {})["n"])
        return types.CallToolResult(content=[types.TextContent(type="text", text=str(n * 2))])

    server = attach(Server("low", on_list_tools=list_tools, on_call_tool=call_tool))
    spec = {"steps": [{"tool": "double", "args": {"n": 4}}, {"tool": "double", "args": {"n": "${last.text}"}}]}
    async with Client(server) as client:
        r = await client.call_tool(PIPE_TOOL, spec)
        bad = await client.call_tool(PIPE_TOOL, {"steps": [{"tool": "triple"}]})
    assert r.structured_content["result"] == "16"
    assert bad.is_error and bad.structured_content["error_code"] == "UNKNOWN_TOOL"


def test_attach_refuses_a_server_without_tools_and_a_second_attach():
    with pytest.raises(ValueError, match="needs a server with tools"):
        attach(Server("empty"))
    app = attach(weather_server())
    with pytest.raises(ValueError, match="already attached"):
        attach(app)


async def test_the_attach_example_runs_the_pipeline_its_docstring_shows():
    example = runpy.run_path(str(Path(__file__).parents[2] / "examples" / "attach_weather.py"))
    async with Client(example["app"]) as client:
        r = await client.call_tool(PIPE_TOOL, SPEC)
    assert r.structured_content["result"] == "LYON: 21C"
