"""A selection over large tiles as the same selection over the block-sparse kernels' 64-token tiles (plain torch).

VSA's tile volumes 128 (cube 4x4x8) and 256 (4x8x8) (FastVideo's VSA-128 / VSA-256) select key cubes per query cube
in the coarse stage; vsagen's block-sparse kernels (`block_sparse_attn`, `linear_marginal`, `sla_star_attn`) take
tiles of at most 64 tokens. A cube's tokens are contiguous in tile order, so it is cut into *kernel tiles*, runs of
at most 64 tokens (`vsagen.layout.TileLayout.kernel_offsets_i32`), and a cube-level list becomes a kernel-tile list
by index expansion: key cube c -> its kernel tiles first[c] .. first[c] + count[c] - 1, and every kernel tile of a
query cube takes its cube's expanded list. Attention over the expanded lists is exactly attention over the cube
lists (the same key tokens for every query token); SLA's 128-token blocks reach the kernels the same way
(`raster_blocks`). FastVideo expands its 128 / 256-token maps to 64-token tiles for its Triton path likewise
(`block_sparse_attn_256.py`, "route A"), with a dense map; here the lists stay lists.
"""

from __future__ import annotations

import torch


def expand_to_kernel_tiles(q2k: torch.Tensor, q2k_cnt: torch.Tensor, tile_kernel_first: torch.Tensor,
                           tile_kernel_count: torch.Tensor, kernel_tile_of: torch.Tensor,
                           kernel_tiles_per_tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cube-level key lists -> the kernels' kernel-tile lists.

    Args:
        q2k: (B, H, Q_TILES, K) integer key cubes of each query cube, ascending, no repeats, each in
            [0, n_tiles); only the first q2k_cnt entries of a row are read.
        q2k_cnt: (B, H, Q_TILES) integer in [0, K].
        tile_kernel_first, tile_kernel_count: (n_tiles,) int64 the first kernel tile of each cube and how many it
            has (`TileLayout.tile_kernel_first` / `tile_kernel_count`), on q2k's device.
        kernel_tile_of: (n_kernel_tiles,) int64 the cube of each kernel tile (`TileLayout.kernel_tile_of`).
        kernel_tiles_per_tile: the most kernel tiles a cube has (ceil(tile volume / 64)).

    Returns:
        q2k: (B, H, n_kernel_tiles, K * kernel_tiles_per_tile) int32, each kernel tile's key kernel tiles,
            ascending (entries past the count are 0);
        q2k_cnt: (B, H, n_kernel_tiles) int32, the sum of the listed cubes' kernel-tile counts.
        For kernel_tiles_per_tile == 1 (cubes of at most 64 tokens) the inputs come back as int32, unexpanded.

    Raises:
        ValueError: q2k not (B, H, Q_TILES, K) with Q_TILES == tile_kernel_first's length, q2k_cnt of another
            shape, or kernel_tiles_per_tile < 1. Index values are not checked (that would synchronize a GPU).

    Source: VSA paper (arXiv 2505.13389) sec. 2 (cube selection, fine stage over the selected cubes); the
    expansion is vsagen's (module docstring).
    """
    if q2k.dim() != 4 or q2k.shape[2] != tile_kernel_first.numel() or q2k_cnt.shape != q2k.shape[:3]:
        raise ValueError(f"q2k (B, H, Q_TILES, K) {tuple(q2k.shape)}, q2k_cnt {tuple(q2k_cnt.shape)} and "
                         f"{tile_kernel_first.numel()} tiles do not match")
    if kernel_tiles_per_tile < 1:
        raise ValueError(f"kernel_tiles_per_tile must be >= 1, got {kernel_tiles_per_tile}")
    if kernel_tiles_per_tile == 1:
        return q2k.to(torch.int32), q2k_cnt.to(torch.int32)
    b, h, n_tiles, k = q2k.shape
    r = kernel_tiles_per_tile
    cubes = q2k.long().clamp(0, n_tiles - 1)  # entries past the count may hold anything
    used = torch.arange(k, device=q2k.device) < q2k_cnt.long().unsqueeze(-1)  # (B, H, Q, K)
    run = torch.arange(r, device=q2k.device)
    runs = tile_kernel_first[cubes].unsqueeze(-1) + run  # (B, H, Q, K, r)
    valid = (used.unsqueeze(-1) & (run < tile_kernel_count[cubes].unsqueeze(-1))).flatten(-2)
    runs = runs.flatten(-2)
    # pack the valid entries to the front of each row, in order (ascending cubes, ascending runs: ascending)
    pos = torch.cumsum(valid.to(torch.int32), -1) - 1
    pos = torch.where(valid, pos, torch.full_like(pos, k * r))  # invalid entries land in a spill column
    packed = torch.zeros(b, h, n_tiles, k * r + 1, dtype=torch.int64, device=q2k.device)
    packed.scatter_(-1, pos.long(), torch.where(valid, runs, torch.zeros_like(runs)))
    lists = packed[..., :k * r].to(torch.int32)
    counts = valid.sum(-1, dtype=torch.int32)
    return lists.index_select(2, kernel_tile_of), counts.index_select(2, kernel_tile_of)
