"""`vsagen serve --ray` (`vsagen.serve.ray_serve`): the replica count and what each takes, the refusals before
anything loads (no ray installed, --replicas without --ray), the front's dispatch without Ray (a fake deployment
handle: a replica's steps as the job's progress, its failure as the job's, a replica lost: queued again then failed,
the front's stop: the running response cancelled, the job queued again), the replica's event stream without Ray;
then, where ray is installed, the real thing: a local Ray cluster on the CPU, two replicas of the tiny model behind
the real HTTP API, two videos made, one by each replica."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types

import pytest
from tqdm import tqdm

from vsagen.commands.generate import LoadedFacts
from vsagen.errors import BadInput
from vsagen.serve.jobs import Served, VideoFields, accepted
from vsagen.serve.ray_serve import (EXTRA, RayWorker, VideoReplica, _reason, check_ray_installed, check_reachable,
                                    replica_plan)
from vsagen.serve.store import JobStore
from vsagen.serve.worker import _CountingBar


@pytest.mark.parametrize("requested,device,resources,plan", [
    (None, "cuda", {"CPU": 64, "GPU": 8}, (8, {"num_gpus": 1.0})),  # one per GPU of the cluster
    (3, "cuda", {"CPU": 64, "GPU": 8}, (3, {"num_gpus": 1.0})),
    (None, "cpu", {"CPU": 2}, (1, {"num_cpus": 1.0})),
    (2, "cpu", {"CPU": 2.0}, (2, {"num_cpus": 1.0})),
])
def test_the_replicas_and_what_each_takes(requested, device, resources, plan):
    assert replica_plan(requested, device, resources) == plan


@pytest.mark.parametrize("requested,device,resources,words", [
    (None, "cuda", {"CPU": 8}, "the Ray cluster has no GPU"),
    (3, "cuda", {"GPU": 2}, "--replicas 3: each replica takes a GPU of its own and the Ray cluster has 2"),
    (3, "cpu", {"CPU": 2}, "--replicas 3: each replica takes a CPU of its own and the Ray cluster has 2"),
    (0, "cpu", {"CPU": 2}, "--replicas must be at least 1, got 0"),
])
def test_a_replica_count_the_cluster_cannot_hold_is_refused(requested, device, resources, words):
    with pytest.raises(BadInput, match=words.replace("-", r"\-").replace("(", r"\(")):
        replica_plan(requested, device, resources)


def test_without_ray_the_flag_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from vsagen.cli.app import app

    real = importlib.util.find_spec
    # neither ray nor Serve's aiohttp (whichever this machine has: a clean CI machine has neither)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("ray", "aiohttp") else real(name, *a))
    with pytest.raises(BadInput, match=rf"^vsagen serve --ray needs ray\[serve\] \(ray, aiohttp not installed\): "):
        check_ray_installed()
    for flags, words in ((["--ray"], f"error: vsagen serve --ray needs ray[serve] (ray, aiohttp not installed): "
                                     f"{EXTRA}\n"),
                         (["--replicas", "2"], "error: --replicas takes --ray")):
        res = CliRunner().invoke(app, ["serve", "--model", "tiny", *flags, "--folder", str(tmp_path / "f")])
        assert res.exit_code == 2 and res.stderr.startswith(words) and res.stderr.count("\n") == 1, res.stderr
        assert not (tmp_path / "f").exists()


def test_a_cluster_address_nothing_answers_at_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # (bound, not listening: refused)
        with pytest.raises(BadInput, match=rf"^--ray-address 127.0.0.1:{port}: no Ray cluster answers there \("):
            check_reachable(f"127.0.0.1:{port}")
    with pytest.raises(BadInput, match=r"^--ray-address head:port: give HOST:PORT \(the head node's"):
        check_reachable("head:port")
    for address in (None, "auto", "local", "ray://head:10001"):  # Ray's to resolve
        check_reachable(address)


def test_a_replica_s_failure_to_start_is_its_own_line():
    status = ('  File "vsagen/serve/ray_serve.py", line 125, in __init__\n    raise BadInput(...)\n'
              "vsagen.errors.BadInput: --folder /x is not on node b: every replica writes the videos there")
    assert _reason(status) == ("BadInput", "--folder /x is not on node b: every replica writes the videos there")
    assert _reason("Traceback\n  ...\nRuntimeError: CUDA error\n") == (None, "RuntimeError: CUDA error")


# the front's dispatch, with a fake deployment handle (no Ray)

class Response:
    """A streaming response of fake events; `before` sees each event before it is handed on; `error` raised at the
    end (a replica lost), or, with `block`, once cancelled (as Serve's cancelled request)."""

    def __init__(self, events, error=None, before=lambda e: None, block=False):
        self.events, self.error, self.before, self.block = events, error, before, block
        self.cancelled = threading.Event()

    def __iter__(self):
        for event in self.events:
            self.before(event)
            yield event
        if self.block:
            self.cancelled.wait(10)
        if self.error is not None:
            raise self.error

    def cancel(self):
        self.cancelled.set()


class Handle:
    """A deployment handle answering each `generate.remote` with the next of `responses`."""

    def __init__(self, *responses):
        self.responses, self.calls = list(responses), []
        self.generate = types.SimpleNamespace(remote=self.remote)

    def options(self, stream):
        assert stream
        return self

    def remote(self, job_id, cfg):
        self.calls.append((job_id, cfg.steps))
        return self.responses.pop(0)


@pytest.fixture
def served(tmp_path, vsagen_cache):
    from vsagen.commands.generate_config import resolve_run
    from vsagen.request.options import request_options

    flags = dict(model="tiny", steps=4, height=16, width=16, frames=1, device="cpu")
    base = resolve_run("x", request_options(**flags, out=tmp_path / "v" / "x.mp4", overwrite=True))
    (tmp_path / "v").mkdir()
    return Served(request_options(**flags), base, tmp_path / "v")


def _front(tmp_path, served, handle, job="video_1"):
    store = JobStore(tmp_path / "jobs.sqlite3")
    fields = VideoFields("a fox")
    store.add(job, accepted(fields, served.config(job, fields)), limit=4)
    lines = []
    facts = LoadedFacts(served.request, run=None, load_s=2.5)
    return store, RayWorker(store, served, facts, handle, replicas=2, log=lines.append), lines


def test_a_replica_s_steps_are_the_job_s_progress_and_its_video_counts_for_it(tmp_path, served):
    seen, workers = [], []
    events = [("step", 1), ("step", 2), ("step", 4), ("done", "node/a", {"total_s": 1.5, "denoise_s": 1.0})]
    before = lambda e: seen.append((store.get("video_1").progress, workers[0].steps_done("video_1")))  # noqa: E731
    store, worker, lines = _front(tmp_path, served, Handle(Response(events, before=before)))
    workers.append(worker)
    worker.run(store.claim())
    assert seen == [(0, 0), (22, 1), (45, 2), (90, 4)]  # 90% x steps done / 4, as each next event comes
    job = store.get("video_1")
    assert (job.status, job.progress, job.attempts) == ("completed", 100, 1) and worker.running == {}
    m = worker.metrics
    assert (m.load_s, m.stage_s["total_s"], m.stage_s["denoise_s"], m.by_replica) == (2.5, 1.5, 1.0, {"node/a": 1})
    assert lines[-1].startswith("video_1: completed in ") and lines[-1].endswith(" s on replica node/a")


def test_a_job_a_replica_failed_ends_failed_with_its_code(tmp_path, served):
    failed = ("failed", "run_failed", "out of GPU memory while generating")
    store, worker, lines = _front(tmp_path, served, Handle(Response([("step", 1), failed])))
    worker.run(store.claim())
    job = store.get("video_1")
    assert (job.status, job.error_code, job.error_message) == ("failed", "run_failed", failed[2])
    assert worker.metrics.ended == {"completed": 0, "failed": 1} and worker.metrics.by_replica == {}


class ActorDiedError(Exception):
    """(Ray's error of a replica that died, by name)"""


def test_a_replica_lost_queues_the_job_again_then_fails_it(tmp_path, served):
    lost = [Response([("step", 1)], error=ActorDiedError("the actor died")), Response([], error=ActorDiedError())]
    store, worker, lines = _front(tmp_path, served, Handle(*lost))
    left = served.videos / ".video_1.3f2a.mp4"  # a temporary of the dead replica's publication
    left.write_bytes(b"half")
    worker.run(store.claim())
    job = store.get("video_1")
    assert (job.status, job.attempts, job.progress) == ("queued", 1, 0) and not left.exists()  # this attempt counted
    worker.run(store.claim())
    job = store.get("video_1")
    assert (job.status, job.attempts, job.error_code) == ("failed", 2, "interrupted")
    assert job.error_message == ("the replica making this video stopped (ActorDiedError), 2 times; not tried again")
    assert lines == ["video_1: started (attempt 1)",
                     "video_1: the replica making this video stopped (ActorDiedError); queued again",
                     "video_1: started (attempt 2)", f"video_1: failed: {job.error_message}"]


def test_the_front_s_stop_cancels_the_running_response_and_queues_the_job_again(tmp_path, served):
    response = Response([("step", 1)], error=RuntimeError("cancelled"), block=True)
    store, worker, _ = _front(tmp_path, served, Handle(response))
    running = threading.Thread(target=worker.run, args=(store.claim(),))
    running.start()
    deadline = time.monotonic() + 10
    while worker.steps_done("video_1") != 1:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    worker.stop(timeout=10)
    running.join(10)
    assert response.cancelled.is_set()
    job = store.get("video_1")
    assert (job.status, job.attempts) == ("queued", 0)  # this attempt not counted


# the replica's side, without Ray

class Stepping:
    """A loaded model whose run counts `steps` on the pipeline's progress bar (as diffusers' loop does), each
    after `before(i)`, then returns a result with its timing."""

    load_s = 1.0

    def __init__(self, steps, before=lambda i: None):
        self.steps, self.before, self.finished = steps, before, False
        self.session = types.SimpleNamespace(pipe=types.SimpleNamespace(
            progress_bar=lambda total: tqdm(total=total, disable=True)))

    def generate(self, cfg):
        with self.session.pipe.progress_bar(total=self.steps) as bar:
            for i in range(self.steps):
                self.before(i)
                bar.update()
        self.finished = True
        return types.SimpleNamespace(summary={"timing": {"total_s": 0.5}})

    def pipe_for(self, cfg):  # (`Resident.pipe_for`: one pipeline here)
        return self.session.pipe


def _replica(resident):
    replica = object.__new__(VideoReplica)  # (its model given, not loaded)
    replica.resident, replica.name, replica.one_run = resident, "node/r", threading.Lock()
    return replica


def _events(resident, first_only=False):
    """The replica's events for one job, on an event loop as Serve runs it; `first_only`: the first event, then
    the stream closed (as Serve closes a cancelled request's), and the run's thread waited for."""
    async def collect():
        stream = _replica(resident).generate("video_1", cfg=None)
        if not first_only:
            return [event async for event in stream]
        first = await stream.__anext__()
        await stream.aclose()
        return [first]

    events = asyncio.run(collect())
    for thread in threading.enumerate():
        if thread.name == "vsagen-replica-video_1":
            thread.join(10)
    return events


def test_a_replica_streams_its_steps_then_its_video():
    assert _events(Stepping(3)) == [("step", 1), ("step", 2), ("step", 3), ("done", "node/r", {"total_s": 0.5})]


def test_a_replica_whose_stream_is_closed_stops_at_its_next_step():
    resident = Stepping(50, before=lambda i: time.sleep(0.01))
    assert _events(resident, first_only=True) == [("step", 1)]
    assert not resident.finished  # stopped at a next step (nothing published); the progress bar's wrapper taken off
    assert not isinstance(resident.session.pipe.progress_bar(total=1), _CountingBar)


def test_a_replica_s_failed_run_is_its_code_and_one_line():
    class Failing(Stepping):
        def generate(self, cfg):
            raise ValueError("odd\nsecond line")

    assert _events(Failing(1)) == [("failed", "internal_error", "ValueError: odd")]


# the real thing: a local Ray cluster on this machine's CPUs

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                    reason=f"ray is not installed ({EXTRA}): the test of vsagen serve --ray on a local Ray cluster")
def test_two_replicas_on_a_local_ray_cluster_make_a_video_each(tmp_path, vsagen_cache, tiny_dir):
    """`vsagen serve --ray --replicas 2` on a new local Ray cluster (the CPU, a CPU a replica), the tiny model:
    two videos posted at once over HTTP, polled to completed, downloaded (mp4 of the frames asked for, the timing
    JSON naming the folder's files), one made by each replica (/metrics); SIGTERM stops it (exit 0)."""
    import httpx

    port = _free_port()
    env = {**os.environ, "VSAGEN_CACHE": str(vsagen_cache), "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    log = tmp_path / "server.log"
    argv = ["serve", "--ray", "--replicas", "2", "--ray-address", "local", "--model", "tiny", "--device", "cpu",
            "--port", str(port), "--folder", str(tmp_path / "serve")]
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "vsagen", *argv], cwd=tmp_path, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        with httpx.Client(base_url=url, timeout=30) as client:
            # enough steps that each video outlasts the other's POST: the two run at once, one on each replica
            ids = [client.post("/v1/videos", json={"prompt": f"a fox {i}", "size": "16x16", "frames": 1,
                                                   "steps": 150, "seed": i}).json()["id"] for i in (1, 2)]
            while {client.get(f"/v1/videos/{i}").json()["status"] for i in ids} != {"completed"}:
                assert time.monotonic() < deadline, [client.get(f"/v1/videos/{i}").json() for i in ids]
                time.sleep(0.2)
            mp4s = [client.get(f"/v1/videos/{i}/content").content for i in ids]
            timings = [client.get(f"/v1/videos/{i}/timing").json() for i in ids]
            metrics = client.get("/metrics").text
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
    from vsagen.media.video import read_mp4

    assert all(m[4:8] == b"ftyp" for m in mp4s) and mp4s[0] != mp4s[1]  # (other seeds)
    for i, mp4, timing in zip(ids, mp4s, timings):
        path = tmp_path / "serve" / "videos" / f"{i}.mp4"
        assert path.read_bytes() == mp4 and timing["video"] == str(path)
        assert read_mp4(path).shape[0] == 1
    made = [line for line in metrics.splitlines() if line.startswith("vsagen_replica_videos_total")]
    assert len(made) == 2 and all(line.endswith(" 1") for line in made), metrics
    text = log.read_text()
    assert rc == 0 and "serving tiny on 2 Ray Serve replicas" in text and "stopped by SIGTERM" in text, text
