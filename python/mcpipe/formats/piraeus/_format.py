"""piraeus as a format of mcpipe: the ``[piraeus]`` section's tools, prompts and flows served, its tools
joining the workflow tool (see ``mcpipe.formats``)."""

from __future__ import annotations

from typing import Any

from mcpipe.errors import ConfigError, Problem
from mcpipe.formats import Context, Format, ToolSource

__all__ = ["FORMAT", "PiraeusFormat"]


class PiraeusFormat(Format):
    """piraeus's exported tool configs, prompts and flows (``docs/formats/piraeus.md``)."""

    name = "piraeus"
    serves_workflow = True  # piraeus's workflow (the config's, its tools added) is the workflow tool

    def _load(self, ctx: Context) -> tuple[Any, list[Problem]]:
        from mcpipe.formats.piraeus import load_piraeus

        return load_piraeus(ctx.config, ctx.models, ctx.workflow)

    def tool_sources(self, ctx: Context) -> list[ToolSource]:
        piraeus, problems = self._load(ctx)
        if problems:
            raise ConfigError(problems)
        out: list[ToolSource] = []
        if piraeus.workflow is not None:
            from mcpipe.workflow import WorkflowTool

            tool: Any = WorkflowTool(piraeus.workflow)  # the workflow over its tools and the configured ones
            out.append(tool)
        out.append(piraeus.source())
        return out

    def problems(self, ctx: Context) -> list[Problem]:
        return self._load(ctx)[1]

    def counts(self, ctx: Context) -> dict[str, int]:
        piraeus, _ = self._load(ctx)
        if piraeus is None:
            return {}
        counts = {
            "piraeus tool": len(piraeus.tools),
            "piraeus prompt": len(piraeus.prompts),
            "piraeus flow": len(piraeus.flows),
        }
        if piraeus.workflow is not None:
            counts["workflow tool"] = 1
        return counts


FORMAT = PiraeusFormat()
