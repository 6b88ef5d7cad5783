"""The ffmpeg command lines vsagen runs, built with ffmpeg-python (import name `ffmpeg`) for the executable that
imageio-ffmpeg bundles, and `PipeWriter`, which feeds raw RGB frames to such a command over its standard input.

Every command is `input -> (filter graph) -> output` in ffmpeg-python's terms, compiled to an argument list
(`.compile(cmd=...)`) and started here, not by ffmpeg-python's `run_async`: the child gets a session of its own
(a Ctrl-C to the terminal's process group does not kill it mid-file; vsagen ends it itself at its safe points,
`vsagen.interrupts`), no stdout, and its stderr in a temporary file whose first line becomes the one-line error.

ffmpeg-python 0.2.0 keeps an output's options in a dict (one value per option, emitted in sorted order), so the
repeated `-metadata KEY=VALUE` pairs are put in front of the output file by `_with_metadata`; option order does not
change what ffmpeg writes (`benchmarks/ffmpeg_python_encode.py`: the same bytes as imageio's writer wrote).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import RunFailure

LOG_ARGS = ("-hide_banner", "-loglevel", "error")  # ffmpeg's global options: errors only, no banner

# A filter graph: ffmpeg-python's stream of the raw frames in -> the stream to encode.
Graph = Callable[[Any], Any]


def executable() -> str:
    """The ffmpeg that imageio-ffmpeg bundles (its path, cached by imageio-ffmpeg for the process).

    Raises:
        RuntimeError: imageio-ffmpeg finds no ffmpeg."""
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()


def raw_frames(width: int, height: int, fps: int) -> Any:
    """ffmpeg-python's input stream of raw (H, W, 3) uint8 RGB frames on standard input at `fps` frames a second."""
    import ffmpeg

    return ffmpeg.input("pipe:", format="rawvideo", vcodec="rawvideo", pix_fmt="rgb24", s=f"{width}x{height}", r=fps)


def palette_gif(stream: Any) -> Any:
    """The GIF's filter graph: one palette made from the whole video (palettegen over every frame, stats_mode=full),
    then each frame mapped onto it (paletteuse)."""
    import ffmpeg

    split = stream.split()
    palette = split[0].filter("palettegen", stats_mode="full")
    return ffmpeg.filter([split[1], palette], "paletteuse")


def encode_command(path: Path, width: int, height: int, fps: int, *, vcodec: str, pix_fmt: str,
                   options: dict[str, Any] | None = None, metadata: dict[str, str] | None = None,
                   graph: Graph | None = None) -> list[str]:
    """The ffmpeg command that encodes raw (H, W, 3) uint8 RGB frames of `width` x `height` from standard input
    into `path` (overwritten) with encoder `vcodec` in pixel format `pix_fmt`, exactly that size (no scaling).

    Args:
        options: the encoder's and muxer's output options without the dash ({"preset": "veryfast", "crf": 10};
            a value None is a flag).
        metadata: the container's tags (title, description, comment), `-metadata KEY=VALUE` each.
        graph: a filter graph between the frames and the encoder (`palette_gif`), or None.

    Returns:
        The argument list, the executable first."""
    stream = raw_frames(width, height, fps)
    if graph is not None:
        stream = graph(stream)
    out = stream.output(str(path), an=None, vcodec=vcodec, pix_fmt=pix_fmt, **(options or {}))
    return _with_metadata(out.global_args(*LOG_ARGS).compile(cmd=executable(), overwrite_output=True),
                          str(path), metadata)


def concat_command(listing: Path, path: Path, metadata: dict[str, str] | None = None) -> list[str]:
    """The command that joins the mp4 segments `listing` names (the concat demuxer's list: `file 'NAME'` lines,
    names relative to its folder) into the mp4 `path` (overwritten) by stream copy, no re-encode; `metadata` as
    `encode_command`'s (`vsagen.media.segments`)."""
    import ffmpeg

    out = ffmpeg.input(str(listing), format="concat").output(str(path), c="copy", format="mp4")
    return _with_metadata(out.global_args(*LOG_ARGS).compile(cmd=executable(), overwrite_output=True),
                          str(path), metadata)


def probe_command(vcodec: str, options: dict[str, Any]) -> list[str]:
    """The command that opens encoder `vcodec` with `options` on 4 blank 256x256 frames and writes nowhere
    (`vsagen.media.encoding.check_encoder`)."""
    import ffmpeg

    blank = ffmpeg.input("color=c=black:s=256x256:r=16", format="lavfi")
    out = blank.output("-", format="null", vcodec=vcodec, **{"frames:v": 4}, **options)
    return out.global_args(*LOG_ARGS).compile(cmd=executable())


def packets_command(path: Path) -> list[str]:
    """The command that prints each video packet of `path` (stream copy, nothing decoded) on standard output in
    ffmpeg's framecrc format: `stream, dts, pts, duration, size, checksum` lines in the stream's time base."""
    import ffmpeg

    out = ffmpeg.input(str(path)).output("-", format="framecrc", c="copy", an=None)
    return out.global_args(*LOG_ARGS).compile(cmd=executable())


def metadata_command(path: Path) -> list[str]:
    """The command that prints `path`'s container tags in ffmpeg's ffmetadata format on standard output."""
    import ffmpeg

    return ffmpeg.input(str(path)).output("-", format="ffmetadata").global_args(*LOG_ARGS).compile(cmd=executable())


def _with_metadata(args: list[str], path: str, metadata: dict[str, str] | None) -> list[str]:
    """`args` with `-metadata KEY=VALUE` for each tag just before the output file `path` (output options)."""
    at = len(args) - 1 - args[::-1].index(path)
    tags = [arg for key, value in (metadata or {}).items() for arg in ("-metadata", f"{key}={value}")]
    return [*args[:at], *tags, *args[at:]]


def reason(stderr: str) -> str:
    """What ffmpeg said went wrong, in one line: its first message line, without the "[libx264 @ 0x...] " source
    prefixes ("" if it said nothing). The first, not the last: ffmpeg 7's threads report the cause first and then
    each consequence ("width not divisible by 2 (17x15)" ... "Nothing was written into output file")."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return re.sub(r"^(\[[^\]]*\] )+", "", lines[0]) if lines else ""


class PipeWriter:
    """An encoder child fed raw frames (imageio's writer interface: `append_data(frame)`, `close()`): ffmpeg starts
    at the first frame with `command(width, height)` (`encode_command` for this writer's file), whose size every
    later frame must have. `close` tells ffmpeg the input ended and waits for it; `abort` kills it (an error or an
    interrupt: its file is about to be removed). The child has ended when either returns or raises. Its errors name
    the file `name` (default: `path`'s name; a segment's writer names the mp4 the segment is part of).

    Raises (append_data, close):
        RunFailure: ffmpeg failed (what it said, one line: `reason`), wrote an empty file, or a frame is not (H, W, 3) uint8
            of the first frame's size.
    """

    def __init__(self, path: Path, command: Callable[[int, int], list[str]], name: str | None = None) -> None:
        self.path, self.command = Path(path), command
        self.name = self.path.name if name is None else name
        self.frames = 0
        self._size: tuple[int, int] | None = None
        self._proc: subprocess.Popen | None = None
        self._stderr: Any = None  # ffmpeg's stderr: a temporary file, read and closed once it ended (`said`)
        self.said = ""  # what ffmpeg said went wrong (`reason`), once it ended

    def append_data(self, frame: np.ndarray) -> None:
        """Hand one (H, W, 3) uint8 frame to ffmpeg (started at the first)."""
        frame = np.asarray(frame)
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
            raise RunFailure(f"frames to encode must be (H, W, 3) uint8, got {frame.shape} {frame.dtype}")
        if self._proc is None:
            self._start(frame.shape[1], frame.shape[0])
        elif frame.shape[:2] != self._size[::-1]:
            raise RunFailure(f"a frame of {frame.shape[:2]} after frames of {self._size[::-1]}")
        try:
            self._proc.stdin.write(np.ascontiguousarray(frame).data)
        except OSError:  # ffmpeg ended early (a broken pipe): its own reason
            self._reap()
            raise self._failure() from None
        self.frames += 1

    def _start(self, width: int, height: int) -> None:
        self._size = (width, height)
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(self.command(width, height), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                      stderr=self._stderr, start_new_session=True)

    def close(self) -> None:
        """Tell ffmpeg the input ended and wait for it to finish the file (nothing after `abort`)."""
        if self._proc is None or self._proc.returncode is not None:
            return
        with contextlib.suppress(OSError):  # ffmpeg may have ended already (its reason: below)
            self._proc.stdin.close()
        if self._reap() != 0:
            raise self._failure()
        if not self.path.exists() or self.path.stat().st_size == 0:
            raise self._failure(f"ffmpeg wrote no video for {self.frames} frames")

    def kill(self) -> None:
        """Send ffmpeg the kill signal without waiting for it (from another thread than the one feeding it: a write
        blocked on the full pipe then fails at once); `abort` waits for it."""
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._proc.kill()

    def abort(self) -> None:
        """Kill ffmpeg and wait for it (its file is being given up)."""
        if self._proc is None:
            return
        with contextlib.suppress(OSError):
            self._proc.kill()
        self._reap()
        with contextlib.suppress(OSError):
            self._proc.stdin.close()

    def _reap(self) -> int:
        """Wait for ffmpeg; keep what it said (`said`), close its stderr file; its exit code."""
        code = self._proc.wait()
        if not self._stderr.closed:
            self._stderr.seek(0)
            self.said = reason(self._stderr.read().decode(errors="replace"))
            self._stderr.close()
        return code

    def _failure(self, what: str | None = None) -> RunFailure:
        what = what or f"ffmpeg failed (exit {self._proc.returncode}) writing {self.name}"
        return RunFailure(f"{what}: {self.said}" if self.said else f"{what} (ffmpeg said nothing)")
