"""The ``progress`` step kind: send a ``notifications/progress`` to the caller."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import trio

from mcpipe.errors import ErrorCode
from mcpipe.kinds._base import Kind, StepFields
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = ["KIND", "ProgressFields", "has_progress_token", "run_progress"]


class ProgressFields(StepFields, tag="progress"):
    """Send a ``notifications/progress``; skipped when the call carried no progress token.
    ``progress``, ``total`` and ``message`` are templates."""

    progress: Any
    total: Any = None
    message: Any = None


def has_progress_token(ctx: ToolContext) -> bool:
    """Did the call carry a progress token? (:attr:`ToolContext.has_progress`)."""
    return ctx.has_progress


async def run_progress(
    step: Leaf[ProgressFields, None], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Send a ``notifications/progress``; skipped when the call carried no progress token."""
    progress = _number(inputs["progress"], "progress")
    total = None if inputs.get("total") is None else _number(inputs["total"], "total")
    message = inputs.get("message")
    if message is not None and not isinstance(message, str):
        raise StepFailure(f"`message` must be a string, got {type(message).__name__}", ErrorCode.TOOL_FAILED)
    if not ctx.has_progress:
        await trio.lowlevel.checkpoint()
        return StepOutput.skip()
    await ctx.report_progress(progress, total, message)
    sent: dict[str, Any] = {"progress": progress}
    if total is not None:
        sent["total"] = total
    if message is not None:
        sent["message"] = message
    return StepOutput.of(sent)


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise StepFailure(f"`{name}` must be a number, got {value!r}", ErrorCode.TOOL_FAILED)
    return value


KIND = Kind("progress", ProgressFields, run_progress, templates=("progress", "total", "message"))
