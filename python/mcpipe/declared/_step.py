"""Compiled declared steps and how one runs: ``when``, ``input_transform``, templates, timeout, the kind.

:class:`DeclaredStep` is a leaf (every kind but ``parallel`` and ``pipe``); ``await step.execute(env,
ctx)`` runs it start to finish and answers a :class:`StepOutput`, never raising for a step failure (only
``trio.Cancelled`` goes through). :class:`DeclaredParallel` and :class:`DeclaredPipe` are containers for the
scheduler, with the same fields as :class:`mcpipe.compile.ParallelStep` / :class:`~mcpipe.compile.PipeStep`
plus ``when`` and ``input_transform``, which :func:`prelude` applies.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import orjson
import trio

from mcpipe._describe import json_type
from mcpipe._template import Template
from mcpipe.compile import PipelinePlan
from mcpipe.declared._expr import CelExpr, ExpressionError, evaluate
from mcpipe.declared._model import StepFields
from mcpipe.declared._policy import ForbiddenError
from mcpipe.errors import InterpolationError, OutputTooLargeError, UnknownToolError
from mcpipe.tools._base import ToolContext, ToolResult

__all__ = [
    "SKIP",
    "DeclaredParallel",
    "DeclaredPipe",
    "DeclaredStep",
    "RunFn",
    "StepFailure",
    "StepOutput",
    "prelude",
]

_log = logging.getLogger("mcpipe.declared")


class StepFailure(Exception):
    """Raised by a kind's runner to fail its step with a message, a code and (optionally) an output.

    Attributes:
        code: the error code (``TOOL_ERROR``, ``TOOL_FAILED``, ``FORBIDDEN``, ``GATE_REJECTED``, ...).
        output: what the step produced before failing (the HTTP status and body, the command's stderr),
            kept in the step result for debugging; None when there is nothing.
    """

    def __init__(self, message: str, code: str = "TOOL_FAILED", output: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.output = output


@dataclass(slots=True)
class StepOutput:
    """What a declared step produced, in the contract's step-result terms (section 3).

    Attributes:
        output: the step's ``output`` (``structured`` if not None, else ``text``).
        structured: the structured value (None when the output is text).
        text: the text (``""`` when the output is structured and the kind produced no text).
        content: MCP content blocks (only the ``tool`` kind has them; else ``[]``).
        ok: False when the step failed.
        error: why it failed (``""`` on success).
        error_code: a stable code (contract section 6) or None.
        skipped: True when ``when`` was false (or a ``progress`` step had no progress token).
    """

    output: Any = None
    structured: Any = None
    text: str = ""
    content: list[dict[str, Any]] = field(default_factory=list)
    ok: bool = True
    error: str = ""
    error_code: str | None = None
    skipped: bool = False

    @classmethod
    def of(cls, value: Any) -> StepOutput:
        """A successful output: a string is text, anything else structured."""
        if isinstance(value, str):
            return cls(value, None, value)
        return cls(value, value)

    @classmethod
    def failure(cls, message: str, code: str, output: Any = None) -> StepOutput:
        """A failed step; ``output`` (if any) is kept as the structured value for debugging."""
        out = cls.of(output) if output is not None else cls()
        out.ok, out.error, out.error_code = False, message, code
        return out

    @classmethod
    def skip(cls) -> StepOutput:
        """A skipped step: ok, with a null output."""
        return cls(skipped=True)

    @classmethod
    def from_tool(cls, res: ToolResult) -> StepOutput:
        """A ``tool`` step's output from what the tool answered (the same rules as ``mcp_pipe``)."""
        text = res.joined_text()
        structured = res.structured
        if structured is None and len(res.content) == 1 and text.lstrip()[:1] in ("{", "["):
            try:
                structured = orjson.loads(text)
            except orjson.JSONDecodeError:
                pass
        out = cls(structured if structured is not None else text, structured, text, res.content)
        if res.is_error:
            out.ok, out.error, out.error_code = False, text or "the tool reported an error", "TOOL_ERROR"
        return out

    def result(self, step_id: str, kind: str, duration_ms: float) -> dict[str, Any]:
        """The step result object of contract section 3, plus ``skipped``."""
        return {
            "id": step_id,
            "kind": kind,
            "ok": self.ok,
            "error": self.error,
            "error_code": self.error_code,
            "structured": self.structured,
            "text": self.text,
            "content": self.content,
            "output": self.output,
            "skipped": self.skipped,
            "duration_ms": duration_ms,
        }


RunFn = Callable[["DeclaredStep", dict[str, Any], Mapping[str, Any], ToolContext], Awaitable[StepOutput]]
"""A kind's executor: ``run(step, inputs, env, ctx)``; ``inputs`` are the step's resolved templates."""

SKIP: Any = object()
"""What :func:`prelude` answers when the step's ``when`` is false."""


@dataclass(frozen=True, slots=True, eq=False)
class DeclaredStep:
    """A compiled leaf step.

    Attributes:
        id: the step id.
        kind: the kind's name (``http``, ``transform``, ...).
        location: where it was declared (``pipelines.charge.steps[2]``).
        spec: the decoded fields (the kind's Struct).
        templates: the template fields by name; resolved, they are the runner's ``inputs``.
        when: the compiled ``when`` condition, or None.
        input_transform: the compiled ``input_transform``, or None.
        timeout_ms: the step's deadline, or None.
        plan: what the kind compiled (a CEL program, an argv, the policy it runs under).
        references: ``(location, reference)`` of every reference it makes, for the static checks.
        runner: the kind's executor.
    """

    id: str
    kind: str
    location: str
    spec: StepFields
    templates: tuple[tuple[str, Template], ...]
    when: CelExpr | None
    input_transform: CelExpr | None
    timeout_ms: float | None
    plan: Any
    references: tuple[tuple[str, str], ...]
    runner: RunFn

    async def execute(self, env: Mapping[str, Any], ctx: ToolContext, *, tools: Any = None) -> StepOutput:
        """Run the step: ``when``, then ``input_transform``, then its templates, then the kind, under
        ``timeout_ms``.

        Args:
            env: the pipeline environment (roots ``vars``, ``steps``, ``last``, ``args``, ``context``).
            ctx: the request's context (``log`` and ``progress`` steps send through it).
            tools: for ``tool`` steps, an object with ``await tools.call(name, args, ctx)`` (the registry or
                gateway); None uses the one the step was compiled with.

        Returns:
            The output; failures are outputs with ``ok`` false and an ``error_code``, never exceptions.

        Raises:
            trio.Cancelled: when the caller is cancelled (the step's work is cancelled first).
        """
        try:
            env2 = await prelude(self, env)
            if env2 is SKIP:
                return StepOutput.skip()
            inputs = {name: t.resolve(env2) for name, t in self.templates}
            if tools is not None and self.kind == "tool":
                return await _with_timeout(self.timeout_ms, call_tool(self, inputs, ctx, tools))
            return await _with_timeout(self.timeout_ms, self.runner(self, inputs, env2, ctx))
        except InterpolationError as e:
            e.with_step(self.id)
            return StepOutput.failure(str(e), "INTERPOLATION_FAILED")
        except OutputTooLargeError as e:
            return StepOutput.failure(str(e), e.code)
        except ExpressionError as e:
            return StepOutput.failure(f"{self.location}: {e}" if e.timeout else str(e), e.code)
        except StepFailure as e:
            return StepOutput.failure(str(e), e.code, e.output)
        except ForbiddenError as e:
            return StepOutput.failure(str(e), "FORBIDDEN")
        except Exception as e:
            _log.exception("step %s (%s, %s) failed", self.id, self.kind, self.location)
            return StepOutput.failure(f"{type(e).__name__}: {e}", "TOOL_FAILED")

    async def run_result(self, env: Mapping[str, Any], ctx: ToolContext, *, tools: Any = None) -> dict[str, Any]:
        """:meth:`execute`, timed, as a step result object (contract section 3, plus ``skipped``)."""
        t0 = perf_counter()
        out = await self.execute(env, ctx, tools=tools)
        return out.result(self.id, self.kind, round((perf_counter() - t0) * 1000, 3))


async def _with_timeout(timeout_ms: float | None, work: Awaitable[StepOutput]) -> StepOutput:
    if timeout_ms is None:
        return await work
    with trio.move_on_after(timeout_ms / 1000):
        return await work
    return StepOutput.failure(f"timed out after {timeout_ms:g} ms", "TIMEOUT")


async def run_tool(step: DeclaredStep, inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext) -> StepOutput:
    """The ``tool`` kind's executor: call through the registry the step was compiled with."""
    return await call_tool(step, inputs, ctx, step.plan)


async def call_tool(step: DeclaredStep, inputs: dict[str, Any], ctx: ToolContext, registry: Any) -> StepOutput:
    """Call the step's tool through ``registry`` (anything with ``await registry.call(name, args, ctx)``)."""
    if registry is None or not hasattr(registry, "call"):
        raise StepFailure("no tool registry to call tools through", "TOOL_FAILED")
    name = step.spec.tool  # type: ignore[attr-defined]
    try:
        res = await registry.call(name, inputs["args"], ctx)
    except UnknownToolError as e:
        raise StepFailure(str(e), "UNKNOWN_TOOL") from None
    return StepOutput.from_tool(res)


@dataclass(frozen=True, slots=True, eq=False)
class DeclaredParallel:
    """Run ``children`` concurrently (same fields as :class:`mcpipe.compile.ParallelStep`, plus the
    common ``when``/``input_transform`` that :func:`prelude` applies before the children start)."""

    id: str
    location: str
    children: tuple[DeclaredStep | DeclaredParallel | DeclaredPipe, ...]
    timeout_ms: float | None
    when: CelExpr | None = None
    input_transform: CelExpr | None = None
    references: tuple[tuple[str, str], ...] = ()
    kind: str = "parallel"


@dataclass(frozen=True, slots=True, eq=False)
class DeclaredPipe:
    """Run the nested ``pipe`` (same fields as :class:`mcpipe.compile.PipeStep`; its plan's ``steps``
    hold declared steps), after :func:`prelude`."""

    id: str
    location: str
    pipe: PipelinePlan
    timeout_ms: float | None
    when: CelExpr | None = None
    input_transform: CelExpr | None = None
    references: tuple[tuple[str, str], ...] = ()
    kind: str = "pipe"


async def prelude(step: DeclaredStep | DeclaredParallel | DeclaredPipe, env: Mapping[str, Any]) -> Any:
    """Apply a step's ``when`` and ``input_transform``.

    Returns:
        :data:`SKIP` when ``when`` is false; else the environment the step runs in: ``env`` itself, or a
        copy whose ``args`` is the ``input_transform``'s value.

    Raises:
        ExpressionError: ``when`` failed or is not a boolean, or ``input_transform`` failed.
    """
    if step.when is not None:
        verdict = await evaluate(step.when, env)
        if not isinstance(verdict, bool):
            raise ExpressionError(f"`when` must be a boolean, got {json_type(verdict)}")
        if not verdict:
            return SKIP
    if step.input_transform is not None:
        transformed = await evaluate(step.input_transform, env)
        new = dict(env)
        new["args"] = transformed
        return new
    return env
