"""mcpg's backends as step kinds: each answers what mcpg's binding answers (its ``CallToolResult``).

mcpg runs a binding's backend and projects the backend plugin's reply onto ``tools/call``
(``src/runtime/execution/mod.rs``): the reply's bytes are the one text block, its JSON (when it parses) the
``structuredContent``, and ``isError`` is whether its ``downstreamError`` is set; a backend failure is
``"<kind> request failed: <error>"``; the mock backend answers a whole result verbatim. The kinds here
produce those same results from mcpipe's own clients (its guarded HTTP client, NATS, Kafka, SQL, a
subprocess), reading the envelopes from the plugins' sources (``mcpg-plugin-backend-*``).

Each kind has ``answer``: ``result`` (a binding: the output is the whole ``CallToolResult``, answered as it
is by the ``mcpg.binding`` shape) or ``step`` (a pipeline step: an error result fails the step with its
first text, else the output is its ``structuredContent``, as mcpg's ``StepOutcome::from_tool_result``).

Templated fields (``url``, ``headers``, ``args``) are mcpg ``${…}`` strings (:mod:`._templates`), evaluated
with mcpg's variables: ``arguments`` is the step's input (the call's arguments, or its ``input_transform``).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import httpx2
import msgspec
import orjson
import trio

from mcpipe._struct import Strict
from mcpipe._url import UrlRefused, check_templated_url, encode_from, url_component
from mcpipe._util import RunLimiter
from mcpipe.access import CredentialError, Credentials
from mcpipe.backends import Connections, NotRunning
from mcpipe.errors import ErrorCode
from mcpipe.expr import CelExpr, ExpressionError, expression_timeout_ms
from mcpipe.formats.mcpg import _serde_json as serde_json
from mcpipe.formats.mcpg._templates import (
    McpgTemplate,
    caller_context,
    cel_env,
    compile_mcpg_cel,
    mcpg_steps,
    request_context,
)
from mcpipe.kinds import KINDS, Build, CommandPolicy, ForbiddenError, HttpPolicy, Kind, StepFields
from mcpipe.kinds.command import ProcessRun, run_captured
from mcpipe.kinds.http import HttpRequestFailed, send_request
from mcpipe.plan import Leaf, RunFn
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

if TYPE_CHECKING:
    from mcpipe.backends.sql import Statement
    from mcpipe.kinds.sql_tx import TransactionFailed, TxStatement

__all__ = ["KIND_NAMES", "query_string", "sorted_json"]

_SF = TypeVar("_SF", bound=StepFields)
"""The fields of the step a helper builds (any kind's)."""
_MF = TypeVar("_MF", bound="McpgFields")
"""The fields of an mcpg backend step."""
_B = TypeVar("_B")
"""What a step's kind built."""
_HG = TypeVar("_HG", bound="OutboundFields")
"""The fields of an ``http`` or a ``grpc`` step (both build an :class:`HttpPlan`)."""

Answer = Literal["result", "step"]

_PROTECTED = frozenset({"host", "connection", "content-length", "forwarded", "via", "x-real-ip", "x-request-id"})
_DEFAULT_BACKOFF_BASE_MS = 1000


# --- JSON as mcpg writes it ------------------------------------------------------------------------


def sorted_json(value: object) -> str:
    """Compact JSON with object keys in order, as serde_json writes a ``Value`` (its maps are B-trees)."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS).decode()


def pretty_json(value: object) -> str:
    """``serde_json::to_string_pretty`` of a ``Value``: two-space indents, sorted keys."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def _result(text: str, structured: object, is_error: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": is_error}
    if structured is not None:
        out["structuredContent"] = structured
    return out


def envelope_result(payload: bytes, truncated: bool = False) -> dict[str, Any]:
    """A backend plugin's reply as mcpg projects it (``execute_binding_plugin``)."""
    text = payload.decode("utf-8", errors="replace")
    try:
        structured = orjson.loads(payload)
    except orjson.JSONDecodeError:
        structured = None
    is_error = isinstance(structured, Mapping) and structured.get("downstreamError") is not None
    if truncated:
        text += "\n[response truncated]"
    return _result(text, structured, is_error)


def failed_result(kind: str, error: str) -> dict[str, Any]:
    """A backend plugin's error as mcpg projects it."""
    return _result(f"{kind} request failed: {error}", None, True)


def timed_out(ms: float) -> str:
    return f"binding timed out after {int(ms)}ms"


def transport(message: str) -> str:
    return f"binding transport error: {message}"


def _finish(answer: Answer, result: dict[str, Any]) -> StepOutput:
    """The step's output: the whole result (a binding), or what a pipeline step makes of it."""
    if answer == "result":
        return StepOutput.of(result)
    if result.get("isError"):
        blocks = result.get("content") or []
        text = next((b.get("text") for b in blocks if b.get("type") == "text"), None)
        raise StepFailure(text if text is not None else "step execution failed", ErrorCode.TOOL_ERROR)
    structured = result.get("structuredContent")
    if structured is None:
        blocks = result.get("content") or []
        text = blocks[0].get("text") if blocks and blocks[0].get("type") == "text" else None
        if isinstance(text, str):
            try:
                structured = orjson.loads(text)
            except orjson.JSONDecodeError:
                structured = None
    return StepOutput.of(structured)


class McpgRetry(Strict):
    """A binding's ``retry`` (mcpg's ``RetryConfig``): an errored result that classifies as retryable is
    tried again, at most ``max_attempts`` more times, after ``initial_backoff_ms * 2**attempt``."""

    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=10)] = 3
    initial_backoff_ms: Annotated[int, msgspec.Meta(ge=1)] = 200
    retry_on_status_codes: list[int] = msgspec.field(default_factory=lambda: [429, 502, 503, 504])
    retry_on_transport_error: bool = True


class McpgFields(StepFields, kw_only=True):
    """What every mcpg backend step knows besides its spec."""

    answer: Answer = "result"
    tool_name: str = ""
    profile: str = ""
    retry: McpgRetry | None = None


def _env(step: Leaf[_MF, _B], env: Mapping[str, object], ctx: ToolContext) -> dict[str, Any]:
    """mcpg's expression variables for this step: ``arguments`` is the step's input."""
    steps = env.get("steps")
    return cel_env(
        env.get("args"),
        step.fields.tool_name,
        _facts(env, ctx),
        mcpg_steps(steps) if step.fields.answer == "step" and isinstance(steps, Mapping) else None,
    )


def _facts(env: Mapping[str, object], ctx: ToolContext) -> Mapping[str, Any]:
    """The request's facts: the pipeline's ``context`` root (computed once per run), else the call's."""
    facts = env.get("context")
    return facts if isinstance(facts, Mapping) else ctx.facts()


def _compile(b: Build[_SF], value: object, where: str) -> McpgTemplate | None:
    if not isinstance(value, str):
        return None
    try:
        return McpgTemplate.compile(value)
    except ValueError as e:
        b.problem(where, str(e))
        return None


def _timeout_ms(fields: StepFields, default: float) -> float:
    return float(fields.timeout_ms) if fields.timeout_ms is not None else default


# --- http (and grpc, which is a JSON POST) --------------------------------------------------------


class OutboundFields(McpgFields, kw_only=True):
    """What mcpg's ``http`` and ``grpc`` backends share: the ``url`` and ``headers`` (``${…}`` strings), and
    the one credential a request presents (in ``credential_header``, between its prefix and suffix)."""

    url: str
    headers: dict[str, str] = {}
    allow_private_backends: bool = False
    credential: str | None = None
    credential_header: str = "Authorization"
    credential_prefix: str = ""
    credential_suffix: str = ""


class HttpFields(OutboundFields, tag="mcpg.http", kw_only=True):
    """mcpg's ``http`` backend (``mcpg-plugin-backend-http``): a POST of the arguments as JSON, or a GET
    with them as the query string; the reply is mcpg's HTTP envelope."""

    method: Literal["get", "post"] = "post"
    expected_status_codes: list[Annotated[int, msgspec.Meta(ge=100, le=599)]] = msgspec.field(
        default_factory=lambda: [200]
    )
    require_json_response: bool = False
    max_response_bytes: Annotated[int, msgspec.Meta(gt=0)] = 4096


class GrpcFields(OutboundFields, tag="mcpg.grpc", kw_only=True):
    """mcpg's ``grpc`` backend (``mcpg-plugin-backend-grpc``): a JSON POST of the arguments to
    ``{origin}/{service}/{method}`` (a gRPC-JSON transcoder), 200 expected."""

    service: str
    method: str
    max_response_bytes: Annotated[int, msgspec.Meta(gt=0)] = 65_536


@dataclass(frozen=True, slots=True)
class HttpPlan:
    url: McpgTemplate
    headers: tuple[tuple[str, McpgTemplate], ...]
    policy: HttpPolicy
    credentials: Credentials
    """The outbound credentials: the binding's `credential` and those the ``${cred://…}`` of ``url`` and
    ``headers`` name (issued per call)."""

    def needs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c for t in (self.url, *(h for _, h in self.headers)) for c in t.credentials))


async def _tokens(plan: HttpPlan, ctx: ToolContext) -> dict[str, str]:
    """The tokens of the credentials the plan's templates name, issued for this caller (``formats/mcpg/plugins``
    maps each ``cred://<plugin>/<target>`` to the mcpipe credential of that name)."""
    tokens: dict[str, str] = {}
    for uri in plan.needs():
        try:
            tokens[uri] = (await plan.credentials.issue(uri.removeprefix("cred://"), ctx.identity)).token
        except CredentialError as exc:
            raise StepFailure(f"backend credential issuance failed: {exc}", ErrorCode.TOOL_FAILED) from None
    return tokens


def _build_http(b: Build[_HG]) -> HttpPlan:
    f = b.decoded()
    url = _compile(b, f.url, f"{b.location}.url")
    headers = []
    for name, value in f.headers.items():
        if not name.strip() or any(c in name + value for c in "\r\n"):
            b.problem(f"{b.location}.headers.{name}", "header names and values must not be empty or hold CR or LF")
            continue
        t = _compile(b, value, f"{b.location}.headers.{name}")
        if t is not None:
            headers.append((name, t))
    if url is None or b.failed:
        b.fail()
    if url.is_literal and not url.source.startswith(("http://", "https://")):
        b.problem(f"{b.location}.url", f"url must start with http:// or https://, got '{url.source}'")
        b.fail()
    policy = b.policy.http
    if f.allow_private_backends and not policy.allow_private:
        policy = replace(policy, allow_private=True)
    credentials = b.policy.credentials
    if f.credential is not None and f.credential not in credentials:
        b.problem(
            f"{b.location}.credential", f"no credential `{f.credential}` in [credentials]", ErrorCode.INVALID_CONFIG
        )
    plan = HttpPlan(url, tuple(headers), policy, credentials)
    for uri in plan.needs():
        if uri.removeprefix("cred://") not in credentials:
            b.problem(b.location, f"no credential issuer resolves `{uri}`")
    return plan


@dataclass(slots=True)
class _Summary:
    status_code: int
    content_type: str | None
    retry_after_ms: int | None
    body: str
    body_truncated: bool
    duration_ms: int


async def _http_call(
    policy: HttpPolicy,
    method: str,
    url: str,
    headers: list[tuple[str, str]],
    body: bytes | None,
    max_bytes: int,
    timeout_ms: float,
) -> _Summary:
    """One request through the core's :func:`~mcpipe.kinds.http.send_request`, answered as mcpg's net-core
    answers it (``execute_http_call``): the body cut at ``max_bytes`` (not failed), and a transport failure
    raising ``_TransportError`` with net-core's words: ``HTTP request failed: `` and reqwest's ``Display`` of
    the error (``error sending request for url (<url>)``: reqwest leaves the cause out), ``HTTP body read
    failed: ...`` when the body breaks off."""
    started = time.perf_counter()
    try:
        response = await send_request(
            policy,
            method,
            url,
            headers=headers,
            content=body,
            max_bytes=max_bytes,
            truncate=True,
            timeout_s=timeout_ms / 1000,
        )
    except HttpRequestFailed as e:
        if e.stage == "read":
            raise _TransportError("HTTP body read failed: request or response body error") from None
        raise _TransportError(f"HTTP request failed: error sending request for url ({url})") from None
    except ForbiddenError as e:
        raise _TransportError(str(e)) from None
    retry_after = response.headers.get("retry-after")
    return _Summary(
        response.status,
        response.content_type,
        int(retry_after) * 1000 if retry_after is not None and retry_after.strip().isdigit() else None,
        response.body.decode("utf-8", errors="replace"),
        response.truncated,
        int((time.perf_counter() - started) * 1000),
    )


class _TransportError(Exception):
    pass


def _with_guidance(error: dict[str, Any], read_only: bool) -> dict[str, Any]:
    """``retry::with_retry_guidance``."""
    error["idempotencyHint"] = "idempotent_read_only" if read_only else "potentially_non_idempotent"
    if not error["retryable"]:
        error["callerRetryDecision"] = "do_not_retry"
        error["retrySafety"] = "do_not_retry"
        error["backoffStrategy"] = "no_retry"
        error.pop("minimumBackoffMs", None)
        return error
    after = error.get("retryAfterMs")
    when = "after_delay" if after is not None else "with_backoff"  # the retry's words: `..._retry_after_delay`
    if read_only:
        error["retrySafety"] = "safe_for_automatic_retry"
        error["callerRetryDecision"] = f"automatic_retry_{when}"
    else:
        error["retrySafety"] = "review_idempotency_before_retry"
        error["suggestedAction"] = f"review_idempotency_then_retry_{when}"
        error["callerRetryDecision"] = f"confirm_idempotency_then_retry_{when}"
    error["backoffStrategy"] = "respect_retry_after" if after is not None else "exponential_backoff"
    error["minimumBackoffMs"] = after if after is not None else _DEFAULT_BACKOFF_BASE_MS
    return error


def status_error(expected: list[int], s: _Summary, read_only: bool) -> dict[str, Any] | None:
    """``validate_expected_status_codes``."""
    if s.status_code in expected:
        return None
    retryable = s.status_code == 429 or s.status_code >= 500
    after = s.retry_after_ms
    error: dict[str, Any] = {
        "kind": "unexpected_status_code",
        "code": "mcpg.downstream_http.unexpected_status_code",
        "message": f"Downstream response status {s.status_code} did not match the configured expected status codes.",
        "retryable": retryable,
        "retryClass": ("after_delay" if after is not None else "with_backoff") if retryable else "do_not_retry",
        "suggestedAction": (
            ("retry_after_indicated_delay" if after is not None else "retry_with_backoff_or_check_downstream_capacity")
            if retryable
            else "inspect_downstream_http_contract"
        ),
        "statusCode": s.status_code,
        "details": {"actualStatusCode": s.status_code, "expectedStatusCodes": expected, "retryAfterMs": after},
    }
    if after is not None:
        error["retryAfterMs"] = after
    return _with_guidance(error, read_only)


def transport_error(message: str, read_only: bool) -> dict[str, Any]:
    """``transport_downstream_error``."""
    return _with_guidance(_downstream("http", "transport_error", {"error": message}), read_only)


_DOWNSTREAM = {
    ("http", "transport_error"): (
        "Downstream HTTP execution failed before a valid response was received.",
        "check_downstream_connectivity_and_retry",
        "with_backoff",
    ),
    ("http", "invalid_content_type"): (
        "Downstream HTTP JSON call required a JSON response content type, but the response was not JSON.",
        "inspect_downstream_response_content_type",
        "do_not_retry",
    ),
    ("http", "invalid_json_body"): (
        "Downstream HTTP JSON call returned a JSON content type, but the body was not valid JSON.",
        "inspect_downstream_json_payload",
        "do_not_retry",
    ),
    ("command", "execution_error"): (
        "Downstream command execution failed before a valid result was produced.",
        "inspect_command_invocation_and_runtime_environment",
        None,
    ),
    ("command", "timeout"): (
        "Downstream command execution timed out before completion.",
        "inspect_command_runtime_and_review_idempotency_before_retry",
        None,
    ),
    ("command", "non_zero_exit"): (
        "Downstream command execution completed with a non-zero exit status.",
        "inspect_command_stderr_and_exit_status",
        None,
    ),
    ("command", "invalid_json_stdout"): (
        "Downstream command JSON call required valid JSON on stdout, but stdout was not valid JSON.",
        "inspect_command_stdout_contract",
        None,
    ),
}
"""mcpg's downstream errors by area and kind: the message, the suggested action, the retry class (None: none
said)."""


def _downstream(area: str, kind: str, details: Mapping[str, object]) -> dict[str, Any]:
    """mcpg's ``DownstreamError`` (``mcpg.downstream_<area>.<kind>``), before its guidance (:func:`_with_guidance`)."""
    message, action, retry_class = _DOWNSTREAM[area, kind]
    error: dict[str, Any] = {
        "kind": kind,
        "code": f"mcpg.downstream_{area}.{kind}",
        "message": message,
        "retryable": retry_class not in (None, "do_not_retry"),
    }
    if retry_class is not None:
        error["retryClass"] = retry_class
    error.update(suggestedAction=action, details=details)
    return error


def _json_checks(s: _Summary, require_json: bool) -> tuple[Any, str | None, dict[str, Any] | None]:
    """``parse_and_validate_json_response``: (json, parse error, validation error)."""
    media = (s.content_type or "").split(";", 1)[0].strip().lower()
    if not (media == "application/json" or media.endswith("+json")):
        if require_json:
            return None, None, _no_retry("invalid_content_type", {"responseContentType": s.content_type})
        return None, None, None
    parsed, message = serde_json.loads(s.body)
    if message is None:
        return parsed, None, None
    if require_json:
        return None, message, _no_retry("invalid_json_body", {"parseError": message})
    return None, message, None


def _no_retry(kind: str, details: Mapping[str, object]) -> dict[str, Any]:
    return _with_guidance(_downstream("http", kind, details), False)


MAX_QUERY_BYTES = 65_536
"""The longest query string a GET binding sends (arguments past it are a transport error, before any is
encoded): percent-encoding 4 MB of arguments held the event loop 1.7 s, for a URL no server takes."""


def query_string(arguments: object) -> str:
    """``build_http_query_string``: sorted keys, arrays repeating their key, RFC 3986 unreserved kept.

    Raises:
        _TransportError: not an object, or longer than :data:`MAX_QUERY_BYTES`.
    """
    if not isinstance(arguments, Mapping):
        raise _TransportError("network query call arguments must be a JSON object")
    pairs = []
    size = 0
    for key in sorted(arguments):
        value = arguments[key]
        for item in value if isinstance(value, list) else [value]:
            text = _query_value(item)
            size += len(key) + len(text) + 2  # each character at least one byte once encoded
            if size > MAX_QUERY_BYTES:
                raise _TransportError(f"the query string would be longer than {MAX_QUERY_BYTES} bytes")
            pairs.append(f"{url_component(key)}={url_component(text)}")
    query = "&".join(pairs)
    if len(query) > MAX_QUERY_BYTES:
        raise _TransportError(f"the query string would be longer than {MAX_QUERY_BYTES} bytes")
    return query


def _query_value(value: object) -> str:
    """A query value: a string as it is, anything else as its JSON (``null``, ``true``, ``1.5``, ``[1,2]``)."""
    return value if isinstance(value, str) else sorted_json(value)


async def resolve_url(template: McpgTemplate, env: Mapping[str, object], tokens: Mapping[str, str]) -> str:
    """A binding's ``url`` for one call: its expressions percent-encoded as URL components where
    ``mcpipe._url`` says (after the scheme's ``://``), then the URL checked to stay under the template's
    literal base with no dot segment in its path. A ``url`` that is one expression is its value as it is.

    Raises:
        ExpressionError: an expression failed.
        _TransportError: the URL leaves its base or climbs (nothing is sent).
    """
    parts = template.parts
    if len(parts) == 1 and parts[0][0] == "cel":
        return await template.resolve_async(env, tokens)
    first = encode_from([value if kind == "lit" else None for kind, value in parts])
    out: list[str] = []
    base: str | None = None
    for i, (kind, value) in enumerate(parts):
        if kind == "lit":
            out.append(value)
            continue
        # One part resolved as it is among others (an expression through CEL's `string()`).
        text = await McpgTemplate("", (("lit", ""), (kind, value))).resolve_async(env, tokens)
        if kind == "cel" and i >= first:
            if base is None and all(k == "lit" for k, _ in parts[:i]):
                base = "".join(out)
            text = url_component(text)
        out.append(text)
    url = "".join(out)
    try:
        return check_templated_url(url, base)
    except UrlRefused as exc:
        raise _TransportError(f"refused the URL of `{_safe_url(template.source)}`: {exc}") from None


def _safe_url(url: str) -> str:
    """The URL without its query (it may hold secrets), for messages."""
    return url.split("?", 1)[0].split("#", 1)[0]


async def _credential_header(
    f: OutboundFields, plan: HttpPlan, ctx: ToolContext, sent: dict[str, str], shown: dict[str, str]
) -> None:
    """The header that presents the binding's credential: its token in what is sent, the credential's name in
    what the envelope shows (mcpipe does not echo a secret to the caller)."""
    if f.credential is None:
        return
    try:
        issued = await plan.credentials.issue(f.credential, ctx.identity)
    except CredentialError as exc:  # the issuer refused, or cannot be reached
        raise _TransportError(f"credential `{f.credential}`: {exc}") from None
    sent[f.credential_header] = f"{f.credential_prefix}{issued.token}{f.credential_suffix}"
    shown[f.credential_header] = f"{f.credential_prefix}<credential {f.credential}>{f.credential_suffix}"


async def _resolve_headers(
    plan: HttpPlan, cel: Mapping[str, object], tokens: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Every configured header, resolved (net-core's ``resolved_headers``: what the envelope echoes)."""
    return {name: await template.resolve_async(cel, tokens) for name, template in plan.headers}


def _outbound(resolved: Mapping[str, str], json_call: bool, require_json: bool) -> list[tuple[str, str]]:
    """The headers sent, as net-core sends them: the configured ones but the protected (``build_default_headers``,
    ``is_protected_request_header``), then ``Accept`` set per request (``application/json`` when the binding
    requires a JSON response, else ``*/*``: it overrides a configured one, as reqwest's request headers win
    over the client's defaults), and a JSON call's ``Content-Type: application/json`` (``RequestBuilder::json``)."""
    out = [("accept", "application/json" if require_json else "*/*")]
    if json_call:
        out.append(("content-type", "application/json"))
    for name, value in resolved.items():
        lower = name.strip().lower()
        if (
            lower in _PROTECTED
            or lower.startswith("x-forwarded-")
            or lower == "accept"
            or (json_call and lower == "content-type")
        ):
            continue
        out.append((name, value))
    return out


async def run_http(
    step: Leaf[HttpFields, HttpPlan], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    f, plan = step.fields, step.built
    arguments = env.get("args")
    cel = _env(step, env, ctx)
    get = f.method == "get"
    request_body = None if get else arguments
    query: str | None = None
    display_headers: dict[str, str] | None = None
    display_url: str | None = None
    error: str | None = None
    summary: _Summary | None = None
    tokens = await _tokens(plan, ctx)
    try:
        display_url = await resolve_url(plan.url, cel, tokens)
        display_headers = await _resolve_headers(plan, cel, tokens)
        if get:
            query = query_string(arguments)
        sent = dict(display_headers)
        await _credential_header(f, plan, ctx, sent, display_headers)
        headers = _outbound(sent, not get, f.require_json_response)
        target = display_url if not query else f"{display_url}{'&' if '?' in display_url else '?'}{query}"
        body = None if get else sorted_json(arguments).encode()
        summary = await _http_call(
            plan.policy, f.method.upper(), target, headers, body, f.max_response_bytes, _timeout_ms(f, 2000)
        )
    except (ExpressionError, _TransportError) as e:
        error = str(e)
    if summary is not None:
        response_json, parse_error, json_error = _json_checks(summary, f.require_json_response)
        bad = status_error(f.expected_status_codes, summary, get)
        errors = [e for e in (bad, json_error) if e is not None]
    else:
        response_json, parse_error, errors = None, None, [transport_error(error or "", get)]
    kind = "query_string" if get else "json_body"
    env_out: dict[str, Any] = {
        "toolName": f.tool_name,
        "profile": f.profile,
        "requestKind": kind,
        "request": {"kind": kind, "arguments": arguments, "body": request_body, "query": query},
        "response": None
        if summary is None
        else {
            "durationMs": summary.duration_ms,
            "statusCode": summary.status_code,
            "contentType": summary.content_type,
            "body": summary.body,
            "bodyTruncated": summary.body_truncated,
            "json": response_json,
            "jsonParseError": parse_error,
        },
        "error": error if summary is None else None,
        "downstreamError": errors[0] if errors else None,
        "downstreamErrors": errors,
        "url": display_url if display_url is not None else plan.url.source,
        "timeoutMs": int(_timeout_ms(f, 2000)),
        "maxResponseBytes": f.max_response_bytes,
        "expectedStatusCodes": f.expected_status_codes,
        "requireJsonResponse": f.require_json_response,
        "requestHeaders": display_headers if display_headers is not None else dict(f.headers),
        "requestArguments": arguments,
        "requestBody": request_body,
        "requestQuery": query,
        "durationMs": None if summary is None else summary.duration_ms,
        "statusCode": None if summary is None else summary.status_code,
        "responseContentType": None if summary is None else summary.content_type,
        "body": None if summary is None else summary.body,
        "bodyTruncated": None if summary is None else summary.body_truncated,
        "responseJson": response_json,
        "responseJsonParseError": parse_error,
    }
    return _finish(f.answer, envelope_result(sorted_json(env_out).encode()))


async def run_grpc(
    step: Leaf[GrpcFields, HttpPlan], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    f, plan = step.fields, step.built
    arguments = env.get("args")
    cel = _env(step, env, ctx)
    base: dict[str, Any] = {"toolName": f.tool_name, "profile": f.profile, "service": f.service, "method": f.method}
    tokens = await _tokens(plan, ctx)
    try:
        origin = httpx2.URL(await resolve_url(plan.url, cel, tokens))
        target = str(origin.copy_with(path=f"/{f.service}/{f.method}", query=None, fragment=None))
        sent = await _resolve_headers(plan, cel, tokens)
        await _credential_header(f, plan, ctx, sent, {})
        headers = _outbound(sent, True, True)  # a JSON POST that requires a JSON reply
        s = await _http_call(
            plan.policy,
            "POST",
            target,
            headers,
            sorted_json(arguments).encode(),
            f.max_response_bytes,
            _timeout_ms(f, 2000),
        )
    except (ExpressionError, _TransportError, httpx2.InvalidURL) as e:
        out = {**base, "error": str(e), "downstreamError": transport_error(str(e), False)}
        return _finish(f.answer, envelope_result(sorted_json(out).encode()))
    parsed, _ = serde_json.loads(s.body)
    out = {
        **base,
        "statusCode": s.status_code,
        "durationMs": s.duration_ms,
        "bodyTruncated": s.body_truncated,
        "body": s.body,
        "response": parsed,
        "downstreamError": status_error([200], s, False),
    }
    return _finish(f.answer, envelope_result(sorted_json(out).encode()))


# --- mock ------------------------------------------------------------------------------------------


class MockFields(McpgFields, tag="mcpg.mock"):
    """mcpg's ``mock`` backend (``mcpg-plugin-backend-mock``): ``response`` as a simulated result, or as the
    whole result (``passthrough``), or a simulated error; in a pipeline its output is ``response``."""

    response: Any = None
    delay_ms: Annotated[int, msgspec.Meta(ge=0)] = 0
    error: bool = False
    error_message: str | None = None
    passthrough: bool = False


def _build_mock(b: Build[MockFields]) -> None:
    f = b.decoded()
    if f.answer == "result" and f.passthrough:
        content = f.response.get("content") if isinstance(f.response, Mapping) else None
        if not isinstance(content, list):
            b.problem(
                f"{b.location}.response",
                "passthrough: true requires `response` to be a CallToolResult object with a `content` array",
            )


async def run_mock(
    step: Leaf[MockFields, None], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    from mcpipe.kinds.mock import simulate

    f = step.fields
    await simulate(ctx, f.delay_ms)
    if f.answer == "step":
        if f.error:
            raise StepFailure(f.error_message or "mock step error", ErrorCode.TOOL_ERROR)
        return StepOutput.of(f.response)
    arguments = env.get("args")
    base = {
        "toolName": f.tool_name,
        "profile": f.profile,
        "bindingKind": "mock",
        "arguments": arguments if arguments is not None else {},
    }
    if f.error:
        message = f.error_message or "mock error"
        return StepOutput.of(_result(message, {**base, "error": message, "simulated": True}, True))
    if f.passthrough:
        response = dict(f.response)
        response.setdefault("isError", False)
        return StepOutput.of(response)
    structured = {**base, "response": f.response, "delayMs": f.delay_ms, "simulated": True}
    return StepOutput.of(_result(pretty_json(f.response), structured, False))


# --- command ---------------------------------------------------------------------------------------


class CommandFields(McpgFields, tag="mcpg.command"):
    """mcpg's ``command`` backend (``mcpg-plugin-backend-command``): the program, its ``args`` (``${…}``
    strings), the call's arguments as JSON on its stdin; the reply is mcpg's command envelope."""

    command: Annotated[str, msgspec.Meta(min_length=1)]
    args: list[str] = []
    max_output_bytes: Annotated[int, msgspec.Meta(gt=0)] = 65_536
    require_json_stdout: bool = False


@dataclass(frozen=True, slots=True)
class CommandPlan:
    args: tuple[McpgTemplate, ...]
    policy: CommandPolicy
    """The operator's command policy: how long a stopped command's processes get before SIGKILL."""


def _build_command(b: Build[CommandFields]) -> CommandPlan:
    f = b.decoded()
    if f.command.strip() == "":
        b.problem(f"{b.location}.command", "command must not be empty")
    args = []
    for i, arg in enumerate(f.args):
        t = _compile(b, arg, f"{b.location}.args[{i}]")
        if t is not None:
            args.append(t)
    if b.failed:
        b.fail()
    return CommandPlan(tuple(args), b.policy.command)


async def run_command(
    step: Leaf[CommandFields, CommandPlan],
    inputs: Mapping[str, object],
    env: Mapping[str, object],
    ctx: ToolContext,
) -> StepOutput:
    f = step.fields
    arguments = env.get("args")
    arguments = arguments if arguments is not None else {}
    timeout_ms = _timeout_ms(f, 5000)
    base: dict[str, Any] = {
        "toolName": f.tool_name,
        "profile": f.profile,
        "requestKind": "json_stdin",
        "request": {"kind": "json_stdin", "arguments": arguments, "body": arguments},
        "command": f.command,
        "requireJsonStdout": f.require_json_stdout,
        "timeoutMs": int(timeout_ms),
        "maxOutputBytes": f.max_output_bytes,
    }

    def answer(response: dict[str, Any] | None, error: str | None, errors: list[dict[str, Any]]) -> StepOutput:
        out = {**base, "response": response, "error": error, "downstreamErrors": errors}
        out["downstreamError"] = errors[0] if errors else None
        return _finish(f.answer, envelope_result(sorted_json(out).encode()))

    cel = _env(step, env, ctx)
    argv = [f.command]
    for i, template in enumerate(step.built.args):
        try:
            argv.append(await template.resolve_async(cel))
        except ExpressionError as e:
            return answer(None, f"evaluating command arg[{i}] expression: {e}", [])
    started = time.perf_counter()
    try:
        # The server's environment, as mcpg's command plugin passes its own.
        run = await run_captured(
            argv,
            dict(os.environ),
            None,
            sorted_json(arguments).encode(),
            step.built.policy,
            max_bytes=f.max_output_bytes,
            timeout_s=timeout_ms / 1000,
        )
    except StepFailure as e:  # it could not start
        return answer(None, str(e), [_downstream("command", "execution_error", {"error": str(e)})])
    response = process_summary(run, started)
    stdout_text = response["stdout"]
    stdout_json: Any = None
    parse_error: str | None = None
    errors: list[dict[str, Any]] = []
    if run.timed_out:
        errors.append(_downstream("command", "timeout", {}))
    elif not response["success"]:
        errors.append(_downstream("command", "non_zero_exit", {"exitCode": response["exitCode"]}))
    if stdout_text.strip():
        stdout_json, parse_error = serde_json.loads(stdout_text)
        if parse_error is not None and f.require_json_stdout:
            errors.append(_downstream("command", "invalid_json_stdout", {"parseError": parse_error}))
    elif f.require_json_stdout:
        errors.append(_downstream("command", "invalid_json_stdout", {"parseError": "stdout was empty"}))
    response.update(json=stdout_json, jsonParseError=parse_error)
    return answer(response, None, errors)


def process_summary(run: ProcessRun, started: float) -> dict[str, Any]:
    """What mcpg's command adapter reports of a finished program (``CommandExecutionSummary``): its exit code
    (none when a signal ended it), whether it succeeded, its output (each stream cut where the core cut it)."""
    return {
        "durationMs": int((time.perf_counter() - started) * 1000),
        "exitCode": run.code if run.code >= 0 else None,
        "success": run.code == 0 and not run.timed_out,
        "timedOut": run.timed_out,
        "stdout": run.stdout.decode("utf-8", errors="replace"),
        "stderr": run.stderr.decode("utf-8", errors="replace"),
        "stdoutTruncated": run.stdout_truncated,
        "stderrTruncated": run.stderr_truncated,
        "readError": None,
    }


# --- nats and kafka (the reply is the payload) ------------------------------------------------------


class NatsFields(McpgFields, tag="mcpg.nats"):
    """mcpg's ``nats`` backend (``mcpg-plugin-backend-nats``): a request on ``subject`` with the arguments as
    JSON; the reply's bytes are the result."""

    url: str
    subject: Annotated[str, msgspec.Meta(min_length=1)]
    max_response_bytes: Annotated[int, msgspec.Meta(gt=0)] = 65_536


class KafkaFields(McpgFields, tag="mcpg.kafka"):
    """mcpg's ``kafka`` backend (``mcpg-plugin-backend-kafka``): the arguments as JSON on ``request_topic``
    with a ``correlation_id`` header; the record on ``response_topic`` carrying it is the result."""

    bootstrap_servers: str
    request_topic: Annotated[str, msgspec.Meta(min_length=1)]
    response_topic: Annotated[str, msgspec.Meta(min_length=1)]
    max_response_bytes: Annotated[int, msgspec.Meta(gt=0)] = 65_536


def _connections(b: Build[_SF], field: str, parse: Callable[[str], object]) -> _SF:
    """The step's fields, its address (``field``) checked by the core backend's ``parse`` (else it fails)."""
    f = b.decoded()
    try:
        parse(getattr(f, field))
    except ValueError as e:
        b.problem(f"{b.location}.{field}", str(e))
        b.fail()
    return f


def _build_nats(b: Build[NatsFields]) -> Connections:
    from mcpipe.backends.nats import parse_nats_url

    f = _connections(b, "url", parse_nats_url)
    if "*" in f.subject or ">" in f.subject or " " in f.subject:
        b.problem(f"{b.location}.subject", f"NATS subject '{f.subject}' contains wildcard characters")
    return b.policy.connections


def _build_kafka(b: Build[KafkaFields]) -> Connections:
    from mcpipe.backends.kafka import parse_bootstrap

    _connections(b, "bootstrap_servers", parse_bootstrap)
    return b.policy.connections


def _payload_result(data: bytes, limit: int) -> dict[str, Any]:
    truncated = len(data) > limit
    return envelope_result(data[:limit] if truncated else data, truncated)


async def run_nats(
    step: Leaf[NatsFields, Connections], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """The core's :func:`~mcpipe.kinds.nats.request` (on the connection the server's NATS steps share), with
    the arguments as sorted JSON; the reply's bytes as mcpg's envelope, a failure in async-nats's words."""
    from mcpipe.backends.nats import NatsError
    from mcpipe.kinds.nats import request

    f = step.fields
    timeout_ms = _timeout_ms(f, 2000)
    try:
        reply = await request(step.built, f.url, f.subject, _arguments_json(env), timeout_ms / 1000, _trace(ctx))
    except (NatsError, NotRunning) as e:
        # async-nats's RequestError: its kind, then its source, which for no responders says it again.
        why = "no responders: no responders" if isinstance(e, NatsError) and "no responders" in str(e) else str(e)
        return _request_failed(f, "nats", e, timeout_ms, f"NATS request to '{f.subject}' failed: {why}")
    return _finish(f.answer, _payload_result(reply.data, f.max_response_bytes))


async def run_kafka(
    step: Leaf[KafkaFields, Connections], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """The core's :func:`~mcpipe.kinds.kafka.request` (on the client the server's Kafka steps share), with
    the arguments as sorted JSON and the trace context as a header; the response's value as mcpg's
    envelope."""
    from mcpipe.backends.kafka import KafkaError
    from mcpipe.kinds.kafka import request

    f = step.fields
    timeout_ms = _timeout_ms(f, 10_000)
    data = _arguments_json(env)
    headers = {k: v.encode() for k, v in (_trace(ctx) or {}).items()}
    try:
        record = await request(
            step.built, f.bootstrap_servers, f.request_topic, f.response_topic, data, timeout_ms / 1000, headers
        )
    except (KafkaError, NotRunning) as e:
        return _request_failed(f, "kafka", e, timeout_ms, str(e))
    return _finish(f.answer, _payload_result(record.value or b"", f.max_response_bytes))


def _arguments_json(env: Mapping[str, object]) -> bytes:
    """The step's arguments as the request's payload (sorted JSON; an object when there are none)."""
    return sorted_json(env.get("args") if env.get("args") is not None else {}).encode()


def _request_failed(f: McpgFields, kind: str, e: Exception, timeout_ms: float, why: str) -> StepOutput:
    """A NATS or Kafka request's failure as mcpg answers it: the binding's timeout, else ``why``."""
    timeout = getattr(e, "code", None) == ErrorCode.TIMEOUT
    return _finish(f.answer, failed_result(kind, timed_out(timeout_ms) if timeout else transport(why)))


def _trace(ctx: ToolContext) -> dict[str, str] | None:
    return {"traceparent": ctx.traceparent} if ctx.traceparent else None


# --- sql -------------------------------------------------------------------------------------------


SqlRowMode = Literal["single", "many", "scalar", "affected_rows", "resource_contents", "stream"]


class McpgAwaitStatement(Strict):
    """A statement of an ``await`` block (``AwaitStep``)."""

    sql: Annotated[str, msgspec.Meta(min_length=1)]
    params: list[str] = []


class McpgAwait(Strict, kw_only=True):
    """A sql binding's ``await`` block (``AwaitConfig``): ``trigger`` once, then ``check`` every
    ``poll_interval_ms`` until ``predicate`` (CEL over ``row``, its first row, and ``arguments``) holds; the
    answer is that row. Past ``timeout_ms`` the call times out."""

    trigger: McpgAwaitStatement | None = None
    check: McpgAwaitStatement
    predicate: Annotated[str, msgspec.Meta(min_length=1)]
    poll_interval_ms: Annotated[int, msgspec.Meta(ge=1)] = 1000
    timeout_ms: Annotated[int, msgspec.Meta(ge=1)] = 60_000


class SqlFields(McpgFields, tag="mcpg.sql"):
    """mcpg's ``sql`` backend (``mcpg-plugin-backend-sql``): one statement on the binding's database (an
    mcpipe ``sql`` backend, by name), its ``:name`` parameters bound from the arguments (``params``) or
    computed (``param_exprs``, CEL); the reply is the rows shaped by ``row_mode``, each value encoded as mcpg's
    drivers encode it (``mcpg_row``)."""

    backend: str
    sql: Annotated[str, msgspec.Meta(min_length=1)]
    params: list[str] = []
    param_exprs: dict[str, str] = {}
    row_mode: SqlRowMode = "many"
    max_rows: Annotated[int, msgspec.Meta(ge=1)] = 1000
    session_vars: dict[str, str] = {}
    """PostgreSQL settings made for the statement's transaction (``set_config(key, value, true)``, as mcpg's
    SQL plugin runs them), each value a ``${…}`` template of the call (``${identity.tenant}``): what a
    row-level-security policy reads with ``current_setting(key)``."""
    await_: McpgAwait | None = msgspec.field(default=None, name="await")
    """Fire-and-wait: the binding answers the row its ``await`` block waits for, not its ``sql``."""
    await_step: str | None = None
    """This runs a pipeline's ``sql_await`` step of that id, on the binding ``profile`` names (its failure is
    ``sql_await '<id>' on binding '<binding>': <error>``)."""
    stream: dict[str, Any] | None = None
    """``row_mode: stream``'s keyset (``cursor_columns``, ``initial``, ``signing_key``: :mod:`._sqlmore`)."""


@dataclass(frozen=True, slots=True)
class AwaitPlan:
    trigger: Any
    check: Any
    predicate: CelExpr


@dataclass(frozen=True, slots=True)
class SqlPlan:
    backend: Any
    stmt: Any
    exprs: tuple[tuple[str, CelExpr], ...]
    session_vars: tuple[tuple[str, McpgTemplate], ...] = ()
    waits: AwaitPlan | None = None
    stream: Any = None


def _build_sql(b: Build[SqlFields]) -> SqlPlan:
    from mcpipe.backends.sql import Statement
    from mcpipe.formats.mcpg._sqlmore import StreamCursors, sql_backend

    f = b.decoded()
    backend = sql_backend(b, f.backend)
    try:
        stmt = Statement.parse(f.sql)
    except ValueError as e:
        b.problem(f"{b.location}.sql", str(e))
        b.fail()
    exprs = []
    for name, source in f.param_exprs.items():
        try:
            exprs.append((name, compile_mcpg_cel(source)))
        except ValueError as e:
            b.problem(f"{b.location}.param_exprs.{name}", str(e))
    session_vars = []
    for key, value in sorted(f.session_vars.items()):
        if not _SQL_IDENTIFIER.fullmatch(key):
            b.problem(
                f"{b.location}.session_vars.{key}",
                f"session_vars: '{key}' is not a safe SQL identifier (allowed: ASCII letters, digits, `_`, `.`)",
            )
            continue
        template = _compile(b, value, f"{b.location}.session_vars.{key}")
        if template is not None:
            session_vars.append((key, template))
    if f.session_vars and getattr(backend, "kind", "") != "postgresql":
        b.problem(
            f"{b.location}.session_vars",
            "session_vars: SQLite has no transaction-scoped session-variable concept (no SET LOCAL, no user "
            "variables). Remove `session_vars` or switch the binding to Postgres / MySQL.",
        )
    waits = _build_await(b, f.await_) if f.await_ is not None else None
    if b.failed:
        b.fail()
    stream = StreamCursors.of(f.profile, f.stream or {}) if f.row_mode == "stream" else None
    return SqlPlan(backend, stmt, tuple(exprs), tuple(session_vars), waits, stream)


def _build_await(b: Build[_SF], block: McpgAwait) -> AwaitPlan | None:
    from mcpipe.backends.sql import Statement

    where = f"{b.location}.await"
    try:
        trigger = Statement.parse(block.trigger.sql) if block.trigger is not None else None
        check = Statement.parse(block.check.sql)
    except ValueError as e:
        b.problem(where, str(e))
        return None
    try:
        predicate = CelExpr.compile(block.predicate, extra_roots=frozenset({"row", "arguments"}))
    except ValueError as e:
        b.problem(f"{where}.predicate", f"await.predicate CEL compile failed: {e}")
        return None
    return AwaitPlan(trigger, check, predicate)


_SQL_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def _rfc3339(value: dt.datetime) -> str:
    """chrono's ``DateTime<Utc>::to_rfc3339``: ``+00:00``, the fraction only when not zero (3 or 6 digits)."""
    utc = value.astimezone(dt.UTC)
    us = utc.microsecond
    fraction = "" if not us else f".{us // 1000:03d}" if us % 1000 == 0 else f".{us:06d}"
    return utc.strftime("%Y-%m-%dT%H:%M:%S") + fraction + "+00:00"


def _iso_interval(value: dt.timedelta) -> str:
    """``pg_interval_to_iso8601`` of an interval of days and microseconds (psycopg reads months as 30 days)."""
    total = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    if total == 0:
        return "PT0S"
    days, micros = value.days, value.seconds * 1_000_000 + value.microseconds
    if days < 0 and micros > 0:  # timedelta normalises to a negative day and a positive time
        days, micros = days + 1, micros - 86_400 * 1_000_000
    negative = (days < 0 or micros < 0) and not (days > 0 or micros > 0)
    days, micros = abs(days), abs(micros)
    out = ("-" if negative else "") + "P" + (f"{days}D" if days else "")
    if micros:
        secs, frac = divmod(micros, 1_000_000)
        hours, rest = divmod(secs, 3600)
        minutes, seconds = divmod(rest, 60)
        out += "T" + (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes else "")
        if seconds or frac:
            out += f"{seconds}.{f'{frac:06d}'.rstrip('0')}S" if frac else f"{seconds}S"
    return out


def _typed(kind: type | tuple[type, ...], encode: Callable[[Any], Any] = lambda v: v) -> Callable[[Any], Any]:
    """A column's encoding that decodes only values of ``kind`` (the others are null)."""
    return lambda v: encode(v) if isinstance(v, kind) else None


def _base64(value: Any) -> dict[str, str]:
    return {"base64": base64.b64encode(bytes(value)).decode("ascii")}


# How mcpg's SQL drivers encode a column (``driver/postgres.rs`` ``decode_pg_column``, ``driver/sqlite.rs``
# ``decode_sqlite_column``): by the column's type on PostgreSQL, by the value's storage class on SQLite. A
# value a driver cannot decode is null; sqlx decodes no type but these (and the texts) as a string.
_PG_VALUES: dict[str, Callable[[Any], Any]] = {
    "bool": _typed(bool),
    **dict.fromkeys(("int2", "int4", "int8"), _typed(int)),
    **dict.fromkeys(("float4", "float8"), lambda v: v if isinstance(v, float) and math.isfinite(v) else None),
    # rust_decimal::Decimal's text: no exponent; NaN and infinities do not decode
    "numeric": lambda v: format(v, "f") if isinstance(v, decimal.Decimal) and v.is_finite() else None,
    **dict.fromkeys(("json", "jsonb"), lambda v: v),
    "uuid": str,
    "timestamptz": _typed(dt.datetime, _rfc3339),
    "timestamp": _typed(dt.datetime, lambda v: v.strftime("%Y-%m-%dT%H:%M:%S.%f")),
    "date": _typed(dt.date, lambda v: v.isoformat()),
    "time": _typed(dt.time, lambda v: v.strftime("%H:%M:%S.%f")),
    "interval": _typed(dt.timedelta, _iso_interval),
    "bytea": _base64,
    **dict.fromkeys(("text", "name", "bpchar", "varchar", "unknown", "citext", ""), _typed(str)),
}


def _pg_value(value: Any, type_name: str) -> Any:
    encode = _PG_VALUES.get(type_name.lower())
    return None if value is None or encode is None else encode(value)


def _sqlite_value(value: object) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _base64(value)
    return value


def mcpg_rows(result: Any) -> list[dict[str, Any]]:
    """A statement's rows as mcpg's SQL plugin makes them (``row_to_json_pg``, ``row_to_json_sqlite``): objects
    keyed by column, each value encoded as its driver encodes it."""
    if result.types:
        types = result.types
        return [
            {c: _pg_value(v, t) for c, v, t in zip(result.columns, row, types, strict=False)} for row in result.rows
        ]
    return [{c: _sqlite_value(v) for c, v in zip(result.columns, row, strict=False)} for row in result.rows]


def _first_column(row: object) -> Any:
    """``scalar``: the row's first value in mcpg's map order (serde_json's, by key)."""
    if isinstance(row, dict):
        return row[min(row)] if row else None
    return row


def shape_rows(rows: list[dict[str, object]], mode: str, max_rows: int, affected: int | None) -> Any:
    """``shape_response`` of the SQL plugin."""
    rows = rows[:max_rows]
    if mode == "single":
        return rows[0] if rows else None
    if mode == "many":
        return rows
    if mode == "scalar":
        return _first_column(rows[0]) if rows else None
    if mode == "affected_rows":
        return {"rows_affected": affected or 0}
    contents = []
    for i, row in enumerate(rows):
        if not isinstance(row.get("uri"), str):
            raise _TransportError(f"resource_contents[{i}] missing required 'uri' column")
        has_text, has_blob = row.get("text") is not None, row.get("blob") is not None
        if has_text == has_blob:
            raise _TransportError(
                f"resource_contents[{i}] cannot SELECT both 'text' and 'blob' — pick one per row"
                if has_text
                else f"resource_contents[{i}] must SELECT either 'text' or 'blob'"
            )
        entry: dict[str, Any] = {"uri": row["uri"]}
        if isinstance(row.get("mime_type"), str):
            entry["mimeType"] = row["mime_type"]
        entry["text" if has_text else "blob"] = row["text" if has_text else "blob"]
        contents.append(entry)
    return {"contents": contents}


def sql_error(e: object, what: str = "execute") -> str:
    """A statement's failure as mcpg's SQL plugin words it: ``<what>: error returned from database: <the
    database's error>`` (sqlx's words; ``execute``, or ``execute_affected`` in a transaction), else mcpipe's."""
    database = getattr(e, "database", None)
    return f"{what}: error returned from database: {database}" if database is not None else str(e)


async def _sql_raw(plan: SqlPlan, stmt: Statement, cel: Mapping[str, Any], params: Mapping[str, object]) -> Any:
    """One statement through the core's :func:`~mcpipe.kinds.sql.run_statement`, after the binding's session
    variables (resolved over mcpg's ``identity``, made in one transaction with it, as mcpg's SQL plugin runs
    them): its result as the driver gave it, for :func:`mcpg_rows`."""
    from mcpipe.kinds.sql import run_statement

    if not plan.session_vars:
        return await run_statement(plan.backend, stmt, params)
    context = cel.get("context") or {}
    attributes = dict(context.get("attributes") or {})
    identity = {
        **attributes,
        "principal_id": context.get("principal_id"),
        "trust_level": context.get("trust_level"),
        "auth_provider": context.get("auth_provider"),
        "roles": context.get("roles", []),
        "groups": context.get("groups", []),
        "scopes": context.get("scopes", []),
        "attributes": attributes,
    }
    scope = {**cel, "identity": identity}
    settings = [(key, await template.resolve_async(scope)) for key, template in plan.session_vars]
    return await run_statement(plan.backend, stmt, params, settings=settings)


class _MissingParam(Exception):
    """``collect_bound_params``'s refusal (mcpg's ``SqlError::InvalidSpec``)."""


def _bound(stmt: Statement, arguments: Mapping[str, object]) -> dict[str, Any]:
    """``collect_bound_params``: each ``:name`` of the statement from the arguments; one absent is an error."""
    out = {}
    for name in stmt.names:
        if name not in arguments:
            raise _MissingParam(f"missing required parameter '{name}'")
        out[name] = arguments[name]
    return out


async def _await_row(plan: SqlPlan, waits: AwaitPlan, f: SqlFields, cel: Mapping[str, object], args: object) -> Any:
    """``execute_await_loop``: the trigger once, then the check until the predicate holds on its first row."""
    block = f.await_
    assert block is not None
    arguments: Mapping[str, Any] = args if isinstance(args, Mapping) else {}
    step_ms = _timeout_ms(f, 30_000)
    if waits.trigger is not None:
        with trio.fail_after(step_ms / 1000):
            await _sql_raw(plan, waits.trigger, cel, _bound(waits.trigger, arguments))
    deadline = trio.current_time() + block.timeout_ms / 1000
    while True:
        with trio.fail_after(step_ms / 1000):
            result = await _sql_raw(plan, waits.check, cel, _bound(waits.check, arguments))
        rows = mcpg_rows(result)
        row = rows[0] if rows else None
        try:
            matched = await waits.predicate.evaluate_async({"row": row, "arguments": args}) is True
        except ExpressionError:
            matched = False
        if matched:
            return row
        now = trio.current_time()
        if now >= deadline:
            raise _AwaitTimeout(block.timeout_ms)
        await trio.sleep(min(block.poll_interval_ms / 1000, deadline - now))


class _AwaitTimeout(Exception):
    """The ``await`` block's ``timeout_ms`` (the one argument) passed before its predicate held."""


def _sql_failed(f: SqlFields, error: str) -> dict[str, Any]:
    if f.await_step is not None:
        return _result(f"sql_await '{f.await_step}' on binding '{f.profile}': {error}", None, True)
    return failed_result("sql", error)


async def run_sql(
    step: Leaf[SqlFields, SqlPlan], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    from mcpipe.backends.sql import SqlError

    f, plan = step.fields, step.built
    given = env.get("args")
    arguments: dict[str, Any] = dict(given) if isinstance(given, Mapping) else {}
    timeout_ms = _timeout_ms(f, 30_000)
    truncated = False
    try:
        cel = _env(step, env, ctx)
        # `param_exprs` go into the arguments, over what the caller sent (``param_exprs::evaluate_into``).
        for name, expr in plan.exprs:
            arguments[name] = await expr.evaluate_async(cel)
        if plan.stream is not None:  # the keyset of the page: from the caller's `_cursor`, never its own values
            try:
                arguments = plan.stream.bind(arguments)
            except ValueError as e:
                return _finish(f.answer, failed_result("sql", f"invalid binding spec: {e}"))
        if plan.waits is not None:
            value = await _await_row(plan, plan.waits, f, cel, arguments if plan.exprs else given)
        else:
            with trio.fail_after(timeout_ms / 1000):
                result = await _sql_raw(plan, plan.stmt, cel, _bound(plan.stmt, arguments))
            if f.row_mode == "affected_rows":
                value = shape_rows([], "affected_rows", f.max_rows, max(result.rowcount, 0))
            elif plan.stream is not None:
                from mcpipe.formats.mcpg._sqlmore import stream_page

                value = stream_page(mcpg_rows(result), f.max_rows, plan.stream)
            else:
                rows = mcpg_rows(result)
                truncated = len(rows) > f.max_rows
                value = shape_rows(rows, f.row_mode, f.max_rows, None)
    except trio.TooSlowError:
        return _finish(f.answer, _sql_failed(f, timed_out(timeout_ms)))
    except _AwaitTimeout as e:
        return _finish(f.answer, _sql_failed(f, timed_out(e.args[0])))
    except _MissingParam as e:
        return _finish(f.answer, _sql_failed(f, f"invalid binding spec: {e}"))
    except SqlError as e:
        return _finish(f.answer, _sql_failed(f, transport(sql_error(e))))
    except (_TransportError, ExpressionError) as e:
        return _finish(f.answer, _sql_failed(f, transport(str(e))))
    # serde_json writes a row's columns in key order (its maps are B-trees).
    return _finish(f.answer, envelope_result(sorted_json(value).encode(), truncated))


class SqlTxStatement(Strict):
    """One statement of an ``mcpg.sql_tx`` step (``TxNestedStepWire``: ``affected_rows`` by default)."""

    id: str
    sql: str
    params: list[str] = []
    row_mode: str = "affected_rows"


class SqlTxFields(StepFields, tag="mcpg.sql_tx", kw_only=True):
    """mcpg's ``sql_tx`` step (``execute_transaction`` of the SQL plugin): its statements in one transaction
    on the named binding's database, each bound from the step's input; the output is
    ``{steps: {<id>: <its rows, shaped by its row_mode>}}``; any failure rolls all back."""

    backend: str
    steps: list[SqlTxStatement]


def _build_sql_tx(b: Build[SqlTxFields]) -> tuple[Any, tuple[Any, ...]]:
    from mcpipe.backends.sql import Statement
    from mcpipe.formats.mcpg._sqlmore import sql_backend

    f = b.decoded()
    backend = sql_backend(b, f.backend)
    stmts = []
    for i, st in enumerate(f.steps):
        try:
            stmts.append(Statement.parse(st.sql))
        except ValueError as e:
            b.problem(f"{b.location}.steps[{i}].sql", str(e))
    if b.failed:
        b.fail()
    return backend, tuple(stmts)


def _tx_statement(st: SqlTxStatement, stmt: Statement, arguments: Mapping[str, object]) -> TxStatement:
    """``run_tx_nested_step``: one statement for the core's transaction, bound from the step's input and
    shaped by its row mode (mcpg's words for a failure of either, raised as ``_TransportError``)."""
    from mcpipe.kinds.sql_tx import TxStatement

    def bind(outputs: Mapping[str, object]) -> Mapping[str, Any]:
        where = f"sql_tx nested step '{st.id}'"
        if st.row_mode not in _TX_ROW_MODES:
            modes = ", ".join(_TX_ROW_MODES)
            raise _TransportError(f"{where}: unsupported row_mode '{st.row_mode}' (supported: {modes})")
        try:
            return _bound(stmt, arguments)
        except _MissingParam as e:
            raise _TransportError(f"{where}: parameter bind for '{st.id}': invalid spec: {e}") from None

    def shaped(result: Any) -> Any:
        rows = [] if st.row_mode == "affected_rows" else mcpg_rows(result)
        return shape_rows(rows, st.row_mode, len(rows), max(result.rowcount, 0))

    return TxStatement(st.id, stmt, bind, shaped)


_TX_ROW_MODES = ("affected_rows", "many", "single", "scalar")


def _tx_failure(f: SqlTxFields, e: TransactionFailed) -> str:
    """sqlx's words for a failed statement (``execute`` or ``execute_affected``, by its row mode), under mcpg's
    ``sql_tx nested step '<id>'``; the transaction's own failure as mcpipe words it."""
    if e.statement is None:
        return str(e.error)
    mode = next(st.row_mode for st in f.steps if st.id == e.statement)
    what = "execute_affected" if mode == "affected_rows" else "execute"
    why = str(e.error) if e.database is None else sql_error(e, "execute failed")
    return f"sql_tx nested step '{e.statement}': {what}: {why}"


async def run_sql_tx(
    step: Leaf[SqlTxFields, tuple[Any, tuple[Any, ...]]],
    inputs: dict[str, Any],
    env: Mapping[str, object],
    ctx: ToolContext,
) -> StepOutput:
    from mcpipe.kinds.sql_tx import TransactionFailed, run_transaction

    f = step.fields
    backend, stmts = step.built
    given = env.get("args")
    arguments: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    statements = [_tx_statement(st, stmt, arguments) for st, stmt in zip(f.steps, stmts, strict=True)]
    try:
        results = await run_transaction(backend, statements)
    except TransactionFailed as e:
        why = _tx_failure(f, e)
    except _TransportError as e:
        why = str(e)
    else:
        return StepOutput.of({"steps": results})
    raise StepFailure(f"sql_tx '{step.fields.id}': {transport(why)}", ErrorCode.TOOL_ERROR) from None


# --- a backend whose config names an unset variable -------------------------------------------------


class UnsetFields(McpgFields, tag="mcpg.unset"):
    """A backend whose config reads an environment variable that is not set: mcpg refuses to start; mcpipe
    serves the binding, and each call fails saying which variable is missing."""

    backend: str
    message: str


async def run_unset(
    step: Leaf[UnsetFields, None], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    f = step.fields
    return _finish(f.answer, failed_result(f.backend, f.message))


# --- plugin_transform (the JSONata transform plugin) -------------------------------------------------


class JsonataFields(StepFields, tag="mcpg.jsonata", kw_only=True):
    """mcpg's ``plugin_transform`` step on ``dev.mcpg.transform.jsonata`` (``execute_plugin_transform_step``):
    ``expression`` evaluated over mcpg's step context, ``{arguments, tool_name, steps, context}``; its value is
    the output. ``config_error`` is why the plugin refuses the step's ``config`` (it then fails each call)."""

    plugin: str = "dev.mcpg.transform.jsonata"
    expression: str = ""
    tool_name: str = ""
    max_output_bytes: Annotated[int, msgspec.Meta(ge=0)] = 1_048_576
    config_error: str | None = None


def _build_jsonata(b: Build[JsonataFields]) -> str:
    """The compiled expression, or the words of its failure: the plugin parses it on each call, so an
    expression that does not parse fails the calls (``parse error: ...``), not the file. The engine is the
    plugin's own, jsonata-core (``jsonatapy``, its Python binding)."""
    import jsonatapy

    f = b.decoded()
    if f.config_error is not None:
        return f"jsonata transform config: {f.config_error}"
    try:
        jsonatapy.compile(f.expression)
    except ValueError as e:
        # The binding words a parse error as `Parse error: <it>` (unless coded); the plugin as `<it>`.
        return f"parse error: {str(e).removeprefix('Parse error: ')}"
    return f.expression


async def run_jsonata(
    step: Leaf[JsonataFields, str], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    f, built = step.fields, step.built

    def failed(why: str) -> StepFailure:
        return StepFailure(f"plugin_transform '{f.plugin}' failed: {why}", ErrorCode.TOOL_ERROR)

    if built != f.expression:
        raise failed(built)
    steps = env.get("steps")
    facts = _facts(env, ctx)
    context = caller_context(facts)
    completed = mcpg_steps(steps) if isinstance(steps, Mapping) else None
    document = {
        "arguments": env.get("args"),
        "tool_name": f.tool_name,
        "steps": completed,
        "context": {k: context.get(k) for k in _JSONATA_CONTEXT},
        # The names of mcpg's pipelines doc, beside those the plugin gets (mcpg as released gives only those).
        "original_args": env.get("args"),
        "completed_steps": completed,
        "request_context": request_context(facts),
    }
    # jsonata-core in a worker thread, bounded by the expression deadline (mcpipe's, D1012 past it); its
    # compiled expression stays on the thread that made it, so it is compiled there.
    import jsonatapy

    timeout = int(expression_timeout_ms())

    def evaluate() -> tuple[bool, Any]:
        # Nothing of the engine leaves the thread (not even in a traceback): it must be dropped here too.
        expression = jsonatapy.compile(f.expression)
        try:
            return True, expression.evaluate(document, timeout=timeout)
        except (ValueError, TypeError) as e:
            return False, str(e)
        finally:
            del expression

    ok, value = await trio.to_thread.run_sync(evaluate, abandon_on_cancel=True, limiter=_jsonata_threads())
    if not ok:
        raise failed(f"evaluation error: {_jsonata_category(value)} error: {value}")
    size = len(sorted_json(value))
    if size > f.max_output_bytes:
        raise failed(f"jsonata output {size} bytes exceeds max_output_bytes ({f.max_output_bytes})")
    return StepOutput.of(value)


_JSONATA_CONTEXT = ("principal_id", "trust_level", "session_id", "transport", "roles", "groups", "scopes", "attributes")
# jsonata-core's ``EvaluatorError`` is a Type, Reference or Evaluation error (its ``Display`` names which: the
# plugin's words); its Python binding gives the message alone. Which variant a message comes from, as the
# engine's sources raise them: a call of something that is no function named by `$name` (T1005, T1006) is a
# reference error; type codes (T) are type errors but those the evaluator raises as evaluation errors; the
# rest (D, U, uncoded) are evaluation errors.
_JSONATA_EVALUATION_T = frozenset({"T1007", "T1008", "T2003", "T2004", "T2009", "T2011", "T2012"})
_JSONATA_TYPE_OTHER = frozenset({"D1002", "D3012", "S0212"})


def _jsonata_category(message: str) -> str:
    code = message[:5] if len(message) > 5 and message[5] == ":" else ""
    if code == "T1005" or message == "Parent context not available":
        return "Reference"
    if code == "T1006" and message.startswith("T1006: Attempted to invoke a non-function"):
        rest = message.removeprefix("T1006: Attempted to invoke a non-function")
        return "Reference" if rest == "" or rest.startswith(": $") else "Type"
    if (code.startswith("T") and code not in _JSONATA_EVALUATION_T) or code in _JSONATA_TYPE_OTHER:
        return "Type"
    return "Evaluation"


_jsonata_threads = RunLimiter("mcpipe_mcpg_jsonata", 4)


class FailFields(StepFields, tag="mcpg.fail", kw_only=True):
    """A binding mcpg serves but cannot run (a pipeline whose steps it does not decode): each call's result is
    its error ``message``, as mcpg answers it."""

    message: str


async def run_fail(
    step: Leaf[FailFields, None], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    return StepOutput.of(_result(step.fields.message, None, True))


# --- log (a pipeline's notification step) -----------------------------------------------------------


class McpgLogFields(StepFields, tag="mcpg.log", kw_only=True):
    """mcpg's ``log`` pipeline step whose ``data`` holds ``${…}``: each such string of it interpolated over the
    pipeline context, as mcpg's pipelines doc writes one (``data: "Charging order ${original_args.order_id}"``),
    then sent to the caller as a ``notifications/message``. (mcpg as released sends ``data`` as written.)"""

    data: Any = None
    level: Literal["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"] = "info"
    logger: str | None = None
    tool_name: str = ""


def _templates_of(b: Build[_SF], value: object, where: str) -> Any:
    """``value`` with each string holding ``${`` compiled (a :class:`McpgTemplate`), the rest as it is."""
    if isinstance(value, str):
        return _compile(b, value, where) if "${" in value else value
    if isinstance(value, Mapping):
        return {k: _templates_of(b, v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_templates_of(b, v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


async def _resolved(value: object, cel: Mapping[str, object]) -> Any:
    if isinstance(value, McpgTemplate):
        return await value.resolve_async(cel)
    if isinstance(value, dict):
        return {k: await _resolved(v, cel) for k, v in value.items()}
    if isinstance(value, list):
        return [await _resolved(v, cel) for v in value]
    return value


def _build_log(b: Build[McpgLogFields]) -> Any:
    f = b.decoded()
    data = _templates_of(b, f.data, f"{b.location}.data")
    if b.failed:
        b.fail()
    return data


async def run_log(
    step: Leaf[McpgLogFields, object], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    f = step.fields
    steps = env.get("steps")
    cel = cel_env(
        env.get("args"), f.tool_name, _facts(env, ctx), mcpg_steps(steps) if isinstance(steps, Mapping) else {}
    )
    try:
        data = await _resolved(step.built, cel)
    except ExpressionError as e:
        raise StepFailure(f"log data: {e}", ErrorCode.INTERPOLATION_FAILED) from None
    await ctx.send_log(f.level, data, f.logger)
    return StepOutput.of(data)


# --- registration ----------------------------------------------------------------------------------


def retryable(result: Mapping[str, Any], rc: McpgRetry) -> bool:
    """``error_result_is_retryable``: a text block's own classification (``retryable``, ``statusCode``,
    ``kind: transport_error``) decides; unclassified text retries on a transport word."""
    for block in result.get("content") or []:
        text = block.get("text") if isinstance(block, Mapping) and block.get("type") == "text" else None
        if not isinstance(text, str):
            continue
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError:
            data = None
        if isinstance(data, Mapping):
            if data.get("retryable") is True:
                return True
            status = data.get("statusCode")
            if isinstance(status, int) and not isinstance(status, bool) and status in rc.retry_on_status_codes:
                return True
            if rc.retry_on_transport_error and data.get("kind") == "transport_error":
                return True
            if "retryable" in data or "kind" in data or "statusCode" in data:
                continue
        if rc.retry_on_transport_error and any(w in text for w in ("connection", "timeout", "transport")):
            return True
    return False


def _binding_call(kind: str, run: RunFn[_MF, _B]) -> RunFn[_MF, _B]:
    """A backend kind's ``run`` as a binding's own call (not a pipeline's step): tried again as mcpg's
    ``dispatch_with_retries`` does when the binding has a ``retry``, and its result given the ``_meta.audit``
    every binding-plugin dispatch of mcpg attaches (``binding_audit_meta``)."""

    async def call(
        step: Leaf[_MF, _B], inputs: dict[str, Any], env: Mapping[str, object], ctx: ToolContext
    ) -> StepOutput:
        if step.fields.answer != "result":
            return await run(step, inputs, env, ctx)
        rc = step.fields.retry
        n = 0
        while True:
            out = await run(step, inputs, env, ctx)
            result = out.output if isinstance(out, StepOutput) else None
            if (
                rc is None
                or n == rc.max_attempts
                or not isinstance(result, Mapping)
                or not result.get("isError")
                or not retryable(result, rc)
            ):
                break
            await trio.sleep(rc.initial_backoff_ms * 2**n / 1000)
            n += 1
        if isinstance(result, dict):
            outcome = "error" if result.get("isError") else "success"
            audit = {"backend_kind": kind, "binding_profile": step.fields.profile, "outcome": outcome}
            result["_meta"] = {"audit": audit}
        return out

    return call


_KINDS: list[Kind[Any, Any]] = [
    Kind("mcpg.http", HttpFields, _binding_call("http", run_http), build=_build_http, own_deadline=True),
    Kind("mcpg.grpc", GrpcFields, _binding_call("grpc", run_grpc), build=_build_http, own_deadline=True),
    Kind("mcpg.mock", MockFields, _binding_call("mock", run_mock), build=_build_mock),
    Kind("mcpg.command", CommandFields, _binding_call("command", run_command), build=_build_command, own_deadline=True),
    Kind("mcpg.nats", NatsFields, _binding_call("nats", run_nats), build=_build_nats, own_deadline=True),
    Kind("mcpg.kafka", KafkaFields, _binding_call("kafka", run_kafka), build=_build_kafka, own_deadline=True),
    Kind("mcpg.sql", SqlFields, _binding_call("sql", run_sql), build=_build_sql, own_deadline=True),
    Kind("mcpg.unset", UnsetFields, run_unset),
    Kind("mcpg.sql_tx", SqlTxFields, run_sql_tx, build=_build_sql_tx),
    Kind("mcpg.fail", FailFields, run_fail),
    Kind("mcpg.jsonata", JsonataFields, run_jsonata, build=_build_jsonata),
    Kind("mcpg.log", McpgLogFields, run_log, build=_build_log),
]

KIND_NAMES = tuple(k.name for k in _KINDS)
"""The ``mcpg.*`` step kinds (those of :mod:`._sqlmore` and :mod:`._debug` besides)."""

for _kind in _KINDS:
    if KINDS.get(_kind.name) is None:
        KINDS.register(_kind)

from mcpipe.formats.mcpg import _answers, _debug, _sqlmore  # noqa: E402,F401  (answer shapes, debug tools, SQL extras)
