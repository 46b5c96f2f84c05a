"""A piraeus ``ToolConfig`` served as an MCP tool: its mapping applied both ways, as ``GenericApiTool`` does.

A call runs piraeus's ``ToolExecutor`` then ``GenericApiTool.execute`` (``core/executor.py``,
``factory/api_tool.py``):

1. the arguments are checked against ``input_schema`` (its ``properties`` and ``required``, each property's
   ``type`` converted as pydantic's lax mode does; undeclared arguments are dropped);
2. the request: ``api.base_url`` and ``api.path`` joined by one ``/``; the query is ``api.params``, then the
   credential (``api_key_query``: ``key_name`` or ``apikey``), then each ``mapping.input_to_params`` field
   (``str()`` of its value); the headers are ``api.headers`` and the credential (``api_key_header``:
   ``key_name`` or ``X-API-Key``; ``bearer``: ``Authorization: Bearer``); the JSON body is the
   ``mapping.input_to_body`` fields (none when none is given; never for GET and DELETE);
3. a status other than 2xx fails the call; the body is read as JSON;
4. the output: the value at ``mapping.response_path`` (keys joined by dots), then each
   ``mapping.response_to_output`` field read there (a dotted path), converted to the output schema's
   ``number`` or ``integer`` when it says so; fields that are absent are left out.

Secrets (``auth.secret_ref``): ``${NAME}`` is read at each call from ``[piraeus] secrets``, then from the
environment; any other value is the secret itself. The request goes through the outbound HTTP policy (only
the loaded tools' hosts; private addresses only with ``allow_private`` or an IP literal host).
"""

from __future__ import annotations

import os
from collections import ChainMap
from collections.abc import Mapping
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import orjson
import trio

from mcpipe._describe import json_type
from mcpipe._redact import credential_named, redact
from mcpipe.formats.piraeus._model import ToolConfig
from mcpipe.formats.piraeus._read import coerce
from mcpipe.kinds import HttpPolicy
from mcpipe.kinds.http import send_request
from mcpipe.models import schema_errors
from mcpipe.results import StepFailure
from mcpipe.tools import ToolContext, ToolResult

__all__ = ["ApiTool", "Secrets", "build_request", "check_inputs", "read_path", "transform"]


class Secrets(ChainMap[str, str]):
    """Where ``${NAME}`` secrets are read: ``[piraeus] secrets`` first, then the environment (at each read).

    It is also the ``environ`` of the workflow serving piraeus's tools: a literal ``secret_ref`` is kept
    under a name of its own (``literal``), so the workflow reads every secret the same way.
    """

    def __init__(self, table: Mapping[str, str] | None = None) -> None:
        super().__init__({}, dict(table or {}), os.environ)  # the literals first

    def literal(self, tool: str, value: str) -> str:
        """The name a literal secret of ``tool`` is read under."""
        key = f"piraeus:{tool}"
        self[key] = value
        return key

    def secret(self, config: ToolConfig) -> str:
        """The secret of ``config``'s ``auth``.

        Raises:
            StepFailure: a ``${NAME}`` that is set nowhere (piraeus would send an empty credential).
        """
        auth = config.api.auth
        name = auth.secret_name
        if name is None:
            return auth.secret_ref or ""
        value = self.get(name)
        if not value:
            raise StepFailure(
                f"the secret `{name}` of tool '{config.name}' is not set ([piraeus] secrets or the environment)"
            )
        return value


def _json_type(prop: object) -> str:
    """The type piraeus's executor validates a property as (``_json_type_to_python``): its ``type``, string
    when absent or unknown; a list's first type other than ``null``."""
    kind = prop.get("type", "string") if isinstance(prop, Mapping) else "string"
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    return kind if kind in ("string", "integer", "number", "boolean", "array", "object") else "string"


def check_inputs(schema: Mapping[str, Any], args: Mapping[str, object]) -> tuple[dict[str, Any], list[str]]:
    """The arguments as piraeus's executor validates them (``_validate_inputs``): with ``properties``, only
    the declared ones, each converted to its type, the required ones present; without, as they are.
    Answers ``(arguments, problems)``."""
    props = schema.get("properties")
    if not isinstance(props, Mapping):
        return dict(args), []
    required = schema.get("required") or []
    out: dict[str, Any] = {}
    problems: list[str] = []
    for name, prop in props.items():
        if name not in args:
            if name in required:
                problems.append(f"{name}: field required")
            continue
        value, why = coerce(args[name], _json_type(prop))
        if why is not None:
            problems.append(f"{name}: {why}")
        else:
            out[name] = value
    return out, problems


@dataclass(frozen=True, slots=True)
class Request:
    """The HTTP request of one call (secrets included: never shown)."""

    method: str
    url: str
    headers: dict[str, str]
    params: dict[str, str]
    body: dict[str, Any] | None
    secrets: tuple[str, ...] = ()
    """What an answer must not show back: the credential, and configured headers that look like one."""


def build_request(config: ToolConfig, args: Mapping[str, object], secret: str) -> Request:
    """``GenericApiTool``'s request for the checked ``args`` (``_build_url``, ``_build_headers``,
    ``_build_params``, ``_build_body``)."""
    api = config.api
    headers = dict(api.headers)
    params = dict(api.params)
    where = api.auth.where
    if where is not None:
        place, key, prefix = where
        (params if place == "query" else headers)[key] = prefix + secret
    for field_name, param in config.mapping.input_to_params.items():
        if field_name in args:
            params[param] = str(args[field_name])
    body: dict[str, Any] | None = {b: args[f] for f, b in config.mapping.input_to_body.items() if f in args} or None
    if api.method in ("GET", "DELETE"):
        body = None
    secrets = [secret, *credential_named(api.headers), *credential_named(api.params)]
    return Request(api.method, api.url, headers, params, body, tuple(x for x in secrets if x))


def _convert(value: Any, target: object) -> Any:
    """``GenericApiTool._convert_type``: ``number`` -> float, ``integer`` -> int (through float); a value that
    does not convert stays as it is."""
    try:
        if target == "number":
            return float(value)
        if target == "integer":
            return int(float(value))
    except (TypeError, ValueError, OverflowError):
        return value
    return value


def read_path(value: object, path: str) -> Any:
    """The value at a dotted ``path`` (``GenericApiTool``'s nested fields), or None. A key holding dots is
    read whole first (``01. symbol``, as Alpha Vantage names its fields), then split at each dot in turn:
    piraeus splits at every dot, so its own example's ``"05. price"`` never resolves there."""
    if not isinstance(value, dict):
        return None
    if path in value:
        return value[path]
    start = 0
    while (dot := path.find(".", start)) != -1:
        head = path[:dot]
        if head in value:
            found = read_path(value[head], path[dot + 1 :])
            if found is not None:
                return found
        start = dot + 1
    return None


def transform(config: ToolConfig, data: object) -> dict[str, Any]:
    """``GenericApiTool._transform_response``: the mapped output of the API's JSON answer.

    Raises:
        StepFailure: ``response_path`` crosses a value that is not an object (piraeus fails the call too).
    """
    m = config.mapping
    if m.response_path:
        if not isinstance(data, dict):
            raise StepFailure(
                f"Execution error: response_path `{m.response_path}`: the answer is {json_type(data)}, not an object"
            )
        found = read_path(data, m.response_path)
        data = {} if found is None else found  # piraeus: a missing key reads as an empty object
    props = config.output_schema.get("properties") or {}  # _schema refused one that is not an object
    out: dict[str, Any] = {}
    for field_name, source in m.response_to_output.items():
        value = read_path(data, source)
        if value is not None:
            target = props.get(field_name)
            out[field_name] = _convert(value, target.get("type") if isinstance(target, Mapping) else None)
    return out


class ApiTool:
    """One ``ToolConfig`` as an MCP tool: ``inputSchema`` its ``input_schema``, ``outputSchema`` its
    ``output_schema`` (when it describes an object), the answer its mapped output."""

    def __init__(self, config: ToolConfig, secrets: Secrets, policy: HttpPolicy) -> None:
        self.config = config
        self.secrets = secrets
        self.policy = policy
        self.name = config.name
        self.title: str | None = None
        self.description = config.description
        self.input_schema = {"type": "object", **config.input_schema}
        out = config.output_schema
        self.output_schema: dict[str, Any] | None = out if out.get("type") == "object" else None
        self.annotations: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"<piraeus tool {self.name}>"

    async def call(self, args: Mapping[str, object], ctx: ToolContext) -> ToolResult:
        """Run the tool; a failure is an error result (``Input validation error: ...``, ``Execution error:
        ...``, as piraeus's ``ToolResult.error`` words them)."""
        if not isinstance(args, Mapping):
            return ToolResult.error(f"Input validation error: the arguments must be an object, got {json_type(args)}")
        checked, problems = check_inputs(self.config.input_schema, args)
        if problems:
            return ToolResult.error("Input validation error: " + "; ".join(problems))
        try:
            output = await self.run(checked)
        except StepFailure as e:
            return ToolResult.error(str(e))
        return ToolResult([{"type": "text", "text": orjson.dumps(output).decode()}], output)

    async def run(self, args: Mapping[str, object]) -> dict[str, Any]:
        """Send the request for checked ``args`` and answer the mapped output.

        Raises:
            StepFailure: the request could not be made, the API answered other than 2xx or not JSON, or the
                output does not match the output schema.
        """
        config = self.config
        request = build_request(config, args, self.secrets.secret(config) if config.api.auth.where else "")
        headers = dict(request.headers)
        content = None
        if request.body is not None:
            content = orjson.dumps(request.body)
            headers.setdefault("content-type", "application/json")
        t0 = perf_counter()
        with trio.move_on_after(config.api.timeout) as scope:
            response = await send_request(
                self.policy, request.method, request.url, headers=headers, params=request.params, content=content
            )
        if scope.cancelled_caught:
            raise StepFailure(
                f"Execution error: {request.method} {request.url} did not answer within {config.api.timeout:g} s"
            )
        raw = response.body
        if not 200 <= response.status < 300:
            # An API's error often echoes the credential it was sent: redacted (the whole body, then cut).
            excerpt = redact(raw.decode("utf-8", "replace"), request.secrets)[:200]
            raise StepFailure(
                f"Execution error: {request.method} {request.url} answered HTTP {response.status}: {excerpt}",
                output={"status_code": response.status, "duration_ms": round((perf_counter() - t0) * 1000, 3)},
            )
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise StepFailure(f"Execution error: {request.method} {request.url} answered no JSON ({e})") from None
        output = transform(config, data)
        why = schema_errors(output, self.output_schema) if self.output_schema is not None else None
        if why is not None:
            raise StepFailure(f"Execution error: the mapped output does not match output_schema ({why})", output=output)
        return output
