"""The server teaches its own language (``server/_guide.py``): the pipeline reference as ``text/markdown``
resources and the prompt ``write_pipeline``, listing exactly the caller's tools with their schemas.

Every example pipeline in the prompt and the resources compiles and runs, through a real MCP client, on the
embedded default's tools; downstream servers' own resources and prompts are still listed beside them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import yaml
from mcp import Client

from kit.clients import bearer_client
from kit.servers import everything_downstream, http_server, make_config
from mcpipe import compile_spec
from mcpipe.config import DEFAULT_CONFIG, AuditConfig
from mcpipe.gateway import PIPE_TOOL
from mcpipe.server import open_app
from mcpipe.server._guide import GUIDE_PROMPT, GUIDE_RESOURCES, guide_text

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

ERAS = ["legacy", "2026-07-28"]
DEFAULT = msgspec.structs.replace(DEFAULT_CONFIG, audit=AuditConfig(enabled=False))
"""The embedded default (`mcpipe serve` with no config), without its audit file."""
ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "tests" / "formats" / "noetl" / "golden" / "4.26.0" / "conditional_flow.yaml"
DECLARED = ROOT / "examples" / "declared" / "order_summary.yaml"


def json_blocks(markdown: str) -> list[Any]:
    """Every JSON object of a ```json block (the pipelines shown), parsed."""
    return [json.loads(m) for m in re.findall(r"```json(?: pipeline)?\n(\{.*?\})\n```", markdown, flags=re.S)]


@pytest.mark.parametrize("mode", ERAS)
async def test_the_default_server_answers_resources_and_prompts_with_its_guide(mode):
    with trio.fail_after(30):
        async with open_app(DEFAULT) as app, Client(app.server, mode=mode) as client:
            resources = {str(r.uri): r for r in (await client.list_resources()).resources}
            read = {uri: (await client.read_resource(uri)).contents[0] for uri in GUIDE_RESOURCES}
            prompts = {p.name: p for p in (await client.list_prompts()).prompts}
    assert set(resources) == set(GUIDE_RESOURCES)
    for uri, (filename, title, _) in GUIDE_RESOURCES.items():
        assert resources[uri].mime_type == "text/markdown"
        assert resources[uri].title == title
        assert read[uri].mime_type == "text/markdown"
        assert read[uri].text == guide_text(filename)
    assert list(prompts) == [GUIDE_PROMPT]
    assert [a.name for a in prompts[GUIDE_PROMPT].arguments] == ["task"]


async def test_every_example_of_the_prompt_and_the_resources_compiles_and_runs_on_the_defaults_tools():
    with trio.fail_after(60):
        async with open_app(DEFAULT) as app, Client(app.server) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            prompt = (await client.get_prompt(GUIDE_PROMPT, {"task": "count the words"})).messages[0].content.text
            shown = json_blocks(prompt)
            for uri in GUIDE_RESOURCES:
                shown += json_blocks((await client.read_resource(uri)).contents[0].text)
            answers = [(await client.call_tool(PIPE_TOOL, spec)).structured_content for spec in shown]
    assert len(shown) >= 8, "the prompt repeats the four examples of mcpipe://guide/pipelines"
    for spec, answer in zip(shown, answers, strict=True):
        compile_spec(spec, tools=tools)  # raises on any problem
        if spec.get("continue_on_error"):
            assert answer["error_code"] == "TOOL_ERROR" and answer["result"]["bad"] == "TOOL_ERROR", answer
        else:
            assert answer["ok"], (spec, answer)
    assert prompt.rstrip().endswith("## The task\n\ncount the words")


def tools_section(prompt: str) -> dict[str, dict[str, Any]]:
    """The prompt's tools: name -> {"input": schema, "output": schema or None}."""
    section = prompt.split("## The tools you may call", 1)[1].split("\n## ", 1)[0]
    out: dict[str, dict[str, Any]] = {}
    for block in section.split("\n### ")[1:]:
        name = block.split("`", 2)[1]
        found = re.search(r"^input schema: `(.*)`$", block, flags=re.M)
        output = re.search(r"^output schema: `(.*)`$", block, flags=re.M)
        assert found is not None, block
        out[name] = {"input": json.loads(found[1]), "output": json.loads(output[1]) if output else None}
    return out


async def test_the_prompt_lists_exactly_the_callers_tools_with_their_schemas_over_http(monkeypatch):
    tokens = {"TOKEN_ALICE": "alice-secret", "TOKEN_BOB": "bob-secret"}
    for k, v in tokens.items():
        monkeypatch.setenv(k, v)
    config = make_config(
        tokens,
        auth={
            "tokens": [
                {"env": "TOKEN_ALICE", "principal": "alice", "tools": ["mcp_pipe", "text_*", "echo"]},
                {"env": "TOKEN_BOB", "principal": "bob", "tools": ["*"]},
            ]
        },
    )
    seen: dict[str, tuple[list[Any], dict[str, dict[str, Any]]]] = {}
    with trio.fail_after(60):
        async with open_app(config) as app, http_server(app) as url:
            for who in ("alice", "bob"):
                async with bearer_client(url, f"{who}-secret") as client:
                    listed = [t for t in (await client.list_tools()).tools if t.name != PIPE_TOOL]
                    prompt = (await client.get_prompt(GUIDE_PROMPT)).messages[0].content.text
                    seen[who] = (listed, tools_section(prompt))
    for who, (listed, shown) in seen.items():
        assert list(shown) == [t.name for t in listed], who
        for tool in listed:
            assert shown[tool.name]["input"] == tool.input_schema
            assert shown[tool.name]["output"] == tool.output_schema
    assert set(seen["alice"][1]) == {"echo", "text_join", "text_split", "text_replace"}
    assert "now" in seen["bob"][1] and "json_parse" in seen["bob"][1]


async def test_a_downstream_servers_own_resources_and_prompts_are_listed_beside_the_guide():
    config = make_config(mcpServers={"ev": everything_downstream()})
    with trio.fail_after(30):
        async with open_app(config) as app, Client(app.server) as client:
            resources = {str(r.uri) for r in (await client.list_resources()).resources}
            prompts = [p.name for p in (await client.list_prompts()).prompts]
            theirs = (await client.read_resource("test://static-text")).contents[0].text
            ours = (await client.read_resource("mcpipe://guide/references")).contents[0].text
            simple = (await client.get_prompt("ev.test_simple_prompt")).messages[0].content.text
    assert set(GUIDE_RESOURCES) | {"test://static-text", "test://static-binary"} <= resources
    assert prompts[0] == GUIDE_PROMPT and "ev.test_simple_prompt" in prompts
    assert theirs == "This is the content of the static text resource."
    assert ours.startswith("# References")
    assert simple == "This is a simple prompt for testing."


async def test_without_mcp_pipe_there_is_no_guide():
    config = make_config(pipe={"enabled": False})
    async with open_app(config) as app, Client(app.server) as client:
        with pytest.raises(Exception, match="Method not found"):
            await client.list_prompts()


async def test_each_declared_pipeline_and_playbook_has_a_guide_resource_with_its_mermaid_drawing_for_its_callers(
    monkeypatch, tmp_path, capsys
):
    """A client reads a declared pipeline's (and a NoETL playbook's) guide resource over HTTP: what it is, its
    arguments, and its plan as a ```mermaid block, the drawing ``mcpipe explain --format mermaid`` makes; a caller
    that may not call the pipeline neither lists nor reads it."""
    from mcpipe.cli import main
    from mcpipe.config import load_config
    from mcpipe.server._guide import PIPELINE_GUIDE

    monkeypatch.setenv("TOKEN_ALICE", "alice-secret")
    monkeypatch.setenv("TOKEN_BOB", "bob-secret")
    doc = {
        "audit": {"enabled": False},
        "auth": {
            "tokens": [
                {"env": "TOKEN_ALICE", "principal": "alice", "tools": ["mcp_pipe", "order_summary"]},
                {"env": "TOKEN_BOB", "principal": "bob", "tools": ["*"]},
            ]
        },
        "outbound": {"commands": {"sh": "/bin/sh"}},
        "pipelines": yaml.safe_load(DECLARED.read_text())["pipelines"],
        "playbooks": [{"files": str(PLAYBOOK)}],
    }
    path = tmp_path / "mcpipe.json"
    path.write_text(json.dumps(doc))
    drawn = {}
    for name in ("order_summary", "conditional_flow_example"):
        assert main(["explain", "--config", str(path), "--pipeline", name, "--format", "mermaid"]) == 0
        drawn[name] = capsys.readouterr().out
    pipeline_uri, playbook_uri = PIPELINE_GUIDE + "order_summary", PIPELINE_GUIDE + "conditional_flow_example"
    with trio.fail_after(60):
        async with open_app(load_config(str(path))) as app, http_server(app) as url:
            async with bearer_client(url, "alice-secret") as client:
                alice = {str(r.uri): r for r in (await client.list_resources()).resources}
                guide = (await client.read_resource(pipeline_uri)).contents[0]
                with pytest.raises(Exception, match="Resource not found"):
                    await client.read_resource(playbook_uri)  # not hers to call: not hers to read
            async with bearer_client(url, "bob-secret") as client:
                bob = {str(r.uri) for r in (await client.list_resources()).resources}
                played = (await client.read_resource(playbook_uri)).contents[0]
    assert set(alice) == {*GUIDE_RESOURCES, pipeline_uri}
    assert alice[pipeline_uri].mime_type == "text/markdown" and alice[pipeline_uri].name == "order_summary"
    assert {*GUIDE_RESOURCES, pipeline_uri, playbook_uri} <= bob
    for read, name in ((guide, "order_summary"), (played, "conditional_flow_example")):
        assert read.mime_type == "text/markdown"
        blocks = re.findall(r"```mermaid\n(.*?)```", read.text, flags=re.S)
        assert blocks == [drawn[name]], name
    assert guide.text.startswith("# `order_summary`\n\nTotals and a one-line summary for an order's lines.")
    assert '"required":["customer","lines"]' in guide.text
    assert 'subgraph c0["workflow (graph)"]' in played.text
