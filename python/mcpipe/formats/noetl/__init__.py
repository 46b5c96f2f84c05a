"""NoETL's playbooks, read as they are (both layouts), and seed 004's ``mcp:`` turns on top: compiled into
mcpipe's one plan, run by the scheduler, served as tools.

See ``docs/playbooks.md`` and ``docs/formats/noetl.md``. :func:`load_playbook` reads and checks a file (a
NoETL playbook, or a playbook made of seed 004 turns); :func:`playbook_tool` runs one and serves it as a
tool (a :class:`~mcpipe.declared.PlanTool` in the :class:`PlaybookDialect`); :func:`load_playbooks` is the
server's side of the config's ``playbooks`` (:class:`Playbooks`: the section decoded, its tools compiled once
per load), which the format's registration (:mod:`._format`) serves.

- :mod:`._layout`: NoETL's two layouts read into one model; :mod:`._workflow`: that model compiled into a
  plan (a :class:`~mcpipe.plan.Graph`), each tool kind onto what runs it (:mod:`.toolkinds` for
  ``python``, ``postgres``, ``duckdb`` and ``shell``); :mod:`._steps`: how a step runs (its template scope,
  tasks, policy rules, ``set``, arcs); :mod:`._serve`: a run and its answer in NoETL's shape;
  :mod:`._catalog`: where ``playbook`` tasks find playbooks; :mod:`._tmpl`: NoETL's template rules.
- :mod:`._compile` and :mod:`._run`: seed 004's ``mcp:`` section (models, tools, resources, prompts, turns).
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson
import yaml

from mcpipe._describe import did_you_mean, json_type
from mcpipe._lazy import lazy_names
from mcpipe._struct import Strict
from mcpipe._yaml import compose_yaml, load_yaml
from mcpipe.declared import PlanCall, PlanTool, ToolDialect
from mcpipe.errors import Problem
from mcpipe.formats.noetl._catalog import Catalog
from mcpipe.formats.noetl._layout import CODE, read_doc
from mcpipe.formats.noetl._serve import registry_of, run_noetl, run_plan
from mcpipe.formats.noetl._tmpl import problem_order
from mcpipe.formats.noetl._workflow import NoetlPlaybook, compile_workflow
from mcpipe.kinds import StepPolicy
from mcpipe.plan import Limits
from mcpipe.tools import ToolContext, ToolResult

if TYPE_CHECKING:
    from mcpipe.formats.noetl._compile import Playbook, action_types, compile_playbook
    from mcpipe.models import Models

# Seed 004's `mcp:` front-end (its turns, models and SQL bindings) is loaded when a file has an `mcp:` section
# or a workbook, so a run of a NoETL playbook without one does not import it.
__getattr__ = lazy_names(__name__, dict.fromkeys(["Playbook", "action_types", "compile_playbook"], "._compile"))

__all__ = [
    "Catalog",
    "NoetlPlaybook",
    "Playbook",
    "PlaybookDialect",
    "PlaybookEntry",
    "PlaybookFiles",
    "PlaybookTools",
    "Playbooks",
    "action_types",
    "compile_noetl",
    "compile_playbook",
    "decode_playbooks",
    "load_playbook",
    "load_playbooks",
    "playbook_of",
    "playbook_tool",
    "reached_tools",
]

EventFn = Callable[[dict[str, Any]], None]


def load_playbook(
    path: str | os.PathLike[str],
    *,
    models: Models | None = None,
    policy: StepPolicy | None = None,
    tools: Container[str] | None = None,
    base_dir: str = ".",
    catalog: Catalog | None = None,
    scan: list[str] | None = None,
    known: dict[str, str] | None = None,
    roots: list[str] | None = None,
    stack: tuple[str, ...] = (),
) -> tuple[Playbook | NoetlPlaybook | None, list[Problem]]:
    """Read, check and compile a playbook file (``path`` relative to ``base_dir``); problems are located in it
    by line and path (``pb.yaml:14: workflow[2].tool.kind``).

    A file whose steps are seed 004's (``mcp:`` turns, ``workbook`` actions on mcpipe's kinds) compiles as
    today (:class:`Playbook`); any other NoETL playbook compiles into a :class:`NoetlPlaybook`. ``catalog``
    is where its ``playbook`` tasks look (default: ``known`` catalog paths, then the playbooks under
    ``roots``, by path from ``base_dir`` or a root, and by ``metadata.path`` in the file's directory and
    under ``scan``'s directories; ``roots`` default to ``base_dir`` and the file's directory, ``scan``'s
    directories are roots too: :mod:`mcpipe.formats.noetl._catalog`). ``stack``: the identities of the
    playbooks running this one (:func:`~mcpipe.formats.noetl._catalog.identity`), for a sub-playbook."""
    name = str(path)
    full = os.path.join(base_dir, name)
    try:
        text = Path(full).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        return None, [Problem(name, CODE, f"cannot read: {getattr(e, 'strerror', None) or e}")]
    try:
        raw = load_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{name}:{mark.line + 1}" if mark is not None else name
        return None, [Problem(where, CODE, f"not valid YAML: {getattr(e, 'problem', None) or e}")]
    pb: Playbook | NoetlPlaybook | None
    if is_seed(raw):
        from mcpipe.formats.noetl._compile import compile_playbook

        pb, problems = compile_playbook(raw, models=models, policy=policy, tools=tools)
    else:

        def compile_child(file: str, chain: tuple[str, ...]) -> tuple[Any, list[Problem]]:
            rel = os.path.relpath(file, base_dir)
            return load_playbook(
                rel, models=models, policy=policy, tools=tools, base_dir=base_dir, catalog=cat, scan=scan, stack=chain
            )

        if catalog is None:
            cat = Catalog.around(compile_child, full, scan, known, roots, base=base_dir)
            catalog = cat
        pb, problems = compile_noetl(
            raw, models=models, policy=policy, tools=tools, catalog=catalog, file=full, stack=stack
        )
        if pb is not None:
            pb.root = os.path.abspath(base_dir)
    if not problems:
        return pb, []
    lines = _line_finder(text)
    return pb, [Problem(_where(name, lines(p.location), p.location), p.code, p.message) for p in problems]


_SEED_STEP = frozenset({"step", "desc", "description", "next", "type", "task", "turn"})


def is_seed(raw: object) -> bool:
    """Whether a decoded playbook is one of seed 004's own: an ``mcp:`` section (or no NoETL
    ``apiVersion``/``kind``) and, if any, a workflow of ``workbook``/``mcp`` steps naming its actions and
    turns. Those compile as they always have; every other playbook is NoETL's."""
    if not isinstance(raw, Mapping) or "metadata" not in raw:
        return False
    if "mcp" not in raw and ("apiVersion" in raw or "kind" in raw):
        return False
    workflow = raw.get("workflow")
    if isinstance(workflow, list):
        for s in workflow:
            if not isinstance(s, Mapping) or not set(s) <= _SEED_STEP:
                return False
            if s.get("type") not in (None, "workbook", "mcp", "start", "end") or isinstance(s.get("task"), Mapping):
                return False
            if isinstance(s.get("next"), Mapping) and "arcs" in s["next"]:
                return False
    book = raw.get("workbook")
    if isinstance(book, list):
        from mcpipe.formats.noetl._compile import action_types

        kinds = action_types()
        return all(a.get("type") in kinds for a in book if isinstance(a, Mapping))
    return True


def compile_noetl(
    raw: object,
    *,
    models: Models | None = None,
    policy: StepPolicy | None = None,
    tools: Container[str] | None = None,
    catalog: Catalog | None = None,
    file: str = "",
    stack: tuple[str, ...] = (),
) -> tuple[NoetlPlaybook | None, list[Problem]]:
    """Check and compile a NoETL playbook (already decoded from YAML), in either layout; an ``mcp:``
    section's turns become steps it can run (``type: mcp`` + ``turn``, or ``tool: {kind: mcp, turn}``).

    Returns:
        The playbook (None when there are problems) and every problem, located.
    """
    if not isinstance(raw, Mapping):
        return None, [Problem("", CODE, f"must be an object, got {json_type(raw)}")]
    from mcpipe.formats.noetl._engines import engine_of

    engine = engine_of(raw)
    pb, found = engine.compile(
        raw, models=models, policy=policy or StepPolicy(), tools=tools, catalog=catalog, file=file, stack=stack
    )
    if found:
        return None, sorted(found, key=problem_order)
    pb.name = _served(pb.name) or engine.unnamed
    return pb, []


def compile_today(
    raw: Mapping[str, object],
    *,
    models: Models | None,
    policy: StepPolicy,
    tools: Container[str] | None,
    catalog: Catalog | None,
    file: str,
    stack: tuple[str, ...],
) -> tuple[NoetlPlaybook | None, list[Problem]]:
    """A playbook of today's engine (``noetl.io/v2`` or the layout before it, :mod:`._engines`), compiled; a
    file of a prototype that ran nothing is refused (why, with the commit that shows it)."""
    if not isinstance(raw.get("workflow"), list):
        why = _prototype(raw) or "not a NoETL playbook: it has no `workflow` (a list of steps)"
        if "mcp" in raw:
            why = "an `mcp:` playbook needs `metadata` (`name`, `path`) and turns, or a NoETL `workflow`"
        return None, [Problem("workflow", CODE, why)]
    doc = read_doc(raw)
    problems = list(doc.problems)
    mcp = None
    if "mcp" in raw:
        seed = {
            "metadata": {"name": _served(doc.name) or "playbook", "path": doc.path or "playbook"},
            "workload": doc.workload,
            "mcp": raw["mcp"],
        }
        from mcpipe.formats.noetl._compile import compile_playbook

        mcp, found = compile_playbook(seed, models=models, policy=policy, tools=tools)
        problems += found
    pb, found = compile_workflow(doc, policy=policy, tools=tools, catalog=catalog, mcp=mcp, file=file, stack=stack)
    problems += found
    return (None, problems) if problems else (pb, [])


def _prototype(raw: Mapping[str, object]) -> str | None:
    """Why a file of one of NoETL's prototypes without a ``workflow`` list is refused: no engine of its time ran
    it (the commit that shows it), or one did that mcpipe does not read."""
    wf = raw.get("workflow")
    spec = raw.get("spec")
    if isinstance(wf, Mapping) and isinstance(wf.get("tasks"), Mapping):
        return (
            "a workflow of NoETL's 2018 Go prototype, which ran none: its `s3`, `rest` and `aggregate` modules are "
            "stubs that do nothing (flow/modules.go, commit f567ecd4); not supported"
        )
    if isinstance(spec, Mapping) and isinstance(spec.get("tasks"), Mapping):
        return (
            "a workflow of NoETL's 2023 NATS prototype, which ran none: its dispatcher logs a workflow's events and "
            "sends no task to a handler (noetl/dispatcher.py, `generate_workflow_command`, commit edbc1064); not "
            "supported"
        )
    if raw.get("type") == "Playbook" and isinstance(raw.get("tasks"), list):
        return (
            "a playbook of NoETL's 2024 plugin prototype, which ran none: the repository held no plugin for its "
            "steps (`http-requests`, `shell`), only a template loader and state-transition checks (noetl/playbook.py, "
            "commit e0073283); not supported"
        )
    if isinstance(raw.get("steps"), list) and isinstance(raw.get("tasks"), list) and "environment" in raw:
        return (
            "a playbook of NoETL's job runtime of April-May 2025 (noetl/dsl: Job, Step, Task, Action, driven by a "
            "payload), which mcpipe does not read; not supported"
        )
    return None


def _served(name: str) -> str:
    """A NoETL playbook's name as a tool name (letters, digits, ``_``, ``-``, ``.``; at most 64)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64]


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


def reached_tools(playbook: Playbook | NoetlPlaybook) -> tuple[str, ...]:
    """The names of the gateway tools a playbook's steps call, in the order they are written: a NoETL step's
    ``kind: tool`` tasks, a seed 004 ``tool`` action (a workbook action, a resource, a tool its turns offer the
    model), and those of each sub-playbook a ``playbook`` task names by a fixed path (one named by a template is
    known only when it runs: its tools are checked as each is called). Other kinds (``http``, ``python``,
    ``postgres``...) call no gateway tool."""
    found: dict[str, None] = {}
    seen: set[int] = set()
    todo: list[Playbook | NoetlPlaybook] = [playbook]
    while todo:
        pb = todo.pop()
        if id(pb) in seen:
            continue
        seen.add(id(pb))
        steps: list[object]
        if isinstance(pb, NoetlPlaybook):
            tasks = [t for s in pb.steps.values() for t in s.tasks]
            steps = [t.parts.get("step") for t in tasks if t.runner == "kind"]
            todo += [t.parts["child"] for t in tasks if t.runner == "playbook" and t.parts.get("child") is not None]
            todo += [pb.mcp] if pb.mcp is not None else []
        else:
            steps = [a.step for a in (*pb.workbook.values(), *pb.resources.values(), *pb.tools.values())]
        found.update((tool, None) for s in steps if isinstance(tool := getattr(s, "tool", None), str))
    return tuple(found)


class PlaybookDialect(ToolDialect):
    """NoETL's playbooks (and seed 004's) as a :class:`~mcpipe.declared.PlanTool` dialect.

    The call's arguments are the playbook's ``input`` (seed 004) and NoETL's execution payload, laid over
    the ``workload``. The answer of a playbook with turns is its last step's result (the final turn's
    ``data`` when it has an ``output_schema``, else its text); a NoETL playbook's is the run in NoETL's
    shape (``playbook``, ``status``, ``steps``, ``failed_steps``, ``final``). A call with a progress token
    reports each finished step and tool call; a queued run's events (``pipe_events``) carry the playbook's own
    (tool calls of turns, saved turns, step results) between its steps'.

    Attributes:
        playbook: the playbook, compiled.
        reached: the gateway tools its steps call (``kind: tool`` tasks, ``tool`` actions, the tools its turns
            offer, those of the sub-playbooks its ``playbook`` tasks name): a call needs their scopes too,
            checked before it runs (:meth:`mcpipe.gateway.Gateway.needed_scopes`).
    """

    may_ask = True
    reports_progress = True

    def __init__(self, playbook: Playbook | NoetlPlaybook) -> None:
        self.playbook = playbook
        self.reached = reached_tools(playbook)

    def reaches(self, tool: PlanTool) -> tuple[str, ...]:
        return self.reached

    def bind(self, tool: PlanTool, registry: object) -> None:
        """Make the playbook's ``tool`` actions call through ``registry`` (the gateway)."""
        self.playbook.registry = registry

    def check_args(self, tool: PlanTool, args: object) -> tuple[dict[str, Any], list[str]]:
        """The arguments, and what is wrong with them (checked before a background run is queued)."""
        if not isinstance(args, dict):
            return {}, [f"args must be an object, got {json_type(args)}"]
        return args, []

    def invalid(self, tool: PlanTool, errors: list[str], args: object) -> ToolResult:
        return ToolResult.error(f"invalid arguments for tool '{tool.name}': args must be an object")

    def registry(self, tool: PlanTool, ctx: ToolContext) -> Any:
        """The registry the playbook is bound to, else the call's, else none at all (every tool unknown)."""
        return registry_of(self.playbook, ctx)

    async def execute(
        self, tool: PlanTool, call: PlanCall, registry: Any, ctx: ToolContext, on_event: EventFn | None = None
    ) -> dict[str, Any]:
        """Run the playbook; answers the pipeline answer (``ok``, ``result``, ``steps``, ``summary``...) with
        ``answer``, the playbook's result (a NoETL playbook's: also ``noetl``, the run in NoETL's shape).
        Events go to ``on_event``: ``started``, then ``step_started`` / ``step_finished`` per step (a NoETL
        step's ``step_exit`` with its result between them; a turn's ``tool_call_started`` /
        ``tool_call_finished`` and ``turn_saved``), and ``completed`` or ``failed``."""
        args = call.args
        if on_event is not None:
            on_event({"type": "started", "playbook": tool.name, "path": self.playbook.path})
        pb, events = self.playbook, _with_run_log(on_event, ctx)
        if isinstance(pb, NoetlPlaybook):
            answer = await run_noetl(pb, args, ctx, limits=tool.limits, on_event=events)
            answer["answer"] = answer["noetl"]
        else:
            assert pb.plan is not None
            answer = await run_plan(pb.plan, registry, ctx, tool.limits, dict(args), on_event, events)
            result = answer["result"]
            if isinstance(result, dict) and "text" in result and "data" in result:
                result = result["data"] if result["data"] is not None else result["text"]
            answer["answer"] = result if answer["ok"] else None
        if on_event is not None and answer["ok"]:
            on_event({"type": "completed", "playbook": tool.name, "duration_ms": answer["duration_ms"]})
        elif on_event is not None:
            failed = {"error": answer["error"], "error_code": answer["error_code"]}
            on_event({"type": "failed", "playbook": tool.name, **failed})
        return answer

    async def answer(self, tool: PlanTool, call: PlanCall, answer: Mapping[str, object]) -> ToolResult:
        if isinstance(self.playbook, NoetlPlaybook):
            shaped, ok = answer["noetl"], bool(answer["ok"])
            text = orjson.dumps(shaped, default=str).decode() if ok else f"{answer['error_code']}: {answer['error']}"
            return ToolResult([{"type": "text", "text": text}], shaped, not ok)
        if not answer["ok"]:
            return ToolResult.error(f"{answer['error_code']}: {answer['error']}")
        result = answer["answer"]
        if isinstance(result, str):
            return ToolResult.text(result)
        text = orjson.dumps(result).decode()
        return ToolResult([{"type": "text", "text": text}], result if isinstance(result, dict) else None)


def playbook_tool(
    playbook: Playbook | NoetlPlaybook,
    *,
    limits: Limits | None = None,
    registry: object = None,
    background: bool = False,
    task_support: str = "optional",
) -> PlanTool:
    """One playbook, runnable (``await tool.run(args, on_event=...)``) and served as a tool named by its name
    (``metadata.name``): a :class:`~mcpipe.declared.PlanTool` in the :class:`PlaybookDialect`.

    Args:
        limits: the server's limits (deadline, output and answer sizes); the step count is the playbook's own.
        registry: what its ``tool`` actions call through (None: the registry a call comes in by).
        background: a direct call is queued on the run queue and answered with its run id.
        task_support: how it runs as an MCP task (``optional``, ``required``, ``forbidden``).
    """
    properties: dict[str, Any] = {n: {} for n in playbook.inputs}
    limits = limits or Limits()
    if isinstance(playbook, NoetlPlaybook):
        properties = {n: _schema_of(v) for n, v in playbook.workload.items()}
        playbook.limits = limits
    if registry is not None:
        playbook.registry = registry
    return PlanTool(
        PlaybookDialect(playbook),
        name=playbook.name,
        title=playbook.name,
        description=playbook.description or f"Playbook {playbook.path}",
        input_schema={"type": "object", "properties": properties, "additionalProperties": True},
        compiled=playbook.plan,
        limits=limits,
        background=background,
        task_support=task_support,
    )


def playbook_of(tool: object) -> Playbook | NoetlPlaybook | None:
    """The playbook ``tool`` serves (a :class:`~mcpipe.declared.PlanTool` in the playbook dialect), or None."""
    dialect = getattr(tool, "dialect", None)
    return dialect.playbook if isinstance(dialect, PlaybookDialect) else None


def _schema_of(value: object) -> dict[str, Any]:
    """A workload value's JSON type, as the schema of the argument that overrides it."""
    kind = json_type(value)
    return {"type": kind} if kind in ("string", "boolean", "object", "array") else {}


_OWN_EVENTS = frozenset({"tool_call_started", "tool_call_finished", "turn_saved", "step_exit"})
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

    def __init__(self, tools: list[PlanTool]) -> None:
        self._tools = {t.name: t for t in tools}

    def get(self, name: str) -> PlanTool | None:
        return self._tools.get(name)

    def __iter__(self) -> Iterator[PlanTool]:
        return iter(self._tools.values())

    def __contains__(self, name: object) -> bool:
        return name in self._tools


_TASK_SUPPORT = ("optional", "required", "forbidden")


class PlaybookFiles(Strict):
    """A ``playbooks`` entry written as a table: ``{files = "GLOB", background = true, task_support = "optional"}``.

    Attributes:
        files: a glob of playbook files, relative to the config.
        background: a call is queued on the run queue and answered with its run id (``docs/runs.md``).
        task_support: as an MCP task (``optional``, ``required``, ``forbidden``), as for declared pipelines.
    """

    files: str
    background: bool = False
    task_support: Literal["optional", "required", "forbidden"] = "optional"


PlaybookEntry = str | PlaybookFiles
"""One ``playbooks`` entry: a glob, or a table."""


def decode_playbooks(raw: Sequence[object]) -> tuple[list[PlaybookEntry], list[Problem]]:
    """The ``playbooks`` entries decoded, one for each written (an entry with problems keeps its place, with
    what of it could be read: its glob empty when it has none), and every problem, located."""
    problems: list[Problem] = []
    return [_entry(entry, f"playbooks[{i}]", problems) for i, entry in enumerate(raw)], problems


def _entry(entry: object, where: str, problems: list[Problem]) -> PlaybookEntry:
    if isinstance(entry, str | PlaybookFiles):
        return entry
    if not isinstance(entry, Mapping):
        problems.append(Problem(where, "INVALID_CONFIG", f"must be a glob or a table, got {json_type(entry)}"))
        return ""

    def add(key: str, message: str) -> None:
        problems.append(Problem(f"{where}.{key}", "INVALID_CONFIG", message))

    keys = ("files", "background", "task_support")
    for k in entry:
        if k not in keys:
            add(k, f"unknown key `{k}`{did_you_mean(k, keys)}")
    files = entry.get("files")
    if not isinstance(files, str) or not files:
        add("files", "is required: a glob of playbook files")
        files = ""
    background = entry.get("background", False)
    if not isinstance(background, bool):
        add("background", f"expected a bool, got {json_type(background)}")
        background = False
    support = entry.get("task_support", "optional")
    if support not in _TASK_SUPPORT:
        add("task_support", f"expected one of {', '.join(_TASK_SUPPORT)}, got {support!r}")
        support = "optional"
    return PlaybookFiles(files=files, background=background, task_support=support)


def _playbook_files(
    entries: Sequence[PlaybookEntry], base_dir: str
) -> tuple[list[tuple[str, PlaybookFiles]], list[Problem], list[str]]:
    """The served files (each with how it is served), the problems, and the catalog's roots: the directory of
    each glob (:func:`~mcpipe.formats.noetl._catalog.glob_root`)."""
    from mcpipe.formats.noetl._catalog import glob_root

    files: list[tuple[str, PlaybookFiles]] = []
    problems: list[Problem] = []
    roots: list[str] = []
    for i, entry in enumerate(entries):
        serving = PlaybookFiles(files=entry) if isinstance(entry, str) else entry
        if not serving.files:
            continue
        full = os.path.join(base_dir, os.path.expanduser(serving.files))
        roots.append(glob_root(full))
        found = sorted(glob.glob(full))
        if not found:
            at = f"playbooks[{i}]" if isinstance(entry, str) else f"playbooks[{i}].files"
            problems.append(Problem(at, "INVALID_CONFIG", f"no file matches `{serving.files}`"))
        files += [(f, serving) for f in found]
    return files, problems, roots


@dataclass(frozen=True, slots=True)
class Playbooks:
    """What the config's ``playbooks`` section loads, once per load: the entries decoded (what
    :class:`mcpipe.config.Config` holds) and each playbook file compiled.

    Attributes:
        entries: the ``playbooks`` entries, decoded.
        tools: each playbook file, compiled and served as a tool.
        files: how many files the ``playbooks`` globs name.
    """

    entries: list[PlaybookEntry]
    tools: list[PlanTool]
    files: int


def load_playbooks(
    playbooks: Sequence[object],
    models: Models,
    *,
    base_dir: str = ".",
    limits: Limits | None = None,
    policy: StepPolicy | None = None,
) -> tuple[Playbooks, list[Problem]]:
    """Decode, read and compile the config's ``playbooks`` section (as written, or decoded already), every
    problem located.

    Args:
        models: the config's model presets.
        base_dir: what the globs are relative to (the config file's directory).
        limits: the server's pipeline limits (deadline, output and answer sizes; a playbook's step count is
            its own).
        policy: what steps may reach: the declared pipelines' (the outbound policy and the SQL backends the
            server owns, so the playbooks' steps share their connections), else nothing but ``base_dir``.
    """
    from mcpipe.formats.noetl._catalog import metadata_path

    policy = policy if policy is not None else StepPolicy(base_dir=base_dir)
    entries, problems = decode_playbooks(playbooks)
    files, fp, roots = _playbook_files(entries, base_dir)
    problems += fp
    known = {p: os.path.abspath(f) for f, _ in files if (p := metadata_path(f)) is not None}
    loaded: list[PlanTool] = []
    names: dict[str, str] = {}
    for f, serving in files:
        rel = os.path.relpath(f, base_dir)
        pb, pp = load_playbook(rel, models=models, policy=policy, base_dir=base_dir, known=known, roots=roots)
        problems += pp
        if pb is None:
            continue
        if pb.name in names:
            why = f"playbook `{pb.name}` is also defined in {names[pb.name]}"
            problems.append(Problem(f"{f}: metadata.name", CODE, why))
            continue
        names[pb.name] = f
        loaded.append(
            playbook_tool(pb, limits=limits, background=serving.background, task_support=serving.task_support)
        )
    return Playbooks(entries, loaded, len(files)), problems
