"""The TAEHV family's decoder (madebyollin/taehv, MIT: `taew2_1`, `taew2_2`; LightX2V's `lighttaew2_1` / `_2` share it),
written from the facts of its source, and its decode as a stream of frames.

Sources read: madebyollin/taehv @1f14a56 `taehv.py` (the TAEHV class, its memory blocks, time growth, the
sequential and parallel ways of running them, `decode_video`, `patch_tgrow_layers`), its README ("TAEHV does not use
any latent scales / shifts") and `examples/TAEW2.1_T2I_Demo.ipynb` (its diffusers wrapper: latents mean 0 and std 1,
frames * 2 - 1); LightX2V @f8aee98 `lightx2v/models/video_encoders/hf/tae.py`, `.../hf/wan/vae_tiny.py` and
`lightx2v/pipeline.py` (how `lighttaew2_*` are loaded and fed). What the decoder is:

* A 2-D convolutional network run on every latent frame. Its "memory blocks" are what makes it a video decoder: each
  sees, beside its input frame, the input it had one frame earlier (zeros before the first frame). So frame t's
  output depends on frames <= t only: causal, and it streams.
* Its layers, by the index that prefixes their keys in the published files (`decoder.N.`): 0 squashes the latents,
  tanh(x / 3) * 3; 1 conv 3x3 (bias) latent channels -> w0; 2 ReLU; then three stages s = 0, 1, 2 of: three memory
  blocks of width w_s, a nearest-neighbour 2x upsampling, a time growth, a conv 3x3 without bias w_s -> w_{s+1}
  (indices 3-8, 9-14, 15-20); 21 ReLU; 22 conv 3x3 (bias) w3 -> 3 p^2. Published widths (256, 128, 64, 64); vsagen
  reads them from the weights' shapes, so a tiny model's narrower one loads the same way.
* A memory block: three convs 3x3 with bias and ReLUs between them on [input, past input] (2w channels in), plus the
  input, then ReLU (its 1x1 skip conv exists only where the widths differ, never in this decoder).
* A time growth of stride s: a 1x1 conv without bias from C to s C channels whose channel group j becomes frame
  t s + j. The three strides are 1, 2, 2 (their `decoder_time_upscale` default): 4 frames per latent frame. A file
  whose growth weight has more rows than the stride needs keeps its last rows (their loader's rule).
* The frames: a pixel shuffle by the patch p (2 for `taew2_2`, the Wan2.2-5B VAE's 2x2 patch; 1 for `taew2_1`),
  clamped to [0, 1] (diffusers' [-1, 1] is 2 x - 1), and the video's first t_upscale - 1 = 3 frames dropped: T
  latent frames give 4 T - 3 frames, as the Wan VAEs' 1 + 4 (T - 1). Spatially 8 p pixels per latent.
* The latents it takes: `taew2_*` the DiT's latents as they are (diffusers' normalised ones: no mean / std);
  LightX2V's `lighttaew2_*` un-normalised ones, z * std + mean (LightX2V sets `need_scaled` for any `lighttae`
  file with Wan models and its tiny VAE then un-normalises).
* Files: `.pth` (torch.save of the state dict: `encoder.*` and `decoder.*`) and `.safetensors` with the same keys;
  vsagen reads `decoder.*` only, `.pth` through torch's weights-only unpickler.

Not here: the encoder (vsagen encodes with the stock VAE), the `_super` variants (another decoder: refused in one
line), their previews without time or space upsampling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import BadInput

TIME_STRIDES = (1, 2, 2)  # the three time growths (their decoder_time_upscale default): 4 frames per latent frame
SPATIAL_UPSCALE = 8  # three 2x upsamplings, before the pixel shuffle by the patch
PUBLISHED_WIDTHS = (256, 128, 64, 64)  # taew2_1 / taew2_2 / lighttaew2_* (their base decoder)
_FIRST, _LAST = 1, 22  # indices of the first and last conv (latents in, pixels out)
_STAGE_CONVS = (8, 14, 20)  # the conv that ends each stage (its rows: the next width)


@dataclass(frozen=True)
class TinyVaeConfig:
    """The shape of a TAEHV decoder.

    Attributes:
        latent_channels: channels of the latents (16: Wan2.1 VAE, 48: Wan2.2-5B VAE).
        patch_size: pixel shuffle of the output (1 or 2).
        widths: channels of the three stages and of the last conv's input (published: 256, 128, 64, 64).
        raw_latents: it takes un-normalised latents (z * std + mean; LightX2V's `lighttaew2_*`), not the DiT's.
    """

    latent_channels: int = 16
    patch_size: int = 1
    widths: tuple[int, int, int, int] = PUBLISHED_WIDTHS
    raw_latents: bool = False

    @property
    def temporal_ratio(self) -> int:
        """Frames per latent frame (the product of the time strides)."""
        return math.prod(TIME_STRIDES)

    @property
    def spatial_ratio(self) -> int:
        """Pixels per latent along height and width."""
        return SPATIAL_UPSCALE * self.patch_size

    @property
    def frames_to_trim(self) -> int:
        """Leading frames of the whole video dropped (t_upscale - 1: the causal start, as the Wan VAEs' first latent
        frame gives one frame)."""
        return self.temporal_ratio - 1


class Squash(nn.Module):
    """tanh(x / 3) * 3: latents softly limited to (-3, 3)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x / 3) * 3


class MemoryBlock(nn.Module):
    """relu(convs([x, past]) + x) for frames x (N, w, H, W) and each one's previous frame `past` (same shape)."""

    def __init__(self, width: int):
        super().__init__()
        self.conv = nn.Sequential(_conv3(2 * width, width), nn.ReLU(), _conv3(width, width), nn.ReLU(),
                                  _conv3(width, width))

    def forward(self, x: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(torch.cat([x, past], dim=1)) + x)


class TimeGrow(nn.Module):
    """(N, C, H, W) -> (N * stride, C, H, W): a 1x1 conv to stride * C channels, group j of frame n becoming frame
    n * stride + j."""

    def __init__(self, width: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(width, width * stride, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        return self.conv(x).reshape(n * self.stride, c, h, w)


def _conv3(n_in: int, n_out: int, bias: bool = True) -> nn.Conv2d:
    return nn.Conv2d(n_in, n_out, 3, padding=1, bias=bias)


def _layers(c: TinyVaeConfig) -> list[nn.Module]:
    """The decoder's layers in the published files' order (module docstring)."""
    layers: list[nn.Module] = [Squash(), _conv3(c.latent_channels, c.widths[0]), nn.ReLU()]
    for stage, stride in enumerate(TIME_STRIDES):
        w = c.widths[stage]
        layers += [MemoryBlock(w), MemoryBlock(w), MemoryBlock(w), nn.Upsample(scale_factor=2), TimeGrow(w, stride),
                   _conv3(w, c.widths[stage + 1], bias=False)]
    return layers + [nn.ReLU(), _conv3(c.widths[3], 3 * c.patch_size ** 2)]


class TinyVaeDecoder(nn.Module):
    """A TAEHV decoder (module docstring): latents (B, C, T, h, w) -> frames (B, 3, 4 T - 3, 8 p h, 8 p w) in [0, 1].

    `decoder` holds the layers under the published keys; `window` is how many latent frames `decode_chunks` runs at
    once by default (1: each latent frame's frames as soon as they exist); `origin` says where its weights came from
    (for the run's JSON)."""

    def __init__(self, config: TinyVaeConfig):
        super().__init__()
        self.config = config
        self.decoder = nn.Sequential(*_layers(config))
        self.window = 1
        self.origin = "random weights"

    def decode_chunks(self, z: torch.Tensor, window: int | None = None) -> Iterator[torch.Tensor]:
        """Decode latents as a stream: z (B, latent_channels, T, h, w), in this decoder's convention (`raw_latents`)
        and dtype -> chunks (B, 3, f, 8 p h, 8 p w) in [0, 1], `window` latent frames at a time (default
        `self.window`): 4 frames per latent frame, the video's first 3 dropped (the first window's chunk is shorter,
        empty chunks are not given). Concatenated along frames they are `decode(z)`, whatever the window. Call it
        under `torch.inference_mode()` (or no_grad).

        Raises:
            ValueError: z is not 5-D with `latent_channels` channels, or the window is below 1.
        """
        if z.ndim != 5 or z.shape[1] != self.config.latent_channels:
            raise ValueError(f"latents of shape (B, {self.config.latent_channels}, T, h, w) expected, got "
                             f"{tuple(z.shape)}")
        step = self.window if window is None else window
        if step < 1:
            raise ValueError(f"window must be at least 1 latent frame, got {step}")
        memory: dict[int, torch.Tensor] = {}  # each memory block's input at the last frame decoded
        trim = self.config.frames_to_trim
        frames_first = z.transpose(1, 2)  # (B, T, C, h, w)
        for start in range(0, z.shape[2], step):
            frames = self._run(frames_first[:, start:start + step], memory)  # (B, f, 3, H, W)
            drop = min(trim, frames.shape[1])
            trim -= drop
            if frames.shape[1] > drop:
                yield frames[:, drop:].transpose(1, 2)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """The whole video at once: `decode_chunks(z)` with every latent frame in one window, (B, 3, 4 T - 3, H, W)."""
        return torch.cat(list(self.decode_chunks(z, window=max(1, z.shape[2]))), dim=2)

    def _run(self, x: torch.Tensor, memory: dict[int, torch.Tensor]) -> torch.Tensor:
        """Frames (B, t, C, h, w) that follow those `memory` saw -> (B, 4 t, 3, H, W) in [0, 1], `memory` updated."""
        batch = x.shape[0]
        h = x.flatten(0, 1)
        for i, layer in enumerate(self.decoder):
            if isinstance(layer, MemoryBlock):
                seq = h.unflatten(0, (batch, -1))
                before = memory.get(i)
                before = torch.zeros_like(seq[:, :1]) if before is None else before
                past = torch.cat([before, seq[:, :-1]], dim=1).flatten(0, 1)
                memory[i] = seq[:, -1:].clone()
                h = layer(h, past)
            else:
                h = layer(h)
        if self.config.patch_size > 1:
            h = F.pixel_shuffle(h, self.config.patch_size)
        return h.clamp(0.0, 1.0).unflatten(0, (batch, -1))


# ---- weights -----------------------------------------------------------------------------------------------------

def config_of(state: dict[str, torch.Tensor], where: str, raw_latents: bool = False) -> TinyVaeConfig:
    """The decoder's shape read from its weights (`decoder.*` keys): latent channels and w0 from the first conv,
    the stage widths from the convs ending each stage, the patch from the last conv's 3 p^2 rows.

    Raises:
        BadInput: one line starting with `where`: no TAEHV decoder in the file, its `_super` variant, or a last conv
            that is no 3 p^2 rows.
    """
    if "decoder.0.weight" in state:  # the super variant starts with a 1x1 conv where the base decoder squashes
        raise BadInput(f"{where}: a TAEHV 'super' decoder (e.g. taew2_2_super), which vsagen does not run; use the "
                       "base weights (taew2_1, taew2_2, lighttaew2_1, lighttaew2_2)")
    keys = [f"decoder.{i}.weight" for i in (_FIRST, *_STAGE_CONVS, _LAST)]
    shapes = [tuple(state[k].shape) if k in state else None for k in keys]
    if any(s is None or len(s) != 4 or s[2:] != (3, 3) for s in shapes):
        missing = next(k for k, s in zip(keys, shapes) if s is None or len(s) != 4 or s[2:] != (3, 3))
        raise BadInput(f"{where}: not a TAEHV decoder ({missing} missing or not a 3x3 conv); give a taew2_1, taew2_2 "
                       "or lighttaew2_* file")
    first, *stages, last = shapes
    patch = math.isqrt(last[0] // 3)
    if 3 * patch * patch != last[0] or last[1] != stages[-1][0]:
        raise BadInput(f"{where}: not a TAEHV decoder (its last conv {last[:2]} is not 3 p^2 pixels from "
                       f"{stages[-1][0]} channels)")
    widths = (first[0], *(s[0] for s in stages))
    return TinyVaeConfig(latent_channels=first[1], patch_size=patch, widths=widths, raw_latents=raw_latents)


def from_state_dict(state: dict[str, torch.Tensor], where: str, raw_latents: bool = False) -> TinyVaeDecoder:
    """A float32 CPU decoder in eval mode from a state dict's `decoder.*` tensors (others, e.g. the encoder's,
    ignored), checked by `decoder_tensors`.

    Raises:
        BadInput: see `decoder_tensors`.
    """
    ours = {k: v for k, v in state.items() if k.startswith("decoder.")}
    decoder = TinyVaeDecoder(config_of(ours, where, raw_latents))
    decoder.load_state_dict({k: v.float() for k, v in decoder_tensors(ours, decoder, where).items()})
    return decoder.eval()


def check_state(state: dict[str, torch.Tensor], where: str) -> TinyVaeConfig:
    """What `from_state_dict` checks, without building or loading anything: `state` may hold meta tensors (a
    safetensors header's shapes and dtypes, read before anything loads). The decoder's shape (`config_of`).

    Raises:
        BadInput: see `decoder_tensors`.
    """
    ours = {k: v for k, v in state.items() if k.startswith("decoder.")}
    config = config_of(ours, where)
    with torch.device("meta"):
        decoder_tensors(ours, TinyVaeDecoder(config), where)
    return config


def decoder_tensors(ours: dict[str, torch.Tensor], decoder: TinyVaeDecoder, where: str) -> dict[str, torch.Tensor]:
    """The tensors of `ours` (a file's `decoder.*` keys) that load into `decoder` (built by `config_of` from them):
    a time growth's extra rows dropped (the last rows kept), every other tensor as it is.

    Raises:
        BadInput: one line starting with `where`: a tensor missing, unexpected, of another shape, or not floating
            point (an integer tensor is no weight this decoder can use as it is).
    """
    own = decoder.state_dict()
    ours = dict(ours)
    for i, layer in enumerate(decoder.decoder):
        key = f"decoder.{i}.conv.weight"
        if isinstance(layer, TimeGrow) and key in ours and ours[key].shape[0] > own[key].shape[0]:
            ours[key] = ours[key][-own[key].shape[0]:]
    missing, extra = [k for k in own if k not in ours], [k for k in ours if k not in own]
    if missing or extra:
        what = f"lacks {missing[0]}" if missing else f"has {extra[0]}, which the decoder does not"
        raise BadInput(f"{where}: not a TAEHV decoder: it {what}")
    for k, v in own.items():
        if tuple(ours[k].shape) != tuple(v.shape):
            raise BadInput(f"{where}: {k} has shape {tuple(ours[k].shape)}, the decoder its other tensors describe "
                           f"needs {tuple(v.shape)}")
        if not ours[k].is_floating_point():
            raise BadInput(f"{where}: {k} holds {str(ours[k].dtype).removeprefix('torch.')} values, not floating "
                           "point weights (a quantized file?); give a float32, float16 or bfloat16 TAEHV decoder")
    return {k: ours[k] for k in own}


def read_file(path: Path, where: str, raw_latents: bool = False) -> TinyVaeDecoder:
    """The decoder in a `.safetensors` or `.pth` / `.pt` file (the latter through torch's weights-only unpickler:
    `vsagen.models.transformer_files.read_state_dict`), float32 on the CPU, eval mode.

    Raises:
        BadInput: a damaged, truncated or refused file, or no TAEHV decoder in it (one line starting with `where`).
    """
    from ..models.transformer_files import read_state_dict

    decoder = from_state_dict(read_state_dict(Path(path), where), where, raw_latents)
    decoder.origin = str(path)
    return decoder


def save_file(decoder: TinyVaeDecoder, path: Path) -> None:
    """Write the decoder's tensors as safetensors under the published keys (`decoder.N...`)."""
    from safetensors.torch import save_file as save

    path.parent.mkdir(parents=True, exist_ok=True)
    save({k: v.detach().contiguous().cpu() for k, v in decoder.state_dict().items()}, str(path))


def random_decoder(config: TinyVaeConfig, seed: int) -> TinyVaeDecoder:
    """A decoder of `config` with torch's default initialisation drawn from `seed` (the global RNG left as it was),
    float32 on the CPU, eval mode."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return TinyVaeDecoder(config).eval()
