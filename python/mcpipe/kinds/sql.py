"""The ``sql`` step kind: one statement on a named ``[sql.NAME]`` backend (:mod:`mcpipe.backends.sql`).

The statement is parsed at load; its ``:name`` parameters must all have a value in ``params``, a template
resolved per call and bound by the driver. ``sql_tx`` and ``sql_await`` share the helpers here.

:func:`run_statement` is the kind's run, public for a format whose SQL bindings shape rows their own way
(it answers the driver's :class:`~mcpipe.backends.sql.RawResult`; :func:`~mcpipe.backends.sql.shape` is
this kind's shaping); ``kinds/sql_tx``'s :func:`~mcpipe.kinds.sql_tx.run_transaction` is its counterpart for
several statements.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from mcpipe._describe import json_type
from mcpipe._template import Template
from mcpipe.backends.sql import RawResult, RowMode, SqlBackend, SqlError, Statement, shape
from mcpipe.errors import ErrorCode
from mcpipe.kinds._base import Build, Kind, StepFields
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = [
    "KIND",
    "SqlCall",
    "SqlFields",
    "SqlPlan",
    "backend_of",
    "call_of",
    "located",
    "run_sql",
    "run_statement",
]

RowModeField = Literal["rows", "one", "affected_rows"]
SqlText = Annotated[str, msgspec.Meta(min_length=1)]
BackendName = Annotated[str, msgspec.Meta(min_length=1)]


class SqlFields(StepFields, tag="sql"):
    """One SQL statement on a named ``[sql.NAME]`` backend. ``sql`` names its parameters ``:name``;
    ``params`` (a template: an object name -> value; or mcpg's list of argument names) binds them.
    ``row_mode``: ``rows`` (a list of row objects), ``one`` (one row object or null), ``affected_rows``."""

    backend: BackendName
    sql: SqlText
    params: Any = None
    row_mode: RowModeField = "rows"


@dataclass(frozen=True, slots=True)
class SqlCall:
    """A compiled statement: its text, its ``params`` template (None: no parameters), its row mode."""

    id: str
    stmt: Statement
    params: Template | None
    row_mode: RowMode = "rows"

    def bind(self, env: Mapping[str, object]) -> dict[str, Any]:
        if self.params is None:
            return {}
        value = self.params.resolve(env)
        if not isinstance(value, Mapping):
            raise StepFailure(f"`params` must resolve to an object, got {json_type(value)}", ErrorCode.TOOL_FAILED)
        return dict(value)


@dataclass(frozen=True, slots=True)
class SqlPlan:
    backend: SqlBackend
    calls: tuple[SqlCall, ...]


def backend_of(b: Build[Any], name: object) -> SqlBackend | None:
    """The named backend of the policy (None: not a string, reported by the fields; or unknown, reported)."""
    if not isinstance(name, str):
        return None
    backends = b.policy.sql
    if name in backends:
        return backends[name]  # type: ignore[no-any-return]  # None: its entry has problems, reported there
    known = ", ".join(sorted(backends)) if backends else "none are configured: add [sql.NAME] with a url"
    hint = difflib.get_close_matches(name, sorted(backends), n=1)
    maybe = f" (did you mean `{hint[0]}`?)" if hint else ""
    b.problem(f"{b.location}.backend", f"unknown sql backend '{name}'{maybe} (backends: {known})")
    return None


def call_of(
    b: Build[Any],
    sid: str,
    sql: object,
    params: object,
    loc: str,
    sql_loc: str,
    row_mode: RowMode = "rows",
    also_visible: frozenset[str] = frozenset(),
) -> SqlCall | None:
    """A statement and its ``params``, checked (None on a problem, reported)."""
    if not isinstance(sql, str):
        return None  # the fields report it
    try:
        stmt = Statement.parse(sql)
    except ValueError as e:
        b.problem(sql_loc, str(e))
        return None
    params_loc = f"{loc}.params"
    if isinstance(params, list):
        # mcpg's form: the names of arguments, each bound to the argument of that name.
        if not all(isinstance(n, str) and n for n in params):
            b.problem(params_loc, "a list of params names arguments: it must hold non-empty strings")
            return None
        params = {n: {"$ref": f"args.{n}"} for n in params}
    elif params is not None and not isinstance(params, Mapping):
        b.problem(params_loc, f"`params` must be an object (name -> value) or a list of names, got {json_type(params)}")
        return None
    template = b.template(params, params_loc, also_visible) if params is not None else None
    if params is not None and template is None:
        return None
    given = set(params or ())
    missing = [n for n in stmt.names if n not in given]
    if missing:
        names = ", ".join(f":{n}" for n in missing)
        verb = "have" if len(missing) > 1 else "has"
        b.problem(sql_loc, f"parameter{'s' if len(missing) > 1 else ''} {names} {verb} no value in `params`")
        return None
    return SqlCall(sid, stmt, template, row_mode)


def located(backend: SqlBackend, e: SqlError) -> StepFailure:
    return StepFailure(f"sql backend '{backend.name}': {e}", e.code)


def build_sql(b: Build[SqlFields]) -> SqlPlan:
    """The backend (from the policy's sql backends) and the parsed statement."""
    backend = backend_of(b, b.raw.get("backend"))
    mode: RowMode = b.fields.row_mode if b.fields is not None else "rows"
    call = call_of(b, "sql", b.raw.get("sql"), b.raw.get("params"), b.location, f"{b.location}.sql", mode)
    if backend is None or call is None or b.fields is None:
        b.fail()
    return SqlPlan(backend, (call,))


_SET_CONFIG = Statement.parse("SELECT set_config(:name, :value, true)")


async def run_statement(
    backend: SqlBackend,
    stmt: Statement,
    params: Mapping[str, object],
    *,
    settings: Sequence[tuple[str, str]] = (),
) -> RawResult:
    """Run one statement in autocommit; its result as the driver gave it (the values not made JSON-ready,
    the column types named), at most the backend's ``max_rows`` rows.

    ``settings`` are PostgreSQL run-time settings made for the statement alone (``set_config(name, value,
    true)``, in one transaction with it): what a row-level-security policy reads with ``current_setting``.

    Raises:
        SqlError: the database refused it (or a setting), it returned more than ``max_rows`` rows, it could
            not be reached, or it ran past the backend's ``statement_timeout_ms``.
    """
    if not settings:
        async with backend.connection() as conn:
            return await conn.execute_raw(stmt, params)
    async with backend.transaction() as tx:
        for name, value in settings:
            await tx.execute(_SET_CONFIG, {"name": name, "value": value}, "rows")
        return await tx.execute_raw(stmt, params)


async def run_sql(
    step: Leaf[SqlFields, SqlPlan], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Run the statement; the output is its rows, its row, or the affected row count (``row_mode``)."""
    plan = step.built
    call = plan.calls[0]
    try:
        result = await run_statement(plan.backend, call.stmt, call.bind(env))
        return StepOutput.of(shape(result, call.row_mode, plan.backend.config.max_rows))
    except SqlError as e:
        raise located(plan.backend, e) from None


KIND = Kind("sql", SqlFields, run_sql, build=build_sql)
