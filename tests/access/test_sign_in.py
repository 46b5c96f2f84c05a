"""Remote MCP clients sign in to mcpipe as the MCP authorization spec has it, end to end: the official ``mcp``
SDK's OAuth client, starting from mcpipe's 401 alone, discovers the metadata, registers at a real
authorization server (Authlib, on 127.0.0.1), signs in with PKCE, and calls ``mcp_pipe`` over streamable HTTP,
in both protocol eras; then a scope step-up, and tokens for another resource or expired (401)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
import pytest
import trio
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

from kit.authserver import AuthServer, auth_server
from kit.realservers import free_port
from kit.servers import make_config, running
from mcpipe.server import serve_http

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

REDIRECT = "http://127.0.0.1:9/callback"  # the client's own; the test plays its browser, nothing listens


class Memory:
    """The SDK's ``TokenStorage``, in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


class Browser:
    """The user's browser: opens the authorization URL (the server approves at once, for its ``user`` cookie)
    and hands the redirect's code, state and iss back to the SDK."""

    def __init__(self, user: str) -> None:
        self.user = user
        self.opened: list[str] = []
        self._result: AuthorizationCodeResult | None = None

    async def open(self, url: str) -> None:
        self.opened.append(url)
        async with httpx2.AsyncClient(follow_redirects=False, cookies={"user": self.user}) as http:
            r = await http.get(url)
        assert r.status_code == 302, r.text
        query = parse_qs(urlsplit(r.headers["location"]).query)
        self._result = AuthorizationCodeResult(
            code=query["code"][0], state=query.get("state", [None])[0], iss=query.get("iss", [None])[0]
        )

    async def callback(self) -> AuthorizationCodeResult:
        assert self._result is not None
        return self._result


@asynccontextmanager
async def mcpipe_behind(server: AuthServer, **auth: Any) -> AsyncIterator[str]:
    """mcpipe serving MCP on a free port, its resource that URL, trusting ``server``'s tokens."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    resource = {"url": url, **auth.pop("resource", {})}
    config = make_config(
        auth={
            "oidc": [{"issuer": server.url, "allow_private": True, "scope_claims": ["scope"]}],
            "resource": resource,
            **auth,
        },
        pipelines=[{"name": "write_note", "steps": [{"id": "v", "kind": "value", "value": "noted"}]}],
    )
    stop = trio.Event()
    async with running(config) as app, trio.open_nursery() as nursery:
        await nursery.start(partial(serve_http, app, host="127.0.0.1", port=port, shutdown_trigger=stop.wait))
        try:
            yield url
        finally:
            stop.set()


def signed_in_client(
    url: str, browser: Browser, storage: Memory, mode: str, sent: list[dict[str, str]] | None = None
) -> Client:
    """The SDK's client behind its OAuth provider; ``sent`` records each request it makes to ``url`` (its
    session id, its bearer)."""
    provider = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(redirect_uris=[REDIRECT], client_name="test-client"),
        storage=storage,
        redirect_handler=browser.open,
        callback_handler=browser.callback,
    )

    @asynccontextmanager
    async def transport() -> AsyncIterator[Any]:
        async with create_mcp_http_client(auth=provider) as http, streamable_http_client(url, http_client=http) as s:
            if sent is not None:

                async def record(request: httpx2.Request) -> None:
                    if str(request.url) == url and request.method == "POST":
                        headers = request.headers
                        sent.append(
                            {"session": headers.get("mcp-session-id", ""), "bearer": headers.get("authorization", "")}
                        )

                http.event_hooks = {"request": [record], "response": []}
            yield s

    return Client(transport(), mode=mode)


PIPE = {"steps": [{"id": "hi", "tool": "echo", "args": {"said": "hello"}}]}


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_the_sdks_oauth_client_signs_in_from_the_401_alone_and_calls_mcp_pipe(mode):
    async with auth_server(default_user="alice") as server, mcpipe_behind(server) as url:
        browser, storage = Browser("alice"), Memory()
        with trio.fail_after(60):
            async with signed_in_client(url, browser, storage, mode) as client:
                result = await client.call_tool("mcp_pipe", PIPE)
    assert not result.is_error, result
    assert result.structured_content["result"] == {"said": "hello"}
    # Discovery from the 401, registration, PKCE and the resource indicator, as the spec has them.
    assert len(browser.opened) == 1
    asked = parse_qs(urlsplit(browser.opened[0]).query)
    assert asked["code_challenge_method"] == ["S256"] and asked["resource"] == [url]
    assert server.registrations == 1 and storage.tokens is not None
    token_requests = [r for r in server.requests if r["path"] == "/token"]
    assert token_requests[0]["form"]["resource"] == url


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_call_needing_more_scope_steps_up_and_then_succeeds(mode):
    """The SDK's OAuth client steps up on the 403 in both eras: it is the HTTP layer's (``httpx2.Auth``), below
    the protocol; at 2025-11-25 the session the first token opened goes on with the stepped-up one (the session
    is bound to the principal, the same user with more scope)."""
    scopes = [{"scope": "notes:read", "tools": ["echo", "mcp_pipe"]}, {"scope": "notes:write", "tools": ["write_note"]}]
    async with (
        auth_server(default_user="alice", scopes_supported=["notes:read", "notes:write"]) as server,
        mcpipe_behind(server, scopes=scopes, resource={"scopes": ["notes:read"]}) as url,
    ):
        browser, storage, sent = Browser("alice"), Memory(), []
        with trio.fail_after(60):
            async with signed_in_client(url, browser, storage, mode, sent) as client:
                era = client.protocol_version
                read = await client.call_tool("echo", {"a": 1})
                first_scope = storage.tokens.scope if storage.tokens else None
                wrote = await client.call_tool("write_note", {})
                again = await client.call_tool("write_note", {})
    assert era == ("2025-11-25" if mode == "legacy" else "2026-07-28")
    assert not read.is_error and not wrote.is_error and not again.is_error
    bearers = list(dict.fromkeys(r["bearer"] for r in sent if r["bearer"]))
    assert len(bearers) == 2  # the first token, then the stepped-up one
    if mode == "legacy":  # one 2025-11-25 session throughout: the stepped-up token goes on in it
        sessions = {r["session"] for r in sent if r["session"]}
        assert len(sessions) == 1, sessions
    assert first_scope == "notes:read"
    assert len(browser.opened) == 2  # signed in, then stepped up on the 403
    stepped = parse_qs(urlsplit(browser.opened[1]).query)["scope"][0].split()
    assert "notes:write" in stepped and "notes:read" in stepped
    assert storage.tokens is not None and "notes:write" in (storage.tokens.scope or "").split()


@pytest.mark.parametrize("case", ["other_resource", "expired"])
async def test_a_token_of_this_server_for_another_resource_or_expired_is_answered_401(case):
    async with auth_server() as server, mcpipe_behind(server) as url:
        token = {
            "other_resource": server.mint("alice", aud="http://127.0.0.1:1/mcp"),
            "expired": server.mint("alice", aud=url, exp_in=-120),
        }[case]
        async with httpx2.AsyncClient() as http:
            r = await http.post(
                url,
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
                headers={"authorization": f"Bearer {token}", "accept": "application/json, text/event-stream"},
            )
    assert r.status_code == 401
    assert 'error="invalid_token"' in r.headers["www-authenticate"]
    assert "resource_metadata=" in r.headers["www-authenticate"]


async def test_opaque_tokens_of_the_server_are_checked_by_its_introspection():
    async with auth_server(opaque=True) as server:
        server.register("mcpipe-rs", secret="rs-secret", redirect_uris=[], auth_method="client_secret_basic")
        server.resource_servers.add("mcpipe-rs")
        port = free_port()
        url = f"http://127.0.0.1:{port}/mcp"
        config = make_config(
            auth={
                "introspection": [
                    {
                        "issuer": server.url,
                        "client_id": "mcpipe-rs",
                        "client_secret": "rs-secret",
                        "allow_private": True,
                    }
                ],
                "resource": {"url": url},
            }
        )
        good = server.mint("alice", aud=url)
        other = server.mint("alice", aud="http://127.0.0.1:1/mcp")
        stop = trio.Event()
        async with running(config) as app, trio.open_nursery() as nursery:
            await nursery.start(partial(serve_http, app, host="127.0.0.1", port=port, shutdown_trigger=stop.wait))
            headers = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2026-07-28"}
            body = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/list",
                "params": {
                    "_meta": {
                        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                        "io.modelcontextprotocol/clientCapabilities": {},
                    }
                },
            }
            async with httpx2.AsyncClient() as http:
                ok = await http.post(
                    url, json=body, headers={**headers, "authorization": f"Bearer {good}", "mcp-method": "tools/list"}
                )
                refused = await http.post(
                    url, json=body, headers={**headers, "authorization": f"Bearer {other}", "mcp-method": "tools/list"}
                )
            stop.set()
    assert ok.status_code == 200 and refused.status_code == 401
    assert [r["form"]["token"] for r in server.requests if r["path"] == "/introspect"] == [good, other]
