"""Declared pipelines served by the real server, called with the SDK's Client: in memory, over HTTP, and
composing a downstream server's tools; and ``mcpipe check --config`` on a file full of mistakes.

How the pipelines reach the server. The server's hook (``Config.pipelines`` and ``Config.outbound``, read
by ``open_app``, which loads them with :func:`mcpipe.declared.load_declared`, puts them among the
gateway's sources and binds them to the gateway) is used when it exists. Until it does, the same thing is
done here through ``open_app``'s ``extra_sources``: the tests exercise the same server, gateway and SDK
path either way.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import yaml
from mcp import Client

from kit.servers import DOWNSTREAM, http_server
from mcpipe.config import ConfigError, parse, parse_config
from mcpipe.declared import OutboundConfig, PipelineConfig
from mcpipe.server import App, open_app
from mcpipe.tools import ToolRegistry

# The SDK's HTTP client leaves its SSE generators to the garbage collector (as in tests/server).
pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()

local_tools = ToolRegistry()


@local_tools.tool
def shout(text: str) -> str:
    """Upper-case a text."""
    return text.upper()


@asynccontextmanager
async def served(doc: dict[str, Any]) -> AsyncIterator[App]:
    """An app serving the config ``doc`` (its ``pipelines`` and ``outbound`` included), with ``shout``."""
    doc = {"audit": {"enabled": False}, **doc}
    # `shout` comes in as a python_tools entry, so the config's own checks know it once it is loaded.
    doc["python_tools"] = [*doc.get("python_tools", []), f"{__name__}:local_tools"]
    async with open_app(parse(json.dumps(doc), "json", environ={})) as app:
        yield app


ORDER = yaml.safe_load((ROOT / "examples" / "declared" / "order_summary.yaml").read_text())

MEDIA = {
    "pipelines": [
        {
            "name": "media",
            "description": "Every kind of content block.",
            "input_schema": {"type": "object", "properties": {"who": {"type": "string"}}, "required": ["who"]},
            "steps": [
                {"kind": "value", "id": "hello", "value": "hello ${args.who}"},
                {"kind": "tool", "id": "loud", "tool": "shout", "args": {"text": "${steps.hello.output}"}},
            ],
            "content": [
                {"type": "text", "text": "${steps.loud.output}"},
                {"type": "image", "data": PNG, "mimeType": "image/png"},
                {"type": "audio", "data": PNG, "mimeType": "audio/wav"},
                {"type": "resource", "resource": {"uri": "note://${args.who}", "text": "${steps.hello.output}"}},
                {"type": "resource", "resource": {"uri": "blob://1", "blob": PNG, "mimeType": "image/png"}},
                {"type": "resource_link", "uri": "file:///tmp/x.txt", "name": "x.txt"},
            ],
        }
    ]
}


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
async def test_a_declared_pipeline_is_listed_and_called_like_any_tool(mode):
    with trio.fail_after(30):
        async with served(ORDER) as app, Client(app.server, mode=mode) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            args = {"customer": "ada", "lines": [{"sku": "a", "qty": 2, "price": 3.5}]}
            r = await client.call_tool("order_summary", args)
    tool = tools["order_summary"]
    assert tool.description == "Totals and a one-line summary for an order's lines."
    assert tool.input_schema["required"] == ["customer", "lines"]
    assert r.is_error is False
    assert r.structured_content["summary"] == "2 units, 7 EUR"
    assert json.loads(r.content[0].text) == r.structured_content


async def test_bad_arguments_and_failed_steps_are_is_error_answers_not_protocol_errors():
    with trio.fail_after(30):
        async with served(ORDER) as app, Client(app.server) as client:
            bad = await client.call_tool("order_summary", {"customer": "ada", "lines": [{"sku": "a", "qty": 0}]})
            gate = await client.call_tool("order_summary", {"customer": "ada", "lines": []})
    assert bad.is_error is True
    assert bad.content[0].text == (
        "invalid arguments for tool 'order_summary': args.lines[0]: 'price' is a required property; "
        "args.lines[0].qty: 0 is less than the minimum of 1"
    )
    assert gate.is_error is True
    assert gate.content[0].text == "GATE_REJECTED: step 'not_empty' failed: An order has between 1 and 100 lines."


async def test_content_blocks_of_every_type_reach_the_sdk_client():
    with trio.fail_after(30):
        async with served(MEDIA) as app, Client(app.server) as client:
            r = await client.call_tool("media", {"who": "ada"})
    assert r.is_error is False
    assert [b.type for b in r.content] == ["text", "image", "audio", "resource", "resource", "resource_link"]
    text, image, audio, note, blob, link = r.content
    assert text.text == "HELLO ADA"
    assert (image.data, image.mime_type, audio.mime_type) == (PNG, "image/png", "audio/wav")
    assert str(note.resource.uri) == "note://ada" and note.resource.text == "hello ada"
    assert blob.resource.blob == PNG
    assert str(link.uri) == "file:///tmp/x.txt" and link.name == "x.txt"


async def test_progress_and_log_steps_reach_the_sdk_client_over_http():
    doc = {
        "pipelines": [
            {
                "name": "chatty",
                "steps": [
                    {"kind": "progress", "id": "p1", "progress": 1, "total": 2, "message": "half"},
                    {"kind": "log", "id": "note", "level": "warning", "data": "careful, ${args.who}"},
                    {"kind": "progress", "id": "p2", "progress": 2, "total": 2, "message": "done"},
                    {"kind": "value", "id": "answer", "value": "ok"},
                ],
            }
        ]
    }
    progress: list[tuple[float, float | None, str | None]] = []
    logs: list[Any] = []

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append((p, total, message))

    async def on_log(params: Any) -> None:
        logs.append((params.level, params.data))

    with trio.fail_after(30):
        async with (
            served(doc) as app,
            http_server(app) as url,
            Client(url, logging_callback=on_log, mode="legacy") as c,
        ):
            r = await c.call_tool("chatty", {"who": "ada"}, progress_callback=on_progress)
    assert r.content[0].text == "ok"
    assert progress == [(1, 2, "half"), (2, 2, "done")]
    assert logs == [("warning", "careful, ada")]


async def test_a_declared_pipeline_composes_a_downstream_servers_tools_over_http():
    doc = {
        "mcpServers": {"ds": {"command": sys.executable, "args": [DOWNSTREAM], "env": {"GREETING": "hi"}}},
        "pipelines": [
            {
                "name": "greet_sum",
                "input_schema": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["name", "a", "b"],
                },
                "steps": [
                    {
                        "kind": "parallel",
                        "id": "calls",
                        "steps": [
                            {
                                "kind": "tool",
                                "id": "sum",
                                "tool": "ds.add",
                                "args": {"a": "${args.a}", "b": "${args.b}"},
                            },
                            {"kind": "tool", "id": "hello", "tool": "ds.greet", "args": {"name": "${args.name}"}},
                        ],
                    },
                    {
                        "kind": "tool",
                        "id": "loud",
                        "tool": "shout",
                        "args": {"text": "${steps.calls.output.hello.result}"},
                    },
                ],
                "output": {"greeting": "${steps.loud.output}", "sum": "${steps.calls.output.sum.result}"},
            }
        ],
    }
    with trio.fail_after(60):
        async with served(doc) as app, http_server(app) as url, Client(url) as client:
            r = await client.call_tool("greet_sum", {"name": "ada", "a": 2, "b": 3})
    assert r.is_error is False, r.content
    assert r.structured_content == {"greeting": "HI, ADA", "sum": 5}


async def test_a_declared_pipeline_is_also_a_tool_for_mcp_pipe():
    with trio.fail_after(30):
        async with served(MEDIA) as app, Client(app.server) as client:
            r = await client.call_tool(
                "mcp_pipe", {"steps": [{"tool": "media", "args": {"who": "bo"}}], "answer": "full"}
            )
    answer = r.structured_content
    assert answer["ok"], answer["error"]
    assert answer["steps"]["step1"]["text"] == "HELLO BO"


def test_mcpipe_check_config_reports_every_problem_of_a_file_full_of_mistakes(capsys):
    from mcpipe.cli import main

    path = HERE / "configs" / "mistakes.yaml"
    code = main(["check", "--config", str(path)])
    err = capsys.readouterr().err
    assert code == 1
    lines = [line.removeprefix("error: ").removeprefix(f"{path}:") for line in err.splitlines()]
    assert "pipelines.charge.steps[2].expression: invalid CEL: syntax error at line 1, column 14" in "\n".join(lines)
    for location in (
        "outbound.http.alow_private",
        "outbound.commands.jq",
        "pipelines.charge.input_schema.properties.amount.minimum",
        "pipelines.charge.steps[1].id",
        "pipelines.charge.steps[3].kind",
        "pipelines.charge.steps[4].value",
        "pipelines.charge.steps[5].url",
        "pipelines.charge.steps[6].command",
        "pipelines.charge.steps[7].config.expression",
        "pipelines.charge.steps[8].tool",
        "pipelines.charge.steps[9].colour",
        "pipelines.charge.output.amount",
        "pipelines.charge.content[0].type",
        "pipelines[1].name",
        "pipelines.ping.steps[0].tool",
        "pipelines.pong.steps[0].steps[0].tool",
    ):
        assert any(line.startswith(f"{location}: ") for line in lines), (location, err)


def test_the_config_holds_the_declared_sections_decoded_and_they_encode_back_to_the_file():
    doc = yaml.safe_load((ROOT / "examples" / "declared" / "http_apis.yaml").read_text())
    config = parse_config(json.dumps(doc), "json", environ={})
    assert all(isinstance(p, PipelineConfig) for p in config.pipelines)
    assert isinstance(config.outbound, OutboundConfig)
    assert msgspec.to_builtins(config.pipelines) == doc["pipelines"]
    # The nested tables the file leaves out come back empty (their defaults): nothing else is added.
    assert msgspec.to_builtins(config.outbound) == {**doc["outbound"], "python": {}, "duckdb": {}}


def test_the_config_reports_every_problem_at_parse_time_and_tool_names_once_sources_are_loaded():
    doc = yaml.safe_load((HERE / "configs" / "mistakes.yaml").read_text())
    with pytest.raises(ConfigError) as e:
        parse_config(json.dumps(doc), "json", environ={})
    problems = [str(p) for p in e.value.problems]
    assert len(problems) == 19
    assert "pipelines.charge.steps[8].tool: unknown tool 'no_such_tool'" in problems
    # With python_tools, tool names wait for the sources to be loaded: checked then, not compiled again.
    with_python = parse(
        json.dumps(
            {"python_tools": ["x:y"], "pipelines": [{"name": "p", "steps": [{"kind": "tool", "tool": "from_python"}]}]}
        ),
        "json",
        environ={},
    )
    assert [str(p) for p in with_python.tool_problems([local_tools])] == [
        "pipelines.p.steps[0].tool: unknown tool 'from_python'"
    ]
    with pytest.raises(ConfigError) as e:
        with_python.declared_source([local_tools])
    assert [str(p) for p in e.value.problems] == ["pipelines.p.steps[0].tool: unknown tool 'from_python'"]


async def test_a_client_cancelling_the_call_kills_a_running_command_step(tmp_path: Path):
    import os

    from kit.processes import SLEEPER, all_gone, read_pids, watch

    fifo = tmp_path / "pids"
    os.mkfifo(fifo)
    doc = {
        "outbound": {"commands": {"py": [sys.executable, "-c"]}, "command_kill_grace_ms": 200},
        "pipelines": [
            {
                "name": "job",
                "steps": [{"kind": "command", "id": "run", "command": "py", "args": ["${args.script}", str(fifo)]}],
            }
        ],
    }
    with trio.fail_after(30):
        async with served(doc) as app, Client(app.server) as client:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(client.call_tool, "job", {"script": SLEEPER}))
                fds = watch(await read_pids(fifo))
                nursery.cancel_scope.cancel()
            await all_gone(fds)


async def test_a_client_cancelling_the_call_closes_a_running_http_request(http_server):
    doc = {
        "outbound": {"http": {"allowed_hosts": ["127.0.0.1"]}},
        "pipelines": [{"name": "slow", "steps": [{"kind": "http", "id": "get", "url": f"{http_server.url}/slow"}]}],
    }
    with trio.fail_after(30):
        async with served(doc) as app, Client(app.server) as client:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client.call_tool, "slow", {})
                await http_server.log.slow_started.wait()
                nursery.cancel_scope.cancel()
            await http_server.log.slow_disconnected.wait()


async def test_the_http_allowlist_holds_for_urls_built_from_arguments(http_server):
    doc = {
        "outbound": {"http": {"allowed_hosts": ["api.example.com"]}},
        "pipelines": [{"name": "fetch", "steps": [{"kind": "http", "id": "get", "url": "${args.url}"}]}],
    }
    with trio.fail_after(30):
        async with served(doc) as app, Client(app.server) as client:
            r = await client.call_tool("fetch", {"url": f"{http_server.url}/echo"})
    assert r.is_error is True
    assert (
        r.content[0].text == "FORBIDDEN: step 'get' failed: host '127.0.0.1' is not in the allowed hosts"
        " (list it in outbound.http.allowed_hosts)"
    )
    assert http_server.log.requests == []


def kind_cases(url: str) -> list[tuple[str, dict[str, Any], dict[str, Any], Any]]:
    """(name, step, args, expected): an answer's text, or ("error", its text's start)."""
    py = {"command": "py"}
    return [
        ("tool", {"kind": "tool", "tool": "shout", "args": {"text": "${args.t}"}}, {"t": "a"}, "A"),
        ("tool_error", {"kind": "tool", "tool": "shout", "args": {"text": 1}}, {}, ("error", "TOOL_ERROR: step 's'")),
        ("http", {"kind": "http", "url": f"{url}/text"}, {}, '{"status":200,'),
        (
            "http_error",
            {"kind": "http", "url": f"{url}/status/500"},
            {},
            ("error", "TOOL_ERROR: step 's' failed: HTTP 500"),
        ),
        ("http_timeout", {"kind": "http", "url": f"{url}/slow", "timeout_ms": 100}, {}, ("error", "TIMEOUT: step 's'")),
        ("graphql", {"kind": "graphql", "url": f"{url}/graphql", "operation": "query { x }"}, {}, '{"echo":null'),
        (
            "graphql_error",
            {"kind": "graphql", "url": f"{url}/graphql", "operation": "query { boom }"},
            {},
            ("error", "TOOL_ERROR: step 's' failed: GraphQL errors: field 'boom' does not exist"),
        ),
        ("command", {**py, "kind": "command", "args": ["print(6 * 7)"]}, {}, '{"exit_code":0,"stdout":"42\\n"'),
        ("command_error", {**py, "kind": "command", "args": ["raise SystemExit(3)"]}, {}, ("error", "TOOL_ERROR")),
        (
            "command_timeout",
            {**py, "kind": "command", "args": ["import time; time.sleep(30)"], "timeout_ms": 200},
            {},
            ("error", "TIMEOUT: step 's' failed: timed out after 200 ms"),
        ),
        ("mock", {"kind": "mock", "response": {"a": 1}}, {}, '{"a":1}'),
        (
            "mock_error",
            {"kind": "mock", "error": True, "error_message": "down"},
            {},
            ("error", "TOOL_ERROR: step 's' failed: down"),
        ),
        ("mock_timeout", {"kind": "mock", "delay_ms": 5000, "timeout_ms": 50}, {}, ("error", "TIMEOUT")),
        ("value", {"kind": "value", "value": "v=${args.v}"}, {"v": 1}, "v=1"),
        ("transform", {"kind": "transform", "expression": "args.n * 2"}, {"n": 4}, "8"),
        ("transform_error", {"kind": "transform", "expression": "args.n / 0"}, {"n": 4}, ("error", "TOOL_FAILED")),
        ("cel_gate", {"kind": "cel_gate", "expression": "args.ok"}, {"ok": True}, "true"),
        ("cel_gate_error", {"kind": "cel_gate", "expression": "args.ok"}, {"ok": False}, ("error", "GATE_REJECTED")),
        (
            "jsonata",
            {"kind": "plugin_transform", "plugin": "jsonata", "config": {"expression": "$sum(args.xs)"}},
            {"xs": [1, 2]},
            "3",
        ),
        ("log", {"kind": "log", "data": "hi ${args.who}"}, {"who": "x"}, "hi x"),
        ("progress", {"kind": "progress", "progress": 1}, {}, "null"),  # no token: skipped, output null
    ]


async def test_every_kind_answers_over_the_server_with_its_errors_and_timeouts(http_server):
    cases = kind_cases(http_server.url)
    doc = {
        "outbound": {
            "http": {"allowed_hosts": ["127.0.0.1"]},
            "commands": {"py": [sys.executable, "-c"]},
            "command_kill_grace_ms": 100,
        },
        "pipelines": [{"name": name, "steps": [{"id": "s", **step}]} for name, step, _, _ in cases],
    }
    with trio.fail_after(60):
        async with served(doc) as app, Client(app.server) as client:
            for name, _, args, expected in cases:
                r = await client.call_tool(name, args)
                text = r.content[0].text
                if isinstance(expected, tuple):
                    assert r.is_error is True and text.startswith(expected[1]), (name, text)
                else:
                    assert r.is_error is False and text.startswith(expected), (name, text)
