"""An mcpg pipeline's context, as mcpg's pipelines doc gives it (issue 27, item 24), served over HTTP.

Every step reads ``original_args``, ``completed_steps`` and ``request_context`` (request id, session, transport,
the caller's identity): in CEL, in ``${…}`` templates, in JSONata, and in a log step's ``data`` as the doc's
own example writes it (``data: "Charging order ${original_args.order_id}"``). An anonymous caller is one too
(``request_context.identity.kind: anonymous``, ``principal_id: null``), not a missing key. A pipeline past its
``pipeline_timeout_ms`` answers mcpg's ``pipeline '<name>' timed out after <ms>ms at step '<id>'``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import trio
import yaml
from mcp import Client

from kit.servers import http_server
from mcpipe.config import parse_config
from mcpipe.server import open_app

OPEN = {"governance": {"minimum_trust": "unauthenticated"}}


def _tool(name: str, steps: list[dict[str, Any]], **backend: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": name,
        "input_schema": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        **OPEN,
        "backend": {"kind": "pipeline", "steps": steps, **backend},
    }


CONFIG = {
    "gateway": {"server": {"trust_subject_header": True}},
    "governance": {
        "policy": {"tool_access": {"default_minimum_trust": "unauthenticated"}},
        "audit": {"enabled": False},
    },
    "plugins": [{"id": "dev.mcpg.transform.jsonata", "class": "transform", "source": {"path": "./x.so"}}],
    "mcp": {
        "capabilities": {
            "tools": [
                _tool(
                    "charge",
                    [
                        {"id": "fetch", "kind": "mock", "response": {"name": "ada"}},
                        {
                            "id": "announce",
                            "kind": "log",
                            "level": "info",
                            "data": "Charging order ${original_args.order_id}",
                        },
                        {
                            "id": "echo",
                            "kind": "command",
                            "command": "/usr/bin/printf",
                            "args": ["%s/%s", "${original_args.order_id}", "${completed_steps.fetch.output.name}"],
                        },
                        {"id": "out", "kind": "transform", "expression": "completed_steps.echo.output.response.stdout"},
                    ],
                ),
                _tool(
                    "who",
                    [
                        {
                            "id": "seen",
                            "kind": "transform",
                            "expression": '{"request": request_context, "principal": principal_id, '
                            '"trust": trust_level, "args": original_args}',
                        }
                    ],
                ),
                _tool(
                    "shaped",
                    [
                        {"id": "fetch", "kind": "mock", "response": {"name": "ada"}},
                        {
                            "id": "j",
                            "kind": "plugin_transform",
                            "plugin": "dev.mcpg.transform.jsonata",
                            "config": {
                                "expression": '{"order": original_args.order_id, "name": '
                                'completed_steps.fetch.output.name, "kind": request_context.identity.kind, '
                                '"has_id": $exists(request_context.request_id)}'
                            },
                        },
                    ],
                ),
                _tool(
                    "slow",
                    [
                        {"id": "first", "kind": "mock", "response": 1},
                        {"id": "nap", "kind": "mock", "response": 2, "delay_ms": 5000},
                        {"id": "after", "kind": "mock", "response": 3},
                    ],
                    pipeline_timeout_ms=300,
                ),
            ]
        }
    },
}


async def test_templates_logs_and_jsonata_read_the_pipeline_context_of_mcpgs_docs() -> None:
    logs: list[Any] = []

    async def on_log(params: Any) -> None:
        logs.append(params.data)

    config = parse_config(yaml.safe_dump(CONFIG), "yaml", environ={})
    with trio.fail_after(60):
        async with open_app(config) as app, Client(app.server, logging_callback=on_log, mode="legacy") as c:
            charged = await c.call_tool("charge", {"order_id": "A-17"})
            shaped = await c.call_tool("shaped", {"order_id": "A-17"})
    assert charged.is_error is False, charged.content
    assert charged.structured_content["result"] == "A-17/ada"  # type: ignore[index]
    assert "Charging order A-17" in logs
    assert shaped.structured_content["result"] == {  # type: ignore[index]
        "order": "A-17",
        "name": "ada",
        "kind": "anonymous",
        "has_id": True,
    }


async def test_request_context_is_there_for_an_anonymous_caller_and_a_header_asserted_one() -> None:
    config = parse_config(yaml.safe_dump(CONFIG), "yaml", environ={})
    hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    accept = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"}
    seen = []
    with trio.fail_after(60):
        async with open_app(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
            for extra in ({}, {"x-mcpg-subject-id": "bob"}):
                headers = {**accept, **extra}
                init = await http.post(
                    url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}, headers=headers
                )
                session = init.headers.get("mcp-session-id")
                if session:
                    headers["mcp-session-id"] = session
                call = {"name": "who", "arguments": {"order_id": "A-1"}}
                r = await http.post(
                    url, json={"jsonrpc": "2.0", "id": 42, "method": "tools/call", "params": call}, headers=headers
                )
                seen.append((session, _result(r)))
    (anon_session, anonymous), (bob_session, bob) = seen
    assert anonymous["structuredContent"]["result"] == {
        "request": {
            "request_id": "42",
            "session_id": anon_session,
            "transport": "http",
            "identity": {"kind": "anonymous", "source": "no_subject_header"},
        },
        "principal": None,
        "trust": "unauthenticated",
        "args": {"order_id": "A-1"},
    }
    request = bob["structuredContent"]["result"]["request"]
    assert request["identity"] == {"kind": "http_header", "subject_id": "bob", "source": "x-mcpg-subject-id"}
    assert request["session_id"] == bob_session and request["request_id"] == "42"
    assert bob["structuredContent"]["result"]["trust"] == "header_asserted"


def _result(r: Any) -> dict[str, Any]:
    text = r.text
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        text = next(
            line[5:] for line in text.splitlines() if line.startswith("data:") and '"id":42' in line.replace(" ", "")
        )
    result: dict[str, Any] = json.loads(text)["result"]
    return result


async def test_a_pipeline_past_its_timeout_answers_mcpgs_timed_out_message_naming_the_step() -> None:
    config = parse_config(yaml.safe_dump(CONFIG), "yaml", environ={})
    with trio.fail_after(60):
        async with open_app(config) as app, http_server(app) as url, Client(url) as c:
            slow = await c.call_tool("slow", {})
    assert slow.is_error is True
    assert [b.model_dump(exclude_none=True) for b in slow.content] == [
        {"type": "text", "text": "pipeline 'slow' timed out after 300ms at step 'nap'"}
    ]
    assert slow.structured_content is None  # mcpg answers the timeout with text only
