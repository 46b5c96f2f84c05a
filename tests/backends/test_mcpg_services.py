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
