"""A real HTTP server on 127.0.0.1 for the http and graphql steps, and helpers for the kinds' tests.

The server is a tiny ASGI app served by hypercorn's Trio worker inside the test's own Trio run, so the
test can wait on what the server saw (``ServerLog`` events) without sleeping.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from kit.llm import lifespan


@dataclass
class ServerLog:
    """What the test server saw: the requests, and events a test can wait on."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    slow_started: trio.Event = field(default_factory=trio.Event)
    slow_disconnected: trio.Event = field(default_factory=trio.Event)


@dataclass
class TestServer:
    """The running server: its base URL (``http://127.0.0.1:PORT``), port and log."""

    url: str
    port: int
    log: ServerLog


def make_app(log: ServerLog):
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        path = scope["path"]
        query = dict(parse_qsl(scope["query_string"].decode()))
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        log.requests.append({"method": scope["method"], "path": path, "query": query, "headers": headers})

        async def answer(status: int, payload: Any, content_type: str = "application/json", extra=()) -> None:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            hdrs = [(b"content-type", content_type.encode()), *extra]
            await send({"type": "http.response.start", "status": status, "headers": hdrs})
            await send({"type": "http.response.body", "body": data})

        if path == "/echo":
            text = body.decode()
            try:
                parsed: Any = json.loads(text) if text else None
            except ValueError:
                parsed = text
            await answer(200, {"method": scope["method"], "query": query, "headers": headers, "body": parsed})
        elif path == "/text":
            await answer(200, b"plain words", "text/plain; charset=utf-8")
        elif path == "/charset":  # a body of `size` ASCII bytes under the `charset` the query names
            size = int(query["size"])
            await answer(200, b"a" * size + b"-" + b"99" * (size // 2), f"text/plain; charset={query['charset']}")
        elif path == "/json-as-text":
            await answer(200, b'{"a": 1}', "text/plain")
        elif path.startswith("/status/"):
            await answer(int(path.rsplit("/", 1)[1]), {"error": "as requested"})
        elif path == "/redirect":
            await answer(302, b"", "text/plain", [(b"location", query["to"].encode())])
        elif path == "/big":
            await answer(200, b"x" * 200_000, "text/plain")
        elif path == "/slow":
            log.slow_started.set()
            while (await receive())["type"] != "http.disconnect":  # waits until the client goes away
                pass
            log.slow_disconnected.set()
        elif path == "/graphql":
            request = json.loads(body)
            if "boom" in request["query"]:
                await answer(200, {"data": None, "errors": [{"message": "field 'boom' does not exist"}]})
            else:
                await answer(200, {"data": {"echo": request.get("variables"), "op": request.get("operationName")}})
        else:
            await answer(404, {"error": "not found"})

    return app


@pytest.fixture
async def http_server(nursery: trio.Nursery) -> AsyncIterator[TestServer]:
    log = ServerLog()
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 0.1
    binds = await nursery.start(serve, make_app(log), config)
    url = binds[0]
    yield TestServer(url, int(url.rsplit(":", 1)[1]), log)


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    """A named pipe in the test's directory (for :data:`kit.processes.SLEEPER`)."""
    path = tmp_path / "pids"
    os.mkfifo(path)
    return path
