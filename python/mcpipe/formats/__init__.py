"""Foreign formats: other systems' own files, read as they are and compiled into mcpipe's one plan.

Each format is one subpackage that owns everything of it: detecting its files, translating them, the
semantics only it has, its documentation (``docs/formats/<name>.md``) and its tests with the vendored
upstream files (``tests/formats/<name>/``). Adding a format is a new folder and one line here, not edits
across ``config``, ``declared`` and ``kinds``.

| package | system (seed) | what it reads |
|---|---|---|
| ``mcpipe.formats.mcpg`` | mcpg (003) | mcpg config files (``gateway``, ``mcp.capabilities``, ``governance``, ...) |
| ``mcpipe.formats.noetl`` | NoETL (004) | NoETL playbooks (``noetl.io/v2`` and the older layout) |
| ``mcpipe.formats.discord`` | discord-mcp (001) | the ``mcp_pipeline`` tool: its calls and answers |
| ``mcpipe.formats.piraeus`` | piraeus (002) | piraeus's exported tool configs, prompts and flows |

A format never has a scheduler or a plan of its own: it produces what mcpipe's own front-ends take (a
config document in mcpipe's layout, declared pipelines, playbook plans, ``mcp_pipe`` specs) or plan nodes
directly, and the one scheduler runs them.

**Config-file formats.** A format whose files are server configs registers a :class:`ConfigFormat` in
``CONFIG_FORMATS`` (the module path; imported on first use). :func:`mcpipe.config.parse_config` asks
:func:`detect_config` about every decoded document before reading it as mcpipe's own; a format that claims
it translates it into mcpipe's layout (:class:`Translation`), and every problem found afterwards is located
back in the file through ``Translation.locate``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from mcpipe.errors import Problem

__all__ = ["CONFIG_FORMATS", "EXTENSIONS", "ConfigFormat", "Translation", "detect_config", "load_extensions"]


def _same(location: str) -> str:
    return location


@dataclass(slots=True)
class Translation:
    """A foreign document in mcpipe's own layout.

    Attributes:
        raw: the document as mcpipe's config reads it (``mcpipe.config.Config``'s keys).
        problems: what the file has that mcpipe refuses, each located in the file.
        locate: maps a location in ``raw`` (``pipelines.charge.steps[1].url``) to where it is in the file
            (``mcp.capabilities.tools[3].backend.steps[1].url``).
        mapping: ``(where in raw, where in the file)`` of each part that moved, for ``mcpipe convert`` and
            ``mcpipe check --explain``.
    """

    raw: dict[str, Any]
    problems: list[Problem] = field(default_factory=list)
    locate: Callable[[str], str] = _same
    mapping: list[tuple[str, str]] = field(default_factory=list)


class ConfigFormat(Protocol):
    """A config-file format of another system."""

    @property
    def name(self) -> str:
        """Its short name (``mcpg``), used in messages and by ``mcpipe check --explain``."""
        ...

    def detect(self, raw: Mapping[str, Any]) -> bool:
        """Whether the decoded document is one of this format's (by its own keys, never by its path)."""
        ...

    def translate(self, raw: Mapping[str, Any], *, base_dir: str, environ: Mapping[str, str]) -> Translation:
        """The document in mcpipe's layout, with what cannot be honoured refused, located."""
        ...


CONFIG_FORMATS: tuple[str, ...] = ("mcpipe.formats.mcpg",)
"""Modules that define ``FORMAT`` (a :class:`ConfigFormat`), asked in order; the first to claim a document
reads it."""

EXTENSIONS: dict[str, str] = {"mcpg": "mcpipe.formats.mcpg._kinds"}
"""Formats whose translations use step kinds and answer shapes of their own (``kind: mcpg.http``,
``answer: mcpg.binding``): the name before the dot -> the module that registers them. A config in mcpipe's
layout that names one (a translation, or a file ``mcpipe convert`` wrote) loads it first."""


def load_extensions(raw: Mapping[str, Any]) -> None:
    """Import the format modules whose step kinds or answer shapes the ``pipelines`` of ``raw`` name."""
    wanted: set[str] = set()

    def scan(value: Any) -> None:
        if isinstance(value, Mapping):
            for key in ("kind", "answer"):
                name = value.get(key)
                if isinstance(name, str) and "." in name:
                    wanted.add(name.split(".", 1)[0])
            for item in value.values():
                scan(item)
        elif isinstance(value, list):
            for item in value:
                scan(item)

    scan(raw.get("pipelines"))
    for prefix in sorted(wanted & EXTENSIONS.keys()):
        importlib.import_module(EXTENSIONS[prefix])


def detect_config(raw: Mapping[str, Any]) -> ConfigFormat | None:
    """The foreign format a decoded config document is written in, or None for mcpipe's own layout."""
    for module in CONFIG_FORMATS:
        fmt: ConfigFormat = importlib.import_module(module).FORMAT
        if fmt.detect(raw):
            return fmt
    return None
