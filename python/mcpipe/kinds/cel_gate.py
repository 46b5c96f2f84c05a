"""The ``cel_gate`` step kind: a CEL boolean guard; false fails the step with ``GATE_REJECTED``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated

import msgspec

from mcpipe.errors import ErrorCode
from mcpipe.kinds._base import Kind, StepFields
from mcpipe.kinds.transform import build_expression
from mcpipe.plan import Leaf, evaluate
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

if TYPE_CHECKING:
    from mcpipe.expr import CelExpr

__all__ = ["DEFAULT_GATE_MESSAGE", "KIND", "CelGateFields", "run_cel_gate"]

DEFAULT_GATE_MESSAGE = "the gate's condition is false"


class CelGateFields(StepFields, tag="cel_gate"):
    """A CEL boolean guard: false fails the step with ``error_message`` and ``GATE_REJECTED``."""

    expression: Annotated[str, msgspec.Meta(min_length=1)]
    error_message: str | None = None


async def run_cel_gate(
    step: Leaf[CelGateFields, CelExpr], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Continue when the CEL expression is true (output ``true``); fail with ``GATE_REJECTED`` when false."""
    verdict = await evaluate(step.built, env)
    if not isinstance(verdict, bool):
        raise StepFailure(
            f"the gate's expression must be a boolean, got {type(verdict).__name__}", ErrorCode.TOOL_FAILED
        )
    if not verdict:
        raise StepFailure(step.fields.error_message or DEFAULT_GATE_MESSAGE, ErrorCode.GATE_REJECTED)
    return StepOutput.of(True)


KIND = Kind("cel_gate", CelGateFields, run_cel_gate, build=build_expression)
