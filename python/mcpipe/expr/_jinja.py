"""Templates as NoETL writes them (``{{ input.query }}``, ``{{ secrets.pg_dsn }}``, ``| render(...)``), in a
sandboxed Jinja environment: compiled once, at load; rendered per run.

A string that is one ``{{ expression }}`` and nothing else renders to the expression's value (an object stays
an object); any other string renders to a string. Undefined names and attributes are errors, not empty
strings. Templates see only the roots they are given: no Python attributes (the sandbox), no globals.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jinja2
import orjson
from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

from mcpipe.errors import MCPipeError

__all__ = [
    "MAX_BUILT",
    "ROOTS",
    "Compiled",
    "PromptSource",
    "RenderError",
    "compile_value",
    "environment",
    "references",
    "render",
]

ROOTS = ("input", "workload", "secrets", "resources", "turns", "prompts", "context", "args", "mcp")
"""The names a playbook template may start with."""

_WHOLE = re.compile(r"^\s*\{\{(?P<expr>.*)\}\}\s*$", re.S)


GLOBALS: dict[str, Any] = {"range": safe_range, "dict": dict}
"""The only globals templates see (``range`` is the sandbox's, at most 100,000 items)."""

MAX_BUILT = 1_000_000
"""The longest string or list ``*`` may build, and so the most a template's arithmetic can allocate."""


class PromptSource(str):
    """A prompt's template source (``prompts.NAME.template``): the only text ``render`` renders, so a value a
    caller sent can never be rendered as a template."""

    __slots__ = ()


class _Environment(ImmutableSandboxedEnvironment):
    """The sandbox, with ``*`` and ``**`` bounded: ``'a' * 10**10`` is refused, not allocated."""

    intercepted_binops = frozenset(["*", "**"])

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "**":
            if isinstance(right, int) and abs(right) > 1000 and isinstance(left, int) and abs(left) > 1:
                raise SecurityError(f"the power {left} ** {right} is too large")
            return left**right
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_BUILT:
                raise SecurityError(f"`*` would build {len(seq) * n} items, more than {MAX_BUILT}")
        return left * right


class RenderError(MCPipeError):
    """A template failed at run time (an undefined name, a bad filter argument, a sandbox refusal)."""

    code = "INTERPOLATION_FAILED"


def _tojson(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


def _fromjson(text: Any) -> Any:
    return orjson.loads(text)


@lru_cache(maxsize=512)
def _compiled_source(source: str) -> jinja2.Template:
    return environment().from_string(source)


@jinja2.pass_context
def _render(context: jinja2.runtime.Context, source: Any, values: Mapping[str, Any] | None = None) -> str:
    """``{{ prompts.summarize.template | render({'input': {...}}) }}``: render a template string with the
    current roots, ``values`` laid over them (sources are compiled once and cached)."""
    if not isinstance(source, PromptSource):
        raise RenderError("render: only a prompt's template (prompts.NAME.template) can be rendered")
    roots = {k: v for k, v in context.get_all().items() if k in ROOTS}
    if values:
        roots.update({str(k): v for k, v in values.items()})
    return _compiled_source(source).render(roots)


_ENV: ImmutableSandboxedEnvironment | None = None


def environment() -> ImmutableSandboxedEnvironment:
    """The one sandboxed environment every playbook template compiles in."""
    global _ENV
    if _ENV is None:
        env = _Environment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True)
        env.filters["tojson"] = _tojson
        env.filters["fromjson"] = _fromjson
        env.filters["render"] = _render
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

    @property
    def constant(self) -> bool:
        return not self.sources


def _const(value: Any) -> Compiled:
    return Compiled(lambda _roots: value, ())


def compile_value(value: Any, location: str, problems: list[tuple[str, str]]) -> Compiled:
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

                def whole(roots: Mapping[str, Any]) -> Any:
                    out = expr(**roots)
                    if isinstance(out, jinja2.Undefined):
                        out._fail_with_undefined_error()
                    return out

                return Compiled(whole, (value,))
            template = env.from_string(value)
        except jinja2.TemplateSyntaxError as e:
            problems.append((location, f"template syntax error: {e.message} (line {e.lineno})"))
            return _const(None)
        return Compiled(lambda roots: template.render(roots), (value,))
    if isinstance(value, Mapping):
        items = [(str(k), compile_value(v, f"{location}.{k}", problems)) for k, v in value.items()]
        if all(c.constant for _, c in items):
            return _const(value)
        return Compiled(
            lambda roots: {k: c.render(roots) for k, c in items}, tuple(s for _, c in items for s in c.sources)
        )
    if isinstance(value, list):
        parts = [compile_value(v, f"{location}[{i}]", problems) for i, v in enumerate(value)]
        if all(c.constant for c in parts):
            return _const(value)
        return Compiled(lambda roots: [c.render(roots) for c in parts], tuple(s for c in parts for s in c.sources))
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


def render(compiled: Compiled, roots: Mapping[str, Any], location: str) -> Any:
    """Render, turning every template failure into a :class:`RenderError` naming ``location``."""
    try:
        return compiled.render(roots)
    except RenderError as e:
        raise RenderError(f"{location}: {e}") from None
    except jinja2.UndefinedError as e:
        raise RenderError(f"{location}: {e.message}") from None
    except jinja2.exceptions.SecurityError as e:
        raise RenderError(f"{location}: refused by the sandbox: {e}") from None
    except (jinja2.TemplateError, TypeError, ValueError, ArithmeticError, LookupError) as e:
        raise RenderError(f"{location}: {type(e).__name__}: {e}") from None
