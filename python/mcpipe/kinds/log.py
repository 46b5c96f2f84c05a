"""The ``log`` step kind: send ``data`` to the caller as a ``notifications/message``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from mcpipe.kinds._base import Kind, StepFields
from mcpipe.plan import Leaf
from mcpipe.results import StepOutput
from mcpipe.tools import ToolContext

__all__ = ["KIND", "LOG_LEVELS", "LogFields", "run_log"]

LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
LogLevel = Literal["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]


class LogFields(StepFields, tag="log"):
    """Send ``data`` (a template) to the caller as a ``notifications/message`` at ``level``."""

    data: Any
    level: LogLevel = "info"
    logger: str | None = None


async def run_log(
    step: Leaf[LogFields, None], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Send ``data`` to the caller (``notifications/message``); the output is the data sent."""
    fields = step.fields
    data = inputs["data"]
    await ctx.send_log(fields.level, data, fields.logger)  # the notification's own `logger` names it
    return StepOutput.of(data)


KIND = Kind("log", LogFields, run_log, templates=("data",))
