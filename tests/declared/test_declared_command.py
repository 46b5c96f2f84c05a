"""command steps: allowed commands only, no shell, output capture, and the process group killed on timeout
or cancellation."""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from kit.declared import compiled, env
from kit.processes import SLEEPER, all_gone, read_pids, watch
from mcpipe.declared import CommandPolicy, StepPolicy, StepScope, compile_step
from mcpipe.tools._base import ToolContext

CTX = ToolContext()
PY = StepPolicy(command=CommandPolicy(commands={"py": [sys.executable, "-c"], "true": "/bin/true"}, kill_grace_ms=200))


# Starts a grandchild, reports both pids through the FIFO named by argv[1], then waits forever.
async def run(raw, args=None):
    with trio.fail_after(20):
        return await compiled(raw, PY).execute(env(args), CTX)


async def test_command_runs_with_args_and_answers_exit_code_stdout_stderr():
    script = "import sys; print('out', sys.argv[1:]); print('err', file=sys.stderr)"
    out = await run({"kind": "command", "command": "py", "args": [script, "${args.x}", 3]}, {"x": "a b"})
    assert out.ok, out.error
    assert out.output == {"exit_code": 0, "stdout": "out ['a b', '3']\n", "stderr": "err\n"}


async def test_arguments_are_never_interpreted_by_a_shell(tmp_path: Path):
    marker = tmp_path / "pwned"
    script = "import sys; print(sys.argv[1])"
    out = await run({"kind": "command", "command": "py", "args": [script, "${args.x}"]}, {"x": f"; touch {marker}"})
    assert out.output["stdout"] == f"; touch {marker}\n" and not marker.exists()


async def test_json_stdout_is_parsed_and_required_when_asked():
    out = await run(
        {"kind": "command", "command": "py", "args": ["print('{\"a\": [1, 2]}')"], "require_json_stdout": True}
    )
    assert out.ok and out.output["json"] == {"a": [1, 2]}
    out = await run({"kind": "command", "command": "py", "args": ["print('hello')"], "require_json_stdout": True})
    assert out.error_code == "TOOL_ERROR" and "did not print JSON" in out.error


async def test_stdin_env_and_cwd_reach_the_process(tmp_path: Path):
    script = "import os, sys, json; print(json.dumps([sys.stdin.read(), os.environ['GREETING'], os.getcwd()]))"
    raw = {
        "kind": "command",
        "command": "py",
        "args": [script],
        "stdin": {"order": "${args.id}"},
        "env": {"GREETING": "hi ${args.id}"},
        "cwd": str(tmp_path),
    }
    out = await run(raw, {"id": 5})
    assert out.output["json"] == ['{"order":5}', "hi 5", str(tmp_path)]


async def test_the_server_environment_does_not_leak_into_commands(monkeypatch):
    monkeypatch.setenv("MCPIPE_TEST_SECRET", "s3cret")
    out = await run(
        {"kind": "command", "command": "py", "args": ["import os; print(os.environ.get('MCPIPE_TEST_SECRET'))"]}
    )
    assert out.output["stdout"] == "None\n"


async def test_a_nonzero_exit_fails_with_stderr_unless_expected():
    script = "import sys; print('bad input', file=sys.stderr); sys.exit(3)"
    out = await run({"kind": "command", "command": "py", "args": [script]})
    assert out.error_code == "TOOL_ERROR" and "exited with code 3: bad input" in out.error
    assert out.output["exit_code"] == 3
    out = await run({"kind": "command", "command": "py", "args": [script], "expected_exit_codes": [0, 3]})
    assert out.ok


async def test_a_command_that_cannot_start_fails_cleanly():
    policy = StepPolicy(command=CommandPolicy(commands={"ghost": "/nonexistent/ghost"}))
    out = await compiled({"kind": "command", "command": "ghost"}, policy).execute(env(), CTX)
    assert out.error_code == "TOOL_FAILED" and "cannot start" in out.error


async def test_output_past_the_limit_fails_and_stops_the_process():
    policy = StepPolicy(command=CommandPolicy(commands={"py": [sys.executable, "-c"]}, max_output_bytes=10_000))
    script = "import sys\nwhile True: sys.stdout.write('x' * 4096)"
    with trio.fail_after(20):
        out = await compiled({"kind": "command", "command": "py", "args": [script]}, policy).execute(env(), CTX)
    assert out.error_code == "TOOL_FAILED" and "more than 10000 bytes" in out.error


def test_only_commands_named_in_the_policy_may_run():
    _, problems = compile_step(
        {"kind": "command", "command": "rm", "args": ["-rf", "/"]}, "pipelines.p.steps[0]", StepScope(policy=PY)
    )
    assert [(p.location, p.code) for p in problems] == [("pipelines.p.steps[0].command", "FORBIDDEN")]
    assert "py" in problems[0].message and "true" in problems[0].message


def test_a_command_may_be_named_by_the_path_the_policy_allows_as_mcpg_names_it():
    from mcpipe.declared import CommandPolicy, StepPolicy

    policy = StepPolicy(command=CommandPolicy(commands={"true": "/bin/true", "jq": ["/usr/bin/jq", "-c"]}))
    step, problems = compile_step({"kind": "command", "command": "/bin/true"}, "steps[0]", StepScope(policy=policy))
    assert problems == [] and step is not None and step.built.argv == ("/bin/true",)
    # A path allowed only with fixed arguments is not the bare executable: refused.
    _, refused = compile_step({"kind": "command", "command": "/usr/bin/jq"}, "steps[0]", StepScope(policy=policy))
    assert [(p.location, p.code) for p in refused] == [("steps[0].command", "FORBIDDEN")]


# --- timeouts and cancellation ------------------------------------------------------------------------


async def test_a_command_past_its_timeout_is_killed_with_its_children(fifo: Path):
    step = compiled({"kind": "command", "command": "py", "args": [SLEEPER, str(fifo)], "timeout_ms": 1500}, PY)
    outs = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:

            async def go() -> None:
                outs.append(await step.execute(env(), CTX))

            nursery.start_soon(go)
            fds = watch(await read_pids(fifo))
        await all_gone(fds)
    assert outs[0].error_code == "TIMEOUT" and outs[0].error == "timed out after 1500 ms"


async def test_cancelling_a_running_command_kills_its_process_group(fifo: Path):
    step = compiled({"kind": "command", "command": "py", "args": [SLEEPER, str(fifo)]}, PY)
    outs = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:

            async def go() -> None:
                outs.append(await step.execute(env(), CTX))

            nursery.start_soon(go)
            fds = watch(await read_pids(fifo))
            nursery.cancel_scope.cancel()
        await all_gone(fds)
    assert outs == []


async def test_a_finished_command_leaves_no_background_children_holding_the_step(tmp_path: Path):
    script = (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print('parent done')\n"
    )
    with trio.fail_after(20):
        out = await run({"kind": "command", "command": "py", "args": [script]})
    assert out.ok and out.output["stdout"] == "parent done\n"


# --- run_captured: what a format that reports a program's run (mcpg's command binding) builds on --------


async def test_run_captured_cuts_each_stream_at_its_cap_and_says_which_was_cut():
    from mcpipe.kinds.command import run_captured

    script = "import sys; sys.stdout.write('o' * 5000); sys.stderr.write('e' * 10)"
    with trio.fail_after(20):
        run = await run_captured(
            [sys.executable, "-c", script], {}, None, None, PY.command, max_bytes=100, timeout_s=10
        )
    assert (run.code, run.stdout, run.stderr) == (0, b"o" * 100, b"e" * 10)
    assert (run.stdout_truncated, run.stderr_truncated, run.timed_out) == (True, False, False)


async def test_run_captured_stops_a_program_at_its_deadline_and_keeps_what_it_printed(fifo: Path):
    from mcpipe.kinds.command import run_captured

    script = SLEEPER.rstrip().removesuffix("time.sleep(600)") + "print('so far', flush=True)\ntime.sleep(600)\n"
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            pids: list[int] = []

            async def watch_pids() -> None:
                pids.extend(watch(await read_pids(fifo)))

            nursery.start_soon(watch_pids)
            run = await run_captured(
                [sys.executable, "-c", script, str(fifo)], {}, None, None, PY.command, max_bytes=100, timeout_s=1
            )
        assert run.timed_out and run.code < 0 and b"so far" in run.stdout
        await all_gone(pids)
