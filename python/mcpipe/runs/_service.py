"""Background runs as a server offers them: submitting a run, and the ``pipe_*`` tools that watch it.

``mcp_pipe`` with ``"background": true`` (and a declared pipeline with ``background: true``) answers at
once with a run id; the run waits in the queue for a worker. A caller sees only its own runs (those
submitted under its principal).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio

from mcpipe.store import TERMINAL, RunInfo, RunQueue
from mcpipe.tools import PURE, Identity, Request, ToolContext, ToolRegistry, ToolResult

__all__ = ["MAX_WAIT_MS", "RUN_TOOL_NAMES", "Runs"]

RUN_TOOL_NAMES = ("pipe_status", "pipe_result", "pipe_cancel", "pipe_events")
# pipe_cancel changes only the caller's own run (cancelling twice is cancelling once); the others read.
_CANCEL_HINTS = {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}

MAX_WAIT_MS = 60_000
"""The longest ``wait_ms`` a ``pipe_result``/``pipe_events`` call may block."""


def _ok(data: Mapping[str, object]) -> ToolResult:
    import orjson

    return ToolResult([{"type": "text", "text": orjson.dumps(data).decode()}], data)


class Runs:
    """Submitting runs to a queue, and the tools that watch them.

    Args:
        queue: the run queue.
        server_id: written as the ``worker`` of the ``enqueued`` events.
    """

    def __init__(self, queue: RunQueue, *, server_id: str | None = None) -> None:
        self.queue = queue
        self.server_id = server_id

    async def submit(self, target: str, args: Any, ctx: ToolContext, *, meta: dict[str, Any] | None = None) -> RunInfo:
        """Queue a run of ``target`` with ``args`` on behalf of ``ctx.principal`` (``meta``: see
        :class:`~mcpipe.store.RunInfo`)."""
        caller = caller_facts(ctx)
        if caller:
            meta = {**(meta or {}), "caller": caller}
        return await self.queue.enqueue(target, args, principal=ctx.principal, by=self.server_id, meta=meta)

    async def _mine(self, run_id: str, ctx: ToolContext) -> RunInfo | None:
        info = await self.queue.get(run_id)
        if info is None or info.principal != ctx.principal:
            return None
        return info

    async def _wait_done(self, info: RunInfo, wait_ms: float) -> RunInfo:
        """``info`` once terminal, or as it is after ``wait_ms``."""
        if info.done or wait_ms <= 0:
            return info
        cursor: str | None = None
        with trio.move_on_after(min(wait_ms, MAX_WAIT_MS) / 1000):
            while True:
                batch = await self.queue.events(info.id, after=cursor, wait_s=1.0)
                if batch:
                    cursor = batch[-1].cursor
                if any(e.type in TERMINAL for e in batch):
                    break
                if not batch:
                    now = await self.queue.get(info.id)
                    if now is None or now.done:
                        break
        return await self.queue.get(info.id) or info

    def tools(self) -> ToolRegistry:
        """``pipe_status``, ``pipe_result``, ``pipe_cancel`` and ``pipe_events``."""
        reg = ToolRegistry()
        runs = self

        @reg.tool(annotations=PURE)
        async def pipe_status(run_id: str, ctx: ToolContext) -> ToolResult:
            """The status of a background run: queued, running, completed, failed or cancelled.

            Args:
                run_id: the id a background call answered.
            """
            info = await runs._mine(run_id, ctx)
            if info is None:
                return ToolResult.error(f"NOT_FOUND: no run {run_id!r}")
            return _ok(info.summary())

        @reg.tool(annotations=PURE)
        async def pipe_result(run_id: str, ctx: ToolContext, wait_ms: float = 0) -> ToolResult:
            """The result of a background run: the answer the call would have given, once the run is done;
            until then its status (isError false, `done` false).

            Args:
                run_id: the id a background call answered.
                wait_ms: wait up to this long for the run to finish (at most 60000).
            """
            info = await runs._mine(run_id, ctx)
            if info is None:
                return ToolResult.error(f"NOT_FOUND: no run {run_id!r}")
            info = await runs._wait_done(info, wait_ms)
            if not info.done:
                return _ok({**info.summary(), "done": False})
            return ToolResult.from_wire(info.answer)

        @reg.tool(annotations=_CANCEL_HINTS)
        async def pipe_cancel(run_id: str, ctx: ToolContext) -> ToolResult:
            """Cancel a background run, on whichever worker it runs (a queued run never starts).

            Args:
                run_id: the id a background call answered.
            """
            if await runs._mine(run_id, ctx) is None:
                return ToolResult.error(f"NOT_FOUND: no run {run_id!r}")
            info = await runs.queue.cancel(run_id, by=runs.server_id)
            if info is None:
                return ToolResult.error(f"NOT_FOUND: no run {run_id!r}")
            return _ok(info.summary())

        @reg.tool(annotations=PURE)
        async def pipe_events(
            run_id: str, ctx: ToolContext, after: str | None = None, limit: int = 100, wait_ms: float = 0
        ) -> ToolResult:
            """The events of a background run (enqueued, leased, step_started, step_finished, completed,
            failed, cancelled), each with its time and worker; `next` is the cursor to pass as `after`.

            Args:
                run_id: the id a background call answered.
                after: the cursor of the last event seen (from the first event when absent).
                limit: at most this many events (1-1000).
                wait_ms: when there are none yet, wait up to this long for one (at most 60000).
            """
            if await runs._mine(run_id, ctx) is None:
                return ToolResult.error(f"NOT_FOUND: no run {run_id!r}")
            if not 1 <= limit <= 1000:
                return ToolResult.error("INVALID_ARGUMENTS: limit must be between 1 and 1000")
            batch = await runs.queue.events(
                run_id, after=after, limit=limit, wait_s=min(max(wait_ms, 0), MAX_WAIT_MS) / 1000
            )
            events = [e.to_dict() for e in batch]
            return _ok({"run_id": run_id, "events": events, "next": batch[-1].cursor if batch else after})

        return reg


def caller_facts(ctx: ToolContext) -> dict[str, Any]:
    """What a queued run keeps of its caller for the gates its steps pass when a worker runs them: the
    identity (never its bearer token) and the addresses the ``ip_allowlist`` gates read."""
    out: dict[str, Any] = {}
    identity = ctx.request.identity
    if identity is not None:
        out["identity"] = {
            "subject": identity.subject,
            "trust": identity.trust,
            "provider": identity.provider,
            "issuer": identity.issuer,
            "roles": list(identity.roles),
            "groups": list(identity.groups),
            "scopes": list(identity.scopes),
            "attributes": dict(identity.attributes),
        }
    if ctx.request.client_addresses:
        out["addresses"] = [[k, v] for k, v in ctx.request.client_addresses.items()]
    if ctx.request.session_id is not None:
        out["session"] = ctx.request.session_id
    return out


def caller_request(meta: Mapping[str, object], **fields: Any) -> Request:
    """The :class:`~mcpipe.tools.Request` a worker runs a queued run under: its caller's identity and
    addresses as :func:`caller_facts` kept them."""
    caller = meta.get("caller") if isinstance(meta, dict) else None
    if not isinstance(caller, dict):
        return Request(**fields)
    identity = None
    raw = caller.get("identity")
    if isinstance(raw, dict) and isinstance(raw.get("subject"), str):
        identity = Identity(
            subject=raw["subject"],
            trust="header_asserted" if raw.get("trust") == "header_asserted" else "verified",
            provider=str(raw.get("provider") or "token"),
            issuer=raw.get("issuer") if isinstance(raw.get("issuer"), str) else None,
            roles=tuple(str(r) for r in raw.get("roles") or ()),
            groups=tuple(str(g) for g in raw.get("groups") or ()),
            scopes=tuple(str(x) for x in raw.get("scopes") or ()),
            attributes={str(k): str(v) for k, v in (raw.get("attributes") or {}).items()},
        )
    addresses = {k: v for k, v in caller.get("addresses") or () if isinstance(k, (str, type(None)))}
    session = caller.get("session") if isinstance(caller.get("session"), str) else None
    return Request(identity=identity, client_addresses=addresses, session_id=session, **fields)
