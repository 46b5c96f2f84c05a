"""No token passthrough: a caller's OAuth access token (a JWT of an ``[[auth.oidc]]`` issuer, a token an
introspection endpoint vouched for) never leaves mcpipe, whether or not ``[auth.resource]`` is set, through
``forward_bearer`` of a downstream MCP server or of an OpenAPI security scheme; a static token of
``[[auth.tokens]]`` is sent on. Real servers on 127.0.0.1: mcpipe over streamable HTTP, the authorization
server of ``kit.authserver`` (JWTs and, opaque, introspection), a recording MCP server, an OpenAPI stand-in."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from kit.authserver import auth_server
from kit.clients import bearer_client
from kit.oauth_downstream import recording_server
from kit.openapi_standin import DOCUMENTS, read, standin
from kit.servers import http_server, make_config, running

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

STATIC = "static-t0ken"
REFUSED = "forward_bearer would pass the caller's OAuth access token through"


def _auth(issuer: str, source: str, resource: bool) -> dict[str, Any]:
    auth: dict[str, Any] = {"tokens": [{"env": "STATIC", "principal": "ci"}]}
    if source == "oidc":
        auth["oidc"] = [{"issuer": issuer, "audiences": ["mcpipe"], "allow_private": True}]
    else:
        auth["introspection"] = [
            {
                "issuer": issuer,
                "client_id": "mcpipe-rs",
                "client_secret": "rs-secret",
                "audiences": ["mcpipe"],
                "allow_private": True,
            }
        ]
    if resource:
        auth["resource"] = {"url": "https://mcp.example.com/mcp"}
    return auth


@pytest.mark.parametrize("resource", [False, True], ids=["no_resource", "resource"])
@pytest.mark.parametrize("source", ["oidc", "introspection"])
async def test_forward_bearer_sends_on_a_static_token_and_never_an_oauth_one(source, resource, monkeypatch):
    monkeypatch.setenv("STATIC", STATIC)  # the HTTP front reads static tokens from the environment
    async with auth_server(opaque=source == "introspection") as idp, recording_server() as down:
        if source == "introspection":
            idp.register("mcpipe-rs", secret="rs-secret", redirect_uris=[], auth_method="client_secret_basic")
            idp.resource_servers.add("mcpipe-rs")
        token = idp.mint("alice", aud="mcpipe")
        config = make_config(
            {"STATIC": STATIC},
            auth=_auth(idp.url, source, resource),
            mcpServers={"down": {"url": down.url, "forward_bearer": True}},
        )
        with trio.fail_after(60):
            async with running(config) as app, http_server(app) as url:
                async with bearer_client(url, token) as client:
                    oauth = await client.call_tool("down.whoami", {})
                async with bearer_client(url, STATIC) as client:
                    static = await client.call_tool("down.whoami", {})
    assert oauth.is_error and REFUSED in oauth.content[0].text, oauth.content  # type: ignore[union-attr]
    assert "token_exchange" in oauth.content[0].text  # type: ignore[union-attr]
    assert not static.is_error, static.content
    assert all(token not in (seen["authorization"] or "") for seen in down.seen)  # never sent, listing included
    assert [seen["authorization"] for seen in down.calls()] == [f"Bearer {STATIC}"]  # only the static call went


async def test_an_openapi_scheme_forwarding_the_bearer_never_sends_an_oauth_token(monkeypatch):
    monkeypatch.setenv("STATIC", STATIC)
    spec = str(DOCUMENTS / "swagger-petstore-3.0.yaml")
    async with auth_server() as idp, standin(read("swagger-petstore-3.0.yaml"), prefix="/api/v3") as api:
        token = idp.mint("alice", aud="mcpipe")
        config = make_config(
            {"STATIC": STATIC},
            auth=_auth(idp.url, "oidc", False),
            openapi={"own": {"spec": spec, "base_url": api.url, "auth": {"petstore_auth": {"forward_bearer": True}}}},
        )
        with trio.fail_after(60):
            async with running(config) as app, http_server(app) as url:
                async with bearer_client(url, token) as client:
                    oauth = await client.call_tool("own.deletePet", {"petId": 1})
                async with bearer_client(url, STATIC) as client:
                    static = await client.call_tool("own.deletePet", {"petId": 2})
    assert oauth.is_error, oauth.content
    text = oauth.content[0].text  # type: ignore[union-attr]
    assert "would pass the caller's OAuth access token through" in text and "token_exchange" in text, text
    assert not static.is_error, static.content
    assert [s.headers.get("authorization") for s in api.seen] == [f"Bearer {STATIC}"]  # the OAuth call sent nothing
