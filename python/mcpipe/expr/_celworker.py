"""CEL evaluations that may run long, run in worker processes that can be killed (issue 9).

The CEL library evaluates in Rust holding the GIL, cannot be interrupted, and its comprehensions cost
more than linear time (``args.items.map(x, x * 2)`` on 10 000 items takes seconds). A thread would not
help: it would hold the GIL as long. So an expression that iterates (a comprehension, or a list function
such as ``sort`` or ``lists.range``) is evaluated in a worker process of :mod:`mcpipe._workerpool`: the
event loop waits on the worker's pipe and goes on meanwhile, and past the deadline the worker is killed (the
next evaluation starts a new one) and the step fails with a timeout. Expressions that do not iterate cost
time linear in their input and run inline.

A worker's address space is bounded (:data:`MEMORY_BYTES`), and so is its reply (:data:`MAX_REPLY_BYTES`):
an expression that builds a huge value (``lists.range(1000000000)``, a ``replace`` that multiplies a text)
fails its step instead of taking the machine's memory.

The protocol is one JSON line each way: ``{"source", "context", "functions"}`` in; ``{"value"}`` or
``{"error", "missing"}`` out (the pool's framing). The worker is :mod:`mcpipe.expr._celexec` run as a script,
which imports nothing of mcpipe (it starts in the time the CEL library takes to import).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from mcpipe._workerpool import WorkerDied, WorkerPool, WorkerStartError, WorkerTimeout

__all__ = ["WORKERS", "WorkerDied", "evaluate_in_worker"]

WORKERS = 2
"""At most this many worker processes (and evaluations in flight); more evaluations wait for one."""

MEMORY_BYTES = 1024 * 1024 * 1024
"""A worker's address-space limit (``RLIMIT_AS``): the CEL library and Python take about 60 MB of it."""

MAX_REPLY_BYTES = 64 * 1024 * 1024
"""The longest reply (an expression's value as JSON) read from a worker; past it the worker is killed."""

READY_TIMEOUT_S = 60.0
"""How long a new worker may take to start (import the CEL library) before it counts as broken."""

_POOL = WorkerPool(
    "CEL",
    [sys.executable, str(Path(__file__).with_name("_celexec.py"))],
    size=WORKERS,
    memory_bytes=MEMORY_BYTES,
    max_reply_bytes=MAX_REPLY_BYTES,
    start_timeout_s=READY_TIMEOUT_S,
)
"""The workers (:mod:`mcpipe._workerpool`): at most :data:`WORKERS` evaluations in them at once (per Trio
run)."""


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
    try:
        line = await _POOL.call(request, timeout_s)
    except WorkerTimeout:
        return None
    except WorkerDied as e:
        if e.too_large:
            raise WorkerDied(f"the expression's value is larger than {MAX_REPLY_BYTES} bytes of JSON") from None
        raise WorkerDied("the CEL worker exited while evaluating (it ran out of memory, or was killed)") from None
    except WorkerStartError:
        raise OSError("the CEL worker did not start") from None
    reply: dict[str, Any] = orjson.loads(line)
    return reply
