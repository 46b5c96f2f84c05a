"""Running pipelines: the Trio scheduler behind ``mcp_pipe`` and declared pipelines.

The scheduler
-------------

A pipeline run is supervised by the task that called `run_pipeline`. Sequential tool steps run inside the
supervisor itself, one after the other, each under its own cancel scope only when it has a deadline: a step
starts when the previous one finished, so a task per sequential step would buy nothing but overhead (about 10 µs
a step). Every parallel child is its own task in the group's nursery, and every nested pipe runs under its own
scope. Nothing outlives the run: all tasks live in nurseries opened by the run, so cancelling the caller's scope
(a client's cancel, the HTTP stream closing, the pipeline deadline) reaches every running step and every tool
call in flight.

Declared pipelines (the config's `pipelines:`) run on the same scheduler: each is compiled once, at load, into a
`CompiledSpec` of the same plan (`mcpipe.declared` is its front-end), and every call goes to `run_compiled`,
which skips `compile_spec` and its cache. The scheduler dispatches on the three node types only: a kind's leaf
runs through its `execute` (its `when`, `input_transform`, templates, kind and deadline); a `skippable`
`parallel` or `pipe` first applies its `when` and `input_transform`, then runs exactly as `mcp_pipe`'s. A step
whose `when` is false is skipped: it counts as skipped in the summary and its result says `skipped: true`. An
`mcp_pipe` step's `when` (compiled by `Checker.condition`: CEL through `Checker.cel`, the one CEL compiler of
both front-ends, or one reference) is applied by the scheduler's `gated`, through the same deadline-aware
`plan.evaluate` as declared steps (a CEL worker when it iterates); such a skipped step has no output and is not
`last`. A `ForEach` runs a pool of at most `max_concurrency` workers that take the elements in order (a task per
element parked on the call's limiter cost a wake-up each); a retried tool call is made again in `_tool` after a
retryable failure (`MCPipeError.retryable`, set by the downstream `TransportError`, or an `OSError`), each
attempt through the registry, so each audited, and each counted towards `max_calls`. The declared tool validates
its arguments (JSON Schema, compiled once, through `mcpipe._jsonschema`) before the run and shapes the answer
after it.

Concurrency is bounded twice: one `trio.CapacityLimiter(max_concurrency)` per call, shared by every parallel
group of that call, beneath a process-wide limiter. The limiters count tool calls (and declared leaf steps under
a group), not groups waiting on their children, so nested groups cannot deadlock on them. A run started inside
such a step (a NoETL sub-playbook, a pipeline served as a tool and called by a step) lends the step's process-
wide slot back while it runs (`runtime/_scheduler.py`'s `_Slot`), so runs nested in runs cannot deadlock on it
either.

"""

from mcpipe.runtime._scheduler import (
    PROCESS_CONCURRENCY,
    EventFn,
    check_pipeline,
    inline_tool_calls,
    process_limiter,
    run_compiled,
    run_pipeline,
)

__all__ = [
    "PROCESS_CONCURRENCY",
    "EventFn",
    "check_pipeline",
    "inline_tool_calls",
    "process_limiter",
    "run_compiled",
    "run_pipeline",
]
