"""The crop plan of a request before anything loads: its size under `--tile-fit` with the preset's strides and
patch size (`vsagen.layout.plan_crop`), the run notes of a crop that denoises more than was asked and of a cube
longer than the grid, and the refusal of a grid past the transformer's position tables."""

from __future__ import annotations

import math

from ..errors import BadInput
from ..layout import NAMED_TILES, TILE, CropPlan, plan_crop, tile_text
from ..models.sources import ModelSource


def preset_plan(source: ModelSource, frames: int, height: int, width: int, tile_fit: str,
                tile: tuple[int, int, int] = TILE) -> CropPlan:
    """The crop plan of a size under `tile_fit` with the preset's VAE strides and patch size (`crop` rounds the grid
    up to multiples of `tile`)."""
    p = source.preset
    return plan_crop(frames, height, width, fit=tile_fit, vae_stride_temporal=p.vae_stride_temporal,
                     vae_stride_spatial=p.vae_stride_spatial, patch_size=p.patch_size, tile=tile)


def size_limits(src: ModelSource) -> dict[str, int]:
    """The largest `--frames`, `--height` and `--width` the transformer's RoPE tables cover (`rope_max_seq_len`
    post-patch positions per grid axis), by flag; {} where the checkpoint gives no limit."""
    limit = src.rope_max_seq_len
    if not limit:
        return {}
    p = src.preset
    pt, ph, pw = p.patch_size
    return {"--frames": (limit * pt - 1) * p.vae_stride_temporal + 1, "--height": limit * ph * p.vae_stride_spatial,
            "--width": limit * pw * p.vae_stride_spatial}


def check_rope_range(src: ModelSource, plan: CropPlan, tile_fit: str, tile: tuple[int, int, int] = TILE) -> None:
    """The transformer's RoPE tables cover `rope_max_seq_len` post-patch positions per grid axis; a larger grid
    (after --tile-fit crop rounding to whole tiles of `tile`) would fail deep inside diffusers, so refuse it here."""
    limit, p, most = src.rope_max_seq_len, src.preset, size_limits(src)
    if not most:
        return
    for (flag, top), g, asked in zip(most.items(), plan.denoise_grid, plan.grid):
        if g > limit and asked <= limit:  # the size fits; the rounding to whole tiles does not
            raise BadInput(f"--tile-fit crop rounds {flag[2:]} to whole tiles of {tile_text(tile)}: {g} latent "
                           f"positions, past the {limit} {p.name}'s position tables cover; use --tile-fit partial "
                           "or a smaller tile")
        if g > limit:
            raise BadInput(f"{flag} too large for {p.name}: its position tables cover {limit} latent positions "
                           f"per axis, i.e. {flag} <= {top}")


def crop_note(plan: CropPlan, tile: tuple[int, int, int]) -> str | None:
    """The run note of a `--tile-fit crop` plan that denoises more than was asked (None when the grid is whole
    tiles already): the size denoised, how many more tokens, and the tile it rounds to."""
    if not plan.crops:
        return None
    ratio = math.prod(plan.denoise_grid) / math.prod(plan.grid)
    return (f"--tile-fit crop: denoising {plan.denoise_frames}x{plan.denoise_height}x{plan.denoise_width} "
            f"({ratio:.2f}x the tokens of {plan.frames}x{plan.height}x{plan.width}) so the grid is whole tiles of "
            f"{tile_text(tile)}; the video is cropped back")


def oversized_tile_note(grid: tuple[int, int, int], tile: tuple[int, int, int]) -> str | None:
    """The run note of a cube longer than the latent grid along an axis under `--tile-fit partial` (None when it
    fits): every cube of the layout is then partial, holding at most `prod(min(tile, grid))` of its tokens, so the
    block-sparse kernels work on short tiles the whole run (it runs correctly, far from their rate, and unlike
    what a checkpoint trained with whole cubes saw). Names the cubes that fit.

    Args:
        grid: the post-patch latent grid (frames, rows, columns) the run denoises.
        tile: the VSA cube (tt, th, tw).
    """
    over = [f"{axis} {t} > {g}" for axis, t, g in zip(("frames", "rows", "columns"), tile, grid) if t > g]
    if not over:
        return None
    most = math.prod(min(t, g) for t, g in zip(tile, grid))
    fits = [tile_text(t) for t in NAMED_TILES if all(a <= g for a, g in zip(t, grid))]
    named = ", ".join(fits[:-1]) + " or " + fits[-1] if len(fits) > 1 else "".join(fits)
    hint = f"a cube within the grid ({named}) keeps whole cubes" if fits else \
        "no named cube fits this grid; a larger size does"
    return (f"tile {tile_text(tile)} is longer than the latent grid {tile_text(grid)} ({', '.join(over)}): every "
            f"cube is partial and holds at most {most} of its {math.prod(tile)} tokens, so the sparse kernels run "
            f"short tiles throughout; {hint}")
