"""Pipelines the server runs itself (``surface: hidden``): a completion source (``completions: {x: {pipeline}}``)
and a resource listing (``listing``), served over streamable HTTP; never listed nor callable as tools."""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
import pytest
import trio

from kit.clients import bearer_client
from kit.servers import http_server
from mcpipe.config import ConfigError, parse_config
from mcpipe.server import open_app

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

CITIES = ["Paris", "Parma", "Perth", "Porto"]


def _doc(*pipelines: dict[str, Any]) -> dict[str, Any]:
    template = {
        "name": "city",
        "description": "A city.",
        "surface": "resource_template",
        "uri_template": "city://{name}",
        "steps": [{"kind": "value", "id": "v", "value": "${args.name}"}],
        "completions": {"name": {"pipeline": "city.names"}},
        "listing": "city.list",
    }
    names = {
        "name": "city.names",
        "surface": "hidden",
        "steps": [
            {
                "kind": "transform",
                "id": "match",
                "expression": f"{json.dumps(CITIES)}.filter(c, c.startsWith(args.value))",
            }
        ],
    }
    listing = {
        "name": "city.list",
        "surface": "hidden",
        "steps": [
            {
                "kind": "transform",
                "id": "page",
                "expression": "args.cursor == null ? "
                '{"resources": [{"uri": "city://Paris", "name": "Paris"}], "next_cursor": "2"} : '
                '{"resources": [{"uri": "city://Porto", "name": "Porto", "mimeType": "text/plain"}]}',
            }
        ],
    }
    return {"audit": {"enabled": False}, "builtins": False, "pipelines": [template, names, listing, *pipelines]}


def _config(doc: dict[str, Any]) -> Any:
    return parse_config(json.dumps(doc), "json", environ={})


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_completion_source_and_a_listing_answer_through_their_hidden_pipelines(mode: str) -> None:
    ref = types.ResourceTemplateReference(type="ref/resource", uri="city://{name}")
    with trio.fail_after(30):
        async with (
            open_app(_config(_doc())) as app,
            http_server(app) as url,
            bearer_client(url, None, mode=mode) as client,
        ):
            done = await client.complete(ref, {"name": "name", "value": "Par"})
            first = await client.list_resources()
            second = await client.list_resources(cursor=first.next_cursor)
            tools = await client.list_tools()
    assert done.completion.values == ["Paris", "Parma"] and done.completion.total == 2
    assert [r.uri for r in first.resources if r.uri.startswith("city://")] == ["city://Paris"] and first.next_cursor
    assert [(r.uri, r.mime_type) for r in second.resources] == [("city://Porto", "text/plain")]
    assert second.next_cursor is None
    assert not [t.name for t in tools.tools if t.name.startswith("city")]  # hidden pipelines are no tools


async def test_a_completion_source_that_fails_offers_nothing_and_a_bad_cursor_is_invalid_params() -> None:
    doc = _doc()
    doc["pipelines"][1]["steps"][0]["expression"] = "args.value / 0"
    ref = types.ResourceTemplateReference(type="ref/resource", uri="city://{name}")
    with trio.fail_after(30):
        async with open_app(_config(doc)) as app, http_server(app) as url, bearer_client(url, None) as client:
            done = await client.complete(ref, {"name": "name", "value": "P"})
            with pytest.raises(Exception, match="Invalid cursor"):
                await client.list_resources(cursor="not-a-cursor")
    assert done.completion.values == []


def test_a_completion_source_or_listing_naming_no_hidden_pipeline_is_refused_located() -> None:
    doc = _doc()
    doc["pipelines"][0]["listing"] = "nope"
    doc["pipelines"][0]["completions"] = {"name": {"pipeline": "city"}}
    with pytest.raises(ConfigError) as e:
        _config(doc)
    assert sorted((p.location, p.message) for p in e.value.problems) == [
        ("pipelines.city.completions.name.pipeline", "no pipeline 'city' with `surface: hidden` in the config"),
        ("pipelines.city.listing", "no pipeline 'nope' with `surface: hidden` in the config"),
    ]
