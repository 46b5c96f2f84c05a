"""NoETL as a format of mcpipe: the config's ``playbooks`` served as tools (see ``mcpipe.formats``)."""

from __future__ import annotations

from mcpipe.errors import ConfigError, Problem
from mcpipe.formats import Context, Format, ToolSource

__all__ = ["FORMAT", "NoetlFormat"]


class NoetlFormat(Format):
    """NoETL's playbooks (``noetl.io/v2`` and the older layout, seed 004's ``mcp:`` turns on top)."""

    name = "noetl"

    def tool_sources(self, ctx: Context) -> list[ToolSource]:
        from mcpipe.formats.noetl import PlaybookTools, load_playbooks

        loaded, problems = load_playbooks(ctx.config, ctx.models, policy=ctx.policy, limits=ctx.limits)
        if problems:
            raise ConfigError(problems)
        return [PlaybookTools(loaded)] if loaded else []

    def problems(self, ctx: Context) -> list[Problem]:
        from mcpipe.formats.noetl import load_playbooks

        return load_playbooks(ctx.config, ctx.models)[1]

    def counts(self, ctx: Context) -> dict[str, int]:
        from mcpipe.formats.noetl import playbook_count

        return {"playbook": playbook_count(ctx.config)}


FORMAT = NoetlFormat()
