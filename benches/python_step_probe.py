"""One side of ``benches/test_python_steps.py``'s A/B: run in the interpreter of the tree to measure (this
one, or a baseline's, e.g. main's ``.venv/bin/python``), it times python steps through the public pipeline
API and prints one JSON line: ``{"per_step_ms": [...], "in_process_us": ...}``.

    python benches/python_step_probe.py ROUNDS PREFORK [REUSE]

Each round is one call of a 10-step declared pipeline (each step ``main(x, label)`` on the previous step's
output), its time divided by 10; with ``PREFORK`` 10 every step finds a warm worker, with 2 (the default)
the spares are forked again as the steps go; ``REUSE`` ``run`` (``outbound.python.reuse``) has the round's
first worker serve all of its steps (``step``, the default: a fresh worker each). ``cpu_ms_per_step`` is
the CPU a step cost over the timed rounds: the server's (this process, ``getrusage``) and the fork
server's with all the workers it forked (``server_load.trees_cpu_seconds``: the live ones' ``utime +
stime``, the reaped ones' in its ``cutime + cstime``), which does not move with the wall time the machine's
other work leaves a step.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from typing import Any, Literal

import trio

from mcpipe._sandbox import SANDBOX
from mcpipe.declared import load_pipelines
from mcpipe.kinds import PythonPolicy, StepPolicy
from mcpipe.tools import ToolContext, ToolRegistry
from server_load import trees_cpu_seconds

STEPS = 10
Reuse = Literal["step", "run"]
CODE = """\
def main(x, label):
    return {"x": x + 1, "label": label, "squares": [i * i for i in range(x, x + 5)]}
"""


def pipeline(prefork: int = 2, fork_server: bool = True, reuse: Reuse = "step") -> Any:
    """The 10-step declared pipeline (``benches/test_python_steps.py`` times it too), its python steps run
    under ``PythonPolicy(fork_server=..., prefork=..., reuse=...)``."""
    steps = [{"kind": "python", "id": "s0", "code": CODE, "input": {"x": "${args.x}", "label": "${args.label}"}}]
    for i in range(1, STEPS):
        inputs = {"x": f"${{steps.s{i - 1}.output.x}}", "label": f"${{steps.s{i - 1}.output.label}}"}
        steps.append({"kind": "python", "id": f"s{i}", "code": CODE, "input": inputs})
    entry = {
        "name": "ten_python_steps",
        "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}, "label": {"type": "string"}}},
        "steps": steps,
    }
    policy = StepPolicy(python=PythonPolicy(fork_server=fork_server, prefork=prefork, reuse=reuse))
    tools, problems = load_pipelines([entry], policy=policy)
    assert problems == [], problems
    return tools[0]


def in_process_us() -> float:
    namespace: dict[str, Any] = {}
    exec(compile(CODE, "<python step>", "exec"), namespace)
    main = namespace["main"]
    best = float("inf")
    for _ in range(200):
        t0 = time.perf_counter()
        out = {"x": 1, "label": "bench"}
        for _ in range(STEPS):
            out = main(out["x"], out["label"])
        best = min(best, time.perf_counter() - t0)
    return best / STEPS * 1e6


def fork_server_cpu_s() -> float:
    """The fork server's CPU with its workers' (alive, or reaped), in seconds."""
    z = SANDBOX._zygote
    return trees_cpu_seconds([z.proc.pid]) if z is not None else 0.0


def server_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


async def measure(rounds: int, prefork: int, reuse: Reuse = "step") -> tuple[list[float], dict[str, float]]:
    """Per step of each timed round, its wall time in ms; and the CPU per step over them all."""
    tool = pipeline(prefork, reuse=reuse)
    ctx = ToolContext(tools=ToolRegistry())
    per_step = []
    cpu0 = (0.0, 0.0)
    for i in range(rounds + 1):
        await trio.sleep(0.05)  # the spares forked again between rounds
        if i == 1:  # the first round starts the fork server
            cpu0 = (server_cpu_s(), fork_server_cpu_s())
        t0 = time.perf_counter()
        result = await tool.call({"x": 1, "label": "bench"}, ctx)
        took = time.perf_counter() - t0
        assert not result.is_error, result.content
        assert result.structured["x"] == 1 + STEPS
        if i:
            per_step.append(took / STEPS * 1e3)
    await trio.sleep(0.2)  # the last round's workers reaped, their CPU counted
    steps = rounds * STEPS
    cpu = {
        "server": (server_cpu_s() - cpu0[0]) * 1e3 / steps,
        "fork_server": (fork_server_cpu_s() - cpu0[1]) * 1e3 / steps,
    }
    return per_step, cpu


def main() -> None:
    rounds, prefork = int(sys.argv[1]), int(sys.argv[2])
    reuse: Reuse = "run" if sys.argv[3:] == ["run"] else "step"
    per_step, cpu = trio.run(measure, rounds, prefork, reuse)
    print(json.dumps({"per_step_ms": per_step, "cpu_ms_per_step": cpu, "in_process_us": in_process_us()}))


if __name__ == "__main__":
    main()
