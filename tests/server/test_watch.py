"""A declared resource with a ``watch`` tells its subscribers when it changes (``notifications/resources/updated``),
over streamable HTTP in both protocol eras: polled while someone is subscribed (the first read is the baseline,
a changed first text notifies), or told by a webhook; ``notify_if`` chooses who hears it."""

from __future__ import annotations

import json
import warnings
from typing import Any

import httpx2 as httpx
import mcp_types as types
import pytest
import trio

from kit.clients import bearer_client
from kit.mcpg_oracle import StandIn
from kit.servers import http_server
from mcpipe.config import ConfigError, parse_config
from mcpipe.server import open_app

pytestmark = [
    # The SDK's HTTP client leaves its SSE reader to the garbage collector when a session closes.
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


def _doc(url: str, watch: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {
        "audit": {"enabled": False},
        "builtins": False,
        "outbound": {"http": {"allowed_hosts": ["127.0.0.1"], "allow_private": True}},
        "pipelines": [
            {
                "name": "board",
                "description": "The board.",
                "surface": "resource",
                "uri": "board://main",
                "mime_type": "application/json",
                "steps": [{"kind": "http", "id": "get", "url": url, "method": "GET"}],
                "output": "${steps.get.output.body}",
                "watch": watch,
            }
        ],
        **more,
    }


def _config(doc: dict[str, Any], environ: dict[str, str] | None = None) -> Any:
    return parse_config(json.dumps(doc), "json", environ=environ or {})


class Heard:
    """The resource updates a client heard."""

    def __init__(self) -> None:
        self.uris: list[str] = []
        self.event = trio.Event()

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            self.uris.append(str(message.params.uri))
            self.event.set()


async def test_a_2025_subscriber_hears_a_polled_resource_change_once_and_polling_stops_when_it_leaves() -> None:
    with StandIn([{"method": "GET", "path": "/board", "body": {"v": 1}}]) as api:
        doc = _doc(f"http://127.0.0.1:{api.port}/board", {"poll_ms": 100})
        heard = Heard()
        with trio.fail_after(30):
            async with (
                open_app(_config(doc)) as app,
                http_server(app) as url,
                bearer_client(url, None, mode="legacy", message_handler=heard) as client,
            ):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # resources/subscribe is the 2025-11-25 way
                    await client.subscribe_resource("board://main")
                # The baseline, then reads that find it unchanged (waited for: a loaded host polls late).
                while len(api.received) < 3:  # noqa: ASYNC110 (another server's requests: nothing to wait on)
                    await trio.sleep(0.05)
                assert heard.uris == []
                api.routes[0].body = {"v": 2}
                await heard.event.wait()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    await client.unsubscribe_resource("board://main")
                await trio.sleep(0.3)
                reads = len(api.received)
                await trio.sleep(0.4)
                assert len(api.received) == reads  # nobody is subscribed: nothing is read any more
    assert heard.uris == ["board://main"]
    assert all(r["path"] == "/board" for r in api.received)


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_webhook_post_tells_the_subscribers_at_once_and_an_unknown_token_is_404(mode: str) -> None:
    with StandIn([{"method": "GET", "path": "/board", "body": {"v": 1}}]) as api:
        doc = _doc(f"http://127.0.0.1:{api.port}/board", {"webhook_tokens": ["tok-new", "tok-old"]})
        heard = Heard()
        with trio.fail_after(30):
            async with (
                open_app(_config(doc)) as app,
                http_server(app) as url,
                httpx.AsyncClient() as http,
                bearer_client(url, None, mode=mode, message_handler=heard) as client,
            ):
                base = url.rsplit("/mcp", 1)[0]
                if mode == "legacy":
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        await client.subscribe_resource("board://main")
                    hooked = await http.post(f"{base}/webhooks/resource-updated/tok-old", content=b"")
                    await heard.event.wait()
                    events = heard.uris
                else:
                    async with client.listen(resource_subscriptions=["board://main"]) as sub:
                        hooked = await http.post(f"{base}/webhooks/resource-updated/tok-new", json={"any": 1})
                        events = [getattr(await anext(aiter(sub)), "uri", None)]
                unknown = await http.post(f"{base}/webhooks/resource-updated/nope")
    assert hooked.status_code == 200 and hooked.json() == {"ok": True, "uri": "board://main"}
    assert events == ["board://main"]
    assert unknown.status_code == 404 and unknown.json() == {"error": "unknown webhook token"}
    assert api.received == []  # a webhook reads nothing


async def test_notify_if_tells_only_the_subscribers_it_holds_for() -> None:
    with StandIn([{"method": "GET", "path": "/board", "body": {"v": 1}}]) as api:
        watch = {"webhook_tokens": ["t"], "notify_if": 'subscriber.principal_id == "alice"'}
        doc = _doc(f"http://127.0.0.1:{api.port}/board", watch, trust={"subject_header": "x-subject"})
        alice, bob = Heard(), Heard()
        with trio.fail_after(30):
            async with open_app(_config(doc)) as app, http_server(app) as url, httpx.AsyncClient() as http:
                clients = [_subject_client(url, "alice", alice), _subject_client(url, "bob", bob)]
                async with clients[0] as a, clients[1] as b:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        await a.subscribe_resource("board://main")
                        await b.subscribe_resource("board://main")
                    base = url.rsplit("/mcp", 1)[0]
                    assert (await http.post(f"{base}/webhooks/resource-updated/t")).status_code == 200
                    await alice.event.wait()
                    await trio.sleep(0.3)
    assert alice.uris == ["board://main"] and bob.uris == []


def _subject_client(url: str, subject: str, handler: Any) -> Any:
    from contextlib import asynccontextmanager

    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    @asynccontextmanager
    async def transport() -> Any:
        async with (
            create_mcp_http_client(headers={"x-subject": subject}) as h,
            streamable_http_client(url, http_client=h) as s,
        ):
            yield s

    return Client(transport(), mode="legacy", message_handler=handler)


@pytest.mark.parametrize(
    ("watch", "surface", "where", "says"),
    [
        ({}, "resource", "pipelines.board.watch", "a watch needs `poll_ms` or `webhook_tokens`"),
        ({"poll_ms": 10}, "resource", "pipelines.board.watch.poll_ms", "Expected `int` >= 100"),
        ({"webhook_tokens": ["t"], "notify_if": "x =="}, "resource", "pipelines.board.watch.notify_if", "syntax error"),
        ({"poll_ms": 1000}, "resource_template", "pipelines.board.watch", "only a resource (one `uri`)"),
    ],
)
def test_a_watch_that_cannot_work_is_refused_at_load_located(
    watch: dict[str, Any], surface: str, where: str, says: str
) -> None:
    doc = _doc("http://127.0.0.1:1/board", watch)
    entry = doc["pipelines"][0]
    if surface == "resource_template":
        entry.update(surface=surface, uri_template="board://{id}")
        del entry["uri"]
    with pytest.raises(ConfigError) as e:
        _config(doc)
    assert any(p.location == where and says in p.message for p in e.value.problems), e.value.problems
