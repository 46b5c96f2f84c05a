"""discord-mcp as a format of mcpipe: its ``mcp_pipeline`` tool, served over every tool (``[pipe]
mcp_pipeline = true``) or in place of a fronted discord-mcp's own (``mcp_pipeline = true`` on a downstream
server), see ``mcpipe.formats``."""

from __future__ import annotations

from mcpipe.formats import Context, Format, ToolSource

__all__ = ["FORMAT", "DiscordFormat"]


class DiscordFormat(Format):
    """discord-mcp's ``mcp_pipeline`` (``docs/formats/discord.md``)."""

    name = "discord"

    def tool_sources(self, ctx: Context) -> list[ToolSource]:
        from mcpipe.formats.discord import discord_source

        config = ctx.config
        fronted = [
            name if s.prefix is None else s.prefix
            for name, s in config.mcpServers.items()
            if s.enabled and s.mcp_pipeline
        ]
        # Before the downstream servers (appended by open_app): a fronted discord-mcp's own `mcp_pipeline` is
        # shadowed by this one, which runs its steps over that server's tools.
        source = discord_source(config.pipe.mcp_pipeline, fronted, ctx.limits)
        return [source] if source is not None else []


FORMAT = DiscordFormat()
