"""The ``http`` and ``graphql`` executors, behind the operator's :class:`HttpPolicy`.

Every request goes through :class:`_GuardedTransport`: it checks the URL's host against the allowlist,
resolves it, checks every address, and sends the request to the checked address (keeping the ``Host``
header and TLS server name of the URL). Redirects, when a step follows them, are requests of their own
and pass through the same check; so a template cannot make the server reach a host the operator did not
allow, and DNS cannot be made to answer differently between the check and the connection.

Requests use ``httpx2`` (the client the MCP SDK ships), which runs on Trio natively.
"""

from __future__ import annotations

import codecs
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpcore2
import httpx2
import orjson

from mcpipe.declared._policy import ForbiddenError, HttpPolicy
from mcpipe.declared._step import DeclaredStep, StepFailure, StepOutput
from mcpipe.tools._base import ToolContext

__all__ = ["run_graphql", "run_http"]

_SCHEMES = ("http", "https")


class _GuardedTransport(httpx2.AsyncBaseTransport):
    """Send each request to an address the policy allows, and only there.

    It drives an ``httpcore2`` connection pool itself (rather than wrapping httpx's default transport) so
    that a body abandoned half-read (too large, or the step cancelled) closes every layer's iterator.
    """

    def __init__(self, policy: HttpPolicy) -> None:
        self._policy = policy
        self._pool = httpcore2.AsyncConnectionPool(ssl_context=policy.ssl_context, http1=True, http2=False)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        if url.scheme not in _SCHEMES:
            raise ForbiddenError(f"scheme '{url.scheme}' is not allowed (only http and https)")
        host = url.host
        port = url.port or (443 if url.scheme == "https" else 80)
        address = await self._policy.resolve(host, port)
        extensions = dict(request.extensions)
        if url.scheme == "https":
            extensions["sni_hostname"] = url.raw_host.decode("ascii")
        # The request goes to the checked address; the Host header (set by the client from the URL) and
        # the TLS server name stay the URL's host.
        pinned = httpcore2.Request(
            method=request.method,
            url=httpcore2.URL(
                scheme=url.raw_scheme,
                host=address.encode("ascii"),
                port=url.port,
                target=url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=extensions,
        )
        response = await self._pool.handle_async_request(pinned)
        return httpx2.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(response.stream),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


class _ResponseStream(httpx2.AsyncByteStream):
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async with contextlib.aclosing(self._stream.__aiter__()) as parts:
            async for part in parts:
                yield part

    async def aclose(self) -> None:
        await self._stream.aclose()


_TRANSPORT_ERRORS = (
    httpcore2.NetworkError,
    httpcore2.ProtocolError,
    httpcore2.TimeoutException,
    httpcore2.UnsupportedProtocol,
    httpcore2.ProxyError,
)


def _client(policy: HttpPolicy, follow_redirects: bool) -> httpx2.AsyncClient:
    # Deadlines come from the step's timeout (a cancel scope), not from httpx's own timeouts.
    return httpx2.AsyncClient(
        transport=_GuardedTransport(policy),
        follow_redirects=follow_redirects,
        max_redirects=10,
        timeout=None,
        trust_env=False,
    )


async def _send(
    policy: HttpPolicy,
    method: str,
    url: str,
    *,
    headers: dict[str, str] | None,
    params: Any,
    content: bytes | None,
    follow_redirects: bool,
) -> tuple[httpx2.Response, bytes]:
    """Send one request (following redirects if asked); answer the response and its body, capped."""
    limit = policy.max_response_bytes
    try:
        async with _client(policy, follow_redirects) as client:
            request = client.build_request(method, url, headers=headers, params=params, content=content)
            response = await client.send(request, stream=True)
            try:
                chunks: list[bytes] = []
                size = 0
                async with contextlib.aclosing(response.aiter_bytes()) as body:
                    async for chunk in body:
                        size += len(chunk)
                        if size > limit:
                            raise StepFailure(f"the response body is larger than {limit} bytes", "TOOL_FAILED")
                        chunks.append(chunk)
            finally:
                await response.aclose()
    except httpx2.TooManyRedirects as e:
        raise StepFailure(f"too many redirects: {e}", "TOOL_FAILED") from None
    except httpx2.InvalidURL as e:
        raise StepFailure(f"invalid URL '{url}': {e}", "TOOL_FAILED") from None
    except (httpx2.HTTPError, *_TRANSPORT_ERRORS) as e:
        raise StepFailure(f"request to {_safe_url(url)} failed: {type(e).__name__}: {e}", "TOOL_FAILED") from None
    except OSError as e:  # name resolution
        raise StepFailure(f"request to {_safe_url(url)} failed: {e}", "TOOL_FAILED") from None
    return response, b"".join(chunks)


def _safe_url(url: str) -> str:
    """The URL without its query string or credentials (they may hold secrets), for messages."""
    try:
        u = httpx2.URL(url)
    except Exception:
        return "the URL"
    return str(u.copy_with(query=None, fragment=None, username=None, password=None))


def _check_url(url: Any) -> str:
    if not isinstance(url, str) or not url:
        raise StepFailure(f"`url` must be a non-empty string, got {url!r}", "TOOL_FAILED")
    try:
        scheme = httpx2.URL(url).scheme
    except httpx2.InvalidURL as e:
        raise StepFailure(f"invalid URL: {e}", "TOOL_FAILED") from None
    if scheme not in _SCHEMES:
        raise ForbiddenError(f"scheme '{scheme}' is not allowed (only http and https)")
    return url


def _headers(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise StepFailure(f"`headers` must be an object, got {type(value).__name__}", "TOOL_FAILED")
    out: dict[str, str] = {}
    for k, v in value.items():
        if v is None:
            continue
        out[str(k)] = v if isinstance(v, str) else orjson.dumps(v).decode()
    return out


def _query(value: Any) -> list[tuple[str, str]] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise StepFailure(f"`query` must be an object, got {type(value).__name__}", "TOOL_FAILED")
    out: list[tuple[str, str]] = []
    for k, v in value.items():
        for item in v if isinstance(v, list) else [v]:
            if item is None:
                continue
            out.append((str(k), _text(item)))
    return out


def _text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    return orjson.dumps(v).decode()


def _is_json_type(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


# Python codecs a response may name that are no charsets: punycode decodes in quadratic time (a large body
# would block the server), idna cannot replace errors.
_NOT_CHARSETS = frozenset({"punycode", "idna"})


def _decode_body(response: httpx2.Response, raw: bytes, require_json: bool) -> tuple[Any, bool]:
    """The body as JSON when it is JSON (or must be), else as text. Answers (body, parsed)."""
    if require_json or _is_json_type(response.headers.get("content-type", "")):
        try:
            return orjson.loads(raw), True
        except orjson.JSONDecodeError:
            pass
    encoding = response.charset_encoding or "utf-8"
    try:
        if codecs.lookup(encoding).name not in _NOT_CHARSETS:
            return raw.decode(encoding, errors="replace"), False
    except (LookupError, UnicodeError):
        pass
    return raw.decode("utf-8", errors="replace"), False


def _response_headers(response: httpx2.Response) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in response.headers.multi_items():
        key = k.lower()
        out[key] = f"{out[key]}, {v}" if key in out else v
    return out


async def run_http(step: DeclaredStep, inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext) -> StepOutput:
    """One HTTP request; the output is ``{status, headers, body}`` (body parsed when it is JSON)."""
    spec = step.spec
    policy: HttpPolicy = step.plan
    url = _check_url(inputs["url"])
    headers = _headers(inputs.get("headers")) or {}
    body = inputs.get("body")
    content: bytes | None = None
    if isinstance(body, str):
        content = body.encode()
        headers.setdefault("content-type", "text/plain; charset=utf-8")
    elif body is not None:
        content = orjson.dumps(body)
        if not any(k.lower() == "content-type" for k in headers):
            headers["content-type"] = "application/json"
    response, raw = await _send(
        policy,
        spec.method,  # type: ignore[attr-defined]
        url,
        headers=headers,
        params=_query(inputs.get("query")),
        content=content,
        follow_redirects=spec.follow_redirects,  # type: ignore[attr-defined]
    )
    parsed_body, parsed = _decode_body(response, raw, spec.require_json_response)  # type: ignore[attr-defined]
    output = {"status": response.status_code, "headers": _response_headers(response), "body": parsed_body}
    expected = spec.expected_status_codes  # type: ignore[attr-defined]
    good = response.status_code in expected if expected is not None else 200 <= response.status_code < 300
    if not good:
        want = ", ".join(map(str, expected)) if expected is not None else "2xx"
        raise StepFailure(f"HTTP {response.status_code} from {_safe_url(url)} (expected {want})", "TOOL_ERROR", output)
    if spec.require_json_response and not parsed:  # type: ignore[attr-defined]
        raise StepFailure(f"the response from {_safe_url(url)} is not JSON", "TOOL_ERROR", output)
    return StepOutput.of(output)


async def run_graphql(
    step: DeclaredStep, inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext
) -> StepOutput:
    """One GraphQL request; the output is the response's ``data``. ``errors`` fail the step."""
    spec = step.spec
    policy: HttpPolicy = step.plan
    url = _check_url(inputs["url"])
    headers = _headers(inputs.get("headers")) or {}
    headers.setdefault("content-type", "application/json")
    headers.setdefault("accept", "application/graphql-response+json, application/json")
    variables = inputs.get("variables")
    if variables is not None and not isinstance(variables, Mapping):
        raise StepFailure(f"`variables` must be an object, got {type(variables).__name__}", "TOOL_FAILED")
    payload: dict[str, Any] = {"query": spec.operation}  # type: ignore[attr-defined]
    if variables is not None:
        payload["variables"] = variables
    if spec.operation_name is not None:  # type: ignore[attr-defined]
        payload["operationName"] = spec.operation_name  # type: ignore[attr-defined]
    response, raw = await _send(
        policy, "POST", url, headers=headers, params=None, content=orjson.dumps(payload), follow_redirects=False
    )
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        text = raw[:200].decode("utf-8", errors="replace")
        raise StepFailure(
            f"HTTP {response.status_code} from {_safe_url(url)}: not a GraphQL response: {text!r}",
            "TOOL_ERROR" if response.status_code >= 400 else "TOOL_FAILED",
        )
    errors = answer.get("errors")
    if errors:
        messages = "; ".join(
            e.get("message", str(e)) if isinstance(e, dict) else str(e)
            for e in (errors if isinstance(errors, list) else [errors])
        )
        raise StepFailure(f"GraphQL errors: {messages}", "TOOL_ERROR", answer)
    if response.status_code >= 400:
        raise StepFailure(f"HTTP {response.status_code} from {_safe_url(url)}", "TOOL_ERROR", answer)
    return StepOutput.of(answer.get("data"))
