"""An audit log the tests can wait on."""

from __future__ import annotations

from typing import Any

import trio

from mcpipe.gateway import AuditLog


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
