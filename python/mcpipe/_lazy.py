"""Names of a package loaded on first use: a module ``__getattr__`` for a package whose submodules are slow
to import (the MCP SDK, ``jsonschema``, ``cel``), so a command that never touches them never pays for them.

The package keeps the names importable (``from mcpipe.interaction import call_relaying`` works as before)
and typed: it imports them under ``TYPE_CHECKING`` too, where mypy (and ``scripts/check_layers.py``) see them.

    __getattr__ = lazy_names(__name__, {"call_relaying": "._relay", "Askers": "._relay"})
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping

__all__ = ["lazy_names"]


def lazy_names(package: str, homes: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: ``homes[name]`` is the submodule (relative, ``._relay``,
    or absolute) that defines ``name``, imported on the first read; the value is then kept in the package,
    so later reads do not come here."""

    def __getattr__(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
