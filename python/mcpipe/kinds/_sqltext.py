"""SQL text as NoETL's ``postgres`` and ``duckdb`` tools split it into statements.

Both tools take SQL as text (rendered before it is split) and run its statements one by one; they split it
differently, and mcpipe keeps each one's rule, so a playbook's statements are the ones NoETL runs:

- ``postgres`` (NoETL's ``render_and_split_commands``): split at ``;`` outside single-quoted strings
  (``''`` and backslash escapes), double-quoted identifiers, dollar-quoted strings (``$tag$...$tag$``) and
  comments; ``--`` and ``/* */`` comments are dropped.
- ``duckdb`` (NoETL's ``clean_sql_text`` and ``sql_split``): lines that are empty or start with ``--`` or
  ``#`` are dropped, the rest joined with spaces, then split at ``;`` outside single and double quotes.
"""

from __future__ import annotations

import re

__all__ = ["split_duckdb", "split_postgres"]

_POSTGRES = re.compile(
    r"('(?:''|\\.|[^'])*')"  # 1: a string
    r'|("(?:""|\\.|[^"])*")'  # 2: a quoted identifier
    r"|((\$[a-zA-Z0-9_]*\$).*?\4)"  # 3, 4: a dollar-quoted string
    r"|(--[^\n]*)"  # 5: a line comment
    r"|(/\*.*?\*/)"  # 6: a block comment
    r"|(;)"  # 7: the separator
    r"|([^;'\"$\-/]+|.)",  # 8: anything else
    re.DOTALL,
)


def split_postgres(text: str) -> list[str]:
    """The statements of ``text``, NoETL's postgres tool's way (comments dropped, empty ones left out)."""
    statements: list[str] = []
    current: list[str] = []
    for m in _POSTGRES.finditer(text):
        if m.group(7):
            stmt = "".join(current).strip()
            if stmt:
                statements.append(stmt)
            current.clear()
        elif m.group(5) or m.group(6):
            continue
        else:
            current.append(m.group(0))
    stmt = "".join(current).strip()
    if stmt:
        statements.append(stmt)
    return statements


def split_duckdb(text: str) -> list[str]:
    """The statements of ``text``, NoETL's duckdb tool's way (comment lines dropped, lines joined)."""
    lines = [s for line in text.split("\n") if (s := line.strip()) and not s.startswith(("--", "#"))]
    joined = " ".join(lines)
    statements: list[str] = []
    current: list[str] = []
    quote: str | None = None
    for ch in joined:
        if quote is None and ch in "\"'":
            quote = ch
            current.append(ch)
        elif quote is not None and ch == quote:
            quote = None
            current.append(ch)
        elif quote is None and ch == ";":
            stmt = "".join(current).strip()
            if stmt:
                statements.append(stmt)
            current = []
        else:
            current.append(ch)
    stmt = "".join(current).strip()
    if stmt:
        statements.append(stmt)
    return statements
