"""mcpg's example of NATS, gRPC and Kafka steps (examples/mcpg/services.yaml) loads unchanged and runs
against real servers: nats-server, a grpcio server, and the tests' Kafka-protocol broker."""

from __future__ import annotations

import json
from pathlib import Path

import trio
import yaml
from mcp import Client

from grpcserver import grpc_server
from mcpipe.backends.kafka import KafkaClient
from mcpipe.backends.nats import NatsClient
from mcpipe.config import parse_config
from mcpipe.server import open_app

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mcpg" / "services.yaml"


async def nats_service(url: str, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    async with trio.open_nursery() as nursery:
        c = NatsClient(url)
        await nursery.start(c.run)
        async with c.subscribe("service.query") as requests:
            task_status.started()
            async for msg in requests:
                assert msg.reply is not None
                sku = json.loads(msg.data)["sku"]
                await c.publish(msg.reply, json.dumps({"sku": sku, "cents": 120}).encode())


async def kafka_service(bootstrap: str, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    async with trio.open_nursery() as nursery:
        c = KafkaClient(bootstrap)
        await nursery.start(c.run)
        meta = await c.metadata("requests")
        starts = {p: await c.list_offsets("requests", p) for p in meta.partitions}
        task_status.started()
        for partition, offset in starts.items():
            nursery.start_soon(_answer, c, partition, offset)


async def _answer(c: KafkaClient, partition: int, offset: int) -> None:
    while True:
        records, offset = await c.fetch("requests", partition, offset, lane=f"svc {partition}")
        for r in records:
            sku = json.loads(r.value or b"{}")["sku"]
            answer = json.dumps({"sku": sku, "in_stock": sku != "none"}).encode()
            await c.produce("responses", answer, headers={"correlation_id": r.header("correlation_id")})


async def test_the_mcpg_services_example_loads_unchanged_and_runs(nats_url: str, kafka_bootstrap: str) -> None:
    text = EXAMPLE.read_text()
    with grpc_server() as (grpc_url, _):
        # Only the addresses change: the example's servers are the ones the tests started.
        text = text.replace("nats://127.0.0.1:4222", nats_url).replace("grpc://127.0.0.1:50051", grpc_url)
        text = text.replace("127.0.0.1:9092", kafka_bootstrap)
        config = parse_config(json.dumps(yaml.safe_load(text)), "json", environ={})
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                await nursery.start(nats_service, nats_url)
                await nursery.start(kafka_service, kafka_bootstrap)
                async with open_app(config) as app, Client(app.server) as client:
                    r = await client.call_tool("customer_overview", {"sku": "pen", "user_id": 7})
                nursery.cancel_scope.cancel()
    assert not r.is_error, r.content
    assert r.structured_content == {"price": 120, "customer": "user 7", "in_stock": True}
