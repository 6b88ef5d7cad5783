"""The job store of `vsagen serve` (SQLite, WAL): a job is there once `add` returns (another connection, and a
process killed right after, see it), the queue's bound, idempotency keys, the worker's claim / progress / end,
listing pages, deleting, and the recovery of jobs a crash left in progress."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from vsagen.serve.store import STATUSES, JobStore, KeyReused, QueueFull

ROOT = Path(__file__).resolve().parents[2]


def fields(n: int) -> dict:
    return {"request": {"prompt": f"p{n}"}, "video": {"frames": 1}}


@pytest.fixture
def store(tmp_path):
    s = JobStore(tmp_path / "jobs.sqlite3")
    yield s
    s.close()


def test_a_job_is_on_disk_once_added_and_the_log_is_wal(store, tmp_path):
    job, created = store.add("video_a", fields(1), limit=5)
    assert created and (job.id, job.status, job.progress, job.attempts, job.fields) == ("video_a", "queued", 0, 0,
                                                                                       fields(1))
    other = sqlite3.connect(tmp_path / "jobs.sqlite3")  # another reader sees it committed
    assert other.execute("SELECT id, status FROM jobs").fetchall() == [("video_a", "queued")]
    assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_a_job_added_survives_a_kill_9_right_after(tmp_path):
    script = ("import os, signal, sys\nfrom vsagen.serve.store import JobStore\n"
              "s = JobStore(sys.argv[1])\ns.add('video_k', {'request': {}, 'video': {}}, limit=1)\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    res = subprocess.run([sys.executable, "-c", script, str(tmp_path / "j.sqlite3")], cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == -signal.SIGKILL
    again = JobStore(tmp_path / "j.sqlite3")
    assert again.get("video_k").status == "queued"


def test_the_queue_bound_counts_waiting_jobs_only(store):
    for i in range(2):
        store.add(f"video_{i}", fields(i), limit=2)
    with pytest.raises(QueueFull, match=r"the queue is full \(2 jobs waiting\)") as e:
        store.add("video_x", fields(9), limit=2)
    assert e.value.queued == 2 and store.get("video_x") is None
    assert store.claim().id == "video_0"  # one leaves the queue: room for one more
    store.add("video_2", fields(2), limit=2)
    assert store.counts() == {"queued": 2, "in_progress": 1, "completed": 0, "failed": 0}
    store.claim()
    with pytest.raises(QueueFull, match=r"^the queue is full \(1 job waiting\)$"):  # (new-user trial: "1 jobs")
        store.add("video_y", fields(8), limit=1)


def test_an_idempotency_key_is_one_job_and_refuses_other_fields(store):
    first, created = store.add("video_1", fields(1), limit=5, key="k", body_sha256="aa")
    again, created_again = store.add("video_2", fields(1), limit=5, key="k", body_sha256="aa")
    assert created and not created_again and again.id == first.id == "video_1"
    with pytest.raises(KeyReused):
        store.add("video_3", fields(3), limit=5, key="k", body_sha256="bb")
    assert store.get("video_2") is None and store.get("video_3") is None
    store.add("video_4", fields(4), limit=5, key="other", body_sha256="aa")  # another key: another job
    assert store.counts()["queued"] == 2


def test_claim_progress_complete_fail_in_order(store):
    for i in range(3):
        store.add(f"video_{i}", fields(i), limit=5)
    job = store.claim()
    assert (job.id, job.status, job.attempts) == ("video_0", "in_progress", 1)
    store.progress("video_0", 45)
    store.progress("video_1", 45)  # not in progress: unchanged
    assert store.get("video_0").progress == 45 and store.get("video_1").progress == 0
    store.complete("video_0", 1.5)
    done = store.get("video_0")
    assert (done.status, done.progress, done.run_s) == ("completed", 100, 1.5) and done.completed_at >= done.created_at
    assert store.claim().id == "video_1"
    store.fail("video_1", "run_failed", "out of memory", 0.25)
    failed = store.get("video_1")
    assert (failed.status, failed.error_code, failed.error_message) == ("failed", "run_failed", "out of memory")
    assert store.mean_run_s() == 1.5
    assert store.claim().id == "video_2" and store.claim() is None


def test_pages_newest_first_or_oldest_first(store):
    ids = [f"video_{i}" for i in range(5)]
    for n, i in enumerate(ids):
        store.add(i, fields(n), limit=10)
    page, more = store.page(limit=2)
    assert [j.id for j in page] == ["video_4", "video_3"] and more
    page, more = store.page(after="video_3", limit=10)
    assert [j.id for j in page] == ["video_2", "video_1", "video_0"] and not more
    page, more = store.page(after="video_1", order="asc", limit=10)
    assert [j.id for j in page] == ["video_2", "video_3", "video_4"] and not more
    assert [j.id for j in store.page(after="video_gone", limit=1)[0]] == ["video_4"]


def test_delete_keeps_a_job_in_progress(store):
    store.add("video_a", fields(1), limit=5)
    store.add("video_b", fields(2), limit=5)
    store.claim()
    assert store.delete("video_a").status == "in_progress" and store.get("video_a") is not None
    assert store.delete("video_b").status == "queued" and store.get("video_b") is None
    assert store.delete("video_none") is None


def test_recover_finishes_requeues_or_fails_what_a_crash_left(store):
    for i in range(4):
        store.add(f"video_{i}", fields(i), limit=10)
    for _ in range(3):
        store.claim()  # video_0..2 in progress (a crash mid-job)
    store.fail("video_2", "x", "y")  # ended before the crash: left alone
    store.add("video_2b", fields(5), limit=10)
    with store._write() as db:  # video_1 had been tried before
        db.execute("UPDATE jobs SET attempts = 2 WHERE id = 'video_1'")
    counts = store.recover(lambda job: job.id == "video_0", max_attempts=2)
    assert counts == {"completed": 1, "queued": 0, "failed": 1}
    assert store.get("video_0").status == "completed" and store.get("video_0").progress == 100
    failed = store.get("video_1")
    assert (failed.status, failed.error_code) == ("failed", "interrupted")
    assert failed.error_message == "the server stopped while this video was made, 2 times; not tried again"
    assert store.get("video_2").status == "failed" and store.get("video_3").status == "queued"
    store.claim()
    assert store.recover(lambda job: False, max_attempts=2) == {"completed": 0, "queued": 1, "failed": 0}
    assert set(store.counts()) == set(STATUSES)


def test_requeue_puts_a_stopped_job_back_uncounted(store):
    store.add("video_a", fields(1), limit=5)
    store.claim()
    store.requeue("video_a")
    job = store.get("video_a")
    assert (job.status, job.attempts, job.progress) == ("queued", 0, 0)
    store.requeue("video_a")  # not in progress: unchanged
    assert store.get("video_a").attempts == 0 and store.claim().attempts == 1
