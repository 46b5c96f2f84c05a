"""mcpipe's Kafka client and the tests' broker against an independent implementation of the protocol,
kafka-python (run in worker threads: it blocks): records each one writes, the other reads, CRC-32C checked
on both sides; and a kafka step answered by a service written with kafka-python."""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from kit.served import call_beside
from mcpipe.backends.kafka import KafkaClient

with warnings.catch_warnings():
    # kafka-python reads its protocol schemas with importlib.resources' deprecated read_text.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

pytestmark = pytest.mark.filterwarnings("ignore:read_text is deprecated:DeprecationWarning")


@asynccontextmanager
async def client_of(bootstrap: str) -> AsyncIterator[KafkaClient]:
    async with trio.open_nursery() as nursery:
        c = KafkaClient(bootstrap)
        await nursery.start(c.run)
        yield c
        nursery.cancel_scope.cancel()


def producer(bootstrap: str) -> KafkaProducer:
    # The broker does not do idempotent producers (InitProducerId): plain acks=all producing.
    return KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False, acks="all", request_timeout_ms=10_000)


def read(bootstrap: str, topic: str, partition: int, offset: int, count: int) -> list[Any]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, check_crcs=True)
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        got: list[Any] = []
        for _ in range(50):
            for records in consumer.poll(timeout_ms=200).values():
                got.extend(records)
            if len(got) >= count:
                return got
        return got
    finally:
        consumer.close()


async def test_records_kafka_python_produces_are_read_by_mcpipes_client(kafka_bootstrap: str) -> None:
    def produce() -> Any:
        p = producer(kafka_bootstrap)
        try:
            return p.send("interop.a", key=b"k", value=b"from kafka-python", headers=[("h", b"1")]).get(timeout=10)
        finally:
            p.close()

    with trio.fail_after(30):
        meta = await trio.to_thread.run_sync(produce)
        async with client_of(kafka_bootstrap) as c:
            records, _ = await c.fetch("interop.a", meta.partition, meta.offset)
    assert [(r.value, r.key, r.headers) for r in records] == [(b"from kafka-python", b"k", (("h", b"1"),))]


async def test_records_mcpipes_client_produces_are_read_by_kafka_python(kafka_bootstrap: str) -> None:
    with trio.fail_after(30):
        async with client_of(kafka_bootstrap) as c:
            partition, offset = await c.produce("interop.b", b"from mcpipe", key=b"id-1", headers={"trace": b"t"})
            await c.produce("interop.b", None, partition=partition)
        got = await trio.to_thread.run_sync(read, kafka_bootstrap, "interop.b", partition, offset, 2)
    assert [(m.value, m.key, list(m.headers)) for m in got] == [
        (b"from mcpipe", b"id-1", [("trace", b"t")]),
        (None, None, []),
    ]


def serve_quotes(bootstrap: str, ready: threading.Event, stop: threading.Event) -> None:
    """A service written with kafka-python: answers each request with a quote, copying its correlation id."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    p = producer(bootstrap)
    try:
        partitions = [
            TopicPartition("kp.requests", i) for i in sorted(consumer.partitions_for_topic("kp.requests") or {0, 1})
        ]
        consumer.assign(partitions)
        consumer.seek_to_end()
        for tp in partitions:
            consumer.position(tp)
        ready.set()
        while not stop.is_set():
            for records in consumer.poll(timeout_ms=100).values():
                for r in records:
                    cid = dict(r.headers)["correlation_id"]
                    sku = json.loads(r.value)["sku"]
                    answer = json.dumps({"sku": sku, "cents": 42}).encode()
                    p.send("kp.responses", value=answer, headers=[("correlation_id", cid)]).get(timeout=10)
    finally:
        consumer.close()
        p.close()


async def test_a_kafka_step_is_answered_by_a_kafka_python_service(kafka_bootstrap: str) -> None:
    doc = {
        "pipelines": [
            {
                "name": "quote",
                "input_schema": {"type": "object", "properties": {"sku": {"type": "string"}}},
                "steps": [
                    {
                        "kind": "kafka",
                        "id": "q",
                        "bootstrap_servers": kafka_bootstrap,
                        "request_topic": "kp.requests",
                        "response_topic": "kp.responses",
                        "timeout_ms": 10_000,
                    }
                ],
            }
        ],
    }
    with trio.fail_after(60):
        r = await call_beside(serve_quotes, kafka_bootstrap, doc, "quote", {"sku": "pen"})
    assert not r.is_error, r.content
    assert r.structured_content == {"sku": "pen", "cents": 42}
