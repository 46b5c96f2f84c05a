"""NoETL's ``tool:`` kinds that run code or reach a database (``python``, ``postgres``, ``duckdb``,
``shell``), mapped onto mcpipe's step kinds of the same names (``mcpipe.kinds``).

The NoETL front-end (``mcpipe.formats.noetl``) asks :func:`map_tool` for a step's ``tool:`` of one of
:data:`KINDS`; the answer is a declared step in mcpipe's layout (``{"kind": "python", ...}``) whose fields
named in :data:`TEMPLATE_FIELDS` are still NoETL's Jinja, rendered by the front-end at run time (each value,
recursively, in the step's NoETL scope), or None with a located problem. Every other field is final:
``code`` of a python step above all, which is never rendered (NoETL renders Jinja into the source; mcpipe
refuses such code, located, and passes values only as data through ``input``).

What each NoETL tool's fields become (NoETL 4.26.0's tools, ``noetl/tools/*``):

- ``python``: ``code`` (or ``code_b64``/``code_base64``, decoded here), ``libs`` (imports put before the
  code), ``input`` and ``args`` (merged, ``input`` winning: the code's globals and ``main``'s arguments);
  ``coerce`` on, as NoETL decodes JSON or Python literals in string arguments. ``context`` is left to the
  front-end: it may set it (a template) to its scope, NoETL's ``context`` global.
- ``postgres``: the SQL of ``command``/``commands``/``query``/``queries``/``cmd``/``cmds`` (a list joined
  with newlines) or their ``*_b64`` forms; the connection of ``auth`` (or ``credential``): a credential name
  is the config's ``[sql.NAME]`` backend of that name, chosen at run time when
  it is a template; ``{source: inline, fields: {...}}`` (or ``db_host``... fields) is a ``dsn``. The SQL is
  left as NoETL wrote it: the front-end binds its values (:mod:`mcpipe.formats.noetl._sqlbind`).
- ``duckdb``: the same SQL fields, ``database`` (default: NoETL's file per execution, under the temporary
  directory, named by the front-end's ``execution_id``), NoETL's result shape (``output: noetl``).
- ``shell``: ``cmds`` (or ``cmd``/``command``), ``env``, ``cwd``; ``timeout_seconds`` (NoETL's default
  600 s per command) becomes the step's ``timeout_ms``.

What mcpipe cannot honour is refused here, located: ``script`` (code fetched from GCS, S3, HTTP or files),
python ``deps`` (packages installed per tenant) and ``auth`` (cloud credentials as environment variables),
DuckDB ``auth``/``credentials`` (secrets and attachments need DuckDB extensions that are not installed),
and auth sources mcpipe has no store for.

Credentials: NoETL reads a credential by name from its server's credential store; mcpipe's store of
database credentials is the config's ``[sql.NAME]`` sections, so a NoETL credential ``pg_local`` is the
backend ``[sql.pg_local]``. Scalar secrets are read as NoETL reads them from the
environment (:func:`secret_value`: ``source: env`` reads the variable named, ``source: secret`` reads
``NOETL_SECRET_<NAME>``).
"""

from __future__ import annotations

import base64
import binascii
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mcpipe.errors import ErrorCode, Problem
from mcpipe.formats.noetl._save import IDENT

__all__ = [
    "KINDS",
    "NOETL_DUCKDB_DIR",
    "NO_CONNECTION",
    "NO_CONNECTION_CODE",
    "TEMPLATE_FIELDS",
    "connection_of",
    "map_tool",
    "secret_value",
    "single_auth",
]

KINDS = frozenset({"python", "postgres", "duckdb", "shell"})
"""The NoETL tool kinds this module maps."""

TEMPLATE_FIELDS: Mapping[str, frozenset[str]] = {
    "python": frozenset({"input", "env", "context"}),
    "postgres": frozenset({"command", "backend", "dsn"}),
    "duckdb": frozenset({"commands", "database", "secrets"}),
    "shell": frozenset({"cmds", "env", "cwd"}),
}
"""The fields of each mapped step that hold NoETL Jinja for the front-end to render at run time; the
others are final (a python step's ``code`` is never rendered)."""

_SQL_FIELDS = ("query", "queries", "command", "commands", "cmd", "cmds")
_SQL_B64 = ("command_b64", "commands_b64", "query_b64")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_JINJA = re.compile(r"\{\{|\{%")
NOETL_SHELL_TIMEOUT_S = 600
"""NoETL's shell tool's deadline per command when ``timeout_seconds`` is not given."""


def _problem(problems: list[Problem], where: str, message: str, code: str = ErrorCode.INVALID_SPEC) -> None:
    problems.append(Problem(where, code, message))


def map_tool(kind: str, tool: Mapping[str, object], loc: str, problems: list[Problem]) -> dict[str, Any] | None:
    """The mcpipe step for NoETL's ``tool:`` mapping ``tool`` (at ``loc``) of kind ``kind`` (one of
    :data:`KINDS`), or None with a located problem appended to ``problems``."""
    mapper = _MAPPERS.get(kind)
    if mapper is None:
        _problem(problems, f"{loc}.kind", f"NoETL tool kind `{kind}` is not one of {', '.join(sorted(KINDS))}")
        return None
    if not isinstance(tool, Mapping):
        _problem(problems, loc, f"a NoETL tool is a mapping, got {type(tool).__name__}")
        return None
    before = len(problems)
    step = mapper(tool, loc, problems)
    return step if step is not None and len(problems) == before else None


# --- python ---------------------------------------------------------------------------------------------


def _python(tool: Mapping[str, object], loc: str, problems: list[Problem]) -> dict[str, Any] | None:
    for field, why in (
        ("script", "code fetched from a script source (GCS, S3, HTTP, a file) is not supported: put it in `code`"),
        ("deps", "dependencies installed per tenant are not supported: install them in the server's environment"),
        ("auth", "cloud credentials injected as environment variables are not supported: pass them in `env`"),
    ):
        if tool.get(field) not in (None, {}, ""):
            _problem(problems, f"{loc}.{field}", f"python tool: {why}")
    code = _python_code(tool, loc, problems)
    if code is None:
        return None
    jinja = bool(_JINJA.search(code))  # run as written: the front-end warns (see JINJA_IN_CODE)
    imports = _libs(tool.get("libs"), f"{loc}.libs", problems)
    if imports is None:
        return None
    if imports:
        code = "\n".join(imports) + "\n\n" + code
    merged: dict[str, Any] = {}
    for field in ("args", "input"):
        value = tool.get(field)
        if value is None:
            continue
        if not isinstance(value, Mapping):
            template = isinstance(value, str) and _JINJA.search(value)
            why = " of names to values" if template else f", got {type(value).__name__}"
            _problem(problems, f"{loc}.{field}", f"python tool: `{field}` must be a mapping{why}")
            return None
        merged.update(value)
    step: dict[str, Any] = {"kind": "python", "code": code, "coerce": True}
    if merged:
        step["input"] = merged
    if jinja:
        step[JINJA_IN_CODE] = True
    return step


JINJA_IN_CODE = "noetl_jinja_in_code"
"""Marks a mapped python step whose code holds Jinja (``{{ ... }}``, ``{% ... %}``): mcpipe never renders
values into code, so the code runs as written, as NoETL 4.26 runs it (its golden ``test_vars_template_access``);
the front-end takes the marker off and warns."""


def _python_code(tool: Mapping[str, object], loc: str, problems: list[Problem]) -> str | None:
    for field in ("code_b64", "code_base64"):
        if field in tool:
            return _b64(tool, field, loc, problems, "python")
    code = tool.get("code")
    if not isinstance(code, str) or not code.strip():
        _problem(problems, f"{loc}.code", "python tool: `code` (Python source) is required")
        return None
    return code


def _b64(tool: Mapping[str, object], field: str, loc: str, problems: list[Problem], kind: str) -> str | None:
    try:
        return base64.b64decode(str(tool[field])).decode("utf-8")  # as NoETL: non-alphabet bytes dropped
    except (binascii.Error, ValueError, UnicodeDecodeError) as e:
        _problem(problems, f"{loc}.{field}", f"{kind} tool: `{field}` is not base64 of UTF-8 text: {e}")
        return None


def _libs(libs: object, loc: str, problems: list[Problem]) -> list[str] | None:
    """NoETL's ``libs``: alias -> module (``import m as a``) or alias -> {from, import}."""
    if libs in (None, {}) or isinstance(libs, list):
        return []  # NoETL ignores a list (pip names, not imports) with a warning
    if not isinstance(libs, Mapping):
        _problem(problems, loc, f"python tool: `libs` must map aliases to modules, got {type(libs).__name__}")
        return None
    lines = []
    for alias, module in libs.items():
        where = f"{loc}.{alias}"
        if not isinstance(alias, str) or not IDENT.match(alias):
            _problem(problems, where, f"python tool: `{alias}` is not a Python name")
            continue
        source, name = (module.get("from"), module.get("import")) if isinstance(module, Mapping) else (None, None)
        if isinstance(module, str) and _MODULE.match(module):
            lines.append(f"import {module}" if alias == module else f"import {module} as {alias}")
        elif isinstance(source, str) and _MODULE.match(source) and isinstance(name, str) and IDENT.match(name):
            tail = "" if alias == name else f" as {alias}"
            lines.append(f"from {source} import {name}{tail}")
        else:
            _problem(problems, where, "python tool: a lib is a module name or {from: module, import: name}")
    return lines if len(lines) == len(libs) else None


# --- SQL text ---------------------------------------------------------------------------------------------


def _sql_text(tool: Mapping[str, object], loc: str, problems: list[Problem], kind: str) -> str | None:
    if tool.get("script") is not None:
        why = "SQL fetched from a script source (GCS, S3, HTTP, a file) is not supported: put it in `command`"
        _problem(problems, f"{loc}.script", f"{kind} tool: {why}")
        return None
    for field in _SQL_B64:
        if field in tool:
            return _b64(tool, field, loc, problems, kind)
    for field in _SQL_FIELDS:
        if field in tool:
            value = tool[field]
            if isinstance(value, list):
                return "\n".join(str(v) for v in value)
            if value is None or isinstance(value, (Mapping, bool)):
                break
            return str(value)
    why = "no SQL; give `command` (or query, queries, commands, cmd, cmds, or their _b64 forms)"
    _problem(problems, f"{loc}.command", f"{kind} tool: {why}")
    return None


# --- postgres ---------------------------------------------------------------------------------------------

_INLINE_KEYS = {
    name: part
    for part, names in {
        "host": ("host", "db_host"),
        "port": ("port", "db_port"),
        "user": ("user", "username", "db_user"),
        "password": ("password", "db_password"),
        "dbname": ("database", "dbname", "db_name"),
    }.items()
    for name in names
}
"""NoETL's names of a connection's fields (inline ``auth.fields``, NoETL 1.x's ``db_*``), each the libpq part."""


_SINGLE_AUTH_KEYS = frozenset({"source", "key", "name", "service", "secret_name", "scope", "fields", "inject", "type"})
"""NoETL's ``RESERVED_SINGLE_AUTH_KEYS``: an ``auth`` mapping with one of these is one credential, else a map
of aliases to credentials."""


def single_auth(auth: Mapping[str, object]) -> bool:
    """Whether an ``auth`` mapping is one credential (it has one of NoETL's reserved keys), not a map of
    aliases to credentials (NoETL's ``RESERVED_SINGLE_AUTH_KEYS``)."""
    return bool(_SINGLE_AUTH_KEYS.intersection(auth))


def secret_value(spec: Mapping[str, object], environ: Mapping[str, str]) -> str | None:
    """A scalar secret as NoETL reads it from the environment: ``{source: env, name: VAR}`` is ``$VAR``,
    ``{source: secret, name: NAME}`` is ``$NOETL_SECRET_<NAME upper-cased>``; None when unset (or another
    source)."""
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        return None
    if spec.get("source") == "env":
        return environ.get(name)
    if spec.get("source") == "secret":
        return environ.get(f"NOETL_SECRET_{name.upper()}")
    return None


def connection_of(tool: Mapping[str, object], loc: str, problems: list[Problem]) -> dict[str, Any] | None:
    """The connection of a NoETL tool (or save) as the postgres step takes it: ``{"backend": NAME}`` (a
    credential name, the config's ``[sql.NAME]`` backend of that name: ``auth: pg_local`` is ``[sql.pg_local]
    url = "postgresql://..."``) or ``{"dsn": ...}`` (inline fields, NoETL 1.x's ``db_*``), or None with a
    located problem."""
    auth = tool.get("auth")
    where = f"{loc}.auth"
    if auth in (None, "", {}):
        auth = tool.get("credential")
        where = f"{loc}.credential"
    if isinstance(auth, str) and auth.strip():
        return {"backend": auth.strip()}
    if isinstance(auth, Mapping) and auth and not single_auth(auth):
        # An alias map ({pg: ..., gcs: ...}): NoETL takes its postgres entry (else the first).
        entries = list(auth.values())
        chosen = next((e for e in entries if isinstance(e, Mapping) and e.get("type") == "postgres"), entries[0])
        return connection_of({"auth": chosen}, loc, problems)
    if isinstance(auth, Mapping) and auth:
        source = auth.get("source", "credential")
        if source == "credential":
            key = auth.get("key") or auth.get("credential")
            if isinstance(key, str) and key.strip():
                return {"backend": key.strip()}
            _problem(problems, where, "postgres tool: an `auth` credential needs `key` or `credential`")
            return None
        if source == "inline":
            fields = auth.get("fields")
            if isinstance(fields, Mapping) and fields:
                return {"dsn": {_INLINE_KEYS[k]: v for k, v in fields.items() if k in _INLINE_KEYS}}
            why = "inline `auth` needs `fields` (host, port, user, password, database)"
            _problem(problems, where, f"postgres tool: {why}")
            return None
        _problem(problems, where, f"postgres tool: auth source `{source}` is not supported (credential or inline)")
        return None
    # NoETL 1.x: the connection's `db_*` fields on the tool, or among its `with` parameters (`with`, `data`,
    # `args`, `input`: the front-end merges them into `with`), each a template.
    given = tool.get("with")
    for source in (tool, given if isinstance(given, Mapping) else {}):
        direct = {_INLINE_KEYS[k]: v for k, v in source.items() if k in _INLINE_KEYS and k.startswith("db_")}
        if direct:
            return {"dsn": direct}
        if isinstance(source.get("db_conn_string"), str):
            return {"dsn": source["db_conn_string"]}
    _problem(problems, f"{loc}.auth", NO_CONNECTION, code=NO_CONNECTION_CODE)
    return None


NO_CONNECTION = "postgres tool: `auth` (a credential: the config's [sql.NAME]) is required"
NO_CONNECTION_CODE = "NOETL_NO_CONNECTION"
"""The problem of a postgres tool that names no connection at all: NoETL takes such a playbook and fails the
step when it runs, so the front-end makes it a warning and a step that fails as NoETL's does."""


def _postgres(tool: Mapping[str, object], loc: str, problems: list[Problem]) -> dict[str, Any] | None:
    text = _sql_text(tool, loc, problems, "postgres")
    conn = connection_of(tool, loc, problems)
    if text is None or conn is None:
        return None
    return {"kind": "postgres", "command": text, **conn}


# --- duckdb -----------------------------------------------------------------------------------------------

NOETL_DUCKDB_DIR = Path(tempfile.gettempdir()) / "mcpipe-noetl"
"""Where a duckdb step without ``database`` keeps NoETL's database file of its execution."""


_DUCKDB_SECRET_TYPES = {"postgres": "postgres", "hmac": "gcs", "gcs": "gcs", "s3": "s3"}
"""NoETL's DuckDB secret types (``generate_duckdb_secrets``) and DuckDB's type for each."""


def _duckdb(tool: Mapping[str, object], loc: str, problems: list[Problem]) -> dict[str, Any] | None:
    secrets: list[dict[str, Any]] = []
    for field in ("auth", "credentials", "credential"):
        if tool.get(field) not in (None, {}, ""):
            secrets += _duckdb_secrets(tool[field], f"{loc}.{field}", problems)
    text = _sql_text(tool, loc, problems, "duckdb")
    if text is None:
        return None
    database = tool.get("database")
    if database is None:
        database = str(NOETL_DUCKDB_DIR / "duckdb_{{ execution_id }}.duckdb")
    step = {"kind": "duckdb", "commands": text, "database": database, "output": "noetl"}
    if secrets:
        step["secrets"] = secrets
    return step


def _duckdb_secrets(auth: object, where: str, problems: list[Problem]) -> list[dict[str, Any]]:
    """NoETL's DuckDB ``auth`` (an alias map, or one credential): the secrets to create, each
    ``{name, type, credential, scope}`` with the credential still a name (resolved when the step runs: a
    postgres one is the config's ``[sql.NAME]`` backend, the others ``NOETL_SECRET_<NAME>``)."""
    if isinstance(auth, str):
        auth = {"pg_db": {"type": "postgres", "key": auth}}
    if not isinstance(auth, Mapping):
        _problem(problems, where, "duckdb tool: `auth` maps aliases to credentials (`{alias: {type, key}}`)")
        return []
    if single_auth(auth):
        auth = {str(auth.get("secret_name") or auth.get("name") or "auth"): auth}
    out = []
    for alias, entry in auth.items():
        at = f"{where}.{alias}"
        if not isinstance(entry, Mapping):
            _problem(problems, at, "duckdb tool: an auth entry is `{type, key}` (or `credential`)")
            continue
        kind = str(entry.get("type") or entry.get("tool") or entry.get("service") or "")
        if kind not in _DUCKDB_SECRET_TYPES:
            why = "a `snowflake` secret (a cloud warehouse) has no DuckDB type here"
            if kind != "snowflake":
                why = f"secret type `{kind}` is not one of postgres, hmac, gcs, s3"
            _problem(problems, f"{at}.type", f"duckdb tool: {why}")
            continue
        key = entry.get("key") or entry.get("credential")
        if not isinstance(key, str) or not key.strip():
            _problem(problems, at, "duckdb tool: an auth entry names its credential (`key` or `credential`)")
            continue
        name = str(entry.get("secret_name") or alias)
        if not IDENT.match(name):
            _problem(problems, at, f"duckdb tool: `{name}` is not a secret name (letters, digits, `_`)")
            continue
        secret = {"name": name, "type": kind, "credential": key.strip()}
        if entry.get("scope") is not None:
            secret["scope"] = entry["scope"]
        out.append(secret)
    return out


# --- shell ------------------------------------------------------------------------------------------------


def _shell(tool: Mapping[str, Any], loc: str, problems: list[Problem]) -> dict[str, Any] | None:
    cmds = tool.get("cmds")
    if cmds is None:
        cmds = next(([tool[k]] for k in ("cmd", "command") if isinstance(tool.get(k), str) and tool[k].strip()), None)
    if isinstance(cmds, str):
        cmds = [cmds]
    if not isinstance(cmds, list) or not cmds:
        _problem(problems, f"{loc}.cmds", "shell tool: `cmds` (a list of shell programs) is required")
        return None
    step: dict[str, Any] = {"kind": "shell", "cmds": [c if isinstance(c, str) else str(c) for c in cmds]}
    env = tool.get("env")
    if env not in (None, {}):
        if not isinstance(env, Mapping):
            _problem(problems, f"{loc}.env", "shell tool: `env` must map names to values")
            return None
        step["env"] = dict(env)
    if tool.get("cwd"):
        step["cwd"] = tool["cwd"]
    seconds = tool.get("timeout_seconds", NOETL_SHELL_TIMEOUT_S)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        _problem(problems, f"{loc}.timeout_seconds", "shell tool: `timeout_seconds` must be a positive number")
        return None
    step["timeout_ms"] = float(seconds) * 1000 * len(step["cmds"])
    return step


_MAPPERS = {"python": _python, "postgres": _postgres, "duckdb": _duckdb, "shell": _shell}
