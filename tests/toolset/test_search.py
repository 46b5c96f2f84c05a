"""Tool search (``[tools] discovery = "search"``): ``tools/list`` shows ``search_tools``, ``describe_tools``,
``mcp_pipe`` and the pinned tools; every tool a caller may call is found by a query and called directly or in
``mcp_pipe``; one it may not call is never found; the index follows a downstream server's list changes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import trio
from mcp import Client, types

from kit.clients import bearer_client
from kit.openapi_standin import DOCUMENTS, read, standin
from kit.servers import http_server, make_config
from mcpipe.server import open_app

GROWING = str(Path(__file__).resolve().parents[1] / "kit" / "growing_server.py")


def _config(url: str, **extra: Any) -> Any:
    return make_config(
        {"ALICE": "alice-token"},
        openapi={"petstore": {"spec": str(DOCUMENTS / "swagger-petstore-3.0.yaml"), "base_url": url}},
        tools={"discovery": "search", "pinned": ["petstore.getInventory"]},
        **extra,
    )


def _names(result: Any) -> list[str]:
    return [t["name"] for t in (result.structured_content or {})["tools"]]


async def test_search_mode_lists_a_few_tools_and_finds_the_others_which_are_called_directly_and_in_mcp_pipe() -> None:
    with trio.fail_after(60):
        async with (
            standin(read("swagger-petstore-3.0.yaml"), prefix="/api/v3") as api,
            open_app(_config(api.url)) as app,
            http_server(app) as url,
            bearer_client(url, None) as client,
        ):
            listed = [t.name for t in (await client.list_tools()).tools]
            found = await client.call_tool("search_tools", {"query": "find a pet by its id"})
            orders = await client.call_tool("search_tools", {"query": "delete purchase order", "limit": 3})
            described = await client.call_tool("describe_tools", {"names": ["petstore.getPetById", "nope"]})
            direct = await client.call_tool("petstore.getPetById", {"petId": 4})
            piped = await client.call_tool(
                "mcp_pipe",
                {
                    "steps": [
                        {"tool": "petstore.getOrderById", "args": {"orderId": 3}},
                        {"tool": "petstore.deleteOrder", "args": {"orderId": 3}},
                    ]
                },
            )
    assert listed == ["mcp_pipe", "search_tools", "describe_tools", "petstore.getInventory"]
    assert _names(found)[0] == "petstore.getPetById"
    assert _names(orders)[0] == "petstore.deleteOrder" and len(_names(orders)) <= 3
    desc = described.structured_content or {}
    assert [t["name"] for t in desc["tools"]] == ["petstore.getPetById"] and desc["unknown"] == ["nope"]
    assert desc["tools"][0]["inputSchema"]["required"] == ["petId"]
    assert not direct.is_error and (piped.structured_content or {}).get("ok") is True
    assert [s.operation for s in api.seen] == ["getPetById", "getOrderById", "deleteOrder"] and not api.invalid


async def test_a_caller_never_finds_nor_describes_a_tool_it_may_not_call(monkeypatch: Any) -> None:
    monkeypatch.setenv("ALICE", "alice-token")
    grants = {
        "tokens": [
            {"env": "ALICE", "principal": "alice", "tools": ["search_tools", "describe_tools", "petstore.find*"]}
        ]
    }
    with trio.fail_after(60):
        async with (
            standin(read("swagger-petstore-3.0.yaml"), prefix="/api/v3") as api,
            open_app(_config(api.url, auth=grants)) as app,
            http_server(app) as url,
            bearer_client(url, "alice-token") as client,
        ):
            listed = [t.name for t in (await client.list_tools()).tools]
            deleting = await client.call_tool("search_tools", {"query": "delete a pet"})
            finding = await client.call_tool("search_tools", {"query": "find pets by status"})
            described = await client.call_tool("describe_tools", {"names": ["petstore.deletePet"]})
    assert listed == ["mcp_pipe", "search_tools", "describe_tools"]  # the pinned tool is not alice's
    assert all(n.startswith("petstore.find") for n in _names(deleting) + _names(finding))
    assert _names(finding)[0] == "petstore.findPetsByStatus"
    assert (described.structured_content or {}) == {"tools": [], "unknown": ["petstore.deletePet"]}


async def test_the_index_follows_a_downstream_servers_list_changes() -> None:
    changed = trio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    config = make_config(
        mcpServers={"growing": {"command": sys.executable, "args": [GROWING]}}, tools={"discovery": "search"}
    )
    with trio.fail_after(60):
        async with open_app(config) as app, Client(app.server, mode="legacy", message_handler=on_message) as client:
            await client.list_tools()  # a session the gateway tells of changes
            before = await client.call_tool("search_tools", {"query": "weather forecast for tomorrow"})
            await client.call_tool("growing.learn", {})
            await changed.wait()  # the gateway listed the server's tools again
            after = await client.call_tool("search_tools", {"query": "weather forecast for tomorrow"})
            forecast = await client.call_tool("growing.forecast_tomorrow_weather", {"city": "Oslo"})
    assert "growing.forecast_tomorrow_weather" not in _names(before)
    assert _names(after)[0] == "growing.forecast_tomorrow_weather"
    assert "sun in Oslo" in forecast.content[0].text  # type: ignore[union-attr]


async def test_the_guide_and_the_write_pipeline_prompt_teach_search_mode() -> None:
    config = make_config(tools={"discovery": "search", "pinned": ["now"]})
    with trio.fail_after(30):
        async with open_app(config) as app, Client(app.server, mode="legacy") as client:
            instructions = client.instructions or ""
            prompt = await client.get_prompt("write_pipeline", {"task": "split a text"})
            guide = await client.read_resource("mcpipe://guide/pipelines")
    text = prompt.messages[0].content.text  # type: ignore[union-attr]
    assert "## Finding the tools" in text and '`search_tools` with `{"query"' in text
    assert "## The tools listed (3)" in text and "### `now`" in text and "### `text_split`" not in text
    assert "describe_tools" in guide.contents[0].text  # type: ignore[union-attr]
    assert "mcp_pipe" in instructions and "find the others with `search_tools`" in instructions
