"""NoETL reads a rendered ``[...]``/``{...}`` that is not JSON as a Python literal (``ast.literal_eval``);
mcpipe's bounded reader (``formats/noetl/_literal.py``) answers what ``literal_eval`` answers, and refuses
what it refuses."""

from __future__ import annotations

import ast
from typing import Any

import pytest

from mcpipe.formats.noetl._literal import MAX_DEPTH, py_literal

READ = [
    "[1, 2, 3]",
    "[1,]",
    "{'a': 1, 'b': [1, 2, (3,)], 'c': None}",
    "(1)",
    "(1,)",
    "()",
    "{}",
    "{1, 2}",
    "set()",
    "[-1, +2, -1.5, 1e3, .5, 1., 0x1F, 0o7, 0b1, 1_000, 3j, 1+2j, -1-2j, -1j, 1.e5]",
    "['a' 'b', b'x', r'\\n', '\\n', u'\u00e9', '''tri'ple''', \"\"\"x\ny\"\"\", '\\x41\\u00e9', \"it's\", 'a\\'b']",
    "[True, False, None]",
    "{'a': {'b': {'c': [1, [2, [3]]]}}}",
    "[00]",
    "{'k': 1,}",
    "[ ]",
    "[\n1,\n2\n]",
    "[(1, 2), {3: (4,)}]",
    "{'a'}",
]

REFUSED = [
    "[1, 2",
    "[1 2]",
    "[foo]",
    "[1, {[]: 1}]",
    "{1: 2, 3}",
    "[--1]",
    "[1 + 2]",
    "['a' b'x']",
    "[010]",
    "[1,,2]",
    "(,)",
    "{,}",
    "{'a':1 'b':2}",
    "[1]x",
    "[inf]",
    "[1e]",
    "[1__0]",
    "[1j+1]",
    "[1, 2][0]",
    "[__import__('os')]",
    "[print(1)]",
]


def _outcome(fn: Any, text: str) -> Any:
    try:
        return ("value", repr(fn(text)))
    except (ValueError, TypeError, SyntaxError, ArithmeticError):
        return ("refused", None)


@pytest.mark.parametrize("text", READ)
def test_a_python_literal_reads_as_literal_eval_reads_it(text):
    assert _outcome(py_literal, text) == _outcome(ast.literal_eval, text) != ("refused", None)


@pytest.mark.parametrize("text", REFUSED)
def test_what_literal_eval_refuses_is_refused(text):
    assert _outcome(ast.literal_eval, text) == ("refused", None)
    assert _outcome(py_literal, text) == ("refused", None)


def test_containers_nest_at_most_max_depth_deep():
    assert py_literal("[" * MAX_DEPTH + "]" * MAX_DEPTH) == ast.literal_eval("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    with pytest.raises(ValueError, match=f"nest more than {MAX_DEPTH} deep"):
        py_literal("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
