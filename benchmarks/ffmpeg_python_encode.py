"""The mp4 write through ffmpeg-python's command (vsagen.media.video.encode_mp4, `vsagen.media.ffmpeg_pipe`) against
the imageio FFMPEG writer it replaced (issue 45 item 6): the same frames, the same settings (x264 veryfast CRF 10,
yuv420p, exactly H x W, the same metadata), timed alternately on this machine's CPU; then the two files compared
byte for byte and decoded back (imageio's reader) frame for frame.

    python benchmarks/ffmpeg_python_encode.py [--size 480x832x81] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from encode_presets import smooth_video  # noqa: E402  (the same real-looking clip as the preset study)

METADATA = {"title": "a red fox, snow", "description": '{"seed": 0, "steps": 4}', "comment": "vsagen"}


def imageio_encode(frames: np.ndarray, path: Path, fps: int) -> None:
    """The writer vsagen used before: imageio's FFMPEG format with the options vsagen gave it."""
    import imageio.v2 as imageio

    output_params = ["-preset", "veryfast", "-crf", "10"]
    output_params += [a for k, v in METADATA.items() for a in ("-metadata", f"{k}={v}")]
    w = imageio.get_writer(path, format="FFMPEG", fps=fps, codec="libx264", pixelformat="yuv420p",
                           macro_block_size=1, quality=None, output_params=output_params, ffmpeg_log_level="error")
    for frame in frames:
        w.append_data(frame)
    w.close()


def pipe_encode(frames: np.ndarray, path: Path, fps: int) -> None:
    """vsagen's writer now: the command built with ffmpeg-python, frames piped by `PipeWriter`."""
    from vsagen.media import video

    w = video._writer(path, fps, video.Encoding(segments=1), METADATA)
    for frame in frames:
        w.append_data(frame)
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="480x832x81", help="HxWxF")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--fps", type=int, default=16)
    args = ap.parse_args()
    h, w, f = (int(x) for x in args.size.split("x"))
    frames = smooth_video(f, h, w)
    t0 = time.perf_counter()
    import ffmpeg  # noqa: F401  (ffmpeg-python's import, once per process)

    import_s = time.perf_counter() - t0
    from vsagen.media import video

    video.find_ffmpeg()
    times: dict[str, list[float]] = {"imageio": [], "ffmpeg-python": []}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: Path(tmp) / f"{name}.mp4" for name in times}
        for _ in range(args.repeats):  # alternated, so a busy neighbour on the CPU slows both alike
            for name, encode in (("imageio", imageio_encode), ("ffmpeg-python", pipe_encode)):
                t0 = time.perf_counter()
                encode(frames, paths[name], args.fps)
                times[name].append(time.perf_counter() - t0)
        same_bytes = paths["imageio"].read_bytes() == paths["ffmpeg-python"].read_bytes()
        old, new = (video.read_mp4(paths[name]) for name in times)
        sizes = {name: paths[name].stat().st_size for name in times}
    print(f"{f} frames of {h}x{w}, x264 veryfast CRF 10, {args.repeats} runs each, alternated")
    print(f"ffmpeg-python import: {import_s * 1000:.1f} ms")
    for name, ts in times.items():
        print(f"{name:>14}: median {statistics.median(ts):.3f} s  (runs {', '.join(f'{t:.3f}' for t in ts)}), "
              f"{sizes[name]} bytes")
    print(f"same file bytes: {same_bytes}; decoded frames bitwise equal: {old.shape == new.shape and np.array_equal(old, new)}"
          f" ({old.shape[0]} and {new.shape[0]} frames of {old.shape[1]}x{old.shape[2]})")


if __name__ == "__main__":
    main()
