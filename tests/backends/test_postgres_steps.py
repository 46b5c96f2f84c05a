"""postgres steps (NoETL's postgres tool) on a PostgreSQL server started for the tests: several statements
in one text, NoETL's result of the last one, a failing statement reported as NoETL reports it, the backend
chosen at run time, a connection from a dsn, and values bound as parameters."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import trio

from kit.declared import compiled, env
from mcpipe.backends.sql import SqlBackend, SqlBackendConfig
from mcpipe.declared import StepPolicy, StepScope, compile_step
from mcpipe.tools._base import ToolContext

_n = itertools.count()


@pytest.fixture
async def policy(postgres_url: str) -> AsyncIterator[StepPolicy]:
    backends = {
        "pg_local": SqlBackend("pg_local", SqlBackendConfig(url=postgres_url, statement_timeout_ms=2000)),
        "lite": SqlBackend("lite", SqlBackendConfig(url="sqlite://")),
    }
    yield StepPolicy(sql=backends)
    for b in backends.values():
        await b.aclose()


async def run(policy: StepPolicy, raw: dict[str, Any], args: Any = None) -> Any:
    with trio.fail_after(30):
        return await compiled({"kind": "postgres", **raw}, policy).execute(env(args), ToolContext())


async def test_the_result_is_noetls_result_of_the_last_statement(policy):
    t = f"pgk{next(_n)}"
    text = (
        f"CREATE TABLE {t} (id int, name text); INSERT INTO {t} VALUES (1, 'a;b'), (2, 'c');\n"
        f"SELECT * FROM {t} ORDER BY id"
    )
    out = await run(policy, {"backend": "pg_local", "command": text})
    assert out.ok, out.error
    assert out.output == {
        "status": "success",
        "rows": [{"id": 1, "name": "a;b"}, {"id": 2, "name": "c"}],
        "row_count": 2,
        "columns": ["id", "name"],
        "statement_count": 3,
    }
    out = await run(policy, {"backend": "pg_local", "command": f"DELETE FROM {t} WHERE id = 1"})
    assert out.output == {
        "status": "success",
        "row_count": 1,
        "message": "Command executed. 1 rows affected.",
        "statement_count": 1,
    }


async def test_a_failing_statement_does_not_stop_the_next_and_fails_the_step_as_noetl_reports_it(policy):
    t = f"pgk{next(_n)}"
    text = f"CREATE TABLE {t} (id int); SELECT * FROM nowhere_{t}; INSERT INTO {t} VALUES (5)"
    out = await run(policy, {"backend": "pg_local", "command": text})
    assert not out.ok and out.error_code == "TOOL_ERROR"
    assert out.output["status"] == "error" and out.output["statement_count"] == 3
    assert out.output["row_count"] == 1  # the insert after the failure ran
    assert [e["statement_index"] for e in out.output["errors"]] == [1]
    assert out.error.startswith(f"postgres backend 'pg_local': statement_1: relation \"nowhere_{t}\" does not exist")


async def test_the_backend_is_chosen_at_run_time_and_values_are_bound_never_spliced(policy):
    raw = {
        "backend": "${args.db}",
        "command": "SELECT :name::text AS name, length(:name) AS n",
        "params": {"name": "${args.name}"},
    }
    attack = "x'); DROP TABLE users; --"
    out = await run(policy, raw, {"db": "pg_local", "name": attack})
    assert out.output["rows"] == [{"name": attack, "n": len(attack)}]
    out = await run(policy, raw, {"db": "elsewhere", "name": "a"})
    assert not out.ok and out.error == "no sql backend 'elsewhere' (backends: lite, pg_local)"
    out = await run(policy, raw, {"db": "lite", "name": "a"})
    assert not out.ok and out.error == "sql backend 'lite' is sqlite, not PostgreSQL"


async def test_a_dsn_object_opens_a_connection_for_the_step(policy, postgres_url):
    u = urlsplit(postgres_url)
    dsn = {"host": u.hostname, "port": u.port, "user": u.username, "dbname": u.path.lstrip("/")}
    out = await run(policy, {"dsn": dsn, "command": "SELECT 40 + 2 AS answer"})
    assert out.ok, out.error
    assert out.output["rows"] == [{"answer": 42}]


async def test_a_statement_past_the_backends_timeout_fails_with_timeout(policy):
    out = await run(policy, {"backend": "pg_local", "command": "SELECT pg_sleep(30)"})
    assert not out.ok and out.error_code == "TIMEOUT"


async def test_an_unknown_constant_backend_and_a_missing_connection_are_refused_at_load(policy):
    _, problems = compile_step(
        {"kind": "postgres", "backend": "pg_k8s", "command": "SELECT 1"}, "steps[0]", StepScope(policy=policy)
    )
    assert [(p.location, p.message) for p in problems] == [
        (
            "steps[0].backend",
            "no sql backend 'pg_k8s': add [sql.pg_k8s] with a postgresql:// url (backends: lite, pg_local)",
        )
    ]
    _, problems = compile_step({"kind": "postgres", "command": "SELECT 1"}, "steps[0]", StepScope(policy=policy))
    assert [p.location for p in problems] == ["steps[0]"]
