"""The ``sampling`` step kind: ask the client's model (MCP ``sampling/createMessage``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcpipe.interaction import BadInput, question
from mcpipe.kinds._ask import ask_step, failed
from mcpipe.kinds._base import Kind, StepFields
from mcpipe.plan import Leaf
from mcpipe.results import StepOutput
from mcpipe.tools import ToolContext

__all__ = ["KIND", "SamplingFields", "run_sampling"]


class SamplingFields(StepFields, tag="sampling"):
    """Ask the client's model (MCP sampling). ``messages`` (``[{role, content}]``, a string content being
    a text block), ``system_prompt``, ``max_tokens``, ``model_preferences`` and ``temperature`` are
    templates. The output is the model's reply plus its ``text``."""

    messages: Any
    system_prompt: Any = None
    max_tokens: Any = 1024
    model_preferences: Any = None
    temperature: Any = None
    skip_if_unsupported: bool = False
    with_text: bool = True
    """The output holds ``text``, the text of the reply's content (false: the client's result as it is)."""


async def run_sampling(
    step: Leaf[SamplingFields, None], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Ask the client's model (``sampling/createMessage``); the output is its reply, plus ``text``."""
    try:
        params = question("sampling", inputs)
    except BadInput as e:
        raise failed(e) from None
    out = await ask_step(step, "sampling", params, ctx, step.fields.skip_if_unsupported)
    if not step.fields.with_text and isinstance(out.output, dict) and not out.skipped:
        out.output.pop("text", None)
    return out


KIND = Kind(
    "sampling",
    SamplingFields,
    run_sampling,
    templates=("messages", "system_prompt", "max_tokens", "model_preferences", "temperature"),
)
