"""NoETL's templates: Jinja in any string of a tool's fields, ``set``, ``input`` and arc conditions, compiled
once at load (through :mod:`mcpipe.expr._jinja`, the sandboxed environment every playbook uses) and
rendered with NoETL's rules:

- a string that is one ``{{ expression }}`` renders to the value (an object stays an object);
- in a tool's fields (NoETL's ``render_template``), a rendered string that reads as a JSON or Python list or
  object is that value, unless the template uses ``tojson`` (at most :data:`MAX_LITERAL` characters; a Python
  literal is read by :func:`~mcpipe.formats.noetl._literal.py_literal`, within the rendering's deadline);
- in ``set`` and arc conditions (NoETL's engine, ``_render_template``), ``"true"``/``"false"`` are booleans;
- in a pipeline's policy rules (NoETL's worker, ``render_template_str``), every template renders to text (a
  number is its digits), read back as a list or object when it reads as one;
- a condition holds unless it renders to false, ``"false"``, ``"0"``, ``"no"``, ``"none"`` or ``""``.

Unlike NoETL, an undefined name is an error naming the template's place, never the template left as it was.
"""

from __future__ import annotations

import contextlib
import datetime
import re
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from mcpipe._describe import json_type
from mcpipe.errors import Problem
from mcpipe.expr._jinja import Compiled, RenderError, compile_value, render, render_async
from mcpipe.formats.noetl._literal import py_literal

__all__ = [
    "CODE",
    "MAX_LITERAL",
    "Findings",
    "Tmpl",
    "compile_tmpl",
    "fill",
    "has_jinja",
    "leaves",
    "now",
    "problem_order",
    "truthy",
    "walk",
]

L = TypeVar("L")

MAX_LITERAL = 1_000_000
"""The longest rendered text read back as a list or object (NoETL's JSON/literal coercion)."""
CODE = "INVALID_PLAYBOOK"


def problem_order(p: Problem) -> list[tuple[int, Any]]:
    """The sort key of problems in document order (``steps[2]`` before ``steps[10]``)."""
    return [(0, int(x)) if x.isdigit() else (1, x) for x in re.split(r"[\[\].]+", p.location) if x]


class Findings:
    """What reading or compiling a playbook found: its problems (each located, :data:`CODE`) and warnings."""

    def __init__(self, problems: list[Problem] | None = None) -> None:
        self.problems: list[Problem] = [] if problems is None else problems
        self.warnings: list[str] = []

    def add(self, location: str, message: str) -> None:
        """A problem at ``location``."""
        self.problems.append(Problem(location, CODE, message))

    def unknown(
        self, keys: Iterable[object], where: str, known: Container[object], what: str, noun: str = "key"
    ) -> None:
        """Each of ``keys`` not ``known``: a problem, an unknown ``noun`` of ``what`` (``{k}`` in it: the key)."""
        for k in keys:
            if k not in known:
                self.add(f"{where}.{k}", f"unknown {noun} `{k}` of {what.format(k=k)}")

    def whole(self, value: object, location: str, low: int, high: int, default: int) -> int:
        """``value`` when it is an integer from ``low`` to ``high``, else ``default`` and the problem."""
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            self.add(location, f"must be an integer from {low} to {high}")
            return default
        return value

    def seconds(self, value: object, location: str, default: float, what: str = "a number") -> float:
        """``value`` as a float when it is a number from 0 to 3600, else ``default`` and the problem."""
        if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 3600:
            self.add(location, f"must be {what} from 0 to 3600")
            return default
        return float(value)

    def obj(self, value: object, location: str, detail: str = "", *, got: bool = True) -> Mapping[Any, Any] | None:
        """``value`` when it is an object, else None and the problem: it must be an object (``detail`` after
        that; ``got``: then what it is)."""
        if isinstance(value, Mapping):
            return value
        self.add(location, f"must be an object{detail}" + (f", got {json_type(value)}" if got else ""))
        return None

    def name(self, value: object, location: str) -> str | None:
        """``value`` when it is a non-empty string, else None and the problem."""
        if not isinstance(value, str) or not value:
            self.add(location, f"must be a non-empty string, got {json_type(value)}")
            return None
        return value


@dataclass(frozen=True, slots=True)
class Tmpl:
    """A compiled value whose strings are NoETL templates."""

    compiled: Compiled
    location: str
    mode: str  # "config" | "engine"
    shape: Any  # the value with each template string replaced by its index in `parts`
    parts: tuple[tuple[Compiled, bool], ...]  # (compiled string, uses tojson)
    inline: Compiled | None = None
    """The whole rendered in the caller's thread, when every template in it only reads
    (:attr:`~mcpipe.expr._jinja.Compiled.bounded`); it gives way to a thread's render (:class:`_Slow`) where
    a text is long enough that reading it back as a literal is work."""

    @property
    def sources(self) -> tuple[str, ...]:
        return self.compiled.sources

    def render(self, roots: Mapping[str, object]) -> Any:
        """The value rendered over ``roots``, in this thread, within the templates' budgets (time, size:
        :mod:`mcpipe.expr._jinja`). Raises :class:`RenderError` located at the template."""
        if not self.parts:
            return self.shape
        try:
            if self.inline is not None:
                with contextlib.suppress(_Slow):
                    return render(self.inline, roots, self.location)
            return render(self.compiled, roots, self.location)
        except RenderError as e:
            raise _once(e, self.location) from None

    async def render_async(self, roots: Mapping[str, object]) -> Any:
        """:meth:`render` off the event loop (a worker thread, interrupted at the deadline), or at once in
        this thread when every template in it only reads (:attr:`inline`)."""
        if not self.parts:
            return self.shape
        try:
            if self.inline is not None:
                with contextlib.suppress(_Slow):
                    return await render_async(self.inline, roots, self.location)
            return await render_async(self.compiled, roots, self.location)
        except RenderError as e:
            raise _once(e, self.location) from None


class _Slow(Exception):
    """An inline render (:attr:`Tmpl.inline`) met a text longer than :data:`INLINE_LITERAL` to read back as a
    literal: the render is done again in a thread, where a deadline bounds that reading."""


INLINE_LITERAL = 4096
"""The longest rendered text an inline render reads back as a literal (``"[...]"``, ``"{...}"``) itself."""


def _once(e: RenderError, location: str) -> RenderError:
    """The error located once: a template inside the value names its own place, within the value's."""
    text = str(e)
    outer = f"{location}: "
    if text.startswith(outer) and text[len(outer) :].startswith(location):
        return RenderError(text[len(outer) :], e.code)
    return e


@dataclass(frozen=True, slots=True)
class _Slot:
    i: int
    where: str


def walk(value: object, location: str, leaf: Callable[[str, str], Any]) -> Any:
    """``value`` (any YAML value) with each string ``s`` at ``where`` replaced by ``leaf(s, where)`` (keys as text)."""
    if isinstance(value, str):
        return leaf(value, location)
    if isinstance(value, Mapping):
        return {str(k): walk(v, f"{location}.{k}", leaf) for k, v in value.items()}
    if isinstance(value, list):
        return [walk(v, f"{location}[{i}]", leaf) for i, v in enumerate(value)]
    return value


def fill(shape: object, kind: type[L], leaf: Callable[[L], Any]) -> Any:
    """A shape :func:`walk` made with each leaf of type ``kind`` replaced by ``leaf(it)``."""
    if isinstance(shape, kind):
        return leaf(shape)
    if isinstance(shape, dict):
        return {k: fill(v, kind, leaf) for k, v in shape.items()}
    if isinstance(shape, list):
        return [fill(v, kind, leaf) for v in shape]
    return shape


def leaves(shape: object, kind: type[L]) -> list[L]:
    """The leaves of type ``kind`` in a shape :func:`walk` made, in order."""
    found: list[L] = []
    fill(shape, kind, found.append)
    return found


def has_jinja(value: object) -> bool:
    """Whether ``value`` (any YAML value) holds a Jinja expression or statement anywhere."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, Mapping):
        return any(has_jinja(v) for v in value.values())
    if isinstance(value, list):
        return any(has_jinja(v) for v in value)
    return False


def compile_tmpl(value: object, location: str, problems: list[tuple[str, str]], mode: str = "config") -> Tmpl:
    """Compile ``value`` (any YAML value); syntax errors go to ``problems`` as ``(location, message)``."""
    parts: list[tuple[Compiled, bool]] = []

    def leaf(v: str, where: str) -> Any:
        if "{{" not in v and "{%" not in v:
            return v
        parts.append((compile_value(v, where, problems), "tojson" in v))
        return _Slot(len(parts) - 1, where)

    shape = walk(value, location, leaf)
    sources = tuple(s for c, _ in parts for s in c.sources)
    frozen = tuple(parts)
    # One render of the whole value: each template in it renders within the same budgets, located at itself.
    whole = Compiled(lambda roots: fill(shape, _Slot, lambda at: _part(frozen[at.i], at.where, roots, mode)), sources)
    inline = None
    if parts and all(c.bounded for c, _ in parts):
        inline = Compiled(
            lambda roots: fill(shape, _Slot, lambda at: _part(frozen[at.i], at.where, roots, mode, inline=True)),
            sources,
            True,
        )
    return Tmpl(whole, location, mode, shape, frozen, inline)


def _part(part: tuple[Compiled, bool], where: str, roots: Mapping[str, object], mode: str, inline: bool = False) -> Any:
    compiled, tojson = part
    out = render(compiled, roots, where)
    if mode == "text" and not isinstance(out, str):
        out = str(out)  # NoETL's worker renders the template to text, whatever the expression's value
    if isinstance(out, str) and not tojson:
        if inline and mode != "engine" and len(out) > INLINE_LITERAL:
            raise _Slow
        out = _coerce(out, "config" if mode == "text" else mode)
    return out


def _coerce(text: str, mode: str) -> Any:
    if mode == "engine":
        low = text.lower()
        if low in ("true", "false"):
            return low == "true"
        return text
    stripped = text.strip()
    if len(stripped) > MAX_LITERAL or len(stripped) < 2:
        return text
    if (stripped[0], stripped[-1]) not in (("[", "]"), ("{", "}")):
        return text
    try:
        return orjson.loads(stripped)
    except orjson.JSONDecodeError:
        pass
    try:
        value = py_literal(stripped)  # bounded, interruptible: never ast.literal_eval (see _literal)
    except (ValueError, TypeError, ArithmeticError, MemoryError):
        return text
    return value if isinstance(value, list | dict) else text


def now() -> str:
    """``now()`` of the 2025 engines' templates: the local time, ISO 8601."""
    return datetime.datetime.now().isoformat()


def truthy(value: object) -> bool:
    """Whether a rendered condition holds, as NoETL's engine decides it."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value.strip().lower() not in ("false", "0", "no", "none", "")
    return bool(value)


__all__ += ["RenderError"]
