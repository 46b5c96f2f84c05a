"""A key given twice in a YAML or JSON file is refused, located, never silently the last one (issue 27, item 20).

``tool: echo`` then ``tool: now`` would run ``now`` where its author reads ``echo``: every parser keeps the
last. Spec files (``run``, ``check``), config files, ``mcpipe call``'s ARGS and ``mcp_pipe``'s spec given as
JSON text all refuse it, at the second key, saying where the first is.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import trio
import yaml
from mcp import Client

from kit.servers import make_config
from mcpipe._json import DuplicateKeyError, check_unique_keys
from mcpipe._yaml import compose_yaml, load_yaml
from mcpipe.gateway import PIPE_TOOL
from mcpipe.server import open_app

SPECS = [
    (
        "p.yaml",
        "steps:\n  - id: s\n    tool: echo\n    tool: now\n",
        "p.yaml:4:5: invalid YAML: duplicate key `tool` (first at line 3, column 5)",
    ),
    (
        "p.json",
        '{"steps": [{"id": "s",\n  "tool": "echo",\n  "tool": "now"}]}',
        "p.json:3:3: duplicate key `tool` in `steps[0]` (first at line 2, column 3)",
    ),
    (
        "p.yaml",
        "vars: {a: 1}\nsteps: [{tool: echo}]\nvars: {a: 2}\n",
        "p.yaml:3:1: invalid YAML: duplicate key `vars` (first at line 1, column 1)",
    ),
]


@pytest.mark.parametrize("command", ["run", "check"])
@pytest.mark.parametrize(("name", "text", "line"), SPECS, ids=["yaml", "json", "top_level"])
def test_a_spec_file_with_a_key_twice_is_refused_at_the_second_key_by_run_and_check(
    tmp_path, command, name, text, line
):
    (tmp_path / name).write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "mcpipe", command, name], cwd=tmp_path, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert done.stdout == b""  # nothing ran
    assert done.stderr.decode() == f"mcpipe {command}: error: {line}\n"


@pytest.mark.parametrize(
    ("name", "text", "line"),
    [
        (
            "mcpipe.toml",
            "[pipe]\nmax_depth = 3\nmax_depth = 4\n",
            "error: mcpipe.toml:3:14: not valid TOML: Cannot overwrite a value",  # tomllib's own refusal
        ),
        (
            "mcpipe.yaml",
            "pipe:\n  max_depth: 3\n  max_depth: 4\n",
            "error: mcpipe.yaml:3:3: not valid YAML: duplicate key `max_depth` (first at line 2, column 3)",
        ),
        (
            "mcpipe.json",
            '{"pipe": {"max_depth": 3,\n "max_depth": 4}}',
            "error: mcpipe.json:2:2: duplicate key `max_depth` in `pipe` (first at line 1, column 11)",
        ),
    ],
    ids=["toml", "yaml", "json"],
)
def test_a_config_file_with_a_key_twice_is_refused_located(tmp_path, name, text, line):
    (tmp_path / name).write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "mcpipe", "check", "--config", name],
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.decode().strip() == line


def test_call_refuses_args_with_a_key_twice_in_json_and_in_yaml(tmp_path):
    for args, where in (('{"a": 1, "a": 2}', "ARGS:1:10: duplicate key `a`"), ("a: 1\na: 2", "ARGS:2:1: invalid YAML")):
        done = subprocess.run(
            [sys.executable, "-m", "mcpipe", "call", "echo", args],
            cwd=tmp_path,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, args
        assert done.stderr.decode().startswith(f"mcpipe call: error: {where}"), done.stderr


async def test_mcp_pipe_refuses_a_spec_given_as_json_text_with_a_key_twice():
    text = '{"steps": [{"id": "s", "tool": "echo", "tool": "now"}]}'
    with trio.fail_after(20):
        async with open_app(make_config()) as app, Client(app.server) as client:
            result = await client.call_tool(PIPE_TOOL, {"spec": text})
            same_as_object = await client.call_tool(PIPE_TOOL, {"spec": orjson.loads(text)})
    answer = result.structured_content
    assert result.is_error and answer["error_code"] == "INVALID_SPEC"
    assert answer["problems"] == [
        {
            "location": "spec",
            "code": "INVALID_SPEC",
            "message": "line 1, column 40 of the JSON text: duplicate key `tool` in `steps[0]` (first at line 1, "
            "column 24)",
        }
    ]
    # The arguments of a JSON-RPC call are a client's own object: parsed as the SDK parses them, and run.
    assert not same_as_object.is_error


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1, "b": {"a": 2}}', None),  # the same key in two objects
        ('[{"k": 1}, {"k": 2}]', None),
        ('{"a": "x,\\"y\\": 1", "y": 2}', None),  # a key's text inside a string is no key
        ('{"a": 1, "\\u0061": 2}', ("a", "", 1, 10, (1, 2))),  # the same key, escaped
        ('{"s": [0, {"t": {"u": 1,\n "u": 2}}]}', ("u", "s[1].t", 2, 2, (1, 18))),
        ("[" * 2000 + '{"a": 1, "a": 2}' + "]" * 2000, ("a", "[0]" * 2000, 1, 2010, (1, 2002))),  # past any recursion
    ],
)
def test_check_unique_keys_finds_the_first_repeated_key_and_where_it_is(text, expected):
    if expected is None:
        check_unique_keys(text)
        return
    with pytest.raises(DuplicateKeyError) as e:
        check_unique_keys(text)
    assert (e.value.key, e.value.path, e.value.lineno, e.value.colno, e.value.first) == expected


@pytest.mark.parametrize(
    "text",
    [
        "base: &b {a: 1, b: 2}\nuse:\n  <<: *b\n  a: 3\n",  # a merge key is overridden, not repeated
        "a: {x: 1}\nb: {x: 2}\n",
        "list: [{k: 1}, {k: 2}]\n",
        "1: one\n'1': the string\n",  # an integer key and a string key are two keys
    ],
)
def test_yaml_without_a_repeated_key_loads_as_before(text):
    assert load_yaml(text) == yaml.safe_load(text)


def test_yaml_keys_that_are_the_same_however_quoted_are_refused_at_the_second():
    for loader in (load_yaml, compose_yaml):
        with pytest.raises(yaml.MarkedYAMLError) as e:
            loader("x:\n  name: a\n  'name': b\n")
        assert e.value.problem == "duplicate key `name` (first at line 2, column 3)"
        assert e.value.problem_mark is not None and (e.value.problem_mark.line, e.value.problem_mark.column) == (2, 2)


def test_the_refusal_is_located_in_the_repositorys_own_files_none_of_which_repeat_a_key():
    """mcpipe's examples and docs load as they did (the vendored files of other systems are their own)."""
    root = Path(__file__).resolve().parents[1]
    files = [p for d in ("examples", "docs") for p in (root / d).rglob("*") if p.suffix in (".yaml", ".yml", ".json")]
    assert files
    for p in files:
        if p.suffix == ".json":
            check_unique_keys(p.read_bytes())
        else:
            try:
                compose_yaml(p.read_bytes())
            except yaml.MarkedYAMLError as e:
                assert "duplicate key" not in str(e), p
