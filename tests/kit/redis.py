"""A real ``redis-server`` for a test: started on a free 127.0.0.1 port in a temporary directory, without
persistence, and stopped afterwards."""

from __future__ import annotations

import shutil
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def redis_server(workdir: Path) -> AsyncIterator[str]:
    """Yield the URL of a fresh ``redis-server`` (skips the test where none is installed)."""
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
