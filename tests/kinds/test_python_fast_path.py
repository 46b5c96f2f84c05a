"""The python step's fast path (issue 32): what makes a step cheap leaves what it does unchanged.

The code is compiled once, at load, and sent to each worker compiled; ``main``'s parameters are read from its
code object; a worker waits for its request with a short time slice; one epoll set
carries a step's whole wait (the reply, what it prints, its end).
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
from typing import Any

import orjson
import pytest
import trio

from kit.declared import compiled, env
from mcpipe._sandbox import SLICE_US
from mcpipe._sandbox._zygote import short_slice
from mcpipe.declared import StepPolicy
from mcpipe.kinds import PythonPolicy
from mcpipe.kinds._pyexec import _parameters, compile_step, handle, program_text
from mcpipe.tools._base import ToolContext


def _plain(a, b=1, *, c, d=2): ...
def _posonly(a, /, b): ...
def _star(a, *args, k=3, **kw): ...
def _kw(**kw): ...
def _nothing(): ...


def _decorated(f: Any) -> Any:
    @functools.wraps(f)
    def inner(*args: Any, **kwargs: Any) -> Any:
        return f(*args, **kwargs)

    return inner


class _Callable:
    def __call__(self, x, y=2): ...


@pytest.mark.parametrize(
    "fn",
    [
        _plain,
        _posonly,
        _star,
        _kw,
        _nothing,
        lambda x, y=0: None,
        _decorated(_plain),
        _Callable(),
        functools.partial(_plain, 1),
    ],
    ids=["plain", "posonly", "star", "kw", "nothing", "lambda", "decorated", "callable", "partial"],
)
def test_mains_parameters_are_read_as_inspect_signature_reads_them(fn):
    expected = [(p.name, p.kind, p.default is not p.empty) for p in inspect.signature(fn).parameters.values()]
    assert _parameters(fn) == expected


def test_a_worker_runs_the_code_compiled_at_load_not_its_text_again():
    # The header carries the code twice, as text (for errors) and compiled; the worker runs the compiled one.
    header = {"code": "result = 'from the text'", "program": program_text(compile_step("result = 'compiled'"))}
    assert orjson.loads(handle(header, {})) == {"ok": True, "result": "compiled"}
    assert orjson.loads(handle({"code": "result = 'from the text'"}, {})) == {"ok": True, "result": "from the text"}


def test_code_compiled_at_load_keeps_the_annotations_of_a_worker_that_compiled_it():
    code = "def main(x: NotDefinedAnywhere) -> AlsoUndefined:\n    return main.__annotations__\n"
    header = {"code": code, "program": program_text(compile_step(code))}
    reply = orjson.loads(handle(header, {"input": {"x": 1}}))
    assert reply == {"ok": True, "result": {"x": "NotDefinedAnywhere", "return": "AlsoUndefined"}}


PRIORITY = """
import os
sched = open("/proc/self/sched").read()
line = [l for l in sched.splitlines() if l.startswith("se.slice")]
result = {"nice": os.getpriority(os.PRIO_PROCESS, 0), "slice": int(line[0].split(":")[1]) if line else None}
"""


async def test_a_worker_waits_for_its_request_with_a_short_slice():
    step = compiled({"kind": "python", "code": PRIORITY}, StepPolicy(python=PythonPolicy(timeout_ms=20_000)))
    with trio.fail_after(30):
        out = await step.execute(env(), ToolContext())
    assert out.ok, out.error
    assert out.output["nice"] == os.getpriority(os.PRIO_PROCESS, 0)
    if await trio.to_thread.run_sync(_custom_slices):
        assert out.output["slice"] == SLICE_US * 1000


def _custom_slices() -> bool:
    """Whether this kernel gives a thread the slice it asks for (Linux 6.12+; asked in a throwaway thread)."""
    if not short_slice(SLICE_US):
        return False
    with open(f"/proc/self/task/{threading.get_native_id()}/sched") as f:
        return any(line.startswith("se.slice") and int(line.split(":")[1]) == SLICE_US * 1000 for line in f)


PRINTS = """
import os, sys
sys.stdout.write("o" * 300_000)
sys.stderr.write("e" * 200_000)
sys.stdout.flush()
os.write(2, b"!")
result = "done"
"""


async def test_what_a_step_prints_past_the_pipes_buffer_is_read_while_it_runs_and_bounded():
    policy = StepPolicy(python=PythonPolicy(timeout_ms=20_000, max_output_bytes=250_000))
    step = compiled({"kind": "python", "code": PRINTS, "capture": "all"}, policy)
    with trio.fail_after(30):
        out = await step.execute(env(), ToolContext())
    assert out.ok, out.error
    assert out.output["result"] == "done"
    assert out.output["stdout"] == "o" * 250_000
    assert out.output["stderr"] == "e" * 200_000 + "!"
    assert out.output["truncated_bytes"] == 50_000


def test_a_workers_requests_are_read_whole_and_a_repeated_header_is_decoded_once():
    from mcpipe._sandbox import request_frame
    from mcpipe._sandbox._zygote import Requests, write_frame

    header = orjson.dumps({"code": "result = 1", "limits": {"memory_bytes": 1, "cpu_seconds": 2}})
    r, w = os.pipe()
    try:
        first, second = request_frame(header, b'{"input": {"x": 1}}'), request_frame(header, b'{"input": {"x": 2}}')
        os.write(w, first[:3])  # a frame that comes in pieces is read whole
        os.write(w, first[3:] + second)  # and two that come together are read one by one
        requests = Requests(r)
        one, body_one = requests.decode(requests.read())
        two, body_two = requests.decode(requests.read())
        write_frame(w, b"")
        assert requests.read() == b""
        os.close(w)
        w = -1
        with pytest.raises(EOFError):
            requests.read()
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    assert (body_one, body_two) == ({"input": {"x": 1}}, {"input": {"x": 2}})
    assert one is two  # decoded once, looked up by its bytes the second time
    assert one.held == {"memory_bytes": 1} and one.limits["cpu_seconds"] == 2


def test_a_workers_program_is_unmarshalled_once_and_each_step_still_gets_fresh_globals():
    from mcpipe.kinds._pyexec import _program

    code = "n = globals().get('n', 0) + 1\ndef main(acc=[]):\n    acc.append(n)\n    return acc"
    header = {"code": code, "program": program_text(compile_step(code)), "max_result_bytes": 0}
    assert _program(header["program"]) is _program(header["program"])
    replies = [orjson.loads(handle(header, {})) for _ in range(2)]
    assert replies == [{"ok": True, "result": [1]}] * 2
