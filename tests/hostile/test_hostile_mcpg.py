"""mcpg's configs served (``formats/mcpg``) and the access layer under hostile callers: resource templates
matched against a caller's URI, Cedar gates deciding on a caller's arguments, OIDC issuers whose JWK Set
server is slow or answers garbage. Over HTTP against a real ``mcpipe serve``, ``/healthz`` probed."""

from __future__ import annotations

import time

import httpx2
import pytest

from kit.attack import served, write_config
from kit.session import open_session
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
