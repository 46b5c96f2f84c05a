"""python steps with ``outbound.python.reuse: run``: a worker serves the later steps of its own run and
principal (fresh globals each, limits and deadline each), never another run's or principal's, is not kept
after a step that timed out, and is killed when its run ends; the default stays a fresh worker per step."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import trio
from mcp import Client

from kit.declared import compiled, env
from kit.processes import all_gone, in_namespace, open_dir, watch, with_cmdline
from kit.served import call, served
from mcpipe import _runscope
from mcpipe._sandbox import SANDBOX
from mcpipe.config import ConfigError, parse_config
from mcpipe.declared import StepPolicy
from mcpipe.kinds import PythonPolicy
from mcpipe.kinds._pyworker import _pool, python_shape
from mcpipe.tools._base import ToolContext

REUSE = StepPolicy(python=PythonPolicy(memory_mb=256, timeout_ms=20_000, reuse="run"))
FRESH = StepPolicy(python=PythonPolicy(memory_mb=256, timeout_ms=20_000))

# Which worker ran the step: its PID namespace (a worker is process 1 of one of its own here) and its pid.
WHO = "import os\nwho = [os.readlink('/proc/self/ns/pid'), os.getpid()]\n"


def _worker(link: str) -> list[int]:
    """The pids, as seen here, of the worker whose PID namespace is ``link``."""
    return in_namespace(link) if link != os.readlink("/proc/self/ns/pid") else []


async def _step(code: str, policy: StepPolicy = REUSE, ctx: ToolContext | None = None, **raw: Any) -> Any:
    with trio.fail_after(30):
        out = await compiled({"kind": "python", "code": code, **raw}, policy).execute(env(), ctx or ToolContext())
    return out


def _pipeline(name: str, *codes: str) -> dict[str, Any]:
    steps = [{"kind": "python", "id": f"s{i}", "code": code} for i, code in enumerate(codes)]
    return {"name": name, "input_schema": {"type": "object"}, "steps": steps, "output": "${steps}"}


def test_reuse_takes_step_or_run_and_refuses_anything_else_in_one_located_line():
    assert parse_config('{"outbound": {"python": {"reuse": "run"}}}', "json").outbound.python.reuse == "run"
    assert parse_config('{"outbound": {}}', "json").outbound.python.reuse == "step"
    with pytest.raises(ConfigError) as info:
        parse_config('{"outbound": {"python": {"reuse": "always"}}}', "json")
    message = str(info.value)
    assert "outbound.python.reuse" in message and "\n" not in message, message


async def test_the_steps_of_one_run_share_a_worker_but_each_starts_from_fresh_globals():
    codes = [
        WHO + "import json\njson.mark = 'kept'\nmine = 1\nresult = who",
        WHO + "import json\nresult = [who, 'mine' in globals(), getattr(json, 'mark', None)]",
        WHO + "result = [who, 'mine' in globals()]",
    ]
    doc = {"outbound": {"python": {"reuse": "run", "memory_mb": 256}}, "pipelines": [_pipeline("three", *codes)]}
    async with served(doc) as app, Client(app.server) as client:
        with trio.fail_after(60):
            failed, steps = await call(client, "three", {})
    assert not failed, steps
    first = steps["s0"]["output"]
    assert steps["s1"]["output"] == [first, False, "kept"]  # the same worker; the module it imported stays
    assert steps["s2"]["output"] == [first, False]
    with trio.fail_after(20):  # the run is over: its worker was killed
        await all_gone(watch(tuple(_worker(first[0]))))


async def test_without_reuse_each_step_of_a_run_has_a_fresh_worker():
    codes = [
        WHO + "import json\njson.mark = 'kept'\nresult = who",
        WHO + "import json\nresult = [who, hasattr(json, 'mark')]",
    ]
    doc = {"outbound": {"python": {"memory_mb": 256}}, "pipelines": [_pipeline("two", *codes)]}
    async with served(doc) as app, Client(app.server) as client:
        with trio.fail_after(60):
            failed, steps = await call(client, "two", {})
    assert not failed, steps
    first = steps["s0"]["output"]
    second, marked = steps["s1"]["output"]
    assert second != first and marked is False


async def test_two_runs_never_share_a_worker():
    doc = {
        "outbound": {"python": {"reuse": "run", "memory_mb": 256}},
        "pipelines": [_pipeline("two", WHO + "result = who", WHO + "result = who")],
    }
    async with served(doc) as app, Client(app.server) as client:
        with trio.fail_after(60):
            _, one = await call(client, "two", {})
            _, other = await call(client, "two", {})
    assert one["s0"]["output"] == one["s1"]["output"]
    assert other["s0"]["output"] == other["s1"]["output"]
    assert one["s0"]["output"] != other["s0"]["output"]


async def test_a_worker_is_kept_for_its_principal_only():
    token = _runscope.enter()
    try:
        ada = await _step(WHO + "result = who", ctx=ToolContext(principal="ada"))
        bob = await _step(WHO + "result = who", ctx=ToolContext(principal="bob"))
        ada_again = await _step(WHO + "result = who", ctx=ToolContext(principal="ada"))
    finally:
        _runscope.leave(token)
    assert ada.ok and bob.ok and ada_again.ok
    assert ada_again.output == ada.output and bob.output != ada.output


async def test_a_step_that_timed_out_leaves_no_worker_for_the_next():
    with open_dir() as shared:
        said = shared / "who"
        spin = WHO + f"import json\nopen({str(said)!r}, 'w').write(json.dumps(who))\nwhile True:\n    pass"
        token = _runscope.enter()
        try:
            first = await _step(WHO + "result = who")
            stuck = await _step(spin, timeout_ms=1500)
            after = await _step(WHO + "result = who")
        finally:
            _runscope.leave(token)
        spun = json.loads(await trio.Path(said).read_text())
    assert stuck.error_code == "TIMEOUT", stuck.error
    assert spun == first.output  # the timed-out step ran in the run's worker ...
    assert after.ok and after.output != first.output  # ... which was killed, not handed on
    with trio.fail_after(20):
        await all_gone(watch(tuple(_worker(first.output[0]))))


async def test_what_a_step_started_is_killed_before_the_next_step_of_its_run():
    tag = "600.6161"
    code = (
        "import subprocess\n"
        f"subprocess.Popen(['setsid', 'sleep', {tag!r}])\n"
        "import time\n"
        "for _ in range(2000):\n"
        "    if any(open(f'/proc/{p}/cmdline', 'rb').read().startswith(b'sleep')\n"
        "           for p in os.listdir('/proc') if p.isdigit() and p != str(os.getpid())):\n"
        "        break\n"
        "    time.sleep(0.005)\n" + WHO + "result = who"
    )
    token = _runscope.enter()
    try:
        started = await _step(code)
        left = with_cmdline(b"sleep\0" + tag.encode() + b"\0")  # the worker is kept: what it started is not
        again = await _step(WHO + "result = who")
    finally:
        _runscope.leave(token)
    assert started.ok, started.error
    assert again.output == started.output
    assert left == []


async def test_steps_that_run_at_once_take_workers_of_their_own():
    with open_dir() as shared:

        def meet(me: str, other: str) -> str:
            # Each says it is running, then waits until the other does: they hold their workers at once.
            return (
                WHO + f"open({str(shared / me)!r}, 'w').close()\nimport time\n"
                f"while not os.path.exists({str(shared / other)!r}):\n    time.sleep(0.005)\nresult = who"
            )

        outs: dict[str, Any] = {}
        token = _runscope.enter()
        try:

            async def one(me: str, other: str) -> None:
                outs[me] = await _step(meet(me, other))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(one, "a", "b")
                nursery.start_soon(one, "b", "a")
            later = [await _step(WHO + "result = who") for _ in range(2)]
        finally:
            _runscope.leave(token)
    assert outs["a"].ok and outs["b"].ok
    assert outs["a"].output != outs["b"].output
    assert {tuple(o.output) for o in later} <= {tuple(outs["a"].output), tuple(outs["b"].output)}


async def test_outside_a_run_a_reuse_step_still_gets_a_fresh_worker():
    one = await _step(WHO + "result = who")
    two = await _step(WHO + "result = who")
    assert one.ok and two.ok and one.output != two.output


async def test_a_kept_worker_still_holds_each_steps_memory_limit():
    hog = "b = []\nwhile True:\n    b.append(bytearray(32 * 2**20))"
    token = _runscope.enter()
    try:
        first = await _step(WHO + "result = who")
        second = await _step(WHO + hog)
    finally:
        _runscope.leave(token)
    assert first.ok
    assert second.error_code == "LIMIT_EXCEEDED", second.error


async def test_the_default_policy_is_a_fresh_worker_per_step_inside_a_run_too():
    token = _runscope.enter()
    try:
        one = await _step(WHO + "result = who", policy=FRESH)
        two = await _step(WHO + "result = who", policy=FRESH)
    finally:
        _runscope.leave(token)
    assert one.output != two.output


# --- the reused worker's lean path (issue 32, 4 December): what it skips leaves each step as it was ---------


async def test_a_step_whose_compiled_code_a_kept_worker_reuses_still_runs_in_fresh_globals():
    # The same code three times: one header, its program unmarshalled once, each run in globals of its own
    # (a default argument made by the code is made again each time).
    code = (
        WHO
        + "seen = globals().get('seen', 0) + 1\ndef main(acc=[]):\n    acc.append(1)\n    return [who, seen, len(acc)]"
    )
    token = _runscope.enter()
    try:
        outs = [await _step(code) for _ in range(3)]
    finally:
        _runscope.leave(token)
    assert all(o.ok for o in outs), [o.error for o in outs]
    assert [o.output[1:] for o in outs] == [[1, 1]] * 3
    assert len({tuple(o.output[0]) for o in outs}) == 1  # one worker served them


async def test_a_step_that_raised_its_cpu_soft_limit_leaves_the_next_step_its_own_budget():
    cpu = "import resource\nsoft, hard = resource.getrlimit(resource.RLIMIT_CPU)\n"
    raise_it = WHO + cpu + "resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))\nresult = [who, soft, hard]"
    token = _runscope.enter()
    try:
        first = await _step(raise_it)
        second = await _step(WHO + cpu + "result = [who, soft, hard]")
    finally:
        _runscope.leave(token)
    assert first.ok and second.ok, (first.error, second.error)
    assert second.output[0] == first.output[0]
    assert second.output[1] < second.output[2]  # its soft limit set again, below the hard part


async def test_a_child_that_ended_before_its_step_did_is_reaped_before_the_next_step():
    ended = (
        "pid = os.fork()\nif pid == 0:\n    os._exit(0)\n"
        "os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # it has ended, and is not reaped\n" + WHO + "result = who"
    )
    alone = (
        WHO + "try:\n    os.waitpid(-1, os.WNOHANG)\n    kids = 'some'\nexcept ChildProcessError:\n    kids = 'none'\n"
    )
    token = _runscope.enter()
    try:
        first = await _step(ended)
        second = await _step(alone + "result = [who, kids]")
    finally:
        _runscope.leave(token)
    assert first.ok, first.error
    assert second.output == [first.output, "none"]


async def test_what_a_kept_workers_thread_prints_after_its_reply_is_not_the_next_steps_output():
    with open_dir() as shared:
        done = shared / "printed"
        late = (
            "import threading, time, sys\n"
            "def later():\n    time.sleep(0.05)\n    print('late', flush=True)\n"
            f"    open({str(done)!r}, 'w').close()\n"
            "threading.Thread(target=later).start()\n" + WHO + "result = who"
        )
        token = _runscope.enter()
        try:
            first = await _step(late)
            with trio.fail_after(20):
                while not done.exists():  # noqa: ASYNC110 (a file another process writes: no event to wait on)
                    await trio.sleep(0.01)
            second = await _step(WHO + "print('mine')\nresult = who", capture="all")
        finally:
            _runscope.leave(token)
    assert first.ok, first.error
    assert second.output["result"] == first.output
    assert second.output["stdout"] == "mine\n"


async def test_a_kept_worker_that_ended_between_steps_is_followed_by_a_fresh_one():
    code = (
        WHO
        + "import threading, time\n"
        + "threading.Thread(target=lambda: (time.sleep(0.05), os._exit(0))).start()\nresult = who"
    )
    token = _runscope.enter()
    try:
        first = await _step(code)
        with trio.fail_after(20):
            await all_gone(watch(tuple(_worker(first.output[0]))))
        second = await _step(WHO + "result = who")
    finally:
        _runscope.leave(token)
    assert first.ok and second.ok, (first.error, second.error)
    assert second.output != first.output


async def test_a_reusing_runs_spare_is_forked_again_once_the_run_is_over_not_while_its_steps_run():
    policy = REUSE.python
    pool = _pool(policy.workers, policy.spares())
    shape = python_shape(policy.separate_uid, policy.namespaces, reuse=True)
    before = await _step(WHO + "result = who")  # outside a run: the fork server up, the spares topped up
    if not SANDBOX.reuses(shape):
        pytest.skip("workers cannot be reused here (no PID namespace and no uid of their own)")
    assert before.ok and pool.idle(shape) == policy.spares()
    token = _runscope.enter()
    try:
        first = await _step(WHO + "result = who")
        during = pool.idle(shape)
        second = await _step(WHO + "result = who")
    finally:
        _runscope.leave(token)
    assert second.output == first.output
    assert during == policy.spares() - 1  # the spare the run took is not forked again while it runs ...
    with trio.fail_after(20):
        # ... but once it is over, with its worker killed (the pool has no event to wait on)
        while pool.idle(shape) < policy.spares():  # noqa: ASYNC110
            await trio.sleep(0.001)
        await all_gone(watch(tuple(_worker(first.output[0]))))


async def test_a_kept_workers_step_sees_its_own_env_whatever_the_step_before_did_to_os_environ():
    base = FRESH.python.base_env()
    seen = "import os\nseen = dict(os.environ)\n"
    token = _runscope.enter()
    try:
        first = await _step(WHO + seen + "os.environ['LEFT'] = 'x'\ndel os.environ['A']\nresult = [who, seen]",
                            env={"A": "1"})  # fmt: skip
        same = await _step(WHO + seen + "result = [who, seen]", env={"A": "1"})
        again = await _step(WHO + seen + "result = [who, seen]", env={"A": "1"})
        other = await _step(WHO + seen + "result = [who, seen]", env={"C": "3"})
    finally:
        _runscope.leave(token)
    outputs = [first, same, again, other]
    assert all(o.ok for o in outputs), [o.error for o in outputs]
    assert len({json.dumps(o.output[0]) for o in outputs}) == 1  # one worker served them all
    assert [o.output[1] for o in outputs] == [{**base, "A": "1"}] * 3 + [{**base, "C": "3"}]


async def test_a_kept_worker_that_wrote_past_its_reply_is_not_kept_and_the_next_step_is_right():
    with open_dir() as shared:
        done = shared / "wrote"
        stray = (
            "import threading, time\n"
            "def later():\n    time.sleep(0.05)\n    os.write(3, b'\\0\\0\\0\\x02{}')\n"
            f"    open({str(done)!r}, 'w').close()\n"
            "threading.Thread(target=later).start()\n"
        )
        glued = (  # its reply and a frame more in one write
            "import os as o\nreal = o.write\n"
            "def glue(fd, data):\n    o.write = real\n    return real(fd, bytes(data) + b'\\0\\0\\0\\x02{}') - 6\n"
            "o.write = glue\n"
        )
        token = _runscope.enter()
        try:
            first = await _step(WHO + stray + "result = who")
            with trio.fail_after(20):
                while not done.exists():  # noqa: ASYNC110 (a file another process writes: no event to wait on)
                    await trio.sleep(0.01)
            second = await _step(WHO + glued + "result = who")
            third = await _step(WHO + "result = [who, 6 * 7]")
        finally:
            _runscope.leave(token)
    assert first.ok and second.ok and third.ok, (first.error, second.error, third.error)
    assert second.output != first.output  # the stray frame was not taken for the second step's reply
    assert third.output[0] != second.output and third.output[1] == 42


async def test_a_kept_workers_reply_of_megabytes_is_read_whole_and_the_worker_kept():
    token = _runscope.enter()
    try:
        big = await _step(WHO + "result = [who, 'x' * (3 << 20)]")
        after = await _step(WHO + "result = who")
    finally:
        _runscope.leave(token)
    assert big.ok and after.ok, (big.error, after.error)
    assert big.output[1] == "x" * (3 << 20)
    assert after.output == big.output[0]
