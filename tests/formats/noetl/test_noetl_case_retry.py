"""A case's ``then.retry`` (NoETL's v2 engine of 2025-12, ``_process_then_actions``): the step runs again
while the case's ``when`` holds, up to ``max_attempts`` runs in all; spent, the action is skipped and the
step routes as if no case had matched. Each run past the first counts towards ``pipe.max_calls``. HTTP
steps reach a real server on 127.0.0.1 (``kit.noetl.Origin``: ``/flaky/NAME/N`` answers 503 N times)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from kit.noetl import origin, policy, step_order
from mcpipe.formats.noetl import NoetlPlaybook, load_playbook, playbook_tool
from mcpipe.plan import Limits

PLAYBOOK = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: case_retry
  path: tests/case_retry
workload:
  url: http://127.0.0.1:1/
workflow:
- step: start
  tool: {kind: noop}
  next: [{step: fetch}]
- step: fetch
  tool:
    kind: http
    method: GET
    endpoint: "{{ workload.url }}"
  case:
    - when: "{{ event.name == 'call.error' and error is defined }}"
      then:
        retry:
          max_attempts: 3
          delay: 0.01
          backoff: exponential
  next: [{step: end}]
- step: end
  tool: {kind: noop}
"""


def load(tmp_path: Path, text: str = PLAYBOOK) -> NoetlPlaybook:
    (tmp_path / "case_retry.yaml").write_text(text)
    pb, problems = load_playbook("case_retry.yaml", base_dir=str(tmp_path), policy=policy())
    assert problems == [], [str(p) for p in problems]
    assert isinstance(pb, NoetlPlaybook)
    return pb


async def run(pb: NoetlPlaybook, args: dict[str, Any], **limits: Any) -> tuple[dict[str, Any], list[Any]]:
    events: list[dict[str, Any]] = []
    tool = playbook_tool(pb, limits=Limits(**limits)) if limits else playbook_tool(pb)
    with trio.fail_after(30):
        answer = await tool.run(args, on_event=events.append)
    return answer, events


async def test_a_case_retry_runs_the_failing_step_again_until_it_succeeds_and_the_run_goes_on(tmp_path):
    pb = load(tmp_path)
    with origin() as o:
        answer, events = await run(pb, {"url": f"{o.url}/flaky/a/2"})
        hits = o.hits["/flaky/a/2"]
    assert answer["ok"], answer["error"]
    assert hits == 3  # two 503s, then 200
    assert step_order(events) == ["start", "fetch", "fetch", "fetch", "end"]
    runs = answer["noetl"]["steps"]["fetch"]
    assert [r.get("status_code") for r in runs][-1] == 200 and len(runs) == 3


async def test_a_case_retry_spent_skips_the_action_and_the_step_routes_on_failed_as_noetl_does(tmp_path):
    pb = load(tmp_path)
    with origin() as o:
        answer, events = await run(pb, {"url": f"{o.url}/status/503"})
        hits = o.hits["/status/503"]
    assert hits == 3  # max_attempts runs in all
    # NoETL skips a spent retry; the step's structural `next` is taken, and the run ends failed.
    assert step_order(events) == ["start", "fetch", "fetch", "fetch", "end"]
    assert not answer["ok"] and "fetch" in answer["error"]


async def test_every_attempt_of_a_case_retry_counts_towards_max_calls(tmp_path):
    pb = load(tmp_path)
    with origin() as o:
        answer, _ = await run(pb, {"url": f"{o.url}/status/503"}, max_calls=3)
        hits = o.hits["/status/503"]
    assert hits == 1  # the three steps are counted up front: a second run of fetch would make 4 > 3
    assert not answer["ok"] and answer["error_code"] == "LIMIT_EXCEEDED"
    assert "running step 'fetch' again" in answer["error"]


async def test_a_case_retry_with_a_when_that_does_not_hold_never_retries(tmp_path):
    text = PLAYBOOK.replace("event.name == 'call.error' and error is defined", "error.status in [500, 502]")
    pb = load(tmp_path, text)
    with origin() as o:
        answer, events = await run(pb, {"url": f"{o.url}/flaky/b/1"})
        hits = o.hits["/flaky/b/1"]
    # `error` is the failure's message (no `status`): NoETL's condition fails to evaluate, so is false.
    assert hits == 1 and step_order(events) == ["start", "fetch", "end"]
    assert not answer["ok"]


def test_a_case_retry_is_checked_and_1x_names_noetl_does_not_read_are_warned(tmp_path):
    bad = PLAYBOOK.replace("max_attempts: 3", "max_attempts: 0")
    (tmp_path / "bad.yaml").write_text(bad)
    _, problems = load_playbook("bad.yaml", base_dir=str(tmp_path), policy=policy())
    assert [str(p) for p in problems] == [
        "bad.yaml:21: workflow[1].case[0].then.retry.max_attempts: must be a whole number of at least 1, got 0"
    ]
    older = PLAYBOOK.replace("delay: 0.01", "initial_delay: 0.5\n          backoff_multiplier: 2.0")
    pb = load(tmp_path, older)
    assert [w.split(":")[0] for w in pb.warnings] == [
        "workflow[1].case[0].then.retry.initial_delay",
        "workflow[1].case[0].then.retry.backoff_multiplier",
    ]
