"""The ``value`` step kind: the resolved ``value`` template is the output."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcpipe.kinds._base import Kind, StepFields
from mcpipe.plan import Leaf
from mcpipe.results import StepOutput
from mcpipe.tools import ToolContext

__all__ = ["KIND", "ValueFields", "run_value"]


class ValueFields(StepFields, tag="value"):
    """The ``value`` template, resolved, is the output."""

    value: Any


async def run_value(
    step: Leaf[ValueFields, None], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """The resolved ``value`` template is the output."""
    return StepOutput.of(inputs["value"])


KIND = Kind("value", ValueFields, run_value, templates=("value",))
