"""discord-mcp's ``mcp_pipeline`` (seed 001; jhm1909/discord-mcp, cappyeo/discord-mcp), run by mcpipe.

A call is checked as discord's input schema checks it, translated into mcpipe's one plan (one tool leaf per
step: :mod:`mcpipe.formats.discord._steps`), run by the one scheduler through the gateway, and answered in
discord's shape (:mod:`mcpipe.formats.discord._answer`). :func:`pipeline_tool` serves it; the server adds
one when the config asks (``[pipe] mcp_pipeline = true``: over every tool; ``mcp_pipeline = true`` on a
downstream server in ``mcpServers``: over that discord-mcp server's tools, in place of its own).
``docs/formats/discord.md`` says what is discord's, what seed 001 adds, and what differs, with reasons.
"""

from __future__ import annotations

from mcpipe.formats.discord._steps import PIPELINE_TOOL, js_truthy, parse_steps
from mcpipe.formats.discord._tool import DiscordDialect, pipeline_tool

__all__ = ["PIPELINE_TOOL", "DiscordDialect", "js_truthy", "parse_steps", "pipeline_tool"]
