"""NoETL's success-side retry (``retry.on_success``: pagination) on its own vendored playbooks, against NoETL's
paginated test API on 127.0.0.1 (``kit.noetl.Origin``): the request runs again while ``while`` holds, with
``next_call`` laid over it, the pages collected; a failed page is tried again (``on_error``)."""

from __future__ import annotations

from typing import Any

import trio

from kit.noetl import load, origin, run_file


async def run(rel: str, args: dict[str, Any]) -> dict[str, Any]:
    with trio.fail_after(60):
        return await run_file(rel, args)


async def test_page_number_pagination_collects_every_page_into_one_result():
    with origin() as o:
        answer = await run("tests/fixtures/playbooks/pagination/test_pagination_basic.yaml", {"api_url": o.url})
    assert answer["ok"], answer["error"]
    (fetched,) = answer["noetl"]["steps"]["fetch_all_assessments"]
    assert [item["id"] for item in fetched["data"]] == list(range(1, 36))
    assert fetched["meta"] == {"iterations": 4, "collect_strategy": "append"}
    assert [r["query"] for r in o.requests] == [f"page={n}&pageSize=10" for n in (1, 2, 3, 4)]
    assert answer["noetl"]["steps"]["validate_results"][0]["total_items"] == 35


async def test_cursor_pagination_follows_the_next_cursor_until_there_is_none():
    with origin() as o:
        answer = await run("tests/fixtures/playbooks/pagination/test_pagination_cursor.yaml", {"api_url": o.url})
    assert answer["ok"], answer["error"]
    (fetched,) = answer["noetl"]["steps"]["fetch_all_events"]
    assert [e["id"] for e in fetched["data"]] == list(range(1, 36))
    assert o.hits["/api/v1/events"] == 4


async def test_a_page_that_fails_is_tried_again_and_the_pages_after_it_still_come():
    with origin() as o:
        answer = await run("tests/fixtures/playbooks/pagination/test_pagination_retry.yaml", {"api_url": o.url})
    assert answer["ok"], answer["error"]
    (fetched,) = answer["noetl"]["steps"]["fetch_with_retry"]
    assert len(fetched["data"]) == 35
    pages = [r["query"].split("&")[0] for r in o.requests]
    assert pages == ["page=1", "page=2", "page=2", "page=3", "page=4"]  # page 2 answered 500 the first time


def test_an_on_error_when_that_noetl_does_not_read_is_a_check_warning():
    pb = load("tests/fixtures/playbooks/pagination/test_pagination_retry.yaml")
    assert any("on_error.when: NoETL's retry reads `retry_when`, not `when`" in w for w in pb.warnings)
