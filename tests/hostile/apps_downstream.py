"""A stdio MCP server serving one MCP App, ``ui://w/app``, whose ``_meta`` (listed and read) is the JSON of the
``UI_META`` environment variable: a hostile downstream of the apps policy tests."""

from __future__ import annotations

import json
import os

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

META = json.loads(os.environ.get("UI_META", "{}"))
MIME = "text/html;profile=mcp-app"


async def list_tools(ctx: object, params: object) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[])


async def list_templates(ctx: object, params: object) -> types.ListResourceTemplatesResult:
    return types.ListResourceTemplatesResult(resource_templates=[])


async def list_resources(ctx: object, params: object) -> types.ListResourcesResult:
    res = types.Resource(name="app", uri="ui://w/app", mime_type=MIME, _meta=META)
    return types.ListResourcesResult(resources=[res])


async def read_resource(ctx: object, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    content = types.TextResourceContents(uri=params.uri, mime_type=MIME, text="<p>app</p>", _meta=META)
    return types.ReadResourceResult(contents=[content])


server = Server(
    "apps",
    on_list_tools=list_tools,
    on_list_resources=list_resources,
    on_list_resource_templates=list_templates,
    on_read_resource=read_resource,
)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main, backend="trio")
