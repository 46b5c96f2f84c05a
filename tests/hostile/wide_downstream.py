"""A hostile MCP server over streamable HTTP on 127.0.0.1 (issue 27, item 11): one ``tools/list`` answer of
``WIDE_TOOLS`` tools (``t0``, ``t1``, ...; 100 000 by default), each with a small input schema. Prints its URL.

    python wide_downstream.py PORT
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import mcp_types as types
import trio
from mcp.server.lowlevel.server import Server

N = int(os.environ.get("WIDE_TOOLS", "100000"))
SCHEMA = {"type": "object", "properties": {"q": {"type": "string", "description": "what to look up"}}}


LISTING = types.ListToolsResult(
    tools=[types.Tool(name=f"t{i}", description=f"tool number {i}", input_schema=SCHEMA) for i in range(N)]
)
"""Built once: the server's own cost of a listing is not what is measured."""


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return LISTING


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"{params.name} ok")])


server: Server[Any] = Server("wide", on_list_tools=list_tools, on_call_tool=call_tool)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `kit`: this runs as a script
    from kit.mcp_script import serve_http

    trio.run(serve_http, server.streamable_http_app(), int(sys.argv[1]) if len(sys.argv) > 1 else 0)
