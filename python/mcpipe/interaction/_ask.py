"""Building the questions a pipeline asks its client (elicitation, sampling, roots) and reading the
answers: shared by the asking step kinds (:mod:`mcpipe.kinds`) and the ``ask_user``/``sample``/
``list_roots`` tools.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcpipe.interaction._core import SKIPPED, AskFailed, interaction_of
from mcpipe.tools import ToolContext

__all__ = [
    "GATHER_KINDS",
    "OUTPUT_OF",
    "BadInput",
    "ask_one",
    "elicitation_output",
    "elicitation_params",
    "question",
    "sampling_output",
    "sampling_params",
]

GATHER_KINDS = {"elicitation": "elicitation", "sampling": "sampling", "roots": "roots"}
"""A ``gather`` entry's ``kind`` -> its kind of question (the roots entry is ``roots``, as in seed 003)."""


class BadInput(ValueError):
    """A resolved field has the wrong shape."""


def elicitation_params(message: object, requested_schema: object) -> dict[str, Any]:
    """The ``elicitation/create`` params (form mode)."""
    if not isinstance(message, str) or not message:
        raise BadInput(f"`message` must be a non-empty string, got {_describe(message)}")
    schema = {"type": "object", "properties": {}} if requested_schema is None else requested_schema
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise BadInput("`requested_schema` must be a JSON Schema object with `type: object`")
    return {"mode": "form", "message": message, "requestedSchema": schema}


def elicitation_output(answer: Mapping[str, object]) -> dict[str, Any]:
    """What an elicitation step outputs: the user's ``action`` and the ``content`` (null unless accepted)."""
    if answer is SKIPPED:
        return dict(SKIPPED)
    return {"action": answer.get("action"), "content": answer.get("content")}


def sampling_params(
    messages: object,
    max_tokens: object,
    system_prompt: object = None,
    model_preferences: object = None,
    temperature: object = None,
) -> dict[str, Any]:
    """The ``sampling/createMessage`` params. A message's ``content`` may be a string (a text block)."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if not isinstance(messages, list) or not messages:
        raise BadInput(f"`messages` must be a non-empty array, got {_describe(messages)}")
    out_messages = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or m.get("role") not in ("user", "assistant"):
            raise BadInput(f"`messages[{i}]` must be an object with `role` user or assistant")
        content = m.get("content")
        if isinstance(content, str):
            content = {"type": "text", "text": content}
        elif not isinstance(content, Mapping | list):
            raise BadInput(f"`messages[{i}].content` must be a string or a content block")
        out_messages.append({"role": m["role"], "content": content})
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
        raise BadInput(f"`max_tokens` must be a positive integer, got {max_tokens!r}")
    params: dict[str, Any] = {"messages": out_messages, "maxTokens": max_tokens}
    if system_prompt is not None:
        if not isinstance(system_prompt, str):
            raise BadInput("`system_prompt` must be a string")
        params["systemPrompt"] = system_prompt
    if model_preferences is not None:
        if not isinstance(model_preferences, Mapping):
            raise BadInput("`model_preferences` must be an object")
        params["modelPreferences"] = _camel(model_preferences)
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, int | float):
            raise BadInput("`temperature` must be a number")
        params["temperature"] = temperature
    return params


def sampling_output(answer: Mapping[str, object]) -> dict[str, Any]:
    """What a sampling step outputs: the client's result (``role``, ``content``, ``model``, ``stopReason``)
    and ``text``, the text of its content."""
    if answer is SKIPPED:
        return dict(SKIPPED)
    content = answer.get("content")
    blocks = content if isinstance(content, list) else [content]
    text = "".join(b.get("text", "") for b in blocks if isinstance(b, Mapping) and b.get("type") == "text")
    return {**answer, "text": text}


def roots_output(answer: Mapping[str, object]) -> dict[str, Any]:
    if answer is SKIPPED:
        return dict(SKIPPED)
    return {"roots": answer.get("roots", [])}


def _camel(prefs: Mapping[str, object]) -> dict[str, Any]:
    names = {
        "cost_priority": "costPriority",
        "speed_priority": "speedPriority",
        "intelligence_priority": "intelligencePriority",
    }
    return {names.get(k, k): v for k, v in prefs.items()}


def question(kind: str, fields: Mapping[str, object]) -> dict[str, Any] | None:
    """The params of one question from its (resolved) fields."""
    if kind == "elicitation":
        return elicitation_params(fields.get("message"), fields.get("requested_schema"))
    if kind == "sampling":
        return sampling_params(
            fields.get("messages"),
            fields.get("max_tokens", 1024),
            fields.get("system_prompt"),
            fields.get("model_preferences"),
            fields.get("temperature"),
        )
    return None


OUTPUT_OF = {"elicitation": elicitation_output, "sampling": sampling_output, "roots": roots_output}


async def ask_one(kind: str, params: dict[str, Any] | None, ctx: ToolContext, fallback: str, skip: bool) -> Any:
    """Ask one question for a step or tool; answers its output, or ``None`` when skipped."""
    ix = interaction_of(ctx)
    if ix is None:
        raise AskFailed("there is no MCP client to ask (this call was not made over MCP)")
    answer = await ix.ask(ix.key(ctx, fallback), kind, params, skip=skip)
    return None if answer is SKIPPED else OUTPUT_OF[kind](answer)


def _describe(v: object) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int | float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, Mapping):
        return "an object"
    if isinstance(v, list):
        return "an array"
    return type(v).__name__
