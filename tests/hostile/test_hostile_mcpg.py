"""mcpg's configs served (``formats/mcpg``) and the access layer under hostile callers and hostile services:
resource templates matched against a caller's URI, a GET binding's query string, command bindings' children;
OIDC issuers whose JWK Set server hangs or answers garbage, OAuth token endpoints likewise, Cedar gates
deciding on a caller's arguments, audit records of a caller's names. Over HTTP against a real
``mcpipe serve`` (one per config: each attack below is a section of its test), ``/healthz`` probed."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx2
import orjson
import pytest
import trio

from kit.attack import Served, served, write_config
from kit.hostile import call, headers
from kit.llm import _answer, lifespan, serving
from kit.oauth import OAuthServer, echo_api
from kit.processes import in_namespace
from kit.session import open_session
from mcpipe.access._config import RateLimitGate
from mcpipe.access._gates import RateLimiter
from mcpipe.server._passthrough import MAX_TEMPLATE_URI_CHARS, _template_matcher

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

# --- an mcpg config's bindings: resource templates, a GET binding, command bindings ----------------------------

BINDINGS = """
gateway:
  server: {{bind_address: "127.0.0.1:0", mcp_path: /mcp, health_path: /healthz, anonymous_rate_limit_per_min: 0}}
governance:
  audit: {{enabled: false}}
mcp:
  capabilities:
    resource_templates:
      - name: doc
        description: a document by name and extension
        uri_template: "docs://{{name}}.{{ext}}"
        mime_type: text/plain
        governance: {{minimum_trust: unauthenticated}}
        backend: {{kind: mock, response: {{contents: [{{uri: "docs://x", text: found}}]}}}}
      - name: nested
        description: three variables side by side
        uri_template: "tree://{{+root}}{{a}}{{b}}/x/{{c}}/x/"
        mime_type: text/plain
        governance: {{minimum_trust: unauthenticated}}
        backend: {{kind: mock, response: {{contents: [{{uri: "tree://x", text: nested}}]}}}}
    tools:
      - name: search
        description: a GET of the arguments as the query string
        governance: {{minimum_trust: unauthenticated}}
        backend: {{kind: http, method: get, url: "{api}/v1/search", allow_private_backends: true}}
      - name: background
        description: a command that leaves a child running, its output elsewhere
        governance: {{minimum_trust: unauthenticated}}
        backend:
          kind: command
          command: sh
          args: ["-c", "sleep 302 >/dev/null 2>&1 & echo $(readlink /proc/self/ns/pid) $! > {pidfile}; echo '{{}}'"]
      - name: holding
        description: a command that leaves a child holding its output
        governance: {{minimum_trust: unauthenticated}}
        backend:
          kind: command
          command: sh
          args: ["-c", "sleep 303 & echo $(readlink /proc/self/ns/pid) $! > {pidfile}.2; echo '{{}}'"]
"""


def _pids(path: Path) -> list[int]:
    """The pids, as seen here, a command's child wrote (``<its PID namespace> <pid>``): the pid itself, or,
    when the command ran in a PID namespace of its own, every process still in that namespace."""
    link, pid = path.read_text().split()
    return in_namespace(link) if link != os.readlink("/proc/self/ns/pid") else [int(pid)]


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


async def _resource_templates(server: Served, http: httpx2.AsyncClient) -> None:
    # Before: Python's backtracking `re` matched `docs://{name}.{ext}` in time quadratic in the URI: a 32 KB
    # URI of dots held the event loop 4.6 s (a 1 MB one: hours); adjacent variables were worse, on URIs that
    # match too (`{+root}{a}{b}/x/{c}/x/`: cubic, a 2.4 KB URI 5.6 s).
    session = await open_session(http, server.url)
    dots = "docs://" + "a." * 16_000 + "/"
    (status, missing), slowest = await server.probed(lambda: session.request("resources/read", {"uri": dots}))
    assert status == 200 and missing["error"]["message"] == "Resource not found"
    assert slowest < server.stall_s, server.health
    tree = "tree://r/" + "a" * 1_200 + "/x/" + "b" * 1_200 + "/x/"
    (status, hit), slowest = await server.probed(lambda: session.request("resources/read", {"uri": tree}))
    assert status == 200 and hit["result"]["contents"][0]["text"] == "nested"
    assert slowest < server.stall_s, server.health
    _, found = await session.request("resources/read", {"uri": "docs://readme.md"})
    assert found["result"]["contents"][0]["text"] == "found"


async def _query_string(server: Served, api: Any) -> None:
    # Before: 3 MB of arguments were percent-encoded byte by byte in Python on the event loop (/healthz held
    # 1.3 s) into an 18 MB URL, which httpx then refused ("URL too long").
    body = orjson.dumps(call("search", {"q": "é" * 1_500_000}))  # raw UTF-8: 3 MB
    refused, slowest = await server.probed(lambda: server.post(body, "search"))
    assert slowest < server.stall_s, server.health
    assert refused["result"]["isError"] is True
    medium = await server.call("search", {"q": "é" * 40_000})
    assert medium["isError"] is True
    assert "the query string would be longer than 65536 bytes" in medium["content"][0]["text"]
    assert api.seen == []
    fine = await server.call("search", {"q": "é ok", "n": [1, 2]})
    assert not fine.get("isError") and api.seen[-1]["query"] == "n=1&n=2&q=%C3%A9%20ok"


async def _commands(server: Served, pidfile: Path) -> None:
    # Before: the command ran in the server's process group and only it was killed: a child with its output
    # elsewhere outlived the call and the server; one holding the output kept the call to its deadline (5 s,
    # `timedOut: true`) and outlived it too.
    children: list[int] = []
    try:
        answer = await server.call("background", {})
        children += _pids(pidfile)
        held = await server.call("holding", {})
        children += _pids(pidfile.with_suffix(".pid.2"))
        assert answer["structuredContent"]["response"]["success"] is True
        assert held["structuredContent"]["response"]["timedOut"] is False, held  # not held to its deadline
        with trio.move_on_after(5):
            while any(_alive(pid) for pid in children):  # noqa: ASYNC110 (other processes' exits)
                await trio.sleep(0.05)
        assert [pid for pid in children if _alive(pid)] == []
    finally:
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


async def test_an_mcpg_configs_bindings_hold_hostile_uris_query_strings_and_commands(tmp_path):
    pidfile = tmp_path / "child.pid"
    async with echo_api() as api:
        config = write_config(tmp_path, BINDINGS.format(api=api.url, pidfile=pidfile))
        async with served(config) as server, httpx2.AsyncClient(timeout=60) as http:
            await _resource_templates(server, http)
            await _query_string(server, api)
            await _commands(server, pidfile)
            assert server.alive and "Traceback" not in server.text()


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
    # Milliseconds; a backtracking match of these 16 000 characters takes hours: 10 s tells them apart, loaded or not.
    assert time.perf_counter() - t0 < 10


# --- the access layer: issuers, token endpoints, Cedar, audit --------------------------------------------------


@dataclass
class HostileIdp:
    """An OpenID provider (``kit.oauth``'s keys and tokens) whose JWK Set answer is chosen by ``mode``:
    ``good``, ``hang`` (never answers), or garbage (``keys5``: ``{"keys": 5}``)."""

    mode: str = "good"
    oauth: OAuthServer = field(default_factory=OAuthServer)
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


@dataclass
class HostileTokens:
    """A token endpoint whose answer ``mode`` picks: ``good``, ``hang``, or a token that cannot be sent in a
    header (``euro``: ``tok€n``; ``crlf``: a header of its own)."""

    mode: str = "good"
    requests: int = 0

    def app(self) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                await lifespan(receive, send)
                return
            self.requests += 1
            if self.mode == "hang":
                await trio.sleep_forever()
            token = {"euro": "tok€n", "crlf": "t\r\nX-Evil: 1"}.get(self.mode, "good-token")
            await _answer(send, 200, {"access_token": token, "token_type": "Bearer", "expires_in": 3600})

        return app


HOLD_MS = 4000
"""The issuers' and token endpoints' ``timeout_ms``: how long one that never answers holds a caller. Long
enough that a caller held by one (``HOLD_MS``) and one answered at once (milliseconds, a second or two on a
loaded host) are told apart by half of it, and several holds one after another by twice it."""
HELD_S, AT_ONCE_S = 2 * HOLD_MS / 1000, HOLD_MS / 2000


def _access_config(issuers: dict[str, str], endpoints: dict[str, str], api: str, audit: Path) -> str:
    oidc = [
        {
            "issuer": url,
            "audiences": ["mcpipe"],
            "jwks_url": url + "/jwks",
            "allow_private": True,
            "timeout_ms": HOLD_MS,
            "refresh_s": 1,
        }
        for url in issuers.values()
    ]
    credentials = {
        name: {
            "kind": "client_credentials",
            "token_url": url + "/token",
            "client_id": "mcpipe",
            "client_secret": "s3cret",
            "allow_private": True,
            "timeout_ms": HOLD_MS,
        }
        for name, url in endpoints.items()
    }
    http = [
        {"name": name, "steps": [{"kind": "http", "id": "h", "url": api + "/v1/items", "credential": name}]}
        for name in endpoints
    ]
    cedar = "permit(principal, action, resource) unless { context has deny };"
    doc = {
        "audit": {"enabled": True, "path": str(audit)},
        "auth": {"tokens": [{"env": "OPS_TOKEN", "principal": "ops"}], "oidc": oidc, "tools": ["*"]},
        "access": {"gates": [{"kind": "cedar", "name": "authz", "arguments_as_context": True, "policies": cedar}]},
        "outbound": {"http": {"allow_private": True, "allowed_hosts": ["127.0.0.1"]}},
        "credentials": credentials,
        "pipelines": [{"name": "hello", "steps": [{"kind": "value", "id": "v", "value": "hi"}]}, *http],
    }
    return json.dumps(doc)


async def _hello(
    http: httpx2.AsyncClient, url: str, token: str, name: str = "hello", args: dict[str, Any] | None = None
) -> Any:
    args = args or {}
    t0 = time.perf_counter()
    body = orjson.dumps(call(name, args))
    r = await http.post(url, content=body, headers={**headers(name), "authorization": f"Bearer {token}"})
    message = None
    if r.status_code == 200:
        text = r.text
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            text = [line[5:] for line in text.splitlines() if line.startswith("data:")][-1]
        message = json.loads(text)
    return r.status_code, time.perf_counter() - t0, message


async def _many(http: httpx2.AsyncClient, url: str, tokens: list[str], name: str = "hello") -> list[Any]:
    out: list[Any] = []

    async def one(token: str) -> None:
        out.append(await _hello(http, url, token, name))

    async with trio.open_nursery() as nursery:
        for token in tokens:
            nursery.start_soon(one, token)
    return out


async def _jwk_sets(server: Served, http: httpx2.AsyncClient, hang: HostileIdp, late: HostileIdp) -> None:
    # Before: each request needing the keys waited for a fetch of its own, one after another under the cache's
    # lock: 8 callers behind a JWK Set server that never answers were answered 401 after 1, 2, ... 8 s
    # (timeout_ms 1000); with cached keys past refresh_s, every request waited for a fetch and its timeout. Here
    # the timeout is HOLD_MS, and a fetch is counted: the time bounds tell a hold from a loaded host.
    tokens = [hang.oauth.mint(f"user{i}") for i in range(8)]
    answers, slowest = await server.probed(lambda: _many(http, server.url, tokens))
    assert [a[0] for a in answers] == [401] * 8
    assert max(a[1] for a in answers) < HELD_S, answers  # one fetch (HOLD_MS) shared by all
    assert slowest < server.stall_s, server.health
    assert hang.fetches == 1
    # Within 5 s of the failure a token is refused at once, without a fetch.
    status, took, _ = await _hello(http, server.url, tokens[0])
    assert (status, hang.fetches) == (401, 1) and took < AT_ONCE_S
    # Someone with a static token is never held by an issuer.
    ops = await _many(http, server.url, ["ops-secret"] * 4)
    assert [a[0] for a in ops] == [200] * 4 and max(a[1] for a in ops) < AT_ONCE_S
    # Cached keys past refresh_s, the server hanging: callers go on with them while one of them fetches.
    tokens = [late.oauth.mint(f"user{i}") for i in range(8)]
    assert [a[0] for a in await _many(http, server.url, tokens)] == [200] * 8
    late.mode = "hang"
    await trio.sleep(1.1)
    answers = await _many(http, server.url, tokens)
    assert [a[0] for a in answers] == [200] * 8
    assert sorted(a[1] for a in answers)[6] < AT_ONCE_S, answers  # all but the one fetching, at once


async def _garbage_keys(server: Served, http: httpx2.AsyncClient, garbage: HostileIdp) -> None:
    # Before: `{"keys": 5}` raised TypeError out of the identity check: HTTP 500 and a traceback.
    status, _, _ = await _hello(http, server.url, garbage.oauth.mint("alice"))
    assert status == 401
    assert "the JWK Set holds no usable key" in server.text()


async def _token_endpoints(
    server: Served, http: httpx2.AsyncClient, garbage: HostileTokens, hang: HostileTokens, api: Any
) -> None:
    # Before: a token of `tok€n` was cached for its hour and every call failed with UnicodeEncodeError and a
    # traceback; with an endpoint that never answers, 6 callers waited 1, 2, ... 6 s (each its own request,
    # timeout_ms 1000, one at a time; here HOLD_MS).
    for mode in ("euro", "crlf"):
        garbage.mode = mode
        _, _, bad = await _hello(http, server.url, "ops-secret", "garbage")
        assert bad["result"]["isError"] is True
        assert "`access_token` that is not visible ASCII" in bad["result"]["content"][0]["text"]
    assert api.seen == []
    garbage.mode = "good"  # nothing bad was kept
    _, _, good = await _hello(http, server.url, "ops-secret", "garbage")
    assert good["result"]["isError"] is False and api.seen[-1]["authorization"] == "Bearer good-token"
    answers = await _many(http, server.url, ["ops-secret"] * 6, "silent")
    assert all(f"did not answer within {HOLD_MS} ms" in a[2]["result"]["content"][0]["text"] for a in answers)
    assert max(a[1] for a in answers) < HELD_S, answers
    assert hang.requests == 1


async def _cedar(server: Served, http: httpx2.AsyncClient) -> None:
    # Before: Cedar built and evaluated a 4.3 MB context (90 000 extension values) holding the interpreter, on
    # the event loop: /healthz held 1.8 s per call.
    bomb = {"ext": [{"__extn": {"fn": "ip", "arg": "10.0.0.1"}}] * 90_000}
    (_, _, refused), slowest = await server.probed(lambda: _hello(http, server.url, "ops-secret", args=bomb))
    assert slowest < server.stall_s, server.health
    text = refused["result"]["content"][0]["text"]
    assert "policy `authz` denied 'hello'" in text and "larger than 65536 bytes" in text
    _, _, small = await _hello(http, server.url, "ops-secret", args={"ext": bomb["ext"][:10]})
    assert small["result"]["isError"] is False


async def _audited_names(server: Served, http: httpx2.AsyncClient, audit: Path) -> None:
    # Before: mcpipe's audit format wrote the whole name the caller sent: a 3 MB name, a 3 MB line per call.
    session = await open_session(http, server.url, authorization="Bearer ops-secret")
    for _ in range(2):
        status, answer = await session.request("tools/call", {"name": "x" * 3_000_000, "arguments": {}})
        assert status == 200 and answer is not None
    assert max(len(line) for line in _lines(audit)) < 2048


async def test_the_access_layer_holds_hostile_issuers_token_endpoints_and_arguments(tmp_path):
    idps = {"hang": HostileIdp("hang"), "late": HostileIdp("good"), "garbage": HostileIdp("keys5")}
    tokens = {"garbage": HostileTokens("euro"), "silent": HostileTokens("hang")}
    audit = tmp_path / "audit.jsonl"
    async with (
        serving(idps["hang"].app()) as hang,
        serving(idps["late"].app()) as late,
        serving(idps["garbage"].app()) as garbage,
        serving(tokens["garbage"].app()) as garbage_tokens,
        serving(tokens["silent"].app()) as silent_tokens,
        echo_api() as api,
    ):
        issuers = {"hang": hang, "late": late, "garbage": garbage}
        for name, url in issuers.items():
            idps[name].oauth.url = url
        config = _access_config(issuers, {"garbage": garbage_tokens, "silent": silent_tokens}, api.url, audit)
        async with (
            served(write_config(tmp_path, config, ".json"), env={"OPS_TOKEN": "ops-secret"}) as server,
            httpx2.AsyncClient(timeout=30) as http,
        ):
            await _jwk_sets(server, http, idps["hang"], idps["late"])
            await _garbage_keys(server, http, idps["garbage"])
            await _token_endpoints(server, http, tokens["garbage"], tokens["silent"], api)
            await _cedar(server, http)
            await _audited_names(server, http, audit)
            assert server.alive and "Traceback" not in server.text()


def test_idle_rate_limit_buckets_are_dropped_from_the_front_as_new_ones_come():
    # Before: every 256th new bucket scanned them all (a 100 000-bucket limiter: 0.12 ms a call, 25 ms pauses);
    # now the least recently used are at the front, and a new bucket drops the idle ones there.
    now = [0.0]
    gate = RateLimiter(RateLimitGate(default_limit=5, cleanup_interval_ms=1000, max_buckets=100), "rl", lambda: now[0])

    def ctx(who: str) -> Any:
        return SimpleNamespace(principal=who, request=SimpleNamespace(sdk_context=None))

    for i in range(150):
        gate.check("t", {}, ctx(f"p{i}"))
    assert len(gate.buckets) == 100  # max_buckets: the least recently used went
    gate.check("t", {}, ctx("p149"))  # used again: moved to the end
    now[0] = 2.0
    gate.check("t", {}, ctx("late"))
    assert list(gate.buckets) == [(-1, "late")]
