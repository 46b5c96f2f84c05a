"""``mcpipe worker`` processes for the queued-run tests and benchmarks."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import trio

TESTS = str(Path(__file__).resolve().parents[1])


class Workers:
    """``mcpipe worker`` processes with the same config, each started and awaited ready."""

    def __init__(self, nursery: trio.Nursery, config: Path, marks: Path | None = None) -> None:
        self.nursery = nursery
        self.config = config
        self.env = {**os.environ, "PYTHONPATH": TESTS}
        if marks is not None:
            self.env["MCPIPE_TEST_MARKS"] = str(marks)
        self.procs: dict[str, trio.Process] = {}

    async def start(self, worker_id: str) -> None:
        args = [sys.executable, "-m", "mcpipe", "worker", "--config", str(self.config), "--id", worker_id]
        proc = await trio.lowlevel.open_process(
            [*args, "--log-level", "warning"], env=self.env, stdin=-3, stdout=-3, stderr=-1
        )
        self.procs[worker_id] = proc
        ready = trio.Event()
        self.nursery.start_soon(self._drain, proc, ready)
        await ready.wait()

    @staticmethod
    async def _drain(proc: trio.Process, ready: trio.Event) -> None:
        assert proc.stderr is not None
        seen = b""
        async for chunk in proc.stderr:
            if not ready.is_set():
                seen += chunk
                if b" ready" in seen:
                    ready.set()
        if not ready.is_set():
            raise RuntimeError(f"worker exited before it was ready: {seen.decode(errors='replace')}")

    async def __aenter__(self) -> Workers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        with trio.CancelScope(shield=True):
            await self.stop_all()

    def kill(self, worker_id: str) -> None:
        self.procs[worker_id].send_signal(signal.SIGKILL)

    async def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self.procs.values():
            await proc.wait()
