"""Foreign formats: other systems' own files, read as they are and compiled into mcpipe's one plan.

Each format is one subpackage that owns everything of it: detecting its files, translating them, the
semantics only it has, its tools, kinds and answer shapes, its documentation (``docs/formats/<name>.md``) and
its tests with the vendored upstream files (``tests/formats/<name>/``). Adding a format is a new folder and
one line in :data:`FORMATS`, not edits across ``config``, ``server``, ``gateway`` and ``kinds``;
``scripts/check_formats.py`` (``make lint``) fails when a format is named outside its folder.

| package | system (seed) | what it reads |
|---|---|---|
| ``mcpipe.formats.mcpg`` | mcpg (003) | mcpg config files (``gateway``, ``mcp.capabilities``, ``governance``, ...) |
| ``mcpipe.formats.piraeus`` | piraeus (002) | piraeus's exported tool configs, prompts and flows |
| ``mcpipe.formats.noetl`` | NoETL (004) | NoETL playbooks (``noetl.io/v2`` and the older layout) |
| ``mcpipe.formats.discord`` | discord-mcp (001) | the ``mcp_pipeline`` tool: its calls and answers |

A format never has a scheduler or a plan of its own: it produces what mcpipe's own front-ends take (a
config document in mcpipe's layout, declared pipelines, playbook plans, ``mcp_pipe`` specs) or plan nodes
directly, and the one scheduler runs them.

A format is a :class:`Format` (sqlglot's ``Dialect``: it overrides only what differs) defined as ``FORMAT`` by
the module its :class:`Registered` line names. That module is imported only when it is needed: when a config
document is decoded (``config_files``), when the pipelines name one of its kinds or answer shapes
(``prefix``), when the config sets one of the keys that turn it on (``turned_on_by``), or when ``[audit]
format`` names it. What it can do:

- **read server config files** (:meth:`Format.detect`, :meth:`Format.translate`):
  :func:`mcpipe.config.parse_config` asks :func:`detect_config` about every decoded document before reading it
  as mcpipe's own; a format that claims it translates it into mcpipe's layout (:class:`Translation`), and
  every problem found afterwards is located back in the file through ``Translation.locate``;
- **serve tools** (:meth:`Format.tool_sources`, :meth:`Format.problems`, :meth:`Format.counts`): the server
  asks every format the config turns on, in :data:`FORMATS` order, with a :class:`Context` they share (the
  model presets, the checked ``workflow`` section, the declared pipelines' step policy);
- **name step kinds and answer shapes** (``kind: mcpg.http``, ``answer: mcpg.binding``): the module of
  :attr:`Registered.kinds` registers them, loaded by :func:`load_extensions`;
- **write audit records** in its system's format (:meth:`Format.audit_log`, ``[audit] format = NAME``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from mcpipe.errors import ConfigError, Problem

if TYPE_CHECKING:
    from mcpipe._audit import AuditLog
    from mcpipe.kinds import StepPolicy
    from mcpipe.models import Models
    from mcpipe.plan import Limits
    from mcpipe.tools import Tool
    from mcpipe.workflow import WorkflowConfig

__all__ = [
    "FORMATS",
    "ConfigView",
    "Context",
    "Format",
    "Registered",
    "ToolSource",
    "Translation",
    "audit_log",
    "decoded_sections",
    "detect_config",
    "format_counts",
    "format_named",
    "format_problems",
    "format_sources",
    "load_extensions",
    "own_workflow",
    "serves_workflow",
    "turned_on",
]


def _same(location: str) -> str:
    return location


@dataclass(slots=True)
class Translation:
    """A foreign document in mcpipe's own layout.

    Attributes:
        raw: the document as mcpipe's config reads it (``mcpipe.config.Config``'s keys).
        problems: what the file has that mcpipe refuses, each located in the file.
        locate: maps a location in ``raw`` (``pipelines.charge.steps[1].url``) to where it is in the file
            (``mcp.capabilities.tools[3].backend.steps[1].url``).
        mapping: ``(where in raw, where in the file)`` of each part that moved, for ``mcpipe convert`` and
            ``mcpipe check --explain``.
    """

    raw: dict[str, Any]
    problems: list[Problem] = field(default_factory=list)
    locate: Callable[[str], str] = _same
    mapping: list[tuple[str, str]] = field(default_factory=list)


class ToolSource(Protocol):
    """What a format serves: tools by name, and all of them (the gateway's ``ToolSource``)."""

    def get(self, name: str) -> Tool | None: ...

    def __iter__(self) -> Iterator[Tool]: ...


class ServerView(Protocol):
    """What a format reads of one of the config's downstream servers (``mcpipe.config.McpServerConfig``)."""

    @property
    def enabled(self) -> bool: ...

    @property
    def prefix(self) -> str | None: ...

    @property
    def mcp_pipeline(self) -> bool: ...


class PipeView(Protocol):
    """What a format reads of the config's ``[pipe]`` (``mcpipe.config.PipeConfig``)."""

    @property
    def mcp_pipeline(self) -> bool: ...

    def limits(self) -> Limits: ...


class ConfigView(Protocol):
    """What the formats read of the server's config: :class:`mcpipe.config.Config`, of the layer above, named
    by what it holds. The sections decoded by the packages below it (``models``, ``workflow``, each format's
    own: :meth:`Context.section`) are as the file has them while they are decoded (:func:`decoded_sections`),
    decoded after."""

    @property
    def base_dir(self) -> str: ...

    @property
    def pipe(self) -> PipeView: ...

    @property
    def mcpServers(self) -> Mapping[str, ServerView]: ...

    @property
    def models(self) -> object: ...

    @property
    def workflow(self) -> object: ...


class Context:
    """What the formats a config turns on share while their tools are built or checked: the config's model
    presets and its checked ``workflow`` section (each read once, its problems kept in :attr:`problems`),
    and the declared pipelines' step policy.

    Args:
        config: the :class:`mcpipe.config.Config` (what formats read of it: :class:`ConfigView`).
        policy: the declared pipelines' step policy (the outbound policy and the SQL backends the server
            owns), so a format's steps share its connections; None: the format reads the sections itself.
    """

    def __init__(
        self,
        config: ConfigView,
        policy: StepPolicy | None = None,
        compiled: dict[str, tuple[object, list[Problem]]] | None = None,
    ) -> None:
        self.config = config
        self.policy = policy
        self.compiled: dict[str, tuple[Any, list[Problem]]] = compiled if compiled is not None else {}
        """What the shared sections (``models``, ``workflow``) and each format's part of the config compiled to,
        with its problems, by name: compiled once per load (:class:`mcpipe.config.Loaded` keeps this table and
        hands it to every context of that load, so serving, checking and counting compile nothing again)."""
        self.problems: list[Problem] = []
        """The problems of the shared sections and of the formats' parts read through this context."""
        self._read: set[str] = set()

    def _once(self, key: str, make: Callable[[], tuple[object, list[Problem]]]) -> Any:
        if key not in self.compiled:
            self.compiled[key] = make()
        value, problems = self.compiled[key]
        if key not in self._read:
            self._read.add(key)
            self.problems += problems
        return value

    def section(self, fmt: Format) -> object:
        """``fmt``'s own section of the config (the ``Config`` field its :attr:`Format.section` names; None
        without one), as the file has it while it is decoded."""
        return getattr(self.config, fmt.section) if fmt.section is not None else None

    def load(self, fmt: Format) -> Any:
        """What ``fmt``'s part of the config compiles to (:meth:`Format.load`), compiled once per load; its
        problems join :attr:`problems`."""
        return self._once(fmt.name, lambda: fmt.load(self))

    def _models(self) -> tuple[Any, list[Problem]]:
        from mcpipe.models import Models, load_models

        presets, problems = load_models(self.config.models or {})
        return Models(presets), problems

    @property
    def models(self) -> Models:
        """The config's model presets (``[models.NAME]``; ``presets``: what ``Config.models`` holds, decoded)."""
        return self._once("models", self._models)

    def _workflow(self) -> tuple[Any, list[Problem]]:
        from mcpipe.workflow import load_workflow

        workflow, problems = load_workflow(self.config.workflow, self.models)
        return (None if problems else workflow), problems

    @property
    def workflow(self) -> WorkflowConfig | None:
        """The config's ``workflow`` section, checked (None: absent, or it has problems)."""
        return None if self.config.workflow is None else self._once("workflow", self._workflow)

    @property
    def limits(self) -> Limits:
        """The server's pipeline limits (deadline, output and answer sizes)."""
        return self.config.pipe.limits()


class Format:
    """One foreign format: its module defines a subclass as ``FORMAT``, overriding only what it does."""

    name: ClassVar[str] = ""
    """Its short name (``mcpg``): its key in :data:`FORMATS`, the prefix of its kinds and answer shapes, its
    ``[audit] format``; used in messages and by ``mcpipe check --explain``."""

    serves_workflow: ClassVar[bool] = False
    """It serves the ``workflow`` tool itself, in place of the config's own (piraeus's tools join it)."""

    def detect(self, raw: Mapping[str, object]) -> bool:
        """Whether a decoded config document is one of this format's (by its own keys, never by its path)."""
        return False

    def translate(self, raw: Mapping[str, object], *, base_dir: str, environ: Mapping[str, str]) -> Translation:
        """The document in mcpipe's layout, with what cannot be honoured refused, located."""
        raise NotImplementedError(f"the {self.name} format reads no config files")

    section: ClassVar[str | None] = None
    """The ``Config`` field of its own section (``playbooks``), if any: :meth:`load` decodes it, and the
    config's load keeps it decoded (:meth:`decoded`)."""

    def load(self, ctx: Context) -> tuple[Any, list[Problem]]:
        """What the format's part of the config compiles to, and every problem of it; :meth:`Context.load`
        calls it once per load (the other methods read that one result)."""
        return None, []

    def decoded(self, loaded: object) -> Any:
        """Its section (:attr:`section`) decoded, from what :meth:`load` returned."""
        return None

    def tool_sources(self, ctx: Context) -> list[ToolSource]:
        """The tools the config asks of this format.

        Raises:
            mcpipe.errors.ConfigError: listing every problem of the format's part of the config.
        """
        return []

    def problems(self, ctx: Context) -> list[Problem]:
        """Every problem of the format's part of the config (its files read and checked), for ``check``."""
        try:
            self.tool_sources(ctx)
        except ConfigError as exc:
            return list(exc.problems)
        return []

    def counts(self, ctx: Context) -> dict[str, int]:
        """What it serves, for ``mcpipe check --config``'s summary (``{"playbook": 2}``); read after the check."""
        return {}

    def no_pipe_reason(self) -> str | None:
        """Why a config translated from this format serves no ``mcp_pipe``, and how to serve it (None: the usual
        reason, ``pipe.enabled`` false)."""
        return None

    def audit_log(self, path: str | None, audit: object) -> AuditLog | None:
        """An audit log writing this format's records (``[audit] format = NAME``; ``audit``: that section, the
        config's ``AuditConfig``); None: the format writes none."""
        return None


@dataclass(frozen=True, slots=True)
class Registered:
    """One line of :data:`FORMATS`: where the format is and what imports it.

    Attributes:
        module: the module that defines ``FORMAT`` (kept light: it imports the rest when asked).
        config_files: it reads server config files of its own (asked by :func:`detect_config`).
        kinds: the module that registers its step kinds and answer shapes (``kind: NAME.http``), if any.
        turned_on_by: config keys (dotted; ``*`` for every entry of a table) whose value, when set, turns the
            format on: the server then asks it for tools.
    """

    module: str
    config_files: bool = False
    kinds: str | None = None
    turned_on_by: tuple[str, ...] = ()


FORMATS: dict[str, Registered] = {
    "mcpg": Registered("mcpipe.formats.mcpg", config_files=True, kinds="mcpipe.formats.mcpg._kinds"),
    "piraeus": Registered("mcpipe.formats.piraeus._format", turned_on_by=("piraeus",)),
    "noetl": Registered("mcpipe.formats.noetl._format", turned_on_by=("playbooks",)),
    "discord": Registered(
        "mcpipe.formats.discord._format", turned_on_by=("pipe.mcp_pipeline", "mcpServers.*.mcp_pipeline")
    ),
}
"""The formats by name, in the order the server asks them for tools (a tool's name is looked up in that order)."""


def format_named(name: str) -> Format:
    """The format registered as ``name`` (a :data:`FORMATS` key: ``Config.translated_from``, ``[audit] format``)."""
    return importlib.import_module(FORMATS[name].module).FORMAT


def _set(value: object, path: list[str]) -> bool:
    """Whether ``path`` (attribute or key names, ``*`` for every value) leads from ``value`` to a set value."""
    if not path:
        return value is not None and value is not False and value != [] and value != {}
    head, rest = path[0], path[1:]
    if head == "*":
        return any(_set(v, rest) for v in (value.values() if isinstance(value, Mapping) else ()))
    return _set(value.get(head) if isinstance(value, Mapping) else getattr(value, head, None), rest)


def turned_on(config: ConfigView) -> list[Format]:
    """The formats ``config`` turns on (one of their ``turned_on_by`` keys set), in :data:`FORMATS` order."""
    return [
        format_named(name)
        for name, entry in FORMATS.items()
        if any(_set(config, key.split(".")) for key in entry.turned_on_by)
    ]


def serves_workflow(config: ConfigView) -> bool:
    """Whether the config serves the ``workflow`` tool: its own ``[workflow]``, or a format's that serves one."""
    return config.workflow is not None or any(f.serves_workflow for f in turned_on(config))


def own_workflow(ctx: Context) -> WorkflowConfig | None:
    """The config's own ``[workflow]`` (checked, enabled) when it serves it as the ``workflow`` tool: no format the
    config turns on serves one in its place."""
    if any(f.serves_workflow for f in turned_on(ctx.config)):
        return None
    workflow = ctx.workflow
    return workflow if workflow is not None and workflow.enabled else None


def format_sources(ctx: Context) -> list[ToolSource]:
    """The tool sources of every format the config turns on, in :data:`FORMATS` order.

    Raises:
        mcpipe.errors.ConfigError: listing every problem (the shared sections' first).
    """
    sources: list[ToolSource] = []
    problems: list[Problem] = []
    for fmt in turned_on(ctx.config):
        try:
            sources.extend(fmt.tool_sources(ctx))
        except ConfigError as exc:
            problems.extend(exc.problems)
    if ctx.problems or problems:
        raise ConfigError([*ctx.problems, *problems])
    return sources


def format_problems(ctx: Context) -> list[Problem]:
    """Every problem of the config's ``models`` and ``workflow`` sections, then of the formats it turns on."""
    if ctx.config.models:
        _ = ctx.models  # read first: their problems come first
    _ = ctx.workflow
    problems = [p for fmt in turned_on(ctx.config) for p in fmt.problems(ctx)]
    return [*ctx.problems, *problems]


def decoded_sections(ctx: Context) -> dict[str, Any]:
    """The config's ``models``, ``workflow`` and formats' sections as :meth:`Format.load` decoded them, by field
    name (for ``msgspec.structs.replace`` of the config), after :func:`format_problems` read them."""
    out: dict[str, Any] = {}
    if ctx.config.models:
        out["models"] = ctx.models.presets
    if ctx.config.workflow is not None:
        out["workflow"] = ctx.workflow
    for fmt in turned_on(ctx.config):
        if fmt.section is not None:
            out[fmt.section] = fmt.decoded(ctx.load(fmt))
    return out


def format_counts(ctx: Context) -> dict[str, int]:
    """What the formats the config turns on serve, for ``mcpipe check --config``'s summary."""
    return {kind: n for fmt in turned_on(ctx.config) for kind, n in fmt.counts(ctx).items()}


def audit_log(name: str, path: str | None, audit: object) -> AuditLog | None:
    """The audit log of the format ``name`` (``[audit] format``), or None when no format of that name writes one."""
    return format_named(name).audit_log(path, audit) if name in FORMATS else None


def load_extensions(raw: Mapping[str, object]) -> None:
    """Import the format modules whose step kinds or answer shapes the ``pipelines`` of ``raw`` name."""
    wanted: set[str] = set()
    todo = [raw.get("pipelines")]
    while todo:
        value = todo.pop()
        if isinstance(value, Mapping):
            names = [value.get("kind"), value.get("answer")]
            wanted.update(n.split(".", 1)[0] for n in names if isinstance(n, str) and "." in n)
            todo.extend(value.values())
        elif isinstance(value, list):
            todo.extend(value)
    for prefix in sorted(wanted & FORMATS.keys()):
        kinds = FORMATS[prefix].kinds
        if kinds is not None:
            importlib.import_module(kinds)


def detect_config(raw: Mapping[str, object]) -> Format | None:
    """The foreign format a decoded config document is written in, or None for mcpipe's own layout."""
    readers = (format_named(name) for name, entry in FORMATS.items() if entry.config_files)  # imported in turn
    return next((fmt for fmt in readers if fmt.detect(raw)), None)
