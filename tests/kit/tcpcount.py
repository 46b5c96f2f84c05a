"""A TCP forwarder on 127.0.0.1 in front of a server, counting the connections clients open through it: where
a server does not say how many connections it holds (grpcio does not), the forwarder sees each one arrive
and each one close, as the server would."""

from __future__ import annotations

from typing import Any

import trio


class CountingForwarder:
    """Forwards every connection to ``127.0.0.1:target_port``; ``accepted`` so far, ``open`` now.

    ``port = await nursery.start(forwarder.run)``; ``await forwarder.until(lambda: forwarder.open == 0)``.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.accepted = 0
        self.open = 0
        self._changed = trio.Event()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self._forward, listeners)

    async def until(self, check: Any) -> None:
        """Wait until ``check()`` holds, checked again each time a connection opens or closes."""
        while not check():
            await self._changed.wait()

    def _count(self, opened: int) -> None:
        self.accepted += max(opened, 0)
        self.open += opened
        self._changed.set()
        self._changed = trio.Event()

    async def _forward(self, client: trio.SocketStream) -> None:
        self._count(1)
        try:
            server = await trio.open_tcp_stream("127.0.0.1", self.target_port)
            async with server, trio.open_nursery() as nursery:
                nursery.start_soon(_pump, client, server, nursery.cancel_scope)
                nursery.start_soon(_pump, server, client, nursery.cancel_scope)
        finally:
            self._count(-1)


async def _pump(source: trio.SocketStream, sink: trio.SocketStream, both: trio.CancelScope) -> None:
    """Copy until either side closes; then end both directions (the connection is over)."""
    try:
        while data := await source.receive_some(65536):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    both.cancel()
