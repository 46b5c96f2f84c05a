"""The tool registry: what a pipeline (and the server) can call, by name.

``@registry.tool`` turns a plain Python function into a tool. Its input schema comes from the parameters'
type hints and its output schema from the return annotation, both through msgspec; arguments are
validated and converted by msgspec before the function runs, so a function only ever sees well-typed
values. A bad argument answers a tool error naming the argument (``- at `args.limit```), never a
traceback.

The scheduler reaches a registry only through ``in``, ``get``, ``allows`` and ``call``, so the server can
hand it any object with those four (its gateway, which adds authorization and audit).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import UnionType
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin, get_type_hints, overload

import msgspec
import orjson

from mcpipe.errors import UnknownToolError
from mcpipe.tools._base import Tool, ToolContext, ToolResult

__all__ = ["FunctionTool", "ToolRegistry", "UnknownToolError"]

_T = TypeVar("_T", bound=Tool)
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
# Section headers of a Google-style docstring: the description stops at the first of them.
_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns|Yields|Raises|Examples?|Notes?):\s*$")
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


class FunctionTool:
    """A Python function (sync or async) exposed as a tool; built by :meth:`ToolRegistry.tool`.

    A sync function runs inline on the Trio thread: keep it short, or make it async and use
    ``trio.to_thread.run_sync`` inside for blocking work.

    Attributes:
        name, description: as MCP lists them.
        input_schema: JSON Schema of the arguments object (parameters are properties; those without a
            default are required; unknown arguments are rejected).
        output_schema: JSON Schema of ``structuredContent``, or None when the function returns text
            (``str``), a :class:`ToolResult`, or is not annotated.
        annotations: MCP tool annotations (``readOnlyHint``, ``destructiveHint``, ``idempotentHint``,
            ``openWorldHint``, ``title``), or None.
        fn: the wrapped function.
        annotations: MCP tool annotations (``{"idempotentHint": True}``, ``readOnlyHint``, ...), or None.
    """

    __slots__ = (
        "_args_type",
        "_ctx_param",
        "_is_async",
        "_shape",
        "annotations",
        "description",
        "fn",
        "input_schema",
        "name",
        "output_schema",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        annotations: Mapping[str, object] | None = None,
    ):
        self.fn = fn
        self.annotations = annotations
        self.name = name or fn.__name__
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"invalid tool name {self.name!r} (letters, digits, `_`, `-`, `.`; 1-128)")
        doc = inspect.getdoc(fn) or ""
        summary, param_docs = _split_docstring(doc)
        self.description = summary if description is None else description
        self._is_async = inspect.iscoroutinefunction(fn)

        hints = get_type_hints(fn, include_extras=True)
        fields: list[tuple[Any, ...]] = []
        self._ctx_param: str | None = None
        for p in inspect.signature(fn).parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"tool {self.name!r}: *args/**kwargs parameters cannot be described by a schema")
            if p.kind is p.POSITIONAL_ONLY:
                raise TypeError(f"tool {self.name!r}: parameter {p.name!r} is positional-only")
            hint = hints.get(p.name, Any)
            if hint is ToolContext or (get_origin(hint) in (Union, UnionType) and ToolContext in get_args(hint)):
                self._ctx_param = p.name
                continue
            if p.name in param_docs:
                hint = Annotated[hint, msgspec.Meta(description=param_docs[p.name])]
            fields.append((p.name, hint) if p.default is p.empty else (p.name, hint, p.default))
        self._args_type = msgspec.defstruct(f"{self.name}_arguments", fields, kw_only=True, forbid_unknown_fields=True)
        self.input_schema = _inline_schema(self._args_type)

        ret = hints.get("return", inspect.Signature.empty)
        self._shape, self.output_schema = _output_shape(ret)

    def __repr__(self) -> str:
        return f"<FunctionTool {self.name}>"

    async def call(self, args: Mapping[str, object], ctx: ToolContext) -> ToolResult:
        """Validate ``args``, call the function, and shape what it returns as a :class:`ToolResult`."""
        try:
            parsed = msgspec.convert(args, self._args_type)
        except msgspec.ValidationError as e:
            return ToolResult.error(f"invalid arguments for tool '{self.name}': {_locate(str(e))}")
        kwargs = msgspec.structs.asdict(parsed)
        if self._ctx_param is not None:
            kwargs[self._ctx_param] = ctx
        value = await self.fn(**kwargs) if self._is_async else self.fn(**kwargs)
        return _to_result(value, self._shape)


class ToolRegistry:
    """Tools by name. Iterating yields the tools; ``in`` and :meth:`names` work on names."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.register(t)

    @overload
    def tool(self, fn: Callable[..., Any], /) -> FunctionTool: ...
    @overload
    def tool(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        annotations: Mapping[str, object] | None = None,
    ) -> Callable[[Callable[..., Any]], FunctionTool]: ...

    def tool(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        annotations: Mapping[str, object] | None = None,
    ) -> Any:
        """Register a function as a tool: ``@registry.tool`` or ``@registry.tool(name=..., description=...,
        annotations={"readOnlyHint": True})`` (annotations as MCP defines them; ``mcpipe.tools.PURE`` for a
        tool that only computes).

        The description defaults to the docstring's text before its ``Args:`` section; the ``Args:``
        entries describe the parameters in the input schema. A parameter annotated ``ToolContext``
        receives the call's context and is left out of the schema.

        Returns:
            The :class:`FunctionTool` (still callable as a tool, not as the plain function).
        """

        def wrap(f: Callable[..., Any]) -> FunctionTool:
            return self.register(FunctionTool(f, name=name, description=description, annotations=annotations))

        return wrap if fn is None else wrap(fn)

    def register(self, tool: _T) -> _T:
        """Add a tool (anything with the :class:`~mcpipe.tools.Tool` attributes).

        Raises:
            ValueError: a tool with that name is already registered.
        """
        if tool.name in self._tools:
            raise ValueError(f"tool '{tool.name}' is already registered")
        self._tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, or None."""
        return self._tools.get(name)

    def names(self) -> list[str]:
        """The registered names, in registration order."""
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"<ToolRegistry {self.names()}>"

    def allows(self, name: str, ctx: ToolContext) -> bool:
        """Whether the caller of ``ctx`` may call ``name``. Always True here; the server's gateway decides
        by its auth policy (a pipeline asks before any step runs, for ``FORBIDDEN``)."""
        return True

    async def call(self, name: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Call tool ``name``. A tool that raises propagates the exception (the scheduler reports it as
        ``TOOL_FAILED``); one that handled a failure answers ``is_error``.

        Raises:
            UnknownToolError: no tool by that name.
        """
        tool = self._tools.get(name)
        if tool is None:
            raise UnknownToolError(name)
        return await tool.call(args, ctx)


# --- schemas -----------------------------------------------------------------------------------------


def _inline_schema(tp: object) -> dict[str, Any]:
    """JSON Schema of ``tp`` with the top level written out (MCP wants ``"type": "object"`` there, not a
    ``$ref``) and anything it refers to under ``$defs``."""
    (top,), defs = msgspec.json.schema_components([tp], ref_template="#/$defs/{name}")
    if "$ref" in top:
        name = top["$ref"].rsplit("/", 1)[1]
        top = dict(defs.pop(name))
        top.pop("title", None)
    if defs:
        top["$defs"] = defs
    return top


# How a function's return value becomes a ToolResult.
_TEXT = 0  # str: one text block
_OBJECT = 1  # a JSON object: structuredContent, plus the same as a JSON text block
_WRAPPED = 2  # any other JSON value: structuredContent {"result": value} (MCP wants an object there)
_RAW = 3  # ToolResult, or not annotated: decided by the value at run time


def _output_shape(ret: object) -> tuple[int, dict[str, Any] | None]:
    if ret is inspect.Signature.empty or ret is Any or ret is ToolResult:
        return _RAW, None
    if ret is str:
        return _TEXT, None
    if ret is None or ret is type(None):
        return _RAW, None
    schema = _inline_schema(ret)
    if schema.get("type") == "object":
        return _OBJECT, schema
    wrapped: dict[str, Any] = {"type": "object", "properties": {"result": schema}, "required": ["result"]}
    if "$defs" in schema:
        wrapped["$defs"] = schema.pop("$defs")
    return _WRAPPED, wrapped


def _to_result(value: object, shape: int) -> ToolResult:
    if shape == _RAW:
        if isinstance(value, ToolResult):
            return value
        if value is None:
            return ToolResult()
        if isinstance(value, str):
            return ToolResult.text(value)
        value = msgspec.to_builtins(value)
        if isinstance(value, dict):
            shape = _OBJECT
        else:
            return ToolResult.text(orjson.dumps(value).decode())
    elif shape == _TEXT:
        return ToolResult.text(value if isinstance(value, str) else str(value))
    else:
        value = msgspec.to_builtins(value)
        if shape == _WRAPPED:
            value = {"result": value}
    return ToolResult([{"type": "text", "text": orjson.dumps(value).decode()}], value)


def _locate(message: str) -> str:
    """msgspec's ``... - at `$.limit``` names the argument as ``args.limit``; a whole-object problem
    (a missing or unknown field) is at ``args``."""
    head, sep, where = message.partition(" - at `$")
    if sep:
        return f"{head} - at `args{where}"
    return f"{message} - at `args`"


def _split_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The description (text before the first section) and the ``Args:`` entries of a Google-style
    docstring."""
    lines = doc.splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    section = None
    current: str | None = None
    params_indent = 0
    for line in lines:
        m = _SECTION.match(line)
        if m:
            section = m.group(1)
            current = None
            continue
        if section is None:
            summary.append(line)
        elif section in ("Args", "Arguments", "Parameters") and line.strip():
            entry = _ARG_LINE.match(line.strip())
            indent = len(line) - len(line.lstrip())
            if entry and (current is None or indent <= params_indent):
                current = entry.group(1).lstrip("*")
                params_indent = indent
                params[current] = entry.group(2).strip()
            elif current is not None:
                params[current] = f"{params[current]} {line.strip()}".strip()
    return "\n".join(summary).strip(), params
