"""The workflow (seed 002): instructions and tool ids in; the model picks a tool and writes its HTTP
request; the request runs; the model optionally formats the answer.

Stages, each named in ``error_stage`` when it fails: ``tool_retrieval`` (unknown ids), ``tool_context_generation``
(the tools' documentation for the model), ``llm_selection`` (the model's request, parsed and checked, retried
on malformed or off-tool answers), ``api_execution`` (the request could not be made: refused by the outbound
policy, unreachable), ``response_formatting`` (not fatal: the answer stays a success without
``formatted_response``). An API answering 4xx or 5xx is a success carrying that answer in ``raw_response``.

The model only chooses among the configured tools: its request must have the chosen tool's method, scheme,
host, port and path; static parameters are forced and secrets added by the server, then the request goes
through the outbound HTTP policy (only the tools' hosts, no private addresses unless allowed, the
connection pinned to the checked address).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from time import perf_counter
from typing import Any

import httpx2
import orjson
import trio

from mcpipe._describe import did_you_mean
from mcpipe._redact import credential_named, redact, redact_bytes
from mcpipe.kinds import ForbiddenError, HttpPolicy
from mcpipe.kinds.http import send_request
from mcpipe.models import Message, ModelError, Models, converse, once
from mcpipe.results import StepFailure
from mcpipe.tools import ToolContext
from mcpipe.workflow._config import HttpToolConfig, WorkflowConfig

__all__ = [
    "HTTP_SPEC_SCHEMA",
    "INPUT_SCHEMA",
    "MASK",
    "OUTPUT_SCHEMA",
    "STAGES",
    "Workflow",
    "WorkflowRequest",
    "tools_context",
]

MAX_TOOL_IDS = 100
"""The most tools one request may offer the model."""

STAGES = ("tool_retrieval", "tool_context_generation", "llm_selection", "api_execution", "response_formatting")
MASK = "***"

HTTP_SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "tool": {"type": "string", "description": "the name of the chosen tool"},
        "method": {"type": "string"},
        "url": {"type": "string", "description": "the chosen tool's endpoint, path parameters filled in"},
        "query_params": {"type": "object"},
        "body": {"type": ["object", "null"]},
    },
    "required": ["tool", "method", "url"],
}

_SELECT_SYSTEM = """You choose the one tool below that accomplishes the user's instructions and write its HTTP request.
Answer with only a JSON object: {"tool": "<tool name>", "method": "<HTTP method>", "url": "<the tool's endpoint>",
"query_params": {"<name>": "<value>"}, "body": <a JSON object, or null>}.
Use the chosen tool's own endpoint and method. Fill its required parameters from the instructions. Give static
parameters as shown. Leave [authenticated] parameters out: the server adds them.

"""

_FORMAT_SYSTEM = "You turn an API's raw answer into a short, clear answer for a person. Do not invent data."


@dataclass(frozen=True)
class WorkflowRequest:
    """A workflow call's input (the seed's ``WorkflowRequest``)."""

    user_instructions: str
    tool_ids: list[str]
    format_response: bool = False
    response_format_instructions: str | None = None

    @classmethod
    def parse(cls, args: object, max_chars: int) -> tuple[WorkflowRequest | None, list[str]]:
        """Check a call's arguments; answers the request or every problem, located (``tool_ids[1]: ...``)."""
        if not isinstance(args, Mapping):
            return None, ["the arguments must be an object"]
        errors = []
        known = {"user_instructions", "tool_ids", "format_response", "response_format_instructions"}
        errors += [f"{k}: unknown argument{did_you_mean(k, known)}" for k in args if k not in known]
        text = args.get("user_instructions")
        if not isinstance(text, str) or not text.strip():
            errors.append("user_instructions: a non-empty string is required")
        elif len(text) > max_chars:
            errors.append(f"user_instructions: longer than {max_chars} characters")
        ids = args.get("tool_ids")
        if not isinstance(ids, list) or not ids:
            errors.append("tool_ids: a non-empty array of tool names is required")
        elif len(ids) > MAX_TOOL_IDS:
            errors.append(f"tool_ids: at most {MAX_TOOL_IDS} tools, got {len(ids)}")
        else:
            errors += [f"tool_ids[{i}]: must be a string" for i, x in enumerate(ids) if not isinstance(x, str)]
        fmt = args.get("format_response", False)
        if not isinstance(fmt, bool):
            errors.append("format_response: must be a boolean")
        extra = args.get("response_format_instructions")
        if extra is not None and not isinstance(extra, str):
            errors.append("response_format_instructions: must be a string or null")
        if errors or not isinstance(text, str) or not isinstance(ids, list):
            return None, errors
        return cls(text, [str(i) for i in ids], fmt, extra), []


INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "user_instructions": {"type": "string", "minLength": 1, "description": "What to accomplish, in words."},
        "tool_ids": {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "description": "Tools to choose from.",
        },
        "format_response": {"type": "boolean", "default": False, "description": "Have the model format the answer."},
        "response_format_instructions": {"type": ["string", "null"], "description": "How to format it."},
    },
    "required": ["user_instructions", "tool_ids"],
    "additionalProperties": False,
}


OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "status": {"enum": ["success", "error"]},
        "selected_tool": {"type": ["string", "null"]},
        "http_spec": {"type": ["object", "null"]},
        "raw_response": {"type": ["object", "null"]},
        "formatted_response": {"type": ["string", "null"]},
        "error": {"type": ["string", "null"]},
        "error_stage": {"enum": [*STAGES, None]},
    },
    "required": ["status"],
}


@dataclass
class _Prepared:
    tool: HttpToolConfig
    method: str
    url: str
    query: dict[str, str]
    body: Any
    headers: dict[str, str]
    masked: dict[str, Any] = field(default_factory=dict)


def tools_context(tools: list[HttpToolConfig]) -> str:
    """The tools' documentation for the model, in the seed's format (secrets shown as ``[authenticated]``)."""
    lines = ["Available Tools:", ""]
    for tool in tools:
        lines.append(f"Tool: {tool.name}")
        lines.append(f"Description: {tool.description}")
        lines.append(f"Endpoint: {tool.method} {tool.endpoint}")
        where = "Body Fields" if tool.method in ("POST", "PUT", "PATCH") else "Parameters"
        if tool.required_params:
            lines.append(f"Required {where}:")
            lines += [f"  - {p.name} ({p.type}): {p.description}".rstrip(": ") for p in tool.required_params]
        if tool.optional_params:
            lines.append(f"Optional {where}:")
            lines += [f"  - {p.name} ({p.type}): {p.description}".rstrip(": ") for p in tool.optional_params]
        if tool.static_params or tool.authenticated_params:
            lines.append("Query Parameters:")
            lines += [f"  - {k}: {_text(v)} (static)" for k, v in tool.static_params.items()]
            lines += [f"  - {k}: [authenticated]" for k, a in tool.authenticated_params.items() if a.in_ == "query"]
        if tool.output_schema is not None:
            lines.append("Expected Output:")
            props = tool.output_schema.get("properties")
            if isinstance(props, Mapping):
                lines += [
                    f"  - {k} ({v.get('type', 'any') if isinstance(v, Mapping) else 'any'})" for k, v in props.items()
                ]
            else:
                lines.append("  " + orjson.dumps(tool.output_schema).decode())
        lines.append("")
    return "\n".join(lines)


def _text(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return v if isinstance(v, str) else orjson.dumps(v).decode()


def _answer(status: str, **fields: object) -> dict[str, Any]:
    out: dict[str, Any] = {
        "status": status,
        "selected_tool": None,
        "http_spec": None,
        "raw_response": None,
        "formatted_response": None,
        "error": None,
        "error_stage": None,
    }
    out.update(fields)
    return out


class Workflow:
    """The workflow over a config's tools and models.

    Args:
        config: the ``workflow`` section.
        models: the model presets (``sampling`` always there).
        environ: where authenticated parameters are read (default ``os.environ``, at each call).
        full_answers: tools whose answers are dumped whole, as piraeus's ``HTTPRequestSpec`` and
            ``HTTPResponseSpec`` are (every field, null when absent; the response's headers): piraeus's own
            tools (``mcpipe.formats.piraeus``).
    """

    def __init__(
        self,
        config: WorkflowConfig,
        models: Models,
        environ: Mapping[str, str] | None = None,
        full_answers: Iterable[str] = (),
    ) -> None:
        self.config = config
        self.models = models
        self.environ = environ
        self.full_answers = frozenset(full_answers)
        self.tools = {t.name: t for t in config.tools}
        self._patterns = {t.name: t.path_pattern() for t in config.tools}
        hosts = sorted({httpx2.URL(t.base_url).host for t in config.tools})
        self.policy = HttpPolicy(
            allowed_hosts=hosts,
            allow_private=config.allow_private,
            max_response_bytes=config.max_response_bytes,
            verify=config.verify,
            timeout_ms=config.timeout_ms,
            allow_hint="a workflow reaches only the hosts of its [[workflow.tools]] base_url",
        )

    async def run(self, request: WorkflowRequest, ctx: ToolContext) -> dict[str, Any]:
        """Run every stage; answers the seed's ``WorkflowResponse`` as a dict (never raises for a stage's
        failure: it is in ``error`` and ``error_stage``)."""
        missing = [i for i in dict.fromkeys(request.tool_ids) if i not in self.tools]
        if missing:
            hints = "".join(did_you_mean(m, self.tools) for m in missing[:1])
            more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
            listed = [m[:100] for m in missing[:10]]
            return _answer(
                "error", error=f"Tools not found in registry: {listed}{more}{hints}", error_stage="tool_retrieval"
            )
        tools = [self.tools[i] for i in dict.fromkeys(request.tool_ids)]
        context = tools_context(tools)
        if len(context) > self.config.max_context_chars:
            return _answer(
                "error",
                error=f"the tools' documentation is {len(context)} characters, more than the "
                f"{self.config.max_context_chars} allowed (workflow.max_context_chars): ask with fewer tools",
                error_stage="tool_context_generation",
            )
        total = 4 if request.format_response else 3
        await _progress(ctx, 1, total, f"{len(tools)} tool(s) documented for the model")
        try:
            prepared = await self._select(request, tools, context, ctx)
        except ModelError as e:
            return _answer("error", error=str(e), error_stage="llm_selection")
        spec = self._spec(prepared)
        await _progress(ctx, 2, total, f"the model chose {prepared.tool.name}")
        try:
            raw = await once(ctx, "api", lambda: self._execute(prepared))
        except (StepFailure, ForbiddenError, OSError) as e:
            return _answer(
                "error", selected_tool=prepared.tool.name, http_spec=spec, error=str(e), error_stage="api_execution"
            )
        await _progress(ctx, 3, total, f"the API answered HTTP {raw['status_code']}")
        result = _answer("success", selected_tool=prepared.tool.name, http_spec=spec, raw_response=raw)
        if request.format_response:
            try:
                result["formatted_response"] = await self._format(request, raw, ctx)
            except ModelError as e:
                result["error"] = f"the answer could not be formatted: {e}"
                result["error_stage"] = "response_formatting"
            await _progress(ctx, 4, total, "formatted" if result["error"] is None else "not formatted")
        return result

    async def _select(
        self, request: WorkflowRequest, tools: list[HttpToolConfig], context: str, ctx: ToolContext
    ) -> _Prepared:
        chosen: list[_Prepared] = []

        def check(spec: object) -> None:
            chosen.append(self._prepare(spec, tools))

        model = self.models.get(self.config.model)
        cfg = getattr(model, "config", None)
        await converse(
            model,
            [Message.system(_SELECT_SYSTEM + context), Message.user(request.user_instructions)],
            ctx,
            key="select",
            json_schema=HTTP_SPEC_SCHEMA,
            check=check,
            json_retries=cfg.json_retries if cfg is not None else 2,
        )
        return chosen[-1]

    def _prepare(self, spec: Any, tools: list[HttpToolConfig]) -> _Prepared:
        """Check the model's request against the tools; raises ValueError (sent back to the model)."""
        url_text = spec.get("url")
        try:
            url = httpx2.URL(url_text)
        except (httpx2.InvalidURL, TypeError) as e:
            raise ValueError(f"`url` is not a valid URL ({e})") from None
        if url.userinfo or url.fragment:
            raise ValueError("`url` must not carry credentials or a fragment")
        named = spec.get("tool")
        if named not in self.tools or self.tools[named] not in tools:
            offered = ", ".join(t.name for t in tools)
            raise ValueError(f"`tool` must be one of the offered tools ({offered}), got {named!r}")
        tool = self.tools[named]
        base = httpx2.URL(tool.base_url)
        same_origin = (url.scheme, url.host, url.port or _default_port(url.scheme)) == (
            base.scheme,
            base.host,
            base.port or _default_port(base.scheme),
        )
        matched = self._patterns[tool.name].match(url.path)
        if not same_origin or matched is None:
            raise ValueError(f"`url` must be the endpoint of tool '{tool.name}': {tool.endpoint}")
        for name, value in zip(tool.path_names(), matched.groups(), strict=True):
            if value in (".", "..") or "\\" in value or _ENCODED_SEPARATOR.search(value):
                raise ValueError(
                    f"path parameter `{name}` of tool '{tool.name}' must be one segment, not {value!r} (a dot "
                    "segment, or an encoded slash, backslash or dot, would reach another path of the API)"
                )
        method = str(spec.get("method", "")).upper()
        if method != tool.method:
            raise ValueError(f"tool '{tool.name}' is called with {tool.method}, not {method or 'no method'}")
        query_in = spec.get("query_params") or {}
        if not isinstance(query_in, Mapping):
            raise ValueError("`query_params` must be an object")
        query: dict[str, str] = {k: v for k, v in url.params.multi_items()}
        for k, v in query_in.items():
            if isinstance(v, (dict, list)) or v is None:
                raise ValueError(f"query parameter `{k}` must be a string, number or boolean")
            query[str(k)] = _text(v)
        body = spec.get("body")
        if body is not None and tool.method in ("GET", "DELETE"):
            raise ValueError(f"a {tool.method} request has no body")
        if body is not None and not isinstance(body, Mapping):
            raise ValueError("`body` must be an object or null")
        filled = set(query) | (set(body) if isinstance(body, Mapping) else set())
        lacking = [p.name for p in tool.required_params if p.name not in filled and "{" + p.name + "}" not in tool.path]
        if lacking:
            raise ValueError(f"required parameters of '{tool.name}' are missing: {', '.join(lacking)}")
        for k in tool.authenticated_params:
            query.pop(k, None)  # the model never sets a secret
        query.update({k: _text(v) for k, v in tool.static_params.items()})
        return _Prepared(tool, method, str(url.copy_with(query=None)), query, body, dict(tool.headers))

    def _spec(self, p: _Prepared) -> dict[str, Any]:
        """The request as the caller sees it: authenticated values masked."""
        query = dict(p.query)
        headers = dict(p.headers)
        for k, a in p.tool.authenticated_params.items():
            (query if a.in_ == "query" else headers)[k] = MASK
        if p.tool.name in self.full_answers:
            return {
                "method": p.method,
                "url": p.url,
                "headers": headers or None,
                "query_params": query or None,
                "body": p.body,
            }
        spec: dict[str, Any] = {"method": p.method, "url": p.url, "query_params": query}
        if headers:
            spec["headers"] = headers
        if p.body is not None:
            spec["body"] = p.body
        return spec

    async def _execute(self, p: _Prepared) -> dict[str, Any]:
        environ = os.environ if self.environ is None else self.environ
        query = dict(p.query)
        headers = dict(p.headers)
        secrets = credential_named(headers)
        for k, a in p.tool.authenticated_params.items():
            secret = environ.get(a.env)
            if not secret:
                raise StepFailure(f"the secret of `{k}` is not set (environment variable {a.env})")
            secrets += [a.prefix + secret, secret]
            if a.in_ == "query":
                query[k] = a.prefix + secret
            else:
                headers[k] = a.prefix + secret
        content = None
        if p.body is not None:
            content = orjson.dumps(p.body)
            headers.setdefault("content-type", "application/json")
        headers.setdefault("accept", "application/json")
        t0 = perf_counter()
        with trio.move_on_after(self.config.timeout_ms / 1000) as scope:
            response = await send_request(self.policy, p.method, p.url, headers=headers, params=query, content=content)
        if scope.cancelled_caught:
            raise StepFailure(f"the API did not answer within {self.config.timeout_ms:g} ms")
        elapsed = round((perf_counter() - t0) * 1000, 3)
        # An API's answer (its errors most of all) may echo the secret it was sent: neither the caller nor the
        # formatting model sees it.
        response = replace(response, body=redact_bytes(response.body, secrets))
        if p.tool.name in self.full_answers:
            # piraeus's HTTPClientService: no body for a 204 or an empty answer; the headers kept.
            body = None if response.status == 204 or not response.body else response.decoded()[0]
            headers_out = {k: redact(v, secrets) for k, v in response.header_map().items()}
            return {
                "status_code": response.status,
                "headers": headers_out,
                "body": body,
                "execution_time_ms": elapsed,
            }
        body, _ = response.decoded()
        return {"status_code": response.status, "body": body, "execution_time_ms": elapsed}

    async def _format(self, request: WorkflowRequest, raw: Mapping[str, object], ctx: ToolContext) -> str:
        model = self.models.get(self.config.format_model or self.config.model)
        how = request.response_format_instructions or "Answer in one or two sentences."
        data = orjson.dumps(raw["body"]).decode()
        limit = self.config.max_context_chars
        if len(data) > limit:
            data = data[:limit] + " [truncated]"
        prompt = (
            f"The user asked: {request.user_instructions}\n\n"
            f"The API answered (HTTP {raw['status_code']}):\n{data}\n\n{how}"
        )
        out = await converse(model, [Message.system(_FORMAT_SYSTEM), Message.user(prompt)], ctx, key="format")
        if not out.text.strip():
            raise ModelError("the model's answer is empty")
        return out.text


async def _progress(ctx: ToolContext, n: int, total: int, message: str) -> None:
    """A stage done, as a progress notification when the caller asked for progress."""
    if ctx.has_progress:
        await ctx.report_progress(n, total, message)


_ENCODED_SEPARATOR = re.compile(r"%(2e|2f|5c)", re.IGNORECASE)
"""A percent-encoded dot, slash or backslash left in a path parameter once decoded (encoded twice)."""


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80
