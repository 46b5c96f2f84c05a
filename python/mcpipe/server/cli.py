"""``mcpipe serve`` and ``mcpipe check --config``: the command line of the server.

``mcpipe.cli`` owns the top-level parser and delegates here: :func:`add_arguments` fills the ``serve``
subparser, :func:`main` runs it, :func:`check_config` checks a config file.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import orjson
import trio

from mcpipe.config import DEFAULT_CONFIG, Config, ConfigError, Loaded, load, load_config, no_pipe_reason, resolve_path

_log = logging.getLogger("mcpipe.server")

__all__ = [
    "add_arguments",
    "check_config",
    "events_main",
    "main",
    "parse_hostport",
    "quiet_chatter",
    "runs_main",
    "worker_main",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
LOG_LEVELS = ("debug", "info", "warning", "error")
ENVIRONMENT = {
    "config": "MCPIPE_CONFIG",
    "http": "MCPIPE_HTTP",
    "workers": "MCPIPE_WORKERS",
    "log_level": "MCPIPE_LOG_LEVEL",
}
"""``serve``'s options that an environment variable sets when the command line does not (a container's or a
unit's environment): the option wins over its variable."""


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
        help="config file (.toml, .yaml or .json); without it, $MCPIPE_CONFIG, else the embedded default: mcp_pipe "
        "and the built-in tools",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--http",
        metavar="HOST:PORT",
        type=parse_hostport,
        help=f"serve streamable HTTP (the default, on $MCPIPE_HTTP, else the config's http.host:http.port, "
        f"{DEFAULT_HOST}:{DEFAULT_PORT} unless set)",
    )
    where.add_argument("--stdio", action="store_true", help="serve one client on stdin/stdout (for MCP clients)")
    parser.add_argument(
        "--workers",
        type=_positive,
        metavar="N",
        help="HTTP worker processes sharing the port (default: $MCPIPE_WORKERS, else the config's http.workers, 1); "
        "see docs/deployment.md",
    )
    parser.add_argument("--listen-fd", type=int, help=argparse.SUPPRESS)  # a worker's inherited socket
    parser.add_argument("--runs-path", help=argparse.SUPPRESS)  # a worker's run queue, shared by the supervisor
    parser.add_argument(
        "--log-level", choices=LOG_LEVELS, help="log level (on stderr; default: $MCPIPE_LOG_LEVEL, else info)"
    )
    parser.add_argument(
        "--no-worker", action="store_true", help="do not execute queued runs here (leave them to `mcpipe worker`)"
    )
    parser.add_argument(
        "--console",
        action="store_true",
        help="serve the web console at /console and its JSON API at /api/v1 ([console] enabled; docs/console.md)",
    )


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not 1 <= n <= 256:
        raise argparse.ArgumentTypeError(f"must be between 1 and 256: {n}")
    return n


CHATTY_LOGGERS = ("httpx", "httpx2", "httpcore", "mcp.server.streamable_http", "mcp.server.streamable_http_manager")
"""Loggers that write a line per request or session at INFO: the HTTP client towards downstream servers (one
line per downstream request) and the SDK's session bookkeeping. The audit file is the record of calls."""


def quiet_chatter(level: int) -> None:
    """Keep per-request lines out of the log unless it runs at DEBUG."""
    if level > logging.DEBUG:
        for name in CHATTY_LOGGERS:
            logging.getLogger(name).setLevel(max(level, logging.WARNING))


def _print_problems(exc: ConfigError) -> None:
    """Each problem once (a file read by two checks reports its problems to both), in order."""
    for line in dict.fromkeys(str(p) for p in exc.problems):
        print(f"error: {line}", file=sys.stderr)


def _logging(ns: argparse.Namespace) -> None:
    level = getattr(logging, str(getattr(ns, "log_level", "info")).upper())
    logging.basicConfig(stream=sys.stderr, level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_chatter(level)


class _JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": self.formatTime(record), "level": record.levelname.lower(), "logger": record.name}
        out["message"] = record.getMessage()
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def log_to_file(config: Config) -> logging.Handler:
    """Append the log to ``[logs] file`` too (JSON lines or text), at the level stderr has."""
    handler = logging.FileHandler(resolve_path(config, config.logs.file or ""), encoding="utf-8")
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handler.setFormatter(_JsonLines() if config.logs.format == "json" else logging.Formatter(fmt))
    logging.getLogger().addHandler(handler)
    return handler


def from_environment(ns: argparse.Namespace, environ: dict[str, str] | None = None) -> str | None:
    """Fill the options of :data:`ENVIRONMENT` the command line left unset from their variables (an empty
    variable counts as unset); returns the one-line error of a variable whose value the option would refuse."""
    env = os.environ if environ is None else environ
    for option, variable in ENVIRONMENT.items():
        value = env.get(variable, "")
        if getattr(ns, option, None) is not None or not value:
            continue
        if option == "http" and getattr(ns, "stdio", False):
            continue  # --stdio on the command line: there is no address to listen on
        try:
            setattr(ns, option, _from_variable(option, value))
        except argparse.ArgumentTypeError as exc:
            return f"{variable}={value!r}: {exc}"
    if getattr(ns, "log_level", None) is None:
        ns.log_level = "info"
    return None


def _from_variable(option: str, value: str) -> Any:
    if option == "http":
        return parse_hostport(value)
    if option == "workers":
        return _positive(value)
    if option == "log_level":
        if value.lower() not in LOG_LEVELS:
            raise argparse.ArgumentTypeError(f"not a log level (one of {', '.join(LOG_LEVELS)})")
        return value.lower()
    return value


def main(ns: argparse.Namespace) -> int:
    """Run ``mcpipe serve``; returns the exit status (0 after a clean shutdown, 2 on a bad config)."""
    problem = from_environment(ns)
    if problem is not None:
        print(f"mcpipe serve: error: {problem}", file=sys.stderr)
        return 2
    _logging(ns)
    try:
        loaded = load(ns.config) if getattr(ns, "config", None) else Loaded(DEFAULT_CONFIG)
    except ConfigError as exc:
        _print_problems(exc)
        return 2
    config = loaded.config
    if config.logs.file:
        log_to_file(config)
    if getattr(ns, "console", False):
        config = msgspec.structs.replace(config, console=msgspec.structs.replace(config.console, enabled=True))
    if getattr(ns, "runs_path", None):  # a worker of `--workers N`: the queue its supervisor shares
        config = msgspec.structs.replace(config, runs=msgspec.structs.replace(config.runs, path=ns.runs_path))
    http = getattr(ns, "http", None)
    stdio = bool(getattr(ns, "stdio", False))
    execute = False if getattr(ns, "no_worker", False) else None
    workers = getattr(ns, "workers", None) or config.http.workers
    listen_fd = getattr(ns, "listen_fd", None)
    if stdio and config.console.enabled:
        _log.warning("the console is served over HTTP: --stdio serves none")
    if stdio and workers > 1:
        print("error: --workers is for HTTP; --stdio serves one client", file=sys.stderr)
        return 2
    activated = _activated(stdio)
    if isinstance(activated, str):
        print(f"mcpipe serve: error: {activated}", file=sys.stderr)
        return 2
    if activated is not None:  # systemd's socket: its address is the one served
        http = activated.getsockname()[:2]
    if (execute is False or not config.runs.execute) and not _shares_runs(config) and not _runs_path_given(ns):
        print(
            "error: --no-worker ([runs] execute = false) leaves queued runs to `mcpipe worker` processes, "
            'which need a queue they share: set [runs] path (SQLite) or [store] url = "redis://..."',
            file=sys.stderr,
        )
        return 2
    try:
        if workers > 1 and listen_fd is None:
            return _supervise(ns, config, http, workers, activated)
        activated_fd = None if activated is None else activated.detach()  # hypercorn's socket owns it now
        trio.run(
            _serve, loaded.replace(config), stdio, http, execute, listen_fd, getattr(ns, "config", None), activated_fd
        )
    except ConfigError as exc:
        _print_problems(exc)
        return 2
    except (OSError, BaseExceptionGroup) as exc:
        sole = _sole(exc)
        if isinstance(sole, ConfigError):  # found while the app opened (python_tools that do not import)
            _print_problems(sole)
            return 2
        if isinstance(sole, OSError) and sole.filename is not None:  # a file it writes (the audit log), not the port
            print(f"mcpipe serve: error: {sole.filename}: {(sole.strerror or str(sole)).lower()}", file=sys.stderr)
            return 1
        error = _os_error(exc)
        if error is None:
            raise
        host, port = http if http is not None else (config.http.host, config.http.port)
        print(f"mcpipe serve: error: cannot listen on {host}:{port}: {error}", file=sys.stderr)
        return 1
    return 0


def _activated(stdio: bool) -> socket.socket | str | None:
    """The listening socket systemd passed (socket activation), None without one, or the error to print."""
    from mcpipe.server._workers import ActivationError, activated_socket

    try:
        sock = activated_socket()
    except ActivationError as exc:
        return str(exc)
    if sock is not None and stdio:
        sock.detach()
        return "socket activation passed a listening socket, and --stdio serves stdin: drop one"
    return sock


def _runs_path_given(ns: argparse.Namespace) -> bool:
    return bool(getattr(ns, "runs_path", None))


def _shares_runs(config: Config) -> bool:
    from mcpipe.server._app import shares_runs

    return shares_runs(config)


def _supervise(
    ns: argparse.Namespace,
    config: Config,
    http: tuple[str, int] | None,
    workers: int,
    sock: socket.socket | None = None,
) -> int:
    from mcpipe.server._app import shares_runs
    from mcpipe.server._http import signalled
    from mcpipe.server._workers import supervise

    host, port = http if http is not None else (config.http.host, config.http.port)
    args = ["--log-level", str(getattr(ns, "log_level", "info"))]
    if getattr(ns, "config", None):
        args += ["--config", str(Path(ns.config).resolve())]
    if getattr(ns, "no_worker", False):
        args.append("--no-worker")
    if getattr(ns, "console", False):
        args.append("--console")
    run = partial(
        supervise,
        workers=workers,
        host=host,
        port=port,
        path=config.http.path,
        worker_args=args,
        shutdown_trigger=signalled,
        shared_store=not config.store.url.startswith("memory:"),
        state_key_env=config.interaction.state_key_env,
        share_runs=not shares_runs(config),
        sock=sock,
    )
    try:
        return trio.run(run)
    except OSError as exc:
        print(
            f"mcpipe serve: error: cannot listen on {host}:{port}: {(exc.strerror or str(exc)).lower()}",
            file=sys.stderr,
        )
        return 1


def _sole(exc: BaseException) -> BaseException:
    """The one exception inside nested groups of one (Trio nurseries wrap what a task raised)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _os_error(exc: BaseException) -> str | None:
    """The message of the OSError that stopped the server (binding its address), alone or in groups."""
    exc = _sole(exc)
    if not isinstance(exc, OSError):
        return None
    return (exc.strerror or str(exc)).lower()


async def _serve(
    loaded: Loaded,
    stdio: bool,
    http: tuple[str, int] | None,
    execute: bool | None = None,
    listen_fd: int | None = None,
    path: str | None = None,
    activated_fd: int | None = None,
) -> None:
    from mcpipe.server._app import open_app
    from mcpipe.server._heap import settle
    from mcpipe.server._http import serve_http, signalled
    from mcpipe.server._reload import Reloader

    shutdown_trigger = signalled
    if listen_fd is not None:  # a worker of `--workers N`: it ends with its supervisor, even one killed outright
        from mcpipe.server._workers import SUPERVISOR_ENV, first_of, supervisor_gone

        supervisor = int(os.environ.get(SUPERVISOR_ENV) or os.getppid())
        shutdown_trigger = partial(first_of, signalled, partial(supervisor_gone, supervisor))
    host, port = http if http is not None else (None, None)
    if stdio or path is None:
        if loaded.config.reload.watch:
            _log.warning("reload.watch: a config is reloaded when served over HTTP from a file, not here")
        async with open_app(loaded, execute=execute) as app:
            settle()
            if stdio:
                from mcpipe.server._stdio import serve_stdio  # the SDK's stdio transport, for --stdio only

                await serve_stdio(app)
            else:
                await serve_http(
                    app,
                    host=host,
                    port=port,
                    shutdown_trigger=shutdown_trigger,
                    listen_fd=listen_fd,
                    activated_fd=activated_fd,
                    config_path=path,
                )
        return
    # Over HTTP from a file: SIGHUP (and `reload.watch`) serve the file's next version without a restart.
    reloader = Reloader(path, loaded, execute=execute)
    async with trio.open_nursery() as nursery:
        app = await nursery.start(reloader.run)
        settle()
        await serve_http(
            app,
            host=host,
            port=port,
            shutdown_trigger=shutdown_trigger,
            listen_fd=listen_fd,
            activated_fd=activated_fd,
            on_front=reloader.attach,
            config_path=path,
        )
        nursery.cancel_scope.cancel()


class _KeepEnv(dict[str, str]):
    """An environment where every variable reads as its own ``${env.NAME}`` reference."""

    def get(self, key: str, default: object = None) -> Any:
        return "${env." + key + "}"

    def __contains__(self, key: object) -> bool:
        return True


def convert_config(path: str, to: str = "yaml", *, explain_only: bool = False) -> int:
    """``mcpipe convert --config FILE``: another system's config (mcpg's) in mcpipe's own layout, on stdout,
    with where each part came from; ``explain_only`` prints only that mapping. 1 when the file has
    problems (printed, located; a file already in mcpipe's layout is checked as ``check --config`` does),
    2 when it cannot be read, else 0."""
    import json

    import yaml

    from mcpipe.config import _decode_raw
    from mcpipe.errors import Problem
    from mcpipe.formats import detect_config

    p = Path(path)
    fmt = {".toml": "toml", ".yaml": "yaml", ".yml": "yaml", ".json": "json"}.get(p.suffix.lower())
    if fmt is None:
        _print_problems(
            ConfigError([Problem(str(p), "INVALID_CONFIG", "a config file ends in .toml, .yaml, .yml or .json")])
        )
        return 2
    try:
        raw = _decode_raw(p.read_bytes(), fmt)
    except OSError as exc:
        _print_problems(ConfigError([Problem(str(p), "INVALID_CONFIG", f"cannot read: {exc.strerror}")]))
        return 2
    except Exception as exc:  # a syntax error: the loader says where
        try:
            load_config(path)
        except ConfigError as located:
            _print_problems(located)
            return 1
        raise exc
    foreign = detect_config(raw) if isinstance(raw, dict) else None
    if foreign is None:  # nothing to convert: its problems, as `check --config` finds them, else say so
        status = check_config(path, quiet=True)
        if status == 0:
            print(f"{path}: already in mcpipe's own layout", file=sys.stderr)
        return status
    # `${env.NAME}` stays as written (no secret of this shell goes into the output): mcpipe reads it when the
    # converted file is served.
    translation = foreign.translate(raw, base_dir=str(p.resolve().parent), environ=_KeepEnv())
    if translation.problems:
        _print_problems(ConfigError([Problem(f"{p}:{q.location}", q.code, q.message) for q in translation.problems]))
        return 1
    lines = [f"{new}  <-  {old}" for new, old in translation.mapping]
    if explain_only:
        print(f"{path}: {foreign.name}'s layout, read as mcpipe's:")
        for line in lines:
            print(f"  {line}")
        return 0
    head = [f"mcpipe's own layout of {path} ({foreign.name}'s), written by `mcpipe convert`:", ""]
    head += [f"  {line}" for line in lines]
    if to == "json":
        print(json.dumps(translation.raw, indent=2))
    else:
        print("\n".join(f"# {line}".rstrip() for line in head))
        print(yaml.safe_dump(translation.raw, sort_keys=False, allow_unicode=True), end="")
    return 0


def check_config(path: str, *, quiet: bool = False) -> int:
    """Check a config file: print every problem with its location; 1 if there are any, 2 when the file
    cannot be read, else 0 (and the summary line, unless ``quiet``). An environment variable the file reads
    and this environment lacks is a warning (``serve`` refuses the file until it is set): the check runs in
    CI without the secrets, as mcpg's ``config check`` does."""
    from mcpipe.errors import Problem
    from mcpipe.tools.builtin import builtin_tools

    warnings: list[Problem] = []
    try:
        loaded = load(path, warnings=warnings)  # what the file declares is compiled here, once
    except ConfigError as exc:
        _print_problems(exc)
        return 2 if exc.unreadable else 1
    finally:
        for line in dict.fromkeys(str(w) for w in warnings):
            print(f"warning: {line}", file=sys.stderr)
    config = loaded.config
    problems = []
    sources: list[Any] = [builtin_tools(config.builtins)] if config.builtins is not False else []
    for i, entry in enumerate(config.python_tools):
        from mcpipe.server._app import load_tool_source  # the server's loader (it imports the whole server)

        try:
            sources.append(load_tool_source(entry, f"{path}:python_tools[{i}]", base_dir=config.base_dir))
        except ConfigError as exc:
            problems.extend(exc.problems)
    if not problems and config.python_tools:  # now the python_tools' names are known too
        problems.extend(Problem(f"{path}:{p.location}", p.code, p.message) for p in loaded.tool_problems(sources))
    problems.extend(_missing_commands(config, path, {w.location for w in warnings}))
    apis = _openapi_check(config, path, problems) if config.openapi and not problems else None
    if problems:
        _print_problems(ConfigError(problems))
        return 1
    if quiet:
        return 0
    counts = [
        _count(len(config.mcpServers), "downstream server"),
        _count(len(config.python_tools), "python_tools entry", "python_tools entries"),
        _count(len(config.pipelines), "pipeline"),
    ]
    from mcpipe.formats import format_counts, own_workflow, turned_on

    if config.workflow is not None or turned_on(config):
        shared = loaded.context()  # what the load compiled: counted, not compiled again
        served = format_counts(shared)
        if config.workflow is not None and own_workflow(shared) is not None:
            served["workflow tool"] = 1
        counts += [_count(n, kind) for kind, n in served.items()]
    if apis is not None:
        tools = sum(len(a.tools) for a in apis.apis)
        refused = sum(len(a.refused) for a in apis.apis)
        counts.append(_count(tools, "OpenAPI tool") + f" ({refused} operation{'s' if refused != 1 else ''} refused)")
    no_pipe = "" if config.pipe.enabled else f"; no mcp_pipe: {no_pipe_reason(config)}"
    print(f"{path}: ok ({', '.join(counts)}){no_pipe}")
    return 0


def _openapi_check(config: Config, path: str, problems: list[Any]) -> Any:
    """Read the config's OpenAPI documents as ``serve`` would: a document that cannot be read is a problem; an
    operation refused, or what openapi-spec-validator says, a warning (located in the config)."""
    import trio

    from mcpipe.access import Credentials
    from mcpipe.errors import Problem
    from mcpipe.openapi import load_openapi

    try:
        apis = trio.run(
            lambda: load_openapi(config.openapi, base_dir=config.base_dir, credentials=Credentials(config.credentials))
        )
    except ConfigError as exc:
        problems.extend(Problem(f"{path}:{p.location}", p.code, p.message) for p in exc.problems)
        return None
    for warning in apis.warnings():
        print(f"warning: {path}:{warning}", file=sys.stderr)
    return apis


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _missing_commands(config: Config, path: str, warned: set[str]) -> list[Any]:
    """Downstream servers whose ``command`` is neither an executable file nor on PATH (``serve`` would
    start, and retry them in vain); not those whose command reads an unset variable (``warned``)."""
    import os
    import shutil

    from mcpipe.errors import Problem

    problems = []
    for name, server in config.mcpServers.items():
        command = server.command
        if command is None or not server.enabled or f"{path}:mcpServers.{name}.command" in warned:
            continue
        search = (server.env or {}).get("PATH", os.environ.get("PATH"))
        if os.sep in command:
            found = os.access(os.path.join(server.cwd or ".", command), os.X_OK)
        else:
            found = shutil.which(command, path=search) is not None
        if not found:
            where = "is not an executable file" if os.sep in command else "is not found on PATH"
            problems.append(Problem(f"{path}:mcpServers.{name}.command", "INVALID_CONFIG", f"`{command}` {where}"))
    return problems


# --- runs: mcpipe worker, mcpipe runs, mcpipe events --------------------------------------------------


_NEEDS = {"runs": ("runs", "store"), "events": ("runs", "store")}
"""The sections ``mcpipe runs`` and ``mcpipe events`` read (the queue): an environment variable read elsewhere
(an ``auth.tokens`` secret, a downstream server's header) need not be set to list runs."""


def _runs_config(ns: argparse.Namespace, command: str) -> Loaded | None:
    """The config, checked to name a queue that outlives a process; None (printed) when it does not.

    An environment variable the file reads and this environment lacks is refused only where the command reads
    it: ``runs`` and ``events`` read the queue's sections; ``worker`` runs the tools, so every section but
    ``auth`` (the HTTP front's callers, which a worker does not serve)."""
    from mcpipe.errors import Problem

    path = getattr(ns, "config", None)
    if not path:
        loaded = Loaded(DEFAULT_CONFIG)
    else:
        warnings: list[Problem] = []
        try:
            loaded = load(path, warnings=warnings)
        except ConfigError as exc:
            _print_problems(exc)
            return None
        needs = _NEEDS.get(command)
        unset = [
            w
            for w in warnings
            if (section := w.location.removeprefix(f"{path}:").split(".", 1)[0].split("[", 1)[0])
            and (section in needs if needs is not None else section != "auth")
        ]
        if unset:  # as `serve` says them
            tail = ": `mcpipe serve` refuses the file until it is"
            _print_problems(ConfigError([Problem(w.location, w.code, w.message.removesuffix(tail)) for w in unset]))
            return None
    config = loaded.config
    if config.runs.path is None and not config.store.url.startswith(("redis://", "rediss://", "unix://")):
        where = f"{ns.config}: " if getattr(ns, "config", None) else ""
        print(
            f"mcpipe {command}: error: {where}no shared run queue: set [runs] path (a SQLite file) "
            'or [store] url = "redis://..."',
            file=sys.stderr,
        )
        return None
    return loaded


def worker_main(ns: argparse.Namespace) -> int:
    """``mcpipe worker``: execute queued runs until SIGINT/SIGTERM (2 on a bad config)."""
    _logging(ns)
    loaded = _runs_config(ns, "worker")
    if loaded is None:
        return 2
    if ns.concurrency is not None:
        if ns.concurrency < 1:
            print("mcpipe worker: error: --concurrency must be at least 1", file=sys.stderr)
            return 2
        runs = msgspec.structs.replace(loaded.config.runs, concurrency=ns.concurrency)
        loaded = loaded.replace(msgspec.structs.replace(loaded.config, runs=runs))
    try:
        trio.run(_work, loaded, ns.id)
    except ConfigError as exc:
        _print_problems(exc)
        return 2
    return 0


async def _work(loaded: Loaded, worker_id: str | None) -> None:
    from mcpipe.server._app import open_app, run_worker
    from mcpipe.server._heap import settle
    from mcpipe.server._http import signalled

    log = logging.getLogger("mcpipe.runs")
    async with open_app(loaded, execute=False) as app, trio.open_nursery() as nursery:
        settle()
        worker = run_worker(loaded.config, app.runs.queue, app.gateway, worker_id)
        await nursery.start(worker.run)
        log.info("worker %s: executing queued runs", worker.id)
        print(f"worker {worker.id} ready", file=sys.stderr, flush=True)
        await signalled(log)
        nursery.cancel_scope.cancel()


def runs_main(ns: argparse.Namespace) -> int:
    """``mcpipe runs``: the newest runs, one line each."""
    loaded = _runs_config(ns, "runs")
    if loaded is None:
        return 2
    config = loaded.config
    if not 1 <= ns.limit <= 10_000:
        print("mcpipe runs: error: --limit must be between 1 and 10000", file=sys.stderr)
        return 2
    return int(trio.run(_list_runs, config, ns))


async def _list_runs(config: Config, ns: argparse.Namespace) -> int:
    from mcpipe.server._app import run_queue

    queue = run_queue(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(queue.run)
        runs = await queue.runs(limit=ns.limit, status=ns.status)
        nursery.cancel_scope.cancel()
    for info in runs:
        if ns.json:
            print(orjson.dumps(info.summary()).decode())
        else:
            worker = info.worker or "-"
            print(
                f"{info.id}  {info.status:<9}  {_when(info.created)}  {info.target}  attempts={info.attempts}  {worker}"
            )
    return 0


def events_main(ns: argparse.Namespace) -> int:
    """``mcpipe events RUN_ID``: the run's events, followed live until it ends (1: no such run)."""
    loaded = _runs_config(ns, "events")
    if loaded is None:
        return 2
    config = loaded.config
    try:
        return int(trio.run(_events, config, ns))
    except KeyboardInterrupt:
        return 130


async def _events(config: Config, ns: argparse.Namespace) -> int:
    from mcpipe.server._app import run_queue
    from mcpipe.store.events import follow

    queue = run_queue(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(queue.run)
        if await queue.get(ns.run_id) is None:
            print(f"mcpipe events: error: no run {ns.run_id!r}", file=sys.stderr)
            nursery.cancel_scope.cancel()
            return 1
        if ns.no_follow:
            batch = await queue.events(ns.run_id, limit=10_000)
        else:
            batch = None
            async for event in follow(queue, ns.run_id):
                _print_event(event.to_dict(), ns.json)
        for event in batch or []:
            _print_event(event.to_dict(), ns.json)
        nursery.cancel_scope.cancel()
    return 0


def _when(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _print_event(event: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(orjson.dumps(event).decode(), flush=True)
        return
    rest = {k: v for k, v in event.items() if k not in ("cursor", "at", "type", "worker") and v is not None}
    detail = " ".join(f"{k}={v}" for k, v in rest.items())
    print(f"{_when(event['at'])}  {event['type']:<13}  {event['worker'] or '-'}  {detail}".rstrip(), flush=True)


# --- mcpipe auth -----------------------------------------------------------------------------------------


def auth_main(ns: argparse.Namespace) -> int:
    """``mcpipe auth list|revoke|login``: the sign-ins held for downstream servers (2: bad config or names)."""
    command = f"auth {ns.auth_command}"
    try:
        config = load_config(ns.config)
    except ConfigError as exc:
        _print_problems(exc)
        return 2
    from mcpipe.server._app import oauth_clients

    try:
        oauth = oauth_clients(config)
    except ConfigError as exc:
        _print_problems(exc)
        return 2
    if oauth is None:
        print(f"mcpipe {command}: error: {ns.config}: no mcpServers entry has `oauth`", file=sys.stderr)
        return 2
    server = getattr(ns, "server", None)
    if server is not None and server not in oauth.servers:
        known = ", ".join(sorted(oauth.servers))
        print(f"mcpipe {command}: error: no server `{server}` with `oauth` (known: {known})", file=sys.stderr)
        return 2
    return int(trio.run(_auth, oauth, ns))


async def _auth(oauth: Any, ns: argparse.Namespace) -> int:
    from mcpipe.downstream import OPERATOR, SignInError

    async with trio.open_nursery() as nursery:
        await nursery.start(oauth.store.run)
        try:
            if ns.auth_command == "list":
                for row in await oauth.list():
                    if ns.server is not None and row["server"] != ns.server:
                        continue
                    if ns.json:
                        print(orjson.dumps(row).decode())
                    else:
                        who = "(operator)" if row["principal"] == OPERATOR else row["principal"]
                        refresh = "refreshable" if row["refreshable"] else "no refresh token"
                        scope = row["scope"] or "-"
                        print(f"{row['server']}  {who}  expires {_when(row['expires_at'])}  {scope}  {refresh}")
                return 0
            auth = oauth.servers[ns.server]
            if ns.auth_command == "revoke":
                if ns.all:
                    rows = [r for r in await oauth.list() if r["server"] == ns.server]
                    for row in rows:
                        await auth.forget(row["principal"])
                    print(f"revoked {len(rows)} sign-in(s) to {ns.server}")
                    return 0
                principal = ns.principal or OPERATOR
                if not await auth.forget(principal):
                    print(f"mcpipe auth revoke: error: `{principal}` holds no sign-in to {ns.server}", file=sys.stderr)
                    return 1
                print(f"revoked {principal}'s sign-in to {ns.server}")
                return 0
            return await _login(oauth, auth, ns)
        except SignInError as exc:
            print(f"mcpipe auth {ns.auth_command}: error: {exc}", file=sys.stderr)
            return 1
        finally:
            nursery.cancel_scope.cancel()


async def _login(oauth: Any, auth: Any, ns: argparse.Namespace) -> int:
    """The operator's sign-in: print the URL; its redirect comes back to the callback (a running ``mcpipe serve``
    sharing the store, or, when the callback is a loopback address nothing listens on, this command itself)."""
    from urllib.parse import parse_qsl, urlsplit

    from mcpipe.downstream import OPERATOR

    url, _ = await auth.begin(OPERATOR, None)
    callback = urlsplit(oauth.callback_url)
    listen = callback.hostname in ("127.0.0.1", "localhost", "::1") and callback.port is not None

    async def serve_callback(stream: trio.SocketStream) -> None:
        request = b""
        with trio.move_on_after(30):
            while b"\r\n\r\n" not in request and len(request) < 65536:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    break
                request += chunk
        line = request.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        target = urlsplit(line[1]) if len(line) >= 2 else None
        if target is None or target.path != callback.path:
            status, page = 404, b"not found"
        else:
            status, page = await oauth.callback(dict(parse_qsl(target.query)))
        head = f"HTTP/1.1 {status} OK\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: {len(page)}\r\n"
        await stream.send_all(head.encode() + b"connection: close\r\n\r\n" + page)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        if listen:
            try:
                listeners = await trio.open_tcp_listeners(callback.port, host=callback.hostname)
            except OSError:
                listeners = []  # a running server has the port: it takes the callback (the store is shared)
            for listener in listeners:
                nursery.start_soon(trio.serve_listeners, serve_callback, [listener])
        print("Open this URL in a browser and sign in:", flush=True)
        print(url, flush=True)
        signed = await auth.wait_signed_in(OPERATOR, ns.timeout)
        nursery.cancel_scope.cancel()
    if not signed:
        print(
            f"mcpipe auth login: error: the sign-in to {ns.server} did not complete within {ns.timeout:g} s",
            file=sys.stderr,
        )
        return 1
    print(f"signed in to {ns.server} (the operator's account, used by every caller)")
    return 0
