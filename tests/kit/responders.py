"""Services that answer requests over real NATS and Kafka, for the step tests: each answers every JSON
request with ``answer(request)``, until cancelled (start them with ``nursery.start``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from typing import Any

import trio

from mcpipe.backends.kafka import KafkaClient
from mcpipe.backends.nats import NatsClient

Answer = Callable[[dict[str, Any]], dict[str, Any]]


async def nats_responder(
    url: str,
    subject: str,
    answer: Answer,
    silent: Sequence[str] = (),
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Reply to the requests on ``subject``; also subscribe to the ``silent`` subjects and never reply there."""
    async with trio.open_nursery() as nursery:
        c = NatsClient(url)
        await nursery.start(c.run)
        async with AsyncExitStack() as stack:
            requests = await stack.enter_async_context(c.subscribe(subject))
            for other in silent:
                await stack.enter_async_context(c.subscribe(other))
            task_status.started()
            async for msg in requests:
                assert msg.reply is not None
                await c.publish(msg.reply, json.dumps(answer(json.loads(msg.data))).encode())


async def kafka_responder(
    bootstrap: str,
    requests: str,
    responses: str,
    answer: Answer,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Answer each record of every partition of ``requests`` on ``responses``, with its ``correlation_id``."""
    async with trio.open_nursery() as nursery:
        c = KafkaClient(bootstrap)
        await nursery.start(c.run)
        meta = await c.metadata(requests)
        starts = {p: await c.list_offsets(requests, p) for p in meta.partitions}
        task_status.started()
        for partition, offset in starts.items():
            nursery.start_soon(_answer_partition, c, requests, responses, answer, partition, offset)


async def _answer_partition(
    c: KafkaClient, requests: str, responses: str, answer: Answer, partition: int, offset: int
) -> None:
    while True:
        records, offset = await c.fetch(requests, partition, offset, lane=f"svc {partition}")
        for r in records:
            body = json.dumps(answer(json.loads(r.value or b"{}"))).encode()
            await c.produce(responses, body, headers={"correlation_id": r.header("correlation_id")})
