"""The ``mock`` step kind: a fixed ``response`` after ``delay_ms``, or a failure.

:func:`simulate` is the kind's wait (the delay, spread over its progress notifications), public for a
format whose mock bindings answer in their own shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import msgspec
import trio

from mcpipe._template import Template
from mcpipe.errors import ErrorCode
from mcpipe.kinds._base import Build, Kind, StepFields
from mcpipe.kinds.progress import has_progress_token
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = ["KIND", "MockFields", "run_mock", "simulate"]


class MockFields(StepFields, tag="mock"):
    """A fixed ``response`` (not a template), after ``delay_ms``; or a failure with ``error: true``.
    ``passthrough: true`` answers the step's input (``args``, after ``input_transform``) instead; ``progress``
    (numbers) are sent as progress notifications on the way, with ``message`` (mcpg's mock fields)."""

    response: Any = None
    delay_ms: Annotated[float, msgspec.Meta(ge=0)] = 0
    error: bool = False
    error_message: str | None = None
    passthrough: bool = False
    progress: list[float] | None = None
    message: str | None = None


def build_mock(b: Build[MockFields]) -> Template:
    """The response, as a literal (it is not a template): copied on every run."""
    return Template({"$literal": b.raw.get("response")})


async def run_mock(
    step: Leaf[MockFields, Template], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Wait ``delay_ms``, then answer the fixed ``response`` (or fail, with ``error: true``)."""
    fields = step.fields
    await simulate(ctx, fields.delay_ms, fields.progress, fields.message)
    if fields.error:
        raise StepFailure(fields.error_message or "mock error", ErrorCode.TOOL_ERROR)
    if fields.passthrough:
        return StepOutput.of(env.get("args"))
    return StepOutput.of(step.built.resolve({}))


async def simulate(
    ctx: ToolContext, delay_ms: float, progress: Sequence[float] | None = None, message: str | None = None
) -> None:
    """Wait as a slow backend would: ``delay_ms``, spread over ``progress`` (each value sent, with ``message``,
    as a progress notification when the caller asked for them), or at least one checkpoint."""
    if progress:
        pause = delay_ms / 1000 / len(progress)
        send = has_progress_token(ctx)
        for value in progress:
            await trio.sleep(pause)
            if send:
                await ctx.report_progress(value, None, message)
    elif delay_ms:
        await trio.sleep(delay_ms / 1000)
    else:
        await trio.lowlevel.checkpoint()


KIND = Kind("mock", MockFields, run_mock, build=build_mock)
