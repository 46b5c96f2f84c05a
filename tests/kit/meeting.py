"""A meeting of concurrent calls, for the ``wait`` tools of the FastMCP test servers (``fastmcp_host.py``,
``fastmcp3_server.py``, which imports it as ``meeting``, beside it): anyio only, so a server on fastmcp 3's own
environment imports it too."""

from __future__ import annotations

import anyio


class Meeting:
    """The ``wait`` calls in at once: each is held, after its sleep, until ``together`` of them have been in
    at the same time (at most ``MEET_S``), and answers how many it saw; so a test shows that two waits ran
    side by side without timing them, however the host schedules their requests."""

    MEET_S = 10.0

    def __init__(self) -> None:
        self.inside: list[list[int]] = []  # each wait in: [how many it has seen in at once]
        self.changed = anyio.Event()

    async def wait(self, ms: int, together: int) -> dict[str, int]:
        mine = [0]
        self.inside.append(mine)
        for seen in self.inside:  # every wait in now has seen this many in at once, however late it wakes
            seen[0] = max(seen[0], len(self.inside))
        self.changed.set()
        self.changed = anyio.Event()
        try:
            await anyio.sleep(ms / 1000)
            with anyio.move_on_after(self.MEET_S):
                while mine[0] < together:
                    await self.changed.wait()
        finally:
            self.inside = [seen for seen in self.inside if seen is not mine]
        return {"slept": ms, "met": mine[0]}
