"""Tile plans: the order in which the block-sparse loops visit a list of selected tiles, with partial tiles packed.

A (4, 4, 4) cube of the latent grid holds 64 tokens, but cubes at the grid's edges hold fewer (partial tiles: at
the Wan2.1-1.3B 480p shape, 169 of 624 tiles hold 8, 16 or 32 tokens). A loop that visits one selected tile per
iteration (VSA paper, arXiv 2505.13389, sec. 2, fine stage) computes 64 key columns for each of them, so at that
shape 18% of the products it computes fall on padding. A tile plan lets the loop instead take

* every full tile (64 tokens) whole, one per iteration, as before (one TMA box, no masking), then
* the partial tiles' tokens as one stream, 64 at a time (a pack): tiles are laid end to end, each starting on a
  multiple of SEG = 8 stream positions, so a pack covers tokens of at most 64 / SEG = 8 tiles, and a tile may
  straddle two packs (a softmax does not care how its keys are grouped).

At the 1.3B shape that is 513 iterations per 624 selected tiles under a uniform selection, and 67% of the
blocks under the coarse stage's own selection on random inputs (it picks partial tiles more often); the result is
the same up to summation order.

Layout of one plan row (for list row r of an index tensor of width K, e.g. q2k (B, H, Q_TILES, K)):
    plan[..., r, 0:nf]              first token row of each full tile, in list order
    plan[..., r, nf:nf + ng]        the partial tiles' stream in groups of SEG positions, in list order: each
                                    group is (first token row << 4) | tokens in it (1..SEG; a tile's last group
                                    may hold fewer than SEG), so pack p is groups [p * 64 / SEG, (p + 1) * 64 / SEG)
    plan_cnt[..., r, :]             (nf, npk, ng, 0): npk = ceil(ng * SEG / 64) packs
Entries past nf + ng are not written (the kernels mask groups at or past ng). A row needs at most
nf + 8 np <= 8 K entries (a partial tile holds at most 63 tokens, so 8 groups): the plan is 8 K wide.
`reference.tile_plan_reference` is the same in plain torch (the tests' oracle).

Unsupported: tiles of more than 64 tokens (the kernels' contract), token rows of 2^27 or more (packed groups).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

TILE = 64  # tokens in a full tile and in a pack
SEG = 8  # tokens per group of the partial tiles' stream (a partial tile starts a new group)
PLAN_WIDTH = TILE // SEG  # plan entries per list entry (a partial tile takes at most TILE // SEG groups)
PLAN_NUM_WARPS = 4


@triton.jit
def _tile_plan_kernel(
    idx_ptr, cnt_ptr, off_ptr, plan_ptr, pcnt_ptr,
    stride_ib, stride_ih, stride_ir,
    stride_cb, stride_ch, stride_cr,
    stride_pb, stride_ph, stride_pr,
    stride_nb, stride_nh, stride_nr,
    num_heads,
    BLOCK_K: tl.constexpr, TILE_: tl.constexpr, SEG_: tl.constexpr,
):
    """One program: the plan of list row program_id(0) of one (batch, head)."""
    r = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    offs = tl.arange(0, BLOCK_K)
    cnt = tl.load(cnt_ptr + b * stride_cb + h * stride_ch + r * stride_cr)
    used = offs < cnt
    ids = tl.load(idx_ptr + b * stride_ib + h * stride_ih + r * stride_ir + offs, mask=used, other=0)
    start = tl.load(off_ptr + ids, mask=used, other=0)
    length = tl.load(off_ptr + ids + 1, mask=used, other=0) - start
    full = used & (length >= TILE_)
    part = used & (length < TILE_)
    full_i = full.to(tl.int32)
    nf = tl.sum(full_i, 0)
    n_groups = tl.where(part, (length + SEG_ - 1) // SEG_, 0)  # groups each partial tile takes
    group0 = nf + tl.cumsum(n_groups, 0) - n_groups  # where its first group goes
    row = plan_ptr + b * stride_pb + h * stride_ph + r * stride_pr
    tl.store(row + tl.cumsum(full_i, 0) - 1, start, mask=full)
    for i in tl.static_range(TILE_ // SEG_):
        left = length - i * SEG_
        tl.store(row + group0 + i, ((start + i * SEG_) << 4) | tl.minimum(left, SEG_), mask=part & (left > 0))
    ng = tl.sum(n_groups, 0)
    crow = pcnt_ptr + b * stride_nb + h * stride_nh + r * stride_nr
    tl.store(crow, nf)
    tl.store(crow + 1, (ng * SEG_ + TILE_ - 1) // TILE_)
    tl.store(crow + 2, ng)
    tl.store(crow + 3, 0)


def build_tile_plan(idx: torch.Tensor, cnt: torch.Tensor, tile_offsets: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The tile plan of each list row of idx (see the module docstring for the layout), in one Triton launch.

    Args:
        idx: (B, H, R, K) int32, unit stride on the last axis: the first cnt entries of each row are distinct tile
            ids in [0, n_tiles) (q2k or k2q lists); the rest are never read.
        cnt: (B, H, R) int32 in [0, K].
        tile_offsets: (n_tiles + 1,) int32 tile start rows, at most 64 tokens per tile, fewer than 2^27 rows.

    Returns:
        plan: (B, H, R, 8 K) int32 and plan_cnt: (B, H, R, 4) int32 (nf, npk, ng, 0), on idx's device.

    Raises:
        ValueError: idx or cnt not int32, or idx without unit stride on its last axis.
    """
    b, h, n_rows, width = idx.shape
    if idx.dtype != torch.int32 or cnt.dtype != torch.int32 or (width > 1 and idx.stride(-1) != 1):
        raise ValueError("idx and cnt must be int32, idx with unit stride on its last axis")
    plan = torch.empty((b, h, n_rows, PLAN_WIDTH * max(width, 1)), dtype=torch.int32, device=idx.device)
    plan_cnt = torch.empty((b, h, n_rows, 4), dtype=torch.int32, device=idx.device)
    if b * h * n_rows == 0:
        return plan, plan_cnt
    _tile_plan_kernel[(n_rows, b * h)](
        idx, cnt, tile_offsets, plan, plan_cnt,
        idx.stride(0), idx.stride(1), idx.stride(2),
        cnt.stride(0), cnt.stride(1), cnt.stride(2),
        plan.stride(0), plan.stride(1), plan.stride(2),
        plan_cnt.stride(0), plan_cnt.stride(1), plan_cnt.stride(2),
        h,
        BLOCK_K=max(16, triton.next_power_of_2(width)), TILE_=TILE, SEG_=SEG, num_warps=PLAN_NUM_WARPS,
    )
    return plan, plan_cnt
