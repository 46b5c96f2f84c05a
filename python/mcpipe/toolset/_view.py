"""The operator's view of the gateway's tools: the reshaped tools in front, the hidden ones gone, and what
``tools/list`` shows in search mode."""

from __future__ import annotations

from collections.abc import Callable

from mcpipe._util import PIPE_TOOL, glob_matcher
from mcpipe.errors import ConfigError, Problem
from mcpipe.tools import Tool
from mcpipe.toolset._config import ToolsConfig
from mcpipe.toolset._reshape import ReshapedTool, compile_reshape
from mcpipe.toolset._search import DESCRIBE_TOOL, SEARCH_TOOL

__all__ = ["Toolset", "check_tools"]


def check_tools(cfg: ToolsConfig) -> list[Problem]:
    """The ``[tools]`` section's problems (each reshaped tool's arguments and expression), located."""
    problems: list[Problem] = []
    for name, shape in cfg.reshape.items():
        _, found = compile_reshape(name, shape, f"tools.reshape.{name}")
        problems.extend(found)
        if name in (PIPE_TOOL, SEARCH_TOOL, DESCRIBE_TOOL):
            problems.append(Problem(f"tools.reshape.{name}", "INVALID_CONFIG", f"`{name}` is mcpipe's own tool"))
    return problems


class Toolset:
    """What the gateway serves of its sources' tools, as ``[tools]`` says.

    Args:
        cfg: the ``[tools]`` section (checked: :func:`check_tools`).
        lookup: the sources' own lookup (the originals, hidden or not).
    """

    def __init__(self, cfg: ToolsConfig, lookup: Callable[[str], Tool | None]) -> None:
        self.cfg = cfg
        self.shaped: dict[str, ReshapedTool] = {}
        problems: list[Problem] = []
        for name, shape in cfg.reshape.items():
            output, found = compile_reshape(name, shape, f"tools.reshape.{name}")
            problems.extend(found)
            self.shaped[name] = ReshapedTool(name, shape, lookup, output)
        if problems:
            raise ConfigError(problems)
        originals = {s.tool for n, s in cfg.reshape.items() if s.hide_original or s.tool == n}
        patterns = glob_matcher(cfg.hide) if cfg.hide else None
        self._originals = frozenset(originals - set(self.shaped))
        self._patterns = patterns
        self.search = cfg.discovery == "search"
        self._pinned = glob_matcher([*cfg.pinned, SEARCH_TOOL, DESCRIBE_TOOL, PIPE_TOOL])

    def hides(self, name: str) -> bool:
        """Whether ``name`` is neither listed nor callable (a reshaped tool's hidden original, a hidden tool)."""
        if name in self.shaped:
            return False
        return name in self._originals or (self._patterns is not None and self._patterns(name))

    def listed(self, name: str) -> bool:
        """Whether ``tools/list`` shows ``name`` (in search mode: the search tools, ``mcp_pipe``, the pinned)."""
        return not self.search or self._pinned(name)
