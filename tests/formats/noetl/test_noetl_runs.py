"""NoETL's own playbooks (vendored, unmodified) run by mcpipe: each construct of the workflow on a real file.

HTTP steps reach a real server on 127.0.0.1 (``kit.noetl.Origin``); the playbooks' base URLs are given
as call arguments (NoETL's execution payload, laid over the ``workload``), never edited.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from kit.noetl import load, origin, run_file, step_order
from mcpipe.formats.noetl import playbook_tool

WAIT_S = 30


async def run(rel: str, args: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    with trio.fail_after(WAIT_S):
        answer = await run_file(rel, args, events)
    return answer, events


async def test_hello_world_runs_its_python_steps_in_order_and_answers_in_noetls_shape():
    answer, events = await run("tests/fixtures/playbooks/hello_world/hello_world.yaml")
    assert answer["ok"], answer["error"]
    assert answer["noetl"] == {
        "playbook": "hello_world",
        "status": "completed",
        "steps": {
            "start": [{"status": "initialized"}],
            "test_step": [{"status": "ok", "data": {"message": "Hello World"}}],  # `{{ message }}`: a bare name
            "end": [{"status": "complete"}],
        },
        "failed_steps": [],
        "final": {"status": "complete"},
    }
    assert step_order(events) == ["start", "test_step", "end"]
    assert [e["type"] for e in events][:3] == ["started", "step_started", "step_started"]
    exits = [e for e in events if e["type"] == "step_exit"]
    assert exits[1]["result"] == {"status": "ok", "data": {"message": "Hello World"}} and exits[1]["status"] == "ok"


async def test_a_call_argument_overrides_the_workload_as_noetls_execution_payload_does():
    answer, _ = await run("tests/fixtures/playbooks/hello_world/hello_world.yaml", {"message": "Hi"})
    assert answer["noetl"]["steps"]["test_step"] == [{"status": "ok", "data": {"message": "Hi"}}]


async def test_an_inclusive_fan_out_runs_both_branches_and_the_join_once_when_both_are_done():
    answer, events = await run("tests/fixtures/playbooks/fanout_reduce/fanout_reduce_phase6.yaml")
    assert answer["ok"], answer["error"]
    order = step_order(events)
    assert order.count("reduce_customer") == 1
    assert order.index("reduce_customer") > max(order.index("normalize_customer"), order.index("enrich_customer"))
    assert answer["noetl"]["final"] == {"reduced": True}


@pytest.mark.parametrize(
    ("temperature", "branch"), [(30, ["hot_path", "hot_task_a", "hot_task_b"]), (10, ["cold_path", "cold_task"])]
)
async def test_exclusive_arcs_take_the_first_arc_whose_condition_holds(temperature, branch):
    answer, events = await run(
        "tests/fixtures/playbooks/control_flow_workbook/control_flow_workbook.yaml", {"temperature_c": temperature}
    )
    assert answer["ok"], answer["error"]
    ran = step_order(events)
    assert ran[:2] == ["start", "eval_flag"] and ran[-1] == "end"
    assert sorted(ran[2:-1]) == sorted(branch)  # the other branch never runs
    assert answer["noetl"]["steps"]["eval_flag"][0]["is_hot"] is (temperature >= 25)  # a workbook action


async def test_a_sequential_loop_runs_its_items_one_after_the_other_in_order():
    answer, events = await run("tests/fixtures/playbooks/root_scripts/test_simple_loop.yaml")
    assert answer["ok"], answer["error"]
    assert answer["noetl"]["steps"]["loop_test"] == [
        {"value": 10, "name": "ten", "doubled": 20},
        {"value": 20, "name": "twenty", "doubled": 40},
        {"value": 30, "name": "thirty", "doubled": 60},
    ]
    assert step_order(events) == ["start", "loop_test", "loop_test", "loop_test", "end"]


async def test_a_parallel_loop_runs_its_http_items_at_once_within_max_in_flight():
    with origin() as o:
        answer, _ = await run(
            "tests/fixtures/playbooks/pagination/basic/test_pagination_basic.yaml",
            {"api_url": o.url, "slow_delay_seconds": 0.5},
        )
        probes = dict(o.probes)
    assert answer["ok"], answer["error"]
    assert probes["started"] == probes["completed"] == 5
    assert 2 <= probes["max_active"] <= 5  # the playbook's own check (validate_results) passed too
    assert answer["noetl"]["steps"]["validate_results"][0]["status"] == "success"
    assert [r["status_code"] for r in answer["noetl"]["steps"]["run_probes"]] == [200] * 5


async def test_a_loop_is_bounded_by_the_servers_item_limit(tmp_path):
    from mcpipe.plan import Limits

    tool = playbook_tool(
        load("tests/fixtures/playbooks/root_scripts/test_simple_loop.yaml"), limits=Limits(max_items=2)
    )
    with trio.fail_after(WAIT_S):
        answer = await tool.run({})
    assert not answer["ok"]
    assert answer["error_code"] == "LIMIT_EXCEEDED"
    assert "workflow[1].loop.for_each: 3 items; the limit is 2" in answer["error"]


async def test_set_in_a_task_policy_writes_ctx_that_later_steps_read():
    answer, _ = await run("tests/fixtures/playbooks/vars_test/test_vars_simple.yaml")
    assert answer["ok"], answer["error"]
    assert answer["noetl"]["steps"]["set_var"][0]["ctx"] == {
        "test_counter": "42",
        "set_message": "Variable set successfully",
    }
    got = answer["noetl"]["steps"]["get_var"][0]
    # A policy rule's `set` renders to text, as NoETL's worker renders it: 42 comes back "42" (so the
    # playbook's own check, `counter == 42`, is false under NoETL 4.26 too).
    assert got["value"] == "42" and got["verification"] is False and got["message"] == "Variable set successfully"


async def test_a_playbook_task_runs_a_sub_playbook_of_the_catalog_to_its_end():
    answer, events = await run("automation/examples/parent_playbook.yaml")
    assert answer["ok"], answer["error"]
    build = answer["noetl"]["steps"]["call_build"][0]
    assert build["status"] == "completed" and build["path"] == "automation/examples/composition/build"
    assert build["completed_steps"] == ["start", "build_image", "end"]
    assert "Building image with tag: v2.5.3" in build["variables"]["build_image"]["stdout"]
    assert step_order(events) == ["start", "call_build", "call_deploy", "end"]  # the children's own are theirs


async def test_a_retry_policy_calls_again_on_the_status_it_names_until_the_call_succeeds():
    with origin() as o:
        answer, _ = await run(
            "tests/fixtures/playbooks/retry_test/http_retry_status_code.yaml", {"test_url": f"{o.url}/flaky/a/2"}
        )
        hits = o.hits["/flaky/a/2"]
    assert answer["ok"], answer["error"]
    assert hits == 3  # two 503s, then 200
    start = answer["noetl"]["steps"]["start"][0]
    assert start["status"] == "ok" and start["_prev"]["status_code"] == 200 and start["metrics"]["tasks_run"] == 3


async def test_a_retry_policy_gives_up_after_its_attempts_and_the_step_fails_located():
    with origin() as o:
        answer, _ = await run(
            "tests/fixtures/playbooks/retry_test/http_retry_status_code.yaml", {"test_url": f"{o.url}/status/503"}
        )
        hits = o.hits["/status/503"]
    assert not answer["ok"]
    assert hits == 3
    assert answer["noetl"]["failed_steps"] == ["start"]
    assert (
        "workflow[0].tool: still failing after 3 attempts: the tool answered status `error`: HTTP 503"
        in answer["error"]
    )


async def test_a_failed_step_is_routed_on_by_its_arcs_and_the_run_ends_failed_as_noetl_ends_it():
    answer, _ = await run("tests/fixtures/playbooks/test_loop_instance_isolation/playbook.yaml")
    shaped = answer["noetl"]
    assert shaped["status"] == "failed" and shaped["failed_steps"] == ["verify_results"]
    assert shaped["steps"]["verify_results"][0]["status"] == "error"
    assert shaped["steps"]["verify_results"][0]["error"] == "name 'input_data' is not defined"
    assert shaped["steps"]["end"] == [{"message": "Workflow completed"}]  # NoETL 4.26 goes on, too
    assert shaped["final"] == {"message": "Workflow completed"}


async def test_the_final_result_is_the_last_steps_and_none_after_a_pipeline_as_in_noetl():
    answer, _ = await run("tests/fixtures/playbooks/hello_world/hello_world.yaml")
    assert answer["noetl"]["final"] == answer["noetl"]["steps"]["end"][0] == {"status": "complete"}
    answer, _ = await run("tests/fixtures/playbooks/test_end_with_action.yaml")
    assert answer["ok"], answer["error"]
    assert answer["noetl"]["steps"]["end"][0]["_prev"]["status"] == "completed"  # its pipeline's last task
    assert answer["noetl"]["final"] is None  # NoETL 4.26 reports none after a task sequence


async def test_the_older_layout_passes_an_arcs_data_to_the_next_step_and_reads_results_through_data():
    answer, _ = await run("test_data_transition_fix.yaml")  # noetl.io/v1: type steps, next lists, data on arcs
    assert answer["ok"], answer["error"]
    got = answer["noetl"]["steps"]["test_step"][0]["data"]
    assert got == {
        "received_message": "Hello from workload",
        "received_extra": "Additional data from transition",
        "test_passed": True,
    }
    end = answer["steps"]["end"]
    assert end["noetl_set"] == {
        "test_result": True,
        "message_received": "Hello from workload",
        "extra_received": "Additional data from transition",
    }


async def test_an_mcp_turn_runs_as_a_step_of_a_noetl_workflow_and_later_steps_read_its_result():
    from kit.llm import fake_openai, text
    from mcpipe.formats.noetl import compile_noetl
    from mcpipe.models import ModelConfig, Models

    doc = {
        "apiVersion": "noetl.io/v2",
        "kind": "Playbook",
        "metadata": {"name": "ask_then_shout", "path": "tests/ask_then_shout"},
        "workload": {"topic": "refunds"},
        "mcp": {
            "models": [{"name": "m"}],
            "resources": [{"name": "kb", "type": "value", "spec": {"value": "Refunds take 14 days."}}],
            "turns": [{"name": "ask", "model": "m", "user": [{"use": "resource:kb"}, "About {{ workload.topic }}?"]}],
        },
        "workflow": [
            {"step": "start", "tool": {"kind": "noop"}, "next": {"arcs": [{"step": "ask"}]}},
            {"step": "ask", "tool": {"kind": "mcp", "turn": "ask"}, "next": {"arcs": [{"step": "shout"}]}},
            {
                "step": "shout",
                "tool": {"kind": "python", "input": {"said": "{{ ask.text }}"}, "code": "result = said.upper()"},
            },
        ],
    }
    with trio.fail_after(WAIT_S):
        async with fake_openai(text("Fourteen days.")) as fake:
            pb, problems = compile_noetl(doc, models=Models({"m": ModelConfig(base_url=fake.url)}))
            assert problems == [] and pb is not None, problems
            answer = await playbook_tool(pb).run({})
            asked = fake.requests[0]["messages"][-1]["content"]
    assert answer["ok"], answer["error"]
    assert "Resource kb:\nRefunds take 14 days." in asked and "About refunds?" in asked
    assert answer["noetl"]["steps"]["ask"][0]["text"] == "Fourteen days."
    assert answer["noetl"]["final"] == "FOURTEEN DAYS."


async def test_a_failed_item_of_a_sequential_loop_ends_the_run_there_as_noetl_ends_it():
    # Its code does not compile (`return` outside a function), so every item fails. NoETL 4.26's engine answers
    # the item's `command.failed` with `workflow.failed` when no command is pending: the next item is not
    # issued, the loop's arcs are not taken (golden/4.26.0/v2_loop_test.json).
    answer, events = await run("tests/fixtures/playbooks/v2_loop_test.yaml")
    shaped = answer["noetl"]
    assert shaped["status"] == "failed" and shaped["failed_steps"] == ["start"]
    assert [r["error"] for r in shaped["steps"]["start"]] == ["'return' outside function (<string>, line 9)"]
    assert set(shaped["steps"]) == {"start"}  # process, user_loop, verify and end never run
    assert step_order(events) == ["start"]


async def test_a_failed_item_of_a_parallel_loop_lets_the_other_items_run_and_the_arcs_route_it(tmp_path):
    (tmp_path / "pb.yaml").write_text(
        "apiVersion: noetl.io/v2\nkind: Playbook\nmetadata: {name: p, path: t/p}\nworkload: {xs: [1, 0, 2]}\n"
        "workflow:\n"
        "  - step: start\n    loop: {in: '{{ xs }}', iterator: x, spec: {mode: parallel}}\n"
        "    tool: {kind: python, input: {x: '{{ x }}'}, code: 'result = {\"inv\": 1 / x}'}\n"
        "    next: {arcs: [{step: end}]}\n"
        '  - step: end\n    tool: {kind: python, code: \'result = {"status": "done"}\'}\n'
    )
    pb = load(str(tmp_path / "pb.yaml"))
    with trio.fail_after(WAIT_S):
        answer = await playbook_tool(pb).run({})
    shaped = answer["noetl"]
    assert shaped["status"] == "failed" and shaped["failed_steps"] == ["start"]
    assert len(shaped["steps"]["start"]) == 3
    assert shaped["steps"]["end"] == [{"status": "done"}]


async def test_a_sequential_loops_items_each_see_what_the_items_before_them_wrote():
    # heavy_loop_aggregation's items append to `ctx.loop_results` (a policy rule's `set`): folded item by item,
    # the aggregate sees every item (NoETL 4.26 renders each item in the loop's start, and counts 0).
    answer, _ = await run(
        "tests/fixtures/playbooks/load_test/heavy_loop_aggregation/heavy_loop_aggregation.yaml", {"item_count": 5}
    )
    assert answer["ok"], answer["error"]
    steps = answer["noetl"]["steps"]
    assert [len(r["loop_results"]) for r in steps["process_items"]] == [1, 2, 3, 4, 5]
    assert steps["aggregate_results"][0]["summary"]["total_processed"] == 5
    assert steps["end"][0] == {"status": "completed", "test_name": "heavy_loop_aggregation", "test_result": "validated",
                               "all_passed": True}  # fmt: skip
