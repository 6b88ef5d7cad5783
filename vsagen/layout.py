"""Latent grid -> tile layout (tile-order permutation, tile sizes and offsets) and the crop plan.

VSA (arXiv 2505.13389, sec. 2) partitions the post-patch latent grid (T, Hl, Wl) into cubes of
(4, 4, 4) = 64 tokens and maps each cube to one kernel tile. Tiles are visited t-tile, h-tile, w-tile
(row-major over tile coordinates); the tokens inside a tile are row-major over (t, h, w).

Larger cubes (FastVideo's VSA tile volumes 128 = (4, 4, 8) and 256 = (4, 8, 8), the `tile` option of the VSA
backends) keep that order. vsagen's block-sparse kernels take tiles of at most 64 tokens, so a layout also cuts each
cube into *kernel tiles*: its tokens in 64-token runs, in tile order (a cube of 128 tokens is kernel tiles 2c and
2c + 1; an edge cube holds as many runs as its tokens need). A selection made over cubes is run by the kernels as
the same selection over those runs (`vsagen.kernels.tile_expand`).

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
TILE_VOLUMES = (64, 128, 256)  # the VSA tile volumes vsagen runs (FastVideo's three: `vsa_utils`, VSA-128 / 256)
NAMED_TILES = ((4, 4, 4), (4, 4, 8), (4, 8, 8))  # the cube of each volume VSA's paper and FastVideo use
KERNEL_TILE = 64  # tokens of the block-sparse kernels' tiles: a larger cube runs as runs of this many tokens


def parse_tile(text: str) -> tuple[int, int, int]:
    """A tile (cube) written `TxHxW` (`4x4x8`: 4 latent frames, 4 rows, 8 columns of the post-patch grid).

    Returns:
        (tt, th, tw) positive ints.

    Raises:
        ValueError: not three positive integers joined by `x`, a dimension that is not a power of two (a crop
            plan then covers every tile of a run at once: `covering_tile`), or a volume other than 64, 128 or 256
            (`TILE_VOLUMES`). The message says which, in one line.
    """
    if isinstance(text, (tuple, list)):  # (4, 4, 8), as Python callers may give it
        text = "x".join(str(d) for d in text)
    parts = str(text).strip().lower().split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if len(dims) != 3:
        raise ValueError(f"tile {text!r}: write it as TxHxW, e.g. 4x4x4, 4x4x8 or 4x8x8 (latent frames x rows x "
                         "columns of the post-patch grid)")
    if any(d < 1 for d in dims):
        raise ValueError(f"tile {text!r}: each side must be a power of two of at least 1 (1, 2, 4, 8, 16, ...)")
    if any(d & (d - 1) for d in dims):
        raise ValueError(f"tile {text!r}: each side must be a power of two (1, 2, 4, 8, 16, ...)")
    if math.prod(dims) not in TILE_VOLUMES:
        raise ValueError(f"tile {text!r} holds {math.prod(dims)} tokens; the tile volumes are "
                         f"{', '.join(map(str, TILE_VOLUMES))} (e.g. 4x4x4, 4x4x8, 4x8x8)")
    return dims  # type: ignore[return-value]


def tile_text(tile: tuple[int, int, int]) -> str:
    """(4, 4, 8) -> "4x4x8" (the option's spelling)."""
    return "x".join(str(int(d)) for d in tile)


def covering_tile(tiles: "list[tuple[int, int, int]] | tuple[tuple[int, int, int], ...]") -> tuple[int, int, int]:
    """The smallest cube that every tile of `tiles` divides (their per-side maximum: sides are powers of two), the
    tile a `--tile-fit crop` plan rounds the grid up to when one run holds several tiles (`vsagen compare`); `TILE`
    for none."""
    if not tiles:
        return TILE
    return tuple(max(int(t[i]) for t in tiles) for i in range(3))  # type: ignore[return-value]


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
        kernel_offsets_i32: (n_kernel_tiles + 1,) int32 starts of the kernel tiles (each tile's tokens in runs of at
            most `KERNEL_TILE`, in tile order); equal to `tile_offsets_i32` for tiles of at most 64 tokens.
        kernel_tile_of: (n_kernel_tiles,) int64 the tile each kernel tile belongs to (ascending).
        tile_kernel_first: (n_tiles,) int64 the first kernel tile of each tile.
        tile_kernel_count: (n_tiles,) int64 kernel tiles of each tile (ceil(size / 64)).
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
    kernel_offsets_i32: torch.Tensor
    kernel_tile_of: torch.Tensor
    tile_kernel_first: torch.Tensor
    tile_kernel_count: torch.Tensor

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
    def kernel_tiles_per_tile(self) -> int:
        """Kernel tiles of a full tile: ceil(tile_volume / 64) (1 for (4, 4, 4), 2 for (4, 4, 8), 4 for (4, 8, 8))."""
        return -(-self.tile_volume // KERNEL_TILE)

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
            "tile_volume": self.tile_volume,
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
    # kernel tiles: each tile's tokens in runs of at most KERNEL_TILE (a tile of 64 or fewer is one run)
    per_tile = (sizes + KERNEL_TILE - 1) // KERNEL_TILE
    kernel_of = torch.repeat_interleave(torch.arange(n_tiles), per_tile)
    first = torch.zeros(n_tiles, dtype=torch.int64)
    first[1:] = torch.cumsum(per_tile, 0)[:-1]
    run = torch.arange(kernel_of.numel()) - first[kernel_of]
    kernel_offsets = torch.cat([offsets[:-1][kernel_of] + run * KERNEL_TILE, offsets[-1:]])
    dev = torch.device(device)
    return TileLayout(
        grid=grid, tile=tile, tiles_per_dim=(nt, nh, nw),
        perm=perm.to(dev), inv_perm=inv_perm.to(dev), tile_sizes=sizes.to(dev), tile_offsets=offsets.to(dev),
        token_tile=token_tile.to(dev), slots=slots.to(dev), slot_valid=slot_valid.to(dev),
        tile_offsets_i32=offsets.to(torch.int32).to(dev), kernel_offsets_i32=kernel_offsets.to(torch.int32).to(dev),
        kernel_tile_of=kernel_of.to(dev), tile_kernel_first=first.to(dev), tile_kernel_count=per_tile.to(dev),
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
