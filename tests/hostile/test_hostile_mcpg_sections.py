"""mcpg's config sections served (registries, content stores, watches, debug tools, SQL streams) against a
hostile party: a registry that answers without end, a caller forging stream cursors. Real servers on
127.0.0.1, real HTTP."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
import trio

from mcpipe.config import parse_config
from mcpipe.server._registries import MAX_ENTRIES, MAX_RESPONSE_BYTES, RegistryError, RegistrySync

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


# --- a registry that answers without end ---------------------------------------------------------------------


@dataclass
class Hostile:
    """An HTTP/1.1 registry on 127.0.0.1: each request answered by ``body(n)`` (chunked, ``n`` the request's
    number), counting the bytes it managed to send before the client hung up."""

    body: Any
    sent: int = 0
    requests: int = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                got = await stream.receive_some(65536)
                if not got:
                    return
                data += got
            self.requests += 1
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            for piece in self.body(self.requests):
                await stream.send_all(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.sent += len(piece)
            await stream.send_all(b"0\r\n\r\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await stream.aclose()


def _sync(url: str) -> Any:
    config = parse_config(
        json.dumps({"registries": [{"name": "evil", "url": url, "allow_http": True, "allow_private": True}]}), "json"
    )
    # The crawl fails before anything is served: no downstreams, credentials or trust are reached.
    unreached: Any = None
    sync = RegistrySync(config.registries, downstreams=unreached, credentials=unreached, trust=unreached)
    return sync, config.registries[0]


async def _crawl_of(hostile: Hostile) -> tuple[str, float]:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, hostile.handle, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        sync, reg = _sync(f"http://127.0.0.1:{port}")
        started = trio.current_time()
        with pytest.raises(RegistryError) as caught, trio.fail_after(30):
            await sync.sync(reg)
        nursery.cancel_scope.cancel()
    return str(caught.value), trio.current_time() - started


async def test_a_registry_answering_an_endless_list_is_given_up_past_5_mib_not_read_whole() -> None:
    # Before: the whole body was read into memory before its size was checked (80 MiB here, as much as the
    # registry sends within 10 s in general).
    endless = Hostile(lambda _: [b'{"servers": ['] + [b'{"server": {"name": "x/y"}},' * 4096] * 800)
    why, _ = await _crawl_of(endless)
    assert "larger than 5242880 bytes" in why
    assert endless.sent <= MAX_RESPONSE_BYTES + 2 * 1024 * 1024  # what was in flight when it hung up


async def test_a_registry_paging_without_end_is_given_up_past_its_entry_bound() -> None:
    # Before: every page's entries were kept (200 pages of 2000 entries here: 400 000 entries).
    entry = b'{"server": {"name": "x/y", "version": "1"}, "_meta": {}}'
    page = b'{"servers": [' + b",".join([entry] * 2000) + b'], "metadata": {"nextCursor": "more"}}'
    paging = Hostile(lambda _: [page])
    why, _ = await _crawl_of(paging)
    assert f"more than {MAX_ENTRIES} entries" in why
    assert paging.requests <= MAX_ENTRIES // 2000 + 1


# --- a watch's notify_if over what a caller sent -------------------------------------------------------------

_QUADRATIC = (
    'subscriber.principal_id.split(",").exists(a, subscriber.principal_id.split(",").exists(b, a + b == "admin"))'
)


class _Heard:
    def __init__(self) -> None:
        self.uris: list[str] = []
        self.event = trio.Event()

    async def __call__(self, message: Any) -> None:
        import mcp_types as types

        if isinstance(message, types.ResourceUpdatedNotification):
            self.uris.append(str(message.params.uri))
            self.event.set()


def _subject_client(url: str, subject: str, handler: Any, mode: str = "legacy") -> Any:
    from contextlib import asynccontextmanager

    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    @asynccontextmanager
    async def transport() -> Any:
        async with (
            create_mcp_http_client(headers={"x-subject": subject}) as h,
            streamable_http_client(url, http_client=h) as s,
        ):
            yield s

    return Client(transport(), mode=mode, message_handler=handler)


def _probe_health(url: str, stop: Any, worst: list[float], quiet: list[float]) -> None:
    """``GET url`` from a thread (the event loop may be the thing stuck): three times into ``quiet`` (this host's
    speed before the attack), then every 50 ms into ``worst`` until ``stop`` is set."""
    import time
    import urllib.request

    def get() -> float:
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as r:
            r.read()
        return time.perf_counter() - started

    quiet += [get() for _ in range(3)]
    while not stop.is_set():
        worst.append(get())
        time.sleep(0.05)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_subscribers_own_subject_cannot_hold_the_event_loop_through_notify_if() -> None:
    # Before: notify_if ran inline on the event loop, without a deadline, for each subscriber at each change: a
    # 4.5 KB subject (1500 names) held the loop 3.4 s per webhook call (12 s for 3000 names), /healthz with it.
    import threading
    import warnings

    import httpx2

    from kit.servers import http_server
    from mcpipe.server import open_app

    doc = {
        "audit": {"enabled": False},
        "builtins": False,
        "trust": {"subject_header": "x-subject"},
        "pipelines": [
            {
                "name": "board",
                "description": "The board.",
                "surface": "resource",
                "uri": "board://main",
                "steps": [{"kind": "mock", "id": "get", "response": {"v": 1}}],
                "watch": {"webhook_tokens": ["t"], "notify_if": _QUADRATIC},
            }
        ],
    }
    admin, hostile = _Heard(), _Heard()
    stop, worst, quiet = threading.Event(), list[float](), list[float]()
    with trio.fail_after(30):
        async with (
            open_app(parse_config(json.dumps(doc), "json", environ={})) as app,
            http_server(app) as url,
            httpx2.AsyncClient() as http,
        ):
            base = url.rsplit("/mcp", 1)[0]
            async with trio.open_nursery() as nursery:
                probe = partial(_probe_health, f"{base}/healthz", stop, worst, quiet)
                nursery.start_soon(trio.to_thread.run_sync, probe)
                with trio.fail_after(20):
                    while len(quiet) < 3:  # noqa: ASYNC110 (a thread fills it: nothing to wait on)
                        await trio.sleep(0.01)
                long_subject = ",".join(["ab"] * 1500)
                clients = [_subject_client(url, "ad,min", admin), _subject_client(url, long_subject, hostile)]
                async with clients[0] as a, clients[1] as b:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        await a.subscribe_resource("board://main")
                        await b.subscribe_resource("board://main")
                    for _ in range(2):
                        assert (await http.post(f"{base}/webhooks/resource-updated/t")).status_code == 200
                    await admin.event.wait()
                    await trio.sleep(0.2)
                stop.set()
    assert admin.uris == ["board://main"] * 2 and hostile.uris == []
    # A held loop holds a probe for a whole notify_if (3.4 s before); a healthy one answers in milliseconds, a
    # loaded 2-core host now and then in a second or more: the bound is 3 s, or 10 x the slowest quiet probe.
    bound = max(3.0, 10 * max(quiet))
    assert worst and max(worst) < bound, f"/healthz took {max(worst, default=0):.2f} s (bound {bound:.1f} s)"


# --- a file-system content store's ids -----------------------------------------------------------------------


async def test_content_ids_that_name_paths_read_nothing_outside_the_store(tmp_path: Any) -> None:
    from mcpipe.store.content import ContentStores, FileContentStore

    secret = tmp_path / "secret.txt"
    secret.write_text("outside")
    store = FileContentStore(tmp_path / "store")
    stores = ContentStores({"files": store}, "files", "mcpg-resource")
    uri, stored = await stores.put(b"inside", "text/plain")
    assert (await stores.get(uri)) is not None
    for hostile in (
        "../secret.txt", "hash:../../secret.txt", str(secret), "%2e%2e/secret.txt", "hash:%2e%2e%2fsecret.txt",
        f"hash:{stored.id[5:]}\x00", "hash:\x00", "alias:../../secret.txt", "alias:__no_session__:../x",
        f"hash:{stored.id[5:].upper()}/../../../secret.txt", "files/../secret.txt", "",
    ):  # fmt: skip
        assert store.get(hostile) is None, hostile
        assert (await stores.get(f"mcpg-resource://{hostile}")) is None, hostile
        assert (await stores.get(f"mcpg-resource://files/{hostile}")) is None, hostile


# --- content another session or principal stored ---------------------------------------------------------------


def _content_doc(root: Any) -> dict[str, Any]:
    return {
        "audit": {"enabled": False},
        "builtins": False,
        "trust": {"subject_header": "x-subject"},
        "content": {
            "stores": {"files": {"kind": "file_system", "root": str(root)}},
            "default": "files",
            "scheme": "mcpg-resource",
        },
        "pipelines": [
            {
                "name": "keep",
                "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
                "steps": [{"kind": "store_content", "id": "put", "data": "${args.text}", "alias": "report"}],
            }
        ],
    }


async def _refused(client: Any, uri: str) -> bool:
    try:
        await client.read_resource(uri)
    except Exception as exc:
        assert "unknown resource" in str(exc), exc
        return True
    return False


@pytest.mark.parametrize("mode", ["legacy", "modern"])
async def test_content_another_session_or_principal_stored_is_neither_read_nor_overwritten(
    tmp_path: Any, mode: str
) -> None:
    # Before: store_content bound nothing to its caller, so anyone holding a URI read it (a hash URI, or the
    # guessable `alias:__no_session__:report`) and anyone's `report` overwrote everyone's.
    from kit.servers import http_server
    from mcpipe.server import open_app

    async def keep(client: Any, text: str) -> dict[str, Any]:
        return dict((await client.call_tool("keep", {"text": text})).structured_content or {})

    async def text(client: Any, uri: str) -> str:
        return str((await client.read_resource(uri)).contents[0].text)

    era = "legacy" if mode == "legacy" else "2026-07-28"
    with trio.fail_after(30):
        async with (
            open_app(parse_config(json.dumps(_content_doc(tmp_path)), "json", environ={})) as app,
            http_server(app) as url,
            _subject_client(url, "alice", None, era) as alice,
            _subject_client(url, "bob", None, era) as bob,
        ):
            mine = await keep(alice, "alice's secret")
            guesses = (
                mine["uri"],
                "mcpg-resource://alias:__no_session__:report",
                f"mcpg-resource://hash:{mine['content_hash'].removeprefix('blake3:')}",
            )
            refused = [await _refused(bob, uri) for uri in guesses]
            theirs = await keep(bob, "bob's overwrite")
            bobs = await text(bob, theirs["uri"])
            await keep(bob, "alice's secret")  # the same bytes: bob's own record, alice's not taken over
            after = await text(alice, mine["uri"])
    assert refused == [True, True, True]
    assert theirs["uri"] != mine["uri"] and bobs == "bob's overwrite"
    assert after == "alice's secret"


@pytest.mark.parametrize("kind", ["memory", "file_system"])
def test_an_alias_another_owner_holds_is_refused_and_the_same_bytes_keep_each_owners_record(
    tmp_path: Any, kind: str
) -> None:
    # A session id is what the caller sent (a 2026-07-28 caller may send any): naming another's session must
    # not reach its alias; and one owner's write of the same bytes must not take over another's record.
    from mcpipe.store.content import AliasTaken, FileContentStore, MemoryContentStore

    store = MemoryContentStore() if kind == "memory" else FileContentStore(tmp_path)
    alices = store.put(b"x", "text/plain", session_id="s1", tenant_id="alice", alias="report", ttl_s=60)
    with pytest.raises(AliasTaken, match="belongs to another session or principal"):
        store.put(b"y", "text/plain", session_id="s1", tenant_id="bob", alias="report")
    bobs = store.put(b"x", "text/plain", tenant_id="bob", ttl_s=0.001)
    assert alices.id == "alias:s1:report" and bobs.id != alices.id and bobs.content_hash == alices.content_hash
    content = store.get(alices.id)
    assert content is not None and content.data == b"x" and content.readable_by("s1", "alice")
    assert not content.readable_by("s1", "bob") and not content.readable_by("s2", "alice")
    assert store.put(b"z", "text/plain", tenant_id="bob", alias="report").id == "alias:~bob:report"


# --- a forged row_mode: stream cursor ------------------------------------------------------------------------


def test_a_forged_stream_cursor_is_refused_by_its_signature_before_its_body_is_decoded() -> None:
    # Before: the body was base64-decoded and parsed as JSON, then the HMAC compared: a forged 2.9 MB cursor of
    # `{"k": [0, 0, ...]}` allocated its decoded bytes and a 1.1-million-entry list (peak 40.3 MB, 13.8x the
    # token) before it was refused. Now the signature is checked first: only the body's text is hashed (5.9 MB,
    # the token's copies).
    import base64
    import tracemalloc

    from mcpipe.formats.mcpg._sqlmore import StreamCursors

    cursors = StreamCursors.of("docs.stream", {"cursor_columns": ["id"]})
    good = cursors.encode([7])
    assert cursors.decode(good) == [7]
    payload = b'{"v": 1, "b": "docs.stream", "k": [' + b"0," * 1_100_000 + b"0]}"
    forged = f"s.{base64.urlsafe_b64encode(payload).decode().rstrip('=')}.{good.rsplit('.', 1)[1]}"
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="token failed verification"):
            cursors.decode(forged)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * len(forged), f"peak {peak} for a {len(forged)}-byte cursor"
    for bad in ("s.é.x", "s.AAAA.é", "s..", "s.AAAA", "AAAA.BBBB"):
        with pytest.raises(ValueError, match="token failed verification"):
            cursors.decode(bad)
