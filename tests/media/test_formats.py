"""vsagen.media.formats: the format `--out`'s extension picks (mp4, WebM, GIF, PNG frames), each written inside an
`Outputs` set (all of a run's files or none), and the prompt and settings as metadata read back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vsagen.errors import BadInput
from vsagen.interrupts import SignalInterrupt
from vsagen.media.formats import (FORMATS, check_format, check_output, frame_paths, frame_pattern, output_format,
                                  read_metadata, stale_frames, write_video)
from vsagen.media.video import Encoding, Outputs, encode_mp4_stream, read_mp4

# text ffmetadata escapes ('=', ';', '#', '\\', newlines), quotes and non-ASCII: each must come back as it went in
AWKWARD = 'a "red" fox; x=1 # not a comment\\ \nsecond line, été 狐'


def frames(f=5, h=34, w=62, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (f, h, w, 3), dtype=np.uint8)


def chunks(video, size=2):
    return iter([video[i:i + size] for i in range(0, len(video), size)])


def test_the_extension_picks_the_format_and_others_are_refused(tmp_path):
    assert {output_format(Path(f"v.{e}")).name for e in ("mp4", "MP4", "webm", "gif", "png")} == set(FORMATS)
    for bad in ("v.avi", "v", "v.mp4.tmp"):
        with pytest.raises(BadInput, match=r"\.mp4 \(H\.264\), \.webm \(VP9\), \.gif"):
            output_format(Path(bad))
    with pytest.raises(BadInput, match="no file name before .gif"):
        check_output(tmp_path / ".gif", False)
    assert check_output(tmp_path / "a.webm", False) == tmp_path / "a.json"


def test_png_frames_are_named_and_checked_before_the_run(tmp_path):
    assert [p.name for p in frame_paths(tmp_path / "f.png", 3)] == ["f-0000.png", "f-0001.png", "f-0002.png"]
    assert frame_paths(tmp_path / "f.png", 12000)[-1].name == "f-11999.png"
    assert frame_pattern(tmp_path / "f.png", 81) == tmp_path / "f-%04d.png"
    (tmp_path / "f-0002.png").write_bytes(b"x")
    with pytest.raises(BadInput, match="f-0002.png exists"):
        check_output(tmp_path / "f.png", False, frames=3)
    assert check_output(tmp_path / "f.png", False, frames=2) == tmp_path / "f.json"


def test_codec_is_for_mp4_only_and_webm_needs_vp9(monkeypatch):
    check_format(FORMATS["gif"], Encoding())
    check_format(FORMATS["webm"], Encoding())  # the bundled ffmpeg has libvpx-vp9
    check_format(FORMATS["mp4"], Encoding("x264", crf=18))
    with pytest.raises(BadInput, match="--codec sets the mp4's encoder; a .gif"):
        check_format(FORMATS["gif"], Encoding("x264", crf=18))
    import vsagen.media.formats as formats

    monkeypatch.setattr(formats, "_encoders", lambda: frozenset({"libx264", "gif"}))  # an ffmpeg without VP9
    with pytest.raises(BadInput, match="--out .webm: the bundled ffmpeg has no libvpx-vp9 encoder here"):
        check_format(FORMATS["webm"], Encoding())
    check_format(FORMATS["gif"], Encoding())


def test_the_mp4_carries_its_metadata_escaped_text_included(tmp_path):
    tags = {"title": AWKWARD, "description": "vsagen 0.1.0: tiny", "comment": json.dumps({"prompt": AWKWARD})}
    path = tmp_path / "m.mp4"
    encode_mp4_stream(chunks(frames()), path, 8, metadata=tags)
    back = read_metadata(path)
    assert {k: back[k] for k in tags} == tags
    assert json.loads(back["comment"])["prompt"] == AWKWARD
    assert read_mp4(path).shape == (5, 34, 62, 3)


@pytest.mark.parametrize("name", ["webm", "gif"])
def test_webm_and_gif_are_written_with_the_set(tmp_path, name):
    video = frames(f=6)
    out = tmp_path / f"v.{name}"
    kept = []
    with Outputs() as outputs:
        times = write_video(outputs, FORMATS[name], out, chunks(video), 8, Encoding(), frames=6,
                            metadata={"title": AWKWARD}, keep=kept.append)
        outputs.add(tmp_path / "v.json", lambda tmp: tmp.write_text("{}"))
        assert not out.exists()  # published with the JSON, not before
        outputs.publish()
    assert times.frames == 6 and np.array_equal(np.concatenate(kept), video)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["v.json", f"v.{name}"])
    if name == "gif":
        gif = Image.open(out)
        assert (gif.n_frames, gif.size, gif.info["loop"]) == (6, (62, 34), 0)
    else:
        assert read_mp4(out).shape == (6, 34, 62, 3)  # ffmpeg reads it back whole
        assert read_metadata(out)["title"] == AWKWARD


def test_png_frames_are_exact_carry_the_metadata_and_appear_together(tmp_path):
    video = frames(f=5)
    with Outputs() as outputs:
        times = write_video(outputs, FORMATS["png"], tmp_path / "f.png", chunks(video), 8, Encoding(), frames=5,
                            metadata={"title": AWKWARD})
        assert list(tmp_path.iterdir()) == [] or all(p.name.startswith(".") for p in tmp_path.iterdir())
        outputs.publish()
    assert times.frames == 5
    files = sorted(tmp_path.iterdir())
    assert [p.name for p in files] == [f"f-{i:04d}.png" for i in range(5)]
    for i, p in enumerate(files):
        image = Image.open(p)
        assert np.array_equal(np.asarray(image), video[i]) and image.text["title"] == AWKWARD


def test_an_interrupt_midway_leaves_no_png_frame(tmp_path):
    def interrupted():
        yield frames(f=2)
        raise SignalInterrupt(2)

    with pytest.raises(SignalInterrupt):
        with Outputs() as outputs:
            write_video(outputs, FORMATS["png"], tmp_path / "sub" / "f.png", interrupted(), 8, Encoding(), frames=4)
    assert list(tmp_path.iterdir()) == []  # no frame, no temporary, the folder it made removed


def test_overwrite_removes_an_earlier_runs_frames_of_the_series_once_the_new_ones_are_in_place(tmp_path):
    """A user trial: `t2v --out fr.png` (17 frames), then `--frames 5 --overwrite`: fr-0005.png ... fr-0016.png of
    the first run stayed, so the folder looked like one 17-frame video. With --overwrite the files of the series
    `fr-<4+ digits>.png` this run does not write go, only once its frames are in place (an interrupted run removes
    none), and nothing else does; without --overwrite nothing is removed."""
    out = tmp_path / "fr.png"

    def run(n: int, overwrite: bool, video=None) -> None:
        with Outputs(overwrite=overwrite) as outputs:
            write_video(outputs, FORMATS["png"], out, video or chunks(frames(f=n, h=8, w=8)), 8, Encoding(), frames=n)
            outputs.publish()

    run(17, False)
    (tmp_path / "fr-00016.png").write_bytes(b"old")  # the series numbered wider (a run past 9,999 frames)
    others = ["fr-1.png", "fr-0016.png.bak", "fr2-0016.png", "xfr-0016.png", "fr-0016.PNG", "fr.json", "fr.png"]
    for name in others:
        (tmp_path / name).write_bytes(b"keep")
    (tmp_path / "fr-0020.png").mkdir()  # a folder is no frame
    first = sorted(p.name for p in tmp_path.iterdir())
    assert [p.name for p in stale_frames(out, 5)] == [f"fr-{i:04d}.png" for i in range(5, 17)] + ["fr-00016.png"]

    def interrupted():
        yield frames(f=2, h=8, w=8)
        raise SignalInterrupt(2)

    with pytest.raises(SignalInterrupt):
        run(5, True, interrupted())
    assert sorted(p.name for p in tmp_path.iterdir()) == first  # nothing lost, no temporary left
    with pytest.raises(BadInput, match="exists"):  # without --overwrite: refused, nothing removed
        run(5, False)
    assert sorted(p.name for p in tmp_path.iterdir()) == first
    run(5, True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"fr-{i:04d}.png" for i in range(5)] + others
                                                                + ["fr-0020.png"])
    assert Image.open(tmp_path / "fr-0004.png").size == (8, 8)
