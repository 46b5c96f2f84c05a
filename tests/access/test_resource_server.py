"""mcpipe as an OAuth 2.1 resource server, over real HTTP: protected resource metadata (RFC 9728) at both
well-known URIs, the 401 and 403 challenges, the audience rule (RFC 8707), opaque tokens by introspection
(RFC 7662, a real endpoint on 127.0.0.1), and scopes per tool on every path."""

from __future__ import annotations

from typing import Any

import httpx2
import pytest
import trio

from kit.clients import bearer_client
from kit.llm import _answer, _body, lifespan, serving
from kit.oauth import oauth_server
from kit.oauth_downstream import recording_server
from kit.servers import http_server, make_config, running

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
HEADERS = {"mcp-protocol-version": "2026-07-28", "accept": "application/json, text/event-stream"}


def _call(name: str, arguments: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments or {}, "_meta": META},
    }
    return body, {**HEADERS, "mcp-method": "tools/call", "mcp-name": name}


def _challenge(header: str) -> dict[str, str]:
    """The parameters of a ``Bearer`` challenge."""
    assert header.startswith("Bearer ")
    out = {}
    for part in header[len("Bearer ") :].split('", '):
        key, _, value = part.partition("=")
        out[key.strip()] = value.strip().strip('"')
    return out


def _oidc_config(issuer: str, **auth: Any) -> dict[str, Any]:
    return {
        "auth": {
            "oidc": [{"issuer": issuer, "allow_private": True, "scope_claims": ["scope"]}],
            "resource": {"url": "https://mcp.example.com/mcp", "documentation": "https://docs.example.com/mcp"},
            **auth,
        },
        "pipelines": [
            {"name": "report", "steps": [{"id": "e", "kind": "tool", "tool": "echo", "args": {"x": 1}}]},
        ],
    }


async def test_protected_resource_metadata_is_served_at_the_path_aware_and_the_root_well_known_uris():
    async with oauth_server() as idp:
        config = make_config(**_oidc_config(idp.url, scopes=[{"scope": "files:read", "tools": ["echo"]}]))
        async with running(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
            base = url.rsplit("/", 1)[0]
            docs = [
                (await http.get(base + p))
                for p in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource")
            ]
            missing = await http.get(url)
    for r in docs:
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
        assert r.json() == {
            "resource": "https://mcp.example.com/mcp",
            "authorization_servers": [idp.url],
            "bearer_methods_supported": ["header"],
            "resource_name": "mcpipe",
            "scopes_supported": ["files:read"],
            "resource_documentation": "https://docs.example.com/mcp",
        }
    assert missing.status_code == 401
    challenge = _challenge(missing.headers["www-authenticate"])
    assert challenge == {
        "resource_metadata": "https://mcp.example.com/.well-known/oauth-protected-resource/mcp",
        "scope": "files:read",
    }


async def test_without_a_configured_url_the_resource_is_the_endpoint_the_client_reached():
    async with oauth_server() as idp:
        config = make_config(auth={"oidc": [{"issuer": idp.url, "audiences": ["mcpipe"], "allow_private": True}]})
        async with running(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
            base = url.rsplit("/", 1)[0]
            doc = (await http.get(base + "/.well-known/oauth-protected-resource/mcp")).json()
            first = await http.post(url, json={}, headers=HEADERS)
    assert doc["resource"] == url and doc["authorization_servers"] == [idp.url] and "scopes_supported" not in doc
    assert _challenge(first.headers["www-authenticate"]) == {
        "resource_metadata": base + "/.well-known/oauth-protected-resource/mcp"
    }


@pytest.mark.parametrize("case", ["expired", "wrong_audience", "garbage"])
async def test_a_token_that_does_not_verify_gets_401_invalid_token_with_the_metadata(case):
    async with oauth_server() as idp:
        token = {
            "expired": idp.mint("alice", aud="https://mcp.example.com/mcp", exp_in=-600),
            "wrong_audience": idp.mint("alice", aud="https://other.example.com/mcp"),
            "garbage": "not-a-token",
        }[case]
        async with running(make_config(**_oidc_config(idp.url))) as app, http_server(app) as url:
            body, headers = _call("echo")
            async with httpx2.AsyncClient() as http:
                r = await http.post(url, json=body, headers={**headers, "authorization": f"Bearer {token}"})
    assert r.status_code == 401 and r.json()["error"] == "invalid_token"
    challenge = _challenge(r.headers["www-authenticate"])
    assert challenge["error"] == "invalid_token"
    assert challenge["resource_metadata"] == "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"


async def test_a_token_for_this_resource_is_accepted_when_the_issuer_names_no_audiences():
    async with oauth_server() as idp:
        token = idp.mint("alice", aud="https://mcp.example.com/mcp")
        async with (
            running(make_config(**_oidc_config(idp.url))) as app,
            http_server(app) as url,
            bearer_client(url, token) as client,
        ):
            result = await client.call_tool("echo", {"x": 1})
    assert not result.is_error


SCOPED = [
    {"scope": "files:read", "tools": ["echo", "report"]},
    {"scope": "files:write", "tools": ["now"]},
]


async def test_a_call_needing_a_scope_the_token_lacks_gets_403_insufficient_scope_naming_it():
    async with oauth_server() as idp:
        token = idp.mint("alice", aud="https://mcp.example.com/mcp", scope="files:read")
        async with (
            running(make_config(**_oidc_config(idp.url, scopes=SCOPED))) as app,
            http_server(app) as url,
            httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}) as http,
        ):
            answers = {}
            for name, args in (("echo", {"x": 1}), ("now", {})):
                body, headers = _call(name, args)
                answers[name] = await http.post(url, json=body, headers=headers)
            spec = {"steps": [{"id": "a", "tool": "echo", "args": {"x": 1}}, {"id": "b", "tool": "now", "args": {}}]}
            body, headers = _call("mcp_pipe", spec)
            answers["pipe"] = await http.post(url, json=body, headers=headers)
    assert answers["echo"].status_code == 200
    for name in ("now", "pipe"):
        r = answers[name]
        assert r.status_code == 403, name
        challenge = _challenge(r.headers["www-authenticate"])
        assert challenge["error"] == "insufficient_scope"
        assert challenge["resource_metadata"] == "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"
        assert "files:write" in challenge["scope"].split()
    assert _challenge(answers["pipe"].headers["www-authenticate"])["scope"] == "files:read files:write"


async def test_tools_list_shows_a_caller_only_the_tools_its_scopes_allow():
    async with oauth_server() as idp:
        reader = idp.mint("alice", aud="https://mcp.example.com/mcp", scope="files:read")
        nobody = idp.mint("bob", aud="https://mcp.example.com/mcp", scope="")
        config = make_config(**_oidc_config(idp.url, scopes=SCOPED))
        async with running(config) as app, http_server(app) as url:
            seen = {}
            for who, token in (("alice", reader), ("bob", nobody)):
                async with bearer_client(url, token) as client:
                    seen[who] = {t.name for t in (await client.list_tools()).tools}
    assert {"echo", "report"} <= seen["alice"] and "now" not in seen["alice"]
    assert not {"echo", "report", "now"} & seen["bob"]
    assert "mcp_pipe" in seen["bob"]


async def test_every_pipeline_path_is_refused_before_running_naming_the_missing_scope():
    """mcp_pipe (through the gateway, where no HTTP front checked it), a declared pipeline reaching a scoped
    tool, a background run and a task are each refused before any step runs."""
    from mcpipe.gateway import AuditLog
    from mcpipe.tools import Identity, ToolContext
    from mcpipe.tools._base import Request

    config = make_config(
        {"T": "t0ken"},
        auth={
            "tokens": [{"env": "T", "principal": "ci", "scopes": ["files:read"]}],
            "scopes": [{"scope": "files:read", "tools": ["echo"]}, {"scope": "files:write", "tools": ["now"]}],
        },
        pipelines=[
            {"name": "adder", "steps": [{"id": "s", "kind": "tool", "tool": "now", "args": {}}]},
            {"name": "later", "background": True, "steps": [{"id": "s", "kind": "tool", "tool": "now", "args": {}}]},
        ],
    )
    identity = Identity(subject="ci", provider="token", scopes=("files:read",))
    async with running(config, audit=AuditLog(None, keep=True)) as app:
        handlers = app.handlers
        gateway = app.gateway

        def ctx() -> ToolContext:
            return ToolContext(principal="ci", request=Request(identity=identity), tools=gateway)

        spec = {"steps": [{"id": "a", "tool": "echo", "args": {"x": 1}}, {"id": "b", "tool": "now", "args": {}}]}
        piped = await handlers.call("mcp_pipe", spec, ctx())
        declared = await handlers.call("adder", {}, ctx())
        background = await handlers.call("mcp_pipe", {**spec, "background": True}, ctx())
        later = await handlers.call("later", {}, ctx())
        assert handlers.tasks is not None
        task = await handlers.create_task("mcp_pipe", spec, ctx())
        nested = await handlers.call(
            "mcp_pipe", {"steps": [{"id": "a", "tool": "echo", "args": {"x": 1}}, {"id": "b", "tool": "adder"}]}, ctx()
        )
    for answer in (piped, background, task, nested):
        text = answer["content"][0]["text"]
        assert "needs the OAuth scope files:write" in text, text
        assert answer["structuredContent"]["summary"]["total"] == 0 or "problems" in answer["structuredContent"]
    assert "needs the OAuth scope files:write" in declared["content"][0]["text"]
    assert "needs the OAuth scope files:write" in later["content"][0]["text"]
    # Nothing ran: the audit of the gateway saw no call of echo.
    assert gateway.audit.records is not None
    assert not [r for r in gateway.audit.records if r["tool"] == "echo" and r["ok"]]


# -- opaque tokens: RFC 7662 introspection ----------------------------------------------------------------


class Introspector:
    """An RFC 7662 endpoint on 127.0.0.1: tokens by value, client ``rs``/``rs-secret`` by HTTP Basic."""

    def __init__(self) -> None:
        self.url = ""
        self.tokens: dict[str, dict[str, Any]] = {}
        self.requests: list[dict[str, str]] = []
        self.hang = trio.Event()
        self.hanging = False
        self.flood = False

    def app(self) -> Any:
        import base64
        from urllib.parse import parse_qsl

        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                await lifespan(receive, send)
                return
            headers = {k.decode(): v.decode() for k, v in scope["headers"]}
            form = dict(parse_qsl((await _body(receive)).decode()))
            self.requests.append(form)
            if headers.get("authorization") != "Basic " + base64.b64encode(b"rs:rs-secret").decode():
                await _answer(send, 401, {"error": "invalid_client"})
                return
            if self.hanging:
                await self.hang.wait()
            if self.flood:
                await _answer(send, 200, b'{"active": true, "pad": "' + b"x" * (3 * 1024 * 1024) + b'"}')
                return
            await _answer(send, 200, self.tokens.get(form.get("token", ""), {"active": False}))

        return app


def _introspection_config(endpoint: str, **extra: Any) -> dict[str, Any]:
    return {
        "auth": {
            "introspection": [
                {
                    "issuer": "https://as.example.com",
                    "endpoint": endpoint,
                    "client_id": "rs",
                    "client_secret": "rs-secret",
                    "allow_private": True,
                    **extra,
                }
            ],
            "resource": {"url": "https://mcp.example.com/mcp"},
        }
    }


def _active(sub: str, *, aud: str = "https://mcp.example.com/mcp", exp_in: float = 600, **more: Any) -> dict[str, Any]:
    import time

    return {"active": True, "sub": sub, "aud": aud, "exp": int(time.time() + exp_in), "scope": "a b", **more}


async def test_an_opaque_token_is_introspected_once_and_its_answer_cached():
    endpoint = Introspector()
    endpoint.tokens["opaque-1"] = _active("alice", iss="https://as.example.com")
    async with serving(endpoint.app()) as base:
        config = make_config(**_introspection_config(base + "/introspect"))
        async with running(config) as app, http_server(app) as url, bearer_client(url, "opaque-1") as client:
            first = await client.call_tool("echo", {"x": 1})
            second = await client.call_tool("echo", {"x": 2})
    assert not first.is_error and not second.is_error
    assert [r["token"] for r in endpoint.requests] == ["opaque-1"]


@pytest.mark.parametrize("case", ["inactive", "other_resource", "expired", "other_issuer"])
async def test_an_opaque_token_the_endpoint_does_not_vouch_for_this_resource_gets_401(case):
    endpoint = Introspector()
    endpoint.tokens["t"] = {
        "inactive": {"active": False},
        "other_resource": _active("alice", aud="https://other.example.com/mcp"),
        "expired": _active("alice", exp_in=-5),
        "other_issuer": _active("alice", iss="https://evil.example.com"),
    }[case]
    async with serving(endpoint.app()) as base:
        config = make_config(**_introspection_config(base + "/introspect"))
        async with running(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
            body, headers = _call("echo")
            r = await http.post(url, json=body, headers={**headers, "authorization": "Bearer t"})
    assert r.status_code == 401 and _challenge(r.headers["www-authenticate"])["error"] == "invalid_token"


async def test_a_cached_introspection_answer_lives_no_longer_than_its_token():
    from mcpipe.access import IntrospectionProvider
    from mcpipe.access._introspect import Introspection

    endpoint = Introspector()
    endpoint.tokens["short"] = _active("alice", exp_in=10)
    now = [1000.0]
    async with serving(endpoint.app()) as base:
        cfg = IntrospectionProvider(
            issuer="https://as.example.com", endpoint=base, client_id="rs", allow_private=True, any_audience=True
        )
        intro = Introspection(cfg, [], "rs-secret", clock=lambda: now[0])
        assert (await intro.check("short")).subject == "alice"
        now[0] += 1
        await intro.check("short")
        assert len(endpoint.requests) == 1
        now[0] += 10  # past the token's own exp (10 s), well inside cache_s (300 s)
        endpoint.tokens["short"] = {"active": False}
        assert isinstance(await intro.check("short"), str)
    assert len(endpoint.requests) == 2


async def test_introspection_keeps_a_bounded_number_of_tokens_per_principal():
    from mcpipe.access import IntrospectionProvider
    from mcpipe.access._introspect import Introspection

    endpoint = Introspector()
    for i in range(40):
        endpoint.tokens[f"mallory-{i}"] = _active("mallory")
    endpoint.tokens["alice"] = _active("alice")
    async with serving(endpoint.app()) as base:
        cfg = IntrospectionProvider(
            issuer="https://as.example.com",
            endpoint=base,
            client_id="rs",
            allow_private=True,
            any_audience=True,
            max_per_principal=4,
        )
        intro = Introspection(cfg, [], "rs-secret")
        await intro.check("alice")
        for i in range(40):
            await intro.check(f"mallory-{i}")
        before = len(endpoint.requests)
        await intro.check("alice")  # still cached: mallory's 40 tokens did not push it out
    assert intro.cached() == 5 and len(endpoint.requests) == before


async def test_introspection_that_hangs_or_floods_answers_503_or_401_at_once_and_holds_no_caller():
    endpoint = Introspector()
    endpoint.tokens["t"] = _active("alice")
    async with serving(endpoint.app()) as base:
        config = make_config(**_introspection_config(base + "/introspect", timeout_ms=300, max_in_flight=1))
        async with running(config) as app, http_server(app) as url, httpx2.AsyncClient(timeout=30) as http:
            body, headers = _call("echo")
            endpoint.hanging = True
            statuses: list[int] = []

            async def one(token: str) -> None:
                r = await http.post(url, json=body, headers={**headers, "authorization": f"Bearer {token}"})
                statuses.append(r.status_code)

            with trio.fail_after(20):
                async with trio.open_nursery() as nursery:
                    for i in range(5):
                        nursery.start_soon(one, f"t{i}")
            endpoint.hanging = False
            endpoint.hang.set()
            endpoint.flood = True
            flooded = await http.post(url, json=body, headers={**headers, "authorization": "Bearer t"})
    # One request waited out its timeout (503); the four others found the endpoint busy (503) at once.
    assert statuses == [503] * 5
    assert len([r for r in endpoint.requests if r["token"].startswith("t")]) <= 2
    assert flooded.status_code == 503  # an answer past 1 MB is no answer: unavailable, not cached


async def test_a_callers_oauth_token_is_never_passed_through_to_a_downstream_server():
    async with oauth_server() as idp, recording_server() as down:
        token = idp.mint("alice", aud="https://mcp.example.com/mcp")
        config = make_config(**_oidc_config(idp.url), mcpServers={"down": {"url": down.url, "forward_bearer": True}})
        async with running(config) as app, http_server(app) as url, bearer_client(url, token) as client:
            result = await client.call_tool("down.whoami", {})
    assert result.is_error and "forward_bearer would pass the caller's OAuth access token" in result.content[0].text
    assert all(token not in (seen["authorization"] or "") for seen in down.seen)
    assert not down.calls()


async def test_mcpgs_required_scopes_hold_for_a_tool_a_declared_pipeline_reaches_before_it_runs():
    from mcpipe.tools import Identity, ToolContext
    from mcpipe.tools._base import Request

    config = make_config(
        trust={"default_minimum_trust": "verified", "tools": {"now": {"required_scopes": ["clock:read"]}}},
        pipelines=[
            {
                "name": "stamped",
                "steps": [
                    {"id": "e", "kind": "tool", "tool": "echo", "args": {"x": 1}},
                    {"id": "t", "kind": "tool", "tool": "now", "args": {}},
                ],
            }
        ],
    )
    without = Identity(subject="ci", provider="oidc", scopes=())
    with_scope = Identity(subject="ci", provider="oidc", scopes=("clock:read",))
    async with running(config) as app:
        gateway = app.gateway

        def ctx(identity: Identity) -> ToolContext:
            return ToolContext(principal="ci", request=Request(identity=identity), tools=gateway)

        refused = await app.handlers.call("stamped", {}, ctx(without))
        allowed = await app.handlers.call("stamped", {}, ctx(with_scope))
        listed = {t["name"] for t in app.handlers.visible_tools("ci", without)}
    assert "needs the OAuth scope clock:read" in refused["content"][0]["text"]
    assert not allowed.get("isError")
    assert "stamped" not in listed and "now" not in listed and "echo" in listed


async def test_a_prompt_or_resource_needing_a_scope_the_token_lacks_gets_403_with_the_scope():
    async with oauth_server() as idp:
        token = idp.mint("alice", aud="https://mcp.example.com/mcp", scope="files:read")
        config = make_config(
            auth={
                "oidc": [{"issuer": idp.url, "allow_private": True, "scope_claims": ["scope"]}],
                "resource": {"url": "https://mcp.example.com/mcp"},
                "scopes": [
                    {"scope": "prompts:use", "prompts": ["plan"]},
                    {"scope": "reports:read", "resources": ["report://*"]},
                ],
            },
            pipelines=[
                {"name": "plan", "surface": "prompt", "steps": [{"kind": "value", "id": "v", "value": "go"}]},
                {
                    "name": "weekly",
                    "surface": "resource",
                    "uri": "report://weekly",
                    "steps": [{"kind": "value", "id": "v", "value": "ok"}],
                },
            ],
        )
        async with (
            running(config) as app,
            http_server(app) as url,
            httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}) as http,
        ):
            answers = []
            for method, params, name in (
                ("prompts/get", {"name": "plan"}, "plan"),
                ("resources/read", {"uri": "report://weekly"}, "report://weekly"),
            ):
                body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": META}}
                headers = {**HEADERS, "mcp-method": method, "mcp-name": name}
                answers.append(await http.post(url, json=body, headers=headers))
    for r, scope in zip(answers, ("prompts:use", "reports:read"), strict=True):
        assert r.status_code == 403
        assert _challenge(r.headers["www-authenticate"])["scope"] == scope
