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
    lapses INTEGER NOT NULL DEFAULT 0
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

_COLUMNS = "id, target, args, principal, status, created, updated, worker, attempts, cancel, answer, meta, lapses"

RETENTION_S = 7 * 86400.0
MAX_RUN_BYTES = 16 * 1024 * 1024
MAX_RUNS = 1000
MAX_BYTES = 256 * 1024 * 1024
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


def _drop(db: sqlite3.Connection, run_id: str) -> None:
    db.execute("DELETE FROM steps WHERE run = ?", (run_id,))
    db.execute("DELETE FROM events WHERE run = ?", (run_id,))
    db.execute("DELETE FROM runs WHERE id = ?", (run_id,))


def _add_events(db: sqlite3.Connection, run_id: str, worker: str | None, events: list[NewEvent], now: float) -> None:
    if events:
        db.executemany(
            "INSERT INTO events (run, at, type, worker, data) VALUES (?, ?, ?, ?, ?)",
            [(run_id, now, type_, worker, orjson.dumps(data)) for type_, data in events],
        )


class SqliteRunQueue:
    """Runs in one SQLite file (created with its tables on first use).

    Args:
        path: the file.
        retention_s: how long a terminal run, its steps and its events are kept.
        max_run_bytes: the most one run keeps (arguments, recorded steps, answer): larger arguments are
            refused (:class:`~mcpipe.store.RunRefused`), a larger answer is kept as an ``OUTPUT_TOO_LARGE`` error.
        max_runs, max_bytes: the most runs, and bytes of runs, the queue keeps: the oldest finished runs are
            dropped first; a new run is refused when only live runs are left to drop.
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
    ) -> None:
        self.path = path
        self.retention_s = retention_s
        self.max_run_bytes = max_run_bytes
        self.max_runs = max_runs
        self.max_bytes = max_bytes
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
            columns = {col[1] for col in db.execute("PRAGMA table_info(runs)")}
            # A file written before runs counted their bytes, or their lapsed leases.
            for column in ("bytes", "lapses"):
                if column not in columns:
                    try:
                        db.execute(f"ALTER TABLE runs ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")
                    except sqlite3.OperationalError:  # another connection added it first
                        pass
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

    # --- the queue ---

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
        if size > self.max_run_bytes:
            raise RunRefused(
                f"the run's arguments are {size} bytes; a background run keeps at most {self.max_run_bytes}"
                " ([runs] max_run_bytes)"
            )

        def tx(db: sqlite3.Connection) -> None:
            self._make_room(db, size, keep=None)
            db.execute(
                "INSERT INTO runs (id, target, args, principal, status, created, updated, meta, bytes)"
                " VALUES (?,?,?,?,?,?,?,?,?)",
                (info.id, target, args_b, principal, "queued", now, now, meta_b, size),
            )
            _add_events(db, info.id, by, [("enqueued", {"target": target})], now)

        await self._do(lambda db: self._write(db, tx))
        self.wake()
        return info

    def _make_room(self, db: sqlite3.Connection, size: int, keep: str | None) -> None:
        """Drop the oldest finished runs until one more run of ``size`` bytes fits under ``max_runs`` and
        ``max_bytes`` (``keep``: a run already in, never dropped). Raises RunRefused when only live runs are
        left to drop (a new run only: ``keep`` is None)."""
        count, total = db.execute("SELECT count(*), coalesce(sum(bytes), 0) FROM runs").fetchone()
        more = 0 if keep is not None else 1
        while count + more > self.max_runs or total + size > self.max_bytes:
            row = db.execute(
                "SELECT id, bytes FROM runs WHERE status IN ('completed', 'failed', 'cancelled') AND id IS NOT ?"
                " ORDER BY updated, seq LIMIT 1",
                (keep,),
            ).fetchone()
            if row is None:
                if keep is not None:
                    return  # a finishing run: the live runs stay, and so does it
                live = (
                    count
                    - db.execute(
                        "SELECT count(*) FROM runs WHERE status IN ('completed', 'failed', 'cancelled')"
                    ).fetchone()[0]
                )
                runs = "1 run is" if live == 1 else f"{live} runs are"
                if count + more > self.max_runs:
                    raise RunRefused(
                        f"the run queue is full: {runs} queued or running, the most it keeps is "
                        f"{self.max_runs} ([runs] max_runs); try again once some have finished"
                    )
                raise RunRefused(
                    f"the run queue is full: its queued or running runs ({live}) hold {total} bytes, and this "
                    f"one {size} more; the most it keeps is {self.max_bytes} ([runs] max_bytes); try again once "
                    "some have finished"
                )
            _drop(db, row[0])
            count, total = count - 1, total - row[1]

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

    @staticmethod
    def _lease(db: sqlite3.Connection, worker: str, lease_s: float) -> RunInfo | None:
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
        _add_events(db, run_id, worker, [("leased", data)], now)
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
            if rows:
                db.execute("UPDATE runs SET bytes = bytes + ? WHERE id = ?", (sum(len(r[2]) for r in rows), run_id))
            _add_events(db, run_id, worker, events, time.time())
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
            meta = {**(orjson.loads(row[0]) if row[0] else {}), "pending": pending}
            db.execute(
                "UPDATE runs SET status = 'input_required', meta = ?, lease_until = NULL, updated = ? WHERE id = ?",
                (orjson.dumps(meta), now, run_id),
            )
            _add_events(db, run_id, worker, [("input_required", {"keys": sorted(pending)})], now)
            return True

        ok = await self._do(lambda db: self._write(db, tx))
        self._told()
        return ok

    async def answer(self, run_id: str, responses: dict[str, Any], *, by: str | None = None) -> RunInfo | None:
        def tx(db: sqlite3.Connection) -> RunInfo | None:
            now = time.time()
            row = db.execute("SELECT status, meta FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                return None
            if row[0] == "input_required":
                meta, resumed = merge_answers(orjson.loads(row[1]) if row[1] else {}, responses)
                status = "queued" if resumed else "input_required"
                db.execute(
                    "UPDATE runs SET status = ?, meta = ?, updated = ? WHERE id = ?",
                    (status, orjson.dumps(meta), now, run_id),
                )
                if resumed:
                    _add_events(db, run_id, by, [("resumed", {})], now)
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

    async def finish(self, run_id: str, worker: str, status: RunStatus, answer: Any) -> bool:
        answer_b = pack_answer(answer)

        def tx(db: sqlite3.Connection) -> bool:
            nonlocal answer, answer_b, status
            now = time.time()
            row = db.execute(
                "SELECT length(args) + coalesce(length(meta), 0) FROM runs"
                " WHERE id = ? AND worker = ? AND status = 'running'",
                (run_id, worker),
            ).fetchone()
            if row is None:
                return False
            size = row[0] + len(answer_b)
            if size > self.max_run_bytes:
                status, answer = "failed", too_large_answer(len(answer_b), self.max_run_bytes)
                answer_b = pack_answer(answer)
                size = row[0] + len(answer_b)
            # A finished run is never resumed: its recorded steps go (its answer holds what they said).
            db.execute("DELETE FROM steps WHERE run = ?", (run_id,))
            db.execute(
                "UPDATE runs SET status = ?, answer = ?, updated = ?, lease_until = NULL, bytes = ? WHERE id = ?",
                (status, answer_b, now, size, run_id),
            )
            _add_events(db, run_id, worker, [(status, outcome_of(answer))], now)
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
                    "UPDATE runs SET status = 'cancelled', cancel = 1, answer = ?, updated = ?,"
                    " bytes = length(args) + coalesce(length(meta), 0) + ? WHERE id = ?",
                    (answer, now, len(answer), run_id),
                )
                _add_events(db, run_id, by, [("cancelled", {"before_start": True})], now)
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

    async def emit(self, run_id: str, worker: str | None, events: list[NewEvent]) -> None:
        await self._do(lambda db: self._write(db, lambda d: _add_events(d, run_id, worker, events, time.time())))
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
        def tx(db: sqlite3.Connection) -> int:
            cutoff = time.time() - self.retention_s
            gone = [
                r[0]
                for r in db.execute(
                    "SELECT id FROM runs WHERE status IN ('completed', 'failed', 'cancelled') AND updated < ?",
                    (cutoff,),
                ).fetchall()
            ]
            for run_id in gone:
                _drop(db, run_id)
            return len(gone)

        return await self._do(lambda db: self._write(db, tx))

    async def usage(self) -> tuple[int, int]:
        """How many runs the queue keeps, and how many bytes they hold (arguments, recorded steps, answers)."""
        count, total = await self._do(
            lambda db: db.execute("SELECT count(*), coalesce(sum(bytes), 0) FROM runs").fetchone()
        )
        return int(count), int(total)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Create the tables, then sweep runs past their retention until cancelled."""
        await self._do(lambda db: None)
        task_status.started()
        try:
            while True:
                await trio.sleep(max(1.0, min(self.retention_s / 10, 300.0)))
                await self.sweep()
        finally:
            self.close()
