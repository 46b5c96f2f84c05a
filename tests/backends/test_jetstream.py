"""JetStream through mcpipe's NATS client (``mcpipe.backends.jetstream``) against a real ``nats-server -js``: the
key/value store and the object store, and what nats-py (NoETL's client, asyncio, run in a thread) reads of what
mcpipe wrote and the other way round."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import nats
import pytest
import trio

from kit.realservers import nats_server
from mcpipe.backends.jetstream import JetStream, JetStreamError
from mcpipe.backends.nats import NatsError, open_nats


@pytest.fixture(scope="module")
def js_url() -> Iterator[str]:
    with nats_server(jetstream=True) as url:
        yield url


@pytest.fixture
async def js(js_url: str) -> AsyncIterator[JetStream]:
    async with open_nats(js_url) as client:
        yield JetStream(client)


def nats_py(url: str, work: Any) -> Any:
    """``work(js)`` with nats-py's JetStream context, in a thread of its own (nats-py runs on asyncio)."""

    async def main() -> Any:
        nc = await nats.connect(url)
        try:
            return await work(nc.jetstream())
        finally:
            await nc.close()

    return asyncio.run(main())


async def test_a_key_is_put_read_deleted_and_purged(js: JetStream) -> None:
    with trio.fail_after(20):
        kv = await js.create_key_value("kv_basic", history=5)
        r1 = await kv.put("session.1", b'{"user": 1}')
        r2 = await kv.put("session.1", b'{"user": 2}')
        got = await kv.get("session.1")
        assert got is not None and got.value == b'{"user": 2}' and got.revision == r2 > r1
        assert await kv.get("nobody") is None
        await kv.put("session.2", b"two")
        assert sorted(await kv.keys()) == ["session.1", "session.2"]
        await kv.delete("session.1")
        assert await kv.get("session.1") is None
        assert await kv.keys() == ["session.2"]
        await kv.purge("session.2")
        assert await kv.get("session.2") is None and await kv.keys() == []


async def test_a_bucket_that_does_not_exist_and_a_bad_key_are_clear_errors(js: JetStream) -> None:
    with trio.fail_after(20):
        with pytest.raises(JetStreamError, match=r"no key/value bucket `missing` \(no stream KV_missing\)") as e:
            await js.key_value("missing")
        assert e.value.not_found
        kv = await js.create_key_value("kv_keys")
        with pytest.raises(JetStreamError, match="invalid key"):
            await kv.put("has space", b"x")
        with pytest.raises(JetStreamError, match="no JetStream stream holds subject"):
            await js.publish("nowhere.at.all", b"x")


async def test_without_jetstream_the_server_says_so(nats_url: str) -> None:
    with trio.fail_after(20):
        async with open_nats(nats_url) as client:
            with pytest.raises(JetStreamError, match="JetStream is not enabled"):
                await JetStream(client, timeout_s=2).key_value("any")


async def test_what_mcpipe_puts_nats_py_reads_and_the_other_way_round(js: JetStream, js_url: str) -> None:
    with trio.fail_after(30):
        kv = await js.create_key_value("kv_interop")
        await kv.put("from.mcpipe", b"hello")
        await kv.put("gone", b"soon")
        await kv.delete("gone")

        async def read_and_write(jsc: Any) -> Any:
            b = await jsc.key_value("kv_interop")
            mine = (await b.get("from.mcpipe")).value
            try:
                await b.get("gone")
                deleted = False
            except nats.js.errors.KeyNotFoundError:
                deleted = True
            await b.put("from.nats_py", b"world")
            return mine, deleted, sorted(await b.keys())

        mine, deleted, keys = await trio.to_thread.run_sync(nats_py, js_url, read_and_write)
        assert mine == b"hello" and deleted and keys == ["from.mcpipe", "from.nats_py"]
        theirs = await kv.get("from.nats_py")
        assert theirs is not None and theirs.value == b"world"


async def test_an_object_is_stored_in_chunks_read_back_listed_and_deleted(js: JetStream, js_url: str) -> None:
    with trio.fail_after(30):
        store = await js.create_object_store("reports")
        big = bytes(range(256)) * 2000  # 512,000 bytes: four chunks
        info = await store.put("big.bin", big)
        assert info["size"] == len(big) and info["chunks"] == 4 and info["digest"].startswith("SHA-256=")
        await store.put("small.txt", b"first")
        await store.put("small.txt", b"second")  # replaces it; the old chunks are dropped
        got = await store.get("big.bin")
        assert got is not None and got[1] == big
        small = await store.get("small.txt")
        assert small is not None and small[1] == b"second"
        assert sorted(i["name"] for i in await store.list()) == ["big.bin", "small.txt"]

        async def read(jsc: Any) -> Any:
            obs = await jsc.object_store("reports")
            await obs.put("from.nats_py", b"theirs")
            return (await obs.get("big.bin")).data

        assert await trio.to_thread.run_sync(nats_py, js_url, read) == big
        theirs = await store.get("from.nats_py")
        assert theirs is not None and theirs[1] == b"theirs"
        assert await store.delete("small.txt") is True
        assert await store.get("small.txt") is None and await store.delete("small.txt") is False
        assert sorted(i["name"] for i in await store.list()) == ["big.bin", "from.nats_py"]


async def test_a_listing_larger_than_its_bound_is_refused(js: JetStream) -> None:
    with trio.fail_after(30):
        kv = await js.create_key_value("kv_many")
        for i in range(12):
            await kv.put(f"k{i}", b"v")
        with pytest.raises(JetStreamError, match="more than 10 messages") as e:
            await js.consume("KV_kv_many", "$KV.kv_many.>", last_per_subject=True, headers_only=True, limit=10)
        assert e.value.code == "LIMIT_EXCEEDED"
        assert len(await kv.keys()) == 12


async def test_a_connection_refused_is_a_nats_error() -> None:
    with trio.fail_after(20), pytest.raises(NatsError, match="cannot connect to NATS"):
        async with open_nats("nats://127.0.0.1:1", connect_timeout_s=2):
            pass
