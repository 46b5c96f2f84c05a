"""MCP content blocks in a declared pipeline's answer: what is checked at load, what at each answer."""

from __future__ import annotations

import binascii
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from mcpipe._describe import did_you_mean, json_type

__all__ = ["CONTENT_TYPES", "check_static_content", "content_blocks"]

CONTENT_TYPES = ("text", "image", "audio", "resource", "resource_link")
"""The MCP content block types a ``content`` template may produce."""

_BLOCK_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # type: (required fields, optional fields); `type`, `annotations` and `_meta` are always allowed.
    "text": (("text",), ()),
    "image": (("data", "mimeType"), ()),
    "audio": (("data", "mimeType"), ()),
    "resource": (("resource",), ()),
    "resource_link": (("uri", "name"), ("title", "description", "mimeType", "size", "icons")),
}
_ALWAYS = ("type", "annotations", "_meta")


def check_static_content(value: object, loc: str, problem: Callable[[str, str], None]) -> None:
    """Check what can be checked before a run: literal block types and field names."""
    items = [value] if isinstance(value, Mapping) and "type" in value else value if isinstance(value, list) else []
    for i, block in enumerate(items):
        where = f"{loc}[{i}]" if isinstance(value, list) else loc
        if not isinstance(block, Mapping) or "$ref" in block or "$literal" in block:
            continue
        kind = block.get("type")
        if not isinstance(kind, str) or "${" in kind or "{{" in kind:
            if "type" not in block:
                problem(f"{where}.type", f"a content block needs a `type` ({', '.join(CONTENT_TYPES)})")
            continue
        if kind not in _BLOCK_FIELDS:
            problem(
                f"{where}.type",
                f"unknown content type '{kind}'{did_you_mean(kind, CONTENT_TYPES)} ({', '.join(CONTENT_TYPES)})",
            )
            continue
        required, optional = _BLOCK_FIELDS[kind]
        for f in required:
            if f not in block:
                problem(where, f"a `{kind}` block needs `{f}`")
        for f in block:
            if f not in required and f not in optional and f not in _ALWAYS:
                problem(f"{where}.{f}", f"unknown field `{f}` for a `{kind}` block")


def content_blocks(value: object) -> tuple[list[dict[str, Any]], str | None]:
    """Check a resolved ``content`` value: one block or a list of MCP content blocks.

    Returns:
        The blocks, and None; or ``[]`` and what is wrong (``[1].data: not base64``).
    """
    items = [value] if isinstance(value, dict) else value
    if not isinstance(items, list):
        return [], f"expected a list of content blocks, got {json_type(value)}"
    for i, block in enumerate(items):
        problem = _block_problem(block)
        if problem is not None:
            return [], f"[{i}]{problem}"
    return items, None


def _block_problem(block: object) -> str | None:
    if not isinstance(block, dict):
        return f": a content block must be an object, got {json_type(block)}"
    kind = block.get("type")
    if kind not in _BLOCK_FIELDS:
        return f".type: unknown content type {_json(kind)} ({', '.join(CONTENT_TYPES)})"
    required, optional = _BLOCK_FIELDS[kind]
    for f in required:
        if f not in block:
            return f": a `{kind}` block needs `{f}`"
    for f in block:
        if f not in required and f not in optional and f not in _ALWAYS:
            return f".{f}: unknown field for a `{kind}` block"
    if kind == "text":
        return None if isinstance(block["text"], str) else f".text: expected a string, got {json_type(block['text'])}"
    if kind in ("image", "audio"):
        if not isinstance(block["mimeType"], str):
            return f".mimeType: expected a string, got {json_type(block['mimeType'])}"
        return _base64_problem(block["data"], ".data")
    if kind == "resource_link":
        for f in ("uri", "name"):
            if not isinstance(block[f], str):
                return f".{f}: expected a string, got {json_type(block[f])}"
        return None
    resource = block["resource"]
    if not isinstance(resource, dict):
        return f".resource: expected an object, got {json_type(resource)}"
    if not isinstance(resource.get("uri"), str):
        return ".resource.uri: an embedded resource needs a `uri` string"
    has_text, has_blob = "text" in resource, "blob" in resource
    if has_text == has_blob:
        return ".resource: an embedded resource has exactly one of `text` or `blob`"
    for f in resource:
        if f not in ("uri", "mimeType", "text", "blob", "annotations", "_meta"):
            return f".resource.{f}: unknown field for an embedded resource"
    if has_text:
        t = resource["text"]
        return None if isinstance(t, str) else f".resource.text: expected a string, got {json_type(t)}"
    return _base64_problem(resource["blob"], ".resource.blob")


def _base64_problem(value: object, where: str) -> str | None:
    if not isinstance(value, str):
        return f"{where}: expected base64 text, got {json_type(value)}"
    try:
        binascii.a2b_base64(value.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError):
        return f"{where}: not valid base64"
    return None


def _json(v: object) -> str:
    try:
        return orjson.dumps(v).decode()
    except TypeError:
        return repr(v)
