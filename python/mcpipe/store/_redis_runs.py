"""The run queue on Redis Streams, shared by the workers of many boxes.

Keys (under ``PREFIX``):

- ``PREFIX:runs`` the stream of queued runs (one entry per run, ``{"run": ID}``), read by the consumer group
  ``workers``: a worker leases a run by reading it (``XREADGROUP``), keeps it by claiming its entry again
  every third of the lease (``XCLAIM`` resets the entry's idle time), and acknowledges and deletes it when the
  run is finished or waits for input (``XACK``, ``XDEL``: the stream holds live runs only). A dead worker
  stops claiming: once its entry has been idle for the lease, another worker takes it over (``XAUTOCLAIM``).
- ``PREFIX:run:ID`` a hash: the run (target, args, principal, status, worker, attempts, lapses, cancel, answer,
  and its event count and bytes). Its ``worker`` field is the truth of who holds the run: saving steps and
  finishing are Lua scripts that check it, so a worker that stalled past its lease cannot finish a run
  another worker took over.
- ``PREFIX:run:ID:steps`` the run's recorded step results, by path; ``PREFIX:run:ID:events`` its events
  (a stream). The three expire ``retention_s`` after the run ends.
- ``PREFIX:runs:index`` a sorted set of run ids by creation time (``mcpipe runs``).
- The bounds' books (:class:`~mcpipe.store.Bounds`, the same as SQLite's): ``PREFIX:runs:sizes`` (run id ->
  the bytes it keeps: arguments, steps, events, answer), ``PREFIX:runs:total`` (their sum),
  ``PREFIX:runs:done`` (finished runs by the time they ended: the oldest are dropped first),
  ``PREFIX:runs:parked`` (runs waiting for input, by the time they began to: they fail past
  ``parked_ttl_s``), ``PREFIX:runs:live`` and ``PREFIX:runs:live_bytes`` (each principal's live runs and
  their bytes). Every script that changes a run keeps them in step, atomically.

The client is coredis, on Trio through anyio. While Redis is unreachable, every call raises
:class:`~mcpipe.store.StoreUnavailable` (after at most ``timeout_s``), and the client reconnects by itself.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar, cast

import coredis
import coredis.exceptions
import orjson
import trio
from coredis.tokens import PureToken

from mcpipe.store._base import StoreUnavailable
from mcpipe.store._runs import (
    EVENT_OVERHEAD,
    LIFECYCLE,
    MAX_BYTES,
    MAX_BYTES_PER_PRINCIPAL,
    MAX_PAGE,
    MAX_RUN_BYTES,
    MAX_RUN_EVENTS,
    MAX_RUNS,
    MAX_RUNS_PER_PRINCIPAL,
    MAX_SCAN,
    PARKED_TTL_S,
    RETENTION_S,
    Bounds,
    NewEvent,
    Renewal,
    RunEvent,
    RunInfo,
    RunPage,
    RunStatus,
    cancelled_answer,
    event_blob,
    expired_answer,
    merge_answers,
    outcome_of,
    pack_answer,
    too_large_answer,
    unpack_answer,
)

__all__ = ["RedisRunQueue"]

_log = logging.getLogger("mcpipe.store")
T = TypeVar("T")

GROUP = "workers"

# Shared by the scripts. B is the books: B.sizes, B.total, B.live, B.live_bytes, B.done, B.parked (key names).
_PRELUDE = f"""
local OVERHEAD = {EVENT_OVERHEAD}
local function is_live(st) return st == 'queued' or st == 'running' or st == 'input_required' end
-- The facets: a sorted set of run ids by creation time for each status, target and principal (B.facets ..
-- 'status:' .. status ...), their names in the set B.facet_keys. A page reads the smallest that its filters name.
local function facet(B, kind, value, created, id)
  local key = B.facets .. kind .. ':' .. value
  redis.call('ZADD', key, created, id)
  redis.call('SADD', B.facet_keys, key)
end
-- Set run `id`'s status, moving it from its old status's facet to the new one's.
local function set_status(B, run, id, status)
  local old = redis.call('HGET', run, 'status')
  if old == status then return end
  if old then redis.call('ZREM', B.facets .. 'status:' .. old, id) end
  facet(B, 'status', status, redis.call('HGET', run, 'created'), id)
  redis.call('HSET', run, 'status', status)
end
-- Charge `delta` bytes to run `id` (and to its principal's live bytes while it is live).
local function charge(B, run, id, delta)
  if delta == 0 then return end
  redis.call('HINCRBY', B.sizes, id, delta)
  redis.call('INCRBY', B.total, delta)
  if is_live(redis.call('HGET', run, 'status')) then
    redis.call('HINCRBY', B.live_bytes, redis.call('HGET', run, 'principal') or '', delta)
  end
end
-- Append one event within the run's bounds (lifecycle events always); the first one dropped leaves a mark.
local function add_event(B, run, events, id, typ, worker, at, data, keep, max_events, max_bytes)
  local n = tonumber(redis.call('HGET', run, 'nevents') or '0')
  local cost = #data + #typ + OVERHEAD
  if not keep then
    local size = tonumber(redis.call('HGET', B.sizes, id) or '0')
    if n >= max_events or size + cost > max_bytes then
      if redis.call('HINCRBY', run, 'dropped', 1) == 1 then
        local limit = 'max_run_bytes'
        if n >= max_events then limit = 'max_run_events' end
        typ, data = 'events_dropped', cjson.encode({{limit = '[runs] ' .. limit}})
        cost = #data + #typ + OVERHEAD
      else
        return
      end
    end
  end
  redis.call('XADD', events, '*', 'type', typ, 'worker', worker, 'at', at, 'data', data)
  redis.call('HINCRBY', run, 'nevents', 1)
  redis.call('HINCRBY', run, 'ebytes', cost)
  charge(B, run, id, cost)
end
-- Run `id` leaves the live runs for good with `answer`: its principal's books, its size, the finished set.
local function ended(B, run, steps, id, status, answer, now)
  local principal = redis.call('HGET', run, 'principal') or ''
  local old = tonumber(redis.call('HGET', B.sizes, id) or '0')
  if is_live(redis.call('HGET', run, 'status')) then
    redis.call('HINCRBY', B.live, principal, -1)
    redis.call('HINCRBY', B.live_bytes, principal, -old)
  end
  local size = redis.call('HSTRLEN', run, 'args') + redis.call('HSTRLEN', run, 'meta') + #answer
    + tonumber(redis.call('HGET', run, 'ebytes') or '0')
  set_status(B, run, id, status)
  redis.call('HSET', run, 'answer', answer, 'updated', now, 'sbytes', 0)
  redis.call('DEL', steps)
  redis.call('HSET', B.sizes, id, size)
  redis.call('INCRBY', B.total, size - old)
  redis.call('ZADD', B.done, now, id)
  redis.call('ZREM', B.parked, id)
end
local function over(B, max_runs, max_bytes)
  return redis.call('HLEN', B.sizes) > max_runs or tonumber(redis.call('GET', B.total) or '0') > max_bytes
end
"""


def _script(body: str) -> str:
    return _PRELUDE + body


# Every script's KEYS begin with the books (sizes, total, live, live_bytes, done, parked: KEYS[1..6]).
_BOOKS = """
local B = {sizes = KEYS[1], total = KEYS[2], live = KEYS[3], live_bytes = KEYS[4], done = KEYS[5], parked = KEYS[6]}
local base = string.sub(KEYS[1], 1, #KEYS[1] - #'sizes')
B.facets, B.facet_keys = base .. 'by:', base .. 'facets'
"""

# KEYS: books, run, events, index, stream. ARGV: id, target, args, principal, now, by, data, meta, size,
# max_runs, max_bytes, max_runs_per_principal, max_bytes_per_principal, max_events, max_run_bytes.
# Answers {'ok'} or the bound it would pass with the number it is at: {'principal_count', n}, ...
_ENQUEUE = _script(
    _BOOKS
    + """
local run, events, index, stream = KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local id, principal, now, size = ARGV[1], ARGV[4], ARGV[5], tonumber(ARGV[9])
local live = tonumber(redis.call('HGET', B.live, principal) or '0')
if live + 1 > tonumber(ARGV[12]) then return {'principal_count', live} end
local held = tonumber(redis.call('HGET', B.live_bytes, principal) or '0')
if held + size > tonumber(ARGV[13]) then return {'principal_bytes', held} end
local count = redis.call('HLEN', B.sizes)
if count + 1 > tonumber(ARGV[10]) then return {'count', count} end
local total = tonumber(redis.call('GET', B.total) or '0')
if total + size > tonumber(ARGV[11]) then return {'bytes', total} end
redis.call('HSET', run, 'id', id, 'target', ARGV[2], 'args', ARGV[3], 'principal', principal,
  'status', 'queued', 'created', now, 'updated', now, 'attempts', 0, 'cancel', 0, 'meta', ARGV[8],
  'nevents', 0, 'ebytes', 0, 'sbytes', 0)
redis.call('HSET', B.sizes, id, size)
redis.call('INCRBY', B.total, size)
redis.call('HINCRBY', B.live, principal, 1)
redis.call('HINCRBY', B.live_bytes, principal, size)
redis.call('ZADD', index, now, id)
facet(B, 'status', 'queued', now, id)
facet(B, 'target', ARGV[2], now, id)
facet(B, 'principal', principal, now, id)
add_event(B, run, events, id, 'enqueued', ARGV[6], now, ARGV[7], true, 0, 0)
local entry = redis.call('XADD', stream, '*', 'run', id)
redis.call('HSET', run, 'entry', entry)
return {'ok'}
"""
)

# KEYS: books, run, events. ARGV: id, worker, now. Answers the run's hash (flat) when leased, 0 when the run
# is not waiting for a worker (cancelled, ended or waiting for input: ack its entry).
_LEASE = _script(
    _BOOKS
    + """
local run, events = KEYS[7], KEYS[8]
local st = redis.call('HGET', run, 'status')
if st ~= 'queued' and st ~= 'running' then return 0 end
local prev = redis.call('HGET', run, 'worker')
set_status(B, run, ARGV[1], 'running')
redis.call('HSET', run, 'worker', ARGV[2], 'updated', ARGV[3])
redis.call('HINCRBY', run, 'attempts', 1)
if st == 'running' then redis.call('HINCRBY', run, 'lapses', 1) end
local data = '{}'
if prev then data = cjson.encode({taken_over_from = prev}) end
add_event(B, run, events, ARGV[1], 'leased', ARGV[2], ARGV[3], data, true, 0, 0)
return redis.call('HGETALL', run)
"""
)

# KEYS: run, stream. ARGV: group, worker. Answers -1 (lost), 0 (held), 1 (held, cancel asked).
_RENEW = """
if redis.call('HGET', KEYS[1], 'worker') ~= ARGV[2] or redis.call('HGET', KEYS[1], 'status') ~= 'running' then
  return -1
end
local entry = redis.call('HGET', KEYS[1], 'entry')
redis.call('XCLAIM', KEYS[2], ARGV[1], ARGV[2], 0, entry, 'JUSTID')
if redis.call('HGET', KEYS[1], 'cancel') == '1' then return 1 end
return 0
"""

# KEYS: books, run, steps, events. ARGV: id, worker, now, max_runs, max_bytes, max_events, max_run_bytes,
# nsteps, path1, result1, ..., type1, data1, keep1, ... Answers 0 (not held), 1, or 2 (the queue is past its
# bounds: drop the oldest finished runs).
_SAVE = _script(
    _BOOKS
    + """
local run, steps, events, id = KEYS[7], KEYS[8], KEYS[9], ARGV[1]
if redis.call('HGET', run, 'worker') ~= ARGV[2] or redis.call('HGET', run, 'status') ~= 'running' then
  return 0
end
local max_events, max_bytes = tonumber(ARGV[6]), tonumber(ARGV[7])
local n = tonumber(ARGV[8])
local i = 9
local delta = 0
for _ = 1, n do
  delta = delta + #ARGV[i + 1] - redis.call('HSTRLEN', steps, ARGV[i])
  redis.call('HSET', steps, ARGV[i], ARGV[i + 1])
  i = i + 2
end
redis.call('HINCRBY', run, 'sbytes', delta)
charge(B, run, id, delta)
while i <= #ARGV do
  add_event(B, run, events, id, ARGV[i], ARGV[2], ARGV[3], ARGV[i + 1], ARGV[i + 2] == '1', max_events, max_bytes)
  i = i + 3
end
if over(B, tonumber(ARGV[4]), tonumber(ARGV[5])) then return 2 end
return 1
"""
)

# KEYS: books, run, events. ARGV: id, worker, now, max_runs, max_bytes, max_events, max_run_bytes,
# type1, data1, keep1, ... Answers 0 (no such run), 1, or 2 (past the queue's bounds).
_EMIT = _script(
    _BOOKS
    + """
local run, events, id = KEYS[7], KEYS[8], ARGV[1]
if redis.call('EXISTS', run) == 0 then return 0 end
local i = 8
while i <= #ARGV do
  add_event(B, run, events, id, ARGV[i], ARGV[2], ARGV[3], ARGV[i + 1], ARGV[i + 2] == '1',
    tonumber(ARGV[6]), tonumber(ARGV[7]))
  i = i + 3
end
if over(B, tonumber(ARGV[4]), tonumber(ARGV[5])) then return 2 end
return 1
"""
)

# KEYS: books, run, steps, events, stream. ARGV: id, worker, now, status, answer, data, group, retention_s,
# max_run_bytes, too_large_answer, too_large_data, max_runs, max_bytes. Answers 0 (not held), 1, or 2 (past
# the queue's bounds).
_FINISH = _script(
    _BOOKS
    + """
local run, steps, events, stream, id = KEYS[7], KEYS[8], KEYS[9], KEYS[10], ARGV[1]
if redis.call('HGET', run, 'worker') ~= ARGV[2] or redis.call('HGET', run, 'status') ~= 'running' then
  return 0
end
local status, answer, data = ARGV[4], ARGV[5], ARGV[6]
local kept = redis.call('HSTRLEN', run, 'args') + redis.call('HSTRLEN', run, 'meta')
  + tonumber(redis.call('HGET', run, 'ebytes') or '0')
if kept + #answer > tonumber(ARGV[9]) then
  status, answer, data = 'failed', ARGV[10], ARGV[11]
end
local entry = redis.call('HGET', run, 'entry')
ended(B, run, steps, id, status, answer, ARGV[3])
add_event(B, run, events, id, status, ARGV[2], ARGV[3], data, true, 0, 0)
redis.call('XACK', stream, ARGV[7], entry)
redis.call('XDEL', stream, entry)
for _, k in ipairs({run, steps, events}) do redis.call('EXPIRE', k, ARGV[8]) end
if over(B, tonumber(ARGV[12]), tonumber(ARGV[13])) then return 2 end
return 1
"""
)

# KEYS: books, run, events, stream. ARGV: id, worker, now, meta, group, data
_SUSPEND = _script(
    _BOOKS
    + """
local run, events, stream, id = KEYS[7], KEYS[8], KEYS[9], ARGV[1]
if redis.call('HGET', run, 'worker') ~= ARGV[2] or redis.call('HGET', run, 'status') ~= 'running' then
  return 0
end
charge(B, run, id, #ARGV[4] - redis.call('HSTRLEN', run, 'meta'))
set_status(B, run, id, 'input_required')
redis.call('HSET', run, 'meta', ARGV[4], 'updated', ARGV[3])
redis.call('ZADD', B.parked, ARGV[3], id)
local entry = redis.call('HGET', run, 'entry')
redis.call('XACK', stream, ARGV[5], entry)
redis.call('XDEL', stream, entry)
add_event(B, run, events, id, 'input_required', ARGV[2], ARGV[3], ARGV[6], true, 0, 0)
return 1
"""
)

# KEYS: books, run, events, stream. ARGV: id, old meta, new meta, resumed (1/0), now, by. Answers 1, or 0 (the
# meta moved on: read it again).
_ANSWER = _script(
    _BOOKS
    + """
local run, events, stream, id = KEYS[7], KEYS[8], KEYS[9], ARGV[1]
if redis.call('HGET', run, 'status') ~= 'input_required' then return 1 end
if redis.call('HGET', run, 'meta') ~= ARGV[2] then return 0 end
charge(B, run, id, #ARGV[3] - #ARGV[2])
redis.call('HSET', run, 'meta', ARGV[3], 'updated', ARGV[5])
if ARGV[4] == '1' then
  set_status(B, run, id, 'queued')
  redis.call('ZREM', B.parked, id)
  local entry = redis.call('XADD', stream, '*', 'run', id)
  redis.call('HSET', run, 'entry', entry)
  add_event(B, run, events, id, 'resumed', ARGV[6], ARGV[5], '{}', true, 0, 0)
end
return 1
"""
)

# KEYS: books, run, steps, events, stream. ARGV: id, now, answer, by, group, retention_s. Answers the status
# after (nil: no such run).
_CANCEL = _script(
    _BOOKS
    + """
local run, steps, events, stream, id = KEYS[7], KEYS[8], KEYS[9], KEYS[10], ARGV[1]
local st = redis.call('HGET', run, 'status')
if not st then return false end
if st == 'queued' or st == 'input_required' then
  local entry = redis.call('HGET', run, 'entry')
  ended(B, run, steps, id, 'cancelled', ARGV[3], ARGV[2])
  redis.call('HSET', run, 'cancel', 1)
  add_event(B, run, events, id, 'cancelled', ARGV[4], ARGV[2], '{"before_start":true}', true, 0, 0)
  redis.call('XACK', stream, ARGV[5], entry)
  redis.call('XDEL', stream, entry)
  for _, k in ipairs({run, steps, events}) do redis.call('EXPIRE', k, ARGV[6]) end
elseif st == 'running' then
  redis.call('HSET', run, 'cancel', 1, 'updated', ARGV[2])
end
return redis.call('HGET', run, 'status')
"""
)

# KEYS: books, run, steps, events. ARGV: id, now, answer, data, cutoff, retention_s. Answers 1 when the run
# was failed for having waited for input past its time.
_EXPIRE = _script(
    _BOOKS
    + """
local run, steps, events, id = KEYS[7], KEYS[8], KEYS[9], ARGV[1]
local since = redis.call('ZSCORE', B.parked, id)
if redis.call('HGET', run, 'status') ~= 'input_required' then
  redis.call('ZREM', B.parked, id)
  return 0
end
if not since or tonumber(since) > tonumber(ARGV[5]) then return 0 end
ended(B, run, steps, id, 'failed', ARGV[3], ARGV[2])
add_event(B, run, events, id, 'failed', '', ARGV[2], ARGV[4], true, 0, 0)
for _, k in ipairs({run, steps, events}) do redis.call('EXPIRE', k, ARGV[6]) end
return 1
"""
)

# KEYS: books, run, steps, events, index. ARGV: id. Drops a finished run and its books; answers 1, or 0 when
# the run is not finished.
_DROP = _script(
    _BOOKS
    + """
local id = ARGV[1]
if not redis.call('ZSCORE', B.done, id) then return 0 end
local size = tonumber(redis.call('HGET', B.sizes, id) or '0')
redis.call('HDEL', B.sizes, id)
redis.call('DECRBY', B.total, size)
redis.call('ZREM', B.done, id)
redis.call('ZREM', KEYS[10], id)
local h = redis.call('HMGET', KEYS[7], 'status', 'target', 'principal')
for i, kind in ipairs({'status', 'target', 'principal'}) do
  if h[i] then redis.call('ZREM', B.facets .. kind .. ':' .. h[i], id) end
end
redis.call('DEL', KEYS[7], KEYS[8], KEYS[9])
return 1
"""
)


_DOWN = (
    coredis.exceptions.ConnectionError,  # refused, reset, closed, loading its data
    coredis.exceptions.AuthenticationError,
    coredis.exceptions.ReadOnlyError,  # a replica
)
"""What says Redis cannot serve the queue now (a script's own error is a bug, and stays one)."""


# One page of the console's runs list, read and filtered inside Redis (one round trip): the smallest of the sorted
# sets its filters name (the facet of its status, of its target, of its one principal; else the index of every
# run) from the newest run (or the cursor) down to ``min``, each run's summary fields read with HMGET and matched
# (a facet only narrows the look: what is shown is what the run's hash says); at most ``max_scan`` runs looked
# at. KEYS: the index. ARGV: the run key prefix, max score, min score, the cursor's score and id (empty: none),
# status, target (empty: any), the number of principals (0: any) and each ('' is the anonymous caller), limit,
# max_scan, the facets' prefix. Answers {rows, scanned,
# partial, last id, last score} (the last two: where a partial scan stopped); each row is id, score, then the
# summary fields.
_PAGE = """
local prefix, maxs, mins, cscore, cid = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local status, target, np = ARGV[6], ARGV[7], tonumber(ARGV[8])
local wanted = nil
if np > 0 then
  wanted = {}
  for i = 1, np do wanted[ARGV[8 + i]] = true end
end
local limit, max_scan, facets = tonumber(ARGV[9 + np]), tonumber(ARGV[10 + np]), ARGV[11 + np]
if cscore ~= '' then maxs = cscore end
local key, least = KEYS[1], nil
local named = {}
if status ~= '' then named[#named + 1] = facets .. 'status:' .. status end
if target ~= '' then named[#named + 1] = facets .. 'target:' .. target end
if np == 1 then named[#named + 1] = facets .. 'principal:' .. ARGV[9] end
for _, k in ipairs(named) do
  local n = redis.call('ZCARD', k)
  if least == nil or n < least then least, key = n, k end
end
local rows, scanned, offset, last_id, last_score = {}, 0, 0, '', ''
while scanned < max_scan do
  local batch = math.min(500, max_scan - scanned)
  local got = redis.call('ZRANGE', key, maxs, mins, 'BYSCORE', 'REV', 'LIMIT', offset, batch, 'WITHSCORES')
  if #got == 0 then return {rows, scanned, 0, '', ''} end
  offset = offset + #got / 2
  for i = 1, #got, 2 do
    local id, score = got[i], got[i + 1]
    if not (cid ~= '' and score == cscore and id >= cid) then
      scanned, last_id, last_score = scanned + 1, id, score
      local h = redis.call('HMGET', prefix .. id, 'target', 'principal', 'status', 'created', 'updated', 'worker',
        'attempts', 'cancel', 'lapses')
      if h[3] and (status == '' or h[3] == status) and (target == '' or h[1] == target)
          and (wanted == nil or wanted[h[2] or '']) then
        rows[#rows + 1] = {id, score, h[1], h[2] or '', h[3], h[4], h[5], h[6] or '', h[7] or '0', h[8] or '0',
          h[9] or '0'}
        if #rows > limit then return {rows, scanned, 0, '', ''} end
      end
    end
  end
end
return {rows, scanned, 1, last_id, last_score}
"""

# The facets of runs enqueued before there were facets, a batch at a time, oldest first. KEYS: the index. ARGV:
# the run key prefix, the facets' prefix, the set of their names, the lowest score to read (a batch begins with
# the last run of the one before), batch. Answers {how many runs it read, the last one's score}.
_FACETS = """
local prefix, facets, names = ARGV[1], ARGV[2], ARGV[3]
local got = redis.call('ZRANGE', KEYS[1], ARGV[4], '+inf', 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[5]), 'WITHSCORES')
for i = 1, #got, 2 do
  local id, score = got[i], got[i + 1]
  local h = redis.call('HMGET', prefix .. id, 'status', 'target', 'principal')
  if h[1] then
    for j, kind in ipairs({'status', 'target', 'principal'}) do
      local key = facets .. kind .. ':' .. (h[j] or '')
      redis.call('ZADD', key, score, id)
      redis.call('SADD', names, key)
    end
  end
end
return {#got / 2, got[#got] or ''}
"""
FACET_BATCH = 500


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


def _event_args(events: list[NewEvent]) -> list[str]:
    out: list[str] = []
    for type_, data in events:
        out += [type_, event_blob(data).decode(), "1" if type_ in LIFECYCLE else "0"]
    return out


class RedisRunQueue:
    """Runs on Redis Streams (see the module's docstring for the keys), within the same :class:`Bounds` as
    the SQLite queue.

    Args:
        url: ``redis://[:PASSWORD@]HOST:PORT/DB`` (or ``rediss://``, ``unix://``).
        prefix: the key prefix.
        retention_s: how long a finished run, its steps and its events are kept.
        timeout_s: the bound on connecting and on each command (blocking reads wait less than it).
        max_run_bytes, max_run_events, max_runs, max_bytes, max_runs_per_principal, max_bytes_per_principal,
            parked_ttl_s: the bounds (see :class:`~mcpipe.store._sqlite.SqliteRunQueue`).
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "mcpipe",
        retention_s: float = RETENTION_S,
        timeout_s: float = 2.0,
        max_run_bytes: int = MAX_RUN_BYTES,
        max_run_events: int = MAX_RUN_EVENTS,
        max_runs: int = MAX_RUNS,
        max_bytes: int = MAX_BYTES,
        max_runs_per_principal: int = MAX_RUNS_PER_PRINCIPAL,
        max_bytes_per_principal: int = MAX_BYTES_PER_PRINCIPAL,
        parked_ttl_s: float = PARKED_TTL_S,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.bounds = Bounds(
            max_run_bytes=max_run_bytes,
            max_run_events=max_run_events,
            max_runs=max_runs,
            max_bytes=max_bytes,
            max_runs_per_principal=max_runs_per_principal,
            max_bytes_per_principal=max_bytes_per_principal,
            parked_ttl_s=parked_ttl_s,
            retention_s=retention_s,
        )
        self.timeout_s = timeout_s
        self.stream = f"{prefix}:runs"
        self.index = f"{prefix}:runs:index"
        self.books = [f"{prefix}:runs:{k}" for k in ("sizes", "total", "live", "live_bytes", "done", "parked")]
        self.facets = f"{prefix}:runs:by:"
        """The facets' prefix: ``PREFIX:runs:by:status:S`` (``target:T``, ``principal:P``), run ids by creation."""
        self.facet_keys = f"{prefix}:runs:facets"
        self._facets_ready = False
        self._client: coredis.Redis[str] = coredis.Redis.from_url(
            url, decode_responses=True, connect_timeout=timeout_s, stream_timeout=timeout_s + 5.0
        )
        self._group_ready = False
        self._next_reclaim = 0.0
        self._enqueue = self._client.register_script(_ENQUEUE)
        self._lease = self._client.register_script(_LEASE)
        self._renew = self._client.register_script(_RENEW)
        self._save = self._client.register_script(_SAVE)
        self._emit = self._client.register_script(_EMIT)
        self._finish = self._client.register_script(_FINISH)
        self._cancel = self._client.register_script(_CANCEL)
        self._suspend = self._client.register_script(_SUSPEND)
        self._answer = self._client.register_script(_ANSWER)
        self._expire = self._client.register_script(_EXPIRE)
        self._drop = self._client.register_script(_DROP)
        self._page = self._client.register_script(_PAGE)
        self._backfill = self._client.register_script(_FACETS)

    @property
    def retention_s(self) -> float:
        return self.bounds.retention_s

    @property
    def max_run_bytes(self) -> int:
        return self.bounds.max_run_bytes

    def _run(self, run_id: str) -> tuple[str, str, str]:
        base = f"{self.prefix}:run:{run_id}"
        return base, f"{base}:steps", f"{base}:events"

    @property
    def _retention(self) -> int:
        return max(1, int(self.bounds.retention_s))

    async def _do(self, what: str, request: Awaitable[T]) -> T:
        """One call to Redis; an unreachable Redis is :class:`StoreUnavailable`, in one line."""
        try:
            with trio.fail_after(self.timeout_s * 2 + 5.0):  # coredis bounds each step; this bounds their sum
                return await request
        except (*_DOWN, OSError, trio.TooSlowError) as exc:
            from mcpipe.store.redis import redacted

            message = str(exc) or type(exc).__name__
            _log.debug("run queue %s: %s failed: %s", redacted(self.url), what, message)
            raise StoreUnavailable(f"the run queue at {redacted(self.url)} is unavailable: {message}") from None

    async def _ensure_group(self) -> None:
        if self._group_ready:
            return

        async def create() -> None:
            try:
                await self._client.xgroup_create(self.stream, GROUP, identifier="0", mkstream=True)
            except coredis.exceptions.StreamDuplicateConsumerGroupError:
                pass  # another worker or server made it

        await self._do("create", create())
        self._group_ready = True

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the client's connections open until cancelled, sweeping the runs past their time (runs that
        waited for input too long fail; finished runs past the retention go)."""
        from mcpipe.store._sqlite import sweep_period

        async with self._client:
            # Once before serving (runs that waited for input past their time while no server ran fail now),
            # bounded: Redis need not be up for the server to start.
            with trio.move_on_after(self.timeout_s):
                await self._sweep_logged()
            task_status.started()
            while True:
                await trio.sleep(sweep_period(self.bounds))
                await self._sweep_logged()

    async def _sweep_logged(self) -> None:
        try:
            await self.sweep()
        except StoreUnavailable as exc:
            _log.warning("run queue: sweeping %s failed: %s", self.prefix, exc)

    def wake(self) -> None:
        """Nothing to do: idle workers block on the stream."""

    async def enqueue(
        self,
        target: str,
        args: object,
        *,
        principal: str | None = None,
        run_id: str | None = None,
        by: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> RunInfo:
        bounds = self.bounds
        await self._ensure_group()
        now = time.time()
        run_id = run_id or os.urandom(12).hex()
        run, _, events = self._run(run_id)
        data = event_blob({"target": target}).decode()
        meta = meta or {}
        args_s, meta_s = orjson.dumps(args).decode(), orjson.dumps(meta).decode()
        size = len(args_s) + len(meta_s)
        if size > bounds.max_run_bytes:
            raise bounds.too_large(size)
        expired = dropped = False
        while True:
            got: Any = await self._do(
                "enqueue",
                self._enqueue(
                    keys=[*self.books, run, events, self.index, self.stream],
                    args=[
                        run_id,
                        target,
                        args_s,
                        principal or "",
                        repr(now),
                        by or "",
                        data,
                        meta_s,
                        size,
                        bounds.max_runs,
                        bounds.max_bytes,
                        bounds.max_runs_per_principal,
                        bounds.max_bytes_per_principal,
                        bounds.max_run_events,
                        bounds.max_run_bytes,
                    ],
                ),
            )
            verdict, at = got[0], int(got[1]) if len(got) > 1 else 0
            if verdict == "ok":
                break
            if not expired and (await self._expire_parked()) > 0:
                expired = True
                continue  # room was freed by runs that waited for input too long: look again
            expired = True
            if verdict == "principal_count":
                raise bounds.principal_count(principal, at)
            if verdict == "principal_bytes":
                raise bounds.principal_bytes(principal, at, size)
            if await self._drop_oldest():
                dropped = True
                continue
            live = int(await self._do("count", self._client.hlen(self.books[0])))
            if verdict == "count":
                raise bounds.full_count(live)
            raise bounds.full_bytes(live, at, size)
        if dropped:
            await self._trim()
        return RunInfo(id=run_id, target=target, args=args, principal=principal, created=now, updated=now, meta=meta)

    async def _drop_oldest(self) -> bool:
        """Drop the finished run that ended first; False when there is none."""
        oldest = await self._do("trim", self._client.zrange(self.books[4], 0, 0))
        if not oldest:
            return False
        run_id = str(oldest[0])
        await self._do("trim", self._drop(keys=[*self.books, *self._run(run_id), self.index], args=[run_id]))
        return True

    async def _trim(self) -> None:
        """Drop the oldest finished runs while the queue is past ``max_runs`` or ``max_bytes``."""
        bounds = self.bounds
        while True:
            count = int(await self._do("trim", self._client.hlen(self.books[0])))
            total = int(await self._do("trim", self._client.get(self.books[1])) or 0)
            if count <= bounds.max_runs and total <= bounds.max_bytes:
                return
            if not await self._drop_oldest():
                return  # live runs only: they stay

    async def _expire_parked(self) -> int:
        """Fail the runs that waited for input past ``parked_ttl_s``; answers how many."""
        ttl = self.bounds.parked_ttl_s
        now = time.time()
        cutoff = now - ttl
        old = await self._do(
            "expire", self._client.zrange(self.books[5], "-inf", cutoff, sortby=PureToken.BYSCORE, offset=0, count=1000)
        )
        answer = expired_answer(ttl)
        packed = pack_answer(answer).decode()
        data = event_blob({**outcome_of(answer), "expired": True}).decode()
        n = 0
        for run_id in old:
            args: list[str | int] = [run_id, repr(now), packed, data, repr(cutoff), self._retention]
            keys = [*self.books, *self._run(run_id)]
            n += int(await self._do("expire", self._expire(keys=keys, args=args)))
        return n

    async def suspend(self, run_id: str, worker: str, pending: Mapping[str, object]) -> bool:
        run, _, events = self._run(run_id)
        info = await self.get(run_id)
        if info is None:
            return False
        meta = orjson.dumps({**info.meta, "pending": pending}).decode()
        data = event_blob({"keys": sorted(pending)}).decode()
        got: Any = await self._do(
            "suspend",
            self._suspend(
                keys=[*self.books, run, events, self.stream],
                args=[run_id, worker, repr(time.time()), meta, GROUP, data],
            ),
        )
        return bool(got)

    async def answer(self, run_id: str, responses: dict[str, Any], *, by: str | None = None) -> RunInfo | None:
        run, _, events = self._run(run_id)
        await self._expire_parked()
        while True:
            raw = await self._do("answer", self._client.hget(run, "meta"))
            info = await self.get(run_id)
            if info is None or raw is None:
                return info
            meta, resumed = merge_answers(orjson.loads(raw), responses)
            args = [run_id, raw, orjson.dumps(meta).decode(), "1" if resumed else "0", repr(time.time()), by or ""]
            if await self._do("answer", self._answer(keys=[*self.books, run, events, self.stream], args=args)):
                return await self.get(run_id)

    async def _take(self, entry_id: str, run_id: str, worker: str) -> RunInfo | None:
        run, _, events = self._run(run_id)
        got: Any = await self._do(
            "lease", self._lease(keys=[*self.books, run, events], args=[run_id, worker, repr(time.time())])
        )
        if not got:
            # Cancelled, ended or gone before it started: its entry goes.
            await self._do("lease", self._client.xack(self.stream, GROUP, [entry_id]))
            await self._do("lease", self._client.xdel(self.stream, [entry_id]))
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
            claimed = await self._do(
                "lease", self._client.xautoclaim(self.stream, GROUP, worker, lease_ms, "0-0", count=1)
            )
            for entry in claimed[1]:
                got = await self._take(entry.identifier, entry.field_values["run"], worker)
                if got is not None:
                    self._next_reclaim = now  # there may be more
                    return got
        block = max(1, int(min(wait_s, self.timeout_s) * 1000))
        read = await self._do("lease", self._client.xreadgroup(GROUP, worker, {self.stream: ">"}, count=1, block=block))
        for entries in (read or {}).values():
            for entry in entries:
                got = await self._take(str(entry.identifier), str(entry.field_values["run"]), worker)
                if got is not None:
                    return got
        return None

    async def renew(self, run_id: str, worker: str, lease_s: float) -> Renewal:
        run, _, _ = self._run(run_id)
        got: Any = await self._do("renew", self._renew(keys=[run, self.stream], args=[GROUP, worker]))
        return Renewal(False) if got == -1 else Renewal(True, got == 1)

    def _limits(self) -> list[str | int]:
        b = self.bounds
        return [b.max_runs, b.max_bytes, b.max_run_events, b.max_run_bytes]

    async def save(self, run_id: str, worker: str, steps: dict[str, dict[str, Any]], events: list[NewEvent]) -> bool:
        keys = [*self.books, *self._run(run_id)]
        args: list[str | int] = [run_id, worker, repr(time.time()), *self._limits(), len(steps)]
        for path, result in steps.items():
            args += [path, orjson.dumps(result).decode()]
        args += _event_args(events)
        got = int(await self._do("save", self._save(keys=keys, args=args)))
        if got == 2:
            await self._trim()
        return got > 0

    async def recorded(self, run_id: str) -> dict[str, dict[str, Any]]:
        _, steps, _ = self._run(run_id)
        got = await self._do("recorded", self._client.hgetall(steps))
        return {path: orjson.loads(result) for path, result in got.items()}

    async def finish(self, run_id: str, worker: str, status: RunStatus, answer: object) -> bool:
        packed = pack_answer(answer)
        large = too_large_answer(len(packed), self.bounds.max_run_bytes)
        args: list[str | int] = [
            run_id,
            worker,
            repr(time.time()),
            status,
            packed.decode(),
            event_blob(outcome_of(answer)).decode(),
            GROUP,
            self._retention,
            self.bounds.max_run_bytes,
            pack_answer(large).decode(),
            event_blob(outcome_of(large)).decode(),
            self.bounds.max_runs,
            self.bounds.max_bytes,
        ]
        keys = [*self.books, *self._run(run_id), self.stream]
        got = int(await self._do("finish", self._finish(keys=keys, args=args)))
        if got == 2:
            await self._trim()
        return got > 0

    async def cancel(self, run_id: str, *, by: str | None = None) -> RunInfo | None:
        answer = pack_answer(cancelled_answer("cancelled before it started")).decode()
        keys = [*self.books, *self._run(run_id), self.stream]
        args: list[str | int] = [run_id, repr(time.time()), answer, by or "", GROUP, self._retention]
        got: Any = await self._do("cancel", self._cancel(keys=keys, args=args))
        return None if got is None else await self.get(run_id)

    async def get(self, run_id: str) -> RunInfo | None:
        h = await self._do("get", self._client.hgetall(self._run(run_id)[0]))
        return _info(h) if h and "id" in h else None

    async def runs(self, *, limit: int = 50, status: str | None = None) -> list[RunInfo]:
        out: list[RunInfo] = []
        start, page = 0, max(limit, 100)
        while len(out) < limit:
            ids = await self._do("runs", self._client.zrange(self.index, start, start + page - 1, rev=True))
            if not ids:
                break
            for run_id in ids:
                info = await self.get(run_id)
                if info is not None and (status is None or info.status == status):
                    out.append(info)
            start += page
        return out[:limit]

    async def page(
        self,
        *,
        status: str | None = None,
        target: str | None = None,
        principals: tuple[str | None, ...] | None = None,
        since: float | None = None,
        until: float | None = None,
        before: str | None = None,
        limit: int = 50,
    ) -> RunPage:
        limit = max(1, min(limit, MAX_PAGE))
        if principals is not None and not principals:
            return RunPage(runs=[])
        cscore = cid = ""
        if before:
            cscore, _, cid = before.partition("|")
            try:
                float(cscore)
            except ValueError:
                return RunPage(runs=[])
        wanted = [p or "" for p in principals] if principals is not None else []
        maxs = f"({until!r}" if until is not None else "+inf"
        mins = repr(since) if since is not None else "-inf"
        if cscore and until is not None and float(cscore) >= until:
            cscore = ""
        args: list[str | int] = [f"{self.prefix}:run:", maxs, mins, cscore, cid, status or "", target or ""]
        await self._ensure_facets()
        args += [len(wanted), *wanted, limit, MAX_SCAN, self.facets]
        got: list[Any] = list(await self._do("page", self._page(keys=[self.index], args=args)))
        rows: list[list[str]] = got[0]
        scanned, partial, last_id, last_score = int(got[1]), bool(got[2]), str(got[3]), str(got[4])
        more = len(rows) > limit
        rows = rows[:limit]
        runs = [
            RunInfo(
                id=r[0],
                target=r[2],
                principal=r[3] or None,
                status=cast(RunStatus, r[4]),
                created=float(r[5]),
                updated=float(r[6]),
                worker=r[7] or None,
                attempts=int(r[8]),
                cancel=r[9] == "1",
                lapses=int(r[10]),
            )
            for r in rows
        ]
        if more:
            nxt: str | None = f"{rows[-1][1]}|{rows[-1][0]}"
        else:
            nxt = f"{last_score}|{last_id}" if partial and last_id else None
        return RunPage(runs=runs, next=nxt, scanned=int(scanned), partial=bool(partial))

    async def _ensure_facets(self) -> None:
        """Whether the facets hold every run: once per queue (its mark ``PREFIX:runs:facets:v1``), the runs
        enqueued before there were facets are read into them, a batch at a time."""
        if self._facets_ready:
            return
        mark = f"{self.facet_keys}:v1"
        if not await self._do("page", self._client.exists([mark])):
            lowest = "-inf"
            while True:
                args: list[str | int] = [f"{self.prefix}:run:", self.facets, self.facet_keys, lowest, FACET_BATCH]
                got: list[Any] = list(await self._do("page", self._backfill(keys=[self.index], args=args)))
                if int(got[0]) < FACET_BATCH:
                    break
                lowest = str(got[1])
            await self._do("page", self._client.set(mark, "1"))
        self._facets_ready = True

    async def counts(self) -> dict[str, int]:
        done = await self._do("counts", self._client.zcard(self.books[4]))
        parked = await self._do("counts", self._client.zcard(self.books[5]))
        total = await self._do("counts", self._client.zcard(self.index))
        await self._ensure_group()
        pending = await self._do("counts", self._client.xpending(self.stream, GROUP))
        length = await self._do("counts", self._client.xlen(self.stream))
        running = int(getattr(pending, "pending", 0) or 0)
        queued = max(0, int(length) - running)
        out = {"queued": queued, "running": running, "input_required": int(parked), "finished": int(done)}
        out["other"] = max(0, int(total) - sum(out.values()))
        return {k: v for k, v in out.items() if v}

    async def emit(self, run_id: str, worker: str | None, events: list[NewEvent]) -> None:
        if not events:
            await trio.lowlevel.checkpoint()
            return
        run, _, events_key = self._run(run_id)
        args: list[str | int] = [run_id, worker or "", repr(time.time()), *self._limits(), *_event_args(events)]
        got = int(await self._do("emit", self._emit(keys=[*self.books, run, events_key], args=args)))
        if got == 2:
            await self._trim()

    async def events(
        self, run_id: str, *, after: str | None = None, limit: int = 1000, wait_s: float = 0
    ) -> list[RunEvent]:
        key = self._run(run_id)[2]
        got = await self._do("events", self._client.xrange(key, f"({after}" if after else "-", "+", count=limit))
        if not got and wait_s > 0:
            block = max(1, int(min(wait_s, self.timeout_s) * 1000))
            read = await self._do("events", self._client.xread({key: after or "0-0"}, count=limit, block=block))
            got = tuple(e for entries in (read or {}).values() for e in entries)
        return [_event(e) for e in got]

    async def sweep(self) -> int:
        """Fail the runs that waited for input past ``parked_ttl_s``, drop the finished runs past the
        retention (with their books), and the index entries of runs Redis has expired; answers how many
        runs went."""
        await self._expire_parked()
        cutoff = time.time() - self.bounds.retention_s
        gone = 0
        old = await self._do("sweep", self._client.zrange(self.books[4], "-inf", cutoff, sortby=PureToken.BYSCORE))
        for run_id in old:
            keys = [*self.books, *self._run(run_id), self.index]
            gone += int(await self._do("sweep", self._drop(keys=keys, args=[run_id])))
        old = await self._do("sweep", self._client.zrange(self.index, "-inf", cutoff, sortby=PureToken.BYSCORE))
        stale = [r for r in old if not await self._do("sweep", self._client.exists([self._run(r)[0]]))]
        if stale:
            await self._do("sweep", self._client.zrem(self.index, stale))
            for key in await self._do("sweep", self._client.smembers(self.facet_keys)):
                await self._do("sweep", self._client.zrem(key, stale))
                if not await self._do("sweep", self._client.exists([key])):
                    await self._do("sweep", self._client.srem(self.facet_keys, [key]))
        return gone + len(stale)

    async def usage(self) -> tuple[int, int]:
        """How many runs the queue keeps, and how many bytes they hold (arguments, recorded steps, events,
        answers)."""
        count = int(await self._do("usage", self._client.hlen(self.books[0])))
        total = int(await self._do("usage", self._client.get(self.books[1])) or 0)
        return count, total
