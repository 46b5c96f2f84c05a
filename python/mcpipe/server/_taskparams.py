"""The params models of the tasks methods (``tasks/get``, ``tasks/cancel``, ``tasks/update``): pydantic models
on the SDK's ``RequestParams``, imported when the SDK server is built (:meth:`mcpipe.server._tasks.Tasks.install`),
not by the handlers' module."""

from __future__ import annotations

from typing import Any

from mcp_types import RequestParams
from pydantic import ConfigDict, Field

__all__ = ["TaskParams", "UpdateParams"]


class TaskParams(RequestParams):
    model_config = ConfigDict(populate_by_name=True, extra="allow")
    task_id: str = Field(alias="taskId")


class UpdateParams(TaskParams):
    input_responses: dict[str, Any] | None = Field(default=None, alias="inputResponses")
