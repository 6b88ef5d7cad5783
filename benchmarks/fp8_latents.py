"""Issue 46's last accuracy target: "the final latents' distance to the bf16 run written down beside bf16's own
distance to fp32". One Wan2.1-1.3B-architecture transformer (diffusers' `WanTransformer3DModel`, random
initialisation, seed 0) denoises the same noise with the same random text embeddings three times: in float32, in
bfloat16, and in bfloat16 with the blocks' linears in FP8 (`vsagen.quant.swap.quantize_transformer(t, "fp8")`, the
swap `--quant fp8` runs). Flow-matching Euler steps on Wan's shifted sigmas (sigma' = s sigma / (1 + (s - 1) sigma),
timestep = 1000 sigma'), CFG off; attention is diffusers' own (SDPA) in all three, so the distances are the linears'
and the dtype's alone.

Prints the relative L2 distance (float64 sums) between the final latents of each pair, and of the first step's
velocity. Random weights are not trained ones (no outlier channels): the figures state what the arithmetic does,
not a trained checkpoint's error.

Usage, on the lent GPU from the repository root (torch 2.11; about a minute at 480x832x81):
    python3 benchmarks/fp8_latents.py [--steps 4] [--frames 81 --height 480 --width 832]
On the CPU, the script's own check (two blocks, a small grid, FP8 emulated in float32; not a measurement):
    python benchmarks/fp8_latents.py --smoke
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vsagen.quant.swap import quantize_transformer  # noqa: E402

ARCH_1_3B = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
                 text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
                 qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)


def shifted_sigmas(steps: int, shift: float) -> list[float]:
    """Wan's flow-matching sigmas: `steps` equal steps from 1 to 0, shifted (sigma' = s sigma / (1 + (s-1) sigma))."""
    plain = [1 - i / steps for i in range(steps + 1)]
    return [shift * s / (1 + (shift - 1) * s) for s in plain]


@torch.no_grad()
def denoise(transformer, noise: torch.Tensor, text: torch.Tensor, sigmas: list[float]):
    """Euler steps of the flow ODE x <- x + (sigma_next - sigma) v; returns (final latents, first velocity) in
    float32 and the seconds it took (CUDA-synchronised)."""
    dtype = next(transformer.parameters()).dtype
    x, first = noise.clone(), None
    if x.is_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for sigma, nxt in zip(sigmas[:-1], sigmas[1:]):
        timestep = torch.full((x.shape[0],), sigma * 1000.0, device=x.device, dtype=dtype)
        v = transformer(hidden_states=x.to(dtype), timestep=timestep, encoder_hidden_states=text.to(dtype),
                        return_dict=False)[0].float()
        first = v if first is None else first
        x = x + (nxt - sigma) * v
    if x.is_cuda:
        torch.cuda.synchronize()
    return x, first, time.perf_counter() - t0


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--width", type=int, default=832)
    ap.add_argument("--shift", type=float, default=5.0)
    ap.add_argument("--smoke", action="store_true", help="CPU check: two blocks, 5x64x64, FP8 emulated")
    args = ap.parse_args()
    arch, device = dict(ARCH_1_3B), "cuda"
    if args.smoke:
        arch["num_layers"], device = 2, "cpu"
        args.frames, args.height, args.width, args.steps = 5, 64, 64, 2
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    reference = WanTransformer3DModel(**arch).to(device).eval()
    shape = (1, 16, (args.frames - 1) // 4 + 1, args.height // 8, args.width // 8)
    noise = torch.randn(shape, device=device)
    text = torch.randn(1, 512, arch["text_dim"], device=device)
    sigmas = shifted_sigmas(args.steps, args.shift)
    runs = {"fp32": reference}
    runs["bf16"] = copy.deepcopy(reference).to(torch.bfloat16)
    runs["fp8"] = copy.deepcopy(runs["bf16"])
    report = quantize_transformer(runs["fp8"], "fp8")
    print(f"fp8: {len(report.swapped)} linears swapped, {len(report.kept)} kept in bf16; "
          f"latents {tuple(shape)}, {args.steps} steps, shift {args.shift}, on {device}")
    results = {}
    for name, t in runs.items():
        results[name] = denoise(t, noise, text, sigmas)
        print(f"{name:5} {results[name][2]:7.3f} s for {args.steps} steps (attention: diffusers' SDPA)")
    print(f"{'pair':14} {'final latents rel L2':>22} {'first velocity rel L2':>22}")
    for a, b in (("bf16", "fp32"), ("fp8", "bf16"), ("fp8", "fp32")):
        print(f"{a + ' vs ' + b:14} {rel_l2(results[a][0], results[b][0]):22.3e} "
              f"{rel_l2(results[a][1], results[b][1]):22.3e}")
    finite = all(torch.isfinite(r[0]).all() for r in results.values())
    sys.exit(0 if finite else 1)


if __name__ == "__main__":
    main()
