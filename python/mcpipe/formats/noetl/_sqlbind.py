"""NoETL's SQL templates with the values kept out of the SQL (issue 27).

NoETL renders a ``postgres`` or ``duckdb`` tool's SQL with Jinja as text, so a value is read as SQL:
``WHERE name = '{{ workload.name }}'`` with a caller's ``' UNION SELECT ... --`` reads another table (or, in
DuckDB, a host file), and so does ``LIKE '%{{ q }}%'``, ``id = {{ id }}`` or ``'{{ n }}'`` in a ``{% for %}``.
mcpipe reads the template once, at load, knows where each ``{{ expression }}`` stands in the SQL, and rewrites
it so that no value it renders can change the statement:

- **a quoted literal holding templates** (``'...'`` or ``$tag$...$tag$``) where a value stands in a data
  statement (``SELECT``, ``INSERT``, ``UPDATE``, ``DELETE``, ``WITH``, ``VALUES``, ``MERGE``; after an operator,
  a comma, a parenthesis or a value keyword) becomes **one bound parameter**: the literal's whole text as
  rendered (``''`` read as ``'``), ``%`` and ``{% %}`` blocks inside included. ``'%{{ q }}%'`` binds
  ``%ali%``; each ``'{{ n }}'`` of a ``{% for %}`` is a parameter of its own;
- **an expression outside quotes where a value stands** (``id = {{ id }}``, ``LIMIT {{ n }}``,
  ``VALUES ({{ item.id }}, ...)``) is a bound parameter too, its type kept (a number stays a number, text is
  text: ``0 OR true`` against an integer column fails the statement);
- **anywhere else no parameter can stand** (a table or column name, ``date '...'``, DDL, ``ATTACH``, a
  comment): the value is written into the text, so it must be inert there: outside quotes a number or a name
  (``public.{{ table }}``, ``ORDER BY {{ col }}``), or, for an expression that names a ``workload`` entry
  (``{{ query }}``, ``{{ workload.query }}``), that entry's text as the playbook's file writes it
  (``command: "{{ query }}"`` with ``workload: {query: SELECT 1}``: the author's SQL); inside quotes
  or a comment, text without quotes, backslashes, ``$``, ``;``, line breaks or comment marks. Any other value
  fails the step, ``FORBIDDEN``, located at the field.

A quoted literal or comment whose quotes open and close in different branches of a ``{% %}`` block (mcpipe
could not tell its values from its SQL) is refused when the playbook loads. The rewriting is Jinja: a
parameter is the filter ``noetl_sql_value`` (or ``noetl_sql_literal`` for a single-quoted literal's text)
that records the value while the text renders (:func:`rendered_sql`) and writes its placeholder
(``:noetl_pN`` for PostgreSQL, ``$noetl_pN`` for DuckDB).
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from mcpipe.errors import ErrorCode
from mcpipe.expr._jinja import RenderError, add_filter
from mcpipe.formats.noetl._tmpl import Tmpl
from mcpipe.results import StepFailure

__all__ = ["DIALECTS", "SqlTemplate", "binding", "rendered_sql", "sql_template"]

DIALECTS = ("postgres", "duckdb")

_JINJA = re.compile(
    r"\{%-?\s*raw\s*-?%\}.*?\{%-?\s*endraw\s*-?%\}"  # a raw block: text, not templates
    r"|\{\{.*?\}\}"
    r"|\{%.*?%\}"
    r"|\{#.*?#\}",
    re.S,
)
_EXPR = re.compile(r"\{\{(?P<l>-?)(?P<e>.*?)(?P<r>-?)\}\}\Z", re.S)
_MASK = re.compile(r"\x01([ET])(\d+)\x01")
_SQL = re.compile(
    r"(?P<sq>'(?:[^']|'')*'?)"
    r'|(?P<dq>"(?:[^"]|"")*"?)'
    r"|(?P<dollar>(?P<tag>\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$).*?(?:(?P=tag)|\Z))"
    r"|(?P<line>--[^\n]*)"
    r"|(?P<block>/\*.*?(?:\*/|\Z))"
    r"|(?P<semi>;)"
    r"|(?P<mask>\x01[ET]\d+\x01)"
    r"|(?P<other>[^'\"$\-/;\x01]+|.)",
    re.S,
)
_DATA = re.compile(r"(SELECT|INSERT|UPDATE|DELETE|WITH|VALUES|MERGE)\b", re.I)
_TAG_WORD = re.compile(r"\{%-?\s*(\w+)")
_OPENS = frozenset({"if", "for", "macro", "call", "filter", "with", "autoescape", "block"})
# A value stands after an operator, a comma or parenthesis, or one of these words; after another word it may
# be a typed literal (`date '...'`, `interval '...'`) or a name, which a parameter cannot replace.
_BEFORE_VALUE = frozenset(
    (
        "LIKE",
        "ILIKE",
        "THEN",
        "ELSE",
        "WHEN",
        "AND",
        "OR",
        "IN",
        "IS",
        "VALUES",
        "SELECT",
        "RETURNING",
        "DEFAULT",
        "SET",
        "NOT",
        "BETWEEN",
        "WHERE",
        "ON",
        "OFFSET",
        "LIMIT",
        "HAVING",
    )
)
_NAME = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?|[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)*|")
_INERT = re.compile(r"['\"\\$;\n\r\x00]|\*/|/\*")


@dataclass
class _Binds:
    """The parameters of one rendering of one SQL text."""

    dialect: str
    own: tuple[str, ...]
    params: dict[str, Any] = field(default_factory=dict)

    def add(self, value: object) -> str:
        name = f"noetl_p{len(self.params)}"
        self.params[name] = value
        return f"${name}" if self.dialect == "duckdb" else f":{name}"


_BINDS: contextvars.ContextVar[_Binds | None] = contextvars.ContextVar("mcpipe_noetl_sql_binds", default=None)


def _current(what: str) -> _Binds:
    binds = _BINDS.get()
    if binds is None:
        raise RenderError(f"`{what}` is mcpipe's own filter for a NoETL step's SQL", ErrorCode.FORBIDDEN)
    return binds


def _sql_value(value: object) -> str:
    """Bind ``value`` (its type kept: null, a boolean, a number; anything else as the text NoETL would have
    written there, Jinja's own rendering); write its placeholder."""
    binds = _current("noetl_sql_value")
    return binds.add(value if value is None or isinstance(value, bool | int | float) else str(value))


def _sql_literal(body: object) -> str:
    """Bind a single-quoted literal's rendered text (its ``''`` read as ``'``); write its placeholder."""
    return _current("noetl_sql_literal").add(str(body).replace("''", "'"))


def _sql_name(value: object, own: int = -1) -> str:
    """Write ``value`` where no parameter can stand: a number, a name, or (``own``: the index of the workload
    entry the expression names) that entry's text as the playbook's file writes it."""
    binds = _current("noetl_sql_name")
    text = str(value)
    if _NAME.fullmatch(text) or (0 <= own < len(binds.own) and text == binds.own[own]):
        return text
    raise RenderError(
        f"the value {_shown(text)} stands in the SQL where no parameter can (a name, a keyword's place): it must "
        "be a number or a name, or be quoted ('{{ ... }}') to be a value",
        ErrorCode.FORBIDDEN,
    )


def _sql_quoted(value: object) -> str:
    """Write ``value`` inside a quoted literal (or comment) a parameter cannot replace: inert text only."""
    _current("noetl_sql_quoted")
    text = str(value)
    found = _INERT.search(text)
    if found is None:
        return text
    raise RenderError(
        f"the value {_shown(text)} is written into a quoted literal a parameter cannot replace (a typed literal, "
        f"DDL, a comment): it may not hold {found.group(0)!r} there",
        ErrorCode.FORBIDDEN,
    )


def _shown(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")


for _name, _fn in (
    ("noetl_sql_value", _sql_value),
    ("noetl_sql_literal", _sql_literal),
    ("noetl_sql_name", _sql_name),
    ("noetl_sql_quoted", _sql_quoted),
):
    add_filter(_name, _fn)


@dataclass(frozen=True, slots=True)
class SqlTemplate:
    """A NoETL SQL text rewritten (:func:`sql_template`): the Jinja source to compile, and the texts of the
    workload entries its expressions name where no parameter can stand (written as they are when the value
    is that text)."""

    source: str
    dialect: str
    own: tuple[str, ...] = ()


_WORKLOAD_REF = re.compile(r"\s*(?:workload\s*\.\s*)?([A-Za-z_][A-Za-z0-9_]*)\s*")


def sql_template(
    text: str, dialect: str, workload: Mapping[str, object] | None = None
) -> tuple[SqlTemplate, str | None]:
    """``text`` (NoETL SQL with Jinja) rewritten so that its values are bound or checked (see the module), and
    why it cannot be (None when it can). ``workload``: the playbook's, as its file writes it."""
    if "{{" not in text and "{%" not in text:
        return SqlTemplate(text, dialect), None
    own: list[str] = []

    def own_text(expr: str) -> int:
        """The index of the workload text the expression ``expr`` names (-1: none)."""
        m = _WORKLOAD_REF.fullmatch(expr)
        value = (workload or {}).get(m.group(1)) if m is not None else None
        if not isinstance(value, str) or "{{" in value or "{%" in value:
            return -1
        own.append(value)
        return len(own) - 1

    pieces: list[str] = []

    def mask(m: re.Match[str]) -> str:
        pieces.append(m.group(0))
        kind = "E" if m.group(0).startswith("{{") else "T"
        return f"\x01{kind}{len(pieces) - 1}\x01"

    masked = _JINJA.sub(mask, text)
    tokens = [(m.lastgroup or "other", m.group(0)) for m in _SQL.finditer(masked)]
    out: list[str] = []
    for stmt in _statements(tokens):
        data = _is_data(stmt)
        for i, (kind, tok) in enumerate(stmt):
            if kind == "mask":
                out.append(_expression(tok, pieces, data and _bare_value(stmt, i), own_text))
            elif kind in ("sq", "dq", "dollar", "line", "block") and "\x01" in tok:
                if not _balanced(tok, pieces):
                    return SqlTemplate(text, dialect), (
                        "a quoted literal (or comment) of this SQL opens and closes in different branches of a "
                        "`{% %}` block: mcpipe cannot tell its values from its SQL; keep each literal whole"
                    )
                bind = data and kind in ("sq", "dollar") and "\x01E" in tok and _value_position(_before(stmt, i))
                out.append(_literal(kind, tok, pieces) if bind else _restore(tok, pieces, "noetl_sql_quoted"))
            else:
                out.append(tok)
    return SqlTemplate("".join(out), dialect, tuple(own)), None


def _statements(tokens: list[tuple[str, str]]) -> Iterator[list[tuple[str, str]]]:
    current: list[tuple[str, str]] = []
    for kind, tok in tokens:
        current.append((kind, tok))
        if kind == "semi":
            yield current
            current = []
    if current:
        yield current


def _is_data(stmt: list[tuple[str, str]]) -> bool:
    """Whether a statement is one that takes parameters (its first word, past blocks and comments)."""
    for kind, tok in stmt:
        if kind in ("line", "block") or (kind == "mask" and tok.startswith("\x01T")):
            continue
        if kind == "other" and not tok.strip():
            continue
        return kind == "other" and _DATA.match(tok.lstrip()) is not None
    return False


def _before(stmt: list[tuple[str, str]], i: int) -> str:
    """The statement's text before token ``i``, blocks left out (a value after `= {% if %}` is after `=`)."""
    return "".join(tok for kind, tok in stmt[:i] if not (kind == "mask" and tok.startswith("\x01T")))


def _bare_value(stmt: list[tuple[str, str]], i: int) -> bool:
    """Whether the expression at ``i`` (outside quotes) stands where a value does: not a name's part
    (``{{ t }}.id``, ``{{ fn }}(...)``)."""
    if not stmt[i][1].startswith("\x01E"):
        return False
    after = "".join(tok for kind, tok in stmt[i + 1 :] if kind != "mask")[:1]
    return after not in (".", "(") and _value_position(_before(stmt, i))


def _value_position(before: str) -> bool:
    stripped = _MASK.sub(" x ", before).rstrip() if "\x01" in before else before.rstrip()
    if not stripped or before[-1:].isalnum():  # E'...', B'...': a prefixed literal
        return False
    if stripped[-1] in "(,=<>!+-*/|%[":
        return True
    word = re.search(r"([A-Za-z_]+)\Z", stripped)
    return word is not None and word.group(1).upper() in _BEFORE_VALUE


def _expression(tok: str, pieces: list[str], bind: bool, own_text: Callable[[str], int]) -> str:
    m = _MASK.fullmatch(tok)
    assert m is not None
    source = pieces[int(m.group(2))]
    if m.group(1) == "T":
        return source
    if bind:
        return _wrapped(source, "noetl_sql_value")
    e = _EXPR.match(source)
    n = own_text(e.group("e")) if e is not None else -1
    return _wrapped(source, "noetl_sql_name" if n < 0 else f"noetl_sql_name({n})")


def _wrapped(source: str, filter_name: str) -> str:
    m = _EXPR.match(source)
    if m is None:  # `{{` without its `}}`: Jinja says so when it compiles
        return source
    return "{{" + m.group("l") + " (" + m.group("e") + ") | " + filter_name + " " + m.group("r") + "}}"


def _restore(tok: str, pieces: list[str], filter_name: str) -> str:
    def back(m: re.Match[str]) -> str:
        source = pieces[int(m.group(2))]
        return _wrapped(source, filter_name) if m.group(1) == "E" else source

    return _MASK.sub(back, tok)


def _literal(kind: str, tok: str, pieces: list[str]) -> str:
    """A quoted literal as one parameter: its body rendered into a block variable, then bound."""
    if kind == "sq":
        body, filter_name = tok[1:-1] if tok.endswith("'") and len(tok) > 1 else tok[1:], "noetl_sql_literal"
    else:
        m = re.match(r"\$[A-Za-z0-9_]*\$", tok)
        assert m is not None
        tag = m.group(0)
        body = tok[len(tag) : -len(tag)] if tok.endswith(tag) and len(tok) >= 2 * len(tag) else tok[len(tag) :]
        filter_name = "noetl_sql_value"
    inner = _MASK.sub(lambda m: pieces[int(m.group(2))], body)
    return "{% set __noetl_lit %}" + inner + "{% endset %}{{ __noetl_lit | " + filter_name + " }}"


def _balanced(tok: str, pieces: list[str]) -> bool:
    """Whether the blocks inside a literal open and close inside it, never switching branch at its level."""
    depth = 0
    for m in _MASK.finditer(tok):
        if m.group(1) != "T":
            continue
        found = _TAG_WORD.match(pieces[int(m.group(2))])
        word = found.group(1) if found is not None else ""
        if word in _OPENS or (word == "set" and "=" not in pieces[int(m.group(2))]):
            depth += 1
        elif word.startswith("end"):
            depth -= 1
            if depth < 0:
                return False
        elif word in ("else", "elif") and depth == 0:
            return False
    return depth == 0


@contextmanager
def binding(sql: SqlTemplate) -> Iterator[dict[str, Any]]:
    """While a text compiled from ``sql.source`` renders in this context: the parameters its values become
    (a rendering's thread runs in a copy of the context that started it, so it sees them)."""
    binds = _Binds(sql.dialect, sql.own)
    token = _BINDS.set(binds)
    try:
        yield binds.params
    finally:
        _BINDS.reset(token)


async def rendered_sql(tmpl: Tmpl, scope: Mapping[str, object], sql: SqlTemplate) -> tuple[Any, dict[str, Any]]:
    """``tmpl`` (compiled from ``sql.source``) rendered over ``scope``, off the event loop; the text and the
    parameters its values became.

    Raises:
        mcpipe.results.StepFailure: as the front-end's renderings do (``FORBIDDEN`` for a value that would
            be SQL).
    """
    with binding(sql) as params:
        try:
            text = await tmpl.render_async(scope)
        except RenderError as e:
            raise StepFailure(str(e), e.code) from None
    return text, params
