"""The LLM workflow of seed 002, served as the ``workflow`` tool and ``POST /workflow``.

See ``docs/workflow.md``. :class:`Workflow` runs the stages; :class:`WorkflowTool` serves it as a tool;
:func:`load_workflow` checks the config's ``workflow`` section.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import httpx2
import msgspec
import orjson

from mcpipe.errors import Problem
from mcpipe.models import Models, located
from mcpipe.tools import ToolContext, ToolResult
from mcpipe.workflow._config import AuthParam, HttpToolConfig, ParamDoc, WorkflowConfig
from mcpipe.workflow._orchestrator import (
    HTTP_SPEC_SCHEMA,
    INPUT_SCHEMA,
    MASK,
    OUTPUT_SCHEMA,
    STAGES,
    Workflow,
    WorkflowRequest,
    tools_context,
)

__all__ = [
    "HTTP_SPEC_SCHEMA",
    "MASK",
    "STAGES",
    "AuthParam",
    "HttpToolConfig",
    "ParamDoc",
    "Workflow",
    "WorkflowConfig",
    "WorkflowRequest",
    "WorkflowTool",
    "load_workflow",
    "tools_context",
]

TOOL_NAME = "workflow"


class WorkflowTool:
    """The ``workflow`` tool: a tool source holding one tool (``get``/iteration, as the gateway wants)."""

    name = TOOL_NAME
    title = "Workflow"
    description = (
        "Accomplish an instruction with one of the configured HTTP tools: a model picks the tool and writes the "
        "request, the server runs it, and the model can format the answer. Answers status, selected_tool, "
        "http_spec (secrets masked), raw_response, formatted_response, error and error_stage."
    )
    input_schema = INPUT_SCHEMA
    output_schema = OUTPUT_SCHEMA

    def __init__(self, workflow: Workflow) -> None:
        self.workflow = workflow

    def get(self, name: str) -> WorkflowTool | None:
        return self if name == TOOL_NAME else None

    def __iter__(self) -> Iterator[WorkflowTool]:
        return iter((self,))

    def __contains__(self, name: object) -> bool:
        return name == TOOL_NAME

    async def answer(self, args: object, ctx: ToolContext) -> tuple[dict[str, Any] | None, list[str]]:
        """The workflow's response, or the arguments' problems (then nothing ran)."""
        request, errors = WorkflowRequest.parse(args, self.workflow.config.max_instructions_chars)
        if request is None:
            return None, errors
        return await self.workflow.run(request, ctx), []

    async def call(self, args: Mapping[str, object], ctx: ToolContext) -> ToolResult:
        result, errors = await self.answer(args, ctx)
        if result is None:
            return ToolResult.error(f"invalid arguments for tool '{TOOL_NAME}': " + "; ".join(errors))
        text = orjson.dumps(result).decode()
        return ToolResult([{"type": "text", "text": text}], result, result["status"] == "error")


def load_workflow(
    raw: object, models: Models, location: str = "workflow"
) -> tuple[WorkflowConfig | None, list[Problem]]:
    """Decode and check the ``workflow`` section: every problem located (``workflow.tools[1].base_url``)."""
    if raw is None:
        return None, []
    try:
        cfg = msgspec.convert(raw, WorkflowConfig, strict=True)
    except msgspec.ValidationError as e:
        return None, [located(e, location)]
    problems: list[Problem] = []
    for key, name in (("model", cfg.model), ("format_model", cfg.format_model)):
        if name is not None and name not in models:
            problems.append(
                Problem(f"{location}.{key}", "INVALID_CONFIG", f"unknown model `{name}`{models.hint(name)}")
            )
    seen: dict[str, int] = {}
    for i, tool in enumerate(cfg.tools):
        where = f"{location}.tools[{i}]"
        if tool.name in seen:
            problems.append(
                Problem(
                    f"{where}.name",
                    "INVALID_CONFIG",
                    f"duplicate tool `{tool.name}` (first at tools[{seen[tool.name]}])",
                )
            )
        seen.setdefault(tool.name, i)
        try:
            url = httpx2.URL(tool.endpoint)
            ok = url.scheme in ("http", "https") and bool(url.host) and not url.query and not url.userinfo
        except httpx2.InvalidURL:
            ok = False
        if not ok:
            problems.append(
                Problem(
                    f"{where}.base_url", "INVALID_CONFIG", "must be an http(s) URL with a host, no query or credentials"
                )
            )
        clash = set(tool.static_params) & set(tool.authenticated_params)
        if clash:
            problems.append(
                Problem(f"{where}.static_params", "INVALID_CONFIG", f"also authenticated: {', '.join(sorted(clash))}")
            )
        if tool.output_schema is not None and not isinstance(tool.output_schema, Mapping):
            problems.append(Problem(f"{where}.output_schema", "INVALID_CONFIG", "must be a JSON Schema object"))
    return (None if problems else cfg), problems
