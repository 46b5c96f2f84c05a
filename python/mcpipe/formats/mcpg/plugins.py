"""mcpg's plugins by their ids, given their mcpg meaning in mcpipe.

The mcpg front-end (``mcpipe.formats.mcpg``) hands this module two things: the file's top-level
``plugins:`` entries, and every ``cred://<plugin_id>/<target>`` reference a binding makes. Each plugin id
mcpipe can honour is translated into sections of mcpipe's own config layout (``out``); any other is
refused, located, naming the plugin and why. Nothing that guards access is ever ignored silently.

This is a placeholder with the agreed signatures: every plugin is refused until its meaning is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcpipe.errors import Problem

__all__ = ["credential_ref", "translate_plugins"]

_CODE = "INVALID_CONFIG"


def _plugin_id(entry: Any) -> str | None:
    if isinstance(entry, str):
        return entry
    if isinstance(entry, Mapping):
        value = entry.get("id", entry.get("name"))
        return value if isinstance(value, str) else None
    return None


def translate_plugins(
    entries: Any, loc: str, out: dict[str, Any], problems: list[Problem], environ: Mapping[str, str]
) -> None:
    """Read mcpg's ``plugins:`` list (at ``loc``): each plugin's meaning added to ``out`` (a config document
    in mcpipe's layout, being built), or a located problem appended to ``problems``."""
    if not isinstance(entries, list):
        problems.append(Problem(loc, _CODE, "mcpg's `plugins` is a list of plugin entries"))
        return
    for i, entry in enumerate(entries):
        pid = _plugin_id(entry)
        problems.append(Problem(f"{loc}[{i}]", _CODE, f"mcpg's plugin {pid!r} is not supported by mcpipe"))


def credential_ref(uri: str, loc: str, out: dict[str, Any], problems: list[Problem]) -> str | None:
    """The name of mcpipe's outbound credential that a ``cred://<plugin_id>/<target>`` reference (at
    ``loc``) stands for, or None (a located problem appended)."""
    problems.append(Problem(loc, _CODE, f"credential reference {uri!r} is not supported by mcpipe"))
    return None
