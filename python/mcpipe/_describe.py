"""Small helpers for error messages, shared by the spec, config and declared-pipeline compilers."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

__all__ = ["did_you_mean", "json_type", "split_msgspec_error"]


def json_type(value: object) -> str:
    """The JSON type name of a value, as messages say it (``object``, ``array``, ``number``, ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, (list, tuple)):
        return "array"
    return type(value).__name__


def split_msgspec_error(message: str, base: str) -> tuple[str, str]:
    """Split msgspec's ``"Expected int, got str - at `$.steps[0]`"`` into (location, message).

    The location is msgspec's path below ``base``: ``base.steps[0]`` (or ``base`` itself).
    """
    text, sep, where = message.rpartition(" - at `")
    if not sep:
        return base, message
    path = where.rstrip("`")
    path = path[1:] if path.startswith("$") else path
    if path.startswith("["):
        return base + path, text
    path = path[1:] if path.startswith(".") else path
    if not path:
        return base, text
    return (f"{base}.{path}" if base else path), text


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """`` (did you mean `x`?)`` for the closest known name, or ``""`` when none is close."""
    close = difflib.get_close_matches(str(name), sorted(known), n=1)
    return f" (did you mean `{close[0]}`?)" if close else ""
