"""mcpg's pipeline of NATS, gRPC (JSON transcoding) and Kafka steps (examples/mcpg/services.yaml, in mcpg's own
layout) loads unchanged and answers as mcpg does, against real services: nats-server, an HTTP endpoint of
shop.UserService/GetUser, and the tests' Kafka-protocol broker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
from mcp import Client

from kit.mcpg_oracle import StandIn
from kit.responders import kafka_responder, nats_responder
from mcpipe.config import parse_config
from mcpipe.server import open_app

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mcpg" / "services.yaml"


def _price(request: dict[str, Any]) -> dict[str, Any]:
    return {"sku": request["sku"], "cents": 120}


def _stock(request: dict[str, Any]) -> dict[str, Any]:
    return {"sku": request["sku"], "in_stock": request["sku"] != "none"}


async def test_the_mcpg_services_example_loads_unchanged_and_runs(nats_url: str, kafka_bootstrap: str) -> None:
    users = StandIn([{"method": "POST", "path": "/shop.UserService/GetUser", "body": {"display_name": "user 7"}}])
    with users:
        text = EXAMPLE.read_text()
        # Only the addresses change: the example's servers are the ones the tests started.
        text = text.replace("nats://127.0.0.1:4222", nats_url).replace("127.0.0.1:9092", kafka_bootstrap)
        text = text.replace("http://127.0.0.1:50051", f"http://127.0.0.1:{users.port}")
        config = parse_config(text, "yaml", environ={})
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                await nursery.start(nats_responder, nats_url, "service.query", _price)
                await nursery.start(kafka_responder, kafka_bootstrap, "requests", "responses", _stock)
                async with open_app(config) as app, Client(app.server) as client:
                    r = await client.call_tool("customer_overview", {"sku": "pen", "user_id": 7})
                nursery.cancel_scope.cancel()
    assert not r.is_error, r.content
    overview = {"customer": "user 7", "in_stock": True, "price": 120}
    # mcpg's pipeline answer: the last step's output as text, and the run's envelope.
    assert json.loads(r.content[0].text) == overview  # type: ignore[union-attr]
    structured = dict(r.structured_content or {})
    assert structured.pop("duration_ms") >= 0
    assert structured == {"pipeline": "customer_overview", "result": overview, "completed_steps": 4, "total_steps": 4}
    assert users.received[0]["body"] == {"id": 7}


async def test_a_sql_bindings_session_vars_are_set_for_its_statement_from_the_caller(postgres_url: str) -> None:
    """mcpg's ``session_vars`` (``set_config(key, value, true)`` before the statement, in its transaction: what
    a row-level-security policy reads), each value a template of the call; a caller without the attribute
    fails the call rather than running the statement unscoped."""
    from mcpipe.tools import Identity
    from mcpipe.tools._base import Request, ToolContext

    text = json.dumps(
        {
            "mcp": {
                "capabilities": {
                    "tools": [
                        {
                            "name": "whoami",
                            "description": "the tenant the statement sees",
                            "governance": {"minimum_trust": "unauthenticated"},
                            "backend": {
                                "kind": "sql",
                                "driver": "postgres",
                                "url": postgres_url,
                                "query": {
                                    "sql": "SELECT current_setting('app.current_tenant') AS t",
                                    "row_mode": "scalar",
                                },
                                "session_vars": {"app.current_tenant": "${identity.tenant}"},
                            },
                        }
                    ]
                }
            }
        }
    )
    config = parse_config(text, "json", environ={})
    caller = Identity("alice", trust="verified", provider="oidc", attributes={"tenant": "acme"})
    with trio.fail_after(30):
        async with open_app(config) as app:
            r = await app.gateway.call("whoami", {}, ToolContext(principal="alice", request=Request(identity=caller)))
            anonymous = await app.gateway.call("whoami", {}, ToolContext())
    assert not r.is_error and r.structured == "acme", r.content
    assert r.meta == {"audit": {"backend_kind": "sql", "binding_profile": "whoami", "outcome": "success"}}
    assert anonymous.is_error and "tenant" in anonymous.joined_text(), anonymous.content
