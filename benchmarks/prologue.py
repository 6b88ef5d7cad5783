"""The q/k prologue of Wan's self-attention (RMS norm across heads + RoPE) on the lent GPU (not a test):
diffusers' eager arithmetic against the fused Triton kernel (`vsagen.kernels.qk_norm_rope`), one tensor (q or
k) of one layer at the 1.3B 480p, 5B 704x1280x121 and 14B 720p shapes, bf16.

Prints per shape: relative L2 error of each path against a float64 reference, and the time of each path
(triton do_bench medians) with the bytes the fused kernel must move (read x, write the result) as a rate.

Usage: python benchmarks/prologue.py
"""

from __future__ import annotations

import torch
import triton

from vsagen.attention.processor import apply_rotary
from vsagen.bench import SHAPES
from vsagen.kernels.qk_norm_rope import rms_norm_rope


def main() -> None:
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    print("| shape | S x H*D | eager ms | fused ms | speed-up | fused GB/s | eager rel-L2 | fused rel-L2 |")
    print("|---|---|---|---|---|---|---|---|")
    for key, shape in SHAPES.items():
        s = shape.grid[0] * shape.grid[1] * shape.grid[2]
        n, d, h = shape.heads * shape.head_dim, shape.head_dim, shape.heads
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(1, s, n, device="cuda", generator=g).to(torch.bfloat16)
        norm = torch.nn.RMSNorm(n, eps=1e-6).to("cuda", torch.bfloat16)
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5, generator=g)
        ang = torch.rand(s, d // 2, device="cuda", generator=g, dtype=torch.float64).repeat_interleave(2, -1) * 6.28
        cos, sin = ang.cos().float().view(1, s, 1, d), ang.sin().float().view(1, s, 1, d)

        def eager():
            return apply_rotary(norm(x).unflatten(2, (h, -1)), cos, sin)

        def fused():
            return rms_norm_rope(x, norm.weight, 1e-6, cos, sin, h)

        with torch.no_grad():
            xd = x.double()
            ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight.double()
            ref = apply_rotary(ref.unflatten(2, (h, -1)), cos.double(), sin.double())
            errs = [float((f().double() - ref).norm() / ref.norm()) for f in (eager, fused)]
            t_e = triton.testing.do_bench(eager, warmup=50, rep=300, return_mode="median")
            t_f = triton.testing.do_bench(fused, warmup=50, rep=300, return_mode="median")
        gbs = 2 * x.numel() * 2 / t_f / 1e6
        print(f"| {shape.name} | {s} x {n} | {t_e:.3f} | {t_f:.3f} | {t_e / t_f:.1f}x | {gbs:.0f} | "
              f"{errs[0]:.2e} | {errs[1]:.2e} |")


if __name__ == "__main__":
    main()
