"""mcpg's own JSON Schema of its config (``examples/deployments/config.schema.json`` at v0.1.0-beta.16,
Apache-2.0, vendored beside this module), and the ``MCPG_*`` environment overlay its loader applies.

mcpg decodes its config with serde (``deny_unknown_fields`` throughout) after a figment merge of the file and
the ``MCPG_`` variables; the schema is generated from the same structs (schemars), so a file it refuses is
one mcpg's decoder refuses, for the same reason: an unknown key, a wrong type, a value outside an enum.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jsonschema import Draft7Validator
    from jsonschema.exceptions import ValidationError

from mcpipe.errors import Problem

__all__ = ["env_overlay", "schema_problems"]

_SCHEMA = Path(__file__).with_name("config.schema.json")
CODE = "INVALID_CONFIG"


@cache
def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(_SCHEMA.read_text())
    return schema


@cache
def _validator() -> Draft7Validator:
    """The core's validator of the schema (its patterns matched safely, :mod:`mcpipe._jsonschema`)."""
    from mcpipe._jsonschema import validator

    checker: Draft7Validator = validator(_schema())
    return checker


def location(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def schema_problems(doc: Mapping[str, object]) -> list[Problem]:
    """Every place ``doc`` breaks mcpg's schema, located (``gateway.server.bogus``), one line each."""
    problems: list[Problem] = []
    for error in sorted(_validator().iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path]):
        for where, message in _explain(error):
            problems.append(Problem(where, CODE, message))
    return problems


def _explain(error: ValidationError) -> Iterator[tuple[str, str]]:
    where = location(error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = sorted((error.schema.get("properties") or {}).keys())
        extra = sorted(set(error.instance) - set(allowed)) if isinstance(error.instance, Mapping) else []
        for key in extra:
            known = f" (expected one of: {', '.join(allowed)})" if allowed else ""
            yield (f"{where}.{key}" if where else key), f"unknown field `{key}`{known}"
        return
    if error.validator in ("oneOf", "anyOf"):
        enums = _enums(error.schema)
        if enums and not isinstance(error.instance, (Mapping, list)):
            yield where, f"{json.dumps(error.instance)} is not one of: {', '.join(enums)}"
            return
        best = min(error.context or [], key=lambda e: len(list(e.absolute_path)), default=None)
        if best is not None and best.validator not in ("oneOf", "anyOf", "type"):
            yield from _explain(best)
            return
        yield where, f"{_short(error.instance)} does not match the shape mcpg expects here"
        return
    if error.validator == "required":
        yield where, error.message.replace("is a required property", "is required")
        return
    yield where, error.message


def _enums(schema: Mapping[str, Any]) -> list[str]:
    options = [o for o in schema.get("oneOf", []) + schema.get("anyOf", []) if isinstance(o, Mapping)]
    return [str(v) for o in options for v in [*o.get("enum", []), *([o["const"]] if "const" in o else [])]]


def _short(value: object) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def env_overlay(doc: Mapping[str, object], environ: Mapping[str, str]) -> dict[str, Any]:
    """``doc`` with mcpg's ``MCPG_<ROOT>__<KEY>__...`` variables merged in (figment's ``Env::prefixed("MCPG_")
    .split("__")``, limited to the config's roots): keys lower-cased, values read as a boolean, an integer,
    a float, or else text, later wins over the file."""
    out: dict[str, Any] = json.loads(json.dumps(doc))
    for name in sorted(environ):
        if not name.startswith("MCPG_"):
            continue
        path = [p.lower() for p in name[len("MCPG_") :].split("__") if p]
        if not path or path[0] not in _schema()["properties"]:
            continue
        node = out
        for key in path[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[path[-1]] = _env_value(environ[name])
    return out


def _env_value(text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text
