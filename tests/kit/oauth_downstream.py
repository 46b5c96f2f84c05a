"""A small real MCP server on 127.0.0.1 (the SDK's ``MCPServer`` over streamable HTTP) that records the
``Authorization`` of every request it gets, and optionally requires a bearer its authorization server issued
(checked by introspection at that server: the downstream's own side of per-user OAuth).

Its tool ``whoami`` answers the subject of the token the call carried, so a test asserts on the downstream's
side whose token reached it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from mcp.server.mcpserver import Context as McpContext

from kit.llm import _answer, _body, replaying, serving

Verify = Callable[[str], Awaitable[dict[str, Any] | None]]
"""A token -> its claims (``sub``, ``scope``), or None when it does not verify."""


@dataclass
class RecordingServer:
    """The server; ``url`` is its MCP endpoint once it serves."""

    url: str = ""
    seen: list[dict[str, Any]] = field(default_factory=list)
    """Every request: its method (JSON-RPC), its tool (for calls) and its ``authorization`` header."""
    verify: Verify | None = None
    """When set, a request without a token it verifies is answered 401 with an RFC 9728 challenge."""
    metadata: dict[str, Any] | None = None
    """The protected resource metadata it serves (RFC 9728), when it requires tokens."""
    subjects: dict[str, str] = field(default_factory=dict)
    """token -> subject, of the tokens it accepted."""
    protect: frozenset[str] | None = None
    """The JSON-RPC methods that need a token (None: every request); others may go without (and with one,
    it is checked all the same)."""

    def calls(self) -> list[dict[str, Any]]:
        """The ``tools/call`` requests it got."""
        return [s for s in self.seen if s.get("method") == "tools/call"]

    def app(self) -> Any:
        from mcp.server.mcpserver import MCPServer

        server = MCPServer("downstream")
        subjects = self.subjects

        @server.tool()
        def whoami(ctx: McpContext) -> str:
            """The subject of the token this call carried."""
            request = ctx.request_context.request
            auth = request.headers.get("authorization", "") if request is not None else ""
            return subjects.get(auth.removeprefix("Bearer "), "anonymous")

        inner = server.streamable_http_app()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                await inner(scope, receive, send)
                return
            path = scope["path"]
            if self.metadata is not None and path.startswith("/.well-known/oauth-protected-resource"):
                await _answer(send, 200, self.metadata)
                return
            if path != "/mcp":
                await _answer(send, 404, {"error": "not found"})
                return
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            record: dict[str, Any] = {"authorization": headers.get("authorization")}
            if scope["method"] == "POST":
                body = await _body(receive)
                receive = replaying(body, receive)
                try:
                    msg = json.loads(body)
                    record["method"] = msg.get("method")
                    if record["method"] == "tools/call":
                        record["tool"] = msg["params"]["name"]
                except (ValueError, AttributeError, KeyError, TypeError):
                    pass
            self.seen.append(record)
            token = (headers.get("authorization") or "").removeprefix("Bearer ").strip()
            needed = self.protect is None or record.get("method") in self.protect
            if self.verify is not None and (needed or token):
                claims = await self.verify(token) if token else None
                if claims is None:
                    base = self.url.rsplit("/", 1)[0]
                    challenge = f'Bearer resource_metadata="{base}/.well-known/oauth-protected-resource/mcp"'
                    await send(
                        {
                            "type": "http.response.start",
                            "status": 401,
                            "headers": [
                                (b"www-authenticate", challenge.encode()),
                                (b"content-type", b"application/json"),
                            ],
                        }
                    )
                    await send({"type": "http.response.body", "body": b'{"error": "invalid_token"}'})
                    return
                subjects[token] = str(claims.get("sub"))
                record["subject"] = subjects[token]
            await inner(scope, receive, send)

        return app


@asynccontextmanager
async def recording_server(**kw: Any) -> AsyncIterator[RecordingServer]:
    """A :class:`RecordingServer` on a free port of 127.0.0.1."""
    server = RecordingServer(**kw)
    async with serving(server.app()) as base:
        server.url = base + "/mcp"
        yield server
