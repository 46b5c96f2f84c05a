"""piraeus's own data (seed 002; fjfletch/piraeus): its tool configs, prompts and flows, as they are exported.

The config's ``[piraeus]`` section names the files (globs relative to the config)::

    [piraeus]
    tools = "exports/tools/*.json"      # ToolConfig JSON, tool rows, list answers, project exports
    prompts = "exports/prompts/*.json"
    flows = "exports/flows/*.json"
    model = "gpt"                       # prompt steps and services (default: the workflow's, else sampling)

and mcpipe serves:

- each tool as an MCP tool (:class:`ApiTool`: the mapping applied both ways, as piraeus's ``GenericApiTool``)
  and as a tool of the ``workflow`` tool (seed 002's workflow, whose answers keep piraeus's
  ``WorkflowResponse`` shape, request and response dumped whole);
- each prompt as an MCP prompt (:class:`PromptSurface`: ``prompts/list`` with its variables,
  ``prompts/get`` rendering them, typed);
- each flow as a tool (:func:`flow_tool`: a :class:`~mcpipe.declared.PlanTool` in the :class:`FlowDialect`): its
  numbered steps compiled into the one plan and run on the one scheduler, answered as piraeus's
  ``FlowExecuteResponse``.

Every problem of a file is located in it (``exports/tools/quote.json: api.auth.method: ...``), one line each.
See ``docs/formats/piraeus.md``.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import httpx2
import msgspec
import orjson

from mcpipe._json import DuplicateKeyError, check_unique_keys
from mcpipe._struct import Strict
from mcpipe.declared import PlanTool
from mcpipe.errors import Problem
from mcpipe.formats.piraeus._flow import FlowDialect, compile_flow, flow_tool
from mcpipe.formats.piraeus._model import Flow, Kind, ToolConfig, items_of, read_flow, read_prompt, read_tool
from mcpipe.formats.piraeus._prompt import PromptSurface
from mcpipe.formats.piraeus._read import CODE, Reader
from mcpipe.formats.piraeus._services import Services
from mcpipe.formats.piraeus._tool import ApiTool, Secrets, build_request, check_inputs, transform
from mcpipe.kinds import HttpPolicy
from mcpipe.models import Models, located
from mcpipe.plan import Limits
from mcpipe.tools import Tool, ToolRegistry

if TYPE_CHECKING:
    from mcpipe.workflow import Workflow, WorkflowConfig

__all__ = [
    "FlowDialect",
    "Piraeus",
    "PiraeusConfig",
    "PiraeusTools",
    "ToolConfig",
    "build_request",
    "check_inputs",
    "decode_piraeus",
    "load_piraeus",
    "read_files",
    "transform",
]


class PiraeusConfig(Strict):
    """The ``[piraeus]`` section.

    Attributes:
        tools, prompts, flows: globs (one, or a list) of exported JSON files, relative to the config.
        model: the ``[models.NAME]`` preset prompt steps and the ``prompt`` services ask (default: the
            workflow's model, else ``sampling``: the calling client's).
        workflow: the tools join the ``workflow`` tool's (served with ``model`` when there is no
            ``[workflow]``).
        secrets: values of ``${NAME}`` secret references, read before the environment.
        allow_private: the tools may reach private addresses by name (an IP literal host is always allowed).
        allowed_hosts: hosts the ``execute`` services may reach besides the tools' own.
        verify: TLS verification: true, false, or a CA bundle path.
        max_response_bytes: a larger API answer fails the call.
        timeout_ms: the deadline of an ``execute`` service's request (a tool has its own ``api.timeout``).
    """

    tools: str | list[str] = []
    prompts: str | list[str] = []
    flows: str | list[str] = []
    model: str | None = None
    workflow: bool = True
    secrets: dict[str, str] = {}
    allow_private: bool = False
    allowed_hosts: list[str] = []
    verify: bool | str = True
    max_response_bytes: Annotated[int, msgspec.Meta(gt=0)] = 1024 * 1024
    timeout_ms: Annotated[float, msgspec.Meta(gt=0)] = 30_000


class PiraeusTools(ToolRegistry):
    """piraeus's tools and flows as a tool source (a :class:`~mcpipe.tools.ToolRegistry`), its prompts as
    ``surfaces``."""

    def __init__(self, tools: Iterable[Tool], surfaces: list[PromptSurface]) -> None:
        super().__init__(tools)
        self.surfaces: list[Any] = list(surfaces)


@dataclass
class Piraeus:
    """What a ``[piraeus]`` section loads.

    Attributes:
        tools: the enabled tools as MCP tools, by name.
        prompts: the prompts, by name.
        flows: the flows as tools, by name.
        workflow: the workflow serving them (``mcpipe.workflow.Workflow``), or None.
    """

    tools: dict[str, ApiTool] = field(default_factory=dict)
    prompts: dict[str, PromptSurface] = field(default_factory=dict)
    flows: dict[str, PlanTool] = field(default_factory=dict)
    workflow: Workflow | None = None

    def source(self) -> PiraeusTools:
        return PiraeusTools([*self.tools.values(), *self.flows.values()], list(self.prompts.values()))


def _at(at: str, key: str) -> str:
    """``file: path`` + ``key`` -> ``file: path.key`` (``file: key`` for a whole-file entry)."""
    return f"{at}.{key}" if ": " in at else f"{at}: {key}"


def read_files(pattern_list: list[str], where: str, base_dir: str) -> tuple[list[tuple[str, Any]], list[Problem]]:
    """The decoded JSON of every file the globs match (``(name relative to base_dir, data)``), in order."""
    out: list[tuple[str, Any]] = []
    problems: list[Problem] = []
    for i, pattern in enumerate(pattern_list):
        at = f"{where}[{i}]" if len(pattern_list) > 1 else where
        found = sorted(glob.glob(os.path.join(base_dir, os.path.expanduser(pattern))))
        if not found:
            problems.append(Problem(at, CODE, f"no file matches `{pattern}`"))
        for f in found:
            name = os.path.relpath(f, base_dir)
            try:
                raw = Path(f).read_bytes()
                data = orjson.loads(raw)
                check_unique_keys(raw)
            except OSError as e:
                problems.append(Problem(name, CODE, f"cannot read: {e.strerror}"))
            except orjson.JSONDecodeError as e:
                problems.append(Problem(f"{name}:{e.lineno}", CODE, f"not valid JSON: {e.msg} (column {e.colno})"))
            except DuplicateKeyError as e:
                problems.append(Problem(f"{name}:{e.lineno}", CODE, f"{e.msg} (column {e.colno})"))
            else:
                out.append((name, data))
    return out, problems


def _entries(
    files: list[tuple[str, object]], kind: Kind, read: Callable[[Reader, Any, str], Any], problems: list[Problem]
) -> list[Any]:
    loaded: dict[str, Any] = {}
    for name, data in files:
        r = Reader(name)
        for entry, path in items_of(r, data, kind):
            item = read(r, entry, path)
            if item is None:
                continue
            if item.name not in loaded:
                loaded[item.name] = item
            else:
                where = f"{path}.name" if path else "name"
                r.problem(where, f"`{item.name}` is also defined at {loaded[item.name].at}")
        problems.extend(r.problems)
    return list(loaded.values())


def _workflow_entry(cfg: ToolConfig, secrets: Secrets) -> dict[str, Any]:
    """A ``ToolConfig`` in the workflow's layout: its mapped inputs are what the model fills in (query
    parameters and body fields, by the API's names), ``api.params`` static, the credential authenticated."""
    props = cfg.input_schema.get("properties") or {}  # _schema refused one that is not an object of objects
    required = set(cfg.input_schema.get("required") or [])
    must: list[dict[str, Any]] = []
    may: list[dict[str, Any]] = []
    for field_name, param in [*cfg.mapping.input_to_params.items(), *cfg.mapping.input_to_body.items()]:
        prop = props.get(field_name) or {}  # declared when there are properties (_check_mapping)
        kind = prop.get("type")
        doc = {
            "name": param,
            "type": kind if kind in ("string", "integer", "number", "boolean") else "string",
            "description": str(prop.get("description") or ""),
        }
        (must if field_name in required else may).append(doc)
    secret: dict[str, Any] = {}
    where = cfg.api.auth.where
    static = dict(cfg.api.params)
    headers = dict(cfg.api.headers)
    if where is not None:
        place, key, prefix = where
        name = cfg.api.auth.secret_name or secrets.literal(cfg.name, cfg.api.auth.secret_ref or "")
        secret[key] = {"env": name, "in": place, "prefix": prefix}
        (static if place == "query" else headers).pop(key, None)
    entry: dict[str, Any] = {
        "name": cfg.name,
        "description": cfg.description,
        "base_url": cfg.api.base_url,
        "path": cfg.api.path,
        "method": cfg.api.method,
        "required_params": must,
        "optional_params": may,
        "static_params": static,
        "authenticated_params": secret,
        "headers": headers,
    }
    if cfg.output_schema:
        entry["output_schema"] = cfg.output_schema
    return entry


def decode_piraeus(raw: object) -> tuple[PiraeusConfig | None, list[Problem]]:
    """The ``[piraeus]`` section decoded (as written, or decoded already), or None and its problem, located."""
    try:
        return msgspec.convert(raw, PiraeusConfig, strict=True), []
    except msgspec.ValidationError as e:
        return None, [located(e, "piraeus")]


def load_piraeus(
    cfg: PiraeusConfig,
    models: Models,
    workflow: WorkflowConfig | None = None,
    *,
    base_dir: str = ".",
    limits: Limits | None = None,
) -> tuple[Piraeus | None, list[Problem]]:
    """Read and check everything the ``[piraeus]`` section names.

    Args:
        cfg: the section, decoded (:func:`decode_piraeus`).
        models: the model presets.
        workflow: the config's own ``workflow`` section, checked, or None.
        base_dir: what the section's globs are relative to (the config file's directory).
        limits: the server's pipeline limits the flows run under.

    Returns:
        What loaded, or None, and every problem (each file's located in it).
    """
    problems: list[Problem] = []
    model = cfg.model or (workflow.model if workflow is not None else "sampling")
    if model not in models:
        problems.append(Problem("piraeus.model", CODE, f"unknown model `{model}`{models.hint(model)}"))
    loaded: dict[str, list[Any]] = {}
    readers: tuple[tuple[Kind, str | list[str], Callable[[Reader, Any, str], Any]], ...] = (
        ("tools", cfg.tools, read_tool),
        ("prompts", cfg.prompts, read_prompt),
        ("flows", cfg.flows, read_flow),
    )
    for kind, globs, read in readers:
        files, fp = read_files([globs] if isinstance(globs, str) else globs, f"piraeus.{kind}", base_dir)
        problems += fp
        loaded[kind] = _entries(files, kind, read, problems)
    configs: list[ToolConfig] = [t for t in loaded["tools"] if t.enabled]
    disabled = frozenset(t.name for t in loaded["tools"] if not t.enabled)
    secrets = Secrets(cfg.secrets)
    hosts = sorted({httpx2.URL(t.api.base_url).host for t in loaded["tools"]})
    tool_policy = HttpPolicy(
        allowed_hosts=hosts,
        allow_private=cfg.allow_private,
        max_response_bytes=cfg.max_response_bytes,
        verify=cfg.verify,
        timeout_ms=None,
        allow_hint="a tool reaches only the hosts of the tools' api.base_url",
    )
    out = Piraeus()
    out.tools = {t.name: ApiTool(t, secrets, tool_policy) for t in configs}
    out.prompts = {p.name: PromptSurface(p) for p in loaded["prompts"]}
    # The workflow: piraeus's tools join the configured one, or make one.
    from mcpipe.workflow import HttpToolConfig, Workflow, WorkflowConfig

    merged = workflow
    if cfg.workflow and configs:
        own = {t.name for t in workflow.tools} if workflow is not None else set()
        added: list[HttpToolConfig] = []
        for t in configs:
            if t.name in own:
                problems.append(Problem(_at(t.at, "name"), CODE, f"`{t.name}` is also a [[workflow.tools]] tool"))
                continue
            try:
                added.append(msgspec.convert(_workflow_entry(t, secrets), HttpToolConfig, strict=True))
            except msgspec.ValidationError as e:
                problems.append(Problem(t.at, CODE, f"cannot join the workflow: {e}"))
        if workflow is None:
            merged = WorkflowConfig(model=model, tools=added, allow_private=cfg.allow_private, verify=cfg.verify)
        else:
            merged = msgspec.structs.replace(workflow, tools=[*workflow.tools, *added])
    if merged is not None and merged.enabled:
        out.workflow = Workflow(merged, models, environ=secrets, full_answers={t.name for t in configs})
    hint = "list it in [piraeus] allowed_hosts"
    policy = replace(tool_policy, allowed_hosts=[*hosts, *cfg.allowed_hosts], allow_hint=hint)
    services = Services(models, model, out.workflow, policy, timeout_s=cfg.timeout_ms / 1000)
    limits = limits or Limits()
    flows: list[Flow] = loaded["flows"]
    for f in flows:
        if f.name in out.tools:
            also = out.tools[f.name].config.at
            problems.append(Problem(_at(f.at, "name"), CODE, f"`{f.name}` is also a piraeus tool ({also})"))
            continue
        compiled, inputs, fp = compile_flow(
            f, tools=out.tools, prompts=out.prompts, services=services, disabled=disabled
        )
        problems += fp
        if compiled is not None:
            out.flows[f.name] = flow_tool(f, compiled, inputs, limits)
    problems += _cycles(flows)
    return (None if problems else out), problems


def _cycles(flows: list[Flow]) -> list[Problem]:
    """A flow that reaches itself through its tool steps (it would call itself without end)."""
    calls = {f.name: [s.name for s in f.steps if s.type == "tool"] for f in flows}
    problems: list[Problem] = []
    for f in flows:
        seen: set[str] = set()
        todo = [n for n in calls[f.name] if n != f.name]
        while todo and f.name not in seen:
            n = todo.pop()
            if n in calls and n not in seen:
                seen.add(n)
                todo.extend(calls[n])
        if f.name in seen:
            problems.append(Problem(f.at, CODE, f"flow `{f.name}` calls itself through other flows"))
    return problems
