"""Video, JSON, text and figure output: written to a temporary file beside the target, then moved into place.

Without overwrite the final step is `os.link`, which fails if the target appeared meanwhile, so an existing
file is never replaced silently, even by a concurrent run.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import queue
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from .. import interrupts
from ..errors import BadInput, RunFailure, VsagenError
from . import ffmpeg_pipe, segments
from .encoding import CODECS, Encoding  # noqa: F401 - Encoding re-exported (the writers' parameter)
from .paths import normal_path


def to_uint8_frames(video: np.ndarray) -> np.ndarray:
    """(F, H, W, 3) float in [0, 1] (NaN allowed: random weights) -> (F, H, W, 3) uint8."""
    v = np.nan_to_num(np.asarray(video, dtype=np.float32), nan=0.0, posinf=1.0, neginf=0.0)
    return (np.clip(v, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK, errno.EXDEV}


def _publish(tmp: Path, target: Path, overwrite: bool) -> None:
    if overwrite:
        os.replace(tmp, target)
        return
    try:
        try:
            os.link(tmp, target)  # fails if target exists: never replaces a file that appeared meanwhile
        except FileExistsError:
            raise
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
            # a file system without hard links (vfat, some network mounts): reserve the name, then move over it
            os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            os.replace(tmp, target)
    except FileExistsError:
        raise BadInput(f"{target} exists (appeared during the run); pass --overwrite to replace it") from None
    finally:
        tmp.unlink(missing_ok=True)


def _keep_old(target: Path) -> Path | None:
    """A hard link to the file `target` names (kept while a replacement goes in, so a failed set can put it back),
    or None: no file there, or a file system without hard links (the old file is then not kept)."""
    if not target.exists():
        return None
    keep = _temporary_beside(target, target.suffix)
    keep.unlink()  # the name only: the link takes it
    try:
        os.link(target, keep)
    except FileExistsError:  # pragma: no cover - the name was taken meanwhile
        return None
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
        return None
    return keep


def _temporary_beside(target: Path, suffix: str) -> Path:
    """An empty temporary file in `target`'s folder (created if missing), hidden, with the usual file mode."""
    target.parent.mkdir(parents=True, exist_ok=True)  # missing folders: created (config checked they can be)
    fd, name = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=suffix, dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; the result should get the usual mode
    return tmp


def _said_of(error: OSError | VsagenError, tmp: Path, target: Path) -> VsagenError:
    """`error`, raised while writing the temporary file `tmp` of `target`, as the error of `target`: an OS error
    as a RunFailure "cannot write <target>: <the reason> (nothing was written)"; a vsagen error with the temporary
    file's path or name in its text (ffmpeg's "... writing .b.x1y2.mp4: Error writing trailer of /d/.b.x1y2.mp4:
    No space left on device") with `target`'s in their place. (A new-user trial: a full disk's error line named the
    hidden temporary file.)"""
    if isinstance(error, OSError):
        reason = error.strerror or str(error) or type(error).__name__
        return RunFailure(f"cannot write {target}: {reason[:1].lower()}{reason[1:]} (nothing was written)")
    text = str(error).replace(str(tmp), str(target)).replace(tmp.name, target.name)
    return error if text == str(error) else type(error)(text)


def _write_atomic(target: Path, overwrite: bool, write: Callable[[Path], None], suffix: str) -> None:
    with Outputs(overwrite=overwrite) as outputs:
        outputs.add(target, write, suffix)
        outputs.publish()


class Outputs:
    """Files that appear together or not at all (a video and its timing JSON; compare's folder): each is written
    to a temporary file beside its target (`add`), then all are moved into place at once (`publish`). For the
    block's whole life Ctrl-C, SIGTERM and SIGHUP are held back (`vsagen.interrupts.hold`) and raised only at safe
    points: before and after each file, between video frames, before the first file is moved; once every file is
    in place, a later signal no longer interrupts the command (unless not `final`: more sets follow, `--seeds`'
    seeds before the last). Leaving the block unpublished (an error, an
    interrupt) removes the temporaries, every child ffmpeg having ended, and the folders this block created
    (`folder`, and the missing parents of the targets) where they are empty.

    Raises (publish):
        BadInput: a target exists and `overwrite` is False (checked again at publication: nothing is published,
            and the files this set had already moved into place are removed again).
        OSError: a file could not be moved into place; as above, and a file the set replaced is put back.
        SignalInterrupt: (also `add` and entering the block) an ending signal arrived; nothing is left.
    """

    def __init__(self, overwrite: bool = False, folder: Path | None = None, final: bool = True) -> None:
        self.overwrite = overwrite
        self.folder = None if folder is None else normal_path(folder)
        self.final = final  # the command's last set: once published, a signal no longer stops it
        self._staged: list[tuple[Path, Path]] = []
        self._made: list[Path] = []  # folders `add` created for its targets, removed again (if empty) unpublished
        self._replace: set[Path] = set()  # targets `add` was told to replace whatever `overwrite` says
        self._retired: list[Path] = []  # files `publish` removes once every target is in place (`retire`)
        self._created = False
        self._published = False
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> "Outputs":
        self._guard = self._stack.enter_context(interrupts.hold())
        try:
            if self.folder is not None and not self.folder.exists():
                self.folder.mkdir(parents=True)
                self._created = True
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            for tmp, _ in self._staged:
                tmp.unlink(missing_ok=True)
            self._staged.clear()
            if not self._published:
                made = [*reversed(self._made), *([self.folder] if self._created else [])]
                for folder in made:  # deepest first
                    with contextlib.suppress(OSError):  # only if empty: nothing of anyone else's goes
                        folder.rmdir()
        finally:
            self._stack.close()
        if exc[1] is not None and self._guard is not None:  # an error after a held signal: that interrupt
            converted = self._guard.as_interrupt(exc[1])
            if converted is not exc[1]:
                raise converted from exc[1]

    def add(self, target: Path, write: Callable[[Path], None], suffix: str | None = None, *,
            replace: bool = False) -> None:
        """Write `target`'s content with `write(tmp)` to a temporary file beside it (suffix: `target`'s); `write`
        may call `vsagen.interrupts.check()` at its own safe points (`encode_mp4` does between frames). `replace`:
        the file replaces an existing one whatever `overwrite` says (a MagCache calibration file; add it last, so a
        refused earlier file leaves the old one in place).

        Raises:
            RunFailure: `write` failed with an OS error (a full disk: ENOSPC), or with a vsagen error naming the
                temporary file (ffmpeg's): said of `target`, the file the user asked for; the temporary file is
                removed when the block ends, as every unpublished one.
        """
        interrupts.check()
        target = normal_path(target)
        tmp = self.reserve(target, suffix)
        if replace:
            self._replace.add(target)
        try:
            write(tmp)
        except (OSError, VsagenError) as e:
            raise _said_of(e, tmp, target) from None
        interrupts.check()

    def reserve(self, target: Path, suffix: str | None = None) -> Path:
        """A temporary file beside `target` (suffix: `target`'s), staged for `publish` as `add`'s are, for a
        writer that fills it itself (PNG frames, one per frame as the video decodes); removed unpublished."""
        target = normal_path(target)  # `a/../b.mp4`: no folder `a` made on the way
        missing = [p for p in (target.parent, *target.parent.parents) if not p.exists()]
        self._made.extend(reversed(missing))  # outermost first; __exit__ removes them deepest first
        tmp = _temporary_beside(target, target.suffix if suffix is None else suffix)
        self._staged.append((tmp, target))
        return tmp

    def retire(self, paths: list[Path]) -> None:
        """Have `publish` remove `paths` (files an earlier run left that this set's files make stale: the PNG frames
        past this run's count) once every file of the set is in place; a set left unpublished (an error, an
        interrupt, a refusal) removes none, so nothing already there is lost before the new files are."""
        self._retired.extend(normal_path(p) for p in paths)

    def publish(self) -> None:
        """Move every added file into place (a signal meanwhile is held; after the last one it is dropped: the
        command's files are complete). All or nothing: if one cannot be moved (an existing file without
        `overwrite`, an OS error), those already moved are taken back, and a file one of them replaced is put back
        as it was (kept as a hard link until the set is in place; not on a file system without hard links). Then
        the files `retire` named are removed (one that cannot be is left as it is: the set is already in place)."""
        interrupts.check()
        done: list[tuple[Path, Path | None]] = []  # (target, the file it replaced, kept) in publication order
        try:
            for tmp, target in self._staged:
                replace = self.overwrite or target in self._replace
                kept = _keep_old(target) if replace else None
                try:
                    _publish(tmp, target, replace)
                except BaseException:
                    if kept is not None:
                        kept.unlink(missing_ok=True)
                    raise
                done.append((target, kept))
        except BaseException:
            for target, kept in reversed(done):  # ours: linked or moved here a moment ago
                with contextlib.suppress(OSError):
                    if kept is not None:
                        os.replace(kept, target)
                    else:
                        target.unlink(missing_ok=True)
            raise
        else:
            for _, kept in done:
                if kept is not None:
                    kept.unlink(missing_ok=True)
            for path in self._retired:
                with contextlib.suppress(OSError):
                    path.unlink(missing_ok=True)
        finally:
            moved = {t for t, _ in done}
            self._staged = [(t, g) for t, g in self._staged if g not in moved]
        self._published = True
        if self._guard is not None:
            self._guard.published(self.final)


def find_ffmpeg() -> str:
    """The ffmpeg executable vsagen runs, imageio-ffmpeg's bundled one (its path; imageio-ffmpeg caches it for the
    process: `ffmpeg_pipe.executable`). Call it before `Outputs`: it runs `ffmpeg -version` in a child of this
    process group, which a Ctrl-C to the group kills, and inside `Outputs` (the signal held) imageio-ffmpeg would
    then report "No ffmpeg exe could be found"; here the signal interrupts at once.

    Raises:
        RuntimeError: imageio-ffmpeg finds no ffmpeg."""
    return ffmpeg_pipe.executable()


def _writer(path: Path, fps: int, encoding: Encoding | None, metadata: dict[str, str] | None = None, *,
            frames: int | None = None) -> Any:
    """The mp4's encoder (started at the first frame): H.264 yuv420p at exactly the frames' H x W, `encoding`'s
    options, `metadata` as the container's tags (the mp4 muxer keeps title, description and comment without
    further flags; other keys would need `-movflags use_metadata_tags`). One ffmpeg (`ffmpeg_pipe.PipeWriter`), or
    with x264 `segments` > 1 and `frames` (the frames expected) long enough to cut, a `segments.SegmentWriter`;
    without `frames` (a stream of unknown length: the cut needs the count) one ffmpeg."""
    encoding = Encoding() if encoding is None else encoding
    options, vcodec = encoding.ffmpeg_options(), CODECS[encoding.codec]
    if encoding.segments > 1 and frames is not None:
        if len(segments.segment_starts(frames, encoding.segments)) > 1:
            return segments.SegmentWriter(
                path, frames, encoding.segments, fps,
                lambda part, width, height: ffmpeg_pipe.encode_command(part, width, height, fps, vcodec=vcodec,
                                                                       pix_fmt="yuv420p", options=options),
                lambda listing, out: ffmpeg_pipe.concat_command(listing, out, metadata))

    def command(width: int, height: int) -> list[str]:
        return ffmpeg_pipe.encode_command(path, width, height, fps, vcodec=vcodec, pix_fmt="yuv420p",
                                          options=options, metadata=metadata)

    return ffmpeg_pipe.PipeWriter(path, command)


def encode_mp4(frames: np.ndarray, path: Path, fps: int, encoding: Encoding | None = None) -> None:
    """Encode (F, H, W, 3) uint8 frames as H.264 mp4 (yuv420p) at exactly H x W with the bundled ffmpeg into `path`
    (written in place: `write_mp4` and `Outputs` give the atomic publication). Between frames it checks for a
    held-back Ctrl-C / SIGTERM (`vsagen.interrupts.check`); the ffmpeg child has ended when this returns or raises.
    `encoding`: the codec, preset and CRF (`Encoding`; None: its defaults, x264 veryfast CRF 10).

    Raises:
        RunFailure: ffmpeg failed (its last line) or left the file empty.
        SignalInterrupt: an ending signal arrived during the encode (under `Outputs`)."""
    w = _writer(path, fps, encoding, frames=len(frames))
    try:
        for frame in frames:
            w.append_data(frame)
            interrupts.check()  # a safe point
    except BaseException:
        # ended here, so no child outlives the temporary file (one did, and created it again after its removal)
        _give_up(w)
        raise
    w.close()
    if not path.exists() or path.stat().st_size == 0:  # ffmpeg can fail on its own input and still exit quietly
        raise RunFailure(f"ffmpeg wrote no video for {len(frames)} frames at {fps} fps")


def _give_up(writer: Any) -> None:
    """End `writer` whose file is being given up: ffmpeg killed (`PipeWriter.abort`), or closed where the writer
    has no abort (PNG frames); errors of the ending are dropped (the error being raised says what went wrong)."""
    with contextlib.suppress(Exception):
        getattr(writer, "abort", writer.close)()


@dataclass(frozen=True)
class StreamTimes:
    """What `encode_mp4_stream` measured (host clock, seconds): `produce_s` in the producer (the decode of each chunk
    and its frames, main thread), `encode_s` in the encoder thread (handing frames to ffmpeg, ffmpeg's finish),
    `wall_s` from the first chunk asked for to the mp4 closed; `overlap_s` = produce_s + encode_s - wall_s (the
    time both ran at once, >= 0); `frames` encoded."""

    produce_s: float
    encode_s: float
    wall_s: float
    frames: int

    @property
    def overlap_s(self) -> float:
        return max(0.0, self.produce_s + self.encode_s - self.wall_s)


def encode_mp4_stream(chunks: Iterator[np.ndarray], path: Path, fps: int, encoding: Encoding | None = None, *,
                      keep: Callable[[np.ndarray], None] | None = None, metadata: dict[str, str] | None = None,
                      open_writer: Callable[[Path, int], Any] | None = None, frames: int | None = None) -> StreamTimes:
    """Encode a stream of (f, H, W, 3) uint8 frame chunks as `encode_mp4` does, the encode in a thread of its own
    while this thread produces the next chunk (`chunks` is consumed here: a lazy decode runs here, between safe
    points). At most two chunks wait for the encoder, so memory holds a few chunks, never the video (a segmented
    encode, `segments.SegmentWriter`, holds frames until their segment's ffmpeg takes them). `encoding` as
    `encode_mp4`'s; `frames`: the frames the chunks will hold, which a segmented encode needs (without it: one ffmpeg). `keep`, if given,
    also gets each chunk (e.g. to gather a contact sheet's frames). `metadata`: the mp4's container tags (title,
    description, comment; `-metadata` of ffmpeg). `open_writer(path, fps)`: another format's writer
    (`append_data(frame)`, `close()`; `vsagen.media.formats`) in place of the mp4's.

    Raises:
        RunFailure: ffmpeg left the file empty, no chunk came, or the chunks' frame sizes differ.
        SignalInterrupt: an ending signal arrived (under `Outputs`): the encoder is told the input ended and its
            ffmpeg child waited for before this raises.
        Whatever producing a chunk raised, after the same clean-up.
    """
    writer = _writer(path, fps, encoding, metadata, frames=frames) if open_writer is None else open_writer(path, fps)
    encoder = _Encoder(writer)
    start = time.perf_counter()
    encoder.thread.start()
    produce, frames = _produce(chunks, encoder, keep)
    if encoder.failure:
        raise encoder.failure[0]
    interrupts.check()
    if frames == 0:
        raise RunFailure("the decode gave no frames to encode")
    if open_writer is None and (not path.exists() or path.stat().st_size == 0):  # ffmpeg can fail on its own input and still exit quietly
        raise RunFailure(f"ffmpeg wrote no video for {frames} frames at {fps} fps")
    return StreamTimes(produce, encoder.busy_s, time.perf_counter() - start, frames)


class _Encoder:
    """`encode_mp4_stream`'s encoding thread (`thread`, not started): it takes chunks from a queue of two and appends
    their frames to `writer` until the end marker (None), and closes the writer in every case (ffmpeg is told the
    input ended and waited for). A failure is kept in `failure` for the producer to raise; `stop` set by the
    producer (it failed or was interrupted) means encode nothing more; `busy_s` is the encoding's seconds."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.waiting: queue.Queue = queue.Queue(maxsize=2)
        self.failure: list[BaseException] = []
        self.stop = threading.Event()  # the producer failed or was interrupted: encode nothing more
        self.busy_s = 0.0
        self.thread = threading.Thread(target=self._encode, name="vsagen-mp4-encoder", daemon=True)

    def _encode(self) -> None:
        """The thread's body."""
        try:
            while (chunk := self.waiting.get()) is not None:
                t0 = time.perf_counter()
                for frame in chunk:
                    if self.stop.is_set():
                        break
                    self.writer.append_data(frame)
                self.busy_s += time.perf_counter() - t0
        except BaseException as e:  # handed to the producer, which raises it
            self.failure.append(e)
            while self.waiting.get() is not None:  # take what the producer still hands over, up to the end marker
                pass
        finally:
            # ended here in every case (closed: ffmpeg told the input ended and waited for; given up after a failure
            # or a stop: killed and waited for), so no child outlives the temporary file (one did, and created it
            # again after its removal)
            t0 = time.perf_counter()
            if self.failure or self.stop.is_set():
                _give_up(self.writer)
            else:
                try:
                    self.writer.close()
                except BaseException as e:
                    self.failure.append(e)
            self.busy_s += time.perf_counter() - t0

    def hand_over(self, chunk: np.ndarray) -> None:
        """Queue `chunk` for the encoder, checking for interrupts while the queue is full; dropped once the encoder
        failed."""
        while not self.failure:
            try:
                self.waiting.put(chunk, timeout=0.05)
                return
            except queue.Full:
                interrupts.check()  # a safe point while the encoder catches up

    def finish(self) -> None:
        """Hand over the end marker and wait for the thread (the encoder takes every item, so this never waits
        long)."""
        self.waiting.put(None)
        self.thread.join()


def _produce(chunks: Iterator[np.ndarray], encoder: _Encoder,
             keep: Callable[[np.ndarray], None] | None) -> tuple[float, int]:
    """Consume `chunks` on this thread and hand each to the started `encoder` (a safe point between chunks), until
    they end or the encoder fails; the chunks' generator is closed and the encoder finished in every case.

    Returns:
        (seconds spent producing the chunks, frames handed over).

    Raises:
        RunFailure: a chunk's frame size differs from the first's.
        Whatever producing a chunk raised, or a signal at a safe point (the encoder stopped first).
    """
    produce, frames, size = 0.0, 0, None
    for_chunks = iter(chunks)
    try:
        while not encoder.failure:
            t0 = time.perf_counter()
            chunk = next(for_chunks, None)
            produce += time.perf_counter() - t0
            if chunk is None:
                break
            if size is not None and chunk.shape[1:] != size:
                raise RunFailure(f"decoded frames of {chunk.shape[1:3]} after frames of {size[:2]}")
            size, frames = chunk.shape[1:], frames + len(chunk)
            if keep is not None:
                keep(chunk)
            interrupts.check()  # a safe point: between chunks
            encoder.hand_over(chunk)
    except BaseException:
        encoder.stop.set()
        raise
    finally:
        close = getattr(for_chunks, "close", None)
        if close is not None:  # a generator left unfinished (an interrupt, an error): finished now, its clean-up run
            close()
        encoder.finish()  # the end marker
    return produce, frames


def write_mp4(frames: np.ndarray, path: Path, fps: int, *, overwrite: bool = False) -> None:
    """Encode (F, H, W, 3) uint8 frames as H.264 mp4 (yuv420p) at exactly H x W with the bundled ffmpeg.

    Raises:
        BadInput: `path` exists and `overwrite` is False.
    """
    _write_atomic(path, overwrite, lambda tmp: encode_mp4(frames, tmp, fps), ".mp4")


def json_text(data: Any) -> str:
    """`data` as indented JSON text with a final newline.

    Raises:
        ValueError: NaN or infinite numbers (they would not be JSON)."""
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def write_json(data: Any, path: Path, *, overwrite: bool = False) -> None:
    """Write `data` as indented JSON atomically.

    Raises:
        BadInput: `path` exists and `overwrite` is False.
    """
    text = json_text(data)
    _write_atomic(path, overwrite, lambda tmp: tmp.write_text(text), ".json")


def write_text(text: str, path: Path, *, overwrite: bool = False) -> None:
    """Write `text` (UTF-8) atomically.

    Raises:
        BadInput: `path` exists and `overwrite` is False.
    """
    _write_atomic(path, overwrite, lambda tmp: tmp.write_text(text, encoding="utf-8"), path.suffix or ".txt")


def write_with(path: Path, write: Callable[[Path], None], *, overwrite: bool = False) -> None:
    """Atomically create `path` with `write(tmp)`, which writes a temporary file beside it (with the same
    suffix, so writers that pick the format by suffix, such as matplotlib's `savefig`, see the right one).

    Raises:
        BadInput: `path` exists and `overwrite` is False.
    """
    _write_atomic(path, overwrite, write, path.suffix)


def new_figure(what: str, **kwargs: Any) -> Any:
    """A matplotlib `Figure(**kwargs)` (the object API: no pyplot state), for writing with `write_with`.

    Raises:
        BadInput: matplotlib is not installed (`what`, e.g. "--plot", names what needs it).
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise BadInput(f"{what} needs matplotlib, which is not installed: pip install 'vsagen[plot]'") from None
    return Figure(**kwargs)


def read_mp4(path: Path) -> np.ndarray:
    """Decode an mp4 to (F, H, W, 3) uint8 (used by tests and checks)."""
    import imageio.v2 as imageio

    with imageio.get_reader(path, format="FFMPEG") as r:
        return np.stack([np.asarray(f) for f in r])
