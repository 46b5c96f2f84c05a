"""The ``grpc`` step kind: a unary gRPC call, on a connection shared per URL (and descriptor set)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import msgspec
import orjson
import trio

from mcpipe._describe import json_type
from mcpipe._template import Template
from mcpipe.backends import Connections, NotRunning
from mcpipe.backends.grpc import GrpcConnection, GrpcError, _pool_from_file, parse_grpc_url
from mcpipe.errors import ErrorCode
from mcpipe.kinds._base import Build, Kind, StepFields
from mcpipe.kinds._wire import address, object_of, payload, timeout_s
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = ["KIND", "GrpcFields", "GrpcPlan", "run_grpc"]

Name = Annotated[str, msgspec.Meta(min_length=1)]


class GrpcFields(StepFields, tag="grpc"):
    """A unary gRPC call of ``service``/``method`` on ``url`` (a constant). ``message`` (a template; default:
    the step's input, ``args``) is JSON turned into the request message; the response is the output, as
    JSON. Message types come from server reflection, or from ``descriptor_set`` (a ``FileDescriptorSet``
    file). ``metadata`` (a template, an object) is sent with the call."""

    url: Name
    service: Name
    method: Name
    message: Any = msgspec.UNSET
    metadata: Any = None
    descriptor_set: str | None = None


@dataclass(frozen=True, slots=True)
class GrpcPlan:
    url: str
    message: Template
    connections: Connections
    timeout_s: float
    descriptor_set: str | None


def build_grpc(b: Build[GrpcFields]) -> GrpcPlan:
    """The URL and the descriptor set, checked; the message template; the own deadline."""
    url = address(b, "url", parse_grpc_url)
    message = payload(b, "message")
    spec = b.fields
    if spec is None or b.failed:
        b.fail()
    try:
        import grpc  # noqa: F401
        import grpc_reflection  # noqa: F401
    except ImportError:
        b.problem(f"{b.location}.kind", "gRPC steps need grpcio: pip install 'mcpipe[grpc]'")
        b.fail()
    descriptors = None
    if spec.descriptor_set is not None:
        descriptors = str(Path(b.policy.base_dir, spec.descriptor_set))
        problem = _descriptor_problem(descriptors, spec.service, spec.method)
        if problem is not None:
            b.problem(f"{b.location}.descriptor_set", problem)
            b.fail()
    return GrpcPlan(url, message, b.policy.connections, timeout_s(b), descriptors)


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


async def run_grpc(
    step: Leaf[GrpcFields, GrpcPlan], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Call the method with the message; the output is the response, as JSON."""
    plan = step.built
    service, method = step.fields.service, step.fields.method
    message = plan.message.resolve(env)
    if not isinstance(message, Mapping):
        raise StepFailure(f"the gRPC message must be an object, got {json_type(message)}", ErrorCode.TOOL_FAILED)
    metadata = object_of(inputs.get("metadata"), "metadata")
    pairs = [(str(k).lower(), v if isinstance(v, str) else orjson.dumps(v).decode()) for k, v in metadata.items()]
    key = ("grpc", plan.url, plan.descriptor_set)
    try:
        conn = await plan.connections.get(key, lambda: GrpcConnection(plan.url, plan.descriptor_set))
        with trio.move_on_after(plan.timeout_s):
            return StepOutput.of(await conn.call(service, method, message, timeout_s=plan.timeout_s, metadata=pairs))
    except GrpcError as e:
        raise StepFailure(str(e), e.code) from None
    except NotRunning as e:
        raise StepFailure(f"cannot reach gRPC at {plan.url}: {e}", ErrorCode.TOOL_FAILED) from None
    raise StepFailure(f"gRPC {service}/{method}: no answer within {plan.timeout_s * 1000:g} ms", ErrorCode.TIMEOUT)


KIND = Kind("grpc", GrpcFields, run_grpc, templates=("metadata",), build=build_grpc, own_deadline=True)
