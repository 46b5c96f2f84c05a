"""The worker processes of ``python`` steps: a fresh sandbox worker per step (:mod:`mcpipe._sandbox`).

A step's code runs in a worker forked warm by the sandbox's fork server, with the ``python`` role
(:mod:`mcpipe.kinds._pyexec`), never in the server. The worker is used once: it sets its limits (soft =
hard, so the code cannot raise them), drops to a uid of its own where the server may, runs the code, and
answers; then it is killed with everything it started. At most ``workers`` steps run at once (per Trio run);
more wait. The whole of a step (taking a worker, the request, the reply) is under the step's deadline.

The request is two JSON documents in one frame: the step's fixed part (the code, compiled at load and sent
marshalled so the worker does not compile it again, its limits), encoded once when the step is compiled, and
the call's part (``input``, ``context``, ``env``), encoded once per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import trio

from mcpipe._sandbox import SANDBOX, Output, SandboxError, Shape, exchange, request_frame
from mcpipe._workerpool import SizedSlots

__all__ = ["ROLE", "Outcome", "SandboxError", "python_shape", "run_code"]

ROLE = "python"
SANDBOX.register_role(ROLE, str(Path(__file__).with_name("_pyexec.py")))

_EXIT_WAIT_S = 2.0
"""How long to wait for a worker's exit status once it has ended without answering (the fork server
reports it; a fork server that does not, answers "unknown")."""


def python_shape(separate_uid: bool, namespaces: bool) -> Shape:
    return Shape(ROLE, separate_uid=separate_uid, namespaces=namespaces)


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


_SLOTS = SizedSlots("mcpipe_python_workers")
"""At most ``workers`` python steps at once in a Trio run (one limiter per size asked for)."""


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
) -> Outcome:
    """Run one step (its fixed ``header`` and this call's ``body``, JSON) in a fresh worker, within
    ``timeout_s``.

    Raises:
        SandboxError: no worker could be had.
    """
    outcome = Outcome()
    output = Output(max_output_bytes)
    async with _SLOTS(workers):
        with trio.move_on_after(timeout_s) as deadline:
            worker = await SANDBOX.take(shape, prefork)
            try:
                got = await exchange(worker, request_frame(header, body), output, max_reply_bytes)
                outcome.too_large = got.too_large
                if got.reply is not None:
                    try:
                        outcome.reply = orjson.loads(got.reply)
                    except orjson.JSONDecodeError:
                        outcome.reply = None
                if outcome.reply is None and not got.too_large:
                    outcome.returncode = await worker.exit_status(_EXIT_WAIT_S)
            finally:
                SANDBOX.release(worker)
    if deadline.cancelled_caught:
        outcome.timed_out = True
        outcome.reply = None
    outcome.stdout = output.out.decode("utf-8", errors="replace")
    outcome.stderr = output.err.decode("utf-8", errors="replace")
    outcome.truncated = output.truncated
    return outcome
