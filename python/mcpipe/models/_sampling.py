"""The calling client's model, over MCP ``sampling/createMessage`` (both protocol eras).

It asks through the call's :class:`~mcpipe.interaction.Interaction`, as the ``sampling`` step kind does:
over the session on 2025-11-25, by suspending the call on 2026-07-28. One step (or tool call) may ask
several times (retries, tool rounds, a formatting call), so every question carries its own key, and an
answer is kept after use: the call runs again from the top on each retry, and the earlier questions must
find their answers again then.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from mcpipe.interaction import AskFailed, interaction_of
from mcpipe.models._config import SAMPLING, ModelConfig
from mcpipe.models._types import Message, ModelError, Reply, ToolCall, ToolSpec
from mcpipe.tools import ToolContext

__all__ = ["SamplingModel", "once"]


class SamplingModel:
    """The calling client's model.

    Args:
        name: the preset's name (``sampling`` unless configured under another).
        config: the preset (``max_tokens``, ``params``: ``temperature``, ``model_preferences``...).
        params: fields laid over the preset's ``params``.
    """

    def __init__(
        self, name: str = SAMPLING, config: ModelConfig | None = None, *, params: Mapping[str, object] | None = None
    ) -> None:
        self.name = name
        self.config = config or ModelConfig(provider="sampling")
        self.params = {**self.config.params, **(params or {})}

    def request(
        self,
        messages: list[Message],
        tools: list[ToolSpec] | None,
        json_schema: Mapping[str, object] | None,
        json: bool,
    ) -> dict[str, Any]:
        """The ``sampling/createMessage`` params."""
        systems = [m.content for m in messages if m.role == "system"]
        if json:
            rule = "Answer with only a JSON value, no prose and no code fences."
            if json_schema is not None:
                rule += " It must match this JSON Schema: " + orjson.dumps(json_schema).decode()
            systems.append(rule)
        wire: list[dict[str, Any]] = []
        for m in messages:
            if m.role == "system":
                continue
            if m.role == "tool":
                block: dict[str, Any] = {
                    "type": "tool_result",
                    "toolUseId": m.tool_call_id,
                    "content": [{"type": "text", "text": m.content}],
                }
                if m.is_error:
                    block["isError"] = True
                last = wire[-1] if wire else None
                if last is not None and last["role"] == "user" and isinstance(last["content"], list):
                    last["content"].append(block)
                else:
                    wire.append({"role": "user", "content": [block]})
                continue
            content: Any = {"type": "text", "text": m.content}
            if m.tool_calls:
                content = [content] if m.content else []
                content += [
                    {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in m.tool_calls
                ]
            wire.append({"role": m.role, "content": content})
        params: dict[str, Any] = {
            "messages": wire,
            "maxTokens": int(self.params.get("max_tokens", self.config.max_tokens)),
        }
        if systems:
            params["systemPrompt"] = "\n\n".join(systems)
        if "temperature" in self.params:
            params["temperature"] = self.params["temperature"]
        if "model_preferences" in self.params:
            params["modelPreferences"] = self.params["model_preferences"]
        if tools:
            params["tools"] = [
                {"name": t.name, "description": t.description, "inputSchema": t.parameters} for t in tools
            ]
        return params

    async def complete(
        self,
        messages: list[Message],
        ctx: ToolContext,
        *,
        key: str,
        tools: list[ToolSpec] | None = None,
        json_schema: Mapping[str, object] | None = None,
        json: bool = False,
    ) -> Reply:
        ix = interaction_of(ctx)
        if ix is None:
            raise ModelError(
                f"model '{self.name}' is the calling client's (MCP sampling), and this call was not made over MCP"
            )
        if tools and not _supports_tools(ix.capabilities):
            raise ModelError(
                f"model '{self.name}': the client's sampling does not support tools (no `sampling.tools` capability)"
            )
        params = self.request(messages, tools, json_schema, json or json_schema is not None)
        qkey = f"{ix.key(ctx, 'call')}~{key}"
        try:
            answer = await ix.ask(qkey, "sampling", params)
        except AskFailed as e:
            raise ModelError(f"model '{self.name}': {e}") from None
        if ix.modern:
            ix.answers[qkey] = answer  # asked again, identically, when a later question of this call resumes it
        return _reply(self.name, answer)


def _supports_tools(caps: object) -> bool:
    sampling = caps.get("sampling") if isinstance(caps, dict) else getattr(caps, "sampling", None)
    if sampling is None:
        return False
    tools = sampling.get("tools") if isinstance(sampling, dict) else getattr(sampling, "tools", None)
    return tools is not None


def _reply(name: str, answer: Mapping[str, Any]) -> Reply:
    content = answer.get("content")
    blocks = content if isinstance(content, list) else [content]
    text = []
    calls = []
    for i, b in enumerate(blocks):
        if not isinstance(b, Mapping):
            continue
        if b.get("type") == "text":
            text.append(str(b.get("text", "")))
        elif b.get("type") == "tool_use":
            args = b.get("input")
            if isinstance(args, dict):
                calls.append(ToolCall(str(b.get("id") or f"call_{i}"), str(b.get("name")), args))
            else:
                calls.append(
                    ToolCall(str(b.get("id") or f"call_{i}"), str(b.get("name")), {}, "the arguments must be an object")
                )
    return Reply("".join(text), tuple(calls), str(answer.get("model") or name), answer.get("stopReason"))


async def once(ctx: ToolContext, key: str, work: Callable[[], Awaitable[Any]]) -> Any:
    """Run a side effect at most once per call, even when a 2026-07-28 call runs again after a suspension
    or a queued run is taken over from a dead worker: its result is recorded with the call's finished steps
    (saved at once for a queued run) and answered from there when the step runs again.

    Args:
        ctx: the call's context.
        key: unique within the step or tool call (``api``, ``tool~2``).
        work: the side effect; its result must be JSON-ready.
    """
    record = ctx.interaction
    if record is None or not record.resumable:
        return await work()
    path = f"{ctx.step or 'call'}~{key}"
    done = record.get(path)
    if done is not None:
        return done["value"]
    value = await work()
    await record.keep(path, {"value": value})
    return value
