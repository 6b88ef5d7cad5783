"""The job thread of `vsagen serve` (`vsagen.serve.worker`): the steps counted on diffusers' progress bar as the
job's progress, the stages added up for /metrics, a job that cannot run ended failed with one line and its code
(the success path, on the tiny model: tests/serve/test_routes.py)."""

from __future__ import annotations

import types

import pytest
from tqdm import tqdm

from vsagen.errors import RunFailure
from vsagen.serve.jobs import Served, VideoFields, accepted
from vsagen.serve.store import JobStore
from vsagen.serve.worker import STAGES, Metrics, Worker, _CountingBar


def test_the_counting_bar_reports_each_step_and_keeps_the_bar():
    seen = []
    with _CountingBar(tqdm(total=4, disable=True), seen.append) as bar:
        for _ in range(3):
            bar.update()
        bar.update(1)
        assert bar.total == 4  # the wrapped bar's attributes
    assert seen == [1, 2, 3, 4] and bar.done == 4


def test_metrics_add_the_stages_and_skip_what_was_not_timed():
    m = Metrics(load_s=2.0)
    m.add({"denoise_s": 1.5, "total_s": 2.0, "attention_backend_s": None, "other": 9})
    m.add({"denoise_s": 0.5, "total_s": 1.0})
    assert m.stage_s["denoise_s"] == 2.0 and m.stage_s["total_s"] == 3.0 and m.stage_s["attention_backend_s"] == 0
    assert set(m.stage_s) == set(STAGES)


class Refusing:
    """A loaded model whose runs fail as `error` says (the worker's handling of each failure)."""

    load_s = 1.0

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.session = types.SimpleNamespace(load_s=1.0, pipe=types.SimpleNamespace(progress_bar=lambda **k: None))

    def pipe_for(self, cfg):
        return self.session.pipe

    def generate(self, cfg):
        raise self.error


@pytest.fixture
def served(tmp_path, vsagen_cache):
    from vsagen.commands.generate_config import resolve_run
    from vsagen.request.options import request_options

    flags = dict(model="tiny", steps=1, height=16, width=16, frames=1, device="cpu")
    base = resolve_run("x", request_options(**flags, out=tmp_path / "v" / "x.mp4", overwrite=True))
    return Served(request_options(**flags), base, tmp_path / "v")


@pytest.mark.parametrize("error,code,message", [
    (RunFailure("out of GPU memory while generating"), "run_failed", "out of GPU memory while generating"),
    (ValueError("odd\nsecond line"), "internal_error", "ValueError: odd"),
])
def test_a_job_that_fails_ends_failed_with_one_line(tmp_path, served, error, code, message):
    store = JobStore(tmp_path / "jobs.sqlite3")
    fields = VideoFields("a fox")
    store.add("video_1", accepted(fields, served.config("video_1", fields)), limit=4)
    lines = []
    worker = Worker(store, served, Refusing(error), log=lines.append)
    worker.run(store.claim())
    job = store.get("video_1")
    assert (job.status, job.error_code, job.error_message) == ("failed", code, message)
    assert worker.metrics.ended == {"completed": 0, "failed": 1} and worker.running == {}
    assert lines == ["video_1: started (attempt 1)", f"video_1: failed: {message}"]
    assert worker.resident.session.pipe.progress_bar(total=1) is None  # the wrapper taken off again


def test_a_job_the_server_no_longer_takes_fails_as_invalid(tmp_path, served):
    store = JobStore(tmp_path / "jobs.sqlite3")
    fields = VideoFields("a fox", model="another")  # (accepted by a server of another model)
    store.add("video_2", {"request": fields.to_json(), "video": {}}, limit=4)
    worker = Worker(store, served, Refusing(AssertionError("not reached")))
    worker.run(store.claim())
    job = store.get("video_2")
    assert (job.status, job.error_code) == ("failed", "invalid_request")
    assert job.error_message == "model 'another' is not served here; this server runs 'tiny'"


def test_the_thread_takes_queued_jobs_and_stops(tmp_path, served):
    store = JobStore(tmp_path / "jobs.sqlite3")
    fields = VideoFields("a fox")
    worker = Worker(store, served, Refusing(RunFailure("no")))
    worker.start()
    store.add("video_3", accepted(fields, served.config("video_3", fields)), limit=4)
    worker.wake()
    import time

    deadline = time.monotonic() + 10
    while store.get("video_3").status != "failed":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    worker.stop()
    assert not any(t.is_alive() for t in worker._threads)


class Stepping(Refusing):
    """A loaded model whose run counts its steps on the pipeline's progress bar, as diffusers' loop does."""

    def __init__(self, steps: int, before: callable) -> None:
        super().__init__(AssertionError("not raised"))
        self.steps, self.before = steps, before
        self.session.pipe = types.SimpleNamespace(progress_bar=lambda total: tqdm(total=total, disable=True))

    def generate(self, cfg):
        with self.session.pipe.progress_bar(total=self.steps) as bar:
            for i in range(self.steps):
                self.before(i)
                bar.update()
        raise RunFailure("(the test's run ends here)")


def test_steps_set_the_progress_and_a_stop_queues_the_job_again(tmp_path, served):
    store = JobStore(tmp_path / "jobs.sqlite3")
    fields = VideoFields("a fox", steps=4)
    store.add("video_4", accepted(fields, served.config("video_4", fields)), limit=4)
    seen, workers, paces = [], [], []

    def before(i: int) -> None:
        seen.append((store.get("video_4").progress, workers[0].steps_done("video_4")))
        paces.append(workers[0].job_s_estimate())  # the job's seconds at its pace so far (Retry-After's)
        if i == 2:
            workers[0]._stop.set()  # the server stops during the third step

    workers.append(Worker(store, served, Stepping(4, before)))
    workers[0].run(store.claim())
    worker = workers[0]
    assert seen == [(0, 0), (22, 1), (45, 2)]  # 90% x steps done / 4, in the store and in memory
    job = store.get("video_4")
    assert (job.status, job.attempts, job.progress) == ("queued", 0, 0) and worker.running == {}
    assert paces[0] is None and 0 < paces[1] and worker.started == {} and worker.job_s_estimate() is None
