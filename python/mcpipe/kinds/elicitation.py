"""The ``elicitation`` step kind: ask the user (MCP ``elicitation/create``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcpipe.interaction import BadInput, elicitation_params
from mcpipe.kinds._ask import ask_step, failed
from mcpipe.kinds._base import Kind, StepFields
from mcpipe.plan import Leaf
from mcpipe.results import StepOutput
from mcpipe.tools import ToolContext

__all__ = ["KIND", "ElicitationFields", "run_elicitation"]


class ElicitationFields(StepFields, tag="elicitation"):
    """Ask the user (MCP elicitation): ``message`` and the ``requested_schema`` of the answer (templates; a
    schema that contains ``$ref`` goes inside ``$literal``). The output is ``{action, content}``."""

    message: Any
    requested_schema: Any = None
    skip_if_unsupported: bool = False


async def run_elicitation(
    step: Leaf[ElicitationFields, None], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Ask the user (``elicitation/create``); the output is ``{action, content}``, decline and cancel
    included (a later ``cel_gate`` can test ``action``)."""
    try:
        params = elicitation_params(inputs["message"], inputs["requested_schema"])
    except BadInput as e:
        raise failed(e) from None
    return await ask_step(step, "elicitation", params, ctx, step.fields.skip_if_unsupported)


KIND = Kind("elicitation", ElicitationFields, run_elicitation, templates=("message", "requested_schema"))
