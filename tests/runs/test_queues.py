"""The run queue's contract, on SQLite and on a real Redis: leases, takeover after a dead worker's lease
runs out, recorded steps, compare-and-set finishing, cancelling, events."""

from __future__ import annotations

import pytest
import trio

from kit.queues import KINDS, running_queue
from kit.redis import redis_url as redis_server
from mcpipe.store import RunQueue, RunRefused, open_queue
from mcpipe.store._redis_runs import RedisRunQueue
from mcpipe.store._sqlite import SqliteRunQueue


@pytest.mark.parametrize("kind", KINDS)
async def test_a_run_is_leased_once_recorded_and_finished_once_by_its_worker(kind, tmp_path):
    with trio.fail_after(20):
        async with running_queue(kind, tmp_path) as q:
            info = await q.enqueue("mcp_pipe", {"steps": []}, principal="p", run_id="r1", by="srv")
            got = await q.lease("w1", 30, 1)
            assert got is not None and got.id == "r1" and got.status == "running" and got.attempts == 1
            assert await q.lease("w2", 30, 0.05) is None  # held: nobody else gets it
            assert await q.save("r1", "w1", {"a": {"ok": True}}, [("step_finished", {"path": "a"})])
            assert not await q.save("r1", "w2", {"b": {"ok": True}}, [])  # not w2's run
            assert (await q.renew("r1", "w1", 30)).held and not (await q.renew("r1", "w2", 30)).held
            assert await q.recorded("r1") == {"a": {"ok": True}}
            assert not await q.finish("r1", "w2", "completed", {"content": []})
            assert await q.finish("r1", "w1", "completed", {"content": [], "isError": False})
            assert not await q.finish("r1", "w1", "completed", {"content": []})  # once
            done = await q.get("r1")
            events = await q.events("r1")
    assert info.status == "queued"
    assert done is not None and done.status == "completed" and done.principal == "p"
    assert [e.type for e in events] == ["enqueued", "leased", "step_finished", "completed"]
    assert [e.worker for e in events] == ["srv", "w1", "w1", "w1"]
    assert events[-1].data == {"ok": True}


@pytest.mark.parametrize("kind", KINDS)
async def test_a_dead_workers_run_is_taken_over_after_its_lease_with_its_recorded_steps(kind, tmp_path):
    with trio.fail_after(20):
        async with running_queue(kind, tmp_path) as q:
            await q.enqueue("mcp_pipe", {}, run_id="r1")
            assert await q.lease("dead", 0.3, 1) is not None
            await q.save("r1", "dead", {"a": {"ok": True}}, [])
            # "dead" never renews: once its lease has run out, another worker takes the run over.
            with trio.fail_after(5):
                while (got := await q.lease("w2", 0.3, 0.2)) is None:
                    pass
            assert got.attempts == 2 and got.worker == "w2" and got.lapses == 1  # a lapse: "dead" held it
            assert await q.recorded("r1") == {"a": {"ok": True}}
            assert not await q.finish("r1", "dead", "completed", {})  # the stalled worker cannot finish it
            assert await q.finish("r1", "w2", "completed", {})
            leased = [e for e in await q.events("r1") if e.type == "leased"]
    assert leased[1].data == {"taken_over_from": "dead"}


@pytest.mark.parametrize("kind", KINDS)
async def test_cancel_ends_a_queued_run_at_once_and_flags_a_running_one_for_its_worker(kind, tmp_path):
    with trio.fail_after(20):
        async with running_queue(kind, tmp_path) as q:
            await q.enqueue("mcp_pipe", {}, run_id="queued")
            queued = await q.cancel("queued")
            assert await q.lease("w1", 30, 0.05) is None  # a cancelled run is never leased
            await q.enqueue("mcp_pipe", {}, run_id="running")
            assert await q.lease("w1", 30, 1) is not None
            assert not (await q.renew("running", "w1", 30)).cancel
            running = await q.cancel("running")
            renewal = await q.renew("running", "w1", 30)
            missing = await q.cancel("nope")
    assert queued is not None and queued.status == "cancelled"
    assert running is not None and running.status == "running" and running.cancel
    assert renewal.held and renewal.cancel
    assert missing is None


@pytest.mark.parametrize("kind", KINDS)
async def test_events_wait_for_the_next_event_and_follow_from_a_cursor(kind, tmp_path):
    with trio.fail_after(20):
        async with running_queue(kind, tmp_path) as q:
            await q.enqueue("mcp_pipe", {}, run_id="r1")
            first = await q.events("r1")
            async with trio.open_nursery() as nursery:

                async def later() -> None:
                    await trio.sleep(0.1)
                    await q.emit("r1", "noetl-1", [("playbook_step", {"name": "x"})])

                nursery.start_soon(later)
                waited = await q.events("r1", after=first[-1].cursor, wait_s=5)
    assert [e.type for e in waited] == ["playbook_step"] and waited[0].worker == "noetl-1"
    assert waited[0].data == {"name": "x"}


@pytest.mark.parametrize("kind", KINDS)
async def test_a_run_waiting_for_input_is_requeued_once_every_question_is_answered(kind, tmp_path):
    pending = {
        "a": {"key": "both.a", "kind": "elicitation", "request": {"method": "elicitation/create"}},
        "b": {"key": "both.b", "kind": "elicitation", "request": {"method": "elicitation/create"}},
    }
    with trio.fail_after(20):
        async with running_queue(kind, tmp_path) as q:
            await q.enqueue("multi_input", {}, run_id="r1", meta={"capabilities": {"elicitation": {}}})
            assert await q.lease("w1", 30, 1) is not None
            assert not await q.suspend("r1", "w2", pending)  # not w2's run
            assert await q.suspend("r1", "w1", pending)
            assert await q.lease("w2", 30, 0.05) is None  # waiting for input: no worker takes it
            partial = await q.answer("r1", {"a": {"action": "accept"}, "zz": {"action": "accept"}})
            assert await q.lease("w2", 30, 0.05) is None
            full = await q.answer("r1", {"b": {"action": "decline"}}, by="srv")
            again = await q.lease("w2", 30, 1)
            types = [e.type for e in await q.events("r1")]
    assert partial is not None and partial.status == "input_required" and set(partial.meta["pending"]) == {"b"}
    assert full is not None and full.status == "queued" and full.meta["pending"] == {}
    assert full.meta["answers"] == {"both.a": {"action": "accept"}, "both.b": {"action": "decline"}}
    assert again is not None and again.attempts == 2 and again.meta["capabilities"] == {"elicitation": {}}
    assert again.lapses == 0  # requeued by its answers, not by a lease that ran out
    assert types == ["enqueued", "leased", "input_required", "resumed", "leased"]


async def test_finished_runs_their_steps_and_events_go_after_the_retention_and_running_ones_stay(tmp_path):
    q = open_queue(str(tmp_path / "runs.sqlite3"), retention_s=1e-6)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(q.run)
            for run_id in ("done", "busy"):
                await q.enqueue("mcp_pipe", {}, run_id=run_id)
                await q.lease("w1", 30, 1)
            await q.save("done", "w1", {"s": {"ok": True}}, [("step_finished", {"path": "s"})])
            await q.finish("done", "w1", "completed", {})
            gone = await q.sweep()
            left = [r.id for r in await q.runs()]
            steps, events = await q.recorded("done"), await q.events("done")
            nursery.cancel_scope.cancel()
    assert gone == 1 and left == ["busy"] and steps == {} and events == []


@pytest.mark.parametrize("kind", KINDS)
async def test_a_finished_run_keeps_its_answer_once_and_drops_its_recorded_steps(kind, tmp_path):
    from mcpipe.results import pipe_envelope

    answer = pipe_envelope({"ok": True, "result": "x" * 1000, "steps": {}})
    with trio.fail_after(20):
        async with running_queue(kind, tmp_path) as q:
            await q.enqueue("mcp_pipe", {}, run_id="r1")
            assert await q.lease("w1", 30, 1) is not None
            await q.save("r1", "w1", {"a": {"ok": True, "output": "y" * 1000}}, [])
            assert await q.finish("r1", "w1", "completed", answer)
            done = await q.get("r1")
            steps = await q.recorded("r1")
    assert done is not None and done.answer == answer  # the text block is written back exactly
    assert steps == {}  # a finished run is never resumed


@pytest.mark.parametrize("kind", KINDS)
async def test_arguments_or_an_answer_past_max_run_bytes_are_refused_or_kept_as_an_error(kind, tmp_path):
    with trio.fail_after(20):
        async with running_queue(kind, tmp_path, max_run_bytes=4096) as q:
            too_big = r"arguments are 50\d\d bytes; .* at most 4096 \(\[runs\] max_run_bytes\)"
            with pytest.raises(RunRefused, match=too_big):
                await q.enqueue("mcp_pipe", {"vars": {"v": "x" * 5000}})
            await q.enqueue("mcp_pipe", {}, run_id="r1")
            assert await q.lease("w1", 30, 1) is not None
            assert await q.finish("r1", "w1", "completed", {"content": [{"type": "text", "text": "x" * 5000}]})
            done = await q.get("r1")
            events = await q.events("r1")
    assert done is not None and done.status == "failed" and done.answer["isError"] is True
    assert done.answer["content"][0]["text"].startswith("OUTPUT_TOO_LARGE: the run's answer is 50")
    assert events[-1].type == "failed"


@pytest.mark.parametrize("kind", KINDS)
async def test_the_queue_drops_the_oldest_finished_runs_past_max_runs_and_max_bytes(kind, tmp_path):
    with trio.fail_after(20):
        async with running_queue(kind, tmp_path, max_runs=3, max_bytes=20_000) as q:
            for i in range(6):
                await q.enqueue("mcp_pipe", {"i": i}, run_id=f"r{i}")
                assert await q.lease("w", 30, 1) is not None
                assert await q.finish(f"r{i}", "w", "completed", {"content": [], "isError": False})
            by_count = sorted(r.id for r in await q.runs())
            # Bytes: three runs of about 6 kB fit in 20 kB; a fourth drops the oldest.
            for i in range(6, 10):
                await q.enqueue("mcp_pipe", {"v": "x" * 6000}, run_id=f"r{i}")
                assert await q.lease("w", 30, 1) is not None
                assert await q.finish(f"r{i}", "w", "completed", {"content": [], "isError": False})
            by_bytes = sorted(r.id for r in await q.runs())
            assert isinstance(q, SqliteRunQueue | RedisRunQueue)
            count, total = await q.usage()
            old_events = await q.events("r0")
    assert by_count == ["r3", "r4", "r5"]
    assert by_bytes == ["r7", "r8", "r9"] and count == 3 and total <= 20_000
    assert old_events == []  # a dropped run's events go with it


@pytest.mark.parametrize("kind", KINDS)
async def test_a_queue_full_of_live_runs_refuses_a_new_one_and_takes_it_once_one_has_finished(kind, tmp_path):
    with trio.fail_after(20):
        async with running_queue(kind, tmp_path, max_runs=2) as q:
            await q.enqueue("mcp_pipe", {}, run_id="r1")
            await q.enqueue("mcp_pipe", {}, run_id="r2")
            with pytest.raises(RunRefused) as refused:
                await q.enqueue("mcp_pipe", {}, run_id="r3")
            assert await q.lease("w", 30, 1) is not None
            assert await q.finish("r1", "w", "completed", {"content": []})
            await q.enqueue("mcp_pipe", {}, run_id="r3")  # r1 finished: it goes, r3 comes
            kept = sorted(r.id for r in await q.runs())
    assert str(refused.value) == (
        "the run queue is full: 2 runs are queued or running, the most it keeps is 2 ([runs] max_runs); "
        "try again once some have finished"
    )
    assert kept == ["r2", "r3"]


@pytest.mark.parametrize("kind", KINDS)
async def test_one_principal_cannot_have_more_live_runs_than_its_quota_and_others_still_can(kind, tmp_path):
    with trio.fail_after(20):
        async with running_queue(kind, tmp_path, max_runs=10, max_runs_per_principal=3) as q:
            for i in range(3):
                await q.enqueue("mcp_pipe", {}, principal="mallory", run_id=f"m{i}")
            with pytest.raises(RunRefused) as refused:
                await q.enqueue("mcp_pipe", {}, principal="mallory", run_id="m3")
            for i in range(3):  # everyone else still gets runs
                await q.enqueue("mcp_pipe", {}, principal=f"p{i}", run_id=f"p{i}")
            await q.enqueue("mcp_pipe", {}, run_id="anonymous")
            assert (await q.cancel("m0")) is not None  # a finished run no longer counts
            await q.enqueue("mcp_pipe", {}, principal="mallory", run_id="m3")
    assert str(refused.value) == (
        "principal 'mallory' has 3 runs queued, running or waiting for input; one principal may have at most 3 "
        "([runs] max_runs_per_principal); try again once some have finished"
    )


@pytest.mark.parametrize("kind", KINDS)
async def test_one_principals_live_runs_are_bounded_in_bytes(kind, tmp_path):
    with trio.fail_after(20):
        async with running_queue(kind, tmp_path, max_bytes_per_principal=10_000) as q:
            await q.enqueue("mcp_pipe", {"v": "x" * 6000}, principal="mallory")
            with pytest.raises(RunRefused, match=r"\(\[runs\] max_bytes_per_principal\)"):
                await q.enqueue("mcp_pipe", {"v": "x" * 6000}, principal="mallory")
            await q.enqueue("mcp_pipe", {"v": "x" * 6000}, principal="alice")


async def _park(q: RunQueue, run_id: str, principal: str) -> None:
    """Queue a run and leave it waiting for its client's input (as a task that asked)."""
    await q.enqueue("confirm", {}, principal=principal, run_id=run_id, meta={"capabilities": {}})
    got = await q.lease("w", 30, 1)
    assert got is not None and got.id == run_id
    assert await q.suspend(run_id, "w", {"q1": {"key": "confirm", "request": {"method": "elicitation/create"}}})


@pytest.mark.parametrize("kind", KINDS)
async def test_a_run_waiting_for_input_past_parked_ttl_fails_and_frees_its_principals_room(kind, tmp_path):
    with trio.fail_after(20):
        async with running_queue(kind, tmp_path, max_runs_per_principal=2, parked_ttl_s=0.5) as q:
            await _park(q, "a", "mallory")
            await _park(q, "b", "mallory")
            with pytest.raises(RunRefused):
                await q.enqueue("mcp_pipe", {}, principal="mallory", run_id="c")
            await trio.sleep(0.6)
            await q.enqueue("mcp_pipe", {}, principal="mallory", run_id="c")  # the parked runs expired first
            late = await q.answer("a", {"q1": {"action": "accept"}})
            expired = await q.get("b")
            events = await q.events("b")
    for info in (late, expired):
        assert info is not None and info.status == "failed"
        assert info.answer["error"]["code"] == -32001
        assert info.answer["error"]["message"].startswith(
            "TIMEOUT: the run waited for its client's input for more than 0.5 s ([runs] parked_ttl_s)"
        )
    assert events[-1].type == "failed" and events[-1].data == {"ok": False, "expired": True}


@pytest.mark.parametrize("kind", KINDS)
async def test_parked_runs_past_their_time_expire_when_a_server_starts_again(kind, tmp_path):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            if kind == "sqlite":
                url = str(tmp_path / "runs.sqlite3")
                queue = open_queue(url, parked_ttl_s=0.3)
                await nursery.start(queue.run)
                await _park(queue, "a", "mallory")
                nursery.cancel_scope.cancel()
            else:
                async with redis_server(tmp_path) as url:
                    async with trio.open_nursery() as inner:
                        queue = open_queue(url, prefix="t", parked_ttl_s=0.3)
                        await inner.start(queue.run)
                        await _park(queue, "a", "mallory")
                        inner.cancel_scope.cancel()
                    await trio.sleep(0.4)  # no server runs meanwhile
                    async with trio.open_nursery() as inner:
                        again = open_queue(url, prefix="t", parked_ttl_s=0.3)
                        await inner.start(again.run)  # sweeps once when it starts
                        after = await again.get("a")
                        inner.cancel_scope.cancel()
        if kind == "sqlite":
            await trio.sleep(0.4)
            async with trio.open_nursery() as nursery:
                again = open_queue(url, parked_ttl_s=0.3)
                await nursery.start(again.run)
                after = await again.get("a")
                nursery.cancel_scope.cancel()
    assert after is not None and after.status == "failed" and after.answer["error"]["code"] == -32001


@pytest.mark.parametrize("kind", KINDS)
async def test_a_runs_events_are_bounded_in_count_and_bytes_and_charged_to_it(kind, tmp_path):
    with trio.fail_after(30):
        async with running_queue(kind, tmp_path, max_run_events=50, max_run_bytes=64 * 1024) as q:
            await q.enqueue("mcp_pipe", {}, run_id="r1")
            assert await q.lease("w", 30, 1) is not None
            before = (await q.usage())[1]
            path = "p" * 40_000  # a 40 KB step id, as the attack had
            for i in range(20):
                batch = [("step_started", {"path": f"{path}/{i}/{j}"}) for j in range(10)]
                assert await q.save("r1", "w", {}, batch)
            after = (await q.usage())[1]
            assert await q.finish("r1", "w", "completed", {"content": [], "isError": False})
            events = await q.events("r1", limit=1000)
            small = await q.enqueue("mcp_pipe", {}, run_id="r2")
            assert await q.lease("w", 30, 1) is not None
            for i in range(100):
                await q.emit("r2", "producer", [("custom", {"i": i})])
            many = await q.events("r2", limit=1000)
    types = [e.type for e in events]
    assert types.count("events_dropped") == 1 and types[-1] == "completed"
    assert len(events) <= 50 + 2
    cut = events[2].data["path"]
    assert len(cut) < 400 and cut.endswith("(40004 characters)")
    assert 0 < after - before <= 64 * 1024  # charged, within the run's bytes
    assert small.id == "r2"
    assert [e.type for e in many].count("custom") == 50 - 2  # enqueued, leased, then custom up to 50
    assert many[-1].type == "events_dropped" and many[-1].data == {"limit": "[runs] max_run_events"}
