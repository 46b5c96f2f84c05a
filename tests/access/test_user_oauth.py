"""Each user's own OAuth to a downstream server: two principals, one real MCP server behind its own
authorization server (Authlib, on 127.0.0.1). mcpipe discovers how to sign in from the server's 401, asks each
principal through URL-mode elicitation (answered by the test's client, which plays the user's browser), keeps
each principal's tokens sealed in the store, and each principal's calls reach the server with its own token,
never the other's (asserted on the server's side); after a restart with the SQLite store the tokens are still
there, and unreadable on disk. Then the hostile cases."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
import mcp_types as t
import pytest
import trio
from mcp.shared.exceptions import MCPError

from kit.authserver import AuthServer, auth_server
from kit.clients import bearer_client
from kit.oauth_downstream import RecordingServer, recording_server
from kit.realservers import free_port
from kit.servers import make_config, running
from mcpipe.server import serve_http

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

KEY = "k" * 16 + "0123456789abcdef0123"  # a passphrase of 36 characters


class User:
    """A person at a client: answers mcpipe's URL elicitation by opening the URL in a browser signed in to the
    downstream authorization server as ``account``, following its redirect back to mcpipe's callback."""

    def __init__(self, account: str, *, accept: bool = True) -> None:
        self.account = account
        self.accept = accept
        self.asked: list[Any] = []
        self.landed: list[int] = []

    async def elicit(self, context: Any, params: Any) -> t.ElicitResult:
        self.asked.append(params)
        if not self.accept or getattr(params, "mode", None) != "url":
            return t.ElicitResult(action="decline")
        async with httpx2.AsyncClient(follow_redirects=False, cookies={"user": self.account}) as browser:
            approved = await browser.get(params.url)
            assert approved.status_code == 302, approved.text
            back = await browser.get(approved.headers["location"])
            self.landed.append(back.status_code)
        return t.ElicitResult(action="accept")


def _verifier(down_as: AuthServer, resource: str) -> Any:
    """The downstream's own check of a bearer: a token its server issued, unexpired, for it (RFC 8707)."""

    async def verify(token: str) -> dict[str, Any] | None:
        found = down_as.tokens.get(token)
        if found is None or found.is_expired() or found.revoked or found.resource != resource:
            return None
        return {"sub": found.user}

    return verify


@asynccontextmanager
async def world(tmp_path: Path) -> AsyncIterator[tuple[AuthServer, AuthServer, RecordingServer]]:
    """mcpipe's own authorization server, the downstream's, and the downstream (tools/call needs a token)."""
    async with auth_server() as front, auth_server(opaque=True) as down_as, recording_server() as down:
        down.verify = _verifier(down_as, down.url)
        down.protect = frozenset({"tools/call", "ping"})
        down.metadata = {"resource": down.url, "authorization_servers": [down_as.url]}
        yield front, down_as, down


def _config(front: AuthServer, down: RecordingServer, port: int, store: str, **oauth: Any) -> Any:
    return make_config(
        {"MCPIPE_OAUTH_KEY": KEY},
        auth={
            "oidc": [{"issuer": front.url, "allow_private": True}],
            "resource": {"url": f"http://127.0.0.1:{port}/mcp"},
        },
        mcpServers={"down": {"url": down.url, "oauth": {"per_user": True, "allow_private": True}}},
        oauth={"store": store, "callback_url": f"http://127.0.0.1:{port}/oauth/callback", **oauth},
    )


@asynccontextmanager
async def mcpipe(config: Any, port: int, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.setenv("MCPIPE_OAUTH_KEY", KEY)
    stop = trio.Event()
    async with running(config) as app, trio.open_nursery() as nursery:
        await nursery.start(partial(serve_http, app, host="127.0.0.1", port=port, shutdown_trigger=stop.wait))
        try:
            yield app
        finally:
            stop.set()


async def _whoami(url: str, token: str, user: User, mode: str) -> str:
    async with bearer_client(url, token, mode, elicitation_callback=user.elicit) as client:
        result = await client.call_tool("down.whoami", {})
    assert not result.is_error, result
    return str(result.content[0].text)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_each_principal_signs_in_through_url_elicitation_and_its_calls_carry_its_own_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
):
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    db = tmp_path / "tokens.db"
    async with world(tmp_path) as (front, down_as, down):
        config = _config(front, down, port, f"sqlite:///{db}")
        alice_t, bob_t = front.mint("alice", aud=url), front.mint("bob", aud=url)
        alice, bob = User("alice-at-down"), User("bob-at-down")
        with trio.fail_after(90):
            async with mcpipe(config, port, monkeypatch):
                seen = [
                    await _whoami(url, alice_t, alice, mode),
                    await _whoami(url, bob_t, bob, mode),
                    await _whoami(url, alice_t, alice, mode),
                    await _whoami(url, bob_t, bob, mode),
                ]
            # A restart, with the same SQLite store: alice's token is still there (nobody is asked again).
            async with mcpipe(_config(front, down, port, f"sqlite:///{db}"), port, monkeypatch):
                after = await _whoami(url, alice_t, alice, mode)
    assert seen == ["alice-at-down", "bob-at-down", "alice-at-down", "bob-at-down"] and after == "alice-at-down"
    # Each principal was asked once, by URL-mode elicitation of the downstream's authorization endpoint.
    assert len(alice.asked) == 1 and len(bob.asked) == 1 and alice.landed == [200] and bob.landed == [200]
    asked = urlsplit(alice.asked[0].url)
    assert f"{asked.scheme}://{asked.netloc}" == down_as.url and asked.path == "/authorize"
    query = parse_qs(asked.query)
    assert query["code_challenge_method"] == ["S256"] and query["resource"] == [down.url]
    assert query["redirect_uri"] == [f"http://127.0.0.1:{port}/oauth/callback"]
    # On the downstream's side: every call carried its caller's own token, and the two never crossed.
    calls = down.calls()
    assert [c["subject"] for c in calls] == [*seen, after]
    by_subject: dict[str, set[str]] = {}
    for c in calls:
        by_subject.setdefault(c["subject"], set()).add(c["authorization"])
    assert not by_subject["alice-at-down"] & by_subject["bob-at-down"]
    assert down_as.registrations == 1  # mcpipe registered once, for everyone
    # On disk: no token, no refresh token, no principal in clear.
    raw = b"".join([await p.read_bytes() for p in await trio.Path(tmp_path).glob("tokens.db*")])
    for token in down_as.tokens.values():
        assert token.access_token.encode() not in raw
        assert token.refresh_token is None or token.refresh_token.encode() not in raw
    for name in (b"alice", b"bob"):
        assert name not in raw


async def test_a_client_without_url_elicitation_gets_the_url_elicitation_required_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    async with (
        world(tmp_path) as (front, down_as, down),
        mcpipe(_config(front, down, port, "memory://"), port, monkeypatch),
        bearer_client(url, front.mint("alice", aud=url), "2026-07-28") as client,
    ):
        with pytest.raises(MCPError) as refused:
            await client.call_tool("down.whoami", {})
    assert refused.value.error.code == -32042
    (elicitation,) = refused.value.error.data["elicitations"]
    assert elicitation["mode"] == "url" and elicitation["url"].startswith(down_as.url + "/authorize?")
    assert not down.calls()


async def test_tokens_are_listed_and_revoked_and_a_revoked_principal_signs_in_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    async with (
        world(tmp_path) as (front, _down_as, down),
        mcpipe(_config(front, down, port, "memory://"), port, monkeypatch) as app,
    ):
        alice = User("alice-at-down")
        token = front.mint("alice", aud=url)
        await _whoami(url, token, alice, "2026-07-28")
        listed = await app.oauth.list()
        alice_principal = f"oidc:{front.url}#alice"  # the JWT's subject in its issuer (access.Principal)
        assert await app.oauth.servers["down"].forget(alice_principal)
        await _whoami(url, token, alice, "2026-07-28")
    assert [(r["server"], r["principal"], r["refreshable"]) for r in listed] == [("down", alice_principal, True)]
    assert len(alice.asked) == 2


async def test_a_token_about_to_expire_is_refreshed_before_the_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    async with (
        world(tmp_path) as (front, down_as, down),
        mcpipe(_config(front, down, port, "memory://"), port, monkeypatch) as app,
    ):
        alice = User("alice-at-down")
        token = front.mint("alice", aud=url)
        await _whoami(url, token, alice, "2026-07-28")
        await _whoami(url, token, alice, "2026-07-28")  # fresh: no refresh
        first = down.calls()[-1]["authorization"]
        assert not [r for r in down_as.requests if r.get("form", {}).get("grant_type") == "refresh_token"]
        # Time passes: the token now expires within refresh_before_s (60 s).
        key = app.oauth.token_key("down", f"oidc:{front.url}#alice")
        record = await app.oauth.load(key)
        await app.oauth.save(key, {**record, "obtained_at": time.time() - 3570, "expires_at": time.time() + 30})
        await _whoami(url, token, alice, "2026-07-28")
        second = down.calls()[-1]["authorization"]
    refreshes = [r for r in down_as.requests if r.get("form", {}).get("grant_type") == "refresh_token"]
    assert first != second and len(refreshes) == 1 and len(alice.asked) == 1
    assert refreshes[0]["form"]["resource"] == down.url


# -- hostile cases --------------------------------------------------------------------------------------


async def test_a_forged_or_replayed_state_is_refused_and_a_code_works_once(tmp_path: Path, monkeypatch):
    port = free_port()
    async with (
        world(tmp_path) as (front, down_as, down),
        mcpipe(_config(front, down, port, "memory://"), port, monkeypatch) as app,
    ):
        auth = app.oauth.servers["down"]
        sign_in, _ = await auth.begin("alice", "req-1")
        async with httpx2.AsyncClient(follow_redirects=False, cookies={"user": "mallory"}) as browser:
            approved = await browser.get(sign_in)
            callback = approved.headers["location"]
            query = parse_qs(urlsplit(callback).query)
            forged = await browser.get(callback.replace(query["state"][0], "forged-state"))
            good = await browser.get(callback)
            replayed = await browser.get(callback)  # the same state and code again
        # The code itself, replayed at the token endpoint, is refused by the authorization server.
        form = {
            "grant_type": "authorization_code",
            "code": query["code"][0],
            "redirect_uri": f"http://127.0.0.1:{port}/oauth/callback",
            "code_verifier": "x" * 64,
        }
        client = await auth.client(await auth.discover())
        async with httpx2.AsyncClient() as http:
            again = await http.post(
                down_as.url + "/token", data=form, auth=(client["client_id"], client["client_secret"])
            )
    assert forged.status_code == 400 and b"unknown, expired or already used" in forged.content
    assert good.status_code == 200
    assert replayed.status_code == 400
    assert again.status_code == 400 and again.json()["error"] == "invalid_grant"
    # The one good sign-in went to alice, who started it: never to the state's forger.
    assert [r["principal"] for r in await app.oauth.list()] == ["alice"]


async def test_metadata_pointing_at_a_private_address_is_refused(tmp_path: Path, monkeypatch):
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    async with world(tmp_path) as (front, _down_as, down):
        down.metadata = {"resource": down.url, "authorization_servers": ["http://169.254.169.254/latest"]}
        config = make_config(
            {"MCPIPE_OAUTH_KEY": KEY},
            auth={"oidc": [{"issuer": front.url, "allow_private": True}], "resource": {"url": url}},
            mcpServers={"down": {"url": down.url, "oauth": {"per_user": True}}},
            oauth={"callback_url": f"http://127.0.0.1:{port}/oauth/callback"},
        )
        user = User("alice-at-down")
        async with (
            mcpipe(config, port, monkeypatch),
            bearer_client(url, front.mint("alice", aud=url), "2026-07-28", elicitation_callback=user.elicit) as c,
        ):
            result = await c.call_tool("down.whoami", {})
    assert result.is_error
    text = result.content[0].text
    assert "169.254.169.254" in text and "non-public address" in text
    assert not user.asked


async def test_a_token_minted_for_another_resource_is_refused_by_the_metadata_check(tmp_path: Path, monkeypatch):
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    async with world(tmp_path) as (front, down_as, down):
        down.metadata = {"resource": "http://127.0.0.1:1/elsewhere", "authorization_servers": [down_as.url]}
        user = User("alice-at-down")
        async with (
            mcpipe(_config(front, down, port, "memory://"), port, monkeypatch),
            bearer_client(url, front.mint("alice", aud=url), "2026-07-28", elicitation_callback=user.elicit) as c,
        ):
            result = await c.call_tool("down.whoami", {})
    assert result.is_error and "names resource 'http://127.0.0.1:1/elsewhere'" in result.content[0].text
    assert not user.asked and down_as.registrations == 0


async def test_ten_thousand_sign_ins_by_one_principal_stay_bounded(tmp_path: Path, monkeypatch):
    port = free_port()
    async with (
        world(tmp_path) as (front, down_as, down),
        mcpipe(_config(front, down, port, "memory://", max_pending_per_principal=4), port, monkeypatch) as app,
    ):
        auth = app.oauth.servers["down"]
        started = time.perf_counter()
        with trio.fail_after(120):
            for i in range(10_000):
                await auth.begin("mallory", f"r{i}")
            await auth.begin("alice", "a1")
        elapsed = time.perf_counter() - started
        store = app.oauth.store
        pending = await store.keys("pending:")
        mine = await store.keys("pidx:")
    assert len(pending) == 5 and len(mine) == 5  # mallory's newest four, and alice's one
    assert down_as.registrations == 1 and len([r for r in down_as.requests if r["path"] == "/register"]) == 1
    assert elapsed < 120
