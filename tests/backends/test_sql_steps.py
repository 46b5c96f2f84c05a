"""The sql, sql_tx and sql_await steps, served by the real server and called with the SDK's Client, on a
SQLite file and on a PostgreSQL server started for the tests."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client

from kit.served import served
from mcpipe.backends.sql import SqlBackend, SqlBackendConfig, Statement
from mcpipe.config import ConfigError, parse_config
from mcpipe.server import App

_n = itertools.count()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shop.db'}"
    return str(request.getfixturevalue("postgres_url"))


async def prepare(url: str, *statements: str) -> None:
    backend = SqlBackend("setup", SqlBackendConfig(url=url))
    try:
        for sql in statements:
            await backend.execute(Statement.parse(sql), {}, "affected_rows")
    finally:
        await backend.aclose()


async def call(app: App, name: str, args: dict[str, Any]) -> tuple[bool, Any]:
    async with Client(app.server) as client:
        r = await client.call_tool(name, args)
    text = r.content[0].text  # type: ignore[union-attr]
    return r.is_error, (r.structured_content if r.structured_content is not None else text)


def shop(url: str, t: str) -> dict[str, Any]:
    return {
        "sql": {"shop": {"url": url, "pool_size": 2, "statement_timeout_ms": 5000}},
        "pipelines": [
            {
                "name": "place_order",
                "input_schema": {
                    "type": "object",
                    "properties": {"order": {"type": "integer"}, "item": {"type": "string"}},
                },
                "steps": [
                    {
                        "kind": "sql_tx",
                        "id": "charge",
                        "backend": "shop",
                        "steps": [
                            {
                                "id": "deduct",
                                "sql": f"UPDATE {t}_stock SET qty = qty - 1 WHERE item = :item",
                                "params": ["item"],
                                "row_mode": "affected_rows",
                            },
                            {
                                "id": "record",
                                "sql": f"INSERT INTO {t}_orders (id, item) VALUES (:id, :item) RETURNING id",
                                "params": {"id": "${args.order}", "item": "${args.item}"},
                                "row_mode": "one",
                            },
                            {
                                "id": "left",
                                "sql": f"SELECT qty FROM {t}_stock WHERE item = :item AND :n = 1",
                                "params": {"item": "${args.item}", "n": "${steps.deduct.output}"},
                                "row_mode": "one",
                            },
                        ],
                    }
                ],
                "output": {
                    "order": "${steps.charge.output.steps.record.id}",
                    "left": "${steps.charge.output.steps.left.qty}",
                },
            },
            {
                "name": "orders",
                "steps": [
                    {
                        "kind": "sql",
                        "id": "all",
                        "backend": "shop",
                        "sql": f"SELECT id, item FROM {t}_orders ORDER BY id",
                    }
                ],
                "output": {"orders": "${steps.all.output}"},
            },
        ],
    }


async def test_a_transaction_step_commits_all_its_statements_and_nests_their_results(db_url: str) -> None:
    t = f"s{next(_n)}"
    await prepare(
        db_url,
        f"CREATE TABLE {t}_stock (item TEXT PRIMARY KEY, qty INTEGER NOT NULL CHECK (qty >= 0))",
        f"CREATE TABLE {t}_orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)",
        f"INSERT INTO {t}_stock VALUES ('pen', 1)",
    )
    with trio.fail_after(30):
        async with served(shop(db_url, t)) as app:
            assert await call(app, "place_order", {"order": 1, "item": "pen"}) == (False, {"order": 1, "left": 0})
            assert await call(app, "orders", {}) == (False, {"orders": [{"id": 1, "item": "pen"}]})


async def test_a_rolled_back_transaction_leaves_no_row(db_url: str) -> None:
    t = f"s{next(_n)}"
    await prepare(
        db_url,
        f"CREATE TABLE {t}_stock (item TEXT PRIMARY KEY, qty INTEGER NOT NULL CHECK (qty >= 0))",
        f"CREATE TABLE {t}_orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)",
        f"INSERT INTO {t}_stock VALUES ('pen', 5)",
        f"INSERT INTO {t}_orders VALUES (7, 'ink')",
    )
    with trio.fail_after(30):
        async with served(shop(db_url, t)) as app:
            # The stock is deducted, then the order id already exists: the whole transaction goes.
            is_error, text = await call(app, "place_order", {"order": 7, "item": "pen"})
            assert is_error
            assert text.startswith("TOOL_ERROR: step 'charge' failed: sql backend 'shop': statement 'record' failed")
            assert "the transaction was rolled back" in text
            assert await call(app, "orders", {}) == (False, {"orders": [{"id": 7, "item": "ink"}]})
    await check_stock(db_url, t, 5)


async def check_stock(url: str, t: str, qty: int) -> None:
    backend = SqlBackend("check", SqlBackendConfig(url=url))
    try:
        assert await backend.execute(Statement.parse(f"SELECT qty FROM {t}_stock"), {}, "one") == {"qty": qty}
    finally:
        await backend.aclose()


def waiting(url: str, t: str, until: str, timeout_ms: float) -> dict[str, Any]:
    return {
        "sql": {"jobs": {"url": url}},
        "pipelines": [
            {
                "name": "run_job",
                "input_schema": {"type": "object", "properties": {"job": {"type": "string"}}},
                "steps": [
                    {
                        "kind": "sql_await",
                        "id": "done",
                        "backend": "jobs",
                        "trigger": {"sql": f"INSERT INTO {t} (name, polls) VALUES (:job, 0)", "params": ["job"]},
                        # Each check counts itself, so the job is "done" after a number of polls.
                        "check": {
                            "sql": f"UPDATE {t} SET polls = polls + 1 WHERE name = :job RETURNING name, polls",
                            "params": {"job": "${args.job}"},
                        },
                        "until": until,
                        "interval_ms": 10,
                        "timeout_ms": timeout_ms,
                    }
                ],
            }
        ],
    }


async def test_an_await_step_polls_its_check_until_the_condition_holds(db_url: str) -> None:
    t = f"jobs{next(_n)}"
    await prepare(db_url, f"CREATE TABLE {t} (name TEXT PRIMARY KEY, polls INTEGER NOT NULL)")
    with trio.fail_after(30):
        async with served(waiting(db_url, t, "size(rows) == 1 && rows[0].polls >= 3", 10_000)) as app:
            is_error, out = await call(app, "run_job", {"job": "backup"})
    assert (is_error, out) == (False, {"rows": [{"name": "backup", "polls": 3}], "checks": 3})


async def test_a_timed_out_await_says_what_it_last_saw(db_url: str) -> None:
    t = f"jobs{next(_n)}"
    await prepare(db_url, f"CREATE TABLE {t} (name TEXT PRIMARY KEY, polls INTEGER NOT NULL)")
    with trio.fail_after(30):
        async with served(waiting(db_url, t, "rows[0].polls < 0", 300)) as app:
            is_error, text = await call(app, "run_job", {"job": "backup"})
    assert is_error
    assert text.startswith("TIMEOUT: step 'done' failed: `rows[0].polls < 0` did not hold within 300 ms (")
    assert 'the last check returned [{"name":"backup","polls":' in text


def test_sql_steps_are_checked_at_load_with_their_locations(tmp_path: Path) -> None:
    doc = {
        "sql": {"shop": {"url": f"sqlite:///{tmp_path / 'x.db'}"}, "bad": {"url": "mysql://h/db"}},
        "pipelines": [
            {
                "name": "p",
                "steps": [
                    {"kind": "sql", "id": "a", "backend": "nowhere", "sql": "SELECT 1"},
                    {"kind": "sql", "id": "b", "backend": "shop", "sql": "SELECT :x, :y", "params": {"x": 1}},
                    {"kind": "sql", "id": "c", "backend": "shop", "sql": "SELECT 1", "row_mode": "many"},
                    {"kind": "sql_await", "id": "d", "backend": "shop", "check": "SELECT 1", "until": "rowz == 1"},
                    {
                        "kind": "sql_tx",
                        "id": "e",
                        "backend": "shop",
                        "steps": [
                            {"id": "s", "sql": "SELECT 1"},
                            {"id": "s", "sql": "SELECT :q", "params": {"q": "${steps.zz.output}"}},
                        ],
                    },
                ],
            }
        ],
    }
    with pytest.raises(ConfigError) as info:
        parse_config(json.dumps(doc), "json", environ={})
    found = [str(p) for p in info.value.problems]
    expected = [
        "sql.bad.url: unsupported database URL scheme 'mysql'",
        "pipelines.p.steps[0].backend: unknown sql backend 'nowhere' (backends: bad, shop)",
        "pipelines.p.steps[1].sql: parameter :y has no value in `params`",
        "pipelines.p.steps[2].row_mode: Invalid enum value 'many'",
        "pipelines.p.steps[3].until: invalid CEL: unknown variable `rowz`",
        "pipelines.p.steps[4].steps[1].id: duplicate id 's'",
        "pipelines.p.steps[4].steps[1].params.q: reference to unknown step 'zz'",
    ]
    for want in expected:
        assert any(want in f for f in found), (want, found)
    assert len(found) == len(expected), found


async def test_the_pool_opens_connections_on_first_use_and_closes_them_when_the_server_stops(db_url: str) -> None:
    from mcpipe.declared import DeclaredPipelines

    t = f"s{next(_n)}"
    await prepare(db_url, f"CREATE TABLE {t}_orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)")
    with trio.fail_after(30):
        async with served(shop(db_url, t)) as app:
            declared = next(s for s in app.gateway.sources if isinstance(s, DeclaredPipelines))
            backend = declared.policy.sql["shop"]
            assert backend._idle == []  # nothing is opened at load
            assert await call(app, "orders", {}) == (False, {"orders": []})
            assert len(backend._idle) == 1
    assert backend._idle == [] and backend._closed
