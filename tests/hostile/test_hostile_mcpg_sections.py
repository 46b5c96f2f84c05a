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
    sync = RegistrySync(config.registries, downstreams=None, credentials=None, trust=None)  # type: ignore[arg-type]
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
