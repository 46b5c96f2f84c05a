"""The ``mcpipe`` command: run and check pipeline files without a server, and ``serve``.

Exit status: 0 when the pipeline (or check) is ok, 1 when it is not (including a spec that does not
parse or validate), 2 for a usage error (bad options, a file that cannot be read, tools that cannot be
loaded). Errors are one line each on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from mcpipe.errors import SpecError
from mcpipe.tools._registry import ToolRegistry

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
    except _Usage as e:
        print(f"mcpipe {ns.command}: error: {e}", file=sys.stderr)
        return USAGE_ERROR
    except _Invalid as e:
        print(f"mcpipe {ns.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"mcpipe {ns.command}: interrupted", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcpipe", description="Run pipelines of MCP tool calls.")
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
    run.set_defaults(func=_run)

    check = sub.add_parser("check", help="validate a pipeline file (or a server config) and list every problem")
    check.add_argument("spec", metavar="SPEC", nargs="?", help="pipeline file (JSON or YAML); - reads stdin")
    _tool_options(check)
    check.add_argument("--config", metavar="FILE", help="check a server config file instead of a pipeline")
    check.set_defaults(func=_check)

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

    spec = _with_vars(_load_spec(ns.spec), ns.var)
    registry = _registry(ns.tools, builtin=not ns.no_builtin)
    show = ns.progress == "always" or (ns.progress == "auto" and sys.stderr.isatty())
    on_event = _Progress(sys.stderr).on_event if show else None
    answer = trio.run(lambda: run_pipeline(spec, registry, on_event=on_event))
    sys.stdout.buffer.write(orjson.dumps(answer, option=orjson.OPT_INDENT_2, default=str) + b"\n")
    sys.stdout.flush()
    for p in answer.get("problems", ()):
        print(f"{_name(ns.spec)}: {_located(p['location'], p['message'])} [{p['code']}]", file=sys.stderr)
    return 0 if answer["ok"] else 1


def _check(ns: argparse.Namespace) -> int:
    from mcpipe.compile import compile_spec

    if ns.config is not None:
        if ns.spec is not None:
            raise _Usage("give either SPEC or --config FILE, not both")
        return int(_server_cli().check_config(ns.config))
    if ns.spec is None:
        raise _Usage("the following arguments are required: SPEC (or --config FILE)")
    name = _name(ns.spec)
    spec = _with_vars(_load_spec(ns.spec), ns.var)
    # Without --tools the tool names are not checked: the tools a server has are not known here.
    tools = _registry(ns.tools, builtin=not ns.no_builtin) if ns.tools else None
    try:
        compiled = compile_spec(spec, tools=tools)
    except SpecError as e:
        for p in e.problems:
            print(f"{name}: {_located(p.location, p.message)} [{p.code}]", file=sys.stderr)
        return 1
    steps, leaves = compiled.step_count, compiled.leaf_count
    print(f"{name}: ok ({steps} step{'s' if steps != 1 else ''}, {leaves} tool call{'s' if leaves != 1 else ''})")
    return 0


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
        _Invalid: it does not parse (the message has the line and column).
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
            return orjson.loads(text)
        except orjson.JSONDecodeError as e:
            raise _Invalid(f"{name}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    return _load_yaml(text, name)


def _load_yaml(text: str, name: str) -> Any:
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class JSONLoader(base):  # type: ignore[misc,valid-type]
        """YAML's safe loader without dates: `2024-01-01` stays a string, as a spec's values are JSON."""

    JSONLoader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in base.yaml_implicit_resolvers.items()
    }
    try:
        return yaml.load(text, Loader=JSONLoader)
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
    values = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _Usage(f"--var takes NAME=VALUE, got {item!r}")
        try:
            values[key] = orjson.loads(value)
        except orjson.JSONDecodeError:
            values[key] = value
    if isinstance(spec, dict) and "spec" in spec and "steps" not in spec:
        inner = spec["spec"]
        if isinstance(inner, str):
            try:
                inner = orjson.loads(inner)
            except orjson.JSONDecodeError:
                return spec
        return {**spec, "spec": _set_vars(inner, values)}
    return _set_vars(spec, values)


def _set_vars(spec: Any, values: dict[str, Any]) -> Any:
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
    module_name, sep, attr = entry.partition(":")
    if not sep or not module_name or not attr:
        raise _Usage(f"--tools takes MODULE:REGISTRY (e.g. mytools:registry), got {entry!r}")
    # A console script does not put the current directory on sys.path; `python -m` does.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # importing runs the module's code: any failure is the user's module's
        raise _Usage(f"cannot import {module_name!r} (from --tools {entry}): {type(e).__name__}: {e}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise _Usage(f"module {module_name!r} has no attribute {attr!r} (from --tools {entry})") from None
    try:
        tools = list(obj)
    except TypeError:
        tools = []
    if (not tools and not isinstance(obj, ToolRegistry)) or not all(_is_tool(t) for t in tools):
        raise _Usage(f"{entry} is a {type(obj).__name__}, not a ToolRegistry")
    return tools


def _is_tool(obj: Any) -> bool:
    return isinstance(getattr(obj, "name", None), str) and callable(getattr(obj, "call", None))


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
