"""Small helpers every layer may use: the pipe tool's name, name globs, ``module:attr`` loading, and
telling a suspension from a failure.

They live at the bottom so that no layer has to reach up (the gateway used to take ``glob_matcher`` from
the config, the scheduler and the gateway each had their own copy of the suspension test).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["PIPE_TOOL", "LoadError", "glob_matcher", "is_suspension", "load_attr"]

PIPE_TOOL = "mcp_pipe"
"""The name of the server's own pipeline tool; no step may call it and no other tool may take it."""


def glob_matcher(patterns: list[str]) -> Callable[[str], bool]:
    """A predicate matching tool names against ``*``-globs (``*`` alone matches everything)."""
    if "*" in patterns:
        return lambda _name: True
    exact = frozenset(p for p in patterns if "*" not in p)
    globs = [re.compile(re.escape(p).replace(r"\*", ".*") + r"\Z") for p in patterns if "*" in p]
    if not globs:
        return exact.__contains__
    return lambda name: name in exact or any(g.match(name) for g in globs)


def is_suspension(exc: BaseException) -> bool:
    """Whether ``exc`` is a pipeline suspending to ask its 2026-07-28 client (``mcpipe.interaction``), alone
    or as the only content of a group: not a failure, the call resumes on the client's retry."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_suspension(e) for e in exc.exceptions)
    return getattr(exc, "suspends_pipeline", False) is True


class LoadError(Exception):
    """A ``module:attr`` entry that cannot be loaded.

    Attributes:
        malformed: True when the entry is not of the form ``MODULE:ATTR`` (callers word that themselves).
    """

    def __init__(self, message: str, *, malformed: bool = False) -> None:
        super().__init__(message)
        self.malformed = malformed


def load_attr(entry: str, note: str = "") -> Any:
    """Import ``MODULE:ATTR`` (``ATTR`` may be dotted) and answer the object.

    One rule for every entry point (``mcpipe run --tools``, the config's ``python_tools``): the form is
    ``MODULE:ATTR``, and the current directory is importable (a console script does not put it on
    ``sys.path``; ``python -m`` does).

    Args:
        entry: ``MODULE:ATTR``.
        note: added to the messages after what failed (``" (from --tools x:y)"``).

    Raises:
        LoadError: the entry is malformed, the module cannot be imported, or it has no such attribute.
    """
    module_name, sep, attr = entry.partition(":")
    if not sep or not module_name or not attr:
        raise LoadError(f"expected MODULE:ATTR, got {entry!r}", malformed=True)
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # importing runs the module's code: any failure is the user's module's
        raise LoadError(f"cannot import {module_name!r}{note}: {type(e).__name__}: {e}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise LoadError(f"module {module_name!r} has no attribute {attr!r}{note}") from None
    return obj
