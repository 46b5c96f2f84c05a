"""The worker processes of ``python`` steps: one-shot sandbox workers run by the one worker pool.

A step's code runs in a worker forked warm by the sandbox's fork server (:mod:`mcpipe._sandbox`), with the
``python`` role (:mod:`mcpipe.kinds._pyexec`), never in the server. The workers are a
:class:`~mcpipe._workerpool.WorkerPool` of :class:`~mcpipe._sandbox.SandboxSpawner` (one pool per
``workers``/``prefork`` policy), keyed by the step's isolation (its :class:`~mcpipe._sandbox.Shape`), with
``reuse=False``: a worker is used once. It sets its limits (soft = hard, so the code cannot raise them),
drops to a uid of its own where the server may, runs the code, and answers; then it is killed with
everything it started. At most ``workers`` steps run at once (per Trio run); more wait. The whole of a step
(taking a worker, the request, the reply) is under the step's deadline, which the pool keeps: past it the
worker is killed.

With ``outbound.python.reuse: run`` (the step's shape has ``reuse``), a worker that answered cleanly is kept
for the later steps of the same run and principal with the same limits (its reuse key: the run's
:class:`~mcpipe._runscope.RunScope`, the principal, the shape, the fixed limits), each step still in fresh
globals under its own deadline; when the run ends (however) its kept workers are killed
(:meth:`~mcpipe._workerpool.WorkerPool.discard`) and the spare its first step took is forked again, both once
the run's caller has its answer (:func:`_run_over`). A worker is never kept for another run or principal.

The request is two JSON documents in one frame: the step's fixed part (the code, compiled at load and sent
marshalled so the worker does not compile it again, its limits), encoded once when the step is compiled, and
the call's part (``input``, ``context``, ``env``), encoded once per call.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from mcpipe import _runscope
from mcpipe._json import loads
from mcpipe._sandbox import SANDBOX, Output, SandboxError, SandboxSpawner, Shape, request_frame
from mcpipe._workerpool import WorkerDied, WorkerPool, WorkerTimeout

__all__ = ["ROLE", "Outcome", "SandboxError", "python_shape", "run_code"]

_log = logging.getLogger("mcpipe.kinds.python")

ROLE = "python"
SANDBOX.register_role(ROLE, str(Path(__file__).with_name("_pyexec.py")))


def python_shape(separate_uid: bool, namespaces: bool, imports: tuple[str, ...] = (), reuse: bool = False) -> Shape:
    """The workers of a step with this isolation, importing ``imports`` as they wait for the step (``reuse``:
    kept for the later steps of its run)."""
    return Shape(ROLE, separate_uid=separate_uid, namespaces=namespaces, imports=imports, reuse=reuse)


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


_SPAWNER = SandboxSpawner(SANDBOX)
_POOLS: dict[tuple[int, int], WorkerPool] = {}
_POOLS_LOCK = threading.Lock()


def _pool(workers: int, spares: int) -> WorkerPool:
    """The pool of the steps whose policy says ``workers`` and ``prefork`` (made on first use)."""
    pool = _POOLS.get((workers, spares))
    if pool is None:
        with _POOLS_LOCK:
            pool = _POOLS.get((workers, spares))
            if pool is None:
                pool = _POOLS[(workers, spares)] = WorkerPool(
                    f"python ({workers} workers)", _SPAWNER, size=workers, reuse=False, spares=spares
                )
    return pool


async def run_code(
    header: bytes,
    body: bytes,
    *,
    shape: Shape,
    timeout_s: float,
    workers: int,
    prefork: int,
    max_output_bytes: int,
    max_reply_bytes: int,
    principal: str | None = None,
    held: Hashable = None,
) -> Outcome:
    """Run one step (its fixed ``header`` and this call's ``body``, JSON) in a fresh worker, within
    ``timeout_s`` (a ``reuse`` shape: in one kept by an earlier step of this run for ``principal`` and the
    limits ``held`` for all of its steps, when there is one).

    Raises:
        OSError: no worker could be had (:class:`~mcpipe._workerpool.WorkerStartError`, saying why).
    """
    outcome = Outcome()
    output = Output(max_output_bytes)
    pool = _pool(workers, prefork)
    reuse_key = _reuse_key(pool, shape, principal, held, prefork) if shape.reuse else None
    # A run whose worker waits for its later steps: its spare is forked again at its end (:func:`_run_over`).
    later = reuse_key is not None and SANDBOX.reuses(shape)
    try:
        reply = await pool.call(
            request_frame(header, body),
            timeout_s,
            key=shape,
            sink=output,
            limit=max_reply_bytes,
            prefork=0 if later else prefork,
            start_in_deadline=True,
            reuse_key=reuse_key,
        )
        try:
            outcome.reply = loads(reply)  # (an integer past 64 bits exactly)
        except (ValueError, RecursionError):  # (not JSON, or nested past Python's parser: a worker wrote it)
            outcome.reply = None
    except WorkerTimeout:
        outcome.timed_out = True
    except WorkerDied as e:
        outcome.too_large = e.too_large
        outcome.returncode = e.returncode
    outcome.stdout = output.out.decode("utf-8", errors="replace")
    outcome.stderr = output.err.decode("utf-8", errors="replace")
    outcome.truncated = output.truncated
    return outcome


def _reuse_key(pool: WorkerPool, shape: Shape, principal: str | None, held: Hashable, spares: int) -> Hashable:
    """What a worker is kept for within this run (None outside a run: then it is not kept); the run's end
    kills what was kept for it, then tops the spares up: a reusing run's later steps take no spare, so the
    one its first step took is forked again once the run is over, not while its steps run (a fork and a
    worker's start are some milliseconds of CPU, on the cores the run's steps hand each other)."""
    scope = _runscope.current()
    if scope is None or not scope.open:
        return None
    key = (scope, principal, shape, held)
    scope.on_end((pool, key), lambda: _run_over(pool, key, shape, spares))
    return key


def _run_over(pool: WorkerPool, key: Hashable, shape: Shape, spares: int) -> None:
    """The run is over: its kept workers killed and the spares topped up, by a task of the event loop's own
    that runs once the run's caller has gone on (its answer written: a killed worker wakes to exit, and a
    fork server to fork, on the cores the answer needs), and outside Trio at once. The task releases them
    whatever happens to it, even cancelled before it ran (the Trio run ending)."""

    def release() -> None:
        pool.discard(key)
        if spares > 0:
            pool.prefork(spares, key=shape)

    async def soon() -> None:
        try:
            await trio.lowlevel.checkpoint()
        finally:
            try:
                release()
            except Exception:  # a system task's error would end the Trio run: logged instead, as the run's end does
                _log.exception("releasing a python run's workers failed")

    try:
        trio.lowlevel.spawn_system_task(soon, name="mcpipe: a python run's workers released")
    except RuntimeError:  # not in a Trio run
        release()
