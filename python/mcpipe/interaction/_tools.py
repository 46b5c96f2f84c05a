"""``ask_user``, ``sample`` and ``list_roots``: the asking step kinds as tools, for ``mcp_pipe`` specs.

They ask exactly as the declared kinds do (same requests, same outputs, same suspension in 2026-07-28),
keyed by the pipeline step that calls them (the tool's name for a direct call).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from mcpipe.interaction._ask import BadInput, ask_one, question
from mcpipe.interaction._core import AskFailed
from mcpipe.tools import ToolContext, ToolResult

__all__ = ["INTERACTION_TOOL_NAMES", "InteractionTools", "interaction_tools"]

_SKIP = {
    "type": "boolean",
    "default": False,
    "description": "When the client cannot answer this kind of question, skip (output {skipped: true}).",
}


class _AskTool:
    kind = ""
    name = ""
    description = ""
    input_schema: dict[str, Any] = {}
    output_schema: dict[str, Any] | None = None
    # Nothing is written; the answer comes from a person or a model outside, and differs each time.
    annotations: dict[str, Any] = {
        "readOnlyHint": True,
        "destructiveHint": False,
        "idempotentHint": False,
        "openWorldHint": True,
    }

    def params(self, args: Mapping[str, object]) -> dict[str, Any] | None:
        """The question's params, from the tool's arguments as a step's fields (None: no params)."""
        return question(self.kind, args)

    async def call(self, args: Mapping[str, object], ctx: ToolContext) -> ToolResult:
        try:
            params = self.params(args)
            out = await ask_one(self.kind, params, ctx, self.name, bool(args.get("skip_if_unsupported", False)))
        except (BadInput, AskFailed) as e:
            return ToolResult.error(f"{self.name}: {e}")
        if out is None:
            out = {"skipped": True}
        return ToolResult([{"type": "text", "text": orjson.dumps(out).decode()}], out)


class AskUser(_AskTool):
    kind = "elicitation"
    name = "ask_user"
    description = (
        "Ask the user (MCP elicitation): a message and the JSON Schema of the answer. Answers "
        "{action: accept|decline|cancel, content}."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "message": {"type": "string", "minLength": 1},
            "requested_schema": {"type": "object", "description": "A flat JSON Schema (type: object)."},
            "skip_if_unsupported": _SKIP,
        },
        "required": ["message"],
    }


class Sample(_AskTool):
    kind = "sampling"
    name = "sample"
    description = (
        "Ask the client's model for a completion (MCP sampling). `messages` is a prompt string or "
        "[{role, content}]. Answers the model's reply, with its text in `text`."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "messages": {"type": ["string", "array"]},
            "max_tokens": {"type": "integer", "minimum": 1, "default": 1024},
            "system_prompt": {"type": "string"},
            "model_preferences": {"type": "object"},
            "temperature": {"type": "number"},
            "skip_if_unsupported": _SKIP,
        },
        "required": ["messages"],
    }


class ListRoots(_AskTool):
    kind = "roots"
    name = "list_roots"
    description = "Ask the client for its roots (MCP roots/list). Answers {roots: [{uri, name}]}."
    annotations = {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}
    input_schema = {"type": "object", "properties": {"skip_if_unsupported": _SKIP}}


INTERACTION_TOOL_NAMES = ("ask_user", "sample", "list_roots")


class InteractionTools:
    """A tool source of the asking tools (``get``, iteration), optionally limited to some names."""

    def __init__(self, names: Any = None) -> None:
        tools = [AskUser(), Sample(), ListRoots()]
        self._tools = {t.name: t for t in tools if names is None or t.name in names}

    def get(self, name: str) -> Any:
        return self._tools.get(name)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._tools.values())

    def __contains__(self, name: object) -> bool:
        return name in self._tools


def interaction_tools(names: object = None) -> InteractionTools:
    """The asking tools (all, or those named)."""
    return InteractionTools(names)
