"""The VAE decode in bf16 against float32 (issue 32 item 2): PSNR of the frames and the decode times, at a preset's
real size, so `--vae-dtype`'s default can be chosen by measurement (target: within 40 dB of the float32 decode).

The VAE is the preset's real architecture (`[vae]` of its preset: the Wan2.1 VAE, or the Wan2.2 one of the 5B) with
its weights from `--weights DIR` (a diffusers `vae/` folder, safetensors) when given, else random (seeded): then
the latents are not noise but the VAE's own encoding of a smooth moving synthetic clip, so the decoder sees latents
of its own distribution. Both dtypes decode the same latents through `vsagen.decode.stream` (as `t2v` does), the
frames are made uint8 as the mp4's are, and PSNR is taken against the float32 frames.

`--variants` adds the other speed-ups issue 32 item 2 names, each on top of bf16 and checked the same way:
`cl` (channels-last 3-D weights and activations), `cudnn` (cuDNN autotuning, `torch.backends.cudnn.benchmark`),
`compile` (`torch.compile` of the decoder module; its compile is in the untimed first pass).

    python benchmarks/vae_dtype.py --model wan2.1-t2v-1.3b [--size 480x832x81] [--weights DIR] [--device cuda]
        [--variants fp32,bf16,bf16+cl,bf16+cudnn,bf16+compile]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from vsagen.decode.stream import decode_chunks, frames_u8
from vsagen.models.presets import load_preset


def smooth_clip(frames: int, height: int, width: int) -> torch.Tensor:
    """(1, 3, F, H, W) in [-1, 1]: drifting colour waves (the benchmark's stand-in for a real video)."""
    y, x = torch.meshgrid(torch.arange(height, dtype=torch.float32), torch.arange(width, dtype=torch.float32),
                          indexing="ij")
    out = torch.empty(1, 3, frames, height, width)
    for f in range(frames):
        for c in range(3):
            out[0, c, f] = 0.6 * torch.sin(x / (31 + 7 * c) + y / 47 + f / 6 + c) * torch.cos(y / 23 - f / 9)
    return out


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def main() -> None:
    from diffusers import AutoencoderKLWan
    from diffusers.video_processor import VideoProcessor

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="wan2.1-t2v-1.3b")
    ap.add_argument("--size", default=None, help="HxWxF (default: the preset's)")
    ap.add_argument("--weights", default=None, help="a diffusers vae/ folder (default: random weights)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiling", action="store_true", help="the VAE's spatial tiling on")
    ap.add_argument("--variants", default="fp32,bf16", help="comma list of fp32 | bf16[+cl][+cudnn][+compile]; the "
                    "first is the reference (fp32)")
    args = ap.parse_args()
    variants = args.variants.split(",")
    if variants[0] != "fp32" or any(not set(v.split("+")[1:]) <= {"cl", "cudnn", "compile"} for v in variants):
        ap.error("--variants: start with fp32; each is fp32 or bf16 with +cl, +cudnn, +compile")
    preset = load_preset(args.model)
    d = preset.defaults
    h, w, f = (int(v) for v in args.size.split("x")) if args.size else (d.height, d.width, d.frames)
    torch.manual_seed(0)
    vae = (AutoencoderKLWan.from_pretrained(args.weights, use_safetensors=True) if args.weights
           else AutoencoderKLWan(**preset.vae)).eval().to(args.device)
    if args.tiling:
        vae.enable_tiling()
    processor = VideoProcessor(vae_scale_factor=vae.spatial_compression_ratio)
    with torch.inference_mode():
        posterior = vae.encode(smooth_clip(f, h, w).to(args.device)).latent_dist
        z_dim = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean, device=args.device).view(1, z_dim, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std, device=args.device).view(1, z_dim, 1, 1, 1)
        latents = (posterior.mode() - mean) / std  # normalised, as the pipeline hands them to the decode
        results = {}
        decoder = vae.decoder
        for name in variants:
            dtype, *extras = name.split("+")
            vae.to(torch.float32 if dtype == "fp32" else torch.bfloat16)
            layout = torch.channels_last_3d if "cl" in extras else torch.contiguous_format
            for param in vae.parameters():  # Conv3d weights only (the resamplers' Conv2d and the biases stay)
                if param.dim() == 5:
                    param.data = param.data.contiguous(memory_format=layout)
            torch.backends.cudnn.benchmark = "cudnn" in extras
            vae.decoder = torch.compile(decoder) if "compile" in extras else decoder
            for _ in range(2):  # the first pass warms up (cuDNN plans, a compile); the second is timed
                if args.device == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                frames = np.concatenate([frames_u8(processor, c) for c in decode_chunks(vae, latents)])
                sec = time.perf_counter() - t0
            results[name] = (frames, sec)
        vae.decoder = decoder
    ref = results["fp32"][0]
    print(f"{args.model} VAE ({'trained' if args.weights else 'random'} weights), {f}x{h}x{w}, {args.device}"
          f"{', tiled' if args.tiling else ''}")
    print(f"{'variant':16} {'decode s':>9} {'PSNR vs fp32 dB':>16}")
    for name, (frames, sec) in results.items():
        print(f"{name:16} {sec:9.2f} {psnr(frames, ref) if name != 'fp32' else float('inf'):16.2f}")


if __name__ == "__main__":
    main()
