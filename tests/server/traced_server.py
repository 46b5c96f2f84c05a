"""A downstream MCP server (stdio) whose one tool, ``traceparent``, answers the W3C ``traceparent`` its
request carried in ``_meta`` (or ``none``): what the tracing tests read to see the trace carried on."""

from __future__ import annotations

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("traced")


@server.tool()
def traceparent(ctx: Context) -> str:
    """The traceparent of this request's _meta."""
    meta = ctx.request_context.meta or {}
    return str(meta.get("traceparent", "none"))


if __name__ == "__main__":
    server.run("stdio")
