"""Watching a command step's processes: a script that starts a child and says both pids through a FIFO, and
waits on pidfds that become readable when the processes exit (killed with their group, or not)."""

from __future__ import annotations

import os
from pathlib import Path

import trio

SLEEPER = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(sys.argv[1], "w") as f:
    f.write(f"{os.getpid()} {child.pid}\\n")
time.sleep(600)
"""
"""A Python script (``python -c SLEEPER FIFO``): starts a child, writes ``PID CHILD_PID`` to FIFO, sleeps."""


async def read_pids(fifo: Path) -> tuple[int, int]:
    """The pids :data:`SLEEPER` wrote to ``fifo``."""
    # Opened read-write so that reading waits for the script's line (instead of seeing end-of-file before it
    # opens the FIFO), through trio, so the test's fail_after can interrupt it.
    data = b""
    async with trio.lowlevel.FdStream(os.open(fifo, os.O_RDWR | os.O_NONBLOCK)) as stream:
        while not data.endswith(b"\n"):
            data += await stream.receive_some()
    pid, child = map(int, data.split())
    return pid, child


def watch(pids: tuple[int, int]) -> list[int]:
    """pidfds of the processes, opened while they surely run (a pidfd becomes readable when they exit)."""
    return [os.pidfd_open(pid) for pid in pids]


async def all_gone(fds: list[int]) -> None:
    """Wait until every process watched by ``fds`` has exited (the test bounds the wait); closes them."""
    try:
        for fd in fds:
            await trio.lowlevel.wait_readable(fd)
    finally:
        for fd in fds:
            os.close(fd)
