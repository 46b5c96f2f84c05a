"""mcpg sections that mcpipe once refused, served with mcpg's meaning over streamable HTTP: resource watches
(``watch``: mcpg's poll and webhook strategies, its notification filter), per-tenant session caps
(``gateway.server.max_sessions_per_tenant``). Each cites the mcpg source it follows."""

from __future__ import annotations

import base64
import json
import sys
import warnings
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2 as httpx
import mcp_types as types
import msgspec
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
        watches = {p.name: msgspec.to_builtins(p.watch) for p in config.pipelines if p.watch is not None}
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
    watched = msgspec.to_builtins(config.pipelines[0].watch)
    assert watched == {"poll_ms": 10000, "notify_if": 'subscriber.trust_level == "verified"'}


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


# --- the SQL plugin: list_query, dynamic completions, stream ------------------------------------------


def _sql(path: Path, **backend: Any) -> dict[str, Any]:
    return {"kind": "sql", "driver": "sqlite", "url": f"sqlite:{path}?mode=rwc", **backend}


def _docs_db(path: Path, n: int = 5) -> None:
    import sqlite3

    db = sqlite3.connect(path)
    db.execute("CREATE TABLE docs (id INTEGER PRIMARY KEY, slug TEXT, title TEXT, owner TEXT)")
    db.executemany(
        "INSERT INTO docs (slug, title, owner) VALUES (?, ?, ?)",
        [(f"page{i}", f"Page {i}", "acme" if i % 2 else "globex") for i in range(1, n + 1)],
    )
    db.commit()
    db.close()


def _templates(path: Path, **template: Any) -> dict[str, Any]:
    base = {
        "name": "docs.read",
        "description": "One doc.",
        "uri_template": "docs://{slug}",
        "mime_type": "text/markdown",
        "governance": {"minimum_trust": "unauthenticated"},
        "backend": _sql(
            path,
            query={
                "sql": "SELECT 'docs://' || slug AS uri, title AS text FROM docs WHERE slug = :slug",
                "params": ["slug"],
                "row_mode": "resource_contents",
            },
        ),
    }
    return {"mcp": {"capabilities": {"resource_templates": [{**base, **template}]}}}


async def test_a_list_query_lists_its_rows_page_by_page_after_the_fixed_resources(tmp_path: Path) -> None:
    # lib.rs run_list_query / batch_to_resource_page, runtime/enumeration.rs: keyset pages of page_size, the
    # cursor the last row's cursor_column, none once a page comes back short; the binding's name by default.
    _docs_db(tmp_path / "docs.db")
    doc = _templates(tmp_path / "docs.db")
    backend = doc["mcp"]["capabilities"]["resource_templates"][0]["backend"]
    backend["list_query"] = {
        "sql": "SELECT id, 'docs://' || slug AS uri, CASE WHEN id = 2 THEN NULL ELSE title END AS name, "
        "'text/markdown' AS mime_type FROM docs WHERE (:cursor IS NULL OR id > CAST(:cursor AS INTEGER)) "
        "ORDER BY id LIMIT :page_size",
        "mode": "keyset",
        "cursor_column": "id",
        "page_size": 2,
    }
    pages = []
    with trio.fail_after(30):
        async with open_app(_load(doc)) as app, http_server(app) as url, _client(url, None) as client:
            cursor = None
            while True:
                page = await client.list_resources(cursor=cursor) if cursor else await client.list_resources()
                pages.append([(r.uri, r.name) for r in page.resources])
                cursor = page.next_cursor
                if not cursor:
                    break
            read = await client.read_resource("docs://page3")
    assert pages == [
        [("docs://page1", "Page 1"), ("docs://page2", "docs.read")],
        [("docs://page3", "Page 3"), ("docs://page4", "Page 4")],
        [("docs://page5", "Page 5")],
    ]
    assert read.contents[0].text == "Page 3"  # type: ignore[union-attr]


async def test_an_offset_list_query_pages_to_its_end_and_a_forged_or_anothers_cursor_is_invalid(
    tmp_path: Path,
) -> None:
    # Before: the next offset was the page's row count alone (mcpg's plugin; its host does not add the prior
    # offset), so every page after the second repeated the second; and a resources/list cursor was unsigned
    # base64 JSON, so a caller set a listing's offset to "-1", "9" * 4000 or another's and it reached the
    # database. Now offsets add up, cursors are signed for their caller and checked before they are decoded,
    # and an offset is ASCII digits up to 2**63 - 1 (mcpg's wording otherwise).
    _docs_db(tmp_path / "docs.db")
    doc = _templates(tmp_path / "docs.db")
    backend = doc["mcp"]["capabilities"]["resource_templates"][0]["backend"]
    backend["list_query"] = {
        "sql": "SELECT 'docs://' || slug AS uri FROM docs ORDER BY id LIMIT :page_size OFFSET :cursor",
        "mode": "offset",
        "page_size": 2,
    }
    pages: list[list[str]] = []
    refused: list[str] = []
    with trio.fail_after(30):
        async with (
            open_app(_load(doc)) as app,
            http_server(app) as url,
            _client(url, None) as client,
            _client(url, None) as other,
        ):
            page = await client.list_resources()
            first = page.next_cursor
            while len(pages) < 5:
                pages.append([r.uri for r in page.resources])
                if not page.next_cursor:
                    break
                page = await client.list_resources(cursor=page.next_cursor)
            assert first is not None
            body = first.removeprefix("l.").partition(".")[0]
            listing = next(iter(orjson.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))))
            for offset in ("-1", "9" * 4000, "3"):
                forged = base64.urlsafe_b64encode(orjson.dumps({listing: offset})).decode().rstrip("=")
                for cursor in (f"l.{forged}", f"l.{forged}.{first.rsplit('.', 1)[-1]}"):
                    with pytest.raises(Exception) as e:
                        await client.list_resources(cursor=cursor)
                    refused.append(str(e.value))
            with pytest.raises(Exception) as e:
                await other.list_resources(cursor=first)  # another session's
            refused.append(str(e.value))
    assert pages == [["docs://page1", "docs://page2"], ["docs://page3", "docs://page4"], ["docs://page5"]]
    assert refused == ["Invalid cursor"] * 7


def test_an_offset_cursor_is_decimal_digits_up_to_a_64_bit_integer() -> None:
    from mcpipe.formats.mcpg._sqlmore import MAX_OFFSET, offset_of
    from mcpipe.results import StepFailure

    assert [offset_of(c) for c in (None, "", "0", "7", "+7", str(MAX_OFFSET))] == [0, 0, 0, 7, 7, MAX_OFFSET]
    for bad in ("-1", " 5", "5 ", "1_000", "\u0663", "1.5", "0x10", str(MAX_OFFSET + 1), "9" * 4000, 5, "+"):
        with pytest.raises(StepFailure, match="is not a non-negative integer"):
            offset_of(bad)


def test_a_list_query_mcpgs_plugin_would_refuse_is_refused_with_its_message(tmp_path: Path) -> None:
    doc = _templates(tmp_path / "docs.db")
    backend = doc["mcp"]["capabilities"]["resource_templates"][0]["backend"]
    backend["list_query"] = {"sql": "SELECT 'docs://x' AS uri WHERE :owner = 1", "mode": "offset"}
    with pytest.raises(ConfigError) as e:
        _load(doc)
    assert [(p.location, p.message) for p in e.value.problems] == [
        (
            "mcp.capabilities.resource_templates[0].backend.list_query",
            "list_query references ':owner' but only ':cursor' and ':page_size' are bound by the plugin",
        )
    ]


async def test_a_dynamic_variable_completion_runs_its_query_on_the_named_sql_bindings_database(tmp_path: Path) -> None:
    # handlers/completion.rs, lib.rs complete_template_variable: `:prefix` and `:ctx_<key>` bound, the first
    # column of each row offered; a query that fails offers nothing. Static values answer as before.
    _docs_db(tmp_path / "docs.db")
    completions = {
        "owner": ["acme", "globex"],
        "slug": {
            "kind": "dynamic",
            "backend": "docs.count",
            "config": {
                "query": "SELECT slug FROM docs WHERE owner = :ctx_owner AND slug LIKE :prefix || '%' ORDER BY id",
                "max_results": 2,
            },
        },
        "broken": {"kind": "dynamic", "backend": "docs.count", "config": {"query": "SELECT nope FROM nothing"}},
        "elsewhere": {"kind": "dynamic", "backend": "no.such.binding", "config": {"query": ":prefix"}},
    }
    doc = _templates(tmp_path / "docs.db", uri_template="docs://{owner}/{slug}/{broken}/{elsewhere}")
    doc["mcp"]["capabilities"]["resource_templates"][0]["variable_completions"] = completions
    doc["mcp"]["capabilities"]["tools"] = [
        {
            "name": "docs.count",
            "description": "How many docs.",
            "backend": _sql(
                tmp_path / "docs.db", query={"sql": "SELECT count(*) AS n FROM docs", "row_mode": "scalar"}
            ),
        }
    ]
    template = types.ResourceTemplateReference(type="ref/resource", uri="docs://{owner}/{slug}/{broken}/{elsewhere}")
    with trio.fail_after(30):
        async with open_app(_load(doc)) as app, http_server(app) as url, _client(url, None) as client:
            slug = await client.complete(template, {"name": "slug", "value": "page"}, {"owner": "acme"})
            other = await client.complete(template, {"name": "slug", "value": "page"}, {"owner": "globex"})
            owner = await client.complete(template, {"name": "owner", "value": "a"})
            broken = await client.complete(template, {"name": "broken", "value": ""})
            elsewhere = await client.complete(template, {"name": "elsewhere", "value": ""})
    assert (slug.completion.values, slug.completion.total, slug.completion.has_more) == (["page1", "page3"], 2, False)
    assert other.completion.values == ["page2", "page4"]
    assert owner.completion.values == ["acme"]
    assert broken.completion.values == [] and elsewhere.completion.values == []


async def test_a_stream_binding_pages_its_rows_with_a_signed_cursor_and_refuses_a_forged_one(tmp_path: Path) -> None:
    # stream.rs and lib.rs apply_stream_cursor / mint_next_cursor: {rows, truncated, next_cursor}; `_cursor`
    # binds `:_after_<col>` (the caller cannot set it), a tampered cursor fails verification.
    _docs_db(tmp_path / "docs.db")
    query = {
        "sql": "SELECT id, slug FROM docs WHERE id > :_after_id ORDER BY id LIMIT 3",
        "row_mode": "stream",
        "max_rows": 2,
        "stream": {"cursor_columns": ["id"], "initial": {"id": 0}},
    }
    tool = {
        "name": "docs.stream",
        "description": "Docs, a page at a time.",
        "governance": {"minimum_trust": "unauthenticated"},
        "input_schema": {"type": "object", "properties": {"_cursor": {"type": "string"}}},
        "backend": _sql(tmp_path / "docs.db", query=query),
    }
    doc = {"mcp": {"capabilities": {"tools": [tool]}}}
    pages: list[Any] = []
    with trio.fail_after(30):
        async with open_app(_load(doc)) as app, http_server(app) as url, _client(url, None) as client:
            args: dict[str, Any] = {}
            while True:
                r = await client.call_tool("docs.stream", args)
                pages.append(r.structured_content)
                if not r.structured_content or not r.structured_content["rows"]:
                    break
                args = {"_cursor": r.structured_content["next_cursor"]}
            token = pages[0]["next_cursor"]
            forged = await client.call_tool(
                "docs.stream", {"_cursor": token[:-2] + ("AA" if token[-2:] != "AA" else "BB")}
            )
    assert [[row["id"] for row in p["rows"]] for p in pages] == [[1, 2], [3, 4], [5], []]
    assert [p["truncated"] for p in pages] == [True, True, False, False]
    assert [p["next_cursor"] is None for p in pages] == [False, False, False, True]
    assert forged.is_error
    assert forged.content[0].text == (  # type: ignore[union-attr]
        "sql request failed: invalid binding spec: stream cursor: token failed verification (malformed, tampered, "
        "signed by a different gateway instance without shared signing_key, or for a different binding)"
    )


def test_a_stream_binding_mcpgs_plugin_would_refuse_is_refused_with_its_message(tmp_path: Path) -> None:
    query = {"sql": "SELECT id FROM docs", "row_mode": "stream", "stream": {"cursor_columns": ["id"]}}
    doc = {
        "mcp": {
            "capabilities": {
                "tools": [{"name": "s", "description": "d", "backend": _sql(tmp_path / "d.db", query=query)}]
            }
        }
    }
    with pytest.raises(ConfigError) as e:
        _load(doc)
    [problem] = e.value.problems
    assert problem.location == "mcp.capabilities.tools[0].backend.query.stream"
    assert problem.message.startswith("row_mode: stream — query.sql must reference placeholder `:_after_id`")


# --- debug tools --------------------------------------------------------------------------------------


def _debug_doc(standin: int) -> dict[str, Any]:
    return {
        "gateway": {"server": {"allow_private_backends": True, "mcp_path": "/mcp"}},
        "feature_flags": {"debug_tools_enabled": True},
        "debug": {
            "tools": {
                "command_profiles": {
                    "default_command_probe": {"command": "printf", "args": ["probe-%s\\n", "ok"], "max_output_bytes": 6}
                },
                "network_profiles": {
                    "default_network_probe": {
                        "url": f"http://127.0.0.1:{standin}/health",
                        "expected_status_codes": [204],
                        "headers": {"X-Probe": "1"},
                    }
                },
            }
        },
        "governance": {"policy": {"tool_access": {"default_minimum_trust": "unauthenticated"}}},
        "mcp": {"capabilities": {"tools": [{"name": "t", "description": "d", "backend": {"kind": "mock"}, **OPEN}]}},
    }


OPEN = {"governance": {"minimum_trust": "unauthenticated"}}


async def test_mcpgs_debug_tools_prompt_and_resource_answer_as_mcpgs_debug_executor(tmp_path: Path) -> None:
    # capability_registry.rs (the descriptors), execution/mod.rs execute_command_probe / execute_network_probe /
    # RequestEcho, handlers/capabilities_list.rs (the overview prompt and resource).
    with StandIn([{"method": "GET", "path": "/health", "body": {"ok": True}}]) as api:
        with trio.fail_after(30):
            async with (
                open_app(_load(_debug_doc(api.port))) as app,
                http_server(app) as url,
                _client(url, None) as client,
            ):
                tools = {t.name: t for t in (await client.list_tools()).tools}
                command = await client.call_tool("mcpg.debug.command_probe", {})
                network = await client.call_tool("mcpg.debug.network_probe", {})
                echo = await client.call_tool("mcpg.request.echo", {"x": 1})
                prompt = await client.get_prompt("mcpg_operational_overview")
                overview = await client.read_resource("mcpg://runtime/overview")
    assert sorted(tools) == [
        "mcpg.debug.command_probe", "mcpg.debug.network_probe", "mcpg.request.echo", "mcpg.runtime.snapshot", "t",
    ]  # fmt: skip
    assert command.content[0].text == "Executed configured debug command for tool mcpg.debug.command_probe."  # type: ignore[union-attr]
    c = command.structured_content or {}
    assert (c["stdout"], c["stdoutTruncated"], c["exitCode"], c["success"], c["timedOut"]) == (
        "probe-",
        True,
        0,
        True,
        False,
    )
    n = network.structured_content or {}
    assert network.is_error  # 200 is not the expected 204: mcpg's downstream error, retry guidance and all
    assert (n["statusCode"], n["body"], n["requestHeaders"]) == (200, '{"ok": true}', {"X-Probe": "1"})
    assert n["downstreamError"]["code"] == "mcpg.downstream_http.unexpected_status_code"
    assert api.received[0]["headers"]["x-probe"] == "1" and api.received[0]["headers"]["accept"] == "*/*"
    e = echo.structured_content or {}
    assert (e["arguments"], e["request"]["identityKind"], e["request"]["trustLevel"]) == (
        {"x": 1},
        "anonymous",
        "unauthenticated",
    )
    text = prompt.messages[0].content.text  # type: ignore[union-attr]
    assert text.endswith("Available tools: 5. Available prompts: 1. Available resources: 1.")
    snapshot = json.loads(overview.contents[0].text)  # type: ignore[union-attr]
    assert snapshot["mcp_path"] == "/mcp" and snapshot["readiness"]["status"] == "ready"


async def test_the_vendored_debug_config_serves_its_runtime_snapshot_to_the_caller_its_rules_admit() -> None:
    # src/config/tests.rs load_merges_yaml_file: the global cel_allow_if admits only mcpg.runtime.snapshot.
    doc = yaml.safe_load((UPSTREAM / INDEX_DEBUG).read_text())
    doc["gateway"]["server"].update(bind_address="127.0.0.1:0", trust_subject_header=True)
    with trio.fail_after(30):
        async with open_app(_load(doc)) as app, http_server(app) as url, _client(url, "user-1") as client:
            tools = [t.name for t in (await client.list_tools()).tools]
            snap = await client.call_tool("mcpg.runtime.snapshot", {})
    assert tools == ["mcpg.runtime.snapshot"]
    s = snap.structured_content or {}
    assert (s["bind_address"], s["health_path"], s["mcp_path"]) == ("127.0.0.1:0", "/status", "/gateway/mcp")
    assert s["logging"] == {"level": "debug", "sinks": ["stderr"], "initialized": True}


INDEX_DEBUG = "src/config/tests.rs@load_merges_yaml_file.yaml"


def test_a_debug_config_mcpg_refuses_is_refused_with_its_message() -> None:
    doc = {"feature_flags": {"debug_tools_enabled": True}, "debug": {"tools": {"exposure": {"command_probe": False}}}}
    with pytest.raises(ConfigError) as e:
        _load(doc)
    assert [(p.location, p.message) for p in e.value.problems] == [
        (
            "debug.tools.command_profiles",
            "debug.tools.command_profiles must contain 'default_command_probe' when debug is enabled",
        )
    ]


# --- MCP Apps -----------------------------------------------------------------------------------------


def _mcp_apps() -> dict[str, Any]:
    """mcpg's mcp-apps deployment example, its partner upstream pointed at a closed local port, and the subject
    header trusted (its templated apps have mcpg's default floor, header_asserted)."""
    doc = yaml.safe_load((UPSTREAM / "examples/deployments/mcp-apps.yaml").read_text())
    doc["mcp"]["federations"][0]["upstream"]["url"] = "http://127.0.0.1:1/mcp"
    doc["gateway"]["server"].update(bind_address="127.0.0.1:0", trust_subject_header=True)
    return doc


async def test_the_mcp_apps_example_advertises_the_extension_and_serves_its_templated_and_ui_resources() -> None:
    # gateway_apps.rs compile_app / render_html / data_island; apps.rs apply_apps_policy_to_items;
    # v_2026_07_28/dispatch/lifecycle.rs: extensions["io.modelcontextprotocol/ui"] = {mimeTypes: [...]}.
    with trio.fail_after(30):
        async with open_app(_load(_mcp_apps())) as app, http_server(app) as url, httpx.AsyncClient() as http:
            discovered = await http.post(url, json=DISCOVER, headers=DISCOVER_HEADERS)
            extensions = discovered.json()["result"]["capabilities"]["extensions"]
            async with _client(url, "alice") as client:
                listed = {str(res.uri): res for res in (await client.list_resources()).resources}
                table = await client.read_resource("ui://mcpg/customers")
                chart = await client.read_resource("ui://analytics/chart")
                tools = {t.name: t for t in (await client.list_tools()).tools}
    # 2026-07-28 (server/discover): the SDK keeps a 2025-11-25 initialize result to that version's fields.
    assert extensions["io.modelcontextprotocol/ui"] == {"mimeTypes": ["text/html;profile=mcp-app"]}
    apps = {"ui://mcpg/customers", "ui://mcpg/account", "ui://mcpg/new-account", "ui://mcpg/revenue"}
    assert {"ui://analytics/chart", *apps} <= set(listed)
    customers = listed["ui://mcpg/customers"]
    assert (customers.name, customers.title, customers.mime_type) == ("customers", "Customers", APP_MIME)
    assert customers.meta == {"ui": {"resourceUri": "ui://mcpg/customers"}}
    content = table.contents[0]
    assert content.mime_type == APP_MIME
    html = content.text  # type: ignore[union-attr]
    island = html.split('<script type="application/json" id="mcpg-app-config">', 1)[1].split("</script>", 1)[0]
    assert "<" not in island and json.loads(island) == {
        "columns": [
            {"field": "$.name", "format": "text", "header": "Name"},
            {"field": "$.tier", "format": "badge", "header": "Tier"},
            {"align": "end", "field": "$.balance", "format": "currency", "header": "Balance"},
        ],
        "data_tool": "crm.list",
        "description": "CRM accounts and balances.",
        "id": "customers",
        "kind": "table",
        "primary_action": "open",
        "row_actions": [{"arg_map": {"id": "$.id"}, "id": "open", "label": "Open", "tool": "crm.get"}],
        "rows_path": "$.items",
        "schema_version": 1,
        "title": "Customers",
    }
    assert html.startswith("<!doctype html>") and "<!--MCPG_APP_CONFIG-->" not in html
    ui = chart.contents[0].meta["ui"]  # type: ignore[index]
    assert ui["permissions"] == {"clipboardWrite": {}}  # within allowed_permissions
    assert ui["csp"]["connectDomains"] == ["https://api.analytics.example.com"]
    meta = tools["analytics.chart"].meta
    assert meta == {"ui": {"resourceUri": "ui://analytics/chart", "visibility": ["model", "app"]}}


APP_MIME = "text/html;profile=mcp-app"
DISCOVER = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "server/discover",
    "params": {
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {},
        }
    },
}
DISCOVER_HEADERS = {
    "accept": "application/json, text/event-stream",
    "mcp-protocol-version": "2026-07-28",
    "mcp-method": "server/discover",
}


def _ui_resource(meta: dict[str, Any], **apps: Any) -> dict[str, Any]:
    contents = [{"uri": "ui://w/x", "mimeType": "text/html;profile=mcp-app", "text": "<p>", "_meta": meta}]
    resource = {
        "name": "w",
        "description": "d",
        "uri": "ui://w/x",
        "governance": {"minimum_trust": "unauthenticated"},
        "descriptor_meta": meta,
        "backend": {"kind": "mock", "response": {"contents": contents}},
    }
    return {
        "mcp": {
            "capabilities": {"resources": [resource]},
            "configurations": {"apps": {"enabled": True, **apps}},
        }
    }


async def test_a_ui_resource_beyond_the_apps_policy_is_narrowed_or_in_strict_mode_refused() -> None:
    # mcpg-mcp-wire shared/apps.rs apply_to_resource_meta: CSP intersected, permissions stripped, domain dropped.
    meta = {
        "ui": {
            "csp": {"connectDomains": ["https://a.example", "https://evil.example"], "frameDomains": ["*"]},
            "permissions": {"camera": {}, "clipboardWrite": {}},
            "domain": "evil.example",
        }
    }
    policy = {
        "csp_policy": {"connect_domains": ["https://a.example"], "frame_domains": ["self"]},
        "allowed_permissions": ["clipboard_write"],
        "allowed_domains": ["trusted.example"],
    }
    with trio.fail_after(30):
        async with (
            open_app(_load(_ui_resource(meta, **policy))) as app,
            http_server(app) as url,
            _client(url, None) as c,
        ):
            listed = (await c.list_resources()).resources[0].meta
            read = (await c.read_resource("ui://w/x")).contents[0].meta
        async with (
            open_app(_load(_ui_resource(meta, strict=True, **policy))) as app,
            http_server(app) as url,
            _client(url, None) as c,
        ):
            with pytest.raises(Exception, match=r"MCP Apps strict mode: 'ui://w/x' _meta\.ui escaped operator policy"):
                await c.read_resource("ui://w/x")
    narrowed = {
        "ui": {
            "csp": {"connectDomains": ["https://a.example"], "frameDomains": ["self"]},
            "permissions": {"clipboardWrite": {}},
        }
    }
    assert listed == narrowed and read == narrowed


def test_an_apps_section_mcpg_refuses_is_refused_with_its_message() -> None:
    doc = {"mcp": {"configurations": {"apps": {"registry": [{"id": "t", "kind": "table", "title": "T"}]}}}}
    with pytest.raises(ConfigError) as e:
        _load(doc)
    assert [(p.location, p.message) for p in e.value.problems] == [
        (
            "mcp.configurations.apps.registry",
            "apps.registry is non-empty but apps.enabled is false — set enabled: true to advertise and serve the "
            "authored apps.",
        )
    ]


# --- federations: governance and import -----------------------------------------------------------------


def _federated(**fed: Any) -> dict[str, Any]:
    from kit.servers import EVERYTHING

    upstream = {"transport": "stdio", "command": sys.executable, "args": [EVERYTHING]}
    return {
        "gateway": {"server": {"trust_subject_header": True}},
        "governance": {"policy": {"tool_access": {"default_minimum_trust": "unauthenticated"}}},
        "mcp": {"federations": [{"name": "ev", "upstream": upstream, "naming": {"tool_prefix": "ev."}, **fed}]},
    }


async def test_a_federations_governance_guards_every_tool_it_imports_and_it_imports_only_what_it_says() -> None:
    # federation/engine.rs governance_rule (the federation's governance, a binding's by default, on each
    # imported capability); config/federation.rs ImportConfig (tools only, by default).
    doc = _federated(governance={"minimum_trust": "header_asserted", "allow_if": 'principal_id != "mallory"'})
    with trio.fail_after(60):
        async with open_app(_load(doc)) as app, http_server(app) as url:
            async with _client(url, None) as anonymous:
                hidden = [t.name for t in (await anonymous.list_tools()).tools]
                with pytest.raises(Exception, match="requires trust level HeaderAsserted"):
                    await anonymous.call_tool("ev.test_simple_text", {})
            async with _client(url, "alice") as alice:
                seen = [t.name for t in (await alice.list_tools()).tools]
                echoed = await alice.call_tool("ev.test_simple_text", {})
                resources = (await alice.list_resources()).resources
            async with _client(url, "mallory") as mallory:
                with pytest.raises(Exception, match="denied by per-tool CEL allow_if policy"):
                    await mallory.call_tool("ev.test_simple_text", {})
    assert hidden == [] and "ev.test_simple_text" in seen
    assert not echoed.is_error
    assert resources == []  # import.resources defaults to false


async def test_a_federation_importing_resources_serves_them_to_the_callers_its_governance_admits() -> None:
    doc = _federated(**{"import": {"tools": False, "resources": True}})
    with trio.fail_after(60):
        async with open_app(_load(doc)) as app, http_server(app) as url:
            async with _client(url, None) as anonymous:
                denied = (await anonymous.list_resources()).resources
            async with _client(url, "alice") as alice:
                tools = [t.name for t in (await alice.list_tools()).tools]
                resources = (await alice.list_resources()).resources
    assert denied == []  # a binding's floor, header_asserted, by default
    assert tools == [] and resources  # tools not imported, resources imported


def test_a_trust_pattern_covers_the_names_it_begins_an_exact_name_and_a_longer_pattern_win() -> None:
    from mcpipe.config import TrustConfig, TrustRule
    from mcpipe.trust import Trust

    rules = {
        "ev.*": TrustRule(minimum_trust="header_asserted"),
        "ev.admin.*": TrustRule(minimum_trust="verified"),
        "ev.admin.ping": TrustRule(minimum_trust="unauthenticated"),
    }
    trust = Trust(TrustConfig(default_minimum_trust="unauthenticated", tools=rules))
    got = [trust.required_trust(n) for n in ("ev.list", "ev.admin.drop", "ev.admin.ping", "other")]
    assert got == ["header_asserted", "verified", "unauthenticated", "unauthenticated"]


# --- serving a registry view ------------------------------------------------------------------------------


async def test_the_served_registry_of_mcpgs_federation_guide_lists_this_server_as_its_one_entry() -> None:
    # transports/http/discovery.rs served_registry_entry / _list_handler / _version_handler.
    from mcpipe import __version__

    doc = yaml.safe_load((UPSTREAM / "docs/federation/guide.md@L315.yaml").read_text())
    with trio.fail_after(30):
        async with open_app(_load(doc)) as app, http_server(app) as url, httpx.AsyncClient() as http:
            base = url.rsplit("/mcp", 1)[0]
            listed = await http.get(f"{base}/v0.1/servers")
            latest = await http.get(f"{base}/v0.1/servers/com.acme%2Fgateway/versions/latest")
            pinned = await http.get(f"{base}/v0.1/servers/com.acme%2Fgateway/versions/{__version__}")
            other = await http.get(f"{base}/v0.1/servers/com.evil%2Fother/versions/latest")
    entry = {
        "server": {
            "name": "com.acme/gateway",
            "version": __version__,
            "remotes": [{"type": "streamable-http", "url": "https://gw.acme.example/mcp"}],
            "description": "Governed MCP catalog",
        },
        "_meta": {"io.modelcontextprotocol.registry/official": {"status": "active", "isLatest": True}},
    }
    assert listed.status_code == 200 and listed.json() == {"servers": [entry], "metadata": {}}
    assert latest.json() == entry and pinned.json() == entry
    assert other.status_code == 404 and other.json() == {"error": "server or version not found"}


# --- content stores ---------------------------------------------------------------------------------------


async def test_the_air_gapped_example_serves_its_file_content_store_at_mcpg_resource_uris(tmp_path: Path) -> None:
    # storage_wiring.rs build_storages_registry, content_store_fs.rs (the layout), capabilities_list.rs
    # resource_read_managed: what the store holds is read at mcpg-resource://<id>, the rest is unknown.
    doc = yaml.safe_load((UPSTREAM / "examples/deployments/air-gapped.yaml").read_text())
    root = tmp_path / "storage"
    doc["storage"]["providers"][0]["config"]["root"] = str(root)
    doc["governance"]["audit"]["sinks"][0]["config"]["path"] = str(tmp_path / "audit.log")
    doc["observability"]["logs"]["sinks"][0]["config"]["path"] = str(tmp_path / "gateway.log")
    doc["observability"].pop("metrics")  # its prometheus listener's fixed port is no part of this test
    doc["gateway"]["server"].update(bind_address="127.0.0.1:0", trust_subject_header=True)
    # What an mcpg of the same site stored before (an image a backend generated), in mcpg's layout.
    digest = "ab" + "c" * 62
    (root / "blobs" / "ab" / "cc").mkdir(parents=True)
    (root / "blobs" / "ab" / "cc" / digest).write_bytes(b"\x89PNG")
    (root / "meta" / "ab" / "cc").mkdir(parents=True)
    meta = {"mime_type": "image/png", "stored_at": "2026-05-01T10:00:00Z", "size_bytes": 4}
    (root / "meta" / "ab" / "cc" / f"{digest}.json").write_text(json.dumps(meta))
    with trio.fail_after(30):
        async with open_app(_load(doc)) as app, http_server(app) as url, _client(url, "alice") as client:
            image = await client.read_resource(f"mcpg-resource://hash:{digest}")
            also = await client.read_resource(f"mcpg-resource://default/hash:{digest}")
            with pytest.raises(Exception, match=f"unknown resource: mcpg-resource://hash:{'0' * 64}"):
                await client.read_resource(f"mcpg-resource://hash:{'0' * 64}")
            echo = await client.call_tool("dev.mock.echo", {})
    assert image.contents[0].blob == base64.b64encode(b"\x89PNG").decode()  # type: ignore[union-attr]
    assert image.contents[0].mime_type == "image/png" and also.contents[0].blob == image.contents[0].blob  # type: ignore[union-attr]
    assert not echo.is_error


def test_a_storage_section_mcpg_would_not_boot_is_refused_with_its_message() -> None:
    doc = {"storage": {"providers": [{"id": "files", "kind": "file_system", "config": {"root": "/x"}}]}}
    with pytest.raises(ConfigError) as e:
        _load(doc)
    assert [(p.location, p.message) for p in e.value.problems] == [
        ("storage.default", "`storage.default: default` does not match any provider id in `storage.providers: [...]`")
    ]


# --- registry sync -----------------------------------------------------------------------------------------


@pytest.fixture
def tls_cert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A self-signed certificate for 127.0.0.1 that mcpipe's HTTP clients trust (``SSL_CERT_FILE``)."""
    from kit.registry import self_signed

    made = self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(made))
    return made


async def test_the_federation_guides_registry_serves_its_pinned_crm_to_verified_callers_never_passing_their_jwt(
    tls_cert: Path,
) -> None:
    # runtime/registry_sync (crawl, filter, pins, map.rs: remote variables and headers, the synthesized
    # federation's governance and pass_through auth), over a registry and its server on 127.0.0.1 (HTTPS).
    # Where mcpipe differs from mcpg: `pass_through` is `forward_bearer`, which never sends on an OAuth access
    # token (the guide's callers present JWTs of its jwks issuer): the MCP authorization spec forbids token
    # passthrough, so the verified caller's call fails saying so and nothing of it reaches the CRM.
    from kit.oauth import oauth_server
    from kit.registry import Registry, Upstream, calls, entry, serving_tls

    upstream, registry = Upstream(), Registry()
    async with (
        oauth_server() as idp,
        serving_tls(upstream.app(), tls_cert) as up,
        serving_tls(registry.app(), tls_cert) as reg_url,
    ):
        variables = {"tenant_id": {"isRequired": True}}
        key = [{"name": "X-API-Key", "isRequired": True, "isSecret": True}]
        registry.entries = [
            entry("com.acme/crm", "2.4.0", url=f"{up}/{{tenant_id}}/mcp", variables=variables, headers=key),
            entry("com.acme/crm", "2.3.1", url=f"{up}/{{tenant_id}}/v2.3/mcp", variables=variables, headers=key,
                  latest=False),
            entry("com.acme/experimental-search", url=f"{up}/search/mcp"),
            entry("com.acme-typo/crm", url=f"{up}/typo/mcp"),
        ]  # fmt: skip
        doc = yaml.safe_load((UPSTREAM / "docs/federation/guide.md@L152.yaml").read_text())
        doc["mcp"]["registries"][0]["url"] = reg_url
        doc["gateway"] = {"server": {"trust_subject_header": True}}
        jwks = {"issuer": idp.url, "keys_json": json.dumps(idp.jwks()), "audience": "mcpg"}
        doc["governance"] = {"access": {"jwks": jwks}}
        config = _load(doc, {"REGISTRY_TOKEN": "reg-secret", "CRM_KEY": "crm-key"})
        alice = idp.mint("alice", aud="mcpg")
        with trio.fail_after(60):
            async with open_app(config) as app, http_server(app) as url:
                await app.registries.synced.wait()
                for server in app.downstreams.servers:
                    await server.first_attempt()
                async with _client(url, "bob") as bob:
                    with pytest.raises(
                        Exception, match="requires trust level Verified, current trust is HeaderAsserted"
                    ):
                        await bob.call_tool("com.acme.crm.whoami", {})
                from kit.clients import bearer_client

                async with bearer_client(url, alice, mode="legacy") as client:
                    tools = sorted(t.name for t in (await client.list_tools()).tools)
                    got = await client.call_tool("com.acme.crm.whoami", {})
    assert tools == ["com.acme.crm.whoami"]  # the experiment excluded, the other namespace filtered
    assert got.is_error and "forward_bearer would pass the caller's OAuth access token" in got.content[0].text  # type: ignore[union-attr]
    assert calls(upstream) == [] and all(alice not in str(h) for h in upstream.seen)
    crm = [h for h in upstream.seen if h["path"].startswith("/acme-prod")]  # its session (listing its tools)
    assert crm and {h["path"] for h in crm} == {"/acme-prod/v2.3/mcp"}  # the pinned version, its {tenant_id}
    assert {h["x-api-key"] for h in crm} == {"crm-key"}
    assert {r["authorization"] for r in registry.requests} == {"Bearer reg-secret"}


async def test_the_federation_guides_discovering_registry_serves_a_server_once_its_oauth_metadata_is_found(
    tls_cert: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # registry_sync apply_oauth_discovery (mcpg-mcp-client auth.rs: RFC 9728 then RFC 8414, `resource` exact,
    # the issuer round-tripping); the `{server}` credential without its plugin: the static secret mcpg's
    # credential resolver reads from MCPG_CRED_<PLUGIN>_<TARGET>.
    from kit.oauth import oauth_server
    from kit.registry import Registry, Upstream, calls, entry, serving_tls

    upstream, registry = Upstream(), Registry()
    monkeypatch.setenv("MCPG_CRED_DEV_MCPG_CREDENTIAL_OAUTH_ID_JAG_COM_ACME_CRM", "crm-static")
    monkeypatch.setenv("MCPG_CRED_DEV_MCPG_CREDENTIAL_OAUTH_ID_JAG_COM_ACME_WRONG", "wrong-static")
    async with (
        oauth_server() as idp,
        serving_tls(upstream.app(), tls_cert) as up,
        serving_tls(registry.app(), tls_cert) as reg_url,
    ):
        upstream.documents["/.well-known/oauth-protected-resource/mcp"] = {
            "resource": f"{up}/mcp",
            "authorization_servers": [idp.url],
        }
        upstream.documents["/.well-known/oauth-protected-resource/wrong/mcp"] = {
            "resource": "https://elsewhere.example/mcp",
            "authorization_servers": [idp.url],
        }
        registry.entries = [entry("com.acme/crm", url=f"{up}/mcp"), entry("com.acme/wrong", url=f"{up}/wrong/mcp")]
        doc = yaml.safe_load((UPSTREAM / "docs/federation/guide.md@L240.yaml").read_text())
        registry_doc = doc["mcp"]["registries"][0]
        registry_doc["url"] = reg_url
        registry_doc["registry_safety"] = {"allow_private_registry": True}
        registry_doc["defaults"]["upstream_safety"] = {"allow_private_backends": True}
        doc["gateway"] = {"server": {"trust_subject_header": True}}
        with trio.fail_after(60):
            async with open_app(_load(doc)) as app, http_server(app) as url:
                await app.registries.synced.wait()
                skipped = await app.registries.sync(app.config.registries[0])
                for server in app.downstreams.servers:
                    await server.first_attempt()
                async with _client(url, "alice") as alice:
                    tools = sorted(t.name for t in (await alice.list_tools()).tools)
                    got = await alice.call_tool("com.acme.crm.whoami", {})
    assert tools == ["com.acme.crm.whoami"] and not got.is_error
    assert skipped == {"com.acme/wrong": "oauth_discovery: no OAuth metadata found for it"}
    assert {h["authorization"] for h in calls(upstream)} == {"Bearer crm-static"}
    assert idp.hits["/.well-known/oauth-authorization-server"] >= 1


@pytest.mark.parametrize(
    ("registry", "where", "says"),
    [
        ({"url": "http://r.example"}, "mcp.registries[0]", "uses http://; set registry_safety.allow_insecure_http"),
        (
            {"auth": {"mode": "cred", "credential": "cred://dev.mcpg.credential.oauth-client-credentials/r"}},
            "mcp.registries[0].auth.mode",
            "a registry read with a `cred` issuer's token is not in mcpipe",
        ),
        (
            {"defaults": {"auth": {"mode": "service_token"}}},
            "mcp.registries[0].defaults.auth.mode",
            "authenticated by `service_token` are not in mcpipe",
        ),
    ],
)
def test_a_registry_mcpipe_cannot_read_or_authenticate_as_mcpg_does_is_refused_at_its_place(
    registry: dict[str, Any], where: str, says: str
) -> None:
    doc = {"mcp": {"registries": [{"name": "acme", "url": "https://r.example", **registry}]}}
    with pytest.raises(ConfigError) as e:
        _load(doc)
    assert [p.location for p in e.value.problems] == [where]
    assert says in e.value.problems[0].message
