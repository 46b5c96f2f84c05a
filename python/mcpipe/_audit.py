"""The audit log every call path writes to: mcpipe's own records, as JSON Lines.

A format writes its system's records by subclassing :class:`AuditLog` (``[audit] format = NAME``: the
format's ``audit_log``); the gateway only calls :meth:`AuditLog.allowed` and :meth:`AuditLog.write`.
"""

from __future__ import annotations

import logging
import os
from contextvars import ContextVar, Token
from typing import Any

import orjson

from mcpipe.tools import ToolContext

__all__ = ["MAX_AUDITED_NAME", "AuditLog", "Held"]

_log = logging.getLogger("mcpipe.gateway")

MAX_AUDITED_NAME = 256
"""The most characters of an unknown tool's name an audit record keeps."""


class Held:
    """The records one task's call holds back (:meth:`AuditLog.hold`), written together when it ends."""

    __slots__ = ("lines", "log", "open", "token")

    def __init__(self, log: AuditLog) -> None:
        self.log = log
        self.lines: list[bytes] = []
        self.open = True
        self.token: Token[Held | None] | None = None


_HELD: ContextVar[Held | None] = ContextVar("mcpipe_audit_held", default=None)
"""The records the call running in this task holds back, if it holds any."""


class AuditLog:
    """Audit records as JSON Lines, one ``write`` per record on an ``O_APPEND`` descriptor.

    A single small append is atomic on local filesystems and costs a few microseconds, so records are
    written in the calling task, in order, without a buffer that a crash could lose. The one exception is
    a call that does not yield (a declared pipeline of synchronous Python tools): the gateway holds its
    steps' records (:meth:`hold`) and writes them with the call's own in one ``write`` when it ends, the same
    bytes in the same order, since nothing else could have written between them.

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
            line = orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
            held = _HELD.get()
            if held is not None and held.open and held.log is self:
                held.lines.append(line)
            else:
                self._append(line)

    def hold(self) -> Held | None:
        """Hold back the records this task writes until :meth:`release` (the task's call must not yield
        meanwhile but at its runs' checkpoints: a record held across a long wait is one a crash could lose).
        None when there is nothing to hold (no file), or an outer call of this task holds them already."""
        if self._fd is None:
            return None
        outer = _HELD.get()
        if outer is not None and outer.open and outer.log is self:
            return None
        held = Held(self)
        held.token = _HELD.set(held)
        return held

    def release(self, held: Held | None) -> None:
        """Write what ``held`` (:meth:`hold`'s answer, in the same task) kept, in one ``write``."""
        if held is None:
            return
        held.open = False  # a task started meanwhile (its context copied this one) writes its own from now
        if held.token is not None:
            _HELD.reset(held.token)
        if held.lines:
            self._append(b"".join(held.lines))

    def _append(self, data: bytes) -> None:
        fd = self._fd
        if fd is None:  # closed while a call held its records
            return
        try:
            os.write(fd, data)
        except OSError:
            _log.exception("cannot write an audit record to %s", self.path)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
