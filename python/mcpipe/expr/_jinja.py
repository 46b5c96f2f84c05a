"""Templates as NoETL writes them (``{{ input.query }}``, ``{{ secrets.pg_dsn }}``, ``| render(...)``), in a
sandboxed Jinja environment: compiled once, at load; rendered per run.

A string that is one ``{{ expression }}`` and nothing else renders to the expression's value (an object stays
an object); any other string renders to a string. Undefined names and attributes are errors, not empty
strings. Templates see only the roots they are given: no Python attributes (the sandbox), no globals.

Rendering is bounded while it runs (issue 20), by three budgets of one :func:`render` call:

- **bytes**: everything the template builds is charged as it is built, and refused before it is built when its
  size is known beforehand: each piece of output (constant text included), ``~``, ``+``, ``*`` and ``%``,
  every filter's result, every method's result. Strings and lists are measured before they are written as
  text (``{{ x }}``, ``tojson``, ``string``, ``join``, ``%``), so ``([s] * n) | tojson`` is refused before
  ``orjson`` is handed a value that would not fit, and widths (``center(n)``, ``"%*d"``, ``"{:>{n}}"``,
  ``batch(n)``) are checked against what is left. At most :data:`MAX_RENDER_BYTES` characters in all.
- **time**: the expression deadline (``pipe.expression_timeout_ms``). :func:`render_async` renders in a thread
  (the event loop keeps its turns of the interpreter); past the deadline, or when its caller is cancelled (a
  step's ``timeout_ms``), the thread is interrupted: an exception is raised in it at its next bytecode, so a
  loop that builds nothing stops too. :func:`render` interrupts its own thread the same way. A value whose
  every template only reads (``{{ input.url }}``, ``{{ output.status == 'error' }}``: :attr:`Compiled.bounded`)
  renders in the caller's thread at once: it cannot loop nor build, so no deadline could pass in it.
- **depth**: calls (macros, ``caller()``, methods) and nested ``render`` filters at most :data:`MAX_RENDER_DEPTH`
  deep, so a template rendering itself stops at once instead of recursing to Python's limit.

Past any of them the render is a :class:`RenderError` naming the field (``LIMIT_EXCEEDED``, or ``TIMEOUT``).
"""

from __future__ import annotations

import contextvars
import ctypes
import functools
import json
import re
import string
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jinja2
import orjson
import trio
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

from mcpipe._core import json_measure
from mcpipe._deadline import expression_timeout_ms
from mcpipe._util import RunLimiter
from mcpipe.errors import ErrorCode, MCPipeError

__all__ = [
    "MAX_BUILT",
    "MAX_RENDER_BYTES",
    "MAX_RENDER_DEPTH",
    "ROOTS",
    "Compiled",
    "PromptSource",
    "RenderError",
    "add_filter",
    "compile_value",
    "environment",
    "references",
    "render",
    "render_async",
]

ROOTS = ("input", "workload", "secrets", "resources", "turns", "prompts", "context", "args", "mcp")
"""The names a playbook template may start with."""

_WHOLE = re.compile(r"^\s*\{\{(?P<expr>.*)\}\}\s*$", re.S)


GLOBALS: dict[str, Any] = {"range": safe_range, "dict": dict}
"""The only globals templates see (``range`` is the sandbox's, at most 100,000 items)."""

MAX_BUILT = 1_000_000
"""The longest string or list ``*`` may build, and so the most a template's arithmetic can allocate."""

MAX_RENDER_BYTES = 16 * 1024 * 1024
"""The most one render may build, in characters (a list counts 8 per item, a dict 64 per entry), everything
it builds counted as it is built, intermediate values included."""

MAX_RENDER_DEPTH = 64
"""How deeply calls (macros, ``caller()``) and ``render`` filters may nest in one render."""

_LIST_ITEM = 8  # what one more item of a list costs (a pointer); the items themselves are counted where built
_DICT_ENTRY = 64


class PromptSource(str):
    """A prompt's template source (``prompts.NAME.template``): the only text ``render`` renders, so a value a
    caller sent can never be rendered as a template."""

    __slots__ = ()


class RenderError(MCPipeError):
    """A template failed at run time (an undefined name, a bad filter argument, a sandbox refusal), or ran
    past one of its budgets (``code``: ``LIMIT_EXCEEDED``, ``TIMEOUT``)."""

    code = "INTERPOLATION_FAILED"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


# --- the budgets of one render --------------------------------------------------------------------------


class _Refused(BaseException):
    """A budget ran out. A BaseException: it passes through the ``except Exception`` of Jinja and of filters
    (and Jinja's traceback rewriting), straight to :func:`render`."""

    def __init__(self, message: str, code: str = ErrorCode.LIMIT_EXCEEDED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class _Interrupted(BaseException):
    """Raised in a rendering thread when its deadline passed or its caller was cancelled."""


class _Budget:
    __slots__ = ("deadline", "depth", "ms", "room")

    def __init__(self, ms: float) -> None:
        self.room = MAX_RENDER_BYTES
        self.depth = 0
        self.ms = ms
        self.deadline = time.monotonic() + ms / 1000

    def charge(self, n: int) -> None:
        self.room -= n
        if self.room < 0:
            raise _Refused(f"the template built more than {MAX_RENDER_BYTES} characters")

    def fits(self, n: int, what: str) -> None:
        """Refuse building ``n`` more characters before building them."""
        if n > self.room:
            raise _Refused(f"{what} would build at least {n} characters, more than the {max(self.room, 0)} left")
        if time.monotonic() > self.deadline:
            raise _Interrupted


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("mcpipe_jinja_budget", default=None)


def _budget() -> _Budget:
    """The running render's budget; outside a render (a constant folded at compile time, a test rendering a
    Jinja template directly) a fresh one, so the same checks apply."""
    b = _BUDGET.get()
    return b if b is not None else _Budget(expression_timeout_ms())


def _cost(value: object) -> int:
    """What a value a step of the template built costs (its items are counted where they were built)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, (list, tuple)):
        return _LIST_ITEM * len(value)
    if isinstance(value, dict):
        return _DICT_ENTRY * len(value)
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    return 0


def _text_size(value: object, room: int) -> int:
    """The characters ``str(value)`` (or its JSON) would take, measured without building it; past ``room``
    the answer is only known to be past it."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, (list, tuple, dict)):
        return int(json_measure(value, max_bytes=max(room, 0), max_depth=10_000)[0])
    return 24


def _fits_text(value: object, what: str) -> None:
    b = _budget()
    b.fits(_text_size(value, b.room), what)


# Widths and precisions of printf-style conversions (``%10s``, ``%.*f``, ``%(name)-20s``).
_PRINTF = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_DIGITS = re.compile(r"\d+")


def _printf_room(fmt: str, args: object) -> int:
    """The most characters the widths of a printf-style format ask for (``*`` takes its argument)."""
    total = 0
    star_args = list(args) if isinstance(args, tuple) else [args]
    for m in _PRINTF.finditer(fmt):
        for part in m.groups():
            if part == "*":
                total += max((a for a in star_args if type(a) is int), default=0)
            elif part:
                total += int(part)
    return total


def _format_room(fmt: str, args: tuple[Any, ...], kwargs: Mapping[str, object]) -> int:
    """The most characters the format specs of a ``str.format`` string ask for (nested ``{}`` fields take
    their argument)."""
    total = 0
    try:
        parsed = list(string.Formatter().parse(fmt))
    except ValueError:
        return 0  # the call itself will say what is wrong
    for _literal, field, spec, _conversion in parsed:
        if field is None or not spec:
            continue
        for digits in _DIGITS.findall(spec):
            total += int(digits)
        if "{" in spec:  # a nested field: its value is a width
            total += max((a for a in (*args, *kwargs.values()) if type(a) is int), default=0)
    return total


def _check_ints(args: tuple[Any, ...], what: str) -> None:
    b = _budget()
    for a in args:
        if type(a) is int and a > b.room:
            raise _Refused(f"{what}: the argument {a} is more than the {max(b.room, 0)} characters left")


_STR_METHODS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs"})


def _before_call(obj: object, args: tuple[Any, ...], kwargs: Mapping[str, object]) -> None:
    """Refuse a method call whose result would not fit, before making it."""
    owner = getattr(obj, "__self__", None)
    name = getattr(obj, "__name__", "")
    if isinstance(owner, (str, bytes, bytearray)):
        where = f"`{name}`"
        if name in _STR_METHODS:
            _check_ints((*args, *kwargs.values()), where)
        elif name == "replace" and len(args) >= 2:
            _fits_replace(owner, args[0], args[1], where)
        elif name == "join" and args:
            _fits_join(args[0], where)
    elif isinstance(owner, int) and not isinstance(owner, bool):
        _check_ints((*args, *kwargs.values()), f"`{name}`")  # int.to_bytes(n)
    elif name in ("format", "format_map"):  # the sandbox's wrapper of str.format
        wrapped = getattr(obj, "__wrapped__", None)
        fmt = getattr(wrapped, "__self__", None)
        if isinstance(fmt, str):
            values = args[0] if name == "format_map" and args else kwargs
            positional = () if name == "format_map" else args
            b = _budget()
            b.fits(len(fmt) + _format_room(fmt, positional, values), f"`{name}`")
            for a in (*positional, *(values.values() if isinstance(values, Mapping) else ())):
                _fits_text(a, f"`{name}`")


def _fits_replace(s: object, old: object, new: object, what: str) -> None:
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
        count = len(s) + 1 if old == "" else s.count(old)
        _budget().fits(len(s) + count * len(new), what)


def _fits_join(items: object, what: str) -> None:
    if isinstance(items, (list, tuple)):
        b = _budget()
        total = 0
        for x in items:
            total += _text_size(x, b.room - total)
            if total > b.room:
                break
        b.fits(total, what)


# --- filters, bounded ------------------------------------------------------------------------------------

# Filters that write their value (or its items) as text: the value is measured first.
_STRINGIFY = frozenset(
    {
        "capitalize",
        "center",
        "e",
        "escape",
        "forceescape",
        "format",
        "indent",
        "lower",
        "pprint",
        "replace",
        "safe",
        "string",
        "striptags",
        "title",
        "trim",
        "truncate",
        "upper",
        "urlencode",
        "urlize",
        "wordcount",
        "wordwrap",
        "xmlattr",
    }
)
# Filters whose size arguments build that many characters or items.
_SIZED = frozenset({"center", "indent", "wordwrap", "truncate", "batch", "slice"})


def _bounded_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    passes = hasattr(fn, "jinja_pass_arg")

    @functools.wraps(fn)
    def bounded(*args: object, **kwargs: object) -> Any:
        rest = args[1:] if passes else args
        if rest:
            value, more = rest[0], rest[1:]
            what = f"the `{name}` filter"
            if name in _STRINGIFY:
                _fits_text(value, what)
            if name in _SIZED:
                _check_ints((*more, *kwargs.values()), what)
                if name == "indent" and more and isinstance(more[0], str) and isinstance(value, str):
                    _budget().fits(len(more[0]) * (value.count("\n") + 1) + len(value), what)
            elif name == "join":
                _fits_join(value, what)
            elif name == "replace" and len(more) >= 2:
                _fits_replace(value, more[0], more[1], what)
            elif name == "format" and isinstance(value, str):
                _budget().fits(len(value) + _printf_room(value, more or tuple(kwargs.values())), what)
                for a in (*more, *kwargs.values()):
                    _fits_text(a, what)
        out = fn(*args, **kwargs)
        _budget().charge(_cost(out))
        return out

    return bounded


@jinja2.pass_environment
def _sum(environment: Any, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
    """The ``sum`` filter, linear: summing lists (``start=[]``) or strings extends one result, where
    Python's ``sum`` copies it once per item."""
    if attribute is not None:
        from jinja2.filters import make_attrgetter

        iterable = map(make_attrgetter(environment, attribute), iterable)
    if isinstance(start, (list, str)):
        b = _budget()
        out = list(start) if isinstance(start, list) else [start]
        for x in iterable:
            b.charge(_cost(x) if isinstance(x, (list, str)) else _LIST_ITEM)
            if isinstance(start, list):
                out.extend(x)
            else:
                out.append(x)
        return out if isinstance(start, list) else "".join(out)
    return sum(iterable, start)


def _tojson(value: object) -> str:
    _fits_text(value, "the `tojson` filter")
    try:
        return orjson.dumps(value, default=str).decode()
    except orjson.JSONEncodeError as e:
        raise RenderError(f"tojson: {e}") from None


def _to_json(value: object) -> str:
    """NoETL's 2025 ``to_json`` filter: Python's ``json.dumps`` (its spacing, so text compares as NoETL's)."""
    _fits_text(value, "the `to_json` filter")
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError) as e:
        raise RenderError(f"to_json: {e}") from None


def _fromjson(text: Any) -> Any:
    if isinstance(text, str):
        _budget().charge(len(text))  # the value it makes is about as large as its text
    return orjson.loads(text)


@lru_cache(maxsize=512)
def _compiled_source(source: str) -> jinja2.Template:
    return environment().from_string(source)


@jinja2.pass_context
def _render(context: jinja2.runtime.Context, source: object, values: Mapping[str, object] | None = None) -> str:
    """``{{ prompts.summarize.template | render({'input': {...}}) }}``: render a template string with the
    current roots, ``values`` laid over them (sources are compiled once and cached)."""
    if not isinstance(source, PromptSource):
        raise RenderError("render: only a prompt's template (prompts.NAME.template) can be rendered")
    roots = {k: v for k, v in context.get_all().items() if k in ROOTS}
    if values:
        roots.update({str(k): v for k, v in values.items()})
    b = _budget()
    b.depth += 1
    try:
        if b.depth > MAX_RENDER_DEPTH:
            raise _Refused(f"renders nest more than {MAX_RENDER_DEPTH} deep")
        return _compiled_source(source).render(roots)
    finally:
        b.depth -= 1


# --- the environment -------------------------------------------------------------------------------------


class _CodeGenerator(CodeGenerator):
    """Jinja's code generator, writing every piece of output through ``environment.charged`` (constant text
    included, in a macro's or a block's buffer too) and ``~`` through ``environment.joined``."""

    def _output_const_repr(self, group: Any) -> str:
        return f"environment.charged({super()._output_const_repr(group)})"

    def _output_child_pre(self, node: nodes.Expr, frame: Frame, finalize: Any) -> None:
        self.write("environment.charged(")
        super()._output_child_pre(node, frame, finalize)

    def _output_child_post(self, node: nodes.Expr, frame: Frame, finalize: Any) -> None:
        super()._output_child_post(node, frame, finalize)
        self.write(")")

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.joined((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


def _finalize(value: object) -> Any:
    """What ``{{ x }}`` writes: a list or a dict is measured before it is written as text."""
    if isinstance(value, (list, tuple, dict)):
        _fits_text(value, "writing a value")
    return value


class _Environment(ImmutableSandboxedEnvironment):
    """The sandbox, with what a template builds bounded (see the module's docstring)."""

    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset(["*", "**", "+", "%"])

    def charged(self, text: object) -> Any:
        _budget().charge(len(text) if isinstance(text, str) else 0)
        return text

    def joined(self, parts: tuple[Any, ...]) -> str:
        b = _budget()
        total = 0
        for p in parts:
            total += _text_size(p, b.room - total)
            if total > b.room:
                break
        b.fits(total, "`~`")
        out = "".join([p if isinstance(p, str) else str(p) for p in parts])
        b.charge(len(out))
        return out

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        b = _budget()
        if operator == "**":
            if isinstance(right, int) and abs(right) > 1000 and isinstance(left, int) and abs(left) > 1:
                raise SecurityError(f"the power {left} ** {right} is too large")
            return left**right
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                    if len(seq) * n > MAX_BUILT:
                        raise SecurityError(f"`*` would build {len(seq) * n} items, more than {MAX_BUILT}")
                    unit = 1 if isinstance(seq, str) else _LIST_ITEM
                    b.fits(unit * len(seq) * n, "`*`")
            out = left * right
        elif operator == "+":
            if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                unit = 1 if isinstance(left, str) else _LIST_ITEM
                b.fits(unit * (len(left) + len(right)), "`+`")
            out = left + right
        else:  # %
            if isinstance(left, str):
                b.fits(len(left) + _printf_room(left, right), "`%`")
                for a in right if isinstance(right, tuple) else (right,):
                    _fits_text(a, "`%`")
            out = left % right
        b.charge(_cost(out))
        return out

    def call(__self, __context: jinja2.runtime.Context, __obj: object, *args: object, **kwargs: object) -> Any:
        b = _budget()
        if time.monotonic() > b.deadline:
            raise _Interrupted
        _before_call(__obj, args, kwargs)
        b.depth += 1
        try:
            if b.depth > MAX_RENDER_DEPTH:
                raise _Refused(f"calls nest more than {MAX_RENDER_DEPTH} deep")
            out = super().call(__context, __obj, *args, **kwargs)
        finally:
            b.depth -= 1
        b.charge(_cost(out))
        return out


_ENV: ImmutableSandboxedEnvironment | None = None
_FORMAT_FILTERS: dict[str, Callable[..., Any]] = {}


def add_filter(name: str, fn: Callable[..., Any]) -> None:
    """A filter of a format's own in the one environment (the NoETL front-end's SQL values,
    :mod:`mcpipe.formats.noetl._sqlbind`), registered when that format is imported. ``fn`` is bounded by its
    author: what it builds is not charged for it."""
    _FORMAT_FILTERS[name] = fn
    if _ENV is not None:
        _ENV.filters[name] = fn


def environment() -> ImmutableSandboxedEnvironment:
    """The one sandboxed environment every playbook template compiles in."""
    global _ENV
    if _ENV is None:
        env = _Environment(
            undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True, finalize=_finalize
        )
        env.filters = {name: _bounded_filter(name, fn) for name, fn in env.filters.items()}
        env.filters["sum"] = _bounded_filter("sum", _sum)
        env.filters["tojson"] = _tojson
        env.filters["to_json"] = _to_json
        env.filters["fromjson"] = _fromjson
        env.filters["render"] = _render
        env.filters.update(_FORMAT_FILTERS)
        env.globals.clear()
        env.globals.update(GLOBALS)
        _ENV = env
    return _ENV


@dataclass(frozen=True, slots=True)
class Compiled:
    """A compiled value: constants, templates, and objects/arrays of them."""

    render: Callable[[Mapping[str, Any]], Any]
    sources: tuple[str, ...]
    """Every template source in it (for static reference checks)."""
    bounded: bool = False
    """Each of its templates is one expression that builds nothing and takes time in proportion to the values
    it reads (:func:`_bounded`: ``{{ input.url }}``, ``{{ output.status == 'error' }}``): rendered in the
    caller's thread, without a watchdog, since no deadline could pass in it."""

    @property
    def constant(self) -> bool:
        return not self.sources


def _const(value: object) -> Compiled:
    return Compiled(lambda _roots: value, (), True)


_COMPARISONS = frozenset({"eq", "ne", "lt", "lteq", "gt", "gteq", "in", "notin"})


def _bounded(node: nodes.Node) -> bool:
    """Whether an expression only reads: names, attributes and items by constant keys, constants (lists and
    tuples of them too), comparisons, ``in``, ``and``, ``or``, ``not``. No call, filter, test, arithmetic or
    concatenation: it builds nothing, and its time is at most linear in the values it reads."""
    match node:
        case nodes.Name():
            return node.ctx == "load"
        case nodes.Const():
            return True
        case nodes.Getattr():
            return _bounded(node.node)
        case nodes.Getitem():
            return isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str | int) and _bounded(node.node)
        case nodes.List() | nodes.Tuple():
            return all(isinstance(item, nodes.Const) for item in node.items)
        case nodes.Compare():
            return _bounded(node.expr) and all(op.op in _COMPARISONS and _bounded(op.expr) for op in node.ops)
        case nodes.And() | nodes.Or():
            return _bounded(node.left) and _bounded(node.right)
        case nodes.Not():
            return _bounded(node.node)
    return False


def _sole_expression(env: jinja2.Environment, source: str) -> nodes.Node | None:
    """The expression of ``source`` when it is one whole ``{{ expression }}`` (blanks around it aside)."""
    body = env.parse(source).body
    if len(body) != 1 or not isinstance(body[0], nodes.Output):
        return None
    exprs = [n for n in body[0].nodes if not (isinstance(n, nodes.TemplateData) and not n.data.strip())]
    return exprs[0] if len(exprs) == 1 else None


_SPECIAL = frozenset({"self", "loop", "caller", "varargs", "kwargs", "super"})
"""Names a template's code resolves itself (``self`` is the template's reference), not from its roots."""
_MISS = object()


@dataclass(frozen=True, slots=True)
class _Item:
    """A step of a :func:`_path` that reads an item (``[0]``, ``['id']``); a plain ``str`` reads an attribute."""

    key: str | int


_Path = tuple[str, tuple["str | _Item", ...]]


def _path(node: nodes.Node) -> _Path | None:
    """``(name, steps)`` when the expression ``node`` only reads a root and attributes or items of it by
    constant keys (``{{ workload.numbers }}``, ``{{ rows[0]['id'] }}``); else None."""
    steps: list[str | _Item] = []
    while True:
        match node:
            case nodes.Getattr():
                steps.append(node.attr)
                node = node.node
            case nodes.Getitem(arg=nodes.Const(value=str() | int() as key)) if not isinstance(key, bool):
                steps.append(_Item(key))
                node = node.node
            case nodes.Name(ctx="load") if node.name not in _SPECIAL:
                return node.name, tuple(reversed(steps))
            case _:
                return None


def _read(env: jinja2.Environment, path: _Path, roots: Mapping[str, object]) -> Any:
    """What the expression of :func:`_path` reads, by the calls its compiled code makes (the sandbox's
    ``getattr`` and ``getitem``), without a template context; :data:`_MISS` when its root is not one of
    ``roots`` (a global) or something on the way is undefined: the template then says why, as before."""
    name, steps = path
    if name not in roots:
        return _MISS
    out: Any = roots[name]
    for step in steps:
        out = env.getattr(out, step) if isinstance(step, str) else env.getitem(out, step.key)
        if isinstance(out, jinja2.Undefined):
            return _MISS
    return out


def compile_value(value: object, location: str, problems: list[tuple[str, str]]) -> Compiled:
    """Compile a YAML value whose strings may be templates; syntax errors go to ``problems`` as
    ``(location, message)``."""
    if isinstance(value, str):
        if "{{" not in value and "{%" not in value:
            return _const(value)
        env = environment()
        try:
            m = _WHOLE.match(value)
            if m is not None and "}}" not in m.group("expr") and "{{" not in m.group("expr"):
                expr = env.compile_expression(m.group("expr"), undefined_to_none=False)
                sole = _sole_expression(env, value)
                path = _path(sole) if sole is not None else None

                def whole(roots: Mapping[str, object]) -> Any:
                    out = _read(env, path, roots) if path is not None else _MISS
                    if out is _MISS:
                        out = expr(**roots)
                    if isinstance(out, jinja2.Undefined):
                        out._fail_with_undefined_error()
                    # The value goes on as it is (JSON in a request, a message's text): it must fit as text.
                    _fits_text(out, "the value")
                    return out

                return Compiled(whole, (value,), sole is not None and _bounded(sole))
            template = env.from_string(value)
        except jinja2.TemplateSyntaxError as e:
            problems.append((location, f"template syntax error: {e.message} (line {e.lineno})"))
            return _const(None)
        except RecursionError:
            problems.append((location, "the template nests too deeply to compile"))
            return _const(None)
        return Compiled(lambda roots: template.render(roots), (value,))
    if isinstance(value, Mapping):
        items = [(str(k), compile_value(v, f"{location}.{k}", problems)) for k, v in value.items()]
        if all(c.constant for _, c in items):
            return _const(value)
        return Compiled(
            lambda roots: {k: c.render(roots) for k, c in items},
            tuple(s for _, c in items for s in c.sources),
            all(c.bounded for _, c in items),
        )
    if isinstance(value, list):
        parts = [compile_value(v, f"{location}[{i}]", problems) for i, v in enumerate(value)]
        if all(c.constant for c in parts):
            return _const(value)
        return Compiled(
            lambda roots: [c.render(roots) for c in parts],
            tuple(s for c in parts for s in c.sources),
            all(c.bounded for c in parts),
        )
    return _const(value)


def references(sources: tuple[str, ...]) -> Iterator[tuple[str, str | None]]:
    """``(root, name)`` of every root a template reads: ``resources.kb`` -> ``("resources", "kb")``,
    ``resources['kb']`` too; ``(root, None)`` when the name is not a constant. Sources are assumed valid."""
    env = environment()
    for source in sources:
        try:
            ast = env.parse(source)
        except jinja2.TemplateSyntaxError:
            continue
        local = {n.name for n in ast.find_all(nodes.Name) if n.ctx in ("store", "param")}
        named: set[int] = set()
        found: Any
        for found in ast.find_all((nodes.Getattr, nodes.Getitem)):
            node = found
            inner = node.node
            if isinstance(inner, nodes.Name) and inner.name in ROOTS and inner.name not in local:
                named.add(id(inner))
                if isinstance(node, nodes.Getattr):
                    yield inner.name, node.attr
                elif isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
                    yield inner.name, node.arg.value
                else:
                    yield inner.name, None
        for n in ast.find_all(nodes.Name):
            if n.ctx == "load" and id(n) not in named and n.name not in local:
                yield n.name, None


def _located(compiled: Compiled, roots: Mapping[str, object], location: str) -> Any:
    """Render, turning every template failure into a :class:`RenderError` naming ``location``."""
    try:
        return compiled.render(roots)
    except RenderError as e:
        raise RenderError(f"{location}: {e}", e.code) from None
    except _Refused as e:
        raise RenderError(f"{location}: {e.message}", e.code) from None
    except jinja2.UndefinedError as e:
        raise RenderError(f"{location}: {e.message}") from None
    except jinja2.exceptions.SecurityError as e:
        raise RenderError(f"{location}: refused by the sandbox: {e}") from None
    except RecursionError:
        raise RenderError(f"{location}: the template recursed too deeply", ErrorCode.LIMIT_EXCEEDED) from None
    except MemoryError:
        raise RenderError(f"{location}: the template ran out of memory", ErrorCode.LIMIT_EXCEEDED) from None
    except (jinja2.TemplateError, TypeError, ValueError, ArithmeticError, LookupError) as e:
        raise RenderError(f"{location}: {type(e).__name__}: {e}") from None


# CPython's way to raise an exception in another thread at its next bytecode. Never called with NULL (to
# clear a pending one): CPython then sets the interpreter's "asynchronous exception pending" flag that only
# raising a real one clears, so every thread's eval loop goes through its pending-work check at each call and
# loop from then on, and under a profiler (``python -m cProfile``) spins at 100% CPU on a generator's resume.
_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.c_void_p)
_set_async_exc.restype = ctypes.c_int


class _Job:
    """One bounded render in one thread, which :meth:`interrupt` stops (from any thread) while it runs and
    never after: the flag and the injection are taken under one lock, and a thread that was interrupted
    takes a pending injection as it finishes (raised there and dropped), so nothing reaches the code the
    thread runs next."""

    def __init__(self, ms: float) -> None:
        self.budget = _Budget(ms)
        self.lock = threading.Lock()
        self.thread: int | None = None
        self.finished = False
        self.injected = False

    def interrupt(self) -> None:
        with self.lock:
            if self.thread is not None and not self.finished:
                self.injected = True
                _set_async_exc(self.thread, id(_Interrupted))

    def run(self, compiled: Compiled, roots: Mapping[str, object], location: str) -> Any:
        self.budget.deadline = time.monotonic() + self.budget.ms / 1000  # from now: not the wait for a thread
        token = _BUDGET.set(self.budget)
        with self.lock:
            self.thread = threading.get_ident()
        raised = False
        try:
            return _located(compiled, roots, location)
        except _Interrupted:
            raised = True
            raise
        finally:
            try:
                with self.lock:
                    self.finished = True
                    injected = self.injected
                if injected and not raised:  # pending still: raised at the loop's first backward jump
                    for _ in range(64):
                        pass
                    # Not raised there (CPython lost the flag to another thread's injection): cleared, at the
                    # cost above, rather than reaching the next code this thread runs.
                    _set_async_exc(threading.get_ident(), None)
            except _Interrupted:
                pass
            _BUDGET.reset(token)


def _timed_out(location: str, ms: float) -> RenderError:
    return RenderError(f"{location}: the template took longer than {ms:g} ms to render", ErrorCode.TIMEOUT)


def render(compiled: Compiled, roots: Mapping[str, object], location: str) -> Any:
    """Render within the budgets (see the module's docstring), in this thread: a watchdog interrupts it at
    the deadline. On the event loop, prefer :func:`render_async`, which leaves the loop free.

    Raises:
        RenderError: naming ``location``; ``code`` ``LIMIT_EXCEEDED`` or ``TIMEOUT`` past a budget.
    """
    if compiled.constant:
        return compiled.render(roots)
    outer = _BUDGET.get()
    if outer is not None or compiled.bounded:  # a render inside a render (a prompt's template): the same budgets
        return _located(compiled, roots, location)
    ms = expression_timeout_ms()
    job = _Job(ms)
    watchdog = threading.Timer(ms / 1000, job.interrupt)
    watchdog.daemon = True
    watchdog.start()
    try:
        try:
            return job.run(compiled, roots, location)
        finally:
            watchdog.cancel()
    except _Interrupted:
        raise _timed_out(location, ms) from None


_threads = RunLimiter("mcpipe_jinja_threads", 4)


async def render_async(compiled: Compiled, roots: Mapping[str, object], location: str) -> Any:
    """:func:`render` off the event loop: in a thread (at most 4 at once), interrupted at the deadline or as
    soon as the caller is cancelled (a step's ``timeout_ms``). The deadline starts when the rendering does:
    waiting for a thread is not rendering (before, a caller queued behind others' slow templates timed out
    without its own having run). A :attr:`~Compiled.bounded` value renders here, at once: a thread and its
    watchdog would cost more than the lookups.

    Raises:
        RenderError: as :func:`render`.
    """
    if compiled.constant:
        return compiled.render(roots)
    if compiled.bounded:
        return _located(compiled, roots, location)
    ms = expression_timeout_ms()
    job = _Job(ms)
    try:
        return await trio.to_thread.run_sync(
            _watched, job, compiled, roots, location, abandon_on_cancel=True, limiter=_threads()
        )
    except trio.Cancelled:
        job.interrupt()  # the thread stops at its next bytecode; nobody waits for it
        raise
    except _Interrupted:
        raise _timed_out(location, ms) from None


def _watched(job: _Job, compiled: Compiled, roots: Mapping[str, object], location: str) -> Any:
    """``job.run`` in this thread, a watchdog interrupting it at the deadline, counted from now."""
    watchdog = threading.Timer(job.budget.ms / 1000, job.interrupt)
    watchdog.daemon = True
    watchdog.start()
    try:
        return job.run(compiled, roots, location)
    finally:
        watchdog.cancel()
