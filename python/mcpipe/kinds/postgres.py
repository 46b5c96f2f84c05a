"""The ``postgres`` step kind: SQL text with several statements, on a PostgreSQL database, NoETL's way.

Where the ``sql`` kind runs one statement fixed at load, ``postgres`` runs NoETL's postgres tool: ``command``
is SQL text resolved per call, split into statements (NoETL's rule: at ``;`` outside strings, identifiers,
dollar quotes and comments), each run in its own transaction on one connection, and the result is NoETL's:
the last statement's ``{status, rows, row_count, columns}`` (or ``{status, row_count, message}`` for one that
returns no rows) with ``statement_count``. A statement that fails does not stop the next ones (as in NoETL);
the step then fails with the result, ``status: error`` and the ``errors``.

The database is a ``[sql.NAME]`` backend of the config (``backend``, a template: NoETL playbooks choose their
credential at run time), with its pool, deadlines and row limit, or a connection URL (``dsn``, a template:
``postgresql://...`` or an object ``{host, port, user, password, dbname}``) opened for the step. Values in
``params`` are bound by the driver to the statements' ``:name`` parameters (the NoETL mapping turns a quoted
``'{{ expr }}'`` into one), never put into the SQL text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from mcpipe._describe import json_type
from mcpipe.backends.sql import SqlBackend, SqlBackendConfig, SqlError, SqlTransaction, Statement
from mcpipe.errors import ErrorCode
from mcpipe.kinds._base import Build, Kind, StepFields
from mcpipe.kinds._sqltext import split_postgres
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = ["KIND", "PostgresFields", "PostgresPlan", "run_postgres", "statements_result"]


class PostgresFields(StepFields, tag="postgres"):
    """SQL statements (``command``, a template: text) on a PostgreSQL database: a ``[sql.NAME]`` backend
    (``backend``, a template) or a connection (``dsn``, a template). ``params`` (a template: an object) binds
    the statements' ``:name`` parameters."""

    command: Any
    backend: Any = None
    dsn: Any = None
    params: Any = None


@dataclass(frozen=True, slots=True)
class PostgresPlan:
    backends: Mapping[str, Any]
    """The policy's SQL backends by name (None for one whose entry has problems)."""


def build_postgres(b: Build[PostgresFields]) -> PostgresPlan:
    """Exactly one of ``backend`` and ``dsn``; a constant backend name must be a PostgreSQL backend."""
    backend, dsn = b.raw.get("backend"), b.raw.get("dsn")
    if (backend is None) == (dsn is None):
        b.problem(b.location, "a postgres step needs `backend` (a [sql.NAME] of the config) or `dsn`, not both")
    elif isinstance(backend, str) and "${" not in backend and "{{" not in backend:
        _check_backend(b, backend)
    return PostgresPlan(b.policy.sql)


def _check_backend(b: Build[PostgresFields], name: str) -> None:
    known = b.policy.sql
    if name not in known:
        names = ", ".join(sorted(known)) if known else "none are configured"
        b.problem(
            f"{b.location}.backend",
            f"no sql backend '{name}': add [sql.{name}] with a postgresql:// url (backends: {names})",
        )
    elif known[name] is not None and known[name].kind != "postgresql":
        b.problem(f"{b.location}.backend", f"sql backend '{name}' is {known[name].kind}, not PostgreSQL")


def _dsn(value: object) -> str:
    if isinstance(value, str) and value.startswith(("postgresql://", "postgres://")):
        return value
    if isinstance(value, Mapping):
        host = value.get("host") or value.get("db_host")
        port = value.get("port") or value.get("db_port") or 5432
        user = value.get("user") or value.get("username") or value.get("db_user")
        password = value.get("password") or value.get("db_password")
        db = value.get("dbname") or value.get("database") or value.get("db_name")
        missing = [n for n, v in (("host", host), ("user", user), ("dbname", db)) if not v]
        if missing:
            raise StepFailure(f"`dsn` lacks {', '.join(missing)}", ErrorCode.TOOL_FAILED)
        auth = quote(str(user), safe="") + (":" + quote(str(password), safe="") if password else "")
        return f"postgresql://{auth}@{host}:{port}/{quote(str(db), safe='')}"
    raise StepFailure(
        f"`dsn` must resolve to a postgresql:// URL or an object (host, port, user, password, dbname), "
        f"got {json_type(value)}",
        ErrorCode.TOOL_FAILED,
    )


async def run_postgres(
    step: Leaf[PostgresFields, PostgresPlan], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Run the statements; the output is NoETL's result of the last one (with ``statement_count``)."""
    text = inputs["command"]
    if isinstance(text, list) and all(isinstance(t, str) for t in text):
        text = "\n".join(text)
    if not isinstance(text, str):
        raise StepFailure(f"`command` must resolve to SQL text, got {json_type(text)}", ErrorCode.TOOL_FAILED)
    params = inputs.get("params")
    if params is not None and not isinstance(params, Mapping):
        raise StepFailure(f"`params` must resolve to an object, got {json_type(params)}", ErrorCode.TOOL_FAILED)
    statements = split_postgres(text)
    if params:
        try:
            parsed = [Statement.parse(s) for s in statements]
        except ValueError as e:
            raise StepFailure(str(e), ErrorCode.TOOL_FAILED) from None
    else:
        parsed = [Statement(s, (), s, s) for s in statements]
    name = inputs.get("backend")
    if name is not None:
        backend = _backend(step.built, name)
        async with backend.connection() as conn:
            results = await _run_all(conn, parsed, dict(params or {}), backend.name)
    else:
        url = _dsn(inputs.get("dsn"))
        backend = SqlBackend("dsn", SqlBackendConfig(url=url, pool_size=1))
        try:
            async with backend.connection() as conn:
                results = await _run_all(conn, parsed, dict(params or {}), "dsn")
        finally:
            await backend.aclose()
    out = statements_result(results)
    if out["status"] == "error":
        raise StepFailure(f"postgres {_where(name)}: {out['message']}", ErrorCode.TOOL_ERROR, out)
    return StepOutput.of(out)


def _where(name: object) -> str:
    return f"backend '{name}'" if name is not None else "dsn"


def _backend(plan: PostgresPlan, name: object) -> SqlBackend:
    if not isinstance(name, str) or name not in plan.backends:
        known = ", ".join(sorted(plan.backends)) or "none are configured"
        raise StepFailure(f"no sql backend '{name}' (backends: {known})", ErrorCode.TOOL_FAILED)
    backend = plan.backends[name]
    if backend is None:
        raise StepFailure(f"sql backend '{name}' has problems in the config", ErrorCode.TOOL_FAILED)
    if backend.kind != "postgresql":
        raise StepFailure(f"sql backend '{name}' is {backend.kind}, not PostgreSQL", ErrorCode.TOOL_FAILED)
    return backend  # type: ignore[no-any-return]


async def _run_all(
    conn: SqlTransaction, statements: list[Statement], params: Mapping[str, object], where: str
) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for stmt in statements:
        try:
            columns, rows, count = await conn.execute_result(stmt, params)
        except SqlError as e:
            if e.code == ErrorCode.TIMEOUT:
                raise StepFailure(f"postgres {where}: {e}", ErrorCode.TIMEOUT) from None
            if e.code == ErrorCode.TOOL_FAILED and not results:
                raise StepFailure(f"postgres {where}: {e}", ErrorCode.TOOL_FAILED) from None
            results.append({"status": "error", "message": str(e)})
            continue
        if columns is None:
            results.append(
                {"status": "success", "row_count": count, "message": f"Command executed. {count} rows affected."}
            )
        else:
            results.append({"status": "success", "rows": rows, "row_count": len(rows), "columns": list(columns)})
    return results


def statements_result(results: Sequence[Mapping[str, object]]) -> dict[str, Any]:
    """NoETL's ``collapse_results_to_last_command`` (``noetl/tools/postgres/response.py``, 4.26.0): the last
    statement's result, with ``statement_count``, and ``status: error``, ``errors`` and ``message`` when one
    failed."""
    if not results:
        return {"status": "success", "message": "No SQL statements executed", "statement_count": 0}
    payload = dict(results[-1])
    errors = [
        {"statement_index": i, "message": str(r.get("message") or "unknown error")}
        for i, r in enumerate(results)
        if r.get("status") == "error"
    ]
    payload["statement_count"] = len(results)
    if errors:
        payload["status"] = "error"
        payload["errors"] = errors
        payload["message"] = "; ".join(f"statement_{e['statement_index']}: {e['message']}" for e in errors)
    return payload


KIND = Kind(
    "postgres", PostgresFields, run_postgres, templates=("command", "backend", "dsn", "params"), build=build_postgres
)
