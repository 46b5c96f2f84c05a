"""The ``sql_await`` step kind: run ``trigger``, then poll ``check`` until the CEL ``until`` holds.

It applies ``timeout_ms`` itself (an own deadline), so that its ``TIMEOUT`` says what the last check saw.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import orjson
import trio

from mcpipe._describe import json_type
from mcpipe._struct import Strict
from mcpipe.backends.sql import SqlBackend, SqlError
from mcpipe.errors import ErrorCode
from mcpipe.expr import CelExpr
from mcpipe.kinds._base import Build, BuildFailed, Expression, Kind, StepFields
from mcpipe.kinds.sql import BackendName, SqlCall, SqlText, backend_of, call_of, located
from mcpipe.plan import Leaf, evaluate
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = ["KIND", "AwaitPlan", "SqlAwaitFields", "SqlQueryFields", "run_sql_await"]

DEFAULT_AWAIT_MS = 30_000.0
DEFAULT_INTERVAL_MS = 500.0
_LAST_SEEN_CHARS = 500


class SqlQueryFields(Strict):
    """A statement and its ``params`` (``sql_await``'s ``trigger`` and ``check``)."""

    sql: SqlText
    params: Any = None


class SqlAwaitFields(StepFields, tag="sql_await"):
    """Run ``trigger`` (optional), then poll ``check`` every ``interval_ms`` until the CEL ``until`` (which
    sees the check's ``rows``) holds, or ``timeout_ms`` (default 30 s) passes. Fields left out come from
    the backend's ``await`` block (mcpg's backend-level await). A string is a statement without params."""

    backend: BackendName
    trigger: SqlText | SqlQueryFields | None = None
    check: SqlText | SqlQueryFields | None = None
    until: Expression | None = None
    interval_ms: Annotated[float, msgspec.Meta(gt=0)] | None = None


@dataclass(frozen=True, slots=True)
class AwaitPlan:
    backend: SqlBackend
    trigger: SqlCall | None
    check: SqlCall
    until: CelExpr
    interval_s: float
    deadline_ms: float


def build_sql_await(b: Build[SqlAwaitFields]) -> AwaitPlan:
    """The statements and ``until`` (CEL with the extra root ``rows``), the step's or its backend's."""
    raw, loc, spec = b.raw, b.location, b.fields
    backend = backend_of(b, raw.get("backend"))
    defaults: Mapping[str, Any] = (backend.config.await_ or {}) if backend is not None else {}
    block_loc = f"sql.{backend.name}.await" if backend is not None else ""

    def field(name: str) -> tuple[Any, str]:
        if name in raw:
            return raw[name], f"{loc}.{name}"
        return defaults.get(name), f"{block_loc}.{name}"

    calls: dict[str, SqlCall | None] = {}
    ok = True
    for name in ("trigger", "check"):
        value, where = field(name)
        if value is None:
            calls[name] = None
            if name == "check":
                b.problem(f"{loc}.check", "sql_await needs a `check` statement (here or in the backend's await block)")
                ok = False
            continue
        sql, params = (
            (value, None)
            if isinstance(value, str)
            else (value.get("sql"), value.get("params"))
            if isinstance(value, Mapping)
            else (None, None)
        )
        if not isinstance(sql, str):
            b.problem(where, f"expected a statement or {{sql, params}}, got {json_type(value)}")
            ok = False
            continue
        call = call_of(b, name, sql, params, where, f"{where}.sql" if isinstance(value, Mapping) else where)
        ok = ok and call is not None
        calls[name] = call
    until_src, until_loc = field("until")
    until = None
    if until_src is None:
        b.problem(f"{loc}.until", "sql_await needs `until`, a CEL condition over the check's `rows`")
    elif not isinstance(until_src, str):
        b.problem(until_loc, f"`until` must be a CEL expression, got {json_type(until_src)}")
    else:
        try:
            until = b.cel(until_src, until_loc, extra_roots=frozenset({"rows"}))
        except BuildFailed:
            until = None
    interval, _ = field("interval_ms")
    deadline = spec.timeout_ms if spec is not None and spec.timeout_ms is not None else defaults.get("timeout_ms")
    for name, value in (("interval_ms", interval), ("timeout_ms", deadline)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            b.problem(f"{block_loc}.{name}", f"expected a positive number of milliseconds, got {json_type(value)}")
            ok = False
    check = calls.get("check")
    if not ok or until is None or check is None or backend is None or spec is None:
        b.fail()
    return AwaitPlan(
        backend,
        calls.get("trigger"),
        check,
        until,
        (interval or DEFAULT_INTERVAL_MS) / 1000,
        float(deadline or DEFAULT_AWAIT_MS),
    )


async def run_sql_await(
    step: Leaf[SqlAwaitFields, AwaitPlan], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Run the trigger, then poll the check until ``until`` holds; past the deadline, fail with what the last
    check returned."""
    plan = step.built
    backend = plan.backend
    last: Any = None
    checks = 0
    with trio.move_on_after(plan.deadline_ms / 1000):
        try:
            if plan.trigger is not None:
                await backend.execute(plan.trigger.stmt, plan.trigger.bind(env), "affected_rows")
            params = plan.check.bind(env)
            while True:
                rows = await backend.execute(plan.check.stmt, params, "rows")
                last, checks = rows, checks + 1
                verdict = await evaluate(plan.until, {**env, "rows": rows})
                if not isinstance(verdict, bool):
                    raise StepFailure(f"`until` must be a boolean, got {json_type(verdict)}", ErrorCode.TOOL_FAILED)
                if verdict:
                    return StepOutput.of({"rows": rows, "checks": checks})
                await trio.sleep(plan.interval_s)
        except SqlError as e:
            raise located(backend, e) from None
    seen = "nothing (no check finished)" if checks == 0 else _brief(last)
    raise StepFailure(
        f"`{plan.until.source}` did not hold within {plan.deadline_ms:g} ms ({checks} check"
        f"{'' if checks == 1 else 's'}); the last check returned {seen}",
        ErrorCode.TIMEOUT,
        {"rows": last, "checks": checks},
    )


def _brief(value: object) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= _LAST_SEEN_CHARS else text[:_LAST_SEEN_CHARS] + "..."


KIND = Kind("sql_await", SqlAwaitFields, run_sql_await, build=build_sql_await, own_deadline=True)
