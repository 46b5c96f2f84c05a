"""The run queue's filtered pages (what the console's runs list reads), on SQLite and on a real Redis: filters
by status, tool, principal and time, newest first, paged by cursor without repeats or gaps, and the depth."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from kit.queues import KINDS, running_queue
from kit.redis import redis_url
from mcpipe.store import RunQueue, open_queue


async def _fill(q: RunQueue) -> list[str]:
    """12 runs: targets alternate, principals a, b, anonymous in turn; r0..r3 finished (completed/failed)."""
    ids = []
    for i in range(12):
        principal = ("a", "b", None)[i % 3]
        await q.enqueue("mcp_pipe" if i % 2 == 0 else "report", {"i": i}, principal=principal, run_id=f"r{i}")
        ids.append(f"r{i}")
    for i in range(4):
        got = await q.lease("w", 30, 0)
        assert got is not None
        await q.finish(got.id, "w", "completed" if i % 2 == 0 else "failed", {"content": []})
    return ids


async def _all_pages(q: RunQueue, **filters: Any) -> list[str]:
    seen: list[str] = []
    before = None
    for _ in range(50):
        page = await q.page(before=before, limit=5, **filters)
        seen += [r.id for r in page.runs]
        before = page.next
        if before is None:
            return seen
    raise AssertionError("the pages never ended")


@pytest.mark.parametrize("kind", KINDS)
async def test_pages_of_runs_are_newest_first_filtered_and_cursor_paged_without_repeats(kind, tmp_path):
    with trio.fail_after(30):
        async with running_queue(kind, tmp_path) as q:
            ids = await _fill(q)
            everything = await _all_pages(q)
            pipes = await _all_pages(q, target="mcp_pipe")
            of_a = await _all_pages(q, principals=("a",))
            anonymous = await _all_pages(q, principals=(None,))
            a_or_b = await _all_pages(q, principals=("a", "b"))
            failed = await _all_pages(q, status="failed")
            queued = await _all_pages(q, status="queued", target="report")
            nobody = await q.page(principals=())
            first = await q.page(limit=3)
            counts = await q.counts()
            r5 = await q.get("r5")
            assert r5 is not None
            newer = await _all_pages(q, since=r5.created)
            older = await _all_pages(q, until=r5.created)
    assert everything == ids[::-1]
    assert pipes == [f"r{i}" for i in range(11, -1, -1) if i % 2 == 0]
    assert of_a == ["r9", "r6", "r3", "r0"]
    assert anonymous == ["r11", "r8", "r5", "r2"]
    assert a_or_b == [f"r{i}" for i in range(11, -1, -1) if i % 3 != 2]
    assert failed == ["r3", "r1"]
    assert queued == ["r11", "r9", "r7", "r5"]
    assert nobody.runs == [] and nobody.next is None
    assert [r.id for r in first.runs] == ["r11", "r10", "r9"] and first.next is not None
    assert first.runs[0].args is None and first.runs[0].answer is None  # a page carries no arguments or answers
    assert newer == [f"r{i}" for i in range(11, 4, -1)]
    assert older == [f"r{i}" for i in range(4, -1, -1)]
    if kind == "sqlite":
        assert counts == {"queued": 8, "completed": 2, "failed": 2}
    else:
        assert counts == {"queued": 8, "finished": 4}


async def test_a_redis_page_looks_only_at_the_runs_of_its_filters_facet_and_older_runs_get_facets_once(tmp_path):
    """A rare tool, principal or status among many runs is found without looking at the others (``scanned``):
    the page reads the smallest facet its filters name; runs enqueued before there were facets get theirs the
    first time a page is asked for."""
    import coredis

    async def rare(q: RunQueue) -> list[tuple[list[str], int]]:
        out = []
        for filters in ({"target": "nightly"}, {"principals": ("b",)}, {"status": "completed"},
                        {"target": "nightly", "status": "queued"}, {"target": "nope"}):  # fmt: skip
            page = await q.page(limit=50, **filters)
            out.append(([r.id for r in page.runs], page.scanned))
        return out

    with trio.fail_after(60):
        async with redis_url(tmp_path) as url, trio.open_nursery() as nursery:
            q = open_queue(url, prefix="t")
            await nursery.start(q.run)
            for i in range(3):
                await q.enqueue("nightly", {}, principal="b", run_id=f"n{i}")
            for i in range(200):
                await q.enqueue("report", {}, principal="a", run_id=f"r{i}")
            got = await q.lease("w", 30, 0)  # the oldest: n0
            assert got is not None and got.id == "n0"
            await q.finish(got.id, "w", "completed", {"content": []})
            with_facets = await rare(q)
            raw: coredis.Redis[str] = coredis.Redis.from_url(url, decode_responses=True)
            async with raw:
                facets = sorted(await raw.smembers("t:runs:facets"))
                await raw.delete([*facets, "t:runs:facets", "t:runs:facets:v1"])  # as before there were facets
            again = open_queue(url, prefix="t")
            await nursery.start(again.run)
            backfilled = await rare(again)
            nursery.cancel_scope.cancel()
    expected = [(["n2", "n1", "n0"], 3), (["n2", "n1", "n0"], 3), (["n0"], 1), (["n2", "n1"], 3), ([], 0)]
    assert with_facets == expected
    assert backfilled == expected
    assert facets == [
        "t:runs:by:principal:a", "t:runs:by:principal:b", "t:runs:by:status:completed", "t:runs:by:status:queued",
        "t:runs:by:status:running", "t:runs:by:target:nightly", "t:runs:by:target:report",
    ]  # fmt: skip
