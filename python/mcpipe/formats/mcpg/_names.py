"""mcpg's expression variables, read as mcpipe's: CEL and JSONata sources rewritten before they compile.

mcpg evaluates a pipeline's CEL (``transform``, ``cel_gate``, ``input_transform``, ``param_exprs``, an
``await``'s ``until``) over ``ExprContext::to_cel_context`` (its ``mcpg-expr`` crate); its docs also name the
pipeline context ``original_args``, ``completed_steps`` and ``request_context``, which are read the same way:

| mcpg | mcpipe |
|---|---|
| ``arguments``, ``args``, ``original_args`` | ``args`` |
| ``steps``, ``completed_steps`` (``.output``, ``.duration_ms``) | ``steps`` |
| ``steps.X.is_error`` | ``(!steps.X.ok)`` |
| ``context``, ``request_context`` | ``context.identity`` (``principal_id`` is its ``subject_id``) |
| ``principal_id`` | ``context.identity.subject_id`` |
| ``trust_level``, ``auth_provider`` | ``context.identity.<same>`` |
| ``tool_name`` | the binding's name, as a string |

In JSONata (``dev.mcpg.transform.jsonata``) the document's ``arguments`` is ``args``; ``steps`` and
``context`` are the same names.
"""

from __future__ import annotations

import json
import re

from mcpipe.expr import scan_cel, scan_jsonata

__all__ = ["ROOT_ALIASES", "rename_cel", "rename_jsonata"]

ROOT_ALIASES = {
    "arguments": "args",
    "args": "args",
    "original_args": "args",
    "steps": "steps",
    "completed_steps": "steps",
    "context": "context.identity",
    "request_context": "context.identity",
    "principal_id": "context.identity.subject_id",
    "trust_level": "context.identity.trust_level",
    "auth_provider": "context.identity.auth_provider",
}
"""mcpg's variables and what mcpipe reads for each."""

_ROOTS = frozenset({*ROOT_ALIASES, "tool_name"})
_IS_ERROR = re.compile(r"(?:completed_steps|steps)\s*\.\s*([A-Za-z_][A-Za-z0-9_-]*)\s*\.\s*is_error\b")


def rename_cel(source: str, tool_name: str | None = None) -> str:
    """``source`` with mcpg's variables written as mcpipe's (unchanged when it mentions none)."""
    if not isinstance(source, str):
        return source
    mentions, bound = scan_cel(source, _ROOTS)
    out = source
    for m in sorted(mentions, key=lambda m: -m.offset):
        if m.root in bound:
            continue  # a comprehension's own variable
        if m.root == "tool_name":
            out = out[: m.offset] + json.dumps(tool_name or "") + out[m.offset + len(m.root) :]
            continue
        if m.root in ("steps", "completed_steps"):
            hit = _IS_ERROR.match(source, m.offset)
            if hit is not None:
                out = f"{out[: m.offset]}(!steps.{hit.group(1)}.ok){out[hit.end() :]}"
                continue
        new = ROOT_ALIASES[m.root]
        rest = out[m.offset + len(m.root) :]
        if new == "context.identity" and m.segments and m.segments[0] == "principal_id":
            rest = re.sub(r"^(\s*\.\s*)principal_id\b", r"\1subject_id", rest, count=1)
        out = out[: m.offset] + new + rest
    return out


def rename_jsonata(source: str, tool_name: str | None = None) -> str:
    """A JSONata expression of mcpg's transform plugin, read by mcpipe's (``arguments`` is ``args``)."""
    out = source
    for m in sorted(scan_jsonata(source, frozenset({"arguments", "tool_name"})), key=lambda m: -m.offset):
        new = "args" if m.root == "arguments" else json.dumps(tool_name or "")
        out = out[: m.offset] + new + out[m.offset + len(m.root) :]
    return out
