"""What NoETL's engine of a vendored file's own version reads, read as it read it: ``case`` routing (the v2
engine of 2025-12), NoETL 1.x's generic bearer credentials, and what NoETL takes and ignores or fails only when
it runs (an arc's ``cond``, text its Jinja cannot parse), taken with a check warning."""

from __future__ import annotations

import trio

from kit.noetl import UPSTREAM, load, run_file, step_order
from mcpipe.formats.noetl import NoetlPlaybook, load_playbook
from mcpipe.kinds import HttpPolicy, StepPolicy


async def test_a_case_entry_routes_its_step_when_its_condition_holds_at_the_steps_exit():
    events: list[dict] = []
    with trio.fail_after(60):
        answer = await run_file("tests/fixtures/playbooks/vars_test/test_vars_cache.yaml", {}, events)
    # `case: [{when: "{{ event.name == 'step.exit' }}", then: {next: [test_set_var]}}]`
    assert step_order(events)[:2] == ["start", "test_set_var"]
    # its code imports NoETL's own worker (`noetl.worker.vars_cache`): NoETL's test of itself fails here
    (failed,) = answer["noetl"]["steps"]["test_set_var"]
    assert failed["status"] == "error" and "noetl" in failed["error"]


def test_noetl_1x_generic_bearer_credentials_become_a_bearer_auth_by_name():
    pb, problems = load_playbook(
        "examples/credentials/http_bearer_example.yaml",
        base_dir=str(UPSTREAM),
        policy=StepPolicy(http=HttpPolicy(allowed_hosts=("httpbin.org",))),
    )
    assert problems == [] and isinstance(pb, NoetlPlaybook)
    (task,) = pb.steps["call_api"].tasks
    assert task.parts["tmpl"]["auth"].render({}) == {"type": "bearer", "credential": "my-bearer-token"}


def test_what_noetl_ignores_or_fails_only_at_run_time_is_a_check_warning():
    gateway = load("tests/fixtures/playbooks/deployment/deploy_gateway_kind.yaml")
    assert any(".next.arcs[0].cond: NoETL's arcs read `when`, not `cond`" in w for w in gateway.warnings)
    docker = load("automation/development/docker.yaml")
    (warning,) = [w for w in docker.warnings if "template syntax error" in w]
    assert warning.startswith("workflow[4].tool.cmds[0]: template syntax error: unexpected '.'")
    assert docker.steps["clear_images"].tasks[0].runner == "fails"
