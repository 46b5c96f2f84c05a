"""Hostile background runs meet the run queue's bounds (``[runs] max_run_bytes``, ``max_runs``, ``max_bytes``)
over MCP, on the embedded default (an in-memory SQLite queue): what runs keep stays bounded, the oldest finished
runs go first, and a queue full of live runs refuses a new one in one located line."""

from __future__ import annotations

from typing import Any

import trio
from mcp import Client

from kit.servers import make_config
from mcpipe.gateway import PIPE_TOOL
from mcpipe.server import open_app
from mcpipe.store._sqlite import SqliteRunQueue


def _big(n: int) -> dict[str, Any]:
    """A background run carrying ``n`` bytes in a var, which its step echoes (so its answer, with the step's full
    record, holds it too)."""
    return {
        "background": True,
        "answer": "full",
        "vars": {"big": "x" * n},
        "steps": [{"id": "a", "tool": "echo", "args": {"t": "${vars.big}"}}],
    }


async def test_a_flood_of_large_background_runs_keeps_the_in_memory_queue_under_max_bytes():
    limit = 3 * 1024 * 1024
    config = make_config(runs={"max_bytes": limit})
    with trio.fail_after(60):
        async with open_app(config) as app, Client(app.server) as client:
            queue = app.runs.queue
            assert isinstance(queue, SqliteRunQueue)
            ids = []
            for _ in range(3):  # batches, as a hostile client would send them (each fits: its results are read)
                batch = [
                    (await client.call_tool(PIPE_TOOL, _big(100_000))).structured_content["result"]["run_id"]
                    for _ in range(4)
                ]
                for run_id in batch:
                    done = await client.call_tool("pipe_result", {"run_id": run_id, "wait_ms": 20000})
                    assert not done.is_error
                ids += batch
                count, stored = await queue.usage()
                assert stored <= limit
            first = await client.call_tool("pipe_status", {"run_id": ids[0]})
            last = await client.call_tool("pipe_result", {"run_id": ids[-1]})
    # What one run keeps: its arguments and its answer once (not the text block beside the structured copy, not
    # its recorded steps; with both it kept 15 times its var).
    assert stored / count < 7 * 100_000
    assert count < 12  # the oldest finished runs went
    assert first.is_error and "NOT_FOUND" in first.content[0].text
    assert not last.is_error and last.structured_content["result"] == {"t": "x" * 100_000}


async def test_a_queue_full_of_live_runs_refuses_a_new_background_run_in_one_located_line():
    config = make_config(runs={"max_runs": 2})
    with trio.fail_after(20):
        # No worker here: the queued runs stay live.
        async with open_app(config, execute=False) as app, Client(app.server) as client:
            spec = {"background": True, "steps": [{"tool": "echo"}]}
            for _ in range(2):
                assert not (await client.call_tool(PIPE_TOOL, spec)).is_error
            refused = await client.call_tool(PIPE_TOOL, spec)
            kept = await app.runs.queue.runs()
    answer = refused.structured_content
    assert refused.is_error and answer["error_code"] == "LIMIT_EXCEEDED"
    assert answer["problems"] == [
        {
            "location": "background",
            "code": "LIMIT_EXCEEDED",
            "message": "the run queue is full: 2 runs are queued or running, the most it keeps is 2 "
            "([runs] max_runs); try again once some have finished",
        }
    ]
    assert len(kept) == 2


async def test_background_arguments_past_max_run_bytes_are_refused_before_anything_is_queued():
    config = make_config(runs={"max_run_bytes": 64 * 1024})
    with trio.fail_after(20):
        async with open_app(config) as app, Client(app.server) as client:
            refused = await client.call_tool(PIPE_TOOL, _big(100_000))
            kept = await app.runs.queue.runs()
    problem = refused.structured_content["problems"][0]
    assert refused.is_error and problem["location"] == "background" and problem["code"] == "LIMIT_EXCEEDED"
    assert "a background run keeps at most 65536 ([runs] max_run_bytes)" in problem["message"]
    assert kept == []


async def test_a_background_answer_past_max_run_bytes_is_kept_as_an_output_too_large_error():
    config = make_config(runs={"max_run_bytes": 64 * 1024})
    with trio.fail_after(20):
        async with open_app(config) as app, Client(app.server) as client:
            # The answer fits the run's answer limit (capped at max_run_bytes, counted as sent), but with the
            # run's 45 KB of arguments it is past what the queue keeps of one run.
            spec = {**_big(4_000), "vars": {"big": "x" * 4_000, "pad": "p" * 45_000}}
            started = await client.call_tool(PIPE_TOOL, spec)
            run_id = started.structured_content["result"]["run_id"]
            done = await client.call_tool("pipe_result", {"run_id": run_id, "wait_ms": 10000})
            status = (await client.call_tool("pipe_status", {"run_id": run_id})).structured_content
    assert done.is_error and done.content[0].text.startswith("OUTPUT_TOO_LARGE: the run's answer is ")
    assert "at most 65536 with its arguments and events ([runs] max_run_bytes)" in done.content[0].text
    assert status["status"] == "failed"
