"""Write a safetensors file of random `sla-star` projections of trained size, to time the branch end to end with
`vsagen profile ... --attn sla-star:proj_weights=FILE` (not a test; no trained projection can be downloaded here).

Keys `blocks.{i}.attn1.proj_l.weight` (D, D) ~ N(0, 1/D) and `.bias` (D,) ~ N(0, 0.01^2), float32, for layers
0..N-1: the shapes of TurboDiffusion's trained `proj_l` (REFERENCE.md), so the branch does its real work.

Usage: python benchmarks/random_proj.py OUT.safetensors --layers 30 [--head-dim 128] [--seed 0] [--key PREFIX]
(`--key "blocks.{i}.self_attn.attn_op.local_attn.proj_l"`: TurboDiffusion's names, for `--attn sla:proj_weights=`.)
(Wan2.1-1.3B: 30 layers, Wan2.2-TI2V-5B: 30, Wan2.1-14B: 40; head dim 128 in every Wan size.)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from safetensors.torch import save_file


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--key", default="blocks.{i}.attn1.proj_l", help="key prefix with an {i} field for the layer")
    args = ap.parse_args()
    if args.out.exists():
        raise SystemExit(f"{args.out} exists; not overwritten")
    g, d = torch.Generator().manual_seed(args.seed), args.head_dim
    tensors = {}
    for i in range(args.layers):
        tensors[f"{args.key.format(i=i)}.weight"] = torch.randn(d, d, generator=g) / d ** 0.5
        tensors[f"{args.key.format(i=i)}.bias"] = torch.randn(d, generator=g) * 0.01
    save_file(tensors, str(args.out))
    print(f"wrote {args.out}: {args.layers} layers of proj_l ({d}, {d}) + ({d},)")


if __name__ == "__main__":
    main()
