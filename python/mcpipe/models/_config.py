"""``[models.NAME]`` in the server config: the model presets pipelines and the workflow refer to by name."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from mcpipe._struct import Strict

__all__ = ["DEFAULT_OPENAI_BASE_URL", "SAMPLING", "ModelConfig"]

DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"

SAMPLING = "sampling"
"""The model name that always means the calling client's model (MCP sampling), configured or not."""


class ModelConfig(Strict):
    """One model preset.

    Attributes:
        provider: ``openai`` (any OpenAI-compatible chat-completions endpoint) or ``sampling`` (the
            calling client's model, over MCP ``sampling/createMessage``).
        base_url: the endpoint's base (``.../v1``); default ``OPENAI_BASE_URL``, else OpenAI's.
        model: the provider's model id; default: the preset's name.
        api_key_env: the environment variable holding the API key (read at each call, never stored in the
            config); unset or empty: no ``Authorization`` header.
        params: extra request fields (``temperature``, ``max_tokens``, ``top_p``...); a playbook's own
            ``params`` are laid over these.
        json_retries: how many times a malformed structured answer is sent back to the model with the
            parse error before the call fails.
        max_tool_rounds: how many rounds of tool calls one turn may make.
        response_format: how structured output is asked for: ``json_schema`` (the schema in
            ``response_format``), ``json_object``, or ``none`` (only in the prompt).
        timeout_ms: the deadline of one request.
        max_response_bytes: a larger answer fails the call.
        max_tokens: sampling's ``maxTokens`` (MCP requires one); for ``openai`` put it in ``params``.
    """

    provider: Literal["openai", "sampling"] = "openai"
    base_url: str | None = None
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    params: dict[str, Any] = {}
    json_retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 2
    max_tool_rounds: Annotated[int, msgspec.Meta(ge=1, le=64)] = 8
    response_format: Literal["json_schema", "json_object", "none"] = "json_schema"
    timeout_ms: Annotated[float, msgspec.Meta(gt=0, le=3_600_000)] = 120_000
    max_response_bytes: Annotated[int, msgspec.Meta(gt=0)] = 4 * 1024 * 1024
    max_tokens: Annotated[int, msgspec.Meta(gt=0)] = 1024
