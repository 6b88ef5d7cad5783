"""The tiny (TAEHV) decode by itself on a GPU: what bounds it (issue 45's target: <= 0.15 s for 81x480x832, <= 0.5 s
for 121x704x1280).

For `taew2_1` (Wan2.1 latents, 16 channels, 81x480x832 -> 21x60x104 latents) and `taew2_2` (Wan2.2-5B latents, 48
channels, 2x2 patch, 121x704x1280 -> 31x44x80 latents), random weights at the published widths, bf16 (as `vsagen t2v`
runs it) and fp32: the first decode in the process (cold: cuDNN's algorithm choice, lazy CUDA init of the kernels),
then warm decodes streamed with windows of 1 (today's `vsagen t2v`: each latent frame as soon as its frames exist),
2, 4, 8 latent frames and the whole video at once, each with the frames made uint8 on the device as `vsagen t2v`
hands them to the encoder (the device -> host copy included), and with channels-last weights. Median of 5 warm runs,
synchronised. The last column is the frames' max difference against the whole decode (streamed equals whole).

    python benchmarks/tiny_decode.py [--repeats 5] [--only taew2_1] [--bf16]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from diffusers.video_processor import VideoProcessor

from vsagen.decode.stream import host_frames
from vsagen.decode.tiny_decoder import TinyVaeConfig, random_decoder

SHAPES = {  # name: (config, latent (T, h, w), video frames x pixels)
    "taew2_1": (TinyVaeConfig(latent_channels=16, patch_size=1), (21, 60, 104), "81x480x832"),
    "taew2_2": (TinyVaeConfig(latent_channels=48, patch_size=2), (31, 44, 80), "121x704x1280"),
}


def _decode_u8(decoder, z: torch.Tensor, window: int) -> torch.Tensor:
    """The streamed decode as `vsagen t2v` runs it: chunks of `window` latent frames, each made uint8 on the device
    and copied to the host; the host frames concatenated (F, H, W, 3)."""
    out = []
    for chunk in decoder.decode_chunks(z, window=window):
        u8 = (chunk[0].permute(1, 2, 3, 0) * 255.0).round().clamp(0, 255).to(torch.uint8)
        out.append(u8.to("cpu", non_blocking=False))
    return torch.cat(out)


def _vsagen_path(decoder, processor, z: torch.Tensor, window: int) -> np.ndarray:
    """What `vsagen t2v` runs since 2026-12-07 evening: `vsagen.decode.stream.host_frames` over the chunks in
    [-1, 1] (contiguous uint8 on the device, pinned asynchronous copies one chunk behind the decode)."""
    chunks = (c * 2.0 - 1.0 for c in decoder.decode_chunks(z, window=window))
    return np.concatenate(list(host_frames(processor, chunks)))


def _timed(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def bench(name: str, dtype: torch.dtype, repeats: int, channels_last: bool) -> None:
    config, (t, h, w), size = SHAPES[name]
    decoder = random_decoder(config, seed=0).to("cuda", dtype)
    if channels_last:
        decoder = decoder.to(memory_format=torch.channels_last)
    z = torch.randn(1, config.latent_channels, t, h, w, device="cuda", dtype=dtype)
    tag = f"{name} {size} {str(dtype)[6:]}{' cl' if channels_last else ''}"
    with torch.inference_mode():
        cold, _ = _timed(lambda: _decode_u8(decoder, z, 1), 1)
        whole_s, whole = _timed(lambda: _decode_u8(decoder, z, t), repeats)
        print(f"{tag:34} cold (first, window 1) {cold:7.3f} s")
        for window in (1, 2, 4, 8):
            s, frames = _timed(lambda: _decode_u8(decoder, z, window), repeats)
            diff = (frames.int() - whole.int()).abs().max().item()
            print(f"{tag:34} window {window:2}             {s:7.3f} s   max |u8 - whole| {diff}")
        print(f"{tag:34} whole ({t} latent frames)  {whole_s:7.3f} s   frames {tuple(whole.shape)}")
        gpu_only, _ = _timed(lambda: decoder.decode(z), repeats)
        print(f"{tag:34} whole, no uint8 / copy    {gpu_only:7.3f} s")
        processor = VideoProcessor(vae_scale_factor=8)
        for window in (1, 2, 4):
            s, frames = _timed(lambda: _vsagen_path(decoder, processor, z, window), repeats)
            diff = (torch.from_numpy(frames).int() - whole.int()).abs().max().item()
            print(f"{tag:34} vsagen host_frames, window {window}  {s:7.3f} s   max |u8 - whole| {diff}")
    del decoder, z
    torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", choices=sorted(SHAPES))
    parser.add_argument("--bf16", action="store_true", help="bf16 only (as `vsagen t2v` runs it), no channels-last")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    torch.backends.cudnn.benchmark = False  # as vsagen t2v runs the decoders
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for name in [args.only] if args.only else sorted(SHAPES):
        variants = ((torch.bfloat16, False),) if args.bf16 else \
            ((torch.bfloat16, False), (torch.bfloat16, True), (torch.float32, False))
        for dtype, cl in variants:
            bench(name, dtype, args.repeats, cl)


if __name__ == "__main__":
    main()
