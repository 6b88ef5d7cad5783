"""SLA's block selection over raster token blocks, and its translation into the 64-token tile lists that vsagen's
block-sparse kernels read.

SLA (arXiv 2509.24006; thu-ml's `get_block_map`, as TurboDiffusion and FastVideo run it) selects over contiguous
1-D blocks of the token sequence as the model holds it (raster order, frame by row by column; no 3-D cubes):

1. K is smoothed: k - mean of k over every token (per batch and head; SageAttention's smooth-K).
2. q and the smoothed k are mean-pooled over blocks of `block_q` and `block_k` tokens (the last block partial:
   its mean over the tokens it has), summed in fp32 and stored in the inputs' dtype.
3. Block scores: pooled q . pooled k, in the inputs' dtype, no scale and no softmax.
4. Each query block keeps its top `min(n, int(topk * n))` key blocks of n (`torch.topk`, so ties go as torch
   resolves them on the device: the same call SLA makes on the same scores).

TurboDiffusion infers with block_q 128 / block_k 64 (trains with 64 / 64); its SageSLA path on Hopper with
64 / 128. vsagen's block-sparse kernels work on tiles of at most 64 tokens (`block_sparse_attn`), so the raster
sequence is cut into 64-token tiles (`raster_tile_offsets`, the last one partial) and a block of 128 tokens is two
tiles: a query block's key blocks become the key tiles of each of its query tiles (`tile_lists`).

Everything here is plain torch, differentiable nowhere (a selection), and runs on any device; the sparse part and
the linear branch run on the kernels (`block_sparse_attn`, `linear_branch`, `sla_star_attn`).
"""

from __future__ import annotations

import torch

TILE = 64  # tokens per tile of the block-sparse kernels
BLOCK_SIZES = (64, 128)  # SLA's block sizes vsagen runs: whole numbers of tiles


def selected_blocks(topk: float, n_blocks: int) -> int:
    """Key blocks each query block keeps: SLA's `min(n, int(topk * n))`, but at least 1.

    SLA's rule gives 0 when topk * n < 1 (short sequences: the tiny models), and its kernel then divides by a zero
    softmax sum (NaN output); vsagen keeps one block there instead (`vsagen.attention.sla` says so in a run note).

    Args:
        topk: the fraction of key blocks kept, in (0, 1].
        n_blocks: key blocks in the sequence (>= 1).
    """
    return max(1, min(n_blocks, int(topk * n_blocks)))


def raster_tile_offsets(seq_len: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(ceil(S / 64) + 1,) int32 starts of the 64-token tiles of a raster sequence of S tokens, the last = S (the
    `tile_offsets` of `block_sparse_attn.block_sparse_attention` for tokens left in raster order)."""
    starts = torch.arange(0, seq_len, TILE, dtype=torch.int32, device=device)
    return torch.cat([starts, torch.tensor([seq_len], dtype=torch.int32, device=device)])


def block_mean_pool(x: torch.Tensor, block: int, smooth: bool = False) -> torch.Tensor:
    """Mean of x over contiguous blocks of `block` tokens (SLA's `mean_pool`), optionally of x minus its mean over
    every token first (SLA's smoothed K).

    Args:
        x: (B, S, H, D) float, raster order.
        block: tokens per block; the last block holds the S mod block tokens left, if any.
        smooth: subtract x's mean over the S tokens (per batch and head) first, in x's dtype, as SLA does.

    Returns:
        (B, H, ceil(S / block), D) in x's dtype: each block's fp32 sum divided by its token count, then rounded to
        x's dtype (SLA's Triton pool stores in the input dtype).
    """
    if smooth:
        x = x - x.mean(dim=1, keepdim=True)
    b, s, h, d = x.shape
    full = s // block
    parts = []
    if full:
        parts.append(x[:, :full * block].unflatten(1, (full, block)).sum(dim=2, dtype=torch.float32) / block)
    if s > full * block:
        parts.append(x[:, full * block:].sum(dim=1, keepdim=True, dtype=torch.float32) / (s - full * block))
    return torch.cat(parts, dim=1).to(x.dtype).transpose(1, 2)


def block_scores(q: torch.Tensor, k: torch.Tensor, block_q: int, block_k: int) -> torch.Tensor:
    """SLA's block scores: mean-pooled q against mean-pooled smoothed k, no scale.

    Args:
        q, k: (B, S, H, D) float (one dtype), raster order.
        block_q, block_k: tokens per query block and per key block.

    Returns:
        (B, H, ceil(S / block_q), ceil(S / block_k)) in q's dtype (a matmul of the pooled blocks in that dtype).
    """
    return block_mean_pool(q, block_q) @ block_mean_pool(k, block_k, smooth=True).transpose(-1, -2)


def sla_block_map(q: torch.Tensor, k: torch.Tensor, topk: float, block_q: int = 128,
                  block_k: int = 64) -> torch.Tensor:
    """The key blocks each query block of SLA keeps (`block_scores`, then `torch.topk`, unsorted, as SLA).

    Args:
        q, k: (B, S, H, D) float (one dtype), raster order; not differentiated (the selection carries no gradient).
        topk: fraction of key blocks kept, in (0, 1] (`selected_blocks`).
        block_q, block_k: tokens per query block and per key block.

    Returns:
        lut: (B, H, ceil(S / block_q), n_sel) int64 key block indices in torch.topk's order, n_sel =
        `selected_blocks(topk, ceil(S / block_k))`.

    Source: SLA arXiv 2509.24006 sec. 4 and thu-ml's released `get_block_map` (REFERENCE.md).
    """
    with torch.no_grad():
        scores = block_scores(q.detach(), k.detach(), block_q, block_k)
        return torch.topk(scores, selected_blocks(topk, scores.shape[-1]), dim=-1, sorted=False).indices


def tile_lists(lut: torch.Tensor, seq_len: int, block_q: int = 128,
               block_k: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """SLA's block map as the block-sparse kernels' per-tile key lists over the raster 64-token tiles.

    Args:
        lut: (B, H, NQ, n_sel) integer key block indices per query block (`sla_block_map`), no repeats.
        seq_len: S, the tokens of the sequence.
        block_q, block_k: the blocks' sizes in tokens, each in `BLOCK_SIZES`.

    Returns:
        q2k: (B, H, n_tiles, n_sel * block_k / 64) int32 key tiles of each query tile, ascending; a query tile's
            list is its query block's, the key blocks expanded into their tiles.
        q2k_cnt: (B, H, n_tiles) int32 entries to read: fewer than the row's length only where the last key block
            has fewer tiles than the others (a partial block of 128 tokens holding at most 64).

    Raises:
        ValueError: a block size not in `BLOCK_SIZES`, or a lut whose query blocks do not cover S.
    """
    if block_q not in BLOCK_SIZES or block_k not in BLOCK_SIZES:
        raise ValueError(f"block sizes must be in {BLOCK_SIZES}, got {block_q} / {block_k}")
    n_tiles = -(-seq_len // TILE)
    rq, rk = block_q // TILE, block_k // TILE
    if lut.shape[2] != -(-seq_len // block_q):
        raise ValueError(f"lut has {lut.shape[2]} query blocks, S = {seq_len} needs {-(-seq_len // block_q)}")
    blocks = torch.sort(lut, dim=-1).values
    tiles = (blocks.unsqueeze(-1) * rk + torch.arange(rk, device=lut.device)).flatten(-2)  # ascending
    valid = tiles < n_tiles  # only the last key block can run past the end, and it sorts last
    cnt = valid.sum(dim=-1, dtype=torch.int32)
    q2k = torch.where(valid, tiles, 0).to(torch.int32)
    q2k = q2k.repeat_interleave(rq, dim=2)[:, :, :n_tiles].contiguous()
    return q2k, cnt.repeat_interleave(rq, dim=2)[:, :, :n_tiles].contiguous()


_SCORE_ELEMENTS = 1 << 24  # logits held at once by `block_sparse_reference` (64 MB in float32)


def block_sparse_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor,
                           q2k_cnt: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Softmax attention of each raster query tile over the key tiles its list names (the float reference of the
    block-sparse kernels on raster tiles, for `sla`'s torch path and the tests).

    Args:
        q, k, v: (B, S, H, D) float, raster order.
        q2k: (B, H, n_tiles, K) integer key tiles of each 64-token query tile; q2k_cnt: (B, H, n_tiles) entries
            of each row to read (at least 1).
        scale: softmax scale, default 1/sqrt(D).

    Returns:
        (B, S, H, D) like q, computed in float32 (float64 for float64 inputs); differentiable in q, k, v. Query rows
        are taken in chunks so that at most `_SCORE_ELEMENTS` logits are held at once.
    """
    b, s, h, d = q.shape
    n_tiles = q2k.shape[2]
    scale = d ** -0.5 if scale is None else scale
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    listed = torch.arange(q2k.shape[-1], device=q.device) < q2k_cnt.unsqueeze(-1)
    tile_map = torch.zeros(b, h, n_tiles, n_tiles + 1, dtype=torch.bool, device=q.device)
    tile_map.scatter_(-1, torch.where(listed, q2k.long(), n_tiles), True)
    tile_map = tile_map[..., :n_tiles]
    token_tile = torch.arange(s, device=q.device) // TILE
    qh, kh, vh = (x.transpose(1, 2).to(acc) for x in (q, k, v))  # (B, H, S, D)
    rows = max(TILE, _SCORE_ELEMENTS // max(1, b * h * s) // TILE * TILE)
    outs = []
    for start in range(0, s, rows):
        stop = min(s, start + rows)
        logits = (qh[:, :, start:stop] @ kh.transpose(-1, -2)) * scale
        keep = tile_map[:, :, token_tile[start:stop]][..., token_tile]
        outs.append(torch.softmax(logits.masked_fill(~keep, float("-inf")), dim=-1) @ vh)
    return torch.cat(outs, dim=2).transpose(1, 2).to(q.dtype)
