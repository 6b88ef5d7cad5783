"""The thread of `vsagen serve` that makes the videos: it claims the oldest queued job (`vsagen.serve.store`),
resolves its request from the fields the store kept (`vsagen.serve.jobs.Served.config`), runs it on the loaded
model (`vsagen.commands.generate.Resident.generate`: the video and its JSON published together, or nothing) and
ends the job completed or failed with one line saying why. One job at a time: the model is one. When the server
stops, the running job stops at its next step and is queued again for the next start.

Progress: diffusers' denoising loop counts its steps on the pipeline's progress bar; while a job runs, the bar the
pipeline makes is wrapped so that each step also sets the job's progress (90% at the last step; 100% once the
video is published). The seconds of each stage of the finished videos (the timing JSON's) add up for /metrics.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import BadInput, VsagenError
from .jobs import Served, VideoFields
from .store import Job, JobStore

# the timing JSON's stages that /metrics adds up (seconds)
STAGES = ("text_encode_s", "denoise_s", "dit_s", "attention_backend_s", "vae_decode_s", "write_s", "total_s",
          "wait_s")
# how often a job is started before a crash during it counts as the job's own (`JobStore.recover`)
MAX_ATTEMPTS = 2


class Stopped(Exception):
    """The server is stopping: the running job ends at its next step, queued again (`Worker.stop`)."""


class _CountingBar:
    """A progress bar (tqdm) whose `update` also reports the steps done so far."""

    def __init__(self, bar: Any, report: Callable[[int], None]) -> None:
        self._bar, self._report, self.done = bar, report, 0

    def __enter__(self) -> "_CountingBar":
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._bar.__exit__(*exc)

    def update(self, n: int = 1) -> Any:
        out = self._bar.update(n)
        self.done += n
        self._report(self.done)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bar, name)


@dataclass
class Metrics:
    """What /metrics tells beyond the store's counts: the finished videos' seconds by stage, jobs ended by this
    process by outcome, the seconds the model took to load."""

    load_s: float = 0.0
    stage_s: dict[str, float] = field(default_factory=lambda: {s: 0.0 for s in STAGES})
    ended: dict[str, int] = field(default_factory=lambda: {"completed": 0, "failed": 0})

    def add(self, timing: dict[str, Any]) -> None:
        """Add one finished video's timing (its JSON's "timing")."""
        for stage in STAGES:
            value = timing.get(stage)
            if isinstance(value, (int, float)):
                self.stage_s[stage] += float(value)


class Worker:
    """Runs the store's jobs on the loaded model, one at a time, in a thread of its own (see the module
    docstring).

    Args:
        store: the job store; served: the server's options and folders; resident: the loaded model
            (`vsagen.commands.generate.Resident`); log: receives one line per job started and ended.
    """

    def __init__(self, store: JobStore, served: Served, resident: Any, *,
                 log: Callable[[str], None] = lambda m: None) -> None:
        self.store, self.served, self.resident, self.log = store, served, resident, log
        self.metrics = Metrics(load_s=resident.session.load_s)
        self.running: tuple[str, int] | None = None  # (job id, steps done) while a job runs
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="vsagen-serve-worker", daemon=True)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the thread: a running job stops at its next denoising step (its files unwritten) and is queued
        again, this attempt not counted; a job past its steps (decoding, writing) finishes. Waits up to `timeout`
        seconds (a job still running then stays in progress in the store: the next start queues it again)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def wake(self) -> None:
        """Say a job was queued."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            job = self.store.claim()
            if job is None:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            self.run(job)

    def run(self, job: Job) -> None:
        """Make one claimed job's video and end the job (completed, or failed with its reason)."""
        t0 = time.perf_counter()
        self.log(f"{job.id}: started (attempt {job.attempts})")
        try:
            cfg = self.served.config(job.id, VideoFields.from_json(job.fields["request"]))
            result = self._generate(job.id, cfg)
        except Stopped:
            self.store.requeue(job.id)
            self.log(f"{job.id}: stopped with the server; queued again")
        except BadInput as e:
            self._fail(job, "invalid_request", str(e), t0)
        except VsagenError as e:
            self._fail(job, "run_failed", str(e), t0)
        except Exception as e:  # noqa: BLE001 - the job fails with one line; the server goes on
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            self._fail(job, "internal_error", f"{type(e).__name__}: {first}", t0)
        else:
            run_s = time.perf_counter() - t0
            self.store.complete(job.id, run_s)
            self.metrics.add(result.summary["timing"])
            self.metrics.ended["completed"] += 1
            self.log(f"{job.id}: completed in {run_s:.2f} s")
        finally:
            self.running = None

    def _fail(self, job: Job, code: str, message: str, t0: float) -> None:
        self.store.fail(job.id, code, message, time.perf_counter() - t0)
        self.metrics.ended["failed"] += 1
        self.log(f"{job.id}: failed: {message}")

    def _generate(self, job_id: str, cfg: Any) -> Any:
        """`Resident.generate` with the pipeline's progress bar counting the job's steps."""
        from ..wrapping import wrap_method

        total = cfg.steps if not cfg.sampler.renoise else len(cfg.sampler.sigmas)
        self.running = (job_id, 0)

        def report(done: int) -> None:
            if self._stop.is_set():
                raise Stopped
            self.running = (job_id, done)
            self.store.progress(job_id, min(90, 90 * done // max(total, 1)))

        def make(original: Callable) -> Callable:
            return lambda *a, **k: _CountingBar(original(*a, **k), report)

        undo = wrap_method(self.resident.pipe_for(cfg), "progress_bar", make)  # (the pipeline this video runs)
        try:
            return self.resident.generate(cfg)
        finally:
            undo()

    def steps_done(self, job_id: str) -> int | None:
        """The steps the running job has done, if `job_id` is it."""
        running = self.running
        return running[1] if running is not None and running[0] == job_id else None
