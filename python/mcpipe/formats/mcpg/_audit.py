"""mcpg's audit records (its ``dev.mcpg.builtin.audit.local-file`` sink), written when ``[audit] format =
"mcpg"``: one ``AuditEvent`` per line, hash-chained (``docs/formats/mcpg.md``)."""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from collections.abc import Mapping
from typing import Any

import orjson

from mcpipe._audit import MAX_AUDITED_NAME, AuditLog
from mcpipe._util import PIPE_TOOL
from mcpipe.errors import ErrorCode
from mcpipe.tools import ToolContext

__all__ = ["McpgAuditLog"]

_log = logging.getLogger("mcpipe.gateway")


class McpgAuditLog(AuditLog):
    """Audit records in mcpg's format (its ``dev.mcpg.builtin.audit.local-file`` sink): one ``AuditEvent`` per
    line, hash-chained.

    A call writes ``mcpg.tool.call.allowed`` when it passed its checks and ``mcpg.tool.call.completed`` when it
    answered (an ``isError`` answer included), or one of ``mcpg.tool.call.unknown`` (no such tool),
    ``mcpg.tool.call.access_denied`` (the caller may not call it), ``mcpg.tool.call.denied`` (a gate refused
    it), ``mcpg.backend.failed`` (it failed without answering); an ``mcp_pipe`` run writes
    ``mcpg.pipeline.completed`` or ``mcpg.pipeline.failed``. Each line's ``prev_event_hash`` is the SHA-256 of
    the previous line's bytes; a restart continues the chain from the file's last line, and a file rotated away
    (renamed or deleted) is reopened at its path before the next write.

    Args:
        path: the file; None keeps no file.
        allowed: write ``mcpg.tool.call.allowed`` events (mcpg's ``emit_tool_call_allowed``).
        completed: write ``mcpg.tool.call.completed`` events (``emit_tool_call_completed``).
    """

    def __init__(
        self, path: str | None = None, *, keep: bool = False, allowed: bool = True, completed: bool = True
    ) -> None:
        super().__init__(path, keep=keep)
        self.emit_allowed = allowed
        self.emit_completed = completed
        self.last_hash: str | None = _last_line_hash(path) if path else None
        self._id = os.fstat(self._fd) if self._fd is not None else None

    def allowed(self, ctx: ToolContext, tool: str, chain: list[Any]) -> None:
        if self.emit_allowed:
            details = {
                "tool_gate_plugins_evaluated": len(chain),
                "surface": "tool",
                "chain": [
                    {"plugin_id": d.gate, "phase": "pre", "decision": d.decision, "latency_ms": d.latency_ms}
                    for d in chain
                ],
            }
            self._emit(ctx, "mcpg.tool.call.allowed", f"tool://{tool}", "success", details)

    def write(self, record: dict[str, Any], ctx: ToolContext | None = None) -> None:
        tool = str(record.get("tool", ""))
        code = record.get("error_code")
        if "gate" in record:
            details = {"plugin_id": record["gate"], "decision": {"effect": "deny", "code": code}}
            self._emit(ctx, "mcpg.tool.call.denied", f"tool://{tool}", "denied", details, record)
        elif tool == PIPE_TOOL:
            ok = bool(record.get("ok"))
            details = {"pipeline_id": record.get("pipeline"), "duration_ms": record.get("duration_ms")}
            if not ok:
                details["error_code"] = code
            action = "mcpg.pipeline.completed" if ok else "mcpg.pipeline.failed"
            self._emit(ctx, action, f"pipeline://{PIPE_TOOL}", "success" if ok else "failure", details, record)
        elif record.get("ok") or code == ErrorCode.TOOL_ERROR:
            if self.emit_completed:
                details = {
                    "tool_gate_plugins_evaluated": 0,
                    "execution_duration_ms": int(record.get("duration_ms") or 0),
                    "surface": "tool",
                    "chain": [],
                }
                self._emit(ctx, "mcpg.tool.call.completed", f"tool://{tool}", "success", details, record)
        elif code == ErrorCode.UNKNOWN_TOOL:
            details = {"surface": "tool", "transport": "mcp", "reason": "tool_not_registered"}
            self._emit(ctx, "mcpg.tool.call.unknown", f"tool://{tool[:MAX_AUDITED_NAME]}", "failure", details, record)
        elif code == ErrorCode.FORBIDDEN:
            trust = ctx.identity.trust if ctx is not None and ctx.identity is not None else "unauthenticated"
            details = {
                "surface": "tool",
                "transport": "mcp",
                "audit_reason": f"tool_not_granted:{tool}",
                "trust_level": trust,
            }
            self._emit(ctx, "mcpg.tool.call.access_denied", f"tool://{tool}", "denied", details, record)
        else:
            details = {"duration_ms": record.get("duration_ms"), "error_code": code}
            self._emit(ctx, "mcpg.backend.failed", f"tool://{tool}", "failure", details, record)

    def _emit(
        self,
        ctx: ToolContext | None,
        action: str,
        resource: str,
        outcome: str,
        details: Mapping[str, object],
        record: Mapping[str, object] | None = None,
    ) -> None:
        event: dict[str, Any] = {
            "event_id": _uuid7(),
            "occurred_at": record["ts"] if record is not None else _now(),
            "actor": _actor(ctx),
            "action": action,
            "resource": resource,
            "outcome": outcome,
        }
        request_id = ctx.request_id if ctx is not None else None
        if request_id is not None:
            event["request_id"] = request_id
        event["details"] = details
        if self.last_hash is not None:
            event["prev_event_hash"] = self.last_hash
        line = orjson.dumps(event)
        if self.records is not None:
            self.records.append(event)
        if self._fd is None:
            self.last_hash = hashlib.sha256(line).hexdigest()
            return
        try:
            self._follow_rotation()
            os.write(self._fd, line + b"\n")
        except OSError:
            _log.exception("cannot write an audit record to %s", self.path)
            return
        self.last_hash = hashlib.sha256(line).hexdigest()

    def _follow_rotation(self) -> None:
        """Reopen the path when the file was renamed or deleted under the open descriptor (logrotate)."""
        assert self.path is not None and self._fd is not None
        try:
            on_disk = os.stat(self.path)
        except FileNotFoundError:
            on_disk = None
        held = self._id
        if on_disk is not None and held is not None and (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino):
            return
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._id = os.fstat(self._fd)


def _last_line_hash(path: str) -> str | None:
    """The SHA-256 of the last line of an existing audit file (the chain goes on from it)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 1024 * 1024))
            tail = f.read()
    except OSError:
        return None
    lines = [line for line in tail.split(b"\n") if line]
    return hashlib.sha256(lines[-1]).hexdigest() if lines else None


def _actor(ctx: ToolContext | None) -> dict[str, Any]:
    """mcpg's ``PluginIdentity`` of the caller."""
    identity = ctx.identity if ctx is not None else None
    if identity is not None:
        actor: dict[str, Any] = {
            "kind": identity.trust,
            "trust_level": identity.trust,
            "subject_id": identity.subject,
            "auth_provider": identity.issuer if identity.provider == "oidc" else identity.provider,
            "issuer": identity.issuer,
        }
        for key, values in (("roles", identity.roles), ("groups", identity.groups), ("scopes", identity.scopes)):
            if values:
                actor[key] = list(values)
        if identity.attributes:
            actor["attributes"] = dict(sorted(identity.attributes.items()))
        return actor
    principal = ctx.principal if ctx is not None else None
    kind, trust = ("anonymous", "unauthenticated") if principal is None else ("verified", "verified")
    return {"kind": kind, "trust_level": trust, "subject_id": principal, "auth_provider": None, "issuer": None}


def _uuid7() -> str:
    """A UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then random bits; sorts by time."""
    ms = time.time_ns() // 1_000_000
    value = (ms & ((1 << 48) - 1)) << 80 | (0x7 << 76) | (int.from_bytes(os.urandom(10), "big") & ((1 << 76) - 1))
    value = (value & ~(0xC << 60)) | (0x8 << 60)  # the RFC 4122 variant
    return str(uuid.UUID(int=value))


def _now() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"
