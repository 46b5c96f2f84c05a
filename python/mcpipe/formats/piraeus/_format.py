"""piraeus as a format of mcpipe: the ``[piraeus]`` section's tools, prompts and flows served, its tools
joining the workflow tool (see ``mcpipe.formats``)."""

from __future__ import annotations

from typing import Any

from mcpipe.errors import Problem
from mcpipe.formats import Context, Format, ToolSource

__all__ = ["FORMAT", "PiraeusFormat"]


class PiraeusFormat(Format):
    """piraeus's exported tool configs, prompts and flows (``docs/formats/piraeus.md``)."""

    name = "piraeus"
    section = "piraeus"
    serves_workflow = True  # piraeus's workflow (the config's, its tools added) is the workflow tool

    def load(self, ctx: Context) -> tuple[Any, list[Problem]]:
        from mcpipe.formats.piraeus import decode_piraeus, load_piraeus

        section, problems = decode_piraeus(ctx.section(self))
        if section is None:
            return (None, None), problems
        # ctx.workflow: the config's own, checked (its problems are the context's)
        loaded, found = load_piraeus(section, ctx.models, ctx.workflow, base_dir=ctx.config.base_dir, limits=ctx.limits)
        return (section, loaded), [*problems, *found]

    def decoded(self, loaded: Any) -> Any:
        return loaded[0]

    def tool_sources(self, ctx: Context) -> list[ToolSource]:
        piraeus = ctx.load(self)[1]  # compiled once per load
        if piraeus is None:
            return []
        if piraeus.workflow is None:
            return [piraeus.source()]
        from mcpipe.workflow import WorkflowTool

        tool: Any = WorkflowTool(piraeus.workflow)  # the workflow over its tools and the configured ones
        return [tool, piraeus.source()]

    def problems(self, ctx: Context) -> list[Problem]:
        ctx.load(self)  # its problems join the context's
        return []

    def counts(self, ctx: Context) -> dict[str, int]:
        piraeus = ctx.load(self)[1]
        if piraeus is None:
            return {}
        counts = {f"piraeus {kind[:-1]}": len(getattr(piraeus, kind)) for kind in ("tools", "prompts", "flows")}
        if piraeus.workflow is not None:
            counts["workflow tool"] = 1
        return counts


FORMAT = PiraeusFormat()
