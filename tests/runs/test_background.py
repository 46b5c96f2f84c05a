"""Background runs over MCP: ``"background": true`` answers a run id at once; the ``pipe_*`` tools watch,
fetch and cancel the run; events say what happened, with times and the worker's id."""

from __future__ import annotations

from typing import Any

import trio
from mcp import Client

from kit.run_tools import gate, release, reset_gate
from kit.servers import make_config
from mcpipe.gateway import PIPE_TOOL
from mcpipe.server import open_app


def _structured(result: Any) -> Any:
    return result.structured_content


async def _until(client: Client, run_id: str, type_: str, path: str | None = None) -> dict[str, Any]:
    """Follow the run's events (``pipe_events`` with ``wait_ms``) until one of ``type_`` (at ``path``)."""
    after = None
    while True:
        page = _structured(await client.call_tool("pipe_events", {"run_id": run_id, "after": after, "wait_ms": 5000}))
        for event in page["events"]:
            if event["type"] == type_ and (path is None or event.get("path") == path):
                return event
        after = page["next"]


async def test_a_background_pipe_answers_a_run_id_at_once_and_pipe_result_answers_the_pipelines_answer():
    reset_gate()
    with trio.fail_after(20):
        async with open_app(make_config(), extra_sources=[gate]) as app, Client(app.server) as client:
            spec = {
                "background": True,
                "steps": [
                    {"id": "a", "tool": "echo", "args": {"x": 1}},
                    {"id": "b", "tool": "wait_for", "args": {"tag": "t1"}},
                ],
                "answer": "full",
            }
            first = _structured(await client.call_tool(PIPE_TOOL, spec))
            run_id = first["result"]["run_id"]
            assert first["ok"] and first["result"]["status"] == "queued"
            # The run waits on `b`: its status says so, and its result is not there yet.
            await _until(client, run_id, "step_started", "b")
            status = _structured(await client.call_tool("pipe_status", {"run_id": run_id}))
            assert status["status"] == "running"
            pending = _structured(await client.call_tool("pipe_result", {"run_id": run_id}))
            assert pending["done"] is False and pending["status"] == "running"
            release("t1")
            done = await client.call_tool("pipe_result", {"run_id": run_id, "wait_ms": 10000})
            answer = _structured(done)
            assert not done.is_error and answer["ok"] is True and answer["result"] == "released t1"
            assert answer["steps"]["a"]["output"] == {"x": 1}
            events = _structured(await client.call_tool("pipe_events", {"run_id": run_id}))["events"]
    types = [e["type"] for e in events]
    assert types == [
        "enqueued",
        "leased",
        "step_started",
        "step_finished",
        "step_started",
        "step_finished",
        "completed",
    ]
    assert all(isinstance(e["at"], float) for e in events)
    assert {e["worker"] for e in events[1:]} == {app.worker.id}
    assert [e.get("path") for e in events if e["type"] == "step_finished"] == ["a", "b"]
    assert status["attempts"] == 1


async def test_a_background_spec_with_problems_is_answered_at_once_and_never_queued():
    with trio.fail_after(20):
        async with open_app(make_config()) as app, Client(app.server) as client:
            bad = await client.call_tool(PIPE_TOOL, {"background": True, "steps": [{"id": "a", "tool": "nope"}]})
            runs = await app.runs.queue.runs()
    answer = _structured(bad)
    assert bad.is_error and answer["error_code"] == "UNKNOWN_TOOL"
    assert answer["problems"][0]["location"] == "steps[0].tool"
    assert runs == []


async def test_a_background_retry_of_a_tool_not_idempotent_is_answered_at_once_as_a_run_would_refuse_it():
    """The submission makes every check a run makes before its first step, so the queued run is never refused
    later where no one reads it."""
    with trio.fail_after(20):
        async with open_app(make_config()) as app, Client(app.server) as client:
            spec = {"background": True, "steps": [{"id": "t", "tool": "now", "retry": {"attempts": 2}}]}
            bad = await client.call_tool(PIPE_TOOL, spec)
            runs = await app.runs.queue.runs()
    answer = _structured(bad)
    assert bad.is_error and answer["error_code"] == "INVALID_SPEC"
    assert [p["location"] for p in answer["problems"]] == ["steps[0].retry"]
    assert "not marked idempotent" in answer["problems"][0]["message"]
    assert runs == []


async def test_pipe_cancel_stops_a_running_background_run_and_it_ends_cancelled():
    reset_gate()
    with trio.fail_after(20):
        async with open_app(make_config(), extra_sources=[gate]) as app, Client(app.server) as client:
            spec = {"background": True, "steps": [{"id": "w", "tool": "wait_for", "args": {"tag": "never"}}]}
            run_id = _structured(await client.call_tool(PIPE_TOOL, spec))["result"]["run_id"]
            await _until(client, run_id, "step_started", "w")
            asked = _structured(await client.call_tool("pipe_cancel", {"run_id": run_id}))
            assert asked["cancel_requested"] is True
            done = await client.call_tool("pipe_result", {"run_id": run_id, "wait_ms": 15000})
            status = _structured(await client.call_tool("pipe_status", {"run_id": run_id}))
    assert done.is_error and "CANCELLED" in done.content[0].text
    assert status["status"] == "cancelled"


async def test_another_principals_run_is_unknown_to_the_pipe_tools():
    with trio.fail_after(20):
        async with open_app(make_config()) as app, Client(app.server) as client:
            info = await app.runs.queue.enqueue(PIPE_TOOL, {"steps": [{"tool": "echo"}]}, principal="someone-else")
            seen = await client.call_tool("pipe_status", {"run_id": info.id})
    assert seen.is_error and "NOT_FOUND" in seen.content[0].text
