"""The sandbox's fork server (the *zygote*): one process that has started Python and imported what a worker
needs, never runs a worker's code itself, and forks a fresh, isolated worker per request.

Started by :mod:`mcpipe._sandbox` as ``python -I -c LAUNCH _zygote.py SOCKET_FD CONFIG_JSON`` (its
``_LAUNCH``: this file loaded from its cached bytecode, not compiled at each start as a script would be, then
:func:`main`); it imports nothing of mcpipe but its Rust core, loaded by path (:func:`_load_core`: the
fork server's loop and a worker's system calls, ``rust/src/forkserver.rs`` and ``rust/src/sandbox.rs``); a
*role*, the code a worker runs, is loaded by path from the config; what only some workers need they import
once forked, as their spawn request's ``imports`` say; and only the modules of :data:`IMAGE`. Linux only.

At start it probes what this kernel lets it do (:func:`probe`) and says so in its first message:

- **uid**: it runs as root, so each worker can run as a uid of its own (``uid_base + slot``), no
  capabilities, ``no_new_privs``: the worker cannot read or signal the server, another worker, or this
  process, and ``RLIMIT_NPROC`` counts only its own processes;
- **userns**: not root, but the kernel lets it make a user namespace: it enters one (its own uid mapped to
  itself), which gives it the rights the next two need, inside that namespace only;
- **pidns**: each worker is process 1 of a PID namespace of its own, so when it ends (or is killed) the
  kernel kills every process it started, ``setsid`` or double ``fork`` or not;
- **proc**: each worker also has a mount namespace of its own with a ``/proc`` of its PID namespace: it sees
  no other process. Directories a worker's uid could not reach on the way to Python's own files (a
  ``/root`` of mode 0700 above the interpreter) are covered with an empty ``tmpfs`` in which only those
  files are bound again, so the worker can import the standard library and nothing else of them (a worker
  with a uid of its own gets that mount namespace even when its shape asks for no PID namespace).

Without a PID namespace this process is a child subreaper: what a worker leaves behind is re-parented
here, and killed when the worker ends (with a uid: every process of that uid; without: every process
re-parented here).

Protocol with the server, over a ``SOCK_SEQPACKET`` socket, one JSON message per request:
``{"op": "spawn", "role", "uid", "separate_uid", "pidns", "imports", "reuse", "busy"}`` with four descriptors
attached: ``st`` (a ``SOCK_SEQPACKET`` socket: this process answers on it ``{"pid", "cwd", "loops"}`` with a
pidfd of the worker attached, or ``{"error"}``, and later ``{"exit": CODE}``, then closes it: the worker and
all it started are gone), ``io``
(the worker's request and reply, descriptor 3 in the worker), and the worker's stdout and stderr. A role
``exec`` worker also gets its stdin. Nothing is ever read back from a worker: this process cannot be held
by one.
"""

from __future__ import annotations

import _signal
import contextlib
import gc
import json
import os
import resource
import select
import signal
import socket
import stat
import struct
import sys
import types
from importlib.machinery import EXTENSION_SUFFIXES, ExtensionFileLoader, ModuleSpec, SourceFileLoader

TYPE_CHECKING = False
if TYPE_CHECKING:  # (``typing`` is not in the fork server's image: see IMAGE)
    from collections.abc import Mapping
    from typing import Any

IMAGE = frozenset(
    {
        # what this file and the python role (``kinds/_pyexec.py``) import, with what those import in turn
        *("__future__", "contextlib", "gc", "resource", "select", "mcpipe._core"),
        *("signal", "socket", "_socket", "selectors", "array", "errno", "math", "stat", "struct", "_struct"),
        *("types", "importlib", "importlib._bootstrap", "importlib._bootstrap_external", "importlib.machinery"),
        *("warnings", "json", "json.decoder", "json.encoder", "json.scanner", "_json", "binascii", "marshal"),
        *("datetime", "_datetime", "uuid", "_uuid", "platform", "builtins"),
        *("re", "re._casefix", "re._compiler", "re._constants", "re._parser", "_sre", "copyreg", "enum"),
        *("functools", "_functools", "collections", "collections.abc", "_collections", "itertools", "keyword"),
        *("operator", "_operator", "reprlib", "_weakrefset", "weakref"),
    }
)
"""The modules the fork server may hold once it has started, beyond those of the interpreter's own start
(``python -I -c ''``): every worker's fork copies the page tables of all of them, and each worker's first
writes copy their pages, so what only some steps need is imported where it is needed (a step's ``imports``,
or by the role at first use), never here. ``tests/kinds/test_python_image.py`` starts a real fork server
and compares. No ``orjson`` (its extension alone brings ``inspect``, ``dataclasses`` and 3 MB of
anonymous memory), ``typing``, ``tempfile`` or ``shutil``."""

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
CAP_SETUID = 7
CAP_SYS_ADMIN = 21


def _load_core() -> types.ModuleType:
    """mcpipe's Rust core, for its system calls (``rust/src/sandbox.rs``): the one the server imported; in
    the fork server, which imports nothing of mcpipe, its extension file beside this package, loaded by path.

    A worker makes these calls first thing after its fork. Through ``ctypes`` each cost some 50 µs there (its
    argument conversions write to many pages of the fork server's heap, and in a fresh fork the first write
    to each page copies it); a native call touches a few, and without ``ctypes`` the image is smaller too."""
    core = sys.modules.get("mcpipe._core")
    if core is not None:
        return core
    if __name__.startswith("mcpipe."):
        import mcpipe._core

        return mcpipe._core
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for suffix in EXTENSION_SUFFIXES:
        path = os.path.join(package, "_core" + suffix)
        if os.path.exists(path):
            loader = ExtensionFileLoader("mcpipe._core", path)
            module = loader.create_module(ModuleSpec("mcpipe._core", loader, origin=path))
            loader.exec_module(module)
            sys.modules["mcpipe._core"] = module
            return module
    raise ImportError(f"mcpipe's Rust core (_core) is not in {package}")


_native = _load_core()


def prctl(option: int, value: int) -> None:
    _native.sys_prctl(option, value)


def unshare(flags: int) -> None:
    _native.sys_unshare(flags)


def setns(fd: int, kind: int) -> None:
    _native.sys_setns(fd, kind)


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _native.sys_mount(source, target, fstype, flags, data)


def drop_capabilities() -> None:
    """No capability left, effective, permitted or inheritable (``capset``)."""
    _native.sys_drop_capabilities()


def _has_capability(bit: int) -> bool:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> bit & 1)
    return False


# --- framing: a u32 length, then the bytes ---------------------------------------------------------------


def read_exact(fd: int, n: int) -> bytes:
    parts: list[bytes] = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def read_frame(fd: int) -> bytes:
    (n,) = struct.unpack(">I", read_exact(fd, 4))
    return read_exact(fd, n)


def write_frame(fd: int, data: bytes) -> None:
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


# --- what a worker's uid can reach -----------------------------------------------------------------------


def _others_can_enter(path: str) -> bool:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return bool(mode & stat.S_IXOTH) and bool(mode & stat.S_IROTH)


def python_paths() -> list[str]:
    """The directories a worker's Python reads: its prefixes, the interpreter's and ``sys.path``'s."""
    found: set[str] = set()
    for p in [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable), *sys.path]:
        if p and os.path.isdir(p):
            found.add(os.path.realpath(p))
            found.add(os.path.abspath(p))
    return sorted(found)


def hidden_parents(paths: list[str]) -> dict[str, list[str]]:
    """Directories other users cannot enter on the way to ``paths``: the highest such directory of each
    path, with the paths below it (they are bound again inside an empty ``tmpfs`` over it)."""
    plan: dict[str, list[str]] = {}
    for path in paths:
        parts = path.strip("/").split("/")
        for i in range(1, len(parts)):
            parent = "/" + "/".join(parts[:i])
            if not _others_can_enter(parent):
                plan.setdefault(parent, []).append(path)
                break
    for parent, below in plan.items():  # keep the highest of nested paths only
        below.sort()
        kept: list[str] = []
        for p in below:
            if not any(p == k or p.startswith(k + "/") for k in kept):
                kept.append(p)
        plan[parent] = kept
    return plan


def reveal(plan: dict[str, list[str]]) -> None:
    """In this process's own mount namespace: each hidden parent becomes an empty tmpfs in which only its
    planned paths are bound (read-only) again."""
    for parent, below in plan.items():
        handles = [os.open(p, os.O_PATH | os.O_DIRECTORY) for p in below]
        try:
            mount("tmpfs", parent, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
            for path, fd in zip(below, handles, strict=True):
                os.makedirs(path, mode=0o755, exist_ok=True)
                mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
                with contextlib.suppress(OSError):
                    mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        finally:
            for fd in handles:
                os.close(fd)


# --- the probe -------------------------------------------------------------------------------------------


TEMP_DIRS = ("/tmp", "/var/tmp", "/usr/tmp")
"""Where workers' directories go, the first of them this process can write (``tempfile.gettempdir``'s list:
the fork server's environment holds no ``TMPDIR``), else its working directory."""


def temp_dir() -> str:
    for path in TEMP_DIRS:
        if os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK):
            return path
    return os.getcwd()


class Config:
    """What the server said at start: ``uid_base``, ``roles`` (name -> file), ``want_uid``."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.uid_base = int(raw.get("uid_base", 0))
        self.roles: dict[str, str] = dict(raw.get("roles", {}))
        self.tmp = str(raw.get("tmp") or temp_dir())
        self.slice_us = int(raw.get("slice_us") or 0)


class Isolation:
    """What this kernel allows (see the module's doc), and why not where it does not."""

    def __init__(self) -> None:
        self.uid = False
        self.userns = False
        self.pidns = False
        self.proc = False
        self.dumpable = False
        self.subreaper = False
        self.reasons: list[str] = []
        self.hidden: dict[str, list[str]] = {}
        self.own_pidns = -1

    def as_dict(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "userns": self.userns,
            "pidns": self.pidns,
            "proc": self.proc,
            "dumpable": self.dumpable,
            "subreaper": self.subreaper,
            "hidden": sorted(self.hidden),
            "reasons": self.reasons,
        }


def _enter_user_namespace() -> None:
    uid, gid = os.getuid(), os.getgid()
    unshare(CLONE_NEWUSER)
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def fork_in(own_pidns: int) -> int:
    """``os.fork()``, the child the first process (1) of a new PID namespace when ``own_pidns`` (a
    descriptor of this process's own) is given; this process's later children are in its own again."""
    if own_pidns < 0:
        return os.fork()
    unshare(CLONE_NEWPID)
    try:
        pid = os.fork()
    except BaseException:
        setns(own_pidns, CLONE_NEWPID)
        raise
    if pid:
        setns(own_pidns, CLONE_NEWPID)
    return pid


def _trial(iso: Isolation, pidns: bool, body: Any) -> str | None:
    """Run ``body()`` in a forked child (in a new PID namespace when ``pidns``); None when it succeeded,
    else what it said."""
    r, w = os.pipe()
    pid = fork_in(iso.own_pidns if pidns else -1)
    if pid == 0:
        os.close(r)
        try:
            body()
            os.write(w, b"ok")
        except BaseException as e:
            os.write(w, f"{type(e).__name__}: {e}".encode()[:500])
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        said = f.read().decode(errors="replace")
    os.waitpid(pid, 0)
    return None if said == "ok" else said or "the trial process died"


def probe(config: Config) -> Isolation:
    """Find out what this kernel lets a worker have (each tried in a child, as a worker would)."""
    iso = Isolation()
    try:
        prctl(PR_SET_DUMPABLE, 0)
        iso.dumpable = True
    except OSError as e:
        iso.reasons.append(f"the fork server stays dumpable: {e}")
    root = os.geteuid() == 0 and _has_capability(CAP_SETUID)
    if not _has_capability(CAP_SYS_ADMIN):
        try:
            _enter_user_namespace()
            iso.userns = True
        except OSError as e:
            iso.reasons.append(f"no user namespace ({e}): no PID namespace either")
    iso.own_pidns = os.open("/proc/self/ns/pid", os.O_RDONLY)
    if root or iso.userns:
        said = _trial(iso, True, lambda: None)
        iso.pidns = said is None
        if said is not None:
            iso.reasons.append(f"no PID namespace ({said})")
    if iso.pidns:

        def mount_proc() -> None:
            unshare(CLONE_NEWNS)
            mount(None, "/", None, MS_REC | MS_PRIVATE)
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)

        said = _trial(iso, True, mount_proc)
        iso.proc = said is None
        if said is not None:
            iso.reasons.append(f"no mount namespace with a /proc of its own ({said}): workers see every process")
    try:  # for workers without a PID namespace (none to be had, or a policy that asks for none)
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        iso.subreaper = True
    except OSError as e:
        iso.reasons.append(f"not a child subreaper ({e}): a process a worker detaches may outlive it")
    if root and config.uid_base > 0:
        paths = python_paths()
        plan = hidden_parents(paths) if iso.proc else {}
        uid = config.uid_base

        def as_uid() -> None:
            if iso.proc:
                unshare(CLONE_NEWNS)
                mount(None, "/", None, MS_REC | MS_PRIVATE)
                reveal(plan)
            drop_to(uid)
            for p in paths:
                os.listdir(p)

        said = _trial(iso, iso.pidns, as_uid)
        iso.uid = said is None
        iso.hidden = plan if iso.uid else {}
        if said is not None:
            iso.reasons.append(f"workers keep the server's uid: as uid {uid}, {said}")
    elif not root:
        iso.reasons.append("the server is not root: workers keep its uid (files the uid owns stay writable to them)")
    return iso


def short_slice(slice_us: int) -> bool:
    """Ask the kernel for a time slice of ``slice_us`` (``sched_setattr``'s ``sched_runtime`` for a normal
    task, Linux 6.12+): a task with a shorter slice has an earlier deadline when it wakes, so a worker
    blocked on its request runs at once rather than after what holds the core. It gets no more CPU than
    before, only sooner. False where the kernel has no such thing (nothing changes then)."""
    if not slice_us:
        return False
    return _set_slice(slice_us)


def default_slice() -> bool:
    """Back to the kernel's own time slice (``sched_runtime`` 0), whatever the parent asked for.

    The fork server's own: it starts from a thread of the server that asked for a short one, and with
    it, each fork it does for a spare (asked for as a step's request goes out) would wake ahead of that
    step's worker and of the server waiting for its reply, and take the core from them. A fork can wait:
    a spare is for a later step."""
    return _set_slice(0)


def _set_slice(slice_us: int) -> bool:
    runtime = getattr(_native, "sys_sched_runtime", None)  # (Linux only: the server elsewhere has none)
    return bool(runtime(slice_us * 1000)) if runtime is not None else False


def drop_to(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    prctl(PR_SET_NO_NEW_PRIVS, 1)


# --- a worker --------------------------------------------------------------------------------------------


def load_file(name: str, path: str) -> types.ModuleType:
    """The module of the Python file ``path``, named ``name`` (not put in ``sys.modules``), from its cached
    bytecode when it is fresh (as an import would: ``__pycache__``), else compiled (and cached, where it may)."""
    module = types.ModuleType(name)
    module.__file__ = path
    SourceFileLoader(name, path).exec_module(module)
    return module


def _load_role(path: str) -> Any:
    return load_file(f"mcpipe_sandbox_role_{os.path.basename(path)[:-3]}", path)


_LIMITS = (
    ("memory_bytes", resource.RLIMIT_AS),
    ("file_bytes", resource.RLIMIT_FSIZE),
    ("processes", resource.RLIMIT_NPROC),
    ("open_files", resource.RLIMIT_NOFILE),
)


def set_limits(limits: dict[str, Any], processes: bool = True, uses: int = 1, cpu: CpuLimit | None = None) -> None:
    """Each limit as soft = hard, so the worker cannot raise it again (it has no capability left); the CPU
    limit's hard part covers ``uses`` steps (a reused worker: ``cpu``, :meth:`CpuLimit.step`, sets each
    step's soft part)."""
    for key, which in _LIMITS:
        value = limits.get(key)
        if value and (processes or which != resource.RLIMIT_NPROC):
            _, hard = resource.getrlimit(which)
            v = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
            resource.setrlimit(which, (v, v))
    seconds = limits.get("cpu_seconds")
    if seconds:
        v = _cpu_from_now(int(seconds))
        hard = v + int(seconds) * (uses - 1)
        resource.setrlimit(resource.RLIMIT_CPU, (v, hard))
        if cpu is not None:
            cpu.hard = hard


class CpuLimit:
    """A reused worker's CPU limit: the hard part set by its first step for all of them (:func:`set_limits`),
    the soft part each step's budget from now, set only when it differs from what is in force (the kernel
    counts CPU time in seconds: steps of a few milliseconds mostly find it right already)."""

    __slots__ = ("hard",)

    def __init__(self) -> None:
        self.hard = resource.RLIM_INFINITY

    def step(self, limits: dict[str, Any]) -> None:
        """This step's budget from now, within the hard part."""
        seconds = limits.get("cpu_seconds")
        if not seconds:
            return
        v = _cpu_from_now(int(seconds))
        if self.hard != resource.RLIM_INFINITY:
            v = min(v, self.hard)
        soft, hard = resource.getrlimit(resource.RLIMIT_CPU)  # (the code may have changed it: not trusted)
        if soft != v:
            resource.setrlimit(resource.RLIMIT_CPU, (min(v, hard), hard))


def _cpu_from_now(cpu: int) -> int:
    """The CPU-time limit (seconds, as ``RLIMIT_CPU`` counts them) that leaves ``cpu`` seconds from now."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    return int(used.ru_utime + used.ru_stime) + 1 + cpu


def end_worker(uid: int | None, pidns: bool) -> None:
    """Kill what the worker started, then end it: in its PID namespace (it is process 1) or of its own uid,
    every other process it may signal; else its process group (itself too)."""
    with contextlib.suppress(OSError):
        if pidns or uid is not None:
            os.kill(-1, signal.SIGKILL)
        else:
            os.killpg(0, signal.SIGKILL)
    os._exit(0)


class Zygote:
    def __init__(self, sock: socket.socket, config: Config, parent: int) -> None:
        self.sock = sock
        self.config = config
        self.parent = parent
        self.iso = probe(config)
        self.roles = {name: _load_role(path) for name, path in config.roles.items()}
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)

    def serve(self) -> None:
        """Answer the server's requests until it is gone (then end, the workers with it, their directories
        removed): the loop is the Rust core's (``rust/src/forkserver.rs``), which writes to a few pages of
        its own between two forks where this one's Python wrote to some 180, each copied while a worker
        shared it. It returns in each worker it forks, which becomes the worker here."""
        # Its environment emptied once, so that each worker's is empty from its fork (a worker empties it
        # before its step whatever it holds; emptying even a few variables in a fresh fork costs some 100 µs,
        # ``os.environ``'s Python code writing to the pages it touches). Nothing here reads it from now.
        os.environ.clear()
        gc.collect()
        gc.freeze()  # what is here now is never traversed by a worker's collector (fewer pages copied)
        hello = {"hello": self.iso.as_dict(), "pid": os.getpid()}
        hello["modules"] = sorted(sys.modules)  # (what the fork server's image holds: IMAGE)
        self.sock.sendall(json.dumps(hello).encode())
        message, fds, cwd, uid, pidns, loops = _native.fork_server_loop(
            self.sock.fileno(),
            self.wake_r,
            self.parent,
            self.config.tmp,
            self.iso.uid,
            self.iso.pidns,
            self.iso.own_pidns,
            os.fork,
            self.sweep,
            remove_dir,
        )
        code = 70
        try:  # (a forked worker, from here on)
            cmd = json.loads(message)
            self.become_worker(str(cmd["role"]), fds, cwd, uid, pidns, loops, cmd)
        except BaseException as e:
            with contextlib.suppress(BaseException):
                os.write(2, f"mcpipe sandbox: the worker could not start: {e}\n".encode())
        os._exit(code)

    def sweep(self, uid: int | None, workers: list[int]) -> None:
        """What a worker without a PID namespace left, killed once it ended: every process of its uid of its
        own, else what was re-parented here and is none of the ``workers`` alive."""
        if uid is not None:
            self.sweep_uid(uid)
        else:
            self.sweep_orphans(set(workers))

    def become_worker(
        self,
        role: str,
        fds: list[int],
        cwd: str,
        uid: int | None,
        pidns: bool,
        loops: bool,
        cmd: Mapping[str, object],
    ) -> None:
        """This process, just forked, becomes the worker ``cmd`` asked for (``loops``: it may serve more than
        one request, as the fork server told the server)."""
        proc = pidns and self.iso.proc
        zygote = os.getppid()
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != zygote:
            os._exit(70)
        # ``_signal``'s own functions, not ``signal``'s wrappers: those convert through ``enum`` (about 70 µs
        # in a fresh fork, whose first touch of each page of the fork server's heap copies it).
        _signal.set_wakeup_fd(-1)
        _signal.signal(signal.SIGCHLD, _signal.SIG_DFL)
        _signal.signal(PARENT_GONE, _signal.SIG_DFL)
        _st, io, out, err = fds[:4]
        stdin = fds[4] if len(fds) > 4 else os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.dup2(io, 3)
        os.closerange(4, 1 << 20)  # nothing of the server's or of other workers stays open here
        os.set_inheritable(3, False)  # what the worker starts does not hold its reply channel
        os.setsid()
        reveal_python = uid is not None and bool(self.iso.hidden)
        if proc or reveal_python:  # (a worker without a PID namespace still needs Python's files revealed)
            unshare(CLONE_NEWNS)
            mount(None, "/", None, MS_REC | MS_PRIVATE)
            if proc:
                mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            if reveal_python:
                reveal(self.iso.hidden)
        os.chdir(cwd)
        prctl(PR_SET_DUMPABLE, 0)
        if role == "exec":
            keep(uid if cmd.get("exec_uid") else None, pidns)
        else:
            reuse = cmd.get("reuse")
            uses = reuse if isinstance(reuse, int) and loops else 1
            imports = _names(cmd.get("imports"))
            run_role(self.roles[role], uid, pidns, self.config, imports, max(1, uses), cmd.get("busy") is True)
        os._exit(0)

    def sweep_uid(self, uid: int) -> None:
        """Kill every process of ``uid`` (what a worker without a PID namespace left)."""
        pid = os.fork()
        if pid == 0:
            try:
                os.setresuid(uid, uid, uid)
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)

    def sweep_orphans(self, workers: set[int]) -> None:
        """Kill what was re-parented here (this process is a child subreaper) and is none of ``workers``."""
        me = os.getpid()
        for pid in children_of(me):
            if pid not in workers:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


DIR_PREFIX = "mcpipe-py-"
"""A worker's directory's name before its 12 random hex digits (made by ``rust/src/forkserver.rs``)."""


def remove_dir(path: str) -> None:
    """Remove a worker's directory: one ``rmdir`` when the step left it empty (most do), else the tree,
    bottom-up through descriptors (``os.fwalk``), never following a link: a link the step left is removed,
    what it points to is not touched. What cannot be removed is left (a hostile step's tree too deep to
    walk, say), never raised: the fork server goes on."""
    try:
        os.rmdir(path)
        return
    except FileNotFoundError:
        return
    except NotADirectoryError:  # the step put a link in its place (its owner may, in a sticky /tmp)
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    except OSError:
        pass
    with contextlib.suppress(OSError, RecursionError):
        for _top, dirs, files, top_fd in os.fwalk(path, topdown=False, follow_symlinks=False):
            for name in files:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=top_fd)
            for name in dirs:  # (a link to a directory is listed here, and not walked into)
                try:
                    os.rmdir(name, dir_fd=top_fd)
                except NotADirectoryError:
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=top_fd)
                except OSError:
                    pass
        os.rmdir(path)


def children_of(parent: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == parent:
            found.append(int(name))
    return found


class Header:
    """A request's fixed part, decoded: the header itself (a role must not change it: it is shared by every
    request with the same header), its limits, and those of them that hold for all of a worker's steps."""

    __slots__ = ("header", "held", "limits")

    def __init__(self, raw: bytes) -> None:
        self.header: dict[str, Any] = json.loads(raw)
        self.limits: dict[str, Any] = self.header.get("limits") or {}
        self.held = {k: v for k, v in self.limits.items() if k != "cpu_seconds"}


class Requests:
    """A worker's requests on one descriptor: each frame read in one ``read`` when it fits (its length and
    bytes come together), and its header (the step's fixed part: its code, compiled and marshalled, and
    its limits, the same bytes for every call of the step) decoded once per worker, then looked up by its
    bytes: a reused worker's later steps of the same code skip it. Only the body (the call's input) is
    decoded each time."""

    MAX_HEADERS = 64
    """Headers kept (a run's distinct python steps); past it the cache starts again."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pending = b""
        self.headers: dict[bytes, Header] = {}

    def read(self) -> bytes:
        """The next frame's bytes (EOFError at the end of the descriptor)."""
        data = self.pending or os.read(self.fd, 1 << 16)
        self.pending = b""
        if not data:
            raise EOFError
        if len(data) < 4:
            data += read_exact(self.fd, 4 - len(data))
        (n,) = struct.unpack_from(">I", data)
        end = 4 + n
        if len(data) < end:
            data += read_exact(self.fd, end - len(data))
        self.pending = data[end:]
        return data[4:end]

    def decode(self, frame: bytes) -> tuple[Header, Any]:
        """The frame's header (decoded once per distinct header) and its body (decoded now)."""
        (header_len,) = struct.unpack_from(">I", frame)
        raw = frame[4 : 4 + header_len]
        header = self.headers.get(raw)
        if header is None:
            if len(self.headers) >= self.MAX_HEADERS:
                self.headers.clear()
            header = self.headers[raw] = Header(raw)
        body = json.loads(frame[4 + header_len :]) if len(frame) > 4 + header_len else {}
        return header, body


class StepEnv:
    """A worker's environment for each of its steps: when a step's code starts, ``os.environ`` holds its
    ``env`` and nothing else. A reused worker's next step with the same ``env``, after a step that left
    ``os.environ`` as it was set (most: a run's steps share one policy), finds it so already, and nothing is
    unset and set again (one comparison, where emptying and filling it cost a call per variable each)."""

    __slots__ = ("applied",)

    def __init__(self) -> None:
        self.applied: dict[str, str] | None = None
        """The ``env`` the last step was given (None: none yet, ``os.environ`` emptied)."""

    def apply(self, body: object) -> None:
        """``os.environ`` as the request's ``env`` says (taken out of ``body``)."""
        env = body.pop("env", None) if isinstance(body, dict) else None
        wanted = {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}
        if wanted == self.applied and len(os.environ) == len(wanted) and dict(os.environ) == wanted:
            return
        os.environ.clear()
        os.environ.update(wanted)
        self.applied = wanted


def _rehearse(role: Any) -> None:
    """Walk a request's whole path once (decode, environment, the role's trivial step, the reply written to
    a pipe), touching the code and memory a real request touches, so that a fresh fork pays its page
    faults (file-backed pages are not copied by ``fork``: each process faults its own) now rather than
    during the step."""
    sample = getattr(role, "SAMPLE", None)
    if sample is None:
        warm = getattr(role, "warm", None)
        if warm is not None:
            warm()
        return
    r, w = os.pipe()
    try:
        write_frame(w, sample)
        requests = Requests(r)
        header, body = requests.decode(requests.read())
        StepEnv().apply(body)  # as a step's is set (run_role's own starts from the emptied environment)
        os.environ.clear()
        set_limits({}, processes=False)
        reply = role.handle(header.header, body)
        write_frame(w, reply)
        requests.read()
    finally:
        os.close(r)
        os.close(w)


def _names(value: object) -> tuple[str, ...]:
    """The module names of a spawn request's ``imports`` (anything else in it left out)."""
    if not isinstance(value, list):
        return ()
    return tuple(v for v in value if isinstance(v, str) and v.replace(".", "").replace("_", "").isalnum())


def run_role(
    role: Any,
    uid: int | None,
    pidns: bool,
    config: Config,
    imports: tuple[str, ...] = (),
    uses: int = 1,
    busy: bool = False,
) -> None:
    """A one-shot worker: one request on descriptor 3, the limits and the uid, the role's answer, the end;
    with ``uses`` above 1, a reused one: up to that many requests, what each step started killed after its
    reply (:func:`between_steps`), each step in fresh globals (the role's), with its own CPU budget."""
    # What does not depend on the step is done before it comes, while the worker waits: the uid dropped
    # (the request is read as that uid), the fixed limits, the environment emptied, the modules its shape
    # names imported (``imports``: they are not in the fork server, whose every fork and exit they would make
    # dearer), and the request's path walked once (:func:`_rehearse`), unless the request is here already (a
    # step took this worker as it was forked: the rehearsal would only delay it); then the short slice
    # (:func:`short_slice`): it wakes at once when the request comes. A worker forked ``busy`` (the server's
    # cores all taken by steps: ``mcpipe._sandbox.BUSY_AT``) does neither: the walk's CPU is the steps', and
    # the short slice would have it take the core from the server, which every step passes through.
    if uid is not None:
        drop_to(uid)
    else:
        drop_capabilities()
        prctl(PR_SET_NO_NEW_PRIVS, 1)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, 0))
    if os.environ:  # (empty from the fork server: see Zygote.serve)
        os.environ.clear()
    for name in imports:
        with contextlib.suppress(Exception):  # the step imports it again itself, and says why it cannot
            __import__(name)
    if not busy and not select.select([3], [], [], 0)[0]:  # a step waits for it already: no time to rehearse
        with contextlib.suppress(Exception):
            _rehearse(role)
    if not busy:
        short_slice(config.slice_us)
    cwd = os.getcwd()
    fixed: object = None
    requests = Requests(3)
    cpu = CpuLimit()
    env = StepEnv()
    for use in range(uses):
        try:
            frame = requests.read()
        except EOFError:
            os._exit(0)  # the server let this worker go (unused, or at its run's end)
        header, body = requests.decode(frame)
        if use == 0:
            fixed = header.held  # RLIMIT_NPROC counts every process of the uid
            set_limits(header.limits, processes=uid is not None, uses=uses, cpu=cpu)
        elif header.held != fixed:
            os._exit(70)  # the server keeps a worker only for steps with its limits: never here
        else:
            cpu.step(header.limits)
            os.chdir(cwd)
        env.apply(body)
        reply = role.handle(header.header, body)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):  # the code closed them
            pass
        last = use + 1 == uses
        if not last:
            between_steps(pidns)  # what the step started is gone before its answer is read
        try:
            write_frame(3, reply)
        except OSError:
            break
    end_worker(uid, pidns)


def between_steps(pidns: bool = False) -> None:
    """Before a reused worker replies: kill everything its step started (it is process 1 of its PID
    namespace, or alone under its uid: ``kill(-1)`` reaches all of that but not itself) and reap its
    children, so that the next step finds nothing of this one running but its own threads.

    In a PID namespace of its own, a step that started no process costs one ``waitpid``: every other
    process of the namespace descends from this one, and what loses its parent is re-parented here, so
    with no child (alive or not reaped) there is no other process to kill. Under a uid of its own without
    such a namespace, a detached process is re-parented to the fork server instead: ``kill(-1)`` always."""
    if pidns:
        try:
            os.waitpid(-1, os.WNOHANG)  # a child, running or ended: all of them killed and reaped below
        except ChildProcessError:
            return  # no child: no other process in the namespace
    with contextlib.suppress(OSError):
        os.kill(-1, signal.SIGKILL)
    for _ in range(10_000):
        try:
            pid, _ = os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue
        if pid == 0:
            return


def keep(uid: int | None, pidns: bool) -> None:
    """An ``exec`` worker: the keeper of one command. It waits for the command on descriptor 3 (``{"argv",
    "env", "cwd", "limits"}``), starts it as its child, passes on the signals the server asks for
    (``{"signal": N}``: to every process of the worker), and when the command ends kills what it left,
    answers ``{"exit": CODE}`` and ends. When the server goes away first (end of file), it kills them all."""
    try:
        request = json.loads(read_frame(3))
    except (EOFError, ValueError):
        os._exit(0)
    if not pidns:
        with contextlib.suppress(OSError):
            prctl(PR_SET_CHILD_SUBREAPER, 1)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    err_r, err_w = os.pipe()
    os.set_inheritable(err_w, False)
    child = os.fork()
    if child == 0:
        try:
            os.close(err_r)
            os.close(3)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.setpgid(0, 0)
            set_limits(request.get("limits") or {}, processes=uid is not None)
            if uid is not None:
                drop_to(uid)
            if request.get("cwd"):
                os.chdir(request["cwd"])
            argv = [str(a) for a in request["argv"]]
            os.execve(argv[0], argv, {str(k): str(v) for k, v in request.get("env", {}).items()})
        except BaseException as e:
            with contextlib.suppress(BaseException):
                os.write(err_w, (getattr(e, "strerror", None) or str(e)).encode()[:500])
        os._exit(127)
    os.close(err_w)
    failed = os.read(err_r, 600).decode(errors="replace")
    os.close(err_r)
    if failed:
        _finish(child, pidns, {"error": failed})

    def everyone(sig: int) -> None:
        with contextlib.suppress(OSError):
            if pidns:
                os.kill(-1, sig)  # process 1 of its PID namespace: every other process in it
            else:
                os.killpg(child, sig)

    while True:
        readable, _, _ = select.select([3, wake_r], [], [])
        if 3 in readable:
            try:
                ask = json.loads(read_frame(3))
            except (EOFError, ValueError, OSError):
                everyone(signal.SIGKILL)
                _finish(child, pidns, None)
            sig = ask.get("signal")
            if isinstance(sig, int):
                everyone(sig)
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
            try:
                pid, status = os.waitpid(child, os.WNOHANG)
            except ChildProcessError:
                pid, status = child, 0
            if pid == child:
                _finish(child, pidns, {"exit": os.waitstatus_to_exitcode(status)}, reaped=True)


def _finish(child: int, pidns: bool, answer: Mapping[str, object] | None, reaped: bool = False) -> None:
    """Kill what the command left, answer, end (in a PID namespace the kernel kills the rest then)."""
    with contextlib.suppress(OSError):
        if pidns:
            os.kill(-1, signal.SIGKILL)
        else:
            os.killpg(child, signal.SIGKILL)
    if not pidns:
        for _ in range(100):  # a child subreaper: what was detached comes back here; kill it until none is left
            kids = children_of(os.getpid())
            if not kids:
                break
            for pid in kids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
    if answer is not None:
        with contextlib.suppress(OSError):
            write_frame(3, json.dumps(answer).encode())
    os._exit(0)


PARENT_GONE = signal.SIGHUP
"""The fork server's parent-death signal. The kernel sends it when the *thread* that started this process
ends, not only when the server does: the server starts it from a thread of Trio's cache, which ends after
10 s without work. So it is caught (its handler does nothing but wake the loop), and the loop ends this process
only when its parent is another (the server is gone: ``rust/src/forkserver.rs``); its workers, whose
parent-death signal is ``SIGKILL``, end with it."""


def main(argv: list[str]) -> None:
    """``argv``: the descriptor of the socket to the server, and the config (JSON)."""
    parent = os.getppid()
    signal.signal(PARENT_GONE, lambda *_: None)
    prctl(PR_SET_PDEATHSIG, PARENT_GONE)  # the server gone (even killed), this process goes, its workers too
    if os.getppid() != parent:
        os._exit(0)
    sock = socket.socket(fileno=int(argv[0]))
    raw = json.loads(argv[1])
    config = Config(raw)
    default_slice()  # (its workers ask for the short one again, once they wait for their request)
    with contextlib.suppress(OSError):
        os.nice(int(raw.get("nice", 0)))
    Zygote(sock, config, parent).serve()


if __name__ == "__main__":
    main(sys.argv[1:])
