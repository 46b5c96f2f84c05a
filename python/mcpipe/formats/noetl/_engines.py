"""NoETL's engines, by name: each reads the playbooks of one era of NoETL as that engine ran them.

A decoded file goes to the first engine (in :data:`ENGINES` order) that claims it; ``noetl``, today's engine
(``noetl.io/v2`` and the layout before it), claims every file the earlier ones do not, and refuses those of
NoETL's prototypes that ran nothing. An engine claims a file by a look at its keys, here: the engine's module
is imported when a file is compiled for it, so a run of today's playbooks imports none of the others. Adding an
engine is a module and one line here. Seed 004's own ``mcp:`` playbooks are not NoETL's and are told apart
before (``mcpipe.formats.noetl.is_seed``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mcpipe.errors import Problem

__all__ = ["ENGINES", "Engine", "engine_of"]

Compile = Callable[..., tuple[Any, list[Problem]]]
"""``compile(raw, *, models, policy, tools, catalog, file, stack)``: the playbook (a ``NoetlPlaybook``) or
None, and every problem, located."""


@dataclass(frozen=True, slots=True)
class Engine:
    """One of NoETL's engines.

    Attributes:
        claims: whether a decoded file is written for it.
        compile: the file compiled into the plan (:data:`Compile`).
        unnamed: the tool name of a playbook that has none.
    """

    claims: Callable[[Mapping[str, Any]], bool]
    compile: Compile
    unnamed: str = "playbook"


def _workflow2023(raw: Mapping[str, object]) -> bool:
    """A workflow of the April 2023 engine: ``workflow:`` holding ``jobs``, and nothing else."""
    wf = raw.get("workflow")
    return isinstance(wf, Mapping) and isinstance(wf.get("jobs"), list) and set(raw) == {"workflow"}


def _runtime(raw: Mapping[str, object]) -> bool:
    """A playbook of the May 2025 runtime: a top-level ``context`` and steps that ``run:`` tasks."""
    workflow = raw.get("workflow")
    return (
        isinstance(raw.get("context"), Mapping)
        and "workload" not in raw
        and isinstance(workflow, list)
        and any(isinstance(s, Mapping) and "run" in s for s in workflow)
    )


def _draft(raw: Mapping[str, object]) -> bool:
    """A playbook of the 2025 draft engine: a ``call:`` or ``end_loop`` step, or a loop step without a tool of
    its own (its body is its ``next`` steps)."""
    if raw.get("apiVersion") in ("noetl.io/v2", "noetl.io/v10"):
        return False
    workflow = raw.get("workflow")
    if not isinstance(workflow, list):
        return False
    if any(isinstance(s, Mapping) and "run" in s for s in workflow):
        return False  # `run:` steps are the interpreter before it (noetl/runtime/agent.py), not this engine's
    return any(
        isinstance(s, Mapping)
        and ("call" in s or "end_loop" in s or ("loop" in s and not any(k in s for k in ("tool", "type", "task"))))
        for s in workflow
    )


def _lazy(module: str, function: str) -> Compile:
    """The compiler ``function`` of ``module``, imported on its first call (a run of today's playbooks imports
    none of the others)."""

    def compile_(raw: Mapping[str, object], **kw: Any) -> tuple[Any, list[Problem]]:
        compiler: Compile = getattr(importlib.import_module(module), function)
        return compiler(raw, **kw)

    return compile_


ENGINES: dict[str, Engine] = {
    # NoETL's workflow engine of April 2023 (workflow_engine/): jobs of tasks.
    "workflow2023": Engine(
        _workflow2023, _lazy("mcpipe.formats.noetl._workflow2023", "compile_workflow2023"), unnamed="workflow"
    ),
    # NoETL's interpreters of May-July 2025, each read as it ran its playbooks.
    "runtime2025": Engine(_runtime, _lazy("mcpipe.formats.noetl._runtime2025", "compile_runtime")),
    "draft2025": Engine(_draft, _lazy("mcpipe.formats.noetl._draft", "compile_draft")),
    # Today's engine: both layouts (`noetl.io/v2` and the one before), an `mcp:` section's turns on top.
    "noetl": Engine(lambda raw: True, _lazy("mcpipe.formats.noetl", "compile_today")),
}
"""The engines by name, asked in this order."""


def engine_of(raw: Mapping[str, object]) -> Engine:
    """The engine a decoded playbook is written for (the first in :data:`ENGINES` that claims it)."""
    return next(e for e in ENGINES.values() if e.claims(raw))
