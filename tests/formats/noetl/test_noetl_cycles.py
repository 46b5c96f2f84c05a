"""NoETL's arcs back to an earlier step (pagination and polling by arcs) on its own vendored playbooks: the
step reached again runs again, each run recorded, bounded by ``pipe.max_step_runs``. HTTP steps reach NoETL's
paginated test API on 127.0.0.1 (``kit.noetl.Origin``)."""

from __future__ import annotations

from typing import Any

import trio

from kit.noetl import load, origin, run_file, step_order
from mcpipe.formats.noetl import playbook_tool
from mcpipe.plan import Limits

OFFSET = "tests/fixtures/playbooks/pagination/offset/test_pagination_offset.yaml"


async def run(rel: str, args: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    with trio.fail_after(60):
        answer = await run_file(rel, args, events)
    return answer, events


async def test_offset_pagination_by_an_arc_back_fetches_every_page_then_validates_once():
    with origin() as o:
        answer, events = await run(OFFSET, {"api_url": o.url})
    assert answer["ok"], answer["error"]
    shaped = answer["noetl"]
    assert [r["status_code"] for r in shaped["steps"]["fetch_page"]] == [200, 200, 200, 200]
    assert [r["data"]["offset"] for r in shaped["steps"]["fetch_page"]] == [0, 10, 20, 30]
    assert [r["has_more"] for r in shaped["steps"]["check_pagination"]] == [True, True, True, False]
    assert shaped["steps"]["validate_results"] == [
        {"status": "success", "total_users": 35, "first_id": 1, "last_id": 35}
    ]
    assert step_order(events) == ["start", *["fetch_page", "check_pagination"] * 4, "validate_results", "end"]
    assert o.hits["/api/v1/users"] == 4


async def test_a_step_reached_again_past_the_servers_bound_fails_the_run_located_at_the_arc():
    with origin() as o:
        tool = playbook_tool(load(OFFSET), limits=Limits(max_step_runs=2))
        with trio.fail_after(60):
            answer = await tool.run({"api_url": o.url})
    assert not answer["ok"] and answer["error_code"] == "LIMIT_EXCEEDED"
    assert "workflow[2].next.arcs[0]: step 'fetch_page' would run 3 times; the limit is 2" in answer["error"]
    assert len(answer["noetl"]["steps"]["fetch_page"]) == 2 and "validate_results" not in answer["noetl"]["steps"]
