"""Isolated worker processes: forked warm from a fork server, one per use, each killed with all it started.

The code of ``python`` steps (and the programs of ``command`` and ``shell`` steps) runs in a **worker**: a
process forked by the sandbox's fork server (:mod:`mcpipe._sandbox._zygote`, ``python -I``, started on first
use, shared by every Trio run of this process), which has started Python and imported what a worker needs.
What a worker gets depends on what the kernel allows, found out when the fork server starts
(:func:`isolation`): a uid of its own (the server runs as root), a PID namespace of its own in which it is
process 1 (so the kernel kills whatever it started, ``setsid`` or not, when it ends), a ``/proc`` that shows
only its own processes, its limits as soft = hard (it cannot raise them), no capabilities, ``no_new_privs``,
not dumpable; see docs/declared-pipelines.md ("What the isolation promises").

The server's side never blocks the event loop and never waits without a deadline: a request to the fork
server is one non-blocking ``send`` (under a lock held for that call only), and each worker answers on
sockets of its own, so no caller waits behind another. A fork server that stops answering (stopped, wedged,
dead) is found out by the first caller whose worker does not come within :data:`SPAWN_TIMEOUT_S` (or at
once, when ``/proc`` says it is stopped), and replaced; the workers it had started run to their end.

**Warm workers.** One-shot workers are run by :mod:`mcpipe._workerpool` (:class:`SandboxSpawner`): the
pool keeps up to ``prefork`` spares of each shape forked and waiting, so a caller takes one (no fork on its
path), and once it has sent its request (while it would wait anyway) the pool asks for its replacement. A
worker is never used twice: no state passes from one use to the next. The pool bounds the calls, their
deadlines (it kills a worker past its own), and reports a worker's death with its exit status.

**A step's path.** One send of the request; one wait on an epoll set that holds the worker's socket, pipes
and pidfd (made with the worker, off the path); the reply read as soon as it is whole. A worker waiting for its
request and the event loop's thread ask for a short time slice (:data:`SLICE_US`), so that each of a step's
two hand-offs wakes its process at once rather than after another's slice. The fork server does not (it
resets its own to the kernel's default): its forks are for later steps, and must not take the core from
the step that runs.

What a worker left when it ended (its process, its working directory, its uid) is collected by one daemon
thread (the *reaper*), off the callers' path: a uid is given out again only once the fork server has said
that the worker and every process of that uid are gone. Each server on a host has a block of uids of its own
(:func:`claim_uid_base`): a worker's end kills every process of its uid, which must never be another server's.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import functools
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from mcpipe._sandbox._zygote import short_slice

__all__ = [
    "SANDBOX",
    "SPAWN_TIMEOUT_S",
    "UID_BASE",
    "UID_BLOCK",
    "UID_COUNT",
    "Isolation",
    "Sandbox",
    "SandboxError",
    "SandboxProcess",
    "SandboxSpawner",
    "Shape",
    "Worker",
    "claim_uid_base",
    "isolation",
]

UID_BASE = 0x6D700000
"""The first uid workers run as when the server runs as root (``0x6D70`` is "mp"): a server's worker ``n``
runs as its base (:func:`claim_uid_base`, ``UID_BASE`` for the first server of a host) plus ``n``. No account
needs to exist for them."""

UID_COUNT = 4096
"""How many such uids: at most this many workers alive at once (running, spare, or being collected)."""

UID_BLOCK = 8192
"""The uids one server's workers take, from its base (:func:`claim_uid_base`): the base and ``UID_COUNT`` more."""
UID_BLOCKS = 4096
"""How many servers on one host can each hold a block of uids (the last uid is about 1.87e9, below 2**31)."""
UID_LOCKS = "/run/mcpipe-uids"
"""Where servers claim their blocks: one file a block, held with ``flock`` for the server's life."""


def claim_uid_base(locks: str = UID_LOCKS) -> tuple[int, int | None]:
    """A base of :data:`UID_BLOCK` uids no other server on this host uses, and the descriptor holding it.

    The first block whose lock file in ``locks`` takes an exclusive ``flock`` is this process's until it ends
    (the kernel drops the lock with the process, however it ends). Where the directory cannot be made or
    locked (no ``/run``, not root), the block is the pid's: distinct from any other live server's but for a
    pid collision modulo :data:`UID_BLOCKS`, and the descriptor is None.
    """
    try:
        os.makedirs(locks, mode=0o700, exist_ok=True)
        info = os.lstat(locks)
        if info.st_uid != os.geteuid() or info.st_mode & 0o022:
            raise PermissionError(f"{locks} is not this user's alone")
        for block in range(UID_BLOCKS):
            fd = os.open(os.path.join(locks, str(block)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return UID_BASE + block * UID_BLOCK, fd
    except OSError:
        pass
    return UID_BASE + (os.getpid() % UID_BLOCKS) * UID_BLOCK, None


@functools.cache
def _uid_base() -> int:
    """This server's uid base, claimed once (the lock's descriptor stays open for the process's life)."""
    return claim_uid_base()[0]


SPAWN_TIMEOUT_S = 5.0
"""A fork server that has not forked a worker asked for within this long is wedged, and is replaced."""

SLICE_US = 100
"""The time slice the workers (once they wait for their request, unless forked busy: :data:`BUSY_AT`) and
the event loop's thread that talks to them ask the kernel for (``sched_setattr``'s ``sched_runtime``, Linux
6.12+; 0: the kernel's default). A short slice wakes a worker blocked on its request, and the server on the
reply, ahead of what else holds the core: a step's two hand-offs do not each wait out another process's
slice. It gives no more CPU, only sooner."""

BUSY_AT = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
"""A worker forked while this many of its fork server's workers are in use (the cores this process may run
on), or more, is forked *busy*: the cores are all taken by steps then. A busy worker neither walks a
request's path while it waits (``_zygote._rehearse``) nor asks for the short slice (:data:`SLICE_US`). The
walk would only add its CPU (about 0.3 ms a worker here) to what the steps need, instead of taking a wait off
anyone's path; and the short slice would let each worker the server wakes take the core from the server,
which every step of every run passes through. A worker forked with cores to spare does both, so that a step's
page faults come before it and its wake-up does not wait out another process's slice (docs/performance.md,
8 December)."""

EXIT_WAIT_S = 2.0
"""How long to wait for a worker's exit status once it has ended without answering (the fork server
reports it; a fork server that does not, answers "unknown")."""

MAX_USES = 256
"""The most requests one reused worker serves (:attr:`Shape.reuse`); then it ends and a fresh one follows.
Its CPU limit's hard part covers this many steps' budgets (each step's own is the soft part)."""

START_TIMEOUT_S = 60.0
"""How long a new fork server may take to start (Python's start-up and imports, on a loaded machine)."""

_SCRIPT = str(Path(__file__).with_name("_zygote.py"))
_LAUNCH = """\
import sys, types
from importlib.machinery import SourceFileLoader
zygote = types.ModuleType("_zygote")
zygote.__file__ = sys.argv[1]
SourceFileLoader("_zygote", sys.argv[1]).exec_module(zygote)
zygote.main(sys.argv[2:])
"""
"""How the fork server starts (``python -I -c _LAUNCH _zygote.py FD CONFIG``): its file loaded as an import
would load it, from the bytecode cached in ``__pycache__`` (the server's own import of the module wrote it),
where running it as a script would compile its source at every start (and leave the compiler's garbage in
the heap every worker's fork copies)."""
_HEADER = struct.Struct(">I")


class SandboxError(OSError):
    """No worker could be had: the fork server cannot start, or did not fork one in time."""


@dataclass(frozen=True)
class Isolation:
    """What the workers get on this machine (the fork server's probe).

    Attributes:
        uid: each worker runs as a uid of its own (the server runs as root).
        userns: the fork server entered a user namespace (not root, and the kernel allows one).
        pidns: each worker is process 1 of a PID namespace of its own.
        proc: each worker's ``/proc`` shows only the processes of its PID namespace.
        dumpable: the fork server and the workers are not dumpable (``PR_SET_DUMPABLE`` 0).
        subreaper: without a PID namespace, the fork server is a child subreaper.
        hidden: directories above Python's files a worker's uid cannot enter, covered in a worker's view.
        reasons: what is missing, and why.
    """

    uid: bool = False
    userns: bool = False
    pidns: bool = False
    proc: bool = False
    dumpable: bool = False
    subreaper: bool = False
    hidden: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()

    @classmethod
    def of(cls, raw: dict[str, Any]) -> Isolation:
        return cls(
            uid=bool(raw.get("uid")),
            userns=bool(raw.get("userns")),
            pidns=bool(raw.get("pidns")),
            proc=bool(raw.get("proc")),
            dumpable=bool(raw.get("dumpable")),
            subreaper=bool(raw.get("subreaper")),
            hidden=tuple(raw.get("hidden") or ()),
            reasons=tuple(raw.get("reasons") or ()),
        )


@dataclass(frozen=True, slots=True)
class Shape:
    """What kind of worker: its role (``python``, or ``exec`` for a program) and how it is isolated.

    Attributes:
        role: a role registered with :meth:`Sandbox.register_role`, or ``exec``.
        separate_uid: run it as a uid of its own where the server may (else as the server's uid).
        namespaces: give it a PID namespace (and ``/proc``) of its own where the kernel allows.
        imports: modules the worker imports once it is forked, while it waits for its request (the fork
            server has only what every worker needs: a module that a few steps need, ``asyncio`` for a
            coroutine, would make every fork and every exit dearer).
        reuse: after its reply the worker may wait for another request (of the same run and principal: the
            caller keeps it for them, :mod:`mcpipe.kinds._pyworker`), instead of ending; it does only where
            it is alone in a PID namespace or under a uid of its own (what it left is then killed between
            requests). Its fixed limits are those of its first request.
    """

    role: str
    separate_uid: bool = True
    namespaces: bool = True
    imports: tuple[str, ...] = ()
    reuse: bool = False


_PR_SET_DUMPABLE = 4


def _not_dumpable() -> None:
    """This process (the server) not dumpable: a process of its uid without ``CAP_SYS_PTRACE`` cannot read
    its ``/proc/PID/environ`` or ``mem``, nor attach to it."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def fork_server_env() -> dict[str, str]:
    """The fork server's environment as it starts: the server's ``PATH``, locale and time zone, nothing
    else. It empties it once started (``_zygote.Zygote.serve``): a worker's environment is a step's ``env``
    only."""
    return {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TZ") if k in os.environ}


class _Zygote:
    """One fork server process (one generation)."""

    def __init__(self, generation: int, roles: dict[str, str]) -> None:
        self.generation = generation
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        uid_base = _uid_base() if os.geteuid() == 0 else UID_BASE  # a base matters only to root
        config = {"uid_base": uid_base, "roles": roles, "slice_us": SLICE_US}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _LAUNCH, _SCRIPT, str(theirs.fileno()), json.dumps(config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                env=fork_server_env(),
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self.users = 0
        self.retired = False
        try:
            ours.settimeout(START_TIMEOUT_S)
            hello = json.loads(ours.recv(65536) or b"{}")
        except (OSError, ValueError) as e:
            self.kill()
            raise SandboxError(f"the sandbox's fork server did not start: {e}") from None
        if "hello" not in hello:
            self.kill()
            raise SandboxError("the sandbox's fork server did not start (it exited)")
        ours.setblocking(False)
        self.isolation = Isolation.of(hello["hello"])
        self.modules: tuple[str, ...] = tuple(hello.get("modules") or ())
        """The modules the fork server holds once started (:data:`_zygote.IMAGE` says which it may)."""

    def send(self, message: Mapping[str, object], fds: list[int]) -> None:
        """One request (non-blocking: a fork server that does not read is wedged, BlockingIOError)."""
        socket.send_fds(self.sock, [json.dumps(message).encode()], fds)

    def state(self) -> str:
        """Its state as ``/proc`` tells it (``R``, ``S``, ``T`` stopped, ``Z``...; ``X``: gone)."""
        if self.proc.poll() is not None:
            return "X"
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as f:
                data = f.read()
        except OSError:
            return "X"
        return data[data.rfind(b")") + 2 :][:1].decode()

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            self.proc.kill()
        _REAPER.reap_process(self.proc)


@dataclass(eq=False)
class Worker:
    """The server's side of one worker: its sockets and pipes, and once forked its pid, pidfd and cwd.

    Attributes:
        io: the worker's request and reply (a stream socket).
        out, err: the read ends of its stdout and stderr (non-blocking).
        stdin: the write end of its stdin (``exec`` workers given one), else -1.
    """

    shape: Shape
    zygote: _Zygote
    uid: int | None
    st: socket.socket
    io: socket.socket
    out: int
    err: int
    stdin: int = -1
    pid: int = 0
    pidfd: int = -1
    cwd: str = ""
    exit_code: int | None = None
    exited: bool = False
    killed: bool = False
    loops: bool = False
    """It waits for another request after a reply (its shape asks to be reused and it can be, the fork server
    says): an exchange leaves it alive."""
    uses: int = 0
    streams_ended: bool = False
    """It closed its stdout or stderr: what it would print next could not be read (so it is not reused)."""
    _closed: bool = False
    poller: select.epoll | None = None
    """Its request socket, its pipes and (once forked) its pidfd in one epoll set, made when it is asked
    for: a use waits on this one descriptor for whatever the worker does next (:func:`exchange`)."""

    async def ready(self, sandbox: Sandbox) -> None:
        """Wait until the fork server has forked it (its answer on ``st``).

        Raises:
            SandboxError: it failed to, or the fork server is stopped or wedged (then it is replaced).
        """
        if self.pid or self._try_ack():
            return
        give_up = trio.current_time() + SPAWN_TIMEOUT_S
        while True:
            with trio.move_on_after(0.2):
                await trio.lowlevel.wait_readable(self.st)
                self._read_ack()
                return
            state = self.zygote.state()
            if state in ("T", "t", "X", "Z") or trio.current_time() >= give_up:
                sandbox.replace(self.zygote, f"state {state}" if state != "R" else "no answer")
                raise SandboxError(
                    f"the sandbox's fork server did not fork a worker ({'stopped' if state in 'Tt' else 'wedged'})"
                )

    def _try_ack(self) -> bool:
        """Read the fork server's answer if it is here already (a spare forked a while ago): no trip through
        the event loop then. False when it has not come yet."""
        try:
            got = socket.recv_fds(self.st, 65536, 1)
        except BlockingIOError:
            return False
        self._take_ack(*got[:2])
        return True

    def _read_ack(self) -> None:
        try:
            msg, fds, _, _ = socket.recv_fds(self.st, 65536, 1)
        except BlockingIOError:
            raise SandboxError("the fork server's answer was lost") from None
        self._take_ack(msg, fds)

    def _take_ack(self, msg: bytes, fds: list[int]) -> None:
        answer = json.loads(msg) if msg else {"error": "the fork server exited"}
        if "pid" not in answer:
            for fd in fds:
                os.close(fd)
            raise SandboxError(str(answer.get("error") or "the fork server did not fork a worker"))
        self.pid = int(answer["pid"])
        self.pidfd = fds[0]
        self.cwd = str(answer.get("cwd") or "")
        self.loops = bool(answer.get("loops"))
        if self.poller is not None:
            self.poller.register(self.pidfd, select.EPOLLIN)

    def settle(self) -> bool:
        """A kept worker before its next use: whether it is still there (not killed, not ended) and its reply
        socket holds nothing (what a thread of an earlier step wrote there would be read as the next step's
        reply), with what the threads of an earlier step printed since its last reply drained (it is not the
        next step's). One poll of its epoll set says all of it, where nothing happened since (the common
        case)."""
        if self.killed or self.poller is None:
            return False
        events = self.poller.poll(0)
        if not events:
            return True
        stale = Output(0)
        io = self.io.fileno()
        for fd, _ in events:
            if fd == self.pidfd or fd == io:
                return False
            if fd == self.out or fd == self.err:
                stale.read_now(fd, stale.out)
        return True

    def kill(self) -> None:
        """SIGKILL it (in a PID namespace: everything it started too); non-blocking, idempotent."""
        if self.pidfd >= 0 and not self.killed:
            self.killed = True
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    async def exit_status(self, wait_s: float) -> int | None:
        """Its exit status as the fork server reports it, waiting at most ``wait_s`` (None: unknown)."""
        if self.exited:
            return self.exit_code
        with trio.move_on_after(wait_s):
            while True:
                await trio.lowlevel.wait_readable(self.st)
                try:
                    msg = self.st.recv(4096)
                except BlockingIOError:
                    continue
                self.exited = True
                if msg:
                    with contextlib.suppress(ValueError):
                        code = json.loads(msg).get("exit")
                        self.exit_code = int(code) if code is not None else None
                return self.exit_code
        return None

    def close_streams(self) -> None:
        """Close the server's ends of its request socket and pipes (nothing may wait on them)."""
        if self._closed:
            return
        self._closed = True
        for fd in (self.out, self.err, self.stdin):
            if fd >= 0:
                with contextlib.suppress(OSError, RuntimeError):  # RuntimeError: not in a Trio run
                    trio.lowlevel.notify_closing(fd)
                with contextlib.suppress(OSError):
                    os.close(fd)
        with contextlib.suppress(OSError, RuntimeError):
            trio.lowlevel.notify_closing(self.io)
        self.io.close()
        if self.poller is not None:
            with contextlib.suppress(OSError, RuntimeError):
                trio.lowlevel.notify_closing(self.poller.fileno())
            self.poller.close()


class _Reaper:
    """One daemon thread that collects ended workers: waits until the fork server says a worker and all of
    its processes are gone (its ``st`` closes; the fork server has removed its working directory by then),
    then closes its pidfd and gives its uid back (and removes the directory when the fork server died
    first). Also reaps replaced fork servers.

    A worker's ``st`` goes into the thread's epoll set as it is collected (``epoll_ctl`` from the collecting
    thread: the reaper is not woken for it, and does not build its wait set again for each wake-up)."""

    def __init__(self, release_uid: Any) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, Worker] = {}
        self._procs: list[subprocess.Popen[bytes]] = []
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._poller = select.epoll()
        self._poller.register(self._wake_r, select.EPOLLIN)
        self._thread: threading.Thread | None = None
        self._release_uid = release_uid

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mcpipe-sandbox-reaper", daemon=True)
                self._thread.start()

    def collect(self, worker: Worker) -> None:
        fd = worker.st.fileno()
        with self._lock:
            if fd in self._pending:  # collected already
                return
            self._pending[fd] = worker
        self._poller.register(fd, select.EPOLLIN)
        self._start()

    def reap_process(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs.append(proc)
        self._start()
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")  # its wait gets a timeout now, to poll the process

    def _run(self) -> None:
        short_slice(SLICE_US)  # it takes the GIL now and then: preempted holding it, it must not hold it long
        while True:
            with self._lock:
                procs = list(self._procs)
            for proc in procs:
                if proc.poll() is not None:
                    with self._lock:
                        self._procs.remove(proc)
            for fd, _ in self._poller.poll(1.0 if procs else -1):
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                    continue
                with self._lock:
                    w = self._pending.get(fd)
                if w is not None:
                    self._settle(w)

    def _settle(self, w: Worker) -> None:
        try:
            msg = w.st.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            msg = b""
        if msg:  # the exit message; the end of the socket follows
            w.exited = True
            return
        with self._lock:
            del self._pending[w.st.fileno()]
        self._poller.unregister(w.st)
        w.st.close()
        if w.pidfd >= 0:
            os.close(w.pidfd)
        if w.cwd and not w.exited:  # the fork server removes it once the worker ended: unless it died first
            shutil.rmtree(w.cwd, ignore_errors=True)
        # The uid is free only when the fork server said the worker ended (and swept its uid); a fork server
        # that died first said nothing, and a uid that may still run something is not given out again.
        if w.uid is not None and w.exited:
            self._release_uid(w.uid)


class Sandbox:
    """The process's workers: the fork server and the uids (one instance, :data:`SANDBOX`). The warm spares
    of one-shot workers are kept by the pool that uses them (:class:`SandboxSpawner`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._roles: dict[str, str] = {}
        self._zygote: _Zygote | None = None
        self._generation = 0
        self._free_uids: list[int] = []
        self._next_uid = 0
        self.replaced = 0
        """How many fork servers were found stopped or wedged and replaced (a test reads it)."""

    def register_role(self, name: str, path: str) -> None:
        """A role: a file (importing nothing of mcpipe) with ``handle(header, body) -> bytes``, loaded by the
        fork server and called in a worker with one request (see :meth:`call`)."""
        with self._lock:
            if self._roles.get(name) == path:
                return
            self._roles[name] = path
            old, self._zygote = self._zygote, None
        if old is not None:
            self._retire(old)

    # --- the fork server ----------------------------------------------------------------------------------

    def _current(self) -> _Zygote:
        """The running fork server, started when there is none (blocking: call it in a thread)."""
        z = self._zygote
        if z is not None and z.proc.poll() is None:
            return z
        with self._start_lock:
            z = self._zygote
            if z is not None and z.proc.poll() is None:
                return z
            if z is not None:
                self.replace(z, "exited")
            _not_dumpable()
            with self._lock:
                self._generation += 1
                generation, roles = self._generation, dict(self._roles)
            z = _Zygote(generation, roles)
            with self._lock:
                self._zygote = z
            return z

    async def zygote(self) -> _Zygote:
        z = self._zygote
        if z is not None and z.proc.poll() is None:
            return z
        return await trio.to_thread.run_sync(self._current)

    def replace(self, z: _Zygote, why: str) -> None:
        """``z`` stopped answering: the next worker comes from a new fork server. It is killed once the
        workers it forked and that are in use have ended (they run to their end); the spares it forked fail
        to start and are replaced by their pool."""
        with self._lock:
            if self._zygote is not z:
                return
            self._zygote = None
            self.replaced += 1
        self._retire(z)

    def _retire(self, z: _Zygote) -> None:
        with self._lock:
            z.retired = True
            last = z.users == 0
        if last:
            z.kill()

    def stop(self) -> None:
        """Stop the fork server (at exit; the next use starts a new one)."""
        with self._lock:
            z, self._zygote = self._zygote, None
        if z is not None:
            z.kill()

    async def isolation(self) -> Isolation:
        """What the workers get here (starts the fork server if needed)."""
        return (await self.zygote()).isolation

    def reuses(self, shape: Shape) -> bool:
        """Whether a worker of ``shape`` would wait for another request after its reply, as the running fork
        server's isolation says (as its ``loops``: the shape asks to be reused, and the worker is process 1
        of a PID namespace or has a uid of its own); False while no fork server runs."""
        z = self._zygote
        if z is None or not shape.reuse or shape.role == "exec":
            return False
        iso = z.isolation
        return (iso.pidns and shape.namespaces) or (iso.uid and shape.separate_uid)

    # --- uids ---------------------------------------------------------------------------------------------

    def _take_uid(self) -> int:
        with self._lock:
            if self._free_uids:
                return self._free_uids.pop()
            if self._next_uid >= UID_COUNT:
                raise SandboxError(f"all {UID_COUNT} sandbox uids are in use")
            self._next_uid += 1
            return _uid_base() + self._next_uid

    def _release_uid(self, uid: int) -> None:
        with self._lock:
            self._free_uids.append(uid)

    # --- workers ------------------------------------------------------------------------------------------

    def _spawn(self, z: _Zygote, shape: Shape, stdin: bool = False) -> Worker:
        """Ask ``z`` for a worker (non-blocking); it is forked while the caller goes on."""
        uid = self._take_uid() if shape.separate_uid and z.isolation.uid else None
        st, st_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        io, io_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if stdin else (-1, -1)
        for fd in (out_r, err_r, in_w):
            if fd >= 0:
                os.set_blocking(fd, False)
        st.setblocking(False)
        io.setblocking(False)
        worker = Worker(shape, z, uid, st, io, out_r, err_r, in_w)
        if shape.role != "exec":
            worker.poller = select.epoll()
            worker.poller.register(io.fileno(), select.EPOLLIN | select.EPOLLRDHUP)
            worker.poller.register(out_r, select.EPOLLIN)
            worker.poller.register(err_r, select.EPOLLIN)
        theirs = [st_theirs.fileno(), io_theirs.fileno(), out_w, err_w] + ([in_r] if stdin else [])
        message = {
            "op": "spawn",
            "role": shape.role,
            "uid": uid,
            "separate_uid": shape.separate_uid,
            "pidns": shape.namespaces,
            "imports": list(shape.imports),
            "reuse": MAX_USES if shape.reuse else 0,
            "busy": z.users >= BUSY_AT,
        }
        try:
            z.send(message, theirs)
        except OSError:
            worker.close_streams()
            st.close()
            if uid is not None:
                self._release_uid(uid)
            raise
        finally:
            st_theirs.close()
            io_theirs.close()
            for fd in (out_w, err_w, in_r):
                if fd >= 0:
                    os.close(fd)
        return worker

    async def take(self, shape: Shape, stdin: bool = False) -> Worker:
        """A worker forked now, ready for one use (one-shot workers with warm spares come from a pool of
        :class:`SandboxSpawner` instead).

        Give it back with :meth:`release` (in a ``finally``). The caller bounds the wait (its deadline).

        Raises:
            SandboxError: no worker could be had (after one new fork server was tried).
        """
        _short_slice_once()
        for attempt in (0, 1):
            z = await self.zygote()
            try:
                worker = self._spawn(z, shape, stdin)
                with self._lock:
                    worker.zygote.users += 1
                try:
                    await worker.ready(self)
                except BaseException:
                    self.release(worker)
                    raise
                return worker
            except BlockingIOError:
                self.replace(z, "its socket is full")
                if attempt:
                    raise SandboxError("the sandbox's fork server does not read its requests") from None
            except SandboxError:
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def release(self, worker: Worker) -> None:
        """The worker's use is over: it is killed (if it is not yet gone) and collected by the reaper."""
        worker.kill()
        worker.close_streams()
        _REAPER.collect(worker)
        with self._lock:
            z = worker.zygote
            z.users -= 1
            last = z.retired and z.users == 0
        if last:
            z.kill()


_THREAD = threading.local()
"""Per thread: whether it asked for the short slice (:data:`SLICE_US`; the first time it takes a worker)."""


def _short_slice_once() -> None:
    """Ask for the short slice (:data:`SLICE_US`) for this thread, the first time it takes a worker."""
    if not getattr(_THREAD, "sliced", False):
        _THREAD.sliced = True
        short_slice(SLICE_US)


SANDBOX = Sandbox()
_REAPER = _Reaper(SANDBOX._release_uid)
atexit.register(SANDBOX.stop)


async def isolation() -> Isolation:
    """What the workers get on this machine (see :class:`Isolation`)."""
    return await SANDBOX.isolation()


# --- talking to a worker ---------------------------------------------------------------------------------


def frame(*parts: bytes) -> bytes:
    """``parts`` as one frame: a u32 length, then the bytes."""
    body = b"".join(parts)
    return _HEADER.pack(len(body)) + body


def request_frame(header: bytes, body: bytes) -> bytes:
    """A role's request: a frame holding the header's length, the header (JSON, fixed per use: the limits
    and what the role needs), and the body (JSON, per call)."""
    return frame(_HEADER.pack(len(header)), header, body)


async def send_all(sock: socket.socket, data: bytes) -> None:
    """Send all of ``data`` (a non-blocking socket); it waits only when the socket is full: a request that
    fits (the common case) goes out without a trip through the event loop."""
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view) :]
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)


class Output:
    """What a worker printed, the first ``limit`` bytes of each stream (the rest counted)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.out = bytearray()
        self.err = bytearray()
        self.truncated = 0
        self.on_overflow: Callable[[], object] | None = None
        """Called when a stream passes the limit (a command that prints too much is stopped)."""

    def add(self, into: bytearray, chunk: bytes) -> None:
        room = self.limit - len(into)
        if room > 0:
            into += chunk[:room]
        cut = max(0, len(chunk) - max(room, 0))
        if cut:
            self.truncated += cut
            if self.on_overflow is not None:
                self.on_overflow()

    def read_now(self, fd: int, into: bytearray) -> bool:
        """Read what ``fd`` holds now, without waiting; False at its end."""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not chunk:
                return False
            self.add(into, chunk)

    async def drain(self, fd: int, into: bytearray) -> None:
        while True:
            await trio.lowlevel.wait_readable(fd)
            if not self.read_now(fd, into):
                return


_FIRST_RECV = 1 << 16
"""What :meth:`_Frames.read_frame_now` asks for until it knows a frame's length."""


class _Frames:
    """Frames read from a socket as they come (what arrived so far kept, so a reader can stop at any point
    and parse what is whole)."""

    def __init__(self, sock: socket.socket, max_bytes: int) -> None:
        self.sock = sock
        self.max_bytes = max_bytes
        self.buf = bytearray()
        self.ended = False

    def complete(self) -> bool:
        """Whether the first frame is all here (OverflowError: it is longer than ``max_bytes``)."""
        if len(self.buf) < _HEADER.size:
            return False
        (size,) = _HEADER.unpack_from(self.buf)
        if size > self.max_bytes:
            raise OverflowError(size)
        return len(self.buf) >= _HEADER.size + size

    def whole(self) -> bytes | None:
        """The first frame, when all of it is here.

        Raises:
            OverflowError: it is longer than ``max_bytes``.
        """
        if not self.complete():
            return None
        (size,) = _HEADER.unpack_from(self.buf)
        return bytes(self.buf[_HEADER.size : _HEADER.size + size])

    def read_frame_now(self) -> None:
        """Take what the socket holds now until the first frame is whole, without waiting: a reply that came
        in one piece costs one ``recv`` (whether anything follows it is asked by the poll after it).

        Each ``recv`` asks for what the frame still lacks once its length is known, else 64 KiB: a buffer
        below malloc's threshold for ``mmap``, where one of 1 MiB would cost an ``mmap``, ``mremap`` and
        ``munmap`` for every reply."""
        while not self.ended and not self.complete():
            want = _FIRST_RECV
            if len(self.buf) >= _HEADER.size:
                want = min(_HEADER.size + _HEADER.unpack_from(self.buf)[0] - len(self.buf), 1 << 20)
            if not self._take(want):
                return

    def read_now(self) -> None:
        """Take what the socket holds now, without waiting."""
        while not self.ended and self._take(1 << 20):
            pass

    def _take(self, want: int) -> bool:
        """One ``recv`` of at most ``want`` bytes; False when the socket holds nothing now, or has ended."""
        try:
            chunk = self.sock.recv(want)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self.ended = True
            return False
        self.buf += chunk
        return True

    async def receive(self) -> bytes | None:
        """The first frame; None at the socket's end before a whole one (OverflowError: too long)."""
        while True:
            got = self.whole()
            if got is not None:
                return got
            if self.ended:
                return None
            await trio.lowlevel.wait_readable(self.sock)
            self.read_now()


async def receive_frame(sock: socket.socket, max_bytes: int) -> bytes | None:
    """One frame from ``sock``; None at its end before a whole frame (OverflowError: longer than
    ``max_bytes``)."""
    return await _Frames(sock, max_bytes).receive()


@dataclass
class Reply:
    """What one use of a worker gave: its reply (None: it ended without one), what it printed."""

    reply: bytes | None
    output: Output
    too_large: bool = False


async def exchange(
    worker: Worker, request: bytes, output: Output, max_reply_bytes: int, sent: Callable[[], None] | None = None
) -> Reply:
    """Send ``request`` (a frame) to a worker and read its reply frame, draining what it prints meanwhile;
    then kill it, unless it waits for another request (:attr:`Worker.loops`: it flushed what it printed
    before replying, so that is read now, and killed what it started). The reply counts as soon as it is
    whole (a child that holds the socket open does not delay it), and a worker that ends without one ends
    the wait (even if a child of it holds the socket). The caller's deadline bounds all of it; ``sent()`` is
    called once the request is out.

    One wait covers it all: the worker's socket, pipes and pidfd are in one epoll set (made with the worker,
    off the step's path), and the event loop waits on that set's descriptor, so a step costs one
    registration and one wake-up, not a task per descriptor."""
    result = Reply(None, output)
    frames = _Frames(worker.io, max_reply_bytes)
    poller = worker.poller
    if poller is None:
        raise SandboxError("the worker has no poller (an exec worker)")
    streams = {worker.out: output.out, worker.err: output.err}
    worker.uses += 1
    await send_all(worker.io, request)
    if sent is not None:
        sent()  # (the warm spares topped up: while the worker runs, the server would wait anyway)
    ended = False
    try:
        while True:
            events = poller.poll(0)
            if not events:
                await trio.lowlevel.wait_readable(poller.fileno())
                continue
            ended = False
            for fd, _ in events:
                into = streams.get(fd)
                if into is not None:
                    if not output.read_now(fd, into):
                        poller.unregister(fd)
                        worker.streams_ended = True
                elif fd == worker.pidfd:
                    ended = True  # it ended: what it wrote before is in the socket already
                else:
                    frames.read_frame_now()
            if ended:
                frames.read_now()
                result.reply = frames.whole()
                break
            result.reply = frames.whole()
            if result.reply is not None or frames.ended:
                break
    except OverflowError:
        result.too_large = True
    # The reply is in (the worker flushed its stdout and stderr first) or never will be: what is left of the
    # worker goes, whatever it started (a child holding the reply socket or the pipes) with it; a worker that
    # waits for another request stays, if it answered cleanly (whole, nothing after it).
    clean = result.reply is not None and len(frames.buf) == _HEADER.size + len(result.reply)
    after: list[tuple[int, int]] = []
    if worker.loops and clean and not ended:
        # It flushed what it printed before its reply, so that is in the pipes by now and the epoll set says
        # which (one poll, where two reads would each find out); and whether anything came after its reply
        # on its socket (then it is not clean: not kept).
        after = poller.poll(0)
        io = worker.io.fileno()
        clean = not any(fd == io for fd, _ in after)
    if not (worker.loops and clean and not ended):
        worker.loops = False
        worker.kill()
    if worker.loops:
        for fd, _ in after:
            into = streams.get(fd)
            if into is not None:
                output.read_now(fd, into)
    else:
        output.read_now(worker.out, output.out)
        output.read_now(worker.err, output.err)
    return result


# --- the sandbox as a spawner of the worker pool ---------------------------------------------------------


class SandboxSpawner:
    """:mod:`mcpipe._workerpool`'s spawner of one-shot sandbox workers (the role and isolation of each is its
    pool key, a :class:`Shape`): each is forked by the fork server (at once when it runs, else when the
    worker is started), answers one request framed on its socket, what it prints read into the call's sink
    (an :class:`Output`), and is killed with all it started when its call is over. Its limits come with the
    request (the role's header), set by the worker itself as soft = hard."""

    def __init__(self, sandbox: Sandbox | None = None) -> None:
        self.sandbox = sandbox if sandbox is not None else SANDBOX

    def spawn(self, key: Hashable) -> SandboxProcess:
        if not isinstance(key, Shape) or key.role == "exec":
            raise TypeError(f"a sandbox worker's key is the Shape of a registered role, not {key!r}")
        return SandboxProcess(self.sandbox, key)

    def limit_text(self) -> str:
        return "the request's"


class SandboxProcess:
    """One sandbox worker as :mod:`mcpipe._workerpool` uses it (a :class:`~mcpipe._workerpool.WorkerProcess`):
    forked ahead when the fork server runs (a warm spare), used once, or up to :data:`MAX_USES` times when
    its shape asks to be reused and it can be (:attr:`Shape.reuse`)."""

    def __init__(self, sandbox: Sandbox, shape: Shape) -> None:
        self.sandbox = sandbox
        self.key: Hashable = shape
        self.shape = shape
        self.killed = False
        self.worker: Worker | None = None
        self._counted = False
        z = sandbox._zygote
        if z is not None and z.proc.poll() is None:
            with contextlib.suppress(OSError):  # a fork server that does not read: start() finds out
                self.worker = sandbox._spawn(z, shape)

    @property
    def pid(self) -> int:
        return self.worker.pid if self.worker is not None else 0

    async def start(self) -> None:
        """Wait until the fork server has forked it (forking it now from a running one if it was not).

        Raises:
            SandboxError: no worker could be had (after one new fork server was tried).
        """
        _short_slice_once()
        for attempt in (0, 1):
            if self.worker is None:
                z = await self.sandbox.zygote()
                try:
                    self.worker = self.sandbox._spawn(z, self.shape)
                except BlockingIOError:
                    self.sandbox.replace(z, "its socket is full")
                    if attempt:
                        raise SandboxError("the sandbox's fork server does not read its requests") from None
                    continue
            worker = self.worker
            if worker.uses and not worker.settle():  # a kept worker that ended since: a fresh one
                self._let_go()
                continue
            if not self._counted:
                self._counted = True
                with self.sandbox._lock:
                    worker.zygote.users += 1
            if worker.uses:
                # A kept worker reads its requests itself, and it is alive (its poll just said so): its fork
                # server ran (its workers die with it), so nothing to ask of it (a ``waitpid`` a step).
                return
            try:
                await worker.ready(self.sandbox)
            except SandboxError:
                self._let_go()
                if attempt:
                    raise
                continue
            z = worker.zygote
            if z is self.sandbox._zygote and z.proc.poll() is None:
                return
            # A spare of a fork server that was stopped, replaced or died (its workers die with it): it may
            # never read its request. A new one from the current fork server.
            self._let_go()
        raise SandboxError("the sandbox's fork server ended while forking a worker, twice")

    def start_blocking(self, deadline: float) -> bool:
        raise SandboxError("sandbox workers are called from the event loop only")

    async def exchange(self, request: bytes, limit: int, sink: object, sent: Callable[[], None] | None) -> bytes:
        from mcpipe._workerpool import EndedWithoutReply, ReplyTooLarge

        worker = self.worker
        assert worker is not None, "started first"
        output = sink if isinstance(sink, Output) else Output(0)
        try:
            got = await exchange(worker, request, output, limit, sent)
        except OSError:  # its request socket gone (the fork server died, and the worker with it)
            raise EndedWithoutReply from None
        if got.too_large:
            raise ReplyTooLarge
        if got.reply is None:
            raise EndedWithoutReply
        return got.reply

    def exchange_blocking(self, request: bytes, limit: int, deadline: float) -> bytes | None:
        raise SandboxError("sandbox workers are called from the event loop only")

    def reusable(self) -> bool:
        """Whether it waits for another request now: its shape asks to be reused and it can be, its last
        reply was clean, it has its stdout and stderr, and it has not served :data:`MAX_USES` requests."""
        w = self.worker
        return (
            w is not None
            and w.loops
            and not w.killed
            and not w.streams_ended
            and w.uses < MAX_USES
            and not self.killed
            and w.zygote is self.sandbox._zygote
        )

    def kill(self) -> None:
        self.killed = True
        if self.worker is not None:
            self.worker.kill()

    async def exit_status(self) -> int | None:
        """As the fork server reports it (waits at most :data:`EXIT_WAIT_S`)."""
        return await self.worker.exit_status(EXIT_WAIT_S) if self.worker is not None else None

    def exit_status_blocking(self) -> int | None:
        return None

    def close(self) -> None:
        self.killed = True
        self._let_go()

    def _let_go(self) -> None:
        """Kill the worker and hand it to the reaper (its fork server let go of, if it is the last user of a
        replaced one)."""
        worker, self.worker = self.worker, None
        if worker is None:
            return
        if self._counted:
            self._counted = False
            self.sandbox.release(worker)
        else:
            worker.kill()
            worker.close_streams()
            _REAPER.collect(worker)
