"""Assembling a running mcpipe from a :class:`~mcpipe.config.Config`: tool sources, downstream actors,
the gateway, and the SDK server on top.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio
from mcp.server.lowlevel.server import Server

from mcpipe import telemetry
from mcpipe._loader import LoadError, load_object
from mcpipe.compile import Limits, configure_cache
from mcpipe.config import Config, ConfigError, resolve_path
from mcpipe.errors import Problem
from mcpipe.gateway import AuditLog, Gateway, Policy, ToolSource
from mcpipe.interaction import INTERACTION_TOOL_NAMES, Interactions, interaction_tools
from mcpipe.server._core import PipeRunner, ToolHandlers, build_server, principal_of
from mcpipe.server._passthrough import Passthrough
from mcpipe.store import open_pipeline_store
from mcpipe.tools.builtin import builtin_tools
from mcpipe.tools.downstream import Downstreams

__all__ = ["App", "load_tool_source", "open_app"]

_log = logging.getLogger("mcpipe.server")


def load_tool_source(entry: str, where: str = "python_tools", *, base_dir: str = ".") -> ToolSource:
    """Import ``module:attr`` (the config file's directory and the current one importable) and check it is
    a tool source (a ToolRegistry, or anything with ``get`` and iteration).

    Raises:
        ConfigError: the module or attribute cannot be imported, or is not a tool source.
    """
    try:
        obj = load_object(entry, search=[base_dir])
    except LoadError as exc:
        raise ConfigError([Problem(where, "INVALID_CONFIG", f"cannot load `{entry}`: {exc}")]) from None
    if not (callable(getattr(obj, "get", None)) and hasattr(obj, "__iter__")):
        raise ConfigError(
            [Problem(where, "INVALID_CONFIG", f"`{entry}` is a {type(obj).__name__}, not a ToolRegistry")]
        )
    return obj  # type: ignore[no-any-return]


def policy_of(config: Config) -> Policy:
    grants: dict[str, list[str]] = {}
    for t in config.auth.tokens:
        grants.setdefault(t.principal, []).extend(t.tools)
    return Policy(grants)


def limits_of(config: Config) -> Limits:
    limits: Limits = config.pipe.limits()
    return limits


@dataclass
class App:
    """A running mcpipe: its config, gateway, downstream actors, and the SDK server serving them."""

    config: Config
    gateway: Gateway
    downstreams: Downstreams
    handlers: ToolHandlers
    server: Server[Any]


@asynccontextmanager
async def open_app(
    config: Config,
    *,
    extra_sources: list[ToolSource] | None = None,
    audit: AuditLog | None = None,
    errlog: Any = None,
) -> AsyncIterator[App]:
    """Start everything a config describes and yield the App; stop it all on exit.

    Downstream servers with ``connect = "start"`` have tried to connect once when this yields (each
    bounded by its ``connect_timeout_ms``; one that failed keeps retrying in the background).

    Args:
        config: the config.
        extra_sources: more tool sources, looked up after the built-ins and ``python_tools`` (tests).
        audit: an audit log to use instead of the configured one.
        errlog: where stdio downstream servers' stderr goes (default: ours).

    Raises:
        ConfigError: a ``python_tools`` entry cannot be loaded.
    """
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
    declared = None
    if config.pipelines or config.outbound is not None or config.sql:
        from mcpipe.declared import declared_source

        declared = declared_source(config, sources)  # raises ConfigError listing every problem
        sources.append(declared)
    bind_models = None
    if config.workflow is not None or config.playbooks:
        from mcpipe.playbooks import model_sources

        model_tools, bind_models = model_sources(config, sources)  # the workflow tool, playbooks
        sources.extend(model_tools)
    downstreams = Downstreams(config.mcpServers, errlog=errlog)
    sources.append(downstreams)
    if audit is None:
        audit = AuditLog(resolve_path(config, config.audit.path) if config.audit.enabled else None)
    gateway = Gateway(
        sources,
        policy=policy_of(config),
        costs=config.costs,
        audit=audit,
        ready=downstreams.ready if downstreams.lazy else None,
    )
    if declared is not None:
        declared.bind(gateway)  # their tool steps go through the same call path
    if bind_models is not None:
        bind_models(gateway)
    limits = limits_of(config)
    configure_cache(max_bytes=config.pipe.compile_cache_bytes)
    if config.pipelines:  # only declared pipelines evaluate expressions (and load CEL and JSONata)
        from mcpipe.declared._expr import set_expression_timeout

        set_expression_timeout(config.pipe.expression_timeout_ms)
    handlers = ToolHandlers(gateway, PipeRunner(gateway, limits) if config.pipe.enabled else None, limits=limits)
    handlers.passthrough = Passthrough(
        downstreams, gateway.policy, lambda ctx: principal_of(ctx, handlers.default_principal)
    )
    server = build_server(handlers, name=config.name, version=_version())
    store = open_pipeline_store(config.store, config.interaction)
    handlers.interactions = Interactions.from_config(config.interaction, store, audience=config.name)
    try:
        tel = telemetry.configure(config.telemetry, service=config.name, known=_known_names(gateway))
    except ValueError as exc:
        raise ConfigError([Problem("telemetry.traces", "INVALID_CONFIG", str(exc))]) from None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)  # sweeps expired suspended pipelines, or holds the Redis client
            if declared is not None:
                await nursery.start(declared.run)  # nats/grpc/kafka connections, shared per URL
            await downstreams.start(nursery)
            if tel.metrics is not None:
                nursery.start_soon(_report_downstreams, tel, downstreams)
            yield App(config, gateway, downstreams, handlers, server)
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


async def _report_downstreams(tel: telemetry.Telemetry, downstreams: Downstreams) -> None:
    """Keep the downstream-up gauge current (each worker reports its own connections)."""
    while True:
        tel.downstream_status(downstreams.status())
        await trio.sleep(DOWNSTREAM_REPORT_S)


def _known_names(gateway: Gateway) -> Any:
    """Which tool names may label metrics: those the gateway knows (remembered), and ``mcp_pipe``."""
    seen: set[str] = {"mcp_pipe"}

    def known(name: str) -> bool:
        if name in seen:
            return True
        if gateway.get(name) is not None and len(seen) < 10_000:
            seen.add(name)
            return True
        return False

    return known


def _version() -> str:
    from mcpipe import __version__

    return __version__
