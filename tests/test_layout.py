"""Tests for vsagen.layout: tile-order permutation, tile sizes / offsets / slots, and the crop plan.

Expected tile orders are rebuilt here independently with plain Python loops over (t, h, w).
"""

from __future__ import annotations

import math

import pytest
import torch

from vsagen.layout import TILE, plan_crop, tile_layout

# Permutations move values without arithmetic, so round trips must be bit-exact (no tolerance).
EXACT = dict(rtol=0.0, atol=0.0)

# Grids that are multiples of the (4, 4, 4) tile, grids with partial edge tiles, and the 480x832x81 Wan grid.
FULL_GRIDS = [(4, 8, 8), (8, 4, 12)]
PARTIAL_GRIDS = [(3, 5, 7), (1, 1, 1), (5, 6, 10), (21, 30, 52)]
ALL_GRIDS = FULL_GRIDS + PARTIAL_GRIDS


def expected_tile_order(grid, tile=TILE):
    """Raster token indices in tile order, and the size of each tile, built with plain loops.

    Tiles are visited t-tile, h-tile, w-tile (row-major over tile coordinates); tokens inside a tile are
    row-major over (t, h, w).
    """
    gt, gh, gw = grid
    ct, ch, cw = tile
    order, sizes = [], []
    for a in range(-(-gt // ct)):
        for b in range(-(-gh // ch)):
            for c in range(-(-gw // cw)):
                start = len(order)
                for t in range(a * ct, min((a + 1) * ct, gt)):
                    for h in range(b * ch, min((b + 1) * ch, gh)):
                        for w in range(c * cw, min((c + 1) * cw, gw)):
                            order.append((t * gh + h) * gw + w)
                sizes.append(len(order) - start)
    return order, sizes


# ---------------------------------------------------------------------------------------------- permutation


@pytest.mark.parametrize("grid", ALL_GRIDS)
def test_perm_and_inv_perm_are_inverse_permutations(grid):
    lay = tile_layout(grid)
    s = math.prod(grid)
    ar = torch.arange(s)
    assert lay.perm.shape == (s,) and lay.inv_perm.shape == (s,)
    assert lay.perm.dtype == torch.int64 and lay.inv_perm.dtype == torch.int64
    assert torch.equal(torch.sort(lay.perm).values, ar)
    assert torch.equal(lay.perm[lay.inv_perm], ar)
    assert torch.equal(lay.inv_perm[lay.perm], ar)


@pytest.mark.parametrize("grid", ALL_GRIDS)
def test_to_tiles_to_raster_round_trip(grid):
    lay = tile_layout(grid)
    s = math.prod(grid)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, s, 3, 5, generator=g)
    xt = lay.to_tiles(x)
    torch.testing.assert_close(lay.to_raster(xt), x, **EXACT)
    torch.testing.assert_close(lay.to_tiles(lay.to_raster(x)), x, **EXACT)
    # Position i of the tile order holds raster token perm[i].
    torch.testing.assert_close(xt, x[:, lay.perm], **EXACT)


@pytest.mark.parametrize("dim", [0, 2, -1])
def test_to_tiles_along_other_dims(dim):
    grid = (3, 5, 7)
    lay = tile_layout(grid)
    s = math.prod(grid)
    shape = [2, 4, 6]
    shape[dim] = s
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    xt = lay.to_tiles(x, dim=dim)
    torch.testing.assert_close(xt, x.index_select(dim, lay.perm), **EXACT)
    torch.testing.assert_close(lay.to_raster(xt, dim=dim), x, **EXACT)


# ---------------------------------------------------------------------------------------------- tile order


@pytest.mark.parametrize("grid,tile", [((3, 5, 7), TILE), ((5, 6, 10), TILE), ((4, 8, 8), TILE),
                                       ((1, 1, 1), TILE), ((21, 30, 52), TILE), ((5, 7, 9), (2, 3, 4))])
def test_perm_matches_loop_built_tile_order(grid, tile):
    lay = tile_layout(grid, tile)
    order, sizes = expected_tile_order(grid, tile)
    assert lay.perm.tolist() == order
    assert lay.tile_sizes.tolist() == sizes
    assert lay.tiles_per_dim == tuple(-(-g // c) for g, c in zip(grid, tile))
    assert lay.num_tiles == len(sizes)


@pytest.mark.parametrize("grid", [(3, 5, 7), (5, 6, 10), (9, 4, 6)])
def test_tiles_are_contiguous_and_hold_their_cube(grid):
    """Tile j occupies [tile_offsets[j], tile_offsets[j+1]) and holds exactly the raster tokens of its cube."""
    lay = tile_layout(grid)
    gt, gh, gw = grid
    nt, nh, nw = lay.tiles_per_dim
    offsets = lay.tile_offsets.tolist()
    assert offsets[0] == 0 and offsets[-1] == math.prod(grid)
    perm = lay.perm.tolist()
    j = 0
    for a in range(nt):
        for b in range(nh):
            for c in range(nw):
                members = perm[offsets[j]:offsets[j + 1]]
                coords = [(r // (gh * gw), (r // gw) % gh, r % gw) for r in members]
                assert all((t // 4, h // 4, w // 4) == (a, b, c) for t, h, w in coords)
                cube = {(t * gh + h) * gw + w
                        for t in range(4 * a, min(4 * a + 4, gt))
                        for h in range(4 * b, min(4 * b + 4, gh))
                        for w in range(4 * c, min(4 * c + 4, gw))}
                assert set(members) == cube
                # Row-major over (t, h, w) inside the tile: raster indices ascend.
                assert members == sorted(members)
                assert torch.all(lay.token_tile[offsets[j]:offsets[j + 1]] == j)
                j += 1
    assert j == lay.num_tiles


# ---------------------------------------------------------------------------------------------- sizes, slots


@pytest.mark.parametrize("grid", ALL_GRIDS)
def test_tile_sizes_and_offsets(grid):
    lay = tile_layout(grid)
    sizes = lay.tile_sizes
    assert int(sizes.sum()) == math.prod(grid) == lay.num_tokens
    assert int(sizes.min()) >= 1 and int(sizes.max()) <= 64
    # Full tiles are exactly those whose cube lies inside the grid in all three dims.
    full_expected = math.prod(g // 4 for g in grid)
    assert lay.num_full_tiles == full_expected
    assert int((sizes == 64).sum()) == full_expected
    torch.testing.assert_close(lay.tile_offsets[1:] - lay.tile_offsets[:-1], sizes, **EXACT)
    torch.testing.assert_close(lay.token_tile, torch.repeat_interleave(torch.arange(lay.num_tiles), sizes), **EXACT)


def test_wan_480p_grid_counts():
    lay = tile_layout((21, 30, 52))
    assert lay.num_tiles == 624
    assert lay.num_full_tiles == 455
    assert lay.tiles_per_dim == (6, 8, 13)
    assert lay.tile_volume == 64
    assert lay.summary() == {"grid": [21, 30, 52], "tile": [4, 4, 4], "tile_volume": 64, "tiles": 624, "full_tiles": 455,
                             "tokens": 21 * 30 * 52}


@pytest.mark.parametrize("grid", FULL_GRIDS)
def test_multiple_of_tile_grid_has_only_full_tiles(grid):
    lay = tile_layout(grid)
    assert lay.num_full_tiles == lay.num_tiles
    assert bool(lay.slot_valid.all())


@pytest.mark.parametrize("grid,tile", [((3, 5, 7), TILE), ((5, 6, 10), TILE), ((4, 8, 8), TILE),
                                       ((1, 1, 1), TILE), ((5, 7, 9), (2, 3, 4))])
def test_slots_consistent_with_sizes_and_offsets(grid, tile):
    lay = tile_layout(grid, tile)
    vol = math.prod(tile)
    assert lay.slots.shape == (lay.num_tiles, vol) and lay.slot_valid.shape == (lay.num_tiles, vol)
    assert lay.slot_valid.dtype == torch.bool
    for j in range(lay.num_tiles):
        n = int(lay.tile_sizes[j])
        start = int(lay.tile_offsets[j])
        # Valid slots are a prefix of length tile_sizes[j], holding the tile's tokens in order.
        assert lay.slot_valid[j].tolist() == [True] * n + [False] * (vol - n)
        assert lay.slots[j, :n].tolist() == list(range(start, start + n))
        assert lay.slots[j, n:].tolist() == [0] * (vol - n)
    # Every token appears in exactly one valid slot, in tile order.
    torch.testing.assert_close(lay.slots[lay.slot_valid], torch.arange(lay.num_tokens), **EXACT)
    torch.testing.assert_close(lay.token_tile[lay.slots[lay.slot_valid]],
                               torch.arange(lay.num_tiles).view(-1, 1).expand(-1, vol)[lay.slot_valid], **EXACT)


def test_layout_is_cached_per_grid():
    assert tile_layout((3, 5, 7)) is tile_layout((3, 5, 7))
    assert tile_layout((3, 5, 7)) is not tile_layout((3, 5, 8))


@pytest.mark.parametrize("grid", [(0, 4, 4), (4, -1, 4), (4, 4), (4, 4, 4, 4), (2.5, 4, 4), (4, 4, 3.9)])
def test_invalid_grid_raises(grid):
    with pytest.raises(ValueError, match="grid"):
        tile_layout(grid)


@pytest.mark.parametrize("tile", [(0, 4, 4), (4, 4), (4, 1.5, 4)])
def test_invalid_tile_raises(tile):
    with pytest.raises(ValueError, match="tile"):
        tile_layout((4, 4, 4), tile)


def test_integral_float_grid_is_accepted():
    assert tile_layout((4.0, 8, 8)).grid == (4, 8, 8)


# ---------------------------------------------------------------------------------------------- crop plan

WAN21 = dict(vae_stride_temporal=4, vae_stride_spatial=8, patch_size=(1, 2, 2))
WAN22_5B = dict(vae_stride_temporal=4, vae_stride_spatial=16, patch_size=(1, 2, 2))


def test_plan_crop_partial_keeps_sizes():
    p = plan_crop(81, 480, 832, fit="partial", **WAN21)
    assert (p.denoise_frames, p.denoise_height, p.denoise_width) == (81, 480, 832)
    assert p.latent == p.denoise_latent == (21, 60, 104)
    assert p.grid == p.denoise_grid == (21, 30, 52)
    assert not p.crops


def test_plan_crop_crop_480p():
    p = plan_crop(81, 480, 832, fit="crop", **WAN21)
    assert p.fit == "crop"
    assert (p.frames, p.height, p.width) == (81, 480, 832)
    assert p.grid == (21, 30, 52)
    assert p.denoise_grid == (24, 32, 52)
    assert (p.denoise_frames, p.denoise_height, p.denoise_width) == (93, 512, 832)
    assert p.denoise_latent == (24, 64, 104)
    assert p.latent == (21, 60, 104)
    assert p.crops
    lay = tile_layout(p.denoise_grid)
    assert lay.num_full_tiles == lay.num_tiles


def test_plan_crop_crop_wan22_5b():
    p = plan_crop(121, 704, 1280, fit="crop", **WAN22_5B)
    assert p.latent == (31, 44, 80)
    assert p.grid == (31, 22, 40)
    assert p.denoise_grid == (32, 24, 40)
    assert p.denoise_latent == (32, 48, 80)
    assert (p.denoise_frames, p.denoise_height, p.denoise_width) == (125, 768, 1280)


@pytest.mark.parametrize("cfg", [WAN21, WAN22_5B])
@pytest.mark.parametrize("frames", [1, 5, 17, 49, 81])
@pytest.mark.parametrize("hw", [(32, 32), (96, 160), (480, 832)])
def test_plan_crop_invariants(cfg, frames, hw):
    height, width = hw
    mult = cfg["vae_stride_spatial"] * 2
    if height % mult or width % mult:
        pytest.skip("size not valid for this VAE stride")
    st, ss, (pt, ph, pw) = cfg["vae_stride_temporal"], cfg["vae_stride_spatial"], cfg["patch_size"]
    part = plan_crop(frames, height, width, fit="partial", **cfg)
    crop = plan_crop(frames, height, width, fit="crop", **cfg)
    assert part.latent == crop.latent == ((frames - 1) // st + 1, height // ss, width // ss)
    assert part.grid == crop.grid
    for g, d in zip(crop.grid, crop.denoise_grid):
        assert d % 4 == 0 and g <= d < g + 4
    assert crop.denoise_latent == (crop.denoise_grid[0] * pt, crop.denoise_grid[1] * ph, crop.denoise_grid[2] * pw)
    # The denoised pixel sizes are what the denoised latent decodes to; the requested latent decodes to the request.
    assert crop.denoise_frames == (crop.denoise_latent[0] - 1) * st + 1
    assert (crop.denoise_height, crop.denoise_width) == (crop.denoise_latent[1] * ss, crop.denoise_latent[2] * ss)
    assert (crop.latent[0] - 1) * st + 1 == frames
    assert (crop.latent[1] * ss, crop.latent[2] * ss) == (height, width)
    assert all(a <= b for a, b in zip(crop.latent, crop.denoise_latent))
    assert crop.crops == (crop.latent != crop.denoise_latent)


@pytest.mark.parametrize("frames,height,width,fit,match", [
    (10, 480, 832, "crop", "frames"),
    (0, 480, 832, "crop", "frames"),
    (81, 100, 832, "crop", "height"),
    (81, 0, 832, "partial", "height"),
    (81, 480, 100, "partial", "width"),
    (81, 480, 832, "pad", "fit"),
])
def test_plan_crop_invalid(frames, height, width, fit, match):
    with pytest.raises(ValueError, match=match):
        plan_crop(frames, height, width, fit=fit, **WAN21)
