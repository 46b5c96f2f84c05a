"""Tools reshaped by the operator (``[tools.reshape.NAME]``), whatever serves the original: a downstream MCP
server, an OpenAPI operation, a Python tool, a declared pipeline. What the callers list, call, chain in
``mcp_pipe``, are granted and are audited as is the reshaped tool."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from kit.clients import bearer_client
from kit.openapi_standin import DOCUMENTS, read, standin
from kit.servers import http_server, make_config, stdio_downstream
from mcpipe.errors import ConfigError
from mcpipe.gateway import AuditLog
from mcpipe.server import open_app

RESHAPED = {
    # the downstream server's add(a, b): `a` renamed, `b` fixed, the answer doubled by CEL
    "plus_ten": {
        "tool": "down.add",
        "title": "Add ten",
        "description": "Add ten to a number.",
        "arguments": {"a": {"name": "number", "description": "The number."}, "b": {"value": 10}},
        "output": "last.result * 2",
        "language": "cel",
        "annotations": {"readOnlyHint": True, "idempotentHint": True},
        "hide_original": True,
    },
    # the OpenAPI operation: its path parameter renamed, the answer projected by JSONata
    "pet_path": {
        "tool": "petstore.getPetById",
        "description": "The path a pet is served at.",
        "arguments": {"petId": {"name": "id"}},
        "output": "last.path",
        "hide_original": True,
    },
    # the Python built-in: a default, and a fixed argument
    "dashes": {"tool": "text_replace", "arguments": {"old": {"value": " "}, "new": {"default": "-"}}},
    # the declared pipeline, under another name and description
    "hello": {"tool": "greet_pipeline", "description": "Say hello.", "hide_original": True},
}


def _config(url: str) -> Any:
    return make_config(
        {"ALICE": "alice-token"},
        mcpServers={"down": stdio_downstream()},
        openapi={"petstore": {"spec": str(DOCUMENTS / "swagger-petstore-3.0.yaml"), "base_url": url}},
        pipelines=[
            {
                "name": "greet_pipeline",
                "description": "Greets.",
                "input_schema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
                "steps": [{"kind": "value", "id": "v", "value": {"greeting": "hello ${args.name}"}}],
            }
        ],
        auth={"tokens": [{"env": "ALICE", "principal": "alice", "tools": ["plus_ten", "pet_path", "dashes", "hello"]}]},
        tools={"reshape": RESHAPED},
    )


async def test_a_reshaped_tool_of_each_source_is_what_callers_list_call_chain_are_granted_and_audited_as(
    monkeypatch: Any,
) -> None:
    monkeypatch.setenv("ALICE", "alice-token")
    audit = AuditLog(keep=True)
    with trio.fail_after(60):
        async with (
            standin(read("swagger-petstore-3.0.yaml"), prefix="/api/v3") as api,
            open_app(_config(api.url), audit=audit) as app,
            http_server(app) as url,
            bearer_client(url, "alice-token") as client,
        ):
            listed = {t.name: t.model_dump(by_alias=True, exclude_none=True) for t in (await client.list_tools()).tools}
            added = await client.call_tool("plus_ten", {"number": 5})
            path = await client.call_tool("pet_path", {"id": 12})
            dashed = await client.call_tool("dashes", {"text": "a b c"})
            hello = await client.call_tool("hello", {"name": "Ada"})
            hidden = await client.call_tool("down.add", {"a": 1, "b": 2})
            fixed = await client.call_tool("plus_ten", {"number": 1, "b": 99})
            chained = await client.call_tool(
                "mcp_pipe",
                {
                    "steps": [
                        {"id": "n", "tool": "plus_ten", "args": {"number": 1}},
                        {"id": "p", "tool": "pet_path", "args": {"id": "${steps.n.output}"}},
                    ]
                },
            )
    assert set(listed) == {"mcp_pipe", "plus_ten", "pet_path", "dashes", "hello"}  # what alice is granted
    assert listed["plus_ten"]["inputSchema"]["properties"] == {
        "number": {"title": "A", "type": "integer", "description": "The number."}
    }
    assert listed["plus_ten"]["inputSchema"]["required"] == ["number"]
    assert listed["plus_ten"]["title"] == "Add ten" and listed["plus_ten"]["annotations"]["readOnlyHint"] is True
    assert listed["pet_path"]["inputSchema"]["required"] == ["id"] and listed["pet_path"]["description"].startswith(
        "The path"
    )
    assert (
        listed["dashes"]["inputSchema"]["properties"]["new"]["default"] == "-"
        and "old" not in listed["dashes"]["inputSchema"]["properties"]
    )
    assert added.structured_content == 30 and not added.is_error  # (5 + 10) * 2
    assert path.structured_content == "/api/v3/pet/12"  # any JSON value: the client speaks 2026-07-28
    assert dashed.structured_content is not None and "a-b-c" in json.dumps(dashed.structured_content)
    assert "hello Ada" in json.dumps(hello.structured_content)
    assert hidden.is_error and "unknown tool 'down.add'" in hidden.content[0].text
    assert fixed.is_error and "args.b: not an argument of 'plus_ten'" in fixed.content[0].text
    answer = chained.structured_content or {}
    assert answer.get("ok") is True and answer.get("result") == "/api/v3/pet/22", answer
    assert [s.path for s in api.seen] == ["/api/v3/pet/12", "/api/v3/pet/22"] and not api.invalid
    ran = [r["tool"] for r in audit.records or [] if r["ok"]]
    assert ran == ["plus_ten", "pet_path", "dashes", "hello", "plus_ten", "pet_path", "mcp_pipe"]  # once each, reshaped
    assert [(r["tool"], r["error_code"]) for r in audit.records or [] if r["tool"] == "down.add"] == [
        ("down.add", "UNKNOWN_TOOL")
    ]


@pytest.mark.parametrize(
    ("shape", "where", "message"),
    [
        ({"tool": "x", "output": "last.(", "language": "jsonata"}, "tools.reshape.r.output", ""),
        ({"tool": "x", "output": "nope.x", "language": "cel"}, "tools.reshape.r.output", "unknown variable `nope`"),
        ({"tool": "x", "arguments": {"a": {"value": 1, "default": 2}}}, "tools.reshape.r.arguments.a", "set one of"),
        (
            {"tool": "x", "arguments": {"a": {"name": "z"}, "b": {"name": "z"}}},
            "tools.reshape.r.arguments",
            "renamed alike",
        ),
        ({"tool": "x", "colour": "red"}, "tools.reshape.r.colour", "unknown key"),
    ],
)
def test_a_reshaping_with_a_problem_is_refused_located(shape: dict[str, Any], where: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        make_config(tools={"reshape": {"r": shape}})
    assert any(p.location.startswith(where) and message in p.message for p in e.value.problems), e.value.problems


async def test_hidden_tools_are_neither_listed_nor_callable_nor_found() -> None:
    from mcp import Client

    config = make_config(tools={"hide": ["text_*"], "discovery": "list"})
    with trio.fail_after(30):
        async with open_app(config) as app, Client(app.server) as client:
            listed = [t.name for t in (await client.list_tools()).tools]
            refused = await client.call_tool("text_split", {"text": "a b"})
            kept = await client.call_tool("json_parse", {"text": "[1]"})
    assert not [n for n in listed if n.startswith("text_")] and "json_parse" in listed
    assert refused.is_error and "unknown tool 'text_split'" in refused.content[0].text  # type: ignore[union-attr]
    assert not kept.is_error
