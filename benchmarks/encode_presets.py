"""libx264 presets and CRFs for the mp4 write, measured (issue 32 item 3): encode time, file size and PSNR against
the frames handed to the encoder, on real-looking frames (a smooth moving pattern with texture, as a decoded video
is) and on random-weight frames (noise, the worst case), at the two sizes of the issue's targets.

Each configuration encodes the same uint8 frames through imageio-ffmpeg's bundled ffmpeg (the mp4 vsagen writes:
H.264, yuv420p, exactly H x W), reads the file back and compares. Today's setting is `quality=8` in imageio, which
imageio-ffmpeg turns into `-crf 10` at x264's default preset `medium`.

    python benchmarks/encode_presets.py [--sizes 480x832x81,704x1280x121] [--presets ...] [--crfs 10,15,18]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np


def smooth_video(frames: int, height: int, width: int, seed: int = 0, start: int = 0) -> np.ndarray:
    """A real-looking clip: drifting low-frequency colour waves plus mild fine texture, uint8 (F, H, W, 3); `start`:
    the index of its first frame in the clip of that seed (frames start .. start + frames - 1)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi, (3, 3))
    texture = rng.normal(0, 0.02, (height, width, 3)).astype(np.float32)
    out = np.empty((frames, height, width, 3), np.uint8)
    for f in range(frames):
        t = (start + f) / 8
        chans = [0.5 + 0.2 * np.sin(x / 37 + y / 53 + t + phase[c, 0]) + 0.15 * np.sin(x / 11 - t * 1.3 + phase[c, 1])
                 * np.cos(y / 17 + t + phase[c, 2]) for c in range(3)]
        img = np.stack(chans, -1) + texture
        out[f] = (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)
    return out


def noise_video(frames: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (frames, height, width, 3), dtype=np.uint8)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def luma(x: np.ndarray) -> np.ndarray:
    """BT.601 luma of uint8 RGB frames (float64): the channel yuv420p keeps at full resolution, so its PSNR shows
    the encoder's loss apart from the chroma subsampling every setting shares."""
    return x.astype(np.float64) @ np.array([0.299, 0.587, 0.114])


def encode(frames: np.ndarray, path: Path, fps: int, preset: str, crf: int) -> float:
    import imageio.v2 as imageio

    t0 = time.perf_counter()
    w = imageio.get_writer(path, format="FFMPEG", fps=fps, codec="libx264", pixelformat="yuv420p",
                           macro_block_size=1, quality=None, ffmpeg_log_level="error",
                           output_params=["-preset", preset, "-crf", str(crf)])
    for frame in frames:
        w.append_data(frame)
    w.close()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="480x832x81")
    ap.add_argument("--presets", default="ultrafast,superfast,veryfast,faster,fast,medium")
    ap.add_argument("--crfs", default="10,15,18")
    ap.add_argument("--kinds", default="smooth,noise")
    args = ap.parse_args()
    import imageio.v3 as iio

    print(f"cpu cores: {os.cpu_count()}")
    print(f"{'frames':7} {'size':13} {'preset':10} {'crf':>3} {'encode s':>9} {'MB':>7} {'PSNR RGB':>9} "
          f"{'PSNR Y':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            h, w, f = (int(v) for v in size.split("x"))  # height x width x frames
            for kind in args.kinds.split(","):
                frames = (smooth_video if kind == "smooth" else noise_video)(f, h, w)
                for preset in args.presets.split(","):
                    for crf in (int(c) for c in args.crfs.split(",")):
                        path = Path(tmp) / f"{kind}-{preset}-{crf}.mp4"
                        sec = encode(frames, path, 16, preset, crf)
                        back = iio.imread(path)
                        print(f"{kind:7} {size:13} {preset:10} {crf:3d} {sec:9.2f} {path.stat().st_size / 1e6:7.2f} "
                              f"{psnr(back, frames):9.2f} {psnr(luma(back), luma(frames)):7.2f}", flush=True)
                        path.unlink()


if __name__ == "__main__":
    main()
