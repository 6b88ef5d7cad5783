"""vsagen.kernels.tile_expand: cube-level key lists as the kernels' 64-token kernel-tile lists.

The expansion is checked against lists built with plain loops from the layout's token ranges, and the block-sparse
kernels (Triton interpreter) run over the expanded lists against float64 attention with the token mask built
directly from the cube lists, forward and backward; every cube selected equals dense attention.
"""

from __future__ import annotations

import pytest
import torch

from vsagen.kernels.block_sparse_attn import block_sparse_attention
from vsagen.kernels.tile_expand import expand_to_kernel_tiles
from vsagen.layout import tile_layout

GRIDS = [(5, 6, 10), (3, 9, 17), (4, 8, 8)]  # partial cubes on every side; a grid of whole 4x8x8 cubes
TILES = [(4, 4, 8), (4, 8, 8), (8, 4, 4), (4, 4, 4)]


def random_lists(b, h, n, k, seed, ragged=True):
    """(q2k, q2k_cnt): k distinct ascending cubes per row, the first cnt used (cnt in [0, k] when ragged); the unused
    entries hold garbage (out of range) that must never be read."""
    g = torch.Generator().manual_seed(seed)
    q2k = torch.stack([torch.randperm(n, generator=g)[:k].sort().values for _ in range(b * h * n)]).view(b, h, n, k)
    cnt = torch.randint(0, k + 1, (b, h, n), generator=g) if ragged else torch.full((b, h, n), k)
    unused = torch.arange(k) >= cnt.unsqueeze(-1)
    return torch.where(unused, torch.full_like(q2k, 10 ** 6), q2k).to(torch.int32), cnt.to(torch.int32)


def loop_expansion(lay, q2k, cnt):
    """The kernel-tile lists built with loops over the layout's token ranges: the kernel tiles (64-token runs) of
    every listed cube, in order."""
    off = lay.tile_offsets.tolist()
    runs = {c: [j for j, (s, e) in enumerate(zip(lay.kernel_offsets_i32[:-1].tolist(),
                                                lay.kernel_offsets_i32[1:].tolist())) if off[c] <= s < off[c + 1]]
            for c in range(lay.num_tiles)}
    b, h, n, _ = q2k.shape
    out = {}
    for bi in range(b):
        for hi in range(h):
            for kt, cube in enumerate(lay.kernel_tile_of.tolist()):
                out[bi, hi, kt] = [r for c in q2k[bi, hi, cube, :cnt[bi, hi, cube]].tolist() for r in runs[c]]
    return out


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("tile", TILES)
def test_kernel_tiles_cut_each_cube_into_64_token_runs(grid, tile):
    lay = tile_layout(grid, tile)
    off, koff = lay.tile_offsets.tolist(), lay.kernel_offsets_i32.tolist()
    assert koff[0] == 0 and koff[-1] == lay.num_tokens
    sizes = [e - s for s, e in zip(koff, koff[1:])]
    assert all(1 <= s <= 64 for s in sizes)
    for c in range(lay.num_tiles):
        first, count = int(lay.tile_kernel_first[c]), int(lay.tile_kernel_count[c])
        assert koff[first] == off[c] and koff[first + count] == off[c + 1]  # the cube's runs cover it exactly
        assert count == -(-(off[c + 1] - off[c]) // 64)
        assert lay.kernel_tile_of[first:first + count].tolist() == [c] * count
    assert lay.kernel_tiles_per_tile == -(-lay.tile_volume // 64)


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("tile", TILES)
def test_expansion_matches_loop_built_lists(grid, tile):
    lay = tile_layout(grid, tile)
    k = max(1, lay.num_tiles // 2)
    q2k, cnt = random_lists(2, 3, lay.num_tiles, k, seed=hash((grid, tile)) % 1000)
    lists, counts = expand_to_kernel_tiles(q2k, cnt, lay.tile_kernel_first, lay.tile_kernel_count, lay.kernel_tile_of,
                                           lay.kernel_tiles_per_tile)
    n_kernel = lay.kernel_offsets_i32.numel() - 1
    assert lists.dtype == counts.dtype == torch.int32
    assert lists.shape[:3] == (2, 3, n_kernel) and counts.shape == (2, 3, n_kernel)
    want = loop_expansion(lay, q2k, cnt)
    for (bi, hi, kt), runs in want.items():
        assert counts[bi, hi, kt] == len(runs)
        assert lists[bi, hi, kt, :len(runs)].tolist() == runs  # ascending: cubes ascending, runs ascending


def test_expansion_refuses_mismatched_shapes():
    lay = tile_layout((5, 6, 10), (4, 4, 8))
    q2k, cnt = random_lists(1, 1, lay.num_tiles, 2, seed=1)
    args = (lay.tile_kernel_first, lay.tile_kernel_count, lay.kernel_tile_of, 2)
    with pytest.raises(ValueError, match="do not match"):
        expand_to_kernel_tiles(q2k[:, :, 1:], cnt[:, :, 1:], *args)
    with pytest.raises(ValueError, match="do not match"):
        expand_to_kernel_tiles(q2k, cnt[..., :1], *args)
    with pytest.raises(ValueError, match=">= 1"):
        expand_to_kernel_tiles(q2k, cnt, *args[:3], 0)


def masked_attention_fp64(q, k, v, lay, q2k, cnt):
    """float64 attention where a query token of cube i sees a key token of cube j iff j is among i's first cnt[i]
    listed cubes (a row with none is 0), built from the cube lists directly."""
    b, s, h, _ = q.shape
    cube = lay.token_tile
    allowed = torch.zeros(b, h, lay.num_tiles, lay.num_tiles, dtype=torch.bool)
    for bi in range(b):
        for hi in range(h):
            for i in range(lay.num_tiles):
                allowed[bi, hi, i, q2k[bi, hi, i, :cnt[bi, hi, i]].long()] = True
    mask = allowed[:, :, cube][:, :, :, cube]  # (B, H, S, S)
    qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k, v))
    scores = (qd @ kd.transpose(-1, -2)) * q.shape[-1] ** -0.5
    p = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
    return (p @ vd).transpose(1, 2)


# Partial cubes on every axis (2 x 2 x 2 cubes of 4x4x8 at both head dims; 4x8x8 with three cubes along W, whose
# lists expand to up to 8 kernel tiles), and one whole 4x8x8 cube with no partial rows.
@pytest.mark.parametrize("grid,tile,d", [((5, 6, 10), (4, 4, 8), 64), ((3, 9, 17), (4, 8, 8), 128),
                                         ((4, 8, 8), (4, 8, 8), 64), ((5, 6, 10), (4, 4, 8), 128)])
def test_kernels_over_expanded_lists_equal_the_cube_selection(grid, tile, d):
    """Forward and backward of the Triton kernels (interpreter) over the expanded lists against float64 attention
    masked by the cube lists; batch 2, ragged counts (some rows empty), partial cubes."""
    lay = tile_layout(grid, tile)
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, lay.num_tokens, 2, d, generator=g, requires_grad=True) for _ in range(3))
    q2k, cnt = random_lists(2, 2, lay.num_tiles, max(1, lay.num_tiles // 3), seed=8)
    lists, counts = expand_to_kernel_tiles(q2k, cnt, lay.tile_kernel_first, lay.tile_kernel_count, lay.kernel_tile_of,
                                           lay.kernel_tiles_per_tile)
    out, _ = block_sparse_attention(q, k, v, lists, counts, lay.kernel_offsets_i32)
    qd, kd, vd = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    want = masked_attention_fp64(qd, kd, vd, lay, q2k, cnt)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)
    do = torch.randn(out.shape, generator=g)
    out.backward(do)
    want.backward(do.double())
    for got, ref in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        torch.testing.assert_close(got.double(), ref, atol=5e-5, rtol=5e-5)


@pytest.mark.parametrize("tile", [(4, 4, 8), (4, 8, 8)])
def test_every_cube_selected_equals_dense_attention(tile):
    lay = tile_layout((5, 6, 10), tile)
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, lay.num_tokens, 2, 32, generator=g) for _ in range(3))
    n = lay.num_tiles
    q2k = torch.arange(n, dtype=torch.int32).expand(2, 2, n, n).contiguous()
    cnt = torch.full((2, 2, n), n, dtype=torch.int32)
    lists, counts = expand_to_kernel_tiles(q2k, cnt, lay.tile_kernel_first, lay.tile_kernel_count, lay.kernel_tile_of,
                                           lay.kernel_tiles_per_tile)
    out, _ = block_sparse_attention(q, k, v, lists, counts, lay.kernel_offsets_i32)
    qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k, v))
    dense = (torch.softmax((qd @ kd.transpose(-1, -2)) * 32 ** -0.5, -1) @ vd).transpose(1, 2)
    torch.testing.assert_close(out.double(), dense, atol=2e-5, rtol=2e-5)
