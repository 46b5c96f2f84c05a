"""Unary gRPC calls with JSON messages against a real grpcio server, descriptors by reflection or from a file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from kit.grpcserver import descriptor_set_bytes, grpc_server
from mcpipe.backends.grpc import GrpcConnection, GrpcError, parse_grpc_url


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, object]]:
    with grpc_server() as (url, seen):
        yield url, seen


async def test_a_unary_call_by_reflection_takes_and_answers_json(server: tuple[str, object]) -> None:
    url, seen = server
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            conn = GrpcConnection(url)
            await nursery.start(conn.run)
            user = await conn.call(
                "shop.UserService", "GetUser", {"id": 7, "name_hint": "Ada"}, metadata=[("x-trace", "t1")]
            )
            again = await conn.call("shop.UserService", "GetUser", {"id": "8"}, timeout_s=5)
            nursery.cancel_scope.cancel()
    assert user == {"id": "7", "display_name": "Ada", "roles": ["admin", "ops"]}  # int64 is a JSON string
    assert again["display_name"] == "user 8"
    assert seen.calls[0]["metadata"]["x-trace"] == "t1"  # type: ignore[attr-defined]


async def test_descriptors_can_come_from_a_descriptor_set_file(tmp_path: Path) -> None:
    path = tmp_path / "shop.pb"
    path.write_bytes(descriptor_set_bytes())
    with grpc_server(reflection_on=False) as (url, _):
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                conn = GrpcConnection(url, descriptor_set=str(path))
                await nursery.start(conn.run)
                user = await conn.call("shop.UserService", "GetUser", {"id": 3})
                nursery.cancel_scope.cancel()
    assert user["display_name"] == "user 3"


@pytest.mark.parametrize(
    ("service", "method", "message", "error", "code"),
    [
        (
            "shop.UserService",
            "GetUser",
            {"id": 404},
            "gRPC shop.UserService/GetUser answered NOT_FOUND: no user 404",
            "TOOL_ERROR",
        ),
        ("shop.Nope", "GetUser", {}, "unknown gRPC service 'shop.Nope'", "TOOL_FAILED"),
        (
            "shop.UserService",
            "Get",
            {},
            "gRPC service 'shop.UserService' has no method 'Get' (methods: GetUser, Hang, Watch)",
            "TOOL_FAILED",
        ),
        ("shop.UserService", "Watch", {}, "only unary methods can be called", "TOOL_FAILED"),
        ("shop.UserService", "GetUser", {"idd": 1}, "the message does not fit shop.GetUserRequest", "TOOL_FAILED"),
    ],
)
async def test_grpc_failures_are_clear(
    server: tuple[str, object], service: str, method: str, message: dict, error: str, code: str
) -> None:
    url, _ = server
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            conn = GrpcConnection(url)
            await nursery.start(conn.run)
            with pytest.raises(GrpcError) as info:
                await conn.call(service, method, message)
            nursery.cancel_scope.cancel()
    assert error in str(info.value)
    assert info.value.code == code


async def test_a_cancelled_call_is_cancelled_on_the_server(server: tuple[str, object]) -> None:
    url, seen = server
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            conn = GrpcConnection(url)
            await nursery.start(conn.run)
            async with trio.open_nursery() as calling:
                calling.start_soon(conn.call, "shop.UserService", "Hang", {"id": 1})
                # Cancelled once the server has the call, however slowly the host got it there.
                assert await trio.to_thread.run_sync(seen.hang_started.wait, 10)  # type: ignore[attr-defined]
                calling.cancel_scope.cancel()
            await trio.to_thread.run_sync(seen.hang_cancelled.wait, 10)  # type: ignore[attr-defined]
            nursery.cancel_scope.cancel()
    assert seen.hang_cancelled.is_set()  # type: ignore[attr-defined]


async def test_a_deadline_is_a_timeout(server: tuple[str, object]) -> None:
    url, _ = server
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            conn = GrpcConnection(url)
            await nursery.start(conn.run)
            with pytest.raises(GrpcError, match="no answer before the deadline") as info:
                await conn.call("shop.UserService", "Hang", {"id": 1}, timeout_s=0.2)
            nursery.cancel_scope.cancel()
    assert info.value.code == "TIMEOUT"


@pytest.mark.parametrize(
    ("url", "target", "tls"),
    [
        ("grpc://127.0.0.1:50051", "127.0.0.1:50051", False),
        ("https://api.example.com", "api.example.com:443", True),
        ("grpcs://[::1]:9", "[::1]:9", True),
    ],
)
def test_grpc_urls(url: str, target: str, tls: bool) -> None:
    t = parse_grpc_url(url)
    assert (t.target, t.tls) == (target, tls)


def test_a_grpc_url_of_another_scheme_is_refused() -> None:
    with pytest.raises(ValueError, match="a gRPC URL is"):
        parse_grpc_url("ftp://h")


async def test_an_unreachable_server_is_a_clear_error() -> None:
    from kit.realservers import free_port

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            conn = GrpcConnection(f"grpc://127.0.0.1:{free_port()}")
            await nursery.start(conn.run)
            with pytest.raises(
                GrpcError, match=r"cannot read the services of grpc://127\.0\.0\.1:\d+ by reflection: UNAVAILABLE"
            ):
                await conn.call("shop.UserService", "GetUser", {})
            nursery.cancel_scope.cancel()
