"""Video, JSON, text and figure output: written to a temporary file beside the target, then moved into place.

Without overwrite the final step is `os.link`, which fails if the target appeared meanwhile, so an existing
file is never replaced silently, even by a concurrent run.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .errors import BadInput, RunFailure


def to_uint8_frames(video: np.ndarray) -> np.ndarray:
    """(F, H, W, 3) float in [0, 1] (NaN allowed: random weights) -> (F, H, W, 3) uint8."""
    v = np.nan_to_num(np.asarray(video, dtype=np.float32), nan=0.0, posinf=1.0, neginf=0.0)
    return (np.clip(v, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def _publish(tmp: Path, target: Path, overwrite: bool) -> None:
    if overwrite:
        os.replace(tmp, target)
        return
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise BadInput(f"{target} exists (appeared during the run); pass --overwrite to replace it") from None
    finally:
        tmp.unlink(missing_ok=True)


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


def _write_atomic(target: Path, overwrite: bool, write: Callable[[Path], None], suffix: str) -> None:
    tmp = _temporary_beside(target, suffix)
    try:
        write(tmp)
        _publish(tmp, target, overwrite)
    finally:
        tmp.unlink(missing_ok=True)


# Signals that end a command (Ctrl-C, `kill`, a closed terminal): held back while a set of outputs is published, so
# an interrupt lands before or after the set, never between two of its files.
_ENDING_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


class Outputs:
    """Files that appear together or not at all (a video and its timing JSON): each is written to a temporary file
    beside its target (`add`), then all are moved into place at once (`publish`) with the ending signals held back;
    leaving the `with` block unpublished (an error, Ctrl-C, SIGTERM) removes the temporaries.

    Raises (publish):
        BadInput: a target exists and `overwrite` is False (checked again at publication: nothing is published,
            and the files this set had already moved into place are removed again).
    """

    def __init__(self, overwrite: bool = False) -> None:
        self.overwrite = overwrite
        self._staged: list[tuple[Path, Path]] = []

    def __enter__(self) -> "Outputs":
        return self

    def __exit__(self, *exc: Any) -> None:
        for tmp, _ in self._staged:
            tmp.unlink(missing_ok=True)
        self._staged.clear()

    def add(self, target: Path, write: Callable[[Path], None], suffix: str | None = None) -> None:
        """Write `target`'s content with `write(tmp)` to a temporary file beside it (suffix: `target`'s)."""
        tmp = _temporary_beside(target, target.suffix if suffix is None else suffix)
        self._staged.append((tmp, target))
        write(tmp)

    def publish(self) -> None:
        """Move every added file into place, the ending signals held back meanwhile: their Python handlers are
        swapped for a recorder (a signal mask would not do: another thread of the process, e.g. torch's, may take a
        process-directed signal), and what arrived is raised again, to the restored handlers, once all are placed."""
        held: list[int] = []
        previous = {}
        if threading.current_thread() is threading.main_thread():  # (handlers can only be set there)
            hold = lambda signum, frame: held.append(signum)  # noqa: E731
            previous = {sig: signal.signal(sig, hold) for sig in _ENDING_SIGNALS}
        done: list[Path] = []
        try:
            for tmp, target in self._staged:
                _publish(tmp, target, self.overwrite)
                done.append(target)
        except BaseException:
            if not self.overwrite:  # ours alone: linked here a moment ago (an existing file is never replaced)
                for target in done:
                    target.unlink(missing_ok=True)
            raise
        finally:
            self._staged = [(t, g) for t, g in self._staged if g not in done]
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for sig in dict.fromkeys(held):  # each once, in arrival order
                signal.raise_signal(sig)


def encode_mp4(frames: np.ndarray, path: Path, fps: int) -> None:
    """Encode (F, H, W, 3) uint8 frames as H.264 mp4 (yuv420p) at exactly H x W with imageio-ffmpeg into `path`
    (written in place: `write_mp4` and `Outputs` give the atomic publication).

    Raises:
        RunFailure: ffmpeg left the file empty."""
    import imageio.v2 as imageio

    with imageio.get_writer(path, format="FFMPEG", fps=fps, codec="libx264", pixelformat="yuv420p",
                            macro_block_size=1, quality=8, ffmpeg_log_level="error") as w:
        for frame in frames:
            w.append_data(frame)
    if not path.exists() or path.stat().st_size == 0:  # ffmpeg can fail on its own input and still exit quietly
        raise RunFailure(f"ffmpeg wrote no video for {len(frames)} frames at {fps} fps (its own message is above)")


def write_mp4(frames: np.ndarray, path: Path, fps: int, *, overwrite: bool = False) -> None:
    """Encode (F, H, W, 3) uint8 frames as H.264 mp4 (yuv420p) at exactly H x W with imageio-ffmpeg.

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
