"""The plan every front-end compiles to and the scheduler runs, and the one checker they share.

See :mod:`mcpipe.plan._ir` for the nodes and :mod:`mcpipe.plan._check` for the checks.

One plan
--------

`mcpipe.plan` is the only step representation. A plan is a `Pipeline` (vars, steps, return, failure policy,
deadline) of these node types:

- `Leaf[F, B]`: one unit of work. A bare tool call (`mcp_pipe`'s steps) has `run` None and holds `tool` and
  `args`: the scheduler calls the tool inline (the fast path). Every other leaf belongs to a step kind: its typed
  `fields` (an `F`), compiled `templates`, what the kind `built` at load (a `B`), the kind's `run`.
  `leaf.execute(env, ctx)` runs one alone.
- `Parallel`: children run concurrently; they see the group's list, never each other.
- `Pipe`: a nested `Pipeline`; its `vars` resolve in the enclosing environment.
- `ForEach`: one node (`step`) run once per element of the array `items` resolves to (a template, or an
  expression of a front-end's own language), the element and its position bound as the `item` and `index` roots;
  `max_concurrency` bounds the elements running at once below the call's limit (1: in order).
- `Graph`: nodes joined by conditional `Arc`s, run from its `entry` node (NoETL's `next` arcs). When a node
  finishes its arcs are decided (`inclusive`: every arc whose `when` holds, else the first); a node runs when
  every arc into it is decided and at least one was taken (a join waits for all its branches; arcs from nodes
  never reached count as not taken), with `via` the arcs it was reached by (an arc's `data` is the front-end's).
  An arc marked `back` closes a cycle: taking it runs its node again and starts the part after it anew (its nodes
  wait for their arcs again); the `n`-th run records as `ID#n`, bounded by `limits.max_step_runs` and counted
  towards `max_calls`. Nodes ready together run concurrently under the call's limiters, and record their results
  beside the graph's, so later nodes read earlier ones by id. A failed node fails the graph (its running nodes
  cancelled) unless it goes on (`continue_on_error`): then its arcs route it and the graph fails at its end. The
  graph's output is that of the node that finished last among those that took no arc.

Every node may carry `when` and `input_transform` (compiled expressions; `prelude(node, env)` applies them), and
`skippable`: its result says whether it was skipped (declared steps). `CompiledSpec.of(plan)` reads the tool
sites (for the per-caller checks) and counts off the plan.

Every node also carries `continue_on_error` (None: its list's), and a tool leaf `retry` (a `Retry`).
`CompiledSpec` adds what is checked per call against the caller's tools: `retry_sites` (the tool must be
idempotent) and `typed_sites` (`plan.type_problems`: an argument fed one reference to a tool step's output,
compared through the two tools' schemas) and `argument_sites` (`plan.argument_problems`: each tool step's
argument names and plain values against its tool's `inputSchema`); `dry_run` asks for `plan.explain(plan, env,
limits)` instead of a run.

Front-ends
----------

Front-ends parse their own syntax and check with the shared `Checker`: `compile_spec` (`mcp_pipe`'s
`tool`/`parallel`/`pipe` keys) and `mcpipe.declared` (steps written `kind: ...`, every leaf kind looked up in the
registry). Both report every problem, located, sorted by `problem_order`.  `mcpipe.formats.noetl` is the third
producer of the same plan (docs/formats/noetl.md, "How the front-end is built").

Compile once, run many
----------------------

`compile_spec` turns a spec into an immutable `CompiledSpec` (a plan of `Leaf`, `Parallel`, `Pipe` and `ForEach`
nodes, each a `Step` carrying the fields every node shares, inside `Pipeline`s, each holding compiled
`Template`s). It collects every problem before raising `SpecError`. Before any of that, the shared `Checker`
(`Checker.size`, over `check_spec_size` in `python/mcpipe/plan/_bounds.py`) refuses a spec past `max_spec_bytes`
or `max_steps` by a walk that stops at the limit, so no input makes compiling expensive; compiling itself is
linear in the spec (the checker's list scopes build no set of earlier ids per step, templates get only the step
positions they name, and values nesting past `max_json_depth` are located `LIMIT_EXCEEDED` problems), for
`mcp_pipe` specs and declared pipelines alike (a declared pipeline's steps go through the same walk,
`check_steps`, with the nesting depth checked there too, before it is compiled; docs/reliability.md). Valid plans
are cached by spec text and limits in an LRU bounded by entries (512) and bytes (`pipe.compile_cache_bytes`; each
plan charged what it holds, 64 x its text + 256 per reference, an upper bound measured on every shape; a spec
over 256 KiB compiles in a thread, `compile_spec_async`): an agent that sends the same spec again skips parsing
and compiling. The per-call checks that depend on the caller (does each tool exist, may this principal call it)
run on the cached plan's list of tool sites.

Bounds on hostile input
-----------------------

Every input is bounded before the work it could make expensive (docs/reliability.md): `mcpipe.plan._bounds` holds
the small checks (spec size and step count before compiling, JSON depth, output size), and the Rust core's
`json_measure` measures values without building anything. The core refuses an interpolated text past
`max_output_bytes` before allocating it (and reserves fallibly: `MemoryError`, not an abort); the scheduler
measures each leaf's output as it settles (`OUTPUT_TOO_LARGE`) and charges every result it records to the answer
as it will be sent (`json_measure(wire=True)`: the JSON with escapes, and again as the text block), stopping the
run when the answer is full; `max_calls` bounds a run's leaf executions, nested `for_each` multiplied
(`plan.least_calls` when compiling, each expansion at run time). CEL expressions that iterate run in worker
processes killed at the expression deadline (`mcpipe.expr._celworker`, on the one pool of killable workers,
`mcpipe._workerpool`), since the library holds the GIL. A `python` step's code runs in a sandbox worker of its own
(`mcpipe._sandbox`, forked warm by a fork server that never runs step code, used once; the same pool of killable
workers runs them through the sandbox's spawner, `mcpipe.kinds._pyworker` is the step's side): its input only as
JSON data, its own uid and PID namespace, limits it cannot raise, everything it started killed when the step ends
(see docs/declared-pipelines.md, "What the isolation promises"); `command` and `shell` programs run in the same
sandbox's `exec` role; `duckdb` steps run in bounded worker threads, interrupted at theirs. The HTTP front
reads every POST body itself, within `http.body_timeout_s`, and replays it to the lean path or the SDK; each request
head has its own deadline (`http.head_timeout_s`, `server._listen`), and a connection resting between requests gives its
slot up when every slot is taken. The SDK's stdio reader is fed whole lines (`mcpipe.downstream._lines`), since it is
quadratic in a line's length; a downstream's `tools/list` answer, over stdio or HTTP, is cut to `4 x max_tools` tools as
its bytes come by the Rust core's `ArrayCap` (a tokenizer that builds no value: `rust/src/jsoncap.rs`), before the SDK
parses it.

"""

from typing import TYPE_CHECKING

from mcpipe._lazy import lazy_names
from mcpipe.plan._bounds import check_steps, deepest_location, depth_problem, json_depth, measure_output
from mcpipe.plan._check import (
    STEP_ID,
    WHOLE_REFERENCE,
    Checker,
    Scope,
    assign_step_ids,
    compile_each,
    decode_fields,
    problem_order,
    reference_root,
    referenced_step,
    referenced_var,
    step_reference_problem,
    template_parts,
)
from mcpipe.plan._explain import STATIC_ROOTS, explain
from mcpipe.plan._ir import (
    DEFAULT_LIMITS,
    SKIP,
    Arc,
    CompiledSpec,
    Expression,
    ForEach,
    Graph,
    Leaf,
    Limits,
    Node,
    Parallel,
    Pipe,
    Pipeline,
    Retry,
    RunFn,
    Step,
    evaluate,
    expression_timeout_ms,
    least_calls,
    plan_of,
    prelude,
    set_expression_timeout,
    tool_sites,
    walk,
)
from mcpipe.plan._types import ArgumentSite, TypedSite, argument_problems, literal_type, output_path, type_problems

if TYPE_CHECKING:
    from mcpipe.plan._draw import Drawing, drawing, drawn

__all__ = [
    "DEFAULT_LIMITS",
    "SKIP",
    "STATIC_ROOTS",
    "STEP_ID",
    "WHOLE_REFERENCE",
    "Arc",
    "ArgumentSite",
    "Checker",
    "CompiledSpec",
    "Drawing",
    "Expression",
    "ForEach",
    "Graph",
    "Leaf",
    "Limits",
    "Node",
    "Parallel",
    "Pipe",
    "Pipeline",
    "Retry",
    "RunFn",
    "Scope",
    "Step",
    "TypedSite",
    "argument_problems",
    "assign_step_ids",
    "check_steps",
    "compile_each",
    "decode_fields",
    "deepest_location",
    "depth_problem",
    "drawing",
    "drawn",
    "evaluate",
    "explain",
    "expression_timeout_ms",
    "json_depth",
    "least_calls",
    "literal_type",
    "measure_output",
    "output_path",
    "plan_of",
    "prelude",
    "problem_order",
    "reference_root",
    "referenced_step",
    "referenced_var",
    "set_expression_timeout",
    "step_reference_problem",
    "template_parts",
    "tool_sites",
    "type_problems",
    "walk",
]


# Drawing a plan (``mcpipe draw``, the console) is loaded on first use: a run never draws.
__getattr__ = lazy_names(
    __name__, {"Drawing": "mcpipe.plan._draw", "drawing": "mcpipe.plan._draw", "drawn": "mcpipe.plan._draw"}
)
