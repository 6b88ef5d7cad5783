"""The video's file format, chosen by `--out`'s extension: `.mp4` (H.264, the default), `.webm` (VP9), `.gif`
(an animated GIF, a palette made from the whole video) or `.png` (one PNG per frame, `NAME-0000.png`, ...); the
prompt and settings written into the file as metadata (`-metadata` of ffmpeg: title, description, comment; PNG text
chunks); and reading that metadata back (ffmpeg's ffmetadata format)."""

from __future__ import annotations

import functools
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import BadInput, RunFailure
from . import ffmpeg_pipe, video
from .paths import check_folder, check_target


@dataclass(frozen=True)
class VideoFormat:
    """One output format: `name` (its `--out` extension without the dot), `what` (in words), `encoder` (the bundled
    ffmpeg's encoder, None for PNG frames, which PIL writes) and whether it holds metadata (GIF does not)."""

    name: str
    what: str
    encoder: str | None
    metadata: bool = True


FORMATS = {f.name: f for f in (
    VideoFormat("mp4", "H.264 mp4 (--codec)", "libx264"),
    VideoFormat("webm", "VP9 WebM", "libvpx-vp9"),
    VideoFormat("gif", "animated GIF", "gif", metadata=False),
    VideoFormat("png", "PNG frames NAME-0000.png, NAME-0001.png, ...", None),
)}
WEBM_CRF = 30  # VP9's constant quality (0-63, lower is better): 30 is a small preview that keeps the detail
# VP9's output options: constant quality alone (`-b:v 0`), libvpx's good deadline at speed 5, row multithreading
WEBM_OPTIONS = {"crf": str(WEBM_CRF), "b:v": "0", "deadline": "good", "cpu-used": "5", "row-mt": "1"}


def output_format(out: Path) -> VideoFormat:
    """The format `--out`'s extension names (case-insensitive).

    Raises:
        BadInput: another extension, or none (one line naming those there are)."""
    fmt = FORMATS.get(out.suffix.lower().lstrip("."))
    if fmt is None:
        raise BadInput(f"--out {out}: the extension picks the format: .mp4 (H.264), .webm (VP9), .gif (animated) "
                       "or .png (one PNG per frame); give a path ending in one of them")
    return fmt


def frame_paths(out: Path, frames: int) -> list[Path]:
    """The files of `--out NAME.png`: `NAME-0000.png` ... beside it, one per frame (four digits, more past 9999)."""
    digits = max(4, len(str(frames - 1)))
    return [out.with_name(f"{out.stem}-{i:0{digits}d}.png") for i in range(frames)]


def stale_frames(out: Path, frames: int) -> list[Path]:
    """The PNG frame files of an earlier run of `--out NAME.png` that a run of `frames` frames does not write: the
    files beside `out` named exactly `NAME-` + four or more digits + `.png` (that series' pattern: an earlier,
    longer run's `NAME-0017.png` ...; frames numbered with more digits, past 9,999) other than
    `frame_paths(out, frames)`, in the order of their numbers. Nothing else in the folder counts (`NAME-1.png`, `NAME-0017.png.bak`,
    `NAME2-0017.png`, folders); an unreadable folder gives none."""
    series = re.compile(re.escape(out.stem) + r"-[0-9]{4,}\.png")
    written = {p.name for p in frame_paths(out, frames)}
    try:
        names = os.listdir(out.parent)
    except OSError:
        return []
    return sorted((out.parent / n for n in names
                   if series.fullmatch(n) and n not in written and not (out.parent / n).is_dir()),
                  key=lambda p: (len(p.name), p.name))


def frame_pattern(out: Path, frames: int) -> Path:
    """The frames of `--out NAME.png` as ffmpeg's pattern (`NAME-%04d.png`, what `ffmpeg -i` reads back)."""
    return out.with_name(f"{out.stem}-%0{max(4, len(str(frames - 1)))}d.png")


@functools.lru_cache(maxsize=None)
def _encoders() -> frozenset[str]:
    try:
        done = subprocess.run([video.find_ffmpeg(), "-hide_banner", "-encoders"], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(line.split()[1] for line in done.stdout.splitlines()
                     if len(line.split()) > 1 and len(line.split()[0]) == 6)


def check_format(fmt: VideoFormat, encoding: video.Encoding) -> None:
    """Make sure `fmt` can be written here, before anything runs: the bundled ffmpeg has its encoder (WebM needs
    libvpx-vp9), and `--codec` (mp4 only) is left at its default for the others.

    Raises:
        BadInput: one line saying why."""
    if fmt.name != "mp4" and encoding != video.Encoding():
        raise BadInput(f"--codec sets the mp4's encoder; a .{fmt.name} is written as {fmt.what}: leave --codec out")
    if fmt.encoder is not None and fmt.name != "mp4" and fmt.encoder not in _encoders():
        raise BadInput(f"--out .{fmt.name}: the bundled ffmpeg has no {fmt.encoder} encoder here; use .mp4 or .gif")


def _ffmpeg_frames(path: Path, fps: int, fmt: VideoFormat, metadata: dict[str, str] | None) -> ffmpeg_pipe.PipeWriter:
    """The WebM or GIF encoder child (started at the first frame, whose size it takes): VP9 yuv420p at
    WEBM_OPTIONS with `metadata` as its tags, or a looping GIF through one palette for the whole video."""

    def command(width: int, height: int) -> list[str]:
        if fmt.name == "webm":
            return ffmpeg_pipe.encode_command(path, width, height, fps, vcodec=fmt.encoder, pix_fmt="yuv420p",
                                              options=WEBM_OPTIONS, metadata=metadata)
        return ffmpeg_pipe.encode_command(path, width, height, fps, vcodec=fmt.encoder, pix_fmt="pal8",
                                          options={"loop": "0"}, graph=ffmpeg_pipe.palette_gif)

    return ffmpeg_pipe.PipeWriter(path, command)


class _PngFrames:
    """PNG frames: each frame to a temporary file `outputs` stages for its target (`Outputs.reserve`), with the
    metadata as text chunks, so every frame appears with the JSON or none does."""

    def __init__(self, outputs: video.Outputs, targets: list[Path], metadata: dict[str, str] | None) -> None:
        self.outputs, self.targets, self.metadata, self.done = outputs, targets, metadata, 0

    def append_data(self, frame: np.ndarray) -> None:
        from PIL import Image
        from PIL.PngImagePlugin import PngInfo

        if self.done >= len(self.targets):
            raise RunFailure(f"the decode gave more than the {len(self.targets)} frames asked for")
        info = PngInfo()
        for key, value in (self.metadata or {}).items():
            info.add_itxt(key, value)
        Image.fromarray(frame).save(self.outputs.reserve(self.targets[self.done]), format="PNG", pnginfo=info)
        self.done += 1

    def close(self) -> None:
        pass


def write_video(outputs: video.Outputs, fmt: VideoFormat, out: Path, chunks: Iterator[np.ndarray], fps: int,
                encoding: video.Encoding, *, frames: int, metadata: dict[str, str] | None = None,
                keep: Callable[[np.ndarray], None] | None = None) -> video.StreamTimes:
    """Stream (f, H, W, 3) uint8 chunks into `out` in `fmt` inside an `Outputs` block (published with the rest of
    its set): mp4 through `video.encode_mp4_stream` at `encoding`, WebM and GIF through ffmpeg, PNG frames as the
    `frames` files `frame_paths(out, frames)`, and where `outputs` overwrites, an earlier run's frames of the same
    series past them (`stale_frames`) removed once the set is in place (`Outputs.retire`: an interrupted or refused
    run removes none). `metadata` (title, description, comment) goes into the file where the format holds it.
    Returns what the stream measured.

    Raises:
        RunFailure / SignalInterrupt: as `video.encode_mp4_stream`."""
    streamed: list[video.StreamTimes] = []
    if fmt.name == "png":
        writer = _PngFrames(outputs, frame_paths(out, frames), metadata)
        if outputs.overwrite:  # a user trial: `--frames 5 --overwrite` left frames 5-16 of a 17-frame run
            outputs.retire(stale_frames(out, frames))
        return video.encode_mp4_stream(chunks, out, fps, keep=keep, open_writer=lambda path, rate: writer)
    opener = None if fmt.name == "mp4" else (lambda path, rate: _ffmpeg_frames(path, rate, fmt, metadata))

    def write(tmp: Path) -> None:
        streamed.append(video.encode_mp4_stream(chunks, tmp, fps, encoding, keep=keep, metadata=metadata,
                                                open_writer=opener, frames=frames))
        if not tmp.exists() or tmp.stat().st_size == 0:  # ffmpeg can fail on its own input and still exit quietly
            raise RunFailure(f"ffmpeg wrote no {fmt.what}")

    outputs.add(out, write, f".{fmt.name}")
    return streamed[0]


def _unescape(text: str) -> list[tuple[str, bool]]:
    """ffmetadata text as (character, escaped) pairs: a backslash takes the next character (`=`, `;`, `#`, `\\`,
    a newline) literally."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            out.append((text[i + 1], True))
            i += 2
        else:
            out.append((text[i], False))
            i += 1
    return out


def read_metadata(path: Path) -> dict[str, str]:
    """The container metadata of a video file (mp4, WebM, ...) as ffmpeg reads it (`ffmpeg -i FILE -f ffmetadata
    -`, escapes undone); keys lower-cased (Matroska writes COMMENT).

    Raises:
        RunFailure: ffmpeg could not read the file."""
    done = subprocess.run(ffmpeg_pipe.metadata_command(path), capture_output=True, timeout=60)
    if done.returncode != 0:
        raise RunFailure(f"ffmpeg could not read {path}: {ffmpeg_pipe.reason(done.stderr.decode(errors='replace'))}")
    tags: dict[str, str] = {}
    line: list[tuple[str, bool]] = []
    for ch, escaped in [*_unescape(done.stdout.decode("utf-8")), ("\n", False)]:
        if ch != "\n" or escaped:
            line.append((ch, escaped))
            continue
        if line and line[0] == ("[", False):  # a stream's or chapter's section: the file's own tags are above
            break
        if line and line[0] != (";", False):  # ";" starts a comment (the ";FFMETADATA1" header)
            split = next((i for i, (c, e) in enumerate(line) if c == "=" and not e), None)
            if split is not None:
                tags["".join(c for c, _ in line[:split]).lower()] = "".join(c for c, _ in line[split + 1:])
        line = []
    return tags


def check_output(out: Path, overwrite: bool, frames: int = 1) -> Path:
    """`--out` of t2v / i2v: a video file name (not a folder) whose extension picks the format
    (`output_format`: .mp4, .webm, .gif, or .png for `frames` PNG files NAME-0000.png, ...)
    that may be written, and its JSON beside it (see `check_target`, `check_folder`). Returns the JSON's path."""
    if out.is_dir():
        raise BadInput(f"--out is the video file to write (.mp4, .webm, .gif, or .png for PNG frames); {out} is a "
                       f"folder: use --out {out / 'name.mp4'}")
    if not out.name or out.name in (".", ".."):
        raise BadInput(f"--out {str(out)!r}: give a file name ending in .mp4, .webm, .gif or .png")
    json_out = out.with_suffix(".json")
    if out.name.lower() in {f".{name}" for name in FORMATS}:
        raise BadInput(f"--out {out}: no file name before {out.name}; give e.g. video{out.name.lower()}")
    files = frame_paths(out, frames) if output_format(out).name == "png" else [out]
    for p in (*files, json_out):
        check_target(p, overwrite, "--out")
    check_folder(out.parent)
    return json_out
