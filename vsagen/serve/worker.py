"""The thread of `vsagen serve` that makes the videos: it claims the oldest queued job (`vsagen.serve.store`),
resolves its request from the fields the store kept (`vsagen.serve.jobs.Served.config`), runs it on the loaded
model (`vsagen.commands.generate.Resident.generate`: the video and its JSON published together, or nothing) and
ends the job completed or failed with one line saying why. One job at a time: the model is one. When the server
stops, the running job stops at its next step and is queued again for the next start. (`vsagen serve --ray`
runs one such thread per replica, each handing its jobs to the replicas: `vsagen.serve.ray_serve.RayWorker`.)

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


class JobFailed(Exception):
    """A job that failed where it ran (a replica, `vsagen.serve.ray_serve`), with its error `code` and one line
    `message` (`failure_of`)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class Lost(Exception):
    """The process making a job's video went away mid-job (a replica died): the job is queued again, this attempt
    counted, until it was tried `MAX_ATTEMPTS` times, then failed "interrupted" (`Worker.run`)."""


def failure_of(error: Exception) -> tuple[str, str]:
    """The error code and one line of a job's failure: "invalid_request" for what the command line refuses
    (`BadInput`, its words), "run_failed" for another vsagen error, else "internal_error" with the exception's
    name and its message's first line."""
    if isinstance(error, BadInput):
        return "invalid_request", str(error)
    if isinstance(error, VsagenError):
        return "run_failed", str(error)
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return "internal_error", f"{type(error).__name__}: {first}"


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
    by_replica: dict[str, int] = field(default_factory=dict)  # videos completed by each replica (`--ray` only)

    def add(self, timing: dict[str, Any]) -> None:
        """Add one finished video's timing (its JSON's "timing")."""
        for stage in STAGES:
            value = timing.get(stage)
            if isinstance(value, (int, float)):
                self.stage_s[stage] += float(value)


def generate_counting(resident: Any, cfg: Any, report: Callable[[int], None]) -> Any:
    """`resident.generate(cfg)` (`vsagen.commands.generate.Resident`) with the pipeline's progress bar reporting
    the steps done so far to `report` (which may raise to stop the run at that step); returns its `RunResult`."""
    from ..wrapping import wrap_method

    def make(original: Callable) -> Callable:
        return lambda *a, **k: _CountingBar(original(*a, **k), report)

    undo = wrap_method(resident.pipe_for(cfg), "progress_bar", make)  # (the pipeline this video runs)
    try:
        return resident.generate(cfg)
    finally:
        undo()


def total_steps(cfg: Any) -> int:
    """The denoising steps a video of `cfg` counts on the progress bar (a re-noise sampler's sigmas)."""
    return cfg.steps if not cfg.sampler.renoise else len(cfg.sampler.sigmas)


class Worker:
    """Runs the store's jobs on the loaded model, one at a time, in a thread of its own (see the module
    docstring).

    Args:
        store: the job store; served: the server's options and folders; resident: the loaded model
            (`vsagen.commands.generate.Resident`; under `--ray`, the replicas' `LoadedFacts`: the checks without
            the pipeline); log: receives one line per job started and ended; lanes: threads taking jobs at once
            (1 here; one per replica under `--ray`).
    """

    def __init__(self, store: JobStore, served: Served, resident: Any, *,
                 log: Callable[[str], None] = lambda m: None, lanes: int = 1) -> None:
        self.store, self.served, self.resident, self.log = store, served, resident, log
        self.metrics = Metrics(load_s=resident.load_s)
        self.running: dict[str, int] = {}  # job id -> steps done, while the job runs
        self.started: dict[str, tuple[float, int]] = {}  # job id -> (perf_counter at its start, its steps)
        self._lock = threading.Lock()  # the metrics (several lanes)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, name=f"vsagen-serve-worker-{i}", daemon=True)
                         for i in range(lanes)]

    def start(self) -> None:
        """Start the threads."""
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the threads: a running job stops at its next denoising step (its files unwritten) and is queued
        again, this attempt not counted; a job past its steps (decoding, writing) finishes. Waits up to `timeout`
        seconds (a job still running then stays in progress in the store: the next start queues it again)."""
        self._stop.set()
        self._wake.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread.is_alive():
                thread.join(max(0.0, deadline - time.monotonic()))

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
        """Make one claimed job's video and end the job: completed, failed with its reason, or queued again (the
        server stopping; the replica making it lost, `Lost`)."""
        t0 = time.perf_counter()
        self.log(f"{job.id}: started (attempt {job.attempts})")
        try:
            cfg = self.served.config(job.id, VideoFields.from_json(job.fields["request"]))
            self.started[job.id] = (t0, total_steps(cfg))
            result = self._generate(job.id, cfg)
        except Stopped:
            self.store.requeue(job.id)
            self.log(f"{job.id}: stopped with the server; queued again")
        except Lost as e:
            self._lost(job, str(e), t0)
        except JobFailed as e:
            self._fail(job, e.code, e.message, t0)
        except Exception as e:  # noqa: BLE001 - the job fails with one line; the server goes on
            self._fail(job, *failure_of(e), t0)
        else:
            run_s = time.perf_counter() - t0
            self.store.complete(job.id, run_s)
            where = getattr(result, "replica", None)  # (a replica's result names it, `ray_serve.Made`)
            with self._lock:
                self.metrics.add(result.summary["timing"])
                self.metrics.ended["completed"] += 1
                if where is not None:
                    self.metrics.by_replica[where] = self.metrics.by_replica.get(where, 0) + 1
            self.log(f"{job.id}: completed in {run_s:.2f} s" + (f" on replica {where}" if where else ""))
        finally:
            self.running.pop(job.id, None)
            self.started.pop(job.id, None)

    def _fail(self, job: Job, code: str, message: str, t0: float) -> None:
        self.store.fail(job.id, code, message, time.perf_counter() - t0)
        with self._lock:
            self.metrics.ended["failed"] += 1
        self.log(f"{job.id}: failed: {message}")

    def _lost(self, job: Job, why: str, t0: float) -> None:
        """The job's maker went away: queued again (this attempt counted) or, after `MAX_ATTEMPTS`, failed."""
        if job.attempts < MAX_ATTEMPTS:
            self.store.requeue(job.id, counted=True)
            self.log(f"{job.id}: {why}; queued again")
            return
        self._fail(job, "interrupted", f"{why}, {job.attempts} time{'s' if job.attempts != 1 else ''}; not tried "
                                       "again", t0)

    def _generate(self, job_id: str, cfg: Any) -> Any:
        """`Resident.generate` with the pipeline's progress bar counting the job's steps (`generate_counting`)."""
        total = total_steps(cfg)
        self.running[job_id] = 0

        def report(done: int) -> None:
            if self._stop.is_set():
                raise Stopped
            self.running[job_id] = done
            self.store.progress(job_id, min(90, 90 * done // max(total, 1)))

        return generate_counting(self.resident, cfg, report)

    def job_s_estimate(self) -> float | None:
        """The seconds a whole job takes at the running jobs' pace so far (seconds since its start / steps done x
        its steps; the mean over the running jobs); None while no running job has finished a step."""
        now = time.perf_counter()
        paces = [(now - t0) / done * steps for job_id, (t0, steps) in list(self.started.items())
                 if (done := self.running.get(job_id))]
        return sum(paces) / len(paces) if paces else None

    def steps_done(self, job_id: str) -> int | None:
        """The steps the running job `job_id` has done (None: it is not running here)."""
        return self.running.get(job_id)
