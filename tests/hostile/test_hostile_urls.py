"""A caller's values interpolated into an outbound URL (issue 27, item 4): mcpg's vendored GitHub example
(``upstream/examples/06-github``) and mcpipe's own ``http`` kind, each served by a real ``mcpipe serve`` on
127.0.0.1 in front of an API on 127.0.0.1 that records every request. A value lands in one path segment
(percent-encoded), a dot segment is refused, and no request leaves the configured base; ``/healthz`` is
probed throughout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from kit.attack import Served, served, write_config
from kit.hostile import call, headers, result_of
from kit.mcpg_oracle import oracle_overlay, render, rewrite_hosts
from kit.oauth import EchoApi, echo_api

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

UPSTREAM = Path(__file__).parent.parent / "formats" / "mcpg" / "upstream"
TOKEN = "ghp_operator0000000000000000000000000000"

# `owner` values a caller may send: the first three reached `/admin/keys` with the operator's bearer before.
TRAVERSALS = [
    "../../admin/keys?",
    "../../admin/keys#",
    "..",
    "%2e%2e/%2e%2e/admin/keys?",
    "x/../../../admin/keys?",
]


async def _post(server: Served, name: str, arguments: Any, subject: str | None = None) -> Any:
    h = headers(name)
    if subject is not None:
        h["x-mcpg-subject-id"] = subject
    async with httpx2.AsyncClient(timeout=60) as http:
        r = await http.post(server.url, content=json.dumps(call(name, arguments)).encode(), headers=h)
    assert r.status_code == 200, (r.status_code, r.text[:300])
    return result_of(r.text, r.headers.get("content-type", ""))["result"]


def _outside(api: EchoApi, base: str) -> list[str]:
    """The raw paths the API was asked for that are not under ``base`` (as the API's router decodes them)."""
    return [s["raw_path"] for s in api.seen if not s["path"].startswith(base) or "/../" in s["path"]]


async def test_mcpg_github_example_keeps_a_callers_owner_inside_its_path_segment(tmp_path: Path) -> None:
    # Before: `${arguments.owner}` was joined raw into the URL: `../../admin/keys?` requested `/admin/keys`
    # with the operator's `Authorization: Bearer ${env.GITHUB_TOKEN}` (3 of the 5 payloads reached it).
    source = yaml.safe_load((UPSTREAM / "examples" / "06-github" / "config.yaml").read_text())
    async with echo_api() as api:
        doc = oracle_overlay(rewrite_hosts(source, {"https://api.github.com": "api"}))
        doc["governance"] = {"audit": {"enabled": False}}
        doc["gateway"]["server"]["health_path"] = "/healthz"  # where `kit.attack` probes
        ports = {"api": httpx2.URL(api.url).port or 80, "mcp": 0}
        config = write_config(tmp_path, render(yaml.safe_dump(doc), ports, str(tmp_path)))
        async with served(config, env={"GITHUB_TOKEN": TOKEN}) as server:

            async def attack() -> list[Any]:
                return [
                    await _post(server, "gh.issues.list", {"owner": owner, "repo": "hello"}, "mallory")
                    for owner in TRAVERSALS
                ]

            answers, slowest = await server.probed(attack)
            fine = await _post(server, "gh.issues.list", {"owner": "octo cat", "repo": "hello"}, "alice")
    assert slowest < server.stall_s, server.health
    assert _outside(api, "/repos/") == [], [s["raw_path"] for s in api.seen]
    for answer in answers:  # each refused before anything is sent, as mcpg answers a transport failure
        envelope = answer["structuredContent"]
        assert envelope["downstreamError"]["kind"] == "transport_error", envelope["downstreamError"]
        assert envelope["statusCode"] is None, envelope
        assert "holds a dot segment" in envelope["error"], envelope
    assert [s["raw_path"] for s in api.seen] == ["/repos/octo%20cat/hello/issues"]
    assert not fine.get("isError") and fine["structuredContent"]["statusCode"] == 200
    assert api.seen[-1]["authorization"] == f"Bearer {TOKEN}"


async def test_an_http_steps_url_template_keeps_a_callers_value_inside_its_path_segment(tmp_path: Path) -> None:
    # Before: mcpipe's own `http` kind joined `${args.owner}` raw into the URL as well: the same payloads
    # reached `/admin/keys` with the operator's token.
    async with echo_api() as api:
        config = {
            "audit": {"enabled": False},
            "outbound": {"http": {"allowed_hosts": ["127.0.0.1"], "allow_private": True}},
            "pipelines": [
                {
                    "name": "issues",
                    "input_schema": {"type": "object", "properties": {"owner": {"type": "string"}}},
                    "steps": [
                        {
                            "id": "get",
                            "kind": "http",
                            "url": api.url + "/repos/${args.owner}/hello/issues?state=${args.owner}",
                            "headers": {"authorization": f"Bearer {TOKEN}"},
                        }
                    ],
                }
            ],
        }
        async with served(write_config(tmp_path, json.dumps(config), ".json")) as server:

            async def attack() -> list[Any]:
                return [await server.call("issues", {"owner": owner}) for owner in TRAVERSALS]

            answers, slowest = await server.probed(attack)
            fine = await server.call("issues", {"owner": "octo cat&x=1"})
    assert slowest < server.stall_s, server.health
    for answer in answers:
        assert answer["isError"] is True and "FORBIDDEN" in answer["content"][0]["text"], answer
        assert "holds a dot segment" in answer["content"][0]["text"], answer
    assert not fine.get("isError"), fine
    assert [(s["raw_path"], s["query"]) for s in api.seen] == [
        ("/repos/octo%20cat%26x%3D1/hello/issues", "state=octo%20cat%26x%3D1")
    ]
