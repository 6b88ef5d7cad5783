"""Tile plans on and off (`block_sparse_attn.PACK_PARTIAL_TILES`): the fine forward and the whole backward at the
Wan shapes, and the fine forward on the 1.3B grid cropped to multiples of 4 (every tile full), on the lent GPU.

    python3 benchmarks/pack_ab.py [--shapes 1.3b,5b,14b] [--reps 2]

Prints ms per call (triton do_bench medians), the ratio against dense cuDNN measured in the same run, and the
largest relative L2 difference of the packed results (out, dq, dk, dv) from the plain loop's, which differ only in
summation order. Results and method notes: BENCHMARKS.md (fourth session).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend

sys.path.insert(0, str(Path(__file__).parent))
import attention as A  # noqa: E402

import vsagen.kernels.block_sparse_attn as bsa  # noqa: E402
from vsagen.kernels import reference as ref  # noqa: E402
from vsagen.kernels.coarse import coarse_stage  # noqa: E402
from vsagen.kernels.k2q import build_k2q_triton  # noqa: E402
from vsagen.layout import tile_layout  # noqa: E402


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def shape_ab(key: str, reps: int) -> None:
    shape = A.SHAPES[key]
    layout = tile_layout(shape.grid, device="cuda")
    off = layout.tile_offsets.to(torch.int32)
    n = layout.num_tiles
    top_k = ref.top_k_from_sparsity(0.875, n)
    q, k, v = A.make_inputs(shape, seed=2)
    c = coarse_stage(q, k, off, top_k)
    do = torch.randn_like(q)
    k2q, k2q_cnt = build_k2q_triton(c.q2k, c.q2k_cnt, n)
    bsa.PACK_PARTIAL_TILES = False
    o0, l0 = bsa.bsa_fwd(q, k, v, c.q2k, c.q2k_cnt, off)
    g0 = bsa.bsa_bwd(do, q, k, v, o0, l0, c.q2k, c.q2k_cnt, k2q, k2q_cnt, off)
    cudnn = A.bench(lambda: A.sdpa(q, k, v, SDPBackend.CUDNN_ATTENTION))
    print(f"{shape.name}: SDPA cuDNN fwd {cudnn:.3f} ms", flush=True)
    for _ in range(reps):
        for pack in (False, True):
            bsa.PACK_PARTIAL_TILES = pack
            o, lse = bsa.bsa_fwd(q, k, v, c.q2k, c.q2k_cnt, off)
            g = bsa.bsa_bwd(do, q, k, v, o, lse, c.q2k, c.q2k_cnt, k2q, k2q_cnt, off)
            diff = max(rel(o, o0), *(rel(a, b) for a, b in zip(g, g0)))
            fwd = A.bench(lambda: bsa.bsa_fwd(q, k, v, c.q2k, c.q2k_cnt, off))
            bwd = A.bench(lambda: bsa.bsa_bwd(do, q, k, v, o, lse, c.q2k, c.q2k_cnt, k2q, k2q_cnt, off))
            print(f"  pack {pack!s:5}: fine fwd {fwd:.3f} ms ({cudnn / fwd:.2f}x)  bwd {bwd:.3f} ms  "
                  f"max rel L2 vs plain loop {diff:.2e}", flush=True)


def crop_ab(reps: int) -> None:
    shape = A.SHAPES["1.3b"]
    layout = tile_layout((20, 28, 52), device="cuda")  # 21x30x52 cropped to multiples of 4: every tile full
    off = layout.tile_offsets.to(torch.int32)
    n, s = layout.num_tiles, layout.num_tokens
    top_k = ref.top_k_from_sparsity(0.875, n)
    g = torch.Generator(device="cuda").manual_seed(2)
    q, k, v = (torch.randn(1, s, shape.heads, shape.head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    c = coarse_stage(q, k, off, top_k)
    cudnn = A.bench(lambda: A.sdpa(q, k, v, SDPBackend.CUDNN_ATTENTION))
    dense = 4 * s * s * shape.head_dim * shape.heads
    fine = 4 * n * top_k * 64 * 64 * shape.head_dim * shape.heads
    for _ in range(reps):
        for pack in (False, True):
            bsa.PACK_PARTIAL_TILES = pack
            ms = A.bench(lambda: bsa.bsa_fwd(q, k, v, c.q2k, c.q2k_cnt, off))
            print(f"crop 20x28x52 pack {pack!s:5}: cuDNN {cudnn:.3f} ms; fine {ms:.3f} ms, {fine / ms / 1e9:.0f} "
                  f"TFLOP/s = {fine / ms / (dense / cudnn):.1%} of cuDNN's rate", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1.3b,5b,14b")
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    for key in filter(None, args.shapes.split(",")):
        shape_ab(key, args.reps)
        torch.cuda.empty_cache()
    crop_ab(args.reps)


if __name__ == "__main__":
    main()
