"""The worker processes of ``python`` steps: one process per step, killed with everything it started.

A step's code runs in a process of its own (:mod:`mcpipe.kinds._pyexec`, run with ``python -I``), never in
the server: it cannot read or change the server's memory, its environment is the operator's base
environment plus the step's ``env`` (none of the server's secrets), its working directory is a fresh
temporary directory, and the process lowers its own limits before the code runs (address space, so an
allocation past the memory limit raises ``MemoryError``; CPU time; no core dumps). The process runs in a
session of its own, so when the step ends (answered, failed, past its deadline, cancelled) the whole
process group is killed and reaped: nothing the code started outlives the step, and a process is never
reused, so no step sees what an earlier one left behind.

Starting Python costs tens of milliseconds (the venv's ``site``), so a few processes are started ahead
(*spares*, idle, blocked reading their request) and a step takes one; its replacement starts in a thread
while the step runs. At most ``workers`` steps run at once (a :class:`trio.CapacityLimiter`); more wait.
The parent never blocks the event loop: it talks to the process over non-blocking pipes (the request on
stdin, the reply on a pipe of its own, stdout and stderr drained into bounded buffers), and forks,
reaping and clean-up run in threads.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

__all__ = ["Outcome", "Spares", "run_code"]

_SCRIPT = str(Path(__file__).with_name("_pyexec.py"))


class _Process:
    """One started worker: its pipes (raw fds, owned here until handed to Trio), its session, its directory."""

    def __init__(self, env: dict[str, str]) -> None:
        self.dir = tempfile.mkdtemp(prefix="mcpipe-py-")
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        res_r, res_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", _SCRIPT, str(res_w)],
                stdin=in_r,
                stdout=out_w,
                stderr=err_w,
                pass_fds=(res_w,),
                env=env,
                cwd=self.dir,
                start_new_session=True,
                close_fds=True,
            )
        except BaseException:
            for fd in (in_w, out_r, err_r, res_r):
                os.close(fd)
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        finally:
            for fd in (in_r, out_w, err_w, res_w):
                os.close(fd)
        self.stdin: int | None = in_w
        self.stdout: int | None = out_r
        self.stderr: int | None = err_r
        self.result: int | None = res_r

    def take(self) -> tuple[int, int, int, int]:
        """The four pipe ends, now the caller's to close."""
        fds = (self.stdin, self.stdout, self.stderr, self.result)
        assert None not in fds
        self.stdin = self.stdout = self.stderr = self.result = None
        return fds  # type: ignore[return-value]

    def kill(self) -> None:
        """SIGKILL the process group, reap the process, remove its directory, close what is still ours
        (blocking: run in a thread, or at exit)."""
        if self.proc.returncode is None:  # once reaped, its group id may belong to someone else
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                self.proc.wait()
        for fd in (self.stdin, self.stdout, self.stderr, self.result):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.stdin = self.stdout = self.stderr = self.result = None
        shutil.rmtree(self.dir, ignore_errors=True)


class Spares:
    """Processes started ahead, shared by every Trio run of the process (killed at exit).

    A daemon thread of its own starts them when asked (:meth:`want`), so no step waits for a fork.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._idle: list[tuple[tuple[tuple[str, str], ...], _Process]] = []
        self._wanted: dict[tuple[tuple[str, str], ...], int] = {}
        self._thread: threading.Thread | None = None
        self._stopped = False

    def take(self, env: dict[str, str]) -> _Process | None:
        """An idle process started with ``env``, or None."""
        key = tuple(sorted(env.items()))
        with self._cond:
            for i, (k, p) in enumerate(self._idle):
                if k == key:
                    del self._idle[i]
                    self._cond.notify()
                    return p
        return None

    def want(self, env: dict[str, str], count: int) -> None:
        """Keep ``count`` processes with ``env`` waiting (started in the background)."""
        key = tuple(sorted(env.items()))
        with self._cond:
            if self._stopped or self._wanted.get(key) == count:
                return
            self._wanted[key] = count
            if self._thread is None:
                self._thread = threading.Thread(target=self._fill, name="mcpipe-python-spares", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _missing(self) -> tuple[tuple[str, str], ...] | None:
        for key, count in self._wanted.items():
            if sum(1 for k, _ in self._idle if k == key) < count:
                return key
        return None

    def _fill(self) -> None:
        while True:
            with self._cond:
                key = None
                while not self._stopped and (key := self._missing()) is None:
                    self._cond.wait()
                if self._stopped or key is None:
                    return
            try:
                p = _Process(dict(key))
            except OSError:
                with self._cond:  # cannot fork now: stop asking until a step asks again
                    self._wanted.pop(key, None)
                continue
            with self._cond:
                if self._stopped:
                    stale = True
                else:
                    stale = False
                    self._idle.append((key, p))
            if stale:
                p.kill()

    def stop(self) -> None:
        """Kill every idle process and stop starting new ones (at exit; ``restart`` undoes it in tests)."""
        with self._cond:
            self._stopped = True
            idle, self._idle = self._idle, []
            self._wanted.clear()
            self._cond.notify_all()
        for _, p in idle:
            p.kill()

    def restart(self) -> None:
        """Start processes again after :meth:`stop` (tests)."""
        with self._cond:
            self._stopped = False
            self._thread = None

    def idle(self) -> int:
        """How many processes wait now."""
        with self._cond:
            return len(self._idle)


SPARES = Spares()
atexit.register(SPARES.stop)


@dataclass
class Outcome:
    """What a step's process did.

    Attributes:
        reply: its reply (``{"ok": ...}``), or None when it ended without one.
        stdout, stderr: what it printed, the first ``max_output_bytes`` of each.
        truncated: bytes of stdout and stderr left out.
        returncode: its exit status when it ended without a reply (negative: the signal that ended it).
        timed_out: the deadline passed (the process was killed).
        too_large: the reply was larger than allowed (the process was killed).
    """

    reply: dict[str, Any] | None = None
    stdout: str = ""
    stderr: str = ""
    truncated: int = 0
    returncode: int | None = None
    timed_out: bool = False
    too_large: bool = False
    _out: bytearray = field(default_factory=bytearray, repr=False)
    _err: bytearray = field(default_factory=bytearray, repr=False)


_limiters: trio.lowlevel.RunVar[dict[int, trio.CapacityLimiter]] = trio.lowlevel.RunVar("mcpipe_python_workers")


def _limiter(workers: int) -> trio.CapacityLimiter:
    try:
        by_size = _limiters.get()
    except LookupError:
        by_size = {}
        _limiters.set(by_size)
    limiter = by_size.get(workers)
    if limiter is None:
        limiter = by_size[workers] = trio.CapacityLimiter(workers)
    return limiter


async def run_code(
    request: bytes,
    *,
    env: dict[str, str],
    timeout_s: float,
    workers: int,
    spares: int,
    max_output_bytes: int,
    max_reply_bytes: int,
) -> Outcome:
    """Run one request (:mod:`mcpipe.kinds._pyexec`'s JSON) in a fresh process, within ``timeout_s``.

    Raises:
        OSError: no process could be started.
    """
    async with _limiter(workers):
        proc = SPARES.take(env)
        if spares > 0:
            SPARES.want(env, spares)
        if proc is None:
            proc = await trio.to_thread.run_sync(_Process, env)
        try:
            return await _converse(proc, request, timeout_s, max_output_bytes, max_reply_bytes)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(proc.kill)


async def _converse(
    proc: _Process, request: bytes, timeout_s: float, max_output_bytes: int, max_reply_bytes: int
) -> Outcome:
    stdin_fd, stdout_fd, stderr_fd, result_fd = proc.take()
    stdin = trio.lowlevel.FdStream(stdin_fd)
    streams = [trio.lowlevel.FdStream(fd) for fd in (stdout_fd, stderr_fd, result_fd)]
    outcome = Outcome()
    reply = bytearray()
    try:
        with trio.move_on_after(timeout_s) as deadline:
            async with trio.open_nursery() as nursery:

                async def feed() -> None:
                    async with stdin:
                        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                            await stdin.send_all(request)

                async def drain(stream: trio.lowlevel.FdStream, into: bytearray) -> None:
                    while chunk := await stream.receive_some(65536):
                        room = max_output_bytes - len(into)
                        if room > 0:
                            into += chunk[:room]
                        outcome.truncated += max(0, len(chunk) - max(room, 0))

                nursery.start_soon(feed)
                nursery.start_soon(drain, streams[0], outcome._out)
                nursery.start_soon(drain, streams[1], outcome._err)
                while chunk := await streams[2].receive_some(65536):
                    reply += chunk
                    if len(reply) > max_reply_bytes:
                        outcome.too_large = True
                        break
                # The reply is complete (or the process ended without one): whatever is left of the group
                # goes, and the drains read what the pipes still hold, to their end.
                await trio.to_thread.run_sync(proc.kill)
        outcome.timed_out = deadline.cancelled_caught
    finally:
        for s in streams:
            await s.aclose()
    outcome.stdout = outcome._out.decode("utf-8", errors="replace")
    outcome.stderr = outcome._err.decode("utf-8", errors="replace")
    if not outcome.timed_out and not outcome.too_large:
        if reply:
            try:
                outcome.reply = json.loads(reply)
            except ValueError:
                outcome.reply = None
        if outcome.reply is None:
            outcome.returncode = proc.proc.returncode
    return outcome
