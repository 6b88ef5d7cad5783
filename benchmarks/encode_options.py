"""What writes the mp4 fastest at the default quality (x264 CRF 10) on this machine's CPU (issue 45 item 4): today's
writer against x264 thread counts, sliced threads, zero-latency tuning, segment-parallel encoding joined without
re-encoding (`--codec x264:segments=N`, `vsagen.media.segments`), a faster preset, and a lossless intermediate
transcoded afterwards.

Every option is fed the same real-looking uint8 frames (`encode_presets.smooth_video`) one by one from Python, as
vsagen's writer thread feeds them, through vsagen's own writers (`vsagen.media.video._writer`) where the option is
an `--codec` setting, and through the same ffmpeg command builder otherwise. Per option and size:

* encode s: from the first frame handed over to the mp4 closed, every frame ready (the decode taking no time),
  the median of `--repeats` runs; join s: of that, the segments' join (one ffmpeg, stream copy);
* tail s: the same with the frames handed over evenly across `--decode-s` seconds (a streamed decode of that
  length), minus that time: what the user still waits once the decode ended;
* MB, PSNR Y (BT.601 luma, dB) of the decoded file against the source frames and against today's file;
* checks: the file decodes back (imageio) to exactly the frames given, its packets' decode timestamps strictly
  increase and its presentation timestamps are one frame apart.

    python benchmarks/encode_options.py [--sizes 480x832x81,704x1280x121] [--repeats 2] [--decode-s 0.2]
        [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from encode_presets import smooth_video  # noqa: E402  (the preset study's clip)

FPS = 16


@dataclass(frozen=True)
class Option:
    """One way to write the mp4: `name` for the table, `open(path, frames)` -> a writer (`append_data`, `close`)."""

    name: str
    open: Callable[[Path, int], Any]


def frames_of(count: int, height: int, width: int) -> np.ndarray:
    """`smooth_video(count, height, width)`, its frames made by one thread per core."""
    cores = os.cpu_count() or 1
    cuts = np.linspace(0, count, min(count, cores) + 1).astype(int)
    with ThreadPoolExecutor(cores) as pool:
        parts = pool.map(lambda a, b: smooth_video(b - a, height, width, start=a), cuts[:-1], cuts[1:])
        return np.concatenate(list(parts))


def luma(frames: np.ndarray) -> np.ndarray:
    """BT.601 luma of (F, H, W, 3) uint8 frames, (F, H, W) float32, a frame at a time (`encode_presets.luma`'s
    float64 matmul of the whole 121 x 704 x 1280 video took 11 s here; within 3e-5 of it)."""
    weights = np.array([0.299, 0.587, 0.114], np.float32)
    out = np.empty(frames.shape[:3], np.float32)
    for f, frame in enumerate(frames):
        out[f] = frame.astype(np.float32) @ weights
    return out


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR (dB, peak 255) of `a` against `b`, the squared error summed in float64 a frame at a time."""
    se = sum(float(np.sum(np.square(x.astype(np.float64) - y), dtype=np.float64)) for x, y in zip(a, b))
    return float("inf") if se == 0 else float(10 * np.log10(255.0 ** 2 * a.size / se))


def vsagen_option(name: str, **codec: Any) -> Option:
    """An `--codec` setting, written by vsagen's own writer."""
    from vsagen.media import video

    encoding = video.Encoding(**codec)
    return Option(name, lambda path, frames: video._writer(path, FPS, encoding, frames=frames))


def command_option(name: str, **extra: str) -> Option:
    """Today's encoding with further x264 output options (`-tune`, `-x264-params`), one ffmpeg."""
    from vsagen.media import ffmpeg_pipe, video

    options = {**video.Encoding().ffmpeg_options(), **extra}

    def open_writer(path: Path, frames: int) -> Any:
        return ffmpeg_pipe.PipeWriter(path, lambda w, h: ffmpeg_pipe.encode_command(
            path, w, h, FPS, vcodec="libx264", pix_fmt="yuv420p", options=options))

    return Option(name, open_writer)


class LosslessThenX264:
    """A lossless intermediate: the frames written losslessly as they come (x264 ultrafast at qp 0, yuv420p, into
    a Matroska file beside the mp4), then transcoded to today's encoding once they are all in."""

    def __init__(self, path: Path) -> None:
        from vsagen.media import ffmpeg_pipe

        self.path, self.middle = path, path.with_suffix(".lossless.mkv")
        self.writer = ffmpeg_pipe.PipeWriter(self.middle, lambda w, h: ffmpeg_pipe.encode_command(
            self.middle, w, h, FPS, vcodec="libx264", pix_fmt="yuv420p", options={"preset": "ultrafast", "qp": "0"}))

    def append_data(self, frame: np.ndarray) -> None:
        self.writer.append_data(frame)

    def close(self) -> None:
        import ffmpeg

        from vsagen.media import ffmpeg_pipe, video

        self.writer.close()
        out = ffmpeg.input(str(self.middle)).output(str(self.path), an=None, vcodec="libx264", pix_fmt="yuv420p",
                                                    **video.Encoding().ffmpeg_options())
        subprocess.run(out.global_args(*ffmpeg_pipe.LOG_ARGS).compile(cmd=ffmpeg_pipe.executable(),
                                                                     overwrite_output=True), check=True)
        self.middle.unlink()


def options(cores: int) -> list[Option]:
    """The options measured, today's first and again last."""
    from vsagen.media.video import X264_SEGMENTS

    found = [vsagen_option(f"today (veryfast, threads auto, segments={X264_SEGMENTS})")]
    found += [vsagen_option(f"threads={t}", threads=t) for t in sorted({max(1, cores // 2), cores, 2 * cores})]
    found += [command_option("sliced-threads=1", **{"x264-params": "sliced-threads=1"}),
              command_option("tune=zerolatency (no B-frames)", tune="zerolatency")]
    for n in (2, 4, 8):
        found += [vsagen_option(f"segments={n}", segments=n),
                  vsagen_option(f"segments={n}:threads={max(1, cores // n)}", segments=n, threads=max(1, cores // n))]
    found += [vsagen_option("preset=superfast (larger file)", preset="superfast"),
              Option("lossless intermediate, then x264", lambda path, frames: LosslessThenX264(path))]
    return [*found, Option("today again (the spread over the run)", found[0].open)]


def write(option: Option, frames: np.ndarray, path: Path, decode_s: float) -> tuple[float, float | None]:
    """Seconds from the first frame handed to `option`'s writer to the file closed, and of that the segments' join
    (None: no join); with `decode_s` > 0 the frames are handed over evenly across that time (frame i at
    (i + 1) / F of it)."""
    writer = option.open(path, len(frames))
    t0 = time.perf_counter()
    for i, frame in enumerate(frames):
        if decode_s > 0:
            wait = t0 + decode_s * (i + 1) / len(frames) - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        writer.append_data(frame)
    writer.close()
    return time.perf_counter() - t0, getattr(writer, "join_s", None)


def checks(path: Path, back: np.ndarray, count: int) -> str:
    """"ok", or what is wrong: the frame count decoded, decode timestamps out of order, presentation timestamps not
    one frame apart."""
    from vsagen.media.segments import packet_times

    times = packet_times(path)
    dts, pts = [t[0] for t in times], sorted(t[1] for t in times)
    wrong = [f"{len(back)} frames decoded of {count}"] if len(back) != count else []
    wrong += ["dts not increasing"] if any(b <= a for a, b in zip(dts, dts[1:])) else []
    steps = {b - a for a, b in zip(pts, pts[1:])}
    wrong += [f"pts steps {sorted(steps)}"] if len(steps) > 1 or len(pts) != count else []
    return "ok" if not wrong else "; ".join(wrong)


def measure(size: str, args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    """Every option at `size` (HxWxF): a row each."""
    from vsagen.media.video import read_mp4

    h, w, f = (int(v) for v in size.split("x"))
    frames = frames_of(f, h, w)
    source_y, today_y, rows = luma(frames), None, []
    for k, option in enumerate(options(os.cpu_count() or 1)):
        path = tmp / f"option-{k}.mp4"
        runs, joins = zip(*(write(option, frames, path, 0.0) for _ in range(args.repeats)))
        tail = write(option, frames, path, args.decode_s)[0] - args.decode_s
        back = read_mp4(path)
        back_y = luma(back) if len(back) == f else None
        today_y = back_y if k == 0 else today_y
        row = {"size": size, "option": option.name, "encode_s": statistics.median(runs), "runs_s": list(runs),
               "join_s": statistics.median(joins) if joins[0] is not None else None, "tail_s": tail, "mb": path.stat().st_size / 1e6, "checks": checks(path, back, f),
               "psnr_y_source": psnr(back_y, source_y) if back_y is not None else None,
               "psnr_y_today": psnr(back_y, today_y) if back_y is not None and today_y is not None else None}
        rows.append(row)
        print_row(row, rows[0])
        path.unlink()
    return rows


def print_row(row: dict[str, Any], today: dict[str, Any]) -> None:
    vs = today["encode_s"] / row["encode_s"]
    same = row["psnr_y_today"]
    join = f"{row['join_s']:.3f}" if row["join_s"] is not None else "-"
    print(f"{row['size']:13} {row['option'][:44]:44} {row['encode_s']:8.3f} {vs:5.2f}x {join:>6} {row['tail_s']:7.3f} "
          f"{row['mb']:7.2f} {row['psnr_y_source'] or float('nan'):7.2f} "
          f"{'same' if same == float('inf') else f'{same:.2f}' if same else '-':>7} {row['checks']}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="480x832x81,704x1280x121", help="HxWxF, comma-separated")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--decode-s", type=float, default=0.2, help="the paced run's decode time")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    import imageio_ffmpeg

    from vsagen.media import ffmpeg_pipe

    print(f"cpu cores: {os.cpu_count()}; ffmpeg: {Path(ffmpeg_pipe.executable()).name} (imageio-ffmpeg "
          f"{imageio_ffmpeg.__version__}); x264 CRF 10 unless said; encode s: median of {args.repeats}, frames "
          f"ready; tail s: after a {args.decode_s} s paced decode")
    print(f"{'size':13} {'option':44} {'encode s':>8} {'speed':>6} {'join s':>6} {'tail s':>7} {'MB':>7} {'Y src':>7} "
          f"{'Y today':>7} checks")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            rows += measure(size, args, Path(tmp))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
