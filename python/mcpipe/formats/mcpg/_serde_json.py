"""JSON parse errors as mcpg reports them: serde_json's words and positions (``serde_json`` 1.0, ``de.rs``).

mcpg's backends parse the JSON they receive with ``serde_json::from_str`` (an HTTP body, a command's stdout),
and its envelopes carry the parser's message when that fails (``jsonParseError``, ``parseError``):
``expected value at line 1 column 1``, ``trailing characters at line 2 column 1``. :func:`serde_json_error`
walks a text as serde_json's deserializer of a ``Value`` walks it, and answers the error it stops at, worded
and placed as serde_json places it (``line``: 1-based; ``column``: the bytes of that line read so far, the
last one included). It decides validity as serde_json does too (``NaN``, an exponent past the range of an
``f64`` and a lone surrogate escape are errors; a long integer is not), so :func:`loads` accepts exactly
what mcpg accepts.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["loads", "serde_json_error"]

_RECURSION_LIMIT = 128
_WHITESPACE = b" \n\t\r"
_DIGITS = b"0123456789"
_IDENTS = {ord("n"): b"ull", ord("t"): b"rue", ord("f"): b"alse"}
_CLOSE = {ord("["): (ord("]"), "a list"), ord("{"): (ord("}"), "an object")}


class _Syntax(Exception):
    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(f"{message} at line {line} column {column}")


class _Reader:
    """serde_json's ``SliceRead`` and the parts of ``Deserializer`` that a ``Value`` goes through."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.index = 0
        self.depth = _RECURSION_LIMIT

    # --- positions (``position_of_index``) ---

    def _at(self, i: int, message: str) -> _Syntax:
        start = self.data.rfind(b"\n", 0, i) + 1
        return _Syntax(message, 1 + self.data.count(b"\n", 0, start), i - start)

    def error(self, message: str) -> _Syntax:
        """An error at the next unread byte (``Deserializer::error``)."""
        return self._at(self.index, message)

    def peek_error(self, message: str) -> _Syntax:
        """An error at the byte last peeked (``Deserializer::peek_error``)."""
        return self._at(min(len(self.data), self.index + 1), message)

    # --- bytes ---

    def peek(self) -> int | None:
        return self.data[self.index] if self.index < len(self.data) else None

    def next(self) -> int | None:
        if self.index < len(self.data):
            self.index += 1
            return self.data[self.index - 1]
        return None

    def whitespace(self) -> int | None:
        while (b := self.peek()) is not None and b in _WHITESPACE:
            self.index += 1
        return b

    # --- values ---

    def value(self) -> None:
        b = self.whitespace()
        if b is None:
            raise self.peek_error("EOF while parsing a value")
        if b in _IDENTS:
            self.index += 1
            self.ident(_IDENTS[b])
        elif b == ord("-") or b in _DIGITS:
            if b == ord("-"):
                self.index += 1
            self.integer()
        elif b == ord('"'):
            self.index += 1
            self.string()
        elif b in _CLOSE:
            self.depth -= 1
            if self.depth == 0:
                raise self.peek_error("recursion limit exceeded")
            self.index += 1
            self.elements(*_CLOSE[b])
            self.depth += 1
        else:
            raise self.peek_error("expected value")

    def ident(self, rest: bytes) -> None:
        for expected in rest:
            got = self.next()
            if got is None:
                raise self.error("EOF while parsing a value")
            if got != expected:
                raise self.error("expected ident")

    def elements(self, close: int, what: str) -> None:
        """A list's (``close``: ``]``) or an object's (``}``) elements, through the closing byte (``end_seq``,
        ``end_map``)."""
        first = True
        while (b := self.whitespace()) != close:
            if b == ord(",") and not first:
                self.index += 1
                b = self.whitespace()
            elif b is None:
                raise self.peek_error(f"EOF while parsing {what}")
            elif not first:
                raise self.peek_error(f"expected `,` or `{chr(close)}`")
            first = False
            if b == close:
                raise self.peek_error("trailing comma")
            if b is None:
                raise self.peek_error("EOF while parsing a value")
            if close == ord("}"):
                self.key()
            self.value()
        self.index += 1

    def key(self) -> None:
        """An object's key and the colon after it (``parse_object_colon``)."""
        if self.peek() != ord('"'):
            raise self.peek_error("key must be a string")
        self.index += 1
        self.string()
        b = self.whitespace()
        if b is None:
            raise self.peek_error("EOF while parsing an object")
        if b != ord(":"):
            raise self.peek_error("expected `:`")
        self.index += 1

    def string(self) -> None:
        """``parse_str_bytes`` (validating): after the opening quote, through the closing one."""
        data = self.data
        while True:
            while self.index < len(data) and data[self.index] >= 0x20 and data[self.index] not in b'"\\':
                self.index += 1
            if self.index == len(data):
                raise self.error("EOF while parsing a string")
            b = data[self.index]
            self.index += 1
            if b == ord('"'):
                return
            if b != ord("\\"):
                raise self.error("control character (\\u0000-\\u001F) found while parsing a string")
            self.escape()

    def escape(self) -> None:
        ch = self.next()
        if ch is None:
            raise self.error("EOF while parsing a string")
        if ch in b'"\\/bfnrt':
            return
        if ch != ord("u"):
            raise self.error("invalid escape")
        n = self.hex4()
        if 0xDC00 <= n <= 0xDFFF:
            raise self.error("lone leading surrogate in hex escape")
        if 0xD800 <= n <= 0xDBFF:  # a leading surrogate: a trailing one must follow
            for expected in b"\\u":
                if self.peek() is None:
                    raise self.error("EOF while parsing a string")
                if self.next() != expected:
                    raise self.error("unexpected end of hex escape")
            if not 0xDC00 <= self.hex4() <= 0xDFFF:
                raise self.error("lone leading surrogate in hex escape")

    def hex4(self) -> int:
        """``decode_hex_escape``."""
        if len(self.data) - self.index < 4:
            self.index = len(self.data)
            raise self.error("EOF while parsing a string")
        digits = self.data[self.index : self.index + 4]
        self.index += 4
        if not all(chr(c) in "0123456789abcdefABCDEF" for c in digits):
            raise self.error("invalid escape")
        return int(digits, 16)

    def integer(self) -> None:
        """``parse_integer``, ``parse_number``, ``parse_decimal``, ``parse_exponent``."""
        start = self.index
        b = self.next()
        if b is None:
            raise self.error("EOF while parsing a value")
        if b == ord("0"):
            if (p := self.peek()) is not None and p in _DIGITS:
                raise self.peek_error("invalid number")
        elif b in _DIGITS:
            while (p := self.peek()) is not None and p in _DIGITS:
                self.index += 1
        else:
            raise self.error("invalid number")
        p = self.peek()
        if p == ord("."):
            self.index += 1
            digits = 0
            while (p := self.peek()) is not None and p in _DIGITS:
                self.index += 1
                digits += 1
            if not digits:
                if self.peek() is not None:
                    raise self.peek_error("invalid number")
                raise self.peek_error("EOF while parsing a value")
            p = self.peek()
        if p in (ord("e"), ord("E")):
            self.index += 1
            if self.peek() in (ord("+"), ord("-")):
                self.index += 1
            b = self.next()
            if b is None:
                raise self.error("EOF while parsing a value")
            if b not in _DIGITS:
                raise self.error("invalid number")
            while (p := self.peek()) is not None and p in _DIGITS:
                self.index += 1
        # Past the range of an f64 (a long integer or a decimal is read as one): out of range.
        number = self.data[start : self.index]
        if (len(number) > 15 or b"e" in number.lower()) and math.isinf(float(number)):
            raise self.error("number out of range")


def serde_json_error(text: str) -> str | None:
    """The error ``serde_json::from_str::<Value>(text)`` reports (``expected value at line 1 column 1``), or None
    when it parses."""
    r = _Reader(text.encode("utf-8", errors="surrogatepass"))
    try:
        r.value()
        if r.whitespace() is not None:  # Deserializer::end
            raise r.peek_error("trailing characters")
    except _Syntax as e:
        return str(e)
    return None


def loads(text: str) -> tuple[Any, str | None]:
    """``text`` parsed as mcpg parses it: (the value, None), or (None, serde_json's error)."""
    error = serde_json_error(text)
    if error is not None:
        return None, error
    return json.loads(text), None
