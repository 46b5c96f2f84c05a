"""Playbooks (seed 004): NoETL's playbooks with the ``mcp:`` extension, kept under their old name.

The NoETL front-end lives in :mod:`mcpipe.formats.noetl`; this module answers the same names (looked up
when first used, so that the format can import the Jinja environment in :mod:`mcpipe.playbooks._jinja`
without a cycle).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "Playbook",
    "PlaybookDialect",
    "PlaybookTools",
    "action_types",
    "compile_playbook",
    "load_playbook",
    "model_problems",
    "model_sources",
    "playbook_tool",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("mcpipe.formats.noetl"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
