"""An mcpg config file, read by mcpipe's mcpg front-end and served over real HTTP: its OIDC issuer
(``governance.access.oidc_oauth``, a real provider on 127.0.0.1) identifies the caller, its
``dev.mcpg.rate-limit`` plugin answers the over-budget call as mcpg does (JSON-RPC -32029), and its credential
issuer's token reaches the http binding's upstream."""

from __future__ import annotations

import httpx2
import pytest

from kit.oauth import echo_api, oauth_server
from kit.servers import http_server
from mcpipe.config import parse_config
from mcpipe.server import open_app

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}

CONFIG = """
gateway:
  server: {{bind_address: "127.0.0.1:8787", mcp_path: /mcp}}
governance:
  access:
    oidc_oauth:
      providers:
        - issuer: "{idp}"
          audiences: [mcpg]
          allow_private_issuer: true
          verification: {{kind: oidc_jwks, allowed_algs: [RS256]}}
  audit: {{enabled: false}}
plugins:
  - id: dev.mcpg.rate-limit
    class: tool_gate
    source: {{oci: "ghcr.io/mcpg-dev/source-code/plugins/rate-limit:1.0.0"}}
    config: {{default_limit: 2}}
  - id: dev.mcpg.credential.oauth-client-credentials
    class: credential_issuer
    source: {{oci: "ghcr.io/mcpg-dev/plugins/credential-oauth-client-credentials:1"}}
    config:
      providers:
        api: {{token_url: "{idp}/token", client_id: mcpipe, client_secret: "${{env.API_SECRET}}"}}
mcp:
  capabilities:
    tools:
      - name: items.list
        description: the upstream's items
        backend:
          kind: http
          method: get
          url: "{api}/v1/items"
          allow_private_backends: true
          headers:
            Authorization: "Bearer ${{cred://dev.mcpg.credential.oauth-client-credentials/api}}"
"""


async def _call(http: httpx2.AsyncClient, url: str, token: str | None, rid: int) -> dict:
    body = {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "tools/call",
        "params": {"name": "items.list", "arguments": {}, "_meta": META},
    }
    headers = {
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "items.list",
    }
    if token:
        headers["authorization"] = f"Bearer {token}"
    r = await http.post(url, json=body, headers=headers)
    return (
        {"status": r.status_code, **r.json()}
        if r.headers.get("content-type", "").startswith("application/json")
        else {"status": r.status_code}
    )


async def test_an_mcpg_file_s_identity_rate_limit_and_credential_plugins_are_served_with_mcpgs_meaning():
    async with oauth_server() as idp, echo_api() as api:
        config = parse_config(CONFIG.format(idp=idp.url, api=api.url), "yaml", environ={"API_SECRET": "s3cret"})
        async with open_app(config) as app, http_server(app) as url, httpx2.AsyncClient() as http:
            alice = idp.mint("alice", aud="mcpg")
            answers = [await _call(http, url, alice, i) for i in range(3)]
            forged = await _call(http, url, idp.mint("mallory", aud="someone-else"), 9)
    assert [a["status"] for a in answers] == [200, 200, 200]
    assert "result" in answers[0] and "result" in answers[1]
    assert answers[2]["error"]["code"] == -32029 and answers[2]["error"]["message"] == "Rate limit exceeded"
    assert forged["status"] == 401
    assert [seen["authorization"] for seen in api.seen] == ["Bearer cc-mcpipe-1", "Bearer cc-mcpipe-1"]
    assert len(idp.requests) == 1 and idp.requests[0]["client_secret"] == "s3cret"
