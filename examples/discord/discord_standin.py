"""A stand-in of discord-mcp (cappyeo/discord-mcp) for the example: the three tools its recipe "Chain three
calls" uses, with their names, arguments and answers shaped as discord-mcp's (the message, event and role ids
of the recipe's own output), and no Discord behind them. The real server: `npx -y @discord-mcp/cli` with a
bot's DISCORD_TOKEN ([docs/formats/discord.md](../../docs/formats/discord.md)).

    python examples/discord/discord_standin.py     # stdio, as examples/discord/mcpipe.yaml starts it
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer

server = MCPServer("discord-standin")
GUILD = "111122223333444455"


def _iso(value: str) -> str:
    """A time as Discord writes it back (milliseconds added)."""
    return value[:-1] + ".000Z" if value.endswith("Z") and "." not in value else value


@server.tool()
def messages_send(channel_id: str, content: str) -> dict[str, Any]:
    """Send a message to a channel."""
    mid = "888899990000111122"
    return {
        "message_id": mid,
        "channel_id": channel_id,
        "jump_url": f"https://discord.com/channels/{GUILD}/{channel_id}/{mid}",
        "timestamp": "2030-01-01T16:30:00.000Z",
    }


@server.tool()
def events_create(
    guild_id: str,
    name: str,
    scheduled_start_time: str,
    scheduled_end_time: str,
    entity_type: int,
    privacy_level: int,
    entity_metadata: dict[str, Any] | None = None,
    description: str = "",
) -> dict[str, Any]:
    """Create a scheduled event in a guild."""
    return {
        "id": "333344445555666677",
        "guild_id": guild_id,
        "name": name,
        "description": description,
        "scheduled_start_time": _iso(scheduled_start_time),
        "scheduled_end_time": _iso(scheduled_end_time),
        "status": 1,
        "entity_type": entity_type,
        "channel_id": None,
    }


@server.tool()
def members_add_role(guild_id: str, user_id: str, role_id: str) -> dict[str, Any]:
    """Give a member a role."""
    return {"added": True, "user_id": user_id, "role_id": role_id}


if __name__ == "__main__":
    server.run()
