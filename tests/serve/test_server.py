"""`vsagen serve`'s start and stop (`vsagen.serve.server`): one server per folder, the address refused in one line
when taken, the recovery of what a crash left (files in place: completed; half a publication: its temporaries gone,
queued again; an image-to-video job made again after a crash from the image kept under its id), the graceful stop
on a signal (end to end: tests/serve/test_routes.py)."""

from __future__ import annotations

import signal
import socket

import pytest

from vsagen.errors import BadInput
from vsagen.serve.jobs import Served
from vsagen.serve.server import GracefulServer, claimed, listening, recover
from vsagen.serve.settings import Settings
from vsagen.serve.store import JobStore


def test_one_server_per_folder(tmp_path):
    with claimed(tmp_path / "f") as folder:
        assert (folder / "videos").is_dir()
        with pytest.raises(BadInput, match="is in use by another vsagen serve; give each server its own folder"):
            with claimed(tmp_path / "f"):
                pass
    with claimed(tmp_path / "f"):  # let go at the end of the block
        pass


def test_a_taken_port_is_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(BadInput, match=rf"^cannot listen on http://127.0.0.1:{port}: "):
            with listening(Settings(port=port)):
                pass
    with listening(Settings(port=port)) as sock:
        assert sock.getsockname()[1] == port


def test_a_taken_port_writes_no_folder(tmp_path):
    """New-user trial: `vsagen serve --port TAKEN` refused the port but left the new folder with serve.lock and
    videos/ behind; the address is tried first now."""
    from vsagen.request.options import request_options
    from vsagen.serve.server import serve

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(BadInput, match="^cannot listen on "):
            serve(Settings(port=port, folder=tmp_path / "new"), request_options(model="tiny", device="cpu"))
    assert not (tmp_path / "new").exists()


def test_recover_after_a_crash_mid_publication(tmp_path):
    videos = tmp_path / "videos"
    videos.mkdir()
    store = JobStore(tmp_path / "jobs.sqlite3")
    for i in ("video_a", "video_b"):
        store.add(i, {"request": {}, "video": {}}, limit=4)
        store.claim()
    (videos / "video_a.mp4").write_bytes(b"mp4")  # both files in place: the crash came after the publication
    (videos / "video_a.json").write_text("{}")
    (videos / "video_b.mp4").write_bytes(b"mp4")  # the video moved, its JSON not yet: half a set
    (videos / ".video_b.abc.json").write_text("{")  # a temporary of the publication
    images = tmp_path / "images"
    images.mkdir()
    kept, orphan = images / "video_b.png", images / f"video_{'c' * 32}.jpg"  # a job's image, a refused request's
    for path in (kept, orphan, images / ".video_d.png.1234"):  # (and an upload the crash cut short)
        path.write_bytes(b"image")
    lines = []
    served = Served(None, None, videos)
    assert recover(store, served, lines.append) == {"completed": 1, "queued": 1, "failed": 0}
    assert store.get("video_a").status == "completed" and store.get("video_b").status == "queued"
    assert not (videos / ".video_b.abc.json").exists()
    assert [p.name for p in images.iterdir()] == ["video_b.png"]
    assert lines == ["jobs left in progress by the last server: 1 completed, 1 queued"]


def test_the_first_signal_stops_gracefully_a_second_ctrl_c_at_once():
    import uvicorn

    server = GracefulServer(uvicorn.Config(app=None))
    server.stop(signal.SIGTERM)
    assert server.should_exit and not server.force_exit and server.signalled == signal.SIGTERM
    server.stop(signal.SIGINT)
    assert server.force_exit and server.signalled == signal.SIGTERM  # the first one is the one said


def test_refusals_come_before_the_folder_is_made(tmp_path, vsagen_cache):
    from typer.testing import CliRunner

    from vsagen.cli.app import app

    for args, words in ((["--model", "tiny-flf2v"], "error: vsagen serve: --model tiny-flf2v makes a video between "
                                                    "a first and a last image, and a video request carries one image "
                                                    "(input_reference); serve an image-to-video model (e.g. --model "
                                                    "tiny-i2v)\n"),
                        (["--model", "tiny", "--frames", "2"], "error: --frames must be 4k+1")):
        res = CliRunner().invoke(app, ["serve", *args, "--folder", str(tmp_path / "f")])
        assert res.exit_code == 2 and res.stderr.startswith(words) and res.stderr.count("\n") == 1, res.stderr
        assert not (tmp_path / "f").exists()


def test_an_image_to_video_job_a_crash_left_in_progress_is_made_again_from_its_kept_image(tmp_path, i2v_dir):
    """The i2v side of a kill -9 and a restart (the crash and restart of a real process over HTTP:
    test_routes.py's kill -9 test, t2v): two multipart uploads accepted by the application of `vsagen serve`
    (its images kept under the jobs' ids), the first claimed and mid-steps as the crash leaves it; the restart's
    folder lock, store and `recover` queue it again and keep both images; the worker then makes both videos, each
    from its own image read from disk (the one job on its second attempt). In this process: the model is loaded
    once and kept across the restart (the restart's reload: the t2v test)."""
    import json

    from fastapi.testclient import TestClient

    from conftest import noise_image
    from vsagen.request.options import request_options
    from vsagen.serve.routes import create_app
    from vsagen.serve.server import DATABASE, load, served_request
    from vsagen.serve.worker import Worker

    settings = Settings(folder=tmp_path / "serve")
    options = request_options(model="tiny-i2v", attn="vsa", steps=1, height=32, width=32, frames=1, device="cpu")
    served = served_request(settings, options)
    resident = load(served, lambda line: None)
    uploads = [noise_image(tmp_path / "a.png", (40, 36), seed=1).read_bytes(),
               noise_image(tmp_path / "b.png", (32, 32), seed=5).read_bytes()]
    with claimed(settings.folder) as folder:  # the first server, its worker not started
        store = JobStore(folder / DATABASE)
        client = TestClient(create_app(settings, store, served, Worker(store, served, resident)))
        ids = [client.post("/v1/videos", data={"prompt": "a fox", "seed": "3"},
                           files={"input_reference": ("x.png", image, "image/png")}).json()["id"] for image in uploads]
        running = store.claim()  # what the worker's loop does first; a step reports its progress; then kill -9,
        store.progress(running.id, 45)  # which ends no job
        assert running.id == ids[0] and [store.get(i).status for i in ids] == ["in_progress", "queued"]
    lines = []
    with claimed(settings.folder) as folder:  # the restart (a kill -9 lets the lock go; its connection stays open)
        again, served = JobStore(folder / DATABASE), served_request(settings, options)
        assert recover(again, served, lines.append) == {"completed": 0, "queued": 1, "failed": 0}
        assert [p.name for p in served.job_images(ids[0]) + served.job_images(ids[1])] == [f"{i}.png" for i in ids]
        worker = Worker(again, served, resident)
        for _ in ids:
            worker.run(again.claim())
        videos = [TestClient(create_app(settings, again, served, worker)).get(f"/v1/videos/{i}").json() for i in ids]
        again.close()
    store.close()
    assert lines == ["jobs left in progress by the last server: 1 queued"]
    assert [(v["status"], v["vsagen"]["attempts"]) for v in videos] == [("completed", 2), ("completed", 1)], videos
    made = [json.loads(served.paths(i)[1].read_text()) for i in ids]
    assert [m["image"] for m in made] == [str(served.images / f"{i}.png") for i in ids]
    assert [served.job_images(i)[0].read_bytes() for i in ids] == uploads  # as sent
    mp4s = [served.paths(i)[0].read_bytes() for i in ids]
    assert all(m[4:8] == b"ftyp" for m in mp4s) and mp4s[0] != mp4s[1]  # same prompt and seed: the images differ
