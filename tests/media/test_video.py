"""vsagen.media.video: float frames to uint8, mp4 encode / decode at the exact size, and the atomic writers (JSON, text,
any writer): a temporary file beside the target moved into place, an existing file never replaced silently."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from vsagen.errors import BadInput
from vsagen.media.video import Outputs, read_mp4, to_uint8_frames, write_json, write_mp4, write_text, write_with

# H.264 (yuv420p, quality 8) of smooth frames: a mean absolute error of a few levels; a wrong size, frame order or
# colour plane would be off by tens.
MP4_MEAN_ABS_MAX = 6.0


def test_to_uint8_rounds_clips_and_zeroes_nan():
    v = np.array([[[[0.0, 1.0, 0.5], [-0.2, 1.7, np.nan], [np.inf, -np.inf, 0.998]]]], dtype=np.float64)
    got = to_uint8_frames(v)
    assert got.dtype == np.uint8 and got.shape == v.shape
    assert got.reshape(-1).tolist() == [0, 255, 128, 0, 255, 0, 255, 0, 254]


def smooth_frames(f, h, w, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    out = []
    for i in range(f):
        phase = rng.uniform(0, 2 * math.pi, 3)
        out.append(np.stack([0.5 + 0.4 * np.sin(x / 9 + y / 13 + p) for p in phase], -1))
    return to_uint8_frames(np.stack(out))


@pytest.mark.parametrize("size", [(5, 48, 80), (3, 34, 62)])  # the second is not a multiple of 16
def test_mp4_round_trip_keeps_the_exact_size(tmp_path, size):
    frames = smooth_frames(*size, seed=1)
    path = tmp_path / "v.mp4"
    write_mp4(frames, path, fps=8)
    back = read_mp4(path)
    assert back.shape == frames.shape and back.dtype == np.uint8
    assert np.abs(back.astype(int) - frames.astype(int)).mean() < MP4_MEAN_ABS_MAX
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.mp4"]  # no temporary file left


def test_existing_files_are_kept_without_overwrite(tmp_path):
    path = tmp_path / "r.json"
    write_json({"a": 1}, path)
    assert json.loads(path.read_text()) == {"a": 1} and path.read_text().endswith("\n")
    with pytest.raises(BadInput, match="exists"):
        write_json({"a": 2}, path)
    with pytest.raises(BadInput, match="exists"):
        write_mp4(smooth_frames(1, 16, 16, 0), path, fps=8)
    assert json.loads(path.read_text()) == {"a": 1}
    write_json({"a": 3}, path, overwrite=True)
    assert json.loads(path.read_text()) == {"a": 3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_a_file_system_without_hard_links_still_publishes_and_never_replaces(tmp_path, monkeypatch):
    """`os.link` refused (EPERM, as on vfat): the name is reserved with O_EXCL and the file moved over it; a file
    that appeared meanwhile is kept and the run says so (it used to escape as an OSError traceback)."""
    import errno

    from vsagen.media import video

    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(video.os, "link", no_links)
    path = tmp_path / "r.json"
    write_json({"a": 1}, path)
    assert json.loads(path.read_text()) == {"a": 1} and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]

    def appears_then_no_links(src, dst):
        with open(dst, "w") as f:
            f.write("theirs")
        no_links(src, dst)

    monkeypatch.setattr(video.os, "link", appears_then_no_links)
    with pytest.raises(BadInput, match="appeared during the run"):
        write_json({"a": 2}, tmp_path / "s.json")
    assert (tmp_path / "s.json").read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "s.json"]


def test_json_refuses_nan(tmp_path):
    with pytest.raises(ValueError):
        write_json({"x": float("nan")}, tmp_path / "n.json")
    assert list(tmp_path.iterdir()) == []


def test_text_and_writer_files_are_created_with_folders_and_the_usual_mode(tmp_path):
    umask = os.umask(0o022)
    try:
        target = tmp_path / "a" / "b" / "report.md"
        write_text("héllo\n", target)
        assert target.read_text(encoding="utf-8") == "héllo\n"
        assert target.stat().st_mode & 0o777 == 0o644
        seen = []

        def writer(tmp):
            seen.append(tmp)
            tmp.write_bytes(b"\x00\x01")

        plot = tmp_path / "p.svg"
        write_with(plot, writer)
        assert plot.read_bytes() == b"\x00\x01"
        assert seen[0].suffix == ".svg" and seen[0].parent == tmp_path and seen[0] != plot
        assert not seen[0].exists()
        with pytest.raises(BadInput, match="exists"):
            write_with(plot, writer)
    finally:
        os.umask(umask)


def test_a_failing_writer_leaves_nothing(tmp_path):
    def broken(tmp):
        tmp.write_text("partial")
        raise RuntimeError("encoder died")

    with pytest.raises(RuntimeError, match="encoder died"):
        write_with(tmp_path / "x.png", broken)
    assert list(tmp_path.iterdir()) == []


def test_outputs_publish_together_or_not_at_all(tmp_path):
    with Outputs() as outs:  # left unpublished: the temporaries go
        outs.add(tmp_path / "a.txt", lambda t: t.write_text("a"))
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "b.json").write_text("theirs")
    with pytest.raises(BadInput, match="b.json exists"):
        with Outputs() as outs:
            outs.add(tmp_path / "a.mp4", lambda t: t.write_text("video"))
            outs.add(tmp_path / "b.json", lambda t: t.write_text("ours"))
            outs.publish()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json"] and (tmp_path / "b.json").read_text() == "theirs"
    with Outputs(overwrite=True) as outs:
        outs.add(tmp_path / "a.mp4", lambda t: t.write_text("video"))
        outs.add(tmp_path / "b.json", lambda t: t.write_text("ours"))
        outs.publish()
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"a.mp4": "video", "b.json": "ours"}


def _publish_pair_with_sigterm_between(tmp_path, monkeypatch) -> list:
    """Publish a.mp4 and a.json with a SIGTERM sent right after the first is in place; returns what the SIGTERM
    handler saw in the folder each time it ran."""
    import signal

    import vsagen.media.video as video

    real = video._publish

    def publish_then_signal(tmp, target, overwrite):
        real(tmp, target, overwrite)
        os.kill(os.getpid(), signal.SIGTERM)  # between the two files: held back until both are there
        for _ in range(10_000):  # time for a handler to run, if one would
            pass

    monkeypatch.setattr(video, "_publish", publish_then_signal)
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda *_: seen.append(sorted(p.name for p in tmp_path.iterdir())))
    try:
        with Outputs() as outs:
            outs.add(tmp_path / "a.mp4", lambda t: t.write_text("video"))
            outs.add(tmp_path / "a.json", lambda t: t.write_text("{}"))
            outs.publish()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return seen


def test_a_signal_during_publication_lands_after_both_files_are_in_place(tmp_path, monkeypatch):
    assert _publish_pair_with_sigterm_between(tmp_path, monkeypatch) == [["a.json", "a.mp4"]]  # once, after the pair


def test_publication_holds_signals_while_other_threads_run(tmp_path, monkeypatch):
    """A process-directed signal may land on any thread that does not block it (torch starts threads): the hold
    must not depend on the main thread's signal mask (the full suite caught that)."""
    import threading

    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, daemon=True)  # a thread with no signal blocked
    worker.start()
    try:
        assert _publish_pair_with_sigterm_between(tmp_path, monkeypatch) == [["a.json", "a.mp4"]]
    finally:
        stop.set()


def test_an_empty_encode_is_a_failure_not_a_video(tmp_path, monkeypatch):
    """ffmpeg given a rate it cannot parse printed its error and left a 0-byte mp4, and the run said it succeeded."""
    from vsagen.errors import RunFailure
    from vsagen.media import video
    from vsagen.media.video import encode_mp4

    class Silent:  # a writer that writes nothing, as ffmpeg did
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def append_data(self, frame):
            pass

        def close(self):
            pass

    monkeypatch.setattr(video, "_writer", lambda *a, **k: Silent())
    path = tmp_path / "e.mp4"
    path.write_bytes(b"")
    with pytest.raises(RunFailure, match="ffmpeg wrote no video"):
        encode_mp4(smooth_frames(2, 16, 16, 0), path, 8)


def test_a_stream_encodes_the_frames_encode_mp4_encodes(tmp_path):
    """`encode_mp4_stream` over chunks of 1, 4, 4 and 3 frames writes the frames `encode_mp4` writes for the whole
    video (read back: the same decoded frames), reports what it measured, and gives `keep` every chunk."""
    from vsagen.media.video import encode_mp4, encode_mp4_stream

    frames = smooth_frames(12, 32, 48, 3)
    whole, streamed = tmp_path / "w.mp4", tmp_path / "s.mp4"
    encode_mp4(frames, whole, 8)
    kept = []
    times = encode_mp4_stream(iter([frames[:1], frames[1:5], frames[5:9], frames[9:]]), streamed, 8, keep=kept.append,
                              frames=12)  # the count, as the commands give it (a segmented default cuts by it)
    assert np.array_equal(read_mp4(streamed), read_mp4(whole))
    assert np.array_equal(np.concatenate(kept), frames)
    assert times.frames == 12 and times.wall_s > 0 and times.encode_s > 0 and times.produce_s >= 0
    assert 0 <= times.overlap_s <= min(times.produce_s, times.encode_s) + 1e-9


def test_a_stream_that_fails_midway_raises_its_error_with_ffmpeg_ended(tmp_path):
    """A decode error after two chunks: that error, the encoder thread and its ffmpeg ended; a chunk of another
    frame size and an empty stream are RunFailures."""
    import threading

    from vsagen.errors import RunFailure
    from vsagen.media.video import encode_mp4_stream

    frames = smooth_frames(6, 16, 16, 1)

    def failing():
        yield frames[:3]
        yield frames[3:]
        raise RuntimeError("decoder died")

    with pytest.raises(RuntimeError, match="decoder died"):
        encode_mp4_stream(failing(), tmp_path / "f.mp4", 8)
    assert not [t for t in threading.enumerate() if t.name == "vsagen-mp4-encoder"]
    with pytest.raises(RunFailure, match="decoded frames of"):
        encode_mp4_stream(iter([frames[:2], smooth_frames(2, 16, 32, 2)]), tmp_path / "g.mp4", 8)
    with pytest.raises(RunFailure, match="no frames"):
        encode_mp4_stream(iter([]), tmp_path / "h.mp4", 8)


def test_the_encoding_reaches_ffmpeg(tmp_path):
    """A higher CRF writes a smaller file of the same frames; the preset and CRF are what ffmpeg was told."""
    from vsagen.media.video import Encoding, _writer, encode_mp4

    frames = smooth_frames(8, 64, 96, 4)
    sizes = {}
    for crf in (10, 35):
        path = tmp_path / f"{crf}.mp4"
        encode_mp4(frames, path, 8, Encoding("x264", "veryfast", crf))
        sizes[crf] = path.stat().st_size
        assert read_mp4(path).shape == frames.shape
    assert sizes[35] < sizes[10] / 2
    command = _writer(tmp_path / "s.mp4", 8, Encoding("x264", "ultrafast", 23, segments=1)).command(96, 64)
    said = {command[i]: command[i + 1] for i in range(command.index("pipe:") + 1, len(command) - 1)}
    assert (said["-vcodec"], said["-preset"], said["-crf"]) == ("libx264", "ultrafast", "23")


def test_a_target_through_a_missing_folder_and_back_makes_no_folder(tmp_path, monkeypatch):
    """New-user trial: `--out a/../b.mp4` left an empty folder `a` behind (its missing parents were created as
    spelled). The target is normalised first: published as b.mp4, unpublished nothing; no `a` either way."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError, match="stop"):
        with Outputs() as outputs:
            outputs.add(Path("a/../b.mp4"), lambda tmp: tmp.write_bytes(b"partial"))
            raise RuntimeError("stop")
    assert list(tmp_path.iterdir()) == []
    with Outputs(folder=Path("c/../d")) as outputs:  # compare's folder too
        outputs.add(Path("a/../b.mp4"), lambda tmp: tmp.write_bytes(b"whole"))
        outputs.publish()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.mp4", "d"]
    assert (tmp_path / "b.mp4").read_bytes() == b"whole"


def test_an_unpublished_set_removes_the_folders_it_created(tmp_path):
    """New-user trial: `--out x/y/o.mp4` interrupted left the empty x/y it had created. Folders that existed, or
    that someone else filled meanwhile, stay."""
    target = tmp_path / "x" / "y" / "o.mp4"
    with pytest.raises(RuntimeError, match="stop"):
        with Outputs() as outputs:
            outputs.add(target, lambda tmp: tmp.write_bytes(b"partial"))
            assert target.parent.is_dir()
            raise RuntimeError("stop")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "x").mkdir()
    with pytest.raises(RuntimeError, match="stop"):
        with Outputs() as outputs:
            outputs.add(target, lambda tmp: tmp.write_bytes(b"partial"))
            (tmp_path / "x" / "other.txt").write_text("someone else's")
            raise RuntimeError("stop")
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == ["other.txt"]
    with Outputs() as outputs:  # published: the folders stay with the file
        outputs.add(target, lambda tmp: tmp.write_bytes(b"whole"))
        outputs.publish()
    assert target.read_bytes() == b"whole"


def test_a_failed_stream_finishes_its_producer_at_once(tmp_path):
    """The producer generator is closed when the stream fails (its clean-up runs then, not when it is collected)."""
    from vsagen.media.video import encode_mp4_stream

    finished = []

    def producer():
        try:
            yield smooth_frames(2, 16, 16, 0)
            yield smooth_frames(2, 16, 32, 0)  # another size: the stream fails here
            yield smooth_frames(2, 16, 16, 0)
        finally:
            finished.append(True)

    with pytest.raises(Exception, match="decoded frames of"):
        encode_mp4_stream(producer(), tmp_path / "p.mp4", 8)
    assert finished == [True]


def test_an_os_error_midway_through_an_overwrite_puts_the_old_files_back(tmp_path, monkeypatch):
    """--overwrite of a set (video, JSON, sheet) where the last move fails: the files already moved are taken back,
    the ones they replaced restored as they were, a new one removed, and no temporary or kept file is left (before,
    such a set was left half new, half old)."""
    import vsagen.media.video as video

    (tmp_path / "a.mp4").write_text("old video")
    (tmp_path / "c.png").write_text("old sheet")
    real = video._publish

    def fail_on_the_sheet(tmp, target, overwrite):
        if target.name == "c.png":
            raise OSError(28, "No space left on device")
        real(tmp, target, overwrite)

    monkeypatch.setattr(video, "_publish", fail_on_the_sheet)
    with pytest.raises(OSError, match="No space"):
        with Outputs(overwrite=True) as outs:
            outs.add(tmp_path / "a.mp4", lambda t: t.write_text("new video"))
            outs.add(tmp_path / "b.json", lambda t: t.write_text("new json"))
            outs.add(tmp_path / "c.png", lambda t: t.write_text("new sheet"))
            outs.publish()
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"a.mp4": "old video", "c.png": "old sheet"}
    monkeypatch.setattr(video, "_publish", real)
    with Outputs(overwrite=True) as outs:  # and a set that goes in keeps nothing of the old files beside it
        outs.add(tmp_path / "a.mp4", lambda t: t.write_text("new video"))
        outs.add(tmp_path / "c.png", lambda t: t.write_text("new sheet"))
        outs.publish()
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"a.mp4": "new video", "c.png": "new sheet"}


def test_an_added_file_told_to_replace_replaces_without_overwrite(tmp_path):
    """`add(..., replace=True)` (a MagCache calibration) replaces its file whatever `overwrite` says; added last, a
    refused earlier file leaves it as it was."""
    (tmp_path / "cal.json").write_text("old")
    with Outputs() as outputs:
        outputs.add(tmp_path / "a.json", lambda tmp: tmp.write_text("a"))
        outputs.add(tmp_path / "cal.json", lambda tmp: tmp.write_text("new"), replace=True)
        outputs.publish()
    assert (tmp_path / "cal.json").read_text() == "new"
    with pytest.raises(BadInput, match="a.json exists"):
        with Outputs() as outputs:
            outputs.add(tmp_path / "a.json", lambda tmp: tmp.write_text("b"))
            outputs.add(tmp_path / "cal.json", lambda tmp: tmp.write_text("newer"), replace=True)
            outputs.publish()
    assert (tmp_path / "cal.json").read_text() == "new" and (tmp_path / "a.json").read_text() == "a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "cal.json"]


def test_a_full_disk_names_the_users_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    """New-user trial: a disk full while the mp4 was written gave an error line naming the hidden temporary file
    (`.b.x1y2.mp4`). ENOSPC simulated in process, as Python's write raises it and as ffmpeg reports it: the line
    names the output the user asked for, and nothing is left in its folder."""
    import errno

    import vsagen.media.video as video
    from vsagen.errors import RunFailure
    from vsagen.media.encoding import Encoding
    from vsagen.media.formats import FORMATS, write_video

    out = tmp_path / "b.mp4"

    def full_disk(chunks, path, *args, **kwargs):
        path.write_bytes(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    def ffmpeg_full_disk(chunks, path, *args, **kwargs):
        path.write_bytes(b"partial")
        raise RunFailure(f"ffmpeg failed (exit 1) writing {path.name}: Error writing trailer of {path}: "
                         f"{os.strerror(errno.ENOSPC)}")

    frames = iter([np.zeros((1, 16, 16, 3), np.uint8)])
    for fake, want in ((full_disk, f"cannot write {out}: no space left on device (nothing was written)"),
                       (ffmpeg_full_disk, f"ffmpeg failed (exit 1) writing b.mp4: Error writing trailer of {out}: "
                                          "No space left on device")):
        monkeypatch.setattr(video, "encode_mp4_stream", fake)
        with pytest.raises(RunFailure) as failed:
            with Outputs() as outputs:
                write_video(outputs, FORMATS["mp4"], out, frames, 8, Encoding(), frames=1)
        assert str(failed.value) == want
        assert list(tmp_path.iterdir()) == []
