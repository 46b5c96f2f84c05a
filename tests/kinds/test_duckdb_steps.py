"""duckdb steps on the real duckdb package: statements split as NoETL splits them, a file database shared
between steps, NoETL's result shape, and a runaway query interrupted at its deadline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from kit.declared import compiled, env
from mcpipe.declared import StepPolicy
from mcpipe.kinds import DuckdbPolicy
from mcpipe.kinds._sqltext import split_duckdb, split_postgres
from mcpipe.tools._base import ToolContext

pytest.importorskip("duckdb")

USERS = """
CREATE TABLE users (id INTEGER, name VARCHAR, age INTEGER);
-- a comment line
INSERT INTO users VALUES (1, 'Alice; the first', 30), (2, 'Bob', 25), (3, 'Charlie', 35);
SELECT name, age FROM users WHERE age >= 30 ORDER BY age;
"""


async def run(raw: dict[str, Any], args: Any = None, policy: StepPolicy | None = None) -> Any:
    with trio.fail_after(30):
        return await compiled({"kind": "duckdb", **raw}, policy).execute(env(args), ToolContext())


async def test_the_output_is_the_last_statements_rows():
    out = await run({"commands": USERS})
    assert out.ok, out.error
    assert out.output == [{"name": "Alice; the first", "age": 30}, {"name": "Charlie", "age": 35}]


async def test_noetl_output_is_noetls_summary_of_the_statements():
    out = await run({"commands": USERS, "output": "noetl"})
    assert out.ok, out.error
    task_id = out.output.pop("task_id")
    assert len(task_id) == 36
    assert out.output == {
        "executed_commands": 3,
        "command_2_rows": 1,
        "command_2_sample": [[3]],
        "command_3_rows": 2,
        "command_3_sample": [["Alice; the first", 30], ["Charlie", 35]],
        "secrets_created": 0,
        "database_path": ":memory:",
    }


async def test_a_file_database_keeps_its_tables_between_steps(tmp_path: Path):
    db = str(tmp_path / "state" / "run.duckdb")
    first = await run({"commands": "CREATE TABLE t AS SELECT ${args.n} AS n", "database": db}, {"n": 7})
    second = await run({"commands": "SELECT n * 2 AS twice FROM t", "database": db})
    assert first.ok and second.output == [{"twice": 14}]


async def test_a_failing_statement_fails_the_step_naming_it():
    out = await run({"commands": "SELECT 1; SELEC 2"})
    assert not out.ok and out.error_code == "TOOL_ERROR"
    assert out.error.startswith("duckdb (in memory): statement 2 failed: Parser Error")


async def test_a_runaway_query_is_interrupted_at_its_deadline():
    out = await run({"commands": "SELECT count(*) FROM range(100000000000) a, range(1000000) b", "timeout_ms": 500})
    assert not out.ok and out.error_code == "TIMEOUT"
    assert "deadline of 500 ms (interrupted)" in out.error


async def test_more_rows_than_the_policy_allows_fail_the_step():
    policy = StepPolicy(duckdb=DuckdbPolicy(max_rows=10))
    out = await run({"commands": "SELECT * FROM range(11)"}, policy=policy)
    assert not out.ok and "more than 10 rows" in out.error


async def test_params_bind_the_statements_dollar_names_and_never_become_sql():
    out = await run(
        {"commands": USERS + "SELECT name FROM users WHERE name = $who OR age = $age", "params": "${args}"},
        {"who": "Bob' OR 1=1 --", "age": 35},
    )
    assert out.ok, out.error
    assert out.output == [{"name": "Charlie"}]


async def test_duckdb_reaches_no_file_outside_its_database_unless_the_operator_allows_it(tmp_path: Path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "in.csv").write_text("a,b\n1,2\n")
    read = {"commands": f"SELECT * FROM read_csv('{tmp_path}/data/in.csv')"}
    copy = {"commands": f"COPY (SELECT 1 AS x) TO '{tmp_path}/out.csv'"}
    for raw in (read, copy, {"commands": "SELECT content FROM read_text('/etc/hostname')"}):
        out = await run(raw)
        assert not out.ok and "file system operations are disabled by configuration" in out.error
    out = await run({"commands": "SET enable_external_access = true"})
    assert not out.ok and "the configuration has been locked" in out.error
    out = await run({"commands": "SET memory_limit = '64GB'"})  # nor the limits
    assert not out.ok and "the configuration has been locked" in out.error
    assert not (tmp_path / "out.csv").exists()
    allowed = StepPolicy(duckdb=DuckdbPolicy(allowed_directories=(str(tmp_path / "data"),)))
    out = await run(read, policy=allowed)
    assert out.ok and out.output == [{"a": 1, "b": 2}], out.error
    out = await run(copy, policy=allowed)
    assert not out.ok and "disabled by configuration" in out.error
    opened = StepPolicy(duckdb=DuckdbPolicy(external_access=True))
    out = await run(copy, policy=opened)
    assert out.ok, out.error
    assert (tmp_path / "out.csv").read_text() == "x\n1\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("SELECT 1; SELECT 2;", ["SELECT 1", "SELECT 2"]),
        ("SELECT ';';\n  -- x\nSELECT 2", ["SELECT ';'", "SELECT 2"]),
        ("# comment\nSELECT\n  1;\n\n", ["SELECT 1"]),
    ],
)
def test_duckdb_text_splits_as_noetl_splits_it(text, expected):
    assert split_duckdb(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("SELECT 1; SELECT 2;", ["SELECT 1", "SELECT 2"]),
        ("SELECT 'a;b' -- c;d\n; SELECT \"x;y\"", ["SELECT 'a;b'", 'SELECT "x;y"']),
        ("DO $f$ BEGIN PERFORM 1; END $f$; /* ; */ SELECT 2", ["DO $f$ BEGIN PERFORM 1; END $f$", "SELECT 2"]),
        ("SELECT 'it''s; here'", ["SELECT 'it''s; here'"]),
    ],
)
def test_postgres_text_splits_as_noetl_splits_it(text, expected):
    assert split_postgres(text) == expected
