"""mcpg's configs served (``formats/mcpg``) and the access layer under hostile callers: resource templates
matched against a caller's URI, Cedar gates deciding on a caller's arguments, OIDC issuers whose JWK Set
server is slow or answers garbage. Over HTTP against a real ``mcpipe serve``, ``/healthz`` probed."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx2
import orjson
import pytest
import trio

from kit.attack import served, write_config
from kit.hostile import call, headers
from kit.llm import _answer, lifespan, serving
from kit.oauth import OAuthServer
from kit.session import open_session
from mcpipe.access._identity import FAILED_FETCH_RETRY_S
from mcpipe.server._passthrough import MAX_TEMPLATE_URI_CHARS, _template_matcher

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

TEMPLATES = """
gateway:
  server: {bind_address: "127.0.0.1:0", mcp_path: /mcp, health_path: /healthz, anonymous_rate_limit_per_min: 0}
governance:
  audit: {enabled: false}
mcp:
  capabilities:
    resource_templates:
      - name: doc
        description: a document by name and extension
        uri_template: "docs://{name}.{ext}"
        mime_type: text/plain
        governance: {minimum_trust: unauthenticated}
        backend: {kind: mock, response: {contents: [{uri: "docs://x", text: found}]}}
      - name: nested
        description: three variables side by side
        uri_template: "tree://{+root}{a}{b}/x/{c}/x/"
        mime_type: text/plain
        governance: {minimum_trust: unauthenticated}
        backend: {kind: mock, response: {contents: [{uri: "tree://x", text: nested}]}}
"""


async def test_a_resource_template_matches_a_hostile_uri_in_linear_time(tmp_path):
    # Before: Python's backtracking `re` matched `docs://{name}.{ext}` in time quadratic in the URI: a 32 KB
    # URI of dots held the event loop 4.6 s (a 1 MB one: hours); adjacent variables were worse, on URIs that
    # match too (`{+root}{a}{b}/x/{c}/x/`: cubic, a 2.4 KB URI 5 s).
    async with served(write_config(tmp_path, TEMPLATES)) as server, httpx2.AsyncClient(timeout=60) as http:
        session = await open_session(http, server.url)
        dots = "docs://" + "a." * 16_000 + "/"
        (status, missing), slowest = await server.probed(lambda: session.request("resources/read", {"uri": dots}))
        assert status == 200 and missing["error"]["message"] == "Resource not found"
        assert slowest < 1.0, server.health
        tree = "tree://r/" + "a" * 1_200 + "/x/" + "b" * 1_200 + "/x/"
        (status, hit), slowest = await server.probed(lambda: session.request("resources/read", {"uri": tree}))
        assert status == 200 and hit["result"]["contents"][0]["text"] == "nested"
        assert slowest < 1.0, server.health
        _, found = await session.request("resources/read", {"uri": "docs://readme.md"})
        assert found["result"]["contents"][0]["text"] == "found"
        assert server.alive


@pytest.mark.parametrize(
    ("template", "uri", "expected"),
    [
        ("docs://{name}.{ext}", "docs://a.b.c", {"name": "a.b", "ext": "c"}),
        ("docs://{name}.{ext}", "docs://a/b.c", None),
        ("f://{a}/{+path}", "f://x/y/z%20w", {"a": "x", "path": "y/z w"}),
        ("t://{+r}{a}{b}/x/{c}/x/", "t://p/q-r/x/s/x/", {"r": "p/q", "a": "-", "b": "r", "c": "s"}),
        ("t://{a}{b}", "t://ab", {"a": "a", "b": "b"}),
        ("t://{a}", "t://", None),
        ("t://plain", "t://plain", {}),
    ],
)
def test_a_template_splits_a_uri_as_a_backtracking_regex_would(template, uri, expected):
    assert _template_matcher(template)(uri) == expected


def test_a_uri_past_the_bound_matches_no_template_and_costs_nothing():
    match = _template_matcher("tree://{+root}{a}{b}/x/{c}/x/")
    t0 = time.perf_counter()
    assert match("tree://" + "a" * MAX_TEMPLATE_URI_CHARS + "/x/c/x/") is None
    assert match("tree://r/" + "a" * 8_000 + "/x/" + "b" * 8_000 + "/x/") == {
        "root": "r/" + "a" * 7_998,
        "a": "a",
        "b": "a",
        "c": "b" * 8_000,
    }
    assert time.perf_counter() - t0 < 0.5


# --- an OIDC issuer whose JWK Set server is slow or answers garbage ---------------------------------------------


@dataclass
class HostileIdp:
    """An OpenID provider (``kit.oauth``'s keys and tokens) whose JWK Set answer is chosen by ``mode``:
    ``good``, ``hang`` (never answers), or a body of garbage (``keys5``: ``{"keys": 5}``)."""

    oauth: OAuthServer = field(default_factory=OAuthServer)
    mode: str = "good"
    fetches: int = 0

    def app(self) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                await lifespan(receive, send)
                return
            self.fetches += 1
            if self.mode == "hang":
                await trio.sleep_forever()
            body: Any = {"keys": 5} if self.mode == "keys5" else self.oauth.jwks()
            await _answer(send, 200, body)

        return app


def _oidc_config(idp: str, **extra: Any) -> str:
    doc = {
        "audit": {"enabled": False},
        "auth": {
            "tokens": [{"env": "OPS_TOKEN", "principal": "ops"}],
            "oidc": [
                {
                    "issuer": idp,
                    "audiences": ["mcpipe"],
                    "jwks_url": idp + "/jwks",
                    "allow_private": True,
                    "timeout_ms": 1000,
                    **extra,
                }
            ],
            "tools": ["*"],
        },
        "pipelines": [{"name": "hello", "steps": [{"kind": "value", "id": "v", "value": "hi"}]}],
    }
    return json.dumps(doc)


async def _hello(http: httpx2.AsyncClient, url: str, token: str) -> tuple[int, float]:
    t0 = time.perf_counter()
    body = orjson.dumps(call("hello", {}))
    r = await http.post(url, content=body, headers={**headers("hello"), "authorization": f"Bearer {token}"})
    return r.status_code, time.perf_counter() - t0


async def _many(http: httpx2.AsyncClient, url: str, tokens: list[str]) -> list[tuple[int, float]]:
    out: list[tuple[int, float]] = []

    async def one(token: str) -> None:
        out.append(await _hello(http, url, token))

    async with trio.open_nursery() as nursery:
        for token in tokens:
            nursery.start_soon(one, token)
    return out


async def test_a_jwk_set_server_that_hangs_holds_no_caller_in_line(tmp_path):
    # Before: each request needing the keys waited for a fetch of its own, one after another under the cache's
    # lock: 8 callers with tokens behind a JWK Set server that never answers were answered 401 after 1, 2, ...
    # 8 s (timeout_ms 1000); with cached keys past refresh_s, every request waited a fetch and its timeout.
    idp = HostileIdp(mode="hang")
    async with serving(idp.app()) as base:
        idp.oauth.url = base
        env = {"OPS_TOKEN": "ops-secret"}
        async with (
            served(write_config(tmp_path, _oidc_config(base, refresh_s=1), ".json"), env=env) as server,
            httpx2.AsyncClient(timeout=30) as http,
        ):
            tokens = [idp.oauth.mint(f"user{i}") for i in range(8)]
            answers, slowest = await server.probed(lambda: _many(http, server.url, tokens))
            assert [s for s, _ in answers] == [401] * 8
            assert max(t for _, t in answers) < 2.5, answers  # one fetch (1 s) shared by all
            assert slowest < 1.0, server.health
            assert idp.fetches == 1
            # Within FAILED_FETCH_RETRY_S of the failure, a token is refused at once, without a fetch.
            status, took = await _hello(http, server.url, tokens[0])
            assert (status, idp.fetches) == (401, 1) and took < 0.5
            # Someone with a static token is never held by the issuer.
            ops = await _many(http, server.url, ["ops-secret"] * 4)
            assert [s for s, _ in ops] == [200] * 4 and max(t for _, t in ops) < 1.0
            # The keys come back: fetched once, then cached; past refresh_s the server hangs again, and callers
            # go on with the cached keys while one of them fetches.
            idp.mode = "good"
            await trio.sleep(FAILED_FETCH_RETRY_S)
            assert [s for s, _ in await _many(http, server.url, tokens)] == [200] * 8
            idp.mode = "hang"
            await trio.sleep(1.1)
            answers = await _many(http, server.url, tokens)
            assert [s for s, _ in answers] == [200] * 8
            assert sorted(t for _, t in answers)[6] < 0.5, answers  # all but the one fetching, at once
            assert "Traceback" not in server.text()


async def test_a_jwk_set_of_garbage_is_refused_without_a_traceback(tmp_path):
    # Before: `{"keys": 5}` raised TypeError out of the identity check of every request with a token.
    idp = HostileIdp(mode="keys5")
    async with serving(idp.app()) as base:
        idp.oauth.url = base
        async with (
            served(write_config(tmp_path, _oidc_config(base), ".json"), env={"OPS_TOKEN": "x"}) as server,
            httpx2.AsyncClient(timeout=30) as http,
        ):
            status, _ = await _hello(http, server.url, idp.oauth.mint("alice"))
            assert status == 401
            assert "the JWK Set holds no usable key" in server.text()
            assert "Traceback" not in server.text() and server.alive


# --- a Cedar gate deciding on the caller's arguments ---------------------------------------------------------

CEDAR = """
audit: {enabled: false}
access:
  gates:
    - kind: cedar
      name: authz
      arguments_as_context: true
      policies: 'permit(principal, action, resource) when { context has ok && context.ok == true };'
pipelines:
  - name: hello
    steps: [{kind: value, id: v, value: hi}]
"""


async def test_a_cedar_context_from_the_callers_arguments_is_bounded(tmp_path):
    # Before: Cedar built and evaluated a 4 MB context (90 000 extension values) holding the interpreter, on
    # the event loop: /healthz held about 4 s per call.
    bomb = {"ok": True, "ext": [{"__extn": {"fn": "ip", "arg": "10.0.0.1"}}] * 90_000}
    async with served(write_config(tmp_path, CEDAR)) as server:
        refused, slowest = await server.probed(lambda: server.call("hello", bomb))
        assert slowest < 1.0, server.health
        assert refused["isError"] is True
        text = refused["content"][0]["text"]
        assert "policy `authz` denied 'hello'" in text and "larger than 65536 bytes" in text
        allowed = await server.call("hello", {"ok": True, "ext": [{"__extn": {"fn": "ip", "arg": "10.0.0.1"}}] * 10})
        assert allowed["isError"] is False
