"""The ``http`` step kind: one HTTP request, behind the operator's :class:`HttpPolicy`.

Every request goes through :class:`~mcpipe.kinds._guarded._GuardedTransport`: it checks the URL's host
against the allowlist, resolves it, checks every address, and sends the request to the checked address
(keeping the ``Host`` header and TLS server name of the URL). Redirects, when a step follows them, are
requests of their own and pass through the same check; so a template cannot make the server reach a host
the operator did not allow, and DNS cannot be made to answer differently between the check and the
connection.

Requests use ``httpx2`` (the client the MCP SDK ships), which runs on Trio natively.
"""

from __future__ import annotations

import codecs
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, NamedTuple

import msgspec
import orjson
import trio

from mcpipe._describe import json_type
from mcpipe._template import Template
from mcpipe._url import UrlRefused, check_templated_url
from mcpipe._util import read_capped
from mcpipe.access import CredentialError, Credentials
from mcpipe.errors import ErrorCode
from mcpipe.kinds._base import Build, Kind, StepFields
from mcpipe.kinds._policy import ForbiddenError, HttpPolicy, StepPolicy
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

if TYPE_CHECKING:
    import httpx2

__all__ = [
    "KIND",
    "HttpBuilt",
    "HttpFields",
    "HttpRequestFailed",
    "HttpResponse",
    "check_static_url",
    "check_url",
    "guarded_client",
    "header_values",
    "http_timeout",
    "is_json_type",
    "run_http",
    "safe_url",
    "send_request",
]

_SCHEMES = ("http", "https")


def guarded_client(policy: HttpPolicy, *, follow_redirects: bool = False) -> httpx2.AsyncClient:
    """An HTTP client whose every request goes through ``policy`` (hosts, addresses; see the module), for
    code that makes HTTP requests its own way (the OpenAPI tools, the registries)."""
    return _client(policy, follow_redirects)


def _client(policy: HttpPolicy, follow_redirects: bool) -> httpx2.AsyncClient:
    from mcpipe.kinds._guarded import client  # httpx2 with the first request, not with the registry

    return client(policy, follow_redirects)


class HttpRequestFailed(StepFailure):
    """A request that got no whole response: the URL is invalid, the connection or the body broke off, the
    redirects ran out, or ``timeout_s`` passed. Its message is the core's; a format that words transport
    failures its own way (its HTTP bindings) reads ``stage`` and ``timed_out`` instead.

    Attributes:
        stage: ``url`` (it did not parse), ``send`` (no response arrived), ``read`` (the body broke off).
        timed_out: ``timeout_s`` passed (at ``stage``).
    """

    def __init__(self, message: str, stage: Literal["url", "send", "read"], timed_out: bool = False) -> None:
        super().__init__(message, ErrorCode.TOOL_FAILED)
        self.stage = stage
        self.timed_out = timed_out


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """A response read whole (or its first ``max_bytes``, when the request allowed truncation).

    Attributes:
        status: the status code.
        headers: the response's headers, as they came (several of a name kept).
        body: the body's bytes.
        truncated: the body was longer than ``max_bytes`` (and ``body`` is its first ``max_bytes``).
        charset: the charset the ``content-type`` names, if any.
    """

    status: int
    headers: httpx2.Headers
    body: bytes
    truncated: bool = False
    charset: str | None = None

    @property
    def content_type(self) -> str | None:
        return self.headers.get("content-type")

    def header_map(self) -> dict[str, str]:
        """The headers by lower-case name, several of a name joined with ``, ``."""
        out: dict[str, str] = {}
        for k, v in self.headers.multi_items():
            key = k.lower()
            out[key] = f"{out[key]}, {v}" if key in out else v
        return out

    def decoded(self, require_json: bool = False) -> tuple[Any, bool]:
        """The body as JSON when it is JSON (by its content type, or ``require_json``), else as text in its
        charset (UTF-8 when it names none, or none Python should decode). Answers ``(body, parsed)``."""
        if require_json or is_json_type(self.content_type or ""):
            try:
                return orjson.loads(self.body), True
            except orjson.JSONDecodeError:
                pass
        encoding = self.charset or "utf-8"
        try:
            if codecs.lookup(encoding).name not in _NOT_CHARSETS:
                return self.body.decode(encoding, errors="replace"), False
        except (LookupError, UnicodeError):
            pass
        return self.body.decode("utf-8", errors="replace"), False


async def send_request(
    policy: HttpPolicy,
    method: str,
    url: str,
    *,
    headers: Mapping[str, str] | list[tuple[str, str]] | None = None,
    params: Any = None,
    content: bytes | None = None,
    follow_redirects: bool = False,
    max_bytes: int | None = None,
    truncate: bool = False,
    timeout_s: float | None = None,
) -> HttpResponse:
    """Send one request through ``policy`` (hosts, addresses: see the module) and read its body.

    Args:
        policy: the outbound policy.
        method, url, headers, params, content: the request (``params``: its query, as httpx takes it).
        follow_redirects: follow redirects (each one a request checked like the first).
        max_bytes: the most body read; default the policy's ``max_response_bytes``.
        truncate: a longer body is cut at ``max_bytes`` (``truncated``), rather than failing the request.
        timeout_s: a deadline for the whole exchange; past it :class:`HttpRequestFailed` with ``timed_out``.
            None: the caller's deadline (the step's cancel scope) bounds it.

    Raises:
        HttpRequestFailed: no whole response (see its ``stage``).
        StepFailure: the body is larger than ``max_bytes`` (without ``truncate``).
        ForbiddenError: the policy refuses the host, the address or the scheme.
    """
    import httpx2

    from mcpipe.kinds._guarded import TRANSPORT_ERRORS

    limit = policy.max_response_bytes if max_bytes is None else max_bytes
    stage: Literal["url", "send", "read"] = "url"
    try:
        with trio.fail_after(timeout_s) if timeout_s is not None else contextlib.nullcontext():
            async with _client(policy, follow_redirects) as client:
                request = client.build_request(method, url, headers=headers, params=params, content=content)
                stage = "send"
                response = await client.send(request, stream=True)
                stage = "read"
                try:
                    body, larger = await read_capped(response, limit)
                finally:
                    await response.aclose()
    except trio.TooSlowError:
        raise HttpRequestFailed(
            f"request to {safe_url(url)} did not answer within {timeout_s:g} s", stage, timed_out=True
        ) from None
    except httpx2.TooManyRedirects as e:
        raise HttpRequestFailed(f"too many redirects: {e}", stage) from None
    except httpx2.InvalidURL as e:
        raise HttpRequestFailed(f"invalid URL '{url}': {e}", stage) from None
    except (httpx2.HTTPError, *TRANSPORT_ERRORS) as e:
        raise HttpRequestFailed(f"request to {safe_url(url)} failed: {type(e).__name__}: {e}", stage) from None
    except OSError as e:  # name resolution
        raise HttpRequestFailed(f"request to {safe_url(url)} failed: {e}", stage) from None
    if larger and not truncate:
        raise StepFailure(f"the response body is larger than {limit} bytes", ErrorCode.TOOL_FAILED)
    return HttpResponse(response.status_code, response.headers, body, larger, response.charset_encoding)


def safe_url(url: str) -> str:
    """The URL without its query string or credentials (they may hold secrets), for messages."""
    import httpx2

    try:
        u = httpx2.URL(url)
    except Exception:
        return "the URL"
    return str(u.copy_with(query=None, fragment=None, username=None, password=None))


def check_url(url: object) -> str:
    """A step's resolved ``url``: a non-empty http or https URL (else the step fails; a scheme is forbidden)."""
    if not isinstance(url, str) or not url:
        raise StepFailure(f"`url` must be a non-empty string, got {url!r}", ErrorCode.TOOL_FAILED)
    import httpx2

    try:
        scheme = httpx2.URL(url).scheme
    except httpx2.InvalidURL as e:
        raise StepFailure(f"invalid URL: {e}", ErrorCode.TOOL_FAILED) from None
    if scheme not in _SCHEMES:
        raise ForbiddenError(f"scheme '{scheme}' is not allowed (only http and https)")
    return url


def header_values(value: object) -> dict[str, str] | None:
    """A step's resolved ``headers`` (an object, or null) as strings (non-strings as JSON; null values left out)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise StepFailure(f"`headers` must be an object, got {type(value).__name__}", ErrorCode.TOOL_FAILED)
    out: dict[str, str] = {}
    for k, v in value.items():
        if v is None:
            continue
        out[str(k)] = v if isinstance(v, str) else orjson.dumps(v).decode()
    return out


def _query(value: object) -> list[tuple[str, str]] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise StepFailure(f"`query` must be an object, got {type(value).__name__}", ErrorCode.TOOL_FAILED)
    out: list[tuple[str, str]] = []
    for k, v in value.items():
        for item in v if isinstance(v, list) else [v]:
            if item is None:
                continue
            out.append((str(k), _text(item)))
    return out


def _text(v: object) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    return orjson.dumps(v).decode()


def is_json_type(content_type: str) -> bool:
    """``application/json`` or a ``+json`` media type (parameters ignored)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


# Python codecs a response may name that are no charsets: punycode decodes in quadratic time (a large body
# would block the server), idna cannot replace errors.
_NOT_CHARSETS = frozenset({"punycode", "idna"})


StatusCode = Annotated[int, msgspec.Meta(ge=100, le=599)]
HttpMethod = Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class HttpFields(StepFields, tag="http"):
    """One HTTP request. ``url``, ``headers``, ``query`` and ``body`` are templates.

    An object or array ``body`` is sent as JSON; a string as text; null sends no body.
    ``expected_status_codes`` defaults to any 2xx.
    """

    url: Any
    method: HttpMethod = "GET"
    headers: Any = None
    query: Any = None
    body: Any = None
    expected_status_codes: list[StatusCode] | None = None
    require_json_response: bool = False
    follow_redirects: bool = False
    credential: str | None = None
    """A ``[credentials.NAME]`` whose token the request carries (minted per caller for ``token_exchange`` and
    ``id_jag``), in ``credential_header`` as ``credential_prefix`` + token + ``credential_suffix``; without a
    prefix, ``<token type> <token>`` (``Bearer ...``)."""
    credential_header: str = "Authorization"
    credential_prefix: str | None = None
    credential_suffix: str = ""


class HttpBuilt(NamedTuple):
    """What an ``http`` step runs with: the outbound policy, the credentials it may present, and whether its
    ``url`` is a template (then its resolved URL is checked against ``url_base``, ``mcpipe._url``)."""

    http: HttpPolicy
    credentials: Credentials
    url_templated: bool = False
    url_base: str | None = None


def build_http(b: Build[Any]) -> HttpBuilt:
    """The policy the step runs under; a URL without placeholders is checked against it at load, and a named
    credential must exist."""
    url = b.templates.get("url")
    check_static_url(b, url, f"{b.location}.url", b.policy)
    fields = b.fields
    name = getattr(fields, "credential", None)
    if name is not None and name not in b.policy.credentials:
        b.problem(f"{b.location}.credential", f"no credential `{name}` in [credentials]", ErrorCode.INVALID_CONFIG)
    templated = url is not None and not url.is_constant
    return HttpBuilt(b.policy.http, b.policy.credentials, templated, url.url_base if url is not None else None)


def check_static_url(b: Build[Any], url: Template | None, loc: str, policy: StepPolicy) -> None:
    """A URL without placeholders is checked against the allowlist at load, not at the first call."""
    if url is None or url.reference_sites:
        return
    value = url.resolve({})
    if not isinstance(value, str):
        b.problem(loc, f"`url` must be a string, got {json_type(value)}")
        return
    import httpx2  # a static URL's check; a config without one never loads the HTTP client

    try:
        parsed = httpx2.URL(value)
    except httpx2.InvalidURL as e:
        b.problem(loc, f"invalid URL: {e}")
        return
    if parsed.scheme not in ("http", "https"):
        b.problem(loc, f"scheme '{parsed.scheme}' is not allowed (only http and https)", ErrorCode.FORBIDDEN)
    elif not policy.http.host_allowed(parsed.host):
        b.problem(loc, policy.http.host_refused(parsed.host), ErrorCode.FORBIDDEN)


def http_timeout(policy: StepPolicy) -> float | None:
    """Steps that wait on the outside world get the operator's default deadline."""
    return policy.http.timeout_ms


def _upper_method(raw: dict[str, Any]) -> None:
    if isinstance(raw.get("method"), str):
        raw["method"] = raw["method"].upper()


async def run_http(
    step: Leaf[HttpFields, HttpBuilt], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """One HTTP request; the output is ``{status, headers, body}`` (body parsed when it is JSON)."""
    spec = step.fields
    policy = step.built.http
    url = check_url(inputs["url"])
    if step.built.url_templated:
        try:
            check_templated_url(url, step.built.url_base)
        except UrlRefused as exc:
            raise StepFailure(f"refused the URL {safe_url(url)}: {exc}", ErrorCode.FORBIDDEN) from None
    headers = header_values(inputs.get("headers")) or {}
    if spec.credential is not None:
        try:
            issued = await step.built.credentials.issue(spec.credential, ctx.identity)
        except CredentialError as exc:
            raise StepFailure(str(exc), ErrorCode.TOOL_FAILED) from None
        value = (
            issued.authorization()
            if spec.credential_prefix is None
            else f"{spec.credential_prefix}{issued.token}{spec.credential_suffix}"
        )
        headers = {k: v for k, v in headers.items() if k.lower() != spec.credential_header.lower()}
        headers[spec.credential_header] = value
    body = inputs.get("body")
    content: bytes | None = None
    if isinstance(body, str):
        content = body.encode()
        headers.setdefault("content-type", "text/plain; charset=utf-8")
    elif body is not None:
        content = orjson.dumps(body)
        if not any(k.lower() == "content-type" for k in headers):
            headers["content-type"] = "application/json"
    response = await send_request(
        policy,
        spec.method,
        url,
        headers=headers,
        params=_query(inputs.get("query")),
        content=content,
        follow_redirects=spec.follow_redirects,
    )
    parsed_body, parsed = response.decoded(spec.require_json_response)
    output = {"status": response.status, "headers": response.header_map(), "body": parsed_body}
    expected = spec.expected_status_codes
    good = response.status in expected if expected is not None else 200 <= response.status < 300
    if not good:
        want = ", ".join(map(str, expected)) if expected is not None else "2xx"
        raise StepFailure(
            f"HTTP {response.status} from {safe_url(url)} (expected {want})", ErrorCode.TOOL_ERROR, output
        )
    if spec.require_json_response and not parsed:
        raise StepFailure(f"the response from {safe_url(url)} is not JSON", ErrorCode.TOOL_ERROR, output)
    return StepOutput.of(output)


KIND = Kind(
    "http",
    HttpFields,
    run_http,
    templates=("url", "headers", "query", "body"),
    url_templates=("url",),
    build=build_http,
    default_timeout=http_timeout,
    prepare=_upper_method,
)
