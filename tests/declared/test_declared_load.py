"""Loading ``pipelines:`` and ``outbound:``: every problem at once, located by pipeline name; cycles;
the outbound policy; the example configs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kit.pipelines import problems_of
from mcpipe.compile import Limits
from mcpipe.declared import KnownTools, load_declared, load_outbound, validate_declared
from mcpipe.server.cli import check_config
from mcpipe.tools import ToolRegistry

HERE = Path(__file__).parent
EXAMPLES = HERE.parents[1] / "examples" / "declared"


def test_a_file_full_of_mistakes_reports_every_problem_at_once_located_in_file_order():
    text = (HERE / "configs" / "mistakes.yaml").read_text()
    assert problems_of(text) == [
        "outbound.http.alow_private: unknown field `alow_private` (did you mean `allow_private`?)",
        "outbound.commands.jq: a command needs an executable (a path, or an argv list)",
        "pipelines.charge.input_schema.properties.amount.minimum: not a valid JSON Schema: "
        "'zero' is not of type 'number'",
        "pipelines.charge.timeout_ms: Expected `float` > 0.0",
        "pipelines.charge.steps[1].id: duplicate id 'first' (also pipelines.charge.steps[0])",
        "pipelines.charge.steps[2].expression: invalid CEL: syntax error at line 1, column 14: mismatched input "
        "'<EOF>' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, "
        "STRING, BYTES, IDENTIFIER}",
        'pipelines.charge.steps[3].kind: unknown kind "transfrom" (did you mean `transform`?) (kinds: tool, http, '
        "graphql, command, mock, value, store_content, transform, cel_gate, plugin_transform, log, progress, "
        "elicitation, sampling, roots_list, gather, sql, sql_tx, sql_await, nats, grpc, kafka, python, duckdb, "
        "postgres, shell, twilio, parallel, pipe)",
        "pipelines.charge.steps[4].value: reference to step 'later', which does not run before this step",
        "pipelines.charge.steps[5].url: host '169.254.169.254' is not in the allowed hosts"
        " (list it in outbound.http.allowed_hosts)",
        "pipelines.charge.steps[6].command: command 'bash' is not allowed (allowed: none are configured)",
        "pipelines.charge.steps[7].config.expression: invalid JSONata: Expected } before end of expression at "
        "character 7 (S0203)",
        "pipelines.charge.steps[8].tool: unknown tool 'no_such_tool'",
        "pipelines.charge.steps[9].colour: unknown field `colour` for kind `value`",
        "pipelines.charge.output.amount: reference to unknown step 'nowhere'",
        "pipelines.charge.content[0].type: unknown content type 'picture' (text, image, audio, resource, "
        "resource_link)",
        "pipelines[1].name: duplicate pipeline name 'charge' (also pipelines.charge)",
        "pipelines.ping.input_schema.type: an input schema describes the arguments object: `type: object`",
        "pipelines.ping.steps[0].tool: calling 'pong' makes a cycle (ping -> pong -> ping): declared pipelines "
        "cannot call themselves",
        "pipelines.pong.steps[0].steps[0].tool: calling 'ping' makes a cycle (pong -> ping -> pong): declared "
        "pipelines cannot call themselves",
    ]


def test_any_problem_means_no_tools_at_all():
    declared, problems = load_declared(
        [{"name": "good", "steps": [{"kind": "value", "value": 1}]}, {"name": "bad", "steps": []}]
    )
    assert [str(p) for p in problems] == ["pipelines.bad.steps: steps must be a non-empty array, got array"]
    assert len(declared) == 0


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (
            "[{name: me, steps: [{kind: tool, tool: me}]}]",
            "pipelines.me.steps[0].tool: calling 'me' makes a cycle (me -> me)",
        ),
        (
            "[{name: a, steps: [{kind: tool, tool: b}]},"
            " {name: b, steps: [{kind: parallel, steps: [{kind: tool, tool: c}]}]},"
            " {name: c, steps: [{kind: tool, tool: a}]}]",
            "pipelines.a.steps[0].tool: calling 'b' makes a cycle (a -> b -> c -> a)",
        ),
        ("[{steps: [{kind: value, value: 1}]}]", "pipelines[0].name: missing field `name`"),
        ("[{name: 'has space', steps: [{kind: value, value: 1}]}]", 'pipelines[0].name: invalid tool name "has space"'),
        (
            "[{name: mcp_pipe, steps: [{kind: value, value: 1}]}]",
            "pipelines.mcp_pipe.name: `mcp_pipe` is the server's own tool",
        ),
        ("[{name: add, steps: [{kind: value, value: 1}]}]", "pipelines.add.name: a tool named 'add' already exists"),
        ("[{name: p}]", "pipelines.p.steps: missing field `steps`"),
        (
            "[{name: p, steps: [{kind: value, value: 1}], outptu: 1}]",
            "pipelines.p.outptu: unknown field `outptu` (did you mean `output`?)",
        ),
        (
            "[{name: p, description: 3, steps: [{kind: value, value: 1}]}]",
            "pipelines.p.description: Expected `str`, got `int`",
        ),
        (
            "[{name: p, input_schema: {type: object, required: 3}, steps: [{kind: value, value: 1}]}]",
            "pipelines.p.input_schema.required: not a valid JSON Schema: 3 is not of type 'array'",
        ),
        (
            "[{name: p, output_schema: {type: objekt}, steps: [{kind: value, value: 1}]}]",
            "pipelines.p.output_schema.type: not a valid JSON Schema",
        ),
        ("[{name: p, steps: [{kind: value, value: 1}], output: '${args.'}]", "pipelines.p.output: "),
        (
            "[{name: p, steps: [{kind: value, id: v, value: 1}], output: '${vars.x}'}]",
            "pipelines.p.output: reference `vars.x`: no var named 'x'",
        ),
        (
            "[{name: p, steps: [{kind: value, value: 1}], content: [{type: text}]}]",
            "pipelines.p.content[0]: a `text` block needs `text`",
        ),
        (
            "[{name: p, steps: [{kind: value, value: 1}], content: [{type: image, data: x, mime: y}]}]",
            "pipelines.p.content[0]: a `image` block needs `mimeType`",
        ),
        (
            "[{name: p, steps: [{kind: transform, expression: 'steps.step2.output'}, {kind: value, value: 1}]}]",
            "pipelines.p.steps[0].expression: reference to step 'step2', which does not run before this step",
        ),
        (
            "[{name: p, steps: [{kind: parallel, steps: [{kind: value, id: a, value: 1},"
            " {kind: transform, expression: 'steps.a.ok'}]}]}]",
            "pipelines.p.steps[0].steps[1].expression: reference to step 'a', a sibling in the same parallel group",
        ),
        ("pipelines: {a: 1}", "pipelines: expected a list of pipelines, got object"),
    ],
)
def test_load_problems_are_located_by_pipeline_name(doc, expected):
    found = problems_of(doc)
    assert any(p.startswith(expected) for p in found), found


def test_the_servers_limits_apply_to_declared_pipelines():
    steps = "[" + ", ".join("{kind: value, value: 1}" for _ in range(4)) + "]"
    assert problems_of(f"[{{name: p, steps: {steps}}}]", limits=Limits(max_steps=3)) == [
        "pipelines.p.steps: the pipeline has 4 steps; the limit is 3"
    ]
    nested = "[{kind: pipe, steps: [{kind: pipe, steps: [{kind: value, value: 1}]}]}]"
    assert problems_of(f"[{{name: p, steps: {nested}}}]", limits=Limits(max_depth=1)) == [
        "pipelines.p.steps[0].steps[0]: nesting is 2 levels deep here; the limit is 1"
    ]


def test_tool_names_are_not_checked_without_tools_and_downstream_prefixes_pass_the_check():
    doc = "[{name: p, steps: [{kind: tool, tool: github.search}, {kind: tool, tool: gitlab.search}]}]"
    assert problems_of(doc, tools=None) == []
    known = KnownTools(ToolRegistry(), ["github"])
    assert problems_of(doc, tools=known) == ["pipelines.p.steps[1].tool: unknown tool 'gitlab.search'"]


def test_the_outbound_section_becomes_the_step_policy():
    policy, problems = load_outbound(
        {
            "http": {"allowed_hosts": ["api.example.com"], "allow_private": True, "timeout_ms": 5000},
            "commands": {"jq": ["/usr/bin/jq", "-c"], "git": "/usr/bin/git"},
            "command_env": {"PATH": "/usr/bin"},
            "command_timeout_ms": 2000,
            "command_kill_grace_ms": 0,
            "expression_max_ms": 50,
        }
    )
    assert problems == []
    assert policy.http.host_allowed("api.example.com") and not policy.http.host_allowed("evil.example.com")
    assert policy.http.allow_private and policy.http.timeout_ms == 5000
    assert policy.command.argv("jq") == ("/usr/bin/jq", "-c") and policy.command.argv("git") == ("/usr/bin/git",)
    assert policy.command.base_env() == {"PATH": "/usr/bin"} and policy.command.timeout_ms == 2000
    assert policy.expression_max_ms == 50
    default, problems = load_outbound(None)
    assert problems == [] and not default.http.host_allowed("api.example.com") and default.command.commands == {}
    _, problems = load_outbound({"http": {"timeout_ms": 0}, "comands": {}})
    assert [str(p) for p in problems] == [
        "outbound.http.timeout_ms: Expected `float` > 0.0",
        "outbound.comands: unknown field `comands` (did you mean `commands`?)",
    ]


def test_a_constant_url_outside_the_outbound_hosts_is_refused_at_load():
    doc = """
outbound: {http: {allowed_hosts: [api.example.com]}}
pipelines:
  - name: p
    steps:
      - {kind: http, url: "https://api.example.com/ok"}
      - {kind: http, url: "https://other.example.com/no"}
      - {kind: http, url: "http://127.0.0.1:8080/"}
"""
    assert problems_of(doc) == [
        "pipelines.p.steps[1].url: host 'other.example.com' is not in the allowed hosts"
        " (list it in outbound.http.allowed_hosts)",
        "pipelines.p.steps[2].url: host '127.0.0.1' is not in the allowed hosts"
        " (list it in outbound.http.allowed_hosts)",
    ]


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_config_loads_without_problems(path: Path):
    doc = yaml.safe_load(path.read_text())
    servers = doc.get("mcpServers", {})
    prefixes = [s.get("prefix", name) for name, s in servers.items()]
    declared, problems = load_declared(
        doc["pipelines"], doc.get("outbound"), tools=KnownTools(ToolRegistry(), prefixes)
    )
    assert problems == [], "\n".join(map(str, problems))
    assert len(declared) == len(doc["pipelines"])
    for tool in declared:
        assert tool.description and tool.input_schema["type"] == "object"


DOC = HERE.parents[1] / "docs" / "declared-pipelines.md"


def _config_blocks() -> list[str]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    return [b for b in blocks if re.search(r"^pipelines:", b, re.M)]


@pytest.mark.parametrize("block", _config_blocks(), ids=lambda b: b.split("name: ", 1)[-1].split("\n", 1)[0])
def test_every_config_example_of_the_doc_loads_without_problems(block):
    assert problems_of(block) == []


def test_too_many_steps_are_refused_before_any_step_is_compiled():
    # Every step is broken: compiling even one would report it. The walk counts and stops.
    steps = [{"kind": "no_such_kind"}] * 100_000
    problems = validate_declared([{"name": "p", "steps": steps}])
    assert [str(p) for p in problems] == ["pipelines.p.steps: the pipeline has 100000 steps; the limit is 50"]
    assert problems[0].code == "LIMIT_EXCEEDED"


def test_a_wide_nested_group_is_counted_only_until_the_limit_is_passed():
    group = {"kind": "parallel", "steps": [{"kind": "no_such_kind"}] * 10}
    steps = [{"kind": "pipe", "steps": [group] * 1000}, {"kind": "value", "value": 1}]
    problems = validate_declared([{"name": "p", "steps": steps}], limits=Limits(max_steps=20))
    assert [str(p) for p in problems] == ["pipelines.p.steps: the pipeline has at least 1002 steps; the limit is 20"]


def test_nesting_a_thousand_levels_deep_is_reported_alone_at_the_first_level_past_the_limit_before_compiling():
    step: dict[str, Any] = {"kind": "no_such_kind"}
    for i in range(1000):
        step = {"kind": "pipe" if i % 2 else "parallel", "steps": [step]}
    problems = validate_declared([{"name": "p", "steps": [{"kind": "no_such_kind"}, step]}])
    assert [str(p) for p in problems] == [
        "pipelines.p.steps[1]" + ".steps[0]" * 5 + ": nesting is 6 levels deep here; the limit is 5"
    ]


def test_a_config_whose_pipelines_pass_the_limits_fails_its_check_with_located_lines(tmp_path, capsys):
    deep: dict[str, Any] = {"kind": "value", "value": 1}
    for _ in range(3):
        deep = {"kind": "pipe", "steps": [deep]}
    config = tmp_path / "c.json"
    config.write_text(
        json.dumps(
            {
                "pipe": {"max_steps": 4, "max_depth": 2},
                "pipelines": [
                    {"name": "many", "steps": [{"kind": "value", "value": i} for i in range(5)]},
                    {"name": "deep", "steps": [deep]},
                    {"name": "fine", "steps": [{"kind": "value", "value": 1}]},
                ],
            }
        )
    )
    assert check_config(str(config)) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"error: {config}:pipelines.many.steps: the pipeline has 5 steps; the limit is 4",
        f"error: {config}:pipelines.deep.steps[0].steps[0].steps[0]: nesting is 3 levels deep here; the limit is 2",
    ]
