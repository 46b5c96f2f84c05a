"""The document's security schemes presented from mcpipe's credentials: OAuth 2 as an OAuth client-credentials
token minted (and cached) by mcpipe, or as the caller's own bearer token; an API key from a secret."""

from __future__ import annotations

from typing import Any

import trio

from kit.clients import bearer_client
from kit.oauth import oauth_server
from kit.openapi_standin import DOCUMENTS, read, standin
from kit.servers import http_server, make_config
from mcpipe.server import open_app

SPEC = str(DOCUMENTS / "swagger-petstore-3.0.yaml")


async def test_oauth_schemes_present_a_client_credentials_token_or_the_callers_own_bearer(monkeypatch: Any) -> None:
    monkeypatch.setenv("ALICE", "alice-token")
    with trio.fail_after(60):
        async with (
            oauth_server() as idp,
            standin(read("swagger-petstore-3.0.yaml"), prefix="/api/v3") as api,
        ):
            config = make_config(
                {"ALICE": "alice-token"},
                auth={"tokens": [{"env": "ALICE", "principal": "alice"}]},
                credentials={
                    "shop": {
                        "kind": "client_credentials",
                        "token_url": idp.url + "/token",
                        "client_id": "mcpipe",
                        "client_secret": "s3cret",
                        "scopes": ["write:pets"],
                        "allow_private": True,
                    }
                },
                openapi={
                    "minted": {"spec": SPEC, "base_url": api.url, "auth": {"petstore_auth": {"credential": "shop"}}},
                    "own": {"spec": SPEC, "base_url": api.url, "auth": {"petstore_auth": {"forward_bearer": True}}},
                },
            )
            async with (
                open_app(config) as app,
                http_server(app) as url,
                bearer_client(url, "alice-token") as client,
            ):
                first = await client.call_tool("minted.deletePet", {"petId": 1})
                second = await client.call_tool("minted.deletePet", {"petId": 2})
                forwarded = await client.call_tool("own.deletePet", {"petId": 3})
    assert not (first.is_error or second.is_error or forwarded.is_error)
    minted = [s.headers.get("authorization") for s in api.seen[:2]]
    assert minted == ["Bearer cc-mcpipe-1", "Bearer cc-mcpipe-1"]  # minted once, cached
    assert [r["grant_type"] for r in idp.requests] == ["client_credentials"]
    assert api.seen[2].headers.get("authorization") == "Bearer alice-token"
    assert not api.invalid


async def test_a_scheme_the_document_lacks_or_a_credential_the_config_lacks_is_refused_located() -> None:
    from mcpipe.errors import ConfigError

    for auth, where, says in (
        ({"nope": {"credential": "k"}}, "openapi.p.auth.nope", "no security scheme `nope`"),
        ({"api_key": {"credential": "missing"}}, "openapi.p.auth.api_key.credential", "no credential `missing`"),
        ({"api_key": {}}, "openapi.p.auth.api_key", "set one of `credential` or `forward_bearer = true`"),
    ):
        try:
            config = make_config(
                {"K": "v"},
                credentials={"k": {"kind": "env", "env": "K"}},
                openapi={"p": {"spec": SPEC, "base_url": "http://127.0.0.1:9", "auth": auth}},
            )
            async with open_app(config):
                raise AssertionError("served")
        except ConfigError as exc:
            assert [(p.location, says in p.message) for p in exc.problems] == [(where, True)], exc.problems
