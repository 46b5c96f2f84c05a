"""Watching a step's processes: a script that starts a child and says where it runs through a FIFO, and
waits on pidfds that become readable when the processes exit (killed with their step, or not).

A step's processes run in a PID namespace of their own where the kernel allows (:mod:`mcpipe._sandbox`),
so the pids they know are not this process's: they say their namespace too (``pid:[INODE] PID CHILD``),
and :func:`read_pids` answers the pids, as seen here, of every process in that namespace.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import trio

SAY_PIDS = "f\"{os.readlink('/proc/self/ns/pid')} {os.getpid()} {child.pid}\\n\""
"""A Python expression (``os`` and ``child``, a Popen, in scope): the line :func:`read_pids` reads."""

SLEEPER = f"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(sys.argv[1], "w") as f:
    f.write({SAY_PIDS})
time.sleep(600)
"""
"""A Python script (``python -c SLEEPER FIFO``): starts a child, writes where both run to FIFO, sleeps."""


_DETACH = """
import os, subprocess, time
subprocess.Popen(["setsid", "sleep", tag], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)

def running():
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and open(f"/proc/{p}/cmdline", "rb").read() == b"sleep\\0" + tag.encode() + b"\\0":
                return True
        except OSError:
            pass
    return False

for _ in range(4000):
    if running():
        break
    time.sleep(0.005)
"""


def detaching(result: str) -> str:
    """A python step's code that starts ``setsid sleep TAG`` (``tag``, an input) detached from itself, waits
    until it runs, and answers the expression ``result``: what the step leaves behind, to be killed."""
    return f"{_DETACH}result = {result}\n"


def cmdline(pid: int) -> bytes:
    """The command line of ``pid`` as ``/proc`` has it (NUL-separated); empty once it has gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def with_cmdline(line: bytes) -> list[int]:
    """The pids of the processes whose command line is ``line`` (``b"sleep\\0600\\0"``)."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and cmdline(int(p)) == line]


async def gone(line: bytes) -> None:
    """Wait until every process with command line ``line`` has exited (the caller bounds the wait)."""
    fds = []
    for pid in with_cmdline(line):
        with contextlib.suppress(ProcessLookupError):
            fds.append(os.pidfd_open(pid))
    await all_gone(fds)


def in_namespace(link: str) -> list[int]:
    """The pids (as seen here) of the processes whose PID namespace is ``link`` (``pid:[INODE]``)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{name}/ns/pid") == link:
                    found.append(int(name))
    return sorted(found)


@contextlib.contextmanager
def open_dir() -> Iterator[Path]:
    """A directory every uid may use (a python step runs as a uid of its own; pytest's ``tmp_path`` is
    its owner's only), removed after."""
    path = Path(tempfile.mkdtemp(prefix="mcpipe-test-"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def read_pids(fifo: Path) -> tuple[int, ...]:
    """The pids (as seen here) of the processes :data:`SLEEPER` (or :data:`SAY_PIDS`) said through
    ``fifo``: those it named, or, when it ran in a PID namespace of its own, every process in it."""
    # Opened read-write so that reading waits for the script's line (instead of seeing end-of-file before it
    # opens the FIFO), through trio, so the test's fail_after can interrupt it.
    data = b""
    async with trio.lowlevel.FdStream(os.open(fifo, os.O_RDWR | os.O_NONBLOCK)) as stream:
        while not data.endswith(b"\n"):
            data += await stream.receive_some()
    words = data.split()
    if words[0].startswith(b"pid:"):
        link = words[0].decode()
        if link != os.readlink("/proc/self/ns/pid"):
            return tuple(in_namespace(link))
        words = words[1:]
    return tuple(int(w) for w in words)


def watch(pids: tuple[int, ...]) -> list[int]:
    """pidfds of the processes (a pidfd becomes readable when they exit); one already gone (and reaped) has
    none: there is nothing to wait for."""
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            continue
    return fds


async def all_gone(fds: list[int]) -> None:
    """Wait until every process watched by ``fds`` has exited (the test bounds the wait); closes them."""
    try:
        for fd in fds:
            await trio.lowlevel.wait_readable(fd)
    finally:
        for fd in fds:
            os.close(fd)
