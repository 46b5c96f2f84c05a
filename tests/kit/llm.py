"""Helpers for the model tests (imported as ``kit.llm``): a scripted OpenAI-compatible server on 127.0.0.1,
a plain HTTP API for the workflow to call, and an SDK client answering sampling.

Both servers are ASGI apps served by hypercorn's Trio worker inside the test's own Trio run.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import mcp_types as t
import trio
import yaml
from hypercorn.config import Config
from hypercorn.trio import serve

from mcpipe.tools import ToolRegistry

Asgi = Callable[..., Any]

LOOKUPS: list[str] = []
"""Every call of the side-effecting `lookup` tool, in order (a resume that ran it again would show)."""

counting = ToolRegistry()


@counting.tool
def lookup(said: str) -> dict[str, Any]:
    """Look something up (a side effect: every call is recorded)."""
    LOOKUPS.append(said)
    return {"said": said, "n": len(LOOKUPS)}


BROKEN = """\
metadata:
  name: broken
mcp:
  models:
    - name: gpt-5
    - name: gpt-5
  tools:
    - name: search
      type: http
      spec: {url: "https://search/api?q={{ input.query }}"}
    - name: db
      type: postgres
      spec: {sql: "select 1"}
  resources:
    - name: kb
      type: value
      spec: {value: 1}
  prompts:
    - name: summarize
      template: "{{ input.text"
  turns:
    - name: t1
      model: gpt-5
      user:
        - use: resource:kbb
        - use: prompt:summarise
    - name: t2
      model: gpt5
      user:
        - text: "{{ resources.nope }} {{ turns.t3.text }} {{ secret.x }}"
      tools_allowed: [search, serch]
      save: {storage: s3}
"""
"""A playbook with one of each validation problem (the tests and docs/playbooks.md list its errors)."""


async def _body(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


def replaying(body: bytes, receive: Any) -> Any:
    """An ASGI ``receive`` that gives ``body`` (already read by :func:`_body`) once more, then goes on with
    ``receive``: for a server that looks at a request's body before handing the request on."""
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def lifespan(receive: Any, send: Any) -> None:
    """Answer an ASGI lifespan scope (for the small servers the tests write)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _answer(send: Any, status: int, payload: Any, content_type: str = "application/json") -> None:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", content_type.encode())]})
    await send({"type": "http.response.body", "body": data})


def text(content: str) -> dict[str, Any]:
    """A scripted chat-completions answer whose message says ``content``."""
    return {"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}


def tool_call(name: str, arguments: Any, call_id: str = "call_1") -> dict[str, Any]:
    """A scripted answer calling one tool (``arguments`` a dict, or raw text for malformed ones)."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "message": {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}],
        },
        "finish_reason": "tool_calls",
    }


def http_error(status: int, message: str) -> dict[str, Any]:
    """A scripted HTTP error answer."""
    return {"status": status, "json": {"error": {"message": message, "type": "invalid_request_error"}}}


@dataclass
class FakeOpenAI:
    """A chat-completions endpoint answering from a script, one entry per request, in order.

    Each entry is a choice (``text(...)``, ``tool_call(...)``), ``{"status", "json"}`` for an HTTP error,
    or a callable taking the request body and answering one of those. ``requests`` holds every request
    body, ``headers`` their headers.
    """

    url: str = ""
    script: deque[Any] = field(default_factory=deque)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def says(self, *entries: Any) -> FakeOpenAI:
        self.script.extend(entries)
        return self

    def app(self) -> Asgi:
        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                await lifespan(receive, send)
                return
            body = await _body(receive)
            if scope["path"] != "/v1/chat/completions" or scope["method"] != "POST":
                await _answer(send, 404, {"error": {"message": "not found"}})
                return
            request = json.loads(body)
            self.requests.append(request)
            self.headers.append({k.decode().lower(): v.decode() for k, v in scope["headers"]})
            if not self.script:
                await _answer(send, 500, {"error": {"message": "the test's script is exhausted"}})
                return
            entry = self.script.popleft()
            if callable(entry):
                entry = entry(request)
            if "status" in entry:
                await _answer(send, entry["status"], entry.get("json", {}))
                return
            await _answer(
                send,
                200,
                {
                    "id": f"chatcmpl-{len(self.requests)}",
                    "object": "chat.completion",
                    "model": request.get("model", "fake"),
                    "choices": [{"index": 0, **entry}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                },
            )

        return app


@dataclass
class FakeApi:
    """A plain JSON API: ``/quote`` answers a stock quote, ``/missing`` a 404, everything is recorded."""

    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> Asgi:
        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                await lifespan(receive, send)
                return
            body = await _body(receive)
            query = dict(parse_qsl(scope["query_string"].decode()))
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            self.requests.append(
                {"method": scope["method"], "path": scope["path"], "query": query, "headers": headers, "body": body}
            )
            if scope["path"] == "/query" and query.get("symbol"):
                symbol = query["symbol"]
                await _answer(send, 200, {"Global Quote": {"01. symbol": symbol, "05. price": "142.50"}})
            elif scope["path"] == "/query":
                await _answer(send, 400, {"Error Message": "symbol is required"})
            elif scope["path"] == "/echo":
                parsed = json.loads(body) if body else None
                seen = {"method": scope["method"], "query": query, "body": parsed}
                if "authorization" in headers:
                    seen["authorization"] = headers["authorization"]
                await _answer(send, 200, seen)
            elif scope["path"].startswith("/users/"):
                parsed = json.loads(body) if body else None
                await _answer(send, 201, {"method": scope["method"], "path": scope["path"], "body": parsed})
            elif scope["path"] == "/search":
                await _answer(send, 200, {"hits": [{"title": f"About {query.get('q', '')}"}]})
            else:
                await _answer(send, 404, {"error": "not found"})

        return app


@asynccontextmanager
async def serving(app: Asgi) -> AsyncIterator[str]:
    """Serve an ASGI app on 127.0.0.1 (a free port) for the block; yields its base URL."""
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 0.1
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve, app, config)
        try:
            yield binds[0]
        finally:
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def fake_openai(*entries: Any) -> AsyncIterator[FakeOpenAI]:
    fake = FakeOpenAI().says(*entries)
    async with serving(fake.app()) as base:
        fake.url = base + "/v1"
        yield fake


@asynccontextmanager
async def fake_api() -> AsyncIterator[FakeApi]:
    api = FakeApi()
    async with serving(api.app()) as base:
        api.url = base
        yield api


class Sampler:
    """The client's side of sampling: a real SDK callback answering from a script, recording requests."""

    def __init__(self, *answers: Any) -> None:
        self.answers = deque(answers)
        self.requests: list[t.CreateMessageRequestParams] = []

    async def __call__(self, context: Any, params: t.CreateMessageRequestParams) -> Any:
        self.requests.append(params)
        answer = self.answers.popleft() if self.answers else "out of answers"
        if isinstance(answer, dict):  # a tool use
            return t.CreateMessageResultWithTools(
                role="assistant",
                content=[
                    t.ToolUseContent(type="tool_use", id=answer["id"], name=answer["name"], input=answer["input"])
                ],
                model="client-model",
                stop_reason="toolUse",
            )
        return t.CreateMessageResult(
            role="assistant", content=t.TextContent(type="text", text=answer), model="client-model"
        )


def lookup_playbook(tmp_path: Path) -> dict[str, Any]:
    """A config serving one playbook (``pb/tools``) whose turn, on the client's model, may call the
    ``lookup`` tool (``kit.llm:counting``) with ``{"said": ...}``; the playbook file is written in ``tmp_path``."""
    doc = {
        "metadata": {"path": "pb/tools", "name": "with_tools"},
        "mcp": {
            "models": [{"name": "client", "provider": "sampling"}],
            "tools": [
                {
                    "name": "lookup",
                    "type": "tool",
                    "description": "Echo what it is given",
                    "input_schema": {"type": "object", "properties": {"said": {"type": "string"}}},
                    "spec": {"tool": "lookup"},
                }
            ],
            "turns": [{"name": "t", "model": "client", "user": ["Look up {{ input.q }}"], "tools_allowed": ["lookup"]}],
        },
    }
    (tmp_path / "pb.yaml").write_text(yaml.safe_dump(doc))
    return {"audit": {"enabled": False}, "python_tools": ["kit.llm:counting"], "playbooks": ["pb.yaml"]}
