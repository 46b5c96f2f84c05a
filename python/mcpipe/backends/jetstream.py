"""JetStream over mcpipe's NATS client: streams, the key/value store and the object store.

JetStream's API is request/reply on ``$JS.API.*`` subjects (JSON in, JSON out); publishing to a stream's subject
with a reply inbox answers the stream's acknowledgement. On top of it, as every NATS client lays them out:

- a **key/value bucket** ``B`` is the stream ``KV_B`` on subjects ``$KV.B.<key>``: a value is the last message
  of its key's subject; a delete is a message with the header ``KV-Operation: DEL`` (``PURGE``, with
  ``Nats-Rollup: sub``, also drops the key's history);
- an **object store** ``B`` is the stream ``OBJ_B``: an object's chunks on ``$O.B.C.<nuid>``, and its
  description (JSON: name, size, chunks, ``SHA-256=`` digest, ...) as the last message of
  ``$O.B.M.<name in base64url>``.

The wire is the one nats-py and the Go client speak, so what this writes they read, and the other way round.
Listing keys or objects, and reading an object's chunks, use an ephemeral push consumer without acks that
delivers to an inbox of its own; it is read until the server's delivery says nothing is pending, and deleted
after. Everything is bounded: each request waits at most ``timeout_s``, a listing holds at most ``MAX_LISTED``
entries and an object read at most ``MAX_OBJECT_BYTES``.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
import trio

from mcpipe.backends.nats import NatsClient, NatsError, parse_header_block

__all__ = [
    "MAX_LISTED",
    "MAX_OBJECT_BYTES",
    "JetStream",
    "JetStreamError",
    "KeyValue",
    "KvEntry",
    "ObjectStore",
    "StoredMessage",
]

API = "$JS.API"
MAX_LISTED = 10_000
"""The most keys, objects or chunks one listing reads."""
MAX_OBJECT_BYTES = 16 * 1024 * 1024
"""The largest object read or written (NoETL's tool keeps a whole object in memory, and so does this)."""
CHUNK_BYTES = 128 * 1024
"""An object's chunk size (nats-py's and the Go client's default)."""

KV_OP = "KV-Operation"
ROLLUP = "Nats-Rollup"
_BUCKET = re.compile(r"^[a-zA-Z0-9_-]+$")
_KEY = re.compile(r"^[-/_=.a-zA-Z0-9]+$")
_NUID = string.ascii_letters + string.digits


class JetStreamError(NatsError):
    """A JetStream request failed: the server answered an API error (``status``: its HTTP-like code, 404 when
    the stream, message or consumer is not there; ``err_code``: JetStream's own), or a name was invalid."""

    def __init__(
        self, message: str, code: str | None = None, *, status: int | None = None, err_code: int | None = None
    ):
        super().__init__(message, code)
        self.status = status
        self.err_code = err_code

    @property
    def not_found(self) -> bool:
        return self.status == 404


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message kept in a stream: its subject, sequence, payload, headers and time (RFC 3339, when known)."""

    subject: str
    seq: int
    data: bytes
    headers: dict[str, str] = field(default_factory=dict)
    time: str | None = None


@dataclass(frozen=True, slots=True)
class KvEntry:
    """A key's current value: its bytes and revision (the stream sequence of the message that holds it)."""

    key: str
    value: bytes
    revision: int
    time: str | None = None


class JetStream:
    """JetStream's API on a connected :class:`~mcpipe.backends.nats.NatsClient`.

    Args:
        client: the connection (running).
        timeout_s: how long each request (and each message of a listing) may take.
    """

    def __init__(self, client: NatsClient, *, timeout_s: float = 5.0) -> None:
        self.client = client
        self.timeout_s = timeout_s

    async def request(self, api: str, body: Mapping[str, object] | None = None) -> dict[str, Any]:
        """``$JS.API.<api>`` with ``body`` as JSON; the answer decoded.

        Raises:
            JetStreamError: the server answered an error, JetStream is not enabled, or the answer is not JSON.
            NatsError: the connection failed or the server did not answer in time.
        """
        payload = orjson.dumps(body) if body is not None else b""
        try:
            msg = await self.client.request(f"{API}.{api}", payload, self.timeout_s)
        except NatsError as e:
            if "no responders" in str(e):
                where = self.client.shown_url
                raise JetStreamError(
                    f"JetStream is not enabled on the NATS server at {where} (nothing answers {API}.{api})",
                    "TOOL_FAILED",
                ) from None
            raise
        return _answer(msg.data, f"{API}.{api}")

    async def publish(self, subject: str, data: bytes, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Publish into the stream that holds ``subject`` and wait for its acknowledgement
        (``{stream, seq, duplicate}``).

        Raises:
            JetStreamError: no stream holds the subject, or the stream refused the message.
        """
        try:
            msg = await self.client.request(subject, data, self.timeout_s, headers=dict(headers) if headers else None)
        except NatsError as e:
            if "no responders" in str(e):
                raise JetStreamError(
                    f"no JetStream stream holds subject '{subject}'", "TOOL_ERROR", status=503
                ) from None
            raise
        ack = _answer(msg.data, subject)
        return {"stream": ack.get("stream"), "seq": int(ack.get("seq") or 0), "duplicate": bool(ack.get("duplicate"))}

    async def stream_info(self, stream: str) -> dict[str, Any]:
        """The stream's ``config`` and ``state``."""
        _check_name(stream, "stream")
        return await self.request(f"STREAM.INFO.{stream}")

    async def add_stream(self, config: Mapping[str, object]) -> dict[str, Any]:
        """Create a stream (``config`` as JetStream takes it: ``name``, ``subjects``, ...)."""
        name = str(config.get("name"))
        _check_name(name, "stream")
        return await self.request(f"STREAM.CREATE.{name}", config)

    async def purge(self, stream: str, subject: str | None = None) -> None:
        """Drop the stream's messages (only those on ``subject`` when given)."""
        await self.request(f"STREAM.PURGE.{stream}", {"filter": subject} if subject else None)

    async def get_msg(
        self, stream: str, *, seq: int | None = None, last_by_subject: str | None = None
    ) -> StoredMessage:
        """A stored message: by sequence, or the last one on a subject.

        Raises:
            JetStreamError: there is none (``not_found``), or the stream is not there.
        """
        body: dict[str, Any] = {"last_by_subj": last_by_subject} if last_by_subject is not None else {"seq": seq}
        answer = await self.request(f"STREAM.MSG.GET.{stream}", body)
        m = answer.get("message") or {}
        headers: dict[str, str] = {}
        if m.get("hdrs"):
            _status, _desc, headers = parse_header_block(base64.b64decode(m["hdrs"]))
        return StoredMessage(
            str(m.get("subject", "")),
            int(m.get("seq") or 0),
            base64.b64decode(m.get("data") or ""),
            headers,
            m.get("time"),
        )

    async def consume(
        self,
        stream: str,
        subject: str,
        *,
        last_per_subject: bool,
        headers_only: bool = False,
        limit: int = MAX_LISTED,
    ) -> list[StoredMessage]:
        """The stream's messages on ``subject`` (a filter, wildcards allowed), in order: each subject's last one
        (``last_per_subject``) or all, through an ephemeral push consumer delivering to an inbox of its own.

        Raises:
            JetStreamError: more than ``limit`` messages (``LIMIT_EXCEEDED``), or a message did not come within
                ``timeout_s`` (``TIMEOUT``).
        """
        inbox = f"_INBOX.{secrets.token_hex(11)}"
        config = {
            "deliver_subject": inbox,
            "deliver_policy": "last_per_subject" if last_per_subject else "all",
            "ack_policy": "none",
            "replay_policy": "instant",
            "filter_subject": subject,
            "headers_only": headers_only,
            "mem_storage": True,
            "num_replicas": 1,
            "inactive_threshold": int(max(self.timeout_s, 5.0) * 1e9),
        }
        out: list[StoredMessage] = []
        async with self.client.subscribe(inbox, max_pending=limit + 1) as messages:
            info = await self.request(f"CONSUMER.CREATE.{stream}", {"stream_name": stream, "config": config})
            name = str(info.get("name") or "")
            try:
                pending = int(info.get("num_pending") or 0)
                delivered = int((info.get("delivered") or {}).get("consumer_seq") or 0)
                if pending + delivered > limit:
                    raise JetStreamError(
                        f"stream {stream} holds more than {limit} messages on '{subject}'", "LIMIT_EXCEEDED"
                    )
                if pending == 0 and delivered == 0:
                    return out
                while True:
                    with trio.move_on_after(self.timeout_s):
                        msg = await messages.receive()
                        meta = _delivery(msg.reply)
                        if meta is None:
                            continue  # a status message (heartbeat, flow control): not a stored message
                        sseq, stamp, left = meta
                        out.append(StoredMessage(msg.subject, sseq, msg.data, dict(msg.headers), stamp))
                        if left == 0:
                            return out
                        if len(out) >= limit:
                            raise JetStreamError(
                                f"stream {stream} holds more than {limit} messages on '{subject}'", "LIMIT_EXCEEDED"
                            )
                        continue
                    raise JetStreamError(
                        f"stream {stream}: a message on '{subject}' did not come within {self.timeout_s:g} s", "TIMEOUT"
                    )
            finally:
                if name and not self.client.closed:
                    with trio.CancelScope(shield=True), trio.move_on_after(min(self.timeout_s, 2.0)):
                        try:
                            await self.request(f"CONSUMER.DELETE.{stream}.{name}")
                        except NatsError:
                            pass  # it is ephemeral: the server drops it after inactive_threshold anyway

    async def key_value(self, bucket: str) -> KeyValue:
        """The key/value bucket ``bucket`` (it must exist).

        Raises:
            JetStreamError: an invalid name, no such bucket (``not_found``), or a stream that is not a bucket.
        """
        if not _BUCKET.match(bucket):
            raise JetStreamError(f"invalid key/value bucket name {bucket!r} (letters, digits, `_`, `-`)", "TOOL_ERROR")
        try:
            info = await self.stream_info(f"KV_{bucket}")
        except JetStreamError as e:
            if e.not_found:
                raise JetStreamError(
                    f"no key/value bucket `{bucket}` (no stream KV_{bucket})", "TOOL_ERROR", status=404
                ) from None
            raise
        if int((info.get("config") or {}).get("max_msgs_per_subject") or 0) < 1:
            raise JetStreamError(f"stream KV_{bucket} is not a key/value bucket", "TOOL_ERROR")
        return KeyValue(self, bucket)

    async def create_key_value(self, bucket: str, *, history: int = 1, storage: str = "file") -> KeyValue:
        """Create the key/value bucket ``bucket`` (as nats-py's ``create_key_value`` lays it out)."""
        if not _BUCKET.match(bucket):
            raise JetStreamError(f"invalid key/value bucket name {bucket!r} (letters, digits, `_`, `-`)", "TOOL_ERROR")
        await self.add_stream(
            {
                "name": f"KV_{bucket}",
                "subjects": [f"$KV.{bucket}.>"],
                "max_msgs_per_subject": history,
                "discard": "new",
                "deny_delete": True,
                "allow_rollup_hdrs": True,
                "allow_direct": True,
                "storage": storage,
                "num_replicas": 1,
                "duplicate_window": 120 * 10**9,
            }
        )
        return KeyValue(self, bucket)

    async def object_store(self, bucket: str) -> ObjectStore:
        """The object store ``bucket`` (it must exist).

        Raises:
            JetStreamError: an invalid name, or no such store (``not_found``).
        """
        if not _BUCKET.match(bucket):
            raise JetStreamError(f"invalid object store name {bucket!r} (letters, digits, `_`, `-`)", "TOOL_ERROR")
        try:
            await self.stream_info(f"OBJ_{bucket}")
        except JetStreamError as e:
            if e.not_found:
                raise JetStreamError(
                    f"no object store `{bucket}` (no stream OBJ_{bucket})", "TOOL_ERROR", status=404
                ) from None
            raise
        return ObjectStore(self, bucket)

    async def create_object_store(self, bucket: str, *, storage: str = "file") -> ObjectStore:
        """Create the object store ``bucket`` (as nats-py's ``create_object_store`` lays it out)."""
        if not _BUCKET.match(bucket):
            raise JetStreamError(f"invalid object store name {bucket!r} (letters, digits, `_`, `-`)", "TOOL_ERROR")
        await self.add_stream(
            {
                "name": f"OBJ_{bucket}",
                "subjects": [f"$O.{bucket}.C.>", f"$O.{bucket}.M.>"],
                "discard": "new",
                "allow_rollup_hdrs": True,
                "allow_direct": True,
                "storage": storage,
                "num_replicas": 1,
            }
        )
        return ObjectStore(self, bucket)


class KeyValue:
    """A key/value bucket (see the module): get, put, delete, purge and list its keys."""

    def __init__(self, js: JetStream, bucket: str) -> None:
        self.js = js
        self.bucket = bucket
        self.stream = f"KV_{bucket}"
        self.prefix = f"$KV.{bucket}."

    def _subject(self, key: str) -> str:
        if not _KEY.match(key) or key.startswith(".") or key.endswith("."):
            raise JetStreamError(f"invalid key {key!r} (letters, digits and `-/_=.`, not at an end)", "TOOL_ERROR")
        return self.prefix + key

    async def get(self, key: str) -> KvEntry | None:
        """The key's value, or None when it was never put, or was deleted or purged."""
        subject = self._subject(key)
        try:
            m = await self.js.get_msg(self.stream, last_by_subject=subject)
        except JetStreamError as e:
            if e.not_found:
                return None
            raise
        if m.subject != subject or m.headers.get(KV_OP) in ("DEL", "PURGE"):
            return None
        return KvEntry(key, m.data, m.seq, m.time)

    async def put(self, key: str, value: bytes) -> int:
        """Set the key; its new revision."""
        ack = await self.js.publish(self._subject(key), value)
        return int(ack["seq"])

    async def delete(self, key: str) -> None:
        """Mark the key deleted (its history stays, up to the bucket's)."""
        await self.js.publish(self._subject(key), b"", {KV_OP: "DEL"})

    async def purge(self, key: str) -> None:
        """Delete the key and drop its history."""
        await self.js.publish(self._subject(key), b"", {KV_OP: "PURGE", ROLLUP: "sub"})

    async def keys(self) -> list[str]:
        """The keys that hold a value, in the order of their last change."""
        found = await self.js.consume(self.stream, f"{self.prefix}>", last_per_subject=True, headers_only=True)
        return [m.subject[len(self.prefix) :] for m in found if m.headers.get(KV_OP) not in ("DEL", "PURGE")]


class ObjectStore:
    """An object store (see the module): put, get, describe, delete and list objects."""

    def __init__(self, js: JetStream, bucket: str) -> None:
        self.js = js
        self.bucket = bucket
        self.stream = f"OBJ_{bucket}"

    def _meta_subject(self, name: str) -> str:
        if not name:
            raise JetStreamError("an object needs a name", "TOOL_ERROR")
        return f"$O.{self.bucket}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"

    async def info(self, name: str, *, show_deleted: bool = False) -> dict[str, Any] | None:
        """The object's description (``name``, ``size``, ``chunks``, ``digest``, ``mtime``, ``nuid``, ...), or None
        when there is no such object (or it was deleted)."""
        try:
            m = await self.js.get_msg(self.stream, last_by_subject=self._meta_subject(name))
        except JetStreamError as e:
            if e.not_found:
                return None
            raise
        try:
            info = orjson.loads(m.data)
        except orjson.JSONDecodeError:
            raise JetStreamError(
                f"object `{name}` of store `{self.bucket}` has a malformed description", "TOOL_ERROR"
            ) from None
        if not isinstance(info, dict) or (info.get("deleted") and not show_deleted):
            return None
        info.setdefault("mtime", m.time)
        return info

    async def put(self, name: str, data: bytes) -> dict[str, Any]:
        """Store ``data`` as ``name`` (replacing an object of that name); the object's description.

        Raises:
            JetStreamError: ``data`` is larger than :data:`MAX_OBJECT_BYTES` (``LIMIT_EXCEEDED``), or the store
                refused a chunk (the chunks sent are dropped again).
        """
        meta_subject = self._meta_subject(name)
        if len(data) > MAX_OBJECT_BYTES:
            raise JetStreamError(f"the object is {len(data)} bytes; the most is {MAX_OBJECT_BYTES}", "LIMIT_EXCEEDED")
        old = await self.info(name)
        nuid = "".join(secrets.choice(_NUID) for _ in range(22))
        chunk_subject = f"$O.{self.bucket}.C.{nuid}"
        digest = hashlib.sha256()
        chunks = 0
        info = {
            "name": name,
            "bucket": self.bucket,
            "nuid": nuid,
            "size": len(data),
            "mtime": datetime.now(UTC).isoformat(),
            "chunks": 0,
            "digest": "",
            "options": {"max_chunk_size": CHUNK_BYTES},
        }
        try:
            for start in range(0, len(data), CHUNK_BYTES):
                part = data[start : start + CHUNK_BYTES]
                digest.update(part)
                await self.js.publish(chunk_subject, part)
                chunks += 1
            info["chunks"] = chunks
            info["digest"] = "SHA-256=" + base64.urlsafe_b64encode(digest.digest()).decode()
            await self.js.publish(meta_subject, orjson.dumps(info), {ROLLUP: "sub"})
        except BaseException:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                try:
                    await self.js.purge(self.stream, chunk_subject)
                except NatsError:
                    pass  # the failure being reported matters more than this cleanup
            raise
        if old is not None and old.get("nuid"):
            await self.js.purge(self.stream, f"$O.{self.bucket}.C.{old['nuid']}")
        return info

    async def get(self, name: str) -> tuple[dict[str, Any], bytes] | None:
        """The object's description and its bytes (checked against its digest), or None when there is none.

        Raises:
            JetStreamError: larger than :data:`MAX_OBJECT_BYTES` (``LIMIT_EXCEEDED``), a link to another store
                (not followed), or the bytes do not match the digest.
        """
        info = await self.info(name)
        if info is None:
            return None
        if (info.get("options") or {}).get("link"):
            raise JetStreamError(f"object `{name}` is a link to another store, which is not followed", "TOOL_ERROR")
        size = int(info.get("size") or 0)
        if size > MAX_OBJECT_BYTES:
            raise JetStreamError(
                f"object `{name}` is {size} bytes; the most read is {MAX_OBJECT_BYTES}", "LIMIT_EXCEEDED"
            )
        if size == 0:
            return info, b""
        chunks = await self.js.consume(
            self.stream,
            f"$O.{self.bucket}.C.{info.get('nuid')}",
            last_per_subject=False,
            limit=int(info.get("chunks") or 0) + 1,
        )
        data = b"".join(m.data for m in chunks)
        want = str(info.get("digest") or "")
        got = "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()
        if want.upper() != got.upper() or len(data) != size:
            raise JetStreamError(f"object `{name}` of store `{self.bucket}` does not match its digest", "TOOL_ERROR")
        return info, data

    async def delete(self, name: str) -> bool:
        """Mark the object deleted and drop its chunks; False when there was no such object."""
        info = await self.info(name)
        if info is None:
            return False
        nuid = info.get("nuid")
        info.update(deleted=True, size=0, chunks=0, digest="", mtime="")
        try:
            await self.js.publish(self._meta_subject(name), orjson.dumps(info), {ROLLUP: "sub"})
        finally:
            if nuid:
                await self.js.purge(self.stream, f"$O.{self.bucket}.C.{nuid}")
        return True

    async def list(self) -> list[dict[str, Any]]:
        """The objects' descriptions (deleted ones left out), in the order of their last change."""
        found = await self.js.consume(self.stream, f"$O.{self.bucket}.M.>", last_per_subject=True)
        out = []
        for m in found:
            try:
                info = orjson.loads(m.data)
            except orjson.JSONDecodeError:
                continue  # not a description: nothing any client could read either
            if isinstance(info, dict) and not info.get("deleted"):
                info.setdefault("mtime", m.time)
                out.append(info)
        return out


def _answer(data: bytes, subject: str) -> dict[str, Any]:
    try:
        answer = orjson.loads(data) if data else {}
    except orjson.JSONDecodeError:
        raise JetStreamError(f"the answer on '{subject}' is not JSON: {data[:80]!r}", "TOOL_FAILED") from None
    if not isinstance(answer, dict):
        raise JetStreamError(f"the answer on '{subject}' is not a JSON object", "TOOL_FAILED")
    err = answer.get("error")
    if isinstance(err, dict):
        status = err.get("code")
        raise JetStreamError(
            f"JetStream: {err.get('description') or 'error'} ({subject})",
            "TOOL_ERROR",
            status=int(status) if isinstance(status, int) else None,
            err_code=err.get("err_code") if isinstance(err.get("err_code"), int) else None,
        )
    return answer


def _check_name(name: str, what: str) -> None:
    if not name or any(c in name for c in " .*>\t\r\n"):
        raise JetStreamError(f"invalid {what} name {name!r}", "TOOL_ERROR")


def _delivery(reply: str | None) -> tuple[int, str | None, int] | None:
    """``(stream sequence, time, pending)`` from a push consumer's ``$JS.ACK...`` reply subject (both its
    layouts: 9 tokens, and 12 with a domain and an account hash), or None for anything else."""
    if not reply or not reply.startswith("$JS.ACK."):
        return None
    t = reply.split(".")
    if len(t) == 9:
        sseq, stamp, pending = t[5], t[7], t[8]
    elif len(t) >= 12:
        sseq, stamp, pending = t[7], t[9], t[10]
    else:
        return None
    try:
        when = datetime.fromtimestamp(int(stamp) / 1e9, UTC).isoformat()
        return int(sseq), when, int(pending)
    except ValueError:
        return None
