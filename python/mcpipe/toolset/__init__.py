"""The operator's view of the tools (``[tools]``, ``docs/gateway.md``): tools reshaped (name, title,
description, arguments renamed, fixed or defaulted, the answer projected by JSONata or CEL, annotations),
originals hidden, and tool search (``discovery = "search"``: ``search_tools`` ranks tools by BM25 and
``describe_tools`` gives their schemas, so ``tools/list`` shows only those, ``mcp_pipe`` and the pinned tools).

The gateway applies the view (:class:`Toolset`), so what a caller lists, calls, chains in ``mcp_pipe``, is
granted and is audited is the reshaped tool.
"""

from mcpipe.toolset._config import ArgumentShape, ReshapeConfig, ToolsConfig
from mcpipe.toolset._reshape import ReshapedTool, compile_reshape
from mcpipe.toolset._search import DESCRIBE_TOOL, SEARCH_TOOL, SearchIndex, search_tools
from mcpipe.toolset._view import Toolset, check_tools

__all__ = [
    "DESCRIBE_TOOL",
    "SEARCH_TOOL",
    "ArgumentShape",
    "ReshapeConfig",
    "ReshapedTool",
    "SearchIndex",
    "ToolsConfig",
    "Toolset",
    "check_tools",
    "compile_reshape",
    "search_tools",
]
