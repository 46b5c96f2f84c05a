"""CEL evaluations that may run long, run in worker processes that can be killed (issue 9).

The CEL library evaluates in Rust holding the GIL, cannot be interrupted, and its comprehensions cost
more than linear time (``args.items.map(x, x * 2)`` on 10 000 items takes seconds). A thread would not
help: it would hold the GIL as long. So an expression that iterates (a comprehension, or a list function
such as ``sort`` or ``lists.range``) is evaluated in a worker process: a thread of a bounded limiter
waits on the worker's pipe without the GIL, the event loop goes on, and past the deadline the worker is
killed (the next evaluation starts a new one) and the step fails with a timeout. Expressions that do not
iterate cost time linear in their input and run inline.

A worker's address space is bounded (:data:`MEMORY_BYTES`), and so is its reply (:data:`MAX_REPLY_BYTES`):
an expression that builds a huge value (``lists.range(1000000000)``, a ``replace`` that multiplies a text)
fails its step instead of taking the machine's memory.

The protocol is one JSON line each way: ``{"source", "context", "functions"}`` in; ``{"value"}`` or
``{"error", "missing"}`` out. The worker is :mod:`mcpipe.expr._celexec` run as a script, which imports
nothing of mcpipe (it starts in the time the CEL library takes to import).
"""

from __future__ import annotations

import atexit
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import orjson
import trio

from mcpipe._util import RunLimiter

__all__ = ["WORKERS", "WorkerDied", "evaluate_in_worker"]

WORKERS = 2
"""At most this many worker processes (and evaluations in flight); more evaluations wait for one."""

MEMORY_BYTES = 1024 * 1024 * 1024
"""A worker's address-space limit (``RLIMIT_AS``): the CEL library and Python take about 60 MB of it."""

MAX_REPLY_BYTES = 64 * 1024 * 1024
"""The longest reply (an expression's value as JSON) read from a worker; past it the worker is killed."""

READY_TIMEOUT_S = 60.0
"""How long a new worker may take to start (import the CEL library) before it counts as broken."""

_workers = RunLimiter("mcpipe_cel_workers", WORKERS)
"""At most :data:`WORKERS` expressions evaluate in workers at once (per Trio run)."""
_idle: list[_Worker] = []


class WorkerDied(OSError):
    """The worker ended without a whole reply: the expression's fault (memory, a reply too large), not the
    machine's; the step fails with this message."""


class _Worker:
    """One worker process; its pipe is read by one thread at a time."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("_celexec.py")), str(MEMORY_BYTES)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.ready = False

    def _pipes(self) -> tuple[IO[bytes], IO[bytes]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        return self.proc.stdin, self.proc.stdout

    def wait_ready(self) -> None:
        """Block until the worker has imported the CEL library (runs in a thread)."""
        if not self.ready:
            line = self._pipes()[1].readline()
            if line != b"ready\n":
                raise OSError("the CEL worker did not start")
            self.ready = True

    def ask(self, request: bytes) -> bytes:
        """Send one request, answer its reply line (runs in a thread; EOF when the worker is killed)."""
        stdin, stdout = self._pipes()
        stdin.write(request + b"\n")
        stdin.flush()
        line = stdout.readline(MAX_REPLY_BYTES + 1)
        if not line:
            raise WorkerDied("the CEL worker exited while evaluating (it ran out of memory, or was killed)")
        if not line.endswith(b"\n"):
            raise WorkerDied(f"the expression's value is larger than {MAX_REPLY_BYTES} bytes of JSON")
        return line

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@atexit.register
def _stop_all() -> None:
    while _idle:
        _idle.pop().kill()


async def evaluate_in_worker(source: str, context: Mapping[str, object], functions: list[str], timeout_s: float) -> Any:
    """Evaluate ``source`` against ``context`` in a worker, within ``timeout_s``.

    Returns:
        The reply: ``{"value": ...}`` or ``{"error": ..., "missing": ...}``; None when the deadline passed
        (the worker was killed).

    Raises:
        TypeError: the context is not JSON data.
        WorkerDied: the worker died while evaluating, or its reply was too large (it is killed).
        OSError: no worker could be started.
    """
    request = orjson.dumps({"source": source, "context": context, "functions": functions})
    async with _workers():
        worker = _idle.pop() if _idle else _Worker()
        try:
            with trio.fail_after(READY_TIMEOUT_S):
                await trio.to_thread.run_sync(worker.wait_ready, abandon_on_cancel=True)
            with trio.move_on_after(timeout_s):
                line = await trio.to_thread.run_sync(worker.ask, request, abandon_on_cancel=True)
                _idle.append(worker)
                reply: dict[str, Any] = orjson.loads(line)
                return reply
            worker.kill()  # the deadline passed: the thread reading its pipe sees EOF and ends
            return None
        except BaseException:
            if worker not in _idle:
                worker.kill()
            raise
