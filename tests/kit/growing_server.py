"""A stdio MCP server whose tool list grows: ``learn`` adds ``forecast_tomorrow_weather`` and says the list
changed (``notifications/tools/list_changed``), as a server that gains tools at run time does.

    python growing_server.py
"""

from __future__ import annotations

import anyio
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("growing")


def forecast_tomorrow_weather(city: str) -> str:
    """Forecast tomorrow's weather (rain, sun, wind) for a city."""
    return f"sun in {city}"


@server.tool()
async def learn(ctx: Context) -> str:
    """Add a tool, and tell the client the tool list changed."""
    server.add_tool(forecast_tomorrow_weather)
    await ctx.notify_tools_changed()  # a 2026-07-28 client's listen stream
    await ctx.session.send_tool_list_changed()  # a 2025-11-25 client's session
    return "learned"


@server.tool()
def echo(text: str) -> str:
    """Answer the text given."""
    return text


if __name__ == "__main__":
    anyio.run(server.run_stdio_async, backend="trio")
