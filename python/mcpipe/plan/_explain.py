"""What a plan will do, without doing it: ``mcp_pipe``'s ``"dry_run": true`` and ``mcpipe explain``.

:func:`explain` walks a checked plan and describes every step in order: its kind, what runs in parallel,
its condition and failure policy, each tool call's arguments resolved as far as they can be before
anything runs (``vars``, ``args`` and ``context`` are known; step outputs, ``last``, ``item`` and
``index`` are not), and the references left to resolve at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcpipe._template import Template
from mcpipe.errors import InterpolationError
from mcpipe.plan._check import ReferenceCondition, reference_root
from mcpipe.plan._ir import ForEach, Graph, Leaf, Limits, Node, Parallel, Pipe, Pipeline

__all__ = ["STATIC_ROOTS", "explain"]

STATIC_ROOTS = frozenset({"vars", "args", "context"})
"""The roots whose values are known before any step runs."""


def explain(plan: Pipeline, env: Mapping[str, object], limits: Limits) -> dict[str, Any]:
    """The plan of a run, step by step.

    Args:
        plan: the checked plan.
        env: the environment before any step runs (``vars`` resolved, ``args``, ``context``).
        limits: the server's limits (the concurrency of parallel groups and ``for_each``).

    Returns:
        ``{"steps": [...], "continue_on_error", "timeout_ms", "max_concurrency"}``; each step has ``id``,
        ``location``, ``kind``, ``order`` (its position in its list: steps of a list run one after the
        other), and by kind: a tool call's ``tool``, ``args`` (resolved when every reference is known
        now, else null), ``known`` (the values of the references known now, by location) and ``pending``
        (the references to resolve at run time); a group's ``parallel`` children (they run at the same
        time); a nested pipe's ``pipe``; a ``for_each``'s ``for_each`` (its reference) and ``step``; a
        graph's ``graph`` (its ``entry``, ``nodes`` and ``arcs``).
    """
    return {
        "continue_on_error": plan.continue_on_error,
        "timeout_ms": plan.timeout_ms,
        "max_concurrency": limits.max_concurrency,
        "steps": [_node(step, i, env, plan.continue_on_error) for i, step in enumerate(plan.steps)],
    }


def _node(step: Node, order: int, env: Mapping[str, object], keep_going: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"id": step.id, "location": step.location, "kind": step.kind, "order": order}
    if step.when is not None:
        when = step.when
        out["when"] = (
            when.template.references[0] if isinstance(when, ReferenceCondition) else getattr(when, "source", None)
        )
    cont = keep_going if step.continue_on_error is None else step.continue_on_error
    out["continue_on_error"] = cont
    if step.timeout_ms is not None:
        out["timeout_ms"] = step.timeout_ms
    if isinstance(step, Leaf):
        if step.tool is not None:
            out["tool"] = step.tool
        if step.retry is not None:
            out["retry"] = {"attempts": step.retry.attempts, "backoff_ms": step.retry.backoff_ms}
        for name, template in (("args", step.args),) if step.args is not None else step.templates:
            out.update(_arguments(name, template, env))
    elif isinstance(step, Parallel):
        out["parallel"] = [_node(child, i, env, cont) for i, child in enumerate(step.children)]
    elif isinstance(step, Pipe):
        inner = step.pipe
        out["pipe"] = {
            "vars": _arguments("vars", inner.vars, env),
            "continue_on_error": inner.continue_on_error,
            "steps": [_node(s, i, {}, inner.continue_on_error) for i, s in enumerate(inner.steps)],
        }
    elif isinstance(step, ForEach):
        items = step.items
        out["for_each"] = items.references[0] if isinstance(items, Template) else getattr(items, "source", None)
        if step.max_concurrency is not None:
            out["max_concurrency"] = step.max_concurrency
        out["step"] = _node(step.step, 0, env, cont)
    elif isinstance(step, Graph):
        out["graph"] = {
            "entry": step.nodes[step.entry].id,
            "nodes": [_node(n, i, env, cont) for i, n in enumerate(step.nodes)],
            "arcs": [
                {
                    "from": step.nodes[i].id,
                    "mode": "inclusive" if step.inclusive[i] else "exclusive",
                    "to": [
                        {"step": step.nodes[a.to].id, "when": getattr(a.when, "source", None)}
                        if a.when is not None
                        else {"step": step.nodes[a.to].id}
                        for a in arcs
                    ],
                }
                for i, arcs in enumerate(step.arcs)
                if arcs
            ],
        }
    return out


def _arguments(name: str, template: Template, env: Mapping[str, object]) -> dict[str, Any]:
    """A template resolved as far as it can be now: its value when every reference is known, the known
    references' values, and the references still to resolve."""
    known: dict[str, Any] = {}
    pending: list[dict[str, str]] = []
    for site, ref in template.reference_sites:
        if reference_root(ref) in STATIC_ROOTS and env:
            try:
                known[site] = Template({"$ref": ref}).resolve(env)
                continue
            except InterpolationError as e:
                pending.append({"location": site, "reference": ref, "problem": str(e)})
                continue
        pending.append({"location": site, "reference": ref})
    value = template.resolve(env) if not pending else None
    out: dict[str, Any] = {name: value}
    if known:
        out["known"] = known
    if pending:
        out["pending"] = pending
    return out
