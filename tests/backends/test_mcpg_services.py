"""mcpg's example of NATS, gRPC and Kafka steps (examples/mcpg/services.yaml) loads unchanged and runs
against real servers: nats-server, a grpcio server, and the tests' Kafka-protocol broker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
import yaml
from mcp import Client

from kit.grpcserver import grpc_server
from kit.responders import kafka_responder, nats_responder
from mcpipe.config import parse_config
from mcpipe.server import open_app

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mcpg" / "services.yaml"


def _price(request: dict[str, Any]) -> dict[str, Any]:
    return {"sku": request["sku"], "cents": 120}


def _stock(request: dict[str, Any]) -> dict[str, Any]:
    return {"sku": request["sku"], "in_stock": request["sku"] != "none"}


async def test_the_mcpg_services_example_loads_unchanged_and_runs(nats_url: str, kafka_bootstrap: str) -> None:
    text = EXAMPLE.read_text()
    with grpc_server() as (grpc_url, _):
        # Only the addresses change: the example's servers are the ones the tests started.
        text = text.replace("nats://127.0.0.1:4222", nats_url).replace("grpc://127.0.0.1:50051", grpc_url)
        text = text.replace("127.0.0.1:9092", kafka_bootstrap)
        config = parse_config(json.dumps(yaml.safe_load(text)), "json", environ={})
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                await nursery.start(nats_responder, nats_url, "service.query", _price)
                await nursery.start(kafka_responder, kafka_bootstrap, "requests", "responses", _stock)
                async with open_app(config) as app, Client(app.server) as client:
                    r = await client.call_tool("customer_overview", {"sku": "pen", "user_id": 7})
                nursery.cancel_scope.cancel()
    assert not r.is_error, r.content
    assert r.structured_content == {"price": 120, "customer": "user 7", "in_stock": True}
