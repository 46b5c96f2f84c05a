"""The ``mcpipe serve --workers N`` supervisor under test: start it, aim requests at one worker, read its log."""

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

import mcp_types as t
import trio
from mcp import Client

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
