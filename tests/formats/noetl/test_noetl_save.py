"""NoETL's ``save`` and ``transfer`` on its own vendored playbooks: a step's result persisted into a real
PostgreSQL (started by the tests), as NoETL's save executor writes it (a ``type: save`` step's upsert, an
iterator's save per item and its aggregated save after the last item), and an HTTP API's records moved into a
table (its ``transfer`` tool, against a real HTTP server on 127.0.0.1)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import psycopg
import pytest
import trio

from kit.noetl import UPSTREAM, origin, policy
from mcpipe.declared import load_sql
from mcpipe.formats.noetl import NoetlPlaybook, load_playbook, playbook_tool

_db = itertools.count()


@pytest.fixture
def database(noetl_postgres: str) -> str:
    """A fresh database on the session's PostgreSQL; its URL."""
    name = f"noetl_save_{next(_db)}"
    with psycopg.connect(noetl_postgres, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return noetl_postgres.rsplit("/", 1)[0] + f"/{name}"


def load(rel: str, url: str) -> NoetlPlaybook:
    backends, problems = load_sql({"pg_local": {"url": url}, "pg_k8s": {"url": url}})
    assert problems == []
    pb, found = load_playbook(rel, base_dir=str(UPSTREAM), policy=replace(policy(), sql=backends))
    assert found == [], [str(p) for p in found]
    assert isinstance(pb, NoetlPlaybook)
    return pb


async def run(pb: NoetlPlaybook, args: dict[str, Any] | None = None) -> dict[str, Any]:
    try:
        with trio.fail_after(60):
            return await playbook_tool(pb).run(args or {})
    finally:
        for backend in pb.policy.sql.values():  # the credentials' pools, as the server closes them
            if backend is not None:
                await backend.aclose()


def rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql).fetchall()


async def test_a_save_step_upserts_its_data_into_the_table_its_credential_reaches(database):
    answer = await run(load("examples/test/postgres_save_simple2.yaml", database))
    assert answer["ok"], answer["error"]
    saved = answer["noetl"]["steps"]["save_row"][0]
    assert saved["status"] == "success" and saved["data"]["saved"] == "postgres"
    assert saved["data"]["table"] == "public.postgres_save_demo"
    assert rows(database, "SELECT message FROM public.postgres_save_demo") == [("Hello Save",)]


async def test_an_iterator_saves_each_items_result_then_the_whole_loop_once_after_its_last_item(database):
    answer = await run(load("examples/test/loop_controller_numbers.yaml", database))
    assert answer["ok"], answer["error"]
    got = rows(database, "SELECT iter_index, input_val, output_val, id FROM public.loop_numbers ORDER BY iter_index")
    assert [r[:3] for r in got] == [(0, 1, 1), (1, 2, 4), (2, 3, 9), (3, 4, 16)]
    assert all(r[3].endswith(f":{r[0]}") for r in got)  # `{{ execution_id }}:{{ loop_numbers.result_index }}`
    ((count, results),) = rows(database, "SELECT count, results_json FROM public.loop_numbers_agg")
    assert count == 4 and [r["square"] for r in results] == [1, 4, 9, 16]
    per_item = answer["noetl"]["steps"]["loop_numbers"]
    assert [r["meta"]["save"]["data"]["saved"] for r in per_item] == ["postgres"] * 4


async def test_a_save_that_fails_fails_its_step_located_at_the_save(database):
    # The table the save writes into does not exist: `create_table` is left out by asking the save directly.
    pb = load("examples/test/postgres_save_simple2.yaml", database)
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.postgres_save_demo (id INTEGER PRIMARY KEY, message TEXT)")
    answer = await run(pb)
    assert not answer["ok"]
    assert answer["noetl"]["failed_steps"] == ["save_row"]
    assert "workflow[2]" in answer["error"] and "postgres" in answer["error"]


async def test_a_transfer_moves_an_http_apis_records_into_a_table_by_its_mapping(database):
    pb = load(
        "tests/fixtures/playbooks/data_transfer/http_to_postgres_transfer/http_to_postgres_transfer.yaml", database
    )
    with origin() as o:
        answer = await run(pb, {"api_url": f"{o.url}/posts"})
    assert answer["ok"], answer["error"]
    (moved,) = answer["noetl"]["steps"]["transfer_http_to_pg"]
    assert moved["data"]["direction"] == "http_to_postgres" and moved["data"]["rows_transferred"] == 1
    got = rows(database, "SELECT post_id, user_id, title FROM public.http_to_postgres_transfer")
    assert got == [(1, 1, "first")]  # the API's `id`, `userId`, `title` by the mapping
