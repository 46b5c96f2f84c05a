"""The shapes every model provider speaks: messages, tool specs, tool calls, replies, errors.

Messages follow the chat-completions roles (``system``, ``user``, ``assistant``, ``tool``); each provider
translates them to its wire format (OpenAI's JSON, or MCP ``sampling/createMessage``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from mcpipe.errors import MCPipeError
from mcpipe.tools import ToolContext

__all__ = [
    "Message",
    "Model",
    "ModelError",
    "ModelOutputError",
    "Reply",
    "ToolCall",
    "ToolSpec",
]

Role = Literal["system", "user", "assistant", "tool"]


class ModelError(MCPipeError):
    """The model could not be asked, or answered something unusable (the message says which)."""

    code = "MODEL_FAILED"


class ModelOutputError(ModelError):
    """The model's answer was not the JSON asked for, after every retry.

    Attributes:
        text: the model's last answer.
        attempts: how many answers were tried.
    """

    def __init__(self, message: str, text: str, attempts: int) -> None:
        super().__init__(message)
        self.text = text
        self.attempts = attempts


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the model asked for: ``id`` correlates the result, ``arguments`` is an object.

    ``error`` is set when the model's arguments were unusable (not a JSON object): the call is not made and
    the model is told why.
    """

    id: str
    name: str
    arguments: dict[str, Any]
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool offered to the model: its name, what it does and its input JSON Schema."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message.

    Attributes:
        role: ``system``, ``user``, ``assistant`` or ``tool``.
        content: the text.
        tool_calls: an assistant message's tool calls.
        tool_call_id: a ``tool`` message's correlation id (the :class:`ToolCall` it answers).
        is_error: a ``tool`` message reporting a failed call.
    """

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    is_error: bool = False

    @classmethod
    def system(cls, text: str) -> Message:
        return cls("system", text)

    @classmethod
    def user(cls, text: str) -> Message:
        return cls("user", text)

    @classmethod
    def assistant(cls, text: str, tool_calls: tuple[ToolCall, ...] = ()) -> Message:
        return cls("assistant", text, tool_calls)

    @classmethod
    def tool(cls, call_id: str, text: str, *, is_error: bool = False) -> Message:
        return cls("tool", text, (), call_id, is_error)


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer of the model.

    Attributes:
        text: its text (``""`` when it only calls tools).
        tool_calls: the tools it asks to call.
        model: the model that answered, as the provider names it.
        stop_reason: why it stopped (``stop``/``endTurn``, ``tool_calls``/``toolUse``, ``length``...).
        usage: token counts when the provider reports them.
    """

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    model: str = ""
    stop_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)


class Model(Protocol):
    """A model to ask: an OpenAI-compatible endpoint, or the calling client's (MCP sampling).

    ``key`` names the question within the call (a 2026-07-28 client is asked by suspending the call, and
    the answer comes back under that key on the retry), so it must be the same on every run of the call.
    """

    name: str

    async def complete(
        self,
        messages: list[Message],
        ctx: ToolContext,
        *,
        key: str,
        tools: list[ToolSpec] | None = None,
        json_schema: dict[str, Any] | None = None,
        json: bool = False,
    ) -> Reply:
        """Ask once (``json``: ask for a JSON answer, matching ``json_schema`` when given).

        Raises:
            ModelError: the model cannot be asked, or its answer is unusable.
        """
        ...
