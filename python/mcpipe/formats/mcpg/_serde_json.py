"""JSON parse errors as mcpg reports them: serde_json's words and positions (``serde_json`` 1.0, ``de.rs``).

mcpg's backends parse the JSON they receive with ``serde_json::from_str`` (an HTTP body, a command's stdout),
and its envelopes carry the parser's message when that fails (``jsonParseError``, ``parseError``):
``expected value at line 1 column 1``, ``trailing characters at line 2 column 1``. jiter (``pydantic_core.
from_json``) words and places its errors as serde_json does (``line``: 1-based; ``column``: the bytes of that
line read so far, the last one included), so it reads the text, and three differences are laid over its answer:
serde_json stops at a depth of 128 (jiter at 200), refuses a number past the range of an ``f64`` (``1e400``, a
400-digit integer; jiter reads it), and places a bad ``\\u`` escape after its four bytes (jiter at the bad one).
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic_core import from_json

__all__ = ["loads", "serde_json_error"]

_RECURSION_LIMIT = 128
# The tokens serde_json's two limits concern: strings (skipped whole, an unclosed one to the end), brackets, and
# numbers with any malformed tail taken in (``1.``, ``1e+``: jiter's own error), so that only a whole one is weighed.
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"?|[\[\]{}]|-?(?:0|[1-9][0-9]*)(?:\.[0-9]*)?(?:[eE][+-]?[0-9]*)?', re.S)
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_MAYBE_HUGE = re.compile(rb"[0-9][eE]|[0-9]{309}")  # no number past an f64's range without one of these
_HEX_SO_FAR = re.compile(rb"\\u[0-9A-Fa-f]{0,3}\Z")


def _serde_limit(data: bytes, stop: int) -> tuple[str, int] | None:
    """The first error of serde_json's that jiter does not make, ending at or before the byte ``stop``, and the
    index it is placed at."""
    depth = 0
    for m in _TOKEN.finditer(data):
        if m.end() > stop:
            break
        token = m[0]
        if token in (b"[", b"{"):
            depth += 1
            if depth == _RECURSION_LIMIT:
                return "recursion limit exceeded", m.end()
        elif token in (b"]", b"}"):
            depth -= 1
        elif token[0] != ord('"') and _NUMBER.fullmatch(token) and math.isinf(float(token)):
            return "number out of range", m.end()
    return None


def loads(text: str) -> tuple[Any, str | None]:
    """``text`` parsed as mcpg parses it: (the value, None), or (None, the error ``serde_json::from_str::<Value>``
    reports, ``expected value at line 1 column 1``)."""
    data = text.encode("utf-8", errors="surrogatepass")
    value: Any = None
    message: str | None = None
    try:
        value, stop = from_json(data, allow_inf_nan=False), len(data)
    except ValueError as e:
        message, _, at = str(e).rpartition(" at line ")
        at_line, _, column = at.partition(" column ")
        stop = 0
        for _ in range(int(at_line) - 1):
            stop = data.index(b"\n", stop) + 1
        stop += int(column)
        if message == "invalid escape" and (m := _HEX_SO_FAR.search(data, max(0, stop - 6), stop - 1)):
            stop = m.start() + 6  # serde_json reads the four bytes of a ``\u`` escape before it checks them
    maybe_limit = data.count(b"[") + data.count(b"{") >= _RECURSION_LIMIT or _MAYBE_HUGE.search(data)
    if maybe_limit and (limit := _serde_limit(data, stop)):
        message, stop = limit
    if message is None:
        return value, None
    start = data.rfind(b"\n", 0, stop) + 1
    line = data.count(b"\n", 0, start) + 1
    return None, f"{message} at line {line} column {stop - start}"


def serde_json_error(text: str) -> str | None:
    """The error ``serde_json::from_str::<Value>(text)`` reports, or None when it parses."""
    return loads(text)[1]
