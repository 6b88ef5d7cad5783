"""The cube -> kernel-tile list expansion on the lent GPU (not a test): the torch `tile_expand.expand_to_kernel_tiles`
against the one-launch `tile_expand_triton.expand_to_kernel_tiles_triton` that `vsa` / `sla-star` run at tile
volumes 128 and 256, checked bitwise, then timed with launch overhead (triton.testing.do_bench: what the coarse stage
pays per attention call) and without (do_bench_cudagraph: GPU time), at the Wan2.1-1.3B 480p and 14B 720p grids.

Usage: python benchmarks/tile_expand.py [--sparsity 0.875]
"""

from __future__ import annotations

import argparse

import torch
import triton.testing

from vsagen.kernels.reference import top_k_from_sparsity
from vsagen.kernels.tile_expand import expand_to_kernel_tiles
from vsagen.kernels.tile_expand_triton import expand_to_kernel_tiles_triton
from vsagen.layout import tile_layout

SHAPES = {"1.3b": ((21, 30, 52), 12), "14b": ((21, 45, 80), 40)}  # latent grid (post-patch), heads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sparsity", type=float, default=0.875)
    args = ap.parse_args()
    print(f"{'shape':5} {'tile':6} {'tiles':>5} {'K':>4} {'torch ms':>9} {'triton ms':>10} {'torch GPU ms':>13} "
          f"{'triton GPU ms':>14}")
    for name, (grid, heads) in SHAPES.items():
        for tile in ((4, 4, 8), (4, 8, 8)):
            lay = tile_layout(grid, tile, device="cuda")
            n, k = lay.num_tiles, top_k_from_sparsity(args.sparsity, lay.num_tiles)
            g = torch.Generator(device="cuda").manual_seed(0)
            q2k = torch.rand(1, heads, n, n, generator=g, device="cuda").argsort(-1)[..., :k].sort(-1).values
            q2k, cnt = q2k.to(torch.int32), torch.full((1, heads, n), k, dtype=torch.int32, device="cuda")

            def plain():
                return expand_to_kernel_tiles(q2k, cnt, lay.tile_kernel_first, lay.tile_kernel_count,
                                              lay.kernel_tile_of, lay.kernel_tiles_per_tile)

            def one_launch():
                return expand_to_kernel_tiles_triton(q2k, cnt, lay.tile_kernel_first, lay.tile_kernel_count,
                                                     lay.kernel_tile_of, lay.kernel_tiles_per_tile)

            (a, ac), (b, bc) = plain(), one_launch()
            assert torch.equal(a, b) and torch.equal(ac, bc), f"{name} {tile}: the expansions differ"
            times = [triton.testing.do_bench(f) for f in (plain, one_launch)]
            times += [triton.testing.do_bench_cudagraph(f) for f in (plain, one_launch)]
            print(f"{name:5} {'x'.join(map(str, tile)):6} {n:5} {k:4} {times[0]:9.3f} {times[1]:10.3f} "
                  f"{times[2]:13.3f} {times[3]:14.3f}")


if __name__ == "__main__":
    main()
