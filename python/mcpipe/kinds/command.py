"""The ``command`` step kind: run an allowed executable, no shell, in a sandbox worker of its own.

The process is started by the sandbox (:mod:`mcpipe._sandbox`, role ``exec``): a keeper process, first of a
PID namespace of its own where the kernel allows (else a child subreaper), runs the command as its child.
When the command exits, everything it started is killed with it (a background child, one that called
``setsid``, a double fork), so nothing outlives the step. When the step is cancelled (its timeout, the
pipeline's deadline, the caller going away) every process of the command gets SIGTERM, then SIGKILL after
the policy's grace period. The command runs as the server's uid, with the operator's base environment.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Mapping
from typing import Annotated, Any, NamedTuple

import msgspec
import orjson
import trio

from mcpipe._json import dumps
from mcpipe._sandbox import SANDBOX, Output, SandboxError, Shape, Worker, frame, receive_frame, send_all
from mcpipe.errors import ErrorCode
from mcpipe.kinds._base import Build, Kind, StepFields
from mcpipe.kinds._policy import CommandPolicy, StepPolicy
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = [
    "KIND",
    "CommandFields",
    "CommandPlan",
    "ProcessRun",
    "env_object",
    "run_captured",
    "run_command",
    "run_process",
]


class CommandFields(StepFields, tag="command"):
    """Run an allowed command (no shell). ``args``, ``env``, ``cwd`` and ``stdin`` are templates."""

    command: Annotated[str, msgspec.Meta(min_length=1)]
    args: Any = msgspec.field(default_factory=list)
    env: Any = None
    cwd: Any = None
    stdin: Any = None
    require_json_stdout: bool = False
    expected_exit_codes: list[int] = msgspec.field(default_factory=lambda: [0])


class CommandPlan:
    """What the compiler fixed for a command step: its argv prefix and the policy it runs under."""

    __slots__ = ("argv", "policy")

    def __init__(self, argv: tuple[str, ...], policy: CommandPolicy) -> None:
        self.argv = argv
        self.policy = policy


def build_command(b: Build[Any]) -> CommandPlan:
    """The command's argv prefix from the operator's allowlist."""
    name = b.raw.get("command")
    if not isinstance(name, str):
        b.fail()
    policy = b.policy
    argv = policy.command.argv(name)
    if argv is None:
        allowed = ", ".join(sorted(policy.command.commands)) or "none are configured"
        b.problem(f"{b.location}.command", f"command '{name}' is not allowed (allowed: {allowed})", ErrorCode.FORBIDDEN)
        b.fail()
    if not argv or not argv[0]:
        b.problem(f"{b.location}.command", f"command '{name}' has an empty executable in the config")
        b.fail()
    return CommandPlan(argv, policy.command)


def command_timeout(policy: StepPolicy) -> float | None:
    """Commands get the operator's default deadline."""
    return policy.command.timeout_ms


async def run_command(
    step: Leaf[CommandFields, CommandPlan], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Run the command; the output is ``{exit_code, stdout, stderr}`` plus ``json`` when stdout is JSON."""
    spec = step.fields
    plan = step.built
    argv = [*plan.argv, *_args(inputs.get("args"))]
    proc_env = plan.policy.base_env()
    proc_env.update(env_object(inputs.get("env")))
    cwd = inputs.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise StepFailure(f"`cwd` must be a string, got {type(cwd).__name__}", ErrorCode.TOOL_FAILED)
    stdin = _stdin(inputs.get("stdin"))
    code, out, err = await run_process(argv, proc_env, cwd, stdin, plan.policy)
    stdout = out.decode("utf-8", errors="replace")
    stderr = err.decode("utf-8", errors="replace")
    output: dict[str, Any] = {"exit_code": code, "stdout": stdout, "stderr": stderr}
    parsed = False
    if stdout.strip():
        try:
            output["json"] = orjson.loads(out)
            parsed = True
        except orjson.JSONDecodeError:
            pass
    if code not in spec.expected_exit_codes:
        tail = stderr.strip()[-500:]
        reason = f"command '{spec.command}' exited with code {code}"
        raise StepFailure(f"{reason}: {tail}" if tail else reason, ErrorCode.TOOL_ERROR, output)
    if spec.require_json_stdout and not parsed:
        raise StepFailure(f"command '{spec.command}' did not print JSON", ErrorCode.TOOL_ERROR, output)
    return StepOutput.of(output)


def _args(value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise StepFailure(f"`args` must be an array, got {type(value).__name__}", ErrorCode.TOOL_FAILED)
    out = []
    for item in value:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, bool):
            out.append("true" if item else "false")
        elif isinstance(item, (int, float)):
            out.append(orjson.dumps(item).decode())
        else:
            raise StepFailure(f"every arg must be a string or a number, got {item!r}", ErrorCode.TOOL_FAILED)
    return out


def env_object(value: object) -> dict[str, str]:
    """A step's ``env`` (an object, or null) as environment variables (non-strings as JSON)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise StepFailure(f"`env` must be an object, got {type(value).__name__}", ErrorCode.TOOL_FAILED)
    return {str(k): v if isinstance(v, str) else orjson.dumps(v).decode() for k, v in value.items() if v is not None}


def _stdin(value: object) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    return orjson.dumps(value)


EXEC = Shape("exec", separate_uid=False, namespaces=True)
"""Commands run as the server's uid (they are the operator's executables), in a PID namespace of their own
where the kernel allows (else under a child subreaper), so nothing they start outlives them."""

_ANSWER_BYTES = 65536


def _executable(name: str, env: Mapping[str, str]) -> str:
    if "/" in name:
        return name
    found = shutil.which(name, path=env.get("PATH", os.defpath))
    if found is None:
        raise StepFailure(f"cannot start '{name}': No such file or directory", ErrorCode.TOOL_FAILED)
    return found


class ProcessRun(NamedTuple):
    """What a program did (:func:`run_captured`).

    Attributes:
        code: its exit code (negative: the signal that ended it; ``-SIGKILL`` when it was stopped).
        stdout, stderr: what it printed, each cut at ``max_bytes``.
        stdout_truncated, stderr_truncated: that stream printed more than ``max_bytes``.
        timed_out: ``timeout_s`` passed and it was stopped (its output so far kept).
    """

    code: int
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False


async def run_process(
    argv: list[str], env: dict[str, str], cwd: str | None, stdin: bytes | None, policy: CommandPolicy
) -> tuple[int, bytes, bytes]:
    """Run ``argv`` in a sandbox worker (:mod:`mcpipe._sandbox`'s ``exec`` role); its exit code, stdout
    and stderr (see the module's doc).

    Raises:
        StepFailure: it could not start, or printed more than the policy's ``max_output_bytes``.
    """
    limit = policy.max_output_bytes
    run = await _run(argv, env, cwd, stdin, policy, limit, None, stop_on_overflow=True)
    if run.stdout_truncated or run.stderr_truncated:
        raise StepFailure(f"the command printed more than {limit} bytes", ErrorCode.TOOL_FAILED)
    return run.code, run.stdout, run.stderr


async def run_captured(
    argv: list[str],
    env: dict[str, str],
    cwd: str | None,
    stdin: bytes | None,
    policy: CommandPolicy,
    *,
    max_bytes: int,
    timeout_s: float | None = None,
) -> ProcessRun:
    """Run ``argv`` as :func:`run_process` does, for a format that reports what a program did rather than
    failing on it (its command bindings): output past ``max_bytes`` is cut and flagged,
    and past ``timeout_s`` the program is stopped (its processes all killed) and ``timed_out`` set.

    Raises:
        StepFailure: it could not start.
    """
    return await _run(argv, env, cwd, stdin, policy, max_bytes, timeout_s, stop_on_overflow=False)


async def _run(
    argv: list[str],
    env: dict[str, str],
    cwd: str | None,
    stdin: bytes | None,
    policy: CommandPolicy,
    limit: int,
    timeout_s: float | None,
    *,
    stop_on_overflow: bool,
) -> ProcessRun:
    request = {
        "argv": [_executable(argv[0], env), *argv[1:]],
        "env": env,
        "cwd": os.path.join(os.getcwd(), cwd) if cwd else os.getcwd(),
    }
    try:
        worker = await SANDBOX.take(EXEC, stdin=stdin is not None)
    except SandboxError as e:
        raise StepFailure(f"cannot start '{argv[0]}': {e}", ErrorCode.TOOL_FAILED) from None
    output = Output(limit + 1)  # one byte past the limit tells a stream that printed more
    answer: bytes | None = None
    reading = trio.CancelScope()
    if stop_on_overflow:
        output.on_overflow = reading.cancel
    deadline = trio.move_on_after(timeout_s) if timeout_s is not None else trio.CancelScope()
    try:
        with deadline:
            try:
                async with trio.open_nursery() as nursery:

                    async def feed() -> None:
                        fd, worker.stdin = worker.stdin, -1
                        try:
                            view = memoryview(stdin or b"")
                            while view:
                                await trio.lowlevel.wait_writable(fd)
                                try:
                                    view = view[os.write(fd, view) :]
                                except BlockingIOError:
                                    continue
                        except OSError:
                            pass
                        finally:
                            trio.lowlevel.notify_closing(fd)
                            os.close(fd)

                    async def drain(fd: int, into: bytearray) -> None:
                        await output.drain(fd, into)

                    if stdin is not None:
                        nursery.start_soon(feed)
                    nursery.start_soon(drain, worker.out, output.out)
                    nursery.start_soon(drain, worker.err, output.err)
                    await send_all(worker.io, frame(dumps(request)))
                    with reading:

                        async def watch() -> None:
                            await trio.lowlevel.wait_readable(worker.pidfd)  # the keeper has ended
                            reading.cancel()

                        nursery.start_soon(watch)
                        answer = await receive_frame(worker.io, _ANSWER_BYTES)
                    nursery.cancel_scope.cancel()
            except BaseException:
                # Cancelled (timeout, deadline, caller gone) or failed: never leave the command behind.
                with trio.CancelScope(shield=True):
                    await _terminate(worker, policy.kill_grace_ms)
                raise
    finally:
        SANDBOX.release(worker)
    output.read_now(worker.out, output.out)
    output.read_now(worker.err, output.err)
    said = orjson.loads(answer) if answer else {}
    if "error" in said:
        raise StepFailure(f"cannot start '{argv[0]}': {said['error']}", ErrorCode.TOOL_FAILED)
    code = said.get("exit")
    if not isinstance(code, int):
        code = -signal.SIGKILL  # the keeper was killed before it could say
    out, err = bytes(output.out), bytes(output.err)
    return ProcessRun(
        code,
        out[:limit],
        err[:limit],
        len(out) > limit or (stop_on_overflow and bool(output.truncated)),
        len(err) > limit,
        deadline.cancelled_caught,
    )


async def _terminate(worker: Worker, grace_ms: float) -> None:
    """SIGTERM every process of the command, SIGKILL them after ``grace_ms`` (the caller shields this)."""
    if grace_ms > 0 and worker.pidfd >= 0:
        with contextlib.suppress(OSError):
            await send_all(worker.io, frame(dumps({"signal": int(signal.SIGTERM)})))
            with trio.move_on_after(grace_ms / 1000):
                await trio.lowlevel.wait_readable(worker.pidfd)
    worker.kill()


KIND = Kind(
    "command",
    CommandFields,
    run_command,
    templates=("args", "env", "cwd", "stdin"),
    build=build_command,
    default_timeout=command_timeout,
)
