"""A worker: leases queued runs and executes them (enqueue -> lease -> execute -> emit -> complete).

Each run executes in its own task, under a cancel scope and beside a keeper task that renews the lease
every third of ``lease_s``. Renewing also tells the worker when cancelling was asked (from any server or
worker: the flag lives in the queue), and when the lease went to another worker (this one stalled past
it); either cancels the run's scope. A worker shutting down (its own scope cancelled) finishes nothing:
its runs stay leased until the lease runs out, then another worker takes them over and resumes them after
their last recorded step.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

import trio

from mcpipe._util import PIPE_TOOL, is_suspension
from mcpipe.errors import ErrorCode
from mcpipe.gateway import CallError, Gateway
from mcpipe.interaction import CapabilityMissing, only
from mcpipe.plan import Limits
from mcpipe.results import AnswerMode, pipe_envelope
from mcpipe.runs._record import RunInteraction, RunRecord
from mcpipe.runs._service import caller_request
from mcpipe.runtime import run_pipeline
from mcpipe.store import RunInfo, RunQueue, StoreUnavailable
from mcpipe.tools import ToolContext, ToolResult

INTERNAL_ERROR = -32603
MISSING_CAPABILITY = -32021

__all__ = ["LEASE_S", "Worker", "new_worker_id"]

_log = logging.getLogger("mcpipe.runs")

LEASE_S = 10.0
"""How long a worker holds a run without renewing; a dead worker's runs are taken over after it."""

MAX_LAPSES = 3
"""How many times a run's lease may run out while it runs before a worker fails it (``[runs] max_lapses``)."""


def new_worker_id() -> str:
    """``host:pid:random``, unique among the workers of a queue."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


def cancelled_answer(message: str) -> dict[str, Any]:
    """The answer of a run cancelled by request."""
    return ToolResult.error(f"{ErrorCode.CANCELLED}: {message}").wire()


class Worker:
    """Executes the runs of a queue through a gateway (so every step is authorized, audited and billed as
    the run's principal).

    Args:
        queue: the run queue.
        gateway: the call path (the worker's tools: the same config as the server's).
        limits: the pipelines' limits.
        worker_id: this worker's id (default :func:`new_worker_id`).
        concurrency: how many runs execute at once.
        lease_s: the lease; renewed every third of it.
        wait_s: how long one look for work blocks.
        max_lapses: a run leased after its lease ran out this many times while it ran (its workers died or
            froze on it) is failed, with the step it was running when it last lapsed, instead of run again.
        answer: what an ``mcp_pipe`` run's answer holds when its spec does not say (``[pipe] answer``).
    """

    def __init__(
        self,
        queue: RunQueue,
        gateway: Gateway,
        *,
        limits: Limits | None = None,
        worker_id: str | None = None,
        concurrency: int = 8,
        lease_s: float = LEASE_S,
        wait_s: float = 1.0,
        answer: AnswerMode = "result",
        max_lapses: int = MAX_LAPSES,
    ) -> None:
        self.queue = queue
        self.answer: AnswerMode = answer
        self.gateway = gateway
        self.limits = limits or Limits()
        self.id = worker_id or new_worker_id()
        self.concurrency = concurrency
        self.lease_s = lease_s
        self.wait_s = wait_s
        self.max_lapses = max_lapses
        self.executed = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Lease and execute runs until cancelled (start it with ``nursery.start``)."""
        slots = trio.Semaphore(self.concurrency)
        down = False
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                await slots.acquire()
                try:
                    info = await self.queue.lease(self.id, self.lease_s, self.wait_s)
                except trio.Cancelled:
                    raise
                except StoreUnavailable as exc:
                    slots.release()
                    # One line when the queue goes away, one when it is back: not a traceback a second.
                    if not down:
                        _log.warning("worker %s: %s; retrying every second", self.id, exc)
                    down = True
                    await trio.sleep(1.0)
                    continue
                except Exception:
                    slots.release()
                    _log.exception("worker %s: leasing failed; retrying in 1 s", self.id)
                    await trio.sleep(1.0)
                    continue
                if down:
                    _log.warning("worker %s: the run queue answers again", self.id)
                    down = False
                if info is None:
                    slots.release()
                    continue
                nursery.start_soon(self._one, info, slots)

    async def _one(self, info: RunInfo, slots: trio.Semaphore) -> None:
        try:
            await self.execute(info)
        except trio.Cancelled:
            raise
        except Exception as exc:
            if (down := only(exc, StoreUnavailable)) is not None:
                # Its lease runs out; a worker takes it over once the queue is back.
                _log.warning("worker %s: run %s stopped: %s", self.id, info.id, down)
            else:
                _log.exception("worker %s: run %s failed outside its pipeline", self.id, info.id)
        finally:
            slots.release()

    async def execute(self, info: RunInfo) -> bool:
        """Execute one leased run and finish it; True when this worker finished it."""
        if info.lapses >= self.max_lapses:
            return await self.poisoned(info)
        # A task that asked its client before it became one starts with the steps of those rounds recorded.
        recorded = {**(info.meta.get("recorded") or {}), **await self.queue.recorded(info.id)}
        record = RunRecord(self.queue, info.id, self.id, recorded)
        caps = info.meta.get("capabilities")
        # A task's client can be asked (a question suspends the run until tasks/update answers it).
        asking = None if caps is None else RunInteraction(record, caps, dict(info.meta.get("answers") or {}))
        ctx = ToolContext(
            request_id=info.id,
            client={"name": "mcpipe-worker", "version": self.id},
            principal=info.principal,
            pipeline=info.id,
            request=caller_request(info.meta, interaction=record if asking is None else asking),
            tools=self.gateway,
        )
        answer: dict[str, Any] | None = None
        asked = suspended = False
        with trio.CancelScope() as scope:
            record.on_lost(scope.cancel)
            async with trio.open_nursery() as nursery:

                async def keep() -> None:
                    nonlocal asked
                    while True:
                        await trio.sleep(self.lease_s / 3)
                        try:
                            renewal = await self.queue.renew(info.id, self.id, self.lease_s)
                        except trio.Cancelled:
                            raise
                        except StoreUnavailable as exc:
                            _log.warning("worker %s: renewing run %s failed: %s", self.id, info.id, exc)
                            continue
                        except Exception:
                            _log.exception("worker %s: renewing run %s failed", self.id, info.id)
                            continue
                        if not renewal.held:
                            _log.warning("worker %s: run %s was taken over; stopping it", self.id, info.id)
                            record.lose()
                            return
                        if renewal.cancel and not asked:
                            asked = True
                            scope.cancel()
                            return

                nursery.start_soon(keep)
                if info.cancel:
                    asked = True
                    scope.cancel()
                try:
                    answer = await self.call(info, ctx)
                except BaseException as exc:
                    if asking is not None and is_suspension(exc):
                        suspended = True
                    elif asking is not None and (missing := only(exc, CapabilityMissing)) is not None:
                        answer = _protocol_error(MISSING_CAPABILITY, str(missing))
                    else:
                        raise
                finally:
                    nursery.cancel_scope.cancel()
        if record.lost:
            return False
        if suspended:
            assert asking is not None
            await record.save()
            return await self.queue.suspend(info.id, self.id, dict(asking.pending))
        if answer is None:  # cancelled by request (a worker shutting down never gets here)
            status = "cancelled"
            answer = cancelled_answer("the run was cancelled")
        else:
            status = "failed" if answer.get("isError") else "completed"
        await record.save()
        done = await self.queue.finish(info.id, self.id, status, answer)  # type: ignore[arg-type]
        if done:
            self.executed += 1
        return done

    async def poisoned(self, info: RunInfo) -> bool:
        """Fail a run whose lease ran out ``max_lapses`` times while it ran, instead of running it again: it
        killed or froze every worker that took it. The error names the step that was running (the last one
        started and not finished, from the run's events)."""
        where = "before its first step"
        events = await self.queue.events(info.id, limit=100_000)
        open_steps: dict[str, None] = {}
        for e in events:
            path = e.data.get("path")
            if e.type == "step_started" and isinstance(path, str):
                open_steps[path] = None
            elif e.type == "step_finished" and isinstance(path, str):
                open_steps.pop(path, None)
        if open_steps:
            where = f"at step `{next(reversed(open_steps))}`"
        message = (
            f"{ErrorCode.LIMIT_EXCEEDED}: run {info.id} was not run again: its lease ran out "
            f"{_times(info.lapses)} while it ran, {where} (its workers died or stalled on it; [runs] max_lapses is "
            f"{self.max_lapses})"
        )
        _log.error("worker %s: %s", self.id, message.split(": ", 1)[1])
        done = await self.queue.finish(info.id, self.id, "failed", ToolResult.error(message).wire())
        if done:
            self.executed += 1
        return done

    async def call(self, info: RunInfo, ctx: ToolContext) -> dict[str, Any]:
        """Run the run's target: an ``mcp_pipe`` spec, or a tool (a declared pipeline)."""
        await self.gateway.ready()
        if info.target == PIPE_TOOL:
            t0 = time.perf_counter()
            answer = None
            try:
                answer = await run_pipeline(
                    info.args, self.gateway, context=ctx, limits=self.limits, answer=self.answer
                )
            finally:
                self.gateway.record_pipe(ctx, info.id, answer or {"ok": False, "error_code": ErrorCode.CANCELLED}, t0)
            return pipe_envelope(answer)
        try:
            return (await self.gateway.call(info.target, info.args or {}, ctx)).wire()
        except CallError as exc:
            return ToolResult.error(f"{exc.code}: {exc}").wire()
        except trio.Cancelled:
            raise
        except Exception as exc:
            # Not a failure the tool reported but one of the call itself (the tool raised): a protocol-level
            # error, which a task reports as `failed` with a JSON-RPC error.
            _log.exception("run %s: tool %r raised", info.id, info.target)
            return _protocol_error(INTERNAL_ERROR, f"{ErrorCode.TOOL_FAILED}: {type(exc).__name__}: {exc}")


def _times(n: int) -> str:
    return "1 time" if n == 1 else f"{n} times"


def _protocol_error(code: int, message: str) -> dict[str, Any]:
    """The answer of a run whose call failed as a whole (a JSON-RPC error), not with a tool error."""
    return {**ToolResult.error(message).wire(), "error": {"code": code, "message": message}}
