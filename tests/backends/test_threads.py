"""``run_interruptible``: what a blocking call made after its caller was cancelled is discarded, not left to
the collector (a psycopg connection opened after the step's deadline was left open until collected)."""

from __future__ import annotations

import threading

import pytest
import trio

from mcpipe.backends._threads import run_interruptible


@pytest.mark.parametrize("grace_s", [0.0, 30.0], ids=["abandoned", "within-the-grace"])
async def test_what_a_call_returns_after_its_caller_is_cancelled_is_discarded(grace_s: float) -> None:
    release = threading.Event()
    discarded: list[object] = []
    done = threading.Event()
    made = object()

    def connect() -> object:
        release.wait(30)
        return made

    def discard(value: object) -> None:
        discarded.append(value)
        done.set()

    with trio.CancelScope() as scope:

        async def cancel_then_release() -> None:
            await trio.lowlevel.checkpoint()  # run_interruptible has started its thread
            scope.cancel()
            release.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_then_release)
            await run_interruptible(connect, None, grace_s=grace_s, discard=discard)
    assert scope.cancelled_caught
    await trio.to_thread.run_sync(done.wait, 30)
    assert discarded == [made]


async def test_what_a_call_returns_to_a_caller_still_waiting_is_not_discarded() -> None:
    discarded: list[object] = []
    assert await run_interruptible(lambda: 7, None, discard=discarded.append) == 7
    assert discarded == []
