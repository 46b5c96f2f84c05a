"""The HTTP requests of access control: discovery documents, JWK Sets, OAuth token endpoints.

Their URLs come from the operator's config, never from a caller; still, unless ``allow_private`` is set,
a host that resolves to a private, loopback or link-local address is refused (an issuer URL pointed at the
metadata service must not become a way in), and redirects are not followed. Bodies are capped.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson
import trio

from mcpipe._redact import redact
from mcpipe._util import read_capped
from mcpipe.errors import MCPipeError

if TYPE_CHECKING:
    import httpx2

__all__ = ["FetchError", "Fetched", "fetch", "get_json", "post_form"]

MAX_BODY_BYTES = 1024 * 1024
"""The largest discovery document, JWK Set or token response read."""


class FetchError(MCPipeError):
    """An access-control request failed; ``status`` is the HTTP status when there was one, ``oauth_error``
    the RFC 6749 ``error`` code the endpoint answered (never its description: it may echo secrets)."""

    def __init__(self, message: str, status: int | None = None, oauth_error: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.oauth_error = oauth_error


async def _check_host(url: httpx2.URL, allow_private: bool) -> None:
    if url.scheme not in ("http", "https"):
        raise FetchError(f"scheme '{url.scheme}' is not allowed (only http and https)")
    if allow_private:
        return
    host = url.host
    try:
        addresses = [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        infos = await trio.socket.getaddrinfo(
            host, url.port or (443 if url.scheme == "https" else 80), type=socket.SOCK_STREAM
        )
        addresses = [ipaddress.ip_address(str(i[4][0]).split("%", 1)[0]) for i in infos]
    for address in addresses:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if not address.is_global:
            raise FetchError(f"'{host}' resolves to {address}, a non-public address (set `allow_private` to allow it)")


class Fetched(NamedTuple):
    """An answer as read: its status, headers (lower-case names) and body (capped)."""

    status: int
    headers: dict[str, str]
    body: bytes


async def fetch(
    method: str,
    url: str,
    *,
    timeout_ms: float,
    allow_private: bool,
    data: Mapping[str, str] | None = None,
    json: object = None,
    headers: Mapping[str, str] | None = None,
) -> Fetched:
    """One guarded request (see the module docstring), whatever its status.

    Raises:
        FetchError: it could not be made, timed out, or its body was larger than :data:`MAX_BODY_BYTES`.
    """
    import httpx2  # with the first fetch (JWKS, introspection, token exchange)

    try:
        parsed = httpx2.URL(url)
    except httpx2.InvalidURL as exc:
        raise FetchError(f"invalid URL: {exc}") from None
    with trio.move_on_after(timeout_ms / 1000) as scope:
        try:
            await _check_host(parsed, allow_private)
            async with httpx2.AsyncClient(timeout=None, follow_redirects=False, trust_env=False) as client:
                sent = {"accept": "application/json", **(headers or {})}
                async with client.stream(
                    method, parsed, data=dict(data) if data is not None else None, json=json, headers=sent
                ) as r:
                    body, larger = await read_capped(r, MAX_BODY_BYTES)
                    if larger:
                        raise FetchError(f"the answer of {parsed.host} is larger than {MAX_BODY_BYTES} bytes")
                    return Fetched(r.status_code, {k.lower(): v for k, v in r.headers.items()}, body)
        except httpx2.HTTPError as exc:
            raise FetchError(f"request to {parsed.host} failed: {type(exc).__name__}: {exc}") from None
        except OSError as exc:
            raise FetchError(f"request to {parsed.host} failed: {exc}") from None
    assert scope.cancelled_caught
    raise FetchError(f"{parsed.host} did not answer within {timeout_ms:g} ms")


def _json(status: int, body: bytes, what: str) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise FetchError(f"{what} is not JSON (HTTP {status})", status) from None


async def get_json(url: str, *, timeout_ms: float, allow_private: bool, what: str) -> Any:
    """GET a JSON document (a 2xx answer).

    Raises:
        FetchError: it could not be fetched, was not 2xx, or is not JSON.
    """
    status, _, body = await fetch("GET", url, timeout_ms=timeout_ms, allow_private=allow_private)
    if not 200 <= status < 300:
        raise FetchError(f"{what} answered HTTP {status}", status)
    return _json(status, body, what)


_ERROR_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")
"""An error code of RFC 6749 §5.2 (and RFC 8693's ``invalid_target``): lower-case words joined by ``_``."""
_SECRET_FIELDS = ("client_secret", "subject_token", "assertion")
"""The form fields a token request carries secrets in."""


async def post_form(
    url: str,
    form: Mapping[str, str],
    *,
    timeout_ms: float,
    allow_private: bool,
    what: str,
    headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """POST ``application/x-www-form-urlencoded`` to an OAuth token endpoint; answers its JSON object.

    Raises:
        FetchError: the endpoint could not be reached, refused (its ``error`` code kept), or did not answer
            a JSON object.
    """
    status, _, body = await fetch(
        "POST", url, timeout_ms=timeout_ms, allow_private=allow_private, data=form, headers=headers
    )
    if not 200 <= status < 300:
        code = None
        try:
            parsed = orjson.loads(body)
            code = parsed.get("error") if isinstance(parsed, dict) and isinstance(parsed.get("error"), str) else None
        except orjson.JSONDecodeError:
            pass
        suffix = ""
        if code is not None:
            # An RFC 6749 error code is a word (`invalid_client`); anything else is not shown, since an endpoint
            # may echo what it was sent (the client secret, the caller's token) into it.
            secrets = [form.get(k) for k in _SECRET_FIELDS]
            code = redact(code, secrets) if _ERROR_CODE.fullmatch(code) else None
            suffix = f" (error: {code})" if code else " (its `error` is not an RFC 6749 error code: not shown)"
        raise FetchError(f"{what} answered HTTP {status}{suffix}", status, code)
    doc = _json(status, body, what)
    if not isinstance(doc, dict):
        raise FetchError(f"{what} did not answer a JSON object", status)
    return doc
