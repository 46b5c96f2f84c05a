"""NoETL as a format of mcpipe: the config's ``playbooks`` served as tools (see ``mcpipe.formats``).

The playbooks are compiled once per load (:meth:`NoetlFormat.load`, kept by the context's table); the other
methods read that one result.
"""

from __future__ import annotations

from typing import Any

from mcpipe.errors import Problem
from mcpipe.formats import Context, Format, ToolSource

__all__ = ["FORMAT", "NoetlFormat"]


class NoetlFormat(Format):
    """NoETL's playbooks (``noetl.io/v2`` and the older layout, seed 004's ``mcp:`` turns on top)."""

    name = "noetl"
    section = "playbooks"

    def load(self, ctx: Context) -> tuple[Any, list[Problem]]:
        from mcpipe.formats.noetl import load_playbooks

        entries = ctx.section(self)  # a list (the config's shape), as written or decoded
        return load_playbooks(
            entries if isinstance(entries, list) else [],
            ctx.models,
            base_dir=ctx.config.base_dir,
            limits=ctx.limits,
            policy=ctx.policy,
        )

    def decoded(self, loaded: Any) -> Any:
        return loaded.entries

    def tool_sources(self, ctx: Context) -> list[ToolSource]:
        from mcpipe.formats.noetl import PlaybookTools

        tools = ctx.load(self).tools
        return [PlaybookTools(tools)] if tools else []

    def problems(self, ctx: Context) -> list[Problem]:
        ctx.load(self)  # its problems join the context's
        return []

    def counts(self, ctx: Context) -> dict[str, int]:
        return {"playbook": ctx.load(self).files}


FORMAT = NoetlFormat()
