"""The messaging and RPC step kinds: ``nats`` (and, below, ``grpc`` and ``kafka``).

Each runs on a connection shared per server URL (:class:`mcpipe.backends._connections.Connections`, in the
step policy), opened on first use and closed when the server stops. The URL is a constant, checked at
load; the subject, payload and headers are templates. A payload left out is the step's input (``args``,
after ``input_transform``), as in mcpg, whose backend steps send their input.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import trio

from mcpipe._describe import json_type
from mcpipe._template import Template
from mcpipe.backends._connections import Connections, NotRunning
from mcpipe.backends.grpc import GrpcConnection, GrpcError, _pool_from_file, parse_grpc_url
from mcpipe.backends.kafka import KafkaClient, KafkaError, parse_bootstrap
from mcpipe.backends.nats import NatsClient, NatsError, parse_nats_url
from mcpipe.declared._step import DeclaredStep, StepFailure, StepOutput
from mcpipe.tools._base import ToolContext

if TYPE_CHECKING:
    from mcpipe.declared._compile import StepScope, _Compiler

__all__ = ["OWN_DEADLINE", "SERVICE_KINDS", "compile_service", "run_grpc", "run_kafka", "run_nats"]

SERVICE_KINDS = ("nats", "grpc", "kafka")
OWN_DEADLINE = ("nats", "grpc", "kafka")
"""Kinds that apply ``timeout_ms`` themselves, so that a timeout can say what was waited for."""

DEFAULT_TIMEOUT_MS = 30_000.0


@dataclass(frozen=True, slots=True)
class GrpcPlan:
    url: str
    message: Template
    connections: Connections
    timeout_s: float
    descriptor_set: str | None


@dataclass(frozen=True, slots=True)
class KafkaPlan:
    servers: str
    value: Template
    connections: Connections
    timeout_s: float
    produce: bool


@dataclass(frozen=True, slots=True)
class NatsPlan:
    url: str
    payload: Template
    connections: Connections
    timeout_s: float


def compile_service(
    c: _Compiler, kind: str, raw: Mapping[str, Any], spec: Any, loc: str, scope: StepScope, refs: list[tuple[str, str]]
) -> Any:
    """The plan of a ``nats``, ``grpc`` or ``kafka`` step (None on a problem, which ``c`` records)."""
    if kind == "kafka":
        return _kafka_plan(c, raw, spec, loc, scope, refs)
    url = raw.get("url")
    if not isinstance(url, str):
        return None  # the Struct reports it
    try:
        (parse_nats_url if kind == "nats" else parse_grpc_url)(url)
    except ValueError as e:
        c.problem(f"{loc}.url", str(e))
        return None
    field = "payload" if kind == "nats" else "message"
    default = Template({"$ref": "args"})
    payload = c.template(raw[field], f"{loc}.{field}", scope, refs) if field in raw else default
    if payload is None or spec is None:
        return None
    timeout = (spec.timeout_ms if spec.timeout_ms is not None else DEFAULT_TIMEOUT_MS) / 1000
    if kind == "nats":
        return NatsPlan(url, payload, scope.policy.connections, timeout)
    try:
        import grpc  # noqa: F401
        import grpc_reflection  # noqa: F401
    except ImportError:
        c.problem(f"{loc}.kind", "gRPC steps need grpcio: pip install 'mcpipe[grpc]'")
        return None
    descriptors = None
    if spec.descriptor_set is not None:
        descriptors = str(Path(scope.policy.base_dir, spec.descriptor_set))
        problem = _descriptor_problem(descriptors, spec.service, spec.method)
        if problem is not None:
            c.problem(f"{loc}.descriptor_set", problem)
            return None
    return GrpcPlan(url, payload, scope.policy.connections, timeout, descriptors)


def _kafka_plan(
    c: _Compiler, raw: Mapping[str, Any], spec: Any, loc: str, scope: StepScope, refs: list[tuple[str, str]]
) -> Any:
    servers = raw.get("bootstrap_servers")
    if not isinstance(servers, str):
        return None  # the Struct reports it
    try:
        parse_bootstrap(servers)
    except ValueError as e:
        c.problem(f"{loc}.bootstrap_servers", str(e))
        return None
    has = {name: raw.get(name) is not None for name in ("topic", "request_topic", "response_topic")}
    if has["topic"] == (has["request_topic"] or has["response_topic"]):
        c.problem(loc, "a kafka step has `topic` (produce) or `request_topic` and `response_topic` (request)")
        return None
    if not has["topic"] and not (has["request_topic"] and has["response_topic"]):
        missing = "response_topic" if has["request_topic"] else "request_topic"
        c.problem(f"{loc}.{missing}", f"a kafka request needs `{missing}` too")
        return None
    value = c.template(raw["value"], f"{loc}.value", scope, refs) if "value" in raw else Template({"$ref": "args"})
    if value is None or spec is None:
        return None
    timeout = (spec.timeout_ms if spec.timeout_ms is not None else DEFAULT_TIMEOUT_MS) / 1000
    return KafkaPlan(servers, value, scope.policy.connections, timeout, has["topic"])


def _descriptor_problem(path: str, service: str, method: str) -> str | None:
    """What is wrong with a descriptor set for ``service``/``method``, checked at load."""
    try:
        pool = _pool_from_file(path)
    except GrpcError as e:
        return str(e)
    except Exception as e:  # a file that is not a FileDescriptorSet: protobuf's DecodeError, TypeError
        return f"{path} is not a protobuf FileDescriptorSet: {e}"
    try:
        svc = pool.FindServiceByName(service)
    except KeyError:
        return f"the descriptor set has no service '{service}'"
    if method not in svc.methods_by_name:
        return f"service '{service}' has no method '{method}' (methods: {', '.join(sorted(svc.methods_by_name))})"
    return None


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


async def run_grpc(step: DeclaredStep, inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext) -> StepOutput:
    """Call the method with the message; the output is the response, as JSON."""
    plan: GrpcPlan = step.plan
    service, method = step.spec.service, step.spec.method  # type: ignore[attr-defined]
    message = plan.message.resolve(env)
    if not isinstance(message, Mapping):
        raise StepFailure(f"the gRPC message must be an object, got {json_type(message)}", "TOOL_FAILED")
    metadata = inputs.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise StepFailure(f"`metadata` must be an object, got {json_type(metadata)}", "TOOL_FAILED")
    pairs = [
        (str(k).lower(), v if isinstance(v, str) else orjson.dumps(v).decode()) for k, v in (metadata or {}).items()
    ]
    key = ("grpc", plan.url, plan.descriptor_set)
    try:
        conn = await plan.connections.get(key, lambda: GrpcConnection(plan.url, plan.descriptor_set))
        with trio.move_on_after(plan.timeout_s):
            return StepOutput.of(await conn.call(service, method, message, timeout_s=plan.timeout_s, metadata=pairs))
    except GrpcError as e:
        raise StepFailure(str(e), e.code) from None
    except NotRunning as e:
        raise StepFailure(f"cannot reach gRPC at {plan.url}: {e}", "TOOL_FAILED") from None
    raise StepFailure(f"gRPC {service}/{method}: no answer within {plan.timeout_s * 1000:g} ms", "TIMEOUT")


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise StepFailure(f"`{name}` must be a non-empty string, got {json_type(value)}", "TOOL_FAILED")
    return value


async def run_kafka(step: DeclaredStep, inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext) -> StepOutput:
    """Produce (the output says where the record went) or request (the output is the response's value)."""
    plan: KafkaPlan = step.plan
    headers = inputs.get("headers")
    if headers is not None and not isinstance(headers, Mapping):
        raise StepFailure(f"`headers` must be an object, got {json_type(headers)}", "TOOL_FAILED")
    hdrs = {str(k): v.encode() if isinstance(v, str) else orjson.dumps(v) for k, v in (headers or {}).items()}
    key = inputs.get("key")
    value = encode(plan.value.resolve(env))
    try:
        client = await plan.connections.get(("kafka", plan.servers), lambda: KafkaClient(plan.servers))
        if plan.produce:
            topic = _text(inputs.get("topic"), "topic")
            with trio.move_on_after(plan.timeout_s):
                partition, offset = await client.produce(
                    topic, value, key=None if key is None else encode(key), headers=hdrs or None
                )
                return StepOutput.of({"topic": topic, "partition": partition, "offset": offset})
            raise StepFailure(f"producing to '{topic}' took more than {plan.timeout_s * 1000:g} ms", "TIMEOUT")
        request, response = (
            _text(inputs.get("request_topic"), "request_topic"),
            _text(inputs.get("response_topic"), "response_topic"),
        )
        record = await client.request(request, response, value, timeout_s=plan.timeout_s, headers=hdrs or None)
    except KafkaError as e:
        raise StepFailure(str(e), e.code) from None
    except NotRunning as e:
        raise StepFailure(f"cannot reach Kafka at {plan.servers}: {e}", "TOOL_FAILED") from None
    return StepOutput.of(None if record.value is None else decode(record.value))
