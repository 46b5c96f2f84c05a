"""NoETL's ``save`` (and ``sink``): a result persisted into PostgreSQL or DuckDB, on mcpipe's ``postgres`` and
``duckdb`` kinds, as NoETL's save executor does it (``noetl/plugin/save.py`` of 2025-09, then
``noetl/plugin/shared/storage/``).

Where a save is written:

- a step's ``save:`` (or ``sink:``): after the step's tool, in the step's scope with ``result`` (the result's
  ``data``, else the result), ``this`` (the result) and ``data`` (the same as ``result``, when the scope has no
  ``data``); a loop step's runs once after its last item, with ``results``/``items``/``result`` (every item's
  result), ``errors`` and ``count``;
- a task's own ``save:`` (NoETL 1.x's iterator body): after the task, for each item;
- a ``type: save`` step or ``kind: save`` task: the save is the task.

What a save holds: ``storage`` (a name, or ``{type, ...}`` with the fields below inside), ``data`` (or
``args``: a mapping rendered in that scope), ``auth`` (a credential, as the postgres tool reads it), and
either ``statement`` (SQL; ``:name`` binds ``data.name``, ``params.x`` reads ``data.x``) or ``table`` with
``mode`` (``insert``, ``upsert``) and ``key`` (the conflict columns of an upsert). DuckDB takes
``commands``/``sql``/``statement``, or writes ``data`` into ``table`` (NoETL's ``save_data``) as one row.
``storage: event``/``event_log`` keeps the rendered data in the result only.

mcpipe binds each value of a declarative insert as a parameter (NoETL quotes them into the text); ``None`` is
SQL ``NULL`` and an object or list is its JSON text (NoETL writes Python's ``str`` of them). A save that fails
fails its step (NoETL 1.x notes the error in the result's ``meta.save`` and goes on).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from mcpipe._describe import json_type
from mcpipe.errors import Problem

__all__ = ["SAVE_KINDS", "SaveSpec", "read_save"]

SAVE_KINDS = ("event", "event_log", "", "postgres", "duckdb")
"""The storages mcpipe writes a save into."""

REFUSED_STORAGE = {
    "gcs": "Google Cloud Storage",
    "s3": "Amazon S3",
    "http": "an HTTP endpoint (use an `http` step)",
    "python": "a python callable (use a `python` step)",
    "snowflake": "a cloud warehouse",
    "nats": "NoETL's NATS store",
    "kv": "NoETL's key/value store",
}

_FIELDS = (
    "storage",
    "tool",
    "kind",
    "type",
    "data",
    "args",
    "statement",
    "params",
    "mode",
    "key",
    "keys",
    "table",
    "auth",
    "credential",
    "spec",
    "format",
    "batch",
    "chunk_size",
    "chunksize",
    "concurrency",
    "commands",
    "sql",
    "database",
    "desc",
    "description",
    "name",
    "with",
)
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
"""A SQL name: a column, a key, an alias."""
TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?\Z")
"""A table's name, its schema optional."""
_BIND = re.compile(r"(?<![:\w]):([A-Za-z_][A-Za-z0-9_]*)")


@dataclass
class SaveSpec:
    """A ``save``/``sink`` block (or a ``save`` task), read: its storage ``kind`` and fields."""

    kind: str
    location: str
    data: Any = None
    statement: str | None = None
    table: str | None = None
    mode: str = "insert"
    keys: tuple[str, ...] = ()
    auth: Any = None
    commands: Any = None
    database: Any = None
    given: Mapping[str, Any] = field(default_factory=dict)
    """The task's ``with`` parameters (a postgres connection's ``db_*`` fields)."""


def read_save(raw: object, where: str, problems: list[Problem], code: str) -> SaveSpec | None:
    """A save block as NoETL's ``extract_save_config`` reads it (flat, or nested under ``storage``), checked."""

    def add(at: str, message: str) -> None:
        problems.append(Problem(at, code, message))

    if not isinstance(raw, Mapping):
        # A list of `{when, tool, data}` saves is a design of NoETL's docs/refactor (2025-10); its save plugin
        # then read one object (`save.get("storage")`, noetl/plugin/save.py at 62a1c659).
        if isinstance(raw, list):
            add(where, "a save is one object (`storage`, `data`, ...): no NoETL engine reads a list")
        else:
            add(where, f"a save is an object (`storage`, `data`, ...), got {json_type(raw)}")
        return None
    for k in raw:
        if k not in _FIELDS:
            add(f"{where}.{k}", f"unknown key `{k}` of a save")
    storage = raw.get("storage")
    nested: Mapping[str, Any] = {}
    if isinstance(storage, Mapping):
        nested = storage
        kind = storage.get("type", storage.get("kind", "event"))
    else:
        kind = storage if storage is not None else raw.get("tool", raw.get("kind", "event"))
    if not isinstance(kind, str):
        add(f"{where}.storage", "must be a storage name (`postgres`, `duckdb`, `event`)")
        return None
    kind = kind.strip().lower()
    if kind not in SAVE_KINDS:
        why = REFUSED_STORAGE.get(kind, "a storage mcpipe has no kind for")
        add(
            f"{where}.storage",
            f"`save` into `{kind}` ({why}) is not supported: mcpipe saves into postgres, duckdb or the event log",
        )
        return None

    def get(*keys: str) -> Any:
        """The first of ``keys`` given (not null), inside ``storage`` before beside it."""
        for key in keys:
            value = nested.get(key) if key in nested else raw.get(key)
            if value is not None:
                return value
        return None

    spec = SaveSpec(kind, where, data=get("data", "args"), database=get("database"))
    if spec.data is not None and not isinstance(spec.data, Mapping | str):
        add(f"{where}.data", f"must be a mapping of names to values, got {json_type(spec.data)}")
    statement = get("statement")
    if statement is not None and not isinstance(statement, str):
        add(f"{where}.statement", "must be SQL text")
        statement = None
    spec.statement = statement
    table = get("table")
    if table is not None and (not isinstance(table, str) or not TABLE.match(table)):
        add(f"{where}.table", f"must be a table name (`schema.table`), got {table!r}")
        table = None
    spec.table = table
    mode = str(get("mode") or "insert").lower()
    if mode not in ("insert", "upsert", "append", "replace"):
        add(f"{where}.mode", f"must be insert or upsert, got {mode!r}")
    spec.mode = "upsert" if mode in ("upsert", "replace") else "insert"
    keys = get("key", "keys")
    if isinstance(keys, str):
        keys = [keys]
    if keys is not None and (
        not isinstance(keys, list) or not all(isinstance(k, str) and IDENT.match(k) for k in keys)
    ):
        add(f"{where}.key", "must be a column name or a list of column names")
        keys = None
    spec.keys = tuple(keys or ())
    spec.auth = get("auth", "credential")
    spec.commands = get("commands", "sql")
    with_ = raw.get("with")
    if isinstance(with_, Mapping):
        spec.given = with_
    if kind == "postgres" and statement is None:
        if table is None:
            add(where, "a postgres save needs `statement`, or `table` and `data`")
        elif not isinstance(spec.data, Mapping):
            add(f"{where}.data", "a postgres save into a `table` needs `data`: a mapping")
    if isinstance(spec.data, Mapping) and table is not None and statement is None:
        for col in spec.data:
            if not isinstance(col, str) or not IDENT.match(col):
                add(f"{where}.data.{col}", f"`{col}` is not a column name")
    return spec


def insert_sql(table: str, columns: list[str], mode: str, keys: tuple[str, ...]) -> str:
    """NoETL's declarative save (``build_sql_statement``): an INSERT of ``columns`` (each bound as
    ``:noetl_cN``), an upsert with ``ON CONFLICT (keys) DO UPDATE SET`` the other columns (``DO NOTHING`` when
    every column is a key)."""
    values = ", ".join(f":noetl_c{i}" for i in range(len(columns)))
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({values})"
    if mode == "upsert" and keys:
        rest = [f"{c} = EXCLUDED.{c}" for c in columns if c not in keys]
        conflict = f" ON CONFLICT ({', '.join(keys)}) "
        sql += conflict + ("DO UPDATE SET " + ", ".join(rest) if rest else "DO NOTHING")
    return sql


def column_name(name: object, where: str) -> str:
    """``name`` if it is a column name, else a located ``ValueError``."""
    if not isinstance(name, str) or not IDENT.match(name):
        raise ValueError(f"{where}: `{name}` is not a column name")
    return name


def as_text(value: object) -> Any:
    """A value bound into a declarative insert: text as NoETL writes it (numbers and booleans their text),
    ``None`` as NULL, an object or list as JSON."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return orjson.dumps(value, default=str).decode()


def binds(statement: str) -> list[str]:
    """The ``:name`` parameters of a statement (outside quotes is close enough: NoETL replaces them all)."""
    return _BIND.findall(statement)


def duckdb_table_sql(table: str, data: Mapping[str, object]) -> str:
    """NoETL's DuckDB save of a data mapping (``build_duckdb_commands``): a table of text columns holding the
    one row (the values quoted, as NoETL quotes them), then the table."""
    cols = [column_name(k, "data") for k in data]
    values = ["NULL" if v is None else "'" + str(as_text(v)).replace("'", "''") + "'" for v in data.values()]
    heads = ", ".join(f"'{c}' AS {c}" for c in cols)
    return (
        f"CREATE OR REPLACE TABLE {table} AS SELECT {heads} WHERE FALSE;\n"
        f"INSERT INTO {table} VALUES ({', '.join(values)});\n"
        f"SELECT * FROM {table};"
    )
