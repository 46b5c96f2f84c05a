"""The server's side of declared pipelines, in three calls over a config with ``pipelines`` and ``outbound``.

The config, the ``check --config`` command and ``open_app`` each need one line:

- ``parse_config`` (at the end of its checks): ``problems += config_problems(cfg)`` -- every problem of the
  two sections, with the tool names known without importing anything (the built-ins, and the
  ``<prefix>.`` of each downstream server); tool names are left unchecked when the config has
  ``python_tools``, which only importing them tells.
- ``check_config`` (after loading the ``python_tools``): ``problems += config_problems(config, sources)`` --
  the tool names, checked against the loaded sources.
- ``open_app`` (before building the gateway): ``declared = declared_source(config, sources)``, appended to
  the sources, then ``declared.bind(gateway)``.

Everything here reads the config by attribute (``pipelines``, ``outbound``, ``mcpServers``, ``builtins``,
``python_tools``, ``pipe``), so it works with the server's ``Config`` Struct once it has the two fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mcpipe.declared._pipelines import load_declared
from mcpipe.declared._tool import DeclaredPipelines, KnownTools
from mcpipe.errors import ConfigError, ErrorCode, Problem
from mcpipe.plan import Limits
from mcpipe.tools.builtin import BUILTIN_NAMES

__all__ = ["config_limits", "config_problems", "declared_source", "known_tools"]


def config_limits(config: Any) -> Limits:
    """The server's limits from the config's ``pipe`` section (as ``mcp_pipe`` gets them)."""
    p = getattr(config, "pipe", None)
    if p is None:
        return Limits()
    limits: Limits = p.limits()
    return limits


def _prefixes(config: Any) -> list[str]:
    servers = getattr(config, "mcpServers", {}) or {}
    return [name if getattr(s, "prefix", None) is None else s.prefix for name, s in servers.items()]


def known_tools(config: Any, sources: Sequence[Any] | None = None) -> KnownTools | None:
    """The tool names declared pipelines may call, besides each other.

    Args:
        config: the config.
        sources: the loaded tool sources (built-ins, ``python_tools``, ...), or None before they are loaded:
            then the built-ins the config enables are known, and None (do not check) is answered when the
            config has ``python_tools``.
    """
    reshaped = frozenset(getattr(getattr(config, "tools", None), "reshape", None) or ())
    if sources is not None:
        return KnownTools.of([*sources, _Named(reshaped)], _prefixes(config))
    if getattr(config, "python_tools", None):
        return None
    builtins = getattr(config, "builtins", True)
    names = frozenset(BUILTIN_NAMES if builtins is True else builtins or ()) | reshaped
    # Before the OpenAPI documents are read (the config is parsed, not served), their tools are known by prefix.
    apis = getattr(config, "openapi", None) or {}
    prefixes = [name if getattr(s, "prefix", None) is None else s.prefix for name, s in apis.items()]
    return KnownTools(names, [*_prefixes(config), *prefixes])


class _Named:
    """Tool names as a tool source's lookup (the reshaped tools' names, which the gateway serves)."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def get(self, name: str) -> object | None:
        return name if name in self.names else None


def config_problems(config: Any, sources: Sequence[Any] | None = None) -> list[Problem]:
    """Every problem of the config's ``pipelines`` and ``outbound`` sections, located
    (``pipelines.charge.steps[2].expression``); see :func:`known_tools` for ``sources``."""
    pipelines = getattr(config, "pipelines", None)
    outbound = getattr(config, "outbound", None)
    sql = getattr(config, "sql", None)
    if not pipelines and outbound is None and not sql:
        return []
    _, problems = load_declared(
        pipelines or [],
        outbound,
        tools=known_tools(config, sources),
        limits=config_limits(config),
        sql=sql,
        base_dir=getattr(config, "base_dir", "."),
        credentials=getattr(config, "credentials", None),
        content=content_of(config, opened=False),
    )
    return problems


def content_of(config: Any, *, opened: bool = True) -> Any:
    """The content stores of a config's ``content`` section (None without stores); ``opened=False``: only their
    names, to check steps against (nothing is created on disk)."""
    content = getattr(config, "content", None)
    if content is None or not content.stores:
        return None
    from mcpipe.store.content import ContentStores, StoreUnopenable, open_content_stores

    if not opened:
        return ContentStores(dict.fromkeys(content.stores), content.default, content.scheme)

    try:
        return open_content_stores(content, getattr(config, "base_dir", "."))
    except StoreUnopenable as e:
        raise ConfigError([Problem(f"content.stores.{e.store}.root", ErrorCode.INVALID_CONFIG, str(e))]) from None


def declared_source(config: Any, sources: Sequence[Any]) -> DeclaredPipelines:
    """The config's declared pipelines as a tool source, checked against the loaded ``sources``.

    Put it among the gateway's sources, then call ``bind(gateway)`` on it.

    Raises:
        mcpipe.errors.ConfigError: listing every problem (the server must not start).
    """
    declared, problems = load_declared(
        getattr(config, "pipelines", None) or [],
        getattr(config, "outbound", None),
        tools=known_tools(config, sources),
        limits=config_limits(config),
        sql=getattr(config, "sql", None),
        base_dir=getattr(config, "base_dir", "."),
        credentials=getattr(config, "credentials", None),
        content=content_of(config),
    )
    if problems:
        raise ConfigError(problems)
    return declared
