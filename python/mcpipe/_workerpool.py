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
  With ``reuse=False`` a worker is used once and killed after its reply (no state passes between calls),
  unless a call names a ``reuse_key``: then a worker that can be reused (:meth:`WorkerProcess.reusable`) is
  kept idle under that key for the next call naming it (a run's later steps), until :meth:`WorkerPool.discard`.
- **Shutdown.** :meth:`WorkerPool.shutdown` kills every worker (and at exit, every pool's); a later call
  starts new ones. The async path starts no task and no thread: everything a call does runs in the caller's
  task, under its cancel scope, and a cancelled call kills its worker.

**Spawners.** How a worker process is made is the pool's :class:`Spawner`: :class:`ExecSpawner` (the
default, from ``argv``) starts a program with line framing on its pipes; the sandbox's spawner
(:class:`mcpipe._sandbox.SandboxSpawner`) forks an isolated worker from its fork server, framed on a socket
of its own, its stdout and stderr read into the call's ``sink``. A spawner's processes
(:class:`WorkerProcess`) frame a request and its reply; the pool does everything else above, the same way
for each.

Users: the regular-expression fallback (:mod:`mcpipe._pattern`, from threads), CEL evaluations that iterate
(:mod:`mcpipe.expr._celworker`, async), and ``python`` steps (:mod:`mcpipe.kinds._pyworker`: one-shot
sandbox workers, keyed by their isolation, with warm spares forked ahead).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import select
import subprocess
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

from mcpipe._util import RunLimiter

__all__ = [
    "EndedWithoutReply",
    "ExecSpawner",
    "ReplyTooLarge",
    "Spawner",
    "WorkerBusy",
    "WorkerDied",
    "WorkerError",
    "WorkerPool",
    "WorkerProcess",
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


class EndedWithoutReply(Exception):
    """Raised by a :class:`WorkerProcess`'s exchange: the worker ended (or closed its reply channel) before a
    whole reply."""


class ReplyTooLarge(Exception):
    """Raised by a :class:`WorkerProcess`'s exchange: the reply is longer than the limit it was given."""


_Ended = EndedWithoutReply
_TooLarge = ReplyTooLarge


class WorkerProcess(Protocol):
    """One worker process as a :class:`Spawner` makes it: it frames a request and its reply; the pool bounds,
    kills and reports it. One caller uses it at a time.

    Attributes:
        key: the key it was made for (it serves no other).
        pid: its pid (0 until it exists).
        killed: :meth:`kill` was called.
    """

    @property
    def key(self) -> Hashable: ...

    @property
    def pid(self) -> int: ...

    @property
    def killed(self) -> bool: ...

    async def start(self) -> None:
        """Wait until it can take a request (the caller's cancel scope bounds the wait).

        Raises:
            OSError: it could not be started.
        """
        ...

    def start_blocking(self, deadline: float) -> bool:
        """:meth:`start` for a thread; False when ``deadline`` (monotonic) passed first.

        Raises:
            OSError: it could not be started.
        """
        ...

    async def exchange(self, request: bytes, limit: int, sink: object, sent: Callable[[], None] | None) -> bytes:
        """Send ``request`` and answer its reply (at most ``limit`` bytes), ``sent()`` called once the request
        is out; what else it prints goes to ``sink`` (the spawner's kind of object; None: dropped).

        Raises:
            EndedWithoutReply, ReplyTooLarge.
        """
        ...

    def exchange_blocking(self, request: bytes, limit: int, deadline: float) -> bytes | None:
        """:meth:`exchange` for a thread; None when ``deadline`` passed first."""
        ...

    def reusable(self) -> bool:
        """Whether it may serve another call (alive, nothing unread)."""
        ...

    def kill(self) -> None:
        """SIGKILL it, whatever it does (non-blocking, idempotent)."""
        ...

    async def exit_status(self) -> int | None:
        """Its exit status once it has ended without a reply (negative: a signal; None: not known soon)."""
        ...

    def exit_status_blocking(self) -> int | None:
        """:meth:`exit_status` for a thread."""
        ...

    def close(self) -> None:
        """Kill it and let go of all it holds (its pipes, its process)."""
        ...


class Spawner(Protocol):
    """How a pool's worker processes are made."""

    def spawn(self, key: Hashable) -> WorkerProcess:
        """A new worker process for ``key``, without waiting for it to be ready (:meth:`WorkerProcess.start`
        waits)."""
        ...

    def limit_text(self) -> str:
        """Its workers' memory limit, as the pool's messages name it."""
        ...


class ExecSpawner:
    """Workers that are a program (``argv``) started as a child, speaking lines on its stdin and stdout: it
    says ``ready`` once started, then answers each request line with one reply line. Its address space is
    bounded (``RLIMIT_AS`` = ``memory_bytes``, 0: none), set on the child as soon as it exists."""

    def __init__(self, argv: Sequence[str], memory_bytes: int = 0) -> None:
        self.argv = tuple(argv)
        self.memory_bytes = memory_bytes

    def spawn(self, key: Hashable) -> _Worker:
        return _Worker(self.argv, self.memory_bytes, key)

    def limit_text(self) -> str:
        return f"{self.memory_bytes // (1024 * 1024)} MB" if self.memory_bytes else "none"


class _Worker:
    """One worker process of an :class:`ExecSpawner`. Its pipes are non-blocking; one caller uses it at a
    time."""

    def __init__(self, argv: Sequence[str], memory_bytes: int, key: Hashable) -> None:
        self.key: Hashable = key
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

    def exchange_blocking_line(self, request: bytes | None, limit: int, deadline: float) -> bytes | None:
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

    async def _exchange_line(self, request: bytes | None, limit: int, sent: Callable[[], None] | None = None) -> bytes:
        """Send ``request`` (None: send nothing), then call ``sent()``; answer the reply line (the caller's
        cancel scope bounds the wait)."""
        import trio

        view = memoryview(request or b"")
        while view and not self.ended:
            view = self._write_now(view)
            if view:
                await trio.lowlevel.wait_writable(self.stdin)
        if sent is not None:
            sent()
        while True:
            self._read_now()
            line = self._line(limit)
            if line is not None:
                return line
            await trio.lowlevel.wait_readable(self.stdout)

    # --- the WorkerProcess protocol: a "ready" line first, then a line each way ---------------------------

    async def start(self) -> None:
        if self.ready:
            return
        try:
            said = await self._exchange_line(None, 64)
        except (_Ended, _TooLarge):
            said = b""
        if said != b"ready\n":
            raise OSError(f"worker {self.pid} exited or said {said[:64]!r}, not 'ready'")
        self.ready = True

    def start_blocking(self, deadline: float) -> bool:
        if self.ready:
            return True
        try:
            said = self.exchange_blocking_line(None, 64, deadline)
        except (_Ended, _TooLarge):
            said = b""
        if said is None:
            return False
        if said != b"ready\n":
            raise OSError(f"worker {self.pid} exited or said {said[:64]!r}, not 'ready'")
        self.ready = True
        return True

    async def exchange(self, request: bytes, limit: int, sink: object, sent: Callable[[], None] | None) -> bytes:
        return (await self._exchange_line(request + b"\n", limit, sent))[:-1]

    def exchange_blocking(self, request: bytes, limit: int, deadline: float) -> bytes | None:
        line = self.exchange_blocking_line(request + b"\n", limit, deadline)
        return None if line is None else line[:-1]

    def reusable(self) -> bool:
        return not self.killed and not self.ended and not self.buf

    async def exit_status(self) -> int | None:
        return self.returncode()

    def exit_status_blocking(self) -> int | None:
        return self.returncode()

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


_POOLS: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


@atexit.register
def _shutdown_all() -> None:
    for pool in list(_POOLS):
        pool.shutdown()


class WorkerPool:
    """Up to ``size`` killable worker processes (see the module's docstring).

    Args:
        name: what the pool's messages call it (``"pattern"``, ``"CEL"``).
        spawner: how a worker is made: a :class:`Spawner`, or the command line of an :class:`ExecSpawner`
            (bounded by ``memory_bytes``).
        size: at most this many calls hold a worker at once; at most this many idle workers are kept.
        memory_bytes: each worker's address-space limit (0: none), for a command line.
        max_reply_bytes: the longest reply read; past it the worker is killed.
        start_timeout_s: how long a new worker may take to be ready.
        reuse: keep a worker for the next call of its key (False: one call each, then it is killed).
        spares: idle workers kept beyond ``size`` (a one-shot pool's warm spares, :meth:`prefork`).
    """

    def __init__(
        self,
        name: str,
        spawner: Spawner | Sequence[str],
        *,
        size: int,
        memory_bytes: int = 0,
        max_reply_bytes: int = 64 * 1024 * 1024,
        start_timeout_s: float = 60.0,
        reuse: bool = True,
        spares: int = 0,
    ) -> None:
        if size < 1:
            raise ValueError(f"worker pool {name!r}: size must be at least 1, not {size}")
        self.name = name
        self.spawner: Spawner = ExecSpawner(spawner, memory_bytes) if isinstance(spawner, Sequence) else spawner
        self.size = size
        self.spares = max(0, spares)
        self.max_reply_bytes = max_reply_bytes
        self.start_timeout_s = start_timeout_s
        self.reuse = reuse
        self._lock = threading.Lock()
        # Oldest first; each under the key a call must name to take it: its own, or the reuse key it was kept for.
        self._idle: OrderedDict[WorkerProcess, Hashable] = OrderedDict()
        self._busy: set[WorkerProcess] = set()
        self._thread_slots = threading.BoundedSemaphore(size)
        self._run_slots = RunLimiter(f"mcpipe_worker_pool_{name}_{id(self)}", size)
        _POOLS.add(self)

    # --- workers ------------------------------------------------------------------------------------------

    def _checkout(self, key: Hashable, fresh: bool = False, reuse_key: Hashable = None) -> tuple[WorkerProcess, bool]:
        """An idle worker kept for ``reuse_key``, else an idle one of ``key`` (unless ``fresh``), else a new
        one (an idle worker of another key killed if the pool is full); and whether it was idle."""
        evict: WorkerProcess | None = None
        with self._lock:
            if not fresh:
                # A reused worker: the one used last (its caches warm). A one-shot spare: the oldest, the one
                # most likely to have finished starting.
                found = self._take_idle(reuse_key, newest=True) if reuse_key is not None else None
                if found is None:
                    found = self._take_idle(key, newest=self.reuse)
                if found is not None:
                    return found, True
            if self._idle and len(self._idle) + len(self._busy) >= self.size + self.spares:
                evict = next(iter(self._idle))
                del self._idle[evict]
        if evict is not None:
            evict.close()
        worker = self.spawner.spawn(key)
        with self._lock:
            self._busy.add(worker)
        return worker, False

    def _take_idle(self, kept_for: Hashable, newest: bool) -> WorkerProcess | None:
        """Under the lock: the idle worker kept for ``kept_for`` (the newest or the oldest), now busy."""
        for worker, key in reversed(self._idle.items()) if newest else self._idle.items():
            if key == kept_for:
                del self._idle[worker]
                self._busy.add(worker)
                return worker
        return None

    def _checkin(self, worker: WorkerProcess, ok: bool, reuse_key: Hashable = None) -> None:
        """The call is over: keep the worker for its key's next call (or ``reuse_key``'s), or end it."""
        keep = ok and (self.reuse or reuse_key is not None) and worker.reusable()
        with self._lock:
            self._busy.discard(worker)
            if keep and len(self._idle) < self.size + (0 if reuse_key is None else self.spares):
                self._idle[worker] = worker.key if reuse_key is None else reuse_key
                return
        worker.close()

    def _too_large(self, worker: WorkerProcess, limit: int) -> WorkerDied:
        worker.kill()
        return WorkerDied(
            f"worker pool {self.name!r}: worker {worker.pid}'s reply is longer than {limit} bytes (it was killed)",
            too_large=True,
        )

    def _died(self, worker: WorkerProcess, code: int | None) -> WorkerDied:
        return WorkerDied(
            f"worker pool {self.name!r}: worker {worker.pid} ended without a reply (exit status {code}; "
            f"its memory limit: {self.spawner.limit_text()}; or it was killed)",
            returncode=code,
        )

    def _timed_out(self, worker: WorkerProcess, timeout_s: float) -> WorkerTimeout:
        worker.kill()
        return WorkerTimeout(
            f"worker pool {self.name!r}: worker {worker.pid} did not reply within {timeout_s * 1000:g} ms "
            "(it was killed)"
        )

    def _not_started(self, worker: WorkerProcess, why: object = None) -> WorkerStartError:
        worker.kill()
        because = f": {why}" if why else f" (not ready within {self.start_timeout_s:g} s, or it exited)"
        which = f"worker {worker.pid}" if worker.pid else "a new worker"
        return WorkerStartError(f"worker pool {self.name!r}: {which} did not start{because}")

    # --- calls --------------------------------------------------------------------------------------------

    async def call(
        self,
        request: bytes,
        timeout_s: float,
        *,
        key: Hashable = None,
        sink: object = None,
        limit: int | None = None,
        prefork: int = 0,
        start_in_deadline: bool = False,
        reuse_key: Hashable = None,
    ) -> bytes:
        """Send one request (for an :class:`ExecSpawner`: a line without its newline) to a worker of ``key``;
        its reply.

        Waits for a free slot as long as the caller's cancel scope allows; a cancelled call kills its worker.

        Args:
            sink: where the worker's other output goes (its spawner's kind of object).
            limit: the longest reply (default: the pool's ``max_reply_bytes``).
            prefork: once the request is sent, idle workers of ``key`` are started up to this many
                (:meth:`prefork`), while this call waits anyway.
            start_in_deadline: ``timeout_s`` bounds the worker's start too (else only the exchange).
            reuse_key: take a worker kept for this key if there is one, and keep this call's worker for it
                afterwards if it can be reused (until :meth:`discard`); a one-shot pool's workers too.

        Raises:
            WorkerTimeout: no reply within ``timeout_s`` (the worker was killed).
            WorkerDied: the worker ended without a reply, or its reply was too large.
            WorkerStartError: no worker could be started.
        """
        import trio  # lazily: the blocking path (and the modules that import this one) need no Trio

        limit = self.max_reply_bytes if limit is None else limit
        sent = (lambda: self.prefork(prefork, key=key)) if prefork > 0 else None
        async with self._run_slots():
            worker: WorkerProcess | None = None
            with trio.move_on_after(timeout_s if start_in_deadline else math.inf):
                worker = await self._started(key, reuse_key)
                ok = False
                try:
                    with trio.move_on_after(timeout_s) as scope:
                        try:
                            reply = await worker.exchange(request, limit, sink, sent)
                        except _Ended:
                            raise self._died(worker, await worker.exit_status()) from None
                        except _TooLarge:
                            raise self._too_large(worker, limit) from None
                    if not scope.cancelled_caught:
                        ok = True
                        return reply
                finally:
                    if not ok:
                        worker.kill()
                    self._checkin(worker, ok, reuse_key)
            if worker is None:
                raise WorkerTimeout(f"worker pool {self.name!r}: no worker was ready within {timeout_s * 1000:g} ms")
            raise self._timed_out(worker, timeout_s)

    async def _started(self, key: Hashable, reuse_key: Hashable = None) -> WorkerProcess:
        """A worker of ``key`` ready for a request: an idle one (kept for ``reuse_key`` first), else a new one;
        an idle one that cannot start (its spawner's state went stale: a fork server replaced) is dropped for
        one new one."""
        import trio

        for fresh in (False, True):
            worker, was_idle = self._checkout(key, fresh, reuse_key)
            failed: OSError | None = None
            try:
                with trio.move_on_after(self.start_timeout_s):
                    try:
                        await worker.start()
                    except OSError as e:
                        failed = e
                    else:
                        return worker
            except BaseException:
                self._checkin(worker, False)
                raise
            self._checkin(worker, False)
            if not was_idle:
                raise self._not_started(worker, failed)
        raise AssertionError("unreachable")

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
            worker, _ = self._checkout(key)
            ok = False
            try:
                try:
                    started = worker.start_blocking(time.monotonic() + self.start_timeout_s)
                except OSError as e:
                    raise self._not_started(worker, e) from None
                if not started:
                    raise self._not_started(worker)
                try:
                    reply = worker.exchange_blocking(request, self.max_reply_bytes, time.monotonic() + timeout_s)
                except _Ended:
                    raise self._died(worker, worker.exit_status_blocking()) from None
                except _TooLarge:
                    raise self._too_large(worker, self.max_reply_bytes) from None
                if reply is None:
                    raise self._timed_out(worker, timeout_s)
                ok = True
                return reply
            finally:
                self._checkin(worker, ok)
        finally:
            self._thread_slots.release()

    def prefork(self, count: int, *, key: Hashable = None) -> None:
        """Start up to ``count`` idle workers of ``key`` now (within the pool's size and spares), so that calls
        find them warm; they get ready while the caller goes on."""
        with self._lock:
            have = sum(1 for kept_for in self._idle.values() if kept_for == key)
            room = self.size + self.spares - len(self._idle) - len(self._busy)
            want = max(0, min(count - have, room))
        for _ in range(want):
            try:
                worker = self.spawner.spawn(key)
            except OSError:  # the next call finds out why, and says so
                return
            with self._lock:
                self._idle[worker] = key

    # --- the pool -----------------------------------------------------------------------------------------

    def pids(self) -> list[int]:
        """The pids of the workers alive now (idle or in use)."""
        with self._lock:
            return [w.pid for w in (*self._idle, *self._busy) if not w.killed and w.pid]

    def in_use(self) -> int:
        """How many workers calls hold now."""
        with self._lock:
            return len(self._busy)

    def idle(self, key: Hashable = None) -> int:
        """How many idle workers of ``key`` (or kept for that reuse key) are kept now."""
        with self._lock:
            return sum(1 for kept_for in self._idle.values() if kept_for == key)

    def discard(self, reuse_key: Hashable) -> int:
        """Kill the idle workers kept for ``reuse_key`` (its run is over); how many there were."""
        with self._lock:
            gone = [w for w, kept_for in self._idle.items() if kept_for == reuse_key]
            for worker in gone:
                del self._idle[worker]
        for worker in gone:
            worker.close()
        return len(gone)

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
