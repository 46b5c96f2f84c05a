"""The run queue on Redis Streams, shared by the workers of many boxes.

Keys (under ``PREFIX``):

- ``PREFIX:runs`` the stream of queued runs (one entry per run, ``{"run": ID}``), read by the consumer group
  ``workers``: a worker leases a run by reading it (``XREADGROUP``), keeps it by claiming its entry again
  every third of the lease (``XCLAIM`` resets the entry's idle time), and acknowledges it when the run is
  finished (``XACK``). A dead worker stops claiming: once its entry has been idle for the lease, another
  worker takes it over (``XAUTOCLAIM``).
- ``PREFIX:run:ID`` a hash: the run (target, args, principal, status, worker, attempts, lapses, cancel, answer).
  Its ``worker`` field is the truth of who holds the run: saving steps and finishing are Lua scripts that
  check it, so a worker that stalled past its lease cannot finish a run another worker took over.
- ``PREFIX:run:ID:steps`` the run's recorded step results, by path; ``PREFIX:run:ID:events`` its events
  (a stream). The three expire ``retention_s`` after the run ends.
- ``PREFIX:runs:index`` a sorted set of run ids by creation time (``mcpipe runs``).

The client is coredis, on Trio through anyio.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import coredis
import orjson
import trio
from coredis.tokens import PureToken

from mcpipe.store._runs import (
    NewEvent,
    Renewal,
    RunEvent,
    RunInfo,
    RunRefused,
    RunStatus,
    cancelled_answer,
    merge_answers,
    outcome_of,
    pack_answer,
    too_large_answer,
    unpack_answer,
)

__all__ = ["RedisRunQueue"]

_log = logging.getLogger("mcpipe.store")

GROUP = "workers"
RETENTION_S = 7 * 86400.0

# KEYS: run, events, index, stream. ARGV: id, target, args, principal, now, by, data, meta
_ENQUEUE = """
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'target', ARGV[2], 'args', ARGV[3], 'principal', ARGV[4],
  'status', 'queued', 'created', ARGV[5], 'updated', ARGV[5], 'attempts', 0, 'cancel', 0, 'meta', ARGV[8])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
redis.call('XADD', KEYS[2], '*', 'type', 'enqueued', 'worker', ARGV[6], 'at', ARGV[5], 'data', ARGV[7])
local entry = redis.call('XADD', KEYS[4], '*', 'run', ARGV[1])
redis.call('HSET', KEYS[1], 'entry', entry)
return entry
"""

# KEYS: run, events. ARGV: worker, now. Returns the run's hash (flat) when leased, 0 when the run is not
# waiting for a worker (cancelled or waiting for input: ack its entry).
_LEASE = """
local st = redis.call('HGET', KEYS[1], 'status')
if st ~= 'queued' and st ~= 'running' then return 0 end
local prev = redis.call('HGET', KEYS[1], 'worker')
redis.call('HSET', KEYS[1], 'status', 'running', 'worker', ARGV[1], 'updated', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'attempts', 1)
if st == 'running' then redis.call('HINCRBY', KEYS[1], 'lapses', 1) end
local data = '{}'
if prev then data = cjson.encode({taken_over_from = prev}) end
redis.call('XADD', KEYS[2], '*', 'type', 'leased', 'worker', ARGV[1], 'at', ARGV[2], 'data', data)
return redis.call('HGETALL', KEYS[1])
"""

# KEYS: run, stream. ARGV: group, worker. Returns -1 (lost), 0 (held), 1 (held, cancel asked).
_RENEW = """
if redis.call('HGET', KEYS[1], 'worker') ~= ARGV[2] or redis.call('HGET', KEYS[1], 'status') ~= 'running' then
  return -1
end
local entry = redis.call('HGET', KEYS[1], 'entry')
redis.call('XCLAIM', KEYS[2], ARGV[1], ARGV[2], 0, entry, 'JUSTID')
if redis.call('HGET', KEYS[1], 'cancel') == '1' then return 1 end
return 0
"""

# KEYS: run, steps, events. ARGV: worker, now, nsteps, path1, result1, ..., type1, data1, ...
_SAVE = """
if redis.call('HGET', KEYS[1], 'worker') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'status') ~= 'running' then
  return 0
end
local n = tonumber(ARGV[3])
local i = 4
for _ = 1, n do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  i = i + 2
end
while i <= #ARGV do
  redis.call('XADD', KEYS[3], '*', 'type', ARGV[i], 'worker', ARGV[1], 'at', ARGV[2], 'data', ARGV[i + 1])
  i = i + 2
end
return 1
"""

# KEYS: run, steps, events, stream. ARGV: worker, now, status, answer, data, group, retention_s
_FINISH = """
if redis.call('HGET', KEYS[1], 'worker') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'status') ~= 'running' then
  return 0
end
redis.call('HSET', KEYS[1], 'status', ARGV[3], 'answer', ARGV[4], 'updated', ARGV[2])
redis.call('DEL', KEYS[2])
redis.call('XADD', KEYS[3], '*', 'type', ARGV[3], 'worker', ARGV[1], 'at', ARGV[2], 'data', ARGV[5])
redis.call('XACK', KEYS[4], ARGV[6], redis.call('HGET', KEYS[1], 'entry'))
for k = 1, 3 do redis.call('EXPIRE', KEYS[k], ARGV[7]) end
return 1
"""

# KEYS: run, events, stream. ARGV: worker, now, meta, group, data
_SUSPEND = """
if redis.call('HGET', KEYS[1], 'worker') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'status') ~= 'running' then
  return 0
end
redis.call('HSET', KEYS[1], 'status', 'input_required', 'meta', ARGV[3], 'updated', ARGV[2])
redis.call('XACK', KEYS[3], ARGV[4], redis.call('HGET', KEYS[1], 'entry'))
redis.call('XADD', KEYS[2], '*', 'type', 'input_required', 'worker', ARGV[1], 'at', ARGV[2], 'data', ARGV[5])
return 1
"""

# KEYS: run, events, stream. ARGV: old meta, new meta, resumed (1/0), now, by. Returns 1, or 0 (meta moved on).
_ANSWER = """
if redis.call('HGET', KEYS[1], 'status') ~= 'input_required' then return 1 end
if redis.call('HGET', KEYS[1], 'meta') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'meta', ARGV[2], 'updated', ARGV[4])
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[1], 'status', 'queued')
  local entry = redis.call('XADD', KEYS[3], '*', 'run', redis.call('HGET', KEYS[1], 'id'))
  redis.call('HSET', KEYS[1], 'entry', entry)
  redis.call('XADD', KEYS[2], '*', 'type', 'resumed', 'worker', ARGV[5], 'at', ARGV[4], 'data', '{}')
end
return 1
"""

# KEYS: run, steps, events, stream. ARGV: now, answer, by, group, retention_s. Returns the status after.
_CANCEL = """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return false end
if st == 'queued' or st == 'input_required' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'cancel', 1, 'answer', ARGV[2], 'updated', ARGV[1])
  redis.call('XADD', KEYS[3], '*', 'type', 'cancelled', 'worker', ARGV[3], 'at', ARGV[1], 'data',
    '{"before_start":true}')
  redis.call('XACK', KEYS[4], ARGV[4], redis.call('HGET', KEYS[1], 'entry'))
  for k = 1, 3 do redis.call('EXPIRE', KEYS[k], ARGV[5]) end
elseif st == 'running' then
  redis.call('HSET', KEYS[1], 'cancel', 1, 'updated', ARGV[1])
end
return redis.call('HGET', KEYS[1], 'status')
"""


def _info(h: dict[str, str]) -> RunInfo:
    return RunInfo(
        id=h["id"],
        target=h["target"],
        args=orjson.loads(h["args"]) if h.get("args") else None,
        principal=h.get("principal") or None,
        status=h["status"],  # type: ignore[arg-type]
        created=float(h["created"]),
        updated=float(h["updated"]),
        worker=h.get("worker") or None,
        attempts=int(h.get("attempts", 0)),
        lapses=int(h.get("lapses", 0)),
        cancel=h.get("cancel") == "1",
        answer=unpack_answer(h["answer"]) if h.get("answer") else None,
        meta=orjson.loads(h["meta"]) if h.get("meta") else {},
    )


def _event(entry: Any) -> RunEvent:
    f = entry.field_values
    return RunEvent(
        cursor=entry.identifier,
        at=float(f["at"]),
        type=f["type"],
        worker=f.get("worker") or None,
        data=orjson.loads(f["data"]) if f.get("data") else {},
    )


class RedisRunQueue:
    """Runs on Redis Streams (see the module's docstring for the keys).

    Args:
        url: ``redis://[:PASSWORD@]HOST:PORT/DB`` (or ``rediss://``, ``unix://``).
        prefix: the key prefix.
        retention_s: how long a finished run, its steps and its events are kept.
        timeout_s: the bound on connecting and on each command (blocking reads wait less than it).
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "mcpipe",
        retention_s: float = RETENTION_S,
        timeout_s: float = 2.0,
        max_run_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.retention_s = retention_s
        self.max_run_bytes = max_run_bytes
        self.timeout_s = timeout_s
        self.stream = f"{prefix}:runs"
        self.index = f"{prefix}:runs:index"
        self._client: coredis.Redis[str] = coredis.Redis.from_url(
            url, decode_responses=True, connect_timeout=timeout_s, stream_timeout=timeout_s + 5.0
        )
        self._group_ready = False
        self._next_reclaim = 0.0
        self._enqueue = self._client.register_script(_ENQUEUE)
        self._lease = self._client.register_script(_LEASE)
        self._renew = self._client.register_script(_RENEW)
        self._save = self._client.register_script(_SAVE)
        self._finish = self._client.register_script(_FINISH)
        self._cancel = self._client.register_script(_CANCEL)
        self._suspend = self._client.register_script(_SUSPEND)
        self._answer = self._client.register_script(_ANSWER)

    def _run(self, run_id: str) -> tuple[str, str, str]:
        base = f"{self.prefix}:run:{run_id}"
        return base, f"{base}:steps", f"{base}:events"

    @property
    def _retention(self) -> int:
        return max(1, int(self.retention_s))

    async def _ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            await self._client.xgroup_create(self.stream, GROUP, identifier="0", mkstream=True)
        except coredis.exceptions.StreamDuplicateConsumerGroupError:
            pass  # another worker or server made it
        self._group_ready = True

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the client's connections open until cancelled; finished runs expire in Redis itself."""
        async with self._client:
            task_status.started()
            while True:
                await trio.sleep(max(1.0, min(self.retention_s / 10, 300.0)))
                try:
                    await self.sweep()
                except (coredis.exceptions.RedisError, OSError):
                    _log.warning("run queue: sweeping %s failed", self.prefix, exc_info=True)

    def wake(self) -> None:
        """Nothing to do: idle workers block on the stream."""

    async def enqueue(
        self,
        target: str,
        args: Any,
        *,
        principal: str | None = None,
        run_id: str | None = None,
        by: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> RunInfo:
        await self._ensure_group()
        now = time.time()
        run_id = run_id or os.urandom(12).hex()
        run, _, events = self._run(run_id)
        data = orjson.dumps({"target": target}).decode()
        meta = meta or {}
        args_s, meta_s = orjson.dumps(args).decode(), orjson.dumps(meta).decode()
        if len(args_s) + len(meta_s) > self.max_run_bytes:
            raise RunRefused(
                f"the run's arguments are {len(args_s) + len(meta_s)} bytes; a background run keeps at most "
                f"{self.max_run_bytes} ([runs] max_run_bytes)"
            )
        await self._enqueue(
            keys=[run, events, self.index, self.stream],
            args=[
                run_id,
                target,
                args_s,
                principal or "",
                repr(now),
                by or "",
                data,
                meta_s,
            ],
        )
        return RunInfo(id=run_id, target=target, args=args, principal=principal, created=now, updated=now, meta=meta)

    async def suspend(self, run_id: str, worker: str, pending: dict[str, Any]) -> bool:
        run, _, events = self._run(run_id)
        info = await self.get(run_id)
        if info is None:
            return False
        meta = orjson.dumps({**info.meta, "pending": pending}).decode()
        data = orjson.dumps({"keys": sorted(pending)}).decode()
        got: Any = await self._suspend(
            keys=[run, events, self.stream], args=[worker, repr(time.time()), meta, GROUP, data]
        )
        return bool(got)

    async def answer(self, run_id: str, responses: dict[str, Any], *, by: str | None = None) -> RunInfo | None:
        run, _, events = self._run(run_id)
        while True:
            raw = await self._client.hget(run, "meta")
            info = await self.get(run_id)
            if info is None or raw is None:
                return info
            meta, resumed = merge_answers(orjson.loads(raw), responses)
            args = [raw, orjson.dumps(meta).decode(), "1" if resumed else "0", repr(time.time()), by or ""]
            if await self._answer(keys=[run, events, self.stream], args=args):
                return await self.get(run_id)

    async def _take(self, entry_id: str, run_id: str, worker: str) -> RunInfo | None:
        run, _, events = self._run(run_id)
        got: Any = await self._lease(keys=[run, events], args=[worker, repr(time.time())])
        if not got:
            await self._client.xack(self.stream, GROUP, [entry_id])  # cancelled (or gone) before it started
            return None
        flat = list(got)
        return _info(dict(zip(flat[::2], flat[1::2], strict=True)))

    async def lease(self, worker: str, lease_s: float, wait_s: float) -> RunInfo | None:
        await self._ensure_group()
        now = time.monotonic()
        if now >= self._next_reclaim:
            # A dead worker's runs: entries idle for longer than the lease (looked for a few times a lease).
            self._next_reclaim = now + lease_s / 4
            lease_ms = max(1, int(lease_s * 1000))
            claimed = await self._client.xautoclaim(self.stream, GROUP, worker, lease_ms, "0-0", count=1)
            for entry in claimed[1]:
                got = await self._take(entry.identifier, entry.field_values["run"], worker)
                if got is not None:
                    self._next_reclaim = now  # there may be more
                    return got
        block = max(1, int(min(wait_s, self.timeout_s) * 1000))
        read = await self._client.xreadgroup(GROUP, worker, {self.stream: ">"}, count=1, block=block)
        for entries in (read or {}).values():
            for entry in entries:
                got = await self._take(str(entry.identifier), str(entry.field_values["run"]), worker)
                if got is not None:
                    return got
        return None

    async def renew(self, run_id: str, worker: str, lease_s: float) -> Renewal:
        run, _, _ = self._run(run_id)
        got: Any = await self._renew(keys=[run, self.stream], args=[GROUP, worker])
        return Renewal(False) if got == -1 else Renewal(True, got == 1)

    async def save(self, run_id: str, worker: str, steps: dict[str, dict[str, Any]], events: list[NewEvent]) -> bool:
        run, steps_key, events_key = self._run(run_id)
        args: list[str] = [worker, repr(time.time()), str(len(steps))]
        for path, result in steps.items():
            args += [path, orjson.dumps(result).decode()]
        for type_, data in events:
            args += [type_, orjson.dumps(data).decode()]
        return bool(await self._save(keys=[run, steps_key, events_key], args=args))

    async def recorded(self, run_id: str) -> dict[str, dict[str, Any]]:
        _, steps, _ = self._run(run_id)
        got = await self._client.hgetall(steps)
        return {path: orjson.loads(result) for path, result in got.items()}

    async def finish(self, run_id: str, worker: str, status: RunStatus, answer: Any) -> bool:
        run, steps, events = self._run(run_id)
        packed = pack_answer(answer)
        if len(packed) > self.max_run_bytes:
            status, answer = "failed", too_large_answer(len(packed), self.max_run_bytes)
            packed = pack_answer(answer)
        data = orjson.dumps(outcome_of(answer)).decode()
        args: list[str | int] = [
            worker,
            repr(time.time()),
            status,
            packed.decode(),
            data,
            GROUP,
            self._retention,
        ]
        return bool(await self._finish(keys=[run, steps, events, self.stream], args=args))

    async def cancel(self, run_id: str, *, by: str | None = None) -> RunInfo | None:
        run, steps, events = self._run(run_id)
        answer = pack_answer(cancelled_answer("cancelled before it started")).decode()
        got: Any = await self._cancel(
            keys=[run, steps, events, self.stream], args=[repr(time.time()), answer, by or "", GROUP, self._retention]
        )
        return None if got is None else await self.get(run_id)

    async def get(self, run_id: str) -> RunInfo | None:
        h = await self._client.hgetall(self._run(run_id)[0])
        return _info(h) if h else None

    async def runs(self, *, limit: int = 50, status: str | None = None) -> list[RunInfo]:
        out: list[RunInfo] = []
        start, page = 0, max(limit, 100)
        while len(out) < limit:
            ids = await self._client.zrange(self.index, start, start + page - 1, rev=True)
            if not ids:
                break
            for run_id in ids:
                info = await self.get(run_id)
                if info is not None and (status is None or info.status == status):
                    out.append(info)
            start += page
        return out[:limit]

    async def emit(self, run_id: str, worker: str | None, events: list[NewEvent]) -> None:
        key = self._run(run_id)[2]
        now = repr(time.time())
        for type_, data in events:
            fields = {"type": type_, "worker": worker or "", "at": now, "data": orjson.dumps(data).decode()}
            await self._client.xadd(key, fields)

    async def events(
        self, run_id: str, *, after: str | None = None, limit: int = 1000, wait_s: float = 0
    ) -> list[RunEvent]:
        key = self._run(run_id)[2]
        got = await self._client.xrange(key, f"({after}" if after else "-", "+", count=limit)
        if not got and wait_s > 0:
            block = max(1, int(min(wait_s, self.timeout_s) * 1000))
            read = await self._client.xread({key: after or "0-0"}, count=limit, block=block)
            got = tuple(e for entries in (read or {}).values() for e in entries)
        return [_event(e) for e in got]

    async def sweep(self) -> int:
        """Drop the index entries of runs Redis has expired; answers how many."""
        cutoff = time.time() - self.retention_s
        old = await self._client.zrange(self.index, "-inf", cutoff, sortby=PureToken.BYSCORE)
        gone = [run_id for run_id in old if not await self._client.exists([self._run(run_id)[0]])]
        if gone:
            await self._client.zrem(self.index, gone)
        return len(gone)
