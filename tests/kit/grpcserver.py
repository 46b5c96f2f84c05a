"""A real gRPC server for the tests, written with grpcio, with server reflection on.

Its ``shop.UserService`` is declared with descriptors built here (no generated code): ``GetUser`` answers a
user (``NOT_FOUND`` for id 404), ``Hang`` waits until its call is cancelled and records that it was.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_reflection.v1alpha import reflection

SERVICE = "shop.UserService"


def file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto(name="shop/users.proto", package="shop", syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto
    req = f.message_type.add(name="GetUserRequest")
    req.field.add(name="id", number=1, type=T.TYPE_INT64, label=T.LABEL_OPTIONAL)
    req.field.add(name="name_hint", number=2, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    user = f.message_type.add(name="User")
    user.field.add(name="id", number=1, type=T.TYPE_INT64, label=T.LABEL_OPTIONAL)
    user.field.add(name="display_name", number=2, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    user.field.add(name="roles", number=3, type=T.TYPE_STRING, label=T.LABEL_REPEATED)
    svc = f.service.add(name="UserService")
    svc.method.add(name="GetUser", input_type=".shop.GetUserRequest", output_type=".shop.User")
    svc.method.add(name="Hang", input_type=".shop.GetUserRequest", output_type=".shop.User")
    svc.method.add(name="Watch", input_type=".shop.GetUserRequest", output_type=".shop.User", server_streaming=True)
    return f


def descriptor_set_bytes() -> bytes:
    return descriptor_pb2.FileDescriptorSet(file=[file_descriptor()]).SerializeToString()


@dataclass
class Seen:
    calls: list[dict[str, Any]] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)  # every call's method path, reflection's too
    hang_started: threading.Event = field(default_factory=threading.Event)
    hang_cancelled: threading.Event = field(default_factory=threading.Event)


class _Record(grpc.ServerInterceptor):
    """Notes the method of every call the server receives."""

    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        self.seen.methods.append(handler_call_details.method)
        return continuation(handler_call_details)


@contextmanager
def grpc_server(*, reflection_on: bool = True) -> Iterator[tuple[str, Seen]]:
    """Yields the server's URL (``grpc://127.0.0.1:PORT``) and what it saw."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_descriptor())
    Request = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.GetUserRequest"))
    User = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.User"))
    seen = Seen()

    def get_user(request: Any, context: grpc.ServicerContext) -> Any:
        seen.calls.append({"id": request.id, "metadata": dict(context.invocation_metadata())})
        if request.id == 404:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no user {request.id}")
        return User(id=request.id, display_name=request.name_hint or f"user {request.id}", roles=["admin", "ops"])

    def hang(request: Any, context: grpc.ServicerContext) -> Any:
        done = threading.Event()
        context.add_callback(done.set)
        seen.hang_started.set()
        done.wait(30)
        if not context.is_active():
            seen.hang_cancelled.set()
        return User(id=request.id)

    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "GetUser": grpc.unary_unary_rpc_method_handler(
                get_user, request_deserializer=Request.FromString, response_serializer=User.SerializeToString
            ),
            "Hang": grpc.unary_unary_rpc_method_handler(
                hang, request_deserializer=Request.FromString, response_serializer=User.SerializeToString
            ),
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), interceptors=[_Record(seen)])
    server.add_generic_rpc_handlers((handler,))
    if reflection_on:
        reflection.enable_server_reflection((SERVICE, reflection.SERVICE_NAME), server, pool=pool)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"grpc://127.0.0.1:{port}", seen
    finally:
        server.stop(grace=None).wait(5)
