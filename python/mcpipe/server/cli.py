"""``mcpipe serve`` and ``mcpipe check --config``: the command line of the server.

``mcpipe.cli`` owns the top-level parser and delegates here: :func:`add_arguments` fills the ``serve``
subparser, :func:`main` runs it, :func:`check_config` checks a config file.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import trio

from mcpipe.config import DEFAULT_CONFIG, Config, ConfigError, load_config

__all__ = ["add_arguments", "check_config", "main", "parse_hostport", "quiet_chatter"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765


def parse_hostport(value: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT``, ``PORT`` or ``[::1]:PORT`` -> (host, port)."""
    host, port = DEFAULT_HOST, value
    if value.startswith("["):
        end = value.find("]")
        host, port = value[1:end], value[end + 2 :]
    elif ":" in value:
        host, _, port = value.rpartition(":")
        host = host or DEFAULT_HOST
    try:
        n = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not HOST:PORT: {value!r}") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range: {n}")
    return host, n


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``serve``'s options to its subparser."""
    parser.add_argument(
        "--config",
        "-c",
        metavar="FILE",
        help="config file (.toml, .yaml or .json); without it, the embedded default: mcp_pipe and the built-in tools",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--http",
        metavar="HOST:PORT",
        type=parse_hostport,
        help=f"serve streamable HTTP (the default, on the config's http.host:http.port, "
        f"{DEFAULT_HOST}:{DEFAULT_PORT} unless set)",
    )
    where.add_argument("--stdio", action="store_true", help="serve one client on stdin/stdout (for MCP clients)")
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log level (on stderr)"
    )


CHATTY_LOGGERS = ("httpx", "httpx2", "httpcore", "mcp.server.streamable_http", "mcp.server.streamable_http_manager")
"""Loggers that write a line per request or session at INFO: the HTTP client towards downstream servers (one
line per downstream request) and the SDK's session bookkeeping. The audit file is the record of calls."""


def quiet_chatter(level: int) -> None:
    """Keep per-request lines out of the log unless it runs at DEBUG."""
    if level > logging.DEBUG:
        for name in CHATTY_LOGGERS:
            logging.getLogger(name).setLevel(max(level, logging.WARNING))


def _print_problems(exc: ConfigError) -> None:
    for p in exc.problems:
        print(f"error: {p}", file=sys.stderr)


def main(ns: argparse.Namespace) -> int:
    """Run ``mcpipe serve``; returns the exit status (0 after a clean shutdown, 2 on a bad config)."""
    level = getattr(logging, str(getattr(ns, "log_level", "info")).upper())
    logging.basicConfig(stream=sys.stderr, level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_chatter(level)
    try:
        config = load_config(ns.config) if getattr(ns, "config", None) else DEFAULT_CONFIG
    except ConfigError as exc:
        _print_problems(exc)
        return 2
    http = getattr(ns, "http", None)
    stdio = bool(getattr(ns, "stdio", False))
    try:
        trio.run(_serve, config, stdio, http)
    except ConfigError as exc:
        _print_problems(exc)
        return 2
    return 0


async def _serve(config: Config, stdio: bool, http: tuple[str, int] | None) -> None:
    from mcpipe.server._app import open_app
    from mcpipe.server._http import serve_http, signalled
    from mcpipe.server._stdio import serve_stdio

    async with open_app(config) as app:
        if stdio:
            await serve_stdio(app)
        else:
            host, port = http if http is not None else (None, None)
            await serve_http(app, host=host, port=port, shutdown_trigger=signalled)


def check_config(path: str) -> int:
    """Check a config file: print every problem with its location; 1 if there are any, else 0."""
    from mcpipe.errors import Problem
    from mcpipe.server._app import load_tool_source
    from mcpipe.tools.builtin import builtin_tools

    try:
        config = load_config(path)
    except ConfigError as exc:
        _print_problems(exc)
        return 1
    problems = []
    sources: list[Any] = [builtin_tools(config.builtins)] if config.builtins is not False else []
    for i, entry in enumerate(config.python_tools):
        try:
            sources.append(load_tool_source(entry, f"{path}:python_tools[{i}]"))
        except ConfigError as exc:
            problems.extend(exc.problems)
    if not problems and config.python_tools and (config.pipelines or config.outbound is not None):
        from mcpipe.declared import config_problems  # now the python_tools' names are known too

        problems.extend(Problem(f"{path}:{p.location}", p.code, p.message) for p in config_problems(config, sources))
    if problems:
        _print_problems(ConfigError(problems))
        return 1
    n = len(config.mcpServers)
    print(f"{path}: ok ({n} downstream server{'s' if n != 1 else ''}, {len(config.python_tools)} python_tools)")
    return 0
