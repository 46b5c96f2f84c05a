"""The embedded run queue: one SQLite file, shared by the processes of one box.

The file is in WAL mode, so readers never wait for the writer; every write is one ``BEGIN IMMEDIATE``
transaction (SQLite serializes writers across processes, with a busy timeout). Leasing is a compare-and-set
inside that transaction: the oldest run that is queued, or running under a lease that has run out, becomes
this worker's. SQLite's calls block, so they run in worker threads (``trio.to_thread``) under a bounded
limiter, each on a connection of a small pool.

SQLite has no notifications: an idle worker looks for work every ``poll_s``, and a run enqueued by the
same process wakes that process's workers at once.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
import trio

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

__all__ = ["SqliteRunQueue"]

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    target TEXT NOT NULL,
    args BLOB,
    principal TEXT,
    status TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    worker TEXT,
    lease_until REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    cancel INTEGER NOT NULL DEFAULT 0,
    answer BLOB,
    meta BLOB,
    bytes INTEGER NOT NULL DEFAULT 0,
    lapses INTEGER NOT NULL DEFAULT 0,
    parked REAL,
    events INTEGER NOT NULL DEFAULT 0,
    event_bytes INTEGER NOT NULL DEFAULT 0,
    events_dropped INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS runs_by_status ON runs (status, seq);
CREATE TABLE IF NOT EXISTS steps (
    run TEXT NOT NULL,
    path TEXT NOT NULL,
    result BLOB NOT NULL,
    PRIMARY KEY (run, path)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run TEXT NOT NULL,
    at REAL NOT NULL,
    type TEXT NOT NULL,
    worker TEXT,
    data BLOB
);
CREATE INDEX IF NOT EXISTS events_by_run ON events (run, seq);
"""

# Columns added since the first files were written: added to an older file when it is opened.
_ADDED = {
    "bytes": "INTEGER NOT NULL DEFAULT 0",
    "lapses": "INTEGER NOT NULL DEFAULT 0",
    "parked": "REAL",
    "events": "INTEGER NOT NULL DEFAULT 0",
    "event_bytes": "INTEGER NOT NULL DEFAULT 0",
    "events_dropped": "INTEGER NOT NULL DEFAULT 0",
}
# The console's filters (``page``): a principal's, a tool's and a time range's runs, newest first.
_INDEXES = """
CREATE INDEX IF NOT EXISTS runs_by_principal ON runs (principal, status);
CREATE INDEX IF NOT EXISTS runs_by_principal_seq ON runs (principal, seq);
CREATE INDEX IF NOT EXISTS runs_by_target ON runs (target, seq);
CREATE INDEX IF NOT EXISTS runs_by_created ON runs (created);
"""
_LIVE = "('queued', 'running', 'input_required')"
_DONE = "('completed', 'failed', 'cancelled')"

_COLUMNS = "id, target, args, principal, status, created, updated, worker, attempts, cancel, answer, meta, lapses"

POLL_S = 0.05
THREADS = 4


def _info(row: tuple[Any, ...]) -> RunInfo:
    id_, target, args, principal, status, created, updated, worker, attempts, cancel, answer, meta, lapses = row
    return RunInfo(
        id=id_,
        target=target,
        args=None if args is None else orjson.loads(args),
        principal=principal,
        status=status,
        created=created,
        updated=updated,
        worker=worker,
        attempts=attempts,
        cancel=bool(cancel),
        answer=unpack_answer(answer),
        meta={} if meta is None else orjson.loads(meta),
        lapses=lapses,
    )


_SUMMARY = "seq, id, target, principal, status, created, updated, worker, attempts, cancel, lapses"


def _summary(row: tuple[Any, ...]) -> RunInfo:
    _, id_, target, principal, status, created, updated, worker, attempts, cancel, lapses = row
    return RunInfo(
        id=id_,
        target=target,
        principal=principal,
        status=status,
        created=created,
        updated=updated,
        worker=worker,
        attempts=attempts,
        cancel=bool(cancel),
        lapses=lapses,
    )


def _drop(db: sqlite3.Connection, run_id: str) -> None:
    db.execute("DELETE FROM steps WHERE run = ?", (run_id,))
    db.execute("DELETE FROM events WHERE run = ?", (run_id,))
    db.execute("DELETE FROM runs WHERE id = ?", (run_id,))


def _add_events(
    db: sqlite3.Connection, bounds: Bounds, run_id: str, worker: str | None, events: list[NewEvent], now: float
) -> int:
    """Append ``events`` to the run's log within its bounds, charging them to the run's bytes: past
    ``max_run_events``, or past ``max_run_bytes`` with the run's other bytes, an event is dropped (its
    lifecycle events are kept), and the first one dropped leaves an ``events_dropped`` event. Answers the
    bytes charged. Events of a run the queue does not hold are dropped."""
    if not events:
        return 0
    row = db.execute("SELECT events, bytes, events_dropped FROM runs WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        return 0
    count, size, dropped = row
    charged = 0
    rows = []
    for type_, data in events:
        blob = event_blob(data)
        cost = len(blob) + len(type_) + EVENT_OVERHEAD
        if type_ not in LIFECYCLE and (count >= bounds.max_run_events or size + cost > bounds.max_run_bytes):
            if not dropped:
                limit = "max_run_events" if count >= bounds.max_run_events else "max_run_bytes"
                blob, type_ = orjson.dumps({"limit": f"[runs] {limit}"}), "events_dropped"
                cost = len(blob) + len(type_) + EVENT_OVERHEAD
                rows.append((run_id, now, type_, worker, blob))
                count, size, charged = count + 1, size + cost, charged + cost
            dropped += 1
            continue
        rows.append((run_id, now, type_, worker, blob))
        count, size, charged = count + 1, size + cost, charged + cost
    db.executemany("INSERT INTO events (run, at, type, worker, data) VALUES (?, ?, ?, ?, ?)", rows)
    db.execute(
        "UPDATE runs SET events = ?, event_bytes = event_bytes + ?, bytes = bytes + ?, events_dropped = ? WHERE id = ?",
        (count, charged, charged, dropped, run_id),
    )
    return charged


class SqliteRunQueue:
    """Runs in one SQLite file (created with its tables on first use).

    Args:
        path: the file.
        retention_s: how long a terminal run, its steps and its events are kept.
        max_run_bytes: the most one run keeps (arguments, recorded steps, events, answer): larger arguments are
            refused (:class:`~mcpipe.store.RunRefused`), events past it are dropped, a larger answer is kept as an
            ``OUTPUT_TOO_LARGE`` error.
        max_run_events: the most events one run keeps (its lifecycle events are kept past it).
        max_runs, max_bytes: the most runs, and bytes of runs, the queue keeps: the oldest finished runs are
            dropped first; a new run is refused when only live runs are left to drop.
        max_runs_per_principal, max_bytes_per_principal: the most live runs (queued, running, waiting for
            input), and bytes of them, one principal may have; past either a new run is refused.
        parked_ttl_s: how long a run may wait for its client's input; then it fails (``TIMEOUT``).
        poll_s: how often an idle worker (or a follower of events) looks again.
        threads: how many SQLite calls run at once (each on its own connection; one for an in-memory
            database).
    """

    def __init__(
        self,
        path: str,
        *,
        retention_s: float = RETENTION_S,
        poll_s: float = POLL_S,
        threads: int = THREADS,
        max_run_bytes: int = MAX_RUN_BYTES,
        max_runs: int = MAX_RUNS,
        max_bytes: int = MAX_BYTES,
        max_run_events: int = MAX_RUN_EVENTS,
        max_runs_per_principal: int = MAX_RUNS_PER_PRINCIPAL,
        max_bytes_per_principal: int = MAX_BYTES_PER_PRINCIPAL,
        parked_ttl_s: float = PARKED_TTL_S,
    ) -> None:
        self.path = path
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
        # An in-memory database has no other writer than this process, whose enqueues wake its workers:
        # nothing to poll for (an idle worker looks once per lease wait).
        memory = path.startswith("file:")
        self.poll_s = 3600.0 if memory else poll_s
        # Connections to a shared in-memory database lock whole tables, and a lock held by another
        # connection fails at once (busy_timeout does not apply): one connection at a time.
        self._limiter = trio.CapacityLimiter(1 if memory else threads)
        self._pool: list[sqlite3.Connection] = []
        self._pool_lock = threading.Lock()
        self._wakeup = trio.Event()
        self._news = trio.Event()

    @property
    def retention_s(self) -> float:
        return self.bounds.retention_s

    @property
    def max_run_bytes(self) -> int:
        return self.bounds.max_run_bytes

    @property
    def max_runs(self) -> int:
        return self.bounds.max_runs

    @property
    def max_bytes(self) -> int:
        return self.bounds.max_bytes

    # --- plumbing ---

    def _connect(self) -> sqlite3.Connection:
        # ``file:NAME?mode=memory&cache=shared``: one in-memory database shared by this process's connections.
        memory = self.path.startswith("file:")
        db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False, uri=memory)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA busy_timeout=30000")
        return db

    def _with_db(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        with self._pool_lock:
            db = self._pool.pop() if self._pool else None
        if db is None:
            db = self._connect()
            db.executescript(_SCHEMA)  # every new connection: a shared in-memory database may be new too
            have = {col[1] for col in db.execute("PRAGMA table_info(runs)")}
            for column, kind in _ADDED.items():
                if column not in have:
                    try:  # a file written before runs kept this column
                        db.execute(f"ALTER TABLE runs ADD COLUMN {column} {kind}")
                    except sqlite3.OperationalError:  # another connection added it first
                        pass
            db.executescript(_INDEXES)
        try:
            return fn(db)
        finally:
            with self._pool_lock:
                self._pool.append(db)

    async def _do(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await trio.to_thread.run_sync(self._with_db, fn, limiter=self._limiter)

    @staticmethod
    def _write(db: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        db.execute("BEGIN IMMEDIATE")
        try:
            out = fn(db)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return out

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, []
        for db in pool:
            db.close()

    def wake(self) -> None:
        self._wakeup.set()
        self._wakeup = trio.Event()

    def _told(self) -> None:
        self._news.set()
        self._news = trio.Event()

    def _events(self, db: sqlite3.Connection, run_id: str, worker: str | None, events: list[NewEvent]) -> int:
        return _add_events(db, self.bounds, run_id, worker, events, time.time())

    # --- the queue ---

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
        now = time.time()
        info = RunInfo(
            id=run_id or os.urandom(12).hex(),
            target=target,
            args=args,
            principal=principal,
            created=now,
            updated=now,
            meta=meta or {},
        )

        args_b, meta_b = orjson.dumps(args), orjson.dumps(info.meta)
        size = len(args_b) + len(meta_b)
        bounds = self.bounds
        if size > bounds.max_run_bytes:
            raise bounds.too_large(size)

        def tx(db: sqlite3.Connection) -> None:
            self._expire_parked(db, now)
            live, held = db.execute(
                f"SELECT count(*), coalesce(sum(bytes), 0) FROM runs WHERE principal IS ? AND status IN {_LIVE}",
                (principal,),
            ).fetchone()
            if live + 1 > bounds.max_runs_per_principal:
                raise bounds.principal_count(principal, live)
            if held + size > bounds.max_bytes_per_principal:
                raise bounds.principal_bytes(principal, held, size)
            self._make_room(db, size, keep=None)
            db.execute(
                "INSERT INTO runs (id, target, args, principal, status, created, updated, meta, bytes)"
                " VALUES (?,?,?,?,?,?,?,?,?)",
                (info.id, target, args_b, principal, "queued", now, now, meta_b, size),
            )
            self._events(db, info.id, by, [("enqueued", {"target": target})])

        await self._do(lambda db: self._write(db, tx))
        self.wake()
        return info

    def _make_room(self, db: sqlite3.Connection, size: int, keep: str | None) -> None:
        """Drop the oldest finished runs until one more run of ``size`` bytes fits under ``max_runs`` and
        ``max_bytes`` (``keep``: a run already in, never dropped). Raises RunRefused when only live runs are
        left to drop (a new run only: ``keep`` is None)."""
        bounds = self.bounds
        count, total = db.execute("SELECT count(*), coalesce(sum(bytes), 0) FROM runs").fetchone()
        more = 0 if keep is not None else 1
        while count + more > bounds.max_runs or total + size > bounds.max_bytes:
            row = db.execute(
                f"SELECT id, bytes FROM runs WHERE status IN {_DONE} AND id IS NOT ? ORDER BY updated, seq LIMIT 1",
                (keep,),
            ).fetchone()
            if row is None:
                if keep is not None:
                    return  # a finishing run: the live runs stay, and so does it
                live = count - db.execute(f"SELECT count(*) FROM runs WHERE status IN {_DONE}").fetchone()[0]
                if count + more > bounds.max_runs:
                    raise bounds.full_count(live)
                raise bounds.full_bytes(live, total, size)
            _drop(db, row[0])
            count, total = count - 1, total - row[1]

    def _expire_parked(self, db: sqlite3.Connection, now: float) -> int:
        """Fail the runs that have waited for their client's input past ``parked_ttl_s``; answers how many."""
        ttl = self.bounds.parked_ttl_s
        expired = db.execute(
            "SELECT id FROM runs WHERE status = 'input_required' AND parked < ?", (now - ttl,)
        ).fetchall()
        if not expired:
            return 0
        answer = expired_answer(ttl)
        packed = pack_answer(answer)
        for (run_id,) in expired:
            db.execute("DELETE FROM steps WHERE run = ?", (run_id,))
            db.execute(
                "UPDATE runs SET status = 'failed', answer = ?, updated = ?, parked = NULL, lease_until = NULL,"
                " bytes = length(args) + coalesce(length(meta), 0) + ? + event_bytes WHERE id = ?",
                (packed, now, len(packed), run_id),
            )
            self._events(db, run_id, None, [("failed", {**outcome_of(answer), "expired": True})])
        return len(expired)

    async def lease(self, worker: str, lease_s: float, wait_s: float) -> RunInfo | None:
        deadline = trio.current_time() + wait_s
        while True:
            wakeup = self._wakeup
            got = await self._do(lambda db: self._write(db, lambda d: self._lease(d, worker, lease_s)))
            if got is not None:
                self._told()
                return got
            left = deadline - trio.current_time()
            if left <= 0:
                return None
            with trio.move_on_after(min(self.poll_s, left)):
                await wakeup.wait()

    def _lease(self, db: sqlite3.Connection, worker: str, lease_s: float) -> RunInfo | None:
        now = time.time()
        row = db.execute(
            "SELECT id, worker, status FROM runs WHERE status = 'queued'"
            " OR (status = 'running' AND lease_until < ?) ORDER BY seq LIMIT 1",
            (now,),
        ).fetchone()
        if row is None:
            return None
        run_id, previous, status = row
        lapsed = int(status == "running")  # its worker stopped renewing: died, or stalled past the lease
        db.execute(
            "UPDATE runs SET status = 'running', worker = ?, lease_until = ?, attempts = attempts + 1,"
            " lapses = lapses + ?, updated = ? WHERE id = ?",
            (worker, now + lease_s, lapsed, now, run_id),
        )
        data = {} if previous is None else {"taken_over_from": previous}
        self._events(db, run_id, worker, [("leased", data)])
        return _info(db.execute(f"SELECT {_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone())

    async def renew(self, run_id: str, worker: str, lease_s: float) -> Renewal:
        def tx(db: sqlite3.Connection) -> Renewal:
            now = time.time()
            cur = db.execute(
                "UPDATE runs SET lease_until = ? WHERE id = ? AND worker = ? AND status = 'running' RETURNING cancel",
                (now + lease_s, run_id, worker),
            )
            row = cur.fetchone()
            return Renewal(False) if row is None else Renewal(True, bool(row[0]))

        return await self._do(lambda db: self._write(db, tx))

    async def save(self, run_id: str, worker: str, steps: dict[str, dict[str, Any]], events: list[NewEvent]) -> bool:
        def tx(db: sqlite3.Connection) -> bool:
            held = db.execute(
                "SELECT 1 FROM runs WHERE id = ? AND worker = ? AND status = 'running'", (run_id, worker)
            ).fetchone()
            if held is None:
                return False
            rows = [(run_id, path, orjson.dumps(r)) for path, r in steps.items()]
            db.executemany("INSERT OR REPLACE INTO steps (run, path, result) VALUES (?, ?, ?)", rows)
            added = sum(len(r[2]) for r in rows)
            if added:
                db.execute("UPDATE runs SET bytes = bytes + ? WHERE id = ?", (added, run_id))
            added += self._events(db, run_id, worker, events)
            if added:
                self._make_room(db, 0, keep=run_id)
            return True

        ok = await self._do(lambda db: self._write(db, tx))
        self._told()
        return ok

    async def suspend(self, run_id: str, worker: str, pending: dict[str, Any]) -> bool:
        def tx(db: sqlite3.Connection) -> bool:
            now = time.time()
            row = db.execute(
                "SELECT meta FROM runs WHERE id = ? AND worker = ? AND status = 'running'", (run_id, worker)
            ).fetchone()
            if row is None:
                return False
            meta_b = orjson.dumps({**(orjson.loads(row[0]) if row[0] else {}), "pending": pending})
            db.execute(
                "UPDATE runs SET status = 'input_required', meta = ?, lease_until = NULL, updated = ?, parked = ?,"
                " bytes = bytes - coalesce(length(meta), 0) + ? WHERE id = ?",
                (meta_b, now, now, len(meta_b), run_id),
            )
            self._events(db, run_id, worker, [("input_required", {"keys": sorted(pending)})])
            return True

        ok = await self._do(lambda db: self._write(db, tx))
        self._told()
        return ok

    async def answer(self, run_id: str, responses: dict[str, Any], *, by: str | None = None) -> RunInfo | None:
        def tx(db: sqlite3.Connection) -> RunInfo | None:
            now = time.time()
            self._expire_parked(db, now)
            row = db.execute("SELECT status, meta FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                return None
            if row[0] == "input_required":
                meta, resumed = merge_answers(orjson.loads(row[1]) if row[1] else {}, responses)
                meta_b = orjson.dumps(meta)
                status = "queued" if resumed else "input_required"
                db.execute(
                    "UPDATE runs SET status = ?, meta = ?, updated = ?, parked = CASE WHEN ? THEN NULL ELSE parked END,"
                    " bytes = bytes - coalesce(length(meta), 0) + ? WHERE id = ?",
                    (status, meta_b, now, resumed, len(meta_b), run_id),
                )
                if resumed:
                    self._events(db, run_id, by, [("resumed", {})])
            return _info(db.execute(f"SELECT {_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone())

        got = await self._do(lambda db: self._write(db, tx))
        self.wake()
        self._told()
        return got

    async def recorded(self, run_id: str) -> dict[str, dict[str, Any]]:
        rows = await self._do(
            lambda db: db.execute("SELECT path, result FROM steps WHERE run = ?", (run_id,)).fetchall()
        )
        return {path: orjson.loads(result) for path, result in rows}

    async def finish(self, run_id: str, worker: str, status: RunStatus, answer: object) -> bool:
        answer_b = pack_answer(answer)

        def tx(db: sqlite3.Connection) -> bool:
            nonlocal answer, answer_b, status
            now = time.time()
            row = db.execute(
                "SELECT length(args) + coalesce(length(meta), 0) + event_bytes FROM runs"
                " WHERE id = ? AND worker = ? AND status = 'running'",
                (run_id, worker),
            ).fetchone()
            if row is None:
                return False
            size = row[0] + len(answer_b)
            if size > self.bounds.max_run_bytes:
                status, answer = "failed", too_large_answer(len(answer_b), self.bounds.max_run_bytes)
                answer_b = pack_answer(answer)
                size = row[0] + len(answer_b)
            # A finished run is never resumed: its recorded steps go (its answer holds what they said).
            db.execute("DELETE FROM steps WHERE run = ?", (run_id,))
            db.execute(
                "UPDATE runs SET status = ?, answer = ?, updated = ?, lease_until = NULL, bytes = ? WHERE id = ?",
                (status, answer_b, now, size, run_id),
            )
            self._events(db, run_id, worker, [(status, outcome_of(answer))])
            self._make_room(db, 0, keep=run_id)
            return True

        ok = await self._do(lambda db: self._write(db, tx))
        self._told()
        return ok

    async def cancel(self, run_id: str, *, by: str | None = None) -> RunInfo | None:
        def tx(db: sqlite3.Connection) -> RunInfo | None:
            now = time.time()
            row = db.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                return None
            if row[0] in ("queued", "input_required"):
                answer = pack_answer(cancelled_answer("cancelled before it started"))
                db.execute("DELETE FROM steps WHERE run = ?", (run_id,))
                db.execute(
                    "UPDATE runs SET status = 'cancelled', cancel = 1, answer = ?, updated = ?, parked = NULL,"
                    " bytes = length(args) + coalesce(length(meta), 0) + ? + event_bytes WHERE id = ?",
                    (answer, now, len(answer), run_id),
                )
                self._events(db, run_id, by, [("cancelled", {"before_start": True})])
            elif row[0] == "running":
                db.execute("UPDATE runs SET cancel = 1, updated = ? WHERE id = ?", (now, run_id))
            return _info(db.execute(f"SELECT {_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone())

        got = await self._do(lambda db: self._write(db, tx))
        self._told()
        return got

    async def get(self, run_id: str) -> RunInfo | None:
        row = await self._do(lambda db: db.execute(f"SELECT {_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone())
        return None if row is None else _info(row)

    async def runs(self, *, limit: int = 50, status: str | None = None) -> list[RunInfo]:
        def q(db: sqlite3.Connection) -> list[Any]:
            if status is None:
                return db.execute(f"SELECT {_COLUMNS} FROM runs ORDER BY seq DESC LIMIT ?", (limit,)).fetchall()
            return db.execute(
                f"SELECT {_COLUMNS} FROM runs WHERE status = ? ORDER BY seq DESC LIMIT ?", (status, limit)
            ).fetchall()

        return [_info(r) for r in await self._do(q)]

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
        where: list[str] = []
        params: list[Any] = []
        if status is not None:
            where.append("status = ?")
            params.append(status)
        if target is not None:
            where.append("target = ?")
            params.append(target)
        if principals is not None:
            if not principals:
                return RunPage(runs=[])
            where.append("(" + " OR ".join("principal IS ?" for _ in principals) + ")")
            params.extend(principals)
        if since is not None:
            where.append("created >= ?")
            params.append(since)
        if until is not None:
            where.append("created < ?")
            params.append(until)
        # With a time filter the newest first are read off the creation-time index (its entries are ordered by
        # (created, seq)), which stops after the page; else off the sequence. A cursor names where a page ended.
        by_time = since is not None or until is not None
        if before:
            try:
                if before.startswith("t"):
                    at, _, seq = before[1:].partition(":")
                    where.append("(created, seq) < (?, ?)")
                    params += [float(at), int(seq)]
                else:
                    where.append("seq < ?")
                    params.append(int(before))
            except ValueError:
                return RunPage(runs=[])
        sql = f"SELECT {_SUMMARY} FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created DESC, seq DESC LIMIT ?" if by_time else " ORDER BY seq DESC LIMIT ?"
        params.append(limit + 1)
        rows = await self._do(lambda db: db.execute(sql, params).fetchall())
        more = len(rows) > limit
        rows = rows[:limit]
        nxt = None
        if more and rows:
            nxt = f"t{rows[-1][5]!r}:{rows[-1][0]}" if by_time else str(rows[-1][0])
        return RunPage(runs=[_summary(r) for r in rows], next=nxt, scanned=len(rows))

    async def counts(self) -> dict[str, int]:
        rows = await self._do(lambda db: db.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall())
        return {status: int(n) for status, n in rows}

    async def emit(self, run_id: str, worker: str | None, events: list[NewEvent]) -> None:
        def tx(db: sqlite3.Connection) -> None:
            if self._events(db, run_id, worker, events):
                self._make_room(db, 0, keep=run_id)

        await self._do(lambda db: self._write(db, tx))
        self._told()

    async def events(
        self, run_id: str, *, after: str | None = None, limit: int = 1000, wait_s: float = 0
    ) -> list[RunEvent]:
        start = int(after) if after else 0
        deadline = trio.current_time() + wait_s
        while True:
            news = self._news
            rows = await self._do(
                lambda db: db.execute(
                    "SELECT seq, at, type, worker, data FROM events WHERE run = ? AND seq > ? ORDER BY seq LIMIT ?",
                    (run_id, start, limit),
                ).fetchall()
            )
            left = deadline - trio.current_time()
            if rows or left <= 0:
                return [
                    RunEvent(cursor=str(seq), at=at, type=type_, worker=worker, data=orjson.loads(data) if data else {})
                    for seq, at, type_, worker, data in rows
                ]
            with trio.move_on_after(min(self.poll_s * 4, left)):
                await news.wait()

    async def sweep(self) -> int:
        """Fail the runs that waited for input past ``parked_ttl_s``, and drop terminal runs past the
        retention; answers how many went."""

        def tx(db: sqlite3.Connection) -> int:
            now = time.time()
            self._expire_parked(db, now)
            cutoff = now - self.bounds.retention_s
            old = db.execute(f"SELECT id FROM runs WHERE status IN {_DONE} AND updated < ?", (cutoff,)).fetchall()
            gone = [r[0] for r in old]
            for run_id in gone:
                _drop(db, run_id)
            return len(gone)

        got = await self._do(lambda db: self._write(db, tx))
        self._told()
        return got

    async def usage(self) -> tuple[int, int]:
        """How many runs the queue keeps, and how many bytes they hold (arguments, recorded steps, events,
        answers)."""
        count, total = await self._do(
            lambda db: db.execute("SELECT count(*), coalesce(sum(bytes), 0) FROM runs").fetchone()
        )
        return int(count), int(total)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Create the tables and sweep once (runs that waited for input past their time while no server ran
        expire now), then sweep until cancelled."""
        await self.sweep()
        task_status.started()
        try:
            while True:
                await trio.sleep(sweep_period(self.bounds))
                await self.sweep()
        finally:
            self.close()


def sweep_period(bounds: Bounds) -> float:
    """How often a queue sweeps: often enough for the retention and for parked runs to expire near their
    time (between 1 s and 5 min)."""
    return max(1.0, min(bounds.retention_s / 10, bounds.parked_ttl_s / 10, 300.0))
