"""Scopes on prompts and resources (``[[auth.scopes]]`` over prompt names and resource URIs), one rule on every
path: in memory (the SDK's in-memory Client against the real server object), over stdio (a real ``mcpipe serve
--stdio`` process) and over streamable HTTP (tokens of the real authorization server of ``kit.authserver``,
and static tokens). A caller lists only the prompts, resources and resource templates its scopes allow; a get,
read, subscription or completion of another is refused, naming the scope: over HTTP with an OAuth issuer the
403 ``insufficient_scope`` step-up, elsewhere JSON-RPC -32003.

Who holds which scopes: a token's own (an OAuth token's ``scope``, a static token's ``scopes``); a caller with
no credential (stdio, in memory, HTTP without auth) is the operator, holding every scope, unless the config has
trust levels (mcpg's), under which it is anonymous and holds none."""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
import trio
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from kit.authserver import auth_server
from kit.clients import bearer_client
from kit.servers import ERAS, everything_downstream, http_server
from mcpipe.access import INSUFFICIENT_SCOPE
from mcpipe.config import Config, parse_config
from mcpipe.server import open_app

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

RESOURCE = "https://mcp.example.com/mcp"
SCOPES = [
    {"scope": "prompts:use", "prompts": ["plan"]},
    {"scope": "reports:read", "resources": ["report://*"]},
]


def _value(value: str) -> list[dict[str, Any]]:
    return [{"kind": "value", "id": "v", "value": value}]


PIPELINES = [
    {"name": "plan", "surface": "prompt", "steps": _value("go")},
    {"name": "hello", "surface": "prompt", "steps": _value("hi")},
    {"name": "weekly", "surface": "resource", "uri": "report://weekly", "steps": _value("all well")},
    {"name": "notes", "surface": "resource", "uri": "note://open", "steps": _value("open notes")},
    {
        "name": "daily",
        "surface": "resource_template",
        "uri_template": "report://daily/{day}",
        "completions": {"day": ["mon", "tue"]},
        "steps": _value("${args.day}"),
    },
    {
        "name": "note",
        "surface": "resource_template",
        "uri_template": "note://n/{id}",
        "completions": {"id": ["one", "two"]},
        "steps": _value("${args.id}"),
    },
]
"""A scoped and an open prompt, resource and resource template each."""

SCOPED = {"prompts": {"plan"}, "resources": {"report://weekly"}, "templates": {"report://daily/{day}"}}
OPEN = {"prompts": {"hello"}, "resources": {"note://open"}, "templates": {"note://n/{id}"}}


def _doc(**extra: Any) -> dict[str, Any]:
    auth = {"scopes": SCOPES, **extra.pop("auth", {})}
    return {"audit": {"enabled": False}, "builtins": False, "auth": auth, "pipelines": PIPELINES, **extra}


def _config(doc: dict[str, Any], environ: dict[str, str] | None = None) -> Config:
    return parse_config(json.dumps(doc), "json", environ=environ or {})


async def _listed(client: Client) -> dict[str, set[str]]:
    prompts = {p.name for p in (await client.list_prompts()).prompts}
    resources = {str(r.uri) for r in (await client.list_resources()).resources}
    templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
    return {"prompts": prompts, "resources": resources, "templates": templates}


async def _refusals(client: Client) -> dict[str, MCPError | None]:
    """Each request of a scoped prompt or resource: the JSON-RPC error it got (None: it was answered)."""

    async def attempt(request: Any) -> MCPError | None:
        try:
            await request
        except MCPError as exc:
            return exc
        return None

    scoped_template = types.ResourceTemplateReference(type="ref/resource", uri="report://daily/{day}")
    scoped_prompt = types.PromptReference(type="ref/prompt", name="plan")
    out = {
        "get": await attempt(client.get_prompt("plan")),
        "read": await attempt(client.read_resource("report://weekly")),
        "read_templated": await attempt(client.read_resource("report://daily/mon")),
        "complete_template": await attempt(client.complete(scoped_template, {"name": "day", "value": "m"})),
        "complete_prompt": await attempt(client.complete(scoped_prompt, {"name": "x", "value": ""})),
    }
    if client.protocol_version == "2025-11-25":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # resources/subscribe is the 2025-11-25 way
            out["subscribe"] = await attempt(client.subscribe_resource("report://weekly"))
    else:  # a 2026-07-28 listen stream naming the resource is a subscription to it

        async def listen() -> None:
            async with client.listen(resource_subscriptions=["report://weekly"]):
                pass

        out["listen"] = await attempt(listen())
    return out


async def _opens(client: Client) -> list[str]:
    """What the open prompt, resource and template answer (they need no scope)."""
    got = await client.get_prompt("hello")
    read = await client.read_resource("note://open")
    templated = await client.read_resource("note://n/seven")
    done = await client.complete(
        types.ResourceTemplateReference(type="ref/resource", uri="note://n/{id}"), {"name": "id", "value": "o"}
    )
    return [
        got.messages[0].content.text,  # type: ignore[union-attr]
        read.contents[0].text,  # type: ignore[union-attr]
        templated.contents[0].text,  # type: ignore[union-attr]
        *done.completion.values,
    ]


def _assert_refused_naming_the_scope(refused: dict[str, MCPError | None]) -> None:
    for what, exc in refused.items():
        assert exc is not None, f"{what} was answered"
        assert exc.code == INSUFFICIENT_SCOPE, (what, exc.code, exc.message)
        scope = "prompts:use" if what in ("get", "complete_prompt") else "reports:read"
        assert f"needs the OAuth scope {scope}, which the caller's token does not carry" in exc.message, exc.message
        assert exc.data == {"error": "insufficient_scope", "scope": scope, "missing": [scope]}


OPEN_ANSWERS = ["hi", "open notes", "seven", "one"]


# -- in memory ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ERAS)
async def test_in_memory_the_operator_holds_every_scope_and_an_anonymous_caller_under_trust_levels_none(mode):
    with trio.fail_after(30):
        async with open_app(_config(_doc())) as app, Client(app.server, mode=mode) as client:
            operator = await _listed(client)
            operator_reads = await client.read_resource("report://weekly")
            operator_gets = await client.get_prompt("plan")
        async with open_app(_config(_doc(trust={}))) as app, Client(app.server, mode=mode) as client:
            anonymous = await _listed(client)
            refused = await _refusals(client)
            opens = await _opens(client)
    for kind in ("prompts", "resources", "templates"):
        assert SCOPED[kind] | OPEN[kind] <= operator[kind], kind
        assert OPEN[kind] <= anonymous[kind] and not SCOPED[kind] & anonymous[kind], (kind, anonymous[kind])
    assert operator_reads.contents[0].text == "all well"  # type: ignore[union-attr]
    assert operator_gets.messages[0].content.text == "go"  # type: ignore[union-attr]
    assert "mcpipe://guide/pipelines" in anonymous["resources"]  # what no rule names is listed to everyone
    _assert_refused_naming_the_scope(refused)
    assert opens == OPEN_ANSWERS


# -- over stdio -----------------------------------------------------------------------------------------------


def _stdio(config: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "mcpipe", "serve", "--stdio", "--config", str(config)], cwd=config.parent
    )


@pytest.mark.parametrize("mode", ERAS)
async def test_over_stdio_the_same_rule_holds_in_the_served_process(mode, tmp_path):
    """stdio has no bearer: its caller is the operator (every scope) unless the config has trust levels, under
    which it is anonymous (no scope), exactly as a tool's scopes are applied."""
    operator_config, anonymous_config = tmp_path / "operator.json", tmp_path / "anonymous.json"
    operator_config.write_text(json.dumps(_doc()))
    anonymous_config.write_text(json.dumps(_doc(trust={})))
    with trio.fail_after(60):
        async with Client(_stdio(operator_config), mode=mode) as client:
            operator = await _listed(client)
            operator_reads = await client.read_resource("report://daily/tue")
        async with Client(_stdio(anonymous_config), mode=mode) as client:
            anonymous = await _listed(client)
            refused = await _refusals(client)
            opens = await _opens(client)
    for kind in ("prompts", "resources", "templates"):
        assert SCOPED[kind] | OPEN[kind] <= operator[kind], kind
        assert OPEN[kind] <= anonymous[kind] and not SCOPED[kind] & anonymous[kind], (kind, anonymous[kind])
    assert operator_reads.contents[0].text == "tue"  # type: ignore[union-attr]
    _assert_refused_naming_the_scope(refused)
    assert opens == OPEN_ANSWERS


# -- over HTTP --------------------------------------------------------------------------------------------------


@asynccontextmanager
async def _oauth_mcpipe(issuer: str) -> AsyncIterator[str]:
    doc = _doc(
        auth={
            "oidc": [{"issuer": issuer, "allow_private": True, "scope_claims": ["scope"]}],
            "resource": {"url": RESOURCE},
        }
    )
    async with open_app(_config(doc)) as app, http_server(app) as url:
        yield url


def _rpc(method: str, params: dict[str, Any], name: str) -> tuple[dict[str, Any], dict[str, str]]:
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    headers = {
        "mcp-protocol-version": "2026-07-28",
        "accept": "application/json, text/event-stream",
        "mcp-method": method,
        "mcp-name": name,
    }
    return body, headers


@pytest.mark.parametrize("mode", ERAS)
async def test_over_http_an_oauth_token_lists_what_its_scopes_allow_and_steps_up_for_the_rest(mode):
    async with auth_server() as idp, _oauth_mcpipe(idp.url) as url:
        reader = idp.mint("alice", aud=RESOURCE, scope="reports:read")
        both = idp.mint("bob", aud=RESOURCE, scope="reports:read prompts:use")
        with trio.fail_after(60):
            async with bearer_client(url, reader, mode=mode) as client:
                seen_by_reader = await _listed(client)
                read = await client.read_resource("report://weekly")
                completed = await client.complete(
                    types.ResourceTemplateReference(type="ref/resource", uri="report://daily/{day}"),
                    {"name": "day", "value": "t"},
                )
                try:
                    await client.complete(
                        types.PromptReference(type="ref/prompt", name="plan"), {"name": "x", "value": ""}
                    )
                except MCPError as exc:
                    completion_refused: MCPError | None = exc
                else:
                    completion_refused = None
            async with bearer_client(url, both, mode=mode) as client:
                seen_by_both = await _listed(client)
                got = await client.get_prompt("plan")
            body, headers = _rpc("prompts/get", {"name": "plan"}, "plan")
            async with httpx2.AsyncClient() as http:
                stepped = await http.post(url, json=body, headers={**headers, "authorization": f"Bearer {reader}"})
    assert seen_by_reader["prompts"] >= OPEN["prompts"] and "plan" not in seen_by_reader["prompts"]
    assert SCOPED["resources"] | OPEN["resources"] <= seen_by_reader["resources"]
    assert SCOPED["templates"] | OPEN["templates"] <= seen_by_reader["templates"]
    assert read.contents[0].text == "all well"  # type: ignore[union-attr]
    assert completed.completion.values == ["tue"]
    # A completion has no HTTP front check: the handler refuses it, as on every transport.
    assert completion_refused is not None and completion_refused.code == INSUFFICIENT_SCOPE
    assert "prompt 'plan' needs the OAuth scope prompts:use" in completion_refused.message
    assert "plan" in seen_by_both["prompts"]
    assert got.messages[0].content.text == "go"  # type: ignore[union-attr]
    assert stepped.status_code == 403
    challenge = stepped.headers["www-authenticate"]
    assert 'error="insufficient_scope"' in challenge and 'scope="prompts:use"' in challenge


@pytest.mark.parametrize("mode", ERAS)
async def test_over_http_a_static_tokens_scopes_hold_without_an_oauth_front(mode, monkeypatch):
    """Static tokens make mcpipe no OAuth resource server (no 403 challenge at the front): the handlers hold the
    rule, answering JSON-RPC -32003 naming the scope."""
    doc = _doc(
        auth={
            "tokens": [
                {"env": "T_NONE", "principal": "ci", "scopes": []},
                {"env": "T_ALL", "principal": "ops", "scopes": ["prompts:use", "reports:read"]},
            ]
        }
    )
    secrets = {"T_NONE": "none-t0ken", "T_ALL": "all-t0ken"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)  # the HTTP front reads the tokens from the environment
    config = _config(doc, secrets)
    with trio.fail_after(60):
        async with open_app(config) as app, http_server(app) as url:
            async with bearer_client(url, "none-t0ken", mode=mode) as client:
                narrow = await _listed(client)
                refused = await _refusals(client)
                opens = await _opens(client)
            async with bearer_client(url, "all-t0ken", mode=mode) as client:
                wide = await _listed(client)
                read = await client.read_resource("report://daily/mon")
    for kind in ("prompts", "resources", "templates"):
        assert OPEN[kind] <= narrow[kind] and not SCOPED[kind] & narrow[kind], (kind, narrow[kind])
        assert SCOPED[kind] | OPEN[kind] <= wide[kind], kind
    _assert_refused_naming_the_scope(refused)
    assert opens == OPEN_ANSWERS
    assert read.contents[0].text == "mon"  # type: ignore[union-attr]


# -- a downstream server's prompts and resources --------------------------------------------------------------


@pytest.mark.parametrize("mode", ERAS)
async def test_a_downstream_servers_prompts_and_resources_are_held_to_the_same_rule(mode):
    """The everything-server's prompts (by their prefixed names) and resources (by URI) pass through the same
    check as the config's own: listed only to a caller whose scopes allow them, refused otherwise."""
    doc = {
        "audit": {"enabled": False},
        "builtins": False,
        "trust": {},  # the in-memory caller is anonymous: no scope
        "auth": {
            "scopes": [
                {"scope": "ev:prompts", "prompts": ["ev.test_simple_*"]},
                {"scope": "ev:static", "resources": ["test://static-*", "test://template/*"]},
            ]
        },
        "mcpServers": {"ev": everything_downstream()},
    }
    with trio.fail_after(60):
        async with open_app(_config(doc)) as app, Client(app.server, mode=mode) as client:
            listed = await _listed(client)
            refused = {}
            for what, request in (
                ("prompt", client.get_prompt("ev.test_simple_prompt")),
                ("resource", client.read_resource("test://static-text")),
                ("templated", client.read_resource("test://template/42/data")),
            ):
                try:
                    await request
                except MCPError as exc:
                    refused[what] = exc
            other = await client.get_prompt("ev.test_prompt_with_arguments", {"arg1": "a", "arg2": "b"})
            watched = await client.read_resource("test://watched-resource")
    assert "ev.test_simple_prompt" not in listed["prompts"] and "ev.test_prompt_with_arguments" in listed["prompts"]
    assert not {"test://static-text", "test://static-binary"} & listed["resources"]
    assert "test://watched-resource" in listed["resources"]
    assert listed["templates"] == set()  # test://template/{id}/data falls under test://template/*
    assert set(refused) == {"prompt", "resource", "templated"}
    assert all(exc.code == INSUFFICIENT_SCOPE for exc in refused.values())
    assert "prompt 'ev.test_simple_prompt' needs the OAuth scope ev:prompts" in refused["prompt"].message
    assert "resource 'test://static-text' needs the OAuth scope ev:static" in refused["resource"].message
    assert other.messages[0].content.text == "Prompt with arguments: arg1='a', arg2='b'"  # type: ignore[union-attr]
    assert watched.contents
