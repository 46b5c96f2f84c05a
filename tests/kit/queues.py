"""A running run queue for the queue tests: on SQLite (a file under the test's directory) or on a real Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from kit.redis import redis_url as redis_server
from mcpipe.store import RunQueue, open_queue

KINDS = ["sqlite", "redis"]
"""The stores a queue test runs on (``pytest.mark.parametrize("kind", KINDS)``)."""


@asynccontextmanager
async def running_queue(kind: str, tmp_path: Path, **options: Any) -> AsyncIterator[RunQueue]:
    """A queue of ``kind`` (``sqlite`` or ``redis``) with ``options``, running until the block ends."""
    async with trio.open_nursery() as nursery:
        if kind == "sqlite":
            queue = open_queue(str(tmp_path / "runs.sqlite3"), poll_s=0.02, **options)
            await nursery.start(queue.run)
            yield queue
        else:
            async with redis_server(tmp_path) as url:
                queue = open_queue(url, prefix="t", **options)
                await nursery.start(queue.run)
                yield queue
        nursery.cancel_scope.cancel()
