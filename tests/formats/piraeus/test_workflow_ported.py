"""piraeus's tools as tools of the workflow (seed 002), ported from its ``backend/tests/test_workflow_orchestrator.py``
and ``test_workflow_integration.py`` (each case names the upstream tests it ports): the model is the scripted
OpenAI-compatible server, the APIs the stand-ins on 127.0.0.1; the answers keep piraeus's ``WorkflowResponse``
with its ``HTTPRequestSpec`` and ``HTTPResponseSpec`` dumped whole."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx2
import trio
from mcp import Client

from kit.llm import FakeOpenAI, http_error, text
from kit.piraeus import QUOTE, StandIn, piraeus_app, rehosted, upstream
from mcpipe.config import ConfigError, parse_config
from mcpipe.server import App, serve_http

WEATHER = {
    "name": "get_weather",
    "description": "Get current weather for a city",
    "api": {
        "base_url": "https://api.openweathermap.org/data/2.5/weather",
        "auth": {"method": "api_key_query", "key_name": "appid", "secret_ref": "${OPENWEATHER_KEY}"},
    },
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "City name"}},
        "required": ["city"],
    },
    "output_schema": {"type": "object", "properties": {"temperature": {"type": "number"}}},
    "mapping": {"input_to_params": {"city": "q"}, "response_to_output": {"temperature": "main.temp"}},
}


def files(api: StandIn) -> dict[str, Any]:
    return {
        "tools/quote.json": rehosted(upstream("EXAMPLE_STOCK_QUOTE_CONFIG.json"), api.url),
        "tools/weather.json": rehosted(WEATHER, api.url),
    }


def picks_quote(api: StandIn, symbol: str = "IBM") -> dict[str, Any]:
    """The model's request for the quote tool: by the API's own parameter names, without secrets."""
    spec = {"tool": "get_stock_quote", "method": "GET", "url": f"{api.url}/query", "query_params": {"symbol": symbol}}
    return text(json.dumps(spec))


@asynccontextmanager
async def over_http(app: App) -> AsyncIterator[str]:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(partial(serve_http, app, host="127.0.0.1", port=0, shutdown_trigger=stop.wait))
        try:
            yield url.rsplit("/", 1)[0] + "/workflow"
        finally:
            stop.set()


async def test_post_workflow_answers_piraeus_shapes_over_http(tmp_path: Path, api: StandIn, model: FakeOpenAI) -> None:
    """Ports ``test_workflow_endpoint_success_without_formatting``, ``test_workflow_endpoint_missing_tools_error``,
    ``test_workflow_endpoint_invalid_request`` and ``test_workflow_endpoint_empty_tool_ids``: HTTP 200 with the
    response (an error stage too), 422 for a request the model refuses."""
    model.says(picks_quote(api))
    async with (
        piraeus_app(tmp_path, files(api), model_url=model.url) as app,
        over_http(app) as url,
        httpx2.AsyncClient(trust_env=False) as http,
    ):
        ok = await http.post(
            url, json={"user_instructions": "IBM?", "tool_ids": ["get_stock_quote"], "format_response": False}
        )
        missing = await http.post(url, json={"user_instructions": "Get data", "tool_ids": ["missing_tool"]})
        no_ids = await http.post(url, json={"user_instructions": "Get data"})
        empty = await http.post(url, json={"user_instructions": "Get data", "tool_ids": []})
    assert ok.status_code == 200
    out = ok.json()
    assert out["status"] == "success" and out["selected_tool"] == "get_stock_quote" and out["error"] is None
    assert out["http_spec"] == {
        "method": "GET",
        "url": f"{api.url}/query",
        "headers": None,
        "query_params": {"symbol": "IBM", "function": "GLOBAL_QUOTE", "apikey": "***"},
        "body": None,
    }
    raw = out["raw_response"]
    assert set(raw) == {"status_code", "headers", "body", "execution_time_ms"}
    assert raw["status_code"] == 200 and raw["body"] == {"Global Quote": QUOTE}
    assert raw["headers"]["x-stand-in"] == "piraeus"
    assert out["formatted_response"] is None
    assert api.requests[0]["query"] == {"symbol": "IBM", "function": "GLOBAL_QUOTE", "apikey": "av-secret-key"}
    assert missing.status_code == 200
    assert missing.json()["status"] == "error" and missing.json()["error_stage"] == "tool_retrieval"
    assert "missing_tool" in missing.json()["error"]
    assert no_ids.status_code == 422 and empty.status_code == 422


async def test_the_model_sees_each_tools_api_and_picks_among_several(
    tmp_path: Path, api: StandIn, model: FakeOpenAI, monkeypatch: Any
) -> None:
    """Ports ``TestFormatToolsAsContext.test_format_multiple_tools``, ``test_workflow_endpoint_multiple_tools``
    and ``test_workflow_endpoint_success_with_formatting`` (``TestExecuteWorkflow.test_successful_workflow_with_
    formatting``): the model is shown each tool's endpoint, the parameters it fills in (the mapped inputs, by the
    API's names), the static ones and the credential as ``[authenticated]``; it picks the weather tool, whose
    answer it then formats."""
    monkeypatch.setenv("OPENWEATHER_KEY", "ow-secret")
    spec = {
        "tool": "get_weather",
        "method": "GET",
        "url": f"{api.url}/data/2.5/weather",
        "query_params": {"q": "Paris"},
    }
    model.says(text(json.dumps(spec)), text("It is 18.5 degrees in Paris."))
    args = {
        "user_instructions": "How warm is Paris?",
        "tool_ids": ["get_stock_quote", "get_weather"],
        "format_response": True,
        "response_format_instructions": "One sentence.",
    }
    async with piraeus_app(tmp_path, files(api), model_url=model.url) as app, Client(app.server) as c:
        r = await c.call_tool("workflow", args)
    out = r.structured_content
    assert not r.is_error and out is not None
    assert out["selected_tool"] == "get_weather" and out["formatted_response"] == "It is 18.5 degrees in Paris."
    assert out["http_spec"]["query_params"] == {"q": "Paris", "appid": "***"}
    assert out["raw_response"]["body"]["main"] == {"temp": 18.5, "humidity": 60}
    system = model.requests[0]["messages"][0]["content"]
    assert "Tool: get_stock_quote" in system and "Tool: get_weather" in system
    assert f"Endpoint: GET {api.url}/query" in system and "  - symbol (string): Stock ticker symbol" in system
    assert "  - function: GLOBAL_QUOTE (static)" in system and "  - apikey: [authenticated]" in system
    assert "  - q (string): City name" in system and "  - appid: [authenticated]" in system
    assert "secret" not in json.dumps(model.requests)
    assert "One sentence." in model.requests[1]["messages"][-1]["content"]


async def test_each_stage_that_fails_is_named_as_piraeus_names_it(
    tmp_path: Path, api: StandIn, model: FakeOpenAI, monkeypatch: Any
) -> None:
    """Ports ``TestExecuteWorkflow.test_workflow_llm_error`` (``llm_selection``), ``test_workflow_api_execution_error``
    (``api_execution``: here the weather tool's secret is unset) and ``test_workflow_formatting_error_non_fatal``
    (the answer stays a success, without ``formatted_response``); ``TestRetrieveTools.test_retrieve_all_missing``."""
    monkeypatch.delenv("OPENWEATHER_KEY", raising=False)
    weather = {
        "tool": "get_weather",
        "method": "GET",
        "url": f"{api.url}/data/2.5/weather",
        "query_params": {"q": "Oslo"},
    }
    model.says(
        http_error(500, "model down"),
        text(json.dumps(weather)),
        picks_quote(api),
        http_error(500, "formatter down"),
    )
    ask = {"user_instructions": "x", "tool_ids": ["get_stock_quote", "get_weather"]}
    async with piraeus_app(tmp_path, files(api), model_url=model.url) as app, Client(app.server) as c:
        llm = (await c.call_tool("workflow", ask)).structured_content
        execution = (await c.call_tool("workflow", ask)).structured_content
        formatting = (await c.call_tool("workflow", {**ask, "format_response": True})).structured_content
        none = (await c.call_tool("workflow", {"user_instructions": "x", "tool_ids": ["a", "b"]})).structured_content
    assert llm is not None and llm["status"] == "error" and llm["error_stage"] == "llm_selection"
    assert execution is not None and execution["status"] == "error" and execution["error_stage"] == "api_execution"
    assert "OPENWEATHER_KEY" in execution["error"] and execution["selected_tool"] == "get_weather"
    assert formatting is not None and formatting["status"] == "success" and formatting["formatted_response"] is None
    assert formatting["error_stage"] == "response_formatting"
    assert none is not None and none["error_stage"] == "tool_retrieval" and "['a', 'b']" in none["error"]


async def test_piraeus_tools_join_a_configured_workflow_whose_own_tools_keep_mcpipes_shape(
    tmp_path: Path, api: StandIn, model: FakeOpenAI
) -> None:
    """With a ``[workflow]`` of its own, piraeus's tools are added to its tools (its model asked); mcpipe's own
    ``[[workflow.tools]]`` answer as before, piraeus's in piraeus's shape."""
    own = {
        "name": "search_docs",
        "description": "Search the docs",
        "base_url": api.url,
        "path": "/data/2.5/weather",
        "required_params": [{"name": "q"}],
    }
    doc = {"workflow": {"model": "gpt", "tools": [own]}}
    spec = {"tool": "search_docs", "method": "GET", "url": f"{api.url}/data/2.5/weather", "query_params": {"q": "x"}}
    model.says(text(json.dumps(spec)), picks_quote(api))
    ask = {"user_instructions": "x", "tool_ids": ["search_docs", "get_stock_quote"]}
    async with piraeus_app(tmp_path, files(api), model_url=model.url, doc=doc) as app, Client(app.server) as c:
        mine = (await c.call_tool("workflow", ask)).structured_content
        theirs = (await c.call_tool("workflow", ask)).structured_content
    assert mine is not None and mine["http_spec"] == {
        "method": "GET",
        "url": f"{api.url}/data/2.5/weather",
        "query_params": {"q": "x"},
    }
    assert set(mine["raw_response"]) == {"status_code", "body", "execution_time_ms"}
    assert theirs is not None and set(theirs["http_spec"]) == {"method", "url", "headers", "query_params", "body"}
    assert "headers" in theirs["raw_response"]


def test_a_piraeus_tool_named_as_a_workflow_tool_is_refused_where_it_is(tmp_path: Path) -> None:
    """Two tools of the workflow under one name: located at the piraeus file."""
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "q.json").write_text(json.dumps(upstream("EXAMPLE_STOCK_QUOTE_CONFIG.json")))
    doc = {
        "workflow": {"tools": [{"name": "get_stock_quote", "description": "x", "base_url": "https://example.com"}]},
        "piraeus": {"tools": "tools/*.json"},
    }
    try:
        parse_config(json.dumps(doc), "json", base_dir=str(tmp_path))
    except ConfigError as e:
        lines = [str(p) for p in e.problems]
    else:
        raise AssertionError("the clash was not refused")
    assert lines == ["tools/q.json: name: `get_stock_quote` is also a [[workflow.tools]] tool"]
