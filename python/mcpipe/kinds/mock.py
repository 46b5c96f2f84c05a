"""The ``mock`` step kind: a fixed ``response`` after ``delay_ms``, or a failure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import msgspec
import trio

from mcpipe._template import Template
from mcpipe.errors import ErrorCode
from mcpipe.kinds._base import Build, Kind, StepFields
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools._base import ToolContext

__all__ = ["KIND", "MockFields", "run_mock"]


class MockFields(StepFields, tag="mock"):
    """A fixed ``response`` (not a template), after ``delay_ms``; or a failure with ``error: true``."""

    response: Any = None
    delay_ms: Annotated[float, msgspec.Meta(ge=0)] = 0
    error: bool = False
    error_message: str | None = None


def build_mock(b: Build[MockFields]) -> Template:
    """The response, as a literal (it is not a template): copied on every run."""
    return Template({"$literal": b.raw.get("response")})


async def run_mock(
    step: Leaf[MockFields, Template], inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext
) -> StepOutput:
    """Wait ``delay_ms``, then answer the fixed ``response`` (or fail, with ``error: true``)."""
    fields = step.fields
    if fields.delay_ms:
        await trio.sleep(fields.delay_ms / 1000)
    else:
        await trio.lowlevel.checkpoint()
    if fields.error:
        raise StepFailure(fields.error_message or "mock error", ErrorCode.TOOL_ERROR)
    return StepOutput.of(step.built.resolve({}))


KIND = Kind("mock", MockFields, run_mock, build=build_mock)
