"""``mcpipe check SPEC`` says what ``mcpipe run SPEC`` (and ``mcpipe call mcp_pipe --config FILE``) would refuse:
the same problems, or ok for both (issue 27, item 19).

Each case is run both ways on the same file and the problem lines compared: a spec ``check`` calls ok must not
be refused by ``run`` before its first step, and every problem ``run`` answers must be one ``check`` prints.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from mcpipe.cli import main

TOOLS_MODULE = """
from mcpipe.tools import ToolRegistry

registry = ToolRegistry()


@registry.tool
def charge(amount: int) -> dict:
    return {"charged": amount}


@registry.tool(annotations={"idempotentHint": True})
def lookup(key: str) -> dict:
    return {"key": key}
"""

OK = "ok"

# (id, spec, extra options, the problem lines both must print, or OK)
CASES = [
    ("a_good_spec", {"steps": [{"tool": "text_join", "args": {"items": ["a", "b"]}}]}, [], OK),
    (
        "an_argument_the_schema_does_not_know",
        {"steps": [{"tool": "text_split", "args": {"text": "a,b", "separator": ","}}]},
        [],
        [
            "steps[0].args.separator: tool 'text_split' has no argument `separator` (its arguments: `text`, `sep`, "
            "`maxsplit`) [INVALID_SPEC]"
        ],
    ),
    (
        "a_retry_on_a_tool_not_marked_idempotent",
        {"steps": [{"id": "t", "tool": "now", "retry": {"attempts": 3}}]},
        [],
        [
            "steps[0].retry: tool 'now' is not marked idempotent, so it cannot be retried (its annotations say "
            "idempotentHint, or the operator lists it in pipe.idempotent_tools) [INVALID_SPEC]"
        ],
    ),
    (
        "a_retry_on_an_idempotent_built_in",
        {"steps": [{"tool": "text_join", "args": {"items": ["a"]}, "retry": {"attempts": 2}}]},
        [],
        OK,
    ),
    ("an_unknown_tool", {"steps": [{"tool": "text_jion"}]}, [], "UNKNOWN_TOOL"),
    ("a_missing_required_argument", {"steps": [{"tool": "text_join", "args": {"sep": "+"}}]}, [], "INVALID_SPEC"),
    ("an_argument_of_the_wrong_type", {"steps": [{"tool": "text_join", "args": {"items": 3}}]}, [], "INVALID_SPEC"),
    (
        "a_reference_to_a_later_step",
        {"steps": [{"tool": "echo", "args": {"v": "${steps.later.structured}"}}, {"id": "later", "tool": "now"}]},
        [],
        "INVALID_SPEC",
    ),
    (
        "an_unknown_argument_inside_a_parallel_group",
        {"steps": [{"id": "g", "parallel": [{"tool": "now"}, {"tool": "text_split", "args": {"txt": "a"}}]}]},
        [],
        "INVALID_SPEC",
    ),
    (
        "a_retry_inside_a_for_each",
        {"steps": [{"id": "e", "for_each": [1, 2], "step": {"tool": "now", "retry": {"attempts": 2}}}]},
        [],
        "INVALID_SPEC",
    ),
    (
        "a_retry_on_a_registry_tool_without_annotations",
        {"steps": [{"tool": "charge", "args": {"amount": 3}, "retry": {"attempts": 2}}]},
        ["--tools", "agree_tools:registry"],
        "INVALID_SPEC",
    ),
    (
        "a_retry_on_a_registry_tool_marked_idempotent",
        {"steps": [{"tool": "lookup", "args": {"key": "k"}, "retry": {"attempts": 2}}]},
        ["--tools", "agree_tools:registry"],
        OK,
    ),
    (
        "an_unknown_argument_of_a_registry_tool",
        {"steps": [{"tool": "charge", "args": {"amount": 3, "currency": "EUR"}}]},
        ["--tools", "agree_tools:registry"],
        "INVALID_SPEC",
    ),
    (
        "a_built_in_left_out",
        {"steps": [{"tool": "echo", "args": {"a": 1}}]},
        ["--no-builtin", "--tools", "agree_tools:registry"],
        "UNKNOWN_TOOL",
    ),
    (
        "a_wrapped_spec_with_an_unknown_argument",
        {"spec": {"steps": [{"tool": "text_split", "args": {"text": "a", "separator": ","}}]}},
        [],
        "INVALID_SPEC",
    ),
    (
        "a_wrapped_spec_as_json_text_with_a_retry",
        {"spec": orjson.dumps({"steps": [{"tool": "now", "retry": {"attempts": 2}}]}).decode()},
        [],
        "INVALID_SPEC",
    ),
    (
        "a_condition_that_does_not_parse",
        {"steps": [{"tool": "now", "when": "vars.x ==="}]},
        [],
        "INVALID_SPEC",
    ),
    ("a_tool_call_more_than_the_limit", {"steps": [{"tool": "now"}] * 51}, [], "LIMIT_EXCEEDED"),
    (
        "several_problems_at_once",
        {
            "steps": [
                {"tool": "text_split", "args": {"text": "a", "separator": ","}},
                {"tool": "now", "retry": {"attempts": 2}},
                {"tool": "nope"},
            ]
        },
        [],
        "UNKNOWN_TOOL",
    ),
]


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "agree_tools.py").write_text(TOOLS_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def problem_lines(err: str, prefix: str) -> list[str]:
    """The problem lines of stderr, without the file's (or the command's) prefix; notes are left out."""
    return [line.removeprefix(prefix) for line in err.splitlines() if line.startswith(prefix) and ": note:" not in line]


@pytest.mark.parametrize(("spec", "options", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_check_prints_the_problems_run_refuses_the_spec_with(workdir, capsys, spec, options, expected):
    path = workdir / "p.json"
    path.write_bytes(orjson.dumps(spec))
    run_status = main(["run", str(path), *options])
    out, err = capsys.readouterr()
    answer = orjson.loads(out)
    refused = problem_lines(err, f"{path}: ")
    check_status = main(["check", str(path), *options])
    out, err = capsys.readouterr()
    checked = problem_lines(err, f"{path}: ")

    assert checked == refused
    if expected == OK:
        assert (check_status, run_status, answer["ok"]) == (0, 0, True)
        assert out == f"{path}: ok (1 step, 1 tool call)\n"
    else:
        assert (check_status, run_status, answer["steps"]) == (1, 1, {})  # refused before any step ran
        assert [f"{p['location']}: {p['message']} [{p['code']}]" for p in answer["problems"]] == refused
        if isinstance(expected, list):
            assert refused == expected
        else:
            assert any(line.endswith(f"[{expected}]") for line in refused)


CONFIG = """\
[pipe]
idempotent_tools = ["now"]

[trust.tools.text_replace]
minimum_trust = "verified"
"""

CONFIG_CASES = [
    ("a_retry_the_operator_allows", {"steps": [{"tool": "now", "retry": {"attempts": 2}}]}, OK),
    (
        "a_tool_the_caller_may_not_call",
        {"steps": [{"tool": "text_replace", "args": {"text": "a", "old": "a", "new": "b"}}]},
        [
            "steps[0].tool: tool text_replace requires trust level Verified, current trust is Unauthenticated"
            " [FORBIDDEN]"
        ],
    ),
    (
        "an_argument_the_schema_does_not_know",
        {"steps": [{"tool": "text_split", "args": {"text": "a,b", "separator": ","}}]},
        "INVALID_SPEC",
    ),
    (
        "a_retry_on_a_tool_neither_annotated_nor_listed",
        {"steps": [{"tool": "ask_user", "args": {"message": "?"}, "retry": {"attempts": 2}}]},
        "INVALID_SPEC",
    ),
]


@pytest.mark.parametrize(("spec", "expected"), [c[1:] for c in CONFIG_CASES], ids=[c[0] for c in CONFIG_CASES])
def test_check_with_a_config_prints_the_problems_its_mcp_pipe_refuses_the_spec_with(workdir, capsys, spec, expected):
    config = workdir / "mcpipe.toml"
    config.write_text(CONFIG)
    path = workdir / "p.json"
    path.write_bytes(orjson.dumps(spec))
    call_status = main(["call", "mcp_pipe", orjson.dumps(spec).decode(), "--config", str(config)])
    _, err = capsys.readouterr()
    refused = problem_lines(err, "mcpipe call: mcp_pipe: ")
    check_status = main(["check", str(path), "--config", str(config)])
    out, err = capsys.readouterr()
    checked = problem_lines(err, f"{path}: ")

    assert checked == refused
    if expected == OK:
        assert (check_status, call_status) == (0, 0)
        assert out == f"{path}: ok (1 step, 1 tool call)\n"
    else:
        assert (check_status, call_status) == (1, 1)
        if isinstance(expected, list):
            assert refused == expected
        else:
            assert any(line.endswith(f"[{expected}]") for line in refused)


def test_check_of_the_issues_two_specs_fails_as_run_does_from_the_command_line(tmp_path):
    """The two specs of the report, through the installed command, as a new user meets them."""
    specs = {
        "split.yaml": "steps:\n  - tool: text_split\n    args: {text: 'a,b', separator: ','}\n",
        "retry.yaml": "steps:\n  - tool: now\n    retry: {attempts: 3}\n",
    }
    for name, text in specs.items():
        (tmp_path / name).write_text(text)
        for command in ("check", "run"):
            done = subprocess.run(
                [sys.executable, "-m", "mcpipe", command, name],
                cwd=tmp_path,
                capture_output=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 1, (command, name, done.stderr)
            assert done.stderr.decode().startswith(f"{name}: steps[0]."), (command, name)
