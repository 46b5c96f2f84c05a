"""piraeus's data as its API and database hold it: rows of ``tools``, ``prompts`` and ``flows``, its list
answers and its project export, ported from ``backend/tests/test_database_endpoints.py`` (each case names the
upstream test; the rows are its mocks, ``upstream/``), served by mcpipe and reached over streamable HTTP with
a bearer token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from kit.clients import bearer_client
from kit.llm import FakeOpenAI, text
from kit.piraeus import StandIn, piraeus_app, rehosted, upstream
from kit.servers import http_server
from mcpipe.config import ConfigError, parse_config


def problems_of(tmp_path: Path, files: dict[str, Any], **section: Any) -> list[str]:
    """The one-line problems of a config serving ``files`` (written under ``tmp_path``)."""
    for name, data in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(data if isinstance(data, str) else json.dumps(data))
    kinds = {k: f"{k}/*.json" for k in ("tools", "prompts", "flows") if any(n.startswith(k + "/") for n in files)}
    doc = {"piraeus": {**kinds, **section}}
    try:
        parse_config(json.dumps(doc), "json", base_dir=str(tmp_path))
    except ConfigError as e:
        return [str(p) for p in e.problems]
    return []


async def test_a_tool_row_serves_its_tool_config_under_the_rows_name(tmp_path: Path, api: StandIn) -> None:
    """Ports ``TestTools.test_list_tools`` and ``test_create_tool``: the row's ``tool_config`` (no name or
    description of its own) is the tool, named and described by the row. It maps nothing, so it answers what
    piraeus's ``GenericApiTool`` answers without ``response_to_output``: an empty object."""
    row = rehosted(upstream("test_database_endpoints.mock_tool.json"), api.url)
    async with piraeus_app(tmp_path, {"tools/rows.json": [row]}) as app, Client(app.server) as c:
        listed = {t.name: t for t in (await c.list_tools()).tools}
        r = await c.call_tool("test_tool", {})
    assert listed["test_tool"].description == "A test tool"
    assert not r.is_error and r.structured_content == {}
    assert api.requests[0]["path"] == "/" and api.requests[0]["query"] == {}


async def test_a_prompt_row_is_an_mcp_prompt_with_its_variables(tmp_path: Path, api: StandIn) -> None:
    """Ports ``TestPrompts.test_create_prompt``: the row ``greeting`` (``Hello {{name}}, welcome!``, variables
    ``["name"]``) is listed with its variable as a required argument and rendered by ``prompts/get``."""
    row = upstream("test_database_endpoints.mock_prompt.json")
    async with piraeus_app(tmp_path, {"prompts/p.json": row}) as app, Client(app.server) as c:
        [prompt] = [p for p in (await c.list_prompts()).prompts if p.name != "write_pipeline"]  # beside the guide
        got = await c.get_prompt("greeting", {"name": "Ada"})
    assert (prompt.name, prompt.description) == ("greeting", "Greet the user")
    assert [(a.name, a.required) for a in prompt.arguments or []] == [("name", True)]
    assert [(m.role, m.content.text) for m in got.messages] == [("user", "Hello Ada, welcome!")]  # type: ignore[union-attr]


def test_a_flow_row_in_the_builders_graph_format_is_refused_where_it_is(tmp_path: Path) -> None:
    """Ports ``TestFlows.test_create_flow``: the row stores the builder's graph (nodes and edges), which piraeus
    never runs; it is refused, located, rather than served as something it is not."""
    lines = problems_of(tmp_path, {"flows/f.json": upstream("test_database_endpoints.mock_flow.json")})
    assert lines == [
        "flows/f.json: steps: the builder's graph (nodes and edges) is not supported: piraeus never runs it; "
        "give numbered steps"
    ]


def test_the_v6_builders_linear_steps_are_refused_saying_why(tmp_path: Path) -> None:
    row = {"name": "v6", "steps_array": [{"id": "step-1", "type": "mcp", "selectedTools": [1]}]}
    [line] = problems_of(tmp_path, {"flows/v6.json": row})
    assert line.startswith("flows/v6.json: steps_array: the v6 builder's `mcp`/`response` steps are not supported")


@pytest.mark.parametrize("shape", ["list", "older_list", "project"])
def test_list_answers_and_project_exports_load_every_entry(tmp_path: Path, shape: str) -> None:
    """The API's list answers (``List[Tool]``; the older ``{tools, total}``) and a project export
    (``/api/projects/{id}/full``) hold many entries: each is read, located by its index."""
    tool = upstream("test_database_endpoints.mock_tool.json")
    bad = {**tool, "name": "broken", "tool_config": {**tool["tool_config"], "api": {"method": "GET"}}}
    entries = [tool, bad]
    data: Any = {
        "list": entries,
        "older_list": {"tools": entries, "total": 2},
        "project": {"id": "p", "name": "Default Project", "tools": entries, "prompts": [], "flows": []},
    }[shape]
    prefix = {"list": "", "older_list": "tools", "project": "tools"}[shape]
    assert problems_of(tmp_path, {"tools/export.json": data}) == [
        f"tools/export.json: {prefix}[1].tool_config.api.base_url: is required"
    ]


async def test_a_project_export_serves_its_tools_prompts_and_flows_over_http(
    tmp_path: Path, api: StandIn, model: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One ``ProjectWithData`` file named by the three globs: its tool, prompt and flow are served, and an SDK
    client over streamable HTTP (a bearer token) calls the flow (tool step, then prompt step on the model)."""
    tool = rehosted(upstream("EXAMPLE_STOCK_QUOTE_CONFIG.json"), api.url)
    prompt = {
        "name": "explain_quote",
        "prompt_template": "Explain a move of {change} for {symbol}.",
        "variables": [{"name": "symbol", "type": "string"}, {"name": "change", "type": "number"}],
    }
    flow = {
        "name": "quote_explained",
        "description": "A quote, explained",
        "steps": [
            {"step": 1, "type": "tool", "name": "get_stock_quote", "inputs": {"symbol": "${symbol}"}},
            {
                "step": 2,
                "type": "prompt",
                "name": "explain_quote",
                "inputs": {"symbol": "${step_1_output.symbol}", "change": "${step_1_output.change}"},
            },
        ],
    }
    project = {
        "id": "00000000-0000-0000-0000-000000000001",
        "name": "Default Project",
        "tools": [{"id": "t1", "name": "get_stock_quote", "tool_config": tool}],
        "prompts": [prompt],
        "flows": [flow],
    }
    model.says(text("IBM rose 1.23."))
    globs = {"tools": "project.json", "prompts": "project.json", "flows": "project.json"}
    monkeypatch.setenv("AGENT_TOKEN", "t0k3n")
    doc = {"auth": {"tokens": [{"env": "AGENT_TOKEN", "principal": "agent"}]}}
    async with (
        piraeus_app(tmp_path, {"project.json": project}, model_url=model.url, doc=doc, **globs) as app,
        http_server(app) as url,
        bearer_client(url, "t0k3n") as c,
    ):
        names = {t.name for t in (await c.list_tools()).tools}
        prompts = [p.name for p in (await c.list_prompts()).prompts if p.name != "write_pipeline"]  # the guide's
        r = await c.call_tool("quote_explained", {"symbol": "IBM"})
    assert {"get_stock_quote", "quote_explained", "workflow"} <= names and prompts == ["explain_quote"]
    out = r.structured_content
    assert not r.is_error and out is not None and out["status"] == "success", r.content
    assert out["outputs"]["step_2_output"] == "IBM rose 1.23."
    assert model.requests[0]["messages"][1]["content"] == "Instructions: Explain a move of 1.23 for IBM."
