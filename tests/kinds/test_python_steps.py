"""python steps: NoETL's semantics (``result``, ``main``, globals from ``input``), the caller's values as data
only, and a step that loops, allocates, exits or crashes failing alone, located, the server unaffected."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client

from kit.declared import compiled, env
from kit.processes import SAY_PIDS, all_gone, open_dir, read_pids, watch
from kit.served import call, served
from mcpipe.declared import StepPolicy, StepScope, compile_step
from mcpipe.kinds import PythonPolicy
from mcpipe.tools._base import ToolContext

CTX = ToolContext()
SMALL = StepPolicy(python=PythonPolicy(memory_mb=256, timeout_ms=20_000))


async def run(raw: dict[str, Any], args: Any = None, policy: StepPolicy = SMALL) -> Any:
    with trio.fail_after(30):
        return await compiled({"kind": "python", **raw}, policy).execute(env(args), CTX)


async def test_the_code_sets_result_from_its_input_globals():
    out = await run(
        {
            "code": "result = {'sum': a + b, 'who': name.upper()}",
            "input": {"a": 2, "b": "${args.b}", "name": "${args.n}"},
        },
        {"b": 3, "n": "ada"},
    )
    assert out.ok, out.error
    assert out.output == {"sum": 5, "who": "ADA"}


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("def main(x, y=10):\n    return x * y", 70),
        ("def main(x, **rest):\n    return sorted(rest)", ["extra", "k"]),  # input, then context["input"]
        ("async def main(x):\n    return x + 1", 8),
        ("def main(context):\n    return context['workload']['k']", "v"),
        ("def main(k):\n    return k", "from-context"),  # not in input: context['input'], data, then context
    ],
)
async def test_main_is_called_with_the_arguments_its_signature_names(code, expected):
    step = {
        "code": code,
        "input": {"x": 7, "extra": 1},
        "context": {"workload": {"k": "v"}, "input": {"k": "from-context"}},
    }
    if "rest" not in code:
        step["input"] = {"x": 7}
    out = await run(step)
    assert out.ok, out.error
    assert out.output == expected


async def test_a_step_without_a_coroutine_runs_in_a_worker_without_asyncio():
    # The fork server imports no asyncio (nor threading, with its after-fork hook): every fork is cheaper.
    out = await run({"code": "import sys\nresult = sorted(m for m in ('asyncio', 'threading') if m in sys.modules)"})
    assert out.ok, out.error
    assert out.output == []


async def test_a_step_with_a_coroutine_finds_asyncio_imported_before_its_code_runs():
    code = "import sys\nloaded = 'asyncio' in sys.modules\nasync def main(x):\n    return [loaded, x]"
    out = await run({"code": code, "input": {"x": 1}})
    assert out.ok, out.error
    assert out.output == [True, 1]


async def test_a_coroutine_the_load_did_not_see_coming_still_runs():
    code = "ns = {}\nexec('async def main(x):\\n    return x * 2', ns)\nmain = ns['main']"
    out = await run({"code": code, "input": {"x": 21}})
    assert out.ok, out.error
    assert out.output == 42


@pytest.mark.parametrize(
    ("code", "needs"),
    [
        ("async def main():\n    return 1", True),
        ("def main():\n    async def inner():\n        return 1\n    return inner", True),
        ("def main():\n    import asyncio\n    return asyncio.sleep", True),
        ("async def gen():\n    yield 1", True),
        ("class C:\n    async def run(self):\n        return 1\nresult = 1", True),
        ("def main(x):\n    return x + 1", False),
        ("import json\nresult = json.dumps({'asyncio': 1})", False),
    ],
)
def test_the_load_tells_a_step_that_may_run_a_coroutine_from_one_that_cannot(code, needs):
    from mcpipe.kinds._pyexec import compile_step, needs_asyncio

    assert needs_asyncio(compile_step(code)) is needs


async def test_main_without_a_value_for_a_required_argument_fails_with_noetls_message():
    out = await run({"code": "def main(missing):\n    return 1"})
    assert not out.ok and out.error_code == "TOOL_ERROR"
    assert "Missing required argument 'missing'" in out.error


async def test_code_that_sets_no_result_answers_noetls_summary_of_its_names():
    out = await run({"code": "import math\nx = math.floor(2.5)\n"})
    assert out.output == {
        "status": "success",
        "message": "Code executed without explicit result variable",
        "locals_count": 2,
        "locals_keys": ["math", "x"],
    }


async def test_data_is_the_contexts_data_and_coerce_decodes_literals_in_strings():
    code = "result = [data, items, type(items).__name__, plain]"
    out = await run(
        {
            "code": code,
            "coerce": True,
            "input": {"items": "[1, 2]", "plain": "{not json"},
            "context": {"data": {"d": 1}},
        }
    )
    assert out.output == [{"d": 1}, [1, 2], "list", "{not json"]


async def test_the_callers_values_reach_the_code_as_data_never_as_code(tmp_path: Path):
    marker = tmp_path / "pwned"
    attack = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    out = await run(
        {"code": "result = [text, '${args.text}', len(text)]", "input": {"text": "${args.text}"}, "coerce": True},
        {"text": attack},
    )
    assert out.ok, out.error
    assert out.output == [attack, "${args.text}", len(attack)]
    assert not marker.exists()


def test_code_that_does_not_compile_is_refused_at_load_located():
    step, problems = compile_step({"kind": "python", "code": "def main(:\n  pass"}, "steps[2]", StepScope(policy=SMALL))
    assert step is None
    assert [(p.location, p.code) for p in problems] == [("steps[2].code", "INVALID_SPEC")]
    assert "does not compile" in problems[0].message and "line 1" in problems[0].message


async def test_an_exception_fails_the_step_with_its_line_traceback_and_what_was_printed():
    out = await run({"code": "print('before')\nx = 1\nraise ValueError('boom')"})
    assert not out.ok and out.error_code == "TOOL_ERROR"
    assert out.error == "the python step failed: ValueError: boom (line 3 of the code)"
    assert out.output["stdout"] == "before\n"
    assert 'File "<python step>", line 3' in out.output["traceback"]


async def test_a_step_that_loops_forever_times_out_and_everything_it_started_is_killed():
    with open_dir() as shared:
        fifo = shared / "pids"
        os.mkfifo(fifo)
        os.chmod(fifo, 0o666)  # the step runs as a uid of its own
        await _loops_forever(fifo)


async def _loops_forever(fifo: Path) -> None:
    code = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(fifo)!r}, 'w').write({SAY_PIDS})\n"
        "while True:\n    pass\n"
    )
    async with trio.open_nursery() as nursery:
        box: list[Any] = []

        async def go() -> None:
            box.append(await run({"code": code, "timeout_ms": 1500}))

        nursery.start_soon(go)
        with trio.fail_after(20):
            pids = await read_pids(fifo)
        fds = watch(pids)
    out = box[0]
    assert not out.ok and out.error_code == "TIMEOUT"
    assert "deadline of 1500 ms" in out.error
    with trio.fail_after(10):
        await all_gone(fds)


async def test_a_step_that_allocates_without_bound_fails_with_limit_exceeded():
    out = await run({"code": "blocks = []\nwhile True:\n    blocks.append(bytearray(32 * 2**20))"})
    assert not out.ok and out.error_code == "LIMIT_EXCEEDED"
    assert out.error == "the python step ran out of memory (limit 256 MiB) (line 3 of the code)"


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (
            "import sys\nsys.exit(3)",
            "the python step failed: the code called sys.exit(3) (line 2 of the code); a step cannot exit",
        ),
        ("import os\nos._exit(4)", "the python step's process exited with status 4 before answering (os._exit?)"),
        ("import ctypes\nctypes.string_at(0)", "the python step's process died of SIGSEGV before answering"),
        (
            # Its own CPU limit lowered to what it has used (soft = hard): the kernel kills it there.
            "import resource\nused = int(resource.getrusage(resource.RUSAGE_SELF).ru_utime) + 1\n"
            "resource.setrlimit(resource.RLIMIT_CPU, (used, used))\nwhile True:\n    pass",
            "the python step's process was killed (SIGKILL; its memory limit is 256 MiB)",
        ),
    ],
    ids=["sys.exit", "os._exit", "segfault", "killed"],
)
async def test_a_step_that_exits_or_crashes_fails_alone_with_a_clear_message(code, message):
    out = await run({"code": code})
    assert not out.ok and out.error_code == "TOOL_ERROR"
    assert out.error == message


async def test_what_the_code_prints_is_kept_bounded():
    policy = StepPolicy(python=PythonPolicy(max_output_bytes=1000))
    out = await run({"code": "print('x' * 5000)\nresult = 1", "capture": "all"}, policy=policy)
    assert out.ok
    assert out.output["result"] == 1 and out.output["stdout"] == "x" * 1000 and out.output["truncated_bytes"] == 4001


async def test_a_result_past_the_limit_fails_with_output_too_large():
    policy = StepPolicy(python=PythonPolicy(max_result_bytes=1000))
    out = await run({"code": "result = 'y' * 5000"}, policy=policy)
    assert not out.ok and out.error_code == "OUTPUT_TOO_LARGE"


async def test_the_code_sees_the_operators_environment_and_its_steps_env_never_the_servers(monkeypatch):
    monkeypatch.setenv("MCPIPE_TEST_SECRET", "s3cret")
    code = "result = [os.environ.get('MCPIPE_TEST_SECRET'), os.environ.get('REGION'), os.getcwd() != start]"
    out = await run({"code": code, "input": {"start": os.getcwd()}, "env": {"REGION": "${args.r}"}}, {"r": "eu"})
    assert out.output == [None, "eu", True]


async def test_each_step_starts_in_a_fresh_process_so_nothing_leaks_between_steps():
    first = await run({"code": "import json\njson.dumps = None\nbuiltins = __builtins__\nresult = os.getpid()"})
    second = await run({"code": "import json\nresult = [json.dumps([1]), os.getpid()]"})
    assert second.output[0] == "[1]" and second.output[1] != first.output


async def test_at_most_workers_steps_run_at_once():
    with open_dir() as shared:
        await _one_at_a_time(shared)


async def _one_at_a_time(tmp_path: Path) -> None:
    # Each step holds an exclusive marker while it runs; with one worker none finds another's.
    code = (
        "import time\n"
        f"fd = os.open({str(tmp_path / 'running')!r}, os.O_CREAT | os.O_EXCL | os.O_WRONLY)\n"
        f"time.sleep(0.05)\nos.close(fd)\nos.unlink({str(tmp_path / 'running')!r})\nresult = 'ok'"
    )
    policy = StepPolicy(python=PythonPolicy(workers=1))
    outs: list[Any] = []

    async def one() -> None:
        outs.append(await run({"code": code}, policy=policy))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(one)
    assert [o.output for o in outs] == ["ok", "ok", "ok"]


def _pipeline(name: str, code: str, timeout_ms: int = 20_000) -> dict[str, Any]:
    return {
        "name": name,
        "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
        "steps": [{"kind": "python", "id": "run", "code": code, "input": {"n": "${args.n}"}, "timeout_ms": timeout_ms}],
    }


async def test_a_runaway_step_leaves_the_server_and_its_other_runs_unaffected():
    doc = {
        "outbound": {"python": {"memory_mb": 256}},
        "pipelines": [
            _pipeline("spin", "while True:\n    pass", timeout_ms=1500),
            _pipeline("hog", "b = []\nwhile True:\n    b.append(bytearray(32 * 2**20))"),
            _pipeline("bye", "import os\nos._exit(1)"),
            _pipeline("square", "def main(n):\n    return {'square': n * n}"),
        ],
    }
    async with served(doc) as app, Client(app.server) as client:
        answers: dict[str, Any] = {}

        async def ask(name: str, n: int) -> None:
            answers[f"{name}{n}"] = await call(client, name, {"n": n})

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask, "spin", 0)
                nursery.start_soon(ask, "hog", 0)
                nursery.start_soon(ask, "bye", 0)
                for n in range(1, 4):
                    nursery.start_soon(ask, "square", n)
            after = await call(client, "square", {"n": 9})
    assert answers["spin0"][0] and "TIMEOUT" in str(answers["spin0"][1])
    assert answers["hog0"][0] and "LIMIT_EXCEEDED" in str(answers["hog0"][1])
    assert answers["bye0"][0] and "exited with status 1" in str(answers["bye0"][1])
    assert [answers[f"square{n}"] for n in range(1, 4)] == [(False, {"square": n * n}) for n in range(1, 4)]
    assert after == (False, {"square": 81})


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("result = os.getpid() != os.getppid()", None),
        ("import ctypes\nctypes.string_at(0)", "the python step's process died of SIGSEGV before answering"),
    ],
)
async def test_without_warm_workers_each_step_waits_for_its_own_fresh_process(code, error):
    policy = StepPolicy(python=PythonPolicy(fork_server=False, memory_mb=256))
    out = await run({"code": code}, policy=policy)
    assert (out.ok, out.error or None) == (error is None, error)


async def test_a_fork_server_that_died_is_started_again():
    from mcpipe._sandbox import SANDBOX

    await run({"code": "result = 1"})
    SANDBOX.stop()
    out = await run({"code": "result = 2"})
    assert out.output == 2


async def test_a_fork_server_killed_from_outside_with_its_warm_spares_is_replaced_and_steps_go_on():
    import signal

    from mcpipe._sandbox import SANDBOX

    assert (await run({"code": "result = 1"})).output == 1  # the fork server runs, its spares forked
    zygote = SANDBOX._zygote
    assert zygote is not None
    os.kill(zygote.proc.pid, signal.SIGKILL)
    await trio.to_thread.run_sync(zygote.proc.wait, 30)  # dead and reaped, not yet replaced
    for n in range(4):
        out = await run({"code": "result = n * n", "input": {"n": n}})
        assert (out.ok, out.output) == (True, n * n), out.error
    assert SANDBOX._zygote is not None and SANDBOX._zygote is not zygote
