"""`vsagen serve --ray`: the same server, its videos made by N Ray Serve replicas (one per GPU; on the CPU, one CPU
each) instead of one model in the server's own process. The optional extra `ray` (`pip install 'vsagen[ray]'`).

Design. The process that runs `vsagen serve --ray` is the front: it listens (the same bind and token rules), owns
the folder (its lock, the SQLite job store, the only writer of both) and serves the same FastAPI application
(`vsagen.serve.routes`): the same routes, checks and refusals, the same store. It does not load the model; it
joins a Ray cluster (`--ray-address`; none: a local one), starts Ray Serve without its HTTP proxy (the front's
uvicorn is the one HTTP door) and deploys `VideoReplica` as an application of N replicas, `max_ongoing_requests=1`
each, then runs one worker thread per replica (`RayWorker`: the `Worker` of `vsagen serve` whose `_generate`
hands the job to a replica through a deployment handle). Each replica loads the served configuration once, as
`vsagen serve` does (`vsagen.serve.server.load`), and makes one video at a time: `Resident.generate` of the request
the front resolved, publishing the video and its JSON into the folder together or not at all (temporaries renamed
into place, `vsagen.media.video.Outputs`). Its steps stream back to the front as they are done (a streaming
response), which sets the job's progress. A request is checked at the front against what the replicas loaded
(`LoadedFacts`: the loaded request, the transformers' device, dtype and architecture), so a POST is refused with the
same words as `vsagen serve`'s.

Why the HTTP side is not a Serve deployment (`@serve.ingress`): Serve may restart a replica or place it on another
node, and the job store is one SQLite file with one writer on the folder's disk; keeping the store in the front
keeps every guarantee of `vsagen serve` (a job is accepted once committed; kill -9 of the front: the next start's
`recover` finishes or fails every accepted job).

What happens when a replica dies mid-job: its streaming response raises (Ray's actor-died errors); the job is
queued again with this attempt counted (`Lost`) and made by the next free replica (Serve starts a replacement, which
loads the model again); a job whose replica died `MAX_ATTEMPTS` times is failed "interrupted" saying so. Nothing it
left counts (half a publication, the video moved but not its JSON, is replaced by the next attempt; its hidden
temporaries are removed now and at the next start). When the front stops (Ctrl-C / SIGTERM), the running jobs'
responses are cancelled (each replica's run stops at its next step: `VideoReplica.generate`) and the jobs are queued
again, their attempts not counted; the Serve application is deleted.

Several hosts: every node runs the same vsagen and model files, and reads and writes the folder at the same path
(a shared filesystem); a replica refuses to start where the folder is not (README, Serving on several machines).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator

from ..errors import BadInput, RunFailure
from ..request.options import RequestOptions
from .settings import Settings
from .store import JobStore
from .worker import JobFailed, Lost, Stopped, Worker, failure_of, generate_counting, total_steps

EXTRA = "pip install 'vsagen[ray]'"
DEPLOYMENT = "VideoReplica"
# seconds Serve waits for a replica's running request when the application is deleted (the front has queued the
# job again by then; a replica still decoding is ended)
GRACE_S = 5.0


def check_ray_installed() -> None:
    """Ray Serve can be imported (the `ray` extra: ray[serve]), without importing it.

    Raises:
        BadInput: it cannot, naming the extra.
    """
    import importlib.util

    missing = [name for name in ("ray", "aiohttp") if importlib.util.find_spec(name) is None]
    if missing:
        raise BadInput(f"vsagen serve --ray needs ray[serve] ({', '.join(missing)} not installed): {EXTRA}")


def replica_plan(requested: int | None, device: str, resources: dict[str, float]) -> tuple[int, dict[str, float]]:
    """How many replicas to start and what each takes (Ray's `ray_actor_options`): on CUDA a GPU each
    (`num_gpus=1`; default: one per GPU of the cluster), on the CPU a CPU each (`num_cpus=1`; default: one).

    Args:
        requested: `--replicas` (None: the default); device: the served request's ("cuda" | "cpu");
            resources: the cluster's (`ray.cluster_resources()`: "CPU", "GPU" counts).

    Raises:
        BadInput: fewer than 1 replica, a CUDA server on a cluster without a GPU, more replicas than the cluster
            has GPUs (CUDA) or CPUs (CPU): Serve would wait for them for ever.
    """
    if requested is not None and requested < 1:
        raise BadInput(f"--replicas must be at least 1, got {requested}")
    kind, per = ("GPU", {"num_gpus": 1.0}) if device == "cuda" else ("CPU", {"num_cpus": 1.0})
    have = int(resources.get(kind, 0))
    if kind == "GPU" and have == 0:
        raise BadInput("vsagen serve --ray --device cuda: the Ray cluster has no GPU (start the nodes with GPUs "
                       "with `ray start`, or serve on the CPU with --device cpu)")
    count = requested if requested is not None else (have if kind == "GPU" else 1)
    if count > have:
        raise BadInput(f"--replicas {count}: each replica takes a {kind} of its own and the Ray cluster has {have}")
    return count, per


def _log_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _replica_name() -> str:
    """This replica's name: its node's host name and Serve's id of the replica."""
    from ray import serve

    return f"{socket.gethostname()}/{serve.get_replica_context().replica_id.unique_id}"


class VideoReplica:
    """One Ray Serve replica of `vsagen serve --ray` (deployed by `deploy`): the served configuration loaded once
    (`vsagen.serve.server.load`), one video at a time.

    Args:
        folder: the server's folder, absolute; it must be reachable at this path on this node (its lock file there).
        options: the `vsagen serve` options, as the front parsed them.

    Raises:
        BadInput: the folder is not on this node; what `vsagen serve` refuses of the options; ModelNotFound,
            RunFailure: as `vsagen serve`'s load.
    """

    def __init__(self, folder: str, options: RequestOptions) -> None:
        from .server import LOCK, load, served_request

        if not (Path(folder) / LOCK).is_file():
            raise BadInput(f"--folder {folder} is not on node {socket.gethostname()}: every replica writes the "
                           "videos there; put the folder on a filesystem every node mounts at the same path")
        self.served = served_request(Settings(folder=Path(folder)), options)
        self.resident = load(self.served, _log_stderr)
        self.name = _replica_name()
        self.one_run = threading.Lock()  # (a cancelled run ends at its next step; the next one waits for it)

    def facts(self) -> Any:
        """What the front checks a video's request against (`LoadedFacts`)."""
        return self.resident.facts

    async def generate(self, job_id: str, cfg: Any) -> AsyncIterator[tuple]:
        """Make one video of `cfg` (resolved by the front: its files the job's in the folder), streaming its
        events: ("step", steps done) per denoising step, then ("done", replica name, the timing JSON's "timing")
        or ("failed", code, one line) (`failure_of`), or ("stopped",). The run is a thread of its own; this
        generator only waits for its events, so that Serve's cancellation of the request (the front stopping)
        reaches it (a `CancelledError` at its wait; a sync generator would run on to its end) and the run stops at
        its next step, nothing published."""
        import asyncio

        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        cancelled = threading.Event()

        def put(event: tuple) -> None:
            if not cancelled.is_set():  # (once cancelled nobody waits: the loop may be gone)
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(events.put_nowait, event)

        def report(done: int) -> None:
            if cancelled.is_set():
                raise Stopped
            put(("step", done))

        def work() -> None:
            try:
                with self.one_run:
                    result = generate_counting(self.resident, cfg, report)
                put(("done", self.name, result.summary["timing"]))
            except Stopped:
                put(("stopped",))
            except Exception as e:  # noqa: BLE001 - the job fails with one line; the replica goes on
                put(("failed", *failure_of(e)))

        threading.Thread(target=work, name=f"vsagen-replica-{job_id}", daemon=True).start()
        try:
            while True:
                event = await events.get()
                yield event
                if event[0] != "step":
                    return
        finally:  # returned, closed or cancelled: a run still going stops at its next step
            cancelled.set()


@dataclass(frozen=True)
class Made:
    """A video a replica made: its timing JSON's "timing" (as `summary["timing"]`) and the replica's name."""

    summary: dict[str, Any]
    replica: str


class RayWorker(Worker):
    """`Worker` with one thread per replica, each handing its claimed jobs to the replicas through the deployment
    handle (`VideoReplica.generate`, streamed) instead of a model of its own; the job's progress follows the
    replica's steps (see the module docstring for a replica lost, and the front's stop).

    Args:
        store, served, log: as `Worker`'s; facts: the replicas' `LoadedFacts` (the requests' checks);
        handle: the application's `DeploymentHandle`; replicas: how many (one thread each).
    """

    def __init__(self, store: JobStore, served: Any, facts: Any, handle: Any, *, replicas: int,
                 log: Callable[[str], None] = lambda m: None) -> None:
        super().__init__(store, served, facts, log=log, lanes=replicas)
        self.handle = handle.options(stream=True)
        self._responses: dict[str, Any] = {}  # job id -> its streaming response, while it runs

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the threads as `Worker.stop`, the running jobs' responses cancelled first (queued again)."""
        self._stop.set()
        for response in list(self._responses.values()):
            response.cancel()
        super().stop(timeout)

    def _generate(self, job_id: str, cfg: Any) -> Made:
        """One job on a free replica: its steps as the job's progress; its outcome as `Worker.run` takes it.

        Raises:
            JobFailed: the replica failed it; Stopped: the front is stopping; Lost: the replica went away.
        """
        total = total_steps(cfg)
        self.running[job_id] = 0
        response = self._responses[job_id] = self.handle.generate.remote(job_id, cfg)
        if self._stop.is_set():  # (a stop between the claim and the call: `stop` did not see this response)
            response.cancel()
        try:
            for event in response:
                if self._stop.is_set() or event[0] == "stopped":
                    raise Stopped
                if event[0] == "failed":
                    raise JobFailed(event[1], event[2])
                if event[0] == "done":
                    return Made({"timing": event[2]}, event[1])
                self.running[job_id] = event[1]
                self.store.progress(job_id, min(90, 90 * event[1] // max(total, 1)))
            raise Lost("the replica making this video ended its answer early")
        except (Stopped, JobFailed, Lost):
            raise
        except Exception as e:  # noqa: BLE001 - Ray's errors of a replica lost (or the request cancelled)
            if self._stop.is_set():
                raise Stopped from None
            self._forget_temporaries(job_id)
            raise Lost(f"the replica making this video stopped ({type(e).__name__})") from None
        finally:
            self._responses.pop(job_id, None)

    def _forget_temporaries(self, job_id: str) -> None:
        """Remove the hidden temporaries a dead replica's publication left for `job_id` (`recover` does at the next
        start otherwise)."""
        for tmp in self.served.videos.glob(f".{job_id}.*"):
            tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def ray_cluster(address: str | None) -> Iterator[Any]:
    """Ray, joined to the cluster at `address` (as `ray.init` takes it: "auto", HOST:PORT, "local" for a new one on
    this machine; None: `RAY_ADDRESS`, else the cluster last started here, else a new one), let go after the block
    (a cluster it started stops with it).

    Raises:
        BadInput: the cluster cannot be reached (one line naming the address).
    """
    import logging

    check_reachable(address)
    import ray

    local = {"include_dashboard": False} if address == "local" else {}
    try:
        ray.init(address=address, logging_level=logging.WARNING, **local)
    except (ConnectionError, ValueError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        auth = ("" if address == "local" or os.environ.get("RAY_AUTH_MODE") else
                " (a cluster with token authentication, which `ray start` turns on from Ray 2.59, needs "
                "RAY_AUTH_MODE=token here and its token: `ray get-auth-token` on its head node)")
        raise BadInput(f"--ray-address {address or '(none)'}: {first}{auth}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def check_reachable(address: str | None, timeout_s: float = 5.0) -> None:
    """Refuse a HOST:PORT cluster address that nothing answers at, in `timeout_s` seconds (Ray itself waits minutes
    for the cluster there); other addresses ("auto", "local", "ray://...", None) are Ray's to resolve.

    Raises:
        BadInput: the address answers no connection, or its port is no number (one line naming it).
    """
    if address is None or address in ("auto", "local") or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise BadInput(f"--ray-address {address}: give HOST:PORT (the head node's; `ray start --head` takes 6379), "
                       "auto or local")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return
    except OSError as e:
        why = e.strerror or str(e) or type(e).__name__
    raise BadInput(f"--ray-address {address}: no Ray cluster answers there ({why}); start its head node with "
                   "`ray start --head`, or leave --ray-address out for a cluster on this machine")


def app_name(folder: Path) -> str:
    """The Serve application's name of the server of `folder` (one per folder, so that servers share a cluster)."""
    return "vsagen-serve-" + hashlib.sha256(str(folder).encode()).hexdigest()[:12]


def deploy(folder: Path, options: RequestOptions, count: int, per_replica: dict[str, float]) -> Any:
    """Start Ray Serve without its HTTP proxy and run `count` replicas of `VideoReplica` (each taking
    `per_replica`, at most one request at a time) as the application `app_name(folder)`; returns its handle once
    every replica has loaded the model.

    Raises:
        BadInput: a replica refused the options or the folder (its words); RunFailure: the replicas did not start
            otherwise (the reason's last line).
    """
    import logging

    from ray import serve

    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # (Serve's lines in this process: one a request)
    quiet = {"log_level": "WARNING", "enable_access_log": False}
    serve.start(proxy_location="Disabled", logging_config=quiet)
    deployment = serve.deployment(VideoReplica, name=DEPLOYMENT, num_replicas=count, ray_actor_options=per_replica,
                                  max_ongoing_requests=1, graceful_shutdown_timeout_s=GRACE_S, logging_config=quiet)
    try:
        return serve.run(deployment.bind(str(folder), options), name=app_name(folder), route_prefix=None,
                         logging_config=quiet)
    except Exception as e:  # noqa: BLE001 - the replica's own error is in the deployment's status
        why = str(e)
        with contextlib.suppress(Exception):
            why = serve.status().applications[app_name(folder)].deployments[DEPLOYMENT].message or why
    kind, message = _reason(why)
    if kind in ("BadInput", "ModelNotFound"):
        raise BadInput(message)
    raise RunFailure(f"the Ray Serve replicas did not start: {message}")


def undeploy(name: str) -> None:
    """Ask Serve to delete the application `name` (its replicas end once their running request has, or after
    `GRACE_S`), without waiting: a cluster this process started stops with it anyway, and one whose processes a
    Ctrl-C of the terminal ended too (they share its process group) answers no more."""
    from ray import serve

    with contextlib.suppress(Exception):
        serve.delete(name, _blocking=False)


def _reason(text: str) -> tuple[str | None, str]:
    """A replica's failure from Serve's text of it (a traceback): the vsagen error's class name and its message where
    a line names one ("vsagen.errors.BadInput: ..."), else (None, the text's last line)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    own = [line for line in lines if line.startswith("vsagen.errors.")]
    if own:
        name, _, message = own[-1].removeprefix("vsagen.errors.").partition(": ")
        return name, message
    return None, lines[-1] if lines else "no reason given"


def serve_ray(settings: Settings, options: RequestOptions, *, replicas: int | None = None, address: str | None = None,
              log: Callable[[str], None] = print) -> None:
    """Run `vsagen serve --ray` until Ctrl-C / SIGTERM (see the module docstring): the address bound, the cluster
    joined and the replica count checked before the folder is made; the replicas deployed; the front served.

    Raises:
        BadInput: as `vsagen serve`, the cluster unreachable, a replica count the cluster cannot hold, the folder not
            on a replica's node; ModelNotFound, RunFailure: the replicas cannot load the model.
    """
    from .server import DATABASE, claimed, listening, recover, run_app, served_request

    settings = replace(settings, folder=settings.folder.resolve())  # the replicas' working folders differ
    served = served_request(settings, options)
    with listening(settings) as sock, ray_cluster(address) as ray:
        count, per_replica = replica_plan(replicas, served.request.device, ray.cluster_resources())
        with claimed(settings.folder) as folder:
            store = JobStore(folder / DATABASE)
            try:
                log(f"starting {count} Ray Serve replica{'s' if count != 1 else ''} of {served.request.model} "
                    f"({', '.join(f'{k}={v:g}' for k, v in per_replica.items())} each)")
                try:  # (a failed deployment too is deleted: a shared cluster keeps no broken application)
                    handle = deploy(folder, options, count, per_replica)
                    facts = handle.facts.remote().result()
                    recover(store, served, log)
                    worker = RayWorker(store, served, facts, handle, replicas=count, log=log)
                    run_app(settings, store, served, worker, sock, log=log,
                            where=f" on {count} Ray Serve replica{'s' if count != 1 else ''}")
                finally:
                    undeploy(app_name(folder))
            finally:
                store.close()
