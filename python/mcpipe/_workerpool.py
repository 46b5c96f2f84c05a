"""Killable worker processes: the one pool behind every piece of work that may run long or grow huge in a
way that cannot be interrupted in process (issue 31).

A :class:`WorkerPool` runs one worker program (``argv``, a script that imports nothing of mcpipe, so it starts
in the time Python takes) in up to ``size`` processes and owns what each user would otherwise build again:

- **Spawning.** A worker is started when a call finds none idle; it says ``ready`` on its stdout once it has
  imported what it needs (within ``start_timeout_s``, else :class:`WorkerStartError`). ``prefork`` workers
  can be started ahead (:meth:`WorkerPool.prefork`), so a call finds one warm.
- **Framing.** One request line in on the worker's stdin, one reply line out on its stdout (the request must
  hold no newline: JSON as orjson writes it). A reply longer than ``max_reply_bytes`` kills the worker.
- **Deadlines.** A call's ``timeout_s`` bounds its work, from the request sent to the reply read; past it the
  worker is killed (SIGKILL, whatever it was doing) and the call raises :class:`WorkerTimeout`.
- **Memory.** Each worker's address space is bounded (``RLIMIT_AS`` = ``memory_bytes``, set by the pool on
  the child as soon as it exists): work that builds a huge value fails in the worker, or ends it
  (:class:`WorkerDied`, with its pid and exit status), instead of taking the machine's memory.
- **Respawn.** A killed worker is gone; the next call is served by a fresh one.
- **Bounded size.** At most ``size`` calls hold a worker at once (per Trio run for :meth:`WorkerPool.call`,
  and among threads for :meth:`WorkerPool.call_blocking`); more wait for one. At most ``size`` idle workers
  are kept.
- **Isolation per key.** A call may name a ``key`` (a principal, say): a worker started for one key serves
  only that key, so no state passes between keys; an idle worker of another key is killed to make room.
  With ``reuse=False`` a worker is used once and killed after its reply (no state passes between calls).
- **Shutdown.** :meth:`WorkerPool.shutdown` kills every worker (and at exit, every pool's); a later call
  starts new ones. The async path starts no task and no thread: everything a call does runs in the caller's
  task, under its cancel scope, and a cancelled call kills its worker.

Users: the regular-expression fallback (:mod:`mcpipe._pattern`, from threads) and CEL evaluations that
iterate (:mod:`mcpipe.expr._celworker`, async). ``python`` steps run in the sandbox's fork-server workers
(:mod:`mcpipe._sandbox`: forked warm, a uid and PID namespace each, one fresh worker per step), bounded by
this module's :class:`SizedSlots`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import subprocess
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from mcpipe._util import RunLimiter

if TYPE_CHECKING:
    import trio

__all__ = [
    "SizedSlots",
    "WorkerBusy",
    "WorkerDied",
    "WorkerError",
    "WorkerPool",
    "WorkerStartError",
    "WorkerTimeout",
]

_FIRST_READ = 4096
_READ_CHUNK = 1 << 16


class WorkerError(OSError):
    """A call to a worker pool that got no reply."""


class WorkerStartError(WorkerError):
    """No worker could be started: it exited, or did not say ``ready`` within the start timeout."""


class WorkerBusy(WorkerError):
    """No worker was free within the wait allowed (:meth:`WorkerPool.call_blocking`'s ``wait_s``)."""


class WorkerTimeout(WorkerError):
    """The call's deadline passed before the reply; its worker was killed."""


class WorkerDied(WorkerError):
    """The worker ended without a whole reply (over its memory limit, killed), or its reply was too large
    (then it was killed).

    Attributes:
        too_large: the reply was longer than the pool's ``max_reply_bytes``.
        returncode: the worker's exit status (negative: the signal), None when it was not known.
    """

    def __init__(self, message: str, *, too_large: bool = False, returncode: int | None = None) -> None:
        super().__init__(message)
        self.too_large = too_large
        self.returncode = returncode


class _Ended(Exception):
    """The worker's stdout ended."""


class _TooLarge(Exception):
    """A reply line longer than allowed."""


class _Worker:
    """One worker process. Its pipes are non-blocking; one caller uses it at a time."""

    def __init__(self, argv: Sequence[str], memory_bytes: int, key: Hashable) -> None:
        self.key = key
        self.proc = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        self.pid = self.proc.pid
        if memory_bytes > 0:
            with contextlib.suppress(OSError, AttributeError, ValueError):
                import resource

                resource.prlimit(self.pid, resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin = self.proc.stdin.fileno()
        self.stdout = self.proc.stdout.fileno()
        os.set_blocking(self.stdin, False)
        os.set_blocking(self.stdout, False)
        self.buf = bytearray()
        self.ended = False
        self.ready = False
        self.killed = False

    # --- framing ------------------------------------------------------------------------------------------

    def _line(self, limit: int) -> bytes | None:
        """The first whole line read so far (its newline kept), else None."""
        end = self.buf.find(b"\n")
        if end < 0:
            if len(self.buf) > limit:
                raise _TooLarge
            if self.ended:
                raise _Ended
            return None
        if end + 1 > limit + 1:
            raise _TooLarge
        line = bytes(self.buf[: end + 1])
        del self.buf[: end + 1]
        return line

    def _read_now(self) -> None:
        size = _FIRST_READ  # most replies are short: a large first read would cost its allocation each time
        while not self.ended:
            try:
                chunk = os.read(self.stdout, size)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self.ended = True
                return
            self.buf += chunk
            if len(chunk) < size:  # the pipe held no more (a second read would only say so)
                return
            size = _READ_CHUNK

    def _write_now(self, view: memoryview) -> memoryview:
        try:
            return view[os.write(self.stdin, view) :]
        except BlockingIOError:
            return view
        except OSError:  # the worker is gone (EPIPE): its reply will not come
            self.ended = True
            return view[len(view) :]

    # --- blocking (for threads) ---------------------------------------------------------------------------

    def exchange_blocking(self, request: bytes | None, limit: int, deadline: float) -> bytes | None:
        """Send ``request`` (None: send nothing), answer the reply line; None when ``deadline`` (monotonic)
        passed first."""
        view = self._write_now(memoryview(request)) if request else memoryview(b"")
        while True:  # the buffer holds nothing between calls: wait first
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            readable, writable, _ = select.select([self.stdout], [self.stdin] if view else [], [], left)
            if writable:
                view = self._write_now(view)
            if readable:
                if not self.buf:  # the common case: the whole reply in one read
                    try:
                        chunk = os.read(self.stdout, _FIRST_READ)
                    except BlockingIOError:
                        continue
                    except OSError:
                        chunk = b""
                    if chunk.endswith(b"\n") and chunk.find(b"\n") == len(chunk) - 1 and len(chunk) <= limit + 1:
                        return chunk
                    if not chunk:
                        self.ended = True
                    self.buf += chunk
                    if len(chunk) == _FIRST_READ:
                        self._read_now()
                else:
                    self._read_now()
                line = self._line(limit)
                if line is not None:
                    return line

    # --- async (for Trio) ---------------------------------------------------------------------------------

    async def exchange(self, request: bytes | None, limit: int) -> bytes:
        """Send ``request`` (None: send nothing), answer the reply line (the caller's cancel scope bounds the
        wait)."""
        import trio

        view = memoryview(request or b"")
        while view and not self.ended:
            view = self._write_now(view)
            if view:
                await trio.lowlevel.wait_writable(self.stdin)
        while True:
            self._read_now()
            line = self._line(limit)
            if line is not None:
                return line
            await trio.lowlevel.wait_readable(self.stdout)

    # --- ending -------------------------------------------------------------------------------------------

    def kill(self) -> None:
        """SIGKILL it (idempotent; its pipes stay open until :meth:`close`)."""
        if not self.killed:
            self.killed = True
            with contextlib.suppress(OSError):
                self.proc.kill()

    def returncode(self) -> int | None:
        """Its exit status, once it has ended (waits a little: its stdout ended, so it is ending)."""
        try:
            return self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        """Kill it, reap it, close its pipes."""
        self.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10.0)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


class SizedSlots:
    """Per Trio run, one capacity limiter per size asked for: ``async with slots(n):`` holds one of ``n``
    slots. The bound of workers a pool does not keep itself (the sandbox's fresh worker per ``python`` step,
    :mod:`mcpipe.kinds._pyworker`, whose size is a step's policy)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._var: trio.lowlevel.RunVar[dict[int, trio.CapacityLimiter]] | None = None  # made on first use

    def __call__(self, size: int) -> trio.CapacityLimiter:
        import trio

        if self._var is None:
            self._var = trio.lowlevel.RunVar(self._name)
        try:
            by_size = self._var.get()
        except LookupError:
            by_size = {}
            self._var.set(by_size)
        limiter = by_size.get(size)
        if limiter is None:
            limiter = by_size[size] = trio.CapacityLimiter(size)
        return limiter


_POOLS: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


@atexit.register
def _shutdown_all() -> None:
    for pool in list(_POOLS):
        pool.shutdown()


class WorkerPool:
    """Up to ``size`` killable processes of one worker program (see the module's docstring).

    Args:
        name: what the pool's messages call it (``"pattern"``, ``"CEL"``).
        argv: the worker's command line.
        size: at most this many calls hold a worker at once; at most this many idle workers are kept.
        memory_bytes: each worker's address-space limit (0: none).
        max_reply_bytes: the longest reply line read; past it the worker is killed.
        start_timeout_s: how long a new worker may take to say ``ready``.
        reuse: keep a worker for the next call of its key (False: one call each, then it is killed).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        size: int,
        memory_bytes: int,
        max_reply_bytes: int = 64 * 1024 * 1024,
        start_timeout_s: float = 60.0,
        reuse: bool = True,
    ) -> None:
        if size < 1:
            raise ValueError(f"worker pool {name!r}: size must be at least 1, not {size}")
        self.name = name
        self.argv = tuple(argv)
        self.size = size
        self.memory_bytes = memory_bytes
        self.max_reply_bytes = max_reply_bytes
        self.start_timeout_s = start_timeout_s
        self.reuse = reuse
        self._lock = threading.Lock()
        self._idle: OrderedDict[_Worker, None] = OrderedDict()  # oldest first
        self._busy: set[_Worker] = set()
        self._thread_slots = threading.BoundedSemaphore(size)
        self._run_slots = RunLimiter(f"mcpipe_worker_pool_{name}_{id(self)}", size)
        _POOLS.add(self)

    # --- workers ------------------------------------------------------------------------------------------

    def _checkout(self, key: Hashable) -> _Worker:
        """An idle worker of ``key``, else a new one (an idle worker of another key killed if the pool is
        full)."""
        evict: _Worker | None = None
        with self._lock:
            for worker in reversed(self._idle):
                if worker.key == key:
                    del self._idle[worker]
                    self._busy.add(worker)
                    return worker
            if self._idle and len(self._idle) + len(self._busy) >= self.size:
                evict = next(iter(self._idle))
                del self._idle[evict]
        if evict is not None:
            evict.close()
        worker = _Worker(self.argv, self.memory_bytes, key)
        with self._lock:
            self._busy.add(worker)
        return worker

    def _checkin(self, worker: _Worker, ok: bool) -> None:
        """The call is over: keep the worker for its key's next call, or end it."""
        keep = ok and self.reuse and not worker.killed and not worker.ended and not worker.buf
        with self._lock:
            self._busy.discard(worker)
            if keep and len(self._idle) < self.size:
                self._idle[worker] = None
                return
        worker.close()

    def _died(self, worker: _Worker, too_large: bool) -> WorkerDied:
        if too_large:
            worker.kill()
            return WorkerDied(
                f"worker pool {self.name!r}: worker {worker.pid}'s reply is longer than {self.max_reply_bytes} "
                "bytes (it was killed)",
                too_large=True,
            )
        code = worker.returncode()
        limit = f"{self.memory_bytes // (1024 * 1024)} MB" if self.memory_bytes else "none"
        return WorkerDied(
            f"worker pool {self.name!r}: worker {worker.pid} ended without a reply (exit status {code}; "
            f"its memory limit: {limit}; or it was killed)",
            returncode=code,
        )

    def _timed_out(self, worker: _Worker, timeout_s: float) -> WorkerTimeout:
        worker.kill()
        return WorkerTimeout(
            f"worker pool {self.name!r}: worker {worker.pid} did not reply within {timeout_s * 1000:g} ms "
            "(it was killed)"
        )

    def _not_started(self, worker: _Worker) -> WorkerStartError:
        worker.kill()
        return WorkerStartError(
            f"worker pool {self.name!r}: worker {worker.pid} did not start (no 'ready' within "
            f"{self.start_timeout_s:g} s, or it exited)"
        )

    # --- calls --------------------------------------------------------------------------------------------

    async def call(self, request: bytes, timeout_s: float, *, key: Hashable = None) -> bytes:
        """Send one request line (without its newline) to a worker of ``key``; its reply line (without it).

        Waits for a free slot as long as the caller's cancel scope allows; a cancelled call kills its worker.

        Raises:
            WorkerTimeout: no reply within ``timeout_s`` (the worker was killed).
            WorkerDied: the worker ended without a reply, or its reply was too large.
            WorkerStartError: no worker could be started.
        """
        import trio  # lazily: the blocking path (and the modules that import this one) need no Trio

        async with self._run_slots():
            worker = self._checkout(key)
            ok = False
            try:
                if not worker.ready:
                    with trio.move_on_after(self.start_timeout_s):
                        try:
                            ready = await worker.exchange(None, 64)
                        except (_Ended, _TooLarge):
                            ready = b""
                    if ready != b"ready\n":
                        raise self._not_started(worker)
                    worker.ready = True
                with trio.move_on_after(timeout_s) as scope:
                    try:
                        line = await worker.exchange(request + b"\n", self.max_reply_bytes)
                    except _Ended:
                        raise self._died(worker, False) from None
                    except _TooLarge:
                        raise self._died(worker, True) from None
                if scope.cancelled_caught:
                    raise self._timed_out(worker, timeout_s)
                ok = True
                return line[:-1]
            finally:
                self._checkin(worker, ok)

    def call_blocking(
        self, request: bytes, timeout_s: float, *, key: Hashable = None, wait_s: float | None = None
    ) -> bytes:
        """:meth:`call` for a thread (it blocks; never on the event loop's thread).

        Args:
            wait_s: how long to wait for a free slot (None: as long as it takes).

        Raises:
            WorkerBusy: no slot was free within ``wait_s``.
            WorkerTimeout, WorkerDied, WorkerStartError: as :meth:`call`.
        """
        if not self._thread_slots.acquire(timeout=wait_s):
            raise WorkerBusy(f"worker pool {self.name!r}: no worker was free within {(wait_s or 0) * 1000:g} ms")
        try:
            worker = self._checkout(key)
            ok = False
            try:
                if not worker.ready:
                    try:
                        ready = worker.exchange_blocking(None, 64, time.monotonic() + self.start_timeout_s)
                    except (_Ended, _TooLarge):
                        ready = b""
                    if ready != b"ready\n":
                        raise self._not_started(worker)
                    worker.ready = True
                try:
                    line = worker.exchange_blocking(request + b"\n", self.max_reply_bytes, time.monotonic() + timeout_s)
                except _Ended:
                    raise self._died(worker, False) from None
                except _TooLarge:
                    raise self._died(worker, True) from None
                if line is None:
                    raise self._timed_out(worker, timeout_s)
                ok = True
                return line[:-1]
            finally:
                self._checkin(worker, ok)
        finally:
            self._thread_slots.release()

    def prefork(self, count: int, *, key: Hashable = None) -> None:
        """Start up to ``count`` idle workers of ``key`` now (within the pool's size), so that calls find
        them warm; they say ``ready`` while the caller goes on."""
        with self._lock:
            have = sum(1 for w in self._idle if w.key == key)
            room = self.size - len(self._idle) - len(self._busy)
            want = max(0, min(count - have, room))
        for _ in range(want):
            worker = _Worker(self.argv, self.memory_bytes, key)
            with self._lock:
                self._idle[worker] = None

    # --- the pool -----------------------------------------------------------------------------------------

    def pids(self) -> list[int]:
        """The pids of the workers alive now (idle or in use)."""
        with self._lock:
            return [w.pid for w in (*self._idle, *self._busy) if not w.killed]

    def in_use(self) -> int:
        """How many workers calls hold now."""
        with self._lock:
            return len(self._busy)

    def shutdown(self) -> None:
        """Kill every worker: idle ones are reaped now, those in use end their call (it fails) and are
        reaped by it. A later call starts new ones."""
        with self._lock:
            idle = list(self._idle)
            self._idle.clear()
            busy = list(self._busy)
        for worker in busy:
            worker.kill()
        for worker in idle:
            worker.close()
