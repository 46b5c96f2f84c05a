"""The nats step, served by the real server and called with the SDK's Client, against a real nats-server."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from mcp import Client

from kit.responders import nats_responder
from kit.served import call, served
from mcpipe.backends.nats import NatsClient
from mcpipe.config import ConfigError, parse_config


def pipelines(url: str) -> dict[str, Any]:
    return {
        "pipelines": [
            {
                "name": "price",
                "input_schema": {"type": "object", "properties": {"sku": {"type": "string"}}},
                # mcpg's shape: no payload, so the step's input (the arguments) is the request.
                "steps": [
                    {"kind": "nats", "id": "backend_query", "url": url, "subject": "prices.get", "timeout_ms": 5000}
                ],
            },
            {
                "name": "ask",
                "input_schema": {"type": "object", "properties": {"to": {"type": "string"}}},
                "steps": [
                    {
                        "kind": "nats",
                        "id": "q",
                        "url": url,
                        "subject": "svc.${args.to}",
                        "payload": "ping from ${args.to}",
                        "timeout_ms": 300,
                    }
                ],
            },
            {
                "name": "announce",
                "input_schema": {"type": "object", "properties": {"order": {"type": "string"}}},
                "steps": [
                    {
                        "kind": "nats",
                        "id": "pub",
                        "url": url,
                        "mode": "publish",
                        "subject": "orders.created",
                        "payload": {"order": "${args.order}"},
                        "headers": {"source": "mcpipe"},
                    }
                ],
            },
        ]
    }


def _price(request: dict[str, Any]) -> dict[str, Any]:
    return {"sku": request["sku"], "cents": 250}


async def test_a_nats_step_requests_and_answers_the_reply(nats_url: str) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(nats_responder, nats_url, "prices.get", _price, ["svc.silent"])
            async with served(pipelines(nats_url)) as app, Client(app.server) as client:
                first = await call(client, "price", {"sku": "pen"})
                second = await call(client, "price", {"sku": "ink"})
            nursery.cancel_scope.cancel()
    assert first == (False, {"sku": "pen", "cents": 250})
    assert second == (False, {"sku": "ink", "cents": 250})


async def test_nats_step_failures_say_what_happened(nats_url: str) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(nats_responder, nats_url, "prices.get", _price, ["svc.silent"])
            async with served(pipelines(nats_url)) as app, Client(app.server) as client:
                nobody = await call(client, "ask", {"to": "nobody"})
                silent = await call(client, "ask", {"to": "silent"})
            nursery.cancel_scope.cancel()
    assert nobody == (True, "TOOL_ERROR: step 'q' failed: no responders on subject 'svc.nobody'")
    assert silent == (True, "TIMEOUT: step 'q' failed: no reply on subject 'svc.silent' within 300 ms")


async def test_a_nats_step_publishes(nats_url: str) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            c = NatsClient(nats_url)
            await nursery.start(c.run)
            async with (
                c.subscribe("orders.>") as seen,
                served(pipelines(nats_url)) as app,
                Client(app.server) as client,
            ):
                out = await call(client, "announce", {"order": "A-1"})
                msg = await seen.receive()
            nursery.cancel_scope.cancel()
    assert out == (False, {"subject": "orders.created", "bytes": len(b'{"order":"A-1"}')})
    assert (json.loads(msg.data), msg.headers) == ({"order": "A-1"}, {"source": "mcpipe"})


def test_a_nats_url_is_checked_at_load() -> None:
    doc = {"pipelines": [{"name": "p", "steps": [{"kind": "nats", "url": "tls://h:4222", "subject": "x"}]}]}
    with pytest.raises(ConfigError) as info:
        parse_config(json.dumps(doc), "json", environ={})
    assert [str(p) for p in info.value.problems] == [
        "pipelines.p.steps[0].url: a NATS URL is nats://host:port, got scheme 'tls' (TLS is not supported)"
    ]


async def test_the_shared_connection_is_opened_on_first_use_and_closed_when_the_server_stops(nats_url: str) -> None:
    from mcpipe.declared import DeclaredPipelines

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(nats_responder, nats_url, "prices.get", _price, ["svc.silent"])
            async with served(pipelines(nats_url)) as app, Client(app.server) as client:
                declared = next(s for s in app.gateway.sources if isinstance(s, DeclaredPipelines))
                connections = declared.policy.connections
                assert connections._open == {}  # nothing is opened before a step needs it
                await call(client, "price", {"sku": "pen"})
                await call(client, "announce", {"order": "A-1"})
                opened = list(connections._open.values())
                assert len(opened) == 1 and not opened[0].closed  # one connection per URL, shared
            nursery.cancel_scope.cancel()
    assert opened[0].closed
