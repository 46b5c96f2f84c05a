"""A declared pipeline served as a tool, and the declared pipelines of a config as a tool source."""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator, Mapping
from typing import Any

import msgspec
import orjson
import trio

from mcpipe._describe import json_type
from mcpipe._jsonschema import needs_thread, validator
from mcpipe.declared._answers import AnswerShape, answer_shape
from mcpipe.declared._config import PipelineConfig
from mcpipe.declared._content import content_blocks
from mcpipe.declared._fastschema import compile_fast
from mcpipe.errors import ErrorCode
from mcpipe.kinds import StepPolicy
from mcpipe.plan import CompiledSpec, Limits
from mcpipe.runtime import inline_tool_calls, run_compiled
from mcpipe.tools import ToolContext, ToolResult

__all__ = ["DeclaredPipelineTool", "DeclaredPipelines", "KnownTools"]


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


class DeclaredPipelineTool:
    """One declared pipeline, served as a tool.

    Attributes:
        name, title, description, input_schema, output_schema: as ``tools/list`` shows them.
        location: where it was declared (``pipelines.charge``).
        compiled: the plan, compiled once, with its tool sites and leaf count.
        limits: the server's limits it runs under.
        registry: what its ``tool`` steps call through (set by :meth:`DeclaredPipelines.bind`).
        background: a direct call is queued as a background run (the server answers its run id).
        task_support: how it runs as an MCP task (``optional``, ``required``, ``forbidden``).
        ask_before_task: a task call asks its client synchronously first (``PipelineConfig``).
        annotations: its MCP tool annotations, or None.
        answer: how its run becomes its answer (an answer shape, :mod:`mcpipe.declared._answers`).
        surface, uri, uri_template, mime_type, arguments, completions, listing, watch, meta: what it serves
            (``PipelineConfig``).
    """

    __slots__ = (
        "_defaults",
        "_fast",
        "_has_content",
        "_has_output",
        "_in_thread",
        "_output_in_thread",
        "_output_validator",
        "_validator",
        "annotations",
        "answer",
        "arguments",
        "ask_before_task",
        "background",
        "compiled",
        "completions",
        "description",
        "input_schema",
        "limits",
        "listing",
        "location",
        "meta",
        "mime_type",
        "name",
        "output_schema",
        "registry",
        "surface",
        "task_support",
        "title",
        "uri",
        "uri_template",
        "watch",
    )

    def __init__(
        self,
        entry: PipelineConfig,
        compiled: CompiledSpec,
        location: str,
        limits: Limits,
        *,
        registry: Any = None,
    ) -> None:
        self.name = entry.name
        self.title = entry.title
        self.description = entry.description
        self.input_schema = entry.input_schema
        self.output_schema = entry.output_schema
        self.location = location
        self.compiled = compiled
        self.limits = limits
        self.registry = registry
        self.background = entry.background
        self.task_support = entry.task_support
        self.ask_before_task = entry.ask_before_task
        self.annotations = entry.annotations
        shape = answer_shape(entry.answer)
        if shape is None:
            raise ValueError(f"no answer shape named {entry.answer!r}")
        self.answer: AnswerShape = shape
        self.surface = entry.surface
        self.uri = entry.uri
        self.uri_template = entry.uri_template
        self.mime_type = entry.mime_type
        self.arguments = [msgspec.to_builtins(a) for a in entry.arguments]
        self.meta = entry.meta
        self.completions = dict(entry.completions)
        self.listing = entry.listing
        self.watch = entry.watch
        self._has_output = entry.output is not msgspec.UNSET
        self._has_content = entry.content is not msgspec.UNSET
        self._validator = _validator(entry.input_schema, entry.check_formats)
        self._fast = compile_fast(entry.input_schema)
        self._output_validator = _validator(entry.output_schema) if entry.output_schema is not None else None
        # A schema with a pattern only the fallback engine takes is validated off the event loop.
        self._in_thread = needs_thread(entry.input_schema)
        self._output_in_thread = entry.output_schema is not None and needs_thread(entry.output_schema)
        props = entry.input_schema.get("properties")
        self._defaults = (
            {k: v["default"] for k, v in props.items() if isinstance(v, Mapping) and "default" in v}
            if isinstance(props, Mapping) and entry.fill_defaults
            else {}
        )

    def __repr__(self) -> str:
        return f"<DeclaredPipelineTool {self.name}>"

    def check_args(self, args: Any) -> tuple[dict[str, Any], list[str]]:
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

    def schema_errors(self, args: Any) -> list[Any]:
        """Every way ``args`` breaks the input schema, as the validator reports them (``jsonschema``'s
        ``ValidationError``s, in its order)."""
        return list(self._validator.iter_errors(args))

    async def check_args_async(self, args: Any) -> tuple[dict[str, Any], list[str]]:
        """:meth:`check_args`, in a thread when the input schema has a pattern only the fallback engine
        takes (its deadline must not hold the event loop)."""
        if not self._in_thread:
            return self.check_args(args)
        return await trio.to_thread.run_sync(self.check_args, args)

    async def call(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Validate ``args``, run the steps, and answer the ``output``/``content`` (or the failure)."""
        given = args
        args, errors = await self.check_args_async(args)
        if errors:
            return self.answer.invalid(self, errors, given)
        # Bound to a registry, or else the one the call came through (the gateway, or the run's registry).
        registry = self.registry if self.registry is not None else ctx.tools
        if registry is None:
            return ToolResult.error(
                f"{ErrorCode.TOOL_FAILED}: declared pipeline '{self.name}' is not bound to a tool registry"
            )
        # A run of its own (a fresh pipeline id), on behalf of the same caller and request; the calling step
        # (if a step called it) stays known, so a run that asks the client keys its steps under it.
        run_ctx = ctx.for_step(None, ctx.step)
        answer = await run_compiled(self.compiled, registry, context=run_ctx, limits=self.limits, args=args)
        if self._output_in_thread:  # its output_schema has a pattern only the fallback engine takes
            return await trio.to_thread.run_sync(self.answer.tool, self, answer)
        return self.answer.tool(self, answer)

    def inline_tools(self) -> tuple[str, ...] | None:
        """The tools a call calls, when calling them (in the event loop) is all it does; else None
        (:func:`mcpipe.runtime.inline_tool_calls`; its checks run in a thread, or it runs in the background)."""
        if self._in_thread or self._output_in_thread or self.background:
            return None
        return inline_tool_calls(self.compiled)

    def shape(self, result: dict[str, Any]) -> ToolResult:
        """The tool's answer from the resolved ``{"output": ..., "content": ...}``."""
        output = result["output"]
        if self._has_content:
            blocks, problem = content_blocks(result["content"])
            if problem is not None:
                return ToolResult.error(f"{ErrorCode.INVALID_OUTPUT}: {self.location}.content: {problem}")
            structured = output if self._has_output and isinstance(output, dict) else None
            if structured is not None and (bad := self._check_output(structured)) is not None:
                return bad
            return ToolResult(blocks, structured)
        if isinstance(output, str):
            if self.output_schema is not None:
                return ToolResult.error(
                    f"{ErrorCode.INVALID_OUTPUT}: {self.location}.output: a string,"
                    " but the tool declares an output_schema"
                )
            return ToolResult.text(output)
        if isinstance(output, dict):
            if (bad := self._check_output(output)) is not None:
                return bad
            return ToolResult([{"type": "text", "text": orjson.dumps(output).decode()}], output)
        if self.output_schema is not None:
            return ToolResult.error(
                f"{ErrorCode.INVALID_OUTPUT}: {self.location}.output: {json_type(output)},"
                " but the output_schema needs an object"
            )
        return ToolResult.text(orjson.dumps(output).decode())

    def _check_output(self, structured: dict[str, Any]) -> ToolResult | None:
        if self._output_validator is None:
            return None
        errors = sorted(self._output_validator.iter_errors(structured), key=lambda e: list(map(str, e.absolute_path)))
        if not errors:
            return None
        where = "; ".join(f"{_path('output', e.absolute_path)}: {e.message}" for e in errors)
        return ToolResult.error(f"{ErrorCode.INVALID_OUTPUT}: the output does not match the output_schema: {where}")


class DeclaredPipelines:
    """The declared pipelines of a config, as a tool source (``get``, iteration, ``in``, ``names``).

    Put it among the gateway's sources, then :meth:`bind` the gateway, so the pipelines' ``tool`` steps
    call through it (auth, audit, cost) and can reach every tool: Python, downstream, another pipeline.
    """

    def __init__(self, tools: list[DeclaredPipelineTool] | None = None, policy: StepPolicy | None = None) -> None:
        self._tools = {t.name: t for t in tools or () if t.surface == "tool"}
        self.surfaces = [t for t in tools or () if t.surface != "tool"]
        """The pipelines served as prompts, resources and resource templates (not tools), and the hidden ones
        they run (completion sources, listings), in config order."""
        self.policy = policy or StepPolicy()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Own the shared connections of ``nats``, ``grpc`` and ``kafka`` steps until cancelled (then close
        them): ``await nursery.start(declared.run)``, as the server does beside its other services."""
        await self.policy.connections.run(task_status=task_status)

    async def aclose(self) -> None:
        """Close the connections the steps opened (SQL pools, ...); the server calls this when it stops."""
        await self.policy.aclose()

    def bind(self, registry: Any) -> None:
        """Make every pipeline's ``tool`` steps call through ``registry`` (``get``/``allows``/``call``)."""
        for t in (*self._tools.values(), *self.surfaces):
            t.registry = registry

    def get(self, name: str) -> DeclaredPipelineTool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[DeclaredPipelineTool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"<DeclaredPipelines {self.names()}>"


def _validator(schema: Mapping[str, Any], formats: bool = True) -> Any:
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


def _json(v: Any) -> str:
    try:
        return orjson.dumps(v).decode()
    except TypeError:
        return repr(v)
