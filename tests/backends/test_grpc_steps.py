"""The grpc step, served by the real server and called with the SDK's Client, against a real grpcio server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client

from kit.grpcserver import SERVICE, descriptor_set_bytes, grpc_server
from kit.served import call, served
from kit.tcpcount import CountingForwarder
from mcpipe.config import ConfigError, parse_config


def users(url: str, **extra: Any) -> dict[str, Any]:
    return {
        "pipelines": [
            {
                "name": "get_user",
                "input_schema": {"type": "object", "properties": {"id": {"type": "integer"}}},
                # mcpg's shape: no message, so the step's input (the arguments) is the request.
                "steps": [
                    {
                        "kind": "grpc",
                        "id": "grpc_call",
                        "url": url,
                        "service": "shop.UserService",
                        "method": "GetUser",
                        **extra,
                    }
                ],
            },
            {
                "name": "greet",
                "input_schema": {
                    "type": "object",
                    "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
                },
                "steps": [
                    {
                        "kind": "grpc",
                        "id": "u",
                        "url": url,
                        "service": "shop.UserService",
                        "method": "GetUser",
                        "message": {"id": "${args.id}", "name_hint": "${args.name}"},
                        "metadata": {"X-Caller": "mcpipe"},
                        **extra,
                    },
                    {"kind": "value", "id": "hello", "value": "hello ${steps.u.output.display_name}"},
                ],
            },
            {
                "name": "hang",
                "steps": [
                    {
                        "kind": "grpc",
                        "id": "h",
                        "url": url,
                        "service": "shop.UserService",
                        "method": "Hang",
                        "timeout_ms": 200,
                        **extra,
                    }
                ],
            },
        ]
    }


async def test_a_grpc_step_calls_a_method_by_reflection() -> None:
    with grpc_server() as (url, seen):
        with trio.fail_after(30):
            async with served(users(url)) as app, Client(app.server) as client:
                user = await call(client, "get_user", {"id": 5})
                hello = await call(client, "greet", {"id": 6, "name": "Ada"})
                missing = await call(client, "get_user", {"id": 404})
                hang = await call(client, "hang", {})
    assert user == (False, {"id": "5", "display_name": "user 5", "roles": ["admin", "ops"]})
    assert hello == (False, "hello Ada")
    assert seen.calls[1]["metadata"]["x-caller"] == "mcpipe"
    assert missing == (
        True,
        "TOOL_ERROR: step 'grpc_call' failed: gRPC shop.UserService/GetUser answered NOT_FOUND: no user 404",
    )
    assert hang[0] and hang[1].startswith("TIMEOUT: step 'h' failed: ")


async def test_a_grpc_step_can_take_its_types_from_a_descriptor_set(tmp_path: Path) -> None:
    (tmp_path / "shop.pb").write_bytes(descriptor_set_bytes())
    with grpc_server(reflection_on=False) as (url, _):
        with trio.fail_after(30):
            async with (
                served(users(url, descriptor_set="shop.pb"), base_dir=str(tmp_path)) as app,
                Client(app.server) as client,
            ):
                user = await call(client, "get_user", {"id": 9})
    assert user == (False, {"id": "9", "display_name": "user 9", "roles": ["admin", "ops"]})


def test_grpc_steps_are_checked_at_load(tmp_path: Path) -> None:
    (tmp_path / "shop.pb").write_bytes(descriptor_set_bytes())
    (tmp_path / "junk.pb").write_bytes(b"\xff\xff not protobuf")
    step = {"kind": "grpc", "url": "grpc://127.0.0.1:1", "service": "shop.UserService", "method": "GetUser"}
    doc = {
        "pipelines": [
            {"name": "a", "steps": [{**step, "url": "ftp://x"}]},
            {"name": "b", "steps": [{**step, "descriptor_set": "shop.pb", "method": "Nope"}]},
            {"name": "c", "steps": [{**step, "descriptor_set": "missing.pb"}]},
            {"name": "d", "steps": [{**step, "descriptor_set": "junk.pb"}]},
        ]
    }
    with pytest.raises(ConfigError) as info:
        parse_config(json.dumps(doc), "json", base_dir=str(tmp_path), environ={})
    found = [str(p) for p in info.value.problems]
    assert found[0] == "pipelines.a.steps[0].url: a gRPC URL is grpc://host:port or grpcs://host:port, got 'ftp://x'"
    assert found[1] == (
        "pipelines.b.steps[0].descriptor_set: service 'shop.UserService' has no method 'Nope'"
        " (methods: GetUser, Hang, Watch)"
    )
    assert found[2].startswith("pipelines.c.steps[0].descriptor_set: cannot read the descriptor set ")
    assert (
        found[3].startswith("pipelines.d.steps[0].descriptor_set: ") and "not a protobuf FileDescriptorSet" in found[3]
    )
    assert len(found) == 4


async def test_grpc_steps_on_one_url_share_one_connection_opened_at_first_use_and_closed_at_shutdown() -> None:
    """Counted where the connections arrive (a forwarder in front of the gRPC server): none before a step runs,
    one for two pipelines on the same URL (which also share the descriptors reflection found), and none left
    once the server has stopped."""
    with grpc_server() as (url, seen):
        forwarder = CountingForwarder(int(url.rsplit(":", 1)[1]))
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                port = await nursery.start(forwarder.run)
                async with served(users(f"grpc://127.0.0.1:{port}")) as app, Client(app.server) as client:
                    await client.list_tools()
                    assert forwarder.accepted == 0  # serving and listing tools connects to nothing
                    assert await call(client, "get_user", {"id": 5}) == (
                        False,
                        {"id": "5", "display_name": "user 5", "roles": ["admin", "ops"]},
                    )
                    reflection_calls = [m for m in seen.methods if "ServerReflection" in m]
                    assert await call(client, "greet", {"id": 6, "name": "Ada"}) == (False, "hello Ada")
                    assert await call(client, "get_user", {"id": 7}) == (False, {"id": "7", **_USER7})
                    assert (forwarder.accepted, forwarder.open) == (1, 1)
                    assert [m for m in seen.methods if "ServerReflection" in m] == reflection_calls  # none new
                await forwarder.until(lambda: forwarder.open == 0)  # the server's stop closed the channel
                nursery.cancel_scope.cancel()
    assert forwarder.accepted == 1 and len(reflection_calls) >= 1
    assert [m for m in seen.methods if "ServerReflection" not in m] == [f"/{SERVICE}/GetUser"] * 3


_USER7 = {"display_name": "user 7", "roles": ["admin", "ops"]}
