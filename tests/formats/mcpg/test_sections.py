"""mcpg sections that mcpipe once refused, served with mcpg's meaning over streamable HTTP: resource watches
(``watch``: mcpg's poll and webhook strategies, its notification filter), per-tenant session caps
(``gateway.server.max_sessions_per_tenant``). Each cites the mcpg source it follows."""

from __future__ import annotations

import json
import warnings
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2 as httpx
import mcp_types as types
import orjson
import pytest
import trio
import yaml

from kit.mcpg_oracle import StandIn, oracle_overlay, render, rewrite_hosts
from kit.servers import http_server
from mcpipe.config import ConfigError, parse_config
from mcpipe.server import open_app

pytestmark = [
    # The SDK's HTTP client leaves its SSE reader to the garbage collector when a session closes.
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

HERE = Path(__file__).parent
UPSTREAM = HERE / "upstream"


def _load(doc: dict[str, Any], environ: dict[str, str] | None = None) -> Any:
    return parse_config(yaml.safe_dump(doc), "yaml", environ=environ or {})


def _client(url: str, subject: str | None, handler: Any = None, mode: str = "legacy") -> Any:
    """The SDK's client over HTTP, a header-asserted caller (``x-mcpg-subject-id``) when ``subject`` is set."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    @asynccontextmanager
    async def transport() -> Any:
        headers = {"x-mcpg-subject-id": subject} if subject else None
        async with create_mcp_http_client(headers=headers) as h, streamable_http_client(url, http_client=h) as s:
            yield s

    return Client(transport(), mode=mode, message_handler=handler)


class Heard:
    def __init__(self) -> None:
        self.uris: list[str] = []
        self.event = trio.Event()

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            self.uris.append(str(message.params.uri))
            self.event.set()


# --- watch ------------------------------------------------------------------------------------------


def _google_workspace(port: int) -> dict[str, Any]:
    """mcpg's example 20 as it is, its Google hosts pointed at a stand-in (the oracle's overlay: a loopback
    listener, private backends allowed, the subject header trusted)."""
    doc = yaml.safe_load((UPSTREAM / "examples/20-google-workspace/config.yaml").read_text())
    hosts = {
        h: "google"
        for h in ("https://www.googleapis.com", "https://gmail.googleapis.com", "https://docs.googleapis.com")
    }
    text = render(json.dumps(oracle_overlay(rewrite_hosts(doc, hosts))), {"google": port, "mcp": 0}, "/tmp")
    out: dict[str, Any] = json.loads(text)
    out.pop("plugins", None)  # the oracle's plugin rows name its built cdylibs: mcpipe has these backends built in
    return out


async def test_the_google_workspace_example_serves_its_watches_a_webhook_tells_the_drive_folder_subscribers() -> None:
    # watch_engine.rs: a webhook POST on /webhooks/resource-updated/{token} fans out to the URI's subscribers.
    env = {"GOOGLE_TOKEN": "g-token", "DRIVE_WEBHOOK_TOKEN": "drive-hook-1"}
    with StandIn([{"method": "GET", "path": "/drive/v3/files", "body": {"files": []}}]) as google:
        config = _load(_google_workspace(google.port), env)
        watches = {p["name"]: p.get("watch") for p in config.pipelines if p.get("watch")}
        heard = Heard()
        with trio.fail_after(30):
            async with (
                open_app(config) as app,
                http_server(app) as url,
                httpx.AsyncClient() as http,
                _client(url, "alice", heard) as client,
            ):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    await client.subscribe_resource("drive://folder/reports-push")
                base = url.rsplit("/mcp", 1)[0]
                hooked = await http.post(f"{base}/webhooks/resource-updated/drive-hook-1", json={"kind": "sync"})
                await heard.event.wait()
    assert watches == {
        "drive.folder.contents": {"poll_ms": 60000},
        "drive.file.metadata": {"poll_ms": 30000},
        "docs.document.revision": {"poll_ms": 30000},
        "calendar.events.recent": {"poll_ms": 120000},
        "gmail.unread": {"poll_ms": 60000},  # `subject_id` falls back to every subscriber for a poll's event
        "drive.folder.pushed": {"webhook_tokens": ["drive-hook-1"]},
    }
    assert hooked.status_code == 200 and hooked.json() == {"ok": True, "uri": "drive://folder/reports-push"}
    assert heard.uris == ["drive://folder/reports-push"]


def _watched(watch: dict[str, Any]) -> dict[str, Any]:
    return {
        "mcp": {
            "capabilities": {
                "resources": [
                    {
                        "name": "r",
                        "description": "d",
                        "uri": "res://r",
                        "governance": {"minimum_trust": "unauthenticated"},
                        "backend": {"kind": "mock", "response": {"contents": [{"uri": "res://r", "text": "x"}]}},
                        "watch": watch,
                    }
                ]
            }
        }
    }


def test_mcpgs_poll_floor_of_ten_seconds_and_its_expression_filter_carry_over() -> None:
    # watch_engine.rs poll_interval: max(interval_ms, 10 s); NotificationFilterConfig::Expression.
    watch = {
        "strategy": {"type": "poll", "interval_ms": 500},
        "notification_filter": {"scope": "expression", "expression": 'subscriber.trust_level == "verified"'},
    }
    config = _load(_watched(watch))
    assert config.pipelines[0]["watch"] == {"poll_ms": 10000, "notify_if": 'subscriber.trust_level == "verified"'}


@pytest.mark.parametrize("kind", ["nats_topic", "kafka_topic", "sql_polling", "postgres_listen_notify", "plugin"])
def test_a_watch_strategy_mcpipe_lacks_is_refused_at_its_place(kind: str) -> None:
    with pytest.raises(ConfigError) as e:
        strategy = {"type": kind, "subject": "s", "topic": "t", "kind": "k", "url": "u", "channel": "c"}
        _load(_watched({"strategy": strategy}))
    [problem] = e.value.problems
    assert problem.location == "mcp.capabilities.resources[0].watch.strategy.type"
    assert problem.message == f"the `{kind}` watch strategy is not in mcpipe (it watches by `poll` and `webhook`)"


async def test_a_2026_listener_of_a_watched_mcpg_resource_hears_the_webhook() -> None:
    doc = _watched({"strategy": {"type": "webhook", "token": "t-1"}})
    with trio.fail_after(30):
        async with (
            open_app(_load(doc)) as app,
            http_server(app) as url,
            httpx.AsyncClient() as http,
            _client(url, None, mode="2026-07-28") as client,
            client.listen(resource_subscriptions=["res://r"]) as sub,
        ):
            base = url.rsplit("/mcp", 1)[0]
            assert (await http.post(f"{base}/webhooks/resource-updated/t-1")).status_code == 200
            event = await anext(aiter(sub))
    assert getattr(event, "uri", None) == "res://r"


# --- per-tenant session caps ------------------------------------------------------------------------

INIT = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}


async def _open(http: httpx.AsyncClient, url: str, subject: str | None) -> httpx.Response:
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    if subject:
        headers["x-mcpg-subject-id"] = subject
    message = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}
    return await http.post(url, content=orjson.dumps(message), headers=headers)


async def test_max_sessions_per_tenant_refuses_a_tenants_next_session_and_counts_anonymous_callers_as_one() -> None:
    # runtime/sessions.rs try_acquire_tenant_session, handlers/lifecycle.rs: 429, -32099 "per-tenant session
    # quota exceeded"; a tenant is synthetic_principal_key (trust-qualified), anonymous callers share one.
    doc = {
        "gateway": {"server": {"max_sessions_per_tenant": 2, "trust_subject_header": True}},
        "mcp": {"capabilities": {"tools": [{"name": "t", "description": "d", "backend": {"kind": "mock"}}]}},
    }
    with trio.fail_after(30):
        async with open_app(_load(doc)) as app, http_server(app) as url, httpx.AsyncClient(timeout=20) as http:
            alice = [await _open(http, url, "alice") for _ in range(3)]
            bob = await _open(http, url, "bob")
            anonymous = [await _open(http, url, None) for _ in range(3)]
            sid = alice[0].headers["mcp-session-id"]
            await http.delete(url, headers={"mcp-session-id": sid, "x-mcpg-subject-id": "alice"})
            again = await _open(http, url, "alice")
    assert [r.status_code for r in alice] == [200, 200, 429]
    assert alice[2].json()["error"] == {"code": -32099, "message": "per-tenant session quota exceeded"}
    assert bob.status_code == 200
    assert [r.status_code for r in anonymous] == [200, 200, 429]
    assert again.status_code == 200  # a session that ends gives its room back
