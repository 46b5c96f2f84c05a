"""discord-mcp's ``mcp_pipeline`` (seed 001; jhm1909/discord-mcp, cappyeo/discord-mcp), run by mcpipe.

A call is checked as discord's input schema checks it, translated into mcpipe's one plan (one tool leaf per
step: :mod:`mcpipe.formats.discord._steps`), run by the one scheduler through the gateway, and answered in
discord's shape (:mod:`mcpipe.formats.discord._answer`). :func:`pipeline_tool` serves it; the server adds
one when the config asks (``[pipe] mcp_pipeline = true``: over every tool; ``mcp_pipeline = true`` on a
downstream server in ``mcpServers``: over that discord-mcp server's tools, in place of its own).
``docs/formats/discord.md`` says what is discord's, what seed 001 adds, and what differs, with reasons.
"""

from __future__ import annotations

from collections.abc import Iterable

from mcpipe.formats.discord._steps import PIPELINE_TOOL, js_truthy, parse_steps
from mcpipe.formats.discord._tool import DiscordDialect, pipeline_tool
from mcpipe.plan import Limits
from mcpipe.tools import ToolRegistry

__all__ = ["DiscordDialect", "discord_source", "js_truthy", "parse_steps", "pipeline_tool"]


def discord_source(everywhere: bool, fronted: Iterable[str], limits: Limits) -> ToolRegistry | None:
    """The ``mcp_pipeline`` tools a config asks for, as a tool source (None: none).

    Args:
        everywhere: serve ``mcp_pipeline`` over every tool (``[pipe] mcp_pipeline``).
        fronted: the prefixes of the downstream servers marked ``mcp_pipeline = true``: each gets
            ``<prefix>.mcp_pipeline`` (``mcp_pipeline`` for an empty prefix) over its own tools.
        limits: the server's limits.
    """
    tools = {PIPELINE_TOOL: pipeline_tool(PIPELINE_TOOL, limits=limits)} if everywhere else {}
    for prefix in fronted:
        name = f"{prefix}.{PIPELINE_TOOL}" if prefix else PIPELINE_TOOL
        tools[name] = pipeline_tool(name, prefix=prefix, limits=limits)
    return ToolRegistry(tools.values()) if tools else None
