"""The one pool of killable worker processes (:mod:`mcpipe._workerpool`): deadlines, memory limits,
respawn, shutdown and isolation per key, with a real worker program."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from mcpipe._workerpool import ExecSpawner, WorkerDied, WorkerPool, WorkerStartError, WorkerTimeout

WORKER = r"""
import os, sys, time
out = sys.stdout.buffer
out.write(b"ready\n")
out.flush()
held = []
for line in sys.stdin.buffer:
    cmd = line.strip()
    if cmd == b"pid":
        out.write(str(os.getpid()).encode() + b"\n")
    elif cmd == b"hang":
        time.sleep(3600)
    elif cmd.startswith(b"alloc "):
        held.append(bytearray(int(cmd[6:])))
        out.write(b"ok\n")
    elif cmd.startswith(b"set "):
        held.append(cmd[4:])
        out.write(b"ok\n")
    elif cmd == b"get":
        out.write(b",".join(x for x in held if isinstance(x, bytes)) + b"\n")
    out.flush()
"""
"""A worker program: ``pid`` answers its pid, ``hang`` never answers, ``alloc N`` holds N bytes, ``set X``
and ``get`` keep and show state."""

GENEROUS_S = 60.0
"""A deadline no answer of a healthy worker comes near, however loaded the machine."""

HANG_S = 0.5
"""The deadline of a call that hangs: it only has to pass."""


def pool(size: int = 2, memory_bytes: int = 0, max_reply_bytes: int = 1 << 20, reuse: bool = True) -> WorkerPool:
    return WorkerPool(
        "test",
        [sys.executable, "-c", WORKER],
        size=size,
        memory_bytes=memory_bytes,
        max_reply_bytes=max_reply_bytes,
        reuse=reuse,
    )


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process of ours that has not been reaped (a zombie counts: not cleaned up)."""
    return Path(f"/proc/{pid}").exists()


def children() -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return found


async def test_a_hung_worker_is_killed_at_its_deadline_and_the_next_call_is_served_by_a_fresh_one():
    workers = pool(size=1)
    try:
        first = int(await workers.call(b"pid", GENEROUS_S))
        with pytest.raises(WorkerTimeout, match=rf"worker pool 'test': worker {first} did not reply within 500 ms"):
            await workers.call(b"hang", HANG_S)
        assert not alive(first)
        second = int(await workers.call(b"pid", GENEROUS_S))
        assert second != first and alive(second)
    finally:
        workers.shutdown()


def test_a_hung_worker_called_from_a_thread_is_killed_at_its_deadline_and_replaced():
    workers = pool(size=1)
    try:
        first = int(workers.call_blocking(b"pid", GENEROUS_S))
        with pytest.raises(WorkerTimeout, match="did not reply within 500 ms"):
            workers.call_blocking(b"hang", HANG_S)
        assert not alive(first)
        assert int(workers.call_blocking(b"pid", GENEROUS_S)) != first
    finally:
        workers.shutdown()


async def test_a_worker_over_its_memory_limit_is_killed_with_a_located_error():
    workers = pool(size=1, memory_bytes=256 * 1024 * 1024)
    try:
        pid = int(await workers.call(b"pid", GENEROUS_S))
        assert await workers.call(b"alloc 1000000", GENEROUS_S) == b"ok"  # 1 MB: within the limit
        with pytest.raises(WorkerDied) as failed:
            await workers.call(b"alloc 4000000000", GENEROUS_S)  # 4 GB: MemoryError ends it
        message = str(failed.value)
        assert message.startswith(f"worker pool 'test': worker {pid} ended without a reply (exit status 1;")
        assert "its memory limit: 256 MB" in message and failed.value.returncode == 1
        assert not alive(pid)
        assert int(await workers.call(b"pid", GENEROUS_S)) != pid
    finally:
        workers.shutdown()


async def test_a_reply_longer_than_the_limit_kills_its_worker():
    workers = pool(size=1, max_reply_bytes=8)
    try:
        pid = int(await workers.call(b"pid", GENEROUS_S))
        with pytest.raises(WorkerDied, match="reply is longer than 8 bytes") as failed:
            await workers.call(b"set " + b"x" * 100, GENEROUS_S)
            await workers.call(b"get", GENEROUS_S)
        assert failed.value.too_large
        assert not alive(pid)
    finally:
        workers.shutdown()


async def test_shutdown_leaves_no_child_processes_even_with_a_call_in_flight():
    workers = pool(size=3)
    before = children()
    pids = {int(await workers.call(b"pid", GENEROUS_S, key=k)) for k in ("a", "b", "c")}
    failed: list[BaseException] = []

    async def hang() -> None:
        try:
            await workers.call(b"hang", GENEROUS_S, key="c")
        except WorkerDied as e:
            failed.append(e)

    with trio.fail_after(GENEROUS_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hang)
            await trio.testing.wait_all_tasks_blocked()  # the call waits on key c's worker, its request out
            assert workers.in_use() == 1
            assert set(workers.pids()) == pids
            workers.shutdown()
    assert len(failed) == 1 and "ended without a reply" in str(failed[0])
    assert len(pids) == 3
    assert not any(alive(pid) for pid in pids)
    assert workers.pids() == []
    assert children() - before == set()


async def test_two_keys_never_share_a_worker():
    workers = pool(size=2)
    try:
        await workers.call(b"set alice", GENEROUS_S, key="alice")
        await workers.call(b"set bob", GENEROUS_S, key="bob")
        assert await workers.call(b"get", GENEROUS_S, key="alice") == b"alice"
        assert await workers.call(b"get", GENEROUS_S, key="bob") == b"bob"

        seen: dict[str, set[int]] = {"alice": set(), "bob": set()}

        async def ask(key: str) -> None:
            seen[key].add(int(await workers.call(b"pid", GENEROUS_S, key=key)))

        with trio.fail_after(GENEROUS_S):
            async with trio.open_nursery() as nursery:
                for _ in range(6):
                    for key in seen:
                        nursery.start_soon(ask, key)
        assert seen["alice"] and seen["bob"] and not seen["alice"] & seen["bob"]
    finally:
        workers.shutdown()


async def test_a_full_pool_ends_another_keys_idle_worker_to_serve_a_new_key():
    workers = pool(size=1)
    try:
        await workers.call(b"set alice", GENEROUS_S, key="alice")
        alice = int(await workers.call(b"pid", GENEROUS_S, key="alice"))
        assert await workers.call(b"get", GENEROUS_S, key="bob") == b""
        assert not alive(alice)
        assert await workers.call(b"get", GENEROUS_S, key="alice") == b""  # a fresh worker: no state kept
    finally:
        workers.shutdown()


async def test_a_pool_without_reuse_serves_each_call_from_a_fresh_worker():
    workers = pool(size=2, reuse=False)
    try:
        workers.prefork(2)
        assert len(workers.pids()) == 2
        first = int(await workers.call(b"pid", GENEROUS_S))
        assert await workers.call(b"get", GENEROUS_S) == b""
        second = int(await workers.call(b"pid", GENEROUS_S))
        assert first != second and not alive(first)
    finally:
        workers.shutdown()


class _Counting(ExecSpawner):
    """A spawner of the test's worker program that counts what it made, and whose first ``broken`` workers
    are a program that exits at once (they never say ``ready``)."""

    def __init__(self, broken: int = 0, argv: list[str] | None = None) -> None:
        super().__init__(argv or [sys.executable, "-c", WORKER])
        self.made = 0
        self.broken = broken

    def spawn(self, key: object) -> Any:
        self.made += 1
        if self.broken:
            self.broken -= 1
            return ExecSpawner([sys.executable, "-c", "pass"]).spawn(key)
        return super().spawn(key)


async def test_a_pool_makes_its_workers_with_the_spawner_it_is_given():
    spawner = _Counting()
    workers = WorkerPool("spawned", spawner, size=1)
    try:
        pid = int(await workers.call(b"pid", GENEROUS_S))
        assert int(await workers.call(b"pid", GENEROUS_S)) == pid and spawner.made == 1
        with pytest.raises(WorkerTimeout, match="worker pool 'spawned'"):
            await workers.call(b"hang", HANG_S)
        assert not alive(pid)
        assert int(await workers.call(b"pid", GENEROUS_S)) != pid and spawner.made == 2
    finally:
        workers.shutdown()


async def test_a_one_shot_pool_keeps_its_spares_beyond_its_size_and_serves_the_oldest_first():
    workers = WorkerPool("spares", _Counting(), size=1, reuse=False, spares=2)
    try:
        workers.prefork(5)
        assert workers.idle() == 3  # within size + spares
        workers.shutdown()
        workers.prefork(2)
        first_forked = workers.pids()[0]
        served = int(await workers.call(b"pid", GENEROUS_S, prefork=2))
        assert served == first_forked and not alive(served)
        assert workers.idle() == 2  # topped up once the request was out
        again = {int(await workers.call(b"pid", GENEROUS_S, prefork=2)) for _ in range(4)}
        assert len(again) == 4 and served not in again
    finally:
        workers.shutdown()


async def test_an_idle_worker_that_cannot_start_gives_way_to_a_fresh_one():
    spawner = _Counting(broken=1)
    workers = WorkerPool("stale", spawner, size=1, reuse=False, spares=1)
    try:
        workers.prefork(1)  # the broken one
        assert int(await workers.call(b"pid", GENEROUS_S)) > 0
        assert spawner.made == 2
    finally:
        workers.shutdown()


async def test_a_new_worker_that_cannot_start_fails_the_call_located():
    workers = WorkerPool("broken", _Counting(argv=[sys.executable, "-c", "pass"]), size=1)
    try:
        with pytest.raises(WorkerStartError, match=r"^worker pool 'broken': worker \d+ did not start: "):
            await workers.call(b"pid", GENEROUS_S)
    finally:
        workers.shutdown()


async def test_a_deadline_that_covers_the_start_ends_a_worker_that_never_gets_ready():
    silent = [sys.executable, "-c", "import time; time.sleep(3600)"]
    workers = WorkerPool("silent", _Counting(argv=silent), size=1)
    try:
        with pytest.raises(WorkerTimeout, match="worker pool 'silent': no worker was ready within 500 ms"):
            await workers.call(b"pid", HANG_S, start_in_deadline=True)
        assert workers.pids() == [] and workers.in_use() == 0
    finally:
        workers.shutdown()
