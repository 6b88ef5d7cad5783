"""vsagen.kernels.tile_expand_triton: the one-launch expansion equals the torch expansion bitwise (Triton
interpreter): every tile shape on grids with partial cubes, ragged counts with garbage past them, batch 2, int32 and
int64 inputs, strided views, lists longer than one chunk, empty lists; bad shapes are refused."""

from __future__ import annotations

import pytest
import torch

from vsagen.kernels import tile_expand_triton
from vsagen.kernels.tile_expand import expand_to_kernel_tiles
from vsagen.kernels.tile_expand_triton import expand_to_kernel_tiles_triton
from vsagen.layout import tile_layout

from test_tile_expand import GRIDS, random_lists

TILES = [(4, 4, 8), (4, 8, 8), (8, 4, 4)]


def both(lay, q2k, cnt):
    want = expand_to_kernel_tiles(q2k, cnt, lay.tile_kernel_first, lay.tile_kernel_count, lay.kernel_tile_of,
                                  lay.kernel_tiles_per_tile)
    got = expand_to_kernel_tiles_triton(q2k, cnt, lay.tile_kernel_first, lay.tile_kernel_count, lay.kernel_tile_of,
                                        lay.kernel_tiles_per_tile)
    return want, got


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("tile", TILES)
def test_equals_the_torch_expansion_bitwise(grid, tile):
    lay = tile_layout(grid, tile)
    q2k, cnt = random_lists(2, 3, lay.num_tiles, max(1, lay.num_tiles // 2), seed=sum(grid) * 7 + tile[2])
    (lists, counts), (got_lists, got_counts) = both(lay, q2k, cnt)
    assert got_lists.dtype == got_counts.dtype == torch.int32
    assert torch.equal(got_counts, counts) and torch.equal(got_lists, lists)  # zeros past each count too


def test_int64_strided_views_long_lists_and_full_rows(monkeypatch):
    """int64 q2k as a transposed view (not contiguous), every entry used, lists over several CHUNK_K chunks."""
    monkeypatch.setattr(tile_expand_triton, "CHUNK_K", 4)
    lay = tile_layout((5, 6, 10), (4, 4, 8))
    q2k, cnt = random_lists(3, 2, lay.num_tiles, lay.num_tiles - 1, seed=5, ragged=False)
    view = q2k.long().transpose(0, 1).contiguous().transpose(0, 1)  # (3, 2, ...) with batch-major strides swapped
    assert not view.is_contiguous()
    (lists, counts), (got_lists, got_counts) = both(lay, view, cnt.long())
    assert torch.equal(got_counts, counts) and torch.equal(got_lists, lists)


def test_empty_lists_give_zero_counts():
    lay = tile_layout((3, 9, 17), (4, 8, 8))
    q2k, _ = random_lists(1, 2, lay.num_tiles, 3, seed=1)
    cnt = torch.zeros(q2k.shape[:3], dtype=torch.int32)
    (lists, counts), (got_lists, got_counts) = both(lay, q2k, cnt)
    assert int(got_counts.abs().sum()) == 0 and int(got_lists.abs().sum()) == 0
    assert torch.equal(got_lists, lists) and torch.equal(got_counts, counts)


def test_cube_counts_above_kernel_tiles_per_tile_are_clamped_as_torch_does():
    """A tile_kernel_count above kernel_tiles_per_tile (no TileLayout gives one) is clamped to it as the torch
    expansion's runs are, and never writes past a row: it aborted the process with a heap error (new-user trial)."""
    lay = tile_layout((5, 6, 10), (4, 8, 8))
    q2k, cnt = random_lists(2, 2, lay.num_tiles, 4, seed=3)
    counts_too_large = lay.tile_kernel_count + lay.kernel_tiles_per_tile  # every cube claims R more than it may
    args = (q2k, cnt, lay.tile_kernel_first, counts_too_large, lay.kernel_tile_of, lay.kernel_tiles_per_tile)
    lists, counts = expand_to_kernel_tiles(*args)
    got_lists, got_counts = expand_to_kernel_tiles_triton(*args)
    assert torch.equal(got_counts, counts) and torch.equal(got_lists, lists)
    _, one = expand_to_kernel_tiles_triton(q2k, cnt, lay.tile_kernel_first, lay.tile_kernel_count,
                                           lay.kernel_tile_of, 1)  # R=1 on a layout whose cubes have 4
    assert int(one.max()) <= q2k.shape[-1]


def test_refuses_mismatched_shapes():
    lay = tile_layout((3, 9, 17), (4, 8, 8))
    q2k, cnt = random_lists(1, 2, lay.num_tiles, 3, seed=1)
    args = (lay.tile_kernel_first, lay.tile_kernel_count, lay.kernel_tile_of)
    with pytest.raises(ValueError, match="do not match"):
        expand_to_kernel_tiles_triton(q2k[:, :, 1:], cnt, *args, 4)
    with pytest.raises(ValueError, match="1..8"):
        expand_to_kernel_tiles_triton(q2k, cnt, *args, 9)


# Its AMD Instinct builds (gfx942, gfx950): tests/kernels/test_amd_build.py.
