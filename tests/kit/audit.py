"""An audit log the tests can wait on, and the writes an audit file gets."""

from __future__ import annotations

import os
from typing import Any

import pytest
import trio

from mcpipe import _audit
from mcpipe.gateway import AuditLog


def counted_writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every ``write(2)`` of audit records from now on, in order (each still made). ``os.write`` is the
    process's, so the writes are told by what they start with: an audit record's time."""
    writes: list[bytes] = []
    real = os.write

    def counted(fd: int, data: bytes) -> int:
        if bytes(data[:7]) == b'{"ts":"':
            writes.append(bytes(data))
        return real(fd, data)

    monkeypatch.setattr(_audit.os, "write", counted)
    return writes


class WatchedAudit(AuditLog):
    """Audit records in memory, with a way to wait (event-driven) until they satisfy a condition."""

    def __init__(self) -> None:
        super().__init__(None, keep=True)
        self._changed = trio.Event()

    def write(self, record: dict[str, Any], ctx: Any = None) -> None:
        super().write(record, ctx)
        self._changed.set()
        self._changed = trio.Event()

    async def until(self, predicate: Any) -> list[dict[str, Any]]:
        while not predicate(self.records):
            await self._changed.wait()
        return self.records  # type: ignore[return-value]

    async def until_any(self, predicate: Any) -> None:
        """Wait until some record satisfies ``predicate``."""
        await self.until(lambda records: any(predicate(r) for r in records or []))
