"""The Rust core does not leak: a million resolves (values, text, copies, wildcards, errors raised and
caught) and many compiles leave memory, allocated blocks and reference counts where they were."""

from __future__ import annotations

import gc
import os
import sys
from typing import Any

import pytest

from mcpipe._core import Template
from mcpipe.errors import InterpolationError, TemplateSyntaxError

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def make_env() -> dict[str, Any]:
    return {
        "vars": {"q": "query ✓", "n": 3, "f": 1.5, "big": 2**80, "obj": {"a": [1, {"b": None}], "t": (1, "x")}},
        "steps": {f"s{i}": {"output": {"items": list(range(5)), "name": f"step {i}"}} for i in range(5)},
        "last": None,
        "args": {},
        "context": {},
    }


def workloads() -> list[tuple[Template, int]]:
    """(template, how many resolves of it per round); the error templates raise every time."""
    return [
        (Template("${vars.n}"), 30),
        (Template({"q": "${vars.q}", "o": {"$ref": "vars.obj"}, "c": {"k": [1, 2, {"x": "y"}]}}), 20),
        (Template("a ${vars.q} b ${vars.obj} c ${vars.big} {{s1.items}} ${vars.f}", step_ids=["s1"]), 20),
        (Template({"$ref": "steps.*.output.items.-1"}), 15),
        (Template({"m": "${vars.obj.missing}"}, location="args"), 5),
        (Template("x ${steps.s0.output.items.9}"), 5),
        (Template("${last.x}"), 5),
    ]


def run_rounds(rounds: int, env: dict[str, Any], templates: list[tuple[Template, int]]) -> int:
    done = 0
    for _ in range(rounds):
        for template, times in templates:
            for _ in range(times):
                try:
                    template.resolve(env)
                except InterpolationError:
                    pass
                done += 1
    return done


def test_a_million_resolves_leave_memory_and_reference_counts_flat():
    env = make_env()
    templates = workloads()
    watched = [env["vars"]["q"], env["vars"]["obj"], env["vars"]["big"], env["steps"]["s1"]["output"]["items"]]
    run_rounds(2000, env, templates)  # warm up caches, interned strings, exception classes
    gc.collect()
    counts = [sys.getrefcount(x) for x in watched]
    blocks, memory = sys.getallocatedblocks(), rss()
    done = run_rounds(10_000, env, templates)
    gc.collect()
    assert done == 1_000_000
    assert [sys.getrefcount(x) for x in watched] == counts
    assert sys.getallocatedblocks() - blocks < 1_000
    assert rss() - memory < 8 * 2**20


def test_compiling_and_failing_to_compile_leave_memory_flat():
    spec = {"a": ["${vars.x}", "t {{step2.y}} u", {"$ref": "steps.a.output['k'].*"}], "b": {"$literal": [1]}}

    def compile_many(n: int) -> None:
        for _ in range(n):
            Template(spec, step_ids=["a", "b"], location="args")
            with pytest.raises(TemplateSyntaxError):
                Template({"x": "${vars.x"})

    compile_many(2_000)
    gc.collect()
    blocks, memory = sys.getallocatedblocks(), rss()
    compile_many(50_000)
    gc.collect()
    assert sys.getallocatedblocks() - blocks < 1_000
    assert rss() - memory < 8 * 2**20


_REFUSED_ALLOCATION = """
import resource
from mcpipe import Template

with open("/proc/self/statm") as f:
    vm = int(f.read().split()[0]) * resource.getpagesize()
# The allocator now refuses anything much past what the process holds: a real refusal, not a simulated one.
resource.setrlimit(resource.RLIMIT_AS, (vm + 256 * 1024 * 1024, resource.RLIM_INFINITY))
template = Template("${vars.a}!", max_text_bytes=2**40)
env = {"vars": {"a": ["x" * 10_000] * 200_000}}  # 2 GB as text; the list holds 1.6 MB of pointers
try:
    template.resolve(env)
except MemoryError as e:
    print(f"MemoryError: {e}")
"""


def test_an_allocation_the_system_refuses_while_interpolating_is_a_memory_error_not_an_abort():
    # The core reserves interpolated text with `try_reserve`: under an address-space limit, the 2 GB the
    # text would take is refused before a byte is written, and Python gets MemoryError (an infallible
    # reserve would abort the process: SIGABRT).
    import subprocess

    done = subprocess.run([sys.executable, "-c", _REFUSED_ALLOCATION], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "MemoryError: cannot allocate 2000600002 bytes of interpolated text"
