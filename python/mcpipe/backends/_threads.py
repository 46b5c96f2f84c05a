"""Run a blocking driver call in a worker thread without blocking Trio, and stop it when cancelled.

Drivers such as ``sqlite3``, ``psycopg`` (its blocking API) and ``grpcio`` block the calling thread. Each
call runs in a worker thread (``trio.to_thread.run_sync``); when the caller is cancelled (a step's
deadline, a client that went away) the driver is asked to stop (``interrupt``: ``sqlite3``'s
``Connection.interrupt``, ``psycopg``'s ``Connection.cancel``), and the call waits, shielded and bounded,
for the thread to finish. The caller learns whether it did from its own bookkeeping (the SQL pool never
returns a connection whose thread is still running: that thread closes it when it ends). What a call
makes after its caller is gone (a connection opened past the step's deadline) goes to ``discard``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import outcome
import trio

__all__ = ["run_interruptible"]

T = TypeVar("T")


async def run_interruptible(
    fn: Callable[[], T],
    interrupt: Callable[[], None] | None = None,
    *,
    grace_s: float = 5.0,
    limiter: trio.CapacityLimiter | None = None,
    discard: Callable[[T], None] | None = None,
) -> T:
    """Run ``fn()`` in a worker thread; on cancellation call ``interrupt()`` and wait for the thread.

    Args:
        fn: the blocking call.
        interrupt: makes ``fn`` return early (thread-safe); run in a thread of its own, as it may block
            briefly (``psycopg`` sends a cancel request over a new connection).
        grace_s: how long to wait for ``fn`` after ``interrupt``.
        limiter: the thread limiter (default: Trio's).
        discard: called (in the worker thread) with what ``fn`` returned when the caller was cancelled
            first, whenever ``fn`` ends: what it made (a connection) is released, not left to the collector.

    Returns:
        What ``fn`` returned.

    Raises:
        trio.Cancelled: the caller was cancelled (after the thread finished, or the grace period passed).
        Exception: whatever ``fn`` raised.
    """
    token = trio.lowlevel.current_trio_token()
    finished = trio.Event()
    box: list[outcome.Outcome[T]] = []
    lock = threading.Lock()
    gone = False  # the caller was cancelled: what fn returns from now on is discarded

    def work() -> None:
        got = outcome.capture(fn)
        with lock:
            box.append(got)
            orphaned = gone
        if orphaned:
            _discard(got, discard)
        try:
            token.run_sync_soon(finished.set)
        except trio.RunFinishedError:
            pass

    try:
        await trio.to_thread.run_sync(work, abandon_on_cancel=True, limiter=limiter)
    except trio.Cancelled:
        with trio.CancelScope(shield=True):
            with trio.move_on_after(grace_s):
                if interrupt is not None and not finished.is_set():
                    await trio.to_thread.run_sync(interrupt)
                await finished.wait()
            with lock:
                gone = True
                got = box[0] if box else None
            if got is not None and discard is not None:  # it ended in the grace period: released here
                await trio.to_thread.run_sync(_discard, got, discard)
        raise
    return box[0].unwrap()


def _discard(got: outcome.Outcome[T], discard: Callable[[T], None] | None) -> None:
    if discard is not None and isinstance(got, outcome.Value):
        try:
            discard(got.value)
        except Exception:  # releasing what nobody waits for any more: nothing to report it to
            pass
