"""NoETL's ``tool:`` kinds that run code or reach a database (``python``, ``postgres``, ``duckdb``,
``shell``), mapped onto mcpipe's step kinds.

The NoETL front-end (``mcpipe.formats.noetl``) asks :func:`map_tool` for a step's ``tool:`` of one of
:data:`KINDS`; the answer is a declared step in mcpipe's layout (``{"kind": "python", ...}``) whose string
fields are still NoETL's Jinja, rendered by the front-end at run time, or None with a located problem.

This is a placeholder with the agreed signature: every kind is refused until it is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcpipe.errors import Problem

__all__ = ["KINDS", "map_tool"]

KINDS = frozenset({"python", "postgres", "duckdb", "shell"})
"""The NoETL tool kinds this module maps."""


def map_tool(kind: str, tool: Mapping[str, Any], loc: str, problems: list[Problem]) -> dict[str, Any] | None:
    """The mcpipe step for NoETL's ``tool:`` mapping ``tool`` (at ``loc``) of kind ``kind`` (one of
    :data:`KINDS`), or None with a located problem appended to ``problems``."""
    problems.append(Problem(f"{loc}.kind", "INVALID_SPEC", f"NoETL tool kind `{kind}` is not supported yet"))
    return None
