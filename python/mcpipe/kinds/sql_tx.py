"""The ``sql_tx`` step kind: several statements in one transaction on a named backend, all or nothing.

:func:`run_transaction` is the kind's run, public for a format whose transaction steps bind and shape each
statement their own way (each :class:`TxStatement` says how) and word a failure their own way
(:class:`TransactionFailed` says which statement failed and why).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from mcpipe._struct import Strict
from mcpipe.backends.sql import RawResult, SqlBackend, SqlError, SqlTransaction, Statement, shape
from mcpipe.kinds._base import Build, Kind, StepFields, StepId
from mcpipe.kinds.sql import BackendName, RowModeField, SqlCall, SqlPlan, SqlText, backend_of, call_of
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = [
    "KIND",
    "SqlStatementFields",
    "SqlTxFields",
    "TransactionFailed",
    "TxStatement",
    "run_sql_tx",
    "run_transaction",
]


class SqlStatementFields(Strict, kw_only=True):
    """One statement of a ``sql_tx`` step (``id``, ``sql``, ``params``, ``row_mode`` as in ``sql``)."""

    id: StepId | None = None
    sql: SqlText
    params: Any = None
    row_mode: RowModeField = "rows"


class SqlTxFields(StepFields, tag="sql_tx"):
    """Several statements in one transaction on a named backend: all or nothing. The output is
    ``{steps: {<statement id>: <its output>}}``; a statement's ``params`` may read earlier statements'
    outputs as ``steps.<statement id>.output``."""

    backend: BackendName
    steps: Annotated[list[SqlStatementFields], msgspec.Meta(min_length=1)]


def build_sql_tx(b: Build[SqlTxFields]) -> SqlPlan:
    """The backend and the statements; each statement's ``params`` sees the statements before it."""
    loc = b.location
    backend = backend_of(b, b.raw.get("backend"))
    statements = b.raw.get("steps")
    if not isinstance(statements, list):
        b.fail()  # the fields report it
    outer = b.visible
    ids: list[str] = []
    calls: list[SqlCall] = []
    ok = True
    for i, item in enumerate(statements):
        where = f"{loc}.steps[{i}]"
        if not isinstance(item, Mapping):
            ok = False
            continue
        given = item.get("id")
        sid = given if isinstance(given, str) and given else f"statement{i + 1}"
        if sid in ids:
            b.problem(f"{where}.id", f"duplicate id '{sid}' (also {loc}.steps[{ids.index(sid)}])")
            ok = False
        elif outer is not None and sid in outer:
            b.problem(f"{where}.id", f"id '{sid}' is also a step of the pipeline: a statement needs an id of its own")
            ok = False
        nested = b.fields.steps[i] if b.fields is not None else None
        mode = nested.row_mode if nested is not None else "rows"
        call = call_of(b, sid, item.get("sql"), item.get("params"), where, f"{where}.sql", mode, frozenset(ids))
        ids.append(sid)
        if call is None:
            ok = False
        else:
            calls.append(call)
    if not ok or backend is None or b.fields is None:
        b.fail()
    return SqlPlan(backend, tuple(calls))


@dataclass(frozen=True, slots=True)
class TxStatement:
    """One statement of a transaction (:func:`run_transaction`).

    Attributes:
        id: its name among the transaction's statements (its output's key).
        stmt: the statement.
        bind: its parameters, from the outputs of the statements before it (by id).
        shape: its output, from the driver's result.
    """

    id: str
    stmt: Statement
    bind: Callable[[Mapping[str, Any]], Mapping[str, Any]]
    shape: Callable[[RawResult], Any]


class TransactionFailed(SqlError):
    """A transaction was rolled back: a statement failed, or the transaction could not begin or commit.

    Attributes:
        statement: the id of the statement that failed (None: the transaction itself failed).
        error: the database's (or the backend's) error.
    """

    def __init__(self, statement: str | None, error: SqlError) -> None:
        super().__init__(str(error), error.code, database=error.database)
        self.statement = statement
        self.error = error


async def run_transaction(backend: SqlBackend, statements: Iterable[TxStatement]) -> dict[str, Any]:
    """Run ``statements`` in order in one transaction: committed when all succeed, rolled back at the first
    failure. Answers each statement's output (its ``shape``), by id.

    Raises:
        TransactionFailed: a statement (or its ``shape``) raised a :class:`SqlError`, or the transaction
            could not begin or commit.
        Exception: what a statement's ``bind`` or ``shape`` raised otherwise (the transaction rolled back).
    """
    outputs: dict[str, Any] = {}
    try:
        async with backend.transaction() as tx:
            for st in statements:
                outputs[st.id] = await _statement(tx, st, outputs)
    except SqlError as e:
        raise e if isinstance(e, TransactionFailed) else TransactionFailed(None, e) from None
    return outputs


async def _statement(tx: SqlTransaction, st: TxStatement, outputs: Mapping[str, object]) -> Any:
    params = st.bind(outputs)
    try:
        return st.shape(await tx.execute_raw(st.stmt, params))
    except SqlError as e:
        raise TransactionFailed(st.id, e) from None


async def run_sql_tx(
    step: Leaf[SqlTxFields, SqlPlan], inputs: Mapping[str, object], env: Mapping[str, Any], ctx: ToolContext
) -> StepOutput:
    """Run the statements in one transaction: committed when all succeed, rolled back at the first failure."""
    plan = step.built
    max_rows = plan.backend.config.max_rows
    before = env.get("steps") or {}

    def bind(call: SqlCall) -> Callable[[Mapping[str, Any]], Mapping[str, Any]]:
        def params(outputs: Mapping[str, Any]) -> Mapping[str, Any]:
            done = {sid: StepOutput.of(out).result(sid, "sql", 0.0) for sid, out in outputs.items()}
            return call.bind({**env, "steps": {**before, **done}})

        return params

    def shaped(call: SqlCall) -> Callable[[RawResult], Any]:
        return lambda result: shape(result, call.row_mode, max_rows)

    statements = [TxStatement(call.id, call.stmt, bind(call), shaped(call)) for call in plan.calls]
    try:
        outputs = await run_transaction(plan.backend, statements)
    except TransactionFailed as e:
        where = f"statement '{e.statement}'" if e.statement is not None else "the transaction"
        raise StepFailure(
            f"sql backend '{plan.backend.name}': {where} failed, the transaction was rolled back: {e.error}",
            e.code,
            {"rolled_back": True, "failed": e.statement or ""},
        ) from None
    return StepOutput.of({"steps": outputs})


KIND = Kind("sql_tx", SqlTxFields, run_sql_tx, build=build_sql_tx)
