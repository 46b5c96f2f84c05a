"""Unary gRPC calls by service and method, with JSON messages, under Trio.

The message types come from the server itself (gRPC server reflection) or from a descriptor set file
(``protoc --include_imports --descriptor_set_out=api.pb``), so no generated code is needed: a JSON object
becomes the request message (``google.protobuf.json_format``), and the response becomes JSON again
(field names as in the ``.proto``). ``grpcio``'s calls block, so each runs in a worker thread; a call
whose step is cancelled or times out is cancelled on the wire.

One channel per server URL is shared by every step (:class:`GrpcConnection`, kept by
:class:`~mcpipe.backends._connections.Connections`), and closed when the server stops.

URLs: ``grpc://host:port`` or ``http://host:port`` (plaintext), ``grpcs://host[:port]`` or
``https://host[:port]`` (TLS, port 443 by default).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import trio

from mcpipe.backends._errors import BackendError
from mcpipe.backends._threads import run_interruptible

__all__ = ["GrpcConnection", "GrpcError", "GrpcMethod", "parse_grpc_url"]


class GrpcError(BackendError):
    """A gRPC call failed.

    Attributes:
        code: ``TOOL_ERROR`` (the server answered with an error status), ``TOOL_FAILED`` (unreachable, an
            unknown service or method, a message that does not fit its type), ``TIMEOUT``.
    """


@dataclass(frozen=True, slots=True)
class GrpcTarget:
    target: str
    tls: bool


def parse_grpc_url(url: str) -> GrpcTarget:
    """``grpc://host:port`` / ``http://host:port`` (plaintext), ``grpcs://host`` / ``https://host`` (TLS).

    Raises:
        ValueError: another scheme, or no host.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("grpc", "http", "grpcs", "https"):
        raise ValueError(f"a gRPC URL is grpc://host:port or grpcs://host:port, got {url!r}")
    if not parts.hostname:
        raise ValueError(f"a gRPC URL needs a host, got {url!r}")
    tls = scheme in ("grpcs", "https")
    try:
        port = parts.port or (443 if tls else 80)
    except ValueError:
        raise ValueError(f"invalid port in gRPC URL {url!r}") from None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return GrpcTarget(f"{host}:{port}", tls)


@dataclass(frozen=True, slots=True)
class GrpcMethod:
    """A method found in the descriptors: its path and message classes."""

    path: str
    request: Any
    response: Any
    input_type: str
    output_type: str


class GrpcConnection:
    """A channel to one gRPC server and the message types found through it (or in a descriptor set).

    Run it in a nursery (``await nursery.start(conn.run)``): the channel lives until it is cancelled.

    Args:
        url: the server.
        descriptor_set: a ``FileDescriptorSet`` file; None: ask the server (reflection).
    """

    def __init__(self, url: str, descriptor_set: str | None = None) -> None:
        self.url = url
        self.target = parse_grpc_url(url)
        self.descriptor_set = descriptor_set
        self._channel: Any = None
        self._pool: Any = None
        self._methods: dict[tuple[str, str], GrpcMethod] = {}
        self._lock = trio.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Open the channel (connections are made by gRPC when a call needs one), then hold it open."""
        import grpc
        from google.protobuf import descriptor_pool

        if self.target.tls:
            self._channel = grpc.secure_channel(self.target.target, grpc.ssl_channel_credentials())
        else:
            self._channel = grpc.insecure_channel(self.target.target)
        try:
            if self.descriptor_set is not None:
                self._pool = _pool_from_file(self.descriptor_set)
            else:
                from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
                    ProtoReflectionDescriptorDatabase,
                )

                self._pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(self._channel))
            task_status.started()
            await trio.sleep_forever()
        finally:
            self._closed = True
            # Shielded: this runs when the server stops (cancelled), and an unshielded to_thread call
            # would raise Cancelled before it ran, leaving the channel and its connection open.
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._channel.close)

    async def method(self, service: str, method: str) -> GrpcMethod:
        """Find ``service``/``method`` (asking the server by reflection the first time; cached after).

        Raises:
            GrpcError: the service or the method does not exist, or reflection failed.
        """
        key = (service, method)
        found = self._methods.get(key)
        if found is not None:
            return found
        async with self._lock:
            found = self._methods.get(key)
            if found is None:
                found = await run_interruptible(lambda: self._find(service, method))
                self._methods[key] = found
        return found

    def _find(self, service: str, method: str) -> GrpcMethod:
        import grpc
        from google.protobuf import message_factory

        try:
            svc = self._pool.FindServiceByName(service)
        except KeyError:
            where = "the descriptor set" if self.descriptor_set else f"the server's reflection at {self.url}"
            raise GrpcError(f"unknown gRPC service '{service}' (not in {where})") from None
        except grpc.RpcError as e:
            raise GrpcError(f"cannot read the services of {self.url} by reflection: {_status(e)}") from None
        m = svc.methods_by_name.get(method)
        if m is None:
            known = ", ".join(sorted(svc.methods_by_name)) or "none"
            raise GrpcError(f"gRPC service '{service}' has no method '{method}' (methods: {known})")
        if m.client_streaming or m.server_streaming:
            raise GrpcError(f"gRPC method '{service}/{method}' streams; only unary methods can be called")
        return GrpcMethod(
            f"/{service}/{method}",
            message_factory.GetMessageClass(m.input_type),
            message_factory.GetMessageClass(m.output_type),
            m.input_type.full_name,
            m.output_type.full_name,
        )

    async def call(
        self,
        service: str,
        method: str,
        message: Mapping[str, object],
        *,
        timeout_s: float | None = None,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> dict[str, Any]:
        """Call a unary method with a JSON message; answer the response as JSON.

        Raises:
            GrpcError: see the class.
        """
        from google.protobuf import json_format

        found = await self.method(service, method)
        try:
            request = json_format.ParseDict(message, found.request())
        except json_format.ParseError as e:
            raise GrpcError(f"the message does not fit {found.input_type}: {e}") from None
        stub = self._channel.unary_unary(
            found.path,
            request_serializer=found.request.SerializeToString,
            response_deserializer=found.response.FromString,
        )
        wait = None if timeout_s is None or math.isinf(timeout_s) else timeout_s
        future = stub.future(request, timeout=wait, metadata=tuple(metadata) or None)
        try:
            response = await run_interruptible(future.result, future.cancel)
        except Exception as e:
            if _is_rpc_error(e):
                raise _rpc_error(e, f"{service}/{method}") from None
            raise
        return json_format.MessageToDict(response, preserving_proto_field_name=True)


def _pool_from_file(path: str) -> Any:
    from google.protobuf import descriptor_pb2, descriptor_pool

    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise GrpcError(f"cannot read the descriptor set {path}: {e.strerror}") from None
    files = descriptor_pb2.FileDescriptorSet.FromString(data)
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)
    return pool


def _is_rpc_error(e: BaseException) -> bool:
    import grpc

    return isinstance(e, grpc.RpcError)


def _status(e: object) -> str:
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else str(e)
    return f"{code.name if code is not None else 'ERROR'}: {details}"


def _rpc_error(e: object, what: str) -> GrpcError:
    import grpc

    code = e.code() if hasattr(e, "code") else None
    details = (e.details() if hasattr(e, "details") else "") or ""
    name = code.name if code is not None else "UNKNOWN"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return GrpcError(f"gRPC {what}: no answer before the deadline", "TIMEOUT")
    if code == grpc.StatusCode.UNAVAILABLE:
        return GrpcError(f"gRPC {what}: the server is unavailable ({details})", "TOOL_FAILED")
    return GrpcError(f"gRPC {what} answered {name}: {details}", "TOOL_ERROR")
