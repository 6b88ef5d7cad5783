"""The stock Wan VAE decode's memory peak: the fit behind `--vae-tiling auto` and its check on a GPU (issue 45 item 3).

`fit` (CPU, ~2 min, no GPU): the Wan2.1 VAE (z 16) and the Wan2.2-5B VAE (z 48) at their presets' real `[vae]`
configs decode random latents through `vsagen.decode.stream` (the streamed decode `vsagen t2v` runs, each chunk made
uint8 on the device) under torch's FakeTensorMode, `vsagen.decode.peak_memory.LiveStorageBytes` counting the bytes of
every storage the operators create. It prints each measured peak beside `vsagen.decode.tiling.decode_peak_estimate`,
and the least-squares slope (bytes per latent pixel) and intercept per VAE and dtype: the constants
`PEAK_FIT` holds. Rows with more latent frames and the whole (non-streamed) decode show what the frame count adds.
`fit --real` adds the tracker's check (CPU, minutes: real weights, real convolutions): the Wan2.1 VAE in float32 at
3 x 16 x 16 and 3 x 30 x 52 latents on real tensors, its peak beside the fake-tensor one (equal to the byte on
2026-12-07: 320,611,328 and 1,949,512,704) and beside torch's profiler (every CPU allocation, oneDNN's reorders and
scratch included: 8.5% and 8.1% more).

`gpu` (CUDA, random weights, no download, < 3 min on an H100): the Wan2.1 VAE at 480x832x81 and the Wan2.2 VAE at
704x1280x121, bf16 (channels-last 3-D weights, as `vsagen t2v` runs it) and float32, untiled and tiled, each decoded
once as `vsagen t2v` streams it after a 2-latent-frame warm-up. One table: the decode's seconds,
`torch.cuda.max_memory_allocated` above what was allocated before it (weights and latents), the prediction (untiled:
the run-time estimate `decode_peak_estimate`; tiled, with `--tracker`: the fake-tensor tracker's count of the same
streamed decode, ~10-20 s of CPU a row, so off by default; on the CPU, 2026-12-07: Wan2.1 VAE 6.48 GiB fp32 /
3.26 GiB bf16, Wan2.2 VAE 10.90 / 5.45 GiB) and their ratio, which the rule's x1.25 + 1 GiB must cover; then what
`--vae-tiling auto` would decide with this machine's free memory now (the VAE alone on the GPU, so more is free
than after a DiT).

    python benchmarks/vae_decode_peak.py fit [--real]
    python benchmarks/vae_decode_peak.py gpu [--only wan2.2] [--tracker]
"""

from __future__ import annotations

import argparse
import time

import torch

from vsagen.decode.peak_memory import build_vae, decode_peak_bytes, profiler_peak_bytes
from vsagen.decode.tiling import (GIB, architecture_key, available_bytes, choose_tiling, decode_peak_estimate)
from vsagen.models.presets import load_preset

# the VAEs, by a preset that carries each one's real config
VAES = {"wan2.1": "wan2.1-t2v-1.3b", "wan2.2": "wan2.2-ti2v-5b"}
FIT_GRIDS = {"wan2.1": [(16, 16), (30, 52), (45, 80), (60, 104), (90, 160)],
             "wan2.2": [(16, 16), (30, 40), (30, 52), (44, 80), (60, 104)]}
FRAME_ROWS = {"wan2.1": (21, 60, 104), "wan2.2": (31, 44, 80)}  # 480x832x81, 704x1280x121
GPU_CASES = [("wan2.1", 81, 480, 832), ("wan2.2", 121, 704, 1280)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def vae_config(name: str) -> dict:
    """The real `[vae]` config of VAE `name` ("wan2.1" | "wan2.2") from its preset."""
    return dict(load_preset(VAES[name]).vae)


def latent_shape(config: dict, frames: int, height: int, width: int) -> tuple[int, int, int, int, int]:
    """(1, z, F_lat, H_lat, W_lat) of a video of `frames` x `height` x `width` pixels for the VAE of `config`."""
    ratio, temporal = config.get("scale_factor_spatial", 8), config.get("scale_factor_temporal", 4)
    return 1, config["z_dim"], (frames - 1) // temporal + 1, height // ratio, width // ratio


def fit() -> None:
    """Measure the grid under fake tensors, print each row against the estimate and the least-squares fit."""
    print(f"{'vae':7} {'dtype':5} {'latent FxHxW':14} {'mode':8} {'tracker GiB':>11} {'estimate GiB':>12} {'err':>7}")
    for name in VAES:
        config = vae_config(name)
        print(f"# {name}: {architecture_key(config)}")
        for label, dtype in DTYPES.items():
            vae, fake = build_vae(config, dtype, fake=True)
            element = torch.tensor([], dtype=dtype).element_size()
            points = []
            rows = [(3, h, w, True) for h, w in FIT_GRIDS[name]] + [(*FRAME_ROWS[name], s) for s in (True, False)]
            for f, h, w, streamed in rows:
                peak = decode_peak_bytes(vae, (1, config["z_dim"], f, h, w), streamed=streamed, fake_mode=fake)
                est = decode_peak_estimate(config, f, h, w, element, streamed=streamed)
                if f == 3 and streamed:
                    points.append((h * w, peak - 3 * config["z_dim"] * f * h * w * element))
                print(f"{name:7} {label:5} {f'{f}x{h}x{w}':14} {'stream' if streamed else 'whole':8} "
                      f"{peak / GIB:11.3f} {est / GIB:12.3f} {(est - peak) / peak:+7.2%}", flush=True)
            n = len(points)
            mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
            slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
            print(f"# {name} {label}: least squares over the streamed 3-frame rows: {slope:,.1f} bytes per latent "
                  f"pixel, intercept {my - slope * mx:,.0f} bytes")


def real_check() -> None:
    """The tracker on real tensors against fake ones and against torch's profiler (CPU, the Wan2.1 VAE, float32)."""
    config = vae_config("wan2.1")
    vae, _ = build_vae(config, torch.float32, fake=False)
    fake_vae, fake = build_vae(config, torch.float32, fake=True)
    for h, w in ((16, 16), (30, 52)):
        shape = (1, config["z_dim"], 3, h, w)
        real = decode_peak_bytes(vae, shape)
        faked = decode_peak_bytes(fake_vae, shape, fake_mode=fake)
        profiled = profiler_peak_bytes(lambda: decode_peak_bytes(vae, shape))
        print(f"wan2.1 fp32 3x{h}x{w}: tracker real {real:,} B, fake {faked:,} B, profiler {profiled:,} B "
              f"({profiled / real - 1:+.1%})", flush=True)


def _decode(vae: torch.nn.Module, z: torch.Tensor) -> None:
    from diffusers.video_processor import VideoProcessor

    from vsagen.decode.stream import decode_chunks, device_frames_u8

    processor = VideoProcessor(vae_scale_factor=vae.config.scale_factor_spatial)
    with torch.inference_mode():
        for chunk in decode_chunks(vae, z):
            device_frames_u8(processor, chunk)


def _timed_peak(vae: torch.nn.Module, z: torch.Tensor) -> tuple[float, int]:
    """(seconds, bytes above what was allocated before) of one streamed decode of `z`, after a 2-frame warm-up."""
    _decode(vae, z[:, :, :2])  # warm-up: cuDNN's first calls
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    _decode(vae, z)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, torch.cuda.max_memory_allocated() - before


def gpu(only: str | None, tracker: bool) -> None:
    """Decode each GPU case untiled and tiled in both dtypes; print the table. The prediction of an untiled row is
    the run-time estimate (`decode_peak_estimate`), of a tiled row the fake-tensor tracker's count (3 latent frames:
    the peak does not grow after the third)."""
    from diffusers import AutoencoderKLWan
    from diffusers.utils import logging as diffusers_logging

    from vsagen.decode.decoder_choice import decode_channels_last

    diffusers_logging.set_verbosity_error()  # (its note on casting a model with `.to`)
    t_start = time.perf_counter()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{'vae':7} {'size':13} {'dtype':5} {'tiling':7} {'decode s':>8} {'max alloc GiB':>13} "
          f"{'predicted GiB':>13} {'alloc/pred':>10}  predicted by")
    for name, frames, height, width in GPU_CASES:
        if only and name != only:
            continue
        config = vae_config(name)
        shape = latent_shape(config, frames, height, width)
        for label, dtype in DTYPES.items():
            torch.manual_seed(0)
            with torch.device("cuda"):
                vae = AutoencoderKLWan(**config).eval().to(dtype)
            decode_channels_last(vae, "cuda")  # as `vsagen t2v` runs a bf16 decode
            z = torch.randn(shape, device="cuda")
            estimate = decode_peak_estimate(config, *shape[2:], dtype.itemsize)
            for tiled in (False, True):
                vae.enable_tiling() if tiled else vae.disable_tiling()
                seconds, peak = _timed_peak(vae, z)
                predicted, source = estimate, "the estimate"
                if tiled and tracker:
                    fake_vae, fake = build_vae(config, dtype, fake=True)
                    fake_vae.enable_tiling()
                    predicted = decode_peak_bytes(fake_vae, (*shape[:2], 3, *shape[3:]), fake_mode=fake)
                    source = "the tracker"
                elif tiled:
                    predicted, source = float("nan"), "-"
                print(f"{name:7} {f'{frames}x{height}x{width}':13} {label:5} {'tiled' if tiled else 'untiled':7} "
                      f"{seconds:8.2f} {peak / GIB:13.2f} {predicted / GIB:13.2f} {peak / predicted:10.2f}  "
                      f"{source}", flush=True)
            available, where = available_bytes("cuda")
            auto = choose_tiling("auto", estimate, available, where)
            print(f"  auto with the memory free now (the VAE alone on the GPU): {auto.why()}", flush=True)
            del vae, z
            torch.cuda.empty_cache()
    print(f"{time.perf_counter() - t_start:.0f} s in all")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["fit", "gpu"])
    ap.add_argument("--only", choices=list(VAES), help="gpu: one VAE only")
    ap.add_argument("--tracker", action="store_true", help="gpu: the fake-tensor tracker's count for the tiled rows "
                    "(CPU work: ~10-20 s a row)")
    ap.add_argument("--real", action="store_true", help="fit: also check the tracker on real tensors (minutes)")
    args = ap.parse_args()
    if args.what == "fit":
        fit()
        if args.real:
            real_check()
    elif not torch.cuda.is_available():
        ap.error("gpu: no CUDA device")
    else:
        gpu(args.only, args.tracker)


if __name__ == "__main__":
    main()
