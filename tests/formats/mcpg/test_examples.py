"""mcpg's own example configs, served end to end: each vendored ``examples/*/config.yaml`` of the oracle's
cases (``cases.yaml``) with only its hosts and ports rewritten to stand-ins on 127.0.0.1, served by mcpipe
over streamable HTTP, called by a real MCP client (the oracle's raw JSON-RPC client), and every answer and
every request the stand-ins received checked against mcpg's semantics (its HTTP backend's envelope and query
string, its trust overlay, its resource codec). The goldens recorded from the real mcpg replay the same
cases byte for byte (``test_mcpg_goldens.py``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import trio
import yaml

from kit.mcpg_oracle import CaseRun, RawMcp, oracle_overlay, render, rewrite_hosts, services
from kit.servers import http_server
from mcpipe.config import parse_config
from mcpipe.server import open_app

HERE = Path(__file__).parent
UPSTREAM = HERE / "upstream"
INDEX: dict[str, str] = json.loads((UPSTREAM / "INDEX.json").read_text())
CASES: dict[str, Any] = yaml.safe_load((HERE / "cases.yaml").read_text())
EXAMPLES = sorted(
    name for name, case in CASES.items() if case["source"].startswith("examples/") and set(case["services"]) == {"http"}
)


def _query(arguments: dict[str, Any]) -> str:
    """mcpg's query string (mcpg-plugin-backend-http README): sorted keys, arrays repeating their key,
    RFC 3986 unreserved characters kept, JSON for objects."""
    pairs = []
    for key in sorted(arguments):
        value = arguments[key]
        for item in value if isinstance(value, list) else [value]:
            text = item if isinstance(item, str) else json.dumps(item, separators=(",", ":"))
            if isinstance(item, bool):
                text = "true" if item else "false"
            pairs.append(f"{quote(key, safe='-_.~')}={quote(text, safe='-_.~')}")
    return "&".join(pairs)


def _path(url: str, arguments: dict[str, Any]) -> str:
    filled = re.sub(r"\$\{arguments\.(\w+)\}", lambda m: str(arguments.get(m.group(1), "")), url)
    return re.sub(r"^https?://[^/]+", "", filled).split("?", 1)[0]


class SubjectClient(RawMcp):
    """The oracle's MCP client, calling as a header-asserted subject (``x-mcpg-subject-id``): mcpg gives every
    binding a trust floor (``header_asserted`` unless the binding says otherwise), so an anonymous caller
    would be refused (``-32003``)."""

    opened: list[Any] = []

    def _post(self, message: dict[str, Any]) -> Any:
        import http.client

        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        self.opened.append(conn)
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-06-18",
            "x-mcpg-subject-id": "oracle",
        }
        if self.session:
            headers["Mcp-Session-Id"] = self.session
        conn.request("POST", self.path, body=json.dumps(message).encode(), headers=headers)
        return conn.getresponse()


def call_all(url: str, calls: list[dict[str, Any]], run: CaseRun) -> list[dict[str, Any]]:
    client = SubjectClient(url)
    client.opened = []
    try:
        client.initialize()
        run.received()
        out = []
        for call in calls:
            response = client.request(call["method"], call.get("params"))
            out.append({**call, "response": response, "received": run.received()})
        return out
    finally:
        for conn in client.opened:
            conn.close()


def test_at_least_ten_example_configs_are_served_end_to_end() -> None:
    assert len(EXAMPLES) >= 10, EXAMPLES


@pytest.mark.parametrize("name", EXAMPLES)
async def test_an_example_config_answers_as_mcpgs_http_backend(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    source = yaml.safe_load((UPSTREAM / INDEX[case["source"]]).read_text())
    doc = oracle_overlay(rewrite_hosts(source, case["hosts"]))
    doc["gateway"]["server"]["trust_subject_header"] = True
    bindings = {b["name"]: b for b in (doc["mcp"]["capabilities"].get("tools") or [])}
    with services(case["services"], tmp_path) as run:
        text = render(yaml.safe_dump(doc), run.ports, str(tmp_path))
        config = parse_config(text, "yaml", base_dir=str(tmp_path), environ=case["env"])
        with trio.fail_after(60):
            async with open_app(config) as app, http_server(app) as url:
                calls = await trio.to_thread.run_sync(call_all, url, case["calls"], run)
        routes = [r for s in case["services"]["http"].values() for r in s["routes"]]
    for call in calls:
        response = call["response"]
        if call["method"] == "tools/list":
            assert sorted(t["name"] for t in response["result"]["tools"]) == sorted(bindings)
            continue
        if call["method"] == "resources/read":
            # A plain HTTP body holds no `contents`: mcpg's resource codec answers -32603 (invocation.rs).
            assert response["error"]["code"] == -32603, response
            assert "is missing `contents`" in response["error"]["message"]
            continue
        if call["method"] != "tools/call":
            assert "result" in response, response
            continue
        params = call["params"]
        binding = bindings[params["name"]]["backend"]
        arguments = params.get("arguments") or {}
        get = str(binding.get("method", "post")).lower() == "get"
        result = response["result"]
        structured = result["structuredContent"]
        assert json.loads(result["content"][0]["text"]) == structured
        assert structured["requestKind"] == ("query_string" if get else "json_body")
        [sent] = [r for requests in call["received"].values() for r in requests]
        assert sent["method"] == ("GET" if get else "POST")
        assert sent["path"] == _path(binding["url"], arguments)
        if get:
            assert sent["query"].endswith(_query(arguments)), (sent["query"], _query(arguments))
        else:
            assert sent["body"] == arguments
        route = next(r for r in routes if r["method"] == sent["method"] and re.fullmatch(r["path"], sent["path"]))
        status = route.get("status", 200)
        assert structured["response"]["statusCode"] == status
        expected = binding.get("expected_status_codes", [200])
        media = (route.get("content_type") or ("text/plain" if "text" in route else "application/json")).split(";")[0]
        is_json = media == "application/json" or media.endswith("+json")
        if is_json and "text" not in route:
            assert structured["response"]["json"] == route.get("body")
        bad = status not in expected or (binding.get("require_json_response", False) and not is_json)
        assert result.get("isError", False) is bad, (params, structured["downstreamErrors"])  # mcpg omits it when false
        assert (structured["downstreamError"] is not None) is bad
        # every binding-plugin dispatch of mcpg says what ran (binding_audit_meta)
        outcome = "error" if bad else "success"
        audit = {"backend_kind": "http", "binding_profile": params["name"], "outcome": outcome}
        assert result["_meta"]["audit"] == audit
