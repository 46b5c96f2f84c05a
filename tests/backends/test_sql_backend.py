"""The SQL backends against real databases: an SQLite file and a PostgreSQL server started for the tests."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from mcpipe.backends.sql import RawResult, SqlBackend, SqlBackendConfig, SqlError, SqlTimeout, Statement

_tables = itertools.count()


@pytest.fixture(params=["sqlite", "postgresql"])
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SqlBackend]:
    """The same backend API over both drivers."""
    if request.param == "sqlite":
        config = SqlBackendConfig(url=f"sqlite:///{tmp_path / 'test.db'}", pool_size=2, statement_timeout_ms=2000)
    else:
        url = request.getfixturevalue("postgres_url")
        config = SqlBackendConfig(url=url, pool_size=2, statement_timeout_ms=2000)
    backend = SqlBackend("testdb", config)
    try:
        yield backend
    finally:
        await backend.aclose()


async def fresh_table(db: SqlBackend) -> str:
    name = f"orders_{next(_tables)}"
    await db.execute(Statement.parse(f"DROP TABLE IF EXISTS {name}"), {}, "affected_rows")
    await db.execute(
        Statement.parse(f"CREATE TABLE {name} (id INTEGER PRIMARY KEY, item TEXT NOT NULL, qty INTEGER)"),
        {},
        "affected_rows",
    )
    return name


@pytest.mark.parametrize(
    ("sql", "names", "postgres"),
    [
        ("SELECT * FROM t WHERE id = :id", ("id",), "SELECT * FROM t WHERE id = %(id)s"),
        (
            "SELECT ':no', \":no\" FROM t -- :no\n WHERE a = :a",
            ("a",),
            "SELECT ':no', \":no\" FROM t -- :no\n WHERE a = %(a)s",
        ),
        (
            "SELECT x::text, '50%' FROM t WHERE a = :a AND b = :a",
            ("a",),
            "SELECT x::text, '50%%' FROM t WHERE a = %(a)s AND b = %(a)s",
        ),
        ("SELECT $$ :no $$, /* :no */ 1", (), "SELECT $$ :no $$, /* :no */ 1"),
        ("SELECT 100 % 7", (), "SELECT 100 % 7"),
    ],
)
def test_named_parameters_are_found_outside_strings_comments_and_casts(
    sql: str, names: tuple[str, ...], postgres: str
) -> None:
    stmt = Statement.parse(sql)
    assert stmt.names == names
    assert stmt.postgres == postgres


async def test_row_modes_give_rows_one_row_or_the_affected_count(db: SqlBackend) -> None:
    t = await fresh_table(db)
    insert = Statement.parse(f"INSERT INTO {t} (id, item, qty) VALUES (:id, :item, :qty)")
    assert await db.execute(insert, {"id": 1, "item": "pen", "qty": 2}, "affected_rows") == 1
    assert await db.execute(insert, {"id": 2, "item": "ink", "qty": 5}, "affected_rows") == 1
    rows = await db.execute(Statement.parse(f"SELECT id, item, qty FROM {t} ORDER BY id"), {}, "rows")
    assert rows == [{"id": 1, "item": "pen", "qty": 2}, {"id": 2, "item": "ink", "qty": 5}]
    one = await db.execute(Statement.parse(f"SELECT item FROM {t} WHERE id = :id"), {"id": 2}, "one")
    assert one == {"item": "ink"}
    none = await db.execute(Statement.parse(f"SELECT item FROM {t} WHERE id = :id"), {"id": 9}, "one")
    assert none is None
    with pytest.raises(SqlError, match="at most one row"):
        await db.execute(Statement.parse(f"SELECT item FROM {t}"), {}, "one")
    updated = await db.execute(Statement.parse(f"UPDATE {t} SET qty = qty + 1"), {}, "affected_rows")
    assert updated == 2


async def test_a_parameter_value_is_bound_never_spliced_into_the_sql(db: SqlBackend) -> None:
    t = await fresh_table(db)
    evil = "x'); DROP TABLE " + t + "; --"
    insert = Statement.parse(f"INSERT INTO {t} (id, item) VALUES (:id, :item)")
    await db.execute(insert, {"id": 1, "item": evil}, "affected_rows")
    assert await db.execute(Statement.parse(f"SELECT item FROM {t}"), {}, "one") == {"item": evil}


async def test_a_failed_transaction_is_rolled_back_and_leaves_no_row(db: SqlBackend) -> None:
    t = await fresh_table(db)
    insert = Statement.parse(f"INSERT INTO {t} (id, item) VALUES (:id, :item)")
    with pytest.raises(SqlError):
        async with db.transaction() as tx:
            await tx.execute(insert, {"id": 1, "item": "first"}, "affected_rows")
            await tx.execute(insert, {"id": 1, "item": "duplicate key"}, "affected_rows")
    assert await db.execute(Statement.parse(f"SELECT count(*) AS n FROM {t}"), {}, "one") == {"n": 0}
    async with db.transaction() as tx:
        await tx.execute(insert, {"id": 1, "item": "first"}, "affected_rows")
        await tx.execute(insert, {"id": 2, "item": "second"}, "affected_rows")
    assert await db.execute(Statement.parse(f"SELECT count(*) AS n FROM {t}"), {}, "one") == {"n": 2}


async def test_a_cancelled_transaction_is_rolled_back(db: SqlBackend) -> None:
    t = await fresh_table(db)
    insert = Statement.parse(f"INSERT INTO {t} (id, item) VALUES (:id, :item)")
    with trio.move_on_after(5) as outer:
        async with db.transaction() as tx:
            await tx.execute(insert, {"id": 1, "item": "first"}, "affected_rows")
            outer.cancel()
            await trio.sleep_forever()
    assert outer.cancelled_caught
    assert await db.execute(Statement.parse(f"SELECT count(*) AS n FROM {t}"), {}, "one") == {"n": 0}


async def test_a_statement_past_its_timeout_is_interrupted_and_the_connection_reused(tmp_path: Path) -> None:
    # A recursive CTE that runs for minutes unless interrupted.
    db = SqlBackend(
        "slow", SqlBackendConfig(url=f"sqlite:///{tmp_path / 's.db'}", pool_size=1, statement_timeout_ms=200)
    )
    endless = Statement.parse("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c")
    try:
        with trio.fail_after(10):
            with pytest.raises(SqlTimeout, match="statement timeout of 200 ms"):
                await db.execute(endless, {}, "one")
            assert await db.execute(Statement.parse("SELECT 1 AS one"), {}, "one") == {"one": 1}
    finally:
        await db.aclose()


async def test_a_postgresql_statement_past_its_timeout_is_cancelled_on_the_server(postgres_url: str) -> None:
    db = SqlBackend("slow", SqlBackendConfig(url=postgres_url, pool_size=1, statement_timeout_ms=300))
    try:
        with trio.fail_after(10):
            with pytest.raises(SqlTimeout, match="statement timeout of 300 ms"):
                await db.execute(Statement.parse("SELECT pg_sleep(30)"), {}, "one")
            assert await db.execute(Statement.parse("SELECT 1 AS one"), {}, "one") == {"one": 1}
    finally:
        await db.aclose()


async def test_the_pool_runs_at_most_pool_size_statements_at_once(postgres_url: str) -> None:
    db = SqlBackend("pool", SqlBackendConfig(url=postgres_url, pool_size=2))
    seen: list[int] = []
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(
                    lambda: _record(db, seen),
                )
        assert max(seen) <= 2
        assert len(seen) == 5
    finally:
        await db.aclose()


_SLEEPERS = Statement.parse(
    "SELECT count(*) AS n FROM pg_stat_activity WHERE backend_type = 'client backend' AND query LIKE 'SELECT pg_sleep%'"
)


async def _record(db: SqlBackend, seen: list[int]) -> None:
    row = await db.execute(_SLEEPERS, {}, "one")
    await db.execute(Statement.parse("SELECT pg_sleep(0.05)"), {}, "rows")
    seen.append(int(row["n"]) + 1)


async def test_an_unreachable_database_is_a_clear_error() -> None:
    from kit.realservers import free_port

    db = SqlBackend(
        "gone", SqlBackendConfig(url=f"postgresql://postgres@127.0.0.1:{free_port()}/x", connect_timeout_ms=2000)
    )
    with trio.fail_after(10), pytest.raises(SqlError, match="cannot connect to sql backend 'gone'") as info:
        await db.execute(Statement.parse("SELECT 1"), {}, "rows")
    assert info.value.code == "TOOL_FAILED"


def test_a_url_of_another_database_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported database URL scheme 'mysql'"):
        SqlBackend("x", SqlBackendConfig(url="mysql://h/db"))


def test_a_relative_sqlite_path_is_relative_to_the_config_directory(tmp_path: Path) -> None:
    from mcpipe.backends.sql import driver_for

    config = SqlBackendConfig(url="sqlite:///data/app.db")
    assert driver_for(config.url, config, str(tmp_path)).path == str(tmp_path / "data" / "app.db")  # type: ignore[attr-defined]
    absolute = SqlBackendConfig(url=f"sqlite:///{tmp_path}/x.db")
    assert driver_for(absolute.url, absolute, "/elsewhere").path == f"{tmp_path}/x.db"  # type: ignore[attr-defined]
    assert driver_for("sqlite://", config).path == ":memory:"  # type: ignore[attr-defined]


async def test_a_long_statement_does_not_block_the_event_loop(db: SqlBackend) -> None:
    slow = (
        "SELECT pg_sleep(1)"
        if db.kind == "postgresql"
        else "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 50000000) SELECT count(*) FROM c"
    )
    ticks = 0
    async with trio.open_nursery() as nursery:
        done = trio.Event()

        async def statement() -> None:
            with trio.move_on_after(1.5):  # an interrupted statement is fine: it ran long enough
                try:
                    await db.execute(Statement.parse(slow), {}, "rows")
                except SqlTimeout:
                    pass
            done.set()

        nursery.start_soon(statement)
        # While the statement runs in its worker thread, this task keeps running on the event loop: it ticks
        # while the statement is still running (on the loop, the statement would let no tick in before its end).
        # Counted, not timed: a loaded host makes each tick slower, not fewer than a handful in a second.
        while not done.is_set():
            await trio.sleep(0.01)
            if not done.is_set():
                ticks += 1
    assert ticks >= 3, ticks


async def test_concurrent_transactions_that_read_then_write_wait_for_each_other(db: SqlBackend) -> None:
    t = await fresh_table(db)
    await db.execute(Statement.parse(f"INSERT INTO {t} (id, item, qty) VALUES (1, 'pen', 0)"), {}, "affected_rows")
    read = Statement.parse(f"SELECT qty FROM {t} WHERE id = 1")
    write = Statement.parse(f"UPDATE {t} SET qty = :qty WHERE id = 1")

    async def add_one() -> None:
        async with db.transaction() as tx:
            row = await tx.execute(read, {}, "one")
            await trio.sleep(0.05)  # the other transaction runs meanwhile
            await tx.execute(write, {"qty": row["qty"] + 1}, "affected_rows")

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(add_one)
            nursery.start_soon(add_one)
    final = await db.execute(read, {}, "one")
    # SQLite serializes the two (BEGIN IMMEDIATE): 2. PostgreSQL's default isolation lets both read 0: 1.
    assert final == {"qty": 2 if db.kind == "sqlite" else 1}


async def test_postgresql_values_become_json(postgres_url: str) -> None:
    db = SqlBackend("types", SqlBackendConfig(url=postgres_url))
    stmt = Statement.parse(
        "SELECT 1.50::numeric AS price, 7::numeric AS whole, '2026-01-02 03:04:05+00'::timestamptz AS at,"
        " '2026-01-02'::date AS day, '\\x0102'::bytea AS raw, :doc::jsonb AS doc, ARRAY[1, 2] AS ids,"
        " 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid AS id, interval '90 seconds' AS wait, :tags::text[] AS tags"
    )
    try:
        with trio.fail_after(10):
            row = await db.execute(stmt, {"doc": {"a": [1, None]}, "tags": ["x", "y"]}, "one")
    finally:
        await db.aclose()
    assert row == {
        "price": 1.5,
        "whole": 7,
        "at": "2026-01-02T03:04:05+00:00",
        "day": "2026-01-02",
        "raw": "AQI=",
        "doc": {"a": [1, None]},
        "ids": [1, 2],
        "id": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "wait": 90.0,
        "tags": ["x", "y"],
    }


# --- the sql kinds' public run API (kinds/sql.run_statement, kinds/sql_tx.run_transaction) ------------------


async def test_run_statement_answers_the_drivers_values_and_the_column_types(db: SqlBackend) -> None:
    from decimal import Decimal

    from mcpipe.kinds.sql import run_statement

    t = await fresh_table(db)
    await db.execute(Statement.parse(f"INSERT INTO {t} (id, item, qty) VALUES (1, 'pen', 3)"), {}, "affected_rows")
    result = await run_statement(
        db, Statement.parse(f"SELECT id, item, qty * 1.5 AS half FROM {t} WHERE id = :id"), {"id": 1}
    )
    assert result.columns == ("id", "item", "half")
    assert list(result.rows[0][:2]) == [1, "pen"]
    if db.kind == "postgresql":
        assert result.types == ("int4", "text", "numeric")
        assert result.rows[0][2] == Decimal("4.5")  # the driver's value, not made JSON-ready
    else:
        assert result.types == ()
        assert result.rows[0][2] == 4.5


async def test_run_statement_settings_hold_for_that_statement_alone(postgres_url: str) -> None:
    from mcpipe.kinds.sql import run_statement

    db = SqlBackend("pg", SqlBackendConfig(url=postgres_url, pool_size=1))
    try:
        read = Statement.parse("SELECT current_setting('app.tenant', true) AS tenant")
        inside = await run_statement(db, read, {}, settings=[("app.tenant", "acme")])
        after = await run_statement(db, read, {})  # the same pooled connection (pool_size 1)
    finally:
        await db.aclose()
    assert inside.rows[0][0] == "acme"
    assert after.rows[0][0] in ("", None)


async def test_run_transaction_binds_from_earlier_outputs_and_names_the_statement_that_failed(db: SqlBackend) -> None:
    from mcpipe.kinds.sql_tx import TransactionFailed, TxStatement, run_transaction

    t = await fresh_table(db)
    insert = Statement.parse(f"INSERT INTO {t} (id, item) VALUES (:id, :item)")
    count = Statement.parse(f"SELECT count(*) AS n FROM {t}")

    def rows(result: RawResult) -> list[list[object]]:
        return [list(r) for r in result.rows]

    def affected(result: RawResult) -> int:
        return result.rowcount

    ok = await run_transaction(
        db,
        [
            TxStatement("first", insert, lambda _: {"id": 1, "item": "pen"}, affected),
            TxStatement("second", insert, lambda out: {"id": out["first"] + 1, "item": "ink"}, affected),
            TxStatement("n", count, lambda _: {}, rows),
        ],
    )
    assert ok == {"first": 1, "second": 1, "n": [[2]]}
    with pytest.raises(TransactionFailed) as failed:
        await run_transaction(
            db,
            [
                TxStatement("third", insert, lambda _: {"id": 3, "item": "cap"}, affected),
                TxStatement("again", insert, lambda _: {"id": 1, "item": "duplicate key"}, affected),
            ],
        )
    assert failed.value.statement == "again"
    assert failed.value.database is not None  # the database's own words, for a format that quotes them
    assert await db.execute(count, {}, "one") == {"n": 2}  # the third row was rolled back with it
