"""Helpers for the declared-step tests: a recording ToolContext, environments, one-step compiles."""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from mcpipe.declared import StepPolicy, StepScope, compile_step
from mcpipe.tools._base import ToolContext


@dataclass
class Sink:
    """A ToolContext whose log and progress notifications are recorded."""

    logs: list[tuple[Any, ...]] = field(default_factory=list)
    progress: list[tuple[float, float | None, str | None]] = field(default_factory=list)

    def context(self, *, progress_token: Any = None) -> ToolContext:
        async def log(level: str, data: Any, /, logger: str | None = None) -> None:
            self.logs.append((level, data) if logger is None else (level, data, logger))

        async def progress(p: float, total: float | None, message: str | None) -> None:
            self.progress.append((p, total, message))

        return ToolContext(request_id="r1", log=log, progress=progress, progress_token=progress_token)


def env(args: Any = None, steps: dict[str, Any] | None = None, vars: Any = None) -> dict[str, Any]:
    """A pipeline environment with the contract's five roots."""
    return {"args": args or {}, "steps": steps or {}, "vars": vars or {}, "context": {}, "last": None}


def compiled(raw: dict[str, Any], policy: StepPolicy | None = None, **scope: Any):
    """Compile one step, failing the test on any problem."""
    step, problems = compile_step(raw, "steps[0]", StepScope(policy=policy or StepPolicy(), **scope))
    assert problems == [], problems
    assert step is not None
    return step


def result_of(output: Any) -> dict[str, Any]:
    """A StepOutput as a step result, the way a later step sees it in ``steps.<id>``."""
    return output.result("s", "value", 0.0)


async def run_result(step: Any, env: Any, ctx: ToolContext, *, tools: Any = None) -> dict[str, Any]:
    """Run one leaf step alone, timed, as a step result object (contract section 3, plus ``skipped``)."""
    t0 = perf_counter()
    out = await step.execute(env, ctx, tools=tools)
    return out.result(step.id, step.kind, round((perf_counter() - t0) * 1000, 3))


async def run_steps(steps: Any, args: Any, ctx: ToolContext | None = None) -> dict[str, Any]:
    """Run compiled leaf steps in order, as the scheduler would (no parallel or pipe); answer the last
    result, or the first failure."""
    e = env(args)
    ctx = ctx or ToolContext()
    last: dict[str, Any] = {}
    for step in steps:
        last = await run_result(step, e, ctx)
        e["steps"][step.id] = last
        e["last"] = last
        if not last["ok"]:
            break
    return last
