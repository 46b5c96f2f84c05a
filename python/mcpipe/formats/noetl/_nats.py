"""NoETL's ``nats`` tool (``noetl/tools/nats/executor.py``, 2026-01): the NATS key/value store, object store and
JetStream, on mcpipe's own NATS client (:mod:`mcpipe.backends.jetstream`).

A task names an ``operation`` and its fields, each a template NoETL renders before the call:
``kv_get``, ``kv_put``, ``kv_delete``, ``kv_purge``, ``kv_keys`` (``bucket``, ``key``, ``value``, ``pattern``);
``object_put``, ``object_get``, ``object_delete``, ``object_info``, ``object_list`` (``bucket``, ``name``,
``data``, ``encoding``); ``js_publish``, ``js_get_msg``, ``js_stream_info`` (``stream``, ``subject``, ``data``,
``headers``, ``seq``, ``last``). Each answers NoETL's result (``{status: success, bucket, key, value, revision,
created}`` for ``kv_get``, ``{status: not_found, ...}`` when the key is not there, ...; docs/playbooks.md has them
all).

Values are written as NoETL writes them (an object or a list as Python's ``json.dumps``, text as UTF-8, anything
else as Python's ``str``), and read back as it reads them. Each task connects, does its operation and closes, as
NoETL's does. The server is the credential's: ``auth`` names one (NoETL's credential store is the environment
here, ``NOETL_SECRET_<NAME>``, a JSON object with ``nats_url``/``url``, ``nats_user``/``user``,
``nats_password``/``password``, ``nats_token``/``token``), or the task gives ``nats_url`` as a constant; a URL
from a caller's value is never connected to.
"""

from __future__ import annotations

import base64
import fnmatch
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

from mcpipe._describe import did_you_mean, json_type
from mcpipe.errors import ErrorCode, Problem

__all__ = ["FIELDS", "OPERATIONS", "read_nats", "run_nats"]

OPERATIONS: dict[str, tuple[str, ...]] = {
    "kv_get": ("bucket", "key"),
    "kv_put": ("bucket", "key", "value"),
    "kv_delete": ("bucket", "key"),
    "kv_keys": ("bucket",),
    "kv_purge": ("bucket", "key"),
    "object_get": ("bucket", "name"),
    "object_put": ("bucket", "name", "data"),
    "object_delete": ("bucket", "name"),
    "object_list": ("bucket",),
    "object_info": ("bucket", "name"),
    "js_publish": ("stream", "subject", "data"),
    "js_get_msg": ("stream",),
    "js_stream_info": ("stream",),
}
"""NoETL's operations and the fields each one needs (its executor's positional arguments)."""

FIELDS = (
    "bucket",
    "key",
    "value",
    "ttl",
    "pattern",
    "name",
    "data",
    "encoding",
    "description",
    "stream",
    "subject",
    "headers",
    "seq",
    "last",
)
"""The fields NoETL's executor reads (each rendered when it holds a template)."""

IGNORED = {
    "ttl": "NoETL's `kv_put` never passes `ttl` on (nats-py's `put` has none)",
    "description": "NoETL's `object_put` never passes `description` on",
}
"""Fields NoETL's executor reads and then drops."""

TLS = ("tls_cert", "tls_key", "tls_ca")
CONNECTION = ("auth", "nats_url", "nats_user", "nats_password", "nats_token", *TLS)
TIMEOUT_S = 5.0
"""Each JetStream request's limit, nats-py's default (NoETL's client)."""

_CREDENTIAL = {
    "url": ("nats_url", "url", "server", "servers"),
    "user": ("nats_user", "user", "username"),
    "password": ("nats_password", "password"),
    "token": ("nats_token", "token"),
}
"""The parts of a NATS server's credential, each under its names (the first one there wins); a task's own
``nats_<part>`` constant wins over them all."""


def read_nats(
    config: Mapping[str, object], location: str, problems: list[Problem], code: str, warnings: list[str]
) -> dict[str, Any] | None:
    """A ``nats`` task's fields checked: its operation, the fields it needs, its connection. Answers the fields
    to render (``fields``), the operation (a constant, or a template checked when it runs) and the connection's
    constant parts; None when it has problems (added, located). What NoETL takes and never uses is a warning."""
    before = len(problems)

    def add(key: str, message: str) -> None:
        problems.append(Problem(f"{location}.{key}", code, message))

    for k, why in IGNORED.items():
        if k in config:
            warnings.append(f"{location}.{k}: {why}: ignored, as NoETL ignores it")
    for k in config:
        if k not in FIELDS and k not in CONNECTION and k not in ("operation", "input", "args", "timeout"):
            add(k, f"unknown field `{k}` of a `nats` tool{did_you_mean(k, FIELDS)}")
    operation = config.get("operation")
    if not isinstance(operation, str) or not operation:
        add("operation", "is required: the NATS operation (kv_get, kv_put, ...)")
        return None
    if "{{" not in operation and operation not in OPERATIONS:
        known = ", ".join(OPERATIONS)
        add(
            "operation", f"unknown NATS operation `{operation}`{did_you_mean(operation, OPERATIONS)} (NoETL's: {known})"
        )
        return None
    for name in OPERATIONS.get(operation, ()):
        if not config.get(name):  # NoETL's executor passes a field only when it is there (and not empty)
            add(name, f"is required by `{operation}`")
    if operation == "js_get_msg" and not (config.get("seq") or config.get("last") or config.get("subject")):
        add("seq", "`js_get_msg` needs `seq`, `last: true` or `subject`")
    if str(config.get("encoding")) == "binary":
        add("encoding", "`binary` gives bytes, which a result (JSON) cannot hold: use base64")
    url = config.get("nats_url")
    if url is not None and (not isinstance(url, str) or "{{" in url or "{%" in url):
        add("nats_url", "must be a constant URL (`nats://host:4222`): a server named by a template could be a caller's")
    auth = config.get("auth")
    if auth is not None and not isinstance(auth, str) and _credential_name(auth) is None:
        add("auth", f"must name a credential (a string), got {json_type(auth)}")
    if auth is None and url is None:
        add("auth", "is required: the credential of the NATS server (or a constant `nats_url`)")
    for k in TLS:
        if k in config:
            add(k, "TLS to NATS is not supported by mcpipe's NATS client")
    if len(problems) > before:
        return None
    fields = {k: config[k] for k in FIELDS if config.get(k)}
    constant = {k: config[k] for k in CONNECTION[1:5] if k in config}
    return {"operation": operation, "fields": fields, "auth": auth, "constant": constant}


def _credential_name(auth: object) -> str | None:
    if isinstance(auth, str):
        return auth
    if isinstance(auth, Mapping):
        for k in ("credential", "key", "name"):
            if isinstance(auth.get(k), str):
                return str(auth[k])
    return None


def server_url(auth: object, constant: Mapping[str, object], secret: Any, location: str) -> str:
    """The NATS URL to connect to: the task's own ``nats_*`` fields over the credential's (NoETL's
    ``resolve_nats_auth``: what the task gives wins), its user and password, or token, put in the URL.

    Raises:
        StepFailure: no URL, an URL that is not ``nats://``, or TLS asked for.
    """
    from mcpipe.results import StepFailure

    fields: dict[str, Any] = {}
    if auth is not None:
        name = _credential_name(auth)
        if not name:
            raise StepFailure(f"{location}.auth: names no credential (rendered to {auth!r})", ErrorCode.TOOL_FAILED)
        data = secret(name)
        if isinstance(data, str):
            data = {"nats_url": data}
        if not isinstance(data, Mapping):
            raise StepFailure(f"{location}.auth: credential `{name}` is not an object", ErrorCode.TOOL_FAILED)
        for key, names in _CREDENTIAL.items():
            found = [data[n] for n in names if data.get(n) is not None]
            if found:
                fields[key] = found[0]
        if any(data.get(k) for k in TLS):
            raise StepFailure(
                f"{location}.auth: credential `{name}` asks for TLS, which mcpipe's NATS client does not speak",
                ErrorCode.TOOL_FAILED,
            )
    for key in _CREDENTIAL:
        if constant.get(f"nats_{key}") is not None:
            fields[key] = constant[f"nats_{key}"]
    url = fields.get("url")
    if isinstance(url, list):
        url = url[0] if url else None
    if not isinstance(url, str) or not url:
        raise StepFailure(
            f"{location}: NATS URL is not configured. Use `auth: <credential_key>` or provide `nats_url` in the task "
            "configuration.",
            ErrorCode.TOOL_FAILED,
        )
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    if parts.scheme != "nats" or not parts.hostname:
        raise StepFailure(f"{location}: the NATS URL must be nats://host:port, got {url!r}", ErrorCode.TOOL_FAILED)
    host = f"{parts.hostname}:{parts.port or 4222}"
    user, password, token = fields.get("user"), fields.get("password"), fields.get("token")
    if user and password:
        return f"nats://{quote(str(user), safe='')}:{quote(str(password), safe='')}@{host}"
    if token:
        return f"nats://{quote(str(token), safe='')}@{host}"
    if parts.username:
        return f"nats://{parts.netloc}"
    return f"nats://{host}"


def encode(value: object, encoding: str = "utf-8") -> bytes:
    """A value as NoETL's ``kv_put``/``js_publish`` write it: an object or list as ``json.dumps``, text as is,
    anything else as Python's ``str``."""
    if isinstance(value, dict | list):
        return json.dumps(value).encode("utf-8")
    if isinstance(value, str):
        return value.encode(encoding)
    if isinstance(value, bytes):
        return value
    return str(value).encode(encoding)


def decode(data: bytes) -> Any:
    """A stored value as NoETL's ``kv_get`` reads it: UTF-8 text (None when empty), parsed as JSON when it is."""
    text = data.decode("utf-8") if data else None
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


async def run_nats(operation: str, f: Mapping[str, Any], js: Any, location: str) -> dict[str, Any]:
    """One operation on a connected :class:`~mcpipe.backends.jetstream.JetStream`, answering NoETL's result.

    Raises:
        StepFailure: what NoETL's executor raises (a missing bucket, an object that is not there, no keys...),
            located.
    """
    from mcpipe.backends.jetstream import JetStreamError
    from mcpipe.results import StepFailure

    def need(name: str) -> Any:
        if f.get(name) in (None, ""):
            raise StepFailure(
                f"{location}.{name}: `{operation}` needs `{name}` (it rendered empty)", ErrorCode.TOOL_FAILED
            )
        return f[name]

    def text(name: str) -> str:
        value = need(name)
        if not isinstance(value, str | int | float):
            raise StepFailure(f"{location}.{name}: must be text, got {json_type(value)}", ErrorCode.TOOL_FAILED)
        return str(value)

    try:
        if operation.startswith("kv_"):
            bucket = text("bucket")
            kv = await js.key_value(bucket)
            if operation == "kv_keys":
                keys = await kv.keys()
                if not keys:
                    raise StepFailure(f"{location}: nats: no keys found (bucket `{bucket}`)", ErrorCode.TOOL_ERROR)
                pattern = f.get("pattern")
                if pattern:
                    keys = [k for k in keys if fnmatch.fnmatch(k, str(pattern))]
                return {"status": "success", "bucket": bucket, "keys": keys, "count": len(keys)}
            key = text("key")
            done = {"status": "success", "bucket": bucket, "key": key}
            if operation == "kv_get":
                entry = await kv.get(key)
                if entry is None:
                    return {"status": "not_found", "bucket": bucket, "key": key, "value": None}
                # nats-py's KeyValue.get leaves `created` empty, so NoETL answers null
                return {**done, "value": decode(entry.value), "revision": entry.revision, "created": None}
            if operation == "kv_put":
                return {**done, "revision": await kv.put(key, encode(need("value")))}
            await (kv.delete(key) if operation == "kv_delete" else kv.purge(key))
            return done
        if operation.startswith("object_"):
            bucket = text("bucket")
            store = await js.object_store(bucket)
            encoding = str(f.get("encoding") or "utf-8")
            if operation == "object_list":
                objects = [{k: i.get(k) for k in ("name", "size", "mtime", "digest")} for i in await store.list()]
                return {"status": "success", "bucket": bucket, "objects": objects, "count": len(objects)}
            name = text("name")
            done = {"status": "success", "bucket": bucket, "name": name}
            if operation == "object_put":
                data = need("data")
                if encoding == "base64":
                    try:
                        raw = base64.b64decode(str(data), validate=True)
                    except ValueError:
                        raise StepFailure(f"{location}.data: is not base64", ErrorCode.TOOL_FAILED) from None
                else:
                    raw = encode(data, encoding) if isinstance(data, str) else str(data).encode(encoding)
                info = await store.put(name, raw)
                return {**done, "size": info["size"], "digest": info["digest"]}
            call = {"object_delete": store.delete, "object_info": store.info}.get(operation, store.get)
            got = await call(name)
            if got is None or got is False:
                raise StepFailure(f"{location}: nats: object not found (`{name}` in `{bucket}`)", ErrorCode.TOOL_ERROR)
            if operation == "object_delete":
                return done
            if operation == "object_info":
                return {**done, **{k: got.get(k) for k in ("size", "mtime", "digest", "chunks")}}
            raw = got[1]
            try:
                value = base64.b64encode(raw).decode("ascii") if encoding == "base64" else raw.decode(encoding)
            except (UnicodeDecodeError, LookupError) as e:
                raise StepFailure(
                    f"{location}.encoding: cannot decode the object: {e}", ErrorCode.TOOL_FAILED
                ) from None
            return {**done, "data": value, "size": len(raw)}
        stream = text("stream")
        if operation == "js_publish":
            headers = f.get("headers")
            if headers is not None and not isinstance(headers, Mapping):
                raise StepFailure(
                    f"{location}.headers: must be an object, got {json_type(headers)}", ErrorCode.TOOL_FAILED
                )
            hdrs = {str(k): str(v) for k, v in (headers or {}).items()}
            ack = await js.publish(text("subject"), encode(need("data")), hdrs or None)
            return {"status": "success", "stream": ack["stream"], "seq": ack["seq"], "duplicate": ack["duplicate"]}
        info = await js.stream_info(stream)
        if operation == "js_stream_info":
            config, state = info.get("config") or {}, info.get("state") or {}
            max_age = config.get("max_age")
            shown = {k: config.get(k) for k in ("name", "subjects", "retention", "max_msgs", "max_bytes", "max_age")}
            shown["subjects"] = list(config.get("subjects") or [])
            shown["retention"] = f"RetentionPolicy.{str(config.get('retention') or 'limits').upper()}"
            shown["max_age"] = max_age / 1e9 if isinstance(max_age, int | float) else None
            return {
                "status": "success",
                "stream": stream,
                "config": shown,
                "state": {k: state.get(k) for k in ("messages", "bytes", "first_seq", "last_seq", "consumer_count")},
            }
        seq = f.get("seq")
        if f.get("last"):
            msg = await js.get_msg(stream, seq=int((info.get("state") or {}).get("last_seq") or 0))
        elif seq:
            msg = await js.get_msg(stream, seq=int(seq))
        else:
            msg = await js.get_msg(stream, last_by_subject=text("subject"))
        return {
            "status": "success",
            "stream": stream,
            "subject": msg.subject,
            "seq": msg.seq,
            "data": decode(msg.data),
            "time": msg.time,
            "headers": dict(msg.headers) or None,
        }
    except JetStreamError as e:
        raise StepFailure(f"{location}: {e}", e.code) from None
