"""Outbound credentials against a real OAuth server on 127.0.0.1 (``kit.oauth``, which checks each grant as
the RFCs say): minted, cached until they expire, refreshed, presented by ``http`` steps and to downstream MCP
servers; per-caller tokens exchanged from the caller's own verified bearer."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kit.clients import bearer_client
from kit.oauth import ID_JAG, TOKEN_EXCHANGE, echo_api, oauth_server
from kit.servers import http_server, make_config, running
from mcpipe.access import ClientCredentials, CredentialError, Credentials, IdJag, TokenExchange
from mcpipe.config import ConfigError, parse_config
from mcpipe.tools import Identity

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


def _pipeline(api: str, credential: str, **step: Any) -> dict[str, Any]:
    return {
        "outbound": {"http": {"allowed_hosts": ["127.0.0.1"]}},
        "pipelines": [
            {
                "name": "fetch",
                "steps": [{"id": "get", "kind": "http", "url": f"{api}/v1/items", "credential": credential, **step}],
                "output": "${steps.get.output.body}",
            }
        ],
    }


async def test_an_http_step_presents_a_client_credentials_token_minted_once_and_cached():
    async with oauth_server() as idp, echo_api() as api:
        creds = {
            "api": {
                "kind": "client_credentials",
                "token_url": idp.url + "/token",
                "client_id": "mcpipe",
                "client_secret": "s3cret",
                "scopes": ["read", "write"],
                "allow_private": True,
            }
        }
        config = make_config(**_pipeline(api.url, "api"), credentials=creds)
        async with running(config) as app, http_server(app) as url, bearer_client(url, None) as client:
            first = await client.call_tool("fetch", {})
            second = await client.call_tool("fetch", {})
    assert first.structured_content["authorization"] == "Bearer cc-mcpipe-1"
    assert second.structured_content["authorization"] == "Bearer cc-mcpipe-1"
    (request,) = idp.requests
    assert request == {
        "grant_type": "client_credentials",
        "client_id": "mcpipe",
        "client_secret": "s3cret",
        "scope": "read write",
    }


async def test_a_credential_header_can_carry_the_token_in_another_header_and_shape():
    async with oauth_server() as idp, echo_api() as api:
        creds = {
            "api": {
                "kind": "client_credentials",
                "token_url": idp.url + "/token",
                "client_id": "mcpipe",
                "client_secret": "s3cret",
                "allow_private": True,
            }
        }
        doc = _pipeline(
            api.url, "api", credential_header="Authorization", credential_prefix="Token ", credential_suffix=";v=1"
        )
        async with (
            running(make_config(**doc, credentials=creds)) as app,
            http_server(app) as url,
            bearer_client(url, None) as client,
        ):
            r = await client.call_tool("fetch", {})
    assert r.structured_content["authorization"] == "Token cc-mcpipe-1;v=1"


async def test_a_token_is_refreshed_before_it_expires_and_the_old_one_served_when_the_refresh_fails():
    async with oauth_server(expires_in=120) as idp:
        clock = [0.0]
        cfg = ClientCredentials(
            token_url=idp.url + "/token",
            client_id="mcpipe",
            client_secret="s3cret",
            refresh_buffer_ms=60_000,
            allow_private=True,
        )
        creds = Credentials({"c": cfg}, clock=lambda: clock[0])
        a = await creds.issue("c", None)
        clock[0] = 59.0  # within the token's life minus the buffer: cached
        b = await creds.issue("c", None)
        clock[0] = 61.0  # past expiry - buffer: refreshed
        c = await creds.issue("c", None)
        idp.clients["mcpipe"] = "rotated"  # the endpoint now refuses us
        clock[0] = 61.0 + 120 + 100  # expired, refresh fails, within five minutes of grace: the old one
        d = await creds.issue("c", None)
        clock[0] = 61.0 + 120 + 400  # past the grace: the failure surfaces, with the endpoint's error code only
        with pytest.raises(CredentialError, match=r"HTTP 401 \(error: invalid_client\)") as err:
            await creds.issue("c", None)
    assert (a.token, b.token, c.token, d.token) == ("cc-mcpipe-1", "cc-mcpipe-1", "cc-mcpipe-2", "cc-mcpipe-2")
    assert "rotated" not in str(err.value) and "s3cret" not in str(err.value)
    assert len(idp.requests) == 4


async def test_a_token_exchange_sends_the_callers_own_jwt_and_caches_per_caller():
    async with oauth_server() as idp, echo_api() as api:
        creds = {
            "obo": {
                "kind": "token_exchange",
                "token_url": idp.url + "/token",
                "client_id": "mcpipe",
                "audience": "https://api.example",
                "resource": "https://api.example/v1",
                "scopes": ["items:read"],
                "allow_private": True,
            }
        }
        oidc = [{"issuer": idp.url, "audiences": ["mcpipe"], "allow_private": True}]
        config = make_config(**_pipeline(api.url, "obo"), credentials=creds, auth={"oidc": oidc})
        alice, bob = idp.mint("alice"), idp.mint("bob")
        async with running(config) as app, http_server(app) as url:
            async with bearer_client(url, alice) as client:
                a1 = await client.call_tool("fetch", {})
                a2 = await client.call_tool("fetch", {})
            async with bearer_client(url, bob) as client:
                b1 = await client.call_tool("fetch", {})
    seen = [idp.claims(r.structured_content["authorization"].removeprefix("Bearer ")) for r in (a1, a2, b1)]
    assert [(c["sub"], c["aud"], c["grant"]) for c in seen] == [("alice", "https://api.example", "exchanged")] * 2 + [
        ("bob", "https://api.example", "exchanged")
    ]
    assert [r["subject_token"] for r in idp.requests] == [alice, bob]  # one exchange per caller
    assert idp.requests[0] == {
        "grant_type": TOKEN_EXCHANGE,
        "subject_token": alice,
        "subject_token_type": "urn:ietf:params:oauth:token-type:access_token",
        "requested_token_type": "urn:ietf:params:oauth:token-type:access_token",
        "client_id": "mcpipe",
        "scope": "items:read",
        "audience": "https://api.example",
        "resource": "https://api.example/v1",
    }


async def test_an_id_jag_is_exchanged_at_the_idp_then_redeemed_at_the_upstream():
    async with oauth_server() as idp:
        cfg = IdJag(
            idp_token_url=idp.url + "/token",
            client_id="mcpipe",
            client_secret="s3cret",
            audience=idp.url,  # the upstream authorization server (here the same server)
            resource="https://mcp.partner.example",
            scopes=["tools:invoke"],
            redeem_token_url=idp.url + "/token",
            redeem_client_id="mcpipe-partner",
            allow_private=True,
        )
        creds = Credentials({"partner": cfg})
        caller = Identity("alice", token=idp.mint("alice"))
        issued = await creds.issue("partner", caller)
    exchange, redeem = idp.requests
    assert exchange["grant_type"] == TOKEN_EXCHANGE and exchange["requested_token_type"] == ID_JAG
    assert exchange["audience"] == idp.url and exchange["resource"] == "https://mcp.partner.example"
    assert (
        redeem["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer"
        and redeem["client_id"] == "mcpipe-partner"
    )
    assert idp.claims(redeem["assertion"])["sub"] == "alice"
    claims = idp.claims(issued.token)
    assert (claims["sub"], claims["grant"], claims["aud"]) == ("alice", "redeemed", "https://mcp.partner.example")


async def test_an_idp_that_does_not_issue_an_id_jag_is_refused():
    async with oauth_server() as idp:
        cfg = IdJag(
            idp_token_url=idp.url + "/token",
            client_id="mcpipe",
            audience=idp.url,
            redeem_token_url=idp.url + "/token",
            allow_private=True,
        )

        def plain(form: dict[str, str]) -> tuple[int, dict[str, Any]]:
            return 200, {
                "access_token": "x",
                "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
                "token_type": "Bearer",
            }

        idp.token = plain  # type: ignore[method-assign]
        with pytest.raises(CredentialError, match="did not issue an ID-JAG"):
            await Credentials({"p": cfg}).issue("p", Identity("alice", token=idp.mint("alice")))


@pytest.mark.parametrize(
    ("identity", "says"),
    [
        (None, "needs a verified caller, not no identity"),
        (Identity("svc", trust="header_asserted", provider="mtls"), "not a header_asserted identity"),
        (Identity("alice"), "presented none"),
    ],
)
async def test_a_per_caller_credential_needs_a_verified_caller_with_a_bearer(identity, says):
    cfg = TokenExchange(token_url="http://127.0.0.1:9/token", client_id="mcpipe", allow_private=True)
    with pytest.raises(CredentialError, match=says):
        await Credentials({"obo": cfg}).issue("obo", identity)


async def test_a_step_whose_credential_cannot_be_issued_fails_with_the_reason(monkeypatch):
    async with oauth_server() as idp, echo_api() as api:
        creds = {
            "api": {
                "kind": "client_credentials",
                "token_url": idp.url + "/token",
                "client_id": "mcpipe",
                "client_secret": "wrong",
                "allow_private": True,
            }
        }
        async with (
            running(make_config(**_pipeline(api.url, "api"), credentials=creds)) as app,
            http_server(app) as url,
            bearer_client(url, None) as client,
        ):
            r = await client.call_tool("fetch", {})
    assert r.is_error and "credential `api`" in r.content[0].text and "invalid_client" in r.content[0].text
    assert api.seen == []  # the request was never sent without its credential


async def test_a_downstream_server_gets_the_shared_token_and_each_callers_exchanged_one(monkeypatch, tmp_path):
    """The downstream is another mcpipe: a service token lets mcpipe list its tools, and each call carries
    the caller's own exchanged token, which the downstream verifies against the same issuer."""
    monkeypatch.setenv("T_SVC", "cc-mcpipe-1")
    async with oauth_server() as idp:
        down_config = make_config(
            {"T_SVC": "cc-mcpipe-1"},
            auth={
                "tokens": [{"env": "T_SVC", "principal": "svc"}],
                "oidc": [{"issuer": idp.url, "audiences": ["down"], "allow_private": True}],
            },
            audit={"path": str(tmp_path / "down.jsonl")},
        )
        async with running(down_config) as down, http_server(down) as down_url:
            creds = {
                "svc": {
                    "kind": "client_credentials",
                    "token_url": idp.url + "/token",
                    "client_id": "mcpipe",
                    "client_secret": "s3cret",
                    "allow_private": True,
                },
                "obo": {
                    "kind": "token_exchange",
                    "token_url": idp.url + "/token",
                    "client_id": "mcpipe",
                    "audience": "down",
                    "allow_private": True,
                },
            }
            up_config = make_config(
                auth={"oidc": [{"issuer": idp.url, "audiences": ["mcpipe"], "allow_private": True}]},
                credentials=creds,
                mcpServers={
                    "shared": {"url": down_url, "credential": "svc", "protocol": "2026-07-28"},
                    "mine": {
                        "url": down_url,
                        "credential": "obo",
                        "headers": {"Authorization": "Bearer cc-mcpipe-1"},
                        "protocol": "2026-07-28",
                    },
                },
            )
            async with (
                running(up_config) as up,
                http_server(up) as up_url,
                bearer_client(up_url, idp.mint("alice")) as client,
            ):
                shared = await client.call_tool("shared.echo", {"x": 1})
                mine = await client.call_tool("mine.echo", {"y": 2})
    assert not shared.is_error and not mine.is_error
    calls = [json.loads(line) for line in (tmp_path / "down.jsonl").read_text().splitlines()]
    assert [(r["tool"], r["principal"]) for r in calls] == [("echo", "svc"), ("echo", f"oidc:{idp.url}#alice")]


@pytest.mark.parametrize(
    ("creds", "where", "says"),
    [
        (
            {"a": {"kind": "client_credentials", "token_url": "ftp://x", "client_id": "c", "client_secret": "s"}},
            "credentials.a.token_url",
            "http:// or https://",
        ),
        (
            {"a": {"kind": "client_credentials", "token_url": "https://x", "client_id": "c"}},
            "credentials.a.client_secret",
            "is required",
        ),
        (
            {
                "a": {
                    "kind": "client_credentials",
                    "token_url": "https://x",
                    "client_id": "c",
                    "client_secret_env": "NOPE",
                }
            },
            "credentials.a.client_secret_env",
            "not set",
        ),
        (
            {
                "a": {
                    "kind": "id_jag",
                    "idp_token_url": "https://i",
                    "client_id": "c",
                    "audience": "",
                    "redeem_token_url": "https://r",
                }
            },
            "credentials.a.audience",
            "must not be empty",
        ),
        (
            {
                "a": {
                    "kind": "id_jag",
                    "idp_token_url": "https://i",
                    "client_id": "c",
                    "audience": "x",
                    "redeem_token_url": "https://r",
                    "redeem_client_secret": "s",
                }
            },
            "credentials.a.redeem_client_secret",
            "redeem_client_id",
        ),
        ({"a": {"kind": "env", "env": "NOPE"}}, "credentials.a.env", "not set"),
        ({"a": {"kind": "saml"}}, "credentials.a.kind", "invalid value"),
    ],
)
def test_bad_credentials_are_refused_located(creds, where, says):
    with pytest.raises(ConfigError) as err:
        parse_config(json.dumps({"credentials": creds}), "json", environ={})
    assert any(p.location == where and says in p.message for p in err.value.problems), err.value.problems


def test_a_step_or_server_naming_an_unknown_credential_is_refused_located():
    doc = {
        "outbound": {"http": {"allowed_hosts": ["*"]}},
        "pipelines": [
            {"name": "p", "steps": [{"id": "a", "kind": "http", "url": "https://x.example/", "credential": "nope"}]}
        ],
        "mcpServers": {"d": {"url": "https://d.example/mcp", "credential": "nope"}},
    }
    with pytest.raises(ConfigError) as err:
        parse_config(json.dumps(doc), "json", environ={})
    where = {p.location for p in err.value.problems}
    assert {"mcpServers.d.credential", "pipelines.p.steps[0].credential"} <= where, err.value.problems


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("error: s3cret+v/al", "error: [redacted]"),
        ("error: s3cret%2Bv%2Fal", "error: [redacted]"),  # as a form or a URL encodes it
        ('{"got": "s3cret+v/al"}', '{"got": "[redacted]"}'),
        ("nothing here", "nothing here"),
    ],
)
def test_a_secret_is_redacted_in_every_spelling_an_echo_takes(text, expected):
    from mcpipe._redact import redact

    assert redact(text, ["s3cret+v/al", None, "ab"]) == expected
