"""vsagen.media.ffmpeg_pipe: the ffmpeg commands built with ffmpeg-python say what imageio's writer said (the old
command lines, as imageio-ffmpeg 0.6 built them, kept here), the files are the ones it wrote (mp4 and GIF byte for
byte, WebM frame for frame: Matroska writes a random segment id), and a failing ffmpeg is one line, its child
ended."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from vsagen.errors import RunFailure
from vsagen.media import ffmpeg_pipe, formats, video
from vsagen.media.video import read_mp4

# imageio's FFMPEG writer as vsagen called it (`-r 16`, 62x34 frames; "EXE" and "OUT" stand for the executable and
# the file), and check_encoder's probe as vsagen wrote it by hand
OLD_HEAD = ["EXE", "-y", "-f", "rawvideo", "-vcodec", "rawvideo", "-s", "62x34", "-pix_fmt", "rgb24", "-r", "16",
            "-i", "-", "-an"]
OLD = {
    "mp4": [*OLD_HEAD, "-vcodec", "libx264", "-pix_fmt", "yuv420p", "-v", "error", "-preset", "veryfast", "-crf", "10",
            "-metadata", "title=a=b; c", "-metadata", "comment=second", "OUT"],
    "webm": [*OLD_HEAD, "-vcodec", "libvpx-vp9", "-pix_fmt", "yuv420p", "-v", "error", "-crf", "30", "-b:v", "0",
             "-deadline", "good", "-cpu-used", "5", "-row-mt", "1", "-metadata", "title=a=b; c", "-metadata",
             "comment=second", "OUT"],
    "gif": [*OLD_HEAD, "-vcodec", "gif", "-pix_fmt", "pal8", "-v", "error", "-vf",
            "split[a][b];[a]palettegen=stats_mode=full[p];[b][p]paletteuse", "-loop", "0", "OUT"],
    "probe": ["EXE", "-hide_banner", "-loglevel", "error", "-f", "lavfi", "-i", "color=c=black:s=256x256:r=16",
              "-frames:v", "4", "-c:v", "h264_nvenc", "-preset", "p4", "-rc", "vbr", "-cq", "10", "-f", "null", "-"],
}
METADATA = {"title": "a=b; c", "comment": "second"}
ONE = video.Encoding(segments=1)  # the one ffmpeg these tests are about, whatever X264_SEGMENTS says
FLAGS = {"-an", "-y", "-hide_banner"}
SAME = {"-c:v": "-vcodec", "-v": "-loglevel", "-i -": "-i pipe:"}  # two spellings of one option


def parts(command: list[str]) -> dict:
    """A one-input, one-output ffmpeg command as {"global": {...}, "input": {...}, "i": input, "output": sorted
    (option, value) pairs, "metadata": its tags in order, "file": the output}, option spellings unified."""
    got: dict = {"global": {}, "input": {}, "output": [], "metadata": [], "file": None}
    words, section = iter(command[1:]), "input"
    for word in words:
        word = SAME.get(word, word)
        if word == "-" or not word.startswith("-"):  # the output file ("-": standard output)
            got["file"] = word
            continue
        value = None if word in FLAGS else next(words)
        if word == "-i":
            got["i"], section = SAME.get(f"-i {value}", f"-i {value}"), "output"
        elif word in ("-y", "-hide_banner", "-loglevel"):
            got["global"][word] = value
        elif word == "-metadata":
            got["metadata"].append(value)
        elif section == "input":
            got["input"][word] = value
        else:
            got["output"].append((word, value))
    got["output"].sort()
    return got


def new_command(kind: str, path: Path) -> list[str]:
    if kind == "mp4":
        return video._writer(path, 16, ONE, METADATA).command(62, 34)
    return formats._ffmpeg_frames(path, 16, formats.FORMATS[kind], METADATA).command(62, 34)


@pytest.mark.parametrize("kind", ["mp4", "webm"])
def test_the_encode_says_what_imageios_writer_said(tmp_path, kind):
    new = new_command(kind, tmp_path / f"v.{kind}")
    assert new[0] == ffmpeg_pipe.executable()
    old = parts([w.replace("OUT", str(tmp_path / f"v.{kind}")) for w in OLD[kind]])
    old["global"]["-hide_banner"] = None  # the one option added: no banner (nothing is printed but errors)
    assert parts(new) == old


def test_the_gif_says_what_imageios_writer_said_its_palette_a_graph(tmp_path):
    new, old = parts(new_command("gif", tmp_path / "v.gif")), parts(OLD["gif"])
    old["global"]["-hide_banner"] = None
    graph = dict(new["output"]).get("-filter_complex")
    assert graph == "[0]split=2[s0][s1];[s0]palettegen=stats_mode=full[s2];[s1][s2]paletteuse[s3]"
    drop = {"-filter_complex", "-map", "-vf"}  # the same graph, as a complex graph with its output mapped
    for p in (new, old):
        p["output"], p["file"] = [o for o in p["output"] if o[0] not in drop], None
    assert new == old


def test_the_encoder_probe_says_what_it_said():
    new = ffmpeg_pipe.probe_command("h264_nvenc", video.Encoding("nvenc").ffmpeg_options())
    assert parts(new) == parts(OLD["probe"])


def _old_write(kind: str, frames: np.ndarray, path: Path) -> None:
    """The file as imageio-ffmpeg's `write_frames` wrote it with the old command's options."""
    import imageio_ffmpeg

    _, codec, _, pix_fmt, _, _, *params, _ = OLD[kind][len(OLD_HEAD):]  # -vcodec C -pix_fmt P -v error ... OUT
    gen = imageio_ffmpeg.write_frames(str(path), (frames.shape[2], frames.shape[1]), fps=16, codec=codec,
                                      pix_fmt_out=pix_fmt, quality=None, macro_block_size=1, output_params=params,
                                      ffmpeg_log_level="error")
    gen.send(None)
    for frame in frames:
        gen.send(np.ascontiguousarray(frame))
    gen.close()


@pytest.mark.parametrize("kind", ["mp4", "gif", "webm"])
def test_the_file_is_the_one_imageio_wrote(tmp_path, kind):
    frames = np.random.default_rng(3).integers(0, 256, (4, 34, 62, 3), dtype=np.uint8)
    old, new = tmp_path / f"old.{kind}", tmp_path / f"new.{kind}"
    _old_write(kind, frames, old)
    writer = video._writer(new, 16, ONE, METADATA) if kind == "mp4" else formats._ffmpeg_frames(
        new, 16, formats.FORMATS[kind], METADATA if kind == "webm" else None)
    for frame in frames:
        writer.append_data(frame)
    writer.close()
    if kind != "webm":
        assert new.read_bytes() == old.read_bytes()
    if kind == "gif":
        from PIL import Image

        with Image.open(new) as gif:
            assert (gif.n_frames, gif.size) == (4, (62, 34))
        return
    back = read_mp4(new)
    assert back.shape == frames.shape and np.array_equal(back, read_mp4(old))


def _children_naming(folder: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if str(folder).encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


@pytest.mark.parametrize("frames", [3, 120])  # 3: ffmpeg fails at the end; 120 (12 kB each): mid-stream, a broken pipe
def test_a_failing_ffmpeg_is_one_line_with_its_reason_and_has_ended(tmp_path, frames):
    path = tmp_path / "odd.mp4"
    with pytest.raises(RunFailure) as e:
        video.encode_mp4(np.zeros((frames, 63, 65, 3), np.uint8), path, 8)  # yuv420p needs even sizes
    assert str(e.value).endswith("writing odd.mp4: width not divisible by 2 (65x63)") and "\n" not in str(e.value)
    assert not _children_naming(tmp_path)


def test_abort_kills_ffmpeg_and_bad_frames_are_refused(tmp_path):
    writer = video._writer(tmp_path / "a.mp4", 8, ONE)
    writer.append_data(np.zeros((16, 16, 3), np.uint8))
    with pytest.raises(RunFailure, match=r"a frame of \(16, 32\) after frames of \(16, 16\)"):
        writer.append_data(np.zeros((16, 32, 3), np.uint8))
    with pytest.raises(RunFailure, match=r"must be \(H, W, 3\) uint8, got \(16, 16, 3\) float32"):
        writer.append_data(np.zeros((16, 16, 3), np.float32))
    assert writer._proc.poll() is None  # still running, waiting for frames
    writer.abort()
    assert writer._proc.returncode == -9 and not Path(f"/proc/{writer._proc.pid}").exists()  # killed and reaped
    writer.close()  # after abort: nothing more to end


def test_reason_is_the_first_line_without_its_sources():
    said = ("[vost#0:0/libx264 @ 0x55] [enc:libx264 @ 0x56] Error while opening encoder\n"
            "[out#0/mp4 @ 0x57] Nothing was written into output file\n")
    assert ffmpeg_pipe.reason(said) == "Error while opening encoder"
    assert ffmpeg_pipe.reason("\n x264 [error]: invalid preset 'bogus'\n") == "x264 [error]: invalid preset 'bogus'"
    assert ffmpeg_pipe.reason("") == ""
