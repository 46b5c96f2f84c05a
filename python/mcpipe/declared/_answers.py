"""How a declared pipeline's run becomes its answer: the answer shapes.

mcpipe's own shape (``output``/``content``, see :class:`~mcpipe.declared.DeclaredDialect`) is the
default. A pipeline entry may name another with ``answer: <name>``: a foreign format whose system answers
differently (mcpg's ``CallToolResult`` of a binding, its pipeline envelope) registers its shapes here, the way
it registers its step kinds, and its configs name them.

A shape also says how the answer of a pipeline served as a resource or a prompt (``surface``) becomes a
``resources/read`` or ``prompts/get`` result. A request it cannot answer raises :class:`SurfaceError` (a
JSON-RPC error code and message, which the server sends as they are).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

import orjson

from mcpipe.errors import MCPipeError
from mcpipe.tools import ToolResult

if TYPE_CHECKING:
    from mcpipe.declared._plantool import PlanTool
    from mcpipe.declared._tool import DeclaredDialect

__all__ = ["ANSWERS", "AnswerShape", "SurfaceError", "answer_shape", "register_answer"]

INTERNAL_ERROR = -32603


class SurfaceError(MCPipeError):
    """A ``resources/read`` or ``prompts/get`` of a declared pipeline that has no answer: the JSON-RPC error
    to send (``code``, ``message``)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.rpc_code = code


class AnswerShape(Protocol):
    """What a named answer shape does."""

    def tool(self, tool: PlanTool, answer: dict[str, Any]) -> ToolResult:
        """The tool's answer, from the run's answer (``ok``, ``error``, ``error_code``, ``result``, ``steps``,
        ``summary``, ``duration_ms``: :func:`mcpipe.runtime.run_compiled`)."""
        ...

    def resource(self, tool: PlanTool, result: ToolResult, uri: str) -> dict[str, Any]:
        """A ``resources/read`` result (``{"contents": [...]}``) from the pipeline's answer."""
        ...

    def prompt(self, tool: PlanTool, result: ToolResult) -> dict[str, Any]:
        """A ``prompts/get`` result (``{"messages": [...]}``) from the pipeline's answer."""
        ...

    def invalid(self, tool: PlanTool, errors: list[str], args: Any) -> ToolResult:
        """The answer to arguments that break the input schema (``errors``: ``args.amount: <why>`` each;
        ``args``: the arguments, for a shape that words the errors its own way: ``tool.dialect.schema_errors``)."""
        ...


class McpipeShape:
    """mcpipe's own answers: ``output``/``content`` as the tool's result; a resource is its ``contents`` (when
    the output is an object holding them) or one text item of the answer's text; a prompt is its ``messages``
    or one user message of the answer's text."""

    def tool(self, tool: PlanTool, answer: dict[str, Any]) -> ToolResult:
        if not answer["ok"]:
            return ToolResult.error(f"{answer['error_code']}: {answer['error']}")
        return cast("DeclaredDialect", tool.dialect).shape(tool, answer["result"])

    def invalid(self, tool: PlanTool, errors: list[str], args: object) -> ToolResult:
        return ToolResult.error(f"invalid arguments for tool '{tool.name}': " + "; ".join(errors))

    def resource(self, tool: PlanTool, result: ToolResult, uri: str) -> dict[str, Any]:
        if result.is_error:
            raise SurfaceError(INTERNAL_ERROR, result.joined_text() or f"reading {uri} failed")
        s = result.structured
        if isinstance(s, Mapping) and isinstance(s.get("contents"), list):
            return {"contents": s["contents"]}
        item: dict[str, Any] = {"uri": uri, "text": result.joined_text()}
        if tool.mime_type is not None:
            item["mimeType"] = tool.mime_type
        return {"contents": [item]}

    def prompt(self, tool: PlanTool, result: ToolResult) -> dict[str, Any]:
        if result.is_error:
            raise SurfaceError(INTERNAL_ERROR, result.joined_text() or f"prompt '{tool.name}' failed")
        s = result.structured
        if isinstance(s, Mapping) and isinstance(s.get("messages"), list):
            return {"messages": s["messages"]}
        return {"messages": [{"role": "user", "content": {"type": "text", "text": result.joined_text()}}]}


ANSWERS: dict[str, AnswerShape] = {"mcpipe": McpipeShape()}
"""The answer shapes by name; ``mcpipe`` is the default."""


def register_answer(name: str, shape: AnswerShape) -> None:
    """Make ``answer: <name>`` mean ``shape`` (a foreign format does this when it is imported)."""
    ANSWERS[name] = shape


def answer_shape(name: str | None) -> AnswerShape | None:
    """The shape named ``name`` (None: mcpipe's), or None when no shape has that name."""
    return ANSWERS.get(name or "mcpipe")


def text_of(value: object) -> str:
    """A value as the text of an answer: a string as it is, anything else as compact JSON."""
    return value if isinstance(value, str) else orjson.dumps(value).decode()
