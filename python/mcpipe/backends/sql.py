"""Named SQL backends: SQLite (embedded, the default) and PostgreSQL, run under Trio without blocking it.

A config names its databases (``[sql.orders] url = "postgresql://..."``); ``sql``, ``sql_tx`` and
``sql_await`` steps refer to them by name. Each backend keeps a pool of at most ``pool_size`` connections,
opened lazily. Every driver call (``sqlite3``, ``psycopg`` 3) runs in a worker thread; a statement past
``statement_timeout_ms``, or whose caller is cancelled, is interrupted (``sqlite3``'s ``interrupt()``,
PostgreSQL's cancel request, plus the server-side ``statement_timeout``), and its connection goes back to
the pool only once its thread is done with it.

Statements use named parameters, ``:name``, bound by the driver (never spliced into the SQL text)::

    backend = SqlBackend("orders", SqlBackendConfig(url="sqlite:///orders.db"))
    stmt = Statement.parse("SELECT * FROM orders WHERE id = :id")
    rows = await backend.execute(stmt, {"id": 7}, "rows")
    async with backend.transaction() as tx:          # all or nothing
        await tx.execute(stmt2, {...}, "affected_rows")
    await backend.aclose()
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import math
import re
import sqlite3
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import unquote, urlsplit

import msgspec
import orjson
import trio

from mcpipe._struct import Strict
from mcpipe.backends._errors import BackendError
from mcpipe.backends._threads import run_interruptible

__all__ = [
    "ROW_MODES",
    "RawResult",
    "RowMode",
    "SqlBackend",
    "SqlBackendConfig",
    "SqlError",
    "SqlTimeout",
    "SqlTransaction",
    "Statement",
]

T = TypeVar("T")

RowMode = Literal["rows", "one", "affected_rows"]
ROW_MODES = ("rows", "one", "affected_rows")


class SqlBackendConfig(Strict):
    """One ``[sql.NAME]`` entry.

    Attributes:
        url: ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``, ``sqlite://`` (in memory), or
            ``postgresql://user:password@host:port/db`` (also ``postgres://``).
        pool_size: at most this many connections, hence statements at once (an in-memory SQLite: one).
        statement_timeout_ms: one statement's deadline; past it the statement is interrupted.
        connect_timeout_ms: opening one connection.
        max_rows: a statement that returns more rows fails instead of filling memory.
        await_: mcpg's backend-level ``await`` block (``trigger``, ``check``, ``until``, ...), the defaults
            of the ``sql_await`` steps that name this backend.
    """

    url: Annotated[str, msgspec.Meta(min_length=1)]
    pool_size: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 4
    statement_timeout_ms: Annotated[float, msgspec.Meta(gt=0)] = 30_000
    connect_timeout_ms: Annotated[float, msgspec.Meta(gt=0)] = 10_000
    max_rows: Annotated[int, msgspec.Meta(ge=1)] = 10_000
    await_: dict[str, Any] | None = msgspec.field(default=None, name="await")


class SqlError(BackendError):
    """A statement failed (the database's message), or the backend could not be reached.

    Attributes:
        code: ``TOOL_ERROR`` when the database answered with an error, ``TOOL_FAILED`` when it could not
            be reached, ``TIMEOUT`` for a statement past its deadline.
        database: the database's own error, as its client library reports it (PostgreSQL: the primary
            message; SQLite: ``(code: <extended result code>) <message>``), or None when the database did
            not answer with an error.
    """

    code = "TOOL_ERROR"
    database: str | None = None

    def __init__(self, message: str, code: str | None = None, *, database: str | None = None) -> None:
        super().__init__(message, code)
        self.database = database


class SqlTimeout(SqlError):
    code = "TIMEOUT"


# --- statements -------------------------------------------------------------------------------------------

# What a named parameter can hide in: quoted strings and identifiers, comments, PostgreSQL's dollar quotes.
_SKIP = re.compile(
    r"""'(?:[^']|'')*'?          # a string literal ('' escapes a quote)
      | "(?:[^"]|"")*"?          # a quoted identifier
      | --[^\n]*                 # a line comment
      | /\*.*?(?:\*/|\Z)         # a block comment
      | (\$[A-Za-z_]*\$).*?(?:\1|\Z)  # a dollar-quoted string
      | ::                       # a PostgreSQL cast, not a parameter
      | :([A-Za-z_][A-Za-z0-9_]*)     # a named parameter
      | %                        # escaped for psycopg's placeholders
    """,
    re.VERBOSE | re.DOTALL,
)


@dataclass(frozen=True, slots=True)
class Statement:
    """One SQL statement with named parameters (``:name``), parsed once.

    Attributes:
        source: the statement as written.
        names: its parameters, in order of first appearance.
        sqlite: the text for ``sqlite3`` (which takes ``:name`` itself).
        postgres: the text for ``psycopg`` (``%(name)s``, literal ``%`` doubled when there are parameters).
    """

    source: str
    names: tuple[str, ...]
    sqlite: str
    postgres: str

    @classmethod
    def parse(cls, source: str) -> Statement:
        """Find the named parameters of ``source``.

        Raises:
            ValueError: the statement is empty.
        """
        if not isinstance(source, str) or not source.strip():
            raise ValueError("a SQL statement must be a non-empty string")
        names: list[str] = []
        out: list[str] = []
        last = 0
        for m in _SKIP.finditer(source):
            name = m.group(2)
            out.append(source[last : m.start()])
            if name is not None:
                if name not in names:
                    names.append(name)
                out.append(f"%({name})s")
            else:
                # psycopg reads `%` everywhere, string literals and comments included.
                out.append(m.group(0).replace("%", "%%"))
            last = m.end()
        out.append(source[last:])
        postgres = "".join(out) if names else source
        return cls(source, tuple(names), source, postgres)


# --- values -----------------------------------------------------------------------------------------------


def json_value(value: object) -> Any:
    """A database value as JSON-ready data: decimals as numbers, times as ISO 8601 text, bytes as base64."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            return str(value)
        return int(value) if value == value.to_integral_value() and abs(value) < 2**63 else float(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    return str(value)


@dataclass(frozen=True, slots=True)
class RawResult:
    """A statement's result as the driver gave it (``SqlTransaction.execute_raw``).

    Attributes:
        columns: the column names (empty when the statement returns no rows).
        rows: the rows, each a sequence of the driver's values (``decimal.Decimal``, ``datetime``, ...).
        rowcount: rows changed (for a statement that returns none), as the driver counts them.
        returns_rows: whether the statement returns rows at all.
        types: per column, the database's name of its type (PostgreSQL: ``numeric``, ``int4``, ...; empty for
            SQLite, whose values carry their own type).
    """

    columns: tuple[str, ...]
    rows: list[Sequence[Any]]
    rowcount: int
    returns_rows: bool
    types: tuple[str, ...] = ()


_Result = RawResult


def shape(result: _Result, row_mode: RowMode, max_rows: int) -> Any:
    """The step output for ``row_mode``: a list of row objects, one row object (or null), or a count."""
    if len(result.rows) > max_rows:
        raise SqlError(f"the statement returned more than {max_rows} rows (the backend's max_rows)")
    if row_mode == "affected_rows":
        return result.rowcount if result.rowcount >= 0 else len(result.rows)
    rows = [{c: json_value(v) for c, v in zip(result.columns, row, strict=False)} for row in result.rows]
    if row_mode == "one":
        if len(rows) > 1:
            raise SqlError(f"row_mode `one` expects at most one row, the statement returned {len(rows)}")
        return rows[0] if rows else None
    return rows


# --- drivers ----------------------------------------------------------------------------------------------


class _Driver:
    """What differs between SQLite and PostgreSQL: connecting, running a statement, stopping one."""

    name = ""
    max_pool: int | None = None
    begin = "BEGIN"

    def connect(self) -> Any:
        raise NotImplementedError

    def run(self, raw: object, stmt: Statement, params: Mapping[str, object], max_rows: int) -> _Result:
        raise NotImplementedError

    def interrupt(self, raw: object) -> None:
        raise NotImplementedError

    def close(self, raw: Any) -> None:
        raw.close()

    def error(self, e: BaseException) -> SqlError | None:
        """The driver's exception as a :class:`SqlError`, or None when it is not the driver's."""
        raise NotImplementedError


class _Sqlite(_Driver):
    name = "sqlite"
    # Take the write lock at BEGIN: two deferred transactions that both read, then both write, would
    # deadlock (one fails at once with "database is locked"); immediate ones wait for each other.
    begin = "BEGIN IMMEDIATE"

    def __init__(self, path: str, busy_timeout_s: float) -> None:
        self.path = path
        self.busy_timeout_s = busy_timeout_s
        self.max_pool = 1 if path == ":memory:" else None

    def connect(self) -> Any:
        # Autocommit: a transaction is an explicit BEGIN ... COMMIT (see SqlBackend.transaction). A
        # connection moves between worker threads, never used by two at once (the pool sees to that).
        raw = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False)
        return raw

    def run(self, raw: Any, stmt: Statement, params: Mapping[str, object], max_rows: int) -> _Result:
        cur = raw.execute(stmt.sqlite, {k: _sqlite_param(v) for k, v in params.items()})
        try:
            if cur.description is None:
                return _Result((), [], cur.rowcount, False)
            columns = tuple(d[0] for d in cur.description)
            return _Result(columns, cur.fetchmany(max_rows + 1), cur.rowcount, True)
        finally:
            cur.close()

    def interrupt(self, raw: Any) -> None:
        raw.interrupt()

    def error(self, e: BaseException) -> SqlError | None:
        if isinstance(e, sqlite3.OperationalError) and "interrupted" in str(e):
            return SqlTimeout("the statement was interrupted")
        if isinstance(e, sqlite3.Error):
            code = getattr(e, "sqlite_errorcode", None)
            database = f"(code: {code}) {e}" if isinstance(code, int) else None
            return SqlError(f"{type(e).__name__}: {e}", database=database)
        return None


def _sqlite_param(value: object) -> Any:
    if isinstance(value, (dict, list)):
        return orjson.dumps(value).decode()  # SQLite has no arrays or objects: JSON text, for its json functions
    return value


class _Postgres(_Driver):
    name = "postgresql"

    def __init__(self, url: str, statement_timeout_ms: float, connect_timeout_ms: float) -> None:
        self.url = url
        self.statement_timeout_ms = statement_timeout_ms
        self.connect_timeout_s = max(1, math.ceil(connect_timeout_ms / 1000))

    def connect(self) -> Any:
        import psycopg

        # The server stops a statement past its deadline even if this process cannot tell it to.
        return psycopg.connect(
            self.url,
            autocommit=True,
            connect_timeout=self.connect_timeout_s,
            options=f"-c statement_timeout={math.ceil(self.statement_timeout_ms)}",
        )

    def run(self, raw: Any, stmt: Statement, params: Mapping[str, object], max_rows: int) -> _Result:
        from psycopg.types.json import Jsonb

        bound = {k: Jsonb(v) if isinstance(v, dict) else v for k, v in params.items()} if stmt.names else None
        with raw.cursor() as cur:
            cur.execute(stmt.postgres, bound)
            if cur.description is None:
                return _Result((), [], cur.rowcount, False)
            columns = tuple(c.name for c in cur.description)
            types = tuple(_pg_type_name(raw, c.type_code) for c in cur.description)
            return _Result(columns, cur.fetchmany(max_rows + 1), cur.rowcount, True, types)

    def interrupt(self, raw: Any) -> None:
        cancel = getattr(raw, "cancel_safe", None)
        if cancel is not None:
            cancel(timeout=5.0)
        else:
            raw.cancel()

    def error(self, e: BaseException) -> SqlError | None:
        import psycopg

        if isinstance(e, psycopg.errors.QueryCanceled):
            return SqlTimeout(_pg_message(e))
        if isinstance(e, psycopg.Error):
            diag = getattr(e, "diag", None)
            primary = getattr(diag, "message_primary", None) if diag is not None else None
            code = "TOOL_FAILED" if isinstance(e, psycopg.OperationalError) else None
            return SqlError(_pg_message(e), code, database=primary)
        return None


def _pg_type_name(raw: Any, oid: int) -> str:
    """The name PostgreSQL gives the type ``oid`` (``numeric``, ``int4``, ``timestamptz``; ``""`` if unknown)."""
    info = raw.adapters.types.get(oid)
    return info.name if info is not None else ""


def _pg_message(e: object) -> str:
    diag = getattr(e, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    state = getattr(e, "sqlstate", None)
    text = primary or str(e).strip().split("\n", 1)[0]
    return f"{text} (SQLSTATE {state})" if state else text


def driver_for(url: str, config: SqlBackendConfig, base_dir: str = ".") -> _Driver:
    """The driver a backend URL names.

    Raises:
        ValueError: the URL's scheme is not ``sqlite`` or ``postgresql``/``postgres``, or it has no path.
    """
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "sqlite":
        rest = url[len("sqlite:") :]
        if rest in ("", "//", "///:memory:", "//:memory:"):
            return _Sqlite(":memory:", config.statement_timeout_ms / 1000)
        if not rest.startswith("///"):
            raise ValueError("a SQLite URL is sqlite:///relative/path.db or sqlite:////absolute/path.db")
        path = unquote(urlsplit(url).path[1:] if rest.startswith("///") else rest)
        if not path:
            raise ValueError("a SQLite URL needs a file path")
        full = Path(base_dir, path) if not Path(path).is_absolute() else Path(path)
        return _Sqlite(str(full), config.statement_timeout_ms / 1000)
    if scheme in ("postgresql", "postgres"):
        return _Postgres(url, config.statement_timeout_ms, config.connect_timeout_ms)
    raise ValueError(f"unsupported database URL scheme {scheme or url!r} (sqlite:///path or postgresql://...)")


# --- connections and the pool -----------------------------------------------------------------------------


class _Conn:
    """A pooled connection, used by one thread at a time.

    If its caller stops waiting for a thread (cancelled, and the thread did not finish in the grace period),
    the connection is *orphaned*: the thread closes it when it is done and it never returns to the pool.
    """

    __slots__ = ("_lock", "_orphaned", "_running", "broken", "driver", "raw")

    def __init__(self, driver: _Driver, raw: object) -> None:
        self.driver = driver
        self.raw = raw
        self.broken = False
        self._lock = threading.Lock()
        self._running = False
        self._orphaned = False

    async def call(self, fn: Callable[[Any], T]) -> T:
        raw = self.raw

        def work() -> T:
            try:
                return fn(raw)
            finally:
                with self._lock:
                    self._running = False
                    orphaned = self._orphaned
                if orphaned:
                    _close_quietly(self.driver, raw)

        with self._lock:
            self._running = True
        return await run_interruptible(work, lambda: self.driver.interrupt(raw))

    @property
    def running(self) -> bool:
        """Is a worker thread using it now?"""
        with self._lock:
            return self._running

    def release(self) -> bool:
        """May the connection go back to the pool? (Not while a thread still holds it, nor once broken.)"""
        with self._lock:
            if self._running:
                self._orphaned = True
                return False
        return not self.broken


def _close_quietly(driver: _Driver, raw: object) -> None:
    try:
        driver.close(raw)
    except Exception:  # closing a connection that is already gone: nothing to report
        pass


class SqlBackend:
    """A named database: a lazy pool of connections and the statements steps run on it.

    Args:
        name: its name in the config (``[sql.NAME]``), used in error messages.
        config: its entry.
        base_dir: what a relative SQLite path is relative to (the config file's directory).

    Raises:
        ValueError: the URL is not one this module can open.
    """

    def __init__(self, name: str, config: SqlBackendConfig, base_dir: str = ".") -> None:
        self.name = name
        self.config = config
        self.driver = driver_for(config.url, config, base_dir)
        size = config.pool_size if self.driver.max_pool is None else min(config.pool_size, self.driver.max_pool)
        self.pool_size = size
        self._limiter = trio.CapacityLimiter(size)
        self._idle: list[_Conn] = []
        self._closed = False

    def __repr__(self) -> str:
        return f"<SqlBackend {self.name} {self.driver.name}>"

    @property
    def kind(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.driver.name

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[SqlTransaction]:
        """A connection of the pool (waiting for one when all ``pool_size`` are in use), in autocommit."""
        if self._closed:
            raise SqlError(f"sql backend '{self.name}' is closed", "TOOL_FAILED")
        token = object()
        await self._limiter.acquire_on_behalf_of(token)
        conn: _Conn | None = None
        try:
            conn = self._idle.pop() if self._idle else await self._connect()
            yield SqlTransaction(self, conn)
        finally:
            if conn is not None:
                if conn.release() and not self._closed:
                    self._idle.append(conn)
                elif not conn.running:
                    with trio.CancelScope(shield=True):
                        await trio.to_thread.run_sync(_close_quietly, self.driver, conn.raw)
            self._limiter.release_on_behalf_of(token)

    async def _connect(self) -> _Conn:
        seconds = self.config.connect_timeout_ms / 1000
        with trio.move_on_after(seconds) as scope:
            try:
                raw = await run_interruptible(
                    self.driver.connect, None, grace_s=0, discard=partial(_close_quietly, self.driver)
                )
            except Exception as e:
                raise SqlError(
                    f"cannot connect to sql backend '{self.name}': {_first_line(e)}", "TOOL_FAILED"
                ) from None
        if scope.cancelled_caught:
            raise SqlError(
                f"cannot connect to sql backend '{self.name}': no answer within {self.config.connect_timeout_ms:g} ms",
                "TIMEOUT",
            )
        return _Conn(self.driver, raw)

    async def execute(self, stmt: Statement, params: Mapping[str, object], row_mode: RowMode = "rows") -> Any:
        """Run one statement in autocommit; the output per ``row_mode`` (see :func:`shape`).

        Raises:
            SqlError: the database refused it, it could not be reached, or it ran past its deadline.
        """
        async with self.connection() as conn:
            return await conn.execute(stmt, params, row_mode)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[SqlTransaction]:
        """A transaction: committed when the block ends normally, rolled back when it raises (or is
        cancelled), so it is all or nothing."""
        async with self.connection() as conn:
            await conn.run_text(self.driver.begin)
            try:
                yield conn
            except BaseException:
                await conn.rollback()
                raise
            await conn.run_text("COMMIT")

    async def aclose(self) -> None:
        """Close the idle connections; connections in use are closed when they come back."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await trio.to_thread.run_sync(_close_quietly, self.driver, conn.raw)


class SqlTransaction:
    """A connection checked out of a :class:`SqlBackend`'s pool (inside or outside a transaction)."""

    __slots__ = ("backend", "conn")

    def __init__(self, backend: SqlBackend, conn: _Conn) -> None:
        self.backend = backend
        self.conn = conn

    async def execute(self, stmt: Statement, params: Mapping[str, object], row_mode: RowMode = "rows") -> Any:
        """Run one statement on this connection; the output per ``row_mode``.

        Raises:
            SqlError: the database refused it, or it ran past the backend's ``statement_timeout_ms``.
        """
        cfg = self.backend.config
        result = await self._run(stmt, params)
        return shape(result, row_mode, cfg.max_rows)

    async def execute_result(
        self, stmt: Statement, params: Mapping[str, object]
    ) -> tuple[tuple[str, ...] | None, list[dict[str, Any]], int]:
        """Run one statement on this connection; its columns (None: it returns no rows), its rows as objects
        (JSON-ready values) and its row count (rows changed, for a statement that returns none).

        Raises:
            SqlError: the database refused it, it returned more than ``max_rows`` rows, or it ran past the
                backend's ``statement_timeout_ms``.
        """
        cfg = self.backend.config
        result = await self._run(stmt, params)
        if not result.returns_rows:
            return None, [], result.rowcount
        rows = shape(result, "rows", cfg.max_rows)
        return result.columns, rows, len(rows)

    async def execute_raw(self, stmt: Statement, params: Mapping[str, object]) -> RawResult:
        """Run one statement on this connection; its result as the driver gave it (the values not made
        JSON-ready, the column types named): for a caller that encodes the values its own way.

        Raises:
            SqlError: the database refused it, it returned more than ``max_rows`` rows, or it ran past the
                backend's ``statement_timeout_ms``.
        """
        cfg = self.backend.config
        result = await self._run(stmt, params)
        if len(result.rows) > cfg.max_rows:
            raise SqlError(f"the statement returned more than {cfg.max_rows} rows (the backend's max_rows)")
        return result

    async def run_text(self, text: str) -> None:
        """Run a statement without parameters or results (``BEGIN``, ``COMMIT``)."""
        stmt = Statement(text, (), text, text)
        driver = self.backend.driver
        await self._timed(lambda raw: driver.run(raw, stmt, {}, 0))

    async def rollback(self) -> None:
        """Roll back, shielded from cancellation and bounded; a connection that cannot is discarded."""
        if self.conn.running:
            # An interrupted statement's thread still holds it: it is closed when that thread ends, which
            # rolls the transaction back on the server.
            self.conn.broken = True
            return
        with trio.CancelScope(shield=True):
            with trio.move_on_after(self.backend.config.statement_timeout_ms / 1000) as scope:
                try:
                    await self.run_text("ROLLBACK")
                except SqlError:
                    self.conn.broken = True
            if scope.cancelled_caught:
                self.conn.broken = True

    async def _run(self, stmt: Statement, params: Mapping[str, object]) -> _Result:
        """The driver's result of one statement, every parameter it names given, under the statement timeout."""
        missing = [n for n in stmt.names if n not in params]
        if missing:
            raise SqlError(f"no value for parameter{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
        driver, max_rows = self.backend.driver, self.backend.config.max_rows
        return await self._timed(lambda raw: driver.run(raw, stmt, params, max_rows))

    async def _timed(self, fn: Callable[[Any], _Result]) -> _Result:
        ms = self.backend.config.statement_timeout_ms
        with trio.move_on_after(ms / 1000) as scope:
            try:
                return await self.conn.call(fn)
            except Exception as e:
                err = self.backend.driver.error(e)
                if err is None:
                    raise
                if isinstance(err, SqlTimeout):
                    raise SqlTimeout(f"the statement ran past the statement timeout of {ms:g} ms") from None
                if err.code == "TOOL_FAILED":
                    self.conn.broken = True
                raise err from None
        assert scope.cancelled_caught
        raise SqlTimeout(f"the statement ran past the statement timeout of {ms:g} ms")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().split("\n", 1)[0]
    return text or type(e).__name__
