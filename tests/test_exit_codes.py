"""Every command's exit status follows one table (docs/cli.md, "Exit status"), through the real command line
(issue 27, item 23): 0 done, 1 what was asked about has problems or failed, 2 the command could not do it (bad
options, a file that cannot be read, a config that cannot be used, no such tool, a server not reached).

Before, an unknown tool exited 2 locally and 1 with ``--url``, and a missing ``--config`` file 1 for ``call``
and 2 for ``check``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from kit.servers import http_server, make_config
from mcpipe.server import open_app

FILES = {
    "bad.yaml": "bad: [\n",
    "unknown.yaml": "steps: [{tool: nope}]\n",
    "good.yaml": "steps: [{tool: text_join, args: {items: [a]}}]\n",
    "broken.toml": '[pipe]\nmax_depth = "x"\n',
    "runs.toml": '[runs]\npath = "runs.db"\n',
    "trust.toml": '[trust.tools.text_replace]\nminimum_trust = "verified"\n',
    "playbook.yaml": (
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: p, path: p}\n"
        "workflow:\n  - step: start\n    tool: {kind: noop}\n"
    ),
}

OK, PROBLEMS, USAGE = 0, 1, 2

CASES = [
    # run, check, explain: the spec is what they are asked about
    (["run", "good.yaml"], OK, ""),
    (["run", "unknown.yaml"], PROBLEMS, "unknown.yaml: steps[0].tool: unknown tool 'nope'"),
    (["run", "bad.yaml"], PROBLEMS, "mcpipe run: error: bad.yaml:2:1: invalid YAML"),
    (["run", "missing.yaml"], USAGE, "mcpipe run: error: cannot read missing.yaml"),
    (["run", "good.yaml", "--tools", "nomodule:registry"], USAGE, "mcpipe run: error: --tools nomodule:registry"),
    (["run", "good.yaml", "--var", "x=1"], USAGE, "mcpipe run: error: --var x: the spec has no var `x`"),
    (["run", "good.yaml", "--frobnicate"], USAGE, "usage: mcpipe"),
    (["check", "good.yaml"], OK, ""),
    (["check", "unknown.yaml"], PROBLEMS, "unknown.yaml: steps[0].tool: unknown tool 'nope'"),
    (["check", "bad.yaml"], PROBLEMS, "mcpipe check: error: bad.yaml:2:1: invalid YAML"),
    (["check", "missing.yaml"], USAGE, "mcpipe check: error: cannot read missing.yaml"),
    (["check", "good.yaml", "--config", "missing.toml"], USAGE, "error: missing.toml: cannot read"),
    (["check", "good.yaml", "--config", "broken.toml"], USAGE, "error: broken.toml:pipe.max_depth: expected `int`"),
    (["explain", "unknown.yaml"], PROBLEMS, "unknown.yaml: steps[0].tool: unknown tool 'nope'"),
    (["explain", "missing.yaml"], USAGE, "mcpipe explain: error: cannot read missing.yaml"),
    # check --config and convert: the config is what they are asked about
    (["check", "--config", "runs.toml"], OK, ""),
    (["check", "--config", "broken.toml"], PROBLEMS, "error: broken.toml:pipe.max_depth: expected `int`"),
    (["check", "--config", "missing.toml"], USAGE, "error: missing.toml: cannot read"),
    (["convert", "--config", "broken.toml"], PROBLEMS, "error: broken.toml:pipe.max_depth: expected `int`"),
    (["convert", "--config", "missing.toml"], USAGE, "error: missing.toml: cannot read"),
    # tools and call: a config they use that cannot be used is a usage error, as for serve
    (["tools"], OK, ""),
    (["tools", "--config", "missing.toml"], USAGE, "mcpipe tools: error: missing.toml: cannot read"),
    (["tools", "--config", "broken.toml"], USAGE, "mcpipe tools: error: broken.toml:pipe.max_depth"),
    (["tools", "--url", "http://127.0.0.1:9/mcp"], USAGE, "mcpipe tools: error: cannot reach http://127.0.0.1:9/mcp"),
    (["call", "text_join", "items: [a]"], OK, ""),
    (["call", "text_join", "items: 3"], PROBLEMS, "mcpipe call: text_join: invalid arguments for tool 'text_join'"),
    (["call", "nope"], USAGE, "mcpipe call: error: no tool `nope`"),
    (["call", "echo", "[1]"], USAGE, "mcpipe call: error: ARGS must be an object"),
    (["call", "nope", "--config", "missing.toml"], USAGE, "mcpipe call: error: missing.toml: cannot read"),
    (["call", "echo", "--config", "broken.toml"], USAGE, "mcpipe call: error: broken.toml:pipe.max_depth"),
    (["call", "echo", "--url", "http://127.0.0.1:9/mcp"], USAGE, "mcpipe call: error: cannot reach"),
    (
        ["call", "text_replace", "text: a\nold: a\nnew: b", "--config", "trust.toml"],
        PROBLEMS,
        "mcpipe call: text_replace: tool text_replace requires trust level Verified, current trust is "
        "Unauthenticated (JSON-RPC error -32003)",
    ),
    # runs, events, worker, serve: a queue or a config they cannot use
    (["runs", "--config", "runs.toml"], OK, ""),
    (["runs"], USAGE, "mcpipe runs: error: no shared run queue"),
    (["runs", "--config", "missing.toml"], USAGE, "error: missing.toml: cannot read"),
    (["events", "nope", "--config", "runs.toml", "--no-follow"], PROBLEMS, "mcpipe events: error: no run 'nope'"),
    (["events", "nope", "--config", "broken.toml"], USAGE, "error: broken.toml:pipe.max_depth"),
    (["worker", "--config", "missing.toml"], USAGE, "error: missing.toml: cannot read"),
    (["serve", "--config", "missing.toml"], USAGE, "error: missing.toml: cannot read"),
    (["serve", "--config", "broken.toml"], USAGE, "error: broken.toml:pipe.max_depth"),
    # playbook check and run
    (["playbook", "check", "playbook.yaml"], OK, ""),
    (["playbook", "check", "bad.yaml"], PROBLEMS, "bad.yaml:2: not valid YAML"),
    (["playbook", "check", "missing.yaml"], USAGE, "mcpipe playbook check: error: cannot read missing.yaml"),
    (["playbook", "run", "missing.yaml"], USAGE, "mcpipe playbook run: error: cannot read missing.yaml"),
    (["playbook", "check", "playbook.yaml", "--config", "missing.toml"], USAGE, "missing.toml: cannot read"),
    (["frobnicate"], USAGE, "usage: mcpipe"),
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("exit_codes")
    for name, text in FILES.items():
        (path / name).write_text(text)
    return path


def mcpipe(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCPIPE_")}
    return subprocess.run(
        [sys.executable, "-m", "mcpipe", *args], cwd=cwd, capture_output=True, text=True, timeout=60, env=env
    )


@pytest.mark.parametrize(("args", "status", "first"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_each_command_exits_as_the_table_says_with_one_clear_line(workdir, args, status, first):
    done = mcpipe(args, workdir)
    assert done.returncode == status, done.stderr
    if first:
        assert first in done.stderr.splitlines()[0] or done.stderr.startswith(first), done.stderr
    assert "Traceback" not in done.stderr


async def test_call_with_url_exits_as_a_local_call_does(tmp_path):
    """No such tool is 2 at a running server as in a config; a refusal is 1, with its JSON-RPC code."""
    trust = tmp_path / "trust.toml"
    trust.write_text(FILES["trust.toml"])
    cases = [
        (["call", "text_jion", "{}"], USAGE, "mcpipe call: error: no tool `text_jion`"),
        (
            ["call", "text_replace", '{"text": "a", "old": "a", "new": "b"}'],
            PROBLEMS,
            "mcpipe call: text_replace: tool text_replace requires trust level Verified",
        ),
        (["call", "text_join", '{"items": 3}'], PROBLEMS, "mcpipe call: text_join: invalid arguments"),
        (["call", "text_join", '{"items": ["a"]}'], OK, ""),
    ]
    config = make_config(trust={"tools": {"text_replace": {"minimum_trust": "verified"}}})
    with trio.fail_after(120):
        async with open_app(config) as app, http_server(app) as url:
            for args, status, first in cases:
                remote = await trio.to_thread.run_sync(mcpipe, [*args, "--url", url], tmp_path)
                local = await trio.to_thread.run_sync(mcpipe, [*args, "--config", str(trust)], tmp_path)
                assert (remote.returncode, local.returncode) == (status, status), (args, remote.stderr, local.stderr)
                assert remote.stderr.startswith(first) and local.stderr.startswith(first), (remote.stderr, local.stderr)
