"""What the asking kinds (``elicitation``, ``sampling``, ``roots_list``, ``gather``) share."""

from __future__ import annotations

from typing import Any

from mcpipe.errors import ErrorCode
from mcpipe.interaction import AskFailed, ask_one
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = ["ask_step", "failed"]


def failed(e: Exception) -> StepFailure:
    """The step failure of a question that cannot be asked."""
    return StepFailure(str(e), ErrorCode.TOOL_FAILED)


async def ask_step(
    step: Leaf[Any, None], kind: str, params: dict[str, Any] | None, ctx: ToolContext, skip: bool
) -> StepOutput:
    """Ask one question for ``step``; its answer is the output (skipped when the client cannot answer
    and ``skip_if_unsupported`` is set)."""
    try:
        out = await ask_one(kind, params, ctx, step.id, skip)
    except AskFailed as e:
        raise failed(e) from None
    return StepOutput.skip() if out is None else StepOutput.of(out)
