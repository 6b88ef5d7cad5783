"""`vsagen serve` from start to stop: the folder claimed (one server per folder, a lock held while it runs), the
jobs a crash left in progress recovered (`JobStore.recover`), the model loaded once (`Resident`), then uvicorn
serving the application (`vsagen.serve.routes`) until Ctrl-C / SIGTERM. Everything that can be refused is refused
before the model loads."""

from __future__ import annotations

import contextlib
import signal
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import uvicorn

from ..errors import BadInput
from ..interrupts import ENDING_SIGNALS, signal_name
from ..request.options import RequestOptions
from .jobs import Served
from .settings import Settings
from .store import JobStore
from .worker import MAX_ATTEMPTS

LOCK = "serve.lock"
DATABASE = "jobs.sqlite3"


@contextlib.contextmanager
def claimed(folder: Path) -> Iterator[Path]:
    """Hold `folder` (created where missing, with `videos/` inside) for this server: an exclusive lock on
    `folder/serve.lock`, let go when the block ends or the process dies (kill -9 included).

    Raises:
        BadInput: the folder cannot be made, or another server holds it.
    """
    import fcntl

    try:
        (folder / "videos").mkdir(parents=True, exist_ok=True)
        handle = open(folder / LOCK, "a+")
    except OSError as e:
        raise BadInput(f"--folder {folder}: {e.strerror or e}") from None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise BadInput(f"--folder {folder} is in use by another vsagen serve; give each server its own "
                           "folder") from None
        yield folder
    finally:
        handle.close()


@contextlib.contextmanager
def listening(settings: Settings) -> Iterator[Any]:
    """A socket bound to the settings' host and port, listening, before anything loads (closed after the block).

    Raises:
        BadInput: the address is taken or cannot be bound (one line naming it).
    """
    import socket

    try:
        infos = socket.getaddrinfo(settings.host, settings.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise BadInput(f"--host {settings.host}: {e.strerror or e}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
            sock.listen(128)
        except OSError as e:
            raise BadInput(f"cannot listen on {settings.url}: {e.strerror or e}") from None
        sock.set_inheritable(True)
        yield sock
    finally:
        sock.close()


def recover(store: JobStore, served: Served, log: Callable[[str], None]) -> dict[str, int]:
    """The jobs an earlier server left in progress: completed where both files are in place, queued again, or
    failed after `MAX_ATTEMPTS` (`JobStore.recover`); the hidden temporaries of an unfinished publication or
    upload (`.video_<id>.*`) removed, and the images of requests that were never accepted (a crash between the
    upload and the job's row). Says what it did."""
    for tmp in (*served.videos.glob(".video_*"), *served.images.glob(".video_*")):
        tmp.unlink(missing_ok=True)
    for image in served.images.glob("video_*"):
        if store.get(image.name.split(".")[0]) is None:
            image.unlink(missing_ok=True)
    counts = store.recover(lambda job: all(p.is_file() for p in served.paths(job.id)), MAX_ATTEMPTS)
    if any(counts.values()):
        log("jobs left in progress by the last server: " + ", ".join(f"{n} {k}" for k, n in counts.items() if n))
    return counts


def served_request(settings: Settings, options: RequestOptions) -> Served:
    """What the server will run: the options resolved as `vsagen t2v` resolves them (a placeholder prompt; an
    image-to-video model without an image, each video bringing its own: `RunConfig.images_per_video`; a
    text-image-to-video model as for text, its videos with an image or without: `load`), and the model found, before
    anything is made or loaded.

    Raises:
        BadInput: a first/last-frame model (it needs two images a video, and a request carries one), or what
            `vsagen t2v` refuses of the same options; ModelNotFound: as `vsagen t2v`.
    """
    from ..cli.running import check_model_available
    from ..commands.generate_config import resolve_run
    from ..models.presets import LAST_IMAGE_REQUIRED
    from ..models.sources import resolve_model

    model = options.model.model
    if resolve_model(model).last_image == LAST_IMAGE_REQUIRED:
        raise BadInput(f"vsagen serve: --model {model} makes a video between a first and a last image, and a video "
                       "request carries one image (input_reference); serve an image-to-video model (e.g. --model "
                       "tiny-i2v)")
    videos = settings.folder / "videos"
    output = replace(options.output, out=videos / "loading.mp4", overwrite=True, sheet=False)
    cfg = resolve_run("vsagen serve", replace(options, output=output), images_per_video=True)
    check_model_available(cfg)
    return Served(options, cfg, videos)


def load(served: Served, log: Callable[[str], None]) -> Any:
    """The served model, loaded once (`Resident`); a text-image-to-video model takes text and image requests on
    that one load (`Resident(images=True)`: `vsagen.commands.generate.TwoModes`).

    Raises:
        BadInput, ModelNotFound, RunFailure: as `vsagen t2v` refuses or fails the same options.
    """
    from ..commands.generate import Resident
    from ..models.loading import prepare_model_files

    prepare_model_files(served.request)
    resident = Resident(served.request, log=log, images=True)
    resident.loaded_notes.append("vsagen serve: the model stays loaded between videos; load_s is the server's one "
                                 "load at its start")
    return resident


class GracefulServer(uvicorn.Server):
    """uvicorn's server, whose Ctrl-C / SIGTERM / SIGHUP stop it gracefully (the requests answered, the worker
    asked to stop) and end `serve` normally, the signal kept in `signalled`: uvicorn's own handlers raise the
    signal again once stopped, which made a server's stop the command's interrupt ("nothing was written", 143)."""

    signalled: int | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Handle the ending signals with `stop` while the server runs (the main thread only, as uvicorn)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self.stop) for s in ENDING_SIGNALS}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def stop(self, signum: int, frame: Any = None) -> None:
        """A signal handler: stop gracefully; a second Ctrl-C stops at once."""
        if self.should_exit and signum == signal.SIGINT:
            self.force_exit = True
        self.signalled = self.signalled or signum
        self.should_exit = True


def run_app(settings: Settings, store: JobStore, served: Served, worker: Any, sock: Any, *,
            log: Callable[[str], None], where: str = "") -> None:
    """Serve the application (`vsagen.serve.routes.create_app`) of `worker` on the listening `sock` until Ctrl-C /
    SIGTERM (`GracefulServer`), then say how it stopped and how many jobs stay queued. `where`: what runs the
    model, said in the first line (e.g. ", 2 Ray Serve replicas")."""
    from .routes import create_app

    app = create_app(settings, store, served, worker)
    log(f"serving {served.request.model}{where} on {settings.url} (jobs and videos in {settings.folder}"
        + (", token required)" if settings.token else ")"))
    server = GracefulServer(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])
    waiting = store.counts()["queued"]
    log(f"stopped{f' by {signal_name(server.signalled)}' if server.signalled else ''}"
        + (f"; {waiting} waiting job{' stays' if waiting == 1 else 's stay'} queued for the next start"
           if waiting else ""))


def serve(settings: Settings, options: RequestOptions, *, log: Callable[[str], None] = print) -> None:
    """Run the server until Ctrl-C / SIGTERM (see the module docstring).

    Raises:
        BadInput: the folder is held by another server or cannot be made, or the options are refused; ModelNotFound,
            RunFailure: the model cannot be loaded.
    """
    from .worker import Worker

    served = served_request(settings, options)
    # the address first: a taken port is refused before the folder is made (nothing written)
    with listening(settings) as sock, claimed(settings.folder) as folder:
        store = JobStore(folder / DATABASE)
        try:
            resident = load(served, log)
            recover(store, served, log)
            run_app(settings, store, served, Worker(store, served, resident, log=log), sock, log=log)
        finally:
            store.close()
