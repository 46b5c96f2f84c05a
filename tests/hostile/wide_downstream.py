"""A hostile MCP server over streamable HTTP on 127.0.0.1 (issue 27, item 11): one ``tools/list`` answer of
``WIDE_TOOLS`` tools (``t0``, ``t1``, ...; 100 000 by default), each with a small input schema. Prints its URL.

    python wide_downstream.py PORT
"""

from __future__ import annotations

import os
import sys
from functools import partial
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


async def main(port: int) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    cfg = Config()
    cfg.bind = [f"127.0.0.1:{port}"]
    cfg.accesslog = None
    cfg.graceful_timeout = 0.5
    app = server.streamable_http_app()
    async with trio.open_nursery() as n:
        binds = await n.start(partial(serve, app, cfg))
        print(binds[0] + "/mcp", flush=True)


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 0)
