"""Segment-parallel H.264 (`--codec x264:segments=N`): a video's frames cut into N contiguous ranges, each encoded by
an ffmpeg of its own into an mp4 segment, the segments then joined into one mp4 by ffmpeg's concat demuxer with stream
copy (`-c copy`: no re-encode; the joined file's packets are the segments' packets, their timestamps shifted by the
duration of the segments before).

Each segment is a whole x264 encode, so it starts with an IDR frame and no frame of it refers to a frame of
another: the join is lossless, and decoding the joined file gives exactly the frames decoding each segment gives.
Its cost against one ffmpeg: an IDR frame at each segment start (a larger file, a little), rate control and
lookahead restarting at each cut. What it buys: N encoders at once, each starting as soon as its first frame
exists, so on many cores the encode is no longer one x264's frame-threading limit.

Segments are at least MIN_SEGMENT_FRAMES long (fewer frames: fewer segments, down to one): x264 reorders frames
for its B-frames and delays the decode timestamps of a segment by two frames, but a segment of one or two frames
has no such delay, and a delayed segment after an undelayed one would put decode timestamps out of order in the
join (measured with imageio-ffmpeg's ffmpeg 7.0.2 and 9.0.2: up to two frames undelayed at every preset, three or
more delayed; `ultrafast`, without B-frames, never delayed). Sizes differ by at most one frame, the longer first.
"""

from __future__ import annotations

import contextlib
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from bisect import bisect_right
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import RunFailure
from . import ffmpeg_pipe

MIN_SEGMENT_FRAMES = 4  # each segment's frames at least (see the module's docstring)
JOIN_LIST = "segments.txt"  # the concat demuxer's list, in the segments' folder


def segment_starts(frames: int, segments: int) -> list[int]:
    """The first frame index of each segment of a `frames`-frame video cut into `segments` contiguous ranges:
    `segments` clamped to [1, frames // MIN_SEGMENT_FRAMES], sizes differing by at most one frame, the longer first
    (17 frames in 3: [0, 6, 12], sizes 6, 6, 5; 17 frames in 9: 4 segments; 5 frames: one).

    Raises:
        ValueError: `segments` < 1 or `frames` < 1."""
    if segments < 1 or frames < 1:
        raise ValueError(f"segment_starts needs frames >= 1 and segments >= 1, got {frames} and {segments}")
    n = max(1, min(segments, frames // MIN_SEGMENT_FRAMES))
    size, longer = divmod(frames, n)
    return [k * size + min(k, longer) for k in range(n)]


class _Feed:
    """One segment: its ffmpeg (a `PipeWriter`, started at the segment's first frame) fed from a queue by a thread
    of its own, so the frames of several segments are encoded at once. The thread closes the writer at the end
    marker (None) and keeps whatever failed in `failures` (shared by the segments)."""

    def __init__(self, writer: ffmpeg_pipe.PipeWriter, failures: list[BaseException]) -> None:
        self.writer, self.failures = writer, failures
        self.waiting: queue.Queue = queue.Queue()  # unbounded: the producer never waits for a segment's encoder
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._feed, name=f"vsagen-segment-{writer.path.stem}", daemon=True)
        self.thread.start()

    def _feed(self) -> None:
        try:
            while (frame := self.waiting.get()) is not None:
                if self.stop.is_set():
                    return
                self.writer.append_data(frame)
            if not self.stop.is_set():
                self.writer.close()
        except BaseException as e:  # kept for the producer (`SegmentWriter.append_data` / `close`), which raises it
            self.failures.append(e)

    def end(self) -> None:
        """The segment's last frame was queued: the end marker, after which the thread closes the writer."""
        self.waiting.put(None)

    def kill(self) -> None:
        """Stop feeding, kill ffmpeg and wait for the thread and the child (its segment is being given up)."""
        self.stop.set()
        self.waiting.put(None)
        self.writer.kill()  # a write blocked on a full pipe fails at once
        self.thread.join()
        self.writer.abort()  # and one started meanwhile (the thread's last frame) killed and waited for


class SegmentWriter:
    """An mp4 written by segments encoded at once (`append_data(frame)`, `close()`, `abort()`, as `PipeWriter`):
    the `frames` frames expected are cut at `segment_starts(frames, segments)`; segment k's ffmpeg,
    `command(segment_path, width, height)`, starts when its first frame arrives and is told its input ended when
    the next segment's first frame arrives. `close` waits for every segment and joins them into `path` with
    `join(list_file, path)` (the concat demuxer, stream copy), each segment lasting exactly its frames / `fps`
    seconds: written in the list, since the duration the demuxer reads from an mp4 segment is the container's,
    rounded (ffmpeg 9.0.2, 60 random clips at 7, 16, 24 and 30 fps: in 19 a segment started two to ten ticks early,
    e.g. 16 fps frames 1016 ticks of 1/16384 s apart at a cut where all others are 1024). Frames past `frames` go to
    the last segment; fewer frames join the segments that started. The segments and their list live in a hidden
    temporary folder beside `path`, removed by `close` and `abort` whatever happens, so an error or an interrupt
    leaves nothing of them.

    Each segment's frames wait in a queue until its ffmpeg takes them, so up to the whole video's frames may be held
    at once (the producer is never slowed by an encoder); a frame must not change after `append_data` took it.

    Raises (append_data, close):
        RunFailure: a segment's ffmpeg or the join failed (ffmpeg's reason, one line), or a frame is not
            (H, W, 3) uint8 of the first frame's size.
    """

    def __init__(self, path: Path, frames: int, segments: int, fps: int, command: Callable[[Path, int, int], list[str]],
                 join: Callable[[Path, Path], list[str]]) -> None:
        self.path, self.fps, self.command, self.join = Path(path), fps, command, join
        self.starts = segment_starts(frames, segments)
        self.frames = 0
        self.join_s = 0.0  # seconds the join took (`close`), host clock
        self.failures: list[BaseException] = []
        self._feeds: list[_Feed] = []
        self._size: tuple[int, ...] | None = None
        self._folder: Path | None = None

    def append_data(self, frame: np.ndarray) -> None:
        """Queue one (H, W, 3) uint8 frame for its segment (whose ffmpeg starts at its first frame)."""
        if self.failures:
            raise self.failures[0]
        frame = np.asarray(frame)
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
            raise RunFailure(f"frames to encode must be (H, W, 3) uint8, got {frame.shape} {frame.dtype}")
        if self._size is not None and frame.shape != self._size:
            raise RunFailure(f"a frame of {frame.shape[:2]} after frames of {self._size[:2]}")
        self._size = frame.shape
        if bisect_right(self.starts, self.frames) > len(self._feeds):  # the first frame of the next segment
            if self._feeds:
                self._feeds[-1].end()
            self._feeds.append(self._open(len(self._feeds), frame.shape[1], frame.shape[0]))
        self._feeds[-1].waiting.put(frame)
        self.frames += 1

    def _open(self, k: int, width: int, height: int) -> _Feed:
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix=f".{self.path.stem}.segments.", dir=self.path.parent))
        part = self._folder / f"segment-{k:03d}.mp4"
        writer = ffmpeg_pipe.PipeWriter(part, lambda w, h: self.command(part, w, h), self.path.name)
        return _Feed(writer, self.failures)

    def close(self) -> None:
        """Wait for every segment's ffmpeg, join the segments into `path` (stream copy) and remove them."""
        try:
            if self._feeds:
                self._feeds[-1].end()
            for feed in self._feeds:
                while feed.thread.is_alive() and not self.failures:  # a failed segment ends the others at once
                    feed.thread.join(0.05)
            if self.failures:
                raise self.failures[0]
            if self._feeds:
                self._join()
        except BaseException:
            self._kill()
            raise
        finally:
            self._remove()

    def _join(self) -> None:
        listing = self._folder / JOIN_LIST
        listing.write_text("".join(f"file '{feed.writer.path.name}'\nduration {feed.writer.frames / self.fps:.6f}\n"
                                   for feed in self._feeds))
        t0 = time.perf_counter()
        with tempfile.TemporaryFile() as said:
            code = subprocess.run(self.join(listing, self.path), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=said, start_new_session=True).returncode
            said.seek(0)
            reason = ffmpeg_pipe.reason(said.read().decode(errors="replace"))
        self.join_s = time.perf_counter() - t0
        if code != 0 or not self.path.exists() or self.path.stat().st_size == 0:
            raise RunFailure(f"ffmpeg failed (exit {code}) joining {len(self._feeds)} segments into {self.path.name}"
                             + (f": {reason}" if reason else " (ffmpeg said nothing)"))

    def abort(self) -> None:
        """Kill every segment's ffmpeg, wait for them and remove the segments (the file is being given up)."""
        try:
            self._kill()
        finally:
            self._remove()

    def _kill(self) -> None:
        for feed in self._feeds:
            with contextlib.suppress(Exception):
                feed.kill()

    def _remove(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    @property
    def segments(self) -> int:
        """How many segments the expected frames are cut into (after the clamp of `segment_starts`)."""
        return len(self.starts)


def packet_times(path: Path) -> list[tuple[int, int]]:
    """(decode, presentation) timestamps of each video packet of the mp4 `path`, in file order and the stream's time
    base (ffmpeg's framecrc listing, `ffmpeg_pipe.packets_command`): the check that a joined file's timestamps run
    on (decode timestamps strictly increasing, presentation timestamps one frame apart once sorted).

    Raises:
        RunFailure: ffmpeg could not read the file."""
    done = subprocess.run(ffmpeg_pipe.packets_command(path), capture_output=True, timeout=120)
    if done.returncode != 0:
        raise RunFailure(f"ffmpeg could not read {path}: {ffmpeg_pipe.reason(done.stderr.decode(errors='replace'))}")
    rows = [line.split(",") for line in done.stdout.decode().splitlines() if line and not line.startswith("#")]
    return [(int(row[1]), int(row[2])) for row in rows]
