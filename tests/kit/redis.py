"""A real ``redis-server`` for the tests, started on a free 127.0.0.1 port in a temporary directory.

It persists with an fsync'd append-only file, so stopping and starting it again (same directory, same
port) keeps everything it acknowledged, as a production Redis configured for durability would.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from kit.realservers import free_port

STARTUP_S = 15


def need_redis() -> str:
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server; .ci/run installs it)")
    return exe


class RedisServer:
    """One redis-server process; :meth:`start` and :meth:`stop` may be called again and again."""

    def __init__(self, directory: Path, nursery: trio.Nursery) -> None:
        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._nursery = nursery
        self._proc: trio.Process | None = None

    async def start(self) -> None:
        """Start it and return once it accepts connections (it says so on stdout)."""
        args = [need_redis(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory)]
        args += ["--appendonly", "yes", "--appendfsync", "always", "--save", "", "--protected-mode", "no"]
        proc = await trio.lowlevel.open_process(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self._proc = proc
        assert proc.stdout is not None
        ready = trio.Event()
        self._nursery.start_soon(self._drain, proc.stdout, ready)
        with trio.fail_after(STARTUP_S):
            await ready.wait()

    async def _drain(self, out: trio.abc.ReceiveStream, ready: trio.Event) -> None:
        seen = b""
        async for chunk in out:
            if not ready.is_set():
                seen += chunk
                if b"Ready to accept connections" in seen:
                    ready.set()

    async def stop(self) -> None:
        """SIGTERM: Redis fsyncs and exits."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            proc.terminate()
            with trio.fail_after(STARTUP_S):
                await proc.wait()


@asynccontextmanager
async def redis_server(directory: Path) -> AsyncIterator[RedisServer]:
    """A started Redis, stopped on exit."""
    async with trio.open_nursery() as nursery:
        server = RedisServer(directory, nursery)
        await server.start()
        try:
            yield server
        finally:
            await server.stop()


@asynccontextmanager
async def redis_url(workdir: Path) -> AsyncIterator[str]:
    """Yield the URL of a fresh ``redis-server`` without persistence (skips the test where none is installed)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (.ci/run installs it)")
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = await trio.lowlevel.open_process([*args, "--dir", str(workdir)], stdout=-3, stderr=-3)
    try:
        with trio.fail_after(10):
            while True:  # until it accepts connections
                try:
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                except OSError:
                    await trio.sleep(0.02)
                    continue
                await stream.aclose()
                break
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        with trio.move_on_after(5):
            await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
