"""An OpenAI-compatible chat-completions endpoint (``POST {base_url}/chat/completions``).

The endpoint is the operator's (named in the config, never by a request), so it is not behind the
outbound allowlist that guards URLs requests and models write; it still has a deadline and a size cap.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from functools import cache
from typing import Any

import orjson
import trio

from mcpipe._redact import redact, redact_bytes
from mcpipe._util import read_capped
from mcpipe.models._config import DEFAULT_OPENAI_BASE_URL, ModelConfig
from mcpipe.models._types import Message, ModelError, Reply, ToolCall, ToolSpec
from mcpipe.tools import ToolContext

__all__ = ["OpenAIModel"]


@cache
def _ssl_context() -> ssl.SSLContext:
    return ssl.create_default_context()


class OpenAIModel:
    """A model behind an OpenAI-compatible endpoint.

    Args:
        name: the preset's name (the default model id).
        config: the preset.
        environ: where ``OPENAI_BASE_URL`` and the API key variable are read (default ``os.environ``).
        params: request fields laid over the preset's (a playbook model's ``params``).
    """

    def __init__(
        self,
        name: str,
        config: ModelConfig | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        params: Mapping[str, object] | None = None,
    ) -> None:
        self.name = name
        self.config = config or ModelConfig()
        self._environ = environ
        self.params = {**self.config.params, **(params or {})}

    @property
    def environ(self) -> Mapping[str, str]:
        return os.environ if self._environ is None else self._environ

    @property
    def base_url(self) -> str:
        base = self.config.base_url or self.environ.get("OPENAI_BASE_URL") or DEFAULT_OPENAI_BASE_URL
        return base.rstrip("/")

    def body(
        self,
        messages: list[Message],
        tools: list[ToolSpec] | None,
        json_schema: Mapping[str, object] | None,
        json: bool,
    ) -> dict[str, Any]:
        """The request body (public so tests and docs can show it)."""
        body: dict[str, Any] = {**self.params, "model": self.config.model or self.name}
        body["messages"] = [_wire_message(m) for m in messages]
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in tools
            ]
        fmt = self.config.response_format
        if json and fmt == "json_schema" and json_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": json_schema, "strict": False},
            }
        elif json and fmt != "none":
            body["response_format"] = {"type": "json_object"}
        return body

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
        body = self.body(messages, tools, json_schema, json or json_schema is not None)
        headers = {"content-type": "application/json", "accept": "application/json"}
        api_key = self.environ.get(self.config.api_key_env)
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        elif not (self.config.base_url or self.environ.get("OPENAI_BASE_URL")):
            # OpenAI's own endpoint wants a key: say so here, not as whatever asking it without one fails with
            # (a DNS error where the network is closed). A local endpoint (a base URL) may need none.
            raise ModelError(
                f"model '{self.name}': {self.config.api_key_env} is not set (and no base URL is given: "
                f"set {self.config.api_key_env}, or OPENAI_BASE_URL / the model's base_url for another endpoint)"
            )
        url = f"{self.base_url}/chat/completions"
        raw, status = await self._post(url, headers, orjson.dumps(body))
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError:
            answer = None
        if status >= 400:
            # An endpoint may echo the key it was sent into its error: the caller never sees it.
            detail = redact(_error_detail(answer, redact_bytes(raw, [api_key])), [api_key])
            raise ModelError(f"model '{self.name}': {url} answered HTTP {status}{detail}")
        if not isinstance(answer, dict):
            shown = redact_bytes(raw, [api_key])[:200]
            raise ModelError(f"model '{self.name}': {url} did not answer a JSON object: {shown!r}")
        return _reply(self.name, answer)

    async def _post(self, url: str, headers: dict[str, str], content: bytes) -> tuple[bytes, int]:
        import httpx2  # with the first request to a model, not with the command

        limit = self.config.max_response_bytes
        with trio.move_on_after(self.config.timeout_ms / 1000) as scope:
            try:
                async with httpx2.AsyncClient(verify=_ssl_context(), timeout=None, trust_env=False) as client:
                    request = client.build_request("POST", url, headers=headers, content=content)
                    response = await client.send(request, stream=True)
                    try:
                        body, larger = await read_capped(response, limit)
                        if larger:
                            raise ModelError(f"model '{self.name}': the answer is larger than {limit} bytes")
                    finally:
                        await response.aclose()
            except httpx2.HTTPError as e:
                raise ModelError(f"model '{self.name}': request to {url} failed: {type(e).__name__}: {e}") from None
            except OSError as e:
                raise ModelError(f"model '{self.name}': request to {url} failed: {e}") from None
            return body, response.status_code
        assert scope.cancelled_caught
        raise ModelError(f"model '{self.name}': no answer within {self.config.timeout_ms:g} ms")


def _wire_message(m: Message) -> dict[str, Any]:
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["content"] = m.content or None
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": orjson.dumps(c.arguments).decode()},
            }
            for c in m.tool_calls
        ]
    return out


def _error_detail(answer: object, raw: bytes) -> str:
    if isinstance(answer, dict):
        err = answer.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return f": {err['message']}"
        if isinstance(err, str):
            return f": {err}"
    text = raw[:200].decode("utf-8", errors="replace").strip()
    return f": {text}" if text else ""


def _reply(name: str, answer: Mapping[str, object]) -> Reply:
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ModelError(f"model '{name}': the answer has no choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ModelError(f"model '{name}': the answer's first choice has no message")
    content = message.get("content")
    if isinstance(content, list):  # some servers answer content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    text = content if isinstance(content, str) else ""
    calls = []
    for i, c in enumerate(message.get("tool_calls") or ()):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ModelError(f"model '{name}': tool call {i} has no function name")
        call_id = c.get("id") if isinstance(c.get("id"), str) else f"call_{i}"
        raw_args = fn.get("arguments")
        args: Any
        error = None
        if isinstance(raw_args, dict):
            args = raw_args
        else:
            try:
                args = orjson.loads(raw_args or "{}")
            except (orjson.JSONDecodeError, TypeError):
                args, error = {}, f"the arguments are not valid JSON: {str(raw_args)[:200]!r}"
            if error is None and not isinstance(args, dict):
                args, error = {}, "the arguments must be a JSON object"
        calls.append(ToolCall(call_id, fn["name"], args, error))
    usage = answer.get("usage")
    return Reply(
        text,
        tuple(calls),
        str(answer.get("model") or name),
        choice.get("finish_reason"),
        usage if isinstance(usage, dict) else {},
    )
