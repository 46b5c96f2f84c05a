"""A stdio MCP server whose tools declare every field of MCP's ``Tool``: the downstream of the tests that mcpipe
lists a downstream tool as the server declared it (``tests/server/test_downstream_declarations.py``).

Its tools: ``chart``, an MCP App (``_meta.ui.resourceUri`` naming its ``ui://charts/chart`` resource, the
``openai/*`` keys, a vendor's own key) with a title, annotations, icons and an output schema; ``plain``, a bare
name, description and input schema; ``queued``, which says it supports tasks (``execution``); and ``odd``,
whose ``_meta.ui`` is ill-typed (a number for a URI, a string for a list).
"""

from __future__ import annotations

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

MIME = "text/html;profile=mcp-app"
ICON = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="
)
OBJECT = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

CHART_META = {
    "ui": {
        "resourceUri": "ui://charts/chart",
        "visibility": ["model", "app"],
        "csp": {"connectDomains": ["https://a.example", "https://evil.example"]},
        "permissions": {"camera": {}, "clipboardWrite": {}},
    },
    "openai/outputTemplate": "ui://charts/chart",
    "openai/widgetAccessible": True,
    "openai/widgetCSP": {"connect_domains": ["https://a.example", "https://evil.example"]},
    "vendor.example/rank": {"n": 1, "tags": ["x"]},
}
ODD_META = {"ui": {"resourceUri": 5, "visibility": "app"}, "vendor.example/rank": 2}

TOOLS = [
    types.Tool(
        name="chart",
        title="Chart",
        description="Draw a chart of n points.",
        input_schema=OBJECT,
        output_schema={"type": "object", "properties": {"points": {"type": "array"}}},
        annotations=types.ToolAnnotations(title="Chart it", read_only_hint=True, open_world_hint=False),
        icons=[types.Icon(src=ICON, mime_type="image/png", sizes=["1x1"], theme="light")],
        _meta=CHART_META,
    ),
    types.Tool(name="plain", description="Nothing but the basics.", input_schema=OBJECT),
    types.Tool(
        name="queued",
        description="Says it supports tasks.",
        input_schema=OBJECT,
        execution=types.ToolExecution(task_support="optional"),
    ),
    types.Tool(name="odd", description="Ill-typed app metadata.", input_schema=OBJECT, _meta=ODD_META),
]


async def list_tools(ctx: object, params: object) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: object, params: types.CallToolRequestParams) -> types.CallToolResult:
    n = int((params.arguments or {}).get("n", 0))
    points = list(range(n))
    return types.CallToolResult(content=[types.TextContent(text=str(points))], structured_content={"points": points})


async def list_resources(ctx: object, params: object) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[types.Resource(name="chart", uri="ui://charts/chart", mime_type=MIME)])


async def list_templates(ctx: object, params: object) -> types.ListResourceTemplatesResult:
    return types.ListResourceTemplatesResult(resource_templates=[])


async def read_resource(ctx: object, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    content = types.TextResourceContents(uri=params.uri, mime_type=MIME, text="<p>chart</p>")
    return types.ReadResourceResult(contents=[content])


server = Server(
    "toolmeta",
    on_list_tools=list_tools,
    on_call_tool=call_tool,
    on_list_resources=list_resources,
    on_list_resource_templates=list_templates,
    on_read_resource=read_resource,
)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main, backend="trio")
