"""The OAuth token stores (memory, a SQLite file, a real Redis on 127.0.0.1) behind one interface, and the
vault that seals what they keep: a value opens only under the key it was sealed for, with the key ring it was
sealed with (or one that still holds that key)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from kit.redis import redis_url
from mcpipe.store.tokens import TokenStore, Vault, VaultError, open_token_store, principal_key


@asynccontextmanager
async def _store(kind: str, tmp_path: Path) -> AsyncIterator[TokenStore]:
    if kind == "redis":
        async with redis_url(tmp_path) as url:
            store = open_token_store(url, prefix="t")
            async with trio.open_nursery() as nursery:
                await nursery.start(store.run)
                yield store
                nursery.cancel_scope.cancel()
        return
    store = open_token_store("memory://" if kind == "memory" else f"sqlite:///{tmp_path}/t.db")
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        yield store
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis"])
async def test_every_store_keeps_gets_lists_deletes_and_expires(kind: str, tmp_path: Path):
    async with _store(kind, tmp_path) as store:
        await store.put("token:a:1", b"one")
        await store.put("token:a:2", b"two", time.time() + 600)
        await store.put("token:b_%:3", b"three")
        await store.put("pending:x", b"gone", time.time() - 1)
        assert await store.get("token:a:1") == b"one"
        assert await store.keys("token:a:") == ["token:a:1", "token:a:2"]
        assert await store.keys("token:b_%") == ["token:b_%:3"]  # LIKE's wildcards are matched as themselves
        assert await store.get("pending:x") is None and await store.keys("pending:") == []
        assert await store.delete("token:a:1") and not await store.delete("token:a:1")
        await store.put("token:a:2", b"again")
        assert await store.get("token:a:2") == b"again"


async def test_a_sqlite_store_keeps_its_entries_across_a_restart_in_a_private_file(tmp_path: Path):
    async with _store("sqlite", tmp_path) as store:
        await store.put("token:a", b"kept")
    async with _store("sqlite", tmp_path) as store:
        assert await store.get("token:a") == b"kept"
    assert (tmp_path / "t.db").stat().st_mode & 0o077 == 0


def test_a_sealed_value_opens_only_under_its_own_key_and_with_its_ring():
    vault = Vault(["first-key-of-the-ring-0123456789abcdef"])
    sealed = vault.seal("token:down:alice", b"secret")
    assert vault.open("token:down:alice", sealed) == b"secret"
    assert b"secret" not in sealed
    with pytest.raises(VaultError):
        vault.open("token:down:bob", sealed)  # moved to another principal's entry
    with pytest.raises(VaultError):
        Vault(["another-key-entirely-0123456789abcdef"]).open("token:down:alice", sealed)
    rotated = Vault(["a-new-key-that-seals-now-0123456789ab", "first-key-of-the-ring-0123456789abcdef"])
    assert rotated.open("token:down:alice", sealed) == b"secret"
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(VaultError):
        vault.open("token:down:alice", tampered)


def test_a_short_key_is_refused_and_keys_never_hold_a_principal():
    with pytest.raises(VaultError, match="32 bytes"):
        Vault(["short"])
    assert "alice" not in principal_key("alice") and principal_key("alice") != principal_key("bob")


def test_an_unknown_store_url_is_refused():
    with pytest.raises(ValueError, match="no token store"):
        open_token_store("ftp://x")


async def test_a_sqlite_store_ending_while_a_call_runs_in_its_thread_closes_only_after_that_call(tmp_path: Path):
    # Closing the connection under a running statement crashed the process (a segfault in sqlite): the store's
    # run task is cancelled at shutdown while another task's call may still be in its thread.
    store = open_token_store(f"sqlite:///{tmp_path}/t.db")
    in_thread = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def slow(db):
        token.run_sync_soon(in_thread.set)
        time.sleep(0.3)
        return db.execute("SELECT count(*) FROM oauth").fetchone()[0]

    got: list[int] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as outer:
            runner = trio.CancelScope()

            async def run_store() -> None:
                with runner:
                    await store.run()

            outer.start_soon(run_store)

            async def call() -> None:
                got.append(await store._do(slow))

            outer.start_soon(call)
            await in_thread.wait()
            runner.cancel()  # the store ends while the call is in its thread
    assert got == [0]
    assert store._db is None
