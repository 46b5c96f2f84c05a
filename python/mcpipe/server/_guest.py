"""Running Trio code inside an asyncio host: one Trio guest run on the host's loop, and a way back.

The pipeline runtime is written for Trio. A host that runs on asyncio (the SDK's default: ``app.run()``,
``anyio.run(...)``, an in-memory ``Client(app)`` under asyncio) gets ``mcp_pipe`` through Trio's guest mode
(:func:`trio.lowlevel.start_guest_run`): Trio's scheduler runs in callbacks of the asyncio loop, on the same
thread, so a pipeline keeps its nurseries, cancel scopes, deadlines and limiters unchanged, and Trio hosts
keep the native path with no cost at all.

Trio allows one run per thread, so there is one guest run per asyncio loop, started by the first call and
stopped when the loop shuts down (it finalizes its async generators, one of which the run keeps: starting a
run costs milliseconds, a call in a running one a fraction of that). Each call runs in its own task under its
own cancel scope: when the host cancels the asyncio task that waits for it, the Trio side is cancelled and
waited for before the cancellation goes on, so no step outlives its call.

The way back, :class:`AsyncioHost`, runs the host's own coroutines (its tool handler, its session's progress
and log notifications) as asyncio tasks in the host's context; cancelling the Trio task that waits for one
cancels that asyncio task.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import outcome
import trio

__all__ = ["AsyncioHost", "run_in_guest"]

T = TypeVar("T")

_log = logging.getLogger("mcpipe.server")


class AsyncioHost:
    """Calls coroutine functions of the asyncio host from Trio tasks of the guest run.

    Args:
        loop: the host's running loop.
        context: the host's context (contextvars) new host tasks start from, so code that sniffs the async
            library there sees asyncio, not the Trio task that asked.
    """

    __slots__ = ("context", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, context: contextvars.Context) -> None:
        self.loop = loop
        self.context = context

    async def call(self, fn: Callable[..., Awaitable[T]], *args: object) -> T:
        """Run ``fn(*args)`` as an asyncio task on the host loop and wait for its result (from a Trio task).

        Cancelling the calling Trio task cancels the asyncio task and waits for it to end.
        """
        task = self.loop.create_task(_coro(fn, args), context=self.context.copy())
        trio_task = trio.lowlevel.current_task()
        token = trio.lowlevel.current_trio_token()
        task.add_done_callback(lambda _: token.run_sync_soon(trio.lowlevel.reschedule, trio_task))

        def abort(_: object) -> trio.lowlevel.Abort:
            task.cancel()
            return trio.lowlevel.Abort.FAILED  # rescheduled when the asyncio task has ended

        await trio.lowlevel.wait_task_rescheduled(abort)
        if task.cancelled():
            await trio.lowlevel.checkpoint()  # raises trio.Cancelled when the cancellation was ours
            raise RuntimeError("the host cancelled the call")
        return task.result()


async def _coro(fn: Callable[..., Awaitable[T]], args: tuple[object, ...]) -> T:
    return await fn(*args)


class _Call:
    __slots__ = ("cancel_requested", "scope")

    def __init__(self) -> None:
        self.cancel_requested = False
        self.scope: trio.CancelScope | None = None


class _Guest:
    """The Trio guest run of one asyncio loop, from its first call until the loop shuts down."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.ready: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.token: trio.lowlevel.TrioToken | None = None
        self.nursery: trio.Nursery | None = None
        self.keeper = self._keep()
        trio.lowlevel.start_guest_run(
            self._main,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            run_sync_soon_not_threadsafe=loop.call_soon,
            done_callback=self._finished,
            # the host owns signal handling (asyncio's signal handlers use the wakeup fd)
            host_uses_signal_set_wakeup_fd=True,
            strict_exception_groups=True,
        )

    async def _keep(self) -> AsyncIterator[None]:
        """Lives as long as the run: the host loop finalizes its async generators when it shuts down
        (``asyncio.run``, ``anyio.run``, ``asyncio.Runner``), which stops the run and waits for its end."""
        try:
            yield
        finally:
            if self.token is not None and self.nursery is not None and not self.done.done():
                self.token.run_sync_soon(self.nursery.cancel_scope.cancel)
            await asyncio.shield(self.done)

    async def _main(self) -> None:
        async with trio.open_nursery() as nursery:
            self.token = trio.lowlevel.current_trio_token()
            self.nursery = nursery
            self.ready.set_result(None)
            await trio.sleep_forever()  # the calls run beside this, until the host loop shuts down

    def _finished(self, result: outcome.Outcome[None]) -> None:
        if _guests.get(self.loop) is self:
            del _guests[self.loop]
        if isinstance(result, outcome.Error):
            _log.error("the Trio guest run ended with an error", exc_info=result.error)
        if not self.ready.done():
            self.ready.set_exception(RuntimeError("the Trio guest run ended before it started"))
        self.done.set_result(None)

    async def run(self, fn: Callable[..., Awaitable[T]], *args: object) -> T:
        assert self.token is not None and self.nursery is not None
        fut: asyncio.Future[T] = self.loop.create_future()
        call = _Call()

        async def in_trio() -> None:
            try:
                with trio.CancelScope() as scope:
                    call.scope = scope
                    if call.cancel_requested:
                        scope.cancel()
                    value = await fn(*args)
                if not scope.cancelled_caught and not fut.done():
                    fut.set_result(value)
            except Exception as exc:
                if not fut.done():
                    fut.set_exception(exc)
            finally:
                if not fut.done():
                    fut.cancel()

        self.token.run_sync_soon(self.nursery.start_soon, in_trio)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            if fut.done():
                raise
            # The host cancels this call: cancel the Trio side and wait until it has ended.
            call.cancel_requested = True
            if call.scope is not None:
                self.token.run_sync_soon(call.scope.cancel)
            while not fut.done():
                try:
                    await asyncio.wait([fut])
                except asyncio.CancelledError:
                    pass  # cancelled again (anyio repeats it): still waiting for the Trio side
            raise


_guests: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Guest] = weakref.WeakKeyDictionary()


async def run_in_guest(fn: Callable[..., Awaitable[T]], *args: object) -> T:
    """From an asyncio task: run the Trio function ``fn(*args)`` in the loop's Trio guest run.

    The guest run starts with the first call on a loop and ends when the loop shuts down.

    Raises:
        asyncio.CancelledError: the calling task was cancelled (after the Trio side has ended).
        Exception: whatever ``fn`` raised.
    """
    loop = asyncio.get_running_loop()
    guest = _guests.get(loop)
    if guest is None:
        guest = _guests[loop] = _Guest(loop)
        await guest.keeper.__anext__()  # registered with the loop, which closes it at shutdown
    await asyncio.shield(guest.ready)
    return await guest.run(fn, *args)
