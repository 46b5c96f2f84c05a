"""A slow, obviously-correct pure-Python implementation of the template language.

This is the reference the Rust core (``mcpipe.Template``) is tested against, property by property, and the
baseline the resolver benchmarks compare with. It follows ``spec/pipeline.md`` sections 3-4 and the
choices written down in ``docs/references.md``. Clarity over speed: it re-walks the template on every
resolve and builds every value anew.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mcpipe.errors import InterpolationError, TemplateSyntaxError

ROOTS = ("vars", "steps", "last", "args", "context")
STEP_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
STEP_N = re.compile(r"step([1-9][0-9]*)")
# A plain (unquoted) path segment: anything but dots, brackets, braces, angles, `$`, `\\`, quotes, space.
PLAIN_SEGMENT = re.compile(r"[^.\[\]{}<>$\\\"' \t\n\r\f\v]+")
WS = " \t\n\r\f\v"
INDEX = re.compile(r"-?[0-9]+")
IDENT_LOCATION = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


# --- paths -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seg:
    """One path segment. kind: "plain" (key, or index on arrays when digits), "key" (quoted: always a
    key), "index" (bracketed digits: index on arrays, key on objects), "star"."""

    kind: str
    text: str

    def normalized(self) -> str:
        if self.kind == "star":
            return ".*"
        if self.kind in ("plain", "index"):
            return "." + self.text
        # A quoted key prints plain when that reads back as the same key.
        if PLAIN_SEGMENT.fullmatch(self.text) and self.text != "*" and not INDEX.fullmatch(self.text):
            return "." + self.text
        return "[" + quote(self.text) + "]"

    def shown(self) -> str:
        """The segment as error messages name it."""
        n = self.normalized()
        return n[1:] if n.startswith(".") else n


@dataclass(frozen=True)
class Path:
    root: str
    segs: tuple[Seg, ...]

    def normalized(self) -> str:
        return self.root + "".join(s.normalized() for s in self.segs)


class PathSyntax(Exception):
    def __init__(self, reason: str, pos: int):
        super().__init__(reason)
        self.reason = reason
        self.pos = pos


def parse_segments(text: str, pos: int) -> tuple[list[Seg], int]:
    """Parse `(.segment | [index] | ["key"])*` from text[pos:]; return the segments and the end."""
    segs: list[Seg] = []
    n = len(text)
    while pos < n:
        c = text[pos]
        if c == ".":
            m = PLAIN_SEGMENT.match(text, pos + 1)
            if not m:
                raise PathSyntax("empty path segment", pos + 1)
            word = m.group()
            segs.append(Seg("star", "*") if word == "*" else Seg("plain", word))
            pos = m.end()
        elif c == "[":
            pos += 1
            if pos < n and text[pos] in "\"'":
                quote = text[pos]
                pos += 1
                buf = []
                while True:
                    if pos >= n:
                        raise PathSyntax("unterminated quoted key", pos)
                    ch = text[pos]
                    if ch == "\\" and pos + 1 < n and text[pos + 1] in (quote, "\\"):
                        buf.append(text[pos + 1])
                        pos += 2
                    elif ch == quote:
                        pos += 1
                        break
                    else:
                        buf.append(ch)
                        pos += 1
                seg = Seg("key", "".join(buf))
            elif text.startswith("*", pos):
                pos += 1
                seg = Seg("star", "*")
            else:
                m = INDEX.match(text, pos)
                if not m:
                    raise PathSyntax("expected an index, `*` or a quoted key after `[`", pos)
                seg = Seg("index", m.group())
                pos = m.end()
            if pos >= n or text[pos] != "]":
                raise PathSyntax("expected `]`", pos)
            pos += 1
            segs.append(seg)
        else:
            break
    return segs, pos


def parse_path(
    text: str, pos: int, *, step_form: bool, step_ids: Mapping[str, str], count: int | None = None
) -> tuple[Path, int]:
    """Parse a reference starting at pos. With step_form (the `{{...}}` brackets) the first word is a step
    id and the path is rewritten to `steps.<id>.output...`; step_ids maps N (as decimal text) to the id of
    step N; with `count` (the ids came as a list of that many), a step N past the list is an error."""
    m = PLAIN_SEGMENT.match(text, pos)
    if not m:
        raise PathSyntax("expected a reference", pos)
    head = m.group()
    if step_form:
        if not STEP_ID.fullmatch(head):
            raise PathSyntax(f"`{head}` is not a step id", pos)
        sn = STEP_N.fullmatch(head)
        step = step_ids.get(sn.group(1), head) if sn else head
        if sn and sn.group(1) not in step_ids and count and head not in step_ids.values():
            n, plural = sn.group(1), "" if count == 1 else "s"
            raise PathSyntax(f"`{head}` is past the end of the step list (step {n} of {count} step{plural})", pos)
        segs, end = parse_segments(text, m.end())
        return Path("steps", (Seg("plain", step), Seg("plain", "output"), *segs)), end
    if head not in ROOTS:
        raise PathSyntax(f"unknown root `{head}` (expected one of {', '.join(ROOTS)})", pos)
    segs, end = parse_segments(text, m.end())
    return Path(head, tuple(segs)), end


# --- templates ---------------------------------------------------------------------------------------


@dataclass
class Const:
    value: Any


@dataclass
class Ref:
    path: Path
    location: str


@dataclass
class Text:
    parts: list  # str or Ref
    location: str


@dataclass
class Obj:
    items: list  # (key, node)


@dataclass
class Arr:
    items: list


OPENERS = (("${", "}", False, True), ("{{", "}}", True, True), ("$<", ">", False, False), ("<<", ">>", True, False))


def quote(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def has_surrogate(s: str) -> bool:
    return any("\ud800" <= c <= "\udfff" for c in s)


def step_id_table(step_ids: Sequence[str] | Mapping[int, str] | None) -> dict[str, str]:
    """{N as decimal text: id of step N} from a sequence of ids (position 1 first) or a mapping {N: id}."""
    if step_ids is None:
        return {}
    pairs = step_ids.items() if isinstance(step_ids, Mapping) else enumerate(step_ids, 1)
    table = {}
    for n, step in pairs:
        if not isinstance(n, int):
            raise TypeError(f"step_ids keys must be integers, not {type(n).__name__}")
        if not isinstance(step, str):
            raise TypeError(f"step ids must be strings, not {type(step).__name__}")
        table[str(int(n))] = step
    return table


def child_location(base: str, key: Any) -> str:
    if not isinstance(key, str):  # a list index (or a non-string key of a Python dict)
        return f"{base}[{key}]"
    if IDENT_LOCATION.fullmatch(key):
        return f"{base}.{key}" if base else key
    return f"{base}[{quote(key)}]"


class Template:
    """The oracle's template: same constructor and results as ``mcpipe.Template``."""

    def __init__(
        self, value: Any, *, step_ids: Sequence[str] | Mapping[int, str] | None = None, location: str = ""
    ) -> None:
        self._ids = step_id_table(step_ids)
        self._count = len(step_ids) if step_ids is not None and not isinstance(step_ids, Mapping) else None
        self._refs: list[tuple[str, str]] = []
        self._node = self._compile(value, location)

    @property
    def references(self) -> list[str]:
        return [r for _, r in self._refs]

    @property
    def reference_sites(self) -> list[tuple[str, str]]:
        return list(self._refs)

    def _compile(self, value: Any, loc: str) -> Any:
        if isinstance(value, dict):
            if len(value) == 1 and "$ref" in value:
                target = value["$ref"]
                if not isinstance(target, str):
                    raise TemplateSyntaxError("`$ref` takes a path string", loc)
                if has_surrogate(target):
                    raise TemplateSyntaxError(
                        "invalid `$ref` path: not valid Unicode (it contains a lone surrogate)", loc
                    )
                text = target.strip(WS)
                try:
                    path, end = parse_path(text, 0, step_form=False, step_ids=self._ids)
                    if end != len(text):
                        raise PathSyntax(f"unexpected `{text[end]}`", end)
                except PathSyntax as e:
                    raise TemplateSyntaxError(f"invalid `$ref` path {quote(target)}: {e.reason}", loc) from None
                self._refs.append((loc, path.normalized()))
                return Ref(path, loc)
            if len(value) == 1 and "$literal" in value:
                return Const(value["$literal"])
            return Obj([(k, self._compile(v, child_location(loc, k))) for k, v in value.items()])
        if isinstance(value, (list, tuple)):
            return Arr([self._compile(v, child_location(loc, i)) for i, v in enumerate(value)])
        if isinstance(value, str):
            return self._compile_string(value, loc)
        return Const(value)

    def _compile_string(self, s: str, loc: str) -> Any:
        if has_surrogate(s) and any(o in s for o, *_ in OPENERS):
            raise TemplateSyntaxError(
                "string is not valid Unicode (it contains a lone surrogate) and cannot hold placeholders", loc
            )
        parts: list = []
        buf: list[str] = []
        i, n = 0, len(s)
        while i < n:
            if s[i] == "\\" and any(s.startswith(o, i + 1) for o, *_ in OPENERS):
                opener = next(o for o, *_ in OPENERS if s.startswith(o, i + 1))
                buf.append(opener)
                i += 1 + len(opener)
                continue
            hit = next((op for op in OPENERS if s.startswith(op[0], i)), None)
            if hit is None:
                buf.append(s[i])
                i += 1
                continue
            opener, closer, step_form, strict = hit
            try:
                j = i + len(opener)
                while j < n and s[j] in WS:
                    j += 1
                path, j = parse_path(s, j, step_form=step_form, step_ids=self._ids, count=self._count)
                while j < n and s[j] in WS:
                    j += 1
                if not s.startswith(closer, j):
                    raise PathSyntax(f"expected `{closer}`", j)
                end = j + len(closer)
            except PathSyntax as e:
                if not strict:
                    buf.append(opener)
                    i += len(opener)
                    continue
                if closer not in s[i + len(opener) :]:
                    reason = f"`{opener}` has no closing `{closer}` (character {i})"
                else:
                    reason = f"invalid placeholder at character {i}: {e.reason} (character {e.pos})"
                raise TemplateSyntaxError(reason, loc) from None
            if buf:
                parts.append("".join(buf))
                buf = []
            parts.append(Ref(path, loc))
            self._refs.append((loc, path.normalized()))
            i = end
        if buf:
            parts.append("".join(buf))
        if len(parts) == 1 and isinstance(parts[0], Ref):
            return parts[0]
        if not any(isinstance(p, Ref) for p in parts):
            return Const("".join(parts))
        return Text(parts, loc)

    # --- resolve ---

    def resolve(self, env: Mapping[str, Any]) -> Any:
        return self._resolve(self._node, env)

    def _resolve(self, node: Any, env: Mapping[str, Any]) -> Any:
        if isinstance(node, Const):
            return deep_copy(node.value)
        if isinstance(node, Ref):
            return deep_copy(lookup(node.path, env, node.location))
        if isinstance(node, Text):
            out = []
            for p in node.parts:
                out.append(p if isinstance(p, str) else stringify(lookup(p.path, env, p.location)))
            return "".join(out)
        if isinstance(node, Obj):
            return {k: self._resolve(v, env) for k, v in node.items}
        if isinstance(node, Arr):
            return [self._resolve(v, env) for v in node.items]
        raise AssertionError(node)


def deep_copy(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: deep_copy(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [deep_copy(x) for x in v]
    return v


def stringify(v: Any) -> str:
    if isinstance(v, str):
        return v
    if v is None:
        return ""
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def type_name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, dict):
        return "object"
    if isinstance(v, (list, tuple)):
        return "array"
    return type(v).__name__


def fail(path: Path, location: str, seg: str, found: Any, found_type: str | None = None) -> InterpolationError:
    keys = length = None
    if isinstance(found, Mapping):
        keys = [str(k) for k in list(found)[:10]]
        length = len(found)
    elif isinstance(found, (list, tuple)):
        length = len(found)
    return InterpolationError(path.normalized(), location, seg, found_type or type_name(found), keys, length)


def lookup(path: Path, env: Mapping[str, Any], location: str) -> Any:
    if path.root not in env:
        raise fail(path, location, path.root, env, "environment")
    return walk(path, list(path.segs), env[path.root], location)


def array_index(text: str) -> int:
    """The integer an index segment names; one too large for any array (and for `int()`) stays out of range."""
    if len(text.lstrip("-").lstrip("0")) > 20:
        return 1 << 80
    return int(text)


def walk(path: Path, segs: list[Seg], value: Any, location: str) -> Any:
    for i, seg in enumerate(segs):
        if seg.kind == "star":
            if isinstance(value, dict):
                items = list(value.values())
            elif isinstance(value, (list, tuple)):
                items = list(value)
            else:
                raise fail(path, location, "*", value)
            return [walk(path, segs[i + 1 :], item, location) for item in items]
        if isinstance(value, dict):
            if seg.text not in value:
                raise fail(path, location, seg.shown(), value)
            value = value[seg.text]
        elif isinstance(value, (list, tuple)) and seg.kind in ("plain", "index") and INDEX.fullmatch(seg.text):
            k = array_index(seg.text)
            if not -len(value) <= k < len(value):
                raise fail(path, location, seg.shown(), value)
            value = value[k]
        else:
            raise fail(path, location, seg.shown(), value)
    return value
