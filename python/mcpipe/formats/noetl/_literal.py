"""Python literals read back from rendered text, as NoETL reads them (``ast.literal_eval``), but bounded.

NoETL decodes a tool's rendered string that reads as a Python list or object (``"[{{ a }}, {{ b }}]"``,
Jinja's text of a dict: ``{'k': 'v'}``) with ``ast.literal_eval``. That parses the whole text into a syntax
tree in C: 960 KB of ``1,1,1,...`` took 2 s holding the GIL (the event loop, ``/healthz`` with it, frozen;
nothing can interrupt it, so the template's deadline passed unheeded) and built 450 MB of tree (issue 27).

:func:`py_literal` reads the same literals (strings with their prefixes and escapes, numbers, ``True``,
``False``, ``None``, lists, tuples, dicts, sets, ``set()``, a sign on a number, ``1+2j``) token by token in
Python: memory in proportion to the value, the interpreter's turns shared with the event loop, and the
rendering's deadline able to stop it between two tokens. At most :data:`MAX_DEPTH` containers deep.
"""

from __future__ import annotations

import ast
import re
from typing import Any

__all__ = ["MAX_DEPTH", "py_literal"]

MAX_DEPTH = 100
"""How deeply containers may nest in a literal (CPython's parser stops at 200)."""

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<str>(?:[rRbBuU]|[bB][rR]|[rR][bB])?
        (?:'''(?:[^\\]|\\.)*?'''|\"\"\"(?:[^\\]|\\.)*?\"\"\"|'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"))
    | (?P<num>(?:0[xX](?:_?[0-9a-fA-F])+|0[oO](?:_?[0-7])+|0[bB](?:_?[01])+
        |(?:\d(?:_?\d)*(?:\.(?:\d(?:_?\d)*)?)?|\.\d(?:_?\d)*)(?:[eE][+-]?\d(?:_?\d)*)?[jJ]?))
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<op>[\[\](){},:+\-])
    )""",
    re.VERBOSE | re.DOTALL,
)
_SPACE = re.compile(r"\s*")
_CLOSE = {"[": "]", "(": ")", "{": "}"}
_NAMES = {"True": True, "False": False, "None": None}


class _Reader:
    __slots__ = ("kind", "pos", "text", "value")

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.kind = ""
        self.value = ""
        self.next()

    def next(self) -> None:
        m = _TOKEN.match(self.text, self.pos)
        if m is None:
            end = _SPACE.match(self.text, self.pos)
            self.pos = end.end() if end is not None else self.pos
            if self.pos < len(self.text):
                raise ValueError(f"not a Python literal at character {self.pos}")
            self.kind, self.value = "end", ""
            return
        self.pos = m.end()
        kind = m.lastgroup or ""
        self.kind, self.value = kind, m.group(kind)

    def expect(self, op: str) -> None:
        if self.kind != "op" or self.value != op:
            raise ValueError(f"expected `{op}` at character {self.pos}")
        self.next()

    def at(self, op: str) -> bool:
        return self.kind == "op" and self.value == op


def _number(token: str) -> Any:
    if token[-1] in "jJ":
        return complex(token)
    if "." in token or ("e" in token.lower() and not token.lower().startswith("0x")):
        return float(token)
    return int(token, 0)


def _string(token: str) -> Any:
    if token[0] in "'\"" and "\\" not in token and not token.startswith(("'''", '"""')):
        return token[1:-1]
    return ast.literal_eval(token)  # one string: a single node, linear in its length


def _value(r: _Reader, depth: int) -> Any:
    kind, token = r.kind, r.value
    if kind == "str":
        value = _string(token)
        r.next()
        while r.kind == "str":  # adjacent strings are one: 'a' 'b'
            value = value + _string(r.value)
            r.next()
        return value
    if kind == "num" or (kind == "op" and token in "+-"):
        return _signed(r)
    if kind == "name":
        r.next()
        if token in _NAMES:
            return _NAMES[token]
        if token == "set" and r.at("("):
            r.next()
            r.expect(")")
            return set()
        raise ValueError(f"`{token}` is not a literal")
    if kind == "op" and token in _CLOSE:
        if depth >= MAX_DEPTH:
            raise ValueError(f"containers nest more than {MAX_DEPTH} deep")
        r.next()
        return _container(r, token, depth + 1)
    raise ValueError(f"not a Python literal at character {r.pos}")


def _signed(r: _Reader) -> Any:
    sign = 1
    if r.kind == "op":
        sign = -1 if r.value == "-" else 1
        r.next()
        if r.kind != "num":
            raise ValueError("a sign stands before a number only")
    value = _number(r.value) * sign
    r.next()
    if r.kind == "op" and r.value in "+-" and not isinstance(value, complex):
        # ast.literal_eval's one binary operation: a real number and an imaginary one (1+2j).
        op = r.value
        r.next()
        if r.kind != "num" or r.value[-1] not in "jJ":
            raise ValueError("only an imaginary number is added to a number")
        imag = _number(r.value)
        r.next()
        value = value + imag if op == "+" else value - imag
    return value


def _items(r: _Reader, close: str, depth: int) -> tuple[list[Any], bool]:
    """The values up to ``close``, and whether a comma separated (or ended) them."""
    items: list[Any] = []
    comma = False
    while not r.at(close):
        items.append(_value(r, depth))
        if r.at(","):
            comma = True
            r.next()
        elif not r.at(close):
            raise ValueError(f"expected `,` or `{close}` at character {r.pos}")
    r.next()
    return items, comma


def _container(r: _Reader, opened: str, depth: int) -> Any:
    if opened == "[":
        return _items(r, "]", depth)[0]
    if opened == "(":
        items, comma = _items(r, ")", depth)
        if len(items) == 1 and not comma:
            return items[0]  # a value in parentheses
        return tuple(items)
    if r.at("}"):
        r.next()
        return {}
    first = _value(r, depth)
    if r.at(":"):
        out: dict[Any, Any] = {}
        key = first
        while True:
            r.expect(":")
            out[key] = _value(r, depth)  # an unhashable key: TypeError, as literal_eval
            if not r.at("}"):
                r.expect(",")  # and a `}` may follow it
            if r.at("}"):
                r.next()
                return out
            key = _value(r, depth)
    seen = {first}
    while r.at(","):
        r.next()
        if r.at("}"):
            break
        seen.add(_value(r, depth))
    r.expect("}")
    return seen


def py_literal(text: str) -> Any:
    """The value of ``text`` read as a Python literal (what ``ast.literal_eval`` answers for it).

    Raises:
        ValueError: the text is not a literal, or nests more than :data:`MAX_DEPTH` containers deep.
        TypeError: an unhashable dict key or set element.
    """
    r = _Reader(text)
    value = _value(r, 0)
    if r.kind != "end":
        raise ValueError(f"text after the literal at character {r.pos}")
    return value
