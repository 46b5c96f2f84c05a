"""The kafka step, served by the real server and called with the SDK's Client, against the tests' Kafka-protocol
broker in a process of its own."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from mcp import Client

from kit.kafkabroker import Broker
from kit.responders import kafka_responder
from kit.served import call, served
from mcpipe.backends.kafka import KafkaClient
from mcpipe.config import ConfigError, parse_config


def pipelines(bootstrap: str) -> dict[str, Any]:
    return {
        "pipelines": [
            {
                "name": "quote",
                "input_schema": {"type": "object", "properties": {"sku": {"type": "string"}}},
                # mcpg's shape: no value, so the step's input (the arguments) is the request.
                "steps": [
                    {
                        "kind": "kafka",
                        "id": "kafka_request",
                        "bootstrap_servers": bootstrap,
                        "group_id": "mcpg",
                        "request_topic": "quotes.requests",
                        "response_topic": "quotes.responses",
                        "timeout_ms": 10000,
                    }
                ],
            },
            {
                "name": "lost",
                "steps": [
                    {
                        "kind": "kafka",
                        "id": "k",
                        "bootstrap_servers": bootstrap,
                        "request_topic": "void.requests",
                        "response_topic": "void.responses",
                        "timeout_ms": 300,
                    }
                ],
            },
            {
                "name": "record",
                "input_schema": {"type": "object", "properties": {"order": {"type": "string"}}},
                "steps": [
                    {
                        "kind": "kafka",
                        "id": "p",
                        "bootstrap_servers": bootstrap,
                        "topic": "orders.${args.order}",
                        "key": "${args.order}",
                        "value": {"order": "${args.order}", "state": "created"},
                        "headers": {"source": "mcpipe"},
                    }
                ],
            },
        ]
    }


def _quote(request: dict[str, Any]) -> dict[str, Any]:
    return {"sku": request["sku"], "cents": 99}


async def test_a_kafka_step_requests_and_answers_the_response(kafka_bootstrap: str) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(kafka_responder, kafka_bootstrap, "quotes.requests", "quotes.responses", _quote)
            async with served(pipelines(kafka_bootstrap)) as app, Client(app.server) as client:
                first = await call(client, "quote", {"sku": "pen"})
                second = await call(client, "quote", {"sku": "ink"})
                lost = await call(client, "lost", {})
            nursery.cancel_scope.cancel()
    assert first == (False, {"sku": "pen", "cents": 99})
    assert second == (False, {"sku": "ink", "cents": 99})
    assert lost[0] and lost[1].startswith("TIMEOUT: step 'k' failed: no response on 'void.responses' within 300 ms")


async def test_a_kafka_step_produces(kafka_bootstrap: str) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            c = KafkaClient(kafka_bootstrap)
            await nursery.start(c.run)
            async with served(pipelines(kafka_bootstrap)) as app, Client(app.server) as client:
                is_error, out = await call(client, "record", {"order": "A-1"})
            records, _ = await c.fetch("orders.A-1", out["partition"], out["offset"])
            nursery.cancel_scope.cancel()
    assert not is_error and out["topic"] == "orders.A-1"
    got = records[0]
    assert (json.loads(got.value or b""), got.key, got.header("source")) == (
        {"order": "A-1", "state": "created"},
        b"A-1",
        b"mcpipe",
    )


@pytest.mark.parametrize(
    ("step", "problem"),
    [
        ({"topic": "t", "request_topic": "r"}, "pipelines.p.steps[0]: a kafka step has `topic` (produce) or"),
        ({"request_topic": "r"}, "pipelines.p.steps[0].response_topic: a kafka request needs `response_topic` too"),
        (
            {"topic": "t", "bootstrap_servers": "nohost"},
            "pipelines.p.steps[0].bootstrap_servers: a Kafka bootstrap server is host:port",
        ),
    ],
)
def test_kafka_steps_are_checked_at_load(step: dict[str, Any], problem: str) -> None:
    doc = {"pipelines": [{"name": "p", "steps": [{"kind": "kafka", "bootstrap_servers": "127.0.0.1:9092", **step}]}]}
    with pytest.raises(ConfigError) as info:
        parse_config(json.dumps(doc), "json", environ={})
    found = [str(p) for p in info.value.problems]
    assert len(found) == 1 and found[0].startswith(problem), found


async def test_kafka_steps_on_one_url_share_one_connection_opened_at_first_use_and_closed_at_shutdown() -> None:
    """Counted by the broker itself (run here, in this test's Trio run): no connection before a step runs, one
    for every produce step of two pipelines on the same bootstrap server, and none left once the server
    has stopped."""
    broker = Broker(0)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            bootstrap = f"127.0.0.1:{await nursery.start(broker.serve)}"
            doc = pipelines(bootstrap)
            steps = [
                {"kind": "kafka", "id": f"p{i}", "bootstrap_servers": bootstrap, "topic": f"audit.{i}"} for i in (1, 2)
            ]
            doc["pipelines"].append({"name": "twice", "steps": steps})  # two produce steps in one pipeline
            async with served(doc) as app, Client(app.server) as client:
                await client.list_tools()
                assert broker.accepted == 0  # serving and listing tools connects to nothing
                recorded = await call(client, "record", {"order": "A-1"})
                both = await call(client, "twice", {})
                again = await call(client, "record", {"order": "A-2"})
                assert (broker.accepted, broker.open) == (1, 1)
            await broker.until(lambda: broker.open == 0)  # the server's stop closed it
            nursery.cancel_scope.cancel()
    assert not recorded[0] and not both[0] and not again[0], (recorded, both, again)
    assert broker.accepted == 1
    assert {t: sum(len(p.batches) for p in parts) for t, parts in broker.topics.items()} == {
        "orders.A-1": 1,
        "audit.1": 1,
        "audit.2": 1,
        "orders.A-2": 1,
    }
