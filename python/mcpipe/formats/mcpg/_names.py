"""mcpg's expression variables, read as mcpipe's: CEL and JSONata sources rewritten before they compile.

mcpg evaluates a pipeline's CEL (``transform``, ``cel_gate``, ``input_transform``, ``param_exprs``, an
``await``'s ``until``) over ``ExprContext::to_cel_context`` (its ``mcpg-expr`` crate); its docs also name the
pipeline context ``original_args``, ``completed_steps`` and ``request_context``, which are read the same way:

| mcpg | mcpipe |
|---|---|
| ``arguments``, ``args``, ``original_args`` | ``args`` |
| ``steps``, ``completed_steps`` (``.output``, ``.duration_ms``) | ``steps`` |
| ``steps.X.is_error`` | ``(!steps.X.ok)`` |
| ``context`` | :data:`CONTEXT`: mcpg's map, built from mcpipe's ``context`` |
| ``request_context`` | :data:`REQUEST_CONTEXT`: ``request_id``, ``session_id``, ``transport``, ``identity`` |
| ``principal_id``, ``trust_level``, ``auth_provider`` | :data:`PRINCIPAL_ID` and the others of its kind |
| ``tool_name`` | the binding's name, as a string |

mcpipe's ``context.identity`` is there only for a caller the front identified; mcpg's variables are there for
every caller (an anonymous one is ``principal_id: null``, ``trust_level: "unauthenticated"``,
``request_context.identity.kind: "anonymous"``), so each is a CEL expression over mcpipe's ``context`` that
says so. The same expressions give mcpg's templates and JSONata their values (:mod:`._templates`): one
definition of what a caller looks like to mcpg.

In JSONata (``dev.mcpg.transform.jsonata``) the document's ``arguments`` is ``args``; ``steps`` and
``context`` are the same names.
"""

from __future__ import annotations

import json
import re

from mcpipe.expr import scan_cel, scan_jsonata

__all__ = [
    "AUTH_PROVIDER",
    "CONTEXT",
    "PRINCIPAL_ID",
    "REQUEST_CONTEXT",
    "ROOT_ALIASES",
    "TRUST_LEVEL",
    "rename_cel",
    "rename_jsonata",
]

_ID = "context.identity"
_KNOWN = f"has({_ID})"
_VERIFIED = f'{_KNOWN} && {_ID}.trust_level == "verified"'

PRINCIPAL_ID = f"({_KNOWN} ? {_ID}.subject_id : null)"
"""mcpg's ``principal_id``: the caller's subject, null for an anonymous one."""
TRUST_LEVEL = f'({_KNOWN} ? {_ID}.trust_level : "unauthenticated")'
"""mcpg's ``trust_level``: ``verified``, ``header_asserted`` or ``unauthenticated``."""
AUTH_PROVIDER = f"({_VERIFIED} ? {_ID}.auth_provider : null)"
"""mcpg's ``auth_provider``: what verified the caller, null unless one did."""

_CONTEXT_FIELDS = {
    "principal_id": PRINCIPAL_ID,
    "trust_level": TRUST_LEVEL,
    "auth_provider": AUTH_PROVIDER,
    "session_id": "context.session_id",
    "transport": "context.transport",
    "roles": f"({_KNOWN} ? {_ID}.roles : [])",
    "groups": f"({_KNOWN} ? {_ID}.groups : [])",
    "scopes": f"({_KNOWN} ? {_ID}.scopes : [])",
    "attributes": f"({_KNOWN} ? {_ID}.attributes : {{}})",
}
CONTEXT = "({" + ", ".join(f'"{k}": {v}' for k, v in _CONTEXT_FIELDS.items()) + "})"
"""mcpg's ``context`` (``ExprContext``'s request context): who calls, over what."""

_IDENTITY = (
    f'({_KNOWN} ? ({_ID}.trust_level == "verified" ? '
    f'{{"kind": "verified", "subject_id": {_ID}.subject_id, "issuer": {_ID}.issuer, '
    f'"auth_provider": {_ID}.auth_provider, "source": {_ID}.auth_provider, "roles": {_ID}.roles, '
    f'"groups": {_ID}.groups, "scopes": {_ID}.scopes, "attributes": {_ID}.attributes}} : '
    f'{{"kind": "http_header", "subject_id": {_ID}.subject_id, '
    f'"source": ({_ID}.auth_provider == "header" ? "x-mcpg-subject-id" : {_ID}.auth_provider)}}) : '
    '{"kind": "anonymous", "source": (context.transport == "http" ? "no_subject_header" : "stdio")})'
)
_REQUEST_FIELDS = {
    "request_id": "context.request_id",
    "session_id": "context.session_id",
    "transport": "context.transport",
    "identity": _IDENTITY,
}
REQUEST_CONTEXT = "({" + ", ".join(f'"{k}": {v}' for k, v in _REQUEST_FIELDS.items()) + "})"
"""mcpg's ``request_context`` as its pipelines doc gives it (its ``RequestContext``): the request id, the
session, the transport, and the caller's ``RequestIdentity`` (``kind``: ``anonymous``, ``http_header`` or
``verified``, with ``subject_id`` and ``source``)."""

ROOT_ALIASES = {
    "arguments": "args",
    "args": "args",
    "original_args": "args",
    "steps": "steps",
    "completed_steps": "steps",
    "context": CONTEXT,
    "request_context": REQUEST_CONTEXT,
    "principal_id": PRINCIPAL_ID,
    "trust_level": TRUST_LEVEL,
    "auth_provider": AUTH_PROVIDER,
}
"""mcpg's variables and what mcpipe reads for each."""

_FIELDS = {"context": _CONTEXT_FIELDS, "request_context": _REQUEST_FIELDS}
"""A field of these read alone (``context.principal_id``) is that field's expression, not the whole map's."""

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
        rest = out[m.offset + len(m.root) :]
        fields = _FIELDS.get(m.root, {})
        if m.segments and m.segments[0] in fields:
            field = re.match(rf"\s*\.\s*{re.escape(m.segments[0])}\b", rest)
            if field is not None:
                out = out[: m.offset] + fields[m.segments[0]] + rest[field.end() :]
                continue
        out = out[: m.offset] + ROOT_ALIASES[m.root] + rest
    return out


def rename_jsonata(source: str, tool_name: str | None = None) -> str:
    """A JSONata expression of mcpg's transform plugin, read by mcpipe's (``arguments`` is ``args``)."""
    out = source
    for m in sorted(scan_jsonata(source, frozenset({"arguments", "tool_name"})), key=lambda m: -m.offset):
        new = "args" if m.root == "arguments" else json.dumps(tool_name or "")
        out = out[: m.offset] + new + out[m.offset + len(m.root) :]
    return out
