"""The executors of the in-process kinds: mock, value, transform, cel_gate, plugin_transform, log, progress.

Each is ``async def run(step, inputs, env, ctx) -> StepOutput``; ``inputs`` holds the step's resolved
template fields, ``env`` the environment after ``input_transform``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import trio

from mcpipe.declared._expr import evaluate
from mcpipe.declared._model import MockFields
from mcpipe.declared._step import DeclaredStep, StepFailure, StepOutput
from mcpipe.tools._base import ToolContext

__all__ = [
    "run_cel_gate",
    "run_log",
    "run_mock",
    "run_plugin_transform",
    "run_progress",
    "run_transform",
    "run_value",
]

DEFAULT_GATE_MESSAGE = "the gate's condition is false"


async def run_mock(step: DeclaredStep, inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext) -> StepOutput:
    """Wait ``delay_ms``, then answer the fixed ``response`` (or fail, with ``error: true``)."""
    spec: MockFields = step.spec  # type: ignore[assignment]
    if spec.progress:
        # The delay is spread over the progress notifications, as a slow backend would send them.
        pause = spec.delay_ms / 1000 / len(spec.progress)
        send = has_progress_token(ctx)
        for value in spec.progress:
            await trio.sleep(pause)
            if send:
                await ctx.report_progress(value, None, spec.message)
    elif spec.delay_ms:
        await trio.sleep(spec.delay_ms / 1000)
    else:
        await trio.lowlevel.checkpoint()
    if spec.error:
        raise StepFailure(spec.error_message or "mock error", "TOOL_ERROR")
    if spec.passthrough:
        return StepOutput.of(env.get("args"))
    return StepOutput.of(step.plan.resolve({}))


async def run_value(step: DeclaredStep, inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext) -> StepOutput:
    """The resolved ``value`` template is the output."""
    return StepOutput.of(inputs["value"])


async def run_transform(
    step: DeclaredStep, inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext
) -> StepOutput:
    """The CEL expression's value is the output."""
    return StepOutput.of(await evaluate(step.plan, env))


async def run_cel_gate(
    step: DeclaredStep, inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext
) -> StepOutput:
    """Continue when the CEL expression is true (output ``true``); fail with ``GATE_REJECTED`` when false."""
    verdict = await evaluate(step.plan, env)
    if not isinstance(verdict, bool):
        raise StepFailure(f"the gate's expression must be a boolean, got {type(verdict).__name__}", "TOOL_FAILED")
    if not verdict:
        raise StepFailure(step.spec.error_message or DEFAULT_GATE_MESSAGE, "GATE_REJECTED")  # type: ignore[attr-defined]
    return StepOutput.of(True)


async def run_plugin_transform(
    step: DeclaredStep, inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext
) -> StepOutput:
    """The plugin's value over the context is the output (JSONata: the expression's value)."""
    return StepOutput.of(await evaluate(step.plan, env))


async def run_log(step: DeclaredStep, inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext) -> StepOutput:
    """Send ``data`` to the caller (``notifications/message``); the output is the data sent."""
    spec = step.spec
    data = inputs["data"]
    payload = data
    if spec.logger is not None:  # type: ignore[attr-defined]
        # ToolContext.send_log takes (level, data); a named logger travels inside the data.
        payload = {"logger": spec.logger, "data": data}  # type: ignore[attr-defined]
    await ctx.send_log(spec.level, payload)  # type: ignore[attr-defined]
    return StepOutput.of(data)


def has_progress_token(ctx: ToolContext) -> bool:
    """Did the call carry a progress token?

    Read from ``ctx.progress_token``, else the server's ``ctx.extras["progress"]`` flag (it also knows an
    in-memory caller's progress callback), else ``ctx.extras["progress_token"]``, else the MCP SDK's request
    context in ``ctx.extras["mcp_context"]`` (its ``meta``).
    """
    token = getattr(ctx, "progress_token", None)
    if token is None and ctx.extras.get("progress") is True:
        return True  # the server's own finding: a token on the wire, or an in-memory progress callback
    if token is None:
        token = ctx.extras.get("progress_token")
    if token is None:
        meta = getattr(ctx.extras.get("mcp_context"), "meta", None)
        if isinstance(meta, Mapping):
            token = meta.get("progressToken", meta.get("progress_token"))
    return token is not None


async def run_progress(
    step: DeclaredStep, inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext
) -> StepOutput:
    """Send a ``notifications/progress``; skipped when the call carried no progress token."""
    progress = _number(inputs["progress"], "progress")
    total = None if inputs.get("total") is None else _number(inputs["total"], "total")
    message = inputs.get("message")
    if message is not None and not isinstance(message, str):
        raise StepFailure(f"`message` must be a string, got {type(message).__name__}", "TOOL_FAILED")
    if not has_progress_token(ctx):
        await trio.lowlevel.checkpoint()
        return StepOutput.skip()
    await ctx.report_progress(progress, total, message)
    sent: dict[str, Any] = {"progress": progress}
    if total is not None:
        sent["total"] = total
    if message is not None:
        sent["message"] = message
    return StepOutput.of(sent)


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise StepFailure(f"`{name}` must be a number, got {value!r}", "TOOL_FAILED")
    return value
