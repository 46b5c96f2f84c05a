"""The bounded accept loop (``mcpipe.server._listen``) over TLS: what a client that never finishes its
handshake leaves behind."""

from __future__ import annotations

import gc
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from hypercorn.config import Config

from kit.registry import self_signed
from mcpipe.server._listen import serve_bounded


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_a_tls_connection_whose_handshake_fails_is_closed_by_the_server_not_left_to_the_collector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # hypercorn returns from a failed handshake without closing the stream: the socket stayed open until
    # the garbage collector found it (an unclosed-socket ResourceWarning in whatever ran next).
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    cert = self_signed(tmp_path)
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.certfile, config.keyfile = str(cert), str(cert.with_suffix(".key"))
    config.accesslog = config.errorlog = None
    config.graceful_timeout = 0.1
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                lambda task_status: serve_bounded(app, config, max_connections=8, task_status=task_status)
            )
            host, port = binds[0].removeprefix("https://").rsplit(":", 1)
            for _ in range(3):
                client = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                with client:
                    await client.connect((host, int(port)))
                    await client.send(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")  # not a TLS ClientHello
                    while await client.recv(4096):  # the server answers with an alert, then closes
                        pass
            nursery.cancel_scope.cancel()
    gc.collect()
    assert [u.object for u in unraisable] == []
