"""``mcpipe serve --workers 2``: real processes sharing one socket under a supervisor.

Which worker accepts a connection is the kernel's choice; to aim a request at one worker the tests stop the
others (SIGSTOP: a stopped process accepts nothing) and continue them afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
from mcp import Client

from kit.workers import WAIT_S, call, pid_of, supervised

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),  # the SDK client's SSE reader
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


async def test_every_worker_serves_stateless_2026_requests(tmp_path: Path) -> None:
    with trio.fail_after(WAIT_S):
        async with supervised(tmp_path, "--workers", "2") as sup:
            workers = sup.workers()
            assert len(workers) == 2
            for pid in workers:
                with sup.only(pid):
                    assert pid_of(await call(sup.url, "2026-07-28", "whoami", {})) == pid
            spec = {"steps": [{"id": "a", "tool": "whoami", "args": {}}, {"id": "b", "tool": "whoami", "args": {}}]}
            piped = await call(sup.url, "2026-07-28", "mcp_pipe", spec)
            assert not piped.is_error and piped.structured_content is not None
            assert piped.structured_content["ok"] is True


async def test_a_2025_client_works_against_two_workers(tmp_path: Path) -> None:
    with trio.fail_after(WAIT_S):
        async with supervised(tmp_path, "--workers", "2") as sup:
            served = set()
            for pid in sup.workers():
                with sup.only(pid):
                    async with Client(sup.url, mode="legacy") as c:
                        names = {tool.name for tool in (await c.list_tools()).tools}
                        assert {"mcp_pipe", "whoami"} <= names
                        served.add(pid_of(await c.call_tool("whoami", {})))
                        piped = await c.call_tool("mcp_pipe", {"steps": [{"id": "w", "tool": "whoami", "args": {}}]})
                        assert not piped.is_error
            assert served == sup.workers()
            # Served statelessly: the session a client opened on one worker is not needed by the other.
            async with Client(sup.url, mode="legacy") as c:
                for _ in range(4):
                    assert pid_of(await c.call_tool("whoami", {})) in served


async def nap_in_flight(url: str, started: trio.Event, answers: list[dict[str, Any]]) -> None:
    """A raw 2026-07-28 ``tools/call`` of ``nap`` asking for progress: ``started`` is set when the server says
    the call runs, the answer is appended when the SSE stream delivers it."""
    meta = {"progressToken": 1, "io.modelcontextprotocol/protocolVersion": "2026-07-28"}
    meta["io.modelcontextprotocol/clientCapabilities"] = {}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "nap", "arguments": {"seconds": 1.0}}}
    body["params"]["_meta"] = meta  # type: ignore[index]
    headers = {
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "nap",
    }
    async with httpx2.AsyncClient() as http, http.stream("POST", url, json=body, headers=headers) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                message = json.loads(line[6:])
                if message.get("method") == "notifications/progress":
                    started.set()
                elif "result" in message:
                    answers.append(message["result"])


async def test_sigterm_reaches_every_worker_which_answers_its_calls_in_flight_and_exits(tmp_path: Path) -> None:
    answers: list[dict[str, Any]] = []
    with trio.fail_after(WAIT_S):
        async with supervised(tmp_path, "--workers", "2") as sup, trio.open_nursery() as nursery:
            workers = sup.workers()
            for pid in workers:
                with sup.only(pid):
                    # A worker answers before its SDK is loaded (its first second), and a call asking for
                    # progress waits for the SDK: one session first, so each nap runs as soon as it is sent.
                    async with Client(sup.url, mode="legacy"):
                        pass
            for pid in workers:
                with sup.only(pid):
                    started = trio.Event()
                    nursery.start_soon(nap_in_flight, sup.url, started, answers)
                    await started.wait()  # running on this worker before the others continue
            sup.proc.send_signal(signal.SIGTERM)
            assert await sup.proc.wait() == 0
    # Each worker answered its call in flight (the project's shutdown: calls end with CANCELLED, answered).
    assert len(answers) == len(workers) == 2
    assert all(a["isError"] and "CANCELLED: the server is shutting down" in a["content"][0]["text"] for a in answers)
    assert not sup.workers()


async def test_a_worker_that_dies_is_reported_and_replaced(tmp_path: Path) -> None:
    with trio.fail_after(WAIT_S):
        async with supervised(tmp_path, "--workers", "2") as sup:
            first = sup.workers()
            victim = min(first)
            os.kill(victim, signal.SIGKILL)
            await sup.until_logged(f"(pid {victim}) exited with status -9: starting another")
            await sup.until_logged("serving MCP at ", 4)  # the supervisor's line, the two workers', the new one's
            survivors = sup.workers()
            assert len(survivors) == 2 and victim not in survivors
            for pid in survivors:
                with sup.only(pid):
                    assert pid_of(await call(sup.url, "2026-07-28", "whoami", {})) == pid


def test_workers_must_be_a_positive_number_and_http_and_no_worker_needs_a_shared_queue() -> None:
    for args, message in (
        (["--workers", "0"], "must be between 1 and 256: 0"),
        (["--workers", "two"], "not a number: 'two'"),
        (["--workers", "2", "--stdio"], "--workers is for HTTP"),
        (["--no-worker"], "need a queue they share"),
        (["--no-worker", "--workers", "2"], "need a queue they share"),
    ):
        done = subprocess.run([sys.executable, "-m", "mcpipe", "serve", *args], capture_output=True, text=True)
        assert done.returncode == 2
        assert message in done.stderr and "Traceback" not in done.stderr


def _structured(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return dict(result.structured_content)


async def test_background_runs_started_on_one_worker_are_watched_and_resolved_from_any_other(tmp_path: Path) -> None:
    """No `[runs] path` and no Redis: the supervisor gives both workers one run queue file, so a run started
    through worker A is found, polled and answered through worker B, over connections of their own."""
    spec = {"background": True, "steps": [{"id": "w", "tool": "whoami", "args": {}}]}
    with trio.fail_after(WAIT_S):
        async with supervised(tmp_path, "--workers", "2") as sup:
            await sup.until_logged("the 2 workers share the run queue ")
            queue_file = sup.text().split("the 2 workers share the run queue ", 1)[1].split()[0]
            a, b = sorted(sup.workers())
            with sup.only(a):  # started and executed on A
                started = [_structured(await call(sup.url, "2026-07-28", "mcp_pipe", spec)) for _ in range(3)]
                ids = [s["result"]["run_id"] for s in started]
                for run_id in ids:
                    await call(sup.url, "2026-07-28", "pipe_result", {"run_id": run_id, "wait_ms": 20000})
            with sup.only(b):  # watched through B
                seen = [_structured(await call(sup.url, "2026-07-28", "pipe_status", {"run_id": i})) for i in ids]
                answers = [_structured(await call(sup.url, "2026-07-28", "pipe_result", {"run_id": i})) for i in ids]
            # Unpinned: every run started and polled over fresh connections, wherever the kernel sends them.
            more = [
                _structured(await call(sup.url, "2026-07-28", "mcp_pipe", spec))["result"]["run_id"] for _ in range(8)
            ]
            polled = [
                _structured(await call(sup.url, "2026-07-28", "pipe_result", {"run_id": i, "wait_ms": 20000}))
                for i in more
            ]
            statuses = [
                _structured(await call(sup.url, "2026-07-28", "pipe_status", {"run_id": i}))["status"] for i in more
            ]
            assert await trio.Path(queue_file).exists()
    assert [s["status"] for s in seen] == ["completed"] * 3
    assert [ans["ok"] for ans in answers] == [True] * 3
    assert {ans["result"]["pid"] for ans in answers} == {a}  # A executed them (B was stopped)
    assert all(p["ok"] for p in polled) and {p["result"]["pid"] for p in polled} <= {a, b}
    assert statuses == ["completed"] * 8
    assert not Path(queue_file).parent.exists()  # the supervisor removed its private directory


async def test_the_workers_of_a_supervisor_killed_outright_shut_down_instead_of_serving_on(tmp_path: Path) -> None:
    with trio.fail_after(WAIT_S):
        async with supervised(tmp_path, "--workers", "2") as sup:
            workers = sup.workers()
            assert len(workers) == 2
            watched = [os.pidfd_open(pid) for pid in workers]
            sup.proc.kill()  # SIGKILL: it cannot stop them
            try:
                for fd in watched:
                    await trio.lowlevel.wait_readable(fd)  # each worker ends by itself
            finally:
                for fd in watched:
                    os.close(fd)
            await sup.until_logged("is gone: shutting down", 2)
