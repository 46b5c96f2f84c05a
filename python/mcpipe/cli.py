"""The ``mcpipe`` command: run and check pipeline files without a server, and ``serve``.

Exit status: 0 when the pipeline (or check) is ok, 1 when it is not (including a spec that does not
parse or validate), 2 for a usage error (bad options, a file that cannot be read, tools that cannot be
loaded). Errors are one line each on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from mcpipe._describe import did_you_mean
from mcpipe._json import DuplicateKeyError, check_unique_keys
from mcpipe._loader import LoadError, load_object
from mcpipe._util import PIPE_TOOL
from mcpipe._util import assignments as parse_assignments
from mcpipe.errors import SpecError
from mcpipe.tools import ToolRegistry

__all__ = ["main"]

USAGE_ERROR = 2


class _Usage(Exception):
    """A usage error: printed as one line, exit status 2."""


class _Invalid(Exception):
    """An input that cannot be used (a spec file that does not parse): one line, exit status 1."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``mcpipe`` and ``python -m mcpipe``; returns the exit status."""
    parser = _parser()
    ns, extra = parser.parse_known_args(argv)
    if ns.command == "serve":
        ns.func = lambda _: _serve(extra)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(ns.func(ns))
    except BrokenPipeError:
        return _pipe_closed()
    except BaseExceptionGroup as group:  # a Trio nursery's (`events`, `worker`, a tool's): the same as bare
        if group.subgroup(KeyboardInterrupt) is not None:
            print(f"mcpipe {ns.command}: interrupted", file=sys.stderr)
            return 130
        broken, rest = group.split(BrokenPipeError)
        if broken is not None and rest is None:
            return _pipe_closed()
        raise
    except _Usage as e:
        print(f"mcpipe {ns.command}: error: {e}", file=sys.stderr)
        return USAGE_ERROR
    except _Invalid as e:
        print(f"mcpipe {ns.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"mcpipe {ns.command}: interrupted", file=sys.stderr)
        return 130


SIGPIPE_STATUS = 128 + 13
"""What a shell reports for a command killed by SIGPIPE (``yes | head -1``): a reader that went away."""


def _pipe_closed() -> int:
    """stdout's reader went away (``mcpipe tools | head -1``): end quietly, as a command killed by SIGPIPE does.

    stdout is pointed at /dev/null first, so the interpreter's last flush at exit finds nowhere to fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass  # stdout is no real file (a test's capture): nothing will flush to a closed pipe
    return SIGPIPE_STATUS


class _Version(argparse.Action):
    """``--version``: the installed version, read only when asked for (``importlib.metadata`` is not free)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kw: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from mcpipe._version import __version__

        print(f"mcpipe {__version__}")  # on stdout, as argparse's own version action does
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcpipe", description="Run pipelines of MCP tool calls.")
    parser.add_argument("--version", action=_Version, help="show the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser("run", help="run a pipeline file and print its answer as JSON")
    run.add_argument("spec", metavar="SPEC", help="pipeline file (JSON or YAML); - reads stdin")
    _tool_options(run)
    run.add_argument(
        "--progress",
        choices=["auto", "always", "never"],
        default="auto",
        help="show steps starting and finishing on stderr (auto: when stderr is a terminal)",
    )
    run.add_argument(
        "--answer",
        choices=["result", "steps", "full"],
        default="result",
        help="what the answer holds when the spec does not say (its `answer`): the result (and what ran, on "
        "failure), a summary per step, or every step's full record (default: result, as the server answers)",
    )
    _debug_option(run)
    run.set_defaults(func=_run)

    check = sub.add_parser("check", help="validate a pipeline file (or a server config) and list every problem")
    check.add_argument("spec", metavar="SPEC", nargs="?", help="pipeline file (JSON or YAML); - reads stdin")
    _tool_options(check)
    check.add_argument(
        "--config",
        metavar="FILE",
        help="alone: check a server config file; with SPEC: check the spec against the tools the config serves",
    )
    check.add_argument(
        "--explain", action="store_true", help="with --config: show how another system's config maps onto mcpipe's"
    )
    check.set_defaults(func=_check)

    convert = sub.add_parser("convert", help="print another system's server config (mcpg's) in mcpipe's own layout")
    convert.add_argument("--config", metavar="FILE", required=True, help="the config file")
    convert.add_argument("--to", choices=["yaml", "json"], default="yaml", help="the output format (default: yaml)")
    convert.set_defaults(func=_convert)

    tools = sub.add_parser("tools", help="list the tools a config (or --tools, or a running server) offers")
    _source_options(tools)
    tools.add_argument("--json", action="store_true", help="print the list as JSON (names, descriptions, schemas)")
    tools.set_defaults(func=_tools)

    call = sub.add_parser("call", help="call one tool and print its result")
    call.add_argument("tool", metavar="TOOL", help="the tool's name (mcp_pipe too)")
    call.add_argument(
        "args", metavar="ARGS", nargs="?", default="{}", help="its arguments, a JSON or YAML object; - reads stdin"
    )
    _source_options(call)
    call.add_argument(
        "--json", action="store_true", help="print the whole result (content, structuredContent, isError)"
    )
    _debug_option(call)
    call.set_defaults(func=_call)

    worker = sub.add_parser("worker", help="execute queued runs (background pipelines) until stopped")
    worker.add_argument("--config", "-c", metavar="FILE", help="the server's config file (its tools, [runs], [store])")
    worker.add_argument("--id", metavar="ID", help="this worker's id in events (default: host:pid:random)")
    worker.add_argument("--concurrency", type=int, metavar="N", help="runs executed at once (default: [runs])")
    worker.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log level (on stderr)"
    )
    worker.set_defaults(func=lambda ns: _server_cli().worker_main(ns))

    runs = sub.add_parser("runs", help="list queued, running and finished runs, newest first")
    runs.add_argument("--config", "-c", metavar="FILE", help="the server's config file ([runs], [store])")
    runs.add_argument("--status", choices=["queued", "running", "completed", "failed", "cancelled"])
    runs.add_argument("--limit", type=int, default=50, metavar="N", help="at most N runs (default 50)")
    runs.add_argument("--json", action="store_true", help="one JSON object per line")
    runs.set_defaults(func=lambda ns: _server_cli().runs_main(ns))

    events = sub.add_parser("events", help="print a run's events, following them live until the run ends")
    events.add_argument("run_id", metavar="RUN_ID")
    events.add_argument("--config", "-c", metavar="FILE", help="the server's config file ([runs], [store])")
    events.add_argument("--no-follow", action="store_true", help="print the events so far and stop")
    events.add_argument("--json", action="store_true", help="one JSON object per line")
    events.set_defaults(func=lambda ns: _server_cli().events_main(ns))

    auth = sub.add_parser("auth", help="the OAuth sign-ins mcpipe holds for downstream servers: list, revoke, login")
    auth_sub = auth.add_subparsers(dest="auth_command", metavar="ACTION", required=True)
    auth_list = auth_sub.add_parser("list", help="every principal's sign-in per server (never the tokens)")
    auth_list.add_argument("--config", "-c", metavar="FILE", required=True, help="the server's config file")
    auth_list.add_argument("--server", metavar="NAME", help="only this server's")
    auth_list.add_argument("--json", action="store_true", help="one JSON object per line")
    auth_list.set_defaults(func=lambda ns: _server_cli().auth_main(ns))
    auth_revoke = auth_sub.add_parser("revoke", help="forget a principal's tokens for a server (it signs in again)")
    auth_revoke.add_argument("server", metavar="SERVER")
    auth_revoke.add_argument("principal", metavar="PRINCIPAL", nargs="?", help="default: the operator's account")
    auth_revoke.add_argument("--config", "-c", metavar="FILE", required=True, help="the server's config file")
    auth_revoke.add_argument("--all", action="store_true", help="every principal's tokens for the server")
    auth_revoke.set_defaults(func=lambda ns: _server_cli().auth_main(ns))
    auth_login = auth_sub.add_parser(
        "login", help="sign in to a server with the operator's own account (shared by every caller)"
    )
    auth_login.add_argument("server", metavar="SERVER")
    auth_login.add_argument("--config", "-c", metavar="FILE", required=True, help="the server's config file")
    auth_login.add_argument("--timeout", type=float, default=600.0, metavar="S", help="how long to wait (600)")
    auth_login.set_defaults(func=lambda ns: _server_cli().auth_main(ns))

    explain = sub.add_parser(
        "explain", help="print what a pipeline file would do, without running anything (its dry run)"
    )
    explain.add_argument(
        "spec",
        metavar="FILE",
        nargs="?",
        help="a pipeline spec (JSON or YAML; - reads stdin), a NoETL playbook, or a config with one pipeline",
    )
    _tool_options(explain)
    explain.add_argument(
        "--format",
        choices=["json", "mermaid", "dot", "svg"],
        default="json",
        help="json: the dry run (every check, then the plan); mermaid, dot, svg: the plan drawn, as the console "
        "draws it (docs/console.md)",
    )
    explain.add_argument(
        "--config",
        metavar="FILE",
        help="a server config: its outbound policy checks a playbook, and --pipeline names one of its pipelines",
    )
    explain.add_argument(
        "--pipeline", metavar="NAME", help="with --config: draw its declared pipeline or playbook NAME"
    )
    explain.set_defaults(func=_explain)

    from mcpipe._playbook_cli import add_parser as add_playbook_parser

    add_playbook_parser(sub)  # mcpipe playbook check|run

    # The server (and the MCP SDK under it) is imported only when `serve` runs: it takes a while.
    sub.add_parser(
        "serve", help="serve mcp_pipe and the configured tools over MCP (see: mcpipe serve --help)", add_help=False
    )
    return parser


def _tool_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tools",
        metavar="MODULE:REGISTRY",
        action="append",
        default=[],
        help="a ToolRegistry to call, e.g. mytools:registry (repeatable; the current directory is importable)",
    )
    p.add_argument(
        "--no-builtin", action="store_true", help="leave out the built-in tools (echo, json_parse, text_join, ...)"
    )
    p.add_argument(
        "--var",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help="set vars.NAME (VALUE is JSON when it parses as JSON, else a string; repeatable)",
    )


def _source_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tools",
        metavar="MODULE:REGISTRY",
        action="append",
        default=[],
        help="a ToolRegistry (repeatable), beside the built-in tools, as for run",
    )
    p.add_argument("--no-builtin", action="store_true", help="leave out the built-in tools")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--config", metavar="FILE", help="the tools of a server config (python_tools, pipelines, mcpServers)"
    )
    where.add_argument(
        "--url", metavar="URL", help="the tools of a running server (streamable HTTP, e.g. http://127.0.0.1:8765/mcp)"
    )


def _debug_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true", help="log with tracebacks (a tool that raises is one line without)")


def _server_cli() -> Any:
    """The server's command-line module (``mcpipe.server.cli``)."""
    try:
        return importlib.import_module("mcpipe.server.cli")
    except ImportError as e:
        raise _Usage(f"the server is not available in this installation ({type(e).__name__}: {e})") from None


def _serve(argv: list[str]) -> int:
    """``mcpipe serve ...``: the server's own parser and main (``mcpipe.server.cli``)."""
    server_cli = _server_cli()
    parser = argparse.ArgumentParser(prog="mcpipe serve", description="Serve mcp_pipe and the configured tools.")
    server_cli.add_arguments(parser)
    return int(server_cli.main(parser.parse_args(argv)))


# --- run and check ----------------------------------------------------------------------------------


def _run(ns: argparse.Namespace) -> int:
    import trio

    from mcpipe.runtime import run_pipeline

    _log_to_stderr(ns)
    spec = _with_vars(_load_spec(ns.spec), ns.var)
    registry = _registry(ns.tools, builtin=not ns.no_builtin)
    show = ns.progress == "always" or (ns.progress == "auto" and sys.stderr.isatty())
    on_event = _Progress(sys.stderr).on_event if show else None
    answer = trio.run(lambda: run_pipeline(spec, registry, on_event=on_event, answer=ns.answer))
    return _answered(ns.spec, answer)


def _explain(ns: argparse.Namespace) -> int:
    """``mcpipe explain FILE``: the spec's dry run (every check, then the plan), as JSON; with ``--format``
    mermaid, dot or svg, the plan of a spec, a declared pipeline or a playbook drawn."""
    import trio

    from mcpipe.runtime import run_pipeline

    if ns.format != "json":
        return _draw(ns)
    if ns.spec is None:
        raise _Usage("the following arguments are required: FILE")
    if ns.config is not None or ns.pipeline is not None:
        raise _Usage("--config and --pipeline go with --format mermaid|dot|svg")
    spec = _with_vars(_load_spec(ns.spec), ns.var)
    if isinstance(spec, dict) and "spec" in spec and "steps" not in spec:
        spec = spec["spec"]
    if not isinstance(spec, dict):
        raise _Invalid(f"{_name(ns.spec)}: a pipeline spec must be an object")
    registry = _registry(ns.tools, builtin=not ns.no_builtin)
    answer = trio.run(lambda: run_pipeline({**spec, "dry_run": True}, registry))
    return _answered(ns.spec, answer)


def _draw(ns: argparse.Namespace) -> int:
    """``mcpipe explain ... --format mermaid|dot|svg``: the plan drawn on stdout; problems located on stderr."""
    from mcpipe.plan import drawing

    found = _plan_to_draw(ns)
    if isinstance(found, int):
        return found
    plan, title = found
    d = drawing(plan)
    if ns.format == "mermaid":
        out = d.mermaid()
    elif ns.format == "dot":
        out = d.dot(title)
    else:
        out = d.svg(title=title)
    sys.stdout.write(out)
    sys.stdout.flush()
    return 0


def _plan_to_draw(ns: argparse.Namespace) -> tuple[Any, str] | int:
    """The plan ``explain --format`` draws and its title, or the exit status after its problems were printed."""
    from mcpipe.compile import compile_spec

    if ns.pipeline is not None:
        if ns.config is None:
            raise _Usage("--pipeline NAME goes with --config FILE")
        if ns.spec is not None:
            raise _Usage("give FILE or --pipeline NAME, not both")
        return _config_plan(ns.config, ns.pipeline)
    if ns.spec is None:
        if ns.config is not None:
            return _config_plan(ns.config, None)
        raise _Usage("the following arguments are required: FILE (or --config FILE --pipeline NAME)")
    name = _name(ns.spec)
    raw = _load_spec(ns.spec)
    if isinstance(raw, dict) and ("workflow" in raw or "apiVersion" in raw or "mcp" in raw):
        return _playbook_plan(ns, name)
    if isinstance(raw, dict) and "pipelines" in raw and "steps" not in raw:
        if ns.spec == "-":
            raise _Usage("a config is read from a file: explain --config FILE --pipeline NAME")
        return _config_plan(ns.spec, None)
    spec = _with_vars(raw, ns.var)
    if isinstance(spec, dict) and "spec" in spec and "steps" not in spec:
        spec = spec["spec"]
    try:
        compiled = compile_spec(spec)
    except SpecError as e:
        for p in e.problems:
            print(f"{name}: {_located(p.location, p.message)} [{p.code}]", file=sys.stderr)
        return 1
    return compiled.plan, Path(name).stem if ns.spec != "-" else "pipeline"


def _playbook_plan(ns: argparse.Namespace, name: str) -> tuple[Any, str] | int:
    """A playbook's plan, checked as ``mcpipe playbook check`` checks it (``--config``: its policy)."""
    from mcpipe._playbook_cli import _context, _UsageError
    from mcpipe.formats.noetl import load_playbook

    if ns.spec == "-":
        raise _Usage("a playbook is read from a file (its tasks may name files beside it)")
    try:
        _, models, policy = _context(argparse.Namespace(config=ns.config))
    except _UsageError as e:  # the config's own problems were printed by _context
        print(f"mcpipe explain: error: {e}", file=sys.stderr)
        return 2
    pb, problems = load_playbook(ns.spec, models=models, policy=policy)
    if problems or pb is None or pb.plan is None:
        for p in problems:
            print(f"{p.location}: {p.message} [{p.code}]", file=sys.stderr)
        return 1
    return pb.plan.plan, pb.name


def _config_plan(path: str, wanted: str | None) -> tuple[Any, str] | int:
    """A config's declared pipeline or playbook ``wanted`` (None: its only one)."""
    from mcpipe.config import ConfigError, load
    from mcpipe.plan import plan_of

    try:
        sources = _server_app().tool_sources(load(path))  # compiled once, by the load
    except ConfigError as exc:
        for line in dict.fromkeys(str(p) for p in exc.problems):
            print(f"error: {line}", file=sys.stderr)
        return 1
    plans = {tool.name: plan for source in sources for tool in source if (plan := plan_of(tool)) is not None}
    if wanted is None:
        if len(plans) != 1:
            names = ", ".join(sorted(plans)) or "none"
            raise _Usage(f"{path} has {len(plans)} pipelines ({names}): name one with --config {path} --pipeline NAME")
        wanted = next(iter(plans))
    if wanted not in plans:
        names = ", ".join(sorted(plans)) or "none"
        raise _Usage(f"{path} has no declared pipeline or playbook {wanted!r} (it has: {names})")
    return plans[wanted], wanted


def _server_app() -> Any:
    return importlib.import_module("mcpipe.server._app")


def _answered(source: str, answer: dict[str, Any]) -> int:
    """Print a pipeline's answer as JSON, and its problems on stderr located in ``source``; the exit code."""
    sys.stdout.buffer.write(orjson.dumps(answer, option=orjson.OPT_INDENT_2, default=str) + b"\n")
    sys.stdout.flush()
    for p in answer.get("problems", ()):
        print(f"{_name(source)}: {_located(p['location'], p['message'])} [{p['code']}]", file=sys.stderr)
    return 0 if answer["ok"] else 1


def _check(ns: argparse.Namespace) -> int:
    if ns.config is not None and ns.spec is None:
        if ns.tools or ns.no_builtin:
            raise _Usage("--tools and --no-builtin do not go with --config FILE (the config names its tools)")
        status = int(_server_cli().check_config(ns.config))
        if status == 0 and ns.explain:
            return int(_server_cli().convert_config(ns.config, explain_only=True))
        return status
    if ns.explain:
        raise _Usage("--explain goes with --config FILE alone")
    if ns.spec is None:
        raise _Usage("the following arguments are required: SPEC (or --config FILE)")
    if ns.config is not None and (ns.tools or ns.no_builtin):
        raise _Usage("--tools and --no-builtin do not go with --config FILE (the config names its tools)")
    import trio

    name = _name(ns.spec)
    spec = _with_vars(_load_spec(ns.spec), ns.var)
    # The checks a run makes before its first step (mcpipe.runtime.check_pipeline), against the tools it would
    # have: a spec `check` calls ok is one `run` (or `call mcp_pipe --config FILE`) does not refuse.
    if ns.config is not None:
        if int(_server_cli().check_config(ns.config, quiet=True)) != 0:
            return USAGE_ERROR  # the config the spec is checked against cannot be used (printed above)
        logging.getLogger("mcpipe").setLevel(logging.ERROR)  # a server that is down is the note below, once
        source = argparse.Namespace(**{**vars(ns), "url": None})  # `_with_tools` opens the config's app
        problems, compiled, unchecked = trio.run(_with_tools, source, lambda tools: _config_check(tools, spec))
        against = f"the tools of {ns.config}"
    else:
        registry = _registry(ns.tools, builtin=not ns.no_builtin)
        problems, compiled = trio.run(_spec_check, spec, registry, None, None)
        unchecked = []
        against = " and ".join(
            [*(["the built-in tools"] if not ns.no_builtin else []), *(["--tools"] if ns.tools else [])]
        )
    for server, why in unchecked:
        print(f"{name}: note: the tools of server `{server}` are not checked: {why}", file=sys.stderr)
    if compiled is None:
        for p in problems:
            print(f"{name}: {_located(p.location, p.message)} [{p.code}]", file=sys.stderr)
        if any(p.code == "UNKNOWN_TOOL" for p in problems):
            hint = "" if ns.config is not None or ns.tools else " (--tools MODULE:REGISTRY or --config FILE adds yours)"
            print(f"{name}: note: tool names were checked against {against or 'no tools'}{hint}", file=sys.stderr)
        return 1
    steps, leaves = compiled.step_count, compiled.leaf_count
    print(f"{name}: ok ({steps} step{'s' if steps != 1 else ''}, {leaves} tool call{'s' if leaves != 1 else ''})")
    return 0


async def _spec_check(spec: Any, registry: Any, context: Any, limits: Any) -> tuple[list[Any], Any]:
    """The problems of ``spec`` with those tools, or its compiled plan: ``([], compiled)`` or ``(problems, None)``."""
    from mcpipe.runtime import check_pipeline

    try:
        return [], await check_pipeline(spec, registry, context=context, limits=limits)
    except SpecError as e:
        return e.problems, None


async def _config_check(tools: _Local, spec: Any) -> tuple[list[Any], Any, list[tuple[str, str]]]:
    """``spec`` checked as the config's ``mcp_pipe`` checks a call of ``mcpipe call`` (its limits, its policy
    for a caller with no principal), and the downstream servers whose tools cannot be known (down, or not
    connected yet), with why."""
    from mcpipe.errors import Problem

    app = tools.app
    await app.gateway.ready()
    unchecked = [
        (s.name, s.last_error or s.state)
        for s in app.downstreams.servers
        if s.config.enabled and s.state != "up" and not s.tools
    ]
    pipe = app.handlers.pipe
    if pipe is None:
        from mcpipe.config import no_pipe_reason

        why = f"this config serves no `mcp_pipe`: {no_pipe_reason(app.config)}"
        return [Problem("", "INVALID_SPEC", why)], None, unchecked
    problems, compiled = await _spec_check(spec, app.gateway, _cli_context(), pipe.limits)
    return problems, compiled, unchecked


def _convert(ns: argparse.Namespace) -> int:
    return int(_server_cli().convert_config(ns.config, ns.to))


def _name(path: str) -> str:
    return "<stdin>" if path == "-" else path


def _located(location: str, message: str) -> str:
    return f"{location}: {message}" if location else message


# --- reading specs ----------------------------------------------------------------------------------


def _load_spec(path: str) -> Any:
    """Read a spec file (``-``: stdin) as JSON or YAML.

    JSON when the name ends in ``.json``, YAML for ``.yaml``/``.yml``; otherwise JSON when the text starts
    with ``{`` or ``[``, else YAML.

    Raises:
        _Usage: the file cannot be read.
        _Invalid: it does not parse (the message has the line and column), or it holds a string.
    """
    name = _name(path)
    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as e:
        raise _Usage(f"cannot read {name}: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise _Invalid(f"{name}: not UTF-8 text (byte {e.start})") from None
    suffix = Path(path).suffix.lower() if path != "-" else ""
    as_json = suffix == ".json" or (suffix not in (".yaml", ".yml") and text.lstrip()[:1] in ("{", "["))
    if as_json:
        try:
            spec = orjson.loads(text)
            check_unique_keys(text)
        except orjson.JSONDecodeError as e:
            raise _Invalid(f"{name}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
        except DuplicateKeyError as e:
            raise _Invalid(f"{name}:{e.lineno}:{e.colno}: {e.msg}") from None
    else:
        spec = _load_yaml(text, name)
    if isinstance(spec, str):  # the file's text is already parsed: a string is not JSON text to parse again
        raise _Invalid(f"{name}: a pipeline spec must be an object with `steps`, got a string")
    return spec


def _load_yaml(text: str, name: str) -> Any:
    import yaml

    from mcpipe._yaml import load_yaml

    try:
        return load_yaml(text, timestamps=False)  # a spec's values are JSON: dates stay strings
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        what = " ".join(str(x) for x in (e.context, e.problem) if x)
        raise _Invalid(f"{name}{where}: invalid YAML: {what}") from None
    except yaml.YAMLError as e:
        raise _Invalid(f"{name}: invalid YAML: {e}") from None


def _with_vars(spec: Any, assignments: list[str]) -> Any:
    """Set ``vars.NAME`` for each ``NAME=VALUE`` (inside ``{"spec": ...}`` too). A spec whose shape is
    wrong is left as it is, for validation to report."""
    if not assignments:
        return spec
    try:
        values = parse_assignments(assignments, "--var")
    except ValueError as e:
        raise _Usage(str(e)) from None
    if isinstance(spec, dict) and "spec" in spec and "steps" not in spec:
        inner = spec["spec"]
        if isinstance(inner, str):
            try:
                inner = orjson.loads(inner)
            except orjson.JSONDecodeError:
                return spec
        _check_vars_used(inner, values)
        return {**spec, "spec": _set_vars(inner, values)}
    _check_vars_used(spec, values)
    return _set_vars(spec, values)


_VAR_REFERENCE = re.compile(r"""\bvars\s*(?:\.\s*([A-Za-z_][A-Za-z0-9_-]*)|\[\s*["']([^"']+)["'])""")


def _check_vars_used(spec: Any, values: Mapping[str, object]) -> None:
    """A ``--var`` the spec neither declares in ``vars`` nor references is a typo, not a no-op."""
    if not isinstance(spec, dict):
        return
    declared = spec.get("vars")
    used = set(declared) if isinstance(declared, dict) else set()
    for m in _VAR_REFERENCE.finditer(orjson.dumps(spec).decode()):
        used.add(m.group(1) or m.group(2))
    for name in values:
        if name not in used:
            known = sorted(used)
            hint = did_you_mean(name, known) or (f" (it uses: {', '.join(known)})" if known else " (it uses none)")
            raise _Usage(f"--var {name}: the spec has no var `{name}`{hint}")


def _set_vars(spec: Any, values: Mapping[str, object]) -> Any:
    if not isinstance(spec, dict) or not isinstance(spec.get("vars", {}), dict):
        return spec
    return {**spec, "vars": {**spec.get("vars", {}), **values}}


# --- tools ------------------------------------------------------------------------------------------


def _registry(entries: list[str], *, builtin: bool) -> ToolRegistry:
    """The tools a run may call: the built-in tools (unless left out), shadowed by those of ``--tools``.

    Raises:
        _Usage: an entry is not ``MODULE:ATTR``, cannot be imported, is not a registry, or two entries
            define the same tool.
    """
    tools: dict[str, Any] = {}
    if builtin:
        try:
            from mcpipe.tools.builtin import builtin_tools
        except ImportError:
            pass
        else:
            tools.update((t.name, t) for t in builtin_tools())
    seen: dict[str, str] = {}
    for entry in entries:
        for tool in _load_tools(entry):
            if tool.name in seen:
                raise _Usage(f"tool '{tool.name}' is defined by both {seen[tool.name]} and {entry}")
            seen[tool.name] = entry
            tools[tool.name] = tool
    return ToolRegistry(list(tools.values()))


def _load_tools(entry: str) -> list[Any]:
    try:
        obj = load_object(entry)
    except LoadError as e:
        raise _Usage(f"--tools {entry}: {e}") from None
    try:
        tools = list(obj)
    except TypeError:
        tools = []
    if (not tools and not isinstance(obj, ToolRegistry)) or not all(_is_tool(t) for t in tools):
        raise _Usage(f"--tools {entry}: a {type(obj).__name__}, not a ToolRegistry")
    return tools


def _is_tool(obj: Any) -> bool:
    return isinstance(getattr(obj, "name", None), str) and callable(getattr(obj, "call", None))


# --- tools and call ---------------------------------------------------------------------------------


def _tools(ns: argparse.Namespace) -> int:
    import trio

    listed = trio.run(_with_tools, ns, _list)
    if ns.json:
        sys.stdout.buffer.write(orjson.dumps(listed, option=orjson.OPT_INDENT_2) + b"\n")
        return 0
    for tool in listed:
        print(_signature(tool))
        description = (tool.get("description") or "").strip()
        if description:
            print(f"    {description.splitlines()[0]}")
    return 0


def _call(ns: argparse.Namespace) -> int:
    import trio

    _log_to_stderr(ns)
    if not ns.debug:  # a tool that raises is the answer's one line below, not a log line too
        logging.getLogger("mcpipe.server").setLevel(logging.CRITICAL)
    args = _call_args(ns.args)
    out = trio.run(_with_tools, ns, lambda tools: tools.call(ns.tool, args))
    structured = out.get("structuredContent")
    failed = bool(out.get("isError")) or "error" in out
    if ns.json:
        sys.stdout.buffer.write(orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n")
    elif failed:
        pass  # a failure is the one line on stderr below (--json prints the whole result)
    elif structured is not None:
        sys.stdout.buffer.write(orjson.dumps(structured, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print("".join(b.get("text", "") for b in out.get("content", []) if b.get("type") == "text"))
    sys.stdout.flush()
    if failed:
        for line in _failure_lines(ns.tool, out):
            print(f"mcpipe call: {ns.tool}: {line}", file=sys.stderr)
        return 1
    return 0


def _call_args(given: str) -> dict[str, Any]:
    """``mcpipe call``'s arguments: a JSON or YAML object (as ``run`` reads a spec with no suffix), ``-``: stdin.

    Raises:
        _Usage: they do not parse, or are not an object.
    """
    text = sys.stdin.read() if given == "-" else given
    if text.lstrip()[:1] in ("{", "["):
        try:
            args = orjson.loads(text)
            check_unique_keys(text)
        except orjson.JSONDecodeError as e:
            raise _Usage(f"ARGS is not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
        except DuplicateKeyError as e:
            raise _Usage(f"ARGS:{e.lineno}:{e.colno}: {e.msg}") from None
    else:
        try:
            args = _load_yaml(text, "ARGS")
        except _Invalid as e:
            raise _Usage(str(e)) from None
    if args is None and not text.strip():
        args = {}
    if not isinstance(args, dict):
        raise _Usage(f"ARGS must be an object (JSON or YAML), got {_json_type(args)}")
    return args


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number" if isinstance(value, int | float) else type(value).__name__)


def _failure_lines(tool: str, out: dict[str, Any]) -> list[str]:
    """A failed call as lines for stderr: an ``mcp_pipe`` answer's problems (one each, located, as ``run``
    prints them) or its error; a JSON-RPC error's message and code; another tool's text, each line that is
    not blank (discord's `mcp_pipeline` says `**Input Error**` first and what is wrong next), at most
    ``_MAX_ERROR_LINES``."""
    structured = out.get("structuredContent")
    if tool == PIPE_TOOL and isinstance(structured, dict) and "ok" in structured:
        problems = structured.get("problems") or ()
        if problems:
            return [f"{_located(p.get('location', ''), p.get('message', ''))} [{p.get('code')}]" for p in problems]
        code = structured.get("error_code")
        return [f"{structured.get('error') or 'the pipeline failed'}" + (f" [{code}]" if code else "")]
    refused = out.get("error")
    if isinstance(refused, dict):  # a JSON-RPC error: the server refused the call (trust, scopes, arguments)
        return [f"{' '.join(str(refused.get('message', '')).split())} (JSON-RPC error {refused.get('code')})"]
    text = "\n".join(b.get("text", "") for b in out.get("content", []) if b.get("type") == "text")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > _MAX_ERROR_LINES:  # an error page, a stack: its head, and where the rest is
        more = len(lines) - _MAX_ERROR_LINES
        lines = [*lines[:_MAX_ERROR_LINES], f"... {more} more line{'s' if more > 1 else ''} (--json prints them)"]
    return lines or ["the tool reported an error"]


_MAX_ERROR_LINES = 10
"""The most lines of a tool's error text ``mcpipe call`` prints (each prefixed, as one error each)."""


async def _list(tools: Any) -> Any:
    return await tools.list()


async def _with_tools(ns: argparse.Namespace, use: Any) -> Any:
    """Open the tools ``ns`` names (a running server, a config, or local registries) and ``use`` them."""
    if ns.url is not None:
        from mcp import Client

        if ns.tools or ns.no_builtin:
            raise _Usage("--tools and --no-builtin do not go with --url (the server has its own tools)")
        try:
            async with Client(ns.url) as client:
                return await use(_Remote(client, ns.url))
        except _Usage:
            raise
        except Exception as e:  # the connection fails in many ways (OSError, HTTP errors, groups of them)
            said = e.subgroup(_Usage) if isinstance(e, ExceptionGroup) else None
            if said is not None:  # what `use` said (no such tool), through the client's task group
                raise _leaf(said) from None
            raise _Usage(f"cannot reach {ns.url}: {_first_error(e)}") from None

    from mcpipe.config import AuditConfig, Config, ConfigError, Loaded, load
    from mcpipe.server import open_app

    extra: list[Any] = [_registry(ns.tools, builtin=False)] if ns.tools else []
    try:
        config: Config | Loaded
        if ns.config is not None:
            config = load(ns.config)  # compiled once, served so
        else:
            config = Config(builtins=not ns.no_builtin, audit=AuditConfig(enabled=False))
        async with open_app(config, extra_sources=extra) as app:
            return await use(_Local(app))
    except ConfigError as e:  # a config that cannot be used (unreadable, or with problems): as `serve` says it
        raise _Usage("; ".join(str(p) for p in e.problems)) from None
    except BaseExceptionGroup as group:  # open_app's nursery wraps what `use` raised
        mine, _ = group.split((_Usage, _Invalid))
        if mine is None:
            raise
        raise _leaf(mine) from None


def _leaf(e: BaseException) -> BaseException:
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


class _Local:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def list(self) -> list[dict[str, Any]]:
        await self.app.gateway.ready()
        return list(self.app.handlers.visible_tools(None))

    async def call(self, name: str, args: Mapping[str, object]) -> dict[str, Any]:
        from mcp import MCPError

        handlers = self.app.handlers
        await self.app.gateway.ready()
        if name == PIPE_TOOL and handlers.pipe is None:
            from mcpipe.config import no_pipe_reason

            raise _Usage(f"no tool `{name}`: {no_pipe_reason(self.app.config)}")
        if name != PIPE_TOOL and handlers.gateway.get(name) is None:
            known = [t["name"] for t in handlers.visible_tools(None)]
            raise _Usage(f"no tool `{name}`{did_you_mean(name, known)}")
        try:
            return dict(await handlers.call(name, args, _cli_context()))
        except MCPError as e:  # refused as a client's call is (trust, scopes): the JSON-RPC error it gets
            return {"error": e.error.model_dump(exclude_none=True)}


def _cli_context() -> Any:
    """The context of the command line's calls: a caller with no principal, named as a client, with a request
    id of its own (as a client's call has one)."""
    from uuid import uuid4

    from mcpipe.tools import ToolContext

    return ToolContext(request_id=f"cli-{uuid4().hex}", client={"name": "mcpipe-cli"})


_INVALID_PARAMS = -32602
"""The JSON-RPC code the MCP SDK answers a call of an unknown tool with (other codes are refusals: trust,
scopes, a gate)."""

_MAX_LIST_PAGES = 100
"""The most pages of a running server's ``tools/list`` the command line reads."""


class _Remote:
    def __init__(self, client: Any, url: str) -> None:
        self.client = client
        self.url = url

    async def list(self) -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = []
        cursor = None
        for _ in range(_MAX_LIST_PAGES):
            page = await self.client.list_tools(cursor=cursor)
            listed += [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in page.tools]
            cursor = page.next_cursor
            if not cursor:
                break
        return listed

    async def call(self, name: str, args: Mapping[str, object]) -> dict[str, Any]:
        """The call's result, or ``{"error": ...}`` for a JSON-RPC error. A failure for a tool the server does
        not list is no such tool (a usage error, as for a local one), whichever way the server answered it."""
        from mcp import MCPError

        try:
            result = await self.client.call_tool(name, args)
            out = dict(result.model_dump(by_alias=True, mode="json", exclude_none=True))
        except MCPError as e:
            out = {"error": e.error.model_dump(exclude_none=True)}
        unknown_code = out.get("error", {}).get("code") == _INVALID_PARAMS  # the SDK's `unknown tool: x`
        if (out.get("isError") or unknown_code) and name != PIPE_TOOL:
            known = [t["name"] for t in await self.list()]
            if name not in known:
                raise _Usage(f"no tool `{name}` at {self.url}{did_you_mean(name, known)}")
        return out


def _first_error(e: BaseException) -> str:
    e = _leaf(e)
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _signature(tool: dict[str, Any]) -> str:
    """``name(a: string, b?: integer)`` from a tool's input schema (``, ...`` when it takes any other
    argument too)."""
    schema = tool.get("inputSchema") or {}
    required = set(schema.get("required") or ())
    params = []
    for name, prop in (schema.get("properties") or {}).items():
        kind = prop.get("type") if isinstance(prop, dict) else None
        if isinstance(kind, list):
            kind = "|".join(map(str, kind))
        mark = "" if name in required else "?"
        params.append(f"{name}{mark}: {kind}" if kind else f"{name}{mark}")
    extra = schema.get("additionalProperties")
    if extra is True or isinstance(extra, dict):  # any other argument too (`echo(...)`, not `echo()`)
        params.append("...")
    return f"{tool['name']}({', '.join(params)})"


# --- logging ----------------------------------------------------------------------------------------


class _OneLine(logging.Formatter):
    """Log records as one line each; an exception is named, its traceback shown only with ``--debug``."""

    def __init__(self, fmt: str, debug: bool) -> None:
        super().__init__(fmt)
        self.debug = debug

    def format(self, record: logging.LogRecord) -> str:
        if self.debug or not record.exc_info:
            return super().format(record)
        exc = record.exc_info[1]
        record = logging.makeLogRecord({**record.__dict__, "exc_info": None, "exc_text": None})
        line = super().format(record)
        return f"{line}: {type(exc).__name__}: {exc}" if exc is not None else line


def _log_to_stderr(ns: argparse.Namespace) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine(f"mcpipe {ns.command}: %(levelname)s: %(message)s", ns.debug))
    logging.basicConfig(level=logging.INFO if ns.debug else logging.WARNING, handlers=[handler], force=True)


# --- progress ---------------------------------------------------------------------------------------


class _Progress:
    """Steps starting and finishing, one line each, on a terminal."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def on_event(self, event: dict[str, Any]) -> None:
        count = f"[{event['completed']}/{event['total']}]"
        if event["type"] == "step_started":
            line = f"{count} start {event['path']} ({event['kind']})"
        elif event["ok"]:
            line = f"{count} ok    {event['path']} {event['duration_ms']:.1f} ms"
        else:
            line = f"{count} {event['error_code'].lower():5} {event['path']}: {event['error']}"
        print(line, file=self.stream, flush=True)
