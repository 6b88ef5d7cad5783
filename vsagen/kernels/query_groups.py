"""Query groups: query tiles that share one key list, packed into programs of BLOCK_M rows (host side, plain torch).

The block-sparse forward (`bsa_forward`) normally runs one program per (batch, head, query tile): 64 query rows
whatever the tile holds, so a partial tile at the grid's edge (8, 16 or 32 tokens: 27% of the tiles at the
Wan2.1-1.3B 480p grid) pays for 64 rows, and two tiles with the same key list each load every key tile. With a
static selection (Sparse-vDiT's patterns, `vsagen.sparsity`) many query tiles share their list exactly (every tile
of a vertical-stripe or dense head; the tiles at one spatial place in every temporal slab under multi-diagonal),
so one program can take BLOCK_M rows of several such tiles: fewer K / V loads per query row, and no padded rows
but the last program's of a group. The query rows are given as segments of up to SEG = 8 consecutive rows (as the
tile plans give the key side, `tile_plan`), BLOCK_M / SEG of them per program.

Layout of one program's row of the table (`build_query_groups`):
    [0]                 head
    [1]                 the list tile: the query tile whose q2k row (and tile plan) the program walks
    [2 : 2 + BLOCK_M / SEG]   row segments, (first token row << 4) | rows (1..SEG), 0 = unused

Every query row of every head is in exactly one program, including the rows of tiles with an empty list (they get
output 0 and LSE -inf, as in the per-tile launch).
"""

from __future__ import annotations

import torch

SEG = 8  # rows per segment (the tile plans' group size)


def build_query_groups(q2k: torch.Tensor, q2k_cnt: torch.Tensor, tile_offsets: torch.Tensor,
                       block_m: int = 128) -> torch.Tensor:
    """The query-group table of one set of per-head q2k lists (see the module docstring).

    Args:
        q2k: (H, Q_TILES, K) integer key lists (the first q2k_cnt entries of each row used), the same for every
            batch entry.
        q2k_cnt: (H, Q_TILES) integer.
        tile_offsets: (n_tiles + 1,) integer tile start rows (Q_TILES = n_tiles), at most 64 rows per tile.
        block_m: rows per program: a power of two, 16 to 256.

    Returns:
        (n_programs, 2 + block_m / 8) int32 on the CPU, programs ordered by head, then group (first tile), then
        rows; tiles are grouped when their used entries and counts are equal.

    Raises:
        ValueError: a block_m that is not a power of two in [16, 256], or shapes that do not match.
    """
    if block_m < 16 or block_m > 256 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two in [16, 256], got {block_m}")
    h, n_q, width = q2k.shape
    if q2k_cnt.shape != (h, n_q) or tile_offsets.numel() != n_q + 1:
        raise ValueError(f"q2k (H, Q_TILES, K) {tuple(q2k.shape)}, q2k_cnt {tuple(q2k_cnt.shape)} and tile_offsets "
                         f"({tile_offsets.numel()},) do not match")
    per = block_m // SEG
    lists = q2k.detach().to("cpu", torch.int64)
    cnt = q2k_cnt.detach().to("cpu", torch.int64)
    used = torch.arange(width)[None, None, :] < cnt[..., None]
    keyed = torch.cat([torch.where(used, lists, -1), cnt[..., None]], dim=-1)  # equal rows <=> equal lists
    off = tile_offsets.detach().to("cpu", torch.int64).tolist()
    rows: list[list[int]] = []
    for head in range(h):
        _, inverse = torch.unique(keyed[head], dim=0, return_inverse=True)
        members: dict[int, list[int]] = {}
        for tile, g in enumerate(inverse.tolist()):
            members.setdefault(g, []).append(tile)
        for tiles in sorted(members.values(), key=lambda t: t[0]):
            segs = []
            # full tiles first, so they start on segment boundaries of a program; then the partial tiles
            for tile in sorted(tiles, key=lambda t: (off[t + 1] - off[t] < 64, t)):
                start, stop = off[tile], off[tile + 1]
                segs.extend(((r << 4) | min(SEG, stop - r)) for r in range(start, stop, SEG))
            for i in range(0, len(segs), per):
                chunk = segs[i:i + per]
                rows.append([head, tiles[0], *chunk, *([0] * (per - len(chunk)))])
    return torch.tensor(rows, dtype=torch.int32).reshape(-1, 2 + per)


def block_query_groups(block_of: torch.Tensor, heads: int, tile_offsets: torch.Tensor,
                       block_m: int = 128) -> torch.Tensor:
    """The query-group table of tiles grouped by a fixed block (a shape-only table: every tile of one block has the
    same key list in every batch entry and head, e.g. the 64-token kernel tiles of one VSA cube, or the two tiles of
    one of SLA's 128-token raster blocks).

    Args:
        block_of: (n_tiles,) integer, the block of each tile (ascending).
        heads: H, the heads the table covers.
        tile_offsets: (n_tiles + 1,) integer tile start rows, at most 64 rows per tile.
        block_m: rows per program, as `build_query_groups`.

    Returns:
        (n_programs, 2 + block_m / 8) int32 on the CPU, as `build_query_groups`: each block's rows in programs of
        block_m (a 256-token block takes two programs of 128).

    Raises:
        ValueError: as `build_query_groups`.
    """
    n_tiles = block_of.numel()
    lists = block_of.detach().to("cpu", torch.int64).view(1, n_tiles, 1).expand(heads, -1, -1)
    return build_query_groups(lists, torch.ones(heads, n_tiles, dtype=torch.int64), tile_offsets.detach().cpu(),
                              block_m)
