"""shell steps: refused unless the operator allows a shell, NoETL's result shape, the first failing
program ends the step, and everything a program started is killed at the deadline."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import trio

from kit.declared import compiled, env
from kit.processes import all_gone, read_pids, watch
from mcpipe.declared import CommandPolicy, StepPolicy, StepScope, compile_step
from mcpipe.tools._base import ToolContext

SH = StepPolicy(command=CommandPolicy(commands={"sh": "/bin/sh"}, kill_grace_ms=100))


async def run(raw: dict[str, Any], args: Any = None) -> Any:
    with trio.fail_after(30):
        return await compiled({"kind": "shell", **raw}, SH).execute(env(args), ToolContext())


def test_a_shell_step_is_refused_unless_the_operator_allows_a_shell():
    step, problems = compile_step({"kind": "shell", "cmds": ["echo hi"]}, "steps[1]", StepScope(policy=StepPolicy()))
    assert step is None
    assert [(p.location, p.code) for p in problems] == [("steps[1].cmds", "FORBIDDEN")]
    assert "add `sh: /bin/sh` to outbound.commands" in problems[0].message


async def test_programs_run_in_turn_and_answer_noetls_result():
    out = await run({"cmds": ["echo one", "echo two >&2; echo three"]})
    assert out.ok, out.error
    r = out.output
    assert (r["returncode"], r["stdout"], r["stderr"]) == (0, "one\n\nthree\n", "two\n")
    assert [(c["cmd_preview"], c["returncode"]) for c in r["commands"]] == [
        ("echo one", 0),
        ("echo two >&2; echo three", 0),
    ]


async def test_the_first_program_that_fails_ends_the_step_with_what_ran():
    out = await run({"cmds": ["echo ok", "echo bad >&2; exit 3", "echo never"]})
    assert not out.ok and out.error_code == "TOOL_ERROR"
    assert out.error == "shell command exited with returncode=3: echo bad >&2; exit 3: bad"
    assert out.output["returncode"] == 3 and len(out.output["commands"]) == 2


async def test_values_passed_in_env_stay_data_for_the_shell(tmp_path: Path):
    marker = tmp_path / "pwned"
    out = await run({"cmds": ['printf "%s" "$NAME"'], "env": {"NAME": "${args.name}"}}, {"name": f"$(touch {marker})"})
    assert out.output["stdout"] == f"$(touch {marker})" and not marker.exists()


async def test_a_program_past_the_deadline_is_killed_with_what_it_started(tmp_path: Path):
    fifo = tmp_path / "pids"
    os.mkfifo(fifo)
    program = f"sleep 600 & echo $(readlink /proc/self/ns/pid) $$ $! > {fifo}; wait"
    box: list[Any] = []

    async def go() -> None:
        box.append(await run({"cmds": [program], "timeout_ms": 1000}))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(go)
        with trio.fail_after(20):
            fds = watch(await read_pids(fifo))
    assert not box[0].ok and box[0].error_code == "TIMEOUT"
    with trio.fail_after(10):
        await all_gone(fds)
