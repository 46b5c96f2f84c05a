"""piraeus's tool configs served as MCP tools, ported from its ``backend/tests/test_config_tools.py`` (each case
names the upstream test it ports) and run over the SDK's client against the stand-in APIs on 127.0.0.1. The
configs are piraeus's own (``upstream/``: its ``EXAMPLE_STOCK_QUOTE_CONFIG`` and the test's fixture), only their
hosts rewritten."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from kit.piraeus import QUOTE, StandIn, piraeus_app, rehosted, upstream
from mcpipe.formats.piraeus import ToolConfig, build_request, check_inputs, transform
from mcpipe.formats.piraeus._model import read_tool
from mcpipe.formats.piraeus._read import Reader

EXAMPLE = "EXAMPLE_STOCK_QUOTE_CONFIG.json"
FIXTURE = "test_config_tools.stock_quote_config.json"
MAPPED = {
    "symbol": "IBM",
    "price": 142.5,
    "change": 1.23,
    "change_percent": "0.8707%",
    "volume": 3456789,
    "latest_trading_day": "2025-11-07",
}


def loaded(name: str) -> ToolConfig:
    r = Reader(name)
    config = read_tool(r, upstream(name), "")
    assert not r.problems and config is not None
    return config


def test_the_upstream_config_validates_as_piraeus_reads_it() -> None:
    """Ports ``TestConfigBasedToolCreation.test_config_validation``."""
    config = loaded(FIXTURE)
    assert config.name == "test_stock_quote"
    assert config.description == "Get real-time stock quote from Alpha Vantage API"
    assert config.api.base_url == "https://www.alphavantage.co/query"
    assert config.api.method == "GET"
    assert config.api.auth.method == "api_key_query"
    assert config.api.auth.secret_name == "ALPHA_VANTAGE_API_KEY"
    assert config.tags == ("finance", "stocks", "test")


async def test_a_tool_made_from_a_json_file_is_listed_with_its_schemas(tmp_path: Path, api: StandIn) -> None:
    """Ports ``TestConfigBasedToolCreation.test_tool_creation_from_dict``, ``test_tool_creation_from_json_file``,
    ``TestConfigBasedToolRegistration.test_register_config_tool``, ``test_get_registered_tool``,
    ``test_get_tool_definition``, ``test_openai_tool_format`` and ``TestConfigToolProperties``: the tool is
    registered under its name, with its description and its input schema as the parameters a model sees."""
    raw = upstream(FIXTURE)
    async with piraeus_app(tmp_path, {"tools/stock.json": rehosted(raw, api.url)}) as app, Client(app.server) as c:
        listed = {t.name: t for t in (await c.list_tools()).tools}
    tool = listed["test_stock_quote"]
    assert tool.description == raw["description"]
    assert tool.input_schema == raw["input_schema"]
    assert tool.output_schema == raw["output_schema"]
    assert "workflow" in listed  # and it joins the workflow's tools


async def test_the_example_tool_calls_the_api_with_its_mapping_and_maps_the_answer_back(
    tmp_path: Path, api: StandIn
) -> None:
    """Ports ``TestConfigBasedToolExecution.test_execute_config_tool`` and
    ``TestEndToEndConfigFlow.test_complete_flow_from_json`` (JSON -> tool -> registry -> execution), on the
    upstream ``EXAMPLE_STOCK_QUOTE_CONFIG``: the static ``function``, the key from ``${ALPHA_VANTAGE_API_KEY}``
    and the mapped ``symbol`` reach the API; its ``Global Quote`` comes back in the output schema's names and
    types."""
    files = {"tools/quote.json": rehosted(upstream(EXAMPLE), api.url)}
    async with piraeus_app(tmp_path, files) as app, Client(app.server) as c:
        r = await c.call_tool("get_stock_quote", {"symbol": "IBM"})
    assert not r.is_error, r.content
    assert r.structured_content == MAPPED
    assert json.loads(r.content[0].text) == MAPPED  # type: ignore[union-attr]
    [request] = api.requests
    assert (request["method"], request["path"]) == ("GET", "/query")
    assert request["query"] == {"function": "GLOBAL_QUOTE", "apikey": "av-secret-key", "symbol": "IBM"}


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({}, "Input validation error: symbol: field required"),
        ({"symbol": 42}, "Input validation error: symbol: expected a string, got number"),
        ({"symbol": None}, "Input validation error: symbol: expected a string, got null"),
    ],
)
async def test_arguments_that_break_the_input_schema_fail_before_any_request(
    tmp_path: Path, api: StandIn, args: dict[str, Any], error: str
) -> None:
    """Ports ``TestConfigBasedToolExecution.test_tool_input_validation``: valid input passes validation, and
    (beyond it) input the executor's pydantic model refuses is an ``Input validation error``."""
    files = {"tools/stock.json": rehosted(upstream(FIXTURE), api.url)}
    async with piraeus_app(tmp_path, files) as app, Client(app.server) as c:
        ok = await c.call_tool("test_stock_quote", {"symbol": "AAPL", "unused": "dropped"})
        bad = await c.call_tool("test_stock_quote", args)
    assert not ok.is_error and ok.structured_content is not None and ok.structured_content["symbol"] == "AAPL"
    assert bad.is_error and bad.content[0].text == error  # type: ignore[union-attr]
    assert [r["query"]["symbol"] for r in api.requests] == ["AAPL"]  # `unused` was dropped, as pydantic drops it


def test_inputs_are_converted_as_pydantics_lax_mode_converts_them() -> None:
    """``ToolExecutor._validate_inputs``: each property's type, pydantic's lax conversions (a numeric string is
    a number, ``"yes"`` a boolean, a number is never a string), absent optional fields left out."""
    schema = {
        "properties": {
            "n": {"type": "integer"},
            "x": {"type": "number"},
            "b": {"type": "boolean"},
            "s": {},
            "opt": {"type": "string"},
        },
        "required": ["n", "x", "b", "s"],
    }
    assert check_inputs(schema, {"n": "5", "x": 2, "b": "yes", "s": "t"}) == (
        {"n": 5, "x": 2.0, "b": True, "s": "t"},
        [],
    )
    _, problems = check_inputs(schema, {"n": "five", "x": [], "b": 3, "s": 1})
    assert problems == [
        "n: expected an integer, got 'five'",
        "x: expected a number, got array",
        "b: expected a boolean, got number",
        "s: expected a string, got number",
    ]


def test_the_request_is_generic_api_tools() -> None:
    """``GenericApiTool._build_url/_build_headers/_build_params/_build_body``: base URL and path joined by one
    slash; static params, then the credential, then the mapped inputs (``str()`` of their values); the body
    of the mapped body fields, never for GET."""
    raw: dict[str, Any] = {
        "name": "post_item",
        "description": "Create an item",
        "api": {
            "base_url": "https://api.example.com/",
            "path": "/v1/items",
            "method": "POST",
            "headers": {"Accept": "application/json"},
            "params": {"v": "2"},
            "auth": {"method": "bearer", "secret_ref": "${TOKEN}"},
        },
        "input_schema": {"type": "object", "properties": {"n": {"type": "number"}, "title": {"type": "string"}}},
        "output_schema": {"type": "object"},
        "mapping": {"input_to_params": {"n": "count"}, "input_to_body": {"title": "name"}},
    }
    r = Reader("x.json")
    config = read_tool(r, raw, "")
    assert config is not None and not r.problems
    req = build_request(config, {"n": 3.0, "title": "hi"}, "tok")
    assert (req.method, req.url) == ("POST", "https://api.example.com/v1/items")
    assert req.headers == {"Accept": "application/json", "Authorization": "Bearer tok"}
    assert req.params == {"v": "2", "count": "3.0"}
    assert req.body == {"name": "hi"}
    header = read_tool(
        Reader("y.json"), {**raw, "api": {**raw["api"], "auth": {"method": "api_key_header", "secret_ref": "k"}}}, ""
    )
    assert header is not None and build_request(header, {}, "k").headers["X-API-Key"] == "k"


def test_the_answer_is_mapped_back_through_response_path_and_the_output_types() -> None:
    """``GenericApiTool._transform_response``: the value at ``response_path``, each output field read there
    (a dotted path) and converted to ``number``/``integer``; absent fields left out. A key holding dots is read
    whole first (piraeus splits ``01. symbol`` at its dot and maps nothing: see docs/formats/piraeus.md)."""
    config = loaded(EXAMPLE)
    assert transform(config, {"Global Quote": QUOTE}) == MAPPED
    assert transform(config, {"Information": "rate limited"}) == {}
    nested = replace(config, mapping=replace(config.mapping, response_to_output={"symbol": "meta.sym", "price": "p"}))
    assert transform(nested, {"Global Quote": {"meta": {"sym": "X"}, "p": "not a number"}}) == {
        "symbol": "X",
        "price": "not a number",  # a value that does not convert stays as it is
    }


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("/status/503", "answered HTTP 503"),
        ("/text", "answered no JSON"),
        ("/list", "response_path `Global Quote`: the answer is array, not an object"),
    ],
)
async def test_an_api_failure_is_an_execution_error(tmp_path: Path, api: StandIn, path: str, error: str) -> None:
    """``GenericApiTool._make_request``'s ``raise_for_status`` and ``response.json()``: a status other than 2xx
    or an answer that is not JSON fails the call (``Execution error``), as does a ``response_path`` crossing an
    array; the secret never shows."""
    raw = rehosted(upstream(EXAMPLE), api.url)
    raw["api"]["base_url"] = api.url + path
    async with piraeus_app(tmp_path, {"tools/q.json": raw}) as app, Client(app.server) as c:
        r = await c.call_tool("get_stock_quote", {"symbol": "IBM"})
    text = r.content[0].text  # type: ignore[union-attr]
    assert r.is_error and text.startswith("Execution error: ") and error in text, text
    assert "av-secret-key" not in text


async def test_an_output_that_breaks_the_output_schema_is_an_error_not_a_warning(tmp_path: Path, api: StandIn) -> None:
    """piraeus only logs a warning when the output breaks ``output_schema``; an MCP client checks
    ``structuredContent`` against ``outputSchema``, so mcpipe answers an error naming what is missing."""
    raw = rehosted(upstream(EXAMPLE), api.url)
    async with piraeus_app(tmp_path, {"tools/q.json": raw}) as app, Client(app.server) as c:
        r = await c.call_tool("get_stock_quote", {"symbol": ""})  # Alpha Vantage's "Error Message" answer
    assert r.is_error
    assert "'symbol' is a required property" in r.content[0].text  # type: ignore[union-attr]


async def test_an_unset_secret_fails_the_call_naming_it(
    tmp_path: Path, api: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``GenericApiTool._resolve_secret`` sends an empty key when ``${NAME}`` is unset; mcpipe refuses to call
    without it and says which secret; ``[piraeus] secrets`` is read before the environment."""
    monkeypatch.delenv("ALPHA_VANTAGE_API_KEY")
    raw = rehosted(upstream(EXAMPLE), api.url)
    async with piraeus_app(tmp_path, {"tools/q.json": raw}) as app, Client(app.server) as c:
        r = await c.call_tool("get_stock_quote", {"symbol": "IBM"})
    assert r.is_error and "the secret `ALPHA_VANTAGE_API_KEY` of tool 'get_stock_quote' is not set" in r.content[0].text  # type: ignore[union-attr]
    assert api.requests == []
    async with (
        piraeus_app(tmp_path, {}, secrets={"ALPHA_VANTAGE_API_KEY": "from-config"}, tools="tools/*.json") as app,
        Client(app.server) as c,
    ):
        r = await c.call_tool("get_stock_quote", {"symbol": "IBM"})
    assert not r.is_error and api.requests[-1]["query"]["apikey"] == "from-config"
