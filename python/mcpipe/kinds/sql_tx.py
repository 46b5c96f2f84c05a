"""The ``sql_tx`` step kind: several statements in one transaction on a named backend, all or nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from mcpipe.backends.sql import SqlError
from mcpipe.kinds._base import Build, Kind, StepFields, StepId
from mcpipe.kinds.sql import BackendName, RowModeField, SqlCall, SqlPlan, SqlText, backend_of, call_of
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = ["KIND", "SqlStatementFields", "SqlTxFields", "run_sql_tx"]


class SqlStatementFields(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
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


async def run_sql_tx(
    step: Leaf[SqlTxFields, SqlPlan], inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext
) -> StepOutput:
    """Run the statements in one transaction: committed when all succeed, rolled back at the first failure."""
    plan = step.built
    outputs: dict[str, Any] = {}
    steps = dict(env.get("steps") or {})
    inner = {**env, "steps": steps}
    current = ""
    try:
        async with plan.backend.transaction() as tx:
            for call in plan.calls:
                current = call.id
                out = await tx.execute(call.stmt, call.bind(inner), call.row_mode)
                outputs[call.id] = out
                steps[call.id] = StepOutput.of(out).result(call.id, "sql", 0.0)
    except SqlError as e:
        where = f"statement '{current}'" if current else "the transaction"
        raise StepFailure(
            f"sql backend '{plan.backend.name}': {where} failed, the transaction was rolled back: {e}",
            e.code,
            {"rolled_back": True, "failed": current},
        ) from None
    return StepOutput.of({"steps": outputs})


KIND = Kind("sql_tx", SqlTxFields, run_sql_tx, build=build_sql_tx)
