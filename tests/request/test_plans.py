"""vsagen.request.plans: the crop plan of a request (the backends' covering tile), the note of a crop that denoises
more than was asked, the note of a cube longer than the grid, and the refusal of a grid past the transformer's
position tables (naming the tile where the rounding, not the size, is the cause)."""

from __future__ import annotations

import math

import pytest

from vsagen.errors import BadInput
from vsagen.models.sources import resolve_model
from vsagen.request.plans import check_rope_range, crop_note, oversized_tile_note, preset_plan, size_limits


def test_preset_plan_rounds_crop_to_the_tile():
    src = resolve_model("tiny")  # 17x96x160: grid 5x6x10
    assert preset_plan(src, 17, 96, 160, "partial", (4, 8, 8)).denoise_grid == (5, 6, 10)
    assert preset_plan(src, 17, 96, 160, "crop").denoise_grid == (8, 8, 12)
    assert preset_plan(src, 17, 96, 160, "crop", (4, 8, 8)).denoise_grid == (8, 8, 16)


def test_crop_note_says_the_size_the_token_ratio_and_the_tile():
    src = resolve_model("tiny")
    plan = preset_plan(src, 17, 96, 160, "crop", (4, 8, 8))
    note = crop_note(plan, (4, 8, 8))
    ratio = math.prod(plan.denoise_grid) / math.prod(plan.grid)
    assert note == (f"--tile-fit crop: denoising {plan.denoise_frames}x{plan.denoise_height}x{plan.denoise_width} "
                    f"({ratio:.2f}x the tokens of 17x96x160) so the grid is whole tiles of 4x8x8; the video is "
                    "cropped back")
    whole = preset_plan(src, 13, 64, 128, "crop")  # grid 4x4x8: whole 4x4x4 tiles
    assert not whole.crops and crop_note(whole, (4, 4, 4)) is None


def test_a_cube_longer_than_the_grid_is_a_note_naming_the_axis_the_tokens_and_the_cubes_that_fit():
    """A reviewer ran `vsa:tile=1x1x64` on the tiny model (grid 5x6x10) and got no word that every cube held 10 of
    its 64 tokens; the note says so before the run."""
    note = oversized_tile_note((5, 6, 10), (1, 1, 64))
    assert note == ("tile 1x1x64 is longer than the latent grid 5x6x10 (columns 64 > 10): every cube is partial and "
                    "holds at most 10 of its 64 tokens, so the sparse kernels run short tiles throughout; a cube "
                    "within the grid (4x4x4 or 4x4x8) keeps whole cubes")
    assert "(frames 16 > 5)" in oversized_tile_note((5, 6, 10), (16, 2, 2))
    assert "at most 20 of its 64" in oversized_tile_note((5, 6, 10), (16, 2, 2))
    assert "no named cube fits this grid" in oversized_tile_note((2, 30, 52), (4, 4, 4))
    for tile in ((4, 4, 4), (4, 4, 8), (4, 8, 8), (1, 2, 32)):
        assert oversized_tile_note((21, 30, 52), tile) is None  # the 1.3B 480p grid holds each
    assert "(4x4x4, 4x4x8 or 4x8x8)" in oversized_tile_note((21, 30, 52), (1, 1, 64))
    assert oversized_tile_note((4, 8, 8), (4, 8, 8)) is None  # equal sides fit


def test_the_cube_note_reaches_the_run_notes_for_a_chosen_cube_under_partial_only():
    from vsagen.request.options import request_options
    from vsagen.request.resolve import SEVERAL, resolve

    def notes(attn, fit, frames=17):
        r = resolve(resolve_model("tiny"), request_options(attn=attn, tile_fit=fit, frames=frames), prompt="p",
                    backends=SEVERAL, several_fits=True)
        return [n for n in r.notes if "longer than the latent grid" in n]

    assert notes("vsa:tile=1x1x64", "partial") == [oversized_tile_note((5, 6, 10), (1, 1, 64))]
    assert len(notes("vsa:tile=1x1x64,rocm-vsa:tile=16x2x2,sla-star:tile=1x1x64", "partial")) == 2  # a note a cube
    assert len(notes("vsa:tile=4x8x8", "partial")) == 1  # rows 8 > 6
    assert notes("vsa:tile=4x8x8", "crop") == []  # rounded up to whole cubes: crop's own note
    assert notes("vsa:tile=4x4x8,full", "partial") == []
    assert notes("vsa", "partial", frames=9) == []  # the default cube on a 3-frame grid: the size is the choice


def test_a_crop_past_the_position_tables_names_the_tile():
    src = resolve_model("tiny")
    limit = src.rope_max_seq_len
    assert limit
    width = (limit - 1) * 2 * 8  # a grid axis of limit - 1 positions: fits, but not rounded to a 64-wide tile
    plan = preset_plan(src, 17, 96, width, "crop", (1, 1, 64))
    check_rope_range(src, preset_plan(src, 17, 96, width, "partial"), "partial")  # the size itself fits
    with pytest.raises(BadInput, match=r"--tile-fit crop rounds width to whole tiles of 1x1x64: 64 latent positions, "
                                       r"past the \d+ tiny's position tables cover; use --tile-fit partial"):
        check_rope_range(src, plan, "crop", (1, 1, 64))
    too_wide = preset_plan(src, 17, 96, (limit + 1) * 2 * 8, "partial")
    with pytest.raises(BadInput, match=r"--width too large for tiny: its position tables cover \d+ latent positions"):
        check_rope_range(src, too_wide, "partial")


def test_size_limits_are_the_largest_sizes_the_position_tables_take():
    src = resolve_model("tiny")
    tops = size_limits(src)
    assert tops == {"--frames": 125, "--height": 512, "--width": 512}  # 32 positions: (32 - 1) * 4 + 1, 32 * 2 * 8
    check_rope_range(src, preset_plan(src, tops["--frames"], tops["--height"], tops["--width"], "partial"), "partial")
    with pytest.raises(BadInput, match=r"--frames too large for tiny"):
        check_rope_range(src, preset_plan(src, tops["--frames"] + 4, 96, 160, "partial"), "partial")
