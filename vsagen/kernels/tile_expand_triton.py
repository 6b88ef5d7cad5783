"""Triton expansion of cube-level key lists to the block-sparse kernels' 64-token kernel tiles, in one launch.

A drop-in for `tile_expand.expand_to_kernel_tiles` (plain torch: about fifteen launches of small index kernels per
attention call, which sat inside the coarse stage's timed region and made it 1.9x dearer at tile volumes 128 / 256
than at 64 on the H200, 2026-12-05, though those tiles are fewer). The rule is the same (VSA paper, arXiv
2505.13389, sec. 2: every query token of a cube attends the tokens of the cube's selected key cubes; a cube's tokens
are contiguous in tile order, cut into kernel tiles of at most 64 tokens by `vsagen.layout.TileLayout`):

    _expand_kernel   one program per (b, h, kernel tile j), of query cube q = kernel_tile_of[j]. It walks q's
                     list CHUNK_K entries at a time: entry e (a key cube c, used while e < q2k_cnt) contributes
                     n_e = tile_kernel_count[c] kernel tiles, tile_kernel_first[c] + t for t < n_e, at positions
                     start_e + t, where start_e is the running sum of the n before e (tl.cumsum within a chunk, the
                     chunk's total carried to the next). Each program writes only its own row j (the kernel tiles of
                     one cube recompute the same short list: a few hundred integers), then zeros from the count to
                     the end of the row, and the count.

Layout contract (as `expand_to_kernel_tiles`, whose tests this passes bitwise):
    q2k: (B, H, Q_TILES, K) int32 or int64, any strides; the first q2k_cnt entries of a row used, ascending, no
         repeats, each in [0, Q_TILES); entries past the count are never read
    q2k_cnt: (B, H, Q_TILES) int32 or int64, any strides, in [0, K]
    tile_kernel_first, tile_kernel_count: (Q_TILES,) int64 (`TileLayout`), on q2k's device
    lists: (B, H, n_kernel_tiles, K * kernel_tiles_per_tile) int32, contiguous: each kernel tile's key kernel tiles,
           ascending, then zeros; counts: (B, H, n_kernel_tiles) int32

Unsupported: autograd (integer outputs); more than 2^31 entries per (b, h) (int32 offsets within one (b, h)).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# q2k entries read per step (a power of two); longer lists loop with the running position carried.
CHUNK_K = 128
NUM_WARPS = 2


@triton.jit
def _expand_kernel(q2k_ptr, cnt_ptr, first_ptr, count_ptr, tile_of_ptr, lists_ptr, counts_ptr,
                   s_qb, s_qh, s_qi, s_qk, s_cb, s_ch, s_ci,
                   H, N_KERNEL, K, WIDTH,
                   R: tl.constexpr, CHUNK_K: tl.constexpr, CHUNK_W: tl.constexpr):
    pid_bh = tl.program_id(0)
    row = tl.program_id(1)  # this program's kernel tile
    b = pid_bh // H
    h = pid_bh % H
    q = tl.load(tile_of_ptr + row)  # the query cube it belongs to
    q2k_row = q2k_ptr + b.to(tl.int64) * s_qb + h.to(tl.int64) * s_qh + q.to(tl.int64) * s_qi
    used = tl.load(cnt_ptr + b.to(tl.int64) * s_cb + h.to(tl.int64) * s_ch + q.to(tl.int64) * s_ci).to(tl.int32)
    used = tl.minimum(tl.maximum(used, 0), K)
    row_ptr = lists_ptr + (pid_bh.to(tl.int64) * N_KERNEL + row) * WIDTH
    offs = tl.arange(0, CHUNK_K)
    total = 0
    for k0 in range(0, K, CHUNK_K):
        e = k0 + offs
        live = e < used
        cube = tl.load(q2k_row + e.to(tl.int64) * s_qk, mask=live, other=0).to(tl.int32)
        # at most R kernel tiles per cube, as the torch expansion's `run < count` over R runs: a count above R (not
        # a TileLayout's) cannot write past the row
        n = tl.where(live, tl.minimum(tl.load(count_ptr + cube, mask=live, other=0).to(tl.int32), R), 0)
        start = total + tl.cumsum(n, 0) - n  # each entry's first position
        head = tl.load(first_ptr + cube, mask=live, other=0).to(tl.int32)
        for t in tl.static_range(R):
            tl.store(row_ptr + start + t, head + t, mask=t < n)
        total += tl.sum(n, 0)
    pos = tl.arange(0, CHUNK_W)
    for j0 in range(0, WIDTH, CHUNK_W):
        j = j0 + pos
        tl.store(row_ptr + j, tl.zeros([CHUNK_W], dtype=tl.int32), mask=(j >= total) & (j < WIDTH))
    tl.store(counts_ptr + pid_bh.to(tl.int64) * N_KERNEL + row, total)


def expand_to_kernel_tiles_triton(q2k: torch.Tensor, q2k_cnt: torch.Tensor, tile_kernel_first: torch.Tensor,
                                  tile_kernel_count: torch.Tensor, kernel_tile_of: torch.Tensor,
                                  kernel_tiles_per_tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cube-level key lists -> the kernels' kernel-tile lists, in one Triton launch (module docstring).

    Args:
        q2k: (B, H, Q_TILES, K) int32 / int64 key cubes of each query cube, ascending, no repeats, any strides;
            only the first q2k_cnt entries of a row are read.
        q2k_cnt: (B, H, Q_TILES) int32 / int64 in [0, K], any strides.
        tile_kernel_first, tile_kernel_count: (Q_TILES,) int64 (`TileLayout.tile_kernel_first` / `_count`), on
            q2k's device.
        kernel_tile_of: (n_kernel_tiles,) int64 the cube of each kernel tile (`TileLayout.kernel_tile_of`).
        kernel_tiles_per_tile: the most kernel tiles a cube has (ceil(tile volume / 64)), 1 to 8.

    Returns:
        lists (B, H, n_kernel_tiles, K * kernel_tiles_per_tile) int32 and counts (B, H, n_kernel_tiles) int32,
        equal to `tile_expand.expand_to_kernel_tiles`'s for kernel_tiles_per_tile >= 2 (at 1 the torch function
        returns q2k unchanged, whatever lies past the counts; this one still zeroes it).

    Raises:
        ValueError: mismatched shapes, or kernel_tiles_per_tile outside 1..8.

    Source: VSA paper (arXiv 2505.13389) sec. 2; the kernel is vsagen's.
    """
    if q2k.dim() != 4 or q2k.shape[2] != tile_kernel_first.numel() or q2k_cnt.shape != q2k.shape[:3] \
            or tile_kernel_count.numel() != tile_kernel_first.numel():
        raise ValueError(f"q2k (B, H, Q_TILES, K) {tuple(q2k.shape)}, q2k_cnt {tuple(q2k_cnt.shape)} and "
                         f"{tile_kernel_first.numel()} tiles do not match")
    if not 1 <= kernel_tiles_per_tile <= 8:
        raise ValueError(f"kernel_tiles_per_tile must be in 1..8, got {kernel_tiles_per_tile}")
    b, h, n_tiles, k = q2k.shape
    n_kernel_tiles = kernel_tile_of.numel()
    width = k * kernel_tiles_per_tile
    lists = torch.empty(b, h, n_kernel_tiles, width, dtype=torch.int32, device=q2k.device)
    counts = torch.empty(b, h, n_kernel_tiles, dtype=torch.int32, device=q2k.device)
    if b * h * n_kernel_tiles == 0:
        return lists.zero_(), counts.zero_()
    _expand_kernel[(b * h, n_kernel_tiles)](
        q2k, q2k_cnt, tile_kernel_first, tile_kernel_count, kernel_tile_of, lists, counts,
        *q2k.stride(), *q2k_cnt.stride(), h, n_kernel_tiles, k, width,
        R=kernel_tiles_per_tile, CHUNK_K=min(CHUNK_K, triton.next_power_of_2(max(k, 1))),
        CHUNK_W=min(256, triton.next_power_of_2(max(width, 1))), num_warps=NUM_WARPS)
    return lists, counts
