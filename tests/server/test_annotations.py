"""Tool annotations (MCP's hints): the built-in tools say what they do, and ``mcp_pipe`` says what its steps
may do, from the hints of the tools it can call (on ``mcpipe serve`` and on ``attach``)."""

from __future__ import annotations

from typing import Any

from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations
from serverkit import make_config, running

from mcpipe.gateway import PIPE_TOOL
from mcpipe.server import attach, open_app

PURE = {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}


async def listed(server: Any) -> dict[str, dict[str, Any]]:
    async with Client(server) as client:
        tools = (await client.list_tools()).tools
    return {
        t.name: (t.annotations.model_dump(by_alias=True, exclude_none=True) if t.annotations else {}) for t in tools
    }


async def test_built_in_tools_are_annotated_and_mcp_pipe_over_them_is_read_only_but_open_world():
    async with open_app(make_config()) as app:
        hints = await listed(app.server)
    for name in ("echo", "json_parse", "json_dump", "text_join", "text_split", "text_replace"):
        assert hints[name] == PURE, name
    assert hints["now"] == {**PURE, "idempotentHint": False}
    assert hints["ask_user"]["openWorldHint"] is True and hints["ask_user"]["readOnlyHint"] is True
    assert hints["list_roots"] == PURE
    # every tool it can call only reads; ask_user and sample reach outside
    assert hints[PIPE_TOOL] == {**PURE, "idempotentHint": False, "openWorldHint": True}


async def test_a_tool_without_hints_makes_mcp_pipe_a_possibly_destructive_open_world_tool():
    async with running() as app:  # the built-ins beside the test tools, which say nothing
        hints = await listed(app.server)
    assert hints["slow"] == {}
    assert hints[PIPE_TOOL] == {
        "readOnlyHint": False,
        "destructiveHint": True,
        "idempotentHint": False,
        "openWorldHint": True,
    }


async def test_attached_mcp_pipe_takes_its_hints_from_the_hosts_tools():
    app = MCPServer("ro")

    @app.tool(annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False))
    def lookup(key: str) -> str:
        """Read a key."""
        return key

    hints = await listed(attach(app))
    assert hints[PIPE_TOOL] == PURE
