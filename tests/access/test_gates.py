"""The gates every tool call passes, over real HTTP: Cedar policies (the Cedar engine deciding), rate
limits, client-address allowlists, shadow mode, and their config checked located."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import httpx2
import pytest

from kit.servers import http_server, make_config, running
from mcpipe.access._config import RateLimitGate
from mcpipe.access._gates import AddressSource, GateRefusal, RateLimiter
from mcpipe.config import ConfigError, parse_config
from mcpipe.gateway import PIPE_TOOL
from mcpipe.tools import Request, ToolContext

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
TOKENS = {"T_ALICE": "alice-secret", "T_BOB": "bob-secret", "T_CAROL": "carol-secret"}
AUTH = {"tokens": [{"env": k, "principal": k[2:].lower()} for k in TOKENS]}

POLICIES = """
permit(principal == User::"alice", action == Action::"tool.call.pre", resource);
permit(principal, action, resource == Tool::"echo");
permit(principal, action, resource == Tool::"mcp_pipe");
@id("no-bob-pipes")
forbid(principal == User::"bob", action, resource == Tool::"mcp_pipe");
"""


async def _call(
    http: httpx2.AsyncClient, url: str, name: str, args: dict, token: str | None = None, **headers: str
) -> dict:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": args, "_meta": META},
    }
    h = {
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": name,
        **headers,
    }
    if token:
        h["authorization"] = f"Bearer {token}"
    r = await http.post(url, json=body, headers=h)
    assert r.status_code == 200, r.text
    return r.json()["result"]


def _text(result: dict) -> str:
    return result["content"][0]["text"] if result.get("content") else ""


async def test_cedar_policies_decide_each_call_with_permit_forbid_and_default_deny(monkeypatch, tmp_path):
    for k, v in TOKENS.items():
        monkeypatch.setenv(k, v)
    gates = [{"kind": "cedar", "name": "authz", "policies": POLICIES}]
    config = make_config(TOKENS, auth=AUTH, access={"gates": gates}, audit={"path": str(tmp_path / "a.jsonl")})
    spec = {"steps": [{"tool": "now"}]}
    async with running(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
        alice_now = await _call(http, url, "now", {}, "alice-secret")
        carol_echo = await _call(http, url, "echo", {"x": 1}, "carol-secret")
        carol_now = await _call(http, url, "now", {}, "carol-secret")
        bob_pipe = await _call(http, url, PIPE_TOOL, {"steps": [{"tool": "echo"}]}, "bob-secret")
        carol_pipe = await _call(http, url, PIPE_TOOL, spec, "carol-secret")
    assert not alice_now["isError"] and not carol_echo["isError"]
    assert carol_now["isError"] and "FORBIDDEN" in _text(carol_now) and "no policy permits it" in _text(carol_now)
    # mcp_pipe passes the policy (Bob may not call it at all), and so does each of its steps (Carol's `now`).
    assert (
        bob_pipe["structuredContent"]["error_code"] == "FORBIDDEN"
        and "no-bob-pipes" in bob_pipe["structuredContent"]["error"]
    )
    (step,) = carol_pipe["structuredContent"]["steps"].values()
    assert carol_pipe["structuredContent"]["error_code"] == "FORBIDDEN" and step["error_code"] == "FORBIDDEN"
    records = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    refused = [r for r in records if r["error_code"] == "FORBIDDEN" and r.get("gate") == "authz"]
    assert [(r["principal"], r["tool"]) for r in refused] == [("carol", "now"), ("bob", PIPE_TOOL), ("carol", "now")]


async def test_a_cedar_forbid_names_the_policies_that_denied():
    gates = [
        {
            "kind": "cedar",
            "policies": 'permit(principal, action, resource);\n@id("no-now")\n'
            'forbid(principal, action, resource == Tool::"now");',
        }
    ]
    async with (
        running(make_config(access={"gates": gates})) as app,
        http_server(app) as url,
        httpx2.AsyncClient() as http,
    ):
        denied = await _call(http, url, "now", {})
        allowed = await _call(http, url, "echo", {})
    assert denied["isError"] and "cedar forbid: no-now" in _text(denied) and not allowed["isError"]


async def test_cedar_reads_entities_a_schema_and_the_arguments_as_context(tmp_path):
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "a.cedar").write_text(
        'permit(principal in Group::"ops", action, resource) when { context.region == "eu" };'
    )
    entities = [
        {"uid": {"type": "User", "id": "anonymous"}, "attrs": {}, "parents": [{"type": "Group", "id": "ops"}]},
        {"uid": {"type": "Group", "id": "ops"}, "attrs": {}, "parents": []},
    ]
    (tmp_path / "entities.json").write_text(json.dumps(entities))
    gate = {
        "kind": "cedar",
        "policy_dir": "policies",
        "entities_path": "entities.json",
        "arguments_as_context": True,
        "resource_types": [{"decision_point": "*", "resource_type": "Tool", "resource_id": "/account"}],
    }
    config_file = tmp_path / "mcpipe.json"
    config_file.write_text(json.dumps({"access": {"gates": [gate]}, "audit": {"enabled": False}}))
    from mcpipe.config import load_config

    config = load_config(config_file, environ={})
    async with running(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
        eu = await _call(http, url, "echo", {"region": "eu", "account": "a1"})
        us = await _call(http, url, "echo", {"region": "us"})
    assert not eu["isError"] and us["isError"]


async def test_a_rate_limit_refuses_the_call_past_its_budget_per_principal(monkeypatch):
    for k, v in TOKENS.items():
        monkeypatch.setenv(k, v)
    gates = [
        {
            "kind": "rate_limit",
            "default_limit": 2,
            "default_window_ms": 60_000,
            "rules": [{"tools": ["n?w"], "limit": 1, "scope": "global"}],
        }
    ]
    config = make_config(TOKENS, auth=AUTH, access={"gates": gates})
    async with running(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
        alice = [await _call(http, url, "echo", {}, "alice-secret") for _ in range(3)]
        bob = await _call(http, url, "echo", {}, "bob-secret")
        now_a = await _call(http, url, "now", {}, "alice-secret")
        now_b = await _call(http, url, "now", {}, "bob-secret")
    assert [r["isError"] for r in alice] == [False, False, True] and not bob["isError"]
    assert "LIMIT_EXCEEDED" in _text(alice[2]) and "retry after" in _text(alice[2])
    assert not now_a["isError"] and now_b["isError"]  # the `now` rule is one global bucket


def test_a_token_bucket_refills_at_its_rate_and_holds_its_burst():
    clock = [0.0]
    limiter = RateLimiter(
        RateLimitGate(default_limit=2, default_window_ms=1000, default_burst=3), "rl", lambda: clock[0]
    )
    ctx = ToolContext(principal="p")

    def take() -> bool:
        try:
            limiter.check("t", {}, ctx)
        except GateRefusal:
            return False
        return True

    assert [take() for _ in range(4)] == [True, True, True, False]  # a fresh bucket holds the burst
    clock[0] = 0.5  # half a window: one token back
    assert [take(), take()] == [True, False]
    clock[0] = 100.0  # long idle: full again, never above the burst
    assert [take() for _ in range(4)] == [True, True, True, False]


@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ({"x-forwarded-for": "10.1.2.3, 203.0.113.9"}, True),
        ({"x-forwarded-for": "192.168.0.7"}, False),
        ({"x-real-ip": "10.9.9.9"}, False),  # only the header named counts
        ({"x-forwarded-for": "::ffff:10.0.0.1"}, True),
        ({}, False),
        ({"x-forwarded-for": "not-an-address"}, False),
    ],
)
async def test_an_ip_allowlist_on_a_header_admits_only_calls_from_its_networks(headers, allowed):
    gates = [
        {
            "kind": "ip_allowlist",
            "allow": ["10.0.0.0/8", "2001:db8::/32"],
            "ip_header": "x-forwarded-for",
            "tools": ["ec*"],
        }
    ]
    async with (
        running(make_config(access={"gates": gates})) as app,
        http_server(app) as url,
        httpx2.AsyncClient() as http,
    ):
        echo = await _call(http, url, "echo", {}, **headers)
        now = await _call(http, url, "now", {}, **headers)  # not a gated tool
    assert echo["isError"] is (not allowed) and not now["isError"]


async def test_an_allowlist_judges_the_tcp_peer_by_default_whatever_the_headers_say():
    gates = [{"kind": "ip_allowlist", "allow": ["127.0.0.0/8"]}]
    async with (
        running(make_config(access={"gates": gates})) as app,
        http_server(app) as url,
        httpx2.AsyncClient() as http,
    ):
        r = await _call(http, url, "echo", {}, **{"x-forwarded-for": "203.0.113.1"})
    assert not r["isError"]


async def test_a_gate_in_shadow_mode_logs_what_it_would_refuse_and_lets_the_call_run(caplog):
    gates = [{"kind": "cedar", "policies": "forbid(principal, action, resource);", "enforce": False}]
    async with (
        running(make_config(access={"gates": gates})) as app,
        http_server(app) as url,
        httpx2.AsyncClient() as http,
    ):
        r = await _call(http, url, "echo", {"x": 1})
    assert not r["isError"] and "would refuse (shadow mode)" in caplog.text


async def test_a_queued_run_passes_the_gates_with_its_callers_address_when_a_worker_runs_it():
    # mcp_pipe is not gated, its step is
    gates = [{"kind": "ip_allowlist", "allow": ["10.0.0.0/8"], "ip_header": "x-forwarded-for", "tools": ["echo"]}]
    async with (
        running(make_config(access={"gates": gates})) as app,
        http_server(app) as url,
        httpx2.AsyncClient() as http,
    ):
        inside = await _call(
            http,
            url,
            PIPE_TOOL,
            {"steps": [{"tool": "echo", "args": {"a": 1}}], "background": True},
            **{"x-forwarded-for": "10.0.0.5"},
        )
        outside = await _call(
            http,
            url,
            PIPE_TOOL,
            {"steps": [{"tool": "echo", "args": {"a": 1}}], "background": True},
            **{"x-forwarded-for": "8.8.8.8"},
        )
        results = []
        for answer in (inside, outside):
            run_id = answer["structuredContent"]["result"]["run_id"]
            results.append(
                await _call(
                    http, url, "pipe_result", {"run_id": run_id, "wait_ms": 5000}, **{"x-forwarded-for": "10.0.0.5"}
                )
            )
    assert results[0]["structuredContent"]["ok"] is True
    assert results[1]["structuredContent"]["error_code"] == "FORBIDDEN"


def test_the_caller_facts_a_run_keeps_never_hold_the_bearer_token():
    from mcpipe.runs._service import caller_facts, caller_request
    from mcpipe.tools import Identity

    ctx = ToolContext(
        request=Request(
            identity=Identity("alice", token="secret-jwt", groups=("ops",)),
            client_addresses={"x-forwarded-for": "10.0.0.1"},
        )
    )
    kept = caller_facts(ctx)
    assert "secret-jwt" not in json.dumps(kept)
    back = caller_request(kept and {"caller": kept})
    assert back.identity is not None and back.identity.subject == "alice" and back.identity.token is None
    assert back.identity.groups == ("ops",) and back.client_addresses == {"x-forwarded-for": "10.0.0.1"}


@pytest.mark.parametrize(
    ("gate", "where", "says"),
    [
        (
            {"kind": "cedar", "policies": "permit(principal action, resource);"},
            "access.gates[0].policies",
            "Cedar refuses it",
        ),
        ({"kind": "cedar"}, "access.gates[0]", "set `policies`"),
        ({"kind": "cedar", "policy_dir": "nowhere"}, "access.gates[0].policy_dir", "not a directory"),
        ({"kind": "ip_allowlist", "allow": ["10.0.0.0/33"]}, "access.gates[0].allow[0]", "not a network"),
        ({"kind": "ip_allowlist", "allow": []}, "access.gates[0].allow", "at least one network"),
        (
            {"kind": "ip_allowlist", "allow": ["10.0.0.0/8"], "trusted_proxies": ["10.1.0.0/16"]},
            "access.gates[0].trusted_proxies",
            "`ip_header` names none",
        ),
        (
            {"kind": "ip_allowlist", "allow": ["10.0.0.0/8"], "ip_header": "x-forwarded-for", "trusted_proxies": ["x"]},
            "access.gates[0].trusted_proxies[0]",
            "not a network",
        ),
        ({"kind": "rate_limit", "default_limit": 0}, "access.gates[0].default_limit", ">= 1"),
        (
            {"kind": "rate_limit", "rules": [{"tools": [], "limit": 1}]},
            "access.gates[0].rules[0].tools",
            "at least one",
        ),
        ({"kind": "firewall"}, "access.gates[0].kind", "invalid value"),
    ],
)
def test_bad_gate_config_is_refused_located(gate, where, says):
    with pytest.raises(ConfigError) as err:
        parse_config(json.dumps({"access": {"gates": [gate]}}), "json", environ={}, base_dir=str(Path(__file__).parent))
    assert any(p.location == where and says in p.message for p in err.value.problems), err.value.problems


async def test_refusals_can_answer_mcpgs_json_rpc_errors():
    gates = [
        {"kind": "ip_allowlist", "allow": ["10.0.0.0/8"], "ip_header": "x-forwarded-for", "tools": ["now"]},
        {
            "kind": "cedar",
            "name": "authz",
            "policies": 'permit(principal, action, resource);\n@id("no-fail")\n'
            'forbid(principal, action, resource == Tool::"fail");',
        },
        {"kind": "rate_limit", "default_limit": 1},
    ]
    config = make_config(access={"gates": gates, "refusals": "error"})
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "", "arguments": {}, "_meta": META}}
    async with running(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
        answers = {}
        for name, headers in (("now", {"x-forwarded-for": "8.8.8.8"}), ("fail", {}), ("echo", {}), ("echo", {})):
            body["params"]["name"] = name
            h = {
                "accept": "application/json, text/event-stream",
                "mcp-protocol-version": "2026-07-28",
                "mcp-method": "tools/call",
                "mcp-name": name,
                **headers,
            }
            answers.setdefault(name, []).append((await http.post(url, json=body, headers=h)).json())
    assert answers["now"][0]["error"] == {
        "code": -32030,
        "message": "Access denied: 8.8.8.8 not in IP allowlist",
        "data": {"client_ip": "8.8.8.8"},
    }
    assert answers["fail"][0]["error"]["code"] == -33000
    assert answers["fail"][0]["error"]["message"] == "Policy `authz` denied tool 'fail': cedar forbid: no-fail"
    assert "result" in answers["echo"][0]
    limited = answers["echo"][1]["error"]
    assert limited["code"] == -32029 and limited["message"] == "Rate limit exceeded"
    assert (
        limited["data"]["limit"] == 1
        and limited["data"]["window_ms"] == 60_000
        and limited["data"]["retry_after_secs"] >= 1
    )


PROXIES = (ipaddress.ip_network("10.1.0.0/16"), ipaddress.ip_network("127.0.0.1/32"))


@pytest.mark.parametrize(
    ("header", "trusted", "values", "peer", "address"),
    [
        (None, (), ["10.0.0.5"], "203.0.113.9", "203.0.113.9"),  # the peer: headers never count
        ("x-forwarded-for", (), ["10.0.0.5, 198.51.100.1"], "127.0.0.1", "10.0.0.5"),  # the first value
        ("x-forwarded-for", (), [], "127.0.0.1", None),  # the header is missing: unknown
        ("x-forwarded-for", PROXIES, ["10.0.0.5"], "203.0.113.9", "203.0.113.9"),  # not from a trusted proxy
        ("x-forwarded-for", PROXIES, ["10.0.0.5, 198.51.100.1"], "127.0.0.1", "198.51.100.1"),  # rightmost untrusted
        ("x-forwarded-for", PROXIES, ["198.51.100.1, 10.1.2.3"], "127.0.0.1", "198.51.100.1"),  # past the proxies
        ("x-forwarded-for", PROXIES, ["10.0.0.5", "198.51.100.1"], "127.0.0.1", "198.51.100.1"),  # two lines, one list
        ("x-forwarded-for", PROXIES, ["10.0.0.5, junk, 10.1.0.1"], "127.0.0.1", "junk"),  # never skipped past
        ("x-forwarded-for", PROXIES, [], "127.0.0.1", "127.0.0.1"),  # the proxy itself
    ],
)
def test_an_address_source_reads_the_peer_or_a_trusted_proxys_header(header, trusted, values, peer, address):
    headers = [(b"X-Forwarded-For", v.encode()) for v in values]
    assert AddressSource(header, trusted).resolve(headers, (peer, 5000)) == address
