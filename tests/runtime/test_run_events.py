"""``on_event``: started/finished events for progress and logs."""

from __future__ import annotations

import logging


async def test_events_report_each_step_starting_and_finishing_with_leaf_counts(run):
    events: list[dict] = []
    spec = {
        "steps": [
            {"id": "a", "tool": "echo"},
            {"id": "g", "parallel": [{"id": "c", "tool": "fail", "args": {"message": "x"}}]},
        ],
        "continue_on_error": True,
    }
    await run(spec, on_event=events.append)
    assert [(e["type"], e["path"]) for e in events] == [
        ("step_started", "a"),
        ("step_finished", "a"),
        ("step_started", "g"),
        ("step_started", "g.c"),
        ("step_finished", "g.c"),
        ("step_finished", "g"),
    ]
    assert events[0] == {
        "type": "step_started",
        "id": "a",
        "path": "a",
        "location": "steps[0]",
        "kind": "tool",
        "completed": 0,
        "total": 2,
    }
    finished = events[4]
    assert finished == {
        "type": "step_finished",
        "id": "c",
        "path": "g.c",
        "location": "steps[1].parallel[0]",
        "kind": "tool",
        "ok": False,
        "error": "x",
        "error_code": "TOOL_ERROR",
        "duration_ms": finished["duration_ms"],
        "completed": 2,
        "total": 2,
    }
    assert events[5]["kind"] == "parallel" and events[5]["error_code"] == "TOOL_ERROR"


async def test_a_failing_event_callback_is_logged_and_the_run_goes_on(run, caplog):
    def broken(event: dict) -> None:
        raise ValueError("callback bug")

    with caplog.at_level(logging.ERROR, logger="mcpipe.runtime"):
        answer = await run({"steps": [{"tool": "echo"}]}, on_event=broken)
    assert answer["ok"]
    assert any("on_event callback failed" in r.getMessage() for r in caplog.records)


async def test_cancelled_steps_report_finishing_as_cancelled(run, autojump_clock):
    events: list[dict] = []
    spec = {
        "steps": [
            {
                "id": "g",
                "parallel": [
                    {"id": "slow", "tool": "wait", "args": {"ms": 1000}},
                    {"id": "bad", "tool": "fail", "args": {"after_ms": 10}},
                ],
            }
        ]
    }
    await run(spec, on_event=events.append)
    finished = {e["path"]: e["error_code"] for e in events if e["type"] == "step_finished"}
    assert finished == {"g.slow": "CANCELLED", "g.bad": "TOOL_ERROR", "g": "TOOL_ERROR"}
    assert events[-1]["completed"] == 2
