"""The server's configuration: ``mcpipe.toml`` / ``.yaml`` / ``.json``, decoded into msgspec Structs.

Every section is decoded on its own so that one run reports every problem it can find, each with its
location (``mcpServers.github.args[1]``), instead of stopping at the first. Unknown keys are errors: a typo
must not be silently ignored.

``${VAR}`` and ``${VAR:-default}`` in a downstream server's ``command``, ``args``, ``env``, ``cwd``, ``url``
and ``headers`` are read from the environment when the config is loaded (the convention MCP clients use),
so secrets stay out of the file. Bearer tokens for ``auth`` are always named by environment variable.

:func:`load` (a file) and :func:`parse` (a document) answer a :class:`Loaded`: the config and what it declares
(pipelines, playbooks, piraeus's flows, the workflow) compiled once, which ``mcpipe check``, ``serve`` and
``convert`` share; :func:`load_config` and :func:`parse_config` answer only the config.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
import yaml

from mcpipe._describe import did_you_mean, split_msgspec_error
from mcpipe._json import DuplicateKeyError, check_unique_keys
from mcpipe._struct import Strict
from mcpipe._util import PIPE_TOOL
from mcpipe._yaml import load_yaml
from mcpipe.access import (
    AccessConfig,
    CredentialConfig,
    IntrospectionProvider,
    MtlsConfig,
    OidcProvider,
    ResourceConfig,
    ScopeRule,
    check_access,
    check_credentials,
    check_introspection,
    check_mtls,
    check_oidc,
    check_resource,
    check_scopes,
    reserved_prefix,
)
from mcpipe.errors import UNSET_ENV, UNSET_ENV_PER_CALL, ConfigError, ErrorCode, Problem
from mcpipe.openapi import OpenApiConfig, check_openapi
from mcpipe.plan import Limits, deepest_location, json_depth
from mcpipe.store import ContentConfig
from mcpipe.toolset import ToolsConfig, check_tools

if TYPE_CHECKING:  # their packages are imported when a config has the section (NoETL, piraeus: start-up)
    from mcpipe.backends.sql import SqlBackendConfig
    from mcpipe.declared import DeclaredPipelines, KnownTools, OutboundConfig, PipelineConfig
    from mcpipe.formats import Context
    from mcpipe.formats.noetl import PlaybookEntry
    from mcpipe.formats.piraeus import PiraeusConfig
    from mcpipe.kinds import StepPolicy
    from mcpipe.models import ModelConfig
    from mcpipe.store.content import ContentStores
    from mcpipe.workflow import WorkflowConfig

__all__ = [
    "DEFAULT_CONFIG",
    "TRUST_ROOTS",
    "AppsConfig",
    "AuditConfig",
    "AuthConfig",
    "Config",
    "ConfigError",
    "ConsoleConfig",
    "ContentConfig",
    "HttpConfig",
    "Loaded",
    "McpServerConfig",
    "PipeConfig",
    "RegistryConfig",
    "ReloadConfig",
    "StoreConfig",
    "TelemetryConfig",
    "TokenConfig",
    "TrustConfig",
    "TrustRule",
    "load",
    "load_config",
    "no_pipe_reason",
    "parse",
    "parse_config",
]

CODE = ErrorCode.INVALID_CONFIG
MAX_CONFIG_DEPTH = 128
"""How deeply any value of a config may nest (declared pipelines' templates included)."""

_log = logging.getLogger("mcpipe.config")


class DownstreamOAuth(Strict):
    """A downstream HTTP server that requires OAuth (``[mcpServers.NAME.oauth]``): mcpipe is its OAuth client, as
    the MCP authorization spec has it (discovery from its 401, protected resource and authorization server
    metadata, a client id metadata document or dynamic registration, PKCE, ``resource``)."""

    per_user: bool = False
    """Each principal signs in with its own account (asked through URL-mode elicitation); false: one shared
    account, the operator's (``mcpipe auth login NAME``)."""
    scopes: list[str] | None = None
    """The scopes asked for (default: the server's challenge, else its ``scopes_supported``)."""
    client_id: str | None = None
    """A client registered beforehand at the server's authorization server (no registration then)."""
    client_secret: str | None = None
    client_secret_env: str | None = None
    token_endpoint_auth_method: (
        Literal["none", "client_secret_basic", "client_secret_post", "private_key_jwt"] | None
    ) = None
    grant: Literal["authorization_code", "client_credentials"] = "authorization_code"
    """``client_credentials``: mcpipe's own machine token for every caller, no person signs in (SEP-1046)."""
    private_key_env: str | None = None
    """``private_key_jwt``: the environment variable holding the client's private key (PEM), which signs its
    assertion (RFC 7523)."""
    signing_algorithm: Literal["ES256", "ES384", "RS256", "PS256", "EdDSA"] = "ES256"
    allow_private: bool = False
    """Let discovery, registration and token requests reach private and loopback addresses (an in-house
    server; tests). Otherwise metadata naming such an address is refused."""


class McpServerConfig(Strict):
    """One downstream MCP server, in the format MCP clients use (plus mcpipe's own keys).

    Exactly one of ``command`` (stdio) or ``url`` (streamable HTTP) is set.
    """

    type: Literal["stdio", "http", "streamable-http", "streamableHttp"] | None = None
    command: str | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = {}
    prefix: str | None = None
    include: list[str] | None = None
    exclude: list[str] = []
    connect: Literal["lazy", "start"] = "start"
    protocol: Literal["auto", "2025-11-25", "2026-07-28"] = "auto"
    session_per_era: bool | None = None
    """With ``protocol = "auto"``: 2025-11-25 callers get a 2025-11-25 session of their own (None: over HTTP
    only; over stdio that is a second process, with state of its own)."""
    enabled: bool = True
    timeout_ms: int | None = None
    connect_timeout_ms: int = 10_000
    max_tools: Annotated[int, msgspec.Meta(ge=1)] = 1000
    """The most tools kept of this server's list (the first ones listed, after ``include``/``exclude``); past it
    the rest are left out, in one log line naming the server and the bound."""
    credential: str | None = None
    """A ``[credentials.NAME]`` whose token (``Authorization: Bearer ...``) every call to this HTTP server carries:
    one token for all callers (``client_credentials``, ``env``), or each caller's own (``token_exchange``,
    ``id_jag``: listing and connecting then go without one, as mcpg lists such an upstream anonymously)."""
    sse_poll_ms: Annotated[int, msgspec.Meta(ge=1, le=3_600_000)] | None = None
    """SSE polling (SEP-1699) for a server that cannot close a call's stream itself (stdio): once a call to
    one of its tools has run this long, mcpipe closes its caller's SSE stream of the request (2025-11-25 HTTP
    callers that can resume), and again each time the call has run twice as long as at the last close; the
    caller comes back for the rest with ``Last-Event-ID``. Unset: a caller's stream closes only when the
    server closes its own (HTTP)."""
    expose: list[Literal["tools", "resources", "resource_templates", "prompts"]] = msgspec.field(
        default_factory=lambda: ["tools", "resources", "resource_templates", "prompts"]
    )
    """What of this server is served: its tools, resources, resource templates, prompts (default: all)."""
    forward_bearer: bool = False
    """Each call carries the caller's own bearer token (``Authorization``) to this HTTP server."""
    oauth: DownstreamOAuth | None = None
    """The server requires OAuth: mcpipe signs in to it (the operator's shared account, or each principal's own)."""
    mcp_pipeline: bool = False
    """This server is a discord-mcp: mcpipe serves its ``mcp_pipeline`` (``<prefix>.mcp_pipeline``) in place of
    the server's own, running each call's steps over this server's tools (``docs/formats/discord.md``)."""

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"


class PipeConfig(Strict):
    """``mcp_pipe`` and the limits every pipeline runs under (``docs/reliability.md``)."""

    enabled: bool = True
    max_steps: int = 50
    max_depth: int = 5
    max_concurrency: int = 8
    timeout_ms: int | None = None
    max_items: int = 100
    max_calls: int = 1000
    """The most leaf step executions one run may make in all (nested ``for_each`` multiplies)."""
    max_step_runs: int = 100
    """The most times one step of a graph (a NoETL workflow) may run in one run, reached again by an arc back
    to it (pagination and polling by arcs); each run past the first counts towards ``max_calls`` too."""
    idempotent_tools: list[str] = msgspec.field(default_factory=list)
    max_spec_bytes: int = 4 * 1024 * 1024
    """The largest spec, refused before anything is compiled."""
    max_json_depth: int = 64
    """How deeply any JSON value (templates, tool arguments, step outputs) may nest."""
    max_output_bytes: int = 8 * 1024 * 1024
    """The most one step's output, or one interpolated string, may hold."""
    max_answer_bytes: int = 32 * 1024 * 1024
    """The most one pipeline's answer may hold as sent (both representations), and one direct call's result."""
    expression_timeout_ms: int = 1000
    """The deadline of one CEL, JSONata or Jinja evaluation a caller reaches, and of one schema pattern matched
    by the fallback engine."""
    compile_cache_bytes: int = 64 * 1024 * 1024
    """The most memory the plan cache holds, each plan charged what it holds: 64 x its spec text + 256 per
    reference (at most 512 entries)."""
    mcp_pipeline: bool = False
    """Serve discord-mcp's ``mcp_pipeline`` beside ``mcp_pipe``, over every tool (``docs/formats/discord.md``)."""
    answer: Literal["result", "steps", "full"] = "result"
    """What an ``mcp_pipe`` answer holds when its spec does not say (its ``answer``): the result (and what ran, when
    the run failed), a summary per step, or every step's full record (``docs/pipelines.md``)."""

    def limits(self) -> Limits:
        """These limits as the runtime takes them."""
        return Limits(
            self.max_steps,
            self.max_depth,
            self.max_concurrency,
            self.timeout_ms,
            max_spec_bytes=self.max_spec_bytes,
            max_json_depth=self.max_json_depth,
            max_output_bytes=self.max_output_bytes,
            max_answer_bytes=self.max_answer_bytes,
            expression_timeout_ms=self.expression_timeout_ms,
            max_items=self.max_items,
            idempotent_tools=tuple(self.idempotent_tools),
            max_calls=self.max_calls,
            max_step_runs=self.max_step_runs,
        )


class TokenConfig(Strict):
    env: str
    principal: str
    tools: list[str] = msgspec.field(default_factory=lambda: ["*"])
    scopes: list[str] = []
    """The OAuth scopes this token stands for (``[[auth.scopes]]`` rules apply to its caller too)."""


class AuthConfig(Strict):
    """Who may call over HTTP (``docs/access.md``): bearer tokens, JWTs of OIDC issuers, client certificates
    forwarded by a proxy. With any of them set, a request without a valid identity is answered 401."""

    tokens: list[TokenConfig] = []
    oidc: list[OidcProvider] = []
    introspection: list[IntrospectionProvider] = []
    """Authorization servers whose opaque tokens are checked by RFC 7662 introspection."""
    mtls: MtlsConfig | None = None
    resource: ResourceConfig | None = None
    """mcpipe as an OAuth resource server: its canonical URL and protected resource metadata (served whenever
    ``oidc`` or ``introspection`` is configured, with these defaults when unset)."""
    scopes: list[ScopeRule] = []
    """The OAuth scope each tool, prompt and resource needs."""
    tools: list[str] = msgspec.field(default_factory=lambda: ["*"])
    """The tools a caller identified by ``oidc`` or ``mtls`` may call (a token's own ``tools`` win for its
    principal)."""


class OAuthClientConfig(Strict):
    """mcpipe as an OAuth client of downstream servers (``[oauth]``; ``docs/access.md``): where it keeps tokens,
    the redirect URI its sign-ins come back to, and the bounds of sign-ins."""

    callback_url: str | None = None
    """The redirect URI registered at downstream authorization servers (mcpipe answers it at its path). Default:
    the origin of ``auth.resource.url``, else ``http://<http.host>:<http.port>``, and ``callback_path``."""
    callback_path: str = "/oauth/callback"
    store: str = "memory://"
    """``memory://``, ``sqlite:///PATH`` (relative to the config; ``sqlite:////ABS``), or ``redis://...``."""
    key_env: str = "MCPIPE_OAUTH_KEY"
    """The environment variable holding the key ring tokens are sealed with (comma-separated; the first seals):
    required for a ``sqlite`` or ``redis`` store, else tokens would not open after a restart."""
    client_name: str = "mcpipe"
    client_metadata_url: str | None = None
    """An https URL that is mcpipe's client id (a Client ID Metadata Document, which mcpipe serves at its path);
    used where the authorization server supports them, else dynamic registration."""
    sign_in_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 600.0
    """How long a sign-in may take (its ``state`` expires then, and a call waiting for it fails)."""
    max_pending_per_principal: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 8
    """The most sign-ins one principal may have under way (past it the oldest is dropped)."""
    max_pending: Annotated[int, msgspec.Meta(ge=1)] = 10_000
    """The most sign-ins under way, for everyone (past it a new one is refused)."""
    max_user_sessions: Annotated[int, msgspec.Meta(ge=1)] = 256
    """The most per-user downstream sessions kept open per server (the least recently used is closed)."""
    refresh_before_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 60.0
    """A token is refreshed when it expires within this long."""
    timeout_ms: Annotated[int, msgspec.Meta(ge=100, le=60_000)] = 5000
    """Each metadata, registration or token request."""


class AuditConfig(Strict):
    enabled: bool = True
    path: str = "mcpipe-audit.jsonl"
    format: Literal["mcpipe", "mcpg"] = "mcpipe"
    """``mcpipe``: one record per call; ``mcpg``: mcpg's audit events (``mcpg.tool.call.allowed`` before the
    call, ``completed``/``denied``/``unknown`` after), hash-chained (``docs/access.md``)."""
    emit_allowed: bool = True
    """``mcpg`` format: write ``mcpg.tool.call.allowed`` before each call."""
    emit_completed: bool = True
    """``mcpg`` format: write ``mcpg.tool.call.completed`` after each call that answered."""


class HttpTlsConfig(Strict):
    """HTTPS: the server's certificate, and (optionally) the client certificates it asks for."""

    cert_file: str
    """The server's certificate chain (PEM)."""
    key_file: str
    """Its private key (PEM)."""
    min_version: Literal["1.2", "1.3"] = "1.2"
    client_ca_file: str | None = None
    """The CA certificates (PEM) a client certificate must chain to."""
    client_cert: Literal["none", "optional", "required"] = "none"
    """Whether a client must present a certificate (``required``: the TLS handshake fails without a valid
    one), may (``optional``: one that does not verify fails it), or is not asked (``none``)."""


class HttpConfig(Strict):
    host: str = "127.0.0.1"
    port: int = 8765
    path: str = "/mcp"
    allowed_hosts: list[str] | None = None
    allowed_origins: list[str] | None = None
    dns_rebinding_protection: bool = True
    json_response: bool = False
    session_idle_timeout_s: float | None = 1800.0
    max_body_bytes: int = 4 * 1024 * 1024
    body_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    """How long a request body may take to arrive, in all; a slower one is answered 408."""
    head_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=300)] = 10.0
    """How long a request head may take to arrive: a connection's first from its accept, each later one from
    its first byte; a slower one is answered 408 and its connection closed (heads dripping a byte at a time
    would hold a connection slot until hypercorn's 75 s keep-alive)."""
    front: Literal["own", "hypercorn"] = "own"
    """What reads plain HTTP/1.1 requests: mcpipe's own front (``own``: its head parsed in the Rust core, the
    app called in the connection's task; anything not plain, TLS included, goes to hypercorn's protocol), or
    hypercorn's protocol for every connection (``hypercorn``, as before 4 December 2026)."""
    resumable_streams: bool = True
    """2025-11-25 SSE streams open with a priming event and are kept in an event store, so a client that
    lost the connection reconnects with ``Last-Event-ID`` and gets what it missed."""
    sse_retry_ms: Annotated[int, msgspec.Meta(ge=0, le=3_600_000)] | None = 1000
    """The ``retry`` the priming event suggests (how long a client waits before reconnecting)."""
    event_store_max_events: Annotated[int, msgspec.Meta(ge=1)] = 10_000
    """The most SSE events kept for replay, across sessions (the oldest go first)."""
    event_store_max_bytes: Annotated[int, msgspec.Meta(ge=1)] = 16 * 1024 * 1024
    """The most bytes of messages kept for replay, across sessions."""
    workers: Annotated[int, msgspec.Meta(ge=1, le=256)] = 1
    """Worker processes sharing the port (``mcpipe serve --workers``; ``docs/deployment.md``)."""
    max_connections: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """The most connections served at once; past it a few more are answered at once (``/healthz``, or 503
    ``busy``) and the rest wait in the kernel's backlog. Unset: what the descriptor limit allows (the limit less
    a reserve of a quarter, at most 256, for everything else the server opens; at most 4096)."""
    max_sessions: Annotated[int, msgspec.Meta(ge=1)] = 10_000
    """The most 2025-11-25 sessions open at once, for all principals; past it a new one is refused (503)."""
    max_sessions_per_principal: Annotated[int, msgspec.Meta(ge=1)] = 100
    """The most 2025-11-25 sessions one principal (one bearer token's, or without auth one client address)
    may have open at once; past it that principal's new session is refused (429), everyone else's is not."""
    max_sessions_per_tenant: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """The most 2025-11-25 sessions one tenant may have open at once (unset: no such cap): a tenant is the
    caller's subject qualified by how it was established (a verified token's issuer and provider, or the
    trusted subject header), and every anonymous caller shares one; past it that tenant's new session is
    refused (429, JSON-RPC -32099 ``per-tenant session quota exceeded``, as mcpg answers). Counted per process."""
    health_path: str = "/healthz"
    """Where the health endpoint answers."""
    access_log: bool = False
    """Log one line per HTTP request (method, path, status, duration) at INFO on ``mcpipe.access``."""
    anonymous_rate_limit_per_min: Annotated[int, msgspec.Meta(ge=0)] = 0
    """Requests per minute one client address may make without a credential (0: unlimited); past it the
    request is answered 429."""
    anonymous_rate_limit_burst: Annotated[int, msgspec.Meta(ge=0)] = 0
    """How many of those requests may come at once (0: the per-minute figure)."""
    tls: HttpTlsConfig | None = None
    """Serve HTTPS (unset: plain HTTP, for a TLS-terminating proxy in front)."""


TrustLevel = Literal["unauthenticated", "header_asserted", "verified"]


class TrustRule(Strict):
    """What one tool (or prompt, or resource) asks of its caller (``docs/formats/mcpg.md``, trust levels)."""

    minimum_trust: TrustLevel | None = None
    """The least trust a caller needs (None: ``trust.default_minimum_trust``)."""
    allow_if: str | None = None
    """A CEL expression over the caller (``principal_id``, ``trust_level``, ``auth_provider``,
    ``identity_kind``, ``identity``, ``tool_name``) that must hold."""
    required_scopes: list[str] = []
    """OAuth scopes the caller's credential must carry."""


class TrustConfig(Strict):
    """Who may call what, by how far the caller's identity is established (mcpg's trust levels; see
    :mod:`mcpipe.trust`).

    A caller is ``verified`` (an ``auth.tokens`` bearer token, or a verified identity), ``header_asserted``
    (no credential, but the ``subject_header`` a trusted proxy sets), or ``unauthenticated``. Each tool needs
    a trust level (its rule's, else ``default_minimum_trust``) and passes ``allow_if`` and its own rule's."""

    subject_header: str | None = None
    """A request header whose value names the caller, trusted as header-asserted (unset: never trusted)."""
    default_minimum_trust: TrustLevel = "unauthenticated"
    allow_if: str | None = None
    """A CEL expression every call must satisfy (see :class:`AccessRule`)."""
    tools: dict[str, TrustRule] = {}
    """Rules by tool, prompt or resource name; a name ending with ``*`` covers every name it begins
    (``notion.*``: a downstream server's tools, prompts and resources): an exact name wins over a pattern, the
    longest pattern over a shorter one."""


class CachingConfig(Strict):
    """Cache hints list and read results carry (as mcpg answers them), where the protocol version has them
    (2026-07-28; the SDK leaves them out of older versions' results)."""

    list_ttl_ms: Annotated[int, msgspec.Meta(ge=0)] = 60_000
    """``ttlMs`` of ``tools/list``, ``prompts/list``, ``resources/list``, ``resources/templates/list``."""
    read_ttl_ms: Annotated[int, msgspec.Meta(ge=0)] = 30_000
    """``ttlMs`` of a ``resources/read`` of the config's own resources."""
    scope: Literal["private", "public"] = "private"
    """``cacheScope``: whether a shared cache may keep the result."""
    every_era: bool = False
    """Also on the protocol versions before 2026-07-28, whose results have no such fields: clients of those
    versions ignore them (as mcpg sends them to every client)."""


class InteractionConfig(Strict):
    """Pipelines that ask the client (``docs/interaction.md``): how suspended 2026-07-28 pipelines are kept."""

    state_key_env: str = "MCPIPE_STATE_KEY"
    """The environment variable holding the requestState key ring (comma-separated, each at least 32 bytes;
    the first seals). Unset: a random key of this process."""
    state_ttl_s: Annotated[float, msgspec.Meta(gt=0, le=7 * 86400)] = 600.0
    """How long a suspended pipeline can be resumed (at most a week: a state must expire)."""
    inline_max_bytes: Annotated[int, msgspec.Meta(ge=0)] = 16384
    """States larger than this stay in the pipeline store; the client holds an opaque handle."""
    sweep_interval_s: Annotated[float, msgspec.Meta(ge=0.1, le=86400)] = 30.0
    """How often expired suspended pipelines are swept from the store."""
    max_suspended: Annotated[int, msgspec.Meta(ge=1)] = 1000
    """The most suspended pipelines the in-memory store keeps; past it the oldest is evicted."""
    max_suspended_bytes: Annotated[int, msgspec.Meta(ge=1)] = 64 * 1024 * 1024
    """The most bytes of suspended states the in-memory store keeps; past it the oldest are evicted."""
    max_claims: Annotated[int, msgspec.Meta(ge=1)] = 100_000
    """The most one-use claims (ids of resumed states) the in-memory store keeps; past it the soonest-expiring
    are evicted, and states expiring no later than those can no longer be resumed (a replay stays refused)."""


class RunsConfig(Strict):
    """Runs that outlive a request: background pipelines, the queue, the workers (``docs/runs.md``)."""

    path: str | None = None
    """The SQLite file queued runs wait in (relative to the config file); unset: in this process's memory
    (runs are lost with it, and only this process's worker executes them)."""
    execute: bool = True
    """Whether ``mcpipe serve`` executes queued runs too (``mcpipe worker`` always does)."""
    concurrency: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 8
    """How many runs one process executes at once."""
    lease_s: Annotated[float, msgspec.Meta(ge=0.5, le=3600)] = 10.0
    """How long a worker holds a run without renewing it; a dead worker's runs are taken over after it."""
    max_lapses: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 3
    """How many times a run's lease may run out while it runs (its worker died, or stalled past the lease)
    before the next worker to lease it fails it instead of running it again: a run that kills or freezes
    every worker that takes it (a poison pill) is not retried for ever."""
    retention_s: Annotated[float, msgspec.Meta(gt=0, le=365 * 86400)] = 7 * 86400.0
    """How long a finished run, its recorded steps and its events are kept."""
    poll_ms: Annotated[float, msgspec.Meta(ge=1, le=60_000)] = 50.0
    """SQLite: how often an idle worker looks for work (Redis blocks instead)."""
    max_run_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 16 * 1024 * 1024
    """The most one run keeps (its arguments, its recorded steps, its answer, as stored JSON): arguments past it
    are refused when the run is submitted, steps past it fail the run (``OUTPUT_TOO_LARGE``), and an answer
    past it is kept as that error instead."""
    max_run_events: Annotated[int, msgspec.Meta(ge=16)] = 10_000
    """The most events one run keeps (each charged to its ``max_run_bytes``); past it, or past those bytes, its
    step events are dropped (one ``events_dropped`` event says so) and the run goes on."""
    max_runs: Annotated[int, msgspec.Meta(ge=1)] = 1000
    """The most runs the queue keeps (SQLite and Redis): past it the oldest finished runs are dropped first;
    when the queue holds only live (queued, running, waiting for input) runs, a new one is refused
    (``LIMIT_EXCEEDED``)."""
    max_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 256 * 1024 * 1024
    """The most bytes of runs the queue keeps, bounded the same way as ``max_runs``."""
    max_runs_per_principal: Annotated[int, msgspec.Meta(ge=1)] = 250
    """The most live runs (queued, running, waiting for input) one principal may have; past it that
    principal's new runs and tasks are refused (``LIMIT_EXCEEDED``), everyone else's are not."""
    max_bytes_per_principal: Annotated[int, msgspec.Meta(ge=1024)] = 64 * 1024 * 1024
    """The most bytes of live runs one principal may have, bounded the same way."""
    parked_ttl_s: Annotated[float, msgspec.Meta(gt=0, le=30 * 86400)] = 3600.0
    """How long a run (a task) may wait for its client's input (``input_required``); then it fails
    (``TIMEOUT``) and no longer counts against the bounds above. Checked also when a server starts."""


class StoreConfig(Strict):
    """Where suspended pipelines, used-state claims and (``redis://``) queued runs live (``docs/deployment.md``,
    ``docs/runs.md``)."""

    url: str = "memory://"
    """``memory://`` (this process only, bounded by ``interaction.max_suspended`` and
    ``max_suspended_bytes``) or ``redis://[:PASSWORD@]HOST:PORT/DB`` (shared by every instance; also
    ``rediss://`` and ``unix://``). ``${VAR}`` and ``${VAR:-default}`` are read from the environment."""
    timeout_ms: Annotated[int, msgspec.Meta(ge=1, le=60_000)] = 2000
    """A shared store's bound on connecting and on each command."""
    prefix: str = "mcpipe"
    """A shared store's key prefix (servers with different prefixes can share a database)."""


class TelemetryConfig(Strict):
    """Metrics and traces (``docs/deployment.md``)."""

    metrics: bool = True
    """Serve ``GET /metrics`` (Prometheus text format)."""
    metrics_path: str = "/metrics"
    """Where the metrics are served."""
    otlp_endpoint: str | None = None
    """With ``traces = "otlp"``: the collector (else the standard ``OTEL_EXPORTER_OTLP_*`` variables)."""
    otlp_protocol: Literal["grpc", "http/protobuf"] = "http/protobuf"
    """How spans reach ``otlp_endpoint``: OTLP over gRPC (port 4317) or over HTTP (4318)."""
    service_name: str | None = None
    """The ``service.name`` of the spans (default: the config's ``name``)."""
    resource_attributes: dict[str, str] = {}
    """More resource attributes on every span (``deployment.environment``...)."""
    traces: Literal["none", "propagate", "console", "otlp"] | None = None
    """Where OpenTelemetry spans go: ``console``, ``otlp``; ``propagate`` records none but carries the
    caller's ``traceparent`` on to downstream servers; ``none`` is off. Unset: the standard OTEL_* variables
    decide, and without them, off."""
    max_tool_labels: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 200
    """The most distinct tool names the metrics label (each costs about 21 series); the calls of tools past it
    count under ``tool="other"``."""
    max_principal_labels: Annotated[int, msgspec.Meta(ge=0, le=100_000)] = 200
    """The most distinct principals ``mcpipe_principal_calls`` labels (the first seen; later ones count under
    ``principal="other"``; 0: calls are not counted by principal)."""


class LogsConfig(Strict):
    """Where ``mcpipe serve`` writes its log besides stderr (``docs/server.md``)."""

    file: str | None = None
    """Also append the log to this file (relative to the config's directory)."""
    format: Literal["json", "text"] = "json"
    """``json``: one object per line (``ts``, ``level``, ``logger``, ``message``); ``text``: as on stderr."""


class AppsCspPolicy(Strict):
    """The widest Content-Security-Policy an app's ``_meta.ui.csp`` may ask for, per axis: an app's list is
    intersected with it (``["*"]``: no bound; an axis the app leaves out stays out)."""

    connect_domains: list[str] = msgspec.field(default_factory=lambda: ["*"])
    resource_domains: list[str] = msgspec.field(default_factory=lambda: ["*"])
    frame_domains: list[str] = msgspec.field(default_factory=lambda: ["self"])
    base_uri_domains: list[str] = msgspec.field(default_factory=lambda: ["self"])
    redirect_domains: list[str] = msgspec.field(default_factory=lambda: ["*"])


class AppsConfig(Strict):
    """MCP Apps (the ``io.modelcontextprotocol/ui`` extension, SEP-1865: ``ui://`` resources of type
    ``text/html;profile=mcp-app`` a host renders, tools pointing at them with ``_meta.ui.resourceUri``;
    ``docs/server.md``)."""

    enabled: bool = False
    """Advertise the extension (``capabilities.extensions``) and clamp every ``_meta.ui`` served."""
    strict: bool = False
    """Refuse (-32603) a list or read whose ``_meta.ui`` goes beyond the policy, instead of narrowing it."""
    csp_policy: AppsCspPolicy = msgspec.field(default_factory=AppsCspPolicy)
    allowed_permissions: list[Literal["camera", "microphone", "geolocation", "clipboardWrite"]] = msgspec.field(
        default_factory=lambda: ["camera", "microphone", "geolocation", "clipboardWrite"]
    )
    """The iframe permissions an app may request (``_meta.ui.permissions``); the others are stripped."""
    allowed_domains: Annotated[list[str], msgspec.Meta(min_length=1)] | None = None
    """The sandbox origins an app may ask for (``_meta.ui.domain``); unset: any."""


class RegistryServerConfig(Strict):
    """What one registry server is given beyond what the registry says (by its registry name)."""

    enabled: bool = True
    version: str | None = None
    """Pin this version (default: the registry's latest)."""
    variables: dict[str, str] = {}
    """Values of its remote URL's ``{variable}`` templates."""
    headers: dict[str, str] = {}
    """Values of its remote's declared request headers."""
    credential: str | None = None
    """A ``[credentials.NAME]`` for this server (default: the registry's ``credential``)."""


class RegistrySourceConfig(Strict):
    """An MCP registry (its ``/v0.1/servers`` API) whose servers are served as downstream servers, kept in step
    with it (``docs/server.md``)."""

    name: Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9-]+$")]
    """Prefixes the servers' names (``<name>--<server>``)."""
    url: str
    headers: dict[str, str] = {}
    """Headers every request to the registry carries (``Authorization: Bearer ...``, an API key)."""
    allow_private: bool = False
    """The registry may be at a private or loopback address."""
    allow_http: bool = False
    """The registry may be plain ``http://``."""
    interval_s: Annotated[int, msgspec.Meta(ge=30)] = 300
    max_servers: Annotated[int, msgspec.Meta(ge=1)] = 100
    """The most servers served from it (by name, the rest left out and logged)."""
    include: list[str] = msgspec.field(default_factory=lambda: ["*"])
    """Server names (exact, or ending with ``*``) served."""
    exclude: list[str] = []
    namespaces: list[str] = []
    """Only servers of these publisher namespaces (the part of the name before ``/``); empty: any."""
    deprecated: Literal["serve", "exclude"] = "serve"
    trust: TrustRule | None = None
    """The rule every server's tools, resources and prompts are held to (``<prefix>.*``)."""
    expose: list[Literal["tools", "resources", "resource_templates", "prompts"]] = msgspec.field(
        default_factory=lambda: ["tools", "resources", "resource_templates", "prompts"]
    )
    allow_private_servers: bool = False
    """A server may be at a private or loopback address (its URL is https, always)."""
    forward_bearer: bool = False
    """Each call carries the caller's own bearer token to the server."""
    credential: str | None = None
    """A ``[credentials.NAME]`` whose token the servers are given (``{server}`` in it: one per server, named by
    the server's registry name)."""
    credential_env: str | None = None
    """When no ``[credentials]`` entry has that name: the environment variable holding the server's static token
    (``{server}`` in it: the server's registry name, upper-cased, every other character ``_``)."""
    oauth_discovery: bool = False
    """Find each server's authorization server (RFC 9728, then RFC 8414) before serving it; a server whose
    discovery fails and never succeeded is left out."""
    servers: dict[str, RegistryServerConfig] = {}


class RegistryConfig(Strict):
    """Serving this server as an MCP registry's only entry (the registry API's ``GET /v0.1/servers`` and
    ``GET /v0.1/servers/{name}/versions/{version}``), so registry-driven clients find it (``docs/server.md``)."""

    enabled: bool = False
    name: str = ""
    """Its registry name, reverse-DNS namespaced: ``com.acme/gateway``."""
    description: str | None = None
    url: str | None = None
    """The MCP endpoint clients are to use (the entry's ``streamable-http`` remote); unset: the entry is not
    listed (a registry cannot point at a guessed address)."""


class ReloadConfig(Strict):
    """Serving a new version of the config file without a restart (``docs/server.md``): SIGHUP reloads it, and
    with ``watch`` the server polls the file."""

    watch: bool = False
    """Read the file every ``poll_ms`` and reload it when its bytes change (SHA-256)."""
    poll_ms: Annotated[int, msgspec.Meta(ge=1000, le=3_600_000)] = 5000
    """How often the file is read."""


class ConsoleConfig(Strict):
    """The web console ``mcpipe serve`` serves at ``/console`` and its JSON API at ``/api/v1`` (``docs/console.md``),
    on the MCP endpoint's listener, behind its auth and front checks."""

    enabled: bool = False
    """Serve it (``mcpipe serve --console`` too). Off by default: it shows runs, tools and metrics."""
    operators: list[str] = []
    """Principals that see and act on every run (the others see only their own)."""
    operator_roles: list[str] = msgspec.field(default_factory=lambda: ["operator"])
    """Roles (of an OIDC identity, by its claim mappings) that make a caller an operator."""
    session_ttl_s: Annotated[int, msgspec.Meta(ge=60, le=30 * 86400)] = 8 * 3600
    """How long a browser stays signed in (never past the JWT it signed in with)."""
    page_size: Annotated[int, msgspec.Meta(ge=1, le=500)] = 50
    """Runs per page of the runs list."""
    max_streams: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 64
    """The most event streams (live pages) open at once; past it a page shows what it has, without updates."""
    secure_cookies: bool | None = None
    """Mark the session cookie ``Secure`` (sent over HTTPS only): ``true`` always; ``false`` only when mcpipe
    serves HTTPS itself (``[http.tls]``); unset (automatic): also when the server's public URL
    (``auth.resource.url``) is https, or a request reached the proxy before mcpipe over HTTPS
    (``X-Forwarded-Proto: https``, or an ``https://`` Origin)."""


class Config(Strict):
    """The whole config. Every key is optional; an empty file is the embedded default minus built-ins.

    Each section is a Struct of the package that owns it (``access``, ``openapi``, ``toolset``, ...). Those of
    ``pipelines``, ``outbound``, ``sql``, ``models``, ``workflow``, ``playbooks`` and ``piraeus`` belong to
    packages of the layers below (``declared``, ``backends``, ``models``, ``workflow``, ``formats``) that are
    slow to import: they are named here for the type checker only, and each package decodes its section when a
    file has it (:func:`parse`), with its own located messages.
    """

    name: str = "mcpipe"
    mcpServers: dict[str, McpServerConfig] = {}
    python_tools: list[str] = []
    builtins: bool | list[str] = True
    unknown_tool: Literal["result", "error"] = "result"
    """How a call naming no tool is answered: an error result (``UNKNOWN_TOOL: unknown tool 'x'``), or the
    JSON-RPC error -32602 (``unknown tool: x``), as MCP's spec suggests and mcpg answers."""
    pipe: PipeConfig = msgspec.field(default_factory=PipeConfig)
    auth: AuthConfig = msgspec.field(default_factory=AuthConfig)
    trust: TrustConfig | None = None
    """Trust levels and per-tool rules (None: any caller auth lets in may call any tool it is granted)."""
    costs: dict[str, float] = {}
    audit: AuditConfig = msgspec.field(default_factory=AuditConfig)
    http: HttpConfig = msgspec.field(default_factory=HttpConfig)
    interaction: InteractionConfig = msgspec.field(default_factory=InteractionConfig)
    caching: CachingConfig | None = None
    """Cache hints on list and read results (None: ``ttlMs: 0``, as lists change when servers come and go)."""
    runs: RunsConfig = msgspec.field(default_factory=RunsConfig)
    store: StoreConfig = msgspec.field(default_factory=StoreConfig)
    telemetry: TelemetryConfig = msgspec.field(default_factory=TelemetryConfig)
    pipelines: list[PipelineConfig] = []
    """Declared pipelines, each served as a tool (``docs/declared-pipelines.md``); decoded and compiled by
    :mod:`mcpipe.declared`, which owns their format (:class:`mcpipe.declared.PipelineConfig`)."""
    outbound: OutboundConfig | None = None
    """What declared steps may reach (hosts for ``http``/``graphql``, commands); see the same doc. Decoded by
    :mod:`mcpipe.declared` (:class:`mcpipe.declared.OutboundConfig`)."""
    sql: dict[str, SqlBackendConfig] = {}
    """Named SQL backends (``[sql.NAME] url = ...``) for the ``sql``, ``sql_tx`` and ``sql_await`` steps;
    decoded by :mod:`mcpipe.declared` (``load_sql``; :class:`mcpipe.backends.sql.SqlBackendConfig`)."""
    models: dict[str, ModelConfig] = {}
    """Model presets by name (``[models.NAME]``), decoded by :mod:`mcpipe.models` (``docs/workflow.md``)."""
    workflow: WorkflowConfig | None = None
    """The LLM workflow tool and its HTTP tools, decoded and checked by :mod:`mcpipe.workflow`
    (``docs/workflow.md``)."""
    logs: LogsConfig = msgspec.field(default_factory=LogsConfig)
    """A log file besides stderr."""
    reload: ReloadConfig = msgspec.field(default_factory=ReloadConfig)
    """Reloading the config while serving (SIGHUP, or watching the file)."""
    registries: list[RegistrySourceConfig] = []
    """MCP registries whose servers are served as downstream servers."""
    content: ContentConfig = msgspec.field(default_factory=ContentConfig)
    """Content stores (``store_content`` steps write, clients read them as resources)."""
    registry: RegistryConfig = msgspec.field(default_factory=RegistryConfig)
    """Serving this server as an MCP registry's entry (``GET /v0.1/servers``)."""
    apps: AppsConfig = msgspec.field(default_factory=AppsConfig)
    """MCP Apps: advertising the extension, and the policy every ``_meta.ui`` served is held to."""
    console: ConsoleConfig = msgspec.field(default_factory=ConsoleConfig)
    """The web console (``docs/console.md``)."""
    access: AccessConfig = msgspec.field(default_factory=AccessConfig)
    """The gates every tool call passes: Cedar policies, rate limits, client-address allowlists
    (``docs/access.md``)."""
    oauth: OAuthClientConfig = msgspec.field(default_factory=OAuthClientConfig)
    """mcpipe as an OAuth client of the downstream servers that require it (``mcpServers.NAME.oauth``)."""
    tools: ToolsConfig = msgspec.field(default_factory=ToolsConfig)
    """The operator's view of the tools: reshaped tools, hidden ones, and tool search (``docs/gateway.md``)."""
    openapi: dict[str, OpenApiConfig] = {}
    """OpenAPI documents whose operations are served as tools (``[openapi.NAME]``, ``docs/openapi.md``)."""
    credentials: dict[str, CredentialConfig] = {}
    """Outbound credentials by name (``[credentials.NAME]``): OAuth tokens and secrets ``http`` steps and
    downstream servers present (``docs/access.md``)."""
    playbooks: list[PlaybookEntry] = []
    """Playbook files served as tools (``docs/playbooks.md``): globs relative to the config, or tables
    ``{files = "GLOB", background = true, task_support = "optional"}`` (``PlaybookFiles``), decoded by
    :mod:`mcpipe.formats.noetl`."""
    piraeus: PiraeusConfig | None = None
    """piraeus's exported tool configs, prompts and flows (``tools``, ``prompts``, ``flows``: globs relative to
    the config), served as tools and prompts; decoded by :mod:`mcpipe.formats.piraeus`
    (``docs/formats/piraeus.md``)."""
    base_dir: str = "."
    """Directory relative paths (``audit.path``, ``cwd``) resolve against: the config file's directory."""
    translated_from: str | None = None
    """The foreign format the file was written in (``mcpg``), read as this layout; None for mcpipe's own."""


def no_pipe_reason(cfg: Config) -> str:
    """Why ``cfg`` serves no ``mcp_pipe``, and how to serve it (said where a caller looks for it)."""
    if cfg.translated_from is not None:
        from mcpipe.formats import format_named

        reason = format_named(cfg.translated_from).no_pipe_reason()
        if reason is not None:
            return reason
    return "its `pipe.enabled` is false"


DEFAULT_CONFIG = Config()
"""What ``mcpipe serve`` runs with no ``--config``: ``mcp_pipe`` plus the built-in tools."""


@dataclass(frozen=True, slots=True)
class _Section:
    key: str
    type: Any
    each: bool = False  # a mapping whose values are decoded one by one (for located errors)


_SECTIONS = {
    "name": _Section("name", str),
    "mcpServers": _Section("mcpServers", McpServerConfig, each=True),
    "python_tools": _Section("python_tools", list[str]),
    "builtins": _Section("builtins", bool | list[str]),
    "unknown_tool": _Section("unknown_tool", Literal["result", "error"]),
    "pipe": _Section("pipe", PipeConfig),
    "auth": _Section("auth", AuthConfig),
    "trust": _Section("trust", TrustConfig | None),
    "costs": _Section("costs", dict[str, float]),
    "audit": _Section("audit", AuditConfig),
    "http": _Section("http", HttpConfig),
    "interaction": _Section("interaction", InteractionConfig),
    "caching": _Section("caching", CachingConfig | None),
    "runs": _Section("runs", RunsConfig),
    "store": _Section("store", StoreConfig),
    "telemetry": _Section("telemetry", TelemetryConfig),
    "pipelines": _Section("pipelines", list[dict[str, Any]]),
    "outbound": _Section("outbound", dict[str, Any] | None),
    "sql": _Section("sql", dict[str, Any]),
    "models": _Section("models", dict[str, Any]),
    "workflow": _Section("workflow", dict[str, Any] | None),
    "playbooks": _Section("playbooks", list[str | dict[str, Any]]),
    "piraeus": _Section("piraeus", dict[str, Any] | None),
    "access": _Section("access", AccessConfig),
    "logs": _Section("logs", LogsConfig),
    "reload": _Section("reload", ReloadConfig),
    "apps": _Section("apps", AppsConfig),
    "console": _Section("console", ConsoleConfig),
    "registry": _Section("registry", RegistryConfig),
    "content": _Section("content", ContentConfig),
    "registries": _Section("registries", list[RegistrySourceConfig]),
    "credentials": _Section("credentials", CredentialConfig, each=True),
    "oauth": _Section("oauth", OAuthClientConfig),
    "openapi": _Section("openapi", OpenApiConfig, each=True),
    "tools": _Section("tools", ToolsConfig),
}

_UNKNOWN = re.compile(r"^Object contains unknown field `(.*)`$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")
_SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_PREFIX = re.compile(r"^[A-Za-z0-9_.-]{0,64}$")


def _located(exc: msgspec.ValidationError, base: str, struct: Any = None) -> Problem:
    """Turn msgspec's ``... - at `$.a.b``` into a Problem located at ``base.a.b``; an unknown key is located
    at the key itself, with the closest known key of ``struct`` when it sits at ``struct``'s level."""
    location, text = split_msgspec_error(str(exc), base)
    if m := _UNKNOWN.match(text):
        key = m.group(1)
        below = _struct_at(struct, location[len(base) :]) if location.startswith(base) else None
        fields = getattr(below, "__struct_encode_fields__", None)
        hint = did_you_mean(key, fields) if fields is not None else ""
        return Problem(f"{location}.{key}" if location else key, CODE, f"unknown key `{key}`{hint}")
    return Problem(location, CODE, text[0].lower() + text[1:] if text else text)


_PATH_PART = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[[^\]]*\]")


def _struct_at(tp: Any, path: str) -> Any:
    """The type found at ``path`` (``.tokens[0]``) below the type ``tp``: through struct fields, list
    items and mapping values (the Struct of an optional field)."""
    for m in _PATH_PART.finditer(path):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if typing.get_origin(tp) in (types.UnionType, typing.Union) and len(args) == 1:
            tp = args[0]
        if m.group(1) is not None:
            field = {f.encode_name: f for f in msgspec.structs.fields(tp)}.get(m.group(1)) if _is_struct(tp) else None
            if field is None:
                return None
            tp = field.type
        else:
            items = typing.get_args(tp)
            if not items:
                return None
            tp = items[-1]  # list[X] -> X, dict[str, X] -> X
    return tp


def _every_problem(exc: msgspec.ValidationError, value: Any, base: str, struct: Any) -> list[Problem]:
    """Every problem of a table, not only the first msgspec stops at: each key is checked on its own
    (unknown keys with the closest known one, each known key's value against its field's type)."""
    fields = {f.encode_name: f for f in msgspec.structs.fields(struct)} if _is_struct(struct) else None
    if fields is None or not isinstance(value, dict):
        return [_located(exc, base, struct)]
    problems = []
    for key, item in value.items():
        field = fields.get(key)
        if field is None:
            problems.append(Problem(f"{base}.{key}", CODE, f"unknown key `{key}`{did_you_mean(str(key), fields)}"))
            continue
        args = typing.get_args(field.type)
        if typing.get_origin(field.type) is dict and len(args) == 2 and _is_struct(args[1]) and isinstance(item, dict):
            # A table of tables (``[tools.reshape.NAME]``): each located by its name, not ``[...]``.
            for name, sub in item.items():
                try:
                    msgspec.convert(sub, args[1], strict=True)
                except msgspec.ValidationError as inner:
                    problems.extend(_every_problem(inner, sub, f"{base}.{key}.{name}", args[1]))
            continue
        try:
            msgspec.convert(item, field.type, strict=True)
        except msgspec.ValidationError as inner:
            problems.append(_located(inner, f"{base}.{key}", field.type))
    return problems or [_located(exc, base, struct)]


def _is_struct(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)


def _syntax_problem(exc: Exception, fmt: str) -> Problem:
    """A document that does not parse: one line, located ``line:col`` when the parser says where."""
    what = f"not valid {fmt.upper()}"
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        text = " ".join(str(x) for x in (exc.context, exc.problem) if x)
        where = f"{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        return Problem(where, CODE, f"{what}: {text}")
    if isinstance(exc, DuplicateKeyError):
        return Problem(f"{exc.lineno}:{exc.colno}", CODE, exc.msg)
    if isinstance(exc, json.JSONDecodeError):
        return Problem(f"{exc.lineno}:{exc.colno}", CODE, f"{what}: {exc.msg}")
    text = " ".join(str(exc).split())
    if m := re.search(r"\s*\(at line (\d+), column (\d+)\)", text):  # tomllib's way of saying where
        return Problem(f"{m.group(1)}:{m.group(2)}", CODE, f"{what}: {text[: m.start()] + text[m.end() :]}")
    return Problem("", CODE, f"{what}: {text}")


def _decode_raw(data: bytes, fmt: str) -> Any:
    match fmt:
        case "toml":
            return tomllib.loads(data.decode())
        case "yaml":
            return load_yaml(data) or {}
        case _:
            if not data.strip():
                return {}
            value = json.loads(data)
            check_unique_keys(data)
            return value


def _expand(value: str, where: str, problems: list[Problem], environ: dict[str, str] | os._Environ[str]) -> str:
    def repl(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        got = environ.get(name)
        if got is None:
            if default is None:
                problems.append(Problem(where, UNSET_ENV, f"environment variable `{name}` is not set"))
                return ""
            return default
        return got

    return _VAR.sub(repl, value)


def _check_server(
    name: str, s: McpServerConfig, problems: list[Problem], environ: dict[str, str] | os._Environ[str]
) -> McpServerConfig:
    base = f"mcpServers.{name}"
    if not _SERVER_NAME.match(name):
        problems.append(Problem(base, CODE, "server names use letters, digits, `_` and `-` (at most 64)"))
    if (s.command is None) == (s.url is None):
        problems.append(Problem(base, CODE, "set exactly one of `command` (stdio) or `url` (streamable HTTP)"))
        return s
    if s.command is not None:
        if s.type not in (None, "stdio"):
            problems.append(Problem(f"{base}.type", CODE, f"`{s.type}` does not go with `command`"))
        if s.headers:
            problems.append(Problem(f"{base}.headers", CODE, "`headers` is for `url` servers"))
    else:
        if s.type == "stdio":
            problems.append(Problem(f"{base}.type", CODE, "`stdio` does not go with `url`"))
        if s.args or s.env or s.cwd is not None:
            problems.append(Problem(base, CODE, "`args`, `env` and `cwd` are for `command` servers"))
    if s.prefix is not None and not _PREFIX.match(s.prefix):
        problems.append(Problem(f"{base}.prefix", CODE, "a prefix uses letters, digits, `_`, `-` and `.`"))
    for key in ("timeout_ms", "connect_timeout_ms"):
        v = getattr(s, key)
        if v is not None and v <= 0:
            problems.append(Problem(f"{base}.{key}", CODE, "must be positive"))

    def ex(v: str, where: str) -> str:
        return _expand(v, f"{base}.{where}", problems, environ)

    fields: dict[str, Any] = {}
    if s.command is not None:
        fields["command"] = ex(s.command, "command")
        fields["args"] = [ex(a, f"args[{i}]") for i, a in enumerate(s.args)]
        fields["env"] = {k: ex(v, f"env.{k}") for k, v in s.env.items()}
        if s.cwd is not None:
            fields["cwd"] = ex(s.cwd, "cwd")
    else:
        url = ex(s.url or "", "url")
        if not url.startswith(("http://", "https://")):
            problems.append(Problem(f"{base}.url", CODE, "must be an http:// or https:// URL"))
        fields["url"] = url
        fields["headers"] = {k: ex(v, f"headers.{k}") for k, v in s.headers.items()}
    return msgspec.structs.replace(s, **fields)


def _check_prefixes(servers: dict[str, McpServerConfig], problems: list[Problem]) -> None:
    """Two enabled servers under one non-empty prefix would serve clashing names (tools, prompts): a config
    error. Bare names (``prefix = ""``) may still clash at run time; the first server in config order wins."""
    seen: dict[str, str] = {}
    for name, s in servers.items():
        prefix = name if s.prefix is None else s.prefix
        if not s.enabled or not prefix:
            continue
        if prefix in seen:
            problems.append(
                Problem(
                    f"mcpServers.{name}.prefix",
                    CODE,
                    f"`{prefix}` is already the prefix of `mcpServers.{seen[prefix]}`: their names would clash",
                )
            )
        else:
            seen[prefix] = name


def _check_pipelines(cfg: Config, servers: dict[str, McpServerConfig], problems: list[Problem]) -> None:
    """Two ``mcp_pipeline`` tools under one name (``[pipe] mcp_pipeline`` and a fronted discord-mcp server with an
    empty prefix, or two such servers): a config error."""
    owner = "pipe.mcp_pipeline" if cfg.pipe.mcp_pipeline else None
    for name, s in servers.items():
        if not (s.enabled and s.mcp_pipeline) or (name if s.prefix is None else s.prefix):
            continue
        where = f"mcpServers.{name}.mcp_pipeline"
        if owner is not None:
            problems.append(
                Problem(where, CODE, f"`mcp_pipeline` is already served by `{owner}`: give the server a prefix")
            )
        else:
            owner = where


def _check(cfg: Config, problems: list[Problem], environ: dict[str, str] | os._Environ[str]) -> Config:
    servers = {n: _check_server(n, s, problems, environ) for n, s in cfg.mcpServers.items()}
    _check_prefixes(servers, problems)
    _check_pipelines(cfg, servers, problems)
    for i, entry in enumerate(cfg.python_tools):
        mod, _, attr = entry.partition(":")
        if not mod or not attr:
            problems.append(Problem(f"python_tools[{i}]", CODE, f"`{entry}` is not `module:registry`"))
    if isinstance(cfg.builtins, list):
        from mcpipe.interaction import INTERACTION_TOOL_NAMES
        from mcpipe.tools.builtin import BUILTIN_NAMES

        names = (*BUILTIN_NAMES, *INTERACTION_TOOL_NAMES)
        for i, name in enumerate(cfg.builtins):
            if name not in names:
                problems.append(Problem(f"builtins[{i}]", CODE, f"no built-in tool `{name}` ({', '.join(names)})"))
    p = cfg.pipe
    for key in (
        "max_steps",
        "max_depth",
        "max_concurrency",
        "timeout_ms",
        "max_items",
        "max_calls",
        "max_step_runs",
        "max_spec_bytes",
        "max_json_depth",
        "max_output_bytes",
        "max_answer_bytes",
        "expression_timeout_ms",
        "compile_cache_bytes",
    ):
        v = getattr(p, key)
        if v is not None and v <= 0:
            problems.append(Problem(f"pipe.{key}", CODE, "must be positive"))
    seen: dict[str, int] = {}
    for i, t in enumerate(cfg.auth.tokens):
        where = f"auth.tokens[{i}]"
        if t.env in seen:
            problems.append(Problem(f"{where}.env", CODE, f"`{t.env}` is already used by auth.tokens[{seen[t.env]}]"))
        seen.setdefault(t.env, i)
        if not environ.get(t.env):
            problems.append(Problem(f"{where}.env", UNSET_ENV, f"environment variable `{t.env}` is not set or empty"))
        if not t.principal:
            problems.append(Problem(f"{where}.principal", CODE, "must not be empty"))
        elif (prefix := reserved_prefix(t.principal)) is not None:
            problems.append(
                Problem(
                    f"{where}.principal",
                    CODE,
                    f"`{t.principal}` starts with `{prefix}`, which names the principals of another identity "
                    "source (docs/access.md#principals): choose another name",
                )
            )
    for tool, cost in cfg.costs.items():
        if cost < 0:
            problems.append(Problem(f"costs.{tool}", CODE, "a cost cannot be negative"))
        if tool == PIPE_TOOL and cost != 0:
            problems.append(Problem(f"costs.{tool}", CODE, f"{PIPE_TOOL} is always accounted with cost 0"))
    h = cfg.http
    if not 0 <= h.port <= 65535:
        problems.append(Problem("http.port", CODE, "must be between 0 and 65535"))
    if not h.path.startswith("/"):
        problems.append(Problem("http.path", CODE, "must start with `/`"))
    if not h.health_path.startswith("/"):
        problems.append(Problem("http.health_path", CODE, "must start with `/`"))
    if h.path == h.health_path:
        problems.append(Problem("http.path", CODE, f"`{h.health_path}` is the health endpoint"))
    if cfg.trust is not None:
        problems.extend(_trust_problems(cfg.trust))
    resource = cfg.auth.resource
    resource_url = resource.url if resource is not None else None
    problems.extend(check_oidc(cfg.auth.oidc, "auth.oidc", resource_url))
    problems.extend(check_introspection(cfg.auth.introspection, "auth.introspection", environ, resource_url))
    if resource is not None:
        problems.extend(check_resource(resource, "auth.resource"))
    problems.extend(check_scopes(cfg.auth.scopes, "auth.scopes"))
    problems.extend(_registry_problems(cfg.registry))
    problems.extend(_registries_problems(cfg))
    problems.extend(_content_problems(cfg.content))
    tls = cfg.http.tls
    if tls is not None and (tls.client_cert == "none") == bool(tls.client_ca_file):
        problems.append(
            Problem(
                "http.tls.client_ca_file",
                CODE,
                "set with `client_cert` optional or required (the CAs a client certificate must chain to), "
                "and only then",
            )
        )
    if cfg.auth.mtls is not None:
        problems.extend(check_mtls(cfg.auth.mtls, "auth.mtls"))
    problems.extend(check_access(cfg.access, "access", base_dir=cfg.base_dir))
    problems.extend(check_credentials(cfg.credentials, "credentials", environ))
    problems.extend(_oauth_problems(cfg, environ))
    problems.extend(check_openapi(cfg.openapi, cfg.credentials))
    problems.extend(check_tools(cfg.tools))
    for name, server in cfg.mcpServers.items():
        if server.credential is not None:
            if server.credential not in cfg.credentials:
                problems.append(
                    Problem(
                        f"mcpServers.{name}.credential", CODE, f"no credential `{server.credential}` in [credentials]"
                    )
                )
            elif server.command is not None:
                problems.append(Problem(f"mcpServers.{name}.credential", CODE, "a credential is for `url` servers"))
    tel = cfg.telemetry
    if not tel.metrics_path.startswith("/"):
        problems.append(Problem("telemetry.metrics_path", CODE, "must start with `/`"))
    elif tel.metrics_path in (h.path, h.health_path):
        problems.append(
            Problem("telemetry.metrics_path", CODE, f"`{tel.metrics_path}` is already served (MCP or health)")
        )
    if tel.otlp_endpoint is not None and not tel.otlp_endpoint.startswith(("http://", "https://")):
        problems.append(Problem("telemetry.otlp_endpoint", CODE, "must be an http:// or https:// URL"))
    # ${VAR} in the URL: a Redis password (or the whole URL) from a container's or a unit's secret
    store = msgspec.structs.replace(cfg.store, url=_expand(cfg.store.url, "store.url", problems, environ))
    scheme, sep, rest = store.url.partition("://")
    if not sep or scheme not in ("memory", "redis", "rediss", "unix") or (scheme != "memory" and not rest):
        problems.append(
            Problem("store.url", CODE, "must be `memory://` or a `redis://HOST:PORT/DB` (or rediss://, unix://) URL")
        )
    return msgspec.structs.replace(cfg, mcpServers=servers, store=store)


def _oauth_problems(cfg: Config, environ: Mapping[str, str]) -> list[Problem]:
    """``[oauth]`` and the servers' ``oauth``: a store that persists needs its key; URLs are URLs."""
    o = cfg.oauth
    problems: list[Problem] = []
    if not any(s.oauth is not None for s in cfg.mcpServers.values()):
        return problems
    scheme = o.store.partition("://")[0]
    if scheme not in ("memory", "sqlite", "redis", "rediss", "unix") or "://" not in o.store:
        problems.append(Problem("oauth.store", CODE, "must be `memory://`, `sqlite:///PATH` or a `redis://` URL"))
    elif scheme != "memory" and not environ.get(o.key_env):
        problems.append(
            Problem(
                "oauth.key_env",
                UNSET_ENV,
                f"environment variable `{o.key_env}` is not set: a `{scheme}` store keeps tokens across restarts, "
                "sealed with this key",
            )
        )
    for key in ("callback_url", "client_metadata_url"):
        value = getattr(o, key)
        if value is not None and not value.startswith(("http://", "https://")):
            problems.append(Problem(f"oauth.{key}", CODE, "must be an http:// or https:// URL"))
    if o.client_metadata_url is not None and not o.client_metadata_url.startswith("https://"):
        problems.append(Problem("oauth.client_metadata_url", CODE, "a client id metadata document is https"))
    if not o.callback_path.startswith("/"):
        problems.append(Problem("oauth.callback_path", CODE, "must start with `/`"))
    for name, server in cfg.mcpServers.items():
        if server.oauth is None:
            continue
        at = f"mcpServers.{name}.oauth"
        if server.command is not None:
            problems.append(Problem(at, CODE, "OAuth is for `url` servers (a stdio server takes its env)"))
        if server.credential is not None or server.forward_bearer:
            problems.append(Problem(at, CODE, "set `oauth`, or `credential`/`forward_bearer`, not both"))
        if server.oauth.client_secret_env is not None and not environ.get(server.oauth.client_secret_env):
            problems.append(
                Problem(f"{at}.client_secret_env", UNSET_ENV, f"`{server.oauth.client_secret_env}` is not set")
            )
        if (server.oauth.client_secret or server.oauth.client_secret_env) and not server.oauth.client_id:
            problems.append(Problem(f"{at}.client_secret", CODE, "needs `client_id`"))
        if server.oauth.grant == "client_credentials" and not server.oauth.client_id:
            problems.append(Problem(f"{at}.client_id", CODE, "a `client_credentials` grant needs its client"))
        if server.oauth.grant == "client_credentials" and server.oauth.per_user:
            problems.append(
                Problem(f"{at}.per_user", CODE, "a `client_credentials` token is mcpipe's own, not a user's")
            )
        key_env = server.oauth.private_key_env
        if key_env is not None and not environ.get(key_env):
            problems.append(Problem(f"{at}.private_key_env", UNSET_ENV, f"`{key_env}` is not set"))
    return problems


def _content_problems(content: ContentConfig) -> list[Problem]:
    """File stores have a root; the default store exists when there are stores."""
    problems = [
        Problem(f"content.stores.{name}.root", CODE, "a file_system store needs its `root` directory")
        for name, store in content.stores.items()
        if store.kind == "file_system" and not store.root
    ]
    if content.stores and content.default not in content.stores:
        known = ", ".join(sorted(content.stores))
        problems.append(Problem("content.default", CODE, f"no store `{content.default}` in content.stores ({known})"))
    if not re.fullmatch(r"[a-z][a-z0-9+.-]*", content.scheme):
        problems.append(Problem("content.scheme", CODE, "a URI scheme: a letter, then letters, digits, +, . or -"))
    return problems


def _registry_problems(registry: RegistryConfig) -> list[Problem]:
    """A served registry entry has a namespaced name and an http(s) URL."""
    if not registry.enabled:
        return []
    namespace, _, name = registry.name.partition("/")
    if not namespace.strip() or not name.strip():
        why = "a registry name is reverse-DNS namespaced, `<namespace>/<name>` (`com.acme/gateway`)"
        return [Problem("registry.name", CODE, why)]
    if registry.url is not None and not registry.url.startswith(("https://", "http://")):
        return [Problem("registry.url", CODE, "must be an http(s) URL")]
    return []


def _registries_problems(cfg: Config) -> list[Problem]:
    """Each registry has its own name and a URL it may be read at; a guard it names is kept (its trust rule needs
    the ``trust`` section; a credential without ``{server}`` is configured, or read from ``credential_env``)."""
    problems: list[Problem] = []
    seen: set[str] = set()
    for i, reg in enumerate(cfg.registries):
        base = f"registries[{i}]"
        if reg.name in seen:
            problems.append(Problem(f"{base}.name", CODE, f"another registry is named `{reg.name}`"))
        seen.add(reg.name)
        if not reg.url.startswith("https://") and not (reg.allow_http and reg.url.startswith("http://")):
            why = "must be an https:// URL (an http:// one with `allow_http`)"
            problems.append(Problem(f"{base}.url", CODE, why))
        if reg.trust is not None and cfg.trust is None:
            why = "a trust rule needs the `trust` section (the callers' trust levels)"
            problems.append(Problem(f"{base}.trust", CODE, why))
        for where, name in [(f"{base}.credential", reg.credential)] + [
            (f"{base}.servers.{server}.credential", over.credential) for server, over in reg.servers.items()
        ]:
            if name is not None and "{server}" not in name and name not in cfg.credentials and not reg.credential_env:
                problems.append(Problem(where, CODE, f"no credential `{name}` is configured (`credentials`)"))
    return problems


def _trust_problems(trust: TrustConfig) -> list[Problem]:
    """Every ``allow_if`` compiles, over the caller's variables only."""
    from mcpipe.expr import CelExpr, ExpressionSyntaxError

    problems = []
    sources = [("trust.allow_if", trust.allow_if)]
    sources += [(f"trust.tools.{name}.allow_if", rule.allow_if) for name, rule in trust.tools.items()]
    for where, source in sources:
        if source is None:
            continue
        try:
            CelExpr.compile(source, extra_roots=TRUST_ROOTS)
        except ExpressionSyntaxError as e:
            problems.append(Problem(where, CODE, str(e)))
    return problems


TRUST_ROOTS = frozenset({"principal_id", "trust_level", "auth_provider", "identity_kind", "identity", "tool_name"})
"""What an ``allow_if`` expression reads."""


def parse_config(
    data: bytes | str,
    fmt: Literal["toml", "yaml", "json"] = "toml",
    *,
    base_dir: str = ".",
    environ: dict[str, str] | None = None,
    warnings: list[Problem] | None = None,
    source: str = "",
) -> Config:
    """Decode and check a config document: :func:`parse`'s config (the arguments and errors are its).

    Raises:
        ConfigError: listing every problem found, each with its location.
    """
    return parse(data, fmt, base_dir=base_dir, environ=environ, warnings=warnings, source=source).config


def parse(
    data: bytes | str,
    fmt: Literal["toml", "yaml", "json"] = "toml",
    *,
    base_dir: str = ".",
    environ: dict[str, str] | None = None,
    warnings: list[Problem] | None = None,
    source: str = "",
) -> Loaded:
    """Decode and check a config document, compiling what it declares (once: :class:`Loaded`).

    Args:
        data: the document.
        fmt: its format.
        base_dir: what relative paths in it are relative to.
        environ: where ``${VAR}``, ``${env.NAME}`` and token variables are read (default: ``os.environ``).
        warnings: when given (``mcpipe check``), an environment variable the file reads and ``environ`` lacks
            is a warning appended here (``mcpipe serve`` refuses the file until it is set), not an error,
            and so is what follows from its empty value at the same place; the config is then returned as
            read with the variable empty, to be checked, not served. One an mcpg binding reads (the binding
            fails each call) is a warning here too; without ``warnings`` it is logged, once the file is taken.
        source: the file's name, in front of those log lines.

    Raises:
        ConfigError: listing every problem found, each with its location.
    """
    env = os.environ if environ is None else environ
    raw_bytes = data.encode() if isinstance(data, str) else data
    try:
        raw = _decode_raw(raw_bytes, fmt)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError([_syntax_problem(exc, fmt)]) from None
    except RecursionError:
        raise ConfigError(
            [Problem("", CODE, f"the document nests too deeply to read (at most {MAX_CONFIG_DEPTH})")]
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError([Problem("", CODE, f"the top level must be a table/object, got {type(raw).__name__}")])
    if json_depth(raw, MAX_CONFIG_DEPTH) > MAX_CONFIG_DEPTH:
        where = deepest_location(raw, MAX_CONFIG_DEPTH)
        raise ConfigError(
            [Problem(where, CODE, f"nests more than {MAX_CONFIG_DEPTH} levels deep; the limit is {MAX_CONFIG_DEPTH}")]
        )
    from mcpipe.formats import detect_config

    foreign = detect_config(raw)
    if foreign is None:
        read: list[Problem] = []
        raw = _read_env(raw, "", read, env)
        loaded, problems = _parse_raw(raw, base_dir, env)
        problems = [*read, *problems]
    else:
        translation = foreign.translate(raw, base_dir=base_dir, environ=env)
        loaded, found = _parse_raw(translation.raw, base_dir, env)
        loaded = loaded.replace(msgspec.structs.replace(loaded.config, translated_from=foreign.name))
        problems = [*translation.problems, *(Problem(translation.locate(p.location), p.code, p.message) for p in found)]
    errors = _settle_unset(problems, warnings)
    if errors:
        raise ConfigError(errors)
    if warnings is None:  # served: the bindings that will fail each call, said once
        for p in dict.fromkeys(p for p in problems if p.code == UNSET_ENV_PER_CALL):
            _log.warning("%s%s: %s", f"{source}:" if source else "", p.location, _per_call(p))
    return loaded


def _per_call(p: Problem) -> str:
    return f"{p.message}: the binding that reads it fails each call until it is"


_ENV_REF = re.compile(r"\$\{\s*\$?env\.([A-Za-z_][A-Za-z0-9_]*)\s*\}")
"""mcpg's spelling of an environment variable, ``${env.NAME}``: what ``mcpipe convert`` keeps as written."""


def _read_env(value: Any, where: str, problems: list[Problem], environ: Mapping[str, str]) -> Any:
    """``value`` with every ``${env.NAME}`` in its strings read from ``environ``, as mcpg reads its file when it
    starts (so a file ``mcpipe convert`` wrote reads the variables where the mcpg file did: a database URL, a
    store's, a registry's header, a step's field). One that is not set is a located ``UNSET_ENV`` problem, and
    is left as written: ``serve`` refuses the file, and ``check`` checks the rest as if it were set (a database
    URL naming a file is still one). The depth is bounded before (``MAX_CONFIG_DEPTH``)."""
    if isinstance(value, str):
        if "${" not in value:
            return value

        def repl(m: re.Match[str]) -> str:
            got = environ.get(m.group(1))
            if got is None:
                problems.append(Problem(where, UNSET_ENV, f"environment variable `{m.group(1)}` is not set"))
                return m.group(0)
            return got

        return _ENV_REF.sub(repl, value)
    if isinstance(value, dict):
        return {k: _read_env(v, f"{where}.{k}" if where else str(k), problems, environ) for k, v in value.items()}
    if isinstance(value, list):
        return [_read_env(v, f"{where}[{i}]", problems, environ) for i, v in enumerate(value)]
    return value


def _settle_unset(problems: list[Problem], warnings: list[Problem] | None) -> list[Problem]:
    """The errors among ``problems``: an unset environment variable is one (``INVALID_CONFIG``) unless
    ``warnings`` is given; then it is a warning. A problem at or inside its place follows from the empty value
    it left, so it is dropped either way. One an mcpg binding reads (``UNSET_ENV_PER_CALL``) is never an
    error: the binding fails each call; it is a warning, or logged (:func:`parse_config`)."""
    for p in problems:
        warning = Problem(p.location, CODE, _per_call(p))
        if p.code == UNSET_ENV_PER_CALL and warnings is not None and warning not in warnings:
            warnings.append(warning)
    problems = [p for p in problems if p.code != UNSET_ENV_PER_CALL]
    unset = [p for p in problems if p.code == UNSET_ENV]
    if warnings is None:  # the variable, and not again what its empty value did at its place
        kept = [p for p in problems if p.code == UNSET_ENV or not any(_nested(p.location, u.location) for u in unset)]
        return list(dict.fromkeys(Problem(p.location, CODE, p.message) if p.code == UNSET_ENV else p for p in kept))
    for p in unset:
        warning = Problem(p.location, CODE, f"{p.message}: `mcpipe serve` refuses the file until it is")
        if warning not in warnings:
            warnings.append(warning)

    def follows(p: Problem) -> bool:
        return any(_nested(p.location, u.location) for u in unset)

    return [p for p in problems if p.code != UNSET_ENV and not follows(p)]


def _nested(inner: str, outer: str) -> bool:
    """``inner`` is ``outer`` or a place inside it (``a.b[0]`` is inside ``a.b``)."""
    return inner == outer or inner.startswith((f"{outer}.", f"{outer}["))


_MODEL_SECTIONS = ("models", "workflow", "playbooks", "piraeus")
"""The sections their own packages decode (:func:`_compile`): read as written here, decoded there."""
_DECLARED_SECTIONS = ("pipelines", "outbound", "sql")
"""The sections :mod:`mcpipe.declared` decodes as it compiles them (:func:`_compile`), the same way."""


def _parse_raw(
    raw: dict[str, Any], base_dir: str, env: dict[str, str] | os._Environ[str]
) -> tuple[Loaded, list[Problem]]:
    """Decode, check and compile a document in mcpipe's own layout: the load, and every problem found."""
    from mcpipe.formats import load_extensions

    load_extensions(raw)  # a format's step kinds and answer shapes, when the pipelines name them
    problems: list[Problem] = []
    fields: dict[str, Any] = {}
    for key, value in raw.items():
        section = _SECTIONS.get(key)
        if section is None:
            hint = did_you_mean(str(key), _SECTIONS) or f" (known: {', '.join(_SECTIONS)})"
            problems.append(Problem(str(key), CODE, f"unknown key `{key}`{hint}"))
            continue
        if section.each:
            if not isinstance(value, dict):
                problems.append(Problem(key, CODE, f"expected a table/object, got {type(value).__name__}"))
                continue
            decoded = {}
            for name, item in value.items():
                try:
                    decoded[name] = msgspec.convert(item, section.type, strict=True)
                except msgspec.ValidationError as exc:
                    problems.extend(_every_problem(exc, item, f"{key}.{name}", section.type))
            fields[key] = decoded
        else:
            try:
                fields[key] = msgspec.convert(value, section.type, strict=True)
            except msgspec.ValidationError as exc:
                problems.extend(_every_problem(exc, value, key, section.type))
    written = {key: fields.pop(key) for key in (*_MODEL_SECTIONS, *_DECLARED_SECTIONS) if key in fields}
    cfg = _check(Config(**fields, base_dir=base_dir), problems, env)
    loaded, found = _compile(cfg, written, check_names=True)
    return loaded, [*problems, *found]


@dataclass(frozen=True, slots=True)
class Loaded:
    """One load of a config: the config and what it declares, compiled once.

    ``mcpipe check``, ``mcpipe serve`` (:func:`mcpipe.server.open_app` takes a Loaded), ``mcpipe convert`` and a
    reload each load the file once (:func:`load`) and share what that compiled: a declared pipeline, a
    playbook, a piraeus flow is compiled once per load, not again to be served. A load serves one app at a time
    (its steps' connections and content stores are that app's).

    Attributes:
        config: the config (its ``pipelines``, ``outbound``, ``sql``, ``models``, ``workflow``, ``playbooks``
            and ``piraeus`` decoded).
        declared: the declared pipelines (``pipelines``, ``outbound``, ``sql``), compiled, their tool names
            checked against the tools known before any is loaded (the built-ins, the downstream servers' and
            OpenAPI documents' prefixes; none with ``python_tools``); None: the config has none of those sections.
        compiled: what ``models``, ``workflow`` and the formats' sections (``playbooks``, ``piraeus``) compiled
            to, by name (the table of :class:`mcpipe.formats.Context`, which :meth:`context` hands on).
    """

    config: Config
    declared: DeclaredPipelines | None = None
    compiled: dict[str, tuple[Any, list[Problem]]] = field(default_factory=dict)

    @classmethod
    def of(cls, config: Config) -> Loaded:
        """What a config built in code (not read by :func:`parse`) compiles; its tool names are checked when it
        is served (:meth:`declared_source`).

        Raises:
            ConfigError: listing every problem of what it declares.
        """
        loaded, problems = _compile(config, {}, check_names=False)
        if problems:
            raise ConfigError(problems)
        return loaded

    def replace(self, config: Config) -> Loaded:
        """The same load serving ``config``: the same file with a setting changed (``--console``, a worker's
        queue), what it declares unchanged."""
        return Loaded(config, self.declared, self.compiled)

    def tool_problems(self, sources: Sequence[object]) -> list[Problem]:
        """The declared pipelines' tool names checked against the tool sources loaded (the built-ins,
        ``python_tools``, the OpenAPI tools...): what compiling them against those sources would add."""
        if self.declared is None:
            return []
        from mcpipe.declared import tool_problems

        return tool_problems(self.declared, _tools_in(self.config, sources))

    def declared_source(self, sources: Sequence[object]) -> DeclaredPipelines | None:
        """The declared pipelines to serve beside ``sources`` (the tools before them), their content stores
        opened (a file store reads its index); None: the config declares none.

        Raises:
            ConfigError: a tool step names a tool none of ``sources`` has, a pipeline's name is taken, or a
                content store cannot be opened (every problem listed).
        """
        if self.declared is None:
            return None
        problems = self.tool_problems(sources)
        if problems:
            raise ConfigError(problems)
        content = self.declared.policy.content
        if content is not None:
            opened = content_stores(self.config)
            content.stores.update(opened.stores if opened is not None else {})
        return self.declared

    def context(self, policy: StepPolicy | None = None) -> Context:
        """What the formats the config turns on share (:class:`mcpipe.formats.Context`), over what this load
        compiled of the ``models``, ``workflow`` and the formats' sections (nothing compiles again).

        Args:
            policy: the declared pipelines' step policy (their SQL backends and connections), shared.
        """
        from mcpipe.formats import Context

        return Context(self.config, policy, self.compiled)


def _compile(cfg: Config, written: Mapping[str, Any], *, check_names: bool) -> tuple[Loaded, list[Problem]]:
    """Compile what ``cfg`` declares: its declared pipelines, then its model sections (``written``: as the file
    has them, else the config's own, decoded or not), those decoded into the config (the pipelines' sections
    too).

    Args:
        check_names: check the tool names the pipelines call against those known before any tool is loaded
            (:func:`_known_tools`); False: leave them to :meth:`Loaded.declared_source`.
    """
    problems: list[Problem] = []
    declared = None
    pipelines = written.get("pipelines", cfg.pipelines)
    outbound = written.get("outbound", cfg.outbound)
    sql = written.get("sql", cfg.sql)
    if pipelines or outbound is not None or sql:
        from mcpipe.declared import compile_declared  # loads CEL and JSONata: only when a config needs them

        declared, decoded, found = compile_declared(
            pipelines,
            outbound,
            tools=_known_tools(cfg) if check_names else None,
            limits=cfg.pipe.limits(),
            sql=sql,
            base_dir=cfg.base_dir,
            credentials=cfg.credentials,
            content=_content_names(cfg.content),
        )
        problems += found
        cfg = msgspec.structs.replace(cfg, pipelines=decoded.pipelines, outbound=decoded.outbound, sql=decoded.sql)
    from mcpipe.formats import Context, decoded_sections, format_problems, turned_on

    sections = {key: written[key] for key in _MODEL_SECTIONS if key in written}
    written_cfg = msgspec.structs.replace(cfg, **sections) if sections else cfg
    compiled: dict[str, tuple[Any, list[Problem]]] = {}
    if written_cfg.models or written_cfg.workflow is not None or turned_on(written_cfg):
        # The model presets, the workflow and each format's part (the playbooks: Jinja, YAML; piraeus's flows),
        # compiled once here: the load keeps what they compiled (Loaded.context), to serve, check and count.
        ctx = Context(written_cfg, declared.policy if declared is not None else None, compiled)
        problems += format_problems(ctx)
        cfg = msgspec.structs.replace(cfg, **decoded_sections(ctx))
    return Loaded(cfg, declared, compiled), problems


def _known_tools(cfg: Config) -> KnownTools | None:
    """The tool names declared pipelines may call besides each other, known before any tool is loaded: the
    built-ins the config enables, the reshaped tools, and any tool of a downstream server's or OpenAPI document's
    prefix; None (do not check) when the config has ``python_tools``, which only importing them tells."""
    if cfg.python_tools:
        return None
    from mcpipe.declared import KnownTools
    from mcpipe.tools.builtin import BUILTIN_NAMES

    names = frozenset(BUILTIN_NAMES if cfg.builtins is True else cfg.builtins or ()) | frozenset(cfg.tools.reshape)
    # Before the OpenAPI documents are read (the config is parsed, not served), their tools are known by prefix.
    apis = [name if s.prefix is None else s.prefix for name, s in cfg.openapi.items()]
    return KnownTools(names, [*_server_prefixes(cfg), *apis])


def _tools_in(cfg: Config, sources: Sequence[object]) -> KnownTools:
    """The tool names declared pipelines may call besides each other, once the tool sources are loaded."""
    from mcpipe.declared import KnownTools

    return KnownTools.of([*sources, _Named(frozenset(cfg.tools.reshape))], _server_prefixes(cfg))


def _server_prefixes(cfg: Config) -> list[str]:
    return [name if s.prefix is None else s.prefix for name, s in cfg.mcpServers.items()]


class _Named:
    """Tool names as a tool source's lookup (the reshaped tools' names, which the gateway serves)."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def get(self, name: str) -> object | None:
        return name if name in self.names else None


def _content_names(content: ContentConfig) -> ContentStores | None:
    """The content stores of a ``content`` section by name only, to compile steps against (nothing is created on
    disk); :meth:`Loaded.declared_source` opens them. None without stores."""
    if not content.stores:
        return None
    from mcpipe.store.content import ContentStores

    return ContentStores(dict.fromkeys(content.stores), content.default, content.scheme)


def content_stores(cfg: Config) -> ContentStores | None:
    """The content stores of the config's ``content`` section, opened (None without stores).

    Raises:
        ConfigError: a file store's root cannot be made or read (located at it).
    """
    if not cfg.content.stores:
        return None
    from mcpipe.store.content import StoreUnopenable, open_content_stores

    try:
        return open_content_stores(cfg.content, cfg.base_dir)
    except StoreUnopenable as e:
        raise ConfigError([Problem(f"content.stores.{e.store}.root", CODE, str(e))]) from None


_FORMATS: dict[str, Literal["toml", "yaml", "json"]] = {
    ".toml": "toml",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".json": "json",
}


def load_config(
    path: str | os.PathLike[str], *, environ: dict[str, str] | None = None, warnings: list[Problem] | None = None
) -> Config:
    """Read a config file: :func:`load`'s config (the arguments and errors are its)."""
    return load(path, environ=environ, warnings=warnings).config


def load(
    path: str | os.PathLike[str], *, environ: dict[str, str] | None = None, warnings: list[Problem] | None = None
) -> Loaded:
    """Read a config file and compile what it declares, once (:class:`Loaded`); its format follows its suffix
    (``.toml``, ``.yaml``/``.yml``, ``.json``). ``warnings``: as for :func:`parse` (each located in the file).

    Raises:
        ConfigError: the file cannot be read or has problems (every one listed, located).
    """
    p = Path(path)
    fmt = _FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise ConfigError([Problem(str(p), CODE, "a config file ends in .toml, .yaml, .yml or .json")], unreadable=True)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError([Problem(str(p), CODE, f"cannot read: {exc.strerror}")], unreadable=True) from None
    found: list[Problem] | None = None if warnings is None else []
    try:
        return parse(data, fmt, base_dir=str(p.resolve().parent), environ=environ, warnings=found, source=str(p))
    except ConfigError as exc:
        raise ConfigError(
            [Problem(f"{p}:{q.location}" if q.location else str(p), q.code, q.message) for q in exc.problems]
        ) from None
    finally:
        if warnings is not None and found:
            warnings.extend(Problem(f"{p}:{q.location}" if q.location else str(p), q.code, q.message) for q in found)


def resolve_path(cfg: Config, path: str) -> str:
    """A path from the config, made absolute against the config file's directory."""
    return str(Path(cfg.base_dir, os.path.expanduser(path)))
