"""One operation served as a tool: its arguments checked against its input schema, written into the request
the document describes (path, query, headers, cookies, body; the security scheme's secret), sent through
the outbound HTTP policy, and the response's JSON answered as structured content (the status and the body
kept when the API refuses).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import httpx2
import orjson
import trio

from mcpipe._jsonschema import validator
from mcpipe._util import read_capped
from mcpipe.access import CredentialError, Credentials, oauth_bearer
from mcpipe.errors import ErrorCode
from mcpipe.kinds import ForbiddenError, HttpPolicy
from mcpipe.kinds.http import guarded_client
from mcpipe.openapi._config import OpenApiAuth
from mcpipe.openapi._operations import Operation, Param, SecurityScheme
from mcpipe.tools import ToolContext, ToolResult

__all__ = ["Api", "OpenApiTool"]


@dataclass(slots=True)
class Api:
    """What every tool of one document shares: where the API is, how it is reached, what it presents."""

    name: str
    base_url: str | None
    policy: HttpPolicy
    credentials: Credentials
    auth: dict[str, OpenApiAuth]
    schemes: dict[str, SecurityScheme | str]
    headers: dict[str, str] = field(default_factory=dict)
    answer: str = "body"
    max_description: int = 2000


def _annotations(method: str) -> dict[str, Any]:
    read_only = method in ("GET", "HEAD", "OPTIONS")
    return {
        "readOnlyHint": read_only,
        "destructiveHint": method == "DELETE",
        "idempotentHint": read_only or method in ("PUT", "DELETE"),
        "openWorldHint": True,
    }


class OpenApiTool:
    """An operation of an OpenAPI document as a tool (``docs/openapi.md``)."""

    output_schema: dict[str, Any] | None = None

    def __init__(self, op: Operation, api: Api) -> None:
        self.op = op
        self.api = api
        self.name = op.tool
        self.title = op.summary[:200] or None
        text = "\n\n".join(t for t in (op.summary, op.description) if t and t != "") or f"{op.method} {op.path}"
        if op.summary and op.description.startswith(op.summary):
            text = op.description
        cut = api.max_description
        self.description = text if len(text) <= cut else text[: cut - 1].rstrip() + "…"
        self.input_schema = op.input_schema
        self.annotations = _annotations(op.method)
        self._validator: Any = None
        self._security = _security(op, api)

    @property
    def base_url(self) -> str | None:
        return self.api.base_url or (self.op.servers[0] if self.op.servers else None)

    def check(self, args: object) -> list[str]:
        """Every way ``args`` breaks the input schema, located (``args.petId: 'x' is not of type 'integer'``)."""
        if self._validator is None:
            self._validator = validator(self.input_schema)
        errors = sorted(self._validator.iter_errors(args), key=lambda e: (list(map(str, e.absolute_path)), e.message))
        return [f"{_path(e.absolute_path)}: {e.message}" for e in errors]

    async def call(self, args: Mapping[str, object], ctx: ToolContext) -> ToolResult:
        problems = self.check(args)
        if problems:
            return ToolResult.error(f"{ErrorCode.INVALID_SPEC}: " + "; ".join(problems[:10]))
        base = self.base_url
        if base is None:
            return ToolResult.error(f"{ErrorCode.TOOL_FAILED}: {self.name}: the document names no server: set base_url")
        try:
            request = await self._request(base, args, ctx)
        except CredentialError as exc:
            return ToolResult.error(f"{ErrorCode.TOOL_FAILED}: {self.name}: {exc}")
        ms = self.api.policy.timeout_ms
        if ms is None:
            return await self._send(request)
        with trio.move_on_after(ms / 1000):
            return await self._send(request)
        return ToolResult.error(f"{ErrorCode.TIMEOUT}: {self.name}: no answer within {ms:g} ms")

    async def _request(self, base: str, args: Mapping[str, object], ctx: ToolContext) -> _Request:
        op = self.op
        path = op.path
        query: list[tuple[str, str]] = []
        headers: dict[str, str] = dict(self.api.headers)
        cookies: list[tuple[str, str]] = []
        for p in op.params:
            if p.arg not in args or args[p.arg] is None:
                continue
            value = args[p.arg]
            if p.location == "path":
                path = path.replace("{" + p.name + "}", _path_value(p, value))
            elif p.location == "query":
                query.extend(_query_pairs(p, value))
            elif p.location == "header":
                headers[p.name] = _simple(p, value)
            else:
                cookies.append((p.name, _simple(p, value)))
        for scheme, auth in self._security:
            secret = await self._secret(scheme, auth, ctx)
            if scheme.kind == "bearer":
                headers["Authorization"] = secret if " " in secret else f"Bearer {secret}"
            elif scheme.kind == "basic":
                token = base64.b64encode(secret.encode()).decode() if ":" in secret else secret
                headers["Authorization"] = f"Basic {token}"
            elif scheme.location == "header":
                headers[scheme.param] = secret
            elif scheme.location == "query":
                query.append((scheme.param, secret))
            else:
                cookies.append((scheme.param, secret))
        if cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies)
        content: bytes | None = None
        files: dict[str, Any] | None = None
        data: dict[str, Any] | None = None
        body = op.body
        if body is not None:
            value = {f: args[f] for f in body.fields if f in args} if body.fields else args.get(body.arg)
            if value is not None:
                if body.encoding == "json":
                    content = orjson.dumps(value)
                    headers["Content-Type"] = body.media if "json" in body.media else "application/json"
                elif body.encoding == "form":
                    content = urlencode(_form_pairs(value, body.styles)).encode()
                    headers["Content-Type"] = "application/x-www-form-urlencoded"
                elif body.encoding == "multipart":
                    data = {k: _text(v) for k, v in (value.items() if isinstance(value, dict) else ())}
                    files = {k: (k, data.pop(k).encode()) for k in list(data) if _is_file(op, k)}
                else:
                    content = (value if isinstance(value, str) else orjson.dumps(value).decode()).encode()
                    headers["Content-Type"] = body.media
        url = base.rstrip("/") + path
        return _Request(op.method, url, query, headers, content, data, files)

    async def _secret(self, scheme: SecurityScheme, auth: OpenApiAuth, ctx: ToolContext) -> str:
        if auth.forward_bearer:
            identity = ctx.identity
            token = getattr(identity, "token", None) if identity is not None else None
            if not token:
                raise CredentialError(
                    f"security scheme `{scheme.name}` forwards the caller's bearer token: it has none"
                )
            if oauth_bearer(identity):  # minted for mcpipe: never passed through (the MCP authorization spec)
                raise CredentialError(
                    f"security scheme `{scheme.name}` would pass the caller's OAuth access token through (tokens are "
                    "for mcpipe alone): give it a `token_exchange` credential instead"
                )
            return str(token)
        assert auth.credential is not None
        issued = await self.api.credentials.issue(auth.credential, ctx.identity)
        return issued.token if scheme.kind != "bearer" else issued.authorization()

    async def _send(self, r: _Request) -> ToolResult:
        policy = self.api.policy
        limit = policy.max_response_bytes
        where = f"{r.method} {_safe(r.url)}"
        try:
            async with guarded_client(policy) as client:
                request = client.build_request(
                    r.method,
                    r.url,
                    params=httpx2.QueryParams(tuple(r.query)) if r.query else None,
                    headers=r.headers,
                    content=r.content,
                    data=r.data,
                    files=r.files,
                )
                response = await client.send(request, stream=True)
                try:
                    raw, larger = await read_capped(response, limit)
                finally:
                    await response.aclose()
        except ForbiddenError as exc:
            return ToolResult.error(f"{ErrorCode.FORBIDDEN}: {self.name}: {exc}")
        except (httpx2.HTTPError, OSError) as exc:
            return ToolResult.error(
                f"{ErrorCode.TOOL_FAILED}: {self.name}: {where} failed: {type(exc).__name__}: {exc}"
            )
        except Exception as exc:  # httpcore's own errors (the guarded transport drives httpcore)
            if type(exc).__module__.startswith("httpcore"):
                return ToolResult.error(
                    f"{ErrorCode.TOOL_FAILED}: {self.name}: {where} failed: {type(exc).__name__}: {exc}"
                )
            raise
        if larger:
            return ToolResult.error(
                f"{ErrorCode.TOOL_FAILED}: {self.name}: the response body is larger than {limit} bytes"
            )
        body, text = _decode(response, raw)
        status = response.status_code
        ok = 200 <= status < 300
        if self.api.answer == "full" or not ok:
            structured: Any = {"status": status, "body": body}
            if self.api.answer == "full":
                structured["headers"] = {k.lower(): v for k, v in response.headers.items()}
        else:
            structured = body
        if not ok:
            return ToolResult([{"type": "text", "text": f"HTTP {status} from {where}: {text}"}], structured, True)
        if structured is None:
            return ToolResult.text(text or f"HTTP {status}")
        return ToolResult([{"type": "text", "text": text}], structured, False, any_json=True)


@dataclass(slots=True)
class _Request:
    method: str
    url: str
    query: list[tuple[str, str]]
    headers: dict[str, str]
    content: bytes | None
    data: dict[str, Any] | None
    files: dict[str, Any] | None


def _security(op: Operation, api: Api) -> list[tuple[SecurityScheme, OpenApiAuth]]:
    """The first of the operation's security alternatives the config can satisfy (none needed: empty)."""
    if not op.security:
        return []
    for requirement in op.security:
        chosen: list[tuple[SecurityScheme, OpenApiAuth]] = []
        for name in requirement:
            scheme, auth = api.schemes.get(name), api.auth.get(name)
            if not isinstance(scheme, SecurityScheme) or auth is None:
                break
            chosen.append((scheme, auth))
        else:
            return chosen
    return []


def _path(parts: Any) -> str:
    out = "args"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _text(v: object) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return str(v)
    return orjson.dumps(v).decode()


def _simple(p: Param, value: object) -> str:
    """``style: simple`` (headers, cookies): arrays comma-joined, objects ``k,v`` (``k=v`` exploded)."""
    if p.as_json:
        return orjson.dumps(value).decode()
    if isinstance(value, list):
        return ",".join(_text(v) for v in value)
    if isinstance(value, dict):
        return ",".join(f"{k}={_text(v)}" if p.explode else f"{k},{_text(v)}" for k, v in value.items())
    return _text(value)


def _path_value(p: Param, value: object) -> str:
    if p.as_json:
        return quote(orjson.dumps(value).decode(), safe="")
    if isinstance(value, list):
        text = ",".join(quote(_text(v), safe="") for v in value)
    elif isinstance(value, dict):
        sep = "=" if p.explode else ","
        text = ",".join(f"{quote(str(k), safe='')}{sep}{quote(_text(v), safe='')}" for k, v in value.items())
    else:
        text = quote(_text(value), safe="")
    if p.style == "label":
        return "." + text
    if p.style == "matrix":
        return f";{p.name}={text}"
    return text


_DELIMITERS = {"spaceDelimited": " ", "pipeDelimited": "|", "tabDelimited": "\t"}


def _query_pairs(p: Param, value: object) -> list[tuple[str, str]]:
    if p.as_json:
        return [(p.name, orjson.dumps(value).decode())]
    if isinstance(value, list):
        if p.style in _DELIMITERS:
            return [(p.name, _DELIMITERS[p.style].join(_text(v) for v in value))]
        if p.explode:
            return [(p.name, _text(v)) for v in value]
        return [(p.name, ",".join(_text(v) for v in value))]
    if isinstance(value, dict):
        if p.style == "deepObject":
            return _deep(p.name, value)
        if p.explode:
            return [(str(k), _text(v)) for k, v in value.items()]
        return [(p.name, ",".join(f"{k},{_text(v)}" for k, v in value.items()))]
    return [(p.name, _text(value))]


def _deep(prefix: str, value: object) -> list[tuple[str, str]]:
    """``deepObject``: ``a[b][c]=v``; arrays as ``a[0]=v`` (as Stripe's API and its libraries write them)."""
    if isinstance(value, dict):
        return [pair for k, v in value.items() for pair in _deep(f"{prefix}[{k}]", v)]
    if isinstance(value, list):
        return [pair for i, v in enumerate(value) for pair in _deep(f"{prefix}[{i}]", v)]
    return [(prefix, _text(value))]


def _form_pairs(value: object, styles: dict[str, tuple[str, bool]]) -> list[tuple[str, str]]:
    """A form body: each property as its ``encoding`` says (``form``, exploded, by default; nested objects and
    arrays of a ``deepObject`` property bracketed)."""
    if not isinstance(value, dict):
        return [("value", _text(value))]
    pairs: list[tuple[str, str]] = []
    for k, v in value.items():
        if v is None:
            continue
        style, explode = styles.get(k, ("form", True))
        if style == "deepObject" and isinstance(v, dict | list):
            pairs.extend(_deep(k, v))
        elif isinstance(v, list):
            pairs.extend([(k, _text(i)) for i in v] if explode else [(k, ",".join(_text(i) for i in v))])
        elif isinstance(v, dict):
            pairs.extend(_deep(k, v))
        else:
            pairs.append((k, _text(v)))
    return pairs


def _is_file(op: Operation, arg: str) -> bool:
    schema = op.input_schema.get("properties", {}).get(arg, {})
    return isinstance(schema, dict) and schema.get("format") == "binary"


def _decode(response: httpx2.Response, raw: bytes) -> tuple[Any, str]:
    """The body as JSON when it is JSON (None when empty), else as text; and its text."""
    if not raw:
        return None, ""
    text = raw.decode(response.charset_encoding or "utf-8", errors="replace")
    ctype = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if ctype.endswith("json") or ctype.endswith("+json") or raw[:1] in (b"{", b"["):
        try:
            return orjson.loads(raw), text
        except orjson.JSONDecodeError:
            pass
    return text, text


def _safe(url: str) -> str:
    return url.split("?", 1)[0]
