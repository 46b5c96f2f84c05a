"""A 2025-11-25 session over raw HTTP (``kit.session``): ``initialize`` once, then any JSON-RPC request on the
session, so a request's parameters (a URI, a prompt's arguments) travel in the body only, however large,
where a stateless 2026-07-28 request would also put them in the ``mcp-name`` header."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx2
import orjson

from kit.siege import message_of

PROTOCOL = "2025-11-25"
INIT = {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "hostile", "version": "1"}}


@dataclass
class Session:
    """An initialized session of ``url``; ``headers`` go on every request (a bearer token, ...)."""

    http: httpx2.AsyncClient
    url: str
    headers: dict[str, str]
    sid: str | None = None
    next_id: int = 1

    def _headers(self) -> dict[str, str]:
        out = {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": PROTOCOL,
            **self.headers,
        }
        if self.sid is not None:
            out["mcp-session-id"] = self.sid
        return out

    async def open(self) -> Session:
        r = await self.http.post(
            self.url, content=orjson.dumps(self._message("initialize", INIT)), headers=self._headers()
        )
        assert r.status_code == 200, (r.status_code, r.text[:300])
        self.sid = r.headers["mcp-session-id"]
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await self.http.post(self.url, content=orjson.dumps(note), headers=self._headers())
        return self

    def _message(self, method: str, params: Any) -> dict[str, Any]:
        self.next_id += 1
        return {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}

    async def request(self, method: str, params: Any) -> tuple[int, Any]:
        """POST one request on the session; the HTTP status and the JSON-RPC message answered."""
        body = orjson.dumps(self._message(method, params))
        r = await self.http.post(self.url, content=body, headers=self._headers())
        return r.status_code, message_of(r) if r.content else None


async def open_session(http: httpx2.AsyncClient, url: str, **headers: str) -> Session:
    """A session of ``url``, initialized."""
    return await Session(http, url, headers).open()
