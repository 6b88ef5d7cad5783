"""Latent grid -> tile layout (tile-order permutation, tile sizes and offsets) and the crop plan.

VSA (arXiv 2505.13389, sec. 2) partitions the post-patch latent grid (T, Hl, Wl) into cubes of
(4, 4, 4) = 64 tokens and maps each cube to one kernel tile. Tiles are visited t-tile, h-tile, w-tile
(row-major over tile coordinates); the tokens inside a tile are row-major over (t, h, w).

Grids that are not multiples of 4 are handled two ways (both selectable with `--tile-fit`):
* partial: edge tiles hold fewer than 64 tokens; `TileLayout.tile_sizes` carries the true counts.
* crop: denoise a latent whose grid is rounded up to multiples of 4 and crop it back before the VAE
  decode (the paper's suggestion, sec. 5); `plan_crop` computes the sizes.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a layout is built: the crop plans answer without it (bad input, fast)
    import torch

TILE = (4, 4, 4)


@dataclass(frozen=True, eq=False)
class TileLayout:
    """Tile layout of one post-patch latent grid.

    Attributes:
        grid: (T, Hl, Wl) post-patch latent grid; S = T * Hl * Wl tokens.
        tile: (tt, th, tw) tile (cube) shape; 64 tokens for (4, 4, 4).
        tiles_per_dim: (ceil(T/tt), ceil(Hl/th), ceil(Wl/tw)).
        perm: (S,) int64; position i of the tile order holds raster token perm[i] (x_tile = x_raster[:, perm]).
        inv_perm: (S,) int64; x_raster = x_tile[:, inv_perm].
        tile_sizes: (n_tiles,) int64 true token counts (64 for full tiles, fewer at grid edges).
        tile_offsets: (n_tiles + 1,) int64 start of each tile in tile order; tile j is
            [tile_offsets[j], tile_offsets[j+1]).
        token_tile: (S,) int64 tile index of each token, in tile order.
        slots: (n_tiles, tile_volume) int64 token index (tile order) of each slot of a padded tile;
            padding slots hold 0 and are flagged False in `slot_valid`.
        slot_valid: (n_tiles, tile_volume) bool.
        tile_offsets_i32: `tile_offsets` as int32, the form the Triton kernels take.
    """

    grid: tuple[int, int, int]
    tile: tuple[int, int, int]
    tiles_per_dim: tuple[int, int, int]
    perm: torch.Tensor
    inv_perm: torch.Tensor
    tile_sizes: torch.Tensor
    tile_offsets: torch.Tensor
    token_tile: torch.Tensor
    slots: torch.Tensor
    slot_valid: torch.Tensor
    tile_offsets_i32: torch.Tensor

    @property
    def num_tokens(self) -> int:
        """S, the number of real tokens."""
        return math.prod(self.grid)

    @property
    def num_tiles(self) -> int:
        """Number of tiles (Q_TILES == KV_TILES)."""
        return math.prod(self.tiles_per_dim)

    @property
    def tile_volume(self) -> int:
        """Tokens in a full tile (64 for (4, 4, 4))."""
        return math.prod(self.tile)

    @property
    def num_full_tiles(self) -> int:
        """Tiles that hold `tile_volume` tokens."""
        return int((self.tile_sizes == self.tile_volume).sum())

    def to_tiles(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """Raster order -> tile order along `dim` (any shape with S at `dim`)."""
        return x.index_select(dim, self.perm.to(x.device))

    def to_raster(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """Tile order -> raster order along `dim`."""
        return x.index_select(dim, self.inv_perm.to(x.device))

    def summary(self) -> dict:
        """JSON-friendly description (grid, tile, tile counts)."""
        return {
            "grid": list(self.grid),
            "tile": list(self.tile),
            "tiles": self.num_tiles,
            "full_tiles": self.num_full_tiles,
            "tokens": self.num_tokens,
        }


def _check_dims(name: str, dims: tuple[int, ...]) -> None:
    if len(dims) != 3 or any(int(d) != d or d < 1 for d in dims):
        raise ValueError(f"{name} must be three positive integers, got {dims}")


@functools.cache
def tile_layout(grid: tuple[int, int, int], tile: tuple[int, int, int] = TILE,
                device: torch.device | str = "cpu") -> TileLayout:
    """Build (and cache per grid, tile and device) the tile layout of a post-patch latent grid.

    Args:
        grid: (T, Hl, Wl) post-patch latent grid, any positive sizes (partial edge tiles allowed).
        tile: tile (cube) shape, default (4, 4, 4).
        device: where the index tensors live.

    Returns:
        TileLayout with int64 index tensors on `device`.

    Raises:
        ValueError: a grid or tile size that is not a positive integer.

    Source: VSA paper sec. 2 (cube partition) and appendix B (tile / untile).
    """
    import torch

    # The cache lives for the whole process: build normal tensors even when the first caller runs under
    # torch.inference_mode (as `generate` does), or a later autograd forward on the same grid fails.
    with torch.inference_mode(False):
        return _build_layout(grid, tile, device)


def _build_layout(grid: tuple[int, int, int], tile: tuple[int, int, int], device: torch.device | str) -> TileLayout:
    import torch

    # Check before converting: int() would silently truncate a non-integral size such as 2.5.
    _check_dims("grid", tuple(grid))
    _check_dims("tile", tuple(tile))
    grid = tuple(int(g) for g in grid)  # type: ignore[assignment]
    tile = tuple(int(t) for t in tile)  # type: ignore[assignment]
    (gt, gh, gw), (ct, ch, cw) = grid, tile
    nt, nh, nw = (math.ceil(g / c) for g, c in zip(grid, tile))
    t = torch.arange(gt).view(-1, 1, 1).expand(gt, gh, gw)
    h = torch.arange(gh).view(1, -1, 1).expand(gt, gh, gw)
    w = torch.arange(gw).view(1, 1, -1).expand(gt, gh, gw)
    tile_id = ((t // ct) * nh + h // ch) * nw + w // cw  # raster order
    in_tile = ((t % ct) * ch + h % ch) * cw + w % cw
    key = (tile_id * (ct * ch * cw) + in_tile).flatten()
    perm = torch.argsort(key)
    inv_perm = torch.empty_like(perm)
    inv_perm[perm] = torch.arange(perm.numel())
    token_tile = tile_id.flatten()[perm]
    n_tiles = nt * nh * nw
    sizes = torch.bincount(token_tile, minlength=n_tiles)
    offsets = torch.zeros(n_tiles + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(sizes, 0)
    vol = ct * ch * cw
    slot = torch.arange(vol).view(1, -1)
    slot_valid = slot < sizes.view(-1, 1)
    slots = torch.where(slot_valid, offsets[:-1].view(-1, 1) + slot, torch.zeros((), dtype=torch.int64))
    dev = torch.device(device)
    return TileLayout(
        grid=grid, tile=tile, tiles_per_dim=(nt, nh, nw),
        perm=perm.to(dev), inv_perm=inv_perm.to(dev), tile_sizes=sizes.to(dev), tile_offsets=offsets.to(dev),
        token_tile=token_tile.to(dev), slots=slots.to(dev), slot_valid=slot_valid.to(dev),
        tile_offsets_i32=offsets.to(torch.int32).to(dev),
    )


@dataclass(frozen=True)
class CropPlan:
    """Sizes to denoise at and to crop back to.

    `frames/height/width` are what the user asked for (pixels); `denoise_*` what the pipeline is run at.
    `latent` / `denoise_latent` are the VAE latent shapes (F_lat, H_lat, W_lat); `grid` / `denoise_grid`
    the post-patch grids. With fit "partial" both are equal.
    """

    fit: str
    frames: int
    height: int
    width: int
    denoise_frames: int
    denoise_height: int
    denoise_width: int
    latent: tuple[int, int, int]
    denoise_latent: tuple[int, int, int]
    grid: tuple[int, int, int]
    denoise_grid: tuple[int, int, int]

    @property
    def crops(self) -> bool:
        """Whether the denoised latent is larger than the requested one."""
        return self.latent != self.denoise_latent


def plan_crop(frames: int, height: int, width: int, *, fit: str, vae_stride_temporal: int, vae_stride_spatial: int,
              patch_size: tuple[int, int, int], tile: tuple[int, int, int] = TILE) -> CropPlan:
    """Plan the denoised size for `--tile-fit`.

    Args:
        frames: requested frames, of the form vae_stride_temporal * k + 1.
        height, width: requested pixels, multiples of vae_stride_spatial * patch.
        fit: "partial" (denoise as asked; edge tiles hold fewer tokens) or "crop" (round the post-patch grid
            up to multiples of the tile, denoise that, crop the latent back before decode).
        vae_stride_temporal, vae_stride_spatial: VAE compression (4 and 8 for Wan2.1; 4 and 16 for Wan2.2-5B).
        patch_size: transformer patch (p_t, p_h, p_w), (1, 2, 2) for Wan.

    Returns:
        CropPlan; decoding `denoise_latent[:, :, :F, :H, :W]` with (F, H, W) = `latent` yields exactly
        `frames` x `height` x `width` pixels (the Wan VAE is causal in time, so the first F latent frames
        decode to the first `frames` frames).

    Raises:
        ValueError: sizes not of the required form, or an unknown fit.

    Source: VSA paper sec. 5 (generate a slightly larger latent and crop).
    """
    if fit not in ("partial", "crop"):
        raise ValueError(f"fit must be 'partial' or 'crop', got {fit!r}")
    pt, ph, pw = patch_size
    if (frames - 1) % vae_stride_temporal or frames < 1:
        raise ValueError(f"frames must be {vae_stride_temporal}k+1, got {frames}")
    for name, v, p in (("height", height, ph), ("width", width, pw)):
        if v < 1 or v % (vae_stride_spatial * p):
            raise ValueError(f"{name} must be a positive multiple of {vae_stride_spatial * p}, got {v}")
    latent = ((frames - 1) // vae_stride_temporal + 1, height // vae_stride_spatial, width // vae_stride_spatial)
    if latent[0] % pt:
        raise ValueError(f"latent frames {latent[0]} not divisible by temporal patch {pt}")
    grid = (latent[0] // pt, latent[1] // ph, latent[2] // pw)
    if fit == "partial":
        dgrid = grid
    else:
        dgrid = tuple(math.ceil(g / c) * c for g, c in zip(grid, tile))
    dlatent = (dgrid[0] * pt, dgrid[1] * ph, dgrid[2] * pw)
    return CropPlan(
        fit=fit, frames=frames, height=height, width=width,
        denoise_frames=(dlatent[0] - 1) * vae_stride_temporal + 1,
        denoise_height=dlatent[1] * vae_stride_spatial, denoise_width=dlatent[2] * vae_stride_spatial,
        latent=latent, denoise_latent=dlatent, grid=grid, denoise_grid=dgrid,  # type: ignore[arg-type]
    )
