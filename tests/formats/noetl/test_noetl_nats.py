"""NoETL's ``nats`` tool (the NATS key/value store, object store and JetStream) on its own vendored playbooks,
against a real ``nats-server -js`` started by the tests, through mcpipe's own NATS client; what the playbooks
write is read back with nats-py (NoETL's client, and the gateway's side of the session cache)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import nats
import pytest
import trio

from kit.noetl import UPSTREAM, policy
from kit.realservers import nats_server
from mcpipe.backends.jetstream import JetStream
from mcpipe.backends.nats import open_nats
from mcpipe.declared import load_sql
from mcpipe.formats.noetl import NoetlPlaybook, load_playbook, playbook_tool


@pytest.fixture(scope="module")
def js_url() -> Iterator[str]:
    with nats_server(jetstream=True) as url:
        yield url


@pytest.fixture
def credential(js_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """NoETL's ``nats_credential`` (its credential store is the environment here)."""
    monkeypatch.setenv("NOETL_SECRET_NATS_CREDENTIAL", json.dumps({"nats_url": js_url}))
    return js_url


async def bucket(url: str, name: str) -> None:
    """The bucket NoETL's deployment creates before its playbooks run (they only bind to it)."""
    async with open_nats(url) as client:
        js = JetStream(client)
        try:
            await js.key_value(name)
        except Exception:
            await js.create_key_value(name)


def nats_py_get(url: str, bucket_name: str, key: str) -> Any:
    async def main() -> Any:
        nc = await nats.connect(url)
        try:
            kv = await nc.jetstream().key_value(bucket_name)
            try:
                return json.loads((await kv.get(key)).value)
            except nats.js.errors.KeyNotFoundError:
                return None
        finally:
            await nc.close()

    return asyncio.run(main())


def load(rel: str, sql: dict[str, Any] | None = None) -> NoetlPlaybook:
    pol = policy()
    if sql:
        backends, problems = load_sql(sql)
        assert problems == []
        pol = replace(pol, sql=backends)
    pb, found = load_playbook(rel, base_dir=str(UPSTREAM), policy=pol)
    assert found == [], [str(p) for p in found]
    assert isinstance(pb, NoetlPlaybook)
    return pb


async def run(pb: NoetlPlaybook, args: dict[str, Any] | None = None) -> dict[str, Any]:
    try:
        with trio.fail_after(60):
            return await playbook_tool(pb).run(args or {})
    finally:
        for backend in pb.policy.sql.values():
            if backend is not None:
                await backend.aclose()


async def test_nats_kv_puts_reads_and_deletes_a_session_as_noetls_tool_answers(credential: str) -> None:
    await bucket(credential, "sessions")
    answer = await run(load("tests/fixtures/playbooks/test_nats_kv.yaml"))
    assert answer["ok"], answer["error"]
    steps = answer["noetl"]["steps"]
    # Each step is a one-task pipeline: its task's result is NoETL's tool result (the step's `_prev`).
    put, got, deleted = (steps[s][0]["_prev"] for s in ("kv_put", "kv_get", "kv_delete"))
    assert put == {"status": "success", "bucket": "sessions", "key": "test_session_123", "revision": put["revision"]}
    assert got == {
        "status": "success",
        "bucket": "sessions",
        "key": "test_session_123",
        "value": {
            "session_token": "test_session_123",
            "user_id": 1,
            "email": "test@example.com",
            "display_name": "Test User",
            "expires_at": "2026-01-31T23:59:59Z",
            "is_active": True,
        },
        "revision": put["revision"],
        "created": None,
    }
    assert deleted == {"status": "success", "bucket": "sessions", "key": "test_session_123"}
    assert steps["end"][0]["message"] == "NATS K/V operations tested successfully"
    # The key is gone for NoETL's own client too.
    assert await trio.to_thread.run_sync(nats_py_get, credential, "sessions", "test_session_123") is None


# NoETL's documented operations (documentation/docs/reference/tools/nats.md, 2026-01), each a step of one playbook.
OPERATIONS = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: nats_ops, path: tests/nats_ops}
workload: {nats_credential: nats_credential, report: {city: Oslo, temps: [3, 5]}}
workflow:
  - step: start
    tool: {kind: nats, auth: "{{ nats_credential }}", operation: kv_put, bucket: cache, key: user_42_a, value: 1}
    next: {arcs: [{step: put_b}]}
  - step: put_b
    tool: {kind: nats, auth: "{{ nats_credential }}", operation: kv_put, bucket: cache, key: user_42_b, value: two}
    next: {arcs: [{step: put_other}]}
  - step: put_other
    tool: {kind: nats, auth: "{{ nats_credential }}", operation: kv_put, bucket: cache, key: other, value: [1, 2]}
    next: {arcs: [{step: keys}]}
  - step: keys
    tool: {kind: nats, auth: "{{ nats_credential }}", operation: kv_keys, bucket: cache, pattern: "user_42_*"}
    next: {arcs: [{step: purge}]}
  - step: purge
    tool: {kind: nats, auth: "{{ nats_credential }}", operation: kv_purge, bucket: cache, key: user_42_a}
    next: {arcs: [{step: gone}]}
  - step: gone
    tool: {kind: nats, auth: "{{ nats_credential }}", operation: kv_get, bucket: cache, key: user_42_a}
    next: {arcs: [{step: store}]}
  - step: store
    tool:
      kind: nats
      auth: "{{ nats_credential }}"
      operation: object_put
      bucket: reports
      name: "report_{{ report.city }}.json"
      data: "{{ report | tojson }}"
    next: {arcs: [{step: fetch}]}
  - step: fetch
    tool: {kind: nats, auth: "{{ nats_credential }}", operation: object_get, bucket: reports, name: report_Oslo.json}
    next: {arcs: [{step: describe}]}
  - step: describe
    tool: {kind: nats, auth: "{{ nats_credential }}", operation: object_info, bucket: reports, name: report_Oslo.json}
    next: {arcs: [{step: listing}]}
  - step: listing
    tool: {kind: nats, auth: "{{ nats_credential }}", operation: object_list, bucket: reports}
    next: {arcs: [{step: publish}]}
  - step: publish
    tool:
      kind: nats
      auth: "{{ nats_credential }}"
      operation: js_publish
      stream: events
      subject: events.user.created
      data: {user_id: 7}
      headers: {X-Correlation-ID: "{{ execution_id }}"}
    next: {arcs: [{step: last}]}
  - step: last
    tool:
      {kind: nats, auth: "{{ nats_credential }}", operation: js_get_msg, stream: events, subject: events.user.created}
    next: {arcs: [{step: info}]}
  - step: info
    tool: {kind: nats, auth: "{{ nats_credential }}", operation: js_stream_info, stream: events}
"""


async def test_noetls_documented_operations_run_on_jetstream_and_nats_py_reads_what_they_wrote(
    credential: str, tmp_path
) -> None:
    async with open_nats(credential) as client:
        js = JetStream(client)
        await js.create_key_value("cache", history=3)
        await js.create_object_store("reports")
        await js.add_stream({"name": "events", "subjects": ["events.>"], "storage": "memory", "num_replicas": 1})
    (tmp_path / "ops.yaml").write_text(OPERATIONS)
    pb, problems = load_playbook("ops.yaml", base_dir=str(tmp_path), policy=policy())
    assert problems == [] and isinstance(pb, NoetlPlaybook), [str(p) for p in problems]
    answer = await run(pb)
    assert answer["ok"], answer["error"]
    steps = {k: v[0] for k, v in answer["noetl"]["steps"].items()}
    assert steps["keys"] == {"status": "success", "bucket": "cache", "keys": ["user_42_a", "user_42_b"], "count": 2}
    assert steps["gone"] == {"status": "not_found", "bucket": "cache", "key": "user_42_a", "value": None}
    stored = steps["store"]
    assert stored["status"] == "success" and stored["name"] == "report_Oslo.json"
    assert stored["digest"].startswith("SHA-256=")
    assert json.loads(steps["fetch"]["data"]) == {"city": "Oslo", "temps": [3, 5]}
    assert steps["fetch"]["size"] == stored["size"] == len(steps["fetch"]["data"].encode())
    assert steps["describe"]["digest"] == stored["digest"] and steps["describe"]["chunks"] == 1
    assert [o["name"] for o in steps["listing"]["objects"]] == ["report_Oslo.json"] and steps["listing"]["count"] == 1
    assert steps["publish"] == {"status": "success", "stream": "events", "seq": 1, "duplicate": False}
    last = steps["last"]
    assert last["data"] == {"user_id": 7} and last["seq"] == 1 and last["subject"] == "events.user.created"
    assert set(last["headers"]) == {"X-Correlation-ID"} and last["headers"]["X-Correlation-ID"].isdigit()
    assert steps["info"]["config"]["retention"] == "RetentionPolicy.LIMITS"
    assert steps["info"]["state"]["messages"] == 1
    # NoETL's own client reads the values as NoETL wrote them (`json.dumps` for lists, `str` for numbers).
    assert await trio.to_thread.run_sync(nats_py_get, credential, "cache", "other") == [1, 2]
    assert await trio.to_thread.run_sync(nats_py_get, credential, "cache", "user_42_a") is None


def test_noetls_playbooks_with_a_nats_step_compile_it_onto_the_nats_tool() -> None:
    for rel, step in (
        ("tests/fixtures/playbooks/api_integration/auth0/auth0_login.yaml", "cache_and_callback"),
        ("tests/fixtures/playbooks/api_integration/auth0/auth0_login_optimized.yaml", "complete"),
        ("tests/fixtures/playbooks/api_integration/auth0/auth0_validate_session.yaml", "cache_session"),
    ):
        pb = load(rel)
        (task,) = pb.steps[step].tasks
        assert (task.kind, task.runner) == ("nats", "nats"), rel
        assert task.parts["operation"].shape == "kv_put"


async def test_a_bucket_that_does_not_exist_fails_the_step_located(credential: str) -> None:
    pb = load("tests/fixtures/playbooks/test_nats_kv.yaml")
    answer = await run(pb, {"bucket": "no_such_bucket"})
    assert not answer["ok"]
    assert "workflow[1].tool[0]: no key/value bucket `no_such_bucket`" in answer["error"]
    # A failed step is routed on by its arcs, as NoETL routes it: the steps after it fail on the same bucket.
    assert sorted(answer["noetl"]["failed_steps"]) == ["kv_delete", "kv_get", "kv_put"]


async def test_a_credential_that_is_not_set_is_a_located_step_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOETL_SECRET_NATS_CREDENTIAL", raising=False)
    answer = await run(load("tests/fixtures/playbooks/test_nats_kv.yaml"))
    assert not answer["ok"] and "NOETL_SECRET_NATS_CREDENTIAL" in answer["error"]


def test_an_unknown_operation_or_a_missing_field_is_refused_at_check_time(tmp_path) -> None:
    (tmp_path / "p.yaml").write_text(
        """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: p, path: p}
workflow:
  - step: start
    tool: {kind: nats, auth: nats_credential, operation: kv_gett, bucket: b, key: k}
  - step: two
    tool: {kind: nats, auth: nats_credential, operation: kv_put, bucket: b, key: k}
  - step: three
    tool: {kind: nats, operation: kv_get, bucket: b, key: k, nats_url: "{{ workload.url }}"}
"""
    )
    _, problems = load_playbook("p.yaml", base_dir=str(tmp_path), policy=policy())
    text = [str(p) for p in problems]
    assert any(
        "workflow[0].tool.operation: unknown NATS operation `kv_gett` (did you mean `kv_get`?)" in t for t in text
    )
    assert any("workflow[1].tool.value: is required by `kv_put`" in t for t in text)
    assert any("workflow[2].tool.nats_url: must be a constant URL" in t for t in text)
