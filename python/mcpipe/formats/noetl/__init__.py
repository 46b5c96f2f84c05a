"""NoETL playbooks with ``mcp:`` turns (seed 004), compiled into mcpipe pipelines and served as tools.

See ``docs/playbooks.md``. :func:`load_playbook` reads and checks a file; :class:`PlaybookTool` runs one
(and serves it as a tool); :func:`model_problems` / :func:`model_sources` are the server's side of the
config's ``models``, ``workflow`` and ``playbooks``.
"""

from __future__ import annotations

import glob
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
import trio
import yaml

from mcpipe._describe import did_you_mean, json_type
from mcpipe._yaml import compose_yaml, load_yaml
from mcpipe.errors import ConfigError, Problem
from mcpipe.formats.noetl._compile import CODE, Playbook, action_types, compile_playbook
from mcpipe.formats.noetl._run import EVENTS
from mcpipe.kinds import StepPolicy
from mcpipe.models import Models, load_models
from mcpipe.plan import Limits
from mcpipe.tools._base import ToolContext, ToolResult

__all__ = [
    "Playbook",
    "PlaybookTool",
    "PlaybookTools",
    "action_types",
    "compile_playbook",
    "load_playbook",
    "model_problems",
    "model_sources",
]

EventFn = Callable[[dict[str, Any]], None]


def load_playbook(
    path: str | os.PathLike[str],
    *,
    models: Models | None = None,
    policy: StepPolicy | None = None,
    tools: Any = None,
    base_dir: str = ".",
) -> tuple[Playbook | None, list[Problem]]:
    """Read, check and compile a playbook file (``path`` relative to ``base_dir``); problems are located in it
    by line and path (``pb.yaml:14: mcp.turns[2].model``)."""
    name = str(path)
    try:
        text = Path(base_dir, path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        return None, [Problem(name, CODE, f"cannot read: {getattr(e, 'strerror', None) or e}")]
    try:
        raw = load_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{name}:{mark.line + 1}" if mark is not None else name
        return None, [Problem(where, CODE, f"not valid YAML: {getattr(e, 'problem', None) or e}")]
    pb, problems = compile_playbook(raw, models=models, policy=policy, tools=tools)
    if not problems:
        return pb, []
    lines = _line_finder(text)
    return pb, [Problem(_where(name, lines(p.location), p.location), p.code, p.message) for p in problems]


def _where(name: str, line: int | None, location: str) -> str:
    head = f"{name}:{line}" if line is not None else name
    return f"{head}: {location}" if location else head


_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _line_finder(text: str) -> Callable[[str], int | None]:
    """``location -> line`` (1-based) in the YAML ``text``: the line of the deepest node the location reaches
    (a missing key is reported at its parent)."""
    try:
        root = compose_yaml(text)
    except yaml.YAMLError:
        root = None

    def line(location: str) -> int | None:
        node = root
        if node is None or not location:
            return None
        at = node.start_mark.line
        for key, index in _TOKEN.findall(location):
            child = None
            if index and isinstance(node, yaml.SequenceNode) and int(index) < len(node.value):
                child = node.value[int(index)]
                at = child.start_mark.line
            elif key and isinstance(node, yaml.MappingNode):
                for k, v in node.value:
                    if isinstance(k, yaml.ScalarNode) and k.value == key:
                        child, at = v, k.start_mark.line
                        break
            if child is None:
                break
            node = child
        return at + 1

    return line


class _NoTools:
    def __contains__(self, name: object) -> bool:
        return False

    def allows(self, name: str, ctx: Any) -> bool:
        return True

    async def call(self, name: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult.error(f"UNKNOWN_TOOL: no tools here ('{name}')")


class PlaybookTool:
    """One playbook, runnable and served as a tool named by ``metadata.name``.

    The call's arguments are the playbook's ``input``; the answer is the last step's result (the final
    turn's ``data`` when it has an ``output_schema``, else its text).

    Attributes:
        background: a direct call is queued on the run queue and answered with its run id; the run's events
            (``pipe_events``) carry the playbook's own (tool calls of turns, saved turns) between its steps'.
        task_support: how it runs as an MCP task (``optional``, ``required``, ``forbidden``).
    """

    def __init__(
        self,
        playbook: Playbook,
        *,
        limits: Limits | None = None,
        registry: Any = None,
        background: bool = False,
        task_support: str = "optional",
    ) -> None:
        self.playbook = playbook
        self.background = background
        self.task_support = task_support
        self.name = playbook.name
        self.title = playbook.name
        self.description = playbook.description or f"Playbook {playbook.path}"
        self.input_schema: dict[str, Any] = {
            "type": "object",
            "properties": {n: {} for n in playbook.inputs},
            "additionalProperties": True,
        }
        self.output_schema: dict[str, Any] | None = None
        self.limits = limits or Limits()
        if registry is not None:
            playbook.registry = registry

    def bind(self, registry: Any) -> None:
        """Make the playbook's ``tool`` actions call through ``registry`` (the gateway)."""
        self.playbook.registry = registry

    def check_args(self, args: Any) -> tuple[dict[str, Any], list[str]]:
        """The arguments, and what is wrong with them (checked before a background run is queued)."""
        if not isinstance(args, dict):
            return {}, [f"args must be an object, got {json_type(args)}"]
        return args, []

    async def run(
        self, args: Mapping[str, Any], ctx: ToolContext | None = None, *, on_event: EventFn | None = None
    ) -> dict[str, Any]:
        """Run the playbook; answers the pipeline answer (``ok``, ``result``, ``steps``, ``summary``...) with
        ``answer``, the playbook's result. Events go to ``on_event``: ``started``, then ``step_started`` /
        ``step_finished`` per step (``resource``, ``model_turn``, ``action``), ``tool_call_started`` /
        ``tool_call_finished`` inside turns, ``turn_saved``, and ``completed`` or ``failed``."""
        from mcpipe.runtime import run_compiled

        base = ctx if ctx is not None else ToolContext()
        run_ctx = base.for_step(None, base.step)
        if on_event is not None:
            on_event({"type": "started", "playbook": self.name, "path": self.playbook.path})
        plan = self.playbook.plan
        assert plan is not None
        registry = self.playbook.registry if self.playbook.registry is not None else base.tools
        if registry is None:
            registry = _NoTools()
        run_ctx = replace(run_ctx, tools=registry)
        token = EVENTS.set(_with_run_log(on_event, base))
        try:
            answer = await run_compiled(
                plan, registry, context=run_ctx, limits=self.limits, on_event=on_event, args=dict(args)
            )
        finally:
            EVENTS.reset(token)
        result = answer["result"]
        if isinstance(result, dict) and "text" in result and "data" in result:
            result = result["data"] if result["data"] is not None else result["text"]
        answer["answer"] = result if answer["ok"] else None
        if on_event is not None:
            if answer["ok"]:
                on_event({"type": "completed", "playbook": self.name, "duration_ms": answer["duration_ms"]})
            else:
                on_event(
                    {
                        "type": "failed",
                        "playbook": self.name,
                        "error": answer["error"],
                        "error_code": answer["error_code"],
                    }
                )
        return answer

    async def call(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if not isinstance(args, dict):
            return ToolResult.error(f"invalid arguments for tool '{self.name}': args must be an object")
        if ctx.has_progress:
            answer = await self._run_with_progress(args, ctx)
        else:
            answer = await self.run(args, ctx)
        if not answer["ok"]:
            return ToolResult.error(f"{answer['error_code']}: {answer['error']}")
        result = answer["answer"]
        if isinstance(result, str):
            return ToolResult.text(result)
        text = orjson.dumps(result).decode()
        return ToolResult([{"type": "text", "text": text}], result if isinstance(result, dict) else None)

    async def _run_with_progress(self, args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """Run, turning finished steps and tool calls into progress notifications (strictly increasing: the
        finished steps, plus thousandths for the tool calls of the running turn). Events arrive synchronously
        and must not block, so one task sends them, in order."""
        send, recv = trio.open_memory_channel[dict[str, Any]](math.inf)
        done, last, total = 0.0, -1.0, None

        async def pump() -> None:
            nonlocal done, last, total
            async for event in recv:
                kind = event["type"]
                if kind == "step_finished":
                    done, total = float(event["completed"]), event["total"]
                    status = "ok" if event["ok"] else event["error_code"]
                    value, message = done, f"step {event['id']} finished ({status})"
                elif kind == "tool_call_finished":
                    value = min(last + 0.001, done + 0.999)
                    message = f"tool {event['tool']} called ({'ok' if event['ok'] else 'failed'})"
                else:
                    continue
                if value > last:
                    last = value
                    await ctx.report_progress(round(value, 3), total, message)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump)
            try:
                return await self.run(args, ctx, on_event=send.send_nowait)
            finally:
                send.close()


_OWN_EVENTS = frozenset({"tool_call_started", "tool_call_finished", "turn_saved"})
"""The playbook's events beside the scheduler's step events: a queued run writes them to its event log."""


def _with_run_log(on_event: EventFn | None, ctx: ToolContext) -> EventFn | None:
    """``on_event``, and for a queued run (a durable record with an event log) the playbook's own events
    written to the run's log too, where ``pipe_events`` shows them between the steps' ``step_started`` and
    ``step_finished`` (which the record writes itself)."""
    record = ctx.interaction
    log = getattr(record, "events", None) if record is not None and record.durable else None
    if log is None:
        return on_event
    ns = str(getattr(record, "ns", "")) + (f"{ctx.step}/" if ctx.step else "")

    def emit(event: dict[str, Any]) -> None:
        if event["type"] in _OWN_EVENTS:
            fields = {k: v for k, v in event.items() if k not in ("type", "id")}
            log.add(event["type"], path=ns + str(event.get("id")), **fields)
        if on_event is not None:
            on_event(event)

    return emit


class PlaybookTools:
    """The config's playbooks as a tool source (``get``, iteration, ``in``)."""

    def __init__(self, tools: list[PlaybookTool]) -> None:
        self._tools = {t.name: t for t in tools}

    def get(self, name: str) -> PlaybookTool | None:
        return self._tools.get(name)

    def __iter__(self) -> Iterator[PlaybookTool]:
        return iter(self._tools.values())

    def __contains__(self, name: object) -> bool:
        return name in self._tools


_TASK_SUPPORT = ("optional", "required", "forbidden")


@dataclass(frozen=True)
class Serving:
    """How the playbooks of one ``playbooks`` entry are served.

    Attributes:
        background: a call is queued on the run queue and answered with its run id (``docs/runs.md``).
        task_support: as an MCP task (``optional``, ``required``, ``forbidden``), as for declared pipelines.
    """

    background: bool = False
    task_support: str = "optional"


def _serving(entry: Any, where: str, problems: list[Problem]) -> tuple[str | None, Serving]:
    """The glob of one ``playbooks`` entry (a string, or a table with ``files``) and how it is served."""
    if isinstance(entry, str):
        return entry, Serving()
    if not isinstance(entry, Mapping):
        problems.append(Problem(where, "INVALID_CONFIG", f"must be a glob or a table, got {json_type(entry)}"))
        return None, Serving()
    keys = ("files", "background", "task_support")
    for k in entry:
        if k not in keys:
            problems.append(Problem(f"{where}.{k}", "INVALID_CONFIG", f"unknown key `{k}`{did_you_mean(k, keys)}"))
    files = entry.get("files")
    if not isinstance(files, str) or not files:
        problems.append(Problem(f"{where}.files", "INVALID_CONFIG", "is required: a glob of playbook files"))
        files = None
    background = entry.get("background", False)
    if not isinstance(background, bool):
        problems.append(
            Problem(f"{where}.background", "INVALID_CONFIG", f"expected a bool, got {json_type(background)}")
        )
        background = False
    support = entry.get("task_support", "optional")
    if support not in _TASK_SUPPORT:
        problems.append(
            Problem(
                f"{where}.task_support",
                "INVALID_CONFIG",
                f"expected one of {', '.join(_TASK_SUPPORT)}, got {support!r}",
            )
        )
        support = "optional"
    return files, Serving(background, support)


def _playbook_files(config: Any) -> tuple[list[tuple[str, Serving]], list[Problem]]:
    files: list[tuple[str, Serving]] = []
    problems: list[Problem] = []
    for i, entry in enumerate(getattr(config, "playbooks", None) or []):
        where = f"playbooks[{i}]"
        pattern, serving = _serving(entry, where, problems)
        if pattern is None:
            continue
        full = os.path.join(getattr(config, "base_dir", "."), os.path.expanduser(pattern))
        found = sorted(glob.glob(full))
        if not found:
            at = where if isinstance(entry, str) else f"{where}.files"
            problems.append(Problem(at, "INVALID_CONFIG", f"no file matches `{pattern}`"))
        files += [(f, serving) for f in found]
    return files, problems


def _load_all(config: Any, tools: Any) -> tuple[Models, Any, list[PlaybookTool], list[Problem]]:
    from mcpipe.declared import load_outbound
    from mcpipe.workflow import load_workflow

    presets, problems = load_models(getattr(config, "models", None) or {})
    models = Models(presets)
    workflow, wp = load_workflow(getattr(config, "workflow", None), models)
    problems += wp
    policy, _ = load_outbound(getattr(config, "outbound", None))
    files, fp = _playbook_files(config)
    problems += fp
    loaded: list[PlaybookTool] = []
    names: dict[str, str] = {}
    # The server's pipeline limits (deadline, output and answer sizes); the step count is the playbook's own.
    p = getattr(config, "pipe", None)
    limits = p.limits() if p is not None and hasattr(p, "limits") else Limits()
    base = getattr(config, "base_dir", ".")
    for f, serving in files:
        pb, pp = load_playbook(os.path.relpath(f, base), models=models, policy=policy, tools=tools, base_dir=base)
        problems += pp
        if pb is None:
            continue
        if pb.name in names:
            problems.append(
                Problem(f"{f}: metadata.name", CODE, f"playbook `{pb.name}` is also defined in {names[pb.name]}")
            )
            continue
        names[pb.name] = f
        loaded.append(PlaybookTool(pb, limits=limits, background=serving.background, task_support=serving.task_support))
    return models, workflow, loaded, problems


def model_problems(config: Any) -> list[Problem]:
    """Every problem of the config's ``models``, ``workflow`` and ``playbooks`` (the files read and checked)."""
    return _load_all(config, None)[3]


def model_sources(config: Any) -> list[Any]:
    """The tool sources of the config's ``workflow`` and ``playbooks`` (a playbook's ``tool`` actions call
    through the gateway the call comes in by, ``ctx.tools``).

    Raises:
        mcpipe.errors.ConfigError: listing every problem.
    """
    models, workflow, playbooks, problems = _load_all(config, None)
    if problems:
        raise ConfigError(problems)
    out: list[Any] = []
    if workflow is not None and workflow.enabled:
        from mcpipe.workflow import Workflow, WorkflowTool

        out.append(WorkflowTool(Workflow(workflow, models)))
    if playbooks:
        out.append(PlaybookTools(playbooks))
    return out
