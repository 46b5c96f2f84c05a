"""The declared step kinds as msgspec Structs: one Struct per kind, fields named as in seed 003.

A step is a flat object: ``kind``, ``id`` and the kind's fields as siblings. Every kind shares ``when``,
``input_transform`` and ``timeout_ms``. Template fields are plain JSON values here; the compiler turns
them into :class:`mcpipe.Template` objects. Unknown fields are errors.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

__all__ = [
    "KIND_STRUCTS",
    "LOG_LEVELS",
    "CelGateFields",
    "CommandFields",
    "ElicitationFields",
    "GatherFields",
    "GraphqlFields",
    "GrpcFields",
    "HttpFields",
    "KafkaFields",
    "LogFields",
    "MockFields",
    "NatsFields",
    "ParallelFields",
    "PipeFields",
    "PluginTransformFields",
    "ProgressFields",
    "RootsListFields",
    "SamplingFields",
    "SqlAwaitFields",
    "SqlFields",
    "SqlQueryFields",
    "SqlStatementFields",
    "SqlTxFields",
    "StepFields",
    "ToolFields",
    "TransformFields",
    "ValueFields",
    "step_schema",
]

StepId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")]
TimeoutMs = Annotated[float, msgspec.Meta(gt=0, description="Deadline in milliseconds.")]
Expression = Annotated[str, msgspec.Meta(min_length=1)]
StatusCode = Annotated[int, msgspec.Meta(ge=100, le=599)]

LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
LogLevel = Literal["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]
HttpMethod = Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class StepFields(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True, tag_field="kind"):
    """The fields every step kind has.

    Attributes:
        id: unique within its list; defaults to ``step<N>`` (N the 1-based position).
        when: a CEL condition; when false the step is skipped (it shows as skipped, its output is null).
        input_transform: a CEL expression whose value replaces ``args`` for this step's templates and
            expressions.
        timeout_ms: the step's deadline; past it the step fails with ``TIMEOUT``.
    """

    id: StepId | None = None
    when: Expression | None = None
    input_transform: Expression | None = None
    timeout_ms: TimeoutMs | None = None


class ToolFields(StepFields, tag="tool"):
    """Call a tool the server knows: ``{kind: tool, tool: <name>, args: <template>}``."""

    tool: Annotated[str, msgspec.Meta(min_length=1)]
    args: Any = msgspec.field(default_factory=dict)


class HttpFields(StepFields, tag="http"):
    """One HTTP request. ``url``, ``headers``, ``query`` and ``body`` are templates.

    An object or array ``body`` is sent as JSON; a string as text; null sends no body.
    ``expected_status_codes`` defaults to any 2xx.
    """

    url: Any
    method: HttpMethod = "GET"
    headers: Any = None
    query: Any = None
    body: Any = None
    expected_status_codes: list[StatusCode] | None = None
    require_json_response: bool = False
    follow_redirects: bool = False


class GraphqlFields(StepFields, tag="graphql"):
    """One GraphQL request (POST, JSON). ``url``, ``variables`` and ``headers`` are templates;
    ``operation`` is the query text (pass data through ``variables``, never by templating the query)."""

    url: Any
    operation: Annotated[str, msgspec.Meta(min_length=1)]
    variables: Any = None
    headers: Any = None
    operation_name: str | None = None


class CommandFields(StepFields, tag="command"):
    """Run an allowed command (no shell). ``args``, ``env``, ``cwd`` and ``stdin`` are templates."""

    command: Annotated[str, msgspec.Meta(min_length=1)]
    args: Any = msgspec.field(default_factory=list)
    env: Any = None
    cwd: Any = None
    stdin: Any = None
    require_json_stdout: bool = False
    expected_exit_codes: list[int] = msgspec.field(default_factory=lambda: [0])


class MockFields(StepFields, tag="mock"):
    """A fixed ``response`` (not a template), after ``delay_ms``; or a failure with ``error: true``.
    ``passthrough: true`` answers the step's input (``args``, after ``input_transform``) instead; ``progress``
    (numbers) are sent as progress notifications on the way, with ``message`` (mcpg's mock fields)."""

    response: Any = None
    delay_ms: Annotated[float, msgspec.Meta(ge=0)] = 0
    error: bool = False
    error_message: str | None = None
    passthrough: bool = False
    progress: list[float] | None = None
    message: str | None = None


class ValueFields(StepFields, tag="value"):
    """The ``value`` template, resolved, is the output."""

    value: Any


class TransformFields(StepFields, tag="transform"):
    """The value of a CEL ``expression`` is the output."""

    expression: Expression


class CelGateFields(StepFields, tag="cel_gate"):
    """A CEL boolean guard: false fails the step with ``error_message`` and ``GATE_REJECTED``."""

    expression: Expression
    error_message: str | None = None


class PluginTransformFields(StepFields, tag="plugin_transform"):
    """A transform plugin: ``plugin: jsonata`` (or ``dev.mcpipe.transform.jsonata``) with
    ``config: {expression: ...}``."""

    plugin: Annotated[str, msgspec.Meta(min_length=1)]
    config: dict[str, Any] = msgspec.field(default_factory=dict)


class LogFields(StepFields, tag="log"):
    """Send ``data`` (a template) to the caller as a ``notifications/message`` at ``level``."""

    data: Any
    level: LogLevel = "info"
    logger: str | None = None


class ProgressFields(StepFields, tag="progress"):
    """Send a ``notifications/progress``; skipped when the call carried no progress token.
    ``progress``, ``total`` and ``message`` are templates."""

    progress: Any
    total: Any = None
    message: Any = None


class ElicitationFields(StepFields, tag="elicitation"):
    """Ask the user (MCP elicitation): ``message`` and the ``requested_schema`` of the answer (templates; a
    schema that contains ``$ref`` goes inside ``$literal``). The output is ``{action, content}``."""

    message: Any
    requested_schema: Any = None
    skip_if_unsupported: bool = False


class SamplingFields(StepFields, tag="sampling"):
    """Ask the client's model (MCP sampling). ``messages`` (``[{role, content}]``, a string content being
    a text block), ``system_prompt``, ``max_tokens``, ``model_preferences`` and ``temperature`` are
    templates. The output is the model's reply plus its ``text``."""

    messages: Any
    system_prompt: Any = None
    max_tokens: Any = 1024
    model_preferences: Any = None
    temperature: Any = None
    skip_if_unsupported: bool = False


class RootsListFields(StepFields, tag="roots_list"):
    """Ask the client for its roots (MCP roots/list). The output is ``{roots: [{uri, name}]}``."""

    skip_if_unsupported: bool = False


CorrelationToken = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")]


class _GatherEntry(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True, tag_field="kind"):
    correlation_token: CorrelationToken
    skip_if_unsupported: bool = False


class GatherElicitation(_GatherEntry, tag="elicitation"):
    message: Any
    requested_schema: Any = None


class GatherSampling(_GatherEntry, tag="sampling"):
    messages: Any
    system_prompt: Any = None
    max_tokens: Any = 1024
    model_preferences: Any = None
    temperature: Any = None


class GatherRoots(_GatherEntry, tag="roots"):
    pass


class GatherFields(StepFields, tag="gather"):
    """Ask several questions in one round (``inputs``, each with a unique ``correlation_token``; the roots
    entry's kind is ``roots``). The output maps each token to its answer."""

    inputs: Annotated[list[GatherElicitation | GatherSampling | GatherRoots], msgspec.Meta(min_length=1)]


class ParallelFields(StepFields, tag="parallel"):
    """Run ``steps`` concurrently; they see what this step's list sees, not each other."""

    steps: Annotated[list[Any], msgspec.Meta(min_length=1)]


class PipeFields(StepFields, tag="pipe"):
    """A nested pipeline: its own ``vars`` (resolved in the parent), ``steps`` and ``return``."""

    steps: Annotated[list[Any], msgspec.Meta(min_length=1)]
    vars: dict[str, Any] = msgspec.field(default_factory=dict)
    return_: Any = msgspec.field(default=msgspec.UNSET, name="return")
    continue_on_error: bool = False


RowMode = Literal["rows", "one", "affected_rows"]
SqlText = Annotated[str, msgspec.Meta(min_length=1)]


class SqlFields(StepFields, tag="sql"):
    """One SQL statement on a named ``[sql.NAME]`` backend. ``sql`` names its parameters ``:name``;
    ``params`` (a template: an object name -> value; or mcpg's list of argument names) binds them.
    ``row_mode``: ``rows`` (a list of row objects), ``one`` (one row object or null), ``affected_rows``."""

    backend: Annotated[str, msgspec.Meta(min_length=1)]
    sql: SqlText
    params: Any = None
    row_mode: RowMode = "rows"


class SqlStatementFields(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """One statement of a ``sql_tx`` step (``id``, ``sql``, ``params``, ``row_mode`` as in ``sql``)."""

    id: StepId | None = None
    sql: SqlText
    params: Any = None
    row_mode: RowMode = "rows"


class SqlTxFields(StepFields, tag="sql_tx"):
    """Several statements in one transaction on a named backend: all or nothing. The output is
    ``{steps: {<statement id>: <its output>}}``; a statement's ``params`` may read earlier statements'
    outputs as ``steps.<statement id>.output``."""

    backend: Annotated[str, msgspec.Meta(min_length=1)]
    steps: Annotated[list[SqlStatementFields], msgspec.Meta(min_length=1)]


class SqlQueryFields(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """A statement and its ``params`` (``sql_await``'s ``trigger`` and ``check``)."""

    sql: SqlText
    params: Any = None


class SqlAwaitFields(StepFields, tag="sql_await"):
    """Run ``trigger`` (optional), then poll ``check`` every ``interval_ms`` until the CEL ``until`` (which
    sees the check's ``rows``) holds, or ``timeout_ms`` (default 30 s) passes. Fields left out come from
    the backend's ``await`` block (mcpg's backend-level await). A string is a statement without params."""

    backend: Annotated[str, msgspec.Meta(min_length=1)]
    trigger: SqlText | SqlQueryFields | None = None
    check: SqlText | SqlQueryFields | None = None
    until: Expression | None = None
    interval_ms: Annotated[float, msgspec.Meta(gt=0)] | None = None


class NatsFields(StepFields, tag="nats"):
    """A NATS request (wait for the reply, ``timeout_ms``, default 30 s) or publish (``mode: publish``) on
    ``subject``. ``url`` is a constant (``nats://host:4222``); ``subject``, ``payload`` (default: the step's
    input, ``args``) and ``headers`` are templates. A string payload is sent as is, anything else as JSON."""

    url: Annotated[str, msgspec.Meta(min_length=1)]
    subject: Any
    payload: Any = msgspec.UNSET
    headers: Any = None
    mode: Literal["request", "publish"] = "request"


class GrpcFields(StepFields, tag="grpc"):
    """A unary gRPC call of ``service``/``method`` on ``url`` (a constant). ``message`` (a template; default:
    the step's input, ``args``) is JSON turned into the request message; the response is the output, as
    JSON. Message types come from server reflection, or from ``descriptor_set`` (a ``FileDescriptorSet``
    file). ``metadata`` (a template, an object) is sent with the call."""

    url: Annotated[str, msgspec.Meta(min_length=1)]
    service: Annotated[str, msgspec.Meta(min_length=1)]
    method: Annotated[str, msgspec.Meta(min_length=1)]
    message: Any = msgspec.UNSET
    metadata: Any = None
    descriptor_set: str | None = None


class KafkaFields(StepFields, tag="kafka"):
    """A Kafka request (``request_topic`` and ``response_topic``: produce with a correlation id, wait for the
    response carrying it, ``timeout_ms``) or produce (``topic``). ``bootstrap_servers`` is a constant; the
    topics, ``value`` (default: the step's input, ``args``), ``key`` and ``headers`` are templates.
    ``group_id`` is mcpg's, accepted and unused (responses are read without a consumer group)."""

    bootstrap_servers: Annotated[str, msgspec.Meta(min_length=1)]
    topic: Any = None
    request_topic: Any = None
    response_topic: Any = None
    value: Any = msgspec.UNSET
    key: Any = None
    headers: Any = None
    group_id: str | None = None


KIND_STRUCTS: dict[str, type[StepFields]] = {
    "tool": ToolFields,
    "http": HttpFields,
    "graphql": GraphqlFields,
    "command": CommandFields,
    "mock": MockFields,
    "value": ValueFields,
    "transform": TransformFields,
    "cel_gate": CelGateFields,
    "plugin_transform": PluginTransformFields,
    "log": LogFields,
    "progress": ProgressFields,
    "elicitation": ElicitationFields,
    "sampling": SamplingFields,
    "roots_list": RootsListFields,
    "gather": GatherFields,
    "parallel": ParallelFields,
    "pipe": PipeFields,
    "sql": SqlFields,
    "sql_tx": SqlTxFields,
    "sql_await": SqlAwaitFields,
    "nats": NatsFields,
    "grpc": GrpcFields,
    "kafka": KafkaFields,
}
"""Every kind by name, in the order the docs list them."""


def step_schema() -> dict[str, Any]:
    """A JSON Schema of one declared step (every kind), for the config's schema and for editors."""
    union = Annotated[
        ToolFields
        | HttpFields
        | GraphqlFields
        | CommandFields
        | MockFields
        | ValueFields
        | TransformFields
        | CelGateFields
        | PluginTransformFields
        | LogFields
        | ProgressFields
        | ElicitationFields
        | SamplingFields
        | RootsListFields
        | GatherFields
        | ParallelFields
        | PipeFields
        | SqlFields
        | SqlTxFields
        | SqlAwaitFields
        | NatsFields
        | GrpcFields
        | KafkaFields,
        msgspec.Meta(description="A declared pipeline step: kind, id, and the kind's fields."),
    ]
    return msgspec.json.schema(union)
