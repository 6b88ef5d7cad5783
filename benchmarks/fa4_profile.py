"""Where FA4's block-sparse fine stage spends its time in VSA (issue 33), for the lent GPU (not a test).

For tile volumes 128 (cube 4x4x8) and 256 (4x8x8) at the Wan2.1-1.3B 480p and 14B 720p shapes, on two grids:
`partial` (the model's post-patch grid; edge cubes hold fewer tokens) and `crop` (the grid rounded up to whole
cubes, as `--tile-fit crop` denoises), B=1, D=128, bf16, 87.5% sparsity, random cube lists (the same lists for
every engine of a grid). Per grid, forward and forward+backward medians (`vsagen.bench.bench_ms`), each against
dense SDPA cuDNN on that grid in the same process:
    vsagen fine             vsagen's Triton fine stage (kernel-tile lists from the cube lists, rows 64)
    FA4 adapter             `fa4_block_sparse_attention`: index conversion, padding, FA4, unpadding
    FA4 index               the adapter's list conversion alone (forward lists; forward + backward lists): on
                            whole cubes `whole_cube_index`, with the dense-map conversion beside it ("old")
    FA4 kernel              `flash_attn_func` alone on pre-padded inputs and pre-built lists (mask_mod on the
                            partial grid's partial key blocks, none on the crop grid)
    FA4 kernel, no mask     (partial grid only) the same lists with every selected key block treated as full and no
                            mask_mod: a wrong result, timed to show what the mask blocks cost
The FA4 adapter's output is checked against vsagen's on the same lists (relative L2, bf16 both).

Usage: python benchmarks/fa4_profile.py [--shapes 1.3b,14b] [--volumes 128,256] [--fits partial,crop]
Needs `pip install 'vsagen[fa4]'` and an sm90 GPU; otherwise prints why and exits 2.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend

from vsagen.attention.shared import kernel_lists
from vsagen.bench import SHAPES, AttentionShape, bench_ms, make_inputs, rel_l2, sdpa
from vsagen.kernels import fa4_block_sparse as fa4
from vsagen.kernels.block_sparse_attn import block_sparse_attention
from vsagen.kernels.reference import top_k_from_sparsity
from vsagen.layout import tile_layout

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/fa4_adapter.py, also when loaded by path
from fa4_adapter import TILES, fa4_parser, fwd_bwd, random_q2k, start  # noqa: E402


def grid_of(shape: AttentionShape, fit: str, tile: tuple[int, int, int]) -> tuple[int, int, int]:
    if fit == "partial":
        return shape.grid
    return tuple(math.ceil(g / t) * t for g, t in zip(shape.grid, tile))  # type: ignore[return-value]


def profile(shape: AttentionShape, vol: int, fit: str, sparsity: float, device) -> list[tuple]:
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
    from flash_attn.cute.interface import flash_attn_func

    tile = TILES[vol]
    grid = grid_of(shape, fit, tile)
    sub = AttentionShape(f"{shape.name} {fit}", grid, shape.heads, shape.head_dim)
    lay = tile_layout(grid, tile, device)
    q, k, v = make_inputs(sub, seed=0, requires_grad=True, device=device)
    do = torch.randn_like(q)
    top_k = top_k_from_sparsity(sparsity, lay.num_tiles)
    q2k, cnt = random_q2k(shape.heads, lay.num_tiles, top_k, device, seed=vol)
    label = f"{shape.name} V={vol} {fit} {'x'.join(map(str, grid))} K={top_k}/{lay.num_tiles}"
    rows = []

    def row(name, f, fb):
        rows.append((label, name, f, fb))
        print(f"{label:44} {name:24} {f:9.3f} {fb if fb is None else round(fb, 3)!s:>9}", flush=True)

    row("SDPA cuDNN", bench_ms(lambda: sdpa(q, k, v, SDPBackend.CUDNN_ATTENTION), device=device),
        bench_ms(fwd_bwd(lambda: sdpa(q, k, v, SDPBackend.CUDNN_ATTENTION), (q, k, v), do), device=device))

    klists = kernel_lists(lay, q2k, cnt)

    def mine():
        return block_sparse_attention(q, k, v, *klists)[0]

    def adapter():
        return fa4.fa4_block_sparse_attention(q, k, v, q2k, cnt, lay.tile_sizes, lay.slots, lay.slot_valid, vol)

    with torch.no_grad():
        err = rel_l2(adapter().float(), mine().float())
    print(f"{label}: FA4 adapter vs vsagen fine, same lists: rel L2 {err:.1e}", flush=True)
    with torch.no_grad():
        f_mine, f_ad = bench_ms(mine, device=device), bench_ms(adapter, device=device)
    row("vsagen fine (rows 64)", f_mine, bench_ms(fwd_bwd(mine, (q, k, v), do), device=device))
    row("FA4 adapter", f_ad, bench_ms(fwd_bwd(adapter, (q, k, v), do), device=device))
    full_cubes = fa4.every_cube_full(lay.num_tiles, vol, lay.num_tokens)

    def index(backward):  # the conversion the adapter runs on this grid
        if full_cubes:
            return fa4.whole_cube_index(q2k, cnt, lay.num_tiles, vol, backward=backward)
        return fa4.fa4_block_sparse_index(q2k, cnt, lay.tile_sizes, vol, backward=backward)

    row("FA4 index fwd / fwd+bwd", bench_ms(lambda: index(False), device=device),
        bench_ms(lambda: index(True), device=device))
    if full_cubes:
        row("FA4 dense-map index (old)",
            bench_ms(lambda: fa4.fa4_block_sparse_index(q2k, cnt, lay.tile_sizes, vol, backward=False), device=device),
            bench_ms(lambda: fa4.fa4_block_sparse_index(q2k, cnt, lay.tile_sizes, vol, backward=True), device=device))
    xs = [(x if full_cubes else fa4.pad_to_cubes(x, lay.slots, lay.slot_valid)).detach().contiguous()
          .requires_grad_(True) for x in (q, k, v)]
    dop = do if full_cubes else fa4.pad_to_cubes(do, lay.slots, lay.slot_valid)
    key_valid = lay.slot_valid.reshape(-1).to(torch.int32).contiguous()

    def kernel(sizes, masked):
        index = fa4.fa4_block_sparse_index(q2k, cnt, sizes, vol, backward=True)
        fwd, bwd = (BlockSparseTensorsTorch(mask_block_cnt=lists[0], mask_block_idx=lists[1], full_block_cnt=lists[2],
                                            full_block_idx=lists[3], block_size=index.block_size)
                    for lists in (index.fwd, index.bwd))
        extra = {"mask_mod": fa4.key_valid_mask_mod(), "aux_tensors": [key_valid]} if masked else {}
        return lambda: flash_attn_func(*xs, block_sparse_tensors=fwd, block_sparse_tensors_bwd=bwd, **extra)[0]

    call = kernel(lay.tile_sizes, not full_cubes)
    with torch.no_grad():
        f = bench_ms(call, device=device)
    row("FA4 kernel", f, bench_ms(fwd_bwd(call, xs, dop), device=device))
    if not full_cubes:
        call = kernel(torch.full_like(lay.tile_sizes, vol), False)
        with torch.no_grad():
            f = bench_ms(call, device=device)
        row("FA4 kernel, no mask", f, bench_ms(fwd_bwd(call, xs, dop), device=device))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = fa4_parser(__doc__.splitlines()[0])
    ap.add_argument("--fits", default="partial,crop")
    args = ap.parse_args(argv)
    device = torch.device("cuda")
    volumes = start(args, device)
    if volumes is None:
        return 2
    rows = []
    for key in args.shapes.split(","):
        for vol in volumes:
            for fit in args.fits.split(","):
                try:
                    rows += profile(SHAPES[key], vol, fit, args.sparsity, device)
                except Exception as exc:  # noqa: BLE001 - one failing configuration must not lose the others
                    print(f"{key} V={vol} {fit}: failed: {type(exc).__name__}: {exc}", flush=True)
                torch.cuda.empty_cache()
    print("\n| grid | kernel | fwd ms | fwd x cuDNN | fwd+bwd ms | f+b x cuDNN |")
    print("|---|---|---|---|---|---|")
    base = {}
    for label, name, f, fb in rows:
        if name == "SDPA cuDNN":
            base[label] = (f, fb)
        bf, bfb = base[label]
        ratio = "" if "index" in name else f"{bf / f:.2f}"
        ratio_b = "" if "index" in name else f"{bfb / fb:.2f}"
        print(f"| {label} | {name} | {f:.3f} | {ratio} | {fb:.3f} | {ratio_b} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
