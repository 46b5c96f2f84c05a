"""``mcpipe playbook check FILE`` and ``mcpipe playbook run FILE [--input k=v]``.

Exit status: 0 ok, 1 for a playbook with problems or a failed run, 2 for a usage error. Problems are one
located line each on stderr (``pb.yaml: mcp.turns[2].model: unknown model ...``); ``run`` prints the answer
as JSON on stdout and, with ``--events``, every event as a JSON line on stderr.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping
from typing import Any

import orjson

from mcpipe._util import assignments

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Add ``playbook`` (with ``check`` and ``run``) to the ``mcpipe`` command's subparsers."""
    pb = sub.add_parser("playbook", help="check or run a NoETL playbook, with mcp: turns or not (docs/playbooks.md)")
    actions = pb.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser("check", help="check a playbook and list every problem, located")
    run = actions.add_parser("run", help="run a playbook and print its answer as JSON")
    for p in (check, run):
        p.add_argument("file", metavar="FILE", help="the playbook (YAML)")
        p.add_argument("--config", metavar="FILE", help="a server config: its models, outbound policy and tools")
        p.add_argument(
            "--catalog",
            metavar="DIR",
            action="append",
            default=[],
            help="a directory whose playbooks `playbook` tasks may run, by metadata.path or path (repeatable; "
            "the current directory and the file's own are always looked in; nothing outside them is)",
        )
    run.add_argument(
        "--input",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help="set input.NAME (VALUE is JSON when it parses as JSON, else a string; repeatable)",
    )
    run.add_argument("--events", action="store_true", help="print every event as a JSON line on stderr")
    check.set_defaults(func=_check)
    run.set_defaults(func=_run)


class _UsageError(Exception):
    pass


def _context(ns: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(the config's load or None, models, outbound policy with the config's SQL backends); without a config,
    no models (the compiler's own default: none) and no policy."""
    if ns.config is None:
        return None, None, None
    from dataclasses import replace

    from mcpipe.config import ConfigError, load
    from mcpipe.declared import load_outbound, load_sql
    from mcpipe.models import Models, load_models

    try:
        loaded = load(ns.config)  # what it declares compiled once, and served so (open_app)
    except ConfigError as e:
        for p in e.problems:
            print(str(p), file=sys.stderr)
        raise _UsageError(f"the config {ns.config} has problems") from None
    config = loaded.config
    presets, _ = load_models(config.models)
    policy, _ = load_outbound(config.outbound)
    backends, _ = load_sql(config.sql, base_dir=config.base_dir)
    return loaded, Models(presets), replace(policy, sql=backends, base_dir=config.base_dir)


def _load(ns: argparse.Namespace) -> tuple[Any, Any]:
    from pathlib import Path

    from mcpipe.formats.noetl import load_playbook

    path = Path(ns.file)
    if not path.is_file():
        raise _UsageError(f"cannot read {ns.file}: {'a directory' if path.is_dir() else 'no such file'}")

    config, models, policy = _context(ns)
    pb, problems = load_playbook(ns.file, models=models, policy=policy, scan=list(ns.catalog))
    for p in problems:
        print(f"{p.location}: {p.message}", file=sys.stderr)
    _config_note(ns, [p.message for p in problems])
    return config, pb


def _config_note(ns: argparse.Namespace, messages: list[str]) -> None:
    """Without ``--config``, a problem that names a setting of the server config is fixed in one: say so."""
    if ns.config is None and any(_OPERATOR_SETTING.search(m) for m in messages):
        print(
            f"{ns.file}: note: without --config nothing is allowed (no commands, hosts, databases or credentials): "
            "the settings these lines name go in a server config, passed with --config FILE",
            file=sys.stderr,
        )


_OPERATOR_SETTING = re.compile(r"\boutbound\.|\[credentials\]|\[sql|\[models|\bsql\.|\bmodels\.")
"""A problem's message naming a setting of the server config (``outbound.commands``, ``[credentials]``)."""


def _check(ns: argparse.Namespace) -> int:
    try:
        _, pb = _load(ns)
    except _UsageError as e:
        print(f"mcpipe playbook check: error: {e}", file=sys.stderr)
        return 2
    if pb is None:
        return 1
    for w in pb.warnings:
        print(f"{ns.file}: {w} (warning)", file=sys.stderr)
    from mcpipe.formats.noetl import NoetlPlaybook

    if isinstance(pb, NoetlPlaybook):
        tools = [t.kind for s in pb.steps.values() for t in s.tasks]
        used = ", ".join(f"{tools.count(k)} {k}" for k in dict.fromkeys(tools))
        layout = {
            "v2": "noetl.io/v2",
            "draft": "NoETL's 2025 draft engine",
            "runtime": "NoETL's runtime of May 2025",
            "2023": "NoETL's workflow engine of April 2023",
        }.get(pb.layout, "the older layout")
        print(f"{ns.file}: ok (playbook `{pb.name}`, {layout}: {len(pb.steps)} steps; {used or 'no tools'})")
        return 0
    kinds = [s.kind for s in pb.plan.plan.steps]
    summary = ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))
    print(f"{ns.file}: ok (playbook `{pb.name}`: {summary})")
    return 0


def _inputs(items: list[str]) -> dict[str, Any]:
    try:
        return assignments(items, "--input")
    except ValueError as e:
        raise _UsageError(str(e)) from None


def _run(ns: argparse.Namespace) -> int:
    import trio

    from mcpipe.formats.noetl import playbook_tool

    try:
        inputs = _inputs(ns.input)
        config, pb = _load(ns)
    except _UsageError as e:
        print(f"mcpipe playbook run: error: {e}", file=sys.stderr)
        return 2
    if pb is None:
        return 1

    def on_event(event: Mapping[str, object]) -> None:
        sys.stderr.buffer.write(orjson.dumps(event, default=str) + b"\n")
        sys.stderr.flush()

    tool = playbook_tool(pb)

    async def main() -> dict[str, Any]:
        if config is None:
            from mcpipe.tools.builtin import builtin_tools

            tool.bind(builtin_tools(True))
            return await tool.run(inputs, on_event=on_event if ns.events else None)
        from mcpipe.server import open_app

        async with open_app(config) as app:
            tool.bind(app.gateway)
            return await tool.run(inputs, on_event=on_event if ns.events else None)

    answer = trio.run(main)
    sys.stdout.buffer.write(orjson.dumps(answer, option=orjson.OPT_INDENT_2, default=str) + b"\n")
    sys.stdout.flush()
    if not answer["ok"]:
        print(f"{ns.file}: {answer['error_code']}: {answer['error']}", file=sys.stderr)
        _config_note(ns, [str(answer["error"])])
    return 0 if answer["ok"] else 1
