"""The HTTP client of the ``http`` kind (and of the kinds of other formats that make HTTP requests):
:class:`_GuardedTransport` sends each request to an address the policy allows, and only there (see
:mod:`mcpipe.kinds.http`). A module of its own so that ``httpx2``/``httpcore2`` load with the first request,
not with the step kinds' registry.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpcore2
import httpx2

from mcpipe.kinds._policy import ForbiddenError, HttpPolicy

__all__ = ["TRANSPORT_ERRORS", "client"]

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


TRANSPORT_ERRORS = (
    httpcore2.NetworkError,
    httpcore2.ProtocolError,
    httpcore2.TimeoutException,
    httpcore2.UnsupportedProtocol,
    httpcore2.ProxyError,
)


def client(policy: HttpPolicy, follow_redirects: bool) -> httpx2.AsyncClient:
    """A client whose every request goes through ``policy``."""
    # Deadlines come from the step's timeout (a cancel scope), not from httpx's own timeouts.
    return httpx2.AsyncClient(
        transport=_GuardedTransport(policy),
        follow_redirects=follow_redirects,
        max_redirects=10,
        timeout=None,
        trust_env=False,
    )
