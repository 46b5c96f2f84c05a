"""The audit log every call path writes to: mcpipe's own records, as JSON Lines.

A format writes its system's records by subclassing :class:`AuditLog` (``[audit] format = NAME``: the
format's ``audit_log``); the gateway only calls :meth:`AuditLog.allowed` and :meth:`AuditLog.write`.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import orjson

from mcpipe.tools import ToolContext

__all__ = ["MAX_AUDITED_NAME", "AuditLog"]

_log = logging.getLogger("mcpipe.gateway")

MAX_AUDITED_NAME = 256
"""The most characters of an unknown tool's name an audit record keeps."""


class AuditLog:
    """Audit records as JSON Lines, one ``write`` per record on an ``O_APPEND`` descriptor.

    A single small append is atomic on local filesystems and costs a few microseconds, so records are
    written in the calling task, in order, without a buffer that a crash could lose.

    Args:
        path: the file (created if needed); None writes no file.
        keep: also keep every record in memory, in ``records`` (for tests and embedding).
    """

    def __init__(self, path: str | None = None, *, keep: bool = False) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if path else None
        self.records: list[dict[str, Any]] | None = [] if keep else None

    def allowed(self, ctx: ToolContext, tool: str, chain: list[Any]) -> None:
        """A call passed its checks and is about to run (a format's log may record it; this one does not)."""

    def write(self, record: dict[str, Any], ctx: ToolContext | None = None) -> None:
        """Append one record (``ctx``: the call it is about, for formats that record the caller's identity)."""
        if self.records is not None:
            self.records.append(record)
        if self._fd is not None:
            try:
                os.write(self._fd, orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))
            except OSError:
                _log.exception("cannot write an audit record to %s", self.path)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
