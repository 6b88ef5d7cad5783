"""Video, JSON, text and figure output: written to a temporary file beside the target, then moved into place.

Without overwrite the final step is `os.link`, which fails if the target appeared meanwhile, so an existing
file is never replaced silently, even by a concurrent run.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .errors import BadInput


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


def _write_atomic(target: Path, overwrite: bool, write: Callable[[Path], None], suffix: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)  # missing folders: created (config checked they can be)
    fd, name = tempfile.mkstemp(prefix=f".{target.stem}.", suffix=suffix, dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; the result should get the usual mode
    try:
        write(tmp)
        _publish(tmp, target, overwrite)
    finally:
        tmp.unlink(missing_ok=True)


def write_mp4(frames: np.ndarray, path: Path, fps: int, *, overwrite: bool = False) -> None:
    """Encode (F, H, W, 3) uint8 frames as H.264 mp4 (yuv420p) at exactly H x W with imageio-ffmpeg.

    Raises:
        BadInput: `path` exists and `overwrite` is False.
    """
    import imageio.v2 as imageio

    def write(tmp: Path) -> None:
        with imageio.get_writer(tmp, format="FFMPEG", fps=fps, codec="libx264", pixelformat="yuv420p",
                                macro_block_size=1, quality=8, ffmpeg_log_level="error") as w:
            for frame in frames:
                w.append_data(frame)

    _write_atomic(path, overwrite, write, ".mp4")


def write_json(data: Any, path: Path, *, overwrite: bool = False) -> None:
    """Write `data` as indented JSON atomically.

    Raises:
        BadInput: `path` exists and `overwrite` is False.
    """
    text = json.dumps(data, indent=2, allow_nan=False) + "\n"  # NaN / Infinity would not be JSON
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
