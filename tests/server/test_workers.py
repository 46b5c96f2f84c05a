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
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as t
import pytest
import trio
from mcp import Client

pytestmark = [
    pytest.mark.filterwarnings("ignore:Async generator:ResourceWarning"),  # the SDK client's SSE reader
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

WAIT_S = 60
HERE = Path(__file__).parent


class Supervisor:
    def __init__(self, proc: trio.Process, url: str, log: bytearray) -> None:
        self.proc, self.url, self.log = proc, url, log
        self._changed = trio.Event()

    def workers(self) -> set[int]:
        """The pids of the supervisor's children (from /proc)."""
        pids = set()
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                fields = stat.rsplit(")", 1)[1].split()
                if int(fields[1]) == self.proc.pid and fields[0] != "Z":
                    pids.add(int(entry))
        return pids

    @contextmanager
    def only(self, pid: int) -> Iterator[None]:
        """Every other worker stopped (SIGSTOP), so new connections reach ``pid``."""
        others = self.workers() - {pid}
        for o in others:
            os.kill(o, signal.SIGSTOP)
        try:
            yield
        finally:
            for o in others:
                os.kill(o, signal.SIGCONT)

    def text(self) -> str:
        return self.log.decode(errors="replace")

    def logged(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def until_logged(self, needle: str, count: int = 1) -> None:
        """Wait until the supervisor's (and its workers') log holds ``needle`` ``count`` times."""
        while self.text().count(needle) < count:
            await self._changed.wait()


@asynccontextmanager
async def supervised(tmp_path: Path, *extra: str) -> AsyncIterator[Supervisor]:
    config = tmp_path / "mcpipe.json"
    config.write_text(json.dumps({"audit": {"enabled": False}, "python_tools": ["worker_tools:tools"]}))
    args = [sys.executable, "-m", "mcpipe", "serve", "--config", str(config), "--http", "127.0.0.1:0", *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    async with trio.open_nursery() as nursery:
        proc = await trio.lowlevel.open_process(args, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        log = bytearray()
        ready = trio.Event()
        url: list[str] = []
        sup = Supervisor(proc, "", log)

        async def drain(out: Any) -> None:
            async for chunk in out:
                log.extend(chunk)
                sup.logged()
                text = log.decode(errors="replace")
                # Ready when the supervisor named its URL and both workers said they serve.
                if not ready.is_set() and text.count("serving MCP at ") >= 3:
                    url.append(text.split("serving MCP at ", 1)[1].split()[0])
                    ready.set()
            ready.set()

        nursery.start_soon(drain, proc.stderr)
        with trio.fail_after(WAIT_S):
            await ready.wait()
        assert url, log.decode(errors="replace")
        sup.url = url[0]
        try:
            yield sup
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                with trio.fail_after(WAIT_S):
                    await proc.wait()


async def call(url: str, mode: str, name: str, args: dict[str, Any]) -> t.CallToolResult:
    async with Client(url, mode=mode) as c:
        return await c.call_tool(name, args)


def pid_of(result: t.CallToolResult) -> int:
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return int(result.structured_content["pid"])


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


def test_workers_must_be_a_positive_number_and_http() -> None:
    for args, message in (
        (["--workers", "0"], "must be between 1 and 256: 0"),
        (["--workers", "two"], "not a number: 'two'"),
        (["--workers", "2", "--stdio"], "--workers is for HTTP"),
    ):
        done = subprocess.run([sys.executable, "-m", "mcpipe", "serve", *args], capture_output=True, text=True)
        assert done.returncode == 2
        assert message in done.stderr and "Traceback" not in done.stderr
