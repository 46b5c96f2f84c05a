"""Small helpers every layer may use: the pipe tool's name, name globs, ``module:attr`` loading, and
telling a suspension from a failure.

They live at the bottom so that no layer has to reach up (the gateway used to take ``glob_matcher`` from
the config, the scheduler and the gateway each had their own copy of the suspension test).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson
import trio

__all__ = ["PIPE_TOOL", "assignments", "glob_matcher", "is_cancellation", "is_suspension"]

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


def assignments(items: list[str], flag: str) -> dict[str, Any]:
    """``NAME=VALUE`` command-line items (``--var``, ``--input``) as a dict: a value is JSON when it parses
    as JSON, else the text. Raises ValueError naming ``flag`` for an item without ``=`` or a name."""
    values: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} takes NAME=VALUE, got {item!r}")
        try:
            values[key] = orjson.loads(value)
        except orjson.JSONDecodeError:
            values[key] = value
    return values


def is_suspension(exc: BaseException) -> bool:
    """Whether ``exc`` is a pipeline suspending to ask its 2026-07-28 client (``mcpipe.interaction``), alone
    or as the only content of a group: not a failure, the call resumes on the client's retry."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_suspension(e) for e in exc.exceptions)
    return getattr(exc, "suspends_pipeline", False) is True


def is_cancellation(exc: BaseException) -> bool:
    """Whether ``exc`` is trio's cancellation, alone or as the only content of a group (a nursery inside
    the cancelled code wraps it in one)."""
    if isinstance(exc, trio.Cancelled):
        return True
    return isinstance(exc, BaseExceptionGroup) and exc.split(trio.Cancelled)[1] is None
