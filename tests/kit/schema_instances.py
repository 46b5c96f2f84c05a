"""A small, valid instance of a JSON Schema (a tool's input schema, ``$defs`` included): required properties
only, the first enum value, the first of ``anyOf``/``oneOf``, formats honoured. For calling many tools with
arguments their schemas accept, without writing each call by hand."""

from __future__ import annotations

from typing import Any

_FORMATS = {
    "date-time": "2020-01-02T03:04:05Z",
    "date": "2020-01-02",
    "uri": "https://example.com/x",
    "url": "https://example.com/x",
    "email": "someone@example.com",
    "uuid": "123e4567-e89b-12d3-a456-426614174000",
    "ipv4": "192.0.2.1",
    "hostname": "example.com",
    "byte": "eA==",
    "binary": "x",
    "int-or-string": "1",
}


def instance(schema: Any, root: dict[str, Any] | None = None, depth: int = 0) -> Any:
    """A value ``schema`` accepts (best effort: patterns are not honoured)."""
    root = root if root is not None else schema
    if not isinstance(schema, dict) or depth > 40:
        return None
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return instance(root.get("$defs", {}).get(name, {}), root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return next((v for v in schema["enum"] if v is not None), schema["enum"][0])
    if "default" in schema and schema["default"] is not None:
        return schema["default"]
    for key in ("oneOf", "anyOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return instance(schema[key][0], root, depth + 1)
    if isinstance(schema.get("allOf"), list):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            value = instance(part, root, depth + 1)
            if isinstance(value, dict):
                merged.update(value)
            elif value is not None and not merged:
                return value
        if merged or "properties" not in schema:
            return merged
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), None)
    if t is None:
        t = "object" if "properties" in schema else "string"
    if t == "object":
        props = schema.get("properties") or {}
        chosen = list(schema.get("required") or [])
        if not chosen and props and depth > 0:  # a nested object left empty vanishes from a form body
            chosen = [next(iter(props))]
        return {k: instance(props.get(k, {}), root, depth + 1) for k in chosen}
    if t == "array":
        n = max(1, int(schema.get("minItems") or 1))
        return [instance(schema.get("items", {}), root, depth + 1) for _ in range(n)]
    if t == "integer":
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        return int(low) + (1 if "exclusiveMinimum" in schema else 0) if isinstance(low, int | float) else 1
    if t == "number":
        return float(schema.get("minimum", 1))
    if t == "boolean":
        return True
    if t == "null":
        return None
    text = _FORMATS.get(str(schema.get("format")), "x")
    return text * max(1, int(schema.get("minLength") or 1)) if len(text) == 1 else text
