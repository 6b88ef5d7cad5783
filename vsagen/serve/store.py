"""The jobs of `vsagen serve` in SQLite (write-ahead log, every change committed before it is answered), in
`FOLDER/jobs.sqlite3` beside the videos' folder `FOLDER/videos/`.

A job is accepted only once its row is committed (`JobStore.add`, which also bounds the queue and keeps an
idempotency key to one job). The worker claims the oldest queued job (`claim`: in_progress, one attempt more),
reports its progress and ends it completed or failed with a reason. After a crash (kill -9 mid-job) the next start's
`recover` finds every job the crash left in progress: completed if its video and JSON are both in place (the
publication is atomic, `vsagen.media.video.Outputs`), else queued again, or failed with the reason once it has
been tried `max_attempts` times. No other state lives outside this file and the videos' folder.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

STATUSES = ("queued", "in_progress", "completed", "failed")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    idempotency_key TEXT UNIQUE,
    body_sha256 TEXT,
    fields TEXT NOT NULL,
    status TEXT NOT NULL,
    progress INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    completed_at INTEGER,
    run_s REAL,
    error_code TEXT,
    error_message TEXT
)
"""


class QueueFull(Exception):
    """The queue holds `limit` jobs already (`JobStore.add`)."""

    def __init__(self, queued: int) -> None:
        super().__init__(f"the queue is full ({queued} job{'s' if queued != 1 else ''} waiting)")
        self.queued = queued


class KeyReused(Exception):
    """An idempotency key came back with another request body than its job's."""


@dataclass(frozen=True)
class Job:
    """One row of the store.

    Attributes:
        id: the job's id ("video_" and 32 hex digits); fields: the request's fields as accepted (`vsagen.serve.jobs`),
        status: one of STATUSES; progress: percent (0-100); attempts: how often a worker started it.
        created_at, completed_at: Unix seconds (completed_at None until it ended); run_s: the last attempt's seconds.
        error_code, error_message: why it failed (None otherwise).
    """

    id: str
    fields: dict[str, Any]
    status: str
    progress: int
    attempts: int
    created_at: int
    completed_at: int | None
    run_s: float | None
    error_code: str | None
    error_message: str | None


_COLUMNS = "id, fields, status, progress, attempts, created_at, completed_at, run_s, error_code, error_message"


def _job(row: tuple) -> Job:
    return Job(row[0], json.loads(row[1]), *row[2:])


class JobStore:
    """The job table of one server (see the module docstring). Thread-safe: one connection behind a lock.

    Args:
        path: the SQLite file (created with its table where missing).

    Raises:
        sqlite3.Error: the file cannot be opened or is no database.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # committed means on disk, a power cut included
        self._db.execute(_SCHEMA)

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction under the lock (BEGIN IMMEDIATE ... COMMIT; ROLLBACK on an exception)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def add(self, job_id: str, fields: dict[str, Any], *, limit: int, key: str | None = None,
            body_sha256: str | None = None) -> tuple[Job, bool]:
        """Accept a job: committed queued, or the job an idempotency `key` already made.

        Returns:
            (the job, True) when added; (the key's earlier job, False) when `key` was seen with the same body.

        Raises:
            QueueFull: `limit` jobs are queued already (nothing written).
            KeyReused: `key` was seen with another body (`body_sha256`).
        """
        with self._write() as db:
            if key is not None:
                row = db.execute(f"SELECT {_COLUMNS}, body_sha256 FROM jobs WHERE idempotency_key = ?",
                                 (key,)).fetchone()
                if row is not None:
                    if row[-1] != body_sha256:
                        raise KeyReused(key)
                    return _job(row[:-1]), False
            queued = db.execute("SELECT COUNT(*) FROM jobs WHERE status = 'queued'").fetchone()[0]
            if queued >= limit:
                raise QueueFull(queued)
            db.execute("INSERT INTO jobs (id, idempotency_key, body_sha256, fields, status, created_at) "
                       "VALUES (?, ?, ?, ?, 'queued', ?)",
                       (job_id, key, body_sha256, json.dumps(fields, sort_keys=True), int(time.time())))
        return self.get(job_id), True

    def get(self, job_id: str) -> Job | None:
        """The job of `job_id`, or None."""
        with self._lock:
            row = self._db.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _job(row) if row is not None else None

    def page(self, *, after: str | None = None, limit: int = 20, order: str = "desc") -> tuple[list[Job], bool]:
        """Jobs by creation, newest first (`order` "desc") or oldest first ("asc"), after job `after` (exclusive;
        an unknown id: from the start); returns up to `limit` jobs and whether more follow."""
        op, direction = ("<", "DESC") if order == "desc" else (">", "ASC")
        with self._lock:
            seq = None
            if after is not None:
                row = self._db.execute("SELECT seq FROM jobs WHERE id = ?", (after,)).fetchone()
                seq = row[0] if row is not None else None
            where, args = (f"WHERE seq {op} ?", (seq,)) if seq is not None else ("", ())
            rows = self._db.execute(f"SELECT {_COLUMNS} FROM jobs {where} ORDER BY seq {direction} LIMIT ?",
                                    (*args, limit + 1)).fetchall()
        return [_job(r) for r in rows[:limit]], len(rows) > limit

    def delete(self, job_id: str) -> Job | None:
        """Remove a job that is not in progress; returns it as it was (None: no such job; an in-progress job is
        returned and kept)."""
        with self._write() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is not None and row[2] != "in_progress":
                db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
        return _job(row) if row is not None else None

    def claim(self) -> Job | None:
        """The oldest queued job, now in progress with one attempt more (None: the queue is empty)."""
        with self._write() as db:
            row = db.execute("SELECT id FROM jobs WHERE status = 'queued' ORDER BY seq LIMIT 1").fetchone()
            if row is None:
                return None
            db.execute("UPDATE jobs SET status = 'in_progress', progress = 0, attempts = attempts + 1 WHERE id = ?",
                       row)
        return self.get(row[0])

    def progress(self, job_id: str, percent: int) -> None:
        """Set an in-progress job's progress (percent)."""
        with self._write() as db:
            db.execute("UPDATE jobs SET progress = ? WHERE id = ? AND status = 'in_progress'", (percent, job_id))

    def complete(self, job_id: str, run_s: float) -> None:
        """End a job completed (progress 100) after `run_s` seconds."""
        with self._write() as db:
            db.execute("UPDATE jobs SET status = 'completed', progress = 100, completed_at = ?, run_s = ?, "
                       "error_code = NULL, error_message = NULL WHERE id = ?", (int(time.time()), run_s, job_id))

    def fail(self, job_id: str, code: str, message: str, run_s: float | None = None) -> None:
        """End a job failed, with `code` (e.g. "invalid_request", "run_failed") and one line of `message`."""
        with self._write() as db:
            db.execute("UPDATE jobs SET status = 'failed', completed_at = ?, run_s = ?, error_code = ?, "
                       "error_message = ? WHERE id = ?", (int(time.time()), run_s, code, message, job_id))

    def requeue(self, job_id: str, *, counted: bool = False) -> None:
        """Put an in-progress job back in the queue, this attempt not counted (the server stopped it) or, where
        `counted`, counted (the replica making it died: `recover`'s rule then fails it once tried too often)."""
        with self._write() as db:
            db.execute("UPDATE jobs SET status = 'queued', progress = 0, attempts = MAX(attempts - ?, 0) "
                       "WHERE id = ? AND status = 'in_progress'", (0 if counted else 1, job_id))

    def recover(self, published: Callable[[Job], bool], max_attempts: int) -> dict[str, int]:
        """After a start: every job left in progress (the server stopped mid-job) becomes completed where
        `published(job)` (its files are in place), queued again while it was tried fewer than `max_attempts`
        times, else failed ("interrupted") saying how often it was tried. Returns how many went each way."""
        counts = {"completed": 0, "queued": 0, "failed": 0}
        with self._write() as db:
            rows = db.execute(f"SELECT {_COLUMNS} FROM jobs WHERE status = 'in_progress'").fetchall()
            for job in map(_job, rows):
                if published(job):
                    db.execute("UPDATE jobs SET status = 'completed', progress = 100, completed_at = ? WHERE id = ?",
                               (int(time.time()), job.id))
                    counts["completed"] += 1
                elif job.attempts < max_attempts:
                    db.execute("UPDATE jobs SET status = 'queued', progress = 0 WHERE id = ?", (job.id,))
                    counts["queued"] += 1
                else:
                    db.execute("UPDATE jobs SET status = 'failed', completed_at = ?, error_code = 'interrupted', "
                               "error_message = ? WHERE id = ?",
                               (int(time.time()), f"the server stopped while this video was made, {job.attempts} "
                                                  f"time{'s' if job.attempts != 1 else ''}; not tried again",
                                job.id))
                    counts["failed"] += 1
        return counts

    def counts(self) -> dict[str, int]:
        """How many jobs are in each of STATUSES."""
        with self._lock:
            rows = dict(self._db.execute("SELECT status, COUNT(*) FROM jobs GROUP BY status").fetchall())
        return {s: int(rows.get(s, 0)) for s in STATUSES}

    def mean_run_s(self, last: int = 20) -> float | None:
        """The mean seconds of the last `last` completed jobs (None before one)."""
        with self._lock:
            row = self._db.execute("SELECT AVG(run_s) FROM (SELECT run_s FROM jobs WHERE status = 'completed' "
                                   "AND run_s IS NOT NULL ORDER BY seq DESC LIMIT ?)", (last,)).fetchone()
        return row[0]
