"""What mcpg's SQL plugin does beyond running a binding's statement (``mcpg-plugin-backend-sql`` ``lib.rs``):

- ``mcpg.sql_list``: a binding's ``list_query``, the resources ``resources/list`` enumerates (``list_resources``,
  ``run_list_query``, ``batch_to_resource_page``): ``:cursor`` and ``:page_size`` bound, each row a resource
  (``uri``, and ``name``, ``description``, ``mime_type`` when selected), the next page's cursor the last row's
  ``cursor_column`` (keyset) or the page's row count (offset), none once a page comes back short;
- ``mcpg.sql_complete``: a template variable's dynamic completion (``complete_template_variable``): the
  ``config.query`` with ``:prefix`` (what the client typed) and ``:ctx_<key>`` (the client's other arguments)
  bound, the first column of each row offered (strings only, at most ``max_results``);
- ``row_mode: stream`` (``stream.rs``): keyset pages of a binding's rows, ``{rows, truncated, next_cursor}``,
  the caller passing ``_cursor`` back for the next page; the cursor is HMAC-signed so it cannot be forged.

Both kinds run in ``hidden`` pipelines the front-end declares (a completion source, a listing).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import msgspec
import orjson
import trio

from mcpipe.errors import ErrorCode
from mcpipe.kinds import KINDS, Build, Kind, StepFields
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = ["StreamCursors", "check_list_query", "stream_page"]

_log = logging.getLogger("mcpipe.mcpg")
_IDENTIFIER = re.compile(r"[A-Za-z0-9_]+")

_SF = TypeVar("_SF", bound=StepFields)
"""The fields of the step whose backend is looked up (any kind's)."""


def sql_backend(b: Build[_SF], name: str) -> Any:
    """The ``[sql.NAME]`` backend a step names (else the step fails, located)."""
    backend = b.policy.sql.get(name) if b.policy.sql is not None else None
    if backend is None:
        b.problem(f"{b.location}.backend", f"no SQL backend '{name}'")
        b.fail()
    return backend


# --- list_query -----------------------------------------------------------------------------------


class SqlListFields(StepFields, tag="mcpg.sql_list", kw_only=True):
    """A sql binding's ``list_query``: the resources it lists, one page (the step's input ``cursor``)."""

    backend: str
    sql: str
    mode: Literal["keyset", "offset"] = "keyset"
    cursor_column: str | None = None
    page_size: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100
    name: str
    """The binding's name: a listed resource's name when its row has none."""


def check_list_query(spec: Mapping[str, object]) -> str | None:
    """Why mcpg's SQL plugin refuses a ``list_query`` at registration (``ListQueryConfig::validate``, and the
    placeholders it binds), or None."""
    from mcpipe.backends.sql import Statement

    sql = spec.get("sql")
    if not isinstance(sql, str) or not sql.strip():
        return "list_query.sql must not be empty"
    page = spec.get("page_size", 100)
    if not isinstance(page, int) or not 0 < page <= 1000:
        return f"list_query.page_size ({page}) must be in 1..=1000"
    if spec.get("mode", "keyset") == "keyset":
        col = str(spec.get("cursor_column") or "").strip()
        if not col:
            return "list_query.cursor_column is required for mode: keyset"
        if not _IDENTIFIER.fullmatch(col):
            return f"list_query.cursor_column '{col}' is not a safe SQL identifier"
    for name in Statement.parse(sql).names:
        if name not in ("cursor", "page_size"):
            return f"list_query references ':{name}' but only ':cursor' and ':page_size' are bound by the plugin"
    return None


def _build_list(b: Build[SqlListFields]) -> tuple[Any, Any]:
    from mcpipe.backends.sql import Statement

    f = b.decoded()
    backend = sql_backend(b, f.backend)
    why = check_list_query(msgspec.to_builtins(f))
    if why is not None:
        b.problem(f"{b.location}.sql", why)
        b.fail()
    return backend, Statement.parse(f.sql)


def _cursor_text(value: object) -> str:
    """``cursor_value_to_string``: a cell as an opaque cursor."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return orjson.dumps(value).decode()  # a boolean as JSON's `true` or `false`


MAX_OFFSET = 2**63 - 1
"""The largest offset-mode cursor (a signed 64-bit integer, what the databases take)."""


def offset_of(cursor: object) -> int:
    """An offset-mode cursor's offset (0 for none): decimal digits (an optional ``+``, as mcpg's ``u64`` parse
    takes) up to :data:`MAX_OFFSET`; anything else (a sign, spaces, ``1_000``, other scripts' digits, a number
    past a 64-bit integer) is refused with mcpg's message.

    Raises:
        StepFailure: the cursor is not such a number.
    """
    if cursor is None or cursor == "":
        return 0
    digits = cursor.removeprefix("+") if isinstance(cursor, str) else ""
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 19 and int(digits) <= MAX_OFFSET):
        shown = cursor if isinstance(cursor, str) and len(cursor) <= 64 else f"{str(cursor)[:64]}…"
        raise StepFailure(f"offset-mode cursor '{shown}' is not a non-negative integer", ErrorCode.TOOL_ERROR)
    return int(digits)


async def run_list(
    step: Leaf[SqlListFields, tuple[Any, Any]],
    inputs: Mapping[str, object],
    env: Mapping[str, object],
    ctx: ToolContext,
) -> StepOutput:
    from mcpipe.backends.sql import SqlError

    f = step.fields
    backend, stmt = step.built
    args = env.get("args")
    cursor = args.get("cursor") if isinstance(args, Mapping) else None
    if f.mode == "keyset":
        bound: Any = cursor if isinstance(cursor, str) and cursor else None
    else:
        bound = offset_of(cursor)
    try:
        with trio.fail_after(f.timeout_ms / 1000 if f.timeout_ms else 30):
            rows = await backend.execute(stmt, {"cursor": bound, "page_size": f.page_size}, "rows")
    except (SqlError, trio.TooSlowError) as e:
        raise StepFailure(f"list_query: {e or 'timed out'}", ErrorCode.TOOL_ERROR) from None
    resources = []
    last: str | None = None
    for row in rows or []:
        uri = row.get("uri") if isinstance(row, Mapping) else None
        if not isinstance(uri, str):
            _log.warning("list_query of '%s': a row without a string 'uri' column is skipped", f.name)
            continue
        entry: dict[str, Any] = {"uri": uri, "name": row["name"] if isinstance(row.get("name"), str) else f.name}
        if isinstance(row.get("description"), str):
            entry["description"] = row["description"]
        if isinstance(row.get("mime_type"), str):
            entry["mimeType"] = row["mime_type"]
        resources.append(entry)
        if f.cursor_column is not None and f.cursor_column in row:
            last = _cursor_text(row[f.cursor_column])
    count = len(rows or [])
    # An offset cursor is the next page's offset (this one's and its rows): mcpg's plugin answers the row count
    # alone for its host to compose, which its host does not (its pages after the second repeat the second).
    next_cursor = None if count < f.page_size else (last if f.mode == "keyset" else str(min(bound + count, MAX_OFFSET)))
    return StepOutput.of({"resources": resources, "next_cursor": next_cursor})


# --- dynamic completions --------------------------------------------------------------------------


class SqlCompleteFields(StepFields, tag="mcpg.sql_complete", kw_only=True):
    """A template variable's completion query on a sql binding's database (``variable_completions``'s
    ``kind: dynamic`` ``config``): the step's input is ``{argument, value, context}``."""

    backend: str
    query: str
    max_results: Annotated[int, msgspec.Meta(ge=0)] = 100


def _build_complete(b: Build[SqlCompleteFields]) -> Any:
    f = b.decoded()
    return sql_backend(b, f.backend)


async def run_complete(
    step: Leaf[SqlCompleteFields, Any], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    from mcpipe.backends.sql import SqlError, Statement

    f = step.fields
    args = env.get("args")
    args = args if isinstance(args, Mapping) else {}
    if ":prefix" not in f.query:
        raise StepFailure("variable_completions.config.query must reference `:prefix`", ErrorCode.TOOL_ERROR)
    context = {
        str(k).lower(): str(v)
        for k, v in (args.get("context") or {}).items()
        if str(k) and _IDENTIFIER.fullmatch(str(k))
    }
    stmt = Statement.parse(f.query)
    params: dict[str, Any] = {}
    for name in stmt.names:
        if name == "prefix":
            params[name] = str(args.get("value") or "")
        elif name.startswith("ctx_") and name[4:] in context:
            params[name] = context[name[4:]]
        elif name.startswith("ctx_"):
            raise StepFailure(
                f"variable_completions.config.query references `:ctx_{name[4:]}` but completion context has no "
                f"`{name[4:]}` entry",
                ErrorCode.TOOL_ERROR,
            )
        else:
            raise StepFailure(
                f"variable_completions.config.query references unsupported placeholder ':{name}' (only :prefix and "
                ":ctx_<key> are bound)",
                ErrorCode.TOOL_ERROR,
            )
    try:
        rows = await step.built.execute(stmt, params, "rows")
    except SqlError as e:
        raise StepFailure(str(e), ErrorCode.TOOL_ERROR) from None
    values = []
    for row in (rows or [])[: f.max_results]:
        first = next(iter(row.values()), None) if isinstance(row, Mapping) else None
        if isinstance(first, str):
            values.append(first)
    return StepOutput.of(values)


# --- row_mode: stream -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamCursors:
    """A ``row_mode: stream`` binding's keyset: its cursor columns, first-page values and signing key."""

    binding: str
    columns: tuple[str, ...]
    initial: Mapping[str, Any]
    key: bytes

    @classmethod
    def of(cls, binding: str, spec: Mapping[str, Any]) -> StreamCursors:
        """From the binding's ``stream`` block (a per-process random key when it has no ``signing_key``)."""
        given = spec.get("signing_key")
        key = hashlib.sha256(str(given).encode()).digest() if given else secrets.token_bytes(32)
        return cls(binding, tuple(spec.get("cursor_columns") or ()), dict(spec.get("initial") or {}), key)

    def encode(self, keyset: Sequence[object]) -> str:
        """``s.<base64url(payload)>.<base64url(hmac)>`` (``stream.rs`` ``encode_cursor``)."""
        payload = orjson.dumps({"v": 1, "b": self.binding, "p": "", "k": keyset})
        body = base64.urlsafe_b64encode(payload).rstrip(b"=")
        mac = base64.urlsafe_b64encode(hmac.new(self.key, body, hashlib.sha256).digest()).rstrip(b"=")
        return f"s.{body.decode()}.{mac.decode()}"

    def decode(self, token: str) -> list[Any]:
        """The keyset a cursor carries.

        Raises:
            ValueError: mcpg's message for a token that fails verification or names another binding.
        """
        failed = ValueError(
            "stream cursor: token failed verification (malformed, tampered, signed by a different gateway "
            "instance without shared signing_key, or for a different binding)"
        )
        body, _, mac = token.removeprefix("s.").partition(".")
        if not token.startswith("s.") or not mac or not body.isascii() or not mac.isascii():
            raise failed
        # The signature first, in constant time; only a body this process signed is decoded (a forged one is
        # never parsed, however large or deep).
        expected = hmac.new(self.key, body.encode("ascii"), hashlib.sha256).digest()
        try:
            given = base64.urlsafe_b64decode(mac + "=" * (-len(mac) % 4))
        except ValueError:
            raise failed from None
        if not hmac.compare_digest(expected, given):
            raise failed
        try:
            payload = orjson.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except (ValueError, orjson.JSONDecodeError):
            raise failed from None
        if not isinstance(payload, dict) or payload.get("v") != 1:
            raise failed
        if payload.get("b") != self.binding:
            raise ValueError(
                f"stream cursor: token was minted for binding `{payload.get('b')}` but submitted to "
                f"`{self.binding}` — bindings MUST match"
            )
        keyset = payload.get("k")
        if not isinstance(keyset, list) or len(keyset) != len(self.columns):
            n = len(keyset) if isinstance(keyset, list) else 0
            raise ValueError(
                f"stream cursor: token carries {n} keyset values but binding declares {len(self.columns)} "
                "cursor_columns — config drift between mint and consume"
            )
        return keyset

    def bind(self, arguments: Mapping[str, object]) -> dict[str, Any]:
        """The statement's parameters for a page: ``_after_<col>`` from the caller's ``_cursor`` (else from
        ``initial``, else null), never from the caller directly (``apply_stream_cursor``)."""
        args = {k: v for k, v in arguments.items() if k != "_cursor"}
        token = arguments.get("_cursor")
        keyset = self.decode(token) if isinstance(token, str) and token else None
        for i, col in enumerate(self.columns):
            args[f"_after_{col}"] = keyset[i] if keyset is not None else self.initial.get(col)
        return args

    def next_cursor(self, rows: Sequence[object]) -> str | None:
        """The next page's cursor: the last row's cursor columns (``mint_next_cursor``); None after the last."""
        if not rows or not isinstance(rows[-1], Mapping):
            return None
        last = rows[-1]
        if any(col not in last for col in self.columns):
            return None
        return self.encode([last[col] for col in self.columns])


def stream_page(rows: Sequence[object], max_rows: int, cursors: StreamCursors) -> dict[str, Any]:
    """The ``row_mode: stream`` answer: ``{rows, truncated, next_cursor}``."""
    kept = rows[:max_rows]
    return {"rows": kept, "truncated": len(rows) > max_rows, "next_cursor": cursors.next_cursor(kept)}


_KINDS: list[Kind[Any, Any]] = [
    Kind("mcpg.sql_list", SqlListFields, run_list, build=_build_list),
    Kind("mcpg.sql_complete", SqlCompleteFields, run_complete, build=_build_complete),
]

for _kind in _KINDS:
    if KINDS.get(_kind.name) is None:
        KINDS.register(_kind)
