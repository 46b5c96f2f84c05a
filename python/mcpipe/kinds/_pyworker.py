"""The worker processes of ``python`` steps: one process per step, killed with everything it started.

A step's code runs in a process of its own (:mod:`mcpipe.kinds._pyexec`), never in the server: it cannot
read or change the server's memory, its environment is the operator's base environment plus the step's
``env`` (none of the server's secrets), its working directory is a fresh temporary directory, and the
process lowers its own limits before the code runs (address space, so an allocation past the memory limit
raises ``MemoryError``; CPU time; no core dumps). The process runs in a session of its own, so when the step
ends (answered, failed, past its deadline, cancelled) the whole process group is killed and reaped: nothing
the code started outlives the step, and a process is never reused, so no step sees what an earlier one left.

Starting Python costs tens of milliseconds, so by default the processes come from a **fork server**
(``_pyexec.fork_server``, ``python -I``, started on first use and shared by every Trio run of the server
process): it has imported what a step needs, never runs a step's code itself, and forks a fresh child per
step in about a millisecond; it reaps a child only when told to, after killing its group, so the group id is
never reused under a kill. Without it (``PythonPolicy.fork_server`` off, or when it cannot start) each step
starts a new interpreter.

At most ``workers`` steps run at once (a :class:`trio.CapacityLimiter`); more wait. The event loop never
blocks: the request goes to the child's stdin, its reply comes on a pipe of its own and its stdout and stderr
are drained into bounded buffers, all over non-blocking pipes; forking, killing and reaping run in threads.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

__all__ = ["FORK_SERVER", "ForkServer", "Outcome", "run_code"]

_SCRIPT = str(Path(__file__).with_name("_pyexec.py"))


def _pipes() -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
    """Four pipes: the child's ends (stdin, stdout, stderr, reply) and the parent's (the other ends)."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    res_r, res_w = os.pipe()
    return (in_r, out_w, err_w, res_w), (in_w, out_r, err_r, res_r)


def _close(fds: tuple[int, ...]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class ForkServer:
    """The fork server's handle: thread-safe, started on first use, started again when it has died."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None

    def _start(self) -> socket.socket:
        if self._sock is not None and self._proc is not None and self._proc.poll() is None:
            return self._sock
        self._stop_locked()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", _SCRIPT, "--fork-server", str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                env={k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TZ") if k in os.environ},
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._sock = ours
        return ours

    def _ask(self, message: dict[str, Any], fds: tuple[int, ...] = ()) -> dict[str, Any]:
        with self._lock:
            sock = self._start()
            try:
                socket.send_fds(sock, [json.dumps(message).encode()], list(fds))
                reply = sock.recv(65536)
            except OSError:
                self._stop_locked()
                raise
            if not reply:
                self._stop_locked()
                raise OSError("the python fork server exited")
            answer: dict[str, Any] = json.loads(reply)
            return answer

    def fork(self, child_fds: tuple[int, int, int, int], cwd: str) -> int:
        """A child running one request on ``child_fds`` (blocking: run in a thread); its pid."""
        return int(self._ask({"op": "fork", "cwd": cwd}, child_fds)["pid"])

    def reap(self, pid: int) -> int | None:
        """Kill the child's process group and reap it (blocking); its exit status (None: unknown)."""
        code = self._ask({"op": "reap", "pid": pid}).get("code")
        return int(code) if code is not None else None

    def _stop_locked(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
            self._proc = None

    def stop(self) -> None:
        """Stop the fork server (at exit; a later step starts it again)."""
        with self._lock:
            self._stop_locked()


FORK_SERVER = ForkServer()
atexit.register(FORK_SERVER.stop)


class _Child:
    """One step's process: forked by the fork server, or a new interpreter; killed and reaped once."""

    def __init__(self, child_fds: tuple[int, int, int, int], cwd: str, env: dict[str, str], forked: bool) -> None:
        self.code: int | None = None
        self._done = False
        self._pid: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        if forked:
            self._pid = FORK_SERVER.fork(child_fds, cwd)
        else:
            stdin, stdout, stderr, result = child_fds
            self._proc = subprocess.Popen(
                [sys.executable, "-I", _SCRIPT, str(result)],
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                pass_fds=(result,),
                env=env,
                cwd=cwd,
                start_new_session=True,
            )

    @property
    def done(self) -> bool:
        """Killed and reaped already."""
        return self._done

    def kill(self) -> None:
        """SIGKILL the process group and reap the process (blocking: run in a thread); idempotent."""
        if self._done:
            return
        self._done = True
        if self._pid is not None:
            with contextlib.suppress(OSError):
                self.code = FORK_SERVER.reap(self._pid)
        elif self._proc is not None:
            if self._proc.returncode is None:  # once reaped, its group id may belong to someone else
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self._proc.pid, signal.SIGKILL)
            self.code = self._proc.wait()


class _Cleaner:
    """Removes the steps' working directories in a daemon thread of its own, off the steps' path."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._paths: list[str] = []
        self._thread: threading.Thread | None = None

    def remove(self, path: str) -> None:
        with self._cond:
            self._paths.append(path)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mcpipe-python-cleaner", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._paths:
                    self._cond.wait()
                paths, self._paths = self._paths, []
            for path in paths:
                shutil.rmtree(path, ignore_errors=True)

    def flush(self) -> None:
        """Remove what is left now (at exit)."""
        with self._cond:
            paths, self._paths = self._paths, []
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)


_CLEANER = _Cleaner()
atexit.register(_CLEANER.flush)


def _start(env: dict[str, str], forked: bool) -> tuple[_Child, tuple[int, int, int, int], str]:
    """A started child, the parent's pipe ends and its working directory (blocking: run in a thread)."""
    cwd = tempfile.mkdtemp(prefix="mcpipe-py-")
    child_fds, ours = _pipes()
    try:
        try:
            child = _Child(child_fds, cwd, env, forked)
        except OSError:
            if not forked:
                raise
            child = _Child(child_fds, cwd, env, False)  # no fork server: a new interpreter
    except BaseException:
        _close(ours)
        shutil.rmtree(cwd, ignore_errors=True)
        raise
    finally:
        _close(child_fds)
    return child, ours, cwd


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
    fork_server: bool,
    max_output_bytes: int,
    max_reply_bytes: int,
) -> Outcome:
    """Run one request (:mod:`mcpipe.kinds._pyexec`'s JSON) in a fresh process, within ``timeout_s``.

    Raises:
        OSError: no process could be started.
    """
    async with _limiter(workers):
        child, fds, cwd = await trio.to_thread.run_sync(_start, env, fork_server)
        try:
            outcome = await _converse(child, fds, request, timeout_s, max_output_bytes, max_reply_bytes)
        finally:
            if not child.done:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(child.kill)
            _CLEANER.remove(cwd)
        if outcome.reply is None and not outcome.timed_out and not outcome.too_large:
            outcome.returncode = child.code
        return outcome


async def _converse(
    child: _Child,
    fds: tuple[int, int, int, int],
    request: bytes,
    timeout_s: float,
    max_output_bytes: int,
    max_reply_bytes: int,
) -> Outcome:
    stdin = trio.lowlevel.FdStream(fds[0])
    streams = [trio.lowlevel.FdStream(fd) for fd in fds[1:]]
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
                await trio.to_thread.run_sync(child.kill)
        outcome.timed_out = deadline.cancelled_caught
    finally:
        for s in streams:
            await s.aclose()
        await stdin.aclose()
    outcome.stdout = outcome._out.decode("utf-8", errors="replace")
    outcome.stderr = outcome._err.decode("utf-8", errors="replace")
    if reply and not outcome.timed_out and not outcome.too_large:
        with contextlib.suppress(ValueError):
            outcome.reply = json.loads(reply)
    return outcome
