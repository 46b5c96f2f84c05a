"""A new user's first hour with the command line: loading tools, one-line errors, --version, tools, call."""

from __future__ import annotations

import importlib.metadata
import logging
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import orjson
import pytest
import trio

import mcpipe as mcpipe_pkg
from mcpipe import SpecError, compile_spec
from mcpipe.config import parse_config
from mcpipe.server import open_app, serve_http

MCPIPE = str(Path(sys.executable).with_name("mcpipe"))
"""The console script (which, unlike ``python -m``, does not put the current directory on sys.path)."""

REGISTRY = """
from mcpipe.tools import ToolRegistry

registry = ToolRegistry()


@registry.tool
def {name}(text: str) -> str:
    \"\"\"Reverse the text.\"\"\"
    return text[::-1]
"""


def mcpipe(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([MCPIPE, *args], cwd=cwd, capture_output=True, text=True, input=stdin, timeout=60)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("where", ["next to the config", "in the current directory"])
def test_python_tools_import_a_module_next_to_the_config_or_in_the_current_directory(tmp_path, where):
    module = f"fh_tools_{where.split()[-1]}"
    conf_dir, cwd = tmp_path / "conf", tmp_path / "work"
    cwd.mkdir()
    write((conf_dir if where == "next to the config" else cwd) / f"{module}.py", REGISTRY.format(name="flip"))
    config = write(conf_dir / "mcpipe.toml", f'python_tools = ["{module}:registry"]\n[audit]\nenabled = false\n')
    checked = mcpipe("check", "--config", str(config), cwd=cwd)
    assert checked.returncode == 0, checked.stderr
    listed = mcpipe("tools", "--config", str(config), "--json", cwd=cwd)
    assert listed.returncode == 0, listed.stderr
    assert "flip" in {t["name"] for t in orjson.loads(listed.stdout)}


# --- 2: a port in use, a downstream command that does not exist ------------------------------------


def test_serve_on_a_port_in_use_says_so_in_one_line_and_exits_1(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = mcpipe("serve", "--http", f"127.0.0.1:{port}", "--log-level", "warning", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"mcpipe serve: error: cannot listen on 127.0.0.1:{port}: address already in use"
    ]


def test_check_config_refuses_a_downstream_command_that_does_not_exist_where_it_is(tmp_path):
    config = write(
        tmp_path / "mcpipe.toml",
        f"""
        [mcpServers.gone]
        command = "mcpipe-no-such-command"
        [mcpServers.here]
        command = "{sys.executable}"
        """,
    )
    r = mcpipe("check", "--config", str(config), cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        f"error: {config}:mcpServers.gone.command: `mcpipe-no-such-command` is not found on PATH"
    ]


async def test_serve_warns_once_about_a_downstream_that_cannot_start_then_retries_quietly(tmp_path):
    config = parse_config('[mcpServers.gone]\ncommand = "mcpipe-no-such-command"\n[audit]\nenabled = false\n')
    down = DownRecords()
    logger = logging.getLogger("mcpipe.downstream")
    logger.addHandler(down)
    level, logger.level = logger.level, logging.DEBUG
    try:
        with trio.fail_after(20), (tmp_path / "stderr").open("w") as errlog:
            async with open_app(config, errlog=errlog):
                await down.until(3)  # three attempts (backing off 0.2, 0.4, 0.8 s)
    finally:
        logger.removeHandler(down)
        logger.setLevel(level)
    assert [r.levelname for r in down.records] == ["WARNING"] + ["DEBUG"] * (len(down.records) - 1)
    assert "No such file or directory: 'mcpipe-no-such-command'" in down.records[0].getMessage()


class DownRecords(logging.Handler):
    """The "downstream ... is down" records, with an event-driven wait for a number of them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._changed = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "is down" in record.getMessage():
            self.records.append(record)
            self._changed.set()
            self._changed = trio.Event()

    async def until(self, n: int) -> None:
        while len(self.records) < n:
            await self._changed.wait()


# --- 3: a raising tool in `mcpipe run` ----------------------------------------------------------------


def test_run_logs_a_raising_tool_as_one_line_and_a_traceback_only_with_debug(tmp_path):
    write(tmp_path / "fh_boom.py", BOOM)
    spec = write(tmp_path / "p.json", '{"steps": [{"tool": "boom"}]}')
    quiet = mcpipe("run", str(spec), "--tools", "fh_boom:registry", "--progress", "never", cwd=tmp_path)
    assert quiet.returncode == 1
    assert orjson.loads(quiet.stdout)["error_code"] == "TOOL_FAILED"
    assert quiet.stderr.splitlines() == [
        "mcpipe run: ERROR: step step1 (steps[0]): tool 'boom' raised: RuntimeError: kaput"
    ]
    loud = mcpipe("run", str(spec), "--tools", "fh_boom:registry", "--progress", "never", "--debug", cwd=tmp_path)
    assert "Traceback (most recent call last)" in loud.stderr and loud.returncode == 1


BOOM = """
from mcpipe.tools import ToolRegistry

registry = ToolRegistry()


@registry.tool
def boom() -> str:
    \"\"\"Raise.\"\"\"
    raise RuntimeError("kaput")
"""


# --- 6: config checking --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "line"),
    [
        ("c.yaml", "pipe:\n  max_depth: [1\n  x: 2\n", "3:4: not valid YAML: while parsing a flow sequence"),
        ("c.toml", "[pipe\nx = 1\n", "1:6: not valid TOML: Expected ']' at the end of a table declaration"),
        ("c.json", '{"pipe": {,}}', "1:11: not valid JSON: Expecting property name enclosed in double quotes"),
    ],
)
def test_a_config_that_does_not_parse_is_one_line_with_line_and_column(tmp_path, name, text, line):
    config = write(tmp_path / name, text)
    r = mcpipe("check", "--config", str(config), cwd=tmp_path)
    assert r.returncode == 1
    [only] = r.stderr.splitlines()
    assert only.startswith(f"error: {config}:{line}")


def test_every_problem_of_a_config_table_is_reported_with_suggestions(tmp_path):
    config = write(
        tmp_path / "c.toml",
        """
        bultins = false
        [pipe]
        max_depth = "5"
        max_stepz = 3
        [mcpServers.x]
        comand = "python3"
        timeout_ms = "soon"
        """,
    )
    r = mcpipe("check", "--config", str(config), cwd=tmp_path)
    assert r.returncode == 1
    assert sorted(r.stderr.splitlines()) == sorted(
        f"error: {config}:{line}"
        for line in [
            "bultins: unknown key `bultins` (did you mean `builtins`?)",
            "pipe.max_depth: expected `int`, got `str`",
            "pipe.max_stepz: unknown key `max_stepz` (did you mean `max_steps`?)",
            "mcpServers.x.comand: unknown key `comand` (did you mean `command`?)",
            "mcpServers.x.timeout_ms: expected `int | null`, got `str`",
        ]
    )


def test_check_config_of_a_missing_file_exits_2_like_check_of_a_missing_spec(tmp_path):
    assert mcpipe("check", "--config", "missing.toml", cwd=tmp_path).returncode == 2
    assert mcpipe("check", "missing.json", cwd=tmp_path).returncode == 2


def test_the_check_config_summary_counts_pipelines(tmp_path):
    config = write(
        tmp_path / "c.yaml",
        """
        audit: {enabled: false}
        pipelines:
          - name: shout
            description: Join two words.
            input_schema: {type: object, properties: {a: {type: string}}, required: [a]}
            steps:
              - {kind: tool, id: j, tool: text_join, args: {items: ["${args.a}", "!"]}}
        """,
    )
    r = mcpipe("check", "--config", str(config), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{config}: ok (0 downstream servers, 0 python_tools entries, 1 pipeline)"


def test_a_syntax_error_in_one_args_string_does_not_hide_the_other_problems_of_the_args():
    spec = {"steps": [{"tool": "echo", "args": {"a": "${vars.x", "b": "${steps.nope.x}", "c": ["ok", "{{bad..}}"]}}]}
    with pytest.raises(SpecError) as info:
        compile_spec(spec)
    assert [(p.location, p.message) for p in info.value.problems] == [
        ("steps[0].args.a", "`${` has no closing `}` (character 0)"),
        ("steps[0].args.b", "reference to unknown step 'nope'"),
        ("steps[0].args.c[1]", "invalid placeholder at character 0: empty path segment (character 6)"),
    ]


# --- 7: --version, tools, call ----------------------------------------------------------------------


def test_version_is_the_distribution_version(tmp_path):
    r = mcpipe("--version", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"mcpipe {mcpipe_pkg.__version__}"
    assert mcpipe_pkg.__version__ == importlib.metadata.version("mcpipe")


def test_tools_lists_names_signatures_and_descriptions_and_json_has_the_schemas(tmp_path):
    human = mcpipe("tools", cwd=tmp_path)
    assert human.returncode == 0
    lines = human.stdout.splitlines()
    assert "text_join(items: array, sep?: string)" in lines
    assert lines[lines.index("text_join(items: array, sep?: string)") + 1].startswith("    Join `items`")
    assert "echo(...)" in lines and "now()" in lines  # echo takes any argument, now none
    listed = {t["name"]: t for t in orjson.loads(mcpipe("tools", "--json", cwd=tmp_path).stdout)}
    assert listed["text_join"]["inputSchema"]["required"] == ["items"] and "mcp_pipe" in listed


def test_call_runs_one_tool_of_a_config_and_prints_its_result(tmp_path):
    write(tmp_path / "fh_flip.py", REGISTRY.format(name="flip"))
    config = write(tmp_path / "mcpipe.toml", 'python_tools = ["fh_flip:registry"]\n[audit]\nenabled = false\n')
    r = mcpipe("call", "flip", '{"text": "abc"}', "--config", str(config), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "cba\n"
    piped = mcpipe("call", "mcp_pipe", "-", "--config", str(config), cwd=tmp_path, stdin=PIPE_FLIP)
    assert orjson.loads(piped.stdout)["result"] == "cba"


PIPE_FLIP = '{"steps": [{"tool": "flip", "args": {"text": "abc"}}]}'


@pytest.mark.parametrize(
    ("args", "message", "status"),
    [
        (["call", "flipp", "{}"], "mcpipe call: error: no tool `flipp` (did you mean `flip`?)", 2),
        (["call", "flip", "[1]"], "mcpipe call: error: ARGS must be an object (JSON or YAML), got an array", 2),
        (["call", "flip", "{"], "mcpipe call: error: ARGS is not JSON (", 2),
        (["call", "flip", "text: [a"], "mcpipe call: error: ARGS:2:1: invalid YAML: while parsing a flow sequence", 2),
        (["call", "flip", "{}"], "mcpipe call: flip: invalid arguments for tool 'flip'", 1),
    ],
)
def test_call_answers_bad_input_with_one_line(tmp_path, args, message, status):
    write(tmp_path / "fh_flip2.py", REGISTRY.format(name="flip"))
    r = mcpipe(*args, "--tools", "fh_flip2:registry", cwd=tmp_path)
    assert r.returncode == status
    [line] = r.stderr.splitlines()
    assert line.startswith(message)


async def test_call_and_tools_reach_a_running_server_by_url(tmp_path):
    async with running_http() as url:
        listed = await trio.to_thread.run_sync(lambda: mcpipe("tools", "--url", url, "--json", cwd=tmp_path))
        called = await trio.to_thread.run_sync(
            lambda: mcpipe("call", "text_join", '{"items": ["a", "b"], "sep": "+"}', "--url", url, cwd=tmp_path)
        )
    assert "text_join" in {t["name"] for t in orjson.loads(listed.stdout)}
    assert called.returncode == 0 and orjson.loads(called.stdout) == {"text": "a+b"}


@asynccontextmanager
async def running_http() -> AsyncIterator[str]:
    config = parse_config("[audit]\nenabled = false\n")
    stop = trio.Event()
    async with open_app(config) as app, trio.open_nursery() as nursery:
        url = await nursery.start(partial(serve_http, app, host="127.0.0.1", port=0, shutdown_trigger=stop.wait))
        try:
            yield url
        finally:
            stop.set()


# --- 8: --var for a name the spec does not use -------------------------------------------------------


def test_a_var_the_spec_does_not_use_is_refused_with_a_suggestion(tmp_path):
    spec = write(tmp_path / "greet.yaml", GREET)
    r = mcpipe("run", str(spec), "--var", "nam=x", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines() == ["mcpipe run: error: --var nam: the spec has no var `nam` (did you mean `name`?)"]
    ok = mcpipe("run", str(spec), "--var", "name=trio", "--var", "extra=1", cwd=tmp_path)
    assert ok.returncode == 0 and orjson.loads(ok.stdout)["result"] == "hello trio 1"


GREET = """\
vars:
  name: world
steps:
  - id: hello
    tool: text_join
    args: {items: ["hello", "${vars.name}", "${vars.extra}"], sep: " "}
return: ${steps.hello.structured.text}
"""


def test_call_of_a_raising_tool_is_one_line_without_debug(tmp_path):
    write(tmp_path / "fh_boom2.py", BOOM)
    r = mcpipe("call", "boom", "--tools", "fh_boom2:registry", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.splitlines() == ["mcpipe call: boom: TOOL_FAILED: RuntimeError: kaput"]


def test_a_typo_in_a_nested_table_of_a_list_gets_a_suggestion(tmp_path):
    config = write(tmp_path / "c.toml", '[[auth.tokens]]\nenv = "HOME"\nprincipl = "a"\n')
    r = mcpipe("check", "--config", str(config), cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        f"error: {config}:auth.tokens[0].principl: unknown key `principl` (did you mean `principal`?)"
    ]


def test_in_a_declared_pipeline_a_syntax_error_does_not_hide_the_other_problems_of_the_args(tmp_path):
    config = write(
        tmp_path / "c.yaml",
        """
        audit: {enabled: false}
        pipelines:
          - name: p
            description: Two problems in one args object.
            input_schema: {type: object}
            steps:
              - {kind: tool, id: j, tool: text_join, args: {items: ["${args.a", "${steps.nope.x}"]}}
        """,
    )
    r = mcpipe("check", "--config", str(config), cwd=tmp_path)
    assert r.returncode == 1
    assert len(r.stderr.splitlines()) == 2, r.stderr
    assert "steps[0].args.items[0]" in r.stderr and "`${` has no closing `}`" in r.stderr
    assert "steps[0].args.items[1]" in r.stderr and "nope" in r.stderr


# --- a second walkthrough ----------------------------------------------------------------------------


def test_a_refused_host_names_the_config_key_that_allows_it(tmp_path):
    config = write(
        tmp_path / "c.yaml",
        """
        audit: {enabled: false}
        outbound: {http: {allowed_hosts: [api.example.com]}}
        pipelines:
          - name: fetch
            description: Fetch a page.
            steps:
              - {kind: http, id: get, url: "https://other.example.com/x"}
        """,
    )
    r = mcpipe("check", "--config", str(config), cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        f"error: {config}:pipelines.fetch.steps[0].url: host 'other.example.com' is not in the allowed hosts"
        " (list it in outbound.http.allowed_hosts)"
    ]


SHELL_PLAYBOOK = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: hello_shell, path: hello_shell}
workflow:
  - step: start
    tool: {kind: shell, cmds: ["echo hello"]}
    next: [{step: end}]
  - step: end
    tool: {kind: noop}
"""


def test_playbook_check_without_config_says_the_fix_goes_in_a_config_file(tmp_path):
    pb = write(tmp_path / "pb.yaml", SHELL_PLAYBOOK)
    r = mcpipe("playbook", "check", str(pb), cwd=tmp_path)
    assert r.returncode == 1
    first, note = r.stderr.splitlines()
    assert first.endswith("add `sh: /bin/sh` to outbound.commands")
    assert note == (
        f"{pb}: note: without --config nothing is allowed (no commands, hosts, databases or credentials): "
        "the settings these lines name go in a server config, passed with --config FILE"
    )
    config = write(tmp_path / "c.yaml", "audit: {enabled: false}\noutbound: {commands: {sh: /bin/sh}}\n")
    r = mcpipe("playbook", "check", str(pb), "--config", str(config), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{pb}: ok (playbook `hello_shell`")


def test_check_and_convert_of_a_config_whose_top_level_is_a_list_exit_1_with_the_problem(tmp_path):
    config = write(tmp_path / "c.yaml", "- a\n- b\n")
    for command in ("check", "convert"):
        r = mcpipe(command, "--config", str(config), cwd=tmp_path)
        assert (r.returncode, r.stderr.splitlines()) == (
            1,
            [f"error: {config}: the top level must be a table/object, got list"],
        ), command


def test_convert_of_a_config_already_in_mcpipes_layout_reports_its_problems_as_check_does(tmp_path):
    bad = write(tmp_path / "bad.yaml", "audit: {enabled: false}\npipe: {max_stepz: 3}\n")
    checked = mcpipe("check", "--config", str(bad), cwd=tmp_path)
    converted = mcpipe("convert", "--config", str(bad), cwd=tmp_path)
    assert converted.returncode == checked.returncode == 1
    assert converted.stderr == checked.stderr
    assert converted.stderr.splitlines() == [
        f"error: {bad}:pipe.max_stepz: unknown key `max_stepz` (did you mean `max_steps`?)"
    ]
    good = write(tmp_path / "good.yaml", "audit: {enabled: false}\n")
    r = mcpipe("convert", "--config", str(good), cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", f"{good}: already in mcpipe's own layout\n")


def test_a_spec_file_holding_a_string_is_told_the_spec_must_be_an_object_with_steps(tmp_path):
    # `check` prints the same line: docs/cli.md shows it (test_first_hour_again.py checks the docs' lines)
    command = "run"
    spec = write(tmp_path / "s.yaml", '"str"\n')
    r = mcpipe(command, str(spec), cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr.splitlines()) == (
        1,
        "",
        [f"mcpipe {command}: error: {spec}: a pipeline spec must be an object with `steps`, got a string"],
    )


def test_check_reports_an_invalid_step_id_once(tmp_path):
    spec = write(tmp_path / "p.yaml", "steps:\n  - {id: bad id, tool: echo, args: {text: x}}\n")
    r = mcpipe("check", str(spec), cwd=tmp_path)
    assert (r.returncode, r.stderr.splitlines()) == (
        1,
        [f"{spec}: steps[0].id: invalid id 'bad id': ids match [A-Za-z_][A-Za-z0-9_-]* [INVALID_SPEC]"],
    )


def test_the_check_config_summary_counts_what_a_piraeus_section_serves(tmp_path):
    upstream = Path(__file__).parent / "formats" / "piraeus" / "upstream"
    exports = tmp_path / "exports"
    for folder, name in (
        ("tools", "EXAMPLE_STOCK_QUOTE_CONFIG.json"),
        ("prompts", "test_database_endpoints.mock_prompt.json"),
    ):
        write(exports / folder / name, (upstream / name).read_text())
    flow = {"name": "f", "steps": [{"step": 1, "type": "prompt", "name": "greeting", "inputs": {"name": "${who}"}}]}
    write(exports / "flows" / "f.json", orjson.dumps(flow).decode())
    config = write(
        tmp_path / "c.toml",
        """
        [audit]
        enabled = false
        [piraeus]
        tools = "exports/tools/*.json"
        prompts = "exports/prompts/*.json"
        flows = "exports/flows/*.json"
        secrets = { ALPHA_VANTAGE_API_KEY = "demo" }
        """,
    )
    r = mcpipe("check", "--config", str(config), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (
        f"{config}: ok (0 downstream servers, 0 python_tools entries, 0 pipelines, "
        "1 piraeus tool, 1 piraeus prompt, 1 piraeus flow, 1 workflow tool)"
    )
