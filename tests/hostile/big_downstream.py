"""A stdio MCP server with one tool, ``big(n)``: a text result of ``n`` characters (one long JSON-RPC line)."""

from __future__ import annotations

import anyio
from mcp.server.mcpserver import MCPServer

server = MCPServer("big")


@server.tool()
def big(n: int) -> str:
    """Answer ``n`` characters."""
    return "x" * n


if __name__ == "__main__":
    anyio.run(server.run_stdio_async, backend="trio")
