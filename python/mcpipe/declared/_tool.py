"""The declared pipelines' dialect of :class:`~mcpipe.declared.PlanTool`, and the declared pipelines of a config
as a tool source."""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator, Mapping
from typing import Any

import msgspec
import orjson
import trio

from mcpipe._describe import json_type
from mcpipe._jsonschema import Checked, needs_thread, validator
from mcpipe.declared._answers import AnswerShape, answer_shape
from mcpipe.declared._config import PipelineConfig
from mcpipe.declared._content import content_blocks
from mcpipe.declared._plantool import PlanCall, PlanTool, ToolDialect
from mcpipe.errors import ErrorCode
from mcpipe.kinds import StepPolicy
from mcpipe.plan import CompiledSpec, Limits
from mcpipe.runtime import inline_tool_calls
from mcpipe.tools import ToolResult

__all__ = ["DeclaredDialect", "DeclaredPipelines", "KnownTools", "declared_tool", "is_declared"]


class KnownTools:
    """The tool names a config can call, for ``mcpipe check --config`` (where downstream servers are not
    connected): ``names`` exactly, plus any ``<prefix>.<tool>`` of a downstream server's prefix, which
    cannot be checked until that server is up.

    Args:
        names: the tools known now (built-ins, ``python_tools``; a registry or gateway works).
        prefixes: the downstream servers' prefixes.
    """

    def __init__(self, names: Container[str], prefixes: Iterable[str] = ()) -> None:
        self.names = names
        self.prefixes = tuple(f"{p}." for p in prefixes if p)

    @classmethod
    def of(cls, sources: Iterable[Any], prefixes: Iterable[str] = ()) -> KnownTools:
        """The names any of ``sources`` (tool sources: anything with ``get``) knows, plus ``prefixes``."""
        return cls(_InSources(tuple(sources)), tuple(prefixes))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self.names or name.startswith(self.prefixes))


class _InSources:
    __slots__ = ("sources",)

    def __init__(self, sources: tuple[Any, ...]) -> None:
        self.sources = sources

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and any(s.get(name) is not None for s in self.sources)


class DeclaredDialect(ToolDialect):
    """mcpipe's declared pipelines as a :class:`~mcpipe.declared.PlanTool` dialect: the arguments checked
    against the entry's ``input_schema`` (top-level defaults filled in), the answer the entry's answer shape
    (:mod:`mcpipe.declared._answers`; mcpipe's own: its ``output``/``content``, checked against the
    ``output_schema``).

    Attributes:
        answer_shape: how its run becomes its answer (and a resource's or prompt's).
    """

    may_ask = True

    def __init__(self, entry: PipelineConfig) -> None:
        shape = answer_shape(entry.answer)
        if shape is None:
            raise ValueError(f"no answer shape named {entry.answer!r}")
        self.answer_shape: AnswerShape = shape
        self._has_output = entry.output is not msgspec.UNSET
        self._has_content = entry.content is not msgspec.UNSET
        self._validator = _validator(entry.input_schema, entry.check_formats)
        self._fast = self._validator.fast if isinstance(self._validator, Checked) else None
        self._output_validator = _validator(entry.output_schema) if entry.output_schema is not None else None
        # A schema with a pattern only the fallback engine takes is validated off the event loop.
        self.in_thread = needs_thread(entry.input_schema)
        self._output_in_thread = entry.output_schema is not None and needs_thread(entry.output_schema)
        props = entry.input_schema.get("properties")
        self._defaults = (
            {k: v["default"] for k, v in props.items() if isinstance(v, Mapping) and "default" in v}
            if isinstance(props, Mapping) and entry.fill_defaults
            else {}
        )

    def check_args(self, tool: PlanTool, args: object) -> tuple[dict[str, Any], list[str]]:
        """The arguments with top-level defaults filled in, and every validation error, located
        (``args.amount: -1 is less than the minimum of 0``)."""
        if not isinstance(args, dict):
            return {}, [f"args: {_json(args)} is not of type 'object'"]
        missing = [k for k in self._defaults if k not in args]
        if missing:
            args = {**args, **{k: self._defaults[k] for k in missing}}
        fast = self._fast
        if fast is not None and fast(args):
            return args, []
        errors = sorted(self._validator.iter_errors(args), key=lambda e: (list(map(str, e.absolute_path)), e.message))
        return args, [f"{_path('args', e.absolute_path)}: {e.message}" for e in errors]

    def schema_errors(self, args: object) -> list[Any]:
        """Every way ``args`` breaks the input schema, as the validator reports them (``jsonschema``'s
        ``ValidationError``s, in its order)."""
        return list(self._validator.iter_errors(args))

    def invalid(self, tool: PlanTool, errors: list[str], args: object) -> ToolResult:
        return self.answer_shape.invalid(tool, errors, args)

    def unbound(self, tool: PlanTool) -> ToolResult:
        return ToolResult.error(
            f"{ErrorCode.TOOL_FAILED}: declared pipeline '{tool.name}' is not bound to a tool registry"
        )

    async def answer(self, tool: PlanTool, call: PlanCall, answer: dict[str, Any]) -> ToolResult:
        if self._output_in_thread:  # its output_schema has a pattern only the fallback engine takes
            return await trio.to_thread.run_sync(self.answer_shape.tool, tool, answer)
        return self.answer_shape.tool(tool, answer)

    def inline_tools(self, tool: PlanTool) -> tuple[str, ...] | None:
        """The tools a call calls, when calling them (in the event loop) is all it does; else None
        (:func:`mcpipe.runtime.inline_tool_calls`; its checks run in a thread, or it runs in the background)."""
        if self.in_thread or self._output_in_thread or tool.background or tool.compiled is None:
            return None
        return inline_tool_calls(tool.compiled)

    def shape(self, tool: PlanTool, result: Mapping[str, object]) -> ToolResult:
        """The tool's answer in mcpipe's shape from the resolved ``{"output": ..., "content": ...}``."""
        output = result["output"]
        if self._has_content:
            blocks, problem = content_blocks(result["content"])
            if problem is not None:
                return ToolResult.error(f"{ErrorCode.INVALID_OUTPUT}: {tool.location}.content: {problem}")
            structured = output if self._has_output and isinstance(output, dict) else None
            if structured is not None and (bad := self._check_output(structured)) is not None:
                return bad
            return ToolResult(blocks, structured)
        if isinstance(output, str):
            if tool.output_schema is not None:
                return ToolResult.error(
                    f"{ErrorCode.INVALID_OUTPUT}: {tool.location}.output: a string,"
                    " but the tool declares an output_schema"
                )
            return ToolResult.text(output)
        if isinstance(output, dict):
            if (bad := self._check_output(output)) is not None:
                return bad
            return ToolResult([{"type": "text", "text": orjson.dumps(output).decode()}], output)
        if tool.output_schema is not None:
            return ToolResult.error(
                f"{ErrorCode.INVALID_OUTPUT}: {tool.location}.output: {json_type(output)},"
                " but the output_schema needs an object"
            )
        return ToolResult.text(orjson.dumps(output).decode())

    def _check_output(self, structured: Mapping[str, object]) -> ToolResult | None:
        if self._output_validator is None:
            return None
        errors = sorted(self._output_validator.iter_errors(structured), key=lambda e: list(map(str, e.absolute_path)))
        if not errors:
            return None
        where = "; ".join(f"{_path('output', e.absolute_path)}: {e.message}" for e in errors)
        return ToolResult.error(f"{ErrorCode.INVALID_OUTPUT}: the output does not match the output_schema: {where}")


def declared_tool(
    entry: PipelineConfig, compiled: CompiledSpec, location: str, limits: Limits, *, registry: object = None
) -> PlanTool:
    """One declared pipeline (its entry, its plan compiled once, where it was declared: ``pipelines.charge``),
    served as a :class:`~mcpipe.declared.PlanTool` in the declared dialect under the server's ``limits``.

    Raises:
        ValueError: when the entry names no known answer shape.
    """
    return PlanTool(
        DeclaredDialect(entry),
        name=entry.name,
        title=entry.title,
        description=entry.description,
        input_schema=entry.input_schema,
        output_schema=entry.output_schema,
        compiled=compiled,
        limits=limits,
        registry=registry,
        location=location,
        background=entry.background,
        task_support=entry.task_support,
        ask_before_task=entry.ask_before_task,
        annotations=entry.annotations,
        surface=entry.surface,
        uri=entry.uri,
        uri_template=entry.uri_template,
        mime_type=entry.mime_type,
        arguments=[msgspec.to_builtins(a) for a in entry.arguments],
        meta=entry.meta,
        completions=entry.completions,
        listing=entry.listing,
        watch=entry.watch,
    )


def is_declared(tool: object) -> bool:
    """Whether ``tool`` is a declared pipeline served as a tool (a :class:`PlanTool` in the declared dialect)."""
    return isinstance(tool, PlanTool) and isinstance(tool.dialect, DeclaredDialect)


class DeclaredPipelines:
    """The declared pipelines of a config, as a tool source (``get``, iteration, ``in``, ``names``).

    Put it among the gateway's sources, then :meth:`bind` the gateway, so the pipelines' ``tool`` steps
    call through it (auth, audit, cost) and can reach every tool: Python, downstream, another pipeline.
    """

    def __init__(self, tools: list[PlanTool] | None = None, policy: StepPolicy | None = None) -> None:
        self.pipelines = list(tools or ())
        """Every pipeline, in config order (its tools and its surfaces)."""
        self._tools = {t.name: t for t in self.pipelines if t.surface == "tool"}
        self.surfaces = [t for t in self.pipelines if t.surface != "tool"]
        """The pipelines served as prompts, resources and resource templates (not tools), and the hidden ones
        they run (completion sources, listings), in config order."""
        self.policy = policy or StepPolicy()

    async def run(self, *, task_status: object = trio.TASK_STATUS_IGNORED) -> None:
        """Own the shared connections of ``nats``, ``grpc`` and ``kafka`` steps until cancelled (then close
        them): ``await nursery.start(declared.run)``, as the server does beside its other services."""
        await self.policy.connections.run(task_status=task_status)

    async def aclose(self) -> None:
        """Close the connections the steps opened (SQL pools, ...); the server calls this when it stops."""
        await self.policy.aclose()

    def bind(self, registry: object) -> None:
        """Make every pipeline's ``tool`` steps call through ``registry`` (``get``/``allows``/``call``)."""
        for t in (*self._tools.values(), *self.surfaces):
            t.registry = registry

    def get(self, name: str) -> PlanTool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[PlanTool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"<DeclaredPipelines {self.names()}>"


def _validator(schema: Mapping[str, object], formats: bool = True) -> Any:
    # On first use: jsonschema is slow to import.
    from jsonschema import Draft4Validator, Draft6Validator, Draft7Validator, Draft202012Validator
    from jsonschema.validators import validator_for

    cls = validator_for(schema, default=Draft202012Validator)
    if formats or cls in (Draft4Validator, Draft6Validator, Draft7Validator):
        return validator(schema, default=Draft202012Validator, format_checker=cls.FORMAT_CHECKER)
    return validator(schema, default=Draft202012Validator)


def _path(base: str, path: Any) -> str:
    out = base
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _json(v: object) -> str:
    try:
        return orjson.dumps(v).decode()
    except TypeError:
        return repr(v)
