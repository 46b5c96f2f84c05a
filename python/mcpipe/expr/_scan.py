"""Find the pipeline roots an expression mentions, by a light scan of its source.

The CEL and JSONata libraries compile an expression but do not say which *step ids* it reads:
``steps.fetch.output`` is a member access on the variable ``steps``. The integrator needs those ids to
reject forward and unknown step references at load, so we tokenize just enough of the source to skip
string literals (and JSONata comments and backtick names) and find root identifiers followed by member
or constant-index accesses. The result is a list of normalized references in the template language's
form (``steps.fetch.output.url``, ``steps["my-step"]`` becomes ``steps.my-step``), each with the
character offset where it starts.

Dynamic access (``steps[name]``) yields the bare root (``steps``): it cannot be checked statically, and it
tells the caller that the expression may read any step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Mention", "scan_cel", "scan_jsonata"]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DIGITS = re.compile(r"-?[0-9]+")
# A segment of a normalized reference that can be written bare (else it is quoted, as templates do).
_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*|-?[0-9]+")


@dataclass(frozen=True, slots=True)
class Mention:
    """One root-level reference found in an expression.

    Attributes:
        root: the root identifier (``steps``, ``args``, ...).
        segments: the constant member/index segments that follow it (``("fetch", "output")``).
        offset: where the root starts in the source (0-based character offset).
    """

    root: str
    segments: tuple[str, ...]
    offset: int

    def normalized(self) -> str:
        """The reference written as a template path: ``steps.fetch.output``."""
        out = [self.root]
        for s in self.segments:
            out.append(f".{s}" if _BARE.fullmatch(s) else f'["{_escape(s)}"]')
        return "".join(out)


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def scan_cel(source: str, roots: frozenset[str]) -> tuple[list[Mention], set[str]]:
    """Scan CEL source for references to ``roots``.

    Returns:
        The mentions of the roots (in source order) and the names bound by comprehension macros and
        ``cel.bind`` (``x`` in ``list.map(x, x * 2)``), which are local variables, not roots.
    """
    return _scan(source, roots, cel=True)


def scan_jsonata(source: str, roots: frozenset[str]) -> list[Mention]:
    """Scan JSONata source for root-level paths starting with one of ``roots`` (or ``$$.root``)."""
    return _scan(source, roots, cel=False)[0]


_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter", "sortBy", "transformList", "transformMap"})


def _scan(source: str, roots: frozenset[str], *, cel: bool) -> tuple[list[Mention], set[str]]:
    mentions: list[Mention] = []
    bound: set[str] = set()
    n = len(source)
    i = 0
    prev = ""  # the previous significant character (outside literals), to tell `x.steps` from `steps`
    while i < n:
        c = source[i]
        if c in "\"'" or (cel and c in "rRbB" and _string_prefix(source, i)):
            i = _skip_string(source, i, cel=cel)
            prev = '"'
            continue
        if not cel and c == "`":
            end = source.find("`", i + 1)
            i = n if end < 0 else end + 1
            prev = "`"
            continue
        if not cel and source.startswith("/*", i):
            end = source.find("*/", i + 2)
            i = n if end < 0 else end + 2
            continue
        if cel and source.startswith("//", i):
            end = source.find("\n", i)
            i = n if end < 0 else end + 1
            continue
        if c.isspace():
            i += 1
            continue
        m = _IDENT.match(source, i)
        if m is None:
            prev = c
            i += 1
            continue
        name = m.group()
        start, i = i, m.end()
        if cel and prev == "." and name in _MACROS:
            bound.update(_macro_vars(source, i))
        if cel and name == "bind" and prev == "." and source[max(0, start - 4) : start] == "cel.":
            bound.update(_macro_vars(source, i, limit=1))
        # A member (`x.steps`) is not a root, except JSONata's explicit root `$$.steps`; and `$steps` is a
        # JSONata variable, not a path.
        is_root = name in roots and (
            (not cel and source[:start].rstrip().endswith("$$.")) if prev == "." else prev != "$"
        )
        if is_root:
            segments, i = _segments(source, i, cel=cel)
            mentions.append(Mention(name, tuple(segments), start))
            prev = "x"
            continue
        prev = "x"
    return mentions, bound


def _skip_ws(source: str, i: int) -> int:
    """The index of the first non-space character at or after ``i``."""
    n = len(source)
    while i < n and source[i].isspace():
        i += 1
    return i


def _string_prefix(source: str, i: int) -> bool:
    """Is ``source[i]`` the start of a CEL string prefix (``r"..."``, ``b'...'``, ``rb"..."``)?"""
    if i > 0 and (source[i - 1].isalnum() or source[i - 1] == "_"):
        return False
    j = i
    while j < len(source) and j - i < 2 and source[j] in "rRbB":
        j += 1
    return j < len(source) and source[j] in "\"'"


def _skip_string(source: str, i: int, *, cel: bool) -> int:
    """Return the index just after the string literal starting at ``i`` (prefix included)."""
    raw = False
    while cel and source[i] in "rRbB":
        raw = raw or source[i] in "rR"
        i += 1
    q = source[i]
    triple = cel and source.startswith(q * 3, i)
    closer = q * 3 if triple else q
    j = i + len(closer)
    n = len(source)
    while j < n:
        if source[j] == "\\" and not raw:
            j += 2
            continue
        if source.startswith(closer, j):
            return j + len(closer)
        j += 1
    return n


def _string_value(source: str, i: int, *, cel: bool) -> tuple[str | None, int]:
    """Read a plain (non-raw, non-triple) string literal's value at ``i``, or None when it is not one."""
    if i >= len(source) or source[i] not in "\"'":
        return None, i
    end = _skip_string(source, i, cel=cel)
    body = source[i + 1 : end - 1]
    if end - i < 2 or source[end - 1] != source[i] or (cel and source.startswith(source[i] * 3, i)):
        return None, end
    if "\\" in body:
        try:
            body = body.encode("utf-8").decode("unicode_escape").encode("latin-1").decode("utf-8")
        except (UnicodeDecodeError, UnicodeEncodeError):
            return None, end
    return body, end


def _segments(source: str, i: int, *, cel: bool) -> tuple[list[str], int]:
    """Read ``.name``, ``["key"]`` and ``[3]`` accesses after a root; stop at anything dynamic."""
    segments: list[str] = []
    n = len(source)
    while True:
        j = _skip_ws(source, i)
        if j < n and source[j] == "." and not source.startswith("..", j):
            k = _skip_ws(source, j + 1)
            if not cel and k < n and source[k] == "`":
                end = source.find("`", k + 1)
                if end < 0:
                    return segments, n
                segments.append(source[k + 1 : end])
                i = end + 1
                continue
            m = _IDENT.match(source, k)
            if m is None:
                return segments, j
            # A method call (`x.size()`) ends the path: the name is a function, not a key.
            after = _skip_ws(source, m.end())
            if cel and after < n and source[after] == "(":
                return segments, j
            segments.append(m.group())
            i = m.end()
            continue
        if j < n and source[j] == "[":
            k = _skip_ws(source, j + 1)
            value, end = _string_value(source, k, cel=cel)
            if value is None:
                d = _DIGITS.match(source, k)
                if d is None:
                    return segments, j
                value, end = d.group(), d.end()
            close = _skip_ws(source, end)
            if close >= n or source[close] != "]":
                return segments, j
            segments.append(value)
            i = close + 1
            continue
        return segments, i


def _macro_vars(source: str, i: int, limit: int = 2) -> list[str]:
    """The variable names a macro call binds: ``(x, ...)`` or ``(k, v, ...)`` right after ``i``."""
    j = _skip_ws(source, i)
    if j >= len(source) or source[j] != "(":
        return []
    names: list[str] = []
    k = j + 1
    while len(names) < limit:
        k = _skip_ws(source, k)
        m = _IDENT.match(source, k)
        if m is None:
            break
        after = _skip_ws(source, m.end())
        if after >= len(source) or source[after] != ",":
            break
        names.append(m.group())
        k = after + 1
    return names
