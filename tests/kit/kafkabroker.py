"""A small Kafka-protocol broker for the tests: one node, topics created on first use, logs in memory.

No Kafka broker is packaged in Debian, so the tests run this one, in a process of its own on a free
127.0.0.1 port (``python kafkabroker.py PORT``). It speaks what mcpipe's client uses, in the versions a real
broker answers (ApiVersions v0, Metadata v4, Produce v3, Fetch v4 with long polling, ListOffsets v1), keeps
record batches as the producer sent them (only their base offset is assigned, as Kafka does), and refuses a
batch whose format is not 2 or whose CRC-32C is wrong, as Kafka does. It shares no code with the client:
its CRC-32C is computed bit by bit, its codec is written here.
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass, field
from typing import Any

import trio

SUPPORTED = {0: (3, 3), 1: (4, 4), 2: (1, 1), 3: (4, 4), 18: (0, 0)}
PARTITIONS = 2


def crc32c_bitwise(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


class Buf:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return v

    def string(self) -> str | None:
        v = self._sized(">h")
        return None if v is None else v.decode()

    def blob(self) -> bytes | None:
        return self._sized(">i")

    def _sized(self, length: str) -> bytes | None:
        """Bytes after their length (``length``, a struct format); None for the length -1 (null)."""
        n = self.take(length)
        if n < 0:
            return None
        v = self.data[self.pos : self.pos + n]
        self.pos += n
        return v


def s16(v: str | None) -> bytes:
    if v is None:
        return struct.pack(">h", -1)
    raw = v.encode()
    return struct.pack(">h", len(raw)) + raw


def arr(items: list[bytes]) -> bytes:
    return struct.pack(">i", len(items)) + b"".join(items)


@dataclass
class Partition:
    batches: list[tuple[int, int, bytes]] = field(default_factory=list)  # base offset, count, batch
    next_offset: int = 0
    grew: trio.Event = field(default_factory=trio.Event)

    def append(self, batch: bytes) -> int:
        (count,) = struct.unpack_from(">i", batch, 57)
        base = self.next_offset
        self.batches.append((base, count, struct.pack(">q", base) + batch[8:]))
        self.next_offset += count
        self.grew.set()
        self.grew = trio.Event()
        return base


class Broker:
    """The broker. A test may run one in its own Trio run (``await nursery.start(Broker(0).serve)`` answers the
    port) to watch the connections clients open: ``accepted`` so far, ``open`` now, ``await until(...)``."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.topics: dict[str, list[Partition]] = {}
        self.accepted = 0
        self.open = 0
        self._changed = trio.Event()

    def topic(self, name: str) -> list[Partition]:
        return self.topics.setdefault(name, [Partition() for _ in range(PARTITIONS)])

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve on ``port`` (0: a free one, advertised in Metadata as it is); reports the port when listening."""
        listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self.connection, listeners)

    async def until(self, check: Any) -> None:
        """Wait until ``check()`` holds, checked again each time a connection opens or closes."""
        while not check():
            await self._changed.wait()

    def _count(self, opened: int) -> None:
        self.accepted += max(opened, 0)
        self.open += opened
        self._changed.set()
        self._changed = trio.Event()

    async def connection(self, stream: trio.SocketStream) -> None:
        self._count(1)
        try:
            await self._serve_connection(stream)
        finally:
            self._count(-1)

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        buf = bytearray()
        try:
            while True:
                while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">i", buf)[0]:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        return
                    buf += chunk
                (size,) = struct.unpack_from(">i", buf)
                frame = bytes(buf[4 : 4 + size])
                del buf[: 4 + size]
                b = Buf(frame)
                api, version, cid = b.take(">h"), b.take(">h"), b.take(">i")
                b.string()  # client id
                lo, hi = SUPPORTED.get(api, (0, -1))
                if api == 18:
                    body = self.api_versions(0 if lo <= version <= hi else 35)
                elif not lo <= version <= hi:
                    return  # Kafka closes the connection on an unsupported version
                else:
                    body = await {0: self.produce, 1: self.fetch, 2: self.list_offsets, 3: self.metadata}[api](b)
                out = struct.pack(">i", cid) + body
                await stream.send_all(struct.pack(">i", len(out)) + out)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return

    def api_versions(self, error: int) -> bytes:
        items = [struct.pack(">hhh", api, lo, hi) for api, (lo, hi) in SUPPORTED.items()]
        return struct.pack(">h", error) + arr(items)

    async def metadata(self, b: Buf) -> bytes:
        n = b.take(">i")
        names = [b.string() or "" for _ in range(max(n, 0))] if n >= 0 else list(self.topics)
        b.take(">b")  # allow auto topic creation
        topics = []
        for name in names:
            parts = self.topic(name)
            entries = [
                struct.pack(">hii", 0, i, 0) + arr([struct.pack(">i", 0)]) + arr([struct.pack(">i", 0)])
                for i in range(len(parts))
            ]
            topics.append(struct.pack(">h", 0) + s16(name) + struct.pack(">b", 0) + arr(entries))
        brokers = arr([struct.pack(">i", 0) + s16("127.0.0.1") + struct.pack(">i", self.port) + s16(None)])
        return struct.pack(">i", 0) + brokers + s16("mcpipe-test-cluster") + struct.pack(">i", 0) + arr(topics)

    async def produce(self, b: Buf) -> bytes:
        b.string()  # transactional id
        b.take(">h")  # acks
        b.take(">i")  # timeout
        responses = []
        for _ in range(b.take(">i")):
            name = b.string() or ""
            parts = self.topic(name)
            out = []
            for _ in range(b.take(">i")):
                index = b.take(">i")
                records = b.blob() or b""
                error, base = self.check(records), -1
                if error == 0 and not 0 <= index < len(parts):
                    error = 3
                if error == 0:
                    base = parts[index].append(records)
                out.append(struct.pack(">ihqq", index, error, base, -1))
            responses.append(s16(name) + arr(out))
        return arr(responses) + struct.pack(">i", 0)

    @staticmethod
    def check(batch: bytes) -> int:
        """Kafka's checks of a produced batch: format 2 and a good CRC-32C (else CORRUPT_MESSAGE)."""
        if len(batch) < 61 or batch[16] != 2:
            return 2
        (length,) = struct.unpack_from(">i", batch, 8)
        (crc,) = struct.unpack_from(">I", batch, 17)
        if 12 + length != len(batch) or crc32c_bitwise(batch[21:]) != crc:
            return 2
        return 0

    async def fetch(self, b: Buf) -> bytes:
        b.take(">i")  # replica
        max_wait = b.take(">i")
        b.take(">i")  # min bytes
        b.take(">i")  # max bytes
        b.take(">b")  # isolation
        wanted: list[tuple[str, list[tuple[int, int]]]] = []
        for _ in range(b.take(">i")):
            name = b.string() or ""
            parts = []
            for _ in range(b.take(">i")):
                index, offset, _max = b.take(">i"), b.take(">q"), b.take(">i")
                parts.append((index, offset))
            wanted.append((name, parts))
        if max_wait > 0 and not any(self.ready(name, parts) for name, parts in wanted):
            with trio.move_on_after(max_wait / 1000):
                async with trio.open_nursery() as nursery:
                    for name, parts in wanted:
                        for index, _ in parts:
                            if name in self.topics and 0 <= index < len(self.topics[name]):
                                nursery.start_soon(self.wake, self.topics[name][index].grew, nursery.cancel_scope)
        responses = []
        for name, parts in wanted:
            out = []
            for index, offset in parts:
                logs = self.topics.get(name)
                if logs is None or not 0 <= index < len(logs):
                    out.append(struct.pack(">ihqq", index, 3, -1, -1) + arr([]) + struct.pack(">i", -1))
                    continue
                p = logs[index]
                if offset > p.next_offset:
                    out.append(
                        struct.pack(">ihqq", index, 1, p.next_offset, p.next_offset) + arr([]) + struct.pack(">i", -1)
                    )
                    continue
                data = b"".join(batch for base, count, batch in p.batches if base + count > offset)
                hw = p.next_offset
                out.append(struct.pack(">ihqq", index, 0, hw, hw) + arr([]) + struct.pack(">i", len(data)) + data)
            responses.append(s16(name) + arr(out))
        return struct.pack(">i", 0) + arr(responses)

    def ready(self, name: str, parts: list[tuple[int, int]]) -> bool:
        logs = self.topics.get(name, [])
        return any(0 <= i < len(logs) and logs[i].next_offset > off for i, off in parts)

    @staticmethod
    async def wake(event: trio.Event, scope: trio.CancelScope) -> None:
        await event.wait()
        scope.cancel()

    async def list_offsets(self, b: Buf) -> bytes:
        b.take(">i")  # replica
        responses = []
        for _ in range(b.take(">i")):
            name = b.string() or ""
            parts = self.topic(name)
            out = []
            for _ in range(b.take(">i")):
                index, ts = b.take(">i"), b.take(">q")
                offset = parts[index].next_offset if ts == -1 else 0
                out.append(struct.pack(">ihqq", index, 0, -1, offset))
            responses.append(s16(name) + arr(out))
        return arr(responses)


async def main(port: int) -> None:
    broker = Broker(port)
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.serve)
        print(f"listening on 127.0.0.1:{port}", flush=True)


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]))
