"""mcpipe's downstream connection as the client under test of the conformance suite's ``auth/*`` scenarios.

    ../shared/conformance/run client --command "python tests/conformance/oauth_client.py" --scenario auth/basic-cimd

The suite starts an MCP server behind its authorization server and runs this with the server's URL. This puts
that server in an mcpipe config (``mcpServers.conformance``, ``oauth``), serves mcpipe's HTTP front (where the
sign-in's redirect comes back to), signs the operator in as ``mcpipe auth login`` does, playing the person at the
browser (the suite's authorization endpoint approves at once: it answers a redirect, which the browser follows
to mcpipe's callback), then lets mcpipe connect to the server, list its tools and call ``test-tool``. Exit 0
when the call answered, 1 otherwise (the reason on stderr).

The scenario's context (``MCP_CONFORMANCE_CONTEXT``: a pre-registered client, client credentials) becomes the
server's ``oauth`` table; the scenario's spec version, ``MCP_CONFORMANCE_PROTOCOL_VERSION``, its ``protocol``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "python"))

import httpx2  # noqa: E402
import trio  # noqa: E402

CIMD_URL = "https://conformance-test.local/client-metadata.json"
"""The client id metadata document URL the suite expects a CIMD client to use (it does not fetch it)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


KEY_ENV = "MCPIPE_CONFORMANCE_PRIVATE_KEY"


def config_doc(url: str, port: int, context: dict[str, Any], version: str | None) -> dict[str, Any]:
    oauth: dict[str, Any] = {"allow_private": True}
    if context.get("client_id"):
        oauth["client_id"] = context["client_id"]
        if context.get("client_secret"):
            oauth["client_secret"] = context["client_secret"]
    if str(context.get("name", "")).startswith("auth/client-credentials"):
        oauth["grant"] = "client_credentials"  # mcpipe's own token: nobody signs in
        if context.get("private_key_pem"):
            os.environ[KEY_ENV] = context["private_key_pem"]
            oauth |= {"private_key_env": KEY_ENV, "token_endpoint_auth_method": "private_key_jwt"}
            oauth["signing_algorithm"] = context.get("signing_algorithm") or "ES256"
        else:
            oauth["token_endpoint_auth_method"] = "client_secret_basic"
    server: dict[str, Any] = {"url": url, "prefix": "", "oauth": oauth, "connect": "lazy"}
    if version in ("2025-11-25", "2026-07-28"):
        server["protocol"] = version
    return {
        "audit": {"enabled": False},
        "builtins": False,
        "http": {"host": "127.0.0.1", "port": port},
        "oauth": {"callback_url": f"http://127.0.0.1:{port}/oauth/callback", "client_metadata_url": CIMD_URL},
        "mcpServers": {"conformance": server},
    }


async def main(url: str) -> int:
    from mcpipe.config import parse_config
    from mcpipe.downstream import OPERATOR, SignInError
    from mcpipe.server import open_app, serve_http
    from mcpipe.tools import ToolContext

    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    version = os.environ.get("MCP_CONFORMANCE_PROTOCOL_VERSION")
    port = _free_port()
    doc = config_doc(url, port, context, version)
    config = parse_config(json.dumps(doc), "json", environ=dict(os.environ))
    stop = trio.Event()
    async with open_app(config) as app, trio.open_nursery() as nursery:
        await nursery.start(partial(serve_http, app, host="127.0.0.1", port=port, shutdown_trigger=stop.wait))
        try:
            assert app.oauth is not None
            auth = app.oauth.servers["conformance"]

            async def sign_in() -> str | None:
                """The operator signs in (``mcpipe auth login``), the person at the browser played here."""
                try:
                    url, _ = await auth.begin(OPERATOR, None)
                except SignInError as exc:
                    return str(exc)
                async with httpx2.AsyncClient(follow_redirects=False, timeout=10) as browser:
                    approved = await browser.get(url)
                    location = approved.headers.get("location")
                    if approved.status_code not in (301, 302, 303, 307) or not location:
                        return f"the authorization endpoint answered {approved.status_code}"
                    if parse_qs(urlsplit(location).query).get("error"):
                        return f"the authorization endpoint refused: {location}"
                    landed = await browser.get(location)  # mcpipe's callback
                return None if landed.status_code == 200 else f"the sign-in failed: {landed.text}"

            if auth.cfg.grant == "authorization_code":
                failed = await sign_in()
                if failed is not None:
                    print(f"oauth_client: {failed}", file=sys.stderr)
                    return 1
            server = app.downstreams.servers[0]
            with trio.fail_after(20):
                await server.first_attempt()
            if server.state != "up":
                print(f"oauth_client: the server did not come up: {server.last_error}", file=sys.stderr)
                return 1
            names = sorted(server.tools)
            tool = "test-tool" if "test-tool" in names else (names[0] if names else None)
            if tool is None:
                return 0
            for attempt in range(3):  # a refused token (a scope to step up to, another server) signs in again
                try:
                    result = await app.gateway.call(tool, {}, ToolContext())
                except Exception as exc:  # the call's failure, said on stderr
                    result, error = None, f"{type(exc).__name__}: {exc}"
                else:
                    error = f"{tool} answered an error: {result.content}" if result.is_error else None
                if error is None:
                    return 0
                if attempt == 2 or auth.cfg.grant != "authorization_code" or await auth.token(OPERATOR) is not None:
                    print(f"oauth_client: {error}", file=sys.stderr)
                    return 1
                failed = await sign_in()
                if failed is not None:
                    print(f"oauth_client: {failed}", file=sys.stderr)
                    return 1
            return 1
        finally:
            stop.set()


if __name__ == "__main__":
    sys.exit(trio.run(main, sys.argv[-1]))
