"""An OpenAPI schema turned into a self-contained JSON Schema (2020-12) for a tool's ``inputSchema``.

Each ``$ref`` is looked up by ``referencing`` (through the document's resolver, so relative files, JSON
pointers and 3.1's ``$id``s and ``$anchor``s resolve as that library resolves them); the schema it names is
converted once and kept under ``$defs``, and the reference points there. So a recursive schema stays a
reference, not an endless copy, and a schema named by many parameters is written once. OpenAPI 3.0's and
Swagger 2.0's dialect is rewritten as JSON Schema: ``nullable`` and ``x-nullable`` become a ``null`` type,
boolean ``exclusiveMinimum``/``exclusiveMaximum`` become numbers, ``type: file`` a string; annotations no
validator reads (``example``, ``xml``, ``externalDocs``, ``discriminator``, ``x-*``) are dropped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from mcpipe.openapi._document import Version

__all__ = ["Bundler", "SchemaProblem"]

MAX_NESTING = 64
"""How deeply one schema may nest (references followed through ``$defs`` do not count)."""

MAX_NODES = 50_000
"""The most schema objects one tool's input schema may hold, its ``$defs`` included."""

_SCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas")
_SCHEMA_ONE = (
    "items",
    "additionalProperties",
    "not",
    "contains",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "additionalItems",
)
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_DROPPED = frozenset(
    {
        "example",
        "examples",
        "xml",
        "externalDocs",
        "discriminator",
        "nullable",
        "$id",
        "$schema",
        "$anchor",
        "$dynamicAnchor",
        "$vocabulary",
        "$comment",
        "$defs",
        "definitions",
        "id",
    }
)
_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


class SchemaProblem(Exception):
    """A schema that cannot be made a tool's input schema (an unresolvable ``$ref``, too large, too deep)."""


class Bundler:
    """Converts the schemas of one operation, collecting what their ``$ref``s name into ``defs``.

    Args:
        version: the document's version (the dialect to rewrite).
        max_nodes: the most schema objects the result may hold.
    """

    def __init__(self, version: Version, max_nodes: int = MAX_NODES) -> None:
        self.version = version
        self.defs: dict[str, Any] = {}
        self._names: dict[int, str] = {}
        self._nodes = 0
        self._max_nodes = max_nodes

    def schema(self, node: Any, resolver: Any, depth: int = 0) -> Any:
        """``node`` (a schema object of the document, found through ``resolver``) as JSON Schema.

        Raises:
            SchemaProblem: a ``$ref`` does not resolve, or the schema nests or grows past its bounds.
        """
        if isinstance(node, bool):
            return node
        if not isinstance(node, dict):
            raise SchemaProblem(f"a schema is an object, not {type(node).__name__}")
        if depth > MAX_NESTING:
            raise SchemaProblem(f"a schema nests deeper than {MAX_NESTING} levels")
        self._nodes += 1
        if self._nodes > self._max_nodes:
            raise SchemaProblem(
                f"its input schema holds more than {self._max_nodes} schemas once its $refs are resolved"
            )
        if "$ref" in node:
            ref = node["$ref"]
            if not isinstance(ref, str):
                raise SchemaProblem(f"a `$ref` is a string, not {_kind(ref)}")
            target = self.ref(ref, resolver)
            siblings = {k: v for k, v in node.items() if k != "$ref"} if self.version == "3.1" else {}
            if not siblings:
                return target
            rest = self._convert(siblings, resolver, depth)
            return {**target, **rest} if rest else target
        if self.version == "3.1" and isinstance(node.get("$id"), str):
            resolver = resolver.in_subresource(DRAFT202012.create_resource(node))
        return self._convert(node, resolver, depth)

    def ref(self, ref: str, resolver: Any) -> dict[str, Any]:
        """``{"$ref": "#/$defs/NAME"}`` for what ``ref`` names (converted into ``defs`` the first time)."""
        try:
            resolved = resolver.lookup(ref)
        except Unresolvable as exc:
            raise SchemaProblem(f"`$ref` `{ref}` does not resolve ({_why(exc)})") from None
        contents = resolved.contents
        key = id(contents)
        name = self._names.get(key)
        if name is None:
            name = self._fresh(ref)
            self._names[key] = name
            self.defs[name] = {}  # reserved: a recursive reference finds the name while it is converted
            self.defs[name] = self.schema(contents, resolved.resolver)
        return {"$ref": f"#/$defs/{name}"}

    def _fresh(self, ref: str) -> str:
        tail = unquote(ref.rsplit("/", 1)[-1].split("#", 1)[-1]) or "schema"
        tail = tail.rsplit(".", 1)[0] if tail.endswith((".yaml", ".yml", ".json")) else tail
        base = _NAME.sub("_", tail)[:64] or "schema"
        name, n = base, 2
        while name in self.defs:
            name, n = f"{base}_{n}", n + 1
        return name

    def _convert(self, node: Mapping[str, object], resolver: object, depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        legacy = self.version != "3.1"
        for key, value in node.items():
            if key in _DROPPED or key.startswith("x-"):
                continue
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                out[key] = {k: self.schema(v, resolver, depth + 1) for k, v in value.items()}
            elif key in _SCHEMA_ONE and isinstance(value, dict | bool):
                out[key] = self.schema(value, resolver, depth + 1)
            elif key in _SCHEMA_LISTS and isinstance(value, list):
                out[key] = [self.schema(v, resolver, depth + 1) for v in value]
            elif key == "items" and isinstance(value, list):  # draft 4's tuple form
                out["prefixItems"] = [self.schema(v, resolver, depth + 1) for v in value]
            elif key == "type" and value == "file":
                out["type"] = "string"
            elif legacy and key in ("exclusiveMinimum", "exclusiveMaximum") and isinstance(value, bool):
                bound = node.get("minimum" if key == "exclusiveMinimum" else "maximum")
                if value and isinstance(bound, int | float):
                    out[key] = bound
            elif key == "required" and not isinstance(value, list):
                continue  # a Swagger 2.0 parameter's boolean, not the schema's list
            else:
                out[key] = value
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            if legacy and node.get(key) is True:
                out.pop("minimum" if key == "exclusiveMinimum" else "maximum", None)
        if legacy and (node.get("nullable") is True or node.get("x-nullable") is True):
            out = _nullable(out)
        return out


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    t = schema.get("type")
    if isinstance(t, str):
        schema["type"] = [t, "null"]
    elif isinstance(t, list):
        schema["type"] = [*t, "null"] if "null" not in t else t
    else:
        return {"anyOf": [schema, {"type": "null"}]}
    if isinstance(schema.get("enum"), list) and None not in schema["enum"]:
        schema["enum"] = [*schema["enum"], None]
    return schema


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _why(exc: Unresolvable) -> str:
    cause = exc.__cause__ or exc.__context__
    text = str(cause) if cause is not None else type(exc).__name__
    return " ".join(text.split())[:200] or type(exc).__name__
