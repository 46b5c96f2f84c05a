"""Content stores: bytes a pipeline stores (its ``store_content`` steps) and clients read back as resources.

Content is addressed by its BLAKE3 hash (``hash:<hex>``), or by an alias a writer gives it
(``alias:<session>:<name>``), and carries its MIME type, when it was stored, when it expires and who owns it:
the session that stored it (``session_id``, no other session may read it, as in mcpg) and the principal
(``tenant_id``, no other principal may read it). Content with an owner is addressed by the hash of its owner
and its bytes (``content_hash`` stays the bytes' own), so two owners storing the same bytes keep two records
and neither can take over the other's (its owner or its expiry); an alias of a caller without a session is
named by its principal (``alias:~<principal>:<name>``), and an alias another owner holds is never
overwritten (:class:`AliasTaken`). Two kinds:

- ``memory``: in this process, the least recently stored dropped first past ``max_bytes``;
- ``file_system``: under ``root``, in the layout of mcpg's file-system store (``mcpg-backend-llm-shared``
  ``content_store_fs.rs``), so content mcpg stored there is served as it is and mcpg reads what mcpipe stores:
  ``blobs/<h[:2]>/<h[2:4]>/<h>`` (the bytes), ``meta/<h[:2]>/<h[2:4]>/<h>.json`` (``mime_type``, ``stored_at``,
  ``expires_at``, ``session_id``, ``tenant_id``, ``size_bytes``), ``aliases/<base64url(alias)>.json``
  (``target_hash``, ``expires_at``); files are written to a temporary name and renamed; the index is rebuilt
  from ``meta/`` when the store opens.

A store is read through :class:`ContentStores` (its URIs: ``<scheme>://<store>/<id>``, the default store's as
``<scheme>://<id>``); its file operations run in worker threads.
"""

from __future__ import annotations

import base64
import os
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import orjson
import trio

from mcpipe.store._contentconfig import ContentConfig

__all__ = [
    "AliasTaken",
    "Content",
    "ContentStore",
    "ContentStores",
    "ContentTooLarge",
    "FileContentStore",
    "MemoryContentStore",
    "StoreUnopenable",
    "Stored",
    "open_content_stores",
]

_THREADS = trio.CapacityLimiter(4)


class ContentTooLarge(ValueError):
    """Content bigger than its store may hold at all."""


class AliasTaken(ValueError):
    """An alias that names content another owner (session or principal) stored."""


class StoreUnopenable(OSError):
    """A file store whose root cannot be made or read: ``store`` names it."""

    def __init__(self, store: str, reason: str) -> None:
        super().__init__(reason)
        self.store = store


@dataclass(frozen=True, slots=True)
class Content:
    """Stored bytes with what is known of them."""

    data: bytes
    mime_type: str
    stored_at: datetime
    expires_at: datetime | None = None
    session_id: str | None = None
    tenant_id: str | None = None

    def readable_by(self, session_id: str | None, tenant_id: str | None) -> bool:
        """Whether a caller of this session and principal may read it: its owners, if any, are the caller's."""
        return (self.session_id is None or self.session_id == session_id) and (
            self.tenant_id is None or self.tenant_id == tenant_id
        )


@dataclass(frozen=True, slots=True)
class Stored:
    """What a store answers a write: the content's id and facts."""

    id: str
    size_bytes: int
    mime_type: str
    content_hash: str
    expires_at: datetime | None


class ContentStore(Protocol):
    """Where content lives."""

    def put(
        self, data: bytes, mime_type: str, *, ttl_s: float | None = None, session_id: str | None = None,
        alias: str | None = None, tenant_id: str | None = None,
    ) -> Stored:  # fmt: skip
        """Store ``data``, owned by ``session_id`` and ``tenant_id`` when given (blocking: call from a worker
        thread).

        Raises:
            ContentTooLarge: more than the store may hold.
            AliasTaken: ``alias`` names content another owner stored.
        """
        ...

    def get(self, content_id: str) -> Content | None:
        """The content of ``hash:<hex>``, ``alias:…`` or a bare hex id; None when absent or expired (blocking)."""
        ...


def _hash(data: bytes) -> str:
    import blake3

    return str(blake3.blake3(data).hexdigest())


def _key(data: bytes, session_id: str | None, tenant_id: str | None) -> tuple[str, str]:
    """``(key, digest)``: where content of these owners is kept, and its bytes' own hash (the same when it has
    no owner)."""
    import blake3

    digest = _hash(data)
    if session_id is None and tenant_id is None:
        return digest, digest
    owned = blake3.blake3(b"mcpipe-owned-content\0" + orjson.dumps([session_id, tenant_id]) + b"\0" + data)
    return str(owned.hexdigest()), digest


def _alias_id(alias: str, session_id: str | None, tenant_id: str | None = None) -> str:
    if session_id is None and tenant_id is not None:
        return f"alias:~{tenant_id}:{alias}"
    return f"alias:{session_id or '__no_session__'}:{alias}"


def _taken(alias_id: str, prior: Any, session_id: str | None, tenant_id: str | None) -> None:
    """Refuse to point ``alias_id`` elsewhere when the content it names has another owner (a session id a
    caller chose could otherwise reach another's alias)."""
    if prior is not None and (prior[0], prior[1]) != (session_id, tenant_id):
        raise AliasTaken(f"the alias `{alias_id}` belongs to another session or principal")


def _hex_id(content_id: str) -> str | None:
    rest = content_id.removeprefix("hash:")
    return rest if rest and all(c in "0123456789abcdefABCDEF" for c in rest) else None


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


class MemoryContentStore:
    """Content in this process, the oldest dropped first past ``max_bytes`` (256 MiB by default)."""

    def __init__(self, max_bytes: int = 256 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._items: dict[str, Content] = {}
        self._aliases: dict[str, str] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def put(
        self, data: bytes, mime_type: str, *, ttl_s: float | None = None, session_id: str | None = None,
        alias: str | None = None, tenant_id: str | None = None,
    ) -> Stored:  # fmt: skip
        if self.max_bytes and len(data) > self.max_bytes:
            raise ContentTooLarge(f"{len(data)} bytes is more than the store's limit of {self.max_bytes}")
        key, digest = _key(data, session_id, tenant_id)
        now = datetime.now(UTC)
        expires = now + timedelta(seconds=ttl_s) if ttl_s is not None else None
        with self._lock:
            content_id = f"hash:{key}"
            if alias is not None:
                content_id = _alias_id(alias, session_id, tenant_id)
                held = self._items.get(self._aliases.get(content_id, ""))
                _taken(content_id, None if held is None else (held.session_id, held.tenant_id), session_id, tenant_id)
            prior = self._items.pop(key, None)
            if prior is not None:
                self._bytes -= len(prior.data)
            self._items[key] = Content(data, mime_type, now, expires, session_id, tenant_id)
            self._bytes += len(data)
            if alias is not None:
                self._aliases[content_id] = key
            while self.max_bytes and self._bytes > self.max_bytes and len(self._items) > 1:
                oldest = next(iter(self._items))
                self._bytes -= len(self._items.pop(oldest).data)
                self._aliases = {a: h for a, h in self._aliases.items() if h != oldest}
        return Stored(content_id, len(data), mime_type, f"blake3:{digest}", expires)

    def get(self, content_id: str) -> Content | None:
        with self._lock:
            digest = self._aliases.get(content_id) if content_id.startswith("alias:") else _hex_id(content_id)
            found = self._items.get(digest) if digest is not None else None
            if found is not None and found.expires_at is not None and found.expires_at <= datetime.now(UTC):
                self._bytes -= len(self._items.pop(digest or "").data)
                return None
            return found


class FileContentStore:
    """Content under ``root`` in mcpg's file-system layout (see the module), at most ``max_bytes`` (8 GiB by
    default: the oldest stored dropped first past it)."""

    def __init__(self, root: str | os.PathLike[str], max_bytes: int = 8 * 1024**3) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        for sub in ("blobs", "meta", "aliases"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._meta: dict[str, dict[str, Any]] = {}
        self._aliases: dict[str, str] = {}
        self._bytes = 0
        for path in (self.root / "meta").glob("*/*/*.json"):
            try:
                meta = orjson.loads(path.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                continue  # a half-written file of a crash: it is swept with its blob
            self._meta[path.stem] = meta
            self._bytes += int(meta.get("size_bytes") or 0)
        for path in (self.root / "aliases").glob("*.json"):
            try:
                alias = base64.urlsafe_b64decode(path.stem + "=" * (-len(path.stem) % 4)).decode()
                record = orjson.loads(path.read_bytes())
            except (OSError, ValueError, orjson.JSONDecodeError):
                continue
            if record.get("target_hash") in self._meta:
                self._aliases[alias] = record["target_hash"]

    def _blob(self, digest: str) -> Path:
        return self.root / "blobs" / digest[:2] / digest[2:4] / digest

    def _meta_path(self, digest: str) -> Path:
        return self.root / "meta" / digest[:2] / digest[2:4] / f"{digest}.json"

    def _alias_path(self, alias_id: str) -> Path:
        return self.root / "aliases" / f"{base64.urlsafe_b64encode(alias_id.encode()).decode().rstrip('=')}.json"

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp.{secrets.token_hex(4)}")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def put(
        self, data: bytes, mime_type: str, *, ttl_s: float | None = None, session_id: str | None = None,
        alias: str | None = None, tenant_id: str | None = None,
    ) -> Stored:  # fmt: skip
        if self.max_bytes and len(data) > self.max_bytes:
            raise ContentTooLarge(f"{len(data)} bytes is more than the store's limit of {self.max_bytes}")
        digest, content_hash = _key(data, session_id, tenant_id)
        now = datetime.now(UTC)
        expires = now + timedelta(seconds=ttl_s) if ttl_s is not None else None
        meta: dict[str, Any] = {"mime_type": mime_type, "stored_at": _iso(now)}
        if expires is not None:
            meta["expires_at"] = _iso(expires)
        if session_id is not None:
            meta["session_id"] = session_id
        if tenant_id is not None:
            meta["tenant_id"] = tenant_id
        meta["size_bytes"] = len(data)
        if alias is not None:
            alias_id = _alias_id(alias, session_id, tenant_id)
            with self._lock:
                held = self._meta.get(self._aliases.get(alias_id, ""))
            _taken(alias_id, None if held is None else (held.get("session_id"), held.get("tenant_id")), session_id,
                   tenant_id)  # fmt: skip
        if not self._blob(digest).exists():
            self._write(self._blob(digest), data)
        self._write(self._meta_path(digest), orjson.dumps(meta))
        content_id = f"hash:{digest}"
        with self._lock:
            prior = self._meta.pop(digest, None)
            self._bytes += len(data) - int((prior or {}).get("size_bytes") or 0)
            self._meta[digest] = meta
        if alias is not None:
            content_id = _alias_id(alias, session_id, tenant_id)
            record: dict[str, Any] = {"target_hash": digest}
            if expires is not None:
                record["expires_at"] = _iso(expires)
            with self._lock:  # checked again: another owner's writer may have come in between
                held = self._meta.get(self._aliases.get(content_id, ""))
                _taken(content_id, None if held is None else (held.get("session_id"), held.get("tenant_id")),
                       session_id, tenant_id)  # fmt: skip
                self._write(self._alias_path(content_id), orjson.dumps(record))
                self._aliases[content_id] = digest
        self._evict()
        return Stored(content_id, len(data), mime_type, f"blake3:{content_hash}", expires)

    def _evict(self) -> None:
        with self._lock:
            if not self.max_bytes or self._bytes <= self.max_bytes:
                return
            by_age = sorted(self._meta, key=lambda h: (str(self._meta[h].get("stored_at")), h))
        for digest in by_age:
            with self._lock:
                if self._bytes <= self.max_bytes:
                    return
            self._remove(digest)

    def _remove(self, digest: str) -> None:
        with self._lock:
            meta = self._meta.pop(digest, None)
            if meta is not None:
                self._bytes -= int(meta.get("size_bytes") or 0)
            dead = [a for a, h in self._aliases.items() if h == digest]
            for a in dead:
                del self._aliases[a]
        for path in (self._blob(digest), self._meta_path(digest), *(self._alias_path(a) for a in dead)):
            path.unlink(missing_ok=True)

    def get(self, content_id: str) -> Content | None:
        with self._lock:
            digest = self._aliases.get(content_id) if content_id.startswith("alias:") else _hex_id(content_id)
            meta = self._meta.get(digest) if digest is not None else None
        if meta is None or digest is None:
            return None
        expires = _parse_time(meta.get("expires_at"))
        if expires is not None and expires <= datetime.now(UTC):
            self._remove(digest)
            return None
        try:
            data = self._blob(digest).read_bytes()
        except OSError:
            return None
        stored = _parse_time(meta.get("stored_at")) or datetime.now(UTC)
        return Content(
            data, str(meta.get("mime_type") or "application/octet-stream"), stored, expires,
            meta.get("session_id"), meta.get("tenant_id"),
        )  # fmt: skip


class ContentStores:
    """The configured content stores, by id, and the URIs their content is read at.

    Args:
        stores: id -> store.
        default: the store content goes to (and a URI without a store id reads from).
        scheme: the URIs' scheme (``mcpg-resource`` for an mcpg config, else ``mcpipe-content``).
    """

    def __init__(self, stores: Mapping[str, Any], default: str, scheme: str = "mcpipe-content") -> None:
        self.stores = dict(stores)
        self.default = default
        self.scheme = scheme

    def uri(self, store: str, content_id: str) -> str:
        """Where content of ``store`` is read."""
        if store == self.default:
            return f"{self.scheme}://{content_id}"
        return f"{self.scheme}://{store}/{content_id}"

    def owns(self, uri: str) -> bool:
        return uri.startswith(f"{self.scheme}://")

    def parse(self, uri: str) -> tuple[str, str]:
        """``(store, id)`` of a content URI (``<scheme>://<store>/<id>``, or ``<scheme>://<id>`` of the default
        store)."""
        body = uri.removeprefix(f"{self.scheme}://")
        store, sep, rest = body.partition("/")
        if sep and store and ":" not in store:
            return store, rest
        return self.default, body

    async def put(
        self, data: bytes, mime_type: str, *, store: str | None = None, ttl_s: float | None = None,
        session_id: str | None = None, alias: str | None = None, tenant_id: str | None = None,
    ) -> tuple[str, Stored]:  # fmt: skip
        """Store ``data``, owned by ``session_id`` and ``tenant_id`` when given; answers its URI and facts."""
        name = store or self.default
        target = self.stores[name]
        stored = await trio.to_thread.run_sync(
            lambda: target.put(data, mime_type, ttl_s=ttl_s, session_id=session_id, alias=alias, tenant_id=tenant_id),
            limiter=_THREADS,
        )
        return self.uri(name, stored.id), stored

    async def get(self, uri: str) -> Content | None:
        """The content a URI names (None: no such store, or absent, or expired)."""
        name, content_id = self.parse(uri)
        target = self.stores.get(name)
        if target is None:
            return None
        return await trio.to_thread.run_sync(target.get, content_id, limiter=_THREADS)


def open_content_stores(config: ContentConfig, base_dir: str = ".") -> ContentStores | None:
    """The stores of a ``content`` section, or None when it has none.

    Raises:
        StoreUnopenable: a file store's root cannot be made or read.
    """
    if not config.stores:
        return None
    stores: dict[str, ContentStore] = {}
    for name, c in config.stores.items():
        if c.kind == "file_system":
            if not c.root:  # the config's checks say so, located; a section built in code is refused here
                raise StoreUnopenable(name, "a file_system store needs its `root` directory")
            root = c.root if os.path.isabs(c.root) else os.path.join(base_dir, c.root)
            try:
                stores[name] = FileContentStore(root, c.max_bytes or 8 * 1024**3)
            except OSError as e:
                raise StoreUnopenable(name, f"cannot open the store at {root}: {e.strerror or e}") from None
        else:
            stores[name] = MemoryContentStore(c.max_bytes or 256 * 1024 * 1024)
    return ContentStores(stores, config.default, config.scheme)
