"""The ``nats`` step kind: a NATS request (wait for the reply) or publish, on a connection shared per URL.

:func:`request` is the kind's request, public for a format whose NATS bindings send their own bytes and word
a failure their own way: it runs on the same shared connection.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
import orjson

from mcpipe._describe import json_type
from mcpipe._template import Template
from mcpipe.backends import Connections, NotRunning
from mcpipe.backends.nats import NatsClient, NatsError, NatsMessage, parse_nats_url
from mcpipe.errors import ErrorCode
from mcpipe.kinds._base import Build, Kind, StepFields
from mcpipe.kinds._wire import address, decode, encode, object_of, payload, timeout_s
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = ["KIND", "NatsFields", "NatsPlan", "client", "request", "run_nats"]


class NatsFields(StepFields, tag="nats"):
    """A NATS request (wait for the reply, ``timeout_ms``, default 30 s) or publish (``mode: publish``) on
    ``subject``. ``url`` is a constant (``nats://host:4222``); ``subject``, ``payload`` (default: the step's
    input, ``args``) and ``headers`` are templates. A string payload is sent as is, anything else as JSON."""

    url: Annotated[str, msgspec.Meta(min_length=1)]
    subject: Any
    payload: Any = msgspec.UNSET
    headers: Any = None
    mode: Literal["request", "publish"] = "request"


@dataclass(frozen=True, slots=True)
class NatsPlan:
    url: str
    payload: Template
    connections: Connections
    timeout_s: float


def build_nats(b: Build[NatsFields]) -> NatsPlan:
    """The URL, checked; the payload template; the shared connections; the own deadline."""
    url = address(b, "url", parse_nats_url)
    body = payload(b, "payload")
    if b.fields is None or b.failed:
        b.fail()
    return NatsPlan(url, body, b.policy.connections, timeout_s(b))


async def run_nats(
    step: Leaf[NatsFields, NatsPlan], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Request (the output is the reply) or publish (the output says what was sent)."""
    plan = step.built
    subject = inputs["subject"]
    if not isinstance(subject, str):
        raise StepFailure(f"`subject` must be a string, got {json_type(subject)}", ErrorCode.TOOL_FAILED)
    headers = object_of(inputs.get("headers"), "headers")
    hdrs = {str(k): v if isinstance(v, str) else orjson.dumps(v).decode() for k, v in headers.items()}
    data = encode(plan.payload.resolve(env))
    try:
        if step.fields.mode == "publish":
            await (await client(plan.connections, plan.url)).publish(subject, data, headers=hdrs or None)
            return StepOutput.of({"subject": subject, "bytes": len(data)})
        reply = await request(plan.connections, plan.url, subject, data, plan.timeout_s, hdrs or None)
    except NatsError as e:
        raise StepFailure(str(e), e.code) from None
    except NotRunning as e:
        raise StepFailure(f"cannot reach NATS at {plan.url}: {e}", ErrorCode.TOOL_FAILED) from None
    return StepOutput.of(decode(reply.data))


async def client(connections: Connections, url: str) -> NatsClient:
    """The connection to ``url`` that the server's NATS steps share (opened on first use).

    Raises:
        NotRunning: the server's connections are closed.
        NatsError: it cannot connect.
    """
    return await connections.get(("nats", url), lambda: NatsClient(url))


async def request(
    connections: Connections,
    url: str,
    subject: str,
    data: bytes,
    timeout_s: float,
    headers: dict[str, str] | None = None,
) -> NatsMessage:
    """A request on ``subject`` over the shared connection to ``url``; the reply.

    Raises:
        NatsError: no responders (``TOOL_ERROR``), no reply within ``timeout_s`` (``TIMEOUT``), or the
            connection failed.
        NotRunning: the server's connections are closed.
    """
    return await (await client(connections, url)).request(subject, data, timeout_s, headers=headers)


KIND = Kind("nats", NatsFields, run_nats, templates=("subject", "headers"), build=build_nats, own_deadline=True)
