"""Helpers for the piraeus format's tests (imported as ``kit.piraeus``): a stand-in for the APIs piraeus's
example tools call (Alpha Vantage's ``GLOBAL_QUOTE``, an OpenWeatherMap-like weather API, a JSON API taking
POST bodies) served on 127.0.0.1, and piraeus's exported files written with only their hosts rewritten."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from kit.llm import Asgi, lifespan, serving

UPSTREAM = Path(__file__).parent.parent / "formats" / "piraeus" / "upstream"
"""The fixtures quoted from piraeus (``tests/formats/piraeus/upstream/SOURCE.md``)."""

QUOTE = {
    "01. symbol": "IBM",
    "02. open": "141.2000",
    "03. high": "143.1000",
    "04. low": "140.8000",
    "05. price": "142.5000",
    "06. volume": "3456789",
    "07. latest trading day": "2025-11-07",
    "08. previous close": "141.2700",
    "09. change": "1.2300",
    "10. change percent": "0.8707%",
}
"""Alpha Vantage's ``GLOBAL_QUOTE`` answer for IBM, in its own field names."""


def upstream(name: str) -> dict[str, Any]:
    """One quoted fixture, decoded."""
    data: dict[str, Any] = json.loads((UPSTREAM / name).read_text())
    return data


def rehost(url: str, base: str) -> str:
    """``url`` with its scheme and host (and port) replaced by ``base``'s; the path and query kept."""
    u, b = urlsplit(url), urlsplit(base)
    return urlunsplit((b.scheme, b.netloc, u.path, u.query, u.fragment))


def rehosted(config: dict[str, Any], base: str) -> dict[str, Any]:
    """A ToolConfig (or a tool row holding one) with ``api.base_url``'s host rewritten, nothing else."""
    out = json.loads(json.dumps(config))
    inner = out["tool_config"] if "tool_config" in out and "api" not in out else out
    inner["api"]["base_url"] = rehost(inner["api"]["base_url"], base)
    return out


def write(directory: Path, name: str, data: Any) -> str:
    """Write ``data`` as JSON under ``directory``; answers the file's path relative to it."""
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return name


async def _body(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def _send(send: Any, status: int, payload: Any, content_type: str = "application/json") -> None:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = [(b"content-type", content_type.encode()), (b"x-stand-in", b"piraeus")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


@dataclass
class StandIn:
    """The APIs piraeus's example tools call, answering on 127.0.0.1 and recording every request
    (``method``, ``path``, ``query``, ``headers``, ``body``).

    - ``GET /``: ``{"service": "stand-in"}``;
    - ``GET /query?function=GLOBAL_QUOTE&symbol=S``: the quote (:data:`QUOTE`, with ``S``); without a symbol,
      Alpha Vantage's 200 with an ``Error Message``;
    - ``GET /data/2.5/weather?q=CITY``: ``{name, main: {temp, humidity}, weather: [{description}]}``;
    - ``POST|PUT|PATCH /v1/items``: ``{id, received: <the JSON body>}``;
    - ``GET /status/<code>``: that status with ``{"error": ...}``; ``GET /list``: a JSON array;
      ``GET /text``: ``text/plain``; ``GET /empty``: 204.
    """

    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> Asgi:
        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                await lifespan(receive, send)
                return
            raw = await _body(receive)
            query = dict(parse_qsl(scope["query_string"].decode()))
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            body = json.loads(raw) if raw and headers.get("content-type", "").startswith("application/json") else raw
            path, method = scope["path"], scope["method"]
            self.requests.append({"method": method, "path": path, "query": query, "headers": headers, "body": body})
            if path == "/":
                await _send(send, 200, {"service": "stand-in"})
            elif path == "/query":
                if query.get("function") == "GLOBAL_QUOTE" and query.get("symbol"):
                    await _send(send, 200, {"Global Quote": {**QUOTE, "01. symbol": query["symbol"]}})
                else:
                    await _send(
                        send, 200, {"Error Message": "Invalid API call. Please retry or visit the documentation."}
                    )
            elif path == "/data/2.5/weather":
                city = query.get("q", "")
                payload = {
                    "name": city,
                    "main": {"temp": 18.5, "humidity": 60},
                    "weather": [{"description": "clear sky"}],
                }
                await _send(send, 200, payload)
            elif path == "/v1/items" and method in ("POST", "PUT", "PATCH"):
                await _send(send, 201, {"id": 7, "received": body})
            elif path.startswith("/status/"):
                code = int(path.rsplit("/", 1)[1])
                await _send(send, code, {"error": f"status {code}"})
            elif path == "/list":
                await _send(send, 200, [{"a": 1}, {"a": 2}])
            elif path == "/text":
                await _send(send, 200, b"plain words", "text/plain")
            elif path == "/empty":
                await send({"type": "http.response.start", "status": 204, "headers": []})
                await send({"type": "http.response.body", "body": b""})
            else:
                await _send(send, 404, {"error": "not found"})

        return app


@asynccontextmanager
async def stand_in() -> AsyncIterator[StandIn]:
    """The stand-in APIs on a free port of 127.0.0.1."""
    api = StandIn()
    async with serving(api.app()) as base:
        api.url = base
        yield api


@asynccontextmanager
async def piraeus_app(
    directory: Path,
    files: dict[str, Any],
    *,
    model_url: str | None = None,
    doc: dict[str, Any] | None = None,
    **section: Any,
) -> AsyncIterator[Any]:
    """mcpipe serving ``files`` (written under ``directory``: ``tools/…``, ``prompts/…``, ``flows/…``) through
    a ``[piraeus]`` section (``section`` laid over the globs of the three folders), its model ``gpt`` at
    ``model_url`` (a scripted OpenAI-compatible server) when given; ``doc``: more config sections."""
    from mcpipe.config import parse_config
    from mcpipe.server import open_app

    for name, data in files.items():
        write(directory, name, data)
    kinds = {k: f"{k}/*.json" for k in ("tools", "prompts", "flows") if any(n.startswith(k + "/") for n in files)}
    config: dict[str, Any] = {"audit": {"enabled": False}, "builtins": False, **(doc or {})}
    if model_url is not None:
        config.setdefault("models", {})["gpt"] = {"base_url": model_url, "json_retries": 1}
        section.setdefault("model", "gpt")
    config["piraeus"] = {**kinds, **section}
    async with open_app(parse_config(json.dumps(config), "json", base_dir=str(directory))) as app:
        yield app
