"""piraeus's services, as a flow's ``service`` steps call them.

A ``service`` step names one of piraeus's backend services by the path its API serves it at; its ``inputs``
are that endpoint's request and its output the endpoint's response (``api/endpoints.py``,
``models/api_requests.py``):

- ``prompt``: ``PromptRequest {instructions, context, response_format_prompt}`` -> ``PromptResponse
  {content, type: "text"}``;
- ``prompt-mcp``: ``MCPPromptRequest {instructions, api_docs, response_format_prompt}`` -> ``PromptResponse
  {content: <HTTPRequestSpec>, type: "http_spec"}``;
- ``execute``: ``ExecuteRequest {http_spec}`` -> ``ExecuteResponse {status, data: <HTTPResponseSpec>, error}``;
- ``prompt-execute``: ``MCPPromptRequest`` -> ``ExecuteResponse``;
- ``workflow``: ``WorkflowRequest`` -> ``WorkflowResponse``.

(``_`` may stand for ``-``.) A response whose ``status`` is ``error`` fails the step, the response kept as
its output. Models are asked through :mod:`mcpipe.models`; HTTP requests go through the outbound policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import httpx2
import orjson
import trio

from mcpipe._describe import did_you_mean, json_type
from mcpipe.errors import ErrorCode
from mcpipe.kinds import ForbiddenError, HttpPolicy
from mcpipe.kinds.http import send_request
from mcpipe.models import Message, ModelError, Models, Outcome, converse, once
from mcpipe.results import StepFailure
from mcpipe.tools import ToolContext

__all__ = ["NORMAL_SYSTEM", "SERVICES", "Services", "canonical", "user_prompt"]

SERVICES = ("prompt", "prompt-mcp", "execute", "prompt-execute", "workflow")

NORMAL_SYSTEM = (
    "You are a helpful AI assistant. Provide clear, accurate, and concise responses to user questions.\n"
    "Focus on being informative and easy to understand."
)
"""piraeus's system prompt of normal mode (``PromptTemplates.normal_mode_system_prompt``)."""

_MCP_SYSTEM = (
    "You write one HTTP request specification from the user's instructions and the API documentation. Use the "
    "URL exactly as the documentation gives it. Answer with only a JSON object: "
    '{"method": "<GET|POST|PUT|DELETE|PATCH|HEAD|OPTIONS>", "url": "<the URL>", "headers": {...} or null, '
    '"query_params": {...} or null, "body": {...}, a string, or null}.'
)

METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")
"""``HTTPRequestSpec.method``."""

HTTP_SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "method": {"enum": list(METHODS)},
        "url": {"type": "string", "minLength": 1},
        "headers": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
        "query_params": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
        "body": {"type": ["object", "string", "null"]},
    },
    "required": ["method", "url"],
}
"""``HTTPRequestSpec`` as a JSON Schema (what the model writes for ``prompt-mcp``)."""


def canonical(name: str) -> str | None:
    """The service ``name`` names (``prompt_mcp`` is ``prompt-mcp``), or None."""
    n = name.strip().lower().replace("_", "-").lstrip("/")
    return n if n in SERVICES else None


def user_prompt(
    instructions: str, context: str | None = None, api_docs: str | None = None, fmt: str | None = None
) -> str:
    """piraeus's multi-stage user prompt (``PromptTemplates.build_user_prompt``)."""
    sections = (("Context: ", context), ("API Documentation:\n", api_docs), ("Response Format: ", fmt))
    return "\n".join([f"Instructions: {instructions}", *(f"\n{head}{text}" for head, text in sections if text)])


def _request(name: str, inputs: object, fields: dict[str, bool]) -> dict[str, Any]:
    """``inputs`` checked as a request model: ``fields`` maps each field to whether it is required (a
    non-empty string); others are optional strings or null.

    Raises:
        StepFailure: located problems, one line.
    """
    if not isinstance(inputs, Mapping):
        why = f"service `{name}`: the inputs must be an object, got {json_type(inputs)}"
        raise StepFailure(why, ErrorCode.INVALID_SPEC)
    problems = [f"{k}: unknown field{did_you_mean(str(k), fields)}" for k in inputs if k not in fields]
    for key, required in fields.items():
        value = inputs.get(key)
        if value is None:
            if required:
                problems.append(f"{key}: is required")
        elif not isinstance(value, str):
            problems.append(f"{key}: expected a string, got {json_type(value)}")
        elif required and not value:
            problems.append(f"{key}: must not be empty")
    if problems:
        raise StepFailure(f"service `{name}`: " + "; ".join(problems), ErrorCode.INVALID_SPEC)
    return dict(inputs)


def http_spec(value: object, where: str) -> dict[str, Any]:
    """An ``HTTPRequestSpec`` checked and dumped as pydantic dumps it (every field, null when absent).

    Raises:
        ValueError: what is wrong, located under ``where``.
    """
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected an HTTPRequestSpec object, got {json_type(value)}")
    keys = ("method", "url", "headers", "query_params", "body")
    problems = [f"{where}.{k}: unknown field{did_you_mean(str(k), keys)}" for k in value if k not in keys]
    method, url = value.get("method"), value.get("url")
    if method not in METHODS:
        problems.append(f"{where}.method: expected one of {', '.join(METHODS)}, got {method!r}")
    if not isinstance(url, str) or not url:
        problems.append(f"{where}.url: a non-empty string is required")
    for key in ("headers", "query_params"):
        v = value.get(key)
        if v is not None and not (isinstance(v, Mapping) and all(isinstance(x, str) for x in v.values())):
            problems.append(f"{where}.{key}: expected an object of strings or null")
    body = value.get("body")
    if body is not None and not isinstance(body, (Mapping, str)):
        problems.append(f"{where}.body: expected an object, a string or null, got {json_type(body)}")
    if problems:
        raise ValueError("; ".join(problems))
    return {k: value.get(k) for k in keys}


def _check_spec(value: object) -> None:
    """The model's ``HTTPRequestSpec``, checked (a problem is sent back to it)."""
    http_spec(value, "the answer")


@dataclass
class Services:
    """What ``service`` steps run on.

    Attributes:
        models: the model presets.
        model: the preset prompt steps and the ``prompt`` services ask.
        workflow: the workflow (``mcpipe.workflow.Workflow``) the ``workflow`` service runs, or None.
        policy: where ``execute`` may send requests.
        timeout_s: an ``execute`` request's deadline.
        json_retries: how often a malformed ``prompt-mcp`` answer is sent back.
    """

    models: Models
    model: str
    workflow: Any
    policy: HttpPolicy
    timeout_s: float = 30.0
    json_retries: int = 2

    def known(self) -> list[str]:
        return [s for s in SERVICES if s != "workflow" or self.workflow is not None]

    async def run(self, name: str, inputs: object, ctx: ToolContext, key: str) -> dict[str, Any]:
        """Run service ``name`` (canonical) on ``inputs``; answers its response.

        Raises:
            StepFailure: the inputs are not its request, or its response says ``status: "error"`` (kept as
                the step's output).
        """
        response: dict[str, Any] = await getattr(self, "_" + name.replace("-", "_"))(inputs, ctx, key)
        if response.get("status") == "error":
            raise StepFailure(f"service `{name}`: {response.get('error')}", ErrorCode.TOOL_ERROR, output=response)
        return response

    async def ask(self, system: str, user: str, ctx: ToolContext, key: str, where: str = "", **json: Any) -> Outcome:
        """The model's answer (``json``: :func:`~mcpipe.models.converse`'s options of a JSON answer); a
        ``ModelError`` becomes the step's failure, ``where`` before its message."""
        try:
            return await converse(
                self.models.get(self.model), [Message.system(system), Message.user(user)], ctx, key=key, **json
            )
        except ModelError as e:
            raise StepFailure(f"{where}the model could not answer: {e}", ErrorCode.TOOL_FAILED) from None

    async def _prompt(self, inputs: object, ctx: ToolContext, key: str) -> dict[str, Any]:
        req = _request("prompt", inputs, {"instructions": True, "context": False, "response_format_prompt": False})
        user = user_prompt(req["instructions"], req.get("context"), fmt=req.get("response_format_prompt"))
        return {"content": (await self.ask(NORMAL_SYSTEM, user, ctx, key)).text, "type": "text"}

    async def _prompt_mcp(self, inputs: object, ctx: ToolContext, key: str) -> dict[str, Any]:
        req = _request("prompt-mcp", inputs, {"instructions": True, "api_docs": True, "response_format_prompt": False})
        user = user_prompt(req["instructions"], api_docs=req["api_docs"], fmt=req.get("response_format_prompt"))
        answer = {"json_schema": HTTP_SPEC_SCHEMA, "check": _check_spec, "json_retries": self.json_retries}
        out = await self.ask(_MCP_SYSTEM, user, ctx, key, "service `prompt-mcp`: ", **answer)
        return {"content": http_spec(out.data, "the answer"), "type": "http_spec"}

    async def _execute(self, inputs: object, ctx: ToolContext, key: str) -> dict[str, Any]:
        if not isinstance(inputs, Mapping) or set(inputs) != {"http_spec"}:
            keys = sorted(inputs) if isinstance(inputs, Mapping) else json_type(inputs)
            why = f"service `execute`: the inputs must be {{http_spec}}, got {keys}"
            raise StepFailure(why, ErrorCode.INVALID_SPEC)
        try:
            spec = http_spec(inputs["http_spec"], "http_spec")
        except ValueError as e:
            raise StepFailure(f"service `execute`: {e}", ErrorCode.INVALID_SPEC) from None
        return await self.send(spec, ctx, key)

    async def _prompt_execute(self, inputs: object, ctx: ToolContext, key: str) -> dict[str, Any]:
        made = await self._prompt_mcp(inputs, ctx, key)
        return await self.send(made["content"], ctx, key)

    async def _workflow(self, inputs: object, ctx: ToolContext, key: str) -> dict[str, Any]:
        from mcpipe.workflow import WorkflowRequest

        request, errors = WorkflowRequest.parse(inputs, self.workflow.config.max_instructions_chars)
        if request is None:
            raise StepFailure("service `workflow`: " + "; ".join(errors), ErrorCode.INVALID_SPEC)
        return await self.workflow.run(request, ctx)

    async def send(self, spec: dict[str, Any], ctx: ToolContext, key: str) -> dict[str, Any]:
        """``HTTPClientService.execute`` answered as ``/execute`` answers: ``{status, data, error}``; a 4xx is a
        success carrying it, a 5xx or a failed request an error (made once per step, even on a resume)."""

        async def work() -> dict[str, Any]:
            try:
                data = await self._send(spec)
            except (StepFailure, ForbiddenError, OSError) as e:
                return {"status": "error", "data": None, "error": str(e)}
            if data["status_code"] >= 500:
                error = f"Server error '{data['status_code']}' for url '{spec['url']}'"
                return {"status": "error", "data": None, "error": error}
            return {"status": "success", "data": data, "error": None}

        return await once(ctx, f"{key}~http", work)

    async def _send(self, spec: dict[str, Any]) -> dict[str, Any]:
        headers = dict(spec["headers"] or {})
        body = spec["body"]
        content = None
        if isinstance(body, Mapping):
            content = orjson.dumps(body)
            if "Content-Type" not in headers and "content-type" not in headers:
                headers["Content-Type"] = "application/json"
        elif isinstance(body, str):
            content = body.encode()
        try:
            httpx2.URL(spec["url"])
        except httpx2.InvalidURL as e:
            raise StepFailure(f"invalid URL: {e}") from None
        t0 = perf_counter()
        with trio.move_on_after(self.timeout_s) as scope:
            response = await send_request(
                self.policy,
                spec["method"],
                spec["url"],
                headers=headers,
                params=spec["query_params"] or None,
                content=content,
            )
        if scope.cancelled_caught:
            raise StepFailure(f"Request timed out after {self.timeout_s:g}s")
        parsed = response.decoded()[0] if response.status != 204 and response.body else None
        return {
            "status_code": response.status,
            "headers": response.header_map(),
            "body": parsed,
            "execution_time_ms": round((perf_counter() - t0) * 1000, 3),
        }
