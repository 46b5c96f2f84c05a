"""The ``python`` step kind: the step's code run in a worker process of its own, with NoETL's semantics.

``code`` is fixed when the pipeline loads (checked for syntax then, never a template): the caller's values
reach it only as data, ``input`` (a template: an object whose entries become the code's globals and
``main``'s arguments) and ``context`` (a template: the code's ``context`` global), sent to the process as
JSON. The code either sets ``result`` or defines ``main(...)``, whose return value is the result (NoETL's
rules, see :mod:`mcpipe.kinds._pyexec`).

Each step runs in a fresh process (:mod:`mcpipe.kinds._pyworker`) under the operator's
:class:`~mcpipe.kinds.PythonPolicy`: a deadline (``timeout_ms``, else the policy's), an address-space limit,
bounded stdout/stderr and result, at most ``workers`` at once. Code that loops forever, allocates without
bound, calls ``sys.exit``/``os._exit`` or crashes the interpreter fails its own step, located, with a code
(``TIMEOUT``, ``LIMIT_EXCEEDED``, ``TOOL_ERROR``); the server and its other runs go on.
"""

from __future__ import annotations

import logging
import math
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from types import CodeType
from typing import Annotated, Any, Literal

import msgspec

from mcpipe._describe import json_type
from mcpipe._json import dumps
from mcpipe._sandbox import Shape
from mcpipe.errors import ErrorCode
from mcpipe.kinds._base import Build, Kind, StepFields
from mcpipe.kinds._policy import PythonPolicy
from mcpipe.kinds._pyexec import ASYNC_IMPORTS, compile_step, needs_asyncio, program_text
from mcpipe.kinds._pyworker import Outcome, python_shape, run_code
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = ["KIND", "PythonFields", "PythonPlan", "run_python"]

_log = logging.getLogger("mcpipe.kinds.python")

Code = Annotated[str, msgspec.Meta(min_length=1)]


class PythonFields(StepFields, tag="python"):
    """Run ``code`` (Python, fixed at load) in a worker process of its own.

    ``input`` (a template: an object) gives the code its globals and ``main``'s arguments; ``context`` (a
    template) its ``context`` global; ``env`` (a template: an object) environment variables laid over the
    operator's base environment. ``coerce``: strings in ``input`` that hold a JSON (or Python) object or
    array literal are decoded first, as NoETL does. ``capture``: ``result`` (the output is the result) or
    ``all`` (``{result, stdout, stderr}``).
    """

    code: Code
    input: Any = None
    context: Any = None
    env: Any = None
    coerce: bool = False
    capture: Literal["result", "all"] = "result"


@dataclass(frozen=True, slots=True)
class PythonPlan:
    """What the compiler fixed: the code, the deadline, the operator's limits, and the step's part of every
    request (the code, compiled, and the limits as JSON, encoded once here)."""

    code: str
    timeout_s: float
    policy: PythonPolicy
    header: bytes
    shape: Shape
    held: tuple[tuple[str, int], ...]
    """The limits that hold for every step a reused worker serves (all but the CPU budget)."""


def _held(policy: PythonPolicy) -> dict[str, int]:
    return {
        "memory_bytes": policy.memory_mb * 1024 * 1024,
        "file_bytes": policy.max_file_mb * 1024 * 1024,
        "processes": policy.max_processes,
        "open_files": policy.max_open_files,
    }


def _header(
    code: str, program: CodeType | None, coerce: bool, timeout_s: float, policy: PythonPolicy, held: dict[str, int]
) -> bytes:
    limits = {**held, "cpu_seconds": math.ceil(timeout_s) + 1}
    header = {
        "code": code,
        "program": program_text(program) if program is not None else None,
        "coerce": coerce,
        "limits": limits,
    }
    return dumps({**header, "max_result_bytes": policy.max_result_bytes})


def build_python(b: Build[PythonFields]) -> PythonPlan:
    """The code, compiled once here (nothing runs: its syntax checked, the compiled code sent to each of its
    workers), and the step's deadline."""
    code = b.raw.get("code")
    if not isinstance(code, str) or b.fields is None:
        b.fail()
    program: CodeType | None = None
    try:
        program = compile_step(code)
    except SyntaxError as e:
        where = f" (line {e.lineno} of the code)" if e.lineno else ""
        b.problem(f"{b.location}.code", f"the code does not compile: {e.msg}{where}")
    except (ValueError, RecursionError, MemoryError) as e:
        b.problem(f"{b.location}.code", f"the code does not compile: {type(e).__name__}: {e}")
    policy = b.policy.python
    ms = b.fields.timeout_ms if b.fields.timeout_ms is not None else policy.timeout_ms
    timeout_s = ms / 1000
    held = _held(policy)
    header = _header(code, program, b.fields.coerce, timeout_s, policy, held)
    imports = ASYNC_IMPORTS if program is not None and needs_asyncio(program) else ()
    shape = python_shape(policy.separate_uid, policy.namespaces, imports, reuse=policy.reuse == "run")
    return PythonPlan(code, timeout_s, policy, header, shape, tuple(sorted(held.items())))


def _env(value: object, base: dict[str, str]) -> dict[str, str]:
    if value is None:
        return base
    if not isinstance(value, Mapping):
        raise StepFailure(f"`env` must be an object, got {json_type(value)}", ErrorCode.TOOL_FAILED)
    env = dict(base)
    for k, v in value.items():
        if v is None:
            continue
        text = v if isinstance(v, str) else dumps(v).decode()
        if "\0" in k or "=" in k or "\0" in text or not k:
            raise StepFailure(f"`env` has an invalid variable name or value: {k!r}", ErrorCode.TOOL_FAILED)
        env[str(k)] = text
    return env


async def run_python(
    step: Leaf[PythonFields, PythonPlan], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Run the code in a fresh worker process; the output is its result (``capture: all``: with its
    stdout and stderr)."""
    plan = step.built
    policy = plan.policy
    given = inputs.get("input")
    if given is not None and not isinstance(given, Mapping):
        raise StepFailure(f"`input` must resolve to an object, got {json_type(given)}", ErrorCode.TOOL_FAILED)
    proc_env = _env(inputs.get("env"), policy.base_env())
    try:
        given_input = dict(given) if given is not None else {}
        body = dumps({"env": proc_env, "input": given_input, "context": inputs.get("context")})
    except TypeError as e:
        raise StepFailure(f"the step's input is not JSON data: {e}", ErrorCode.TOOL_FAILED) from None
    try:
        outcome = await run_code(
            plan.header,
            body,
            shape=plan.shape,
            timeout_s=plan.timeout_s,
            workers=policy.workers,
            prefork=policy.spares(),
            max_output_bytes=policy.max_output_bytes,
            max_reply_bytes=policy.max_result_bytes + 65536,
            principal=ctx.principal,
            held=plan.held,
        )
    except OSError as e:
        raise StepFailure(f"cannot start a python worker process: {e}", ErrorCode.TOOL_FAILED) from None
    return _answer(step, plan, outcome)


def _printed(outcome: Outcome) -> dict[str, Any]:
    out: dict[str, Any] = {"stdout": outcome.stdout, "stderr": outcome.stderr}
    if outcome.truncated:
        out["truncated_bytes"] = outcome.truncated
    return out


def _answer(step: Leaf[PythonFields, PythonPlan], plan: PythonPlan, outcome: Outcome) -> StepOutput:
    printed = _printed(outcome)
    if outcome.stdout or outcome.stderr:
        _log.info("python step %s printed: %s", step.location, printed)
    if outcome.timed_out:
        raise StepFailure(
            f"the python step ran past its deadline of {plan.timeout_s * 1000:g} ms (its process was killed)",
            ErrorCode.TIMEOUT,
            printed,
        )
    if outcome.too_large:
        raise StepFailure(
            f"the python step's result is larger than {plan.policy.max_result_bytes} bytes of JSON",
            ErrorCode.OUTPUT_TOO_LARGE,
            printed,
        )
    reply = outcome.reply
    if reply is None:
        raise StepFailure(_died(outcome.returncode, plan.policy), ErrorCode.TOOL_ERROR, printed)
    if reply.get("ok"):
        result = reply.get("result")
        if step.fields.capture == "all":
            return StepOutput.of({"result": result, **printed})
        return StepOutput.of(result)
    line = reply.get("line")
    where = f" (line {line} of the code)" if isinstance(line, int) else ""
    kind = reply.get("kind")
    message = str(reply.get("error") or "the code failed")
    if reply.get("traceback"):
        printed["traceback"] = reply["traceback"]
    if isinstance(reply.get("text"), str):
        printed["error_text"] = reply["text"]  # the exception's own text (`str(e)`), as NoETL reports it
    if kind == "memory":
        raise StepFailure(
            f"the python step ran out of memory (limit {plan.policy.memory_mb} MiB){where}",
            ErrorCode.LIMIT_EXCEEDED,
            printed,
        )
    if kind == "too_large":
        raise StepFailure(f"the python step's {message}", ErrorCode.OUTPUT_TOO_LARGE, printed)
    if kind == "exit":
        raise StepFailure(
            f"the python step failed: {message}{where}; a step cannot exit", ErrorCode.TOOL_ERROR, printed
        )
    raise StepFailure(f"the python step failed: {message}{where}", ErrorCode.TOOL_ERROR, printed)


def _died(code: int | None, policy: PythonPolicy) -> str:
    if code is None:
        return "the python step's process closed its reply pipe without answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        if -code == signal.SIGXCPU:
            return "the python step used up its CPU time (SIGXCPU)"
        if -code == signal.SIGKILL:
            return f"the python step's process was killed (SIGKILL; its memory limit is {policy.memory_mb} MiB)"
        return f"the python step's process died of {name} before answering"
    return f"the python step's process exited with status {code} before answering (os._exit?)"


KIND = Kind(
    "python",
    PythonFields,
    run_python,
    templates=("input", "context", "env"),
    build=build_python,
    own_deadline=True,
)
