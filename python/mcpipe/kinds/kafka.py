"""The ``kafka`` step kind: produce a record, or request (produce with a correlation id, await the response).

:func:`request` is the kind's request, public for a format whose Kafka bindings send their own bytes and
word a failure their own way: it runs on the same client, shared per bootstrap list.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import orjson
import trio

from mcpipe._template import Template
from mcpipe.backends import Connections, NotRunning
from mcpipe.backends.kafka import KafkaClient, KafkaError, KafkaRecord, parse_bootstrap
from mcpipe.errors import ErrorCode
from mcpipe.kinds._base import Build, Kind, StepFields
from mcpipe.kinds._wire import address, decode, encode, object_of, payload, text_of, timeout_s
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = ["KIND", "KafkaFields", "KafkaPlan", "client", "request", "run_kafka"]


class KafkaFields(StepFields, tag="kafka"):
    """A Kafka request (``request_topic`` and ``response_topic``: produce with a correlation id, wait for the
    response carrying it, ``timeout_ms``) or produce (``topic``). ``bootstrap_servers`` is a constant; the
    topics, ``value`` (default: the step's input, ``args``), ``key`` and ``headers`` are templates.
    ``group_id`` is mcpg's, accepted and unused (responses are read without a consumer group)."""

    bootstrap_servers: Annotated[str, msgspec.Meta(min_length=1)]
    topic: Any = None
    request_topic: Any = None
    response_topic: Any = None
    value: Any = msgspec.UNSET
    key: Any = None
    headers: Any = None
    group_id: str | None = None


@dataclass(frozen=True, slots=True)
class KafkaPlan:
    servers: str
    value: Template
    connections: Connections
    timeout_s: float
    produce: bool


def build_kafka(b: Build[KafkaFields]) -> KafkaPlan:
    """The bootstrap servers, checked; produce or request (which topics); the value template."""
    raw, loc = b.raw, b.location
    servers = address(b, "bootstrap_servers", parse_bootstrap)
    has = {name: raw.get(name) is not None for name in ("topic", "request_topic", "response_topic")}
    if has["topic"] == (has["request_topic"] or has["response_topic"]):
        b.problem(loc, "a kafka step has `topic` (produce) or `request_topic` and `response_topic` (request)")
        b.fail()
    if not has["topic"] and not (has["request_topic"] and has["response_topic"]):
        missing = "response_topic" if has["request_topic"] else "request_topic"
        b.problem(f"{loc}.{missing}", f"a kafka request needs `{missing}` too")
        b.fail()
    value = payload(b, "value")
    if b.fields is None or b.failed:
        b.fail()
    return KafkaPlan(servers, value, b.policy.connections, timeout_s(b), has["topic"])


async def run_kafka(
    step: Leaf[KafkaFields, KafkaPlan], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Produce (the output says where the record went) or request (the output is the response's value)."""
    plan = step.built
    headers = object_of(inputs.get("headers"), "headers")
    hdrs = {str(k): v.encode() if isinstance(v, str) else orjson.dumps(v) for k, v in headers.items()}
    key = inputs.get("key")
    value = encode(plan.value.resolve(env))
    try:
        if plan.produce:
            topic = text_of(inputs.get("topic"), "topic")
            producer = await client(plan.connections, plan.servers)
            with trio.move_on_after(plan.timeout_s):
                partition, offset = await producer.produce(
                    topic, value, key=None if key is None else encode(key), headers=hdrs or None
                )
                return StepOutput.of({"topic": topic, "partition": partition, "offset": offset})
            raise StepFailure(f"producing to '{topic}' took more than {plan.timeout_s * 1000:g} ms", ErrorCode.TIMEOUT)
        request_topic = text_of(inputs.get("request_topic"), "request_topic")
        response_topic = text_of(inputs.get("response_topic"), "response_topic")
        record = await request(
            plan.connections, plan.servers, request_topic, response_topic, value, plan.timeout_s, hdrs
        )
    except KafkaError as e:
        raise StepFailure(str(e), e.code) from None
    except NotRunning as e:
        raise StepFailure(f"cannot reach Kafka at {plan.servers}: {e}", ErrorCode.TOOL_FAILED) from None
    return StepOutput.of(None if record.value is None else decode(record.value))


async def client(connections: Connections, servers: str) -> KafkaClient:
    """The client of ``servers`` that the server's Kafka steps share (opened on first use).

    Raises:
        NotRunning: the server's connections are closed.
        KafkaError: it cannot connect.
    """
    return await connections.get(("kafka", servers), lambda: KafkaClient(servers))


async def request(
    connections: Connections,
    servers: str,
    request_topic: str,
    response_topic: str,
    value: bytes | None,
    timeout_s: float,
    headers: Mapping[str, bytes] | None = None,
) -> KafkaRecord:
    """Produce ``value`` on ``request_topic`` with a fresh correlation id (and ``headers``), over the shared
    client of ``servers``; the record on ``response_topic`` that carries it.

    Raises:
        KafkaError: no response within ``timeout_s`` (``TIMEOUT``), or the produce or fetch failed.
        NotRunning: the server's connections are closed.
    """
    kafka = await client(connections, servers)
    return await kafka.request(request_topic, response_topic, value, timeout_s=timeout_s, headers=headers or None)


KIND = Kind(
    "kafka",
    KafkaFields,
    run_kafka,
    templates=("topic", "request_topic", "response_topic", "key", "headers"),
    build=build_kafka,
    own_deadline=True,
)
