"""A small Trio-native Kafka client: produce, and request/response over two topics with a correlation id.

Kafka's Python clients block or run on asyncio, and declared steps need little of Kafka, so this speaks
the wire protocol itself, in versions every broker since Kafka 0.11 and up to 4.x accepts: ApiVersions v0,
Metadata v4, Produce v3, Fetch v4, ListOffsets v1, records in batches of format v2 (CRC-32C, headers).

A request publishes its message on the request topic with a header ``correlation_id`` (also the record's
key) and waits for a record with the same ``correlation_id`` header (or key) on the response topic, read
from its end as it was just before the request went out, without a consumer group. One client per
bootstrap list is shared by every step (it keeps one connection per broker it talks to).
"""

from __future__ import annotations

import itertools
import logging
import secrets
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from mcpipe.backends._errors import BackendError

__all__ = ["KafkaClient", "KafkaError", "KafkaRecord", "crc32c", "decode_batches", "encode_batch", "parse_bootstrap"]

_log = logging.getLogger("mcpipe.backends.kafka")

API_PRODUCE, API_FETCH, API_LIST_OFFSETS, API_METADATA, API_VERSIONS = 0, 1, 2, 3, 18
VERSIONS = {API_PRODUCE: 3, API_FETCH: 4, API_LIST_OFFSETS: 1, API_METADATA: 4, API_VERSIONS: 0}
NAMES = {API_PRODUCE: "Produce", API_FETCH: "Fetch", API_LIST_OFFSETS: "ListOffsets", API_METADATA: "Metadata"}
MAX_RESPONSE = 64 * 1024 * 1024

ERRORS = {
    1: "OFFSET_OUT_OF_RANGE",
    2: "CORRUPT_MESSAGE",
    3: "UNKNOWN_TOPIC_OR_PARTITION",
    5: "LEADER_NOT_AVAILABLE",
    6: "NOT_LEADER_OR_FOLLOWER",
    7: "REQUEST_TIMED_OUT",
    10: "MESSAGE_TOO_LARGE",
    17: "INVALID_TOPIC_EXCEPTION",
    29: "TOPIC_AUTHORIZATION_FAILED",
    35: "UNSUPPORTED_VERSION",
}


class KafkaError(BackendError):
    """A Kafka operation failed; ``code`` as for the other backends (``TOOL_FAILED``, ``TOOL_ERROR``, ``TIMEOUT``)."""


def _error_name(code: int) -> str:
    return ERRORS.get(code, f"error {code}")


# --- CRC-32C, varints, record batches ---------------------------------------------------------------------


def _crc_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC = _crc_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), which record batches carry."""
    crc = 0xFFFFFFFF
    table = _CRC
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)  # zigzag
    out = bytearray()
    while True:
        b = z & 0x7F
        z >>= 7
        if z:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def _bytes_field(value: bytes | None) -> bytes:
    return _varint(-1) if value is None else _varint(len(value)) + value


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """A record: its value, key, headers, and (read back) topic, partition and offset."""

    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    topic: str = ""
    partition: int = -1
    offset: int = -1
    timestamp_ms: int = -1

    def header(self, name: str) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)


def encode_batch(records: Sequence[KafkaRecord], *, now_ms: int | None = None) -> bytes:
    """Records as one batch of format v2 (uncompressed; the broker assigns the offsets)."""
    ts = int(time.time() * 1000) if now_ms is None else now_ms
    body = bytearray()
    for i, r in enumerate(records):
        rec = bytearray(b"\x00")  # attributes
        rec += _varint(0) + _varint(i)  # timestamp delta, offset delta
        rec += _bytes_field(r.key) + _bytes_field(r.value)
        rec += _varint(len(r.headers))
        for k, v in r.headers:
            rec += _bytes_field(k.encode()) + _bytes_field(v)
        body += _varint(len(rec)) + rec
    after_crc = struct.pack(">hiqqqhii", 0, len(records) - 1, ts, ts, -1, -1, -1, len(records)) + bytes(body)
    crc = crc32c(after_crc)
    after_length = struct.pack(">ibI", 0, 2, crc) + after_crc  # leader epoch, magic, crc
    return struct.pack(">qi", 0, len(after_length)) + after_length


def decode_batches(data: bytes, topic: str = "", partition: int = -1) -> list[KafkaRecord]:
    """The records of a run of batches (format v2) as a Fetch answers them; a partial batch at the end (the
    broker may cut the last one) is left out.

    Raises:
        KafkaError: a batch of another format, a compressed batch, or a bad CRC.
    """
    out: list[KafkaRecord] = []
    pos = 0
    while pos + 12 <= len(data):
        base_offset, length = struct.unpack_from(">qi", data, pos)
        end = pos + 12 + length
        if end > len(data):
            break
        magic = data[pos + 16]
        if magic != 2:
            raise KafkaError(f"a record batch of format {magic} (only format 2 is read)")
        (crc,) = struct.unpack_from(">I", data, pos + 17)
        if crc32c(data[pos + 21 : end]) != crc:
            raise KafkaError(f"a record batch at offset {base_offset} has a bad CRC")
        attributes, _last, base_ts, _max, _pid, _epoch, _seq, count = struct.unpack_from(">hiqqqhii", data, pos + 21)
        if attributes & 0x07:
            raise KafkaError("compressed record batches are not supported")
        if attributes & 0x20:  # a control batch (transaction markers): no user records
            pos = end
            continue
        p = pos + 61
        for _ in range(count):
            _length, p = _read_varint(data, p)
            p += 1  # attributes
            ts_delta, p = _read_varint(data, p)
            offset_delta, p = _read_varint(data, p)
            key, p = _read_bytes(data, p)
            value, p = _read_bytes(data, p)
            n, p = _read_varint(data, p)
            headers = []
            for _ in range(n):
                k, p = _read_bytes(data, p)
                v, p = _read_bytes(data, p)
                headers.append(((k or b"").decode(errors="replace"), v))
            out.append(
                KafkaRecord(
                    value, key, tuple(headers), topic, partition, base_offset + offset_delta, base_ts + ts_delta
                )
            )
        pos = end
    return out


def _read_bytes(data: bytes, pos: int) -> tuple[bytes | None, int]:
    n, pos = _read_varint(data, pos)
    if n < 0:
        return None, pos
    return bytes(data[pos : pos + n]), pos + n


# --- the protocol's primitive types -----------------------------------------------------------------------


class _Writer:
    def __init__(self) -> None:
        self.buf = bytearray()

    def i8(self, v: int) -> _Writer:
        self.buf += struct.pack(">b", v)
        return self

    def i16(self, v: int) -> _Writer:
        self.buf += struct.pack(">h", v)
        return self

    def i32(self, v: int) -> _Writer:
        self.buf += struct.pack(">i", v)
        return self

    def i64(self, v: int) -> _Writer:
        self.buf += struct.pack(">q", v)
        return self

    def string(self, v: str | None) -> _Writer:
        if v is None:
            return self.i16(-1)
        raw = v.encode()
        self.i16(len(raw))
        self.buf += raw
        return self

    def bytes_(self, v: bytes | None) -> _Writer:
        if v is None:
            return self.i32(-1)
        self.i32(len(v))
        self.buf += v
        return self


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _unpack(self, fmt: str, size: int) -> int:
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return int(v)

    def i8(self) -> int:
        return self._unpack(">b", 1)

    def i16(self) -> int:
        return self._unpack(">h", 2)

    def i32(self) -> int:
        return self._unpack(">i", 4)

    def i64(self) -> int:
        return self._unpack(">q", 8)

    def string(self) -> str | None:
        n = self.i16()
        if n < 0:
            return None
        v = self.data[self.pos : self.pos + n].decode()
        self.pos += n
        return v

    def bytes_(self) -> bytes | None:
        n = self.i32()
        if n < 0:
            return None
        v = self.data[self.pos : self.pos + n]
        self.pos += n
        return bytes(v)

    def broker(self) -> tuple[int, str | None, int, str | None]:
        """Metadata's broker: node id, host, port, rack."""
        return self.i32(), self.string(), self.i32(), self.string()

    def partition(self) -> tuple[int, int, int, list[Any], list[Any]]:
        """Metadata's partition: error, index, leader, replicas, in-sync replicas."""
        return self.i16(), self.i32(), self.i32(), self.array(self.i32), self.array(self.i32)

    def array(self, item: Any) -> list[Any]:
        n = self.i32()
        return [item() for _ in range(max(n, 0))]


# --- connections ------------------------------------------------------------------------------------------


def parse_bootstrap(servers: str | Sequence[str]) -> list[tuple[str, int]]:
    """``"host:9092,host2:9092"`` (or a list) as (host, port) pairs; ``kafka://`` prefixes are allowed.

    Raises:
        ValueError: an empty list, or an entry without a valid port.
    """
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out = []
    for item in items:
        s = item.strip().removeprefix("kafka://").rstrip("/")
        if not s:
            continue
        host, sep, port = s.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"a Kafka bootstrap server is host:port, got {item.strip()!r}")
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError("no Kafka bootstrap servers")
    return out


class _BrokerConnection:
    """One TCP connection to a broker; requests are pipelined and matched to responses by correlation id."""

    def __init__(self, host: str, port: int, client_id: str) -> None:
        self.host, self.port, self.client_id = host, port, client_id
        self.stream: trio.SocketStream | None = None
        self._ids = itertools.count(1)
        self._waiting: dict[int, trio.MemorySendChannel[bytes | KafkaError]] = {}
        self._lock = trio.Lock()
        self.closed = False

    @property
    def name(self) -> str:
        return f"{self.host}:{self.port}"

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        started = False
        try:
            try:
                self.stream = await trio.open_tcp_stream(self.host, self.port)
            except OSError as e:
                raise KafkaError(f"cannot connect to the Kafka broker {self.name}: {e.strerror or e}") from None
            task_status.started()
            started = True
            buf = bytearray()
            while True:
                while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">i", buf)[0]:
                    if len(buf) >= 4 and struct.unpack_from(">i", buf)[0] > MAX_RESPONSE:
                        raise KafkaError(f"the Kafka broker {self.name} sent an oversized response")
                    chunk = await self.stream.receive_some(65536)
                    if not chunk:
                        raise KafkaError(f"the Kafka broker {self.name} closed the connection")
                    buf += chunk
                (size,) = struct.unpack_from(">i", buf)
                frame = bytes(buf[4 : 4 + size])
                del buf[: 4 + size]
                (cid,) = struct.unpack_from(">i", frame)
                chan = self._waiting.pop(cid, None)
                if chan is not None:
                    chan.send_nowait(frame[4:])
        except (KafkaError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            error = e if isinstance(e, KafkaError) else KafkaError(f"the connection to {self.name} broke: {e}")
            if not started:
                raise error from None
            for chan in self._waiting.values():
                chan.send_nowait(error)
            self._waiting.clear()
        finally:
            self.closed = True
            for chan in self._waiting.values():
                chan.send_nowait(KafkaError(f"the connection to the Kafka broker {self.name} is closed"))
            self._waiting.clear()
            if self.stream is not None:
                with trio.CancelScope(shield=True):
                    await self.stream.aclose()

    async def call(self, api: int, body: bytes) -> _Reader:
        if self.closed or self.stream is None:
            raise KafkaError(f"the connection to the Kafka broker {self.name} is closed")
        cid = next(self._ids)
        header = _Writer().i16(api).i16(VERSIONS[api]).i32(cid).string(self.client_id).buf
        frame = header + body
        send, receive = trio.open_memory_channel[bytes | KafkaError](1)
        self._waiting[cid] = send
        try:
            async with self._lock:
                await self.stream.send_all(struct.pack(">i", len(frame)) + frame)
            answer = await receive.receive()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
            raise KafkaError(f"the connection to the Kafka broker {self.name} broke: {e}") from None
        finally:
            self._waiting.pop(cid, None)
        if isinstance(answer, KafkaError):
            raise answer
        return _Reader(answer)


@dataclass
class _Topic:
    partitions: dict[int, int] = field(default_factory=dict)  # partition -> leader node id


class KafkaClient:
    """A client for one Kafka cluster (its bootstrap servers).

    Run it in a nursery (``await nursery.start(client.run)``): it connects to a bootstrap server, checks the
    broker speaks the versions it needs, and keeps its broker connections until cancelled.

    Args:
        bootstrap: ``"host:9092,host2:9092"``.
        client_id: what the brokers see.
        connect_timeout_s: reaching a bootstrap server.
    """

    def __init__(
        self, bootstrap: str | Sequence[str], *, client_id: str = "mcpipe", connect_timeout_s: float = 10.0
    ) -> None:
        self.bootstrap = parse_bootstrap(bootstrap)
        self.label = ",".join(f"{h}:{p}" for h, p in self.bootstrap)
        self.client_id = client_id
        self.connect_timeout_s = connect_timeout_s
        self._nursery: trio.Nursery | None = None
        self._brokers: dict[int, tuple[str, int]] = {}
        self._conns: dict[tuple[str, int, str], _BrokerConnection] = {}
        self._conn_lock = trio.Lock()
        self._topics: dict[str, _Topic] = {}
        self._listeners: dict[str, _Listener] = {}
        self._listener_lock = trio.Lock()
        self._rr = itertools.count()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Connect and check the broker's versions, then keep the connections until cancelled.

        Raises:
            KafkaError: before it reports started (no bootstrap server answers, or one too old).
        """
        failure: KafkaError | None = None
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                try:
                    await self._handshake()
                except KafkaError as e:
                    failure = e
                    nursery.cancel_scope.cancel()
                else:
                    task_status.started()
                    await trio.sleep_forever()
        finally:
            self._closed = True
            self._nursery = None
        if failure is not None:
            raise failure

    async def _handshake(self) -> None:
        with trio.move_on_after(self.connect_timeout_s) as scope:
            conn = await self._bootstrap()
        if scope.cancelled_caught:
            raise KafkaError(f"cannot connect to Kafka at {self.label}: no answer within {self.connect_timeout_s:g} s")
        r = await conn.call(API_VERSIONS, b"")
        error = r.i16()
        supported = {api: (lo, hi) for api, lo, hi in r.array(lambda: (r.i16(), r.i16(), r.i16()))}
        if error:
            raise KafkaError(f"the Kafka broker {conn.name} refused ApiVersions: {_error_name(error)}")
        for api, version in VERSIONS.items():
            lo, hi = supported.get(api, (0, -1))
            if not lo <= version <= hi:
                raise KafkaError(
                    f"the Kafka broker {conn.name} does not speak {NAMES.get(api, api)} v{version}"
                    f" (it speaks v{lo}-v{hi})"
                )

    async def _bootstrap(self) -> _BrokerConnection:
        errors = []
        for host, port in self.bootstrap:
            try:
                return await self._connection(host, port)
            except KafkaError as e:
                errors.append(str(e))
        raise KafkaError(f"cannot connect to Kafka at {self.label}: " + "; ".join(errors))

    async def _connection(self, host: str, port: int, lane: str = "") -> _BrokerConnection:
        key = (host, port, lane)
        async with self._conn_lock:
            conn = self._conns.get(key)
            if conn is not None and not conn.closed:
                return conn
            if self._nursery is None:
                raise KafkaError(f"the Kafka client for {self.label} is closed")
            conn = _BrokerConnection(host, port, self.client_id)
            await self._nursery.start(conn.run)
            self._conns[key] = conn
            return conn

    async def _any(self) -> _BrokerConnection:
        for conn in self._conns.values():
            if not conn.closed:
                return conn
        return await self._bootstrap()

    async def metadata(self, topic: str, *, refresh: bool = False) -> _Topic:
        """The partitions of ``topic`` and their leaders (cached; ``refresh`` asks again)."""
        if not refresh and topic in self._topics:
            return self._topics[topic]
        conn = await self._any()
        body = _Writer().i32(1).string(topic).i8(1).buf  # allow auto topic creation
        for _ in range(10):
            r = await conn.call(API_METADATA, bytes(body))
            r.i32()  # throttle
            brokers = r.array(r.broker)
            self._brokers.update({node: (host or "", port) for node, host, port, _rack in brokers})
            r.string()  # cluster id
            r.i32()  # controller
            for _ in range(r.i32()):
                error, name, _internal = r.i16(), r.string(), r.i8()
                parts = r.array(r.partition)
                if name != topic:
                    continue
                if error in (5,) or (not error and not parts):  # LEADER_NOT_AVAILABLE while it is created
                    break
                if error:
                    raise KafkaError(f"Kafka topic '{topic}': {_error_name(error)}", "TOOL_ERROR")
                found = _Topic({index: leader for _e, index, leader, _r, _i in parts})
                self._topics[topic] = found
                return found
            await trio.sleep(0.1)
        raise KafkaError(f"Kafka topic '{topic}' has no leader yet", "TOOL_FAILED")

    async def _leader(self, topic: str, partition: int, lane: str = "") -> _BrokerConnection:
        meta = await self.metadata(topic)
        node = meta.partitions.get(partition)
        if node is None or node not in self._brokers:
            raise KafkaError(f"Kafka topic '{topic}' has no partition {partition}", "TOOL_ERROR")
        host, port = self._brokers[node]
        return await self._connection(host, port, lane)

    async def produce(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes | None] | None = None,
        partition: int | None = None,
        timeout_ms: int = 30_000,
    ) -> tuple[int, int]:
        """Produce one record (acks from all in-sync replicas); answer its (partition, offset).

        Raises:
            KafkaError: the broker refused it (``TOOL_ERROR``) or cannot be reached.
        """
        meta = await self.metadata(topic)
        if partition is None:
            ids = sorted(meta.partitions)
            partition = (
                ids[(murmur2(key) & 0x7FFFFFFF) % len(ids)] if key is not None else ids[next(self._rr) % len(ids)]
            )
        batch = encode_batch([KafkaRecord(value, key, tuple((headers or {}).items()))])
        w = _Writer().string(None).i16(-1).i32(timeout_ms).i32(1).string(topic).i32(1).i32(partition).bytes_(batch)
        conn = await self._leader(topic, partition)
        r = await conn.call(API_PRODUCE, bytes(w.buf))
        for _ in range(r.i32()):
            r.string()
            for _ in range(r.i32()):
                _index, error, base_offset, _append_time = r.i32(), r.i16(), r.i64(), r.i64()
                if error:
                    if error in (3, 6):
                        self._topics.pop(topic, None)
                    raise KafkaError(
                        f"the Kafka broker refused the record for '{topic}': {_error_name(error)}", "TOOL_ERROR"
                    )
                return partition, base_offset
        raise KafkaError(f"the Kafka broker did not answer for '{topic}'")

    async def list_offsets(self, topic: str, partition: int, *, latest: bool = True) -> int:
        conn = await self._leader(topic, partition)
        w = _Writer().i32(-1).i32(1).string(topic).i32(1).i32(partition).i64(-1 if latest else -2)
        r = await conn.call(API_LIST_OFFSETS, bytes(w.buf))
        for _ in range(r.i32()):
            r.string()
            for _ in range(r.i32()):
                _index, error, _ts, offset = r.i32(), r.i16(), r.i64(), r.i64()
                if error:
                    raise KafkaError(f"Kafka ListOffsets of '{topic}': {_error_name(error)}", "TOOL_ERROR")
                return offset
        raise KafkaError(f"the Kafka broker did not answer ListOffsets for '{topic}'")

    async def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_wait_ms: int = 500,
        max_bytes: int = 1 << 20,
        lane: str = "",
    ) -> tuple[list[KafkaRecord], int]:
        """Records of ``topic``/``partition`` from ``offset`` (waiting up to ``max_wait_ms`` for some); answers
        them and the next offset to fetch."""
        conn = await self._leader(topic, partition, lane)
        w = _Writer().i32(-1).i32(max_wait_ms).i32(1).i32(max_bytes).i8(0)
        w.i32(1).string(topic).i32(1).i32(partition).i64(offset).i32(max_bytes)
        r = await conn.call(API_FETCH, bytes(w.buf))
        r.i32()  # throttle
        for _ in range(r.i32()):
            r.string()
            for _ in range(r.i32()):
                _index, error, _hw, _lso = r.i32(), r.i16(), r.i64(), r.i64()
                r.array(lambda: (r.i64(), r.i64()))  # aborted transactions
                data = r.bytes_() or b""
                if error:
                    raise KafkaError(f"Kafka Fetch of '{topic}': {_error_name(error)}", "TOOL_ERROR")
                records = [rec for rec in decode_batches(data, topic, partition) if rec.offset >= offset]
                nxt = records[-1].offset + 1 if records else offset
                return records, nxt
        return [], offset

    async def request(
        self,
        request_topic: str,
        response_topic: str,
        value: bytes | None,
        *,
        timeout_s: float,
        headers: Mapping[str, bytes | None] | None = None,
    ) -> KafkaRecord:
        """Produce on ``request_topic`` with a fresh correlation id; answer the record on ``response_topic``
        that carries it (as a header or as its key).

        Raises:
            KafkaError: no response within ``timeout_s`` (``TIMEOUT``), or produce/fetch failed.
        """
        correlation = secrets.token_hex(16)
        listener = await self._listener(response_topic)
        send, receive = trio.open_memory_channel[KafkaRecord | KafkaError](1)
        listener.waiting[correlation] = send
        try:
            hdrs = {**(headers or {}), "correlation_id": correlation.encode()}
            await self.produce(request_topic, value, key=correlation.encode(), headers=hdrs)
            with trio.move_on_after(timeout_s):
                answer = await receive.receive()
                if isinstance(answer, KafkaError):
                    raise answer
                return answer
            raise KafkaError(
                f"no response on '{response_topic}' within {timeout_s * 1000:g} ms (correlation id {correlation})",
                "TIMEOUT",
            )
        finally:
            listener.waiting.pop(correlation, None)

    async def _listener(self, topic: str) -> _Listener:
        async with self._listener_lock:
            found = self._listeners.get(topic)
            if found is not None and not found.closed:
                return found
            if self._nursery is None:
                raise KafkaError(f"the Kafka client for {self.label} is closed")
            listener = _Listener(self, topic)
            await self._nursery.start(listener.run)
            self._listeners[topic] = listener
            return listener


class _Listener:
    """Reads a response topic from its end, handing each record to the request waiting for its correlation id.

    Each partition is read on a connection of its own: a broker answers a connection's requests in order,
    so a long-polling Fetch would hold back the requests' Produce answers.
    """

    def __init__(self, client: KafkaClient, topic: str) -> None:
        self.client = client
        self.topic = topic
        self.waiting: dict[str, trio.MemorySendChannel[KafkaRecord | KafkaError]] = {}
        self.closed = False
        self.error: KafkaError | None = None

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        try:
            meta = await self.client.metadata(self.topic)
            offsets = {p: await self.client.list_offsets(self.topic, p) for p in sorted(meta.partitions)}
            task_status.started()
            async with trio.open_nursery() as nursery:
                for partition, offset in offsets.items():
                    nursery.start_soon(self._follow, partition, offset, nursery.cancel_scope)
            if self.error is not None:
                _log.warning("stopped reading %s: %s", self.topic, self.error)
                for chan in self.waiting.values():
                    chan.send_nowait(self.error)
        finally:
            self.closed = True

    async def _follow(self, partition: int, offset: int, scope: trio.CancelScope) -> None:
        lane = f"fetch {self.topic} {partition}"
        try:
            while True:
                records, offset = await self.client.fetch(self.topic, partition, offset, lane=lane)
                for rec in records:
                    cid = rec.header("correlation_id")
                    token = (cid if cid is not None else rec.key or b"").decode(errors="replace")
                    chan = self.waiting.pop(token, None)
                    if chan is not None:
                        chan.send_nowait(rec)
        except KafkaError as e:
            self.error = e
            scope.cancel()


def murmur2(data: bytes) -> int:
    """Kafka's default partitioner hash (murmur2, seed 0x9747b28c), so keyed records land where Java's would."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    tail = length - rest
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h
