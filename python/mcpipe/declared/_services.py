"""The messaging and RPC step kinds: ``nats`` (and, below, ``grpc`` and ``kafka``).

Each runs on a connection shared per server URL (:class:`mcpipe.backends._connections.Connections`, in the
step policy), opened on first use and closed when the server stops. The URL is a constant, checked at
load; the subject, payload and headers are templates. A payload left out is the step's input (``args``,
after ``input_transform``), as in mcpg, whose backend steps send their input.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from mcpipe._describe import json_type
from mcpipe._template import Template
from mcpipe.backends._connections import Connections, NotRunning
from mcpipe.backends.nats import NatsClient, NatsError, parse_nats_url
from mcpipe.declared._step import DeclaredStep, StepFailure, StepOutput
from mcpipe.tools._base import ToolContext

if TYPE_CHECKING:
    from mcpipe.declared._compile import StepScope, _Compiler

__all__ = ["OWN_DEADLINE", "SERVICE_KINDS", "compile_service", "run_nats"]

SERVICE_KINDS = ("nats",)
OWN_DEADLINE = ("nats",)
"""Kinds that apply ``timeout_ms`` themselves, so that a timeout can say what was waited for."""

DEFAULT_TIMEOUT_MS = 30_000.0


@dataclass(frozen=True, slots=True)
class NatsPlan:
    url: str
    payload: Template
    connections: Connections
    timeout_s: float


def compile_service(
    c: _Compiler, kind: str, raw: Mapping[str, Any], spec: Any, loc: str, scope: StepScope, refs: list[tuple[str, str]]
) -> Any:
    """The plan of a ``nats`` step (None on a problem, which ``c`` records)."""
    url = raw.get("url")
    if not isinstance(url, str):
        return None  # the Struct reports it
    try:
        parse_nats_url(url)
    except ValueError as e:
        c.problem(f"{loc}.url", str(e))
        return None
    payload = (
        c.template(raw["payload"], f"{loc}.payload", scope, refs) if "payload" in raw else Template({"$ref": "args"})
    )
    if payload is None or spec is None:
        return None
    timeout = spec.timeout_ms if spec.timeout_ms is not None else DEFAULT_TIMEOUT_MS
    return NatsPlan(url, payload, scope.policy.connections, timeout / 1000)


def encode(value: Any) -> bytes:
    """A payload on the wire: a string as UTF-8 text, anything else as JSON."""
    return value.encode() if isinstance(value, str) else orjson.dumps(value)


def decode(data: bytes) -> Any:
    """A reply as a value: JSON when it parses, else text."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return data.decode(errors="replace")


async def run_nats(step: DeclaredStep, inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext) -> StepOutput:
    """Request (the output is the reply) or publish (the output says what was sent)."""
    plan: NatsPlan = step.plan
    subject = inputs["subject"]
    if not isinstance(subject, str):
        raise StepFailure(f"`subject` must be a string, got {json_type(subject)}", "TOOL_FAILED")
    headers = inputs.get("headers")
    if headers is not None and not isinstance(headers, Mapping):
        raise StepFailure(f"`headers` must be an object, got {json_type(headers)}", "TOOL_FAILED")
    hdrs = {str(k): v if isinstance(v, str) else orjson.dumps(v).decode() for k, v in (headers or {}).items()}
    data = encode(plan.payload.resolve(env))
    try:
        client = await plan.connections.get(("nats", plan.url), lambda: NatsClient(plan.url))
        if step.spec.mode == "publish":  # type: ignore[attr-defined]
            await client.publish(subject, data, headers=hdrs or None)
            return StepOutput.of({"subject": subject, "bytes": len(data)})
        reply = await client.request(subject, data, plan.timeout_s, headers=hdrs or None)
    except NatsError as e:
        raise StepFailure(str(e), e.code) from None
    except NotRunning as e:
        raise StepFailure(f"cannot reach NATS at {plan.url}: {e}", "TOOL_FAILED") from None
    return StepOutput.of(decode(reply.data))
