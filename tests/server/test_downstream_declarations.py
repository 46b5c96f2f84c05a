"""A downstream tool is listed as its server declared it (``title``, ``annotations``, ``icons``,
``outputSchema``, ``_meta``), but for mcpipe's prefix, on both protocol eras; with MCP Apps on, its ``_meta.ui``
is held to the operator's policy (``docs/gateway.md``). The downstream is ``kit/toolmeta_downstream.py``."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client, StdioServerParameters

from kit import toolmeta_downstream as declared
from kit.clients import bearer_client
from kit.servers import http_server, make_config, running

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

SERVER = str(Path(declared.__file__))
ERAS = ("legacy", "2026-07-28")


def _downstream(**extra: Any) -> dict[str, Any]:
    return {"command": sys.executable, "args": [SERVER], "prefix": "m", **extra}


def _wire(tools: list[Any]) -> dict[str, dict[str, Any]]:
    return {t.name: t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in tools}


async def _direct(mode: str) -> dict[str, dict[str, Any]]:
    """What the downstream lists to a client of its own."""
    async with Client(StdioServerParameters(command=sys.executable, args=[SERVER]), mode=mode) as c:
        return _wire((await c.list_tools()).tools)


async def test_a_downstream_tools_declaration_is_listed_as_the_server_gave_it_on_both_eras() -> None:
    cfg = make_config(mcpServers={"m": _downstream()})
    through: dict[str, dict[str, dict[str, Any]]] = {}
    with trio.fail_after(30):
        direct = {mode: await _direct(mode) for mode in ERAS}
        async with running(cfg) as app, http_server(app) as url:
            for mode in ERAS:
                async with bearer_client(url, None, mode=mode) as c:
                    through[mode] = _wire((await c.list_tools()).tools)
                    if mode == "legacy":  # the App the tool names opens through mcpipe
                        uri = through[mode]["m.chart"]["_meta"]["ui"]["resourceUri"]
                        page = (await c.read_resource(uri)).contents[0]
                        called = await c.call_tool("m.chart", {"n": 3})
    for mode in ERAS:
        for remote, tool in direct[mode].items():
            expected = {**tool, "name": f"m.{remote}"}
            expected.pop("execution", None)  # mcpipe runs the call and says its own task support
            assert through[mode][f"m.{remote}"] == expected, (mode, remote)
    chart = through["2026-07-28"]["m.chart"]
    assert chart["_meta"] == declared.CHART_META and chart["title"] == "Chart"
    assert chart["annotations"]["readOnlyHint"] is True and chart["icons"][0]["theme"] == "light"
    assert "execution" in direct["legacy"]["queued"] and "execution" not in through["legacy"]["m.queued"]
    assert page.text == "<p>chart</p>" and called.structured_content == {"points": [0, 1, 2]}


def _apps(strict: bool) -> dict[str, Any]:
    return {
        "enabled": True,
        "strict": strict,
        "csp_policy": {"connect_domains": ["https://a.example"]},
        "allowed_permissions": ["clipboardWrite"],
    }


async def test_with_mcp_apps_a_downstream_tools_meta_ui_is_narrowed_and_strict_mode_leaves_the_tool_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    echo = {"name": "shown", "steps": [{"kind": "value", "id": "v", "value": 1}], "meta": {"ui": {"x": ["y"]}}}
    cfg = make_config(apps=_apps(False), mcpServers={"m": _downstream()}, pipelines=[echo])
    strict = make_config(apps=_apps(True), mcpServers={"m": _downstream(include=["plain", "chart"])})
    with trio.fail_after(30):
        async with running(cfg) as app:
            for mode in ERAS:
                async with Client(app.server, mode=mode) as c:
                    tools = _wire((await c.list_tools()).tools)
                    assert tools["m.chart"]["_meta"] == _narrowed(), mode
                    assert tools["m.odd"]["_meta"] == {"ui": {}, "vendor.example/rank": 2}, mode
                    assert tools["m.plain"] == {**_plain(), "name": "m.plain"}
                    assert tools["shown"]["_meta"] == echo["meta"]  # a declared tool's meta is the operator's
        assert app.downstreams.servers[0].tools["m.chart"].meta == declared.CHART_META  # narrowed a copy
        async with running(strict) as app, Client(app.server, mode="2026-07-28") as c:
            # One server's tool beyond the policy is left out; the others are still listed.
            for _ in range(2):
                listed = set(_wire((await c.list_tools()).tools))
                assert "m.plain" in listed and "m.chart" not in listed
    left_out = [r.getMessage() for r in caplog.records if "left out of tools/list" in r.getMessage()]
    assert left_out == [
        "MCP Apps strict mode: tool 'm.chart' _meta.ui escaped operator policy (apps.strict = true): "
        "the tool is left out of tools/list"
    ]


def _narrowed() -> dict[str, Any]:
    meta = copy.deepcopy(declared.CHART_META)
    meta["ui"]["csp"]["connectDomains"] = ["https://a.example"]
    meta["ui"]["permissions"] = {"clipboardWrite": {}}
    meta["openai/widgetCSP"]["connect_domains"] = ["https://a.example"]
    return meta


def _plain() -> dict[str, Any]:
    return next(t for t in declared.TOOLS if t.name == "plain").model_dump(by_alias=True, exclude_none=True)
