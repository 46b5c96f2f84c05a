"""Compiled CEL and JSONata expressions: compile once at load, evaluate per step run.

Both see the same context, the pipeline environment's roots: ``args``, ``steps``, ``vars``, ``context``
and ``last`` (a step's ``input_transform``, when it has one, replaces ``args`` for that step).

CEL values convert to JSON-ready values on the way out: timestamps become RFC 3339 strings, durations a
number of seconds, bytes base64 text; integers wider than 64 bits arrive as doubles (a CEL limit).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mcpipe._deadline import expression_timeout_ms, set_expression_timeout
from mcpipe._util import RunLimiter
from mcpipe.errors import ExpressionError
from mcpipe.expr._scan import Mention, scan_cel, scan_jsonata

__all__ = [
    "ROOTS",
    "CelExpr",
    "ExpressionError",
    "JsonataExpr",
    "expression_timeout_ms",
    "set_expression_timeout",
    "to_json_value",
]

ROOTS = frozenset({"args", "steps", "vars", "context", "last", "item", "index"})
"""The variables an expression may read; ``item`` and ``index`` only inside an ``mcp_pipe`` ``for_each``
(the plan's checker refuses them elsewhere)."""

_JSONATA_ROOTS = ROOTS - {"item", "index"}  # JSONata runs in declared steps only, never in a for_each

# CEL namespaces that look like variables to the compiled program but are not data.
_NAMESPACES = frozenset({"cel", "optional", "math", "strings", "base64", "sets", "lists", "encoders"})


_CEL_ERROR = re.compile(r"ERROR: <input>:(\d+):(\d+): (.*)")

# Functions that build or walk whole lists, or whose cost is more than linear in their input (``replace``
# multiplies a text, ``sets.*`` compare every pair), or that walk a text character by character in Python:
# an expression calling one is evaluated like a comprehension, in a worker process (see
# mcpipe.expr._celworker). The others are Rust builtins or cost one C call linear in their input.
_ITERATING = frozenset(
    {
        "lists.range",
        "sort",
        "distinct",
        "flatten",
        "split",
        "replace",
        "sets.contains",
        "sets.equivalent",
        "sets.intersects",
        "lowerAscii",
        "upperAscii",
        "strings.quote",
        "min",
        "max",
        "sum",
    }
)


def execute_cel(program: object, context: dict[str, Any], functions: Mapping[str, Any] | list[str]) -> Any:
    """Run a compiled CEL program inline; its JSON-ready value.

    Raises:
        ExpressionError: the expression failed.
    """
    from mcpipe.expr._celexec import CelError, execute_cel  # the CEL library, on first use (slow to import)

    try:
        return execute_cel(program, context, functions)
    except CelError as e:
        raise ExpressionError(str(e), missing=e.missing) from None


def to_json_value(value: object) -> Any:
    """Turn what CEL or JSONata returns into plain JSON-ready data (dict, list, str, int, float, ...).

    Raises:
        ExpressionError: the value is not JSON data.
    """
    from mcpipe.expr._celexec import CelError, to_json_value

    try:
        return to_json_value(value)
    except CelError as e:
        raise ExpressionError(str(e)) from None


class ExpressionSyntaxError(ValueError):
    """An expression that does not compile; ``reason`` says why, with line and column when known."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class CelExpr:
    """A compiled CEL expression.

    Attributes:
        source: the expression's text.
        program: the compiled program.
        mentions: the root references found in the source (``steps.fetch.output``).
        roots: the roots it reads; evaluation passes only those to CEL.
        steps: the step ids it reads, or None when it reads ``steps`` dynamically (``steps[x]``).
        projection: per root, the part of its value the expression can reach (see :func:`_projection`).
        functions: the extension functions it calls (``upperAscii``, ``math.greatest``, ``sum``, ...).
        iterates: whether it has a comprehension or calls a list-building function; such an expression
            is evaluated in a worker process under the expression deadline (:meth:`evaluate_async`).
    """

    source: str
    program: Any
    mentions: tuple[Mention, ...]
    roots: frozenset[str]
    steps: frozenset[str] | None
    projection: dict[str, Any]
    functions: dict[str, Any]
    iterates: bool = False

    @classmethod
    def compile(
        cls, source: str, names: frozenset[str] = frozenset(), *, extra_roots: frozenset[str] = frozenset()
    ) -> CelExpr:
        """Compile ``source``; ``names`` are more variables it may read (a ``for_each``'s ``as``).

        Args:
            source: the expression.
            names: variables a pipeline adds (a ``for_each``'s ``as``), scanned like the roots.
            extra_roots: variables a kind adds to the roots (``sql_await``'s ``rows``).

        Raises:
            ExpressionSyntaxError: it does not parse, or it reads a variable that is not a root.
        """
        if not isinstance(source, str) or not source.strip():
            raise ExpressionSyntaxError("a CEL expression must be a non-empty string")
        import cel  # on the first CEL expression: the library takes a command a fifth of a second to import

        try:
            program = cel.compile(source)
        except ValueError as e:
            raise ExpressionSyntaxError(_cel_syntax(str(e))) from None
        roots_here = ROOTS | names
        known = roots_here | extra_roots
        mentions, bound = scan_cel(source, roots_here)
        unknown = sorted(set(program.variables()) - known - bound - _NAMESPACES)
        if unknown:
            listed = ", ".join(f"`{n}`" for n in unknown)
            seen = "args, steps, vars, context and last" + "".join(f", {r}" for r in sorted(extra_roots))
            raise ExpressionSyntaxError(
                f"unknown variable{'s' if len(unknown) > 1 else ''} {listed} (expressions see {seen})"
            )
        roots = frozenset(set(program.variables()) & known)
        steps: set[str] | None = set()
        for m in mentions:
            if m.root == "steps":
                if not m.segments:
                    steps = None
                elif steps is not None:
                    steps.add(m.segments[0])
        frozen_steps = None if steps is None else frozenset(steps)
        functions = _extensions_used(program)
        iterates = bool(bound) or not _ITERATING.isdisjoint(functions)
        return cls(
            source,
            program,
            tuple(mentions),
            roots,
            frozen_steps,
            _projection(mentions, roots),
            functions,
            iterates=iterates,
        )

    def evaluate(self, env: Mapping[str, object]) -> Any:
        """Evaluate against the pipeline environment; the result is a JSON-ready value.

        Raises:
            ExpressionError: the expression failed (a missing key, a type mismatch, a division by zero).
        """
        return execute_cel(self.program, self.context(env), self.functions)

    async def evaluate_async(self, env: Mapping[str, object]) -> Any:
        """:meth:`evaluate` without holding the event loop: an expression that iterates runs in a worker
        process, killed past the expression deadline; the others run inline (they cost time linear in
        their input, which the request limits bound).

        Raises:
            ExpressionError: as :meth:`evaluate`, and with ``timeout`` set when the deadline passed.
        """
        if not self.iterates:
            return self.evaluate(env)
        from mcpipe.expr._celworker import WorkerDied, evaluate_in_worker

        ms = expression_timeout_ms()
        try:
            reply = await evaluate_in_worker(self.source, self.context(env), sorted(self.functions), ms / 1000)
        except TypeError as e:
            raise ExpressionError(f"the expression's input is not JSON data: {e}") from None
        except WorkerDied as e:
            raise ExpressionError(str(e)) from None
        if reply is None:
            raise ExpressionError(f"the CEL expression timed out after {ms:g} ms", timeout=True)
        if "error" in reply:
            raise ExpressionError(reply["error"], missing=bool(reply.get("missing")))
        return reply["value"]

    def context(self, env: Mapping[str, object]) -> dict[str, Any]:
        """What the expression reads of ``env``: its roots, each narrowed to the parts it can reach."""
        context: dict[str, Any] = {}
        projection = self.projection
        for root in self.roots:
            value = env.get(root)
            shape = projection.get(root)
            if shape is not None and isinstance(value, Mapping):
                value = _project(value, shape)
            context[root] = value
        return context


def compile_cel(source: str) -> Any:
    """The CEL library's compiled program (what a worker process compiles)."""
    import cel

    return cel.compile(source)


def _extensions_used(program: Any) -> dict[str, Any]:
    from mcpipe.expr._celexec import _EXTENSIONS

    names = set(program.functions())
    namespaces = set(program.variables()) & _NAMESPACES
    used = {n: _EXTENSIONS[n] for n in names if n in _EXTENSIONS}
    for ns in namespaces:
        for n in names:
            dotted = f"{ns}.{n}"
            if dotted in _EXTENSIONS:
                used[dotted] = _EXTENSIONS[dotted]
    return used


def _projection(mentions: list[Mention], roots: frozenset[str]) -> dict[str, Any]:
    """What part of each root an expression can reach, from the references found in its source.

    Converting a Python value to CEL costs a few microseconds per node, and a step result has a dozen
    fields; passing every earlier step whole would make each evaluation cost grow with the pipeline. So
    for ``steps.a.output.x`` only ``steps.a.output`` is passed, for ``args.n`` only ``args.n``. A root
    that is read whole or dynamically anywhere (``steps[k]``, ``args.size()``) is passed whole.

    Returns:
        root -> None (pass whole) or {key: None (whole) | frozenset of the step-result fields read}.
    """
    shapes: dict[str, Any] = {}
    whole: set[str] = set()
    for m in mentions:
        if m.root in whole:
            continue
        if not m.segments:
            whole.add(m.root)
            shapes.pop(m.root, None)
            continue
        shape = shapes.setdefault(m.root, {})
        key = m.segments[0]
        if m.root == "steps" and len(m.segments) > 1:
            fields = shape.get(key, set())
            if fields is not None:
                shape[key] = fields | {m.segments[1]}
        else:
            shape[key] = None
    # A root the program reads but the scan did not see is passed whole (never narrow on a guess).
    return {
        root: {k: (None if v is None else frozenset(v)) for k, v in shapes[root].items()}
        for root in roots
        if root in shapes and root not in whole
    }


def _project(value: Mapping[str, object], shape: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, fields in shape.items():
        if key in value:
            item = value[key]
            if fields is not None and isinstance(item, Mapping):
                item = {f: item[f] for f in fields if f in item}
            out[key] = item
    return out


def _cel_syntax(message: str) -> str:
    """Shorten the CEL library's parse error to ``syntax error at line 1, column 4: ...``."""
    found = _CEL_ERROR.search(message)
    if found is None:
        return message.split("\n", 1)[0]
    line, col, what = found.groups()
    what = what.removeprefix("Syntax error: ")
    return f"syntax error at line {line}, column {col}: {what}"


@dataclass(frozen=True, slots=True)
class JsonataExpr:
    """A compiled JSONata expression (the ``dev.mcpipe.transform.jsonata`` plugin).

    Evaluation is bounded: ``max_ms`` of run time and ``max_depth`` of recursion, so a runaway expression
    fails the step instead of holding the server.
    """

    source: str
    expression: Any
    mentions: tuple[Mention, ...]
    max_ms: int = 1000
    max_depth: int = 500

    @classmethod
    def compile(cls, source: str, *, max_ms: int = 1000, max_depth: int = 500) -> JsonataExpr:
        """Compile ``source``.

        Raises:
            ExpressionSyntaxError: it does not parse.
        """
        if not isinstance(source, str) or not source.strip():
            raise ExpressionSyntaxError("a JSONata expression must be a non-empty string")
        import jsonata  # on the first JSONata expression

        try:
            expression = jsonata.Jsonata(source)
        except jsonata.JException as e:
            raise ExpressionSyntaxError(_jsonata_message(e, source)) from None
        mentions = scan_jsonata(source, _JSONATA_ROOTS)
        return cls(source, expression, tuple(mentions), max_ms, max_depth)

    def evaluate(self, env: Mapping[str, object]) -> Any:
        """Evaluate with the pipeline environment as the input document (``steps.x.output``, ``args.y``).

        Raises:
            ExpressionError: the expression failed or ran past its bounds.
        """
        import jsonata

        data = {root: env.get(root) for root in _JSONATA_ROOTS}
        frame = self.expression.create_frame(self.expression.environment)
        max_ms = min(self.max_ms, int(expression_timeout_ms()))
        frame.set_runtime_bounds(max_ms, self.max_depth)
        try:
            result = self.expression.evaluate(data, frame)
        except jsonata.JException as e:
            if getattr(e, "error", None) == _JSONATA_TIMEOUT:  # past the deadline: TIMEOUT, as for CEL
                raise ExpressionError(f"the JSONata expression timed out after {max_ms:g} ms", timeout=True) from None
            raise ExpressionError(_jsonata_message(e, self.source)) from None
        except Exception as e:  # the library lets Python errors through (ZeroDivisionError, ...)
            raise ExpressionError(f"{type(e).__name__}: {e}") from None
        if callable(result):
            raise ExpressionError("the result is a function, not JSON data")
        return to_json_value(result)

    async def evaluate_async(self, env: Mapping[str, object]) -> Any:
        """:meth:`evaluate` off the event loop: in a thread (the library is Python, so the loop keeps its turns
        of the interpreter while it runs), which the library's own deadline ends; a cancelled caller does
        not wait for it.

        Raises:
            ExpressionError: as :meth:`evaluate`.
        """
        import trio

        return await trio.to_thread.run_sync(self.evaluate, env, abandon_on_cancel=True, limiter=_threads())


_threads = RunLimiter("mcpipe_expression_threads", 4)
"""At most 4 JSONata evaluations at once in threads (each ends by its deadline)."""


_JSONATA_TIMEOUT = "D1012"
"""The library's code for an evaluation past its time bound."""


def _jsonata_message(e: object, source: str) -> str:
    code = getattr(e, "error", None)
    pos = getattr(e, "location", None)
    text = str(e)
    where = ""
    if isinstance(pos, int) and pos >= 0 and code and str(code).startswith("S"):
        where = f" at character {pos}"
    return f"{text}{where} ({code})" if code else text
