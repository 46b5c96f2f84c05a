"""The built-in tools of ``mcpipe serve``: small, pure, safe glue for pipelines.

None of them touches the network or the filesystem, so serving them needs no policy. An ``http_fetch``
is deliberately absent: a gateway that fetches arbitrary URLs for its callers is a server-side request
forgery waiting to happen; put a fetch server behind ``mcpServers``, where you choose its reach.

| tool | does |
|---|---|
| ``echo`` | answers its arguments (structured, and as JSON text) |
| ``json_parse`` | parses ``text`` as JSON: ``{"value": ...}`` |
| ``json_dump`` | writes ``value`` as JSON text (``indent`` optional): ``{"text": ...}`` |
| ``text_join`` | joins ``items`` with ``sep``: ``{"text": ...}`` |
| ``text_split`` | splits ``text`` on ``sep`` (whitespace when absent): ``{"items": [...]}`` |
| ``text_replace`` | replaces ``old`` with ``new`` in ``text``: ``{"text": ...}`` |
| ``now`` | the current UTC time: ``{"iso": ..., "unix": ...}`` |
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec
import orjson

from mcpipe._json import dumps
from mcpipe.tools._base import PURE, ToolContext, ToolResult
from mcpipe.tools._registry import ToolRegistry

__all__ = ["BUILTIN_NAMES", "builtin_tools"]


class _Echo:
    """``echo`` takes any arguments, which a signature cannot describe, so it is a Tool of its own."""

    name: str = "echo"
    description: str = "Answer the arguments as they came (structured, and as JSON text). Handy to shape data."
    input_schema: dict[str, Any] = {"type": "object", "additionalProperties": True}
    output_schema: dict[str, Any] | None = None
    annotations: dict[str, Any] = PURE

    async def call(self, args: Mapping[str, object], ctx: ToolContext) -> ToolResult:
        return ToolResult([{"type": "text", "text": dumps(args).decode()}], args)


class Text(msgspec.Struct):
    text: str


class Items(msgspec.Struct):
    items: list[str]


class Parsed(msgspec.Struct):
    value: Any


class Now(msgspec.Struct):
    iso: str
    unix: float


def _registry() -> ToolRegistry:
    reg = ToolRegistry()
    reg.register(_Echo())

    @reg.tool
    def json_parse(text: str) -> ToolResult:
        """Parse `text` as JSON; the value is in `value`."""
        try:
            return _ok(Parsed(orjson.loads(text)))
        except orjson.JSONDecodeError as exc:
            return ToolResult.error(f"json_parse: not JSON: {exc}")

    @reg.tool
    def json_dump(value: Any, indent: bool = False) -> Text:
        """Write `value` as JSON text (two-space indent when `indent` is true)."""
        return Text(orjson.dumps(value, option=orjson.OPT_INDENT_2 if indent else 0).decode())

    @reg.tool
    def text_join(items: list[Any], sep: str = "") -> Text:
        """Join `items` with `sep`; items that are not strings are written as JSON."""
        return Text(sep.join(i if isinstance(i, str) else orjson.dumps(i).decode() for i in items))

    @reg.tool
    def text_split(text: str, sep: str | None = None, maxsplit: int = -1) -> ToolResult:
        """Split `text` on `sep` (on runs of whitespace when absent), at most `maxsplit` times."""
        if sep == "":
            return ToolResult.error("text_split: `sep` must not be empty")
        return _ok(Items(text.split(sep, maxsplit)))

    @reg.tool
    def text_replace(text: str, old: str, new: str = "") -> ToolResult:
        """Replace every `old` with `new` in `text`."""
        if not old:
            return ToolResult.error("text_replace: `old` must not be empty")
        return _ok(Text(text.replace(old, new)))

    @reg.tool
    def now() -> Now:
        """The current UTC time: `iso` (ISO 8601) and `unix` (seconds)."""
        t = time.time()
        return Now(datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z"), t)

    # These answer a tool error on bad input, so they return ToolResult and declare their schema here.
    for tool, shape in ((json_parse, Parsed), (text_split, Items), (text_replace, Text)):
        tool.output_schema = _schema(shape)
    for tool in (json_parse, json_dump, text_join, text_split, text_replace):
        tool.annotations = PURE
    now.annotations = {**PURE, "idempotentHint": False}  # the clock moves
    return reg


def _schema(shape: type) -> dict[str, Any]:
    _, defs = msgspec.json.schema_components([shape])
    return defs[shape.__name__]


def _ok(value: msgspec.Struct) -> ToolResult:
    data = msgspec.to_builtins(value)
    return ToolResult([{"type": "text", "text": orjson.dumps(data).decode()}], data)


BUILTIN_NAMES: tuple[str, ...] = tuple(_registry().names())


def builtin_tools(selection: bool | list[str] = True) -> ToolRegistry:
    """A registry of the built-in tools: all (``True``), none (``False``) or those named.

    Raises:
        KeyError: a name that is not a built-in tool.
    """
    reg = _registry()
    if selection is True:
        return reg
    keep = [] if selection is False else list(selection)
    unknown = [n for n in keep if n not in reg]
    if unknown:
        raise KeyError(f"not built-in tools: {', '.join(unknown)}")
    return ToolRegistry([t for t in reg if t.name in keep])
