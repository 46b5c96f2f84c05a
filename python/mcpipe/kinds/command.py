"""The ``command`` step kind: run an allowed executable, no shell, in its own process group.

The process starts in a new session, so it and everything it spawns form one process group. When the
step is cancelled (its timeout, the pipeline's deadline, the caller going away) the whole group gets
SIGTERM, then SIGKILL after the policy's grace period, and the step waits (shielded) until the process
has been reaped: no process outlives the step that started it. The group is also killed when the main
process exits (once its output is read, or after a short grace while something still holds the pipes), so
a background child neither keeps the step waiting nor outlives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec
import orjson
import trio

from mcpipe.errors import ErrorCode
from mcpipe.kinds._base import Build, Kind, StepFields
from mcpipe.kinds._policy import CommandPolicy, StepPolicy
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools._base import ToolContext

__all__ = ["KIND", "CommandFields", "CommandPlan", "env_object", "run_command", "run_process"]


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


_ORPHAN_GRACE_S = 0.2


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
    step: Leaf[CommandFields, CommandPlan], inputs: dict[str, Any], env: Mapping[str, Any], ctx: ToolContext
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


def _args(value: Any) -> list[str]:
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


def env_object(value: Any) -> dict[str, str]:
    """A step's ``env`` (an object, or null) as environment variables (non-strings as JSON)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise StepFailure(f"`env` must be an object, got {type(value).__name__}", ErrorCode.TOOL_FAILED)
    return {str(k): v if isinstance(v, str) else orjson.dumps(v).decode() for k, v in value.items() if v is not None}


def _stdin(value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    return orjson.dumps(value)


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def run_process(
    argv: list[str], env: dict[str, str], cwd: str | None, stdin: bytes | None, policy: CommandPolicy
) -> tuple[int, bytes, bytes]:
    """Run ``argv`` in a process group of its own; its exit code, stdout and stderr (see the module's doc).

    Raises:
        StepFailure: it could not start, or printed more than the policy's ``max_output_bytes``.
    """
    try:
        process = await trio.lowlevel.open_process(
            argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as e:
        raise StepFailure(f"cannot start '{argv[0]}': {e.strerror or e}", ErrorCode.TOOL_FAILED) from None
    limit = policy.max_output_bytes
    out: list[bytes] = []
    err: list[bytes] = []

    async def feed() -> None:
        assert process.stdin is not None
        async with process.stdin:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await process.stdin.send_all(stdin or b"")

    open_pipes = 2
    drained = trio.Event()
    too_much = False

    async def drain(stream: trio.abc.ReceiveStream, into: list[bytes], scope: trio.CancelScope) -> None:
        nonlocal open_pipes, too_much
        size = 0
        async with stream:
            while chunk := await stream.receive_some(65536):
                size += len(chunk)
                if size > limit:
                    too_much = True
                    scope.cancel()
                    return
                into.append(bytes(chunk))
        open_pipes -= 1
        if not open_pipes:
            drained.set()

    try:
        async with trio.open_nursery() as nursery:
            if stdin is not None:
                nursery.start_soon(feed)
            assert process.stdout is not None and process.stderr is not None
            nursery.start_soon(drain, process.stdout, out, nursery.cancel_scope)
            nursery.start_soon(drain, process.stderr, err, nursery.cancel_scope)
            await process.wait()
            # Children that outlived the main process are ended with it: those holding the pipes open after
            # a short grace (they cannot keep the step waiting), and background ones that let go of them
            # (`sleep 600 >/dev/null &` outlived the step, the server too, one more per call). The group's id
            # is the main process's pid, which the system does not give out again while the group has
            # members; reaped a moment ago, it is not given out again so soon either.
            with trio.move_on_after(_ORPHAN_GRACE_S):
                await drained.wait()
            _kill_group(process.pid, signal.SIGKILL)
    except BaseException:
        # Cancelled (timeout, deadline, caller gone) or failed: never leave the process group behind.
        await _terminate(process, policy.kill_grace_ms)
        raise
    if too_much:
        await _terminate(process, 0)
        raise StepFailure(f"the command printed more than {limit} bytes", ErrorCode.TOOL_FAILED)
    assert process.returncode is not None  # reaped by process.wait()
    return process.returncode, b"".join(out), b"".join(err)


async def _terminate(process: trio.Process, grace_ms: float) -> None:
    """SIGTERM the group, SIGKILL it after ``grace_ms``, and reap the process (shielded from cancellation)."""
    with trio.CancelScope(shield=True):
        if process.returncode is None and grace_ms > 0:
            _kill_group(process.pid, signal.SIGTERM)
            with trio.move_on_after(grace_ms / 1000):
                await process.wait()
        _kill_group(process.pid, signal.SIGKILL)
        await process.wait()


KIND = Kind(
    "command",
    CommandFields,
    run_command,
    templates=("args", "env", "cwd", "stdin"),
    build=build_command,
    default_timeout=command_timeout,
)
