"""One forward call of each fine-stage engine for Nsight Compute (issue 33: what bounds each; not a test).

On a grid of whole cubes (the 1.3B 480p grid rounded up to whole 4x4x8 or 4x8x8 cubes, as `--tile-fit crop`
denoises it: 24x32x56, 43,008 tokens, B=1, H=12, D=128, bf16, 87.5% sparsity, the same random cube lists for
both), so that both engines do the same work with no padding or mask: vsagen's Triton fine stage
(`block_sparse_attention` over the kernel tiles, query rows 64) and FA4's block-sparse forward (`flash_attn_func`
with pre-built full-block lists). Each engine runs twice untimed (compilation), then once inside an NVTX range named
after it ("vsagen", "fa4"), so that ncu can select exactly those launches:

    ncu --clock-control none --nvtx --nvtx-include "vsagen/" --nvtx-include "fa4/" \\
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \\
        --section ComputeWorkloadAnalysis python3 benchmarks/ncu_fine.py --volume 128

Without ncu it prints each engine's median forward time (`vsagen.bench.bench_ms`) and their relative L2 difference.
Needs an sm90 GPU and `pip install 'vsagen[fa4]'`; without FA4 only vsagen's launch is made.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from vsagen.attention.shared import kernel_lists
from vsagen.bench import SHAPES, AttentionShape, bench_ms, make_inputs, rel_l2
from vsagen.kernels import fa4_block_sparse as fa4
from vsagen.kernels.block_sparse_attn import block_sparse_attention
from vsagen.kernels.reference import top_k_from_sparsity
from vsagen.layout import tile_layout

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fa4_adapter import TILES, random_q2k  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="1.3b", choices=sorted(SHAPES))
    ap.add_argument("--volume", type=int, default=128, choices=sorted(TILES))
    ap.add_argument("--sparsity", type=float, default=0.875)
    ap.add_argument("--time", action="store_true", help="also print median forward times (not under ncu)")
    args = ap.parse_args(argv)
    device = torch.device("cuda")
    shape, tile = SHAPES[args.shape], TILES[args.volume]
    grid = tuple(math.ceil(g / t) * t for g, t in zip(shape.grid, tile))
    lay = tile_layout(grid, tile, device)
    q, k, v = make_inputs(AttentionShape(f"{shape.name} crop", grid, shape.heads, shape.head_dim), seed=0,
                          device=device)
    top_k = top_k_from_sparsity(args.sparsity, lay.num_tiles)
    q2k, cnt = random_q2k(shape.heads, lay.num_tiles, top_k, device, seed=args.volume)
    klists = kernel_lists(lay, q2k, cnt)
    engines = {"vsagen": lambda: block_sparse_attention(q, k, v, *klists)[0]}
    reason = fa4.fa4_unavailable(device, args.volume)
    if reason is None:
        from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
        from flash_attn.cute.interface import flash_attn_func

        index = fa4.fa4_block_sparse_index(q2k, cnt, lay.tile_sizes, args.volume, backward=False)
        m_cnt, m_idx, f_cnt, f_idx = index.fwd
        assert int(m_cnt.sum()) == 0  # whole cubes: every selected key block is full
        lists = BlockSparseTensorsTorch(mask_block_cnt=m_cnt, mask_block_idx=m_idx, full_block_cnt=f_cnt,
                                        full_block_idx=f_idx, block_size=index.block_size)
        engines["fa4"] = lambda: flash_attn_func(q, k, v, block_sparse_tensors=lists)[0]
    else:
        print(f"FA4 skipped: {reason}")
    print(f"{torch.cuda.get_device_name()}  {shape.name} crop {'x'.join(map(str, grid))} V={args.volume} "
          f"K={top_k}/{lay.num_tiles}", flush=True)
    outs = {}
    with torch.no_grad():
        for name, call in engines.items():
            call(), call()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push(name)
            outs[name] = call()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
        if "fa4" in outs:
            print(f"fa4 vs vsagen, same lists: rel L2 {rel_l2(outs['fa4'].float(), outs['vsagen'].float()):.1e}")
        if args.time:
            for name, call in engines.items():
                print(f"{name:8} fwd {bench_ms(call, device=device):.3f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
