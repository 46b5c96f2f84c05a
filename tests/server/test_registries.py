"""The servers an MCP registry lists are served as downstream servers (``registries``), over real transports:
a registry and the MCP server it lists, both HTTPS on 127.0.0.1 (``kit.registry``), read and called by mcpipe
serving streamable HTTP. What it lists (pages followed, pins, filters, URL variables and headers) comes and goes
with it; the guards it names are kept: trust levels, the caller's own bearer, credentials, OAuth discovery."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import trio
from mcp.shared.exceptions import MCPError

from kit.clients import bearer_client
from kit.oauth import oauth_server
from kit.registry import Registry, Upstream, calls, entry, self_signed, serving_tls
from kit.servers import http_server
from mcpipe.config import ConfigError, parse_config
from mcpipe.server import open_app

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


def _config(doc: dict[str, Any], environ: dict[str, str] | None = None) -> Any:
    return parse_config(json.dumps({"audit": {"enabled": False}, "builtins": False, **doc}), "json", environ=environ)


def _names(listing: Any) -> list[str]:
    return sorted(t.name for t in listing.tools if "." in t.name)  # the registry servers' (not mcpipe's own)


async def _connected(app: Any) -> None:
    """Wait until every server the registries brought tried to connect (they connect in the background)."""
    for server in app.downstreams.servers:
        await server.first_attempt()


class Heard:
    def __init__(self) -> None:
        self.changed = trio.Event()

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.changed.set()


@pytest.fixture
def cert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A self-signed certificate for 127.0.0.1 that mcpipe's HTTP clients trust (``SSL_CERT_FILE``)."""
    made = self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(made))
    return made


async def test_the_servers_a_registry_lists_are_served_as_it_lists_them(cert: Path) -> None:
    upstream, registry = Upstream(), Registry()
    async with serving_tls(upstream.app(), cert) as up, serving_tls(registry.app(), cert) as reg_url:
        url = f"{up}/{{tenant}}/mcp"
        registry.entries = [
            entry("com.acme/crm", "2.4.0", url=url, variables={"tenant": {"isRequired": True}}),
            entry(
                "com.acme/crm",
                "2.3.1",
                url=f"{up}/{{tenant}}/v231/mcp",
                latest=False,
                variables={"tenant": {"isRequired": True}},
                headers=[{"name": "X-API-Key", "isRequired": True}],
            ),
            entry("com.acme/old", url=f"{up}/mcp", status="deleted"),
            entry("com.acme/experimental-x", url=f"{up}/mcp"),
            entry("org.evil/crm", url=f"{up}/mcp"),
            entry("com.acme/pkg", packages=True),
            entry("com.acme/keyless", url=f"{up}/mcp", headers=[{"name": "X-Key", "isRequired": True}]),
            entry("com.acme/plain", url="http://127.0.0.1:9/mcp"),
            entry("com.acme/docs", url=f"{up}/docs/mcp", headers=[{"name": "X-Lang", "default": "en"}]),
        ]
        doc = {
            "registries": [
                {
                    "name": "acme",
                    "url": reg_url,
                    "allow_private": True,
                    "allow_private_servers": True,
                    "headers": {"Authorization": "Bearer reg-token"},
                    "namespaces": ["com.acme"],
                    "exclude": ["com.acme/experimental-*"],
                    "servers": {
                        "com.acme/crm": {
                            "version": "2.3.1",
                            "variables": {"tenant": "acme-prod"},
                            "headers": {"X-API-Key": "k-1"},
                        }
                    },
                }
            ]
        }
        heard = Heard()
        with trio.fail_after(60):
            async with (
                open_app(_config(doc)) as app,
                http_server(app) as mcp_url,
                bearer_client(mcp_url, None, mode="legacy", message_handler=heard) as client,
            ):
                await app.registries.synced.wait()
                await _connected(app)
                listed = _names(await client.list_tools())
                crm = await client.call_tool("com.acme.crm.whoami", {})
                await client.call_tool("com.acme.docs.whoami", {})
                skipped = await app.registries.sync(app.config.registries[0])

                # The registry deletes the pinned version: its server goes, and the client is told.
                registry.entries[1]["_meta"]["io.modelcontextprotocol.registry/official"]["status"] = "deleted"
                await app.registries.sync(app.config.registries[0])
                await heard.changed.wait()
                after = _names(await client.list_tools())
    assert listed == ["com.acme.crm.whoami", "com.acme.docs.whoami"]
    assert not crm.is_error and crm.content[0].text == "crm"  # type: ignore[union-attr]
    by_path = {h["path"]: h for h in calls(upstream)}
    # The pinned version's URL, its variable and declared header given by the operator; a default kept.
    assert by_path["/acme-prod/v231/mcp"]["x-api-key"] == "k-1"
    assert by_path["/docs/mcp"]["x-lang"] == "en"
    assert skipped == {
        "com.acme/old": "deleted",
        "com.acme/pkg": "no_usable_remote: no streamable-http remote",
        "com.acme/keyless": "missing_input: header `X-Key`",
        "com.acme/plain": "no_usable_remote: http://127.0.0.1:9/mcp is not an https URL",
    }
    lists = [r for r in registry.requests if r["path"] == "/v0.1/servers"]
    # Every page read (8 latest entries, 2 a page), each time.
    assert [r["query"].get("cursor") for r in lists[:5]] == [None, "2", "4", "6", None]
    assert {r["authorization"] for r in registry.requests} == {"Bearer reg-token"}
    assert after == ["com.acme.docs.whoami"]


async def test_a_registry_server_at_a_private_address_is_left_out_unless_allowed(cert: Path) -> None:
    upstream, registry = Upstream(), Registry()
    async with serving_tls(upstream.app(), cert) as up, serving_tls(registry.app(), cert) as reg_url:
        registry.entries = [entry("com.acme/crm", url=f"{up}/mcp")]
        doc = {"registries": [{"name": "acme", "url": reg_url, "allow_private": True}]}
        with trio.fail_after(30):
            async with open_app(_config(doc)) as app:
                await app.registries.synced.wait()
                skipped = await app.registries.sync(app.config.registries[0])
            # The registry itself at a private address: read only with allow_private (nothing served, logged).
            doc["registries"][0]["allow_private"] = False
            async with open_app(_config(doc)) as app:
                await app.registries.synced.wait()
                assert not app.downstreams.servers
    assert skipped == {"com.acme/crm": "private_address: 127.0.0.1 is not a public address (allow_private_servers)"}
    assert upstream.seen == []
    assert len(registry.requests) == 2  # the second app never read it


async def test_a_registry_servers_guards_hold_its_trust_rule_and_the_callers_own_bearer(
    cert: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``forward_bearer`` (mcpg's ``pass_through``) sends on a static token of ``[[auth.tokens]]``; an OAuth access
    token (a JWT of an ``[[auth.oidc]]`` issuer) is never passed through, ``[auth.resource]`` or not (the MCP
    authorization spec forbids token passthrough): that call fails, saying so, and nothing reaches the server."""
    upstream, registry = Upstream(), Registry()
    monkeypatch.setenv("ALICE_TOKEN", "alice-static-t0ken")  # the HTTP front reads static tokens from the environment
    async with (
        oauth_server() as idp,
        serving_tls(upstream.app(), cert) as up,
        serving_tls(registry.app(), cert) as reg_url,
    ):
        registry.entries = [entry("com.acme/crm", url=f"{up}/mcp")]
        doc = {
            "auth": {
                "tokens": [{"env": "ALICE_TOKEN", "principal": "alice"}],
                "oidc": [{"issuer": idp.url, "audiences": ["mcpipe"], "allow_private": True}],
            },
            "trust": {"subject_header": "x-user"},
            "registries": [
                {
                    "name": "acme",
                    "url": reg_url,
                    "allow_private": True,
                    "allow_private_servers": True,
                    "trust": {"minimum_trust": "verified"},
                    "forward_bearer": True,
                }
            ],
        }
        jwt = idp.mint("bob")
        config = _config(doc, {"ALICE_TOKEN": "alice-static-t0ken"})
        with trio.fail_after(60):
            async with open_app(config) as app, http_server(app) as mcp_url:
                await app.registries.synced.wait()
                for server in app.downstreams.servers:
                    await server.first_attempt()
                async with bearer_client(mcp_url, "alice-static-t0ken") as client:
                    mine = await client.call_tool("com.acme.crm.whoami", {})
                async with bearer_client(mcp_url, jwt) as client:
                    oauth = await client.call_tool("com.acme.crm.whoami", {})
                async with bearer_client(mcp_url, None) as client:
                    with pytest.raises(MCPError) as anonymous:  # the registry's rule: verified callers only
                        await client.call_tool("com.acme.crm.whoami", {})
    assert not mine.is_error
    assert oauth.is_error and "forward_bearer would pass the caller's OAuth access token" in oauth.content[0].text  # type: ignore[union-attr]
    assert [h.get("authorization") for h in calls(upstream)] == ["Bearer alice-static-t0ken"]  # only alice's call went
    assert all(jwt not in str(h) for h in calls(upstream))
    assert (
        anonymous.value.error.message
        == "tool com.acme.crm.whoami requires trust level Verified, current trust is Unauthenticated"
    )


async def test_a_registry_servers_credential_is_issued_per_caller_with_what_oauth_discovery_found(
    cert: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream, registry = Upstream(), Registry()
    async with (
        oauth_server() as idp,
        serving_tls(upstream.app(), cert) as up,
        serving_tls(registry.app(), cert) as reg_url,
    ):
        resource = f"{up}/mcp"
        idp.redeem_audiences.add(resource)
        upstream.documents["/.well-known/oauth-protected-resource/mcp"] = {
            "resource": resource,
            "authorization_servers": [idp.url],
        }
        registry.entries = [entry("com.acme/crm", url=resource), entry("com.acme/undiscovered", url=f"{up}/x/mcp")]
        doc = {
            "auth": {"oidc": [{"issuer": idp.url, "audiences": ["mcpipe"], "allow_private": True}]},
            "credentials": {
                "jag": {
                    "kind": "id_jag",
                    "idp_token_url": idp.url + "/token",
                    "client_id": "mcpipe",
                    "client_secret": "s3cret",
                    "audience": "replaced-by-discovery",
                    "redeem_token_url": "https://replaced.example/token",
                    "allow_private": True,
                }
            },
            "registries": [
                {
                    "name": "acme",
                    "url": reg_url,
                    "allow_private": True,
                    "allow_private_servers": True,
                    "credential": "jag",
                    "oauth_discovery": True,
                }
            ],
        }
        with trio.fail_after(60):
            async with open_app(_config(doc)) as app, http_server(app) as mcp_url:
                await app.registries.synced.wait()
                skipped = await app.registries.sync(app.config.registries[0])
                await _connected(app)
                async with bearer_client(mcp_url, idp.mint("alice")) as client:
                    listed = _names(await client.list_tools())
                    got = await client.call_tool("com.acme.crm.whoami", {})
    assert listed == ["com.acme.crm.whoami"]
    assert skipped == {"com.acme/undiscovered": "oauth_discovery: no OAuth metadata found for it"}
    assert not got.is_error
    (sent,) = calls(upstream)
    token = sent["authorization"].removeprefix("Bearer ")
    assert idp.claims(token)["sub"] == "alice" and idp.claims(token)["aud"] == resource  # type: ignore[index]
    exchange, redeem = idp.requests
    assert exchange["audience"] == resource and exchange["resource"] == resource
    assert redeem["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer"


async def test_a_registry_servers_static_token_comes_from_the_environment_variable_credential_env_names(
    cert: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKEN_COM_ACME_CRM", "t-crm")
    upstream, registry = Upstream(), Registry()
    async with serving_tls(upstream.app(), cert) as up, serving_tls(registry.app(), cert) as reg_url:
        registry.entries = [entry("com.acme/crm", url=f"{up}/mcp"), entry("com.acme/erp", url=f"{up}/erp/mcp")]
        reg = {
            "name": "acme",
            "url": reg_url,
            "allow_private": True,
            "allow_private_servers": True,
            "credential": "static/{server}",
            "credential_env": "TOKEN_{server}",
        }
        with trio.fail_after(60):
            async with open_app(_config({"registries": [reg]})) as app, http_server(app) as url:
                await app.registries.synced.wait()
                skipped = await app.registries.sync(app.config.registries[0])
                async with bearer_client(url, None) as client:
                    await client.call_tool("com.acme.crm.whoami", {})
    assert skipped == {
        "com.acme/erp": "credential: no credential `static/com.acme/erp`, "
        "and the environment variable TOKEN_COM_ACME_ERP is not set"
    }
    assert [h["authorization"] for h in calls(upstream)] == ["Bearer t-crm"]


@pytest.mark.parametrize(
    ("registry", "doc", "where", "says"),
    [
        ({"url": "http://r.example"}, {}, "registries[0].url", "https:// URL"),
        ({"trust": {"minimum_trust": "verified"}}, {}, "registries[0].trust", "needs the `trust` section"),
        ({"credential": "nope"}, {}, "registries[0].credential", "no credential `nope`"),
        ({"name": "Acme"}, {}, "registries[0].name", "matching regex"),
    ],
)
def test_a_registry_config_with_a_guard_it_cannot_keep_is_refused(
    registry: dict[str, Any], doc: dict[str, Any], where: str, says: str
) -> None:
    with pytest.raises(ConfigError) as err:
        _config({"registries": [{"name": "acme", "url": "https://r.example", **registry}], **doc})
    (problem,) = err.value.problems
    assert problem.location == where and says in problem.message
