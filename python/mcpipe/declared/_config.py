"""The Structs of the config's ``pipelines:`` entries and its ``outbound:`` section."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from mcpipe._struct import Strict
from mcpipe.kinds import CommandPolicy, DuckdbPolicy, HttpPolicy, PythonPolicy, StepPolicy

__all__ = [
    "CompletionSource",
    "OutboundConfig",
    "OutboundDuckdbConfig",
    "OutboundHttpConfig",
    "OutboundPythonConfig",
    "PipelineConfig",
    "PromptArgument",
    "WatchConfig",
]

_MiB = 1024 * 1024


PositiveMs = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(gt=0)]


class PromptArgument(Strict):
    """One argument of a pipeline served as a prompt."""

    name: str
    description: str | None = None
    required: bool = False


class CompletionSource(Strict):
    """A completion of a prompt argument or template variable looked up by running a ``hidden`` pipeline."""

    pipeline: str
    """The pipeline (``surface: hidden``) run with ``{argument, value, context}`` (the argument's name, what
    the client typed, the values it gave for the others); its output is the values: a list (strings are
    offered, anything else skipped), at most 100 offered. A failure, or no answer within 3 s, offers none."""


class WatchConfig(Strict):
    """How the subscribers of a resource learn that it changed (``notifications/resources/updated``).

    Attributes:
        poll_ms: while at least one client is subscribed, read the resource this often (as the server itself,
            not as any caller) and notify when its first text content changes (SHA-256); the first read sets
            the baseline, a failed read changes nothing.
        webhook_tokens: ``POST /webhooks/resource-updated/<token>`` with any of these notifies at once (the first
            is the current one, the others are still accepted while senders move to it).
        notify_if: CEL deciding, per subscriber, whether it is notified: ``subscriber`` (``principal_id``,
            ``trust_level``, ``roles``, ``groups``, ``scopes``, ``attributes``) and ``event`` (``uri``); a
            result that is not ``true``, or an error, skips that subscriber. Unset: every subscriber.
    """

    poll_ms: Annotated[int, msgspec.Meta(ge=100, le=86_400_000)] | None = None
    webhook_tokens: list[Annotated[str, msgspec.Meta(min_length=1)]] = []
    notify_if: str | None = None


class PipelineConfig(Strict, kw_only=True):
    """One ``pipelines:`` entry: a tool built from steps.

    Attributes:
        name: the tool's name (letters, digits, ``_``, ``-``, ``.``; unique among every tool).
        description: what the tool does, as ``tools/list`` shows it.
        title: an optional display name.
        input_schema: a JSON Schema of the arguments (``type: object``); calls are validated against it
            before any step runs. Top-level ``default`` values fill absent arguments.
        output_schema: an optional JSON Schema of the ``output`` object (listed as ``outputSchema``, and
            each answer's structured output is checked against it).
        timeout_ms: the whole pipeline's deadline (capped by the server's ``pipe.timeout_ms``).
        steps: the steps (see the step reference).
        output: a template over ``args``, ``steps``, ``last``, ``context``; default: the last step's output.
            An object is answered as ``structuredContent`` plus its JSON as text; a string as text.
        content: a template giving the MCP content blocks of the answer directly (text, image, audio,
            resource, resource_link); with it, ``output`` (if given and an object) is the structured part.
        background: a call answers at once with a run id and the pipeline runs on the run queue
            (``docs/runs.md``); ``pipe_result`` answers what the call would have.
        task_support: as an MCP task (``io.modelcontextprotocol/tasks``): ``optional`` (a task when the
            client declares the extension), ``required`` (a client without it gets -32021), ``forbidden``.
        ask_before_task: called as a task (2026-07-28), the pipeline first asks its client synchronously
            (input-required rounds) and becomes a task at its first step that reaches out (on the round
            whose answers let it go on); without it, a task call is a task from its first round.
        annotations: MCP tool annotations (``readOnlyHint``, ...), listed as the tool's ``annotations``.
        answer: the answer shape (:mod:`mcpipe.declared._answers`): mcpipe's own by default; a foreign
            format's configs name the shape of their system (``mcpg.binding``).
        surface: what the pipeline serves: a ``tool`` (the default), a ``prompt`` (``prompts/get`` runs it
            with the prompt's arguments), a ``resource`` (``resources/read`` of ``uri`` runs it with
            ``{uri}``) or a ``resource_template`` (a read of a URI matching ``uri_template`` runs it with
            ``{uri, <variables>..., template_vars}``), or ``hidden``: run only by the server itself (a completion
            source, a resource listing), never listed nor called by a client. Only tools are listed and called
            as tools.
        uri, uri_template, mime_type: the resource's URI (or URI template) and MIME type.
        arguments: a prompt's arguments (``[{name, description, required}]``).
        fill_defaults: fill absent arguments from the input schema's top-level ``default`` values before the
            call is checked (mcpipe's way); off, the arguments are checked and passed as the caller sent them.
        check_formats: check the input schema's ``format`` keywords (mcpipe's way); off, a ``format`` is an
            annotation but under drafts 4, 6 and 7, which check it (the ``jsonschema`` crate's default, mcpg's).
        completions: what ``completion/complete`` offers for a prompt's argument or a resource template's
            variable, by its name: a list (the values that start with what the client typed, at most 100), or a
            ``{pipeline: NAME}`` lookup (:class:`CompletionSource`).
        listing: a ``hidden`` pipeline that lists the resources a resource or resource template serves
            (``resources/list``, after the config's fixed ones): run with ``{cursor}`` (None for the first page),
            its output is ``{resources: [{uri, name?, description?, mimeType?}], next_cursor?}``; a failure, or no
            answer within 3 s, lists none.
        watch: how subscribers of a resource learn it changed (:class:`WatchConfig`).
        meta: the descriptor's ``_meta``.
    """

    name: str
    description: str = ""
    title: str | None = None
    input_schema: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object"})
    output_schema: dict[str, Any] | None = None
    timeout_ms: PositiveMs | None = None
    steps: list[Any]
    output: Any = msgspec.UNSET
    content: Any = msgspec.UNSET
    background: bool = False
    task_support: Literal["optional", "required", "forbidden"] = "optional"
    ask_before_task: bool = False
    annotations: dict[str, Any] | None = None
    answer: str | None = None
    surface: Literal["tool", "prompt", "resource", "resource_template", "hidden"] = "tool"
    uri: str | None = None
    uri_template: str | None = None
    mime_type: str | None = None
    arguments: list[PromptArgument] = []
    fill_defaults: bool = True
    check_formats: bool = True
    completions: dict[str, list[str] | CompletionSource] = {}
    listing: str | None = None
    watch: WatchConfig | None = None
    meta: dict[str, Any] | None = None


class OutboundHttpConfig(Strict):
    """``outbound.http``: where ``http`` and ``graphql`` steps may connect (see :class:`HttpPolicy`)."""

    allowed_hosts: list[str] = []
    allow_private: bool = False
    max_response_bytes: PositiveInt = 10 * _MiB
    verify: bool | str = True
    timeout_ms: PositiveMs | None = 30_000
    insecure_hosts: list[str] = []
    """Hosts (patterns as in ``allowed_hosts``) a step may reach with TLS verification off, when it asks
    (NoETL's ``verify_ssl: false``): a gateway with a self-signed certificate, say."""


class OutboundPythonConfig(Strict):
    """``outbound.python``: the limits of ``python`` steps (see :class:`PythonPolicy`)."""

    workers: Annotated[int, msgspec.Meta(ge=1, le=256)] = 4
    prefork: Annotated[int, msgspec.Meta(ge=0, le=64)] = 2
    fork_server: bool = True
    memory_mb: Annotated[int, msgspec.Meta(ge=64)] = 1024
    max_file_mb: Annotated[int, msgspec.Meta(ge=1)] = 64
    max_processes: Annotated[int, msgspec.Meta(ge=1, le=65536)] = 64
    max_open_files: Annotated[int, msgspec.Meta(ge=16, le=1048576)] = 256
    separate_uid: bool = True
    namespaces: bool = True
    timeout_ms: PositiveMs = 60_000
    max_output_bytes: PositiveInt = _MiB
    max_result_bytes: PositiveInt = 10 * _MiB
    env: dict[str, str] | None = None
    reuse: Literal["step", "run"] = "step"
    """``run``: a python worker serves the later steps of its run and principal (see :class:`PythonPolicy`)."""


class OutboundDuckdbConfig(Strict):
    """``outbound.duckdb``: the limits of ``duckdb`` steps (see :class:`DuckdbPolicy`)."""

    workers: Annotated[int, msgspec.Meta(ge=1, le=256)] = 4
    memory_mb: Annotated[int, msgspec.Meta(ge=16)] = 1024
    threads: Annotated[int, msgspec.Meta(ge=1, le=256)] = 2
    timeout_ms: PositiveMs = 60_000
    max_rows: PositiveInt = 10_000
    autoinstall_extensions: bool = False
    external_access: bool = False
    allowed_directories: list[str] = []


class OutboundConfig(Strict):
    """The ``outbound:`` section: what declared steps may reach.

    Attributes:
        http: outbound HTTP for ``http``/``graphql`` steps.
        commands: name -> executable path, or name -> argv prefix; the only commands ``command`` steps run.
        command_env: the environment commands start from (default: the server's PATH, LANG, LC_ALL, TZ,
            HOME only).
        command_timeout_ms: the deadline of a ``command`` step that sets none.
        command_max_output_bytes: stdout or stderr past this fails the step.
        command_kill_grace_ms: SIGTERM, then SIGKILL after this, on timeout or cancellation.
        expression_max_ms: how long one JSONata evaluation may run.
        python: the limits of ``python`` steps.
        duckdb: the limits of ``duckdb`` steps.
    """

    http: OutboundHttpConfig = msgspec.field(default_factory=OutboundHttpConfig)
    python: OutboundPythonConfig = msgspec.field(default_factory=OutboundPythonConfig)
    duckdb: OutboundDuckdbConfig = msgspec.field(default_factory=OutboundDuckdbConfig)
    commands: dict[str, str | list[str]] = {}
    command_env: dict[str, str] | None = None
    command_timeout_ms: PositiveMs | None = 60_000
    command_max_output_bytes: PositiveInt = 10 * _MiB
    command_kill_grace_ms: Annotated[float, msgspec.Meta(ge=0)] = 1000
    expression_max_ms: PositiveInt = 1000

    def policy(self) -> StepPolicy:
        """The :class:`StepPolicy` this section describes."""
        h = self.http
        return StepPolicy(
            http=HttpPolicy(
                allowed_hosts=tuple(h.allowed_hosts),
                allow_private=h.allow_private,
                max_response_bytes=h.max_response_bytes,
                verify=h.verify,
                timeout_ms=h.timeout_ms,
                insecure_hosts=tuple(h.insecure_hosts),
            ),
            command=CommandPolicy(
                commands=dict(self.commands),
                env=self.command_env,
                max_output_bytes=self.command_max_output_bytes,
                kill_grace_ms=self.command_kill_grace_ms,
                timeout_ms=self.command_timeout_ms,
            ),
            python=PythonPolicy(
                workers=self.python.workers,
                prefork=self.python.prefork,
                fork_server=self.python.fork_server,
                memory_mb=self.python.memory_mb,
                max_file_mb=self.python.max_file_mb,
                max_processes=self.python.max_processes,
                max_open_files=self.python.max_open_files,
                separate_uid=self.python.separate_uid,
                namespaces=self.python.namespaces,
                timeout_ms=self.python.timeout_ms,
                max_output_bytes=self.python.max_output_bytes,
                max_result_bytes=self.python.max_result_bytes,
                env=self.python.env,
                reuse=self.python.reuse,
            ),
            duckdb=DuckdbPolicy(
                workers=self.duckdb.workers,
                memory_mb=self.duckdb.memory_mb,
                threads=self.duckdb.threads,
                timeout_ms=self.duckdb.timeout_ms,
                max_rows=self.duckdb.max_rows,
                autoinstall_extensions=self.duckdb.autoinstall_extensions,
                external_access=self.duckdb.external_access,
                allowed_directories=tuple(self.duckdb.allowed_directories),
            ),
            expression_max_ms=self.expression_max_ms,
        )
