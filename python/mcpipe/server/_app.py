"""Assembling a running mcpipe from a :class:`~mcpipe.config.Config`: tool sources, downstream actors,
the gateway, and the SDK server on top.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import trio

from mcpipe import telemetry
from mcpipe._loader import LoadError, load_object
from mcpipe.access import Credentials, Scopes, build_gates
from mcpipe.compile import configure_cache
from mcpipe.config import Config, ConfigError, Loaded, content_stores, resolve_path
from mcpipe.downstream import Downstreams, OAuthClients
from mcpipe.errors import UNSET_ENV, ErrorCode, Problem
from mcpipe.formats import audit_log, format_sources, own_workflow, turned_on
from mcpipe.gateway import PIPE_TOOL, AuditLog, Gateway, Policy, ToolSource
from mcpipe.interaction import INTERACTION_TOOL_NAMES, Interactions, interaction_tools
from mcpipe.plan import Limits, set_expression_timeout
from mcpipe.runs import Runs, Worker, new_worker_id
from mcpipe.server._core import PipeRunner, ToolHandlers, build_server, tool_wire
from mcpipe.server._guide import INSTRUCTIONS, SEARCH_INSTRUCTIONS
from mcpipe.server._tasks import Tasks
from mcpipe.store import RunQueue, ServedStore, StoreUnavailable, open_pipeline_store, open_queue
from mcpipe.store.tokens import Vault, VaultError, open_token_store
from mcpipe.tools.builtin import builtin_tools
from mcpipe.trust import Trust

if TYPE_CHECKING:
    from mcp.server.lowlevel.server import Server

__all__ = ["App", "load_tool_source", "open_app", "pipeline_store", "run_queue", "tool_sources"]

_log = logging.getLogger("mcpipe.server")


def load_tool_source(entry: str, where: str = "python_tools", *, base_dir: str = ".") -> ToolSource:
    """Import ``module:attr`` (the config file's directory and the current one importable) and check it is
    a tool source (a ToolRegistry, or anything with ``get`` and iteration).

    Raises:
        ConfigError: the module or attribute cannot be imported, or is not a tool source.
    """
    try:
        obj: Any = load_object(entry, search=[base_dir])
    except LoadError as exc:
        raise ConfigError([Problem(where, ErrorCode.INVALID_CONFIG, f"cannot load `{entry}`: {exc}")]) from None
    if not (callable(getattr(obj, "get", None)) and hasattr(obj, "__iter__")):
        raise ConfigError(
            [Problem(where, ErrorCode.INVALID_CONFIG, f"`{entry}` is a {type(obj).__name__}, not a ToolRegistry")]
        )
    return obj  # type: ignore[no-any-return]


def policy_of(config: Config) -> Policy:
    grants: dict[str, list[str]] = {}
    for t in config.auth.tokens:
        grants.setdefault(t.principal, []).extend(t.tools)
    # Callers no token names: those an OIDC issuer or a client certificate identified, and those the trust
    # section's subject header names (mcpg's header-asserted callers), may call `auth.tools`.
    identified = (
        bool(config.auth.oidc)
        or bool(config.auth.introspection)
        or config.auth.mtls is not None
        or config.trust is not None
    )
    return Policy(grants, list(config.auth.tools) if identified else None)


def audit_of(config: Config) -> AuditLog:
    """The configured audit log: mcpipe's records, or a format's (``[audit] format = NAME``: that format's own
    audit log, :meth:`mcpipe.formats.Format.audit_log`)."""
    path = resolve_path(config, config.audit.path) if config.audit.enabled else None
    log = audit_log(config.audit.format, path, config.audit)
    return log if log is not None else AuditLog(path)


def limits_of(config: Config) -> Limits:
    limits: Limits = config.pipe.limits()
    return limits


def tool_sources(
    config: Config | Loaded, extra_sources: list[ToolSource] | None = None, apis: ToolSource | None = None
) -> list[ToolSource]:
    """The tool sources a config names, in lookup order: the built-ins, ``python_tools``, ``extra_sources``,
    the OpenAPI documents' tools (``apis``, read by :func:`mcpipe.openapi.load_openapi`), then the declared
    pipelines (checked against the ones before them), the workflow tool, and the tools of the formats the config
    turns on (:func:`mcpipe.formats.format_sources`). A :class:`~mcpipe.config.Loaded` brings them compiled; a
    config is compiled here.

    Raises:
        ConfigError: a ``python_tools`` entry cannot be loaded, or the declared pipelines have problems
            (every problem listed).
    """
    loaded = config if isinstance(config, Loaded) else Loaded.of(config)
    config = loaded.config
    sources: list[ToolSource] = []
    if config.builtins is not False:
        chosen = config.builtins
        if chosen is True:
            sources.extend([builtin_tools(True), interaction_tools()])  # ask_user, sample, list_roots
        else:
            sources.append(builtin_tools([n for n in chosen if n not in INTERACTION_TOOL_NAMES]))
            sources.append(interaction_tools(chosen))
    problems: list[Problem] = []
    for i, entry in enumerate(config.python_tools):
        try:
            sources.append(load_tool_source(entry, f"python_tools[{i}]", base_dir=config.base_dir))
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    sources.extend(extra_sources or [])
    if apis is not None:
        sources.append(apis)
    declared = loaded.declared_source(sources)  # compiled at load; its tool names checked against `sources`
    if declared is not None:
        sources.append(declared)
    # The config's own workflow tool (unless a format serves its own), then the tools of the formats the config
    # turns on (mcpipe.formats.FORMATS, in order); all before the downstream servers (appended by open_app), so a
    # format's tool shadows a downstream one of the same name (a fronted discord-mcp's own `mcp_pipeline`). What
    # they serve was compiled by the load (the playbooks and flows share the declared pipelines' policy).
    shared = loaded.context(declared.policy if declared is not None else None)
    workflow = own_workflow(shared) if config.workflow is not None else None
    if workflow is not None:
        from mcpipe.workflow import Workflow, WorkflowTool

        tool: Any = WorkflowTool(Workflow(workflow, shared.models))  # a source of one tool, untyped as one
        sources.append(tool)
    if turned_on(config) or shared.problems:
        sources.extend(format_sources(shared))
    return sources


async def openapi_of(config: Config, credentials: Credentials) -> ToolSource | None:
    """The tools of the config's OpenAPI documents (``[openapi.NAME]``), each document read and checked now;
    an operation refused is logged once, located, with the reason.

    Raises:
        ConfigError: a document cannot be read, or a section has problems.
    """
    if not config.openapi:
        return None
    from mcpipe.openapi import load_openapi

    hosts = config.outbound.http.allowed_hosts if config.outbound is not None else []
    source = await load_openapi(config.openapi, base_dir=config.base_dir, credentials=credentials, allowed_hosts=hosts)
    for api in source.apis:
        _log.info(
            "openapi.%s: %d tools of %d operations (%d refused, %d left out by the filters)",
            api.name, len(api.tools), api.operations, len(api.refused), api.left_out,
        )  # fmt: skip
    for problem in source.warnings():
        _log.warning("%s", problem)
    return source


def _declared_of(sources: list[ToolSource]) -> Any:
    """The declared pipelines among ``sources`` (None: the config has none, and CEL/JSONata stay unloaded)."""
    if "mcpipe.declared" not in sys.modules:
        return None
    from mcpipe.declared import DeclaredPipelines

    return next((s for s in sources if isinstance(s, DeclaredPipelines)), None)


def _surfaces_of(sources: list[ToolSource]) -> list[Any] | None:
    """The prompts, resources and resource templates the sources serve themselves (declared pipelines served as
    prompts or resources, piraeus's prompts), in source order."""
    found = [s for source in sources for s in (getattr(source, "surfaces", None) or ())]
    return found or None


async def _content_of(config: Config) -> Any:
    """The content stores of a config without declared pipelines (opened off the event loop: a file store
    reads its index)."""
    return await trio.to_thread.run_sync(content_stores, config)


def _apps_of(config: Config) -> Any:
    """MCP Apps' policy when the config turns apps on (``apps.enabled``), else None."""
    if not config.apps.enabled:
        return None
    from mcpipe.server._apps import AppsPolicy

    return AppsPolicy(config.apps)


def pipeline_store(config: Config) -> ServedStore:
    """The store suspended pipelines wait in: the ``[store]`` URL's (in memory by default, Redis shared)."""
    return open_pipeline_store(config.store, config.interaction)


_REDIS = ("redis://", "rediss://", "unix://")


def shares_runs(config: Config) -> bool:
    """Whether the config's run queue is shared between processes: Redis Streams, or a ``[runs] path`` file
    (else :func:`run_queue` is an in-memory database of one process)."""
    return config.store.url.startswith(_REDIS) or bool(config.runs.path)


def run_queue(config: Config) -> RunQueue:
    """The queue background runs wait in: Redis Streams when ``[store] url`` is Redis, else the SQLite file
    ``[runs] path`` (unset: an in-memory database of this process)."""
    r = config.runs
    bounds = {
        "retention_s": r.retention_s,
        "max_run_bytes": r.max_run_bytes,
        "max_run_events": r.max_run_events,
        "max_runs": r.max_runs,
        "max_bytes": r.max_bytes,
        "max_runs_per_principal": r.max_runs_per_principal,
        "max_bytes_per_principal": r.max_bytes_per_principal,
        "parked_ttl_s": r.parked_ttl_s,
    }
    if config.store.url.startswith(_REDIS):
        timeout = config.store.timeout_ms / 1000
        return open_queue(config.store.url, prefix=config.store.prefix, timeout_s=timeout, **bounds)
    if r.path:
        path = resolve_path(config, r.path)
    else:
        path = f"file:mcpipe-runs-{new_worker_id().replace(':', '-')}?mode=memory&cache=shared"
    return open_queue("sqlite://" + path, poll_s=r.poll_ms / 1000, **bounds)


def run_worker(config: Config, queue: RunQueue, gateway: Gateway, worker_id: str | None = None) -> Worker:
    """A worker executing ``queue``'s runs through ``gateway`` with the config's limits and lease."""
    # A run's step outputs are recorded in the queue: no more of them than one run may keep.
    limits = limits_of(config)
    cap = config.runs.max_run_bytes
    limits = replace(
        limits, max_output_bytes=min(limits.max_output_bytes, cap), max_answer_bytes=min(limits.max_answer_bytes, cap)
    )
    return Worker(
        queue,
        gateway,
        limits=limits,
        worker_id=worker_id,
        concurrency=config.runs.concurrency,
        lease_s=config.runs.lease_s,
        answer=config.pipe.answer,
        max_lapses=config.runs.max_lapses,
    )


@dataclass
class App:
    """A running mcpipe: its config, gateway, downstream actors, and the SDK server serving them (built on first
    read of :attr:`server`)."""

    config: Config
    gateway: Gateway
    downstreams: Downstreams
    handlers: ToolHandlers
    runs: Runs
    worker: Worker | None = None
    registries: Any = None
    """The registries' sync (:class:`mcpipe.server._registries.RegistrySync`), when the config has any."""
    oauth: OAuthClients | None = None
    """mcpipe's OAuth client machinery, when a downstream server requires OAuth (its callback is served)."""
    instructions: str | None = None
    """The server's ``instructions`` (what the SDK server says at ``initialize`` and ``server/discover``)."""
    _server: Server[Any] | None = field(default=None, repr=False)

    @property
    def server(self) -> Server[Any]:
        """The SDK's low-level server over the handlers, built on the first read, which imports the SDK (about
        a second of CPU): ``mcpipe serve`` reads it once a thread has imported the SDK, after it answers."""
        if self._server is None:
            self._server = build_server(
                self.handlers, name=self.config.name, version=_version(), instructions=self.instructions
            )
        return self._server


def oauth_callback_url(config: Config) -> str:
    """The redirect URI downstream authorization servers send sign-ins back to (``[oauth] callback_url``, else
    the origin of ``auth.resource.url``, else ``http.host``/``http.port``, and ``callback_path``)."""
    o = config.oauth
    if o.callback_url is not None:
        return o.callback_url
    resource = config.auth.resource.url if config.auth.resource is not None else None
    if resource is not None:
        parts = urlsplit(resource)
        return f"{parts.scheme}://{parts.netloc}{o.callback_path}"
    host = config.http.host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{config.http.port}{o.callback_path}"


def oauth_clients(config: Config) -> OAuthClients | None:
    """The OAuth client machinery of the config's servers that require OAuth (None: none does).

    Raises:
        ConfigError: the store cannot be opened.
    """
    if not any(s.oauth is not None and s.url for s in config.mcpServers.values()):
        return None
    o = config.oauth
    try:
        store = open_token_store(o.store, base_dir=config.base_dir, prefix=config.store.prefix)
        vault = Vault.from_env(o.key_env)
    except (ValueError, VaultError) as exc:
        raise ConfigError([Problem("oauth.store", ErrorCode.INVALID_CONFIG, str(exc))]) from None
    if vault.ephemeral and not o.store.startswith("memory:"):
        why = f"`{o.key_env}` is not set: tokens kept in `{o.store}` would not open after a restart"
        raise ConfigError([Problem("oauth.key_env", UNSET_ENV, why)])
    return OAuthClients(config, store, vault, oauth_callback_url(config))


@asynccontextmanager
async def open_app(
    config: Config | Loaded,
    *,
    extra_sources: list[ToolSource] | None = None,
    audit: AuditLog | None = None,
    errlog: Any = None,
    execute: bool | None = None,
    queue: RunQueue | None = None,
) -> AsyncIterator[App]:
    """Start everything a config describes and yield the App; stop it all on exit.

    Downstream servers with ``connect = "start"`` have tried to connect once when this yields (each
    bounded by its ``connect_timeout_ms``; one that failed keeps retrying in the background).

    Args:
        config: the config, or a load of it (:func:`mcpipe.config.load`: what it declares compiled once, there;
            a config is compiled here).
        extra_sources: more tool sources, looked up after the built-ins and ``python_tools`` (tests).
        audit: an audit log to use instead of the configured one.
        errlog: where stdio downstream servers' stderr goes (default: ours).
        execute: whether this process executes queued runs (default: ``[runs] execute``).
        queue: the run queue (default: the one the config names, :func:`run_queue`).

    Raises:
        ConfigError: a ``python_tools`` entry cannot be loaded.
    """
    loaded = config if isinstance(config, Loaded) else Loaded.of(config)
    config = loaded.config
    if queue is None:
        queue = run_queue(config)
    server_id = new_worker_id()
    runs = Runs(queue, server_id=server_id)
    credentials = Credentials(config.credentials)
    apis = await openapi_of(config, credentials)
    sources = tool_sources(
        loaded, [runs.tools(), *(extra_sources or [])] if config.pipe.enabled else extra_sources, apis
    )
    if config.tools.discovery == "search":
        from mcpipe.toolset import search_tools

        sources.insert(0, search_tools(config.tools.search_limit, tool_wire))
    # The declared pipelines' source owns connections (nats/grpc/kafka, SQL pools): run it, close it.
    declared = _declared_of(sources)
    oauth = oauth_clients(config)
    downstreams = Downstreams(
        config.mcpServers,
        errlog=errlog,
        credentials=credentials,
        oauth=oauth,
        max_user_sessions=config.oauth.max_user_sessions,
    )
    sources.append(downstreams)
    if audit is None:
        audit = audit_of(config)
    # Declared pipelines call tools through the gateway a call comes in by (ctx.tools): nothing to bind.
    gateway = Gateway(
        sources,
        policy=policy_of(config),
        costs=config.costs,
        audit=audit,
        # A call of a server still making its first attempt waits for it: lazy servers, and the servers of
        # registries, added while serving (a fast caller reached one mid-handshake and was told "unavailable").
        ready=downstreams.ready if downstreams.lazy or config.registries else None,
        trust=Trust(config.trust) if config.trust is not None else None,
        gates=build_gates(config.access, base_dir=config.base_dir) if config.access.gates else None,
        refusals=config.access.refusals,
        scopes=Scopes(config.auth.scopes) if config.auth.scopes else None,
        tools=config.tools,
    )
    limits = limits_of(config)
    configure_cache(max_bytes=config.pipe.compile_cache_bytes)
    # mcp_pipe's `when`, declared pipelines' expressions and playbooks' templates all run under it.
    set_expression_timeout(config.pipe.expression_timeout_ms)
    store = pipeline_store(config)
    handlers = ToolHandlers(
        gateway,
        PipeRunner(gateway, limits, runs=runs, answer=config.pipe.answer) if config.pipe.enabled else None,
        interactions=Interactions.from_config(config.interaction, store, audience=config.name),
        runs=runs,
        tasks=Tasks(runs, gateway, pipe=config.pipe.enabled, ttl_s=config.runs.retention_s),
        downstreams=downstreams,  # resources, prompts, completion, logging of the downstream servers
        limits=limits,
        surfaces=_surfaces_of(sources),  # the config's prompts and resources (declared pipelines, piraeus)
        caching=config.caching,
        unknown_tool=config.unknown_tool,
        apps=_apps_of(config),
        content=declared.policy.content if declared is not None else await _content_of(config),
    )
    instructions = INSTRUCTIONS if config.pipe.enabled else None
    if instructions is not None and config.tools.discovery == "search":
        instructions = f"{instructions} {SEARCH_INSTRUCTIONS}"
    try:
        tel = telemetry.configure(
            config.telemetry, service=config.name, known=_known_names(gateway, config.telemetry.max_tool_labels)
        )
    except ValueError as exc:
        raise ConfigError([Problem("telemetry.traces", "INVALID_CONFIG", str(exc))]) from None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)  # the store's background work (sweeping expired entries)
            await nursery.start(queue.run)  # the run queue's (connections, the retention sweeper)
            if oauth is not None:
                await nursery.start(oauth.store.run)  # where downstream servers' tokens are kept
            if declared is not None:
                await nursery.start(declared.run)  # nats/grpc/kafka connections, shared per URL
            await downstreams.start(nursery)
            if handlers.passthrough is not None:
                handlers.passthrough.start(nursery)  # the config's watched resources
            if config.registries:  # the servers of MCP registries, served as they come and go
                from mcpipe.server._registries import RegistrySync

                passthrough = handlers.passthrough
                sync = RegistrySync(
                    config.registries,
                    downstreams,
                    credentials,
                    gateway.trust,
                    changed=passthrough.lists_changed if passthrough is not None else None,
                )
                await nursery.start(sync.run)
                app_registries = sync
            if tel.metrics is not None:
                nursery.start_soon(_report_downstreams, tel, downstreams, queue)
            worker = None
            if config.runs.execute if execute is None else execute:
                worker = run_worker(config, queue, gateway, server_id)
                await nursery.start(worker.run)
            yield App(
                config, gateway, downstreams, handlers, runs, worker,
                registries=app_registries if config.registries else None, oauth=oauth, instructions=instructions,
            )  # fmt: skip
            nursery.cancel_scope.cancel()
    finally:
        if declared is not None:
            with trio.CancelScope(shield=True):
                await declared.aclose()  # the connections its steps opened (SQL pools, ...)
        audit.close()
        if telemetry.current() is tel:
            telemetry.install(None)
        if tel.provider is not None:
            tel.provider.shutdown()  # flushes the spans still batched


DOWNSTREAM_REPORT_S = 5.0


async def _report_downstreams(tel: telemetry.Telemetry, downstreams: Downstreams, queue: RunQueue) -> None:
    """Keep the downstream-up gauge current (each worker reports its own connections), and the run queue's depth
    (one count by status every few seconds)."""
    if tel.metrics is not None:
        await trio.to_thread.run_sync(tel.metrics.build)  # prometheus_client, off the loop that is answering
    while True:
        tel.downstream_status(downstreams.status())
        try:
            tel.queue_depth(await queue.counts())
        except StoreUnavailable:
            pass  # the queue is away: the gauge keeps its last values, the workers log it
        await trio.sleep(DOWNSTREAM_REPORT_S)


def _known_names(gateway: Gateway, limit: int) -> Any:
    """Which tool names may label metrics: ``mcp_pipe``, and the first ``limit`` others the gateway knows that
    are called (remembered): a server with 100 000 tools, or a downstream changing its list, cannot make the
    metrics grow past ``limit`` labels (``[telemetry] max_tool_labels``; the rest count as ``other``)."""
    seen: set[str] = {PIPE_TOOL}

    def known(name: str) -> bool:
        if name in seen:
            return True
        if len(seen) <= limit and gateway.get(name) is not None:
            seen.add(name)
            return True
        return False

    return known


def _version() -> str:
    from mcpipe._version import __version__

    return __version__
