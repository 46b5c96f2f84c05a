"""The Redis pipeline store against a real redis-server: once-only takes and claims across instances,
expiry by Redis, and a clear error (never a crash) while Redis is down."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import pytest
import trio

from kit.redis import redis_server
from mcpipe.config import parse_config
from mcpipe.interaction import InMemoryPipelineStore, StoreUnavailable
from mcpipe.store import open_pipeline_store
from mcpipe.store.redis import RedisPipelineStore, redacted

WAIT_S = 20

coredis_leaks_on_failed_connects = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
"""coredis (6.9) leaves a connection's anyio memory streams unclosed when connecting fails; they are freed
by the garbage collector, which warns. Only the tests that stop Redis see it; they collect before they end,
so the warnings land in them and nowhere else."""


async def test_a_blob_is_taken_once_and_a_claim_wins_once(tmp_path: Path) -> None:
    with trio.fail_after(WAIT_S):
        async with redis_server(tmp_path) as redis, trio.open_nursery() as nursery:
            store = RedisPipelineStore(redis.url)
            await nursery.start(store.run)
            later = time.time() + 60
            await store.put("h1", b"state", later)
            assert await store.take("h1") == b"state"
            assert await store.take("h1") is None
            assert await store.claim("s1", later) is True
            assert await store.claim("s1", later) is False
            assert await store.sweep() == 0  # Redis expires keys itself
            nursery.cancel_scope.cancel()


async def test_of_many_instances_claiming_one_state_at_once_exactly_one_wins(tmp_path: Path) -> None:
    with trio.fail_after(WAIT_S):
        async with redis_server(tmp_path) as redis, trio.open_nursery() as nursery:
            stores = [RedisPipelineStore(redis.url) for _ in range(4)]
            for s in stores:
                await nursery.start(s.run)
            wins: list[bool] = []

            async def claim(s: RedisPipelineStore) -> None:
                wins.append(await s.claim("the-state", time.time() + 60))

            for _ in range(5):  # the same state claimed by every instance, many times over
                async with trio.open_nursery() as claims:
                    for s in stores:
                        claims.start_soon(claim, s)
            assert wins.count(True) == 1 and len(wins) == 20
            nursery.cancel_scope.cancel()


async def test_redis_expires_what_the_store_put(tmp_path: Path) -> None:
    with trio.fail_after(WAIT_S):
        async with redis_server(tmp_path) as redis, trio.open_nursery() as nursery:
            store = RedisPipelineStore(redis.url)
            await nursery.start(store.run)
            await store.put("gone", b"x", time.time() - 1)
            assert await store.take("gone") is None
            assert await store.claim("old", time.time() - 1) is False  # an expired state cannot be claimed
            nursery.cancel_scope.cancel()


@coredis_leaks_on_failed_connects
async def test_while_redis_is_down_operations_fail_clearly_and_resume_after(tmp_path: Path) -> None:
    with trio.fail_after(WAIT_S):
        async with redis_server(tmp_path) as redis, trio.open_nursery() as nursery:
            store = RedisPipelineStore(redis.url, timeout_s=1)
            await nursery.start(store.run)
            await store.put("kept", b"acknowledged", time.time() + 60)
            await redis.stop()
            for op in (store.take("kept"), store.claim("c", time.time() + 60), store.put("x", b"", time.time() + 9)):
                with pytest.raises(StoreUnavailable, match=f"pipeline store at {redis.url} is unavailable"):
                    await op
            assert await store.ping() is False
            await redis.start()
            assert await store.ping() is True
            assert await store.take("kept") == b"acknowledged"  # what Redis acknowledged survived it
            nursery.cancel_scope.cancel()
    gc.collect()


@coredis_leaks_on_failed_connects
async def test_a_store_that_is_not_running_says_so() -> None:
    store = RedisPipelineStore("redis://127.0.0.1:1/0")
    with pytest.raises(StoreUnavailable, match="not running"):
        await store.claim("x", time.time() + 5)
    gc.collect()


def test_the_password_never_shows_in_messages() -> None:
    assert redacted("redis://:s3cret@db.example:6379/2") == "redis://:***@db.example:6379/2"
    assert redacted("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_the_factory_picks_the_store_by_the_url_scheme() -> None:
    config = parse_config("[interaction]\nmax_suspended = 3\nmax_suspended_bytes = 100\nmax_claims = 7", "toml")
    memory = open_pipeline_store(config.store, config.interaction)
    assert isinstance(memory, InMemoryPipelineStore)
    assert (memory.max_states, memory.max_bytes, memory.max_claims) == (3, 100, 7)
    shared = open_pipeline_store(parse_config('[store]\nurl = "redis://127.0.0.1:6379/1"\nprefix = "p"', "toml").store)
    assert isinstance(shared, RedisPipelineStore) and shared.prefix == "p"


@pytest.mark.parametrize("url", ["postgres://x", "redis:/nope", "redis://", "memory"])
def test_a_store_url_of_no_known_kind_is_a_located_config_error(url: str) -> None:
    from mcpipe.config import ConfigError

    with pytest.raises(ConfigError) as caught:
        parse_config(f'[store]\nurl = "{url}"', "toml")
    assert [p.location for p in caught.value.problems] == ["store.url"]
