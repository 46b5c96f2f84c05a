"""The ``shell`` step kind: NoETL's shell tool, shell programs run one after another with ``sh -c``.

NoETL's ``kind: shell`` runs each of its ``cmds`` (a shell program, rendered first) with ``/bin/sh -c``: the
shell is its semantics (pipes, redirections, ``&&``). So a ``shell`` step needs the operator's leave: the
``outbound.commands`` entry ``sh`` (``sh: /bin/sh``) names the shell, and without it the step is refused at
load (``FORBIDDEN``). Each program then runs as a ``command`` step's process does (``mcpipe.kinds.command``):
in a process group of its own, killed (SIGTERM, then SIGKILL) at the deadline or on cancellation, output
bounded, environment the operator's base environment plus the step's ``env``. The first program that exits
non-zero stops the step. The output is NoETL's: ``{returncode, stdout, stderr, commands: [{cmd_preview,
returncode, stdout, stderr, duration_ms}], duration_ms}``.

A program is shell text: a value put into it (a NoETL template rendered into ``cmds``) is read by the
shell. Pass a caller's values in ``env`` and read them as ``"$NAME"`` in the program to keep them data.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from mcpipe._describe import json_type
from mcpipe.errors import ErrorCode
from mcpipe.kinds._base import Build, Kind, StepFields
from mcpipe.kinds.command import CommandPlan, command_timeout, env_object, run_process
from mcpipe.plan import Leaf
from mcpipe.results import StepFailure, StepOutput
from mcpipe.tools import ToolContext

__all__ = ["KIND", "SHELL", "ShellFields", "run_shell"]

SHELL = "sh"
"""The ``outbound.commands`` name a shell step runs its programs with (``<shell> -c PROGRAM``)."""


class ShellFields(StepFields, tag="shell"):
    """Shell programs (``cmds``, a template: a list of strings, or one string), each run with ``sh -c`` in
    turn; ``env`` (a template: an object) and ``cwd`` (a template) as for ``command`` steps."""

    cmds: Any
    env: Any = None
    cwd: Any = None


def build_shell(b: Build[ShellFields]) -> CommandPlan:
    """The shell from the operator's allowlist (``outbound.commands.sh``)."""
    argv = b.policy.command.argv(SHELL)
    if not argv or not argv[0]:
        b.problem(
            f"{b.location}.cmds",
            f"shell steps run `{SHELL} -c PROGRAM`, which the operator has not allowed: "
            f"add `{SHELL}: /bin/sh` to outbound.commands",
            ErrorCode.FORBIDDEN,
        )
        b.fail()
    return CommandPlan(argv, b.policy.command)


def _programs(value: object) -> list[str]:
    if isinstance(value, str):
        return [value] if value.strip() else []
    if isinstance(value, Sequence) and all(isinstance(c, (str, int, float)) for c in value):
        return [str(c) for c in value]
    raise StepFailure(f"`cmds` must resolve to a list of strings, got {json_type(value)}", ErrorCode.TOOL_FAILED)


async def run_shell(
    step: Leaf[ShellFields, CommandPlan], inputs: Mapping[str, object], env: Mapping[str, object], ctx: ToolContext
) -> StepOutput:
    """Run the programs in turn; the output is NoETL's shell result."""
    plan = step.built
    programs = _programs(inputs["cmds"])
    if not programs:
        raise StepFailure("`cmds` is empty: a shell step needs at least one program", ErrorCode.TOOL_FAILED)
    proc_env = plan.policy.base_env()
    proc_env.update(env_object(inputs.get("env")))
    cwd = inputs.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise StepFailure(f"`cwd` must be a string, got {json_type(cwd)}", ErrorCode.TOOL_FAILED)
    per: list[dict[str, Any]] = []
    outs: list[str] = []
    errs: list[str] = []
    code = 0
    t0 = time.monotonic()
    for program in programs:
        preview = program.strip().splitlines()[0][:120] if program.strip() else ""
        t = time.monotonic()
        code, out, err = await run_process([*plan.argv, "-c", program], proc_env, cwd, None, plan.policy)
        stdout = out.decode("utf-8", errors="replace")
        stderr = err.decode("utf-8", errors="replace")
        per.append(
            {
                "cmd_preview": preview,
                "returncode": code,
                "stdout": stdout,
                "stderr": stderr,
                "duration_ms": int((time.monotonic() - t) * 1000),
            }
        )
        if stdout:
            outs.append(stdout)
        if stderr:
            errs.append(stderr)
        if code != 0:
            break
    result = {
        "returncode": code,
        "stdout": "\n".join(outs),
        "stderr": "\n".join(errs),
        "commands": per,
        "duration_ms": int((time.monotonic() - t0) * 1000),
    }
    if code != 0:
        tail = per[-1]["stderr"].strip()[-500:]
        reason = f"shell command exited with returncode={code}: {per[-1]['cmd_preview'] or '<empty>'}"
        raise StepFailure(f"{reason}: {tail}" if tail else reason, ErrorCode.TOOL_ERROR, result)
    return StepOutput.of(result)


KIND = Kind(
    "shell",
    ShellFields,
    run_shell,
    templates=("cmds", "env", "cwd"),
    build=build_shell,
    default_timeout=command_timeout,
)
