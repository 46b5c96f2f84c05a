"""Long-lived connections shared per server URL, opened lazily, owned by one nursery, closed on shutdown.

A NATS or Kafka connection has a reader task that must outlive the step that opened it, so it cannot live
in the step's own nursery. :class:`Connections` runs a nursery of its own (the server starts it with
``await nursery.start(connections.run)``, or a library user enters ``async with connections.running()``);
the first step that needs ``nats://host:4222`` opens it there, later steps share it, and when the server
stops, the nursery is cancelled and every connection closed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol, TypeVar

import trio

__all__ = ["Connection", "Connections", "NotRunning"]


class Connection(Protocol):
    """What :class:`Connections` keeps: something that runs (its reader) until closed."""

    @property
    def closed(self) -> bool: ...

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None: ...


C = TypeVar("C", bound=Connection)


class NotRunning(RuntimeError):
    """A connection was asked for while no :meth:`Connections.run` is running."""


class Connections:
    """Connections by key (``("nats", "nats://127.0.0.1:4222")``), opened on first use."""

    def __init__(self) -> None:
        self._nursery: trio.Nursery | None = None
        self._open: dict[Any, Connection] = {}
        self._locks: dict[Any, trio.Lock] = {}
        self._closers: list[Callable[[], Awaitable[None]]] = []

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Own the connections until cancelled; then close them all."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            self._open.clear()
            with trio.CancelScope(shield=True):
                for close in self._closers:
                    await close()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Connections]:
        """``async with connections.running():`` for library use, the same as the server's ``run``."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.run)
            try:
                yield self
            finally:
                nursery.cancel_scope.cancel()

    def on_close(self, close: Callable[[], Awaitable[None]]) -> None:
        """Run ``close`` when the connections stop (for resources without a task, such as gRPC channels)."""
        self._closers.append(close)

    async def get(self, key: object, factory: Callable[[], C]) -> C:
        """The open connection for ``key``, opening it with ``factory()`` (and its ``run``) when there is none.

        Raises:
            NotRunning: no :meth:`run` is running.
            Exception: what opening the connection raised (the next call tries again).
        """
        found = self._open.get(key)
        if found is not None and not found.closed:
            return found  # type: ignore[return-value]
        lock = self._locks.setdefault(key, trio.Lock())
        async with lock:
            found = self._open.get(key)
            if found is not None and not found.closed:
                return found  # type: ignore[return-value]
            if self._nursery is None:
                raise NotRunning("connections are not running (the server starts them; or use `running()`)")
            conn = factory()
            await self._nursery.start(_run, conn)
            self._open[key] = conn
            return conn


async def _run(conn: Connection, *, task_status: object = trio.TASK_STATUS_IGNORED) -> None:
    await conn.run(task_status=task_status)
