"""mcpg's names, read as mcpipe's: a normalization pass over a ``pipelines:`` entry before it is decoded.

mcpg (seed 003) writes the same pipelines with other names. Where the meaning is the same, its config
loads unchanged; this module rewrites the raw entry into mcpipe's form and reports, located, what mcpg
has that mcpipe does not:

| mcpg | mcpipe |
|---|---|
| ``backend: {kind: pipeline, steps, pipeline_timeout_ms}`` | the entry's ``steps`` and ``timeout_ms`` |
| ``backend: {kind: http, ...}`` (a standalone binding of a step kind) | a one-step pipeline |
| ``pipeline_timeout_ms`` | ``timeout_ms`` |
| in a ``backend:`` pipeline, an ``http`` POST/PUT/PATCH or ``command`` step | its input sent as ``body`` / ``stdin`` |
| ``completed_steps``, ``original_args``, ``request_context`` | ``steps``, ``args``, ``context`` |
| ``completed_steps.X.is_error`` (CEL) | ``(!steps.X.ok)`` |
| ``request_context.identity`` | ``context.principal`` |
| plugin ``dev.mcpg.transform.jsonata`` (JSONata sees ``arguments``) | ``dev.mcpipe.transform.jsonata`` (``args``) |

The rest of mcpg's step fields (mock ``passthrough``, ``progress`` and ``message``; ``sql_tx``'s list of
``params`` names; a backend-level ``await`` block) are mcpipe fields of the same meaning.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mcpipe.declared._scan import scan_cel, scan_jsonata
from mcpipe.errors import Problem

__all__ = ["MCPG_JSONATA_PLUGIN", "ROOT_ALIASES", "normalize_entry", "plugin_problems", "relocate"]

MCPG_JSONATA_PLUGIN = "dev.mcpg.transform.jsonata"

ROOT_ALIASES = {"completed_steps": "steps", "original_args": "args", "request_context": "context"}
"""mcpg's context variables and mcpipe's roots of the same meaning."""

_MCPG_ROOTS = frozenset(ROOT_ALIASES)
_CONTEXT_FIELDS = {"request_id": "request_id", "identity": "principal"}
"""mcpg's ``request_context`` fields that mcpipe's ``context`` has (under these names)."""

_CEL_FIELDS = ("when", "input_transform", "expression", "until")
_NOT_TEMPLATES = frozenset({"kind", "id", "sql", "response", "operation", *_CEL_FIELDS})
_CONTAINERS = ("parallel", "pipe")
_PLACEHOLDER = re.compile(r"\$\{(\s*)([^}]*)\}")
_IS_ERROR = re.compile(r"completed_steps\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)\s*\.\s*is_error\b")
_CONTEXT_FIELD = re.compile(r"request_context\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)")


def normalize_entry(raw: Any, loc: str, step_kinds: frozenset[str]) -> tuple[Any, list[Problem], dict[str, str]]:
    """Rewrite one ``pipelines:`` entry from mcpg's names to mcpipe's.

    Args:
        raw: the entry as decoded from the file.
        loc: its location (``pipelines.charge``).
        step_kinds: the step kinds mcpipe has (a standalone mcpg binding of one becomes a one-step pipeline).

    Returns:
        The entry in mcpipe's form (None when its ``backend`` cannot be read as a pipeline), the problems found (what
        mcpg has that mcpipe does not), and how to relocate problems found later in the rewritten entry to
        where they are in the file (``pipelines.charge.steps`` -> ``pipelines.charge.backend.steps``).
    """
    if not isinstance(raw, Mapping):
        return raw, [], {}
    problems: list[Problem] = []
    moved: dict[str, str] = {}
    entry = dict(raw)
    if "pipeline_timeout_ms" in entry:
        _move(entry, "pipeline_timeout_ms", "timeout_ms", loc, problems)
        moved[f"{loc}.timeout_ms"] = f"{loc}.pipeline_timeout_ms"
    backend = entry.get("backend")
    if "backend" in entry:
        del entry["backend"]
        where = f"{loc}.backend"
        if "steps" in entry:
            problems.append(Problem(where, "INVALID_SPEC", "an entry has `steps` or mcpg's `backend`, not both"))
            return None, problems, moved
        if not isinstance(backend, Mapping):
            problems.append(Problem(where, "INVALID_SPEC", "mcpg's `backend` must be an object with a `kind`"))
            return None, problems, moved
        if backend.get("kind") == "pipeline":
            for key, value in backend.items():
                if key == "steps":
                    entry["steps"] = value
                    moved[f"{loc}.steps"] = f"{where}.steps"
                elif key == "pipeline_timeout_ms":
                    entry["timeout_ms"] = value
                    moved[f"{loc}.timeout_ms"] = f"{where}.pipeline_timeout_ms"
                elif key != "kind":
                    problems.append(
                        Problem(
                            f"{where}.{key}", "INVALID_SPEC", f"mcpg's pipeline field `{key}` has no mcpipe equivalent"
                        )
                    )
        elif backend.get("kind") == "sql" and "sql" not in backend:
            # mcpg defines a SQL database as a binding of its own; mcpipe names databases under `sql:`.
            problems.append(
                Problem(
                    f"{where}.kind",
                    "INVALID_SPEC",
                    f"mcpg's SQL backend binding: in mcpipe a database is a `[sql.{raw.get('name', 'NAME')}]` entry "
                    "(url, pool_size, statement_timeout_ms, await) that sql, sql_tx and sql_await steps name",
                )
            )
            return None, problems, moved
        elif isinstance(backend.get("kind"), str) and backend["kind"] in step_kinds:
            # A standalone binding of a backend mcpipe has as a step kind: a pipeline of that one step.
            entry["steps"] = [{"id": "call", **backend}]
            moved[f"{loc}.steps[0]"] = where
        else:
            kinds = ", ".join(sorted(step_kinds))
            message = f"mcpg's {backend.get('kind')!r} backend has no mcpipe step kind (kinds: {kinds})"
            problems.append(Problem(f"{where}.kind", "INVALID_SPEC", message))
            return None, problems, moved
    steps = entry.get("steps")
    if isinstance(steps, list):
        base = moved.get(f"{loc}.steps", f"{loc}.steps")
        mcpg = "backend" in raw
        entry["steps"] = [_step(s, f"{base}[{i}]", problems, mcpg) for i, s in enumerate(steps)]
    for key in ("output", "content"):
        if key in entry:
            entry[key] = _templates(entry[key], f"{loc}.{key}", problems)
    return entry, problems, moved


def relocate(location: str, moved: Mapping[str, str]) -> str:
    """Where a problem of the rewritten entry is in the file."""
    for new, old in sorted(moved.items(), key=lambda item: -len(item[0])):
        if location == new or location.startswith((f"{new}.", f"{new}[")):
            return old + location[len(new) :]
    return location


def _move(entry: dict[str, Any], old: str, new: str, loc: str, problems: list[Problem]) -> None:
    value = entry.pop(old)
    if new in entry:
        problems.append(Problem(f"{loc}.{old}", "INVALID_SPEC", f"`{old}` is mcpg's `{new}`: give one of them"))
    else:
        entry[new] = value


_SENDS_BODY = ("POST", "PUT", "PATCH")


def _step(raw: Any, loc: str, problems: list[Problem], mcpg: bool = False) -> Any:
    if not isinstance(raw, Mapping):
        return raw
    step = dict(raw)
    kind = step.get("kind")
    if mcpg:
        # An mcpg backend step sends its input (the arguments, or its input_transform's value): an HTTP
        # request as its JSON body, a command on its stdin. mcpipe's steps send only what they are given.
        method = step.get("method")
        if kind == "http" and "body" not in step and isinstance(method, str) and method.upper() in _SENDS_BODY:
            step["body"] = {"$ref": "args"}
        elif kind == "command" and "stdin" not in step:
            step["stdin"] = {"$ref": "args"}
    for name in _CEL_FIELDS:
        if isinstance(step.get(name), str):
            step[name] = _cel(step[name], f"{loc}.{name}", problems)
    if kind == "plugin_transform":
        plugin = step.get("plugin")
        config = step.get("config")
        if plugin == MCPG_JSONATA_PLUGIN and isinstance(config, Mapping) and isinstance(config.get("expression"), str):
            step["config"] = {
                **config,
                "expression": _jsonata(config["expression"], f"{loc}.config.expression", problems),
            }
    if kind in _CONTAINERS and isinstance(step.get("steps"), list):
        step["steps"] = [_step(s, f"{loc}.steps[{i}]", problems, mcpg) for i, s in enumerate(step["steps"])]
    if kind == "sql_tx" and isinstance(step.get("steps"), list):
        step["steps"] = [
            {k: (_templates(v, f"{loc}.steps[{i}].{k}", problems) if k == "params" else v) for k, v in s.items()}
            if isinstance(s, Mapping)
            else s
            for i, s in enumerate(step["steps"])
        ]
    # Nested steps and a plugin's config were handled above; the remaining fields may hold templates.
    for name, value in list(step.items()):
        if name not in _NOT_TEMPLATES and name not in ("config", "steps"):
            step[name] = _templates(value, f"{loc}.{name}", problems)
    return step


def _cel(source: str, loc: str, problems: list[Problem]) -> str:
    mentions, _ = scan_cel(source, _MCPG_ROOTS)
    if not mentions:
        return source
    out = source
    for m in sorted(mentions, key=lambda m: -m.offset):
        _check_context(m.root, m.segments, loc, problems)
        is_error = _IS_ERROR.match(source, m.offset) if m.root == "completed_steps" else None
        if is_error is not None:
            out = f"{out[: m.offset]}(!steps.{is_error.group(1)}.ok){out[is_error.end() :]}"
            continue
        out = _rename_at(out, m.offset, m.root, m.segments)
    return out


def _jsonata(source: str, loc: str, problems: list[Problem]) -> str:
    # mcpg's JSONata document has `arguments` and `tool_name` besides the step outputs and `context`.
    aliases = {"arguments": "args", **ROOT_ALIASES}
    out = source
    for m in sorted(scan_jsonata(source, frozenset({*aliases, "tool_name"})), key=lambda m: -m.offset):
        if m.root == "tool_name":
            problems.append(
                Problem(
                    loc,
                    "INVALID_SPEC",
                    "mcpg's `tool_name` is not in mcpipe's JSONata document (args, steps, vars, context, last)",
                )
            )
            continue
        _check_context(m.root, m.segments, loc, problems)
        new = aliases[m.root]
        out = f"{out[: m.offset]}{new}{out[m.offset + len(m.root) :]}"
    return out


def _rename_at(text: str, offset: int, root: str, segments: tuple[str, ...]) -> str:
    new = ROOT_ALIASES[root]
    rest = text[offset + len(root) :]
    if root == "request_context" and segments and segments[0] in _CONTEXT_FIELDS:
        field = segments[0]
        m = re.match(rf"(\s*\.\s*){field}\b", rest)
        if m is not None:
            rest = m.group(1) + _CONTEXT_FIELDS[field] + rest[m.end() :]
    return text[:offset] + new + rest


def _check_context(root: str, segments: tuple[str, ...], loc: str, problems: list[Problem]) -> None:
    if root == "request_context" and segments and segments[0] not in _CONTEXT_FIELDS:
        problems.append(
            Problem(
                loc,
                "INVALID_SPEC",
                f"mcpg's request_context.{segments[0]} has no mcpipe equivalent "
                "(context has request_id, client and principal; mcpg's identity is principal)",
            )
        )


def _templates(value: Any, loc: str, problems: list[Problem]) -> Any:
    """mcpg's roots in the placeholders and ``$ref``s of a template value."""
    if isinstance(value, str):
        if "${" not in value:
            return value
        return _PLACEHOLDER.sub(lambda m: "${" + m.group(1) + _template_path(m.group(2), loc, problems) + "}", value)
    if isinstance(value, Mapping):
        if set(value) == {"$literal"}:
            return value
        ref = value.get("$ref")
        if len(value) == 1 and isinstance(ref, str):
            return {"$ref": _template_path(ref, loc, problems)}
        return {k: _templates(v, f"{loc}.{k}", problems) for k, v in value.items()}
    if isinstance(value, list):
        return [_templates(v, f"{loc}[{i}]", problems) for i, v in enumerate(value)]
    return value


def _template_path(path: str, loc: str, problems: list[Problem]) -> str:
    for old, new in ROOT_ALIASES.items():
        if path == old or path.startswith((f"{old}.", f"{old}[")):
            rest = path[len(old) :]
            if old == "request_context":
                field = _CONTEXT_FIELD.match(path)
                name = field.group(1) if field is not None else None
                if name is not None and name not in _CONTEXT_FIELDS:
                    _check_context(old, (name,), loc, problems)
                elif name is not None:
                    rest = "." + _CONTEXT_FIELDS[name] + path[field.end() :]  # type: ignore[union-attr]
            elif old == "completed_steps" and re.match(r"\.[A-Za-z_][\w-]*\.is_error\b", rest):
                problems.append(
                    Problem(loc, "INVALID_SPEC", "mcpg's `is_error` is `ok` (negated) in mcpipe: read steps.<id>.ok")
                )
            return new + rest
    return path


_BUILT_IN_PLUGINS = frozenset({MCPG_JSONATA_PLUGIN, "dev.mcpipe.transform.jsonata", "jsonata"})


def plugin_problems(entries: Any, loc: str) -> list[Problem]:
    """mcpg's top-level ``plugins:`` (the plugins to load): mcpipe has the JSONata plugin built in, so an
    entry naming it (a string, or an object with a ``name`` or ``id``) is accepted; any other is a problem."""
    if not isinstance(entries, list):
        return [Problem(loc, "INVALID_SPEC", "mcpg's `plugins` is a list of plugin names")]
    problems = []
    for i, entry in enumerate(entries):
        name = (
            entry
            if isinstance(entry, str)
            else entry.get("name", entry.get("id"))
            if isinstance(entry, Mapping)
            else None
        )
        if name not in _BUILT_IN_PLUGINS:
            problems.append(
                Problem(
                    f"{loc}[{i}]",
                    "INVALID_SPEC",
                    f"mcpg's plugin {name!r} is not in mcpipe (its only transform plugin is JSONata, "
                    "built in: dev.mcpg.transform.jsonata)",
                )
            )
    return problems
