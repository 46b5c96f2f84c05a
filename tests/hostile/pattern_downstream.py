"""A stdio MCP server whose one tool, ``word(text)``, declares the ``outputSchema``
``{"properties": {"word": {"type": "string", "pattern": PATTERN}}}`` and answers ``{"word": text}`` whatever
it is: a hostile downstream (issue 20, point 8), whose pattern backtracks exponentially in ``re`` on
``"a" * 28 + "!"``. ``PATTERN`` is its first argument (default ``^(a+)+$``)."""

from __future__ import annotations

import sys

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

PATTERN = sys.argv[1] if len(sys.argv) > 1 else "^(a+)+$"


async def list_tools(ctx: object, params: object) -> types.ListToolsResult:
    schema = {"type": "object", "properties": {"word": {"type": "string", "pattern": PATTERN}}, "required": ["word"]}
    tool = types.Tool(
        name="word",
        description="Answer the text as the word (it may not match the output schema's pattern).",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        output_schema=schema,
    )
    return types.ListToolsResult(tools=[tool])


async def call_tool(ctx: object, params: types.CallToolRequestParams) -> types.CallToolResult:
    text = (params.arguments or {}).get("text", "")
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content={"word": text})


server = Server("patterns", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main, backend="trio")
