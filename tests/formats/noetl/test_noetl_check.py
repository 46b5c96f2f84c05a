"""A NoETL playbook mcpipe cannot take is refused when it is checked, every problem one line, located in the
file by line and path; and what the workflow's templates fail on at run time fails its step, located."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from kit.noetl import policy
from mcpipe.formats.noetl import load_playbook, playbook_tool

HEAD = "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: p, path: t/p}\nworkflow:\n"


def check(tmp_path: Path, steps: str) -> list[str]:
    (tmp_path / "pb.yaml").write_text(HEAD + steps)
    _, problems = load_playbook("pb.yaml", base_dir=str(tmp_path), policy=policy())
    return [str(p) for p in problems]


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        (
            "  - step: start\n    tool: {kind: noop}\n    next: {arcs: [{step: ned}]}\n"
            "  - step: end\n    tool: {kind: noop}\n",
            "pb.yaml:7: workflow[0].next.arcs[0].step: unknown step `ned` (did you mean `end`?)",
        ),
        (
            "  - step: a\n    tool: {kind: snowflake, command: select 1}\n",
            "pb.yaml:6: workflow[0].tool.kind: NoETL tool kind `snowflake` (a cloud warehouse) has no mcpipe step kind",
        ),
        (
            "  - step: a\n    tool: {kind: pyton}\n",
            "pb.yaml:6: workflow[0].tool.kind: unknown tool kind `pyton` (did you mean `python`?)",
        ),
        (
            "  - step: a\n    tool: {kind: http, url: 'http://x/{{ a.b'}\n",
            "pb.yaml:6: workflow[0].tool.url: template syntax error",
        ),
        (
            "  - step: a\n    loop: {in: '{{ xs }}', iterator: 'not a name'}\n    tool: {kind: noop}\n",
            "pb.yaml:6: workflow[0].loop.iterator: must be a name (letters, digits, `_`)",
        ),
        (
            "  - step: a\n    tool: {kind: noop}\n    nxet: b\n",
            "pb.yaml:7: workflow[0].nxet: unknown key `nxet` of a step (did you mean `next`?)",
        ),
        (
            "  - step: a\n    tool: {kind: noop}\n    next: {spec: {mode: sometimes}, arcs: []}\n",
            "pb.yaml:7: workflow[0].next.spec.mode: must be exclusive or inclusive, got 'sometimes'",
        ),
        (
            "  - step: a\n    tool: {kind: noop}\n  - step: a\n    tool: {kind: noop}\n",
            "pb.yaml:7: workflow[1].step: duplicate step `a`",
        ),
    ],
)
def test_a_playbook_mcpipe_cannot_take_is_refused_at_check_time_located(tmp_path, steps, expected):
    problems = check(tmp_path, steps)
    assert any(p.startswith(expected) for p in problems), problems


async def test_an_undefined_name_at_run_time_fails_its_step_located_and_the_run_ends_failed(tmp_path):
    (tmp_path / "pb.yaml").write_text(
        HEAD + "  - step: a\n    tool: {kind: python, input: {x: '{{ nope.deeper }}'}, code: 'result = x'}\n"
    )
    pb, problems = load_playbook("pb.yaml", base_dir=str(tmp_path), policy=policy())
    assert problems == [] and pb is not None
    with trio.fail_after(30):
        answer = await playbook_tool(pb).run({})
    assert not answer["ok"]
    assert answer["error_code"] == "INTERPOLATION_FAILED"
    assert "workflow[0].tool.input.x: 'nope' is undefined" in answer["error"]
    assert answer["noetl"]["failed_steps"] == ["a"]


async def test_top_level_tracing_and_spec_are_warnings_as_noetl_drops_them_and_the_playbook_runs(tmp_path):
    # NoETL's Playbook model (pydantic, unknown fields dropped) never reads either; its templates have no `spec`.
    top = "tracing: {enabled: true, service_name: p}\nspec: {state: ready}\n"
    steps = "  - step: start\n    tool: {kind: python, code: 'result = {\"ok\": 1}'}\n"
    (tmp_path / "pb.yaml").write_text(HEAD.replace("workflow:\n", top + "workflow:\n") + steps)
    pb, problems = load_playbook("pb.yaml", base_dir=str(tmp_path), policy=policy())
    assert problems == [] and pb is not None
    warned = [w.split(":")[0] for w in pb.warnings]
    assert "tracing" in warned and "spec" in warned
    assert any("OpenTelemetry" in w for w in pb.warnings)
    with trio.fail_after(30):
        answer = await playbook_tool(pb).run({})
    assert answer["ok"], answer


def test_an_older_iterator_named_by_name_is_read_as_that_step(tmp_path):
    # NoETL's broker of 2025-10 names a step by `step`, else `name`.
    (tmp_path / "pb.yaml").write_text(
        "apiVersion: noetl.io/v1\nkind: Playbook\nname: p\npath: t/p\nworkload: {xs: [1, 2]}\nworkflow:\n"
        "  - step: start\n    next: [{step: each}]\n"
        "  - name: each\n    type: iterator\n    collection: '{{ workload.xs }}'\n    element: x\n"
        "    task: {type: python, code: 'def main(x): return x'}\n    next: [{step: end}]\n"
        "  - step: end\n"
    )
    pb, problems = load_playbook("pb.yaml", base_dir=str(tmp_path), policy=policy())
    assert [str(p) for p in problems] == [] and pb is not None
    assert "each" in pb.steps


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        (
            "  - step: a\n    tool: {kind: noop}\n    save: [{storage: event_log, data: {x: 1}}]\n",
            "pb.yaml:7: workflow[0].save: a save is one object (`storage`, `data`, ...): no NoETL engine reads a list",
        ),
        (
            "  - step: a\n    tool: {kind: noop}\n    spec: {next_mode: exclusive}\n",
            "pb.yaml:7: workflow[0].spec.next_mode: a step's `spec.next_mode` is refused by NoETL itself",
        ),
    ],
)
def test_what_no_noetl_engine_reads_is_refused_saying_so(tmp_path, steps, expected):
    problems = check(tmp_path, steps)
    assert any(p.startswith(expected) for p in problems), problems


def test_tool_fields_under_tool_spec_are_read_with_a_warning_that_noetl_426_drops_them():
    # examples/simple_http_v2: NoETL 4.26's worker renders a tool's config without `spec` (it reads only
    # `policy` and `timeout` there), so its http step has no url and the run fails; mcpipe lifts the fields.
    from kit.noetl import load

    pb = load("tests/fixtures/playbooks/examples/simple_http_v2.yaml")
    lifted = sorted(w.split(":")[0] for w in pb.warnings if "under a tool's `spec`" in w)
    assert lifted == [
        "workflow[0].tool.spec.method",
        "workflow[0].tool.spec.params",
        "workflow[0].tool.spec.url",
        "workflow[1].tool.spec.code",
        "workflow[1].tool.spec.input",
        "workflow[2].tool.spec.code",
        "workflow[2].tool.spec.input",
    ]


def test_a_sequential_loops_writes_and_its_failure_arcs_are_warned_of_as_noetl_426_runs_them_otherwise(tmp_path):
    from kit.noetl import load

    pb = load("tests/fixtures/playbooks/load_test/heavy_loop_aggregation/heavy_loop_aggregation.yaml")
    wrote = "workflow[1].loop: the items of this sequential loop write `loop_results`"
    assert any(w.startswith(wrote) for w in pb.warnings)
    (tmp_path / "pb.yaml").write_text(
        HEAD + "  - step: a\n    loop: {in: '{{ [1, 2] }}', iterator: x}\n    tool: {kind: noop}\n"
        "    next: {arcs: [{step: b, when: \"{{ event.name == 'call.error' }}\"}, {step: b}]}\n"
        "  - step: b\n    tool: {kind: noop}\n"
    )
    pb2, problems = load_playbook("pb.yaml", base_dir=str(tmp_path), policy=policy())
    assert problems == [] and pb2 is not None
    assert [w for w in pb2.warnings if "sequential" in w] == [
        "workflow[0].next.arcs[0].when: a failed item of a sequential loop ends the run (as NoETL 4.26 ends it): "
        "this arc is decided only once every item succeeded"
    ]
