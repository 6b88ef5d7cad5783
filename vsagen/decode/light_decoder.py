"""Hummingbird-XT's lightweight VAE decoder (AMD's `AutoencoderKLTurboVAED`), written from the facts of its source.

Source read: AMD-AGI/HummingbirdXT @63b54d1 (`infer/examples/wan2.2/autoencoder_kl_turbo_vaed_ours_wan22.py`, its
loader `load_vae` / `ours_decode` there, and `infer/examples/wan2.2/predict_ti2v_single.py`, `infer/run_t2v.sh`).
What it is:

* A decoder only (no encoder, no attention), adapted from diffusers' LTX-Video VAE decoder: `conv_in` (3-D conv,
  latent -> widest channels), `mid_block` (ResNet blocks), `up_blocks` (each: a ResNet `conv_in` when the width
  changes, an optional 3-D upsampler, ResNet blocks), then, for `patch_size` 4, two 2-D pixel-shuffle upsamplers
  (`upsampler2d_1`, `upsampler2d_2`, each RMS norm + SiLU + conv 3x3 + pixel_shuffle(2)), a channel RMS norm, SiLU and
  `conv_out` to RGB. The Wan2.2 VAE's encoder (and its un-patchify) is not part of it: the Wan2.2 latents (z 48) go
  in, frames in [-1, 1] (not clamped) come out, `4 (T - 1) + 1` frames of `16 h x 16 w` for the Wan2.2 settings.
* Its new block: a depthwise-separable 3-D conv (`decoder_is_dw_conv`, per block, mid block last in the config's
  order): a depthwise k x k x k conv (groups = channels) then a pointwise 1x1x1 conv, the time axis padded by
  repeating the first and last frames (k - 1) / 2 times each, whatever `decoder_causal` says. The plain 3-D conv
  pads time the same way when not causal (`decoder_causal` false, the default), by k - 1 copies of the first frame
  when causal; height and width get zero padding k // 2.
* ResNet block: RMS norm over channels (eps 1e-8, no weights), SiLU (ReLU instead in the up blocks that upsample),
  conv1, RMS norm, SiLU, conv2, plus the input (LayerNorm over channels with weights, eps `resnet_norm_eps`, then a
  kernel-1 conv when the width changes).
* 3-D upsampler (stride 2, 2, 2, or 1, 2, 2 with `decoder_spatio_only`): conv 3x3x3 to C x 8 channels, channel
  index ((c s + dy) s + dx) st + j -> frame t st + j, pixel (y s + dy, x s + dx); the first st - 1 frames dropped
  (kept with `is_video_dc_ae`).
* Compression: spatial `spatial_compression_ratio`, else `patch_size * 2**sum(spatio_temporal_scaling)`; temporal
  `temporal_compression_ratio`, else `patch_size_t * 2**(upsamplers that also upsample time)`.
* Folder: `config.json` (its constructor's keys, plus `scale_factor_spatial` / `scale_factor_temporal` that their
  loader reads) and `diffusion_pytorch_model.safetensors` whose keys are the decoder's own (`conv_in.conv.weight`,
  no `decoder.` prefix: `load_vae` keeps the keys the decoder has and loads them strictly). Their run scripts pass
  `--vae_model ./models/vae/wan22_v1_tiling_16_12 --t_block_size 16 --t_stride 12`: decode in overlapping
  windows of 16 frames every 12 (`_temporal_tiled_decode`: windows of 16 / 4 + 1 latent frames every 3, the last
  frame of every window but the first dropped, 4 frames blended linearly), no spatial tiling by default (their
  `tiled_decode`: tiles of 512 px every 448, `use_tiling`).
* Latents: `ours_decode` un-normalizes with the Wan2.2 VAE's `latents_mean` / `latents_std` (z * std + mean, as
  diffusers' Wan pipelines do) before `decode`, then `(frames / 2 + 0.5).clamp(0, 1)`.

Not supported here (refused in one line): `timestep_conditioning` and `decoder_inject_noise` (their decode passes no
timestep; noise injection draws fresh noise). The training-time `aligned_feature_projection_*` heads are not part of
the decoder and are ignored. vsagen keeps the stock Wan2.2 VAE for encoding (image conditioning) and its config
(latents mean / std, z_dim, scale factors), and routes its `decode` here (`vsagen.decode.decoder_choice`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import BadInput

WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
CONFIG_NAME = "config.json"
_RMS_EPS = 1e-8  # every RMS norm of the decoder (theirs: RMSNorm(..., eps=1e-8) and the final rsqrt(var + 1e-8))


@dataclass(frozen=True)
class LightVaeConfig:
    """The constructor keys of `AutoencoderKLTurboVAED` that shape its decoder (config.json; other keys ignored).
    Lists are in the config's order: `decoder_*` per block from the highest resolution, the mid block last."""

    latent_channels: int = 128
    out_channels: int = 3
    decoder_block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    decoder_layers_per_block: tuple[int, ...] = (4, 3, 3, 3, 4)
    spatio_temporal_scaling: tuple[bool, ...] = (True, True, True, False)
    decoder_spatio_temporal_scaling: tuple[bool, ...] = (True, True, True, False)
    decoder_inject_noise: tuple[bool, ...] = (False, False, False, False, False)
    upsample_factor: tuple[int, ...] = (1, 1, 1, 1)
    timestep_conditioning: bool = False
    patch_size: int = 4
    patch_size_t: int = 1
    resnet_norm_eps: float = 1e-6
    decoder_causal: bool = False
    spatial_compression_ratio: int | None = None
    temporal_compression_ratio: int | None = None
    decoder_is_dw_conv: tuple[bool, ...] = (False, False, False, False, False)
    decoder_dw_kernel_size: int = 3
    decoder_spatio_only: tuple[bool, ...] = (False, False, False, False)
    is_video_dc_ae: bool = False

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> "LightVaeConfig":
        """The config of a config.json's dict (`where` names it in errors).

        Raises:
            BadInput: a value of the wrong kind, or an option vsagen does not run (timestep conditioning, noise
                injection, a patch size other than 1, 2 or 4).
        """
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in data and data[f.name] is not None:
                value = data[f.name]
                kwargs[f.name] = tuple(value) if isinstance(value, list) else value
        try:
            cfg = cls(**kwargs)
            spatial, temporal = cfg.spatial_ratio, cfg.temporal_ratio
        except TypeError as e:
            raise BadInput(f"{where}: not a light VAE decoder config ({e})") from None
        if cfg.timestep_conditioning or any(cfg.decoder_inject_noise):
            raise BadInput(f"{where}: timestep_conditioning / decoder_inject_noise are not supported by vsagen's "
                           "light VAE decoder")
        if cfg.patch_size not in (1, 2, 4) or spatial < 1 or temporal < 1:
            raise BadInput(f"{where}: patch_size must be 1, 2 or 4, got {cfg.patch_size}")
        return cfg

    @property
    def spatial_ratio(self) -> int:
        """Pixels per latent along height and width (`spatial_compression_ratio`, else their formula)."""
        if self.spatial_compression_ratio is not None:
            return int(self.spatial_compression_ratio)
        return self.patch_size * 2 ** sum(bool(s) for s in self.spatio_temporal_scaling)

    @property
    def temporal_ratio(self) -> int:
        """Frames per latent frame after the first (`temporal_compression_ratio`, else their formula)."""
        if self.temporal_compression_ratio is not None:
            return int(self.temporal_compression_ratio)
        ups = sum(bool(s) and not bool(o) for s, o in zip(self.decoder_spatio_temporal_scaling,
                                                          self.decoder_spatio_only))
        return self.patch_size_t * 2 ** ups


def channel_rms(x: torch.Tensor, eps: float = _RMS_EPS) -> torch.Tensor:
    """x / sqrt(mean over channels of x^2 + eps), no weights. x: (B, C, T, H, W); returns x's shape and dtype.
    The mean is taken in float32 for half inputs (as diffusers' RMSNorm does), else in x's dtype."""
    acc = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return (x * torch.rsqrt(acc.pow(2).mean(1, keepdim=True) + eps)).to(x.dtype)


def _pad_time(x: torch.Tensor, kt: int, causal: bool) -> torch.Tensor:
    """Pad the time axis of (B, C, T, H, W) for a kernel of kt frames by repeating edge frames: kt - 1 copies of the
    first frame when `causal`, else (kt - 1) // 2 of the first and of the last."""
    if kt <= 1:
        return x
    if causal:
        return torch.cat([x[:, :, :1].expand(-1, -1, kt - 1, -1, -1), x], dim=2)
    n = (kt - 1) // 2
    return torch.cat([x[:, :, :1].expand(-1, -1, n, -1, -1), x, x[:, :, -1:].expand(-1, -1, n, -1, -1)], dim=2)


class EdgeConv3d(nn.Module):
    """A 3-D conv (kernel k^3, stride 1) with replicated-edge time padding and zero height / width padding
    (their `TurboVAEDCausalConv3d`). (B, Cin, T, H, W) -> (B, Cout, T, H, W). Weights: `conv.weight`, `conv.bias`."""

    def __init__(self, cin: int, cout: int, kernel: int = 3, causal: bool = False) -> None:
        super().__init__()
        self.kernel, self.causal = kernel, causal
        self.conv = nn.Conv3d(cin, cout, kernel, padding=(0, kernel // 2, kernel // 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(_pad_time(x, self.kernel, self.causal))


class SeparableConv3d(nn.Module):
    """Depthwise-separable 3-D conv (their `TurboVAEDCausalDepthwiseSeperableConv3d`): a depthwise k^3 conv (one
    filter per channel, zero height / width padding k // 2, time padded by (k - 1) // 2 copies of the first and of the
    last frame, causal or not) then a pointwise 1x1x1 conv. (B, Cin, T, H, W) -> (B, Cout, T, H, W).
    Weights: `depthwise_conv.{weight,bias}` (Cin, 1, k, k, k), `pointwise_conv.{weight,bias}` (Cout, Cin, 1, 1, 1)."""

    def __init__(self, cin: int, cout: int, kernel: int = 3, causal: bool = False) -> None:
        super().__init__()
        self.kernel = kernel
        self.depthwise_conv = nn.Conv3d(cin, cin, kernel, groups=cin, padding=(0, kernel // 2, kernel // 2))
        self.pointwise_conv = nn.Conv3d(cin, cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise_conv(self.depthwise_conv(_pad_time(x, self.kernel, False)))


class ResBlock(nn.Module):
    """Their `TurboVAEDResnetBlock3d` (no noise, no timestep): x -> conv2(SiLU(rms(conv1(act(rms(x)))))) + skip(x),
    act = ReLU when `relu_first` (up blocks that upsample) else SiLU; skip = conv_shortcut(LayerNorm_C(x)) when the
    width changes, else x. Convs: `SeparableConv3d` (`separable`, kernel `kernel`) or `EdgeConv3d` (kernel 3)."""

    def __init__(self, cin: int, cout: int, *, eps: float, causal: bool, separable: bool, kernel: int,
                 relu_first: bool = False) -> None:
        super().__init__()
        conv = SeparableConv3d if separable else EdgeConv3d
        k = kernel if separable else 3
        self.relu_first = relu_first
        self.conv1 = conv(cin, cout, k, causal)
        self.conv2 = conv(cout, cout, k, causal)
        self.norm3 = self.conv_shortcut = None
        if cin != cout:
            self.norm3 = nn.LayerNorm(cin, eps=eps, elementwise_affine=True, bias=True)
            self.conv_shortcut = conv(cin, cout, 1, causal)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = channel_rms(x)
        h = self.conv1(F.relu(h) if self.relu_first else F.silu(h))
        h = self.conv2(F.silu(channel_rms(h)))
        if self.norm3 is not None:
            x = self.conv_shortcut(self.norm3(x.movedim(1, -1)).movedim(-1, 1))
        return h + x


class Upsampler3d(nn.Module):
    """Their `TurboVAEDUpsampler3d`: conv 3x3x3 to C x st x s x s / f channels, then channel ((c s + dy) s + dx) st + j
    -> frame t st + j, pixel (y s + dy, x s + dx); the first st - 1 frames dropped unless `keep_first`.
    (B, C, T, H, W) -> (B, C / f, T st - (st - 1), H s, W s). Weights: `conv.conv.{weight,bias}`."""

    def __init__(self, cin: int, stride: tuple[int, int, int], causal: bool, factor: int = 1,
                 keep_first: bool = False) -> None:
        super().__init__()
        self.stride, self.keep_first = stride, keep_first
        self.conv = EdgeConv3d(cin, cin * stride[0] * stride[1] * stride[2] // factor, 3, causal)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        st, s = self.stride[0], self.stride[1]
        h = self.conv(x)
        b, c, t, hh, ww = h.shape
        h = h.reshape(b, c // (s * s * st), s, s, st, t, hh, ww).permute(0, 1, 5, 4, 6, 2, 7, 3)
        h = h.reshape(b, c // (s * s * st), t * st, hh * s, ww * s)
        return h if self.keep_first else h[:, :, st - 1:]


class MidBlock(nn.Module):
    """Their `TurboVAEDMidBlock3d`: `resnets` in turn, width unchanged."""

    def __init__(self, channels: int, layers: int, **res: Any) -> None:
        super().__init__()
        self.resnets = nn.ModuleList([ResBlock(channels, channels, **res) for _ in range(layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for r in self.resnets:
            x = r(x)
        return x


class UpBlock(nn.Module):
    """Their `TurboVAEDUpBlock3d`: `conv_in` (a ResBlock when the width changes), `upsamplers` (one `Upsampler3d`
    when the block scales), then `resnets` (their first activation ReLU when the block scales)."""

    def __init__(self, cin: int, cout: int, layers: int, *, scale: bool, spatial_only: bool, factor: int,
                 keep_first: bool, **res: Any) -> None:
        super().__init__()
        self.conv_in = ResBlock(cin, cout, **res) if cin != cout else None
        self.upsamplers = None
        if scale:
            stride = (1, 2, 2) if spatial_only else (2, 2, 2)
            self.upsamplers = nn.ModuleList([Upsampler3d(cout * factor, stride, res["causal"], factor, keep_first)])
        self.resnets = nn.ModuleList([ResBlock(cout, cout, relu_first=scale, **res) for _ in range(layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.conv_in is not None:
            x = self.conv_in(x)
        for up in self.upsamplers or ():
            x = up(x)
        for r in self.resnets:
            x = r(x)
        return x


class PixelShuffle2d(nn.Module):
    """Their `TurboVAEDConv2d(Split)Upsampler` with stride 2: per frame, conv 3x3 (C -> C, zero padding 1) then
    pixel_shuffle(2). (B, C, T, H, W) -> (B, C / 4, T, 2H, 2W). Weights: `conv.{weight,bias}`."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        y = F.pixel_shuffle(self.conv(x.transpose(1, 2).reshape(b * t, c, h, w)), 2)
        return y.reshape(b, t, c // 4, 2 * h, 2 * w).transpose(1, 2)


class LightVaeDecoder(nn.Module):
    """`AutoencoderKLTurboVAED`'s decoder: its state dict has the keys of their safetensors file.

    forward(z): z (B, latent_channels, T, h, w) un-normalized latents (z * latents_std + latents_mean), any float
    dtype -> frames (B, out_channels, (T - 1) * temporal_ratio + 1, h * spatial_ratio, w * spatial_ratio) in about
    [-1, 1], not clamped, in z's dtype. `decode` adds their temporal / spatial tiling.
    """

    def __init__(self, config: LightVaeConfig) -> None:
        super().__init__()
        c = self.config = config
        channels = tuple(reversed(c.decoder_block_out_channels))
        layers = tuple(reversed(c.decoder_layers_per_block))
        scaling = tuple(reversed(c.decoder_spatio_temporal_scaling))
        factors = tuple(reversed(c.upsample_factor))
        separable = tuple(reversed(c.decoder_is_dw_conv))
        spatial_only = tuple(reversed(c.decoder_spatio_only))
        res = dict(eps=c.resnet_norm_eps, causal=c.decoder_causal, kernel=c.decoder_dw_kernel_size)
        width = channels[0]
        self.conv_in = EdgeConv3d(c.latent_channels, width, 3, c.decoder_causal)
        self.mid_block = MidBlock(width, layers[0], separable=separable[0], **res)
        self.up_blocks = nn.ModuleList()
        for i, out in enumerate(channels):
            cin, width = width // factors[i], out // factors[i]
            self.up_blocks.append(UpBlock(cin, width, layers[i + 1], scale=scaling[i], spatial_only=spatial_only[i],
                                          factor=factors[i], keep_first=c.is_video_dc_ae, separable=separable[i + 1],
                                          **res))
        self.upsampler2d_1 = self.upsampler2d_2 = None
        if c.patch_size >= 2:
            self.upsampler2d_1 = PixelShuffle2d(width)
            width //= 4
        if c.patch_size >= 4:
            self.upsampler2d_2 = PixelShuffle2d(width)
            width //= 4
        self.conv_out = EdgeConv3d(width, c.out_channels, 3, c.decoder_causal)
        # their decode's tiling (attributes, as theirs): temporal windows of frames, spatial tiles of pixels
        self.use_framewise_decoding = False
        self.use_tiling = False
        self.follow_vae_tiling = True  # attached (`attach`): tile spatially when the stock VAE's tiling is on
        self.tile_sample_min_num_frames, self.tile_sample_stride_num_frames = 16, 8
        self.tile_sample_min_height = self.tile_sample_min_width = 512
        self.tile_sample_stride_height = self.tile_sample_stride_width = 448

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.mid_block(self.conv_in(z))
        for block in self.up_blocks:
            h = block(h)
        for up in (self.upsampler2d_1, self.upsampler2d_2):
            if up is not None:
                h = up(F.silu(channel_rms(h)))
        if self.config.patch_size == 1:
            h = channel_rms(h)
        else:  # theirs: the mean of squares in the activations' own dtype
            h = h * torch.rsqrt(h.pow(2).mean(1, keepdim=True) + _RMS_EPS)
        return self.conv_out(F.silu(h))

    def set_temporal_tiling(self, frames: int | None, stride: int | None = None) -> None:
        """Decode in windows of `frames` frames every `stride` (their `--t_block_size` / `--t_stride`; stride
        defaults to `frames`); None turns it off."""
        self.use_framewise_decoding = bool(frames)
        if frames:
            self.tile_sample_min_num_frames = int(frames)
            self.tile_sample_stride_num_frames = int(stride or frames)

    @torch.no_grad()
    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Their `_decode`: temporal windows when `use_framewise_decoding` and z has more latent frames than a
        window, else spatial tiles when `use_tiling` and z is wider or taller than a tile, else `forward`.
        z: (B, latent_channels, T, h, w); returns `forward`'s frames (not clamped)."""
        return torch.cat(list(self.decode_chunks(z)), dim=2)

    @torch.no_grad()
    def decode_chunks(self, z: torch.Tensor) -> Iterator[torch.Tensor]:
        """`decode` as a stream: with temporal windows, each window's final frames as soon as it is decoded and
        blended (`vsagen.decode.stream`), else the whole decode as one chunk; concatenated, `decode`'s frames."""
        t_min = self.tile_sample_min_num_frames // self.config.temporal_ratio
        if self.use_framewise_decoding and z.shape[2] > t_min:
            yield from self._temporal_tiled(z)
        else:
            yield self._spatial_or_whole(z)

    def _spatial_or_whole(self, z: torch.Tensor) -> torch.Tensor:
        r = self.config.spatial_ratio
        if self.use_tiling and (z.shape[-1] > self.tile_sample_min_width // r
                                or z.shape[-2] > self.tile_sample_min_height // r):
            return self._spatial_tiled(z)
        return self(z)

    def _temporal_tiled(self, z: torch.Tensor) -> Iterator[torch.Tensor]:
        """Their `_temporal_tiled_decode`, window by window: windows of min/ratio + 1 latent frames every
        stride/ratio, the last frame of each window after the first dropped, each window's first (min - stride)
        frames blended linearly (in place, as theirs) with the previous window's last ones, stride frames kept per
        window (stride + 1 for the first), (T - 1) * ratio + 1 frames in all. A window's kept frames are final once
        it is blended, so each is yielded then."""
        r = self.config.temporal_ratio
        n = z.shape[2]
        t_min, t_stride = self.tile_sample_min_num_frames // r, self.tile_sample_stride_num_frames // r
        blend, keep = self.tile_sample_min_num_frames - self.tile_sample_stride_num_frames, \
            self.tile_sample_stride_num_frames
        left, prev = (n - 1) * r + 1, None
        for i in range(0, n, t_stride):
            decoded = self._spatial_or_whole(z[:, :, i: i + t_min + 1])
            tile = decoded[:, :, :-1] if i > 0 else decoded
            if prev is not None:
                _blend(prev, tile, blend, dim=2)
            out = tile[:, :, : min(keep if prev is not None else keep + 1, left)]
            left -= out.shape[2]
            yield out
            prev = tile
            if i + t_stride + 1 == n or left == 0:
                break

    def _spatial_tiled(self, z: torch.Tensor) -> torch.Tensor:
        """Their `tiled_decode`: latent tiles of min/ratio every stride/ratio, blended linearly over min - stride
        pixels with the tile above and the one to the left (in place), stride pixels kept per tile."""
        r = self.config.spatial_ratio
        h, w = z.shape[-2], z.shape[-1]
        min_h, min_w = self.tile_sample_min_height // r, self.tile_sample_min_width // r
        step_h, step_w = self.tile_sample_stride_height // r, self.tile_sample_stride_width // r
        blend_h = self.tile_sample_min_height - self.tile_sample_stride_height
        blend_w = self.tile_sample_min_width - self.tile_sample_stride_width
        rows = [[self(z[:, :, :, i: i + min_h, j: j + min_w]) for j in range(0, w, step_w)]
                for i in range(0, h, step_h)]
        out_rows = []
        for i, row in enumerate(rows):
            kept = []
            for j, tile in enumerate(row):
                if i > 0:
                    _blend(rows[i - 1][j], tile, blend_h, dim=3)
                if j > 0:
                    _blend(row[j - 1], tile, blend_w, dim=4)
                kept.append(tile[:, :, :, : self.tile_sample_stride_height, : self.tile_sample_stride_width])
            out_rows.append(torch.cat(kept, dim=4))
        return torch.cat(out_rows, dim=3)[:, :, :, : h * r, : w * r]


def _blend(a: torch.Tensor, b: torch.Tensor, extent: int, dim: int) -> None:
    """In place: b's first e entries along `dim` become a's last e weighted (1 - x / e) plus b's weighted x / e,
    e = min(a's size, b's size, extent) (their blend_t / blend_v / blend_h)."""
    e = min(a.shape[dim], b.shape[dim], extent)
    for x in range(e):
        b.select(dim, x).copy_(a.select(dim, a.shape[dim] - e + x) * (1 - x / e) + b.select(dim, x) * (x / e))


# ---- the folder (config.json + diffusion_pytorch_model.safetensors) ------------------------------------------------

def read_folder(folder: Path, where: str) -> LightVaeDecoder:
    """The decoder of an `AutoencoderKLTurboVAED` folder, float32 on the CPU, eval mode: config.json and the
    safetensors file (weights only, never pickle; keys with or without a `decoder.` prefix), every tensor of the
    decoder present with its shape. `where` starts the error lines (e.g. "--model amd/HummingbirdXT").

    Raises:
        BadInput: a missing or damaged file, or weights that do not fit the config (one line naming it).
    """
    from safetensors.torch import load_file

    from ..models.checkpoint_layouts import safetensors_problem

    config_file, weights = folder / CONFIG_NAME, folder / WEIGHTS_NAME
    for f in (config_file, weights):
        if not f.is_file():
            raise BadInput(f"{where}: light VAE decoder folder {folder} has no {f.name}")
    try:
        data = json.loads(config_file.read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        raise BadInput(f"{where}: {config_file} is damaged ({str(e).splitlines()[0]})") from None
    problem = safetensors_problem(weights)
    if problem is not None:
        raise BadInput(f"{where}: {weights} is damaged ({problem}); download it again")
    decoder = LightVaeDecoder(LightVaeConfig.from_dict(data, f"{where}: {config_file}")).eval()
    try:
        state = load_file(str(weights))
    except Exception as e:  # noqa: BLE001 - any failure to read it is the one line below
        raise BadInput(f"{where}: {weights} is damaged ({str(e).splitlines()[0]}); download it again") from None
    state = {k.removeprefix("decoder."): v for k, v in state.items()}
    own = decoder.state_dict()
    missing = [k for k in own if k not in state]
    if missing:
        raise BadInput(f"{where}: {weights} lacks {missing[0]} ({len(missing)} of the decoder's {len(own)} tensors "
                       "missing): not this config's decoder")
    for k, v in own.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise BadInput(f"{where}: {weights}: {k} has shape {tuple(state[k].shape)}, the config's decoder needs "
                           f"{tuple(v.shape)}")
    decoder.load_state_dict({k: state[k] for k in own})
    return decoder


def save_folder(decoder: LightVaeDecoder, folder: Path) -> None:
    """Write `decoder` as their loader reads it: config.json (the constructor keys, `scale_factor_spatial` /
    `scale_factor_temporal`, `_class_name` "AutoencoderKLTurboVAED") and the safetensors file (decoder keys)."""
    from dataclasses import asdict

    from safetensors.torch import save_file

    c = decoder.config
    folder.mkdir(parents=True, exist_ok=True)
    data = {"_class_name": "AutoencoderKLTurboVAED", **{k: list(v) if isinstance(v, tuple) else v
                                                         for k, v in asdict(c).items()},
            "scale_factor_spatial": c.spatial_ratio, "scale_factor_temporal": c.temporal_ratio}
    (folder / CONFIG_NAME).write_text(json.dumps(data, indent=2) + "\n")
    save_file({k: v.detach().contiguous().cpu() for k, v in decoder.state_dict().items()}, str(folder / WEIGHTS_NAME))
