"""The ``transform`` step kind: the value of a CEL ``expression`` is the output."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from mcpipe.kinds._base import Build, Kind, StepFields
from mcpipe.plan import Leaf, evaluate
from mcpipe.results import StepOutput
from mcpipe.tools import ToolContext

if TYPE_CHECKING:
    from mcpipe.expr import CelExpr

__all__ = ["KIND", "TransformFields", "build_expression", "run_transform"]


class TransformFields(StepFields, tag="transform"):
    """The value of a CEL ``expression`` is the output."""

    expression: Annotated[str, msgspec.Meta(min_length=1)]


def build_expression(b: Build[Any]) -> CelExpr:
    """The step's ``expression``, compiled (CEL) and its references checked."""
    return b.cel(b.raw.get("expression"), f"{b.location}.expression")


async def run_transform(
    step: Leaf[TransformFields, CelExpr], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """The CEL expression's value is the output."""
    return StepOutput.of(await evaluate(step.built, env))


KIND = Kind("transform", TransformFields, run_transform, build=build_expression)
