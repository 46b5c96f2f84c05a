"""mcpg's ``${…}`` strings: literal text and expressions, compiled once, resolved per call.

One delimiter covers three things (mcpg's ``docs/string-interpolation.md``, its ``mcpg-expr`` crate):
``${env.NAME}`` is read from the environment when the config loads (:func:`expand_env`, in the front-end);
``${cred://<plugin>/<target>}`` is a credential, resolved per call; anything else is a CEL expression over
the request (``arguments``, ``context``, ``steps``, ``tool_name``, and the bare ``principal_id``,
``trust_level``, ``auth_provider``, ``identity_kind``; in a pipeline also the names of mcpg's pipelines doc,
``original_args``, ``completed_steps`` and ``request_context``). A string that is one expression answers that
expression's value made text (a float with two decimals, null as ``""``); literal text and expressions
together are concatenated, each expression through CEL's ``string()``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mcpipe.expr import CelExpr, ExpressionError, ExpressionSyntaxError, compile_cel
from mcpipe.formats.mcpg._names import CONTEXT, REQUEST_CONTEXT, ROOT_ALIASES

__all__ = [
    "MCPG_ROOTS",
    "McpgTemplate",
    "caller_context",
    "cel_env",
    "compile_mcpg_cel",
    "expand_env",
    "expand_env_in",
    "mcpg_steps",
    "request_context",
    "split_template",
]

MCPG_ROOTS = frozenset({*ROOT_ALIASES, "tool_name", "identity_kind", "env"})
"""The variables mcpg binds for an expression (``ExprContext::to_cel_context``), and those its pipelines doc
gives a pipeline's steps (``original_args``, ``completed_steps``, ``request_context``)."""

_ENV = re.compile(r"\$\{\s*\$?env\.([A-Za-z_][A-Za-z0-9_]*)\s*\}")


def expand_env(value: str, environ: Mapping[str, str], pattern: re.Pattern[str] = _ENV) -> tuple[str, list[str]]:
    """``${env.NAME}`` replaced by the variable's value; answers the text and the names that are unset
    (mcpg refuses to load then)."""
    missing: list[str] = []

    def repl(m: re.Match[str]) -> str:
        got = environ.get(m.group(1))
        if got is None:
            missing.append(m.group(1))
            return ""
        return got

    return pattern.sub(repl, value), missing


def expand_env_in(
    value: object,
    where: str,
    environ: Mapping[str, str],
    unset: Callable[[str, str], None],
    pattern: re.Pattern[str] = _ENV,
) -> Any:
    """:func:`expand_env` in every string of ``value`` (``where`` locates it); ``unset(where, name)`` for each
    variable that is not set."""
    if isinstance(value, str):
        text, missing = expand_env(value, environ, pattern)
        for name in missing:
            unset(where, name)
        return text
    if isinstance(value, Mapping):
        return {k: expand_env_in(v, f"{where}.{k}", environ, unset, pattern) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env_in(v, f"{where}[{i}]", environ, unset, pattern) for i, v in enumerate(value)]
    return value


def split_template(text: str) -> list[tuple[str, str]]:
    """``[(kind, text)]``: ``("lit", text)``, ``("cel", source)`` or ``("cred", uri)`` parts of ``text``.

    Raises:
        ValueError: an unclosed or empty ``${}``.
    """
    parts: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        start = text.find("${", i)
        if start < 0:
            parts.append(("lit", text[i:]))
            break
        if start > i:
            parts.append(("lit", text[i:start]))
        end = _matching_brace(text, start + 2)
        if end < 0:
            raise ValueError(f"unclosed ${{}} expression at position {start}")
        inner = text[start + 2 : end].strip()
        if not inner:
            raise ValueError(f"empty expression at position {start}")
        if inner.startswith("cred://"):
            parts.append(("cred", inner))
        else:
            parts.append(("cel", inner[1:] if inner.startswith("$") else inner))
        i = end + 1
    return parts


def _matching_brace(text: str, start: int) -> int:
    depth = 1
    quote = ""
    i = start
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


@dataclass(frozen=True, slots=True)
class McpgTemplate:
    """A compiled ``${…}`` string."""

    source: str
    parts: tuple[tuple[str, Any], ...]

    @classmethod
    def compile(cls, text: str, credential: Any = None) -> McpgTemplate:
        """Compile ``text``; ``credential(uri)`` names the credential a ``${cred://…}`` stands for.

        Raises:
            ValueError: the text is malformed, or an expression does not compile.
        """
        parts: list[tuple[str, Any]] = []
        for kind, value in split_template(text):
            if kind == "cel":
                try:
                    parts.append(("cel", compile_mcpg_cel(value)))
                except ExpressionSyntaxError as e:
                    raise ValueError(f"expression `{value}`: {e}") from None
            elif kind == "cred":
                parts.append(("cred", credential(value) if credential is not None else value))
            else:
                parts.append(("lit", value))
        return cls(text, tuple(parts))

    @property
    def is_literal(self) -> bool:
        return all(kind == "lit" for kind, _ in self.parts)

    @property
    def credentials(self) -> tuple[str, ...]:
        return tuple(v for kind, v in self.parts if kind == "cred")

    async def resolve_async(self, env: Mapping[str, object], credentials: Mapping[str, str] | None = None) -> str:
        """The text for one call, each expression under the expression deadline (one that iterates runs in a CEL
        worker, off the event loop: issue 20).

        Raises:
            ExpressionError: an expression failed, timed out, or does not make text.
        """
        if len(self.parts) == 1 and self.parts[0][0] == "cel":
            return _to_string(await self.parts[0][1].evaluate_async(env))
        out: list[str] = []
        for kind, value in self.parts:
            if kind == "lit":
                out.append(value)
            elif kind == "cred":
                got = (credentials or {}).get(value)
                if got is None:
                    raise ExpressionError(f"credential {value!r} is not available")
                out.append(got)
            else:
                out.append(_cel_string(await value.evaluate_async(env)))
        return "".join(out)


def compile_mcpg_cel(source: str) -> CelExpr:
    """A CEL expression as mcpg compiles it: a variable it does not bind is no error until the expression is
    evaluated (cel's ``Program::compile`` checks the syntax only).

    Raises:
        ExpressionSyntaxError: the expression does not parse.
    """
    try:
        names = frozenset(compile_cel(source).variables())
    except ValueError:
        names = frozenset()
    return CelExpr.compile(source, extra_roots=MCPG_ROOTS | names)


def _to_string(value: object) -> str:
    """mcpg-expr's ``cel_value_to_string``: CEL's ``string()`` but a float with two decimals and null as ``""``."""
    if isinstance(value, float):
        return f"{value:.2f}"
    if value is None:
        return ""
    if isinstance(value, (str, int)):
        return _cel_string(value)
    raise ExpressionError(f"expression must evaluate to a string, number, or boolean, got {type(value).__name__}")


def _cel_string(value: object) -> str:
    """CEL's ``string()`` of a value."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value != int(value) or abs(value) >= 1e16 else f"{value:g}"
    raise ExpressionError(f"found no matching overload for 'string' applied to '({type(value).__name__})'")


_CONTEXT = CelExpr.compile(CONTEXT)
_REQUEST_CONTEXT = CelExpr.compile(REQUEST_CONTEXT)


def caller_context(facts: Mapping[str, object]) -> dict[str, Any]:
    """mcpg's ``context`` of a call, from mcpipe's request facts (``ToolContext.facts()``): the same expression
    a pipeline's CEL reads (:data:`._names.CONTEXT`)."""
    value: dict[str, Any] = _CONTEXT.evaluate({"context": facts})
    return value


def request_context(facts: Mapping[str, object]) -> dict[str, Any]:
    """mcpg's ``request_context`` of a call (:data:`._names.REQUEST_CONTEXT`)."""
    value: dict[str, Any] = _REQUEST_CONTEXT.evaluate({"context": facts})
    return value


def cel_env(
    args: object,
    tool_name: str,
    facts: Mapping[str, object],
    steps: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    """The variables of an mcpg expression for one call (``ExprContext::to_cel_context``); ``facts`` are the
    request's (``ToolContext.facts()``: its id, session, transport and caller). A pipeline's step (``steps``
    given) also reads ``original_args``, ``completed_steps`` and ``request_context``, as mcpg's pipelines doc
    names them."""
    context = caller_context(facts)
    env: dict[str, Any] = {
        "arguments": args,
        "args": args,
        "tool_name": tool_name,
        "context": context,
        "trust_level": context["trust_level"],
        "principal_id": context["principal_id"],
        "auth_provider": context["auth_provider"],
        "identity_kind": context["transport"],
        # `${env.NAME}` is read when the config loads; one left here reads the server's environment.
        "env": os.environ,
    }
    if steps is not None:
        env["steps"] = steps
        env["completed_steps"] = steps
        env["original_args"] = args
        env["request_context"] = request_context(facts)
    return env


def mcpg_steps(results: Mapping[str, object]) -> dict[str, Any]:
    """mcpipe's step results (``steps`` root) as mcpg's ``completed_steps``: ``{output, is_error,
    duration_ms}`` per step id."""
    out: dict[str, Any] = {}
    for sid, r in results.items():
        if isinstance(r, Mapping):
            out[sid] = {
                "output": r.get("output"),
                "is_error": not r.get("ok", True),
                "duration_ms": int(r.get("duration_ms") or 0),
            }
    return out
