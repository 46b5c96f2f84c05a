"""mcpg's configs (seed 003) load unchanged where the meaning is the same, and what mcpg has that mcpipe does
not is refused, located."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml
from mcp import Client
from pipelinekit import problems_of

from mcpipe.config import load_config
from mcpipe.declared._mcpg import normalize_entry
from mcpipe.server import open_app

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mcpg" / "orders.yaml"


async def test_the_mcpg_example_config_loads_and_its_pipelines_run() -> None:
    config = load_config(EXAMPLE)
    logs: list[Any] = []

    async def on_log(params: Any) -> None:
        logs.append(params.data)

    with trio.fail_after(30):
        async with open_app(config) as app, Client(app.server, logging_callback=on_log, mode="legacy") as client:
            args = {"order_id": "A-17", "role": "admin", "id": 5, "u": 1, "i": 5}
            first = await client.call_tool("charge_order", args)
            second = await client.call_tool("charge_order", args)
            refused = await client.call_tool("charge_order", {**args, "role": "guest"})
            provisioned = await client.call_tool("provision", {"name": "db-1"})
            echoed = await client.call_tool("echo_input", {"x": [1, 2]})
    assert first.structured_content == {"order": "A-17", "recorded": 1, "left": 2}
    assert second.structured_content == {"order": "A-17", "recorded": 1, "left": 1}
    assert refused.is_error
    assert refused.content[0].text == (  # type: ignore[union-attr]
        "GATE_REJECTED: step 'check_permission' failed: User does not have admin role"
    )
    assert logs[:2] == ["Charging order A-17", "Charging order A-17"]
    assert provisioned.structured_content == {"rows": [{"status": "ready"}], "checks": 1}
    assert echoed.structured_content == {"x": [1, 2]}


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (
            {"kind": "transform", "expression": 'completed_steps.a.output.x + original_args.y + "completed_steps"'},
            {"kind": "transform", "expression": 'steps.a.output.x + args.y + "completed_steps"'},
        ),
        (
            {"kind": "cel_gate", "expression": "!completed_steps.a.is_error && request_context.identity != null"},
            {"kind": "cel_gate", "expression": "!(!steps.a.ok) && context.principal != null"},
        ),
        (
            {"kind": "value", "value": {"who": "${original_args.name}", "id": "${ request_context.request_id }"}},
            {"kind": "value", "value": {"who": "${args.name}", "id": "${ context.request_id }"}},
        ),
        (
            {"kind": "log", "data": {"$ref": "completed_steps.a.output"}, "when": "has(original_args.x)"},
            {"kind": "log", "data": {"$ref": "steps.a.output"}, "when": "has(args.x)"},
        ),
        (
            {"kind": "mock", "response": "${original_args.x} stays: a mock response is not a template"},
            {"kind": "mock", "response": "${original_args.x} stays: a mock response is not a template"},
        ),
        (
            {
                "kind": "plugin_transform",
                "plugin": "dev.mcpg.transform.jsonata",
                "config": {"expression": '{"a": arguments.id, "b": steps.s.output, "c": "arguments"}'},
            },
            {
                "kind": "plugin_transform",
                "plugin": "dev.mcpg.transform.jsonata",
                "config": {"expression": '{"a": args.id, "b": steps.s.output, "c": "arguments"}'},
            },
        ),
    ],
)
def test_mcpg_roots_are_read_as_mcpipes_in_expressions_and_templates(
    step: dict[str, Any], expected: dict[str, Any]
) -> None:
    entry, problems, _ = normalize_entry({"name": "p", "steps": [{"id": "s", **step}]}, "pipelines.p", frozenset())
    assert problems == []
    assert entry["steps"][0] == {"id": "s", **expected}


def test_the_pipeline_backend_wrapper_and_pipeline_timeout_ms_are_the_entrys_steps_and_timeout() -> None:
    raw = {"name": "p", "backend": {"kind": "pipeline", "pipeline_timeout_ms": 30000, "steps": [{"kind": "mock"}]}}
    entry, problems, moved = normalize_entry(raw, "pipelines.p", frozenset({"mock"}))
    assert problems == []
    assert entry == {"name": "p", "timeout_ms": 30000, "steps": [{"kind": "mock"}]}
    assert moved["pipelines.p.steps"] == "pipelines.p.backend.steps"


def test_what_mcpg_has_that_mcpipe_does_not_is_refused_located() -> None:
    doc = """
pipelines:
  - name: p
    backend:
      kind: pipeline
      pipeline_store: redis
      steps:
        - {kind: value, id: a, value: "${request_context.session_id}"}
        - {kind: transform, id: b, expression: "completed_steps.a.output +"}
        - kind: plugin_transform
          id: c
          plugin: dev.mcpg.transform.jsonata
          config: {expression: "tool_name"}
        - {kind: value, id: d, value: "${completed_steps.a.is_error}"}
  - name: q
    backend: {kind: redis, url: "redis://x"}
  - name: r
    steps: [{kind: mock}]
    backend: {kind: pipeline, steps: []}
  - name: orders_db
    backend: {kind: sql, url: "postgresql://db/orders"}
"""
    found = problems_of(doc)
    assert found == [
        "pipelines.p.backend.pipeline_store: mcpg's pipeline field `pipeline_store` has no mcpipe equivalent",
        "pipelines.p.backend.steps[0].value: mcpg's request_context.session_id has no mcpipe equivalent "
        "(context has request_id, client and principal; mcpg's identity is principal)",
        "pipelines.p.backend.steps[1].expression: invalid CEL: " + found[2].split("invalid CEL: ", 1)[1],
        "pipelines.p.backend.steps[2].config.expression: mcpg's `tool_name` is not in mcpipe's JSONata document "
        "(args, steps, vars, context, last)",
        "pipelines.p.backend.steps[3].value: mcpg's `is_error` is `ok` (negated) in mcpipe: read steps.<id>.ok",
        "pipelines.q.backend.kind: mcpg's 'redis' backend has no mcpipe step kind "
        + found[5].split("step kind ", 1)[1],
        "pipelines.r.backend: an entry has `steps` or mcpg's `backend`, not both",
        "pipelines.orders_db.backend.kind: mcpg's SQL backend binding: in mcpipe a database is a "
        "`[sql.orders_db]` entry (url, pool_size, statement_timeout_ms, await) that sql, sql_tx and sql_await "
        "steps name",
    ], json.dumps(found, indent=1)


def test_the_mcpg_example_is_valid_yaml_with_mcpg_names() -> None:
    text = EXAMPLE.read_text()
    doc = yaml.safe_load(text)
    assert doc["pipelines"][0]["backend"]["kind"] == "pipeline"
    assert "completed_steps" in text and "original_args" in text and "dev.mcpg.transform.jsonata" in text


def test_an_mcpg_backend_step_sends_its_input() -> None:
    raw = {
        "name": "p",
        "backend": {
            "kind": "pipeline",
            "steps": [
                {"kind": "http", "id": "post", "url": "https://api.example.com/u", "method": "post"},
                {"kind": "http", "id": "get", "url": "https://api.example.com/u"},
                {"kind": "http", "id": "given", "url": "https://api.example.com/u", "method": "PUT", "body": {"a": 1}},
                {"kind": "command", "id": "run", "command": "jq"},
            ],
        },
    }
    entry, problems, _ = normalize_entry(raw, "pipelines.p", frozenset({"http", "command"}))
    assert problems == []
    assert [s.get("body", s.get("stdin")) for s in entry["steps"]] == [
        {"$ref": "args"},
        None,
        {"a": 1},
        {"$ref": "args"},
    ]
    # An mcpipe entry (no mcpg wrapper) keeps mcpipe's meaning: no body unless one is given.
    same, _, _ = normalize_entry({"name": "q", "steps": raw["backend"]["steps"]}, "pipelines.q", frozenset())
    assert "body" not in same["steps"][0]


def test_mcpgs_plugins_list_is_accepted_for_the_jsonata_plugin_and_refuses_others() -> None:
    from mcpipe.config import ConfigError, parse_config

    ok = {"plugins": ["dev.mcpg.transform.jsonata", {"name": "dev.mcpg.transform.jsonata"}]}
    assert parse_config(json.dumps(ok), "json", environ={}).plugins == ok["plugins"]
    with pytest.raises(ConfigError) as info:
        parse_config(json.dumps({"plugins": ["dev.mcpg.transform.jsonata", "dev.mcpg.auth.oidc"]}), "json", environ={})
    assert [str(p) for p in info.value.problems] == [
        "plugins[1]: mcpg's plugin 'dev.mcpg.auth.oidc' is not in mcpipe (its only transform plugin is JSONata, "
        "built in: dev.mcpg.transform.jsonata)"
    ]


async def test_an_mcpg_http_step_posts_its_input_as_the_body(http_server: Any) -> None:
    from mcpipe.config import parse_config

    doc = {
        "audit": {"enabled": False},
        "builtins": False,
        "outbound": {"http": {"allowed_hosts": ["127.0.0.1"]}},
        "pipelines": [
            {
                "name": "create_user",
                "input_schema": {"type": "object", "properties": {"name": {"type": "string"}}},
                "backend": {
                    "kind": "pipeline",
                    "steps": [
                        {"id": "step1", "kind": "http", "url": f"{http_server.url}/echo", "method": "post"},
                        {
                            "id": "step2",
                            "kind": "http",
                            "url": f"{http_server.url}/echo",
                            "method": "put",
                            "input_transform": '{"who": original_args.name,'
                            ' "first": completed_steps.step1.output.status}',
                        },
                        {
                            "id": "step3",
                            "kind": "transform",
                            "expression": '{"post": completed_steps.step1.output.body.body,'
                            ' "put": completed_steps.step2.output.body.body}',
                        },
                    ],
                },
            }
        ],
    }
    with trio.fail_after(30):
        async with open_app(parse_config(json.dumps(doc), "json", environ={})) as app, Client(app.server) as client:
            r = await client.call_tool("create_user", {"name": "ada"})
    assert r.structured_content == {"post": {"name": "ada"}, "put": {"who": "ada", "first": 200}}
    assert http_server.log.requests[0]["method"] == "POST"
