"""Clients for the tests: the SDK's Client over HTTP with a bearer token."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any


def bearer_client(url: str, token: str | None, mode: str = "auto", **callbacks: Any) -> Any:
    """An SDK Client for ``url`` sending ``Authorization: Bearer <token>`` (``callbacks``: the Client's
    elicitation, sampling and roots callbacks)."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    @asynccontextmanager
    async def transport() -> AsyncIterator[Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        async with create_mcp_http_client(headers=headers) as http, streamable_http_client(url, http_client=http) as s:
            yield s

    return Client(transport(), mode=mode, **callbacks)
