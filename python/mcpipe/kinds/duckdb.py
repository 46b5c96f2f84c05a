"""The ``duckdb`` step kind: SQL statements on a DuckDB database (the ``duckdb`` package), off the event loop.

``commands`` is SQL text (several statements, split as NoETL's duckdb tool splits them) or a list of
statements, resolved per call; ``params`` (an object) binds their ``$name`` parameters, never put into the
text; ``database`` a file (or ``:memory:``, the default: a database of the step's own). The statements run in
a worker thread, at most the policy's ``workers`` at once, under DuckDB's ``memory_limit`` and ``threads``;
past the deadline the statement is interrupted (``interrupt()``). DuckDB downloads no extension unless the
operator allows it (``outbound.duckdb.autoinstall_extensions``), and reaches nothing outside its database
(files, URLs, extensions: ``enable_external_access = false``, its configuration locked) unless the operator
allows that (``outbound.duckdb.external_access``, or ``allowed_directories`` for files).

The output is the last statement's rows (objects), or, with ``output: noetl``, NoETL's summary of the run
(``executed_commands``, ``command_N_rows`` and ``command_N_sample`` per statement that returned rows,
``task_id``, ``secrets_created``, ``database_path``).
"""

from __future__ import annotations

import importlib.util
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import trio

from mcpipe._describe import json_type
from mcpipe.backends import run_interruptible
from mcpipe.backends.sql import json_value
from mcpipe.errors import ErrorCode
from mcpipe.kinds._base import Build, Kind, StepFields
from mcpipe.kinds._policy import DuckdbPolicy
from mcpipe.kinds._sqltext import split_duckdb
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = ["KIND", "DuckdbFields", "DuckdbPlan", "run_duckdb"]

MEMORY = ":memory:"


class DuckdbFields(StepFields, tag="duckdb"):
    """Run SQL statements on a DuckDB database.

    ``commands`` (a template): SQL text, split into statements at ``;`` (outside quotes; lines starting
    with ``--`` or ``#`` dropped), or a list of statements. ``database`` (a template): a file path (relative
    to the config's directory) or ``:memory:`` (default). ``output``: ``rows`` (the last statement's rows as
    objects) or ``noetl`` (NoETL's summary). ``secrets`` (a template): DuckDB secrets created before the
    statements, ``[{name, type: postgres | gcs | s3, params: {KEY: value}}]`` (the extension each needs is
    loaded first: ``postgres``, ``httpfs``), so the SQL can ``ATTACH ... (TYPE postgres, SECRET name)`` or
    read a bucket; their values are quoted, never spliced. ``params`` (a template: an object) binds the
    statements' ``$name`` parameters.
    """

    commands: Any
    database: Any = None
    output: Literal["rows", "noetl"] = "rows"
    secrets: Any = None
    params: Any = None


@dataclass(frozen=True, slots=True)
class DuckdbPlan:
    timeout_s: float
    policy: DuckdbPolicy
    base_dir: str
    allowed: tuple[str, ...] = ()
    """The policy's ``allowed_directories``, absolute (relative ones are the config's directory's)."""


def build_duckdb(b: Build[DuckdbFields]) -> DuckdbPlan:
    """The deadline and limits; the ``duckdb`` package must be installed."""
    if importlib.util.find_spec("duckdb") is None:
        b.problem(f"{b.location}.kind", "duckdb steps need the duckdb package: pip install 'mcpipe[duckdb]'")
    if b.fields is None:
        b.fail()
    policy = b.policy.duckdb
    ms = b.fields.timeout_ms if b.fields.timeout_ms is not None else policy.timeout_ms
    allowed = tuple(
        str(Path(d if Path(d).is_absolute() else Path(b.policy.base_dir, d)).resolve()) + "/"
        for d in policy.allowed_directories
    )
    return DuckdbPlan(ms / 1000, policy, b.policy.base_dir, allowed)


def _statements(value: object) -> list[str]:
    if isinstance(value, str):
        return split_duckdb(value)
    if isinstance(value, Sequence) and all(isinstance(s, str) for s in value):
        return [s for s in value if s.strip()]
    raise StepFailure(
        f"`commands` must resolve to SQL text or a list of statements, got {json_type(value)}", ErrorCode.TOOL_FAILED
    )


def _database(value: object, base_dir: str) -> str:
    if value is None or value == MEMORY:
        return MEMORY
    if not isinstance(value, str) or not value.strip():
        raise StepFailure(
            f"`database` must resolve to a file path or {MEMORY}, got {json_type(value)}", ErrorCode.TOOL_FAILED
        )
    path = Path(value)
    return str(path if path.is_absolute() else Path(base_dir, path))


_limiters: trio.lowlevel.RunVar[dict[int, trio.CapacityLimiter]] = trio.lowlevel.RunVar("mcpipe_duckdb_workers")


def _limiter(workers: int) -> trio.CapacityLimiter:
    try:
        by_size = _limiters.get()
    except LookupError:
        by_size = {}
        _limiters.set(by_size)
    limiter = by_size.get(workers)
    if limiter is None:
        limiter = by_size[workers] = trio.CapacityLimiter(workers)
    return limiter


class _Failed(Exception):
    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class _Run:
    """One step's statements on one connection, in a worker thread (``interrupt`` from another)."""

    def __init__(
        self,
        database: str,
        statements: list[str],
        policy: DuckdbPolicy,
        secrets: list[str] | None = None,
        params: Mapping[str, object] | None = None,
        allowed: tuple[str, ...] = (),
    ) -> None:
        self.database = database
        self.statements = statements
        self.policy = policy
        self.secrets = secrets or []
        self.params = dict(params or {})
        self.allowed = allowed
        self.conn: Any = None
        self.interrupted = False

    def interrupt(self) -> None:
        self.interrupted = True
        conn = self.conn
        if conn is not None:
            conn.interrupt()

    def __call__(self) -> tuple[list[tuple[str, ...] | None], list[list[Sequence[Any]] | None]]:
        import duckdb

        config: dict[str, str | bool | int | float | list[str]] = {
            "memory_limit": f"{self.policy.memory_mb}MB",
            "threads": self.policy.threads,
            "autoinstall_known_extensions": self.policy.autoinstall_extensions,
        }
        if self.database != MEMORY:
            Path(self.database).parent.mkdir(parents=True, exist_ok=True)
        try:
            self.conn = duckdb.connect(self.database, config=config)
        except duckdb.Error as e:
            raise _Failed(f"cannot open DuckDB database {self.database}: {e}", ErrorCode.TOOL_FAILED) from None
        columns: list[tuple[str, ...] | None] = []
        rows: list[list[Sequence[Any]] | None] = []
        try:
            for stmt in self.secrets:  # their text holds credentials: an error names the secret, not the text
                try:
                    self.conn.execute(stmt)
                except duckdb.Error as e:
                    label = stmt.split(" (", 1)[0]
                    raise _Failed(f"{label}: {_first_line(e)}", ErrorCode.TOOL_ERROR) from None
            if not self.policy.external_access:
                # From here on nothing outside the database (issue 27: a caller's SQL read /etc/passwd and COPYed
                # host files), and no SET can undo it or raise the limits.
                if self.allowed:
                    self.conn.execute("SET allowed_directories = $d", {"d": list(self.allowed)})
                self.conn.execute("SET enable_external_access = false")
                self.conn.execute("SET lock_configuration = true")
            for i, stmt in enumerate(self.statements):
                if self.interrupted:
                    raise _Failed("interrupted", ErrorCode.TIMEOUT)
                try:
                    named = {n: self.params[n] for n in _PARAM.findall(stmt) if n in self.params}
                    result = self.conn.execute(stmt, named) if named else self.conn.execute(stmt)
                    if result.description is None:
                        columns.append(None)
                        rows.append(None)
                        continue
                    got = result.fetchmany(self.policy.max_rows + 1)
                except duckdb.InterruptException:
                    raise _Failed("interrupted", ErrorCode.TIMEOUT) from None
                except duckdb.Error as e:
                    raise _Failed(f"statement {i + 1} failed: {_first_line(e)}", ErrorCode.TOOL_ERROR) from None
                if len(got) > self.policy.max_rows:
                    raise _Failed(
                        f"statement {i + 1} returned more than {self.policy.max_rows} rows (the policy's max_rows)",
                        ErrorCode.TOOL_ERROR,
                    )
                columns.append(tuple(str(d[0]) for d in result.description))
                rows.append(got)
            if self.database != MEMORY:
                self.conn.execute("CHECKPOINT")
        finally:
            self.conn.close()
        return columns, rows


_PARAM = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
"""A statement's ``$name`` parameters (DuckDB refuses values for names a statement does not have)."""


def _first_line(e: BaseException) -> str:
    return str(e).strip().split("\n", 1)[0] or type(e).__name__


async def run_duckdb(
    step: Leaf[DuckdbFields, DuckdbPlan], inputs: dict[str, Any], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Run the statements; the output is the last statement's rows (``output: noetl``: NoETL's summary)."""
    plan = step.built
    statements = _statements(inputs["commands"])
    database = _database(inputs.get("database"), plan.base_dir)
    secrets = secret_statements(inputs.get("secrets"), plan.policy.autoinstall_extensions)
    params = inputs.get("params")
    if params is not None and not isinstance(params, Mapping):
        raise StepFailure(f"`params` must resolve to an object, got {json_type(params)}", ErrorCode.TOOL_FAILED)
    work = _Run(database, statements, plan.policy, secrets, params, plan.allowed)
    with trio.move_on_after(plan.timeout_s) as deadline:
        try:
            columns, rows = await run_interruptible(work, work.interrupt, limiter=_limiter(plan.policy.workers))
        except _Failed as e:
            if e.code != ErrorCode.TIMEOUT:
                raise StepFailure(f"duckdb {_name(database)}: {e}", e.code) from None
            deadline.cancel()
    if deadline.cancelled_caught or work.interrupted:
        raise StepFailure(
            f"duckdb {_name(database)}: the statements ran past the deadline of {plan.timeout_s * 1000:g} ms "
            "(interrupted)",
            ErrorCode.TIMEOUT,
        )
    if step.fields.output == "noetl":
        return StepOutput.of(_summary(statements, rows, database, len(inputs.get("secrets") or [])))
    for cols, got in zip(reversed(columns), reversed(rows), strict=True):
        if cols is not None and got is not None:
            return StepOutput.of([{c: json_value(v) for c, v in zip(cols, row, strict=False)} for row in got])
    return StepOutput.of([])


def _name(database: str) -> str:
    return "(in memory)" if database == MEMORY else f"'{database}'"


_SECRET_TYPES = {"postgres": "postgres", "gcs": "httpfs", "s3": "httpfs"}
"""The DuckDB secret types a step may create, and the extension each needs."""
_SECRET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def secret_statements(value: object, install: bool) -> list[str]:
    """The statements creating ``secrets`` (``[{name, type, params}]``): each type's extension loaded (installed
    first when the policy lets DuckDB install), then ``CREATE OR REPLACE SECRET name (TYPE t, KEY 'value', ...)``
    with every value a quoted literal (a number: its digits)."""
    if value is None:
        return []
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise StepFailure(f"`secrets` must resolve to a list, got {json_type(value)}", ErrorCode.TOOL_FAILED)
    loads: list[str] = []
    out: list[str] = []
    for i, secret in enumerate(value):
        where = f"secrets[{i}]"
        if not isinstance(secret, Mapping):
            raise StepFailure(f"{where}: must be an object (name, type, params)", ErrorCode.TOOL_FAILED)
        name, kind, params = secret.get("name"), secret.get("type"), secret.get("params") or {}
        if not isinstance(name, str) or not _SECRET_NAME.match(name):
            raise StepFailure(f"{where}.name: must be a name (letters, digits, `_`)", ErrorCode.TOOL_FAILED)
        if kind not in _SECRET_TYPES:
            raise StepFailure(f"{where}.type: must be one of {', '.join(_SECRET_TYPES)}", ErrorCode.TOOL_FAILED)
        if not isinstance(params, Mapping):
            raise StepFailure(f"{where}.params: must be an object", ErrorCode.TOOL_FAILED)
        ext = _SECRET_TYPES[kind]
        if f"LOAD {ext}" not in loads:
            loads += [f"INSTALL {ext}", f"LOAD {ext}"] if install else [f"LOAD {ext}"]
        parts = [f"TYPE {kind}"]
        for key, v in params.items():
            if not isinstance(key, str) or not _SECRET_NAME.match(key):
                raise StepFailure(f"{where}.params: `{key}` is not a parameter name", ErrorCode.TOOL_FAILED)
            if v is None:
                continue
            literal = (
                str(v) if isinstance(v, int) and not isinstance(v, bool) else "'" + str(v).replace("'", "''") + "'"
            )
            parts.append(f"{key.upper()} {literal}")
        out.append(f"CREATE OR REPLACE SECRET {name} ({', '.join(parts)})")
    return [*loads, *out]


def _summary(
    statements: list[str], rows: list[list[Sequence[Any]] | None], database: str, secrets: int = 0
) -> dict[str, Any]:
    """NoETL's duckdb result (``noetl/tools/duckdb/sql/execution.py``, 4.26.0)."""
    out: dict[str, Any] = {"executed_commands": len(statements), "task_id": str(uuid.uuid4())}
    for i, got in enumerate(rows):
        if got:
            out[f"command_{i + 1}_rows"] = len(got)
            out[f"command_{i + 1}_sample"] = [[json_value(v) for v in row] for row in got[:5]]
    out["secrets_created"] = secrets
    out["database_path"] = database
    return out


KIND = Kind(
    "duckdb",
    DuckdbFields,
    run_duckdb,
    templates=("commands", "database", "secrets", "params"),
    build=build_duckdb,
    own_deadline=True,
)
