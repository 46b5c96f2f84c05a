"""One exchange with a model: tool rounds, structured output parsed and retried on malformed answers."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import orjson
import trio

from mcpipe._jsonschema import needs_thread, validator, warmed
from mcpipe.models._types import Message, Model, ModelError, ModelOutputError, Reply, ToolCall, ToolSpec
from mcpipe.tools import ToolContext

__all__ = ["Outcome", "RunTool", "converse", "parse_json", "schema_errors", "schema_errors_async"]

RunTool = Callable[[ToolCall, int], Awaitable[tuple[str, bool]]]
"""Runs one tool call of the model (the ``n``-th of the exchange): answers ``(text, is_error)``."""

_FENCE = re.compile(r"^```[A-Za-z0-9_-]*\s*\n?(.*?)\n?```$", re.S)


@dataclass
class Outcome:
    """What an exchange produced.

    Attributes:
        text: the final answer's text.
        data: the parsed JSON value (structured output), else None.
        reply: the final answer.
        messages: the whole conversation, the final answer included.
        tool_calls: every tool call made: ``{"name", "arguments", "ok", "result"}``.
        attempts: how many answers the model gave (tool rounds and retries included).
        usage: token counts summed over the answers.
    """

    text: str
    data: Any
    reply: Reply
    messages: list[Message]
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    attempts: int = 1
    usage: dict[str, int] = field(default_factory=dict)
    """Token counts summed over every answer (``prompt_tokens``, ``completion_tokens``, ``total_tokens``),
    when the provider reports them."""


@lru_cache(maxsize=256)
def _validator(schema_json: bytes) -> tuple[Any, bool]:
    """The schema's validator (patterns matched safely, :mod:`mcpipe._jsonschema`), and whether validating
    with it belongs off the event loop."""
    schema = orjson.loads(schema_json)
    return validator(schema), needs_thread(schema)  # its $schema's draft, else the latest (2020-12)


def _key(schema: Mapping[str, object]) -> bytes:
    return orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)


def parse_json(text: str, schema: Mapping[str, object] | None = None) -> Any:
    """The JSON value of a model's answer (a surrounding code fence is allowed), checked against ``schema``.

    Raises:
        ValueError: not JSON, or not valid under the schema (the message says where).
    """
    body = text.strip()
    if m := _FENCE.match(body):
        body = m.group(1).strip()
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ValueError(f"it is not valid JSON ({e})") from None
    if schema is not None:
        problems = schema_errors(value, schema)
        if problems is not None:
            raise ValueError(f"it does not match the schema ({problems})")
    return value


def schema_errors(value: object, schema: Mapping[str, object]) -> str | None:
    """Why ``value`` does not match the JSON Schema (up to five places, ``path: message``), or None.
    Validators are compiled once per schema."""
    v, _ = _validator(_key(schema))
    errors = sorted(v.iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))
    if not errors:
        return None
    return "; ".join(f"{'/'.join(map(str, e.absolute_path)) or 'the value'}: {e.message}" for e in errors[:5])


async def schema_errors_async(value: object, schema: Mapping[str, object]) -> str | None:
    """:func:`schema_errors`, in a thread when the schema has a pattern only the fallback engine takes."""
    await warmed()
    if not _validator(_key(schema))[1]:
        return schema_errors(value, schema)
    return await trio.to_thread.run_sync(schema_errors, value, schema)


async def _parse_json_async(text: str, schema: Mapping[str, object] | None) -> Any:
    if schema is not None:
        await warmed()
    if schema is None or not _validator(_key(schema))[1]:
        return parse_json(text, schema)
    return await trio.to_thread.run_sync(parse_json, text, schema)


async def _store(
    out: list[tuple[str, bool]], i: int, call: ToolCall, n: int, allowed: set[str], run_tool: RunTool | None
) -> None:
    """Run the ``n``-th tool call of an exchange (or answer why not) into ``out[i]``."""
    if call.error is not None:
        out[i] = f"not called: {call.error}", True
    elif call.name not in allowed or run_tool is None:
        offered = ", ".join(sorted(allowed)) or "none"
        out[i] = f"not called: there is no tool '{call.name}' here (offered: {offered})", True
    else:
        out[i] = await run_tool(call, n)


async def converse(
    model: Model,
    messages: Sequence[Message],
    ctx: ToolContext,
    *,
    key: str,
    tools: Sequence[ToolSpec] = (),
    run_tool: RunTool | None = None,
    json: bool = False,
    json_schema: dict[str, Any] | None = None,
    check: Callable[[Any], None] | None = None,
    json_retries: int = 2,
    max_tool_rounds: int = 8,
    parallel_tools: bool = False,
) -> Outcome:
    """Ask ``model`` until it gives a final answer.

    When it calls tools, each call is run through ``run_tool`` (one after the other, in the order asked; all
    of a round at once with ``parallel_tools``) and the results go back to it in the order asked; at most
    ``max_tool_rounds`` rounds. When ``json`` (or a schema) is asked
    for, an answer that is not JSON, does not match ``json_schema`` or fails ``check`` (a ``ValueError``) is
    sent back with the reason, at most ``json_retries`` times.

    Args:
        key: names this exchange within the call; its questions are ``{key}.1``, ``{key}.2``...

    Raises:
        ModelOutputError: still malformed after the retries.
        ModelError: the model could not be asked, or called tools too many times.
    """
    msgs = list(messages)
    allowed = {t.name for t in tools}
    want_json = json or json_schema is not None
    asked = rounds = malformed = 0
    calls: list[dict[str, Any]] = []
    usage: dict[str, int] = {}
    while True:
        asked += 1
        reply = await model.complete(
            msgs, ctx, key=f"{key}.{asked}", tools=list(tools) or None, json_schema=json_schema, json=want_json
        )
        for k, v in reply.usage.items():
            if isinstance(v, int) and not isinstance(v, bool):
                usage[k] = usage.get(k, 0) + v
        if reply.tool_calls:
            rounds += 1
            if rounds > max_tool_rounds:
                raise ModelError(f"the model asked for tools more than {max_tool_rounds} rounds in a row")
            msgs.append(Message.assistant(reply.text, reply.tool_calls))
            first = len(calls) + 1
            answers: list[tuple[str, bool]] = [("", True)] * len(reply.tool_calls)
            if parallel_tools and len(reply.tool_calls) > 1:
                async with trio.open_nursery() as nursery:
                    for i, call in enumerate(reply.tool_calls):
                        nursery.start_soon(_store, answers, i, call, first + i, allowed, run_tool)
            else:
                for i, call in enumerate(reply.tool_calls):
                    await _store(answers, i, call, first + i, allowed, run_tool)
            for call, (text, is_error) in zip(reply.tool_calls, answers, strict=True):
                calls.append({"name": call.name, "arguments": call.arguments, "ok": not is_error, "result": text})
                msgs.append(Message.tool(call.id, text, is_error=is_error))
            continue
        if not want_json:
            msgs.append(Message.assistant(reply.text))
            return Outcome(reply.text, None, reply, msgs, calls, asked, usage)
        try:
            data = await _parse_json_async(reply.text, json_schema)
            if check is not None:
                check(data)
        except ValueError as e:
            malformed += 1
            if malformed > json_retries:
                raise ModelOutputError(
                    f"the model's answer is not usable after {malformed} tries: {e}", reply.text, asked
                ) from None
            msgs.append(Message.assistant(reply.text))
            msgs.append(Message.user(f"That answer is not usable: {e}. Answer again with only the corrected JSON."))
            continue
        msgs.append(Message.assistant(reply.text))
        return Outcome(reply.text, data, reply, msgs, calls, asked, usage)
