"""A :class:`~mcpipe.interaction.PipelineStore` in Redis, shared by every instance that may resume a pipeline.

Blobs are plain keys with an absolute expiry (``SET ... PXAT``), taken with ``GETDEL`` so a handle works
once; a claim is ``SET ... NX PXAT``, which Redis applies atomically, so of two instances claiming the same
state at the same moment exactly one wins. Redis expires both itself: there is nothing to sweep.

The client is coredis, which runs on Trio through anyio. While Redis is unreachable every operation raises
:class:`~mcpipe.interaction.StoreUnavailable` (after at most ``timeout_s``); the client reconnects on the
next operation, so service resumes by itself once Redis is back.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import coredis
import coredis.exceptions
import trio

from mcpipe.interaction._store import StoreUnavailable

__all__ = ["RedisPipelineStore", "redacted"]

_log = logging.getLogger("mcpipe.store")


def redacted(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class RedisPipelineStore:
    """Suspended pipelines and used-state claims in Redis.

    Args:
        url: ``redis://[:PASSWORD@]HOST:PORT/DB`` (or ``rediss://``, ``unix://``).
        prefix: the key prefix (``PREFIX:blob:HANDLE``, ``PREFIX:claim:ID``), so servers can share a
            database.
        timeout_s: the bound on connecting and on each command.
    """

    def __init__(self, url: str, *, prefix: str = "mcpipe", timeout_s: float = 2.0) -> None:
        self.url = url
        self.prefix = prefix
        self.timeout_s = timeout_s
        self._client: coredis.Redis[bytes] = coredis.Redis.from_url(
            url, decode_responses=False, connect_timeout=timeout_s, stream_timeout=timeout_s
        )
        self._running = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the client's connection pool open until cancelled (start it with ``nursery.start``).

        Redis need not be up: the store starts anyway and its operations fail until Redis answers.
        """
        async with self._client:
            self._running = True
            try:
                task_status.started()
                await trio.sleep_forever()
            finally:
                self._running = False

    async def put(self, handle: str, blob: bytes, expires_at: float) -> None:
        key = f"{self.prefix}:blob:{handle}"
        await self._do("put", self._client.set(key, blob, pxat=_ms(expires_at)))

    async def take(self, handle: str) -> bytes | None:
        got = await self._do("take", self._client.getdel(f"{self.prefix}:blob:{handle}"))
        return got if isinstance(got, bytes) else None

    async def claim(self, state_id: str, expires_at: float) -> bool:
        if expires_at <= time.time():
            return False  # already expired: Redis would refuse a past PXAT, and the state is dead anyway
        key = f"{self.prefix}:claim:{state_id}"
        won = await self._do("claim", self._client.set(key, b"1", condition=coredis.PureToken.NX, pxat=_ms(expires_at)))
        return bool(won)

    async def sweep(self) -> int:
        """Nothing to do: Redis expires keys itself."""
        await trio.lowlevel.checkpoint()
        return 0

    async def ping(self) -> bool:
        """Whether Redis answers now."""
        try:
            await self._do("ping", self._client.ping())
        except StoreUnavailable:
            return False
        return True

    async def _do(self, what: str, request: Any) -> Any:
        if not self._running:
            raise StoreUnavailable("the Redis pipeline store is not running (start its run() in a nursery)")
        try:
            with trio.fail_after(self.timeout_s * 2):  # coredis bounds each step; this bounds their sum
                return await request
        except (coredis.exceptions.RedisError, OSError, trio.TooSlowError) as exc:
            message = str(exc) or type(exc).__name__
            _log.warning("pipeline store %s: %s failed: %s", redacted(self.url), what, message)
            raise StoreUnavailable(f"the pipeline store at {redacted(self.url)} is unavailable: {message}") from None


def _ms(at: float) -> int:
    return max(1, math.ceil(at * 1000))
