"""Where mcpipe keeps what it holds as an OAuth client of downstream servers: each principal's tokens per
server, its client registrations, and the sign-ins under way (``[oauth] store``; ``docs/access.md``).

Three stores behind one small interface (:class:`TokenStore`: ``get``, ``put``, ``delete``, ``keys``), chosen
by URL: ``memory://`` (this process), ``sqlite:///PATH`` (a file: tokens survive a restart), ``redis://...``
(shared by every instance, so a sign-in's callback may land on any of them).

Every value is sealed by :class:`Vault` before it is stored (AES-256-GCM, a fresh nonce each time, the entry's
key as associated data, so a sealed value moved to another entry, another principal's, does not open), and
keys never hold a principal in clear (:func:`principal_key`): neither the file nor Redis shows a token, nor
who signed in.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

import trio

from mcpipe.store._base import StoreUnavailable

__all__ = [
    "KEY_BYTES",
    "MemoryTokenStore",
    "RedisTokenStore",
    "SqliteTokenStore",
    "TokenStore",
    "Vault",
    "VaultError",
    "open_token_store",
    "principal_key",
]

T = TypeVar("T")

KEY_BYTES = 32
"""An AES-256 key: 32 bytes (given base64 or hex, or as 32+ characters of text, hashed)."""


class VaultError(Exception):
    """A sealed value did not open (another key, another entry, tampered), or a key is unusable."""


def _key_bytes(text: str) -> bytes:
    """A key as given in the environment: 64 hex digits, base64 of 32 bytes, or a passphrase of 32+ characters
    (its SHA-256)."""
    text = text.strip()
    try:
        raw = bytes.fromhex(text)
        if len(raw) == KEY_BYTES:
            return raw
    except ValueError:
        pass
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), validate=False, altchars=b"-_")
        if len(raw) == KEY_BYTES:
            return raw
    except (binascii.Error, ValueError):
        pass
    if len(text) < KEY_BYTES:
        raise VaultError(f"a token key must be 32 bytes (64 hex digits or base64), or 32+ characters, not {len(text)}")
    return hashlib.sha256(text.encode()).digest()


class Vault:
    """AES-256-GCM over stored values: the first key seals, every key of the ring opens (rotation).

    Args:
        keys: the key ring, as text (see :func:`_key_bytes`); empty: one random key of this process.
    """

    def __init__(self, keys: list[str] | None = None) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        ring = [_key_bytes(k) for k in keys or []] or [os.urandom(KEY_BYTES)]
        self._ciphers = [(hashlib.sha256(k).digest()[:4], AESGCM(k)) for k in ring]
        self.ephemeral = not keys

    @classmethod
    def from_env(cls, name: str, environ: dict[str, str] | None = None) -> Vault:
        """The ring in environment variable ``name`` (comma-separated keys), or an ephemeral one when unset."""
        value = (environ if environ is not None else os.environ).get(name, "")
        return cls([k for k in value.split(",") if k.strip()])

    def seal(self, key: str, value: bytes) -> bytes:
        tag, cipher = self._ciphers[0]
        nonce = os.urandom(12)
        return b"v1" + tag + nonce + cipher.encrypt(nonce, value, key.encode())

    def open(self, key: str, sealed: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag

        if len(sealed) < 2 + 4 + 12 + 16 or sealed[:2] != b"v1":
            raise VaultError("not a sealed value")
        tag, nonce, body = sealed[2:6], sealed[6:18], sealed[18:]
        for known, cipher in self._ciphers:
            if known == tag:
                try:
                    return cipher.decrypt(nonce, body, key.encode())
                except InvalidTag:
                    break
        raise VaultError("the value does not open with this key ring (another key, another entry, or tampered)")


def principal_key(principal: str) -> str:
    """What stands for a principal in a store key (not the principal itself)."""
    return hashlib.sha256(b"mcpipe-principal\0" + principal.encode()).hexdigest()[:40]


class TokenStore(Protocol):
    """Opaque values by key, each with an optional expiry (Unix seconds). Values are sealed by the caller."""

    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, value: bytes, expires_at: float | None = None) -> None: ...

    async def delete(self, key: str) -> bool:
        """Remove an entry; True when it was there (of two deleting at once, one gets True)."""
        ...

    async def keys(self, prefix: str) -> list[str]: ...

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None: ...


class MemoryTokenStore:
    """This process's memory (what it holds goes with it)."""

    def __init__(self) -> None:
        self._data: dict[str, tuple[bytes, float]] = {}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await trio.sleep_forever()

    def _live(self, key: str) -> bytes | None:
        hit = self._data.get(key)
        if hit is None:
            return None
        if hit[1] <= time.time():
            del self._data[key]
            return None
        return hit[0]

    async def get(self, key: str) -> bytes | None:
        await trio.lowlevel.checkpoint()
        return self._live(key)

    async def put(self, key: str, value: bytes, expires_at: float | None = None) -> None:
        await trio.lowlevel.checkpoint()
        self._data[key] = (value, math.inf if expires_at is None else expires_at)

    async def delete(self, key: str) -> bool:
        await trio.lowlevel.checkpoint()
        return self._data.pop(key, None) is not None

    async def keys(self, prefix: str) -> list[str]:
        await trio.lowlevel.checkpoint()
        return sorted(k for k in list(self._data) if k.startswith(prefix) and self._live(k) is not None)


class SqliteTokenStore:
    """A SQLite file (created with mode 0600); its calls run in a worker thread, one at a time."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._limiter = trio.CapacityLimiter(1)

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            os.close(fd)
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE IF NOT EXISTS oauth (key TEXT PRIMARY KEY, value BLOB NOT NULL, expires REAL)")
            self._db = db
        return self._db

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            try:
                await self._do(lambda db: None)
            except StoreUnavailable:
                pass  # said again by each operation
            task_status.started()
            await trio.sleep_forever()
        finally:
            # Closed once no call is in its thread: another task's call may still be running one when this task
            # is cancelled, and closing a connection under a running statement crashes the process.
            with trio.CancelScope(shield=True):
                async with self._limiter:
                    db, self._db = self._db, None
                    if db is not None:
                        db.close()

    async def _do(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            return fn(self._open())

        try:
            return await trio.to_thread.run_sync(call, limiter=self._limiter)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"the token store {self.path} is unavailable: {exc}") from None

    async def get(self, key: str) -> bytes | None:
        now = time.time()
        row = await self._do(
            lambda db: db.execute(
                "SELECT value FROM oauth WHERE key = ? AND (expires IS NULL OR expires > ?)", (key, now)
            ).fetchone()
        )
        return bytes(row[0]) if row else None

    async def put(self, key: str, value: bytes, expires_at: float | None = None) -> None:
        await self._do(
            lambda db: db.execute(
                "INSERT INTO oauth (key, value, expires) VALUES (?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value, expires = excluded.expires",
                (key, value, expires_at),
            )
        )

    async def delete(self, key: str) -> bool:
        cursor = await self._do(lambda db: db.execute("DELETE FROM oauth WHERE key = ?", (key,)))
        return bool(cursor.rowcount)

    async def keys(self, prefix: str) -> list[str]:
        now = time.time()
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = await self._do(
            lambda db: db.execute(
                "SELECT key FROM oauth WHERE key LIKE ? ESCAPE '\\' AND (expires IS NULL OR expires > ?) ORDER BY key",
                (escaped + "%", now),
            ).fetchall()
        )
        return [r[0] for r in rows]


class RedisTokenStore:
    """Redis, shared by every instance (expiry is Redis's own)."""

    def __init__(self, url: str, *, prefix: str = "mcpipe", timeout_s: float = 2.0) -> None:
        from mcpipe.store.redis import RedisPipelineStore

        self._redis = RedisPipelineStore(url, prefix=prefix, timeout_s=timeout_s)
        self.prefix = f"{prefix}:oauth:"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self._redis.run(task_status=task_status)

    async def get(self, key: str) -> bytes | None:
        got = await self._redis._do("get", self._redis._client.get(self.prefix + key))
        return got if isinstance(got, bytes) else None

    async def put(self, key: str, value: bytes, expires_at: float | None = None) -> None:
        client = self._redis._client
        if expires_at is None:
            await self._redis._do("put", client.set(self.prefix + key, value))
        else:
            await self._redis._do(
                "put", client.set(self.prefix + key, value, pxat=max(1, math.ceil(expires_at * 1000)))
            )

    async def delete(self, key: str) -> bool:
        return bool(await self._redis._do("delete", self._redis._client.delete([self.prefix + key])))

    async def keys(self, prefix: str) -> list[str]:
        client = self._redis._client
        found: list[str] = []
        cursor = 0
        for _ in range(10_000):
            cursor, batch = await self._redis._do(
                "keys", client.scan(cursor, match=self.prefix + prefix + "*", count=500)
            )
            found.extend(k.decode()[len(self.prefix) :] for k in batch)
            if not cursor:
                break
        return sorted(found)


def open_token_store(url: str, *, base_dir: str = ".", prefix: str = "mcpipe", timeout_s: float = 2.0) -> TokenStore:
    """The store ``url`` names: ``memory://``, ``sqlite:///PATH`` (relative to ``base_dir``), ``redis://...``.

    Raises:
        ValueError: another scheme.
    """
    scheme, sep, rest = url.partition("://")
    if scheme == "memory":
        return MemoryTokenStore()
    if scheme == "sqlite" and sep:
        path = rest[1:] if rest.startswith("/") else rest  # sqlite:///rel.db, sqlite:////abs/path.db
        return SqliteTokenStore(path if os.path.isabs(path) else os.path.join(base_dir, path))
    if scheme in ("redis", "rediss", "unix") and sep:
        return RedisTokenStore(url, prefix=prefix, timeout_s=timeout_s)
    raise ValueError(f"no token store for {url!r} (memory://, sqlite:///PATH, redis://HOST:PORT/DB)")
