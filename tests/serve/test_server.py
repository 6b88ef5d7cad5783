"""`vsagen serve`'s start and stop (`vsagen.serve.server`): one server per folder, the address refused in one line
when taken, the recovery of what a crash left (files in place: completed; half a publication: its temporaries gone,
queued again), the graceful stop on a signal (end to end: tests/serve/test_routes.py)."""

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
