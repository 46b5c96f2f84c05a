"""Who is calling, over real HTTP: JWTs of an OIDC issuer (a real provider on 127.0.0.1, its keys fetched
through discovery and cached), client certificates forwarded by a proxy, and the config's checks."""

from __future__ import annotations

import json

import httpx2
import pytest

from kit.clients import bearer_client
from kit.oauth import oauth_server
from kit.servers import http_server, make_config, running
from mcpipe.config import ConfigError, parse_config

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": META}}
MODERN = {
    "mcp-protocol-version": "2026-07-28",
    "accept": "application/json, text/event-stream",
    "mcp-method": "tools/list",
}
CALL_HEADERS = {**MODERN, "mcp-method": "tools/call", "mcp-name": "echo"}


def _oidc(issuer: str, **extra: object) -> dict[str, object]:
    return {
        "auth": {
            "oidc": [
                {
                    "issuer": issuer,
                    "audiences": ["mcpipe"],
                    "allow_private": True,
                    "group_claims": ["realm_access.groups"],
                    "scope_claims": ["scope"],
                    "attributes": {"org.tenant": "tenant"},
                    **extra,
                }
            ]
        },
        "pipelines": [{"name": "whoami", "steps": [{"id": "me", "kind": "value", "value": "${context.identity}"}]}],
    }


async def test_a_jwt_signed_by_the_issuer_identifies_the_caller_and_its_claims_reach_pipelines(tmp_path):
    async with oauth_server() as idp:
        config = make_config(**_oidc(idp.url), audit={"path": str(tmp_path / "audit.jsonl")})
        token = idp.mint("alice", scope="read write", realm_access={"groups": ["ops"]}, org={"tenant": "acme"})
        async with running(config) as app, http_server(app) as url, bearer_client(url, token) as client:
            first = await client.call_tool("whoami", {})
            second = await client.call_tool("echo", {"x": 1})
    assert not first.is_error and not second.is_error
    facts = first.structured_content
    assert facts["subject_id"] == "alice" and facts["trust_level"] == "verified" and facts["issuer"] == idp.url
    assert (
        facts["groups"] == ["ops"]
        and facts["scopes"] == ["read", "write"]
        and facts["attributes"] == {"tenant": "acme"}
    )
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert {r["principal"] for r in records} == {f"oidc:{idp.url}#alice"}
    # Discovery and the key set were fetched once, for every request after.
    assert idp.hits.get("/.well-known/openid-configuration") == 1 and idp.hits.get("/jwks") == 1


@pytest.mark.parametrize(
    "case",
    ["wrong_audience", "expired", "other_key", "hmac", "none", "garbage", "no_subject", "missing"],
)
async def test_a_token_that_does_not_verify_is_answered_401(case):
    async with oauth_server() as idp:
        import jwt

        tokens = {
            "wrong_audience": idp.mint("alice", aud="someone-else"),
            "expired": idp.mint("alice", exp_in=-120),  # past the 60 s of clock skew
            "hmac": jwt.encode(
                {"iss": idp.url, "sub": "a", "aud": "mcpipe", "exp": 2**33}, "k" * 32, algorithm="HS256"
            ),
            "none": jwt.encode({"iss": idp.url, "sub": "a", "aud": "mcpipe", "exp": 2**33}, None, algorithm="none"),
            "garbage": "not.a.jwt",
            "no_subject": idp.mint("", aud="mcpipe"),
            "missing": None,
        }
        if case == "other_key":
            forged = idp.mint("alice", kid="k1")
            idp.rotate("k1")  # the same kid, a different key: the signature no longer verifies
            tokens["other_key"] = forged
        config = make_config(**_oidc(idp.url))
        async with running(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
            token = tokens[case]
            headers = {**MODERN, **({"authorization": f"Bearer {token}"} if token else {})}
            r = await http.post(url, json=LIST, headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")


async def test_a_rotated_key_is_fetched_once_when_a_token_names_it():
    async with oauth_server() as idp:
        config = make_config(**_oidc(idp.url))
        async with running(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
            ok = await http.post(url, json=LIST, headers={**MODERN, "authorization": f"Bearer {idp.mint('a')}"})
            idp.rotate("k2")
            rotated = await http.post(url, json=LIST, headers={**MODERN, "authorization": f"Bearer {idp.mint('b')}"})
            idp.rotate("k3")
            unknown = idp.mint("c")
            idp.keys.pop("k3")  # a kid the issuer does not publish: refetching once more is rate-limited
            refused = await http.post(url, json=LIST, headers={**MODERN, "authorization": f"Bearer {unknown}"})
    assert (ok.status_code, rotated.status_code) == (200, 200) and refused.status_code == 401
    assert idp.hits["/jwks"] == 2


async def test_a_static_jwk_set_verifies_without_fetching_anything():
    async with oauth_server() as idp:
        config = make_config(
            auth={"oidc": [{"issuer": idp.url, "audiences": ["mcpipe"], "jwks": json.dumps(idp.jwks())}]}
        )
        async with running(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
            r = await http.post(url, json=LIST, headers={**MODERN, "authorization": f"Bearer {idp.mint('alice')}"})
    assert r.status_code == 200 and idp.hits == {}


async def test_an_issuer_on_a_private_address_is_refused_unless_allowed():
    async with oauth_server() as idp:
        doc = _oidc(idp.url)
        doc["auth"]["oidc"][0].pop("allow_private")  # type: ignore[index]
        async with running(make_config(**doc)) as app, http_server(app) as url, httpx2.AsyncClient() as http:
            r = await http.post(url, json=LIST, headers={**MODERN, "authorization": f"Bearer {idp.mint('alice')}"})
    assert r.status_code == 401 and idp.hits == {}


XFCC = 'By=spiffe://gw;Hash=9b2e;Subject="CN=Svc-A,O=Acme, Inc.";URI=spiffe://svc-a,By=spiffe://x;Subject="CN=proxy"'


@pytest.mark.parametrize(
    ("source", "header", "value", "principal"),
    [
        ({"kind": "xfcc", "header": "x-forwarded-client-cert"}, "x-forwarded-client-cert", XFCC, "svc-a"),
        (
            {"kind": "xfcc", "header": "x-forwarded-client-cert", "chain_position": "last"},
            "x-forwarded-client-cert",
            XFCC,
            "proxy",
        ),
        ({"kind": "dn_string", "header": "x-ssl-client-s-dn"}, "x-ssl-client-s-dn", "CN=Robot,OU=Ops", "robot"),
        ({"kind": "dn_string", "header": "x-ssl-client-s-dn"}, "x-ssl-client-s-dn", "OU=Ops", None),
        ({"kind": "dn_string", "header": "x-ssl-client-s-dn"}, "x-other", "CN=Robot", None),
    ],
)
async def test_a_client_certificate_forwarded_by_a_proxy_identifies_the_caller(
    source, header, value, principal, tmp_path
):
    mtls = {"sources": [source], "mode": "subject_cn", "identities": {"svc-a": {"roles": ["deployer"]}}}
    config = make_config(auth={"mtls": mtls}, audit={"path": str(tmp_path / "audit.jsonl")})
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {}, "_meta": META},
    }
    async with running(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
        r = await http.post(url, json=call, headers={**CALL_HEADERS, header: value})
    if principal is None:
        assert r.status_code == 401
        return
    assert r.status_code == 200 and not r.json()["result"]["isError"]
    (record,) = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert record["principal"] == f"mtls:{principal}"  # the subject in its source (mcpipe.access.Principal)


async def test_a_static_token_and_an_oidc_issuer_both_identify_callers(monkeypatch):
    monkeypatch.setenv("T_OPS", "ops-secret")
    async with oauth_server() as idp:
        doc = _oidc(idp.url)
        doc["auth"]["tokens"] = [{"env": "T_OPS", "principal": "ops"}]  # type: ignore[index]
        config = make_config({"T_OPS": "ops-secret"}, **doc)
        async with running(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
            by_token = await http.post(url, json=LIST, headers={**MODERN, "authorization": "Bearer ops-secret"})
            by_jwt = await http.post(url, json=LIST, headers={**MODERN, "authorization": f"Bearer {idp.mint('alice')}"})
            wrong = await http.post(url, json=LIST, headers={**MODERN, "authorization": "Bearer ops-secreT"})
    assert (by_token.status_code, by_jwt.status_code, wrong.status_code) == (200, 200, 401)


@pytest.mark.parametrize(
    ("section", "where", "says"),
    [
        ({"oidc": [{"issuer": "https://idp"}]}, "auth.oidc[0].audiences", "is empty"),
        ({"oidc": [{"issuer": "idp", "audiences": ["a"]}]}, "auth.oidc[0].issuer", "http:// or https://"),
        (
            {"oidc": [{"issuer": "https://i", "audiences": ["a"], "algorithms": ["HS256"]}]},
            "auth.oidc[0].algorithms[0]",
            "allow_hmac",
        ),
        (
            {"oidc": [{"issuer": "https://i", "audiences": ["a"], "clock_skew_s": 900}]},
            "auth.oidc[0].clock_skew_s",
            "at most 300",
        ),
        (
            {"oidc": [{"issuer": "https://i", "audiences": ["a"], "jwks": "{"}]},
            "auth.oidc[0].jwks",
            "not a JSON JWK Set",
        ),
        ({"mtls": {"sources": []}}, "auth.mtls.sources", "must not be empty"),
        (
            {"mtls": {"sources": [{"kind": "custom_header", "header": "x-c"}]}},
            "auth.mtls.sources[0].extraction_hint",
            "dn",
        ),
        ({"mtls": {"sources": [{"kind": "tls", "header": "x"}]}}, "auth.mtls.sources[0].kind", "invalid enum value"),
    ],
)
def test_bad_identity_config_is_refused_located(section, where, says):
    with pytest.raises(ConfigError) as err:
        parse_config(json.dumps({"auth": section}), "json", environ={})
    assert any(p.location == where and says in p.message for p in err.value.problems), err.value.problems


@pytest.mark.parametrize(
    ("identity", "key"),
    [
        ({"subject": "alice", "provider": "token"}, "alice"),
        (
            {"subject": "alice", "provider": "oidc", "issuer": "https://login.example.com"},
            "oidc:https://login.example.com#alice",
        ),
        ({"subject": "a#b:c", "provider": "oidc", "issuer": "https://i.example"}, "oidc:https://i.example#a#b:c"),
        ({"subject": "CN=x,O=y", "provider": "mtls"}, "mtls:CN=x,O=y"),
        ({"subject": "alice", "provider": "header", "trust": "header_asserted"}, "header:alice"),
    ],
)
def test_a_principal_names_the_subject_in_its_source_and_reads_back(identity, key):
    from mcpipe.access import Principal, principal_key
    from mcpipe.tools import Identity

    found = Identity(**identity)
    assert principal_key(found) == key
    assert Principal.parse(key) == Principal.of(found)


def test_a_token_principal_may_not_take_another_sources_prefix(monkeypatch):
    monkeypatch.setenv("T_X", "x")
    doc = {"audit": {"enabled": False}, "auth": {"tokens": [{"env": "T_X", "principal": "oidc:https://i#alice"}]}}
    with pytest.raises(ConfigError) as err:
        parse_config(json.dumps(doc), "json", environ={"T_X": "x"})
    (problem,) = err.value.problems
    assert problem.location == "auth.tokens[0].principal" and "starts with `oidc:`" in problem.message
