"""Reading piraeus's JSON as its pydantic models read it (lax mode), every problem located by JSON path.

piraeus declares its data with pydantic v2 models (``backend/src/dynamic_tools/models/``). This module reads
the same shapes from decoded JSON with pydantic's lax conversions (``"30"`` is a float, ``"true"`` a bool, a
number is never a string) and collects every problem, located (``api.auth.method``), instead of stopping at
the first. One difference: a key the model does not declare is refused here (pydantic ignores it), so a
misspelt key is not silently dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mcpipe._describe import did_you_mean, json_type
from mcpipe.errors import Problem

__all__ = ["CODE", "MISSING", "Reader", "coerce", "join"]

CODE = "INVALID_CONFIG"

MISSING: Any = object()
"""A key that is absent (distinct from ``null``)."""

_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_PLAIN: dict[str, tuple[type, str]] = {
    "string": (str, "a string"),
    "array": (list, "an array"),
    "object": (dict, "an object"),
}


def join(base: str, key: str | int) -> str:
    """``api`` + ``auth`` -> ``api.auth``; ``steps`` + 2 -> ``steps[2]``."""
    if isinstance(key, int):
        return f"{base}[{key}]"
    return f"{base}.{key}" if base else key


def coerce(value: object, kind: str) -> tuple[Any, str | None]:
    """``value`` as pydantic's lax mode converts it to ``kind`` (``string``, ``integer``, ``number``,
    ``boolean``, ``array``, ``object``); answers ``(converted, None)`` or ``(value, why not)``."""
    if kind in _PLAIN:
        tp, what = _PLAIN[kind]
        return (value, None) if isinstance(value, tp) else (value, f"expected {what}, got {json_type(value)}")
    if kind in ("integer", "number"):
        num = int if kind == "integer" else float
        if isinstance(value, int) or (isinstance(value, float) and (kind == "number" or value.is_integer())):
            return num(value), None  # a bool too (True is 1)
        if isinstance(value, str):
            try:
                return num(value.strip()), None
            except ValueError:
                pass
        return value, f"expected {'an integer' if kind == 'integer' else 'a number'}, got {_shown(value)}"
    if kind == "boolean":
        if isinstance(value, int) and value in (0, 1):  # a bool too
            return bool(value), None
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE, None
        return value, f"expected a boolean, got {_shown(value)}"
    return value, None


def _shown(value: object) -> str:
    if isinstance(value, str):
        return repr(value[:40] + ("..." if len(value) > 40 else ""))
    return json_type(value)


@dataclass
class Reader:
    """Collects the problems of one file, each located as ``<file>: <JSON path>``.

    Attributes:
        file: the file as the config names it (relative to the config's directory).
        problems: what was found so far.
    """

    file: str
    problems: list[Problem] = field(default_factory=list)

    def where(self, path: str) -> str:
        return f"{self.file}: {path}" if path else self.file

    def problem(self, path: str, message: str) -> None:
        self.problems.append(Problem(self.where(path), CODE, message))

    def obj(
        self,
        value: object,
        path: str,
        keys: Iterable[str],
        *,
        what: str = "an object",
        belongs: Mapping[str, str] | None = None,
    ) -> dict[str, Any] | None:
        """``value`` as an object whose keys are among ``keys`` (an unknown key is a problem, with the closest
        known one, or, for a key of ``belongs``, the key it goes under); None (a problem noted) when it is not
        an object."""
        if not isinstance(value, dict):
            self.problem(path, f"expected {what}, got {json_type(value)}")
            return None
        known = tuple(keys)
        for k in value:
            if k not in known:
                parent = (belongs or {}).get(str(k))
                hint = f": it goes under `{parent}` (`{parent}.{k}`)" if parent else did_you_mean(str(k), known)
                self.problem(join(path, str(k)), f"unknown key `{k}`{hint}")
        return value

    def get(self, o: Mapping[str, object], key: str, path: str, kind: str, default: object = MISSING) -> Any:
        """The value of ``key`` converted to ``kind`` (see :func:`coerce`); a missing required key or a value
        that does not convert is a problem (then ``default``, or None)."""
        value = o.get(key, MISSING)
        if value is MISSING or (value is None and default is not MISSING and default is None):
            if default is MISSING:
                self.problem(join(path, key), "is required")
                return None
            return default
        converted, why = coerce(value, kind)
        if why is not None:
            self.problem(join(path, key), why)
            return None if default is MISSING else default
        return converted

    def one_of(
        self, o: Mapping[str, object], key: str, path: str, among: Sequence[str], default: object = MISSING
    ) -> Any:
        """A string field that is one of ``among``; one that is not is a problem (then None)."""
        value = self.get(o, key, path, "string", default)
        if isinstance(value, str) and value not in among:
            self.problem(join(path, key), f"expected one of {', '.join(among)}, got {value!r}")
            return None
        return value

    def str_map(self, o: Mapping[str, object], key: str, path: str) -> dict[str, str]:
        """A ``dict[str, str]`` field (absent: empty)."""
        value = o.get(key, {})
        at = join(path, key)
        if not isinstance(value, dict):
            self.problem(at, f"expected an object of strings, got {json_type(value)}")
            return {}
        for k, v in value.items():
            if not isinstance(v, str):
                self.problem(join(at, str(k)), f"expected a string, got {json_type(v)}")
        return {str(k): v for k, v in value.items() if isinstance(v, str)}
