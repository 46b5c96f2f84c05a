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
        """``mcp_pipeline`` over every tool (``[pipe] mcp_pipeline``), and ``<prefix>.mcp_pipeline``
        (``mcp_pipeline`` for an empty prefix) over the tools of each downstream server marked
        ``mcp_pipeline = true``."""
        from mcpipe.formats.discord import PIPELINE_TOOL, pipeline_tool
        from mcpipe.tools import ToolRegistry

        limits = ctx.limits
        tools = {PIPELINE_TOOL: pipeline_tool(PIPELINE_TOOL, limits=limits)} if ctx.config.pipe.mcp_pipeline else {}
        for name, s in ctx.config.mcpServers.items():
            if s.enabled and s.mcp_pipeline:
                prefix = name if s.prefix is None else s.prefix
                tool = f"{prefix}.{PIPELINE_TOOL}" if prefix else PIPELINE_TOOL
                tools[tool] = pipeline_tool(tool, prefix=prefix, limits=limits)
        # Before the downstream servers (appended by open_app): a fronted discord-mcp's own `mcp_pipeline` is
        # shadowed by this one, which runs its steps over that server's tools.
        return [ToolRegistry(tools.values())] if tools else []


FORMAT = DiscordFormat()
