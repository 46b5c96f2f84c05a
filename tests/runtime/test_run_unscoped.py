"""A run whose steps are all leaves opens no cancel scope of its own; once its answer is full, what is left
of it runs under a cancelled scope, so the steps it stops are the ones the run's own scope stopped: the
next step that yields is recorded as cancelled and ends the run, a step that does not yield still runs."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import trio

from mcpipe.compile import Limits

# Room under this limit: 4000 - 1000 (kept for a full answer's records) - 1024 (the answer's own fields).
SMALL = Limits(max_answer_bytes=4000)
BIG = "x" * 3000


@pytest.fixture
def scopes(monkeypatch) -> list[int]:
    """How many cancel scopes the scheduler opened (``trio.CancelScope()`` calls)."""
    from mcpipe.runtime import _scheduler

    opened: list[int] = []
    real = trio.CancelScope

    def counting(*args: Any, **kwargs: Any) -> trio.CancelScope:
        if sys._getframe(1).f_globals["__name__"] == _scheduler.__name__:  # not trio's own fail_after
            opened.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_scheduler.trio, "CancelScope", counting)
    return opened


async def test_a_run_of_leaves_opens_no_cancel_scope_and_a_run_with_a_group_does(run, scopes):
    leaves = {
        "steps": [
            {"id": "a", "tool": "echo", "args": {"value": 1}},
            {"id": "b", "tool": "text", "args": {"value": "t"}},
        ]
    }
    answer = await run(leaves)
    assert answer["ok"], answer["error"]
    assert answer["summary"]["succeeded"] == 2
    assert scopes == []
    group = {"steps": [{"id": "g", "parallel": [{"id": "a", "tool": "echo", "args": {"value": 1}}]}]}
    answer = await run(group)
    assert answer["ok"], answer["error"]
    assert len(scopes) == 1


async def test_once_the_answer_is_full_the_next_step_that_yields_is_cancelled_and_ends_the_run(run, probe, scopes):
    spec = {
        "continue_on_error": True,
        "steps": [
            {"id": "big", "tool": "text", "args": {"value": BIG}},
            {"id": "quiet", "tool": "text", "args": {"value": "still runs"}},
            {"id": "yields", "tool": "wait", "args": {"ms": 1, "label": "yields"}},
            {"id": "never", "tool": "echo", "args": {"value": "never"}},
        ],
    }
    answer = await run(spec, limits=SMALL)
    steps = answer["steps"]
    assert answer["ok"] is False and answer["error_code"] == "OUTPUT_TOO_LARGE"
    assert steps["big"]["error_code"] == "OUTPUT_TOO_LARGE" and steps["big"]["output"] is None
    assert steps["quiet"]["ok"] and steps["quiet"]["output"] == "still runs"
    assert steps["yields"]["error_code"] == "CANCELLED"
    assert "never" not in steps and "echo never" not in probe.log
    assert probe.cancelled == ["yields"]
    assert answer["summary"] == {"total": 4, "succeeded": 1, "failed": 1, "skipped": 1, "cancelled": 1}
    assert len(scopes) == 1  # the cancelled one, opened when the answer filled up


async def test_a_run_of_leaves_that_stops_at_its_full_answer_opens_no_scope_at_all(run, scopes):
    spec = {
        "steps": [
            {"id": "big", "tool": "text", "args": {"value": BIG}},
            {"id": "after", "tool": "wait", "args": {"ms": 1, "label": "after"}},
        ]
    }
    answer = await run(spec, limits=SMALL)
    assert answer["error_code"] == "OUTPUT_TOO_LARGE"
    assert list(answer["steps"]) == ["big"]
    assert answer["summary"] == {"total": 2, "succeeded": 0, "failed": 1, "skipped": 1, "cancelled": 0}
    assert scopes == []


async def test_a_caller_cancelling_a_run_of_leaves_still_cancels_its_running_step(run, probe):
    spec = {"steps": [{"id": "w", "tool": "wait", "args": {"ms": 60_000, "label": "w"}}]}
    with trio.move_on_after(0.05) as scope:
        await run(spec)
    assert scope.cancelled_caught
    assert probe.cancelled == ["w"]
