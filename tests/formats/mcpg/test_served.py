"""Each mcpg backend answers as mcpg answers: the same ``CallToolResult`` (content, structuredContent,
isError) for the same inputs, against real services on 127.0.0.1; prompts and resources decoded as mcpg's
strict codecs do; mcpg's trust floor. The expected shapes are mcpg's, read from its sources (cited per test):
``mcpg-plugin-backend-http`` (``envelope.rs``, README), ``-mock``, ``-command``, ``-sql`` (``shape_response``),
``mcpg/src/runtime/execution/{mod,pipeline}.rs`` and ``runtime/invocation.rs``.
NATS, Kafka and gRPC steps: ``tests/backends/test_mcpg_services.py``."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml
from mcp import Client
from mcp.shared.exceptions import MCPError

from kit.mcpg_oracle import StandIn
from mcpipe.config import parse_config
from mcpipe.errors import ConfigError
from mcpipe.server import open_app

OPEN = {"governance": {"minimum_trust": "unauthenticated"}}
ORDERS = Path(__file__).resolve().parents[3] / "examples" / "mcpg" / "orders.yaml"


def _config(tools: list[dict[str, Any]] | None = None, **caps: Any) -> str:
    doc = {"mcp": {"capabilities": {"tools": [{**OPEN, **t} for t in tools or []], **caps}}}
    return yaml.safe_dump(doc)


@asynccontextmanager
async def serving(text: str, environ: dict[str, str] | None = None, **client: Any) -> AsyncIterator[Client]:
    config = parse_config(text, "yaml", environ=environ or {})
    with trio.fail_after(30):
        async with open_app(config) as app, Client(app.server, **client) as c:
            yield c


def _wire(r: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"content": [b.model_dump(exclude_none=True) for b in r.content], "isError": r.is_error}
    if r.structured_content is not None:
        out["structuredContent"] = r.structured_content
    return out


# --- mock -----------------------------------------------------------------------------------------


async def test_a_mock_binding_answers_its_response_pretty_printed_and_the_simulated_envelope() -> None:
    # mcpg-plugin-backend-mock build_mock_result: text = to_string_pretty(response), structured envelope.
    text = _config(
        [{"name": "m", "description": "d", "backend": {"kind": "mock", "response": {"b": [1, 2], "a": "x"}}}]
    )
    async with serving(text) as c:
        r = await c.call_tool("m", {"q": 1})
    assert _wire(r) == {
        "content": [{"type": "text", "text": '{\n  "a": "x",\n  "b": [\n    1,\n    2\n  ]\n}'}],
        "isError": False,
        "structuredContent": {
            "toolName": "m",
            "profile": "m",
            "bindingKind": "mock",
            "arguments": {"q": 1},
            "response": {"a": "x", "b": [1, 2]},
            "delayMs": 0,
            "simulated": True,
        },
    }


async def test_a_passthrough_mock_answers_its_response_as_the_whole_result_and_an_error_mock_its_message() -> None:
    verbatim = {"content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}], "isError": True}
    text = _config(
        [
            {"name": "p", "description": "d", "backend": {"kind": "mock", "passthrough": True, "response": verbatim}},
            {"name": "e", "description": "d", "backend": {"kind": "mock", "error": True, "error_message": "boom"}},
        ]
    )
    async with serving(text) as c:
        p = await c.call_tool("p", {})
        e = await c.call_tool("e", {"x": 1})
    assert _wire(p) == verbatim
    assert _wire(e) == {
        "content": [{"type": "text", "text": "boom"}],
        "isError": True,
        "structuredContent": {
            "toolName": "e",
            "profile": "e",
            "bindingKind": "mock",
            "arguments": {"x": 1},
            "error": "boom",
            "simulated": True,
        },
    }


def test_a_passthrough_mock_without_a_content_array_is_refused_located() -> None:
    text = _config(
        [{"name": "p", "description": "d", "backend": {"kind": "mock", "passthrough": True, "response": {"x": 1}}}]
    )
    with pytest.raises(Exception) as e:
        parse_config(text, "yaml", environ={})
    assert "mcp.capabilities.tools[0].backend.response: passthrough: true requires `response`" in str(e.value)


# --- http -----------------------------------------------------------------------------------------


def _http(name: str, url: str, **spec: Any) -> dict[str, Any]:
    return {"name": name, "description": "d", "backend": {"kind": "http", "url": url, **spec}}


ROUTES = [
    {"method": "GET", "path": "/items/.*", "body": {"ok": True}},
    {"method": "POST", "path": "/orders", "status": 201, "body": {"id": 7}},
    {"method": "GET", "path": "/html", "text": "<p>hi</p>", "content_type": "text/html"},
    {"method": "GET", "path": "/big", "text": "x" * 100, "content_type": "text/plain"},
    {"method": "GET", "path": "/busy", "status": 503, "body": {"error": "busy"}, "headers": {"Retry-After": "2"}},
]


async def test_a_get_binding_sends_the_arguments_as_a_sorted_query_string_and_answers_mcpgs_envelope() -> None:
    with StandIn(ROUTES) as api:
        base = f"http://127.0.0.1:{api.port}"
        text = _config(
            [
                _http(
                    "get",
                    base + "/items/${arguments.id}",
                    method="get",
                    headers={"Authorization": "Bearer ${env.TOKEN}", "X-Caller": "${tool_name}"},
                    require_json_response=True,
                )
            ]
        )
        env = {"TOKEN": "t0k", "MCPG_GATEWAY__SERVER__ALLOW_PRIVATE_BACKENDS": "true"}
        async with serving(text, env) as c:
            r = await c.call_tool("get", {"id": "a/b", "tags": ["x", "y z"], "n": 2})
        sent = api.take()
    # `${arguments.id}` is one path segment (issue 27): its `/` percent-encoded as mcpg encodes a component.
    assert [(s["method"], s["path"], s["query"]) for s in sent] == [
        ("GET", "/items/a%2Fb", "id=a%2Fb&n=2&tags=x&tags=y%20z")
    ]
    assert sent[0]["headers"]["authorization"] == "Bearer t0k"
    assert sent[0]["headers"]["x-caller"] == "get"
    s = r.structured_content
    assert r.is_error is False and s is not None
    assert json.loads(r.content[0].text) == s  # type: ignore[union-attr]
    assert s["requestKind"] == "query_string"
    assert s["request"] == {
        "kind": "query_string",
        "arguments": {"id": "a/b", "tags": ["x", "y z"], "n": 2},
        "body": None,
        "query": "id=a%2Fb&n=2&tags=x&tags=y%20z",
    }
    assert s["response"]["statusCode"] == 200 and s["response"]["json"] == {"ok": True}
    assert s["url"] == base + "/items/a%2Fb"
    assert s["requestHeaders"] == {"Authorization": "Bearer t0k", "X-Caller": "get"}
    assert s["downstreamError"] is None and s["downstreamErrors"] == []
    assert (s["expectedStatusCodes"], s["maxResponseBytes"], s["timeoutMs"]) == ([200], 4096, 2000)


async def test_a_binding_with_retry_is_tried_again_as_mcpg_retries_it() -> None:
    """``dispatch_with_retries``: an errored result that classifies as retryable (an http envelope's text holds
    ``timeoutMs``, a transport word to ``error_result_is_retryable``) is tried ``max_attempts`` more times."""
    with StandIn(ROUTES) as api:
        base = f"http://127.0.0.1:{api.port}"
        retry = {"max_attempts": 2, "initial_backoff_ms": 1}
        busy = {**_http("busy", base + "/busy", method="get"), "retry": retry}
        items = {**_http("items", base + "/items/1", method="get"), "retry": retry}
        env = {"MCPG_GATEWAY__SERVER__ALLOW_PRIVATE_BACKENDS": "true"}
        async with serving(_config([busy, items]), env) as c:
            r = await c.call_tool("busy", {})
            assert r.is_error is True and len(api.take()) == 3  # the call and two more
            r = await c.call_tool("items", {})
            assert r.is_error is False and len(api.take()) == 1  # a success is not tried again
    with pytest.raises(ConfigError, match=r"retry\.max_attempts must not exceed 10"):
        parse_config(_config([{**busy, "retry": {"max_attempts": 11}}]), "yaml", environ={})
    with pytest.raises(ConfigError, match="retry is not supported for mock bindings"):
        parse_config(_config([{"name": "m", "description": "m", "backend": {"kind": "mock"}, "retry": {}}]), "yaml")


async def test_a_post_binding_sends_the_arguments_as_its_json_body_and_an_unexpected_status_is_an_error() -> None:
    with StandIn(ROUTES) as api:
        base = f"http://127.0.0.1:{api.port}"
        text = _config(
            [
                _http("ok", base + "/orders", expected_status_codes=[200, 201]),
                _http("strict", base + "/orders"),
                _http("busy", base + "/busy", method="get"),
            ]
        )
        env = {"MCPG_GATEWAY__SERVER__ALLOW_PRIVATE_BACKENDS": "true"}
        async with serving(text, env) as c:
            ok = await c.call_tool("ok", {"sku": "pen", "qty": 2})
            strict = await c.call_tool("strict", {"sku": "pen"})
            busy = await c.call_tool("busy", {})
        sent = api.take()
    assert sent[0]["method"] == "POST" and sent[0]["body"] == {"qty": 2, "sku": "pen"}
    assert sent[0]["headers"]["content-type"] == "application/json"
    assert ok.is_error is False and ok.structured_content["response"]["json"] == {"id": 7}  # type: ignore[index]
    # A POST is potentially non-idempotent (retry::with_retry_guidance).
    e = strict.structured_content["downstreamError"]  # type: ignore[index]
    assert strict.is_error is True
    assert e == {
        "kind": "unexpected_status_code",
        "code": "mcpg.downstream_http.unexpected_status_code",
        "message": "Downstream response status 201 did not match the configured expected status codes.",
        "retryable": False,
        "retryClass": "do_not_retry",
        "idempotencyHint": "potentially_non_idempotent",
        "callerRetryDecision": "do_not_retry",
        "retrySafety": "do_not_retry",
        "backoffStrategy": "no_retry",
        "suggestedAction": "inspect_downstream_http_contract",
        "statusCode": 201,
        "details": {"actualStatusCode": 201, "expectedStatusCodes": [200], "retryAfterMs": None},
    }
    # A GET is a read-only probe: a 503 with Retry-After is safe to retry after the delay.
    b = busy.structured_content["downstreamError"]  # type: ignore[index]
    assert busy.is_error is True
    assert (b["retryable"], b["retryClass"], b["retryAfterMs"], b["backoffStrategy"], b["minimumBackoffMs"]) == (
        True,
        "after_delay",
        2000,
        "respect_retry_after",
        2000,
    )
    assert (b["retrySafety"], b["callerRetryDecision"], b["idempotencyHint"]) == (
        "safe_for_automatic_retry",
        "automatic_retry_after_delay",
        "idempotent_read_only",
    )


async def test_the_json_requirement_and_the_size_cap_are_mcpgs() -> None:
    with StandIn(ROUTES) as api:
        base = f"http://127.0.0.1:{api.port}"
        text = _config(
            [
                _http("html", base + "/html", method="get", require_json_response=True),
                _http("big", base + "/big", method="get", max_response_bytes=10),
            ]
        )
        env = {"MCPG_GATEWAY__SERVER__ALLOW_PRIVATE_BACKENDS": "true"}
        async with serving(text, env) as c:
            html = await c.call_tool("html", {})
            big = await c.call_tool("big", {})
    h = html.structured_content
    assert html.is_error is True and h is not None
    assert h["downstreamError"]["kind"] == "invalid_content_type"
    assert h["downstreamError"]["details"] == {"responseContentType": "text/html"}
    assert h["response"]["body"] == "<p>hi</p>" and h["response"]["json"] is None
    b = big.structured_content
    assert big.is_error is False and b is not None
    assert (b["response"]["body"], b["response"]["bodyTruncated"]) == ("x" * 10, True)


async def test_a_private_address_is_refused_unless_allowed_and_a_refused_connection_is_a_transport_error() -> None:
    with StandIn(ROUTES) as api:
        port = api.port
    text = _config([_http("down", f"http://127.0.0.1:{port}/items/1", method="get")])
    async with serving(text) as c:
        guarded = await c.call_tool("down", {})
    async with serving(text, {"MCPG_GATEWAY__SERVER__ALLOW_PRIVATE_BACKENDS": "true"}) as c:
        refused = await c.call_tool("down", {})
    for r in (guarded, refused):
        s = r.structured_content
        assert r.is_error is True and s is not None and s["response"] is None
        assert s["downstreamError"]["kind"] == "transport_error"
        assert s["downstreamError"]["retrySafety"] == "safe_for_automatic_retry"  # a GET
    assert "127.0.0.1" in guarded.structured_content["error"] and "not allowed" in guarded.structured_content["error"]  # type: ignore[index]


# --- command --------------------------------------------------------------------------------------


async def test_a_command_binding_gets_the_arguments_on_stdin_and_answers_mcpgs_command_envelope() -> None:
    # mcpg-plugin-backend-command's own test: `cat` with require_json_stdout round-trips the arguments.
    text = _config(
        [
            {
                "name": "cat",
                "description": "d",
                "backend": {"kind": "command", "command": "cat", "require_json_stdout": True},
            },
            {
                "name": "fail",
                "description": "d",
                "backend": {"kind": "command", "command": "sh", "args": ["-c", "echo ${arguments.word} >&2; exit 3"]},
            },
        ]
    )
    async with serving(text) as c:
        ok = await c.call_tool("cat", {"hello": "world"})
        bad = await c.call_tool("fail", {"word": "oops"})
    s = ok.structured_content
    assert ok.is_error is False and s is not None
    assert s["response"]["exitCode"] == 0 and s["response"]["success"] is True
    assert s["response"]["json"] == {"hello": "world"} and s["downstreamError"] is None
    assert s["request"] == {"kind": "json_stdin", "arguments": {"hello": "world"}, "body": {"hello": "world"}}
    assert (s["command"], s["requireJsonStdout"], s["timeoutMs"], s["maxOutputBytes"]) == ("cat", True, 5000, 65536)
    b = bad.structured_content
    assert bad.is_error is True and b is not None
    assert b["response"]["exitCode"] == 3 and b["response"]["stderr"] == "oops\n"
    assert b["downstreamError"] == {
        "kind": "non_zero_exit",
        "code": "mcpg.downstream_command.non_zero_exit",
        "message": "Downstream command execution completed with a non-zero exit status.",
        "retryable": False,
        "suggestedAction": "inspect_command_stderr_and_exit_status",
        "details": {"exitCode": 3},
    }


# --- sql ------------------------------------------------------------------------------------------


def _sql(name: str, url: str, sql: str, mode: str, **query: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": "d",
        "backend": {"kind": "sql", "driver": "sqlite", "url": url, "query": {"sql": sql, "row_mode": mode, **query}},
    }


async def test_sql_bindings_shape_their_rows_as_mcpgs_row_modes(tmp_path: Path) -> None:
    db = tmp_path / "todos.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE todos (id INTEGER PRIMARY KEY, title TEXT, done INTEGER)")
        conn.executemany("INSERT INTO todos (title, done) VALUES (?, ?)", [("a", 0), ("b", 1), ("c", 0)])
    url = "sqlite:${env.DB}?mode=rwc"
    text = _config(
        [
            _sql("many", url, "SELECT id, title FROM todos WHERE done = :done ORDER BY id", "many", params=["done"]),
            _sql("one", url, "SELECT title, id FROM todos WHERE id = :id", "single", params=["id"]),
            _sql("none", url, "SELECT title FROM todos WHERE id = 99", "single"),
            _sql("count", url, "SELECT COUNT(*) AS n FROM todos", "scalar"),
            _sql("add", url, "INSERT INTO todos (title, done) VALUES (:title, 0)", "affected_rows", params=["title"]),
            _sql(
                "clamp",
                url,
                "SELECT title FROM todos WHERE id = :safe",
                "single",
                params=["safe"],
                param_exprs={"safe": "arguments.id > 0 ? arguments.id : 0"},
            ),
        ]
    )
    async with serving(text, {"DB": str(db)}) as c:
        many = await c.call_tool("many", {"done": 0})
        one = await c.call_tool("one", {"id": 2})
        none = await c.call_tool("none", {})
        count = await c.call_tool("count", {})
        add = await c.call_tool("add", {"title": "d"})
        clamp = await c.call_tool("clamp", {"id": -5})
    # shape_response: a row's columns in key order (serde_json's maps, as mcpg writes them, recorded in
    # golden/served/sql-postgres.json); single/scalar unwrap; affected rows.
    assert many.content[0].text == '[{"id":1,"title":"a"},{"id":3,"title":"c"}]'  # type: ignore[union-attr]
    assert many.structured_content == [{"id": 1, "title": "a"}, {"id": 3, "title": "c"}]  # 2026-07-28: any JSON
    assert one.content[0].text == '{"id":2,"title":"b"}'  # type: ignore[union-attr]
    assert none.content[0].text == "null" and none.structured_content is None  # type: ignore[union-attr]
    assert count.content[0].text == "3" and count.structured_content == 3  # type: ignore[union-attr]
    assert add.content[0].text == '{"rows_affected":1}' and add.is_error is False  # type: ignore[union-attr]
    assert clamp.content[0].text == "null"  # type: ignore[union-attr]


@pytest.mark.parametrize(("mode", "structured"), [("legacy", {"result": [{"n": 3}]}), ("2026-07-28", [{"n": 3}])])
async def test_rows_are_the_structured_content_itself_where_the_protocol_allows_any_json_value(
    tmp_path: Path, mode: str, structured: Any
) -> None:
    # mcpg answers the rows as structuredContent; MCP before 2026-07-28 wants an object there.
    db = tmp_path / "n.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (n INTEGER)")
        conn.execute("INSERT INTO t VALUES (3)")
    text = _config([_sql("rows", f"sqlite:{db}", "SELECT n FROM t", "many")])
    async with serving(text, mode=mode) as c:
        r = await c.call_tool("rows", {})
    assert r.structured_content == structured
    assert r.content[0].text == '[{"n":3}]'  # type: ignore[union-attr]


async def test_a_sql_resource_reads_its_contents_and_a_resource_that_gives_none_is_mcpgs_error(tmp_path: Path) -> None:
    db = tmp_path / "docs.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE docs (slug TEXT, body TEXT)")
        conn.execute("INSERT INTO docs VALUES ('intro', 'hello')")
    url = f"sqlite:{db}"
    templates = [
        {
            **OPEN,
            "name": "doc",
            "description": "a doc",
            "uri_template": "docs://{slug}",
            "mime_type": "text/markdown",
            "backend": {
                "kind": "sql",
                "driver": "sqlite",
                "url": url,
                "query": {
                    "sql": "SELECT 'docs://' || slug AS uri, body AS text, 'text/markdown' AS mime_type"
                    " FROM docs WHERE slug = :slug",
                    "params": ["slug"],
                    "row_mode": "resource_contents",
                },
            },
        }
    ]
    resources = [
        {
            **OPEN,
            "name": "bare",
            "description": "d",
            "uri": "x://bare",
            "backend": {"kind": "mock", "response": {"no": 1}},
        }
    ]
    text = _config(resource_templates=templates, resources=resources)
    async with serving(text) as c:
        listed = await c.list_resource_templates()
        got = await c.read_resource("docs://intro")
        with pytest.raises(MCPError) as e:
            await c.read_resource("x://bare")
    assert [t.uri_template for t in listed.resource_templates] == ["docs://{slug}"]
    assert [(x.uri, x.text, x.mime_type) for x in got.contents] == [("docs://intro", "hello", "text/markdown")]  # type: ignore[union-attr]
    # runtime/invocation.rs decode_resource_result: no `contents` in the body is a JSON-RPC -32603.
    assert e.value.error.code == -32603
    assert e.value.error.message == (
        "resource backend produced a non-conforming response: backend response is not a valid surface envelope: "
        "resource body for x://bare is missing `contents`"
    )


# --- prompts --------------------------------------------------------------------------------------


async def test_a_prompt_renders_its_backends_messages_and_completes_its_arguments() -> None:
    messages = [{"role": "user", "content": {"type": "text", "text": "Review this"}}]
    prompts = [
        {
            **OPEN,
            "name": "review",
            "description": "a prompt",
            "prompt_arguments": [{"name": "lang", "required": True, "completions": ["en", "es", "fr"]}],
            "backend": {"kind": "mock", "response": {"messages": messages}},
        }
    ]
    async with serving(_config(prompts=prompts)) as c:
        listed = await c.list_prompts()
        got = await c.get_prompt("review", {"lang": "en"})
        from mcp_types import PromptReference

        done = await c.complete(PromptReference(type="ref/prompt", name="review"), {"name": "lang", "value": "e"})
    assert [(p.name, [(a.name, a.required) for a in p.arguments or []]) for p in listed.prompts] == [
        ("review", [("lang", True)])
    ]
    assert [m.model_dump(exclude_none=True) for m in got.messages] == messages
    assert done.completion.values == ["en", "es"]


# --- pipelines ------------------------------------------------------------------------------------


PIPELINE = {
    "name": "charge",
    "description": "d",
    "backend": {
        "kind": "pipeline",
        "pipeline_timeout_ms": 10000,
        "steps": [
            {"kind": "mock", "id": "user", "response": {"name": "ada", "role": "admin"}},
            {"kind": "cel_gate", "id": "gate", "expression": "steps.user.output.role == arguments.need"},
            {"kind": "log", "id": "announce", "level": "info", "data": "charging ${arguments.order}"},
            {"kind": "progress", "id": "half", "progress": 0.5, "message": "half way"},
            {"kind": "command", "id": "echo", "command": "cat", "input_transform": '{"order": arguments.order}'},
            {
                "kind": "plugin_transform",
                "id": "shape",
                "plugin": "dev.mcpg.transform.jsonata",
                "config": {"expression": '{"who": steps.user.output.name, "order": arguments.order}'},
            },
            {
                "kind": "transform",
                "id": "done",
                "expression": '{"order": steps.echo.output.response.json.order, "who": steps.shape.output.who,'
                ' "ok": !steps.gate.is_error}',
            },
        ],
    },
}


async def test_a_pipeline_runs_every_step_kind_and_answers_mcpgs_pipeline_result() -> None:
    logs: list[Any] = []

    async def on_log(params: Any) -> None:
        logs.append((params.logger, params.data))

    async with serving(_config([PIPELINE]), logging_callback=on_log, mode="legacy") as c:
        ok = await c.call_tool("charge", {"need": "admin", "order": "A-1"})
        gated = await c.call_tool("charge", {"need": "root", "order": "A-2"})
    # execute_pipeline_binding: the last output as (compact) text, and the run's envelope.
    result = {"ok": True, "order": "A-1", "who": "ada"}
    assert ok.is_error is False
    assert json.loads(ok.content[0].text) == result  # type: ignore[union-attr]
    s = dict(ok.structured_content or {})
    assert s.pop("duration_ms") >= 0
    assert s == {"pipeline": "charge", "result": result, "completed_steps": 7, "total_steps": 7}
    # A gate's refusal: its message, and where the pipeline stopped.
    assert _wire(gated) == {
        "content": [{"type": "text", "text": "pipeline gate failed at step gate"}],
        "isError": True,
        "structuredContent": {
            "pipeline": "charge",
            "gate_step": "gate",
            "reason": "pipeline gate failed at step gate",
            "completed_steps": 1,
            "total_steps": 7,
        },
    }
    # The log step's data is interpolated as mcpg's pipelines doc writes it (mcpg as released sends it as
    # written: a difference on purpose), under the binding's name.
    assert ("charge", "charging A-1") in logs


async def test_a_failed_pipeline_step_is_mcpgs_failure_result() -> None:
    pipeline = {
        "name": "p",
        "description": "d",
        "backend": {
            "kind": "pipeline",
            "steps": [
                {"kind": "mock", "id": "a", "response": 1},
                {"kind": "mock", "id": "b", "error": True, "error_message": "the backend is down"},
            ],
        },
    }
    async with serving(_config([pipeline])) as c:
        r = await c.call_tool("p", {})
    assert _wire(r) == {
        "content": [{"type": "text", "text": "pipeline 'p' failed at step 'b': the backend is down"}],
        "isError": True,
        "structuredContent": {
            "pipeline": "p",
            "failed_step": "b",
            "error": "the backend is down",
            "completed_steps": 1,
            "total_steps": 2,
        },
    }


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_pipeline_that_asks_the_client_answers_the_last_output_pretty_printed_in_both_eras(mode: str) -> None:
    pipeline = {
        "name": "ask",
        "description": "d",
        "backend": {
            "kind": "pipeline",
            "steps": [
                {
                    "kind": "elicitation",
                    "id": "confirm",
                    "message": "Go?",
                    "requested_schema": {"type": "object", "properties": {"go": {"type": "boolean"}}},
                },
                {"kind": "transform", "id": "out", "expression": '{"go": steps.confirm.output.content.go}'},
            ],
        },
    }
    from mcp_types import ElicitResult

    async def elicit(context: Any, params: Any) -> ElicitResult:
        return ElicitResult(action="accept", content={"go": True})

    async with serving(_config([pipeline]), mode=mode, elicitation_callback=elicit) as c:
        r = await c.call_tool("ask", {})
    # execute_pipeline_steps (a pipeline with suspending steps): to_string_pretty(last) and last itself.
    assert _wire(r) == {
        "content": [{"type": "text", "text": '{\n  "go": true\n}'}],
        "isError": False,
        "structuredContent": {"go": True},
    }


# --- trust ----------------------------------------------------------------------------------------


async def test_a_binding_on_mcpgs_default_trust_floor_refuses_an_anonymous_caller_and_is_not_listed() -> None:
    doc = {
        "mcp": {
            "capabilities": {"tools": [{"name": "t", "description": "d", "backend": {"kind": "mock", "response": 1}}]}
        }
    }
    async with serving(yaml.safe_dump(doc)) as c:
        listed = await c.list_tools()
        with pytest.raises(MCPError) as e:
            await c.call_tool("t", {})
    assert listed.tools == []
    # runtime/policy.rs: the trust floor, -32003.
    assert (e.value.error.code, e.value.error.message) == (
        -32003,
        "tool t requires trust level HeaderAsserted, current trust is Unauthenticated",
    )


async def test_arguments_that_break_the_input_schema_are_mcpgs_tool_error_and_defaults_are_not_filled_in() -> None:
    tool = {
        "name": "m",
        "description": "d",
        "input_schema": {
            "type": "object",
            "required": ["zone"],
            "properties": {"zone": {"type": "string"}, "ttl": {"type": "integer", "default": 300}},
        },
        "backend": {"kind": "mock", "response": 1},
    }
    async with serving(_config([tool])) as c:
        bad = await c.call_tool("m", {"ttl": "x"})
        ok = await c.call_tool("m", {"zone": "z"})
    # tools_call.rs: an input the schema refuses is a tool error the model can correct.
    assert bad.is_error is True
    text = bad.content[0].text  # type: ignore[union-attr]
    assert text.startswith("Input validation failed for tool 'm': arguments validation failed: ")
    assert "/ttl: " in text and text.endswith(". Inspect the tool's inputSchema via tools/list and retry.")
    assert ok.structured_content["arguments"] == {"zone": "z"}  # type: ignore[index]


async def test_the_orders_example_in_mcpgs_layout_charges_orders_and_serves_its_prompt_and_resource(
    tmp_path: Path,
) -> None:
    async with serving(ORDERS.read_text(), {"ORDERS_DB": str(tmp_path / "orders.db")}) as c:
        await c.call_tool("orders.init", {})
        charged = await c.call_tool("charge_order", {"order_id": "A-17", "role": "admin", "id": 5, "u": 1})
        refused = await c.call_tool("charge_order", {"order_id": "A-18", "role": "guest", "id": 5, "u": 1})
        left = await c.call_tool("orders.db", {"id": 5})
        stock = await c.read_resource("orders://stock")
        prompt = await c.get_prompt("order_summary", {"order_id": "A-17"})
    assert charged.is_error is False
    assert charged.structured_content["result"] == {"order": "A-17", "recorded": 1}  # type: ignore[index]
    assert refused.is_error is True and refused.content[0].text == "User does not have admin role"  # type: ignore[union-attr]
    assert left.content[0].text == "2"  # type: ignore[union-attr]
    assert [x.text for x in stock.contents] == ["item 5: 2"]  # type: ignore[union-attr]
    assert prompt.messages[0].content.text == "Summarize the order for the customer."  # type: ignore[union-attr]


# --- the server ------------------------------------------------------------------------------------


async def test_gateway_server_tls_serves_https_with_the_certificate_it_names(tmp_path: Path) -> None:
    """``gateway.server.tls`` (cert_path, key_path, min_tls_version): mcpipe serves HTTPS itself, as mcpg."""
    import ssl

    import httpx2

    from kit.servers import http_server, self_signed

    cert, key = await self_signed(tmp_path)
    doc = yaml.safe_load(_config([{"name": "ping", "description": "ping", "backend": {"kind": "mock"}}]))
    doc["gateway"] = {"server": {"tls": {"cert_path": str(cert), "key_path": str(key), "min_tls_version": "1.3"}}}
    config = parse_config(yaml.safe_dump(doc), "yaml", environ={})
    assert config.http.tls is not None and config.http.tls.min_version == "1.3"
    hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}
    headers = {"accept": "application/json, text/event-stream"}
    with trio.fail_after(30):
        async with open_app(config) as app, http_server(app) as url:
            assert url.startswith("https://")
            context = ssl.create_default_context(cafile=str(cert))
            async with httpx2.AsyncClient(verify=context) as client:
                response = await client.post(url, json=body, headers=headers)
                assert response.status_code == 200
                with pytest.raises(httpx2.HTTPError):  # plain HTTP is not served
                    plain = url.replace("https://", "http://")
                    await client.post(plain, json=body, headers=headers, timeout=1.0)
