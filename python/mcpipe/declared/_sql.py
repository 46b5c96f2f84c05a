"""The SQL step kinds: ``sql`` (one statement), ``sql_tx`` (a transaction), ``sql_await`` (trigger, then poll).

They run on the named backends of :mod:`mcpipe.backends.sql` (``[sql.NAME]`` in the config; the
:class:`~mcpipe.declared.StepPolicy` carries them). Statements are parsed at load; their ``:name``
parameters must all have a value in ``params``, a template resolved per call and bound by the driver.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
import trio

from mcpipe._describe import json_type
from mcpipe._template import Template
from mcpipe.backends.sql import RowMode, SqlBackend, SqlError, Statement
from mcpipe.compile import referenced_step
from mcpipe.declared._expr import CelExpr, ExpressionSyntaxError, evaluate
from mcpipe.declared._step import DeclaredStep, StepFailure, StepOutput
from mcpipe.tools._base import ToolContext

if TYPE_CHECKING:
    from mcpipe.declared._compile import StepScope, _Compiler

__all__ = ["SQL_KINDS", "compile_sql", "run_sql", "run_sql_await", "run_sql_tx"]

SQL_KINDS = ("sql", "sql_tx", "sql_await")

DEFAULT_AWAIT_MS = 30_000.0
DEFAULT_INTERVAL_MS = 500.0
_LAST_SEEN_CHARS = 500


@dataclass(frozen=True, slots=True)
class SqlCall:
    """A compiled statement: its text, its ``params`` template (None: no parameters), its row mode."""

    id: str
    stmt: Statement
    params: Template | None
    row_mode: RowMode = "rows"

    def bind(self, env: Mapping[str, Any]) -> dict[str, Any]:
        if self.params is None:
            return {}
        value = self.params.resolve(env)
        if not isinstance(value, Mapping):
            raise StepFailure(f"`params` must resolve to an object, got {json_type(value)}", "TOOL_FAILED")
        return dict(value)


@dataclass(frozen=True, slots=True)
class SqlPlan:
    backend: SqlBackend
    calls: tuple[SqlCall, ...]


@dataclass(frozen=True, slots=True)
class AwaitPlan:
    backend: SqlBackend
    trigger: SqlCall | None
    check: SqlCall
    until: CelExpr
    interval_s: float
    deadline_ms: float


def compile_sql(
    c: _Compiler, kind: str, raw: Mapping[str, Any], spec: Any, loc: str, scope: StepScope, refs: list[tuple[str, str]]
) -> Any:
    """The plan of a ``sql``, ``sql_tx`` or ``sql_await`` step (None on a problem, which ``c`` records)."""
    backend = _backend(c, raw.get("backend"), loc, scope)
    if kind == "sql":
        call = _call(c, "sql", raw.get("sql"), raw.get("params"), loc, f"{loc}.sql", scope, refs, spec)
        if backend is None or call is None or spec is None:
            return None
        return SqlPlan(backend, (call,))
    if kind == "sql_tx":
        return _tx(c, raw, spec, loc, scope, refs, backend)
    return _await(c, raw, spec, loc, scope, refs, backend)


def _backend(c: _Compiler, name: Any, loc: str, scope: StepScope) -> SqlBackend | None:
    if not isinstance(name, str):
        return None  # the Struct reports it
    backends = scope.policy.sql
    if name in backends:
        return backends[name]  # type: ignore[no-any-return]  # None: its entry has problems, reported there
    known = ", ".join(sorted(backends)) if backends else "none are configured: add [sql.NAME] with a url"
    hint = difflib.get_close_matches(name, sorted(backends), n=1)
    maybe = f" (did you mean `{hint[0]}`?)" if hint else ""
    c.problem(f"{loc}.backend", f"unknown sql backend '{name}'{maybe} (backends: {known})")
    return None


def _call(
    c: _Compiler,
    sid: str,
    sql: Any,
    params: Any,
    loc: str,
    sql_loc: str,
    scope: StepScope,
    refs: list[tuple[str, str]],
    spec: Any,
    row_mode: RowMode = "rows",
) -> SqlCall | None:
    if not isinstance(sql, str):
        return None  # the Struct reports it
    try:
        stmt = Statement.parse(sql)
    except ValueError as e:
        c.problem(sql_loc, str(e))
        return None
    params_loc = f"{loc}.params"
    if isinstance(params, list):
        # mcpg's form: the names of arguments, each bound to the argument of that name.
        if not all(isinstance(n, str) and n for n in params):
            c.problem(params_loc, "a list of params names arguments: it must hold non-empty strings")
            return None
        params = {n: {"$ref": f"args.{n}"} for n in params}
    elif params is not None and not isinstance(params, Mapping):
        c.problem(params_loc, f"`params` must be an object (name -> value) or a list of names, got {json_type(params)}")
        return None
    template = c.template(params, params_loc, scope, refs) if params is not None else None
    if params is not None and template is None:
        return None
    given = set(params or ())
    missing = [n for n in stmt.names if n not in given]
    if missing:
        names = ", ".join(f":{n}" for n in missing)
        verb = "have" if len(missing) > 1 else "has"
        c.problem(sql_loc, f"parameter{'s' if len(missing) > 1 else ''} {names} {verb} no value in `params`")
        return None
    mode = getattr(spec, "row_mode", row_mode) if spec is not None else row_mode
    return SqlCall(sid, stmt, template, mode)


def _tx(
    c: _Compiler,
    raw: Mapping[str, Any],
    spec: Any,
    loc: str,
    scope: StepScope,
    refs: list[tuple[str, str]],
    backend: SqlBackend | None,
) -> Any:
    from dataclasses import replace

    statements = raw.get("steps")
    if not isinstance(statements, list):
        return None  # the Struct reports it
    outer = scope.visible or frozenset()
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
            c.problem(f"{where}.id", f"duplicate id '{sid}' (also {loc}.steps[{ids.index(sid)}])")
            ok = False
        elif sid in outer:
            c.problem(f"{where}.id", f"id '{sid}' is also a step of the pipeline: a statement needs an id of its own")
            ok = False
        # A statement's params see the pipeline's earlier steps and the statements before it.
        inner = replace(scope, visible=None if scope.visible is None else outer | frozenset(ids))
        own: list[tuple[str, str]] = []
        nested = spec.steps[i] if spec is not None else None
        call = _call(c, sid, item.get("sql"), item.get("params"), where, f"{where}.sql", inner, own, nested)
        refs.extend((site, ref) for site, ref in own if referenced_step(ref) not in ids)
        ids.append(sid)
        if call is None:
            ok = False
        else:
            calls.append(call)
    if not ok or backend is None or spec is None:
        return None
    return SqlPlan(backend, tuple(calls))


def _await(
    c: _Compiler,
    raw: Mapping[str, Any],
    spec: Any,
    loc: str,
    scope: StepScope,
    refs: list[tuple[str, str]],
    backend: SqlBackend | None,
) -> Any:
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
                c.problem(f"{loc}.check", "sql_await needs a `check` statement (here or in the backend's await block)")
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
            c.problem(where, f"expected a statement or {{sql, params}}, got {json_type(value)}")
            ok = False
            continue
        call = _call(
            c, name, sql, params, where, f"{where}.sql" if isinstance(value, Mapping) else where, scope, refs, None
        )
        ok = ok and call is not None
        calls[name] = call
    until_src, until_loc = field("until")
    until = None
    if until_src is None:
        c.problem(f"{loc}.until", "sql_await needs `until`, a CEL condition over the check's `rows`")
    elif not isinstance(until_src, str):
        c.problem(until_loc, f"`until` must be a CEL expression, got {json_type(until_src)}")
    else:
        try:
            until = CelExpr.compile(until_src, extra_roots=frozenset({"rows"}))
        except ExpressionSyntaxError as e:
            c.problem(until_loc, f"invalid CEL: {e.reason}")
        else:
            for m in until.mentions:
                ref = m.normalized()
                refs.append((until_loc, ref))
                c.check_reference(until_loc, ref, scope)
    interval, _ = field("interval_ms")
    deadline = spec.timeout_ms if spec is not None and spec.timeout_ms is not None else defaults.get("timeout_ms")
    for name, value in (("interval_ms", interval), ("timeout_ms", deadline)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            c.problem(f"{block_loc}.{name}", f"expected a positive number of milliseconds, got {json_type(value)}")
            ok = False
    check = calls.get("check")
    if not ok or until is None or check is None or backend is None or spec is None:
        return None
    return AwaitPlan(
        backend,
        calls.get("trigger"),
        check,
        until,
        (interval or DEFAULT_INTERVAL_MS) / 1000,
        float(deadline or DEFAULT_AWAIT_MS),
    )


def _located(backend: SqlBackend, e: SqlError) -> StepFailure:
    return StepFailure(f"sql backend '{backend.name}': {e}", e.code)


async def run_sql(step: DeclaredStep, inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext) -> StepOutput:
    """Run the statement; the output is its rows, its row, or the affected row count (``row_mode``)."""
    plan: SqlPlan = step.plan
    call = plan.calls[0]
    try:
        return StepOutput.of(await plan.backend.execute(call.stmt, call.bind(env), call.row_mode))
    except SqlError as e:
        raise _located(plan.backend, e) from None


async def run_sql_tx(
    step: DeclaredStep, inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext
) -> StepOutput:
    """Run the statements in one transaction: committed when all succeed, rolled back at the first failure."""
    plan: SqlPlan = step.plan
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


async def run_sql_await(
    step: DeclaredStep, inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext
) -> StepOutput:
    """Run the trigger, then poll the check until ``until`` holds; past the deadline, fail with what the last
    check returned."""
    plan: AwaitPlan = step.plan
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
                    raise StepFailure(f"`until` must be a boolean, got {json_type(verdict)}", "TOOL_FAILED")
                if verdict:
                    return StepOutput.of({"rows": rows, "checks": checks})
                await trio.sleep(plan.interval_s)
        except SqlError as e:
            raise _located(backend, e) from None
    seen = "nothing (no check finished)" if checks == 0 else _brief(last)
    raise StepFailure(
        f"`{plan.until.source}` did not hold within {plan.deadline_ms:g} ms ({checks} check"
        f"{'' if checks == 1 else 's'}); the last check returned {seen}",
        "TIMEOUT",
        {"rows": last, "checks": checks},
    )


def _brief(value: Any) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= _LAST_SEEN_CHARS else text[:_LAST_SEEN_CHARS] + "..."
