"""JSON text of any JSON value: orjson, and Python's ``json`` for what orjson refuses (integers past 64 bits);
and JSON files read with their keys unique.

Both HTTP paths must answer integers of 2^64 and more as the SDK does (exactly), so every place that
writes a client's values back uses this, never ``orjson.dumps`` alone.

A JSON object that gives a key twice is read by every parser (orjson, ``json``, pydantic's) as the last one
given, so a spec or config file saying ``"tool": "echo"`` then ``"tool": "now"`` would run ``now`` where its
author reads ``echo``. The files people write (a spec, a config, ``mcp_pipe``'s spec given as JSON text) are
read with :func:`check_unique_keys`, which refuses them located at the second key. JSON-RPC messages are not:
a client writes them from its own objects, which cannot hold a key twice, and both HTTP paths read them as
the SDK does (the last one).
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeAlias

import orjson

__all__ = ["DuplicateKeyError", "Json", "JsonObject", "check_unique_keys", "dumps", "loads"]

Json: TypeAlias = "bool | int | float | str | list[Json] | dict[str, Json] | None"
"""A JSON value as decoded (orjson, ``json``, msgspec): what a tool's arguments, a step's output and a
config file's free-form tables hold. Read-only parameters that take any such value are better typed
``object`` or ``Mapping[str, object]`` (which every ``dict`` is, whatever its value type)."""

JsonObject: TypeAlias = dict[str, Json]
"""A JSON object as decoded."""


def dumps(value: object) -> bytes:
    """Compact JSON text of ``value`` (UTF-8)."""
    try:
        return orjson.dumps(value)
    except TypeError as e:
        if "64-bit" not in str(e):
            raise
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


_LONG_NUMBER = re.compile(rb"[0-9]{20}")
"""Twenty digits in a row: where an integer past 64 bits may be (orjson reads those as floats, silently)."""


def loads(data: bytes) -> Any:
    """The value of JSON text ``data``: orjson, or Python's ``json`` where an integer may be past 64 bits
    (twenty digits in a row anywhere, a string's too), so that such an integer is read exactly.

    Raises:
        ValueError: it is not JSON (``orjson.JSONDecodeError`` is one).
    """
    if _LONG_NUMBER.search(data) is None:
        return orjson.loads(data)
    return json.loads(data)


class DuplicateKeyError(ValueError):
    """A JSON object that gives a key twice.

    Attributes:
        key: the key.
        path: where the object is (``steps[0]``; empty for the top level).
        lineno, colno: where the second one is (1-based; the column counts characters).
        first: the line and column of the first one.
    """

    def __init__(self, key: str, path: str, lineno: int, colno: int, first: tuple[int, int]) -> None:
        self.key, self.path, self.lineno, self.colno, self.first = key, path, lineno, colno, first
        super().__init__(self.msg)

    @property
    def msg(self) -> str:
        """The message without the position of the second key (a reader puts it in front)."""
        path = self.path if len(self.path) <= _MAX_PATH else f"...{self.path[-_MAX_PATH:]}"
        where = f" in `{path}`" if path else ""
        return f"duplicate key `{self.key}`{where} (first at line {self.first[0]}, column {self.first[1]})"


_MAX_PATH = 120
"""The most characters of an object's path a message shows (its end: the part nearest the key)."""


class _Repeated(Exception):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Repeated
    return obj


def check_unique_keys(text: str | bytes) -> None:
    """Refuse JSON text in which an object gives a key twice (``"a"`` and ``"\\u0061"`` are the same key).

    ``text`` is JSON that parses (read it with orjson first: that says where a syntax error is). The C
    scanner of ``json`` decides quickly that no object repeats a key; only one that does is walked again, to
    say where.

    Raises:
        DuplicateKeyError: the first object, in text order, that repeats a key, located at the second one.
    """
    try:
        json.loads(text, object_pairs_hook=_unique_pairs)
        return
    except _Repeated:
        pass
    except (RecursionError, ValueError):
        pass  # deeper than the C scanner goes, or a value it reads otherwise: the walk below decides
    _locate_duplicate(text.decode("utf-8", "replace") if isinstance(text, bytes | bytearray) else text)


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+')


def _locate_duplicate(text: str) -> None:
    """Walk JSON text token by token (iteratively: any depth) and raise at the first repeated key."""
    # Each open container: its keys so far (an object's, with their offsets) or None (an array), the path to
    # it, its current key or index, and whether an object's next string is a key.
    stack: list[tuple[dict[str, int] | None, str, list[Any]]] = []
    for m in _TOKEN.finditer(text):
        tok = m.group()
        top = stack[-1] if stack else None
        if tok in ("{", "["):
            path = "" if top is None else _child_path(top[1], top[2][0])
            stack.append(({} if tok == "{" else None, path, [None if tok == "{" else 0, tok == "{"]))
        elif tok in ("}", "]"):
            if stack:
                stack.pop()
        elif top is None:
            continue
        elif tok == ",":
            if top[0] is None:
                top[2][0] += 1
            else:
                top[2][1] = True
        elif tok == ":":
            top[2][1] = False
        elif top[0] is not None and top[2][1] and tok.startswith('"'):
            key = json.loads(tok)
            if key in top[0]:
                raise DuplicateKeyError(key, top[1], *_position(text, m.start()), _position(text, top[0][key]))
            top[0][key] = m.start()
            top[2][0] = key


def _child_path(path: str, segment: object) -> str:
    if isinstance(segment, int):
        return f"{path}[{segment}]"
    return f"{path}.{segment}" if path else str(segment)


def _position(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1
