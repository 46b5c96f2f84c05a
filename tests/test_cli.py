"""``mcpipe run`` and ``mcpipe check``: exit codes, inputs, and one clear line per error."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from mcpipe.cli import main

SPEC = {
    "vars": {"name": "ada"},
    "steps": [
        {"id": "hi", "tool": "greet", "args": {"name": "${vars.name}"}},
        {"id": "n", "tool": "count", "args": {"items": "${vars.items}"}},
    ],
    "return": {"greeting": "${steps.hi.text}", "n": {"$ref": "steps.n.structured.result"}},
}

YAML_SPEC = """\
vars:
  name: ada
  items: [1, 2]
steps:
  - id: hi
    tool: greet
    args: {name: "${vars.name}"}
return: ${steps.hi.text}
"""

TOOLS_MODULE = """
from mcpipe.tools import ToolRegistry

registry = ToolRegistry()


@registry.tool
def greet(name: str) -> str:
    return f"hello {name}"


@registry.tool
def count(items: list[int]) -> int:
    return len(items)


@registry.tool
def broken() -> str:
    raise ValueError("nope")


other = ToolRegistry()


@other.tool(name="greet")
def greet_again(name: str) -> str:
    return name

not_a_registry = 42
"""


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "cli_test_tools.py").write_text(TOOLS_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def write(path: Path, data: object) -> str:
    path.write_bytes(data if isinstance(data, bytes) else orjson.dumps(data))
    return str(path)


def stdin(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))


def test_run_prints_the_answer_as_json_and_exits_0_when_ok(workdir, capsys):
    spec = write(workdir / "p.json", SPEC)
    status = main(["run", spec, "--tools", "cli_test_tools:registry", "--var", "items=[1,2,3]"])
    out, err = capsys.readouterr()
    assert status == 0
    answer = orjson.loads(out)
    assert answer["ok"] is True
    assert answer["result"] == {"greeting": "hello ada", "n": 3}
    assert err == ""  # no progress when stderr is not a terminal


def test_run_exits_1_when_the_pipeline_fails(workdir, capsys):
    spec = write(workdir / "p.json", {"steps": [{"tool": "broken"}]})
    assert main(["run", spec, "--tools", "cli_test_tools:registry"]) == 1
    answer = orjson.loads(capsys.readouterr().out)
    assert answer["error_code"] == "TOOL_FAILED"


def test_run_reads_yaml(workdir, capsys):
    spec = workdir / "p.yaml"
    spec.write_text(YAML_SPEC)
    assert main(["run", str(spec), "--tools", "cli_test_tools:registry"]) == 0
    assert orjson.loads(capsys.readouterr().out)["result"] == "hello ada"


@pytest.mark.parametrize("text", [orjson.dumps(SPEC).decode(), YAML_SPEC], ids=["json", "yaml"])
def test_run_reads_the_spec_from_stdin(workdir, capsys, monkeypatch, text):
    stdin(monkeypatch, text)
    assert main(["run", "-", "--tools", "cli_test_tools:registry", "--var", "items=[]"]) == 0
    assert orjson.loads(capsys.readouterr().out)["result"] in ("hello ada", {"greeting": "hello ada", "n": 0})


@pytest.mark.parametrize(
    ("value", "expected"),
    [("42", 42), ("[1, 2]", [1, 2]), ('{"a": null}', {"a": None}), ("plain text", "plain text"), ("", "")],
)
def test_var_values_are_json_when_they_parse_and_strings_otherwise(workdir, capsys, value, expected):
    spec = write(workdir / "p.json", {"steps": [{"tool": "echo", "args": {"v": "${vars.x}"}}]})
    assert main(["run", spec, "--var", f"x={value}"]) == 0
    assert orjson.loads(capsys.readouterr().out)["result"] == {"v": expected}


def test_var_applies_inside_a_wrapped_spec(workdir, capsys):
    spec = write(workdir / "p.json", {"spec": {"steps": [{"tool": "echo", "args": {"v": "${vars.x}"}}]}})
    assert main(["run", spec, "--var", "x=1"]) == 0
    assert orjson.loads(capsys.readouterr().out)["result"] == {"v": 1}


def test_builtin_tools_are_there_unless_left_out(workdir, capsys):
    spec = write(workdir / "p.json", {"steps": [{"tool": "echo", "args": {"a": 1}}]})
    assert main(["run", spec]) == 0
    capsys.readouterr()
    assert main(["run", spec, "--no-builtin"]) == 1
    out, err = capsys.readouterr()
    assert orjson.loads(out)["error_code"] == "UNKNOWN_TOOL"
    assert err == f"{spec}: steps[0].tool: unknown tool 'echo' [UNKNOWN_TOOL]\n"


def test_progress_lines_go_to_stderr_when_asked(workdir, capsys):
    spec = write(workdir / "p.json", {"steps": [{"id": "a", "tool": "echo"}, {"id": "b", "tool": "nope_not_here"}]})
    main(["run", spec, "--progress", "always"])
    capsys.readouterr()
    spec = write(workdir / "q.json", {"steps": [{"id": "a", "tool": "echo"}]})
    assert main(["run", spec, "--progress", "always"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "[0/1] start a (tool)"
    assert err[1].startswith("[1/1] ok    a ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "missing.json"], "mcpipe run: error: cannot read missing.json: No such file or directory"),
        (["run", "{spec}", "--var", "novalue"], "mcpipe run: error: --var takes NAME=VALUE, got 'novalue'"),
        (["run", "{spec}", "--var", "=1"], "mcpipe run: error: --var takes NAME=VALUE, got '=1'"),
        (
            ["run", "{spec}", "--tools", "cli_test_tools"],
            "mcpipe run: error: --tools cli_test_tools: `cli_test_tools` is not MODULE:ATTR (e.g. mytools:registry)",
        ),
        (
            ["run", "{spec}", "--tools", "no_such_module_here:registry"],
            "mcpipe run: error: --tools no_such_module_here:registry: cannot import `no_such_module_here`: "
            "ModuleNotFoundError: No module named 'no_such_module_here'",
        ),
        (
            ["run", "{spec}", "--tools", "cli_test_tools:nothing"],
            "mcpipe run: error: --tools cli_test_tools:nothing: module `cli_test_tools` has no attribute `nothing`",
        ),
        (
            ["run", "{spec}", "--tools", "cli_test_tools:not_a_registry"],
            "mcpipe run: error: --tools cli_test_tools:not_a_registry: a int, not a ToolRegistry",
        ),
        (
            ["run", "{spec}", "--tools", "cli_test_tools:registry", "--tools", "cli_test_tools:other"],
            "mcpipe run: error: tool 'greet' is defined by both cli_test_tools:registry and cli_test_tools:other",
        ),
        (["check"], "mcpipe check: error: the following arguments are required: SPEC (or --config FILE)"),
    ],
)
def test_usage_errors_exit_2_with_one_line(workdir, capsys, args, message):
    spec = write(workdir / "p.json", SPEC)
    assert main([a.replace("{spec}", spec) for a in args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == message + "\n"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.json", b'{"steps": [\n  {"tool": "echo",}\n]}', "bad.json:2:18: invalid JSON: trailing comma"),
        ("bad.yaml", b"steps:\n  - tool: echo\n   args: [\n", "bad.yaml:3:4: invalid YAML: "),
        ("bad.txt", b"\xff\xfe", "bad.txt: not UTF-8 text (byte 0)"),
    ],
)
@pytest.mark.parametrize("command", ["run", "check"])
def test_a_spec_that_does_not_parse_is_one_located_line_and_exit_1(workdir, capsys, command, name, content, message):
    path = write(workdir / name, content)
    assert main([command, path]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1
    assert message in err


def test_check_prints_every_problem_with_its_location(workdir, capsys):
    spec = write(
        workdir / "p.json",
        {"steps": [{"tool": "greet", "args": {"name": "${steps.later.x}"}}, {"id": "later", "tool": "nope"}]},
    )
    assert main(["check", spec, "--tools", "cli_test_tools:registry"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"{spec}: steps[0].args.name: reference to step 'later', which does not run before this step [INVALID_SPEC]",
        f"{spec}: steps[1].tool: unknown tool 'nope' [UNKNOWN_TOOL]",
        f"{spec}: note: tool names were checked against the built-in tools and --tools",
    ]


def test_check_says_ok_and_exits_0_for_a_valid_spec(workdir, capsys):
    spec = write(workdir / "p.json", SPEC)
    assert main(["check", spec, "--tools", "cli_test_tools:registry", "--var", "items=[]"]) == 0
    assert capsys.readouterr().out == f"{spec}: ok (2 steps, 2 tool calls)\n"


def test_check_without_tools_checks_tool_names_against_the_builtins_as_run_would_and_says_so(workdir, capsys):
    spec = write(workdir / "p.json", {"steps": [{"tool": "served_elsewhere"}, {"tool": "echo"}]})
    assert main(["check", spec]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{spec}: steps[0].tool: unknown tool 'served_elsewhere' [UNKNOWN_TOOL]",
        f"{spec}: note: tool names were checked against the built-in tools"
        " (--tools MODULE:REGISTRY or --config FILE adds yours)",
    ]


def test_check_config_delegates_to_the_server(workdir, capsys, monkeypatch):
    import mcpipe.server.cli as server_cli

    seen = []
    monkeypatch.setattr(server_cli, "check_config", lambda path, quiet=False: seen.append(path) or 1)
    assert main(["check", "--config", "mcpipe.toml"]) == 1
    assert seen == ["mcpipe.toml"]
    assert main(["check", "--config", "mcpipe.toml", "--tools", "m:r"]) == 2


def test_python_dash_m_mcpipe_runs_the_same_command(workdir):
    spec = write(workdir / "p.json", {"steps": [{"tool": "echo", "args": {"x": 1}}]})
    done = subprocess.run([sys.executable, "-m", "mcpipe", "run", spec], capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout)["result"] == {"x": 1}
    done = subprocess.run([sys.executable, "-m", "mcpipe", "frobnicate"], capture_output=True, timeout=60, check=False)
    assert done.returncode == 2
    assert b"invalid choice: 'frobnicate'" in done.stderr
    assert b"Traceback" not in done.stderr


def test_the_serve_subcommand_is_the_servers(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--help"])
    assert exit_.value.code == 0
    assert "--stdio" in capsys.readouterr().out


def test_usage_text_documents_the_options(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    for option in ("--tools MODULE:REGISTRY", "--var NAME=VALUE", "--no-builtin", "--progress"):
        assert option in out, textwrap.shorten(out, 200)


def test_serve_without_the_server_installed_is_one_clear_line(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "mcpipe.server.cli", None)  # makes the import fail
    assert main(["serve", "--stdio"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mcpipe serve: error: the server is not available in this installation (")
    assert len(err.splitlines()) == 1


def test_yaml_dates_stay_strings_as_in_json(workdir, capsys):
    spec = workdir / "p.yaml"
    spec.write_text("vars: {day: 2024-01-02}\nsteps:\n  - tool: echo\n    args: {day: '${vars.day}'}\n")
    assert main(["run", str(spec)]) == 0
    assert orjson.loads(capsys.readouterr().out)["result"] == {"day": "2024-01-02"}


def test_run_answers_as_the_server_does_by_default_and_answer_chooses_the_records(workdir, capsys):
    spec = write(workdir / "p.json", {"steps": [{"id": "a", "tool": "echo", "args": {"x": 1}}]})
    answers = {}
    for mode in (None, "result", "steps", "full"):
        assert main(["run", spec, *(["--answer", mode] if mode else [])]) == 0
        answers[mode] = orjson.loads(capsys.readouterr().out)
    assert answers[None] == {**answers["result"], "duration_ms": answers[None]["duration_ms"]}
    assert "steps" not in answers["result"] and answers["result"]["result"] == {"x": 1}
    assert "output" not in answers["steps"]["steps"]["a"] and answers["steps"]["steps"]["a"]["ok"] is True
    assert answers["full"]["steps"]["a"]["output"] == {"x": 1}
    # The spec's own `answer` is what it asks for: the option is the default when it says nothing.
    spec = write(workdir / "q.json", {"answer": "full", "steps": [{"id": "a", "tool": "echo", "args": {"x": 1}}]})
    assert main(["run", spec, "--answer", "result"]) == 0
    assert orjson.loads(capsys.readouterr().out)["steps"]["a"]["output"] == {"x": 1}
