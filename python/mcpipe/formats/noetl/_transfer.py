"""NoETL's ``transfer`` tool (``noetl/tools/transfer/executor.py``): rows moved from an HTTP API or a PostgreSQL
query into a PostgreSQL table, on mcpipe's ``http`` and ``postgres`` kinds (the outbound policy and the
config's ``[sql.NAME]`` credentials apply).

- ``source: {type: http, url, method, headers, data_path}``: the response body (JSON), at ``data_path``
  (``results.items``), a list of records (one record when it is not a list);
- ``source: {type: postgres, auth, query}``: the query's rows;
- ``target: {type: postgres, auth, table, mapping: {column: field}, query}``: each record's ``mapping``
  fields (dotted paths) into the table's columns (an HTTP source's records need a mapping; a query's rows keep
  their columns), ``chunk_size`` rows a statement, every value bound; ``mode``: ``append``/``insert``,
  ``upsert`` (on the first column), ``replace`` (the table emptied first).

The result is NoETL's ``{status, data: {direction, source_type, target_type, mode, rows_transferred,
chunks_processed, ...}}``. Snowflake (a cloud warehouse) is refused at check time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mcpipe.errors import Problem
from mcpipe.formats.noetl._save import IDENT, TABLE

__all__ = ["TransferSpec", "read_transfer"]

MAX_CHUNK = 10_000


@dataclass
class TransferSpec:
    """A ``transfer`` tool, read."""

    location: str
    source_type: str
    target_type: str = "postgres"
    url: Any = None
    method: str = "GET"
    headers: Any = None
    data_path: str | None = None
    source_auth: Any = None
    query: Any = None
    target_auth: Any = None
    table: str | None = None
    target_query: Any = None
    mapping: dict[str, str] = field(default_factory=dict)
    chunk_size: int = 1000
    mode: str = "append"


def read_transfer(config: Mapping[str, object], where: str, problems: list[Problem], code: str) -> TransferSpec | None:
    """A ``transfer`` tool's fields, checked; the directions mcpipe has (http or postgres into postgres)."""

    def add(at: str, message: str) -> None:
        problems.append(Problem(at, code, message))

    source, target = config.get("source"), config.get("target")
    if not isinstance(source, Mapping) or not isinstance(target, Mapping):
        add(where, "a transfer needs `source` and `target` (objects)")
        return None
    s_type = str(source.get("tool", source.get("kind", source.get("type", "")))).lower()
    t_type = str(target.get("tool", target.get("kind", target.get("type", "")))).lower()
    for at, kind in ((f"{where}.source.type", s_type), (f"{where}.target.type", t_type)):
        if kind == "snowflake":
            add(at, "a transfer to or from `snowflake` (a cloud warehouse) has no mcpipe step kind")
            return None
    if s_type not in ("http", "postgres") or t_type != "postgres":
        add(where, f"a transfer from `{s_type}` to `{t_type}`: mcpipe transfers from http or postgres into postgres")
        return None
    spec = TransferSpec(where, s_type, t_type)
    if s_type == "http":
        spec.url = source.get("url", source.get("endpoint"))
        if not isinstance(spec.url, str) or not spec.url:
            add(f"{where}.source.url", "is required: the API's URL")
        spec.method = str(source.get("method", "GET")).upper()
        if spec.method not in ("GET", "POST"):
            add(f"{where}.source.method", "must be GET or POST")
        spec.headers = source.get("headers") or {}
        path = source.get("data_path")
        spec.data_path = str(path) if path is not None else None
    else:
        spec.query, spec.source_auth = source.get("query"), source.get("auth")
        if not isinstance(spec.query, str) or spec.source_auth is None:
            add(f"{where}.source", "a postgres source needs `query` and `auth`")
    spec.target_auth = target.get("auth")
    if spec.target_auth is None:
        add(f"{where}.target.auth", "is required: the credential of the target database")
    table = target.get("table")
    if table is not None and (not isinstance(table, str) or not TABLE.match(table)):
        add(f"{where}.target.table", f"must be a table name (`schema.table`), got {table!r}")
        table = None
    spec.table = table
    spec.target_query = target.get("query")
    if spec.table is None and spec.target_query is None:
        add(f"{where}.target", "needs `table` (or `query`)")
    mapping = target.get("mapping") or {}
    if not isinstance(mapping, Mapping) or not all(
        isinstance(k, str) and IDENT.match(k) and isinstance(v, str) for k, v in mapping.items()
    ):
        add(f"{where}.target.mapping", "maps column names to the records' fields (dotted paths)")
        mapping = {}
    spec.mapping = dict(mapping)
    if s_type == "http" and not spec.mapping:
        add(f"{where}.target.mapping", "an http source's records need a `mapping` of columns to fields")
    size = config.get("chunk_size", 1000)
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_CHUNK:
        add(f"{where}.chunk_size", f"must be an integer from 1 to {MAX_CHUNK}")
    else:
        spec.chunk_size = size
    mode = str(config.get("mode", "append")).lower()
    if mode not in ("append", "insert", "upsert", "replace"):
        add(f"{where}.mode", f"must be append, upsert or replace, got {mode!r}")
    spec.mode = mode
    return spec


def records(body: object, data_path: str | None) -> list[Any]:
    """The records of an HTTP source's body, at ``data_path`` (NoETL's: a missing part is an empty list)."""
    data = body
    for part in (data_path or "").split(".") if data_path else ():
        data = data.get(part, []) if isinstance(data, Mapping) else data
    return data if isinstance(data, list) else [data]


def field_of(record: object, path: str) -> Any:
    """A record's field at a dotted path (None when a part is missing)."""
    value = record
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
        if value is None:
            break
    return value


def insert_chunk(table: str, columns: list[str], rows: list[list[object]], mode: str) -> tuple[str, dict[str, Any]]:
    """One INSERT of ``rows`` (each value bound as ``:tI_J``); ``upsert`` on the first column."""
    params = {f"t{i}_{j}": value for i, row in enumerate(rows) for j, value in enumerate(row)}
    groups = ["(" + ", ".join(f":t{i}_{j}" for j in range(len(row))) + ")" for i, row in enumerate(rows)]
    cols = ", ".join(f'"{c}"' for c in columns)
    sql = f"INSERT INTO {table} ({cols}) VALUES {', '.join(groups)}"
    if mode == "upsert" and len(columns) > 1:
        rest = ", ".join(f'"{c}" = EXCLUDED."{c}"' for c in columns[1:])
        sql += f' ON CONFLICT ("{columns[0]}") DO UPDATE SET {rest}'
    return sql, params


def check_columns(columns: list[str], where: str) -> None:
    for c in columns:
        if not isinstance(c, str) or not IDENT.match(c):
            raise ValueError(f"{where}: `{c}` is not a column name")
