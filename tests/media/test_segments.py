"""Segment-parallel H.264 (`vsagen.media.segments`, `--codec x264:segments=N`): the cut, the join against each
segment encoded alone, the timestamps of the joined file, the clamp, failures and interrupts leaving nothing."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from vsagen import interrupts
from vsagen.errors import BadInput, RunFailure
from vsagen.media import encoding, ffmpeg_pipe, formats, segments, video


def random_clip(frames: int, height: int = 64, width: int = 96) -> np.ndarray:
    """Fresh random frames that move smoothly: random 4 x 6 colour grids blended over time, enlarged 16x, plus
    mild noise (uint8 (F, H, W, 3))."""
    rng = np.random.default_rng()
    keys = rng.uniform(0.1, 0.9, (frames // 4 + 2, height // 16, width // 16, 3))
    t = np.arange(frames) / 4
    w = (t % 1)[:, None, None, None]
    low = keys[t.astype(int)] * (1 - w) + keys[t.astype(int) + 1] * w
    big = low.repeat(16, axis=1).repeat(16, axis=2) + rng.normal(0, 0.01, (frames, height, width, 3))
    return video.to_uint8_frames(big)


def luma_psnr(x: np.ndarray, ref: np.ndarray) -> float:
    """PSNR (dB) of BT.601 luma, the channel yuv420p keeps whole, in float64."""
    y = [v.astype(np.float64) @ np.array([0.299, 0.587, 0.114]) for v in (x, ref)]
    return float(10 * np.log10(255.0 ** 2 / np.mean((y[0] - y[1]) ** 2)))


@pytest.mark.parametrize("frames,asked,starts", [
    (17, 3, [0, 6, 12]), (13, 2, [0, 7]), (16, 4, [0, 4, 8, 12]), (17, 9, [0, 5, 9, 13]),  # 9 asked: 4 of >= 4
    (7, 3, [0]), (1, 64, [0]), (81, 8, [0, 11, 21, 31, 41, 51, 61, 71])])
def test_segment_starts_cut_contiguous_ranges_of_at_least_four_frames(frames, asked, starts):
    got = segments.segment_starts(frames, asked)
    sizes = np.diff([*got, frames])
    assert got == starts and sizes.min() >= min(frames, segments.MIN_SEGMENT_FRAMES)
    assert sizes.max() - sizes.min() <= 1 and list(sizes) == sorted(sizes, reverse=True)  # the longer first
    with pytest.raises(ValueError):
        segments.segment_starts(frames, 0)


@pytest.mark.parametrize("count,asked,fps", [(17, 3, 7), (13, 2, 16)])  # odd counts, uneven splits
def test_the_join_is_each_segment_encoded_alone_with_timestamps_in_order(tmp_path, count, asked, fps):
    clip = random_clip(count)
    encoding = video.Encoding(segments=asked)
    joined, single = tmp_path / "joined.mp4", tmp_path / "single.mp4"
    video.encode_mp4(clip, joined, fps, encoding)
    video.encode_mp4(clip, single, fps)
    back, one = video.read_mp4(joined), video.read_mp4(single)
    assert back.shape == clip.shape
    # lossless join: the frames are those of every segment decoded on its own (x264 is deterministic)
    starts = [*segments.segment_starts(count, asked), count]
    alone = []
    for k, (a, b) in enumerate(zip(starts, starts[1:])):
        video.encode_mp4(clip[a:b], tmp_path / f"alone{k}.mp4", fps)
        alone.append(video.read_mp4(tmp_path / f"alone{k}.mp4"))
    assert np.array_equal(back, np.concatenate(alone))
    # as sharp as one ffmpeg (luma; the cuts restart rate control, a fraction of a dB)
    assert luma_psnr(back, clip) > luma_psnr(one, clip) - 1.0 > 35
    times = segments.packet_times(joined)
    dts, pts = [t[0] for t in times], sorted(t[1] for t in times)
    assert len(times) == count and all(b > a for a, b in zip(dts, dts[1:]))
    assert len({b - a for a, b in zip(pts, pts[1:])}) == 1 and pts[0] == 0  # one frame apart, from 0
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("alone")) == ["joined.mp4", "single.mp4"]


def test_each_segment_starts_exactly_where_the_one_before_ends(tmp_path):
    """Segments of 6 frames at 7 fps (857.142857 ms): the duration the concat demuxer reads from such an mp4
    segment was, for 2 in 3 random clips at this size, a tick or two short, so the next segment started early."""
    for _ in range(4):
        video.encode_mp4(random_clip(17, 32, 48), tmp_path / "j.mp4", 7, video.Encoding(segments=3))
        pts = sorted(t[1] for t in segments.packet_times(tmp_path / "j.mp4"))
        assert len(pts) == 17 and {b - a for a, b in zip(pts, pts[1:])} == {pts[1] - pts[0]}


def test_a_stream_starts_each_segment_at_its_first_frame_and_keeps_the_metadata(tmp_path):
    clip = random_clip(12)
    path = tmp_path / "s.mp4"
    writer = video._writer(path, 16, video.Encoding(segments=3), {"title": "a fox"}, frames=12)
    assert isinstance(writer, segments.SegmentWriter) and writer.starts == [0, 4, 8]
    for i, frame in enumerate(clip):
        writer.append_data(frame)
        assert len(writer._feeds) == i // 4 + 1  # segment k's ffmpeg started with its first frame, not before
    writer.close()
    assert formats.read_metadata(path)["title"] == "a fox" and video.read_mp4(path).shape == clip.shape
    assert [p.name for p in tmp_path.iterdir()] == ["s.mp4"]  # the segments' folder removed


def test_more_segments_than_frames_allow_are_clamped_down_to_one_ffmpeg(tmp_path):
    """Fewer than 2 x MIN_SEGMENT_FRAMES frames: one ffmpeg, the command vsagen always ran; so without the frame
    count (a stream of unknown length), which the cut needs."""
    writer = video._writer(tmp_path / "a.mp4", 16, video.Encoding(segments=64), frames=7)
    assert isinstance(writer, ffmpeg_pipe.PipeWriter)
    clip = random_clip(7)
    video.encode_mp4(clip, tmp_path / "b.mp4", 16, video.Encoding(segments=64))
    assert video.read_mp4(tmp_path / "b.mp4").shape == clip.shape
    assert isinstance(video._writer(tmp_path / "c.mp4", 16, video.Encoding(segments=2)), ffmpeg_pipe.PipeWriter)


def _left(folder: Path) -> list[str]:
    """Files left in `folder`, and ffmpeg children still naming it."""
    pids = [e.name for e in Path("/proc").iterdir() if e.name.isdigit() and int(e.name) != os.getpid()
            and _names(e, folder)]
    return [p.name for p in folder.iterdir()] + [f"pid {p}" for p in pids]


def _names(entry: Path, folder: Path) -> bool:
    try:
        return str(folder).encode() in (entry / "cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.parametrize("fault", ["decode error", "interrupt"])
def test_a_failure_mid_stream_leaves_no_file_no_segment_and_no_ffmpeg(tmp_path, fault):
    clip = random_clip(16)

    def chunks():
        yield clip[:4]
        yield clip[4:9]  # segments 0 and 1 started
        if fault == "interrupt":
            os.kill(os.getpid(), 15)  # SIGTERM, held by Outputs until the next safe point
            yield clip[9:12]
        raise RuntimeError("the decode failed")

    raised = RuntimeError if fault == "decode error" else interrupts.SignalInterrupt
    with pytest.raises(raised), interrupts.as_interrupt():  # as a command runs: the signal raised, not re-sent
        with video.Outputs() as outputs:
            outputs.add(tmp_path / "v.mp4", lambda tmp: video.encode_mp4_stream(
                chunks(), tmp, 16, video.Encoding(segments=4), frames=16))
            outputs.publish()
    assert _left(tmp_path) == []


def test_bad_frames_are_refused_and_abort_kills_every_segment(tmp_path):
    writer = video._writer(tmp_path / "a.mp4", 16, video.Encoding(segments=2), frames=8)
    clip = random_clip(6)
    for frame in clip:  # segments 0 and 1 started, both waiting for frames
        writer.append_data(frame)
    with pytest.raises(RunFailure, match=r"a frame of \(64, 32\) after frames of \(64, 96\)"):
        writer.append_data(clip[0][:, :32])
    with pytest.raises(RunFailure, match=r"must be \(H, W, 3\) uint8, got \(64, 96, 3\) float32"):
        writer.append_data(clip[0].astype(np.float32))
    assert len(writer._feeds) == 2 and _left(tmp_path) != []  # the segments' folder (and their ffmpeg children)
    writer.abort()
    assert _left(tmp_path) == []  # the folder removed; every child started killed and reaped


def test_a_segment_ffmpeg_failing_is_one_line_with_its_reason(tmp_path):
    with pytest.raises(RunFailure) as e:
        video.encode_mp4(np.zeros((8, 63, 65, 3), np.uint8) + 7, tmp_path / "odd.mp4", 16,
                         video.Encoding(segments=2))  # yuv420p needs even sizes
    assert str(e.value).endswith("writing odd.mp4: width not divisible by 2 (65x63)")  # the mp4's name, as one ffmpeg
    assert "\n" not in str(e.value) and _left(tmp_path) == []


def test_codec_threads_and_segments_parse_once_into_the_encoding():
    assert video.Encoding.parse("x264:segments=4:threads=6") == video.Encoding("x264", "veryfast", 10, 6, 4)
    assert video.Encoding().segments == encoding.X264_SEGMENTS and video.Encoding("nvenc").segments == 1
    assert video.Encoding(threads=6).ffmpeg_options()["threads"] == "6"
    assert "threads" not in video.Encoding().ffmpeg_options()  # x264's own choice: the command vsagen always ran
    for bad, says in (("x264:segments=0", "segments must be an integer in [1, 64], got 0"),
                      ("x264:segments=65", "segments must be an integer in [1, 64]"),
                      ("x264:segments=two", "segments must be an integer in [1, 64], got 'two'"),
                      ("x264:threads=-1", "threads must be an integer in [0, 128]"),
                      ("x264:segments=2:segments=3", "each once"),
                      ("nvenc:segments=2", "threads and segments are x264's options")):
        with pytest.raises(BadInput, match=re.escape(says)) as e:
            video.Encoding.parse(bad)
        assert "\n" not in str(e.value)
