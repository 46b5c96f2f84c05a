"""Who a caller is, under a caller who lies about it (issue 27, items 5, 6 and 17), each against a real
``mcpipe serve`` on 127.0.0.1 with ``/healthz`` probed: a forged ``X-Forwarded-For`` before an address
allowlist, the same subject from other identity sources reaching another principal's background run, and a
token endpoint echoing the client secret into its ``error``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote

import httpx2
import pytest

from kit.attack import Served, served, write_config
from kit.hostile import call, headers, result_of
from kit.llm import _answer, _body, lifespan, serving
from kit.oauth import OAuthServer

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


async def _post(server: Served, name: str, arguments: Any, **extra: str) -> Any:
    async with httpx2.AsyncClient(timeout=60) as http:
        r = await http.post(
            server.url, content=json.dumps(call(name, arguments)).encode(), headers={**headers(name), **extra}
        )
    assert r.status_code == 200, (r.status_code, r.text[:300])
    return result_of(r.text, r.headers.get("content-type", ""))["result"]


# --- item 6: an address allowlist and the headers a client sets -----------------------------------------------

ALLOWLIST = """
[audit]
enabled = false

[[access.gates]]
kind = "ip_allowlist"
name = "office"
allow = ["10.0.0.0/8"]
tools = ["echo"]

[[access.gates]]
kind = "ip_allowlist"
name = "loopback"
allow = ["127.0.0.0/8"]
tools = ["now"]

[[access.gates]]
kind = "ip_allowlist"
name = "behind-proxy"
allow = ["10.0.0.0/8"]
ip_header = "x-forwarded-for"
trusted_proxies = ["127.0.0.1/32"]
tools = ["json_dump"]
"""

FORGED = [{"x-forwarded-for": "10.0.0.5"}, {"x-real-ip": "10.0.0.5"}, {"x-forwarded-for": "10.0.0.5, 127.0.0.1"}]


async def test_an_address_allowlist_judges_the_tcp_peer_unless_told_of_a_trusted_proxy(tmp_path: Path) -> None:
    # Before: `ip_header` defaulted to `x-forwarded-for` (its docstring and docs/access.md said the TCP peer),
    # with `x-real-ip` as a fallback: each forged header below was admitted from 127.0.0.1, and a TOML config
    # (which has no null) could not ask for the peer at all.
    async with served(write_config(tmp_path, ALLOWLIST, ".toml")) as server:

        async def attack() -> list[Any]:
            return [await _post(server, "echo", {"x": 1}, **forged) for forged in FORGED]

        forged, slowest = await server.probed(attack)
        peer = await _post(server, "now", {}, **{"x-forwarded-for": "203.0.113.9"})
        proxied = await _post(server, "json_dump", {"value": 1}, **{"x-forwarded-for": "10.0.0.5"})
        # Behind the trusted proxy, the client is the rightmost address it did not add: a client's own
        # `X-Forwarded-For: 10.0.0.5` arrives as `10.0.0.5, 203.0.113.9`.
        spoofed = await _post(server, "json_dump", {"value": 1}, **{"x-forwarded-for": "10.0.0.5, 203.0.113.9"})
    assert slowest < server.stall_s, server.health
    for answer in forged:
        assert answer["isError"] is True, answer
        assert "127.0.0.1 is not in the allowed networks" in answer["content"][0]["text"], answer
    assert not peer.get("isError"), peer
    assert not proxied.get("isError"), proxied
    assert spoofed["isError"] is True and "203.0.113.9 is not in the allowed networks" in spoofed["content"][0]["text"]


# --- item 5: one subject, several identity sources ------------------------------------------------------------


def _issuer(url: str, idp: OAuthServer) -> dict[str, Any]:
    return {"issuer": url, "audiences": ["mcpipe"], "jwks": json.dumps(idp.jwks())}


async def test_the_same_subject_from_another_identity_source_is_another_principal(tmp_path: Path) -> None:
    # Before: the principal was the bare subject: a JWT of either issuer with `sub=alice`, or the trusted
    # subject header naming `alice`, read the background run of the static token `alice` (3 of 3), and the
    # JWTs' `alice` had that token's grants (`now`, which `[auth] tools` does not give them).
    first, second = OAuthServer(url="https://login.example.com"), OAuthServer(url="https://other.example.net")
    config = {
        "audit": {"enabled": False},
        "auth": {
            "tokens": [{"env": "T_ALICE", "principal": "alice", "tools": ["*"]}],
            "oidc": [_issuer(first.url, first), _issuer(second.url, second)],
            "tools": ["echo", "mcp_pipe", "pipe_result"],
        },
        "trust": {"subject_header": "x-user"},
    }
    others = {
        "jwt of the first issuer": {"authorization": f"Bearer {first.mint('alice')}"},
        "jwt of the second issuer": {"authorization": f"Bearer {second.mint('alice')}"},
        "the subject header": {"x-user": "alice"},
    }
    token = {"authorization": "Bearer alice-secret"}
    async with served(write_config(tmp_path, json.dumps(config), ".json"), env={"T_ALICE": "alice-secret"}) as server:
        spec = {"steps": [{"tool": "echo", "args": {"secret": "alice's"}}], "background": True}
        started = await _post(server, "mcp_pipe", spec, **token)
        run_id = started["structuredContent"]["result"]["run_id"]

        async def attack() -> dict[str, Any]:
            return {
                who: await _post(server, "pipe_result", {"run_id": run_id, "wait_ms": 5000}, **h)
                for who, h in others.items()
            }

        read, slowest = await server.probed(attack)
        granted = {who: await _post(server, "now", {}, **h) for who, h in others.items() if "jwt" in who}
        own = await _post(server, "pipe_result", {"run_id": run_id, "wait_ms": 5000}, **token)
    assert slowest < server.stall_s, server.health
    for who, answer in read.items():
        assert answer["isError"] is True, (who, answer)
        assert answer["content"][0]["text"] == f"NOT_FOUND: no run {run_id!r}", (who, answer)
    for who, answer in granted.items():
        assert answer["isError"] is True and "may not call 'now'" in answer["content"][0]["text"], (who, answer)
    assert own["structuredContent"]["ok"] is True, own


# --- item 17: a token endpoint that echoes the client secret ---------------------------------------------------

SECRET = "cs-5ecret-value-0123456789"


def _echoing_token_endpoint(seen: list[str]) -> Any:
    """An OAuth token endpoint that refuses every request, its RFC 6749 ``error`` echoing the secret sent."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        form = dict(parse_qsl((await _body(receive)).decode()))
        seen.append(form.get("client_secret", ""))
        error = {
            "shaped": f"invalid_client: secret {form.get('client_secret')} is wrong",
            "bare": form.get("client_secret"),
            "encoded": quote(form.get("client_secret", "") + "!"),
        }[scope["path"].strip("/")]
        await _answer(send, 401, {"error": error, "error_description": f"got {form}"})

    return app


async def test_a_token_endpoints_error_never_carries_a_secret_to_the_caller(tmp_path: Path) -> None:
    # Before: the endpoint's `error` field was passed on as it was: `error: invalid_client: secret cs-5ecret-...
    # is wrong` reached the caller's answer (and `error: cs-5ecret-...` alone, too).
    seen: list[str] = []
    async with serving(_echoing_token_endpoint(seen)) as tokens:
        credentials = {
            name: {
                "kind": "client_credentials",
                "token_url": f"{tokens}/{name}",
                "client_id": "mcpipe",
                "client_secret_env": "CS_SECRET",
                "allow_private": True,
            }
            for name in ("shaped", "bare", "encoded")
        }
        pipelines = [
            {"name": name, "steps": [{"kind": "http", "url": "http://127.0.0.1:9/never", "credential": name}]}
            for name in credentials
        ]
        config = {
            "audit": {"enabled": False},
            "credentials": credentials,
            "outbound": {"http": {"allowed_hosts": ["127.0.0.1"], "allow_private": True}},
            "pipelines": pipelines,
        }
        async with served(write_config(tmp_path, json.dumps(config), ".json"), env={"CS_SECRET": SECRET}) as server:

            async def attack() -> list[Any]:
                return [await server.call(name, {}) for name in credentials]

            answer, slowest = await server.probed(attack)
            log = server.text()
    assert slowest < server.stall_s, server.health
    assert seen == [SECRET] * 3  # each endpoint was asked, with the secret
    text = json.dumps(answer)
    assert SECRET not in text and quote(SECRET) not in text and SECRET not in log, text
    assert "answered HTTP 401 (error: invalid_client" not in text
    assert text.count("answered HTTP 401") == 3, text
