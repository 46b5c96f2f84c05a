"""``mcpipe serve --workers N``: N server processes sharing one listening socket, under a supervisor.

One mcpipe process uses one core. The supervisor (the process the user started) binds and listens, then
starts N workers (``python -m mcpipe.server --listen-fd FD``) that inherit the socket; each is a full
server with its own app, downstream connections and pipeline store client, and the kernel hands each new
connection to whichever worker accepts it first. So:

- 2026-07-28 requests are stateless: any worker serves any request. With a shared store
  (``[store] url = "redis://..."``) a pipeline suspended by one worker resumes on any other: the workers
  share the state key (the configured one, else one the supervisor draws at start) and the one-use claims.
  With the in-process store each worker keeps its own key and claims, so a state resumes only on the
  worker that issued it (elsewhere it is refused, never run twice): use Redis with several workers.
- Background runs and MCP tasks live in the run queue, which every worker must share (``pipe_status`` of a
  run started through one worker may reach another). Redis (``[store] url``) and a ``[runs] path`` file are
  shared already; with neither, the supervisor makes the workers one SQLite run queue file in a private
  temporary directory (removed when it exits: the runs last as long as the server, as a single process's
  in-memory queue does).
- 2025-11-25 sessions live in one process's memory, and a client's next connection may reach another
  worker, so with several workers that era is served in the SDK's stateless mode: every request stands
  alone (no ``Mcp-Session-Id``, no GET stream). Tools and ``mcp_pipe`` work; a step that asks a
  2025-11-25 client (elicitation, sampling, roots) fails, since the answer would have nowhere to land.

SIGTERM or SIGINT to the supervisor is passed to every worker, which shuts down as a single server does
(its calls in flight answered, then exit); the supervisor exits when they all have. A worker that dies (a
non-zero status, or killed by a signal other than a stop) is reported and replaced; one that keeps dying
(more than :data:`MAX_DEATHS` in :data:`DEATH_WINDOW_S`) stops the whole server with status 1, since a crash
loop would only hide the problem. A worker that stops cleanly (status 0: it was sent SIGTERM or SIGINT
itself) is not replaced; when none is left the supervisor exits too.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial

import trio

from mcpipe.errors import MCPipeError

__all__ = ["DEATH_WINDOW_S", "MAX_DEATHS", "ActivationError", "activated_socket", "listen_socket", "supervise"]

_log = logging.getLogger("mcpipe.workers")

MAX_DEATHS = 5
DEATH_WINDOW_S = 60.0
STOP_TIMEOUT_S = 30.0
"""How long a worker gets to drain after SIGTERM before it is killed."""


def listen_socket(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A bound, listening TCP socket the workers can inherit."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


SD_LISTEN_FDS_START = 3
"""The first descriptor a service manager passes (``sd_listen_fds(3)``)."""


class ActivationError(MCPipeError):
    """The sockets a service manager passed cannot be served (several, or not a listening TCP socket)."""


def activated_socket(environ: dict[str, str] | None = None) -> socket.socket | None:
    """The listening socket systemd passed this process (socket activation), or None when it passed none.

    The protocol of ``sd_listen_fds(3)``: ``LISTEN_PID`` names this process and ``LISTEN_FDS`` counts the
    descriptors from 3 on. mcpipe serves one TCP socket, so more than one, or one that is not a listening
    TCP socket, is an :class:`ActivationError`. The variables are removed from ``os.environ`` once read
    (``--workers``' processes and downstream servers must not take the socket for theirs)."""
    env = os.environ if environ is None else environ
    pid, fds = env.get("LISTEN_PID"), env.get("LISTEN_FDS")
    if pid is None or fds is None or pid != str(os.getpid()):
        return None
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)
    if fds != "1":
        raise ActivationError(f"socket activation passed LISTEN_FDS={fds}: mcpipe serves one listening socket")
    try:
        sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    except OSError as exc:
        raise ActivationError(f"socket activation: descriptor 3 is not a socket ({exc.strerror})") from None
    kind = (sock.family, sock.type, sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
    if kind[0] not in (socket.AF_INET, socket.AF_INET6) or kind[1] != socket.SOCK_STREAM or not kind[2]:
        sock.detach()  # not ours to close
        raise ActivationError(
            "socket activation: descriptor 3 is not a listening TCP socket (ListenStream=PORT or ADDRESS:PORT)"
        )
    sock.set_inheritable(True)
    return sock


async def _stop_worker(proc: trio.Process) -> None:
    proc.send_signal(signal.SIGTERM)
    with trio.move_on_after(STOP_TIMEOUT_S):
        await proc.wait()
        return
    _log.error("worker pid %d did not stop within %.0f s: killing it", proc.pid, STOP_TIMEOUT_S)
    proc.kill()


async def supervise(
    *,
    workers: int,
    host: str,
    port: int,
    path: str,
    worker_args: list[str],
    shutdown_trigger: Callable[[], Awaitable[None]],
    shared_store: bool = False,
    state_key_env: str = "MCPIPE_STATE_KEY",
    share_runs: bool = False,
    sock: socket.socket | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> int:
    """Run ``workers`` worker processes on one socket until ``shutdown_trigger`` returns.

    Args:
        workers: how many.
        host, port: where to listen (port 0 picks a free one).
        path: the MCP path, for the URL reported through ``task_status``.
        worker_args: the ``mcpipe.server`` arguments of each worker (its config and log level).
        shutdown_trigger: returns when the server should stop (SIGINT/SIGTERM).
        shared_store: whether the config's pipeline store is shared (Redis): the workers then share a state
            key; otherwise each has its own, so no claim can be dodged by resuming on another worker.
        state_key_env: the variable holding the state key (``interaction.state_key_env``).
        share_runs: the config names no shared run queue: give the workers one SQLite file in a private
            temporary directory (``--runs-path``), removed on exit.
        sock: a listening socket to serve instead of binding ``host:port`` (socket activation); closed on exit.

    Returns:
        0 after a clean stop, 1 when a worker kept dying.
    """
    sock = listen_socket(host, port) if sock is None else sock
    bound = sock.getsockname()
    name = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    url = f"http://{name}:{bound[1]}{path}"
    metrics_dir = tempfile.mkdtemp(prefix="mcpipe-metrics-")
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": metrics_dir, SUPERVISOR_ENV: str(os.getpid())}
    if shared_store:
        env.setdefault(state_key_env, os.urandom(32).hex())
    elif env.pop(state_key_env, None):
        _log.warning(
            "%s is ignored with several workers and the in-process store (each worker's claims are its own, so "
            "a shared key would let a state resume once per worker): set [store] url to a Redis URL",
            state_key_env,
        )
    argv = [sys.executable, "-m", "mcpipe.server", "--listen-fd", str(sock.fileno()), *worker_args]
    runs_dir = None
    if share_runs:
        runs_dir = tempfile.mkdtemp(prefix="mcpipe-runs-")  # mode 0700: this user's only
        runs_file = os.path.join(runs_dir, "runs.sqlite")
        argv += ["--runs-path", runs_file]
        _log.info(
            "the %d workers share the run queue %s (removed on exit; set [runs] path to keep runs across restarts)",
            workers,
            runs_file,
        )
    status = 0
    stop = trio.Event()
    running = workers

    async def worker(slot: int) -> None:
        nonlocal status, running
        deaths: deque[float] = deque()
        while True:
            async with trio.open_nursery() as nursery:
                run = partial(
                    trio.run_process,
                    argv,
                    stdin=None,
                    check=False,
                    env=env,
                    pass_fds=(sock.fileno(),),
                    deliver_cancel=_stop_worker,
                )
                proc: trio.Process = await nursery.start(run)
                _log.debug("worker %d started (pid %d)", slot, proc.pid)
            _mark_dead(proc.pid, metrics_dir)
            if proc.returncode == 0:
                _log.info("worker %d (pid %d) stopped", slot, proc.pid)
                running -= 1
                if running == 0:
                    stop.set()
                return
            now = trio.current_time()
            deaths.append(now)
            while deaths and deaths[0] < now - DEATH_WINDOW_S:
                deaths.popleft()
            if len(deaths) > MAX_DEATHS:
                _log.error("worker %d died %d times in %.0f s: stopping the server", slot, len(deaths), DEATH_WINDOW_S)
                status = 1
                stop.set()
                return
            _log.error("worker %d (pid %d) exited with status %s: starting another", slot, proc.pid, proc.returncode)

    try:
        async with trio.open_nursery() as nursery:
            for slot in range(workers):
                nursery.start_soon(worker, slot)
            _log.info("serving MCP at %s (%d workers, supervisor pid %d)", url, workers, os.getpid())
            task_status.started(url)
            async with trio.open_nursery() as waiting:
                waiting.start_soon(_set_after, shutdown_trigger, stop)
                await stop.wait()
                waiting.cancel_scope.cancel()
            nursery.cancel_scope.cancel()  # every worker gets SIGTERM and is waited for
    finally:
        sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
        if runs_dir is not None:
            shutil.rmtree(runs_dir, ignore_errors=True)
    return status


SUPERVISOR_ENV = "MCPIPE_SUPERVISOR_PID"
"""The supervisor's pid, in each worker's environment (:func:`supervisor_gone`)."""


async def supervisor_gone(parent: int, log: logging.Logger = _log) -> None:
    """Return once ``parent``, the supervisor that started this worker, has ended: a supervisor killed outright
    (``SIGKILL``, the OOM killer) cannot stop its workers, which would go on serving its socket with no one to
    replace or stop them. A ``shutdown_trigger`` of each worker, beside the signals: the worker shuts down as on
    SIGTERM, answering its calls in flight. Waits on a pidfd of the supervisor (no polling); where there is none,
    looks at the worker's parent every second."""
    try:
        fd: int | None = os.pidfd_open(parent)
    except OSError:  # gone already (then the parent below is another), or no pidfds on this kernel
        fd = None
    try:
        if os.getppid() == parent:  # (opened before it ended: the pidfd is the supervisor's)
            if fd is not None:
                await trio.lowlevel.wait_readable(fd)
            else:
                for _ in itertools.count():  # (a poll: no event to wait on without a pidfd)
                    if os.getppid() != parent:
                        break
                    await trio.sleep(1.0)
    finally:
        if fd is not None:
            os.close(fd)
    log.warning("the supervisor (pid %d) is gone: shutting down", parent)


async def first_of(*triggers: Callable[[], Awaitable[None]]) -> None:
    """Return when the first of ``triggers`` returns (the others cancelled)."""
    async with trio.open_nursery() as nursery:

        async def one(trigger: Callable[[], Awaitable[None]]) -> None:
            await trigger()
            nursery.cancel_scope.cancel()

        for trigger in triggers:
            nursery.start_soon(one, trigger)


async def _set_after(trigger: Callable[[], Awaitable[None]], event: trio.Event) -> None:
    await trigger()
    event.set()


def _mark_dead(pid: int, metrics_dir: str) -> None:
    """Tell prometheus-client's multiprocess mode a worker is gone (its live gauges stop counting)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, metrics_dir)
