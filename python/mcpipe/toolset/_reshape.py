"""A tool reshaped by the operator: another name, title, description; arguments renamed, fixed (hidden),
given defaults; the answer projected by a JSONata or CEL expression; annotations set.

The reshaped tool stands in front of its original wherever tools are seen: ``tools/list``, ``mcp_pipe``
steps, the scopes a principal is granted and the audit all name the reshaped tool; it calls the original
object directly (one call, audited once, under the reshaped name). Its schema is derived from the original's
each time the original changes (a downstream server listing again: :meth:`ReshapedTool.sync`, which the
gateway calls when it hands the tool out).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import orjson

from mcpipe.errors import ErrorCode, ExpressionError, Problem
from mcpipe.tools import Tool, ToolContext, ToolResult
from mcpipe.toolset._config import ReshapeConfig

__all__ = ["ReshapedTool", "compile_reshape"]

Lookup = Callable[[str], Tool | None]


def compile_reshape(name: str, cfg: ReshapeConfig, where: str) -> tuple[Any, list[Problem]]:
    """The compiled ``output`` expression of one reshaped tool (None without one), and its problems."""
    problems: list[Problem] = []
    for arg, shape in cfg.arguments.items():
        at = f"{where}.arguments.{arg}"
        fixed = shape.value is not msgspec.UNSET
        if sum((fixed, shape.default is not msgspec.UNSET, shape.hide)) > 1:
            problems.append(Problem(at, ErrorCode.INVALID_CONFIG, "set one of `value`, `default` or `hide`"))
        if shape.name is not None and (fixed or shape.hide):
            problems.append(Problem(f"{at}.name", ErrorCode.INVALID_CONFIG, "a hidden argument has no name to rename"))
    renamed = [s.name for s in cfg.arguments.values() if s.name]
    if len(set(renamed)) != len(renamed):
        problems.append(Problem(f"{where}.arguments", ErrorCode.INVALID_CONFIG, "two arguments are renamed alike"))
    if cfg.output is None:
        return None, problems
    from mcpipe.expr import CelExpr, ExpressionSyntaxError, JsonataExpr

    try:
        expr = JsonataExpr.compile(cfg.output) if cfg.language == "jsonata" else CelExpr.compile(cfg.output)
    except ExpressionSyntaxError as exc:
        problems.append(Problem(f"{where}.output", ErrorCode.INVALID_CONFIG, str(exc)))
        return None, problems
    return expr, problems


class ReshapedTool:
    """The operator's reshaping of the tool ``cfg.tool``, under ``name``."""

    def __init__(self, name: str, cfg: ReshapeConfig, lookup: Lookup, output: Any = None) -> None:
        self.name = name
        self.cfg = cfg
        self.original_name = cfg.tool
        self._lookup = lookup
        self._output = output
        self._derived_from: int | None = None
        self.title: str | None = cfg.title
        self.description: str = cfg.description or ""
        self.input_schema: dict[str, Any] = {"type": "object"}
        self.output_schema: dict[str, Any] | None = None
        self.annotations: dict[str, Any] | None = dict(cfg.annotations) or None
        self._outward = {shape.name: arg for arg, shape in cfg.arguments.items() if shape.name}
        """The reshaped tool's argument name -> the original's."""

    def original(self) -> Tool | None:
        return self._lookup(self.original_name)

    def sync(self) -> Tool | None:
        """The original, its title, description, schemas and annotations laid under the operator's (derived again
        only when the original changed: a downstream server listed again); None while it is unavailable."""
        tool = self.original()
        if tool is None or id(tool) == self._derived_from:
            return tool
        cfg = self.cfg
        self.title = cfg.title if cfg.title is not None else getattr(tool, "title", None)
        self.description = cfg.description if cfg.description is not None else tool.description
        self.input_schema = self._derive(tool.input_schema)
        self.output_schema = None if self._output is not None else tool.output_schema  # a projection is its own
        merged = {**(getattr(tool, "annotations", None) or {}), **cfg.annotations}
        self.annotations = merged or None
        self._derived_from = id(tool)
        return tool

    def _derive(self, original: dict[str, Any]) -> dict[str, Any]:
        schema = copy.deepcopy(original)
        props: dict[str, Any] = schema.get("properties") or {}
        required: list[str] = list(schema.get("required") or [])
        out_props: dict[str, Any] = {}
        for arg, value in props.items():
            shape = self.cfg.arguments.get(arg)
            if shape is None:
                out_props[arg] = value
                continue
            if shape.value is not msgspec.UNSET or shape.hide:
                required = [r for r in required if r != arg]
                continue
            entry = dict(value) if isinstance(value, dict) else {}
            if shape.default is not msgspec.UNSET:
                entry["default"] = shape.default
                required = [r for r in required if r != arg]
            if shape.description is not None:
                entry["description"] = shape.description
            new = shape.name or arg
            out_props[new] = entry
            required = [new if r == arg else r for r in required]
        schema["properties"] = out_props
        if required:
            schema["required"] = required
        else:
            schema.pop("required", None)
        return schema

    def arguments(self, args: Mapping[str, object]) -> tuple[dict[str, Any], list[str]]:
        """The original's arguments for the reshaped tool's ``args``, and what is wrong with them."""
        problems: list[str] = []
        out: dict[str, Any] = {}
        for key, value in args.items():
            original = self._outward.get(key, key)
            shape = self.cfg.arguments.get(key)
            if shape is not None and (shape.name or shape.value is not msgspec.UNSET or shape.hide):
                problems.append(f"args.{key}: not an argument of '{self.name}'")
                continue
            out[original] = value
        for arg, shape in self.cfg.arguments.items():
            if shape.value is not msgspec.UNSET:
                out[arg] = shape.value
            elif shape.default is not msgspec.UNSET and arg not in out:
                out[arg] = shape.default
        return out, problems

    async def call(self, args: Mapping[str, object], ctx: ToolContext) -> ToolResult:
        tool = self.sync()
        if tool is None:
            return ToolResult.error(
                f"{ErrorCode.TOOL_FAILED}: '{self.name}' reshapes '{self.original_name}', which is unavailable"
            )
        mapped, problems = self.arguments(args)
        if problems:
            return ToolResult.error(f"{ErrorCode.INVALID_SPEC}: " + "; ".join(problems))
        result = await tool.call(mapped, ctx)
        if self._output is None or result.is_error:
            return result
        answer = result.structured if result.structured is not None else result.joined_text()
        try:
            value = await self._output.evaluate_async({"last": answer, "args": args})
        except ExpressionError as exc:
            return ToolResult.error(f"{exc.code}: tools.reshape.{self.name}.output: {exc}")
        text = value if isinstance(value, str) else orjson.dumps(value).decode()
        return ToolResult([{"type": "text", "text": text}], value, False, any_json=True)
