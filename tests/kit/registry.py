"""A small MCP registry and an MCP server listed in it, both over TLS on 127.0.0.1, for the registry tests
(``kit.registry``).

The registry serves the registry API's reads (``registry.modelcontextprotocol.io``'s ``/v0.1``):
``GET /v0.1/servers`` (``limit``, ``cursor``, ``version=latest``, ``include_deleted``; at most ``page`` entries a
page, whatever the limit, so a reader must follow ``metadata.nextCursor``) and
``GET /v0.1/servers/{name}/versions/{version}``. Each entry carries the official ``_meta``
(``status``, ``isLatest``). Every request is kept in ``requests``.

The MCP server is an SDK server (tool ``whoami``) at any path ending in ``/mcp``, which records the headers of
every request it is sent (``seen``) and answers ``documents`` (path -> JSON: the OAuth metadata of discovery).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from kit.llm import _answer, _body, lifespan, replaying

OFFICIAL = "io.modelcontextprotocol.registry/official"


def self_signed(directory: Path) -> Path:
    """A certificate for 127.0.0.1 and its key (``<directory>/tls.crt``, ``tls.key``); answers the certificate
    (a client trusts it through ``SSL_CERT_FILE``)."""
    cert, key = directory / "tls.crt", directory / "tls.key"
    if not cert.exists():
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
             "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True, capture_output=True,
        )  # fmt: skip
    return cert


@asynccontextmanager
async def serving_tls(app: Any, cert: Path) -> AsyncIterator[str]:
    """Serve an ASGI app over HTTPS on 127.0.0.1 (a free port); yields its base URL."""
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.certfile, config.keyfile = str(cert), str(cert.with_suffix(".key"))
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 0.1
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve, app, config)
        try:
            yield binds[0]
        finally:
            nursery.cancel_scope.cancel()


def entry(
    name: str,
    version: str = "1.0.0",
    *,
    url: str | None = None,
    status: str = "active",
    latest: bool = True,
    headers: list[dict[str, Any]] | None = None,
    variables: dict[str, Any] | None = None,
    packages: bool = False,
) -> dict[str, Any]:
    """One registry entry (a server.json in its envelope)."""
    server: dict[str, Any] = {"name": name, "version": version, "description": f"{name} {version}"}
    if url is not None:
        remote: dict[str, Any] = {"type": "streamable-http", "url": url}
        if headers:
            remote["headers"] = headers
        if variables:
            remote["variables"] = variables
        server["remotes"] = [remote]
    if packages:
        server["packages"] = [{"registryType": "npm", "identifier": name, "version": version}]
    meta = {"status": status, "isLatest": latest, "publishedAt": "2026-01-01T00:00:00Z"}
    return {"server": server, "_meta": {OFFICIAL: meta}}


@dataclass
class Registry:
    """The registry's entries (``entry``), ``page`` of them a page."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    page: int = 2
    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                await lifespan(receive, send)
                return
            query = dict(parse_qsl(scope["query_string"].decode()))
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            path = scope["path"]
            self.requests.append({"path": path, "query": query, "authorization": headers.get("authorization")})
            if path == "/v0.1/servers":
                await _answer(send, 200, self._list(query))
                return
            prefix = "/v0.1/servers/"
            if path.startswith(prefix) and "/versions/" in path:
                name, _, version = scope["raw_path"].decode()[len(prefix) :].partition("/versions/")
                name, version = unquote(name), unquote(version)
                for e in self.entries:
                    s = e["server"]
                    if s["name"] == name and (s["version"] == version or (version == "latest" and _latest(e))):
                        await _answer(send, 200, e)
                        return
            await _answer(send, 404, {"title": "Not Found", "status": 404})

        return app

    def _list(self, query: dict[str, str]) -> dict[str, Any]:
        chosen = [
            e
            for e in self.entries
            if (query.get("version") != "latest" or _latest(e))
            and (query.get("include_deleted") == "true" or e["_meta"][OFFICIAL]["status"] != "deleted")
        ]
        start = int(query.get("cursor") or 0)
        size = min(int(query.get("limit") or 30), self.page)
        page = chosen[start : start + size]
        meta: dict[str, Any] = {"count": len(page)}
        if start + size < len(chosen):
            meta["nextCursor"] = str(start + size)
        return {"servers": page, "metadata": meta}


def _latest(e: dict[str, Any]) -> bool:
    return bool(e["_meta"][OFFICIAL]["isLatest"])


@dataclass
class Upstream:
    """The MCP server listed in the registry (``url``: its origin)."""

    url: str = ""
    seen: list[dict[str, str]] = field(default_factory=list)
    documents: dict[str, Any] = field(default_factory=dict)

    def app(self) -> Any:
        from mcp.server.mcpserver import MCPServer

        server = MCPServer("crm")

        @server.tool()
        def whoami() -> str:
            """Who the CRM thinks is calling."""
            return "crm"

        inner = server.streamable_http_app()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                await inner(scope, receive, send)
                return
            path = scope["path"]
            if path in self.documents:
                await _answer(send, 200, self.documents[path])
                return
            if not path.endswith("/mcp"):
                await _answer(send, 404, {"error": "not found"})
                return
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            body = b""
            if scope["method"] == "POST":
                body = await _body(receive)
                receive = replaying(body, receive)
                try:
                    headers["method"] = json.loads(body).get("method", "")
                except (ValueError, AttributeError):
                    pass
            self.seen.append({"path": path, **headers})
            await inner({**scope, "path": "/mcp", "raw_path": b"/mcp"}, receive, send)

        return app


def calls(upstream: Upstream) -> list[dict[str, str]]:
    """The requests of ``tools/call`` the upstream was sent (their headers)."""
    return [h for h in upstream.seen if h.get("method") == "tools/call"]


__all__ = ["Registry", "Upstream", "calls", "entry", "self_signed", "serving_tls"]
