"""The ``mock`` step kind: a fixed ``response`` after ``delay_ms``, or a failure."""

from __future__ import annotations

from collections.abc import Mapping
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

__all__ = ["KIND", "MockFields", "run_mock"]


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
    step: Leaf[MockFields, Template], inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext
) -> StepOutput:
    """Wait ``delay_ms``, then answer the fixed ``response`` (or fail, with ``error: true``)."""
    fields = step.fields
    if fields.progress:
        # The delay is spread over the progress notifications, as a slow backend would send them.
        pause = fields.delay_ms / 1000 / len(fields.progress)
        send = has_progress_token(ctx)
        for value in fields.progress:
            await trio.sleep(pause)
            if send:
                await ctx.report_progress(value, None, fields.message)
    elif fields.delay_ms:
        await trio.sleep(fields.delay_ms / 1000)
    else:
        await trio.lowlevel.checkpoint()
    if fields.error:
        raise StepFailure(fields.error_message or "mock error", ErrorCode.TOOL_ERROR)
    if fields.passthrough:
        return StepOutput.of(env.get("args"))
    return StepOutput.of(step.built.resolve({}))


KIND = Kind("mock", MockFields, run_mock, build=build_mock)
