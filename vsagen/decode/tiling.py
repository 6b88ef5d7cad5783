"""`--vae-tiling auto`: the stock Wan VAE decodes untiled wherever its memory peak fits, decided at decode time.

Tiling costs time: diffusers' tiles (256 pixels every 192) decode every pixel of their overlaps two or four times.
The 5B's stock decode at 704 x 1280 x 121 took 19.47 s tiled inside `vsagen t2v` on an H100 (2026-12-07); the bare
untiled decode of such latents 5.9 s bf16 / 9.2 s fp32 on an H200 (2026-12-03); `benchmarks/vae_decode_peak.py gpu`
times both on one card. So tiling is for when memory needs it. `auto` decides once the DiT has run, when the free
memory is known, for the latents at hand:

    untiled  when  estimate x SAFETY_FACTOR + RESERVE_BYTES (+ VAE weights still to move)  <=  available
    tiled    otherwise

* estimate (`decode_peak_estimate`): the untiled decode's activation peak, from the fitted constants below;
* available (`available_bytes`), on CUDA: `torch.cuda.mem_get_info`'s free bytes plus what torch's caching allocator
  holds reserved and unallocated (`memory_reserved - memory_allocated`, which the decode reuses before asking the
  driver); on the CPU: the kernel's MemAvailable (/proc/meminfo), lowered to the cgroup's limit where one is set. The
  CPU takes the same rule as CUDA, not a pixel threshold: the untiled decode is the faster there too, and a CPU
  machine's memory is what bounds it;
* SAFETY_FACTOR (1.25) and RESERVE_BYTES (1 GiB): what the fit does not see (cuDNN / oneDNN workspaces, the caching
  allocator's rounding and fragmentation, the CUDA context of a first decode) and the spread of the fit.

Where the available memory cannot be read (no /proc/meminfo), `auto` keeps the earlier rule: tiled above 480 x 832
pixels (`AREA_RULE_MAX_AREA`), as it also does for the VAE encode of an image-to-video condition (`encode_tiled`),
whose peak is not estimated. `on` / `off` are as given. The light decoder (`--vae light`, Hummingbird-XT) is not
estimated: it decodes in its own temporal windows, untiled in space unless `--vae-tiling on`.

The fit (`benchmarks/vae_decode_peak.py fit`, CPU, 2026-12-07, torch 2.13 / diffusers 0.42.1): diffusers'
AutoencoderKLWan at the presets' real `[vae]` configs (Wan2.1 VAE: z 16, base 96; Wan2.2 VAE: z 48, decoder base
256, residual, patch 2) ran `vsagen.decode.stream`'s streamed decode (with each chunk's uint8 conversion) under
torch's FakeTensorMode, `vsagen.decode.peak_memory.LiveStorageBytes` adding up every storage the operators create.
The tracker on real tensors gives the same bytes to the byte as on fake tensors (the test), and torch's profiler
(every CPU allocation, kernel buffers included) 9% more at a small size. Over latent grids from 16 x 16 to 90 x 160
and 2 to 31 latent frames:

* the peak is linear in the latent frame's pixels h x w (the per-pixel constant varies by < 1% across sizes);
* it does not grow with the number of frames: the decoder runs one latent frame at a time and its causal cache
  holds the last two frames of each convolution's input, so the peak is reached from the third latent frame on (the
  first makes 1 frame, the next ones 4); the latents themselves (and their un-normalised copies) add a little;
* bf16 / fp16 is about half of float32 (Wan2.1: 0.52, Wan2.2: 0.50): the RMS norms and the upsamplers work in
  float32 whatever the dtype;
* the whole (non-streamed) decode, `vae.decode` (`vsagen compare`), also holds the growing output, which
  `torch.cat` copies once per latent frame: + `OUTPUT_COPIES` x the decoded video's bytes bounds it.

At the real sizes that gives (streamed): Wan2.1 VAE at 480 x 832 x 81: 7.3 GiB float32, 3.8 GiB bf16 (720 x 1280:
16.8 / 8.7 GiB); Wan2.2 VAE at 704 x 1280 x 121: 18.1 GiB float32, 9.1 GiB bf16. A VAE of another architecture
gets `GENERIC_ACTIVATIONS` (the larger of the two fits' multiples of its last decoder stage, see
`decode_peak_estimate`; an upper bound on the tiny models).

Tiling saves less memory in the streamed decode than in diffusers' own: `vsagen.decode.stream` walks the tiles
frame by frame, so every tile's causal cache is alive at once, where diffusers' `tiled_decode` finishes one tile's
frames before the next. The same tracker, streamed, tiled against untiled: Wan2.2 VAE bf16 at 704 x 1280 5.4 against
9.0 GiB, Wan2.1 VAE float32 at 480 x 832 6.5 against 7.3 GiB; diffusers' `tiled_decode`: 0.7 / 1.2 GiB plus the
decoded video.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

GIB = 1 << 30

# The streamed untiled decode's peak as (bytes per pixel of a latent frame (h_lat x w_lat), intercept bytes), by VAE
# architecture and element size (4: float32, 2: bf16 / fp16): the least-squares line over the fit's streamed rows
# (`benchmarks/vae_decode_peak.py fit`, module docstring), slope rounded up to 100 bytes, intercept to 0.1 MB (a
# negative intercept taken as 0). Architectures are keyed by `architecture_key` of their diffusers config.
WAN21_VAE = (96, 16, (1, 2, 4, 4), 2, False, None)  # the Wan2.1 VAE (Wan2.1 all, Wan2.2 A14B)
WAN22_VAE = (256, 48, (1, 2, 4, 4), 2, True, 2)  # the Wan2.2-5B VAE (also Hummingbird-XT's)
PEAK_FIT = {
    WAN21_VAE: {4: (1_247_700, 2_100_000), 2: (649_200, 0)},
    WAN22_VAE: {4: (5_513_100, 8_100_000), 2: (2_756_600, 4_100_000)},
}
# Any other architecture: the peak per latent pixel as this many activations of the decoder's last stage
# (its channels x 4 frames x its pixels per latent pixel), the larger of the two fits' (Wan2.1: 12.7-13.2, Wan2.2:
# 21.05), rounded up.
GENERIC_ACTIVATIONS = 22
# The whole decode (`vae.decode`) also holds the decoded video: this many copies of it on top of the streamed peak.
OUTPUT_COPIES = 2

SAFETY_FACTOR = 1.25
RESERVE_BYTES = 1 * GIB
# The earlier rule, kept where no memory can be read and for the image-to-video condition encode: frames of more
# pixels than Wan2.1-1.3B's native 480 x 832 are tiled.
AREA_RULE_MAX_AREA = 480 * 832


def architecture_key(config: Mapping[str, Any]) -> tuple:
    """What of an AutoencoderKLWan config shapes its decoder's memory: (decoder base channels, z_dim, dim_mult,
    num_res_blocks, is_residual, patch_size); the keys of `PEAK_FIT`."""
    base = config.get("decoder_base_dim") or config.get("base_dim", 96)
    return (int(base), int(config.get("z_dim", 16)), tuple(config.get("dim_mult", (1, 2, 4, 4))),
            int(config.get("num_res_blocks", 2)), bool(config.get("is_residual", False)), config.get("patch_size"))


def decode_peak_estimate(config: Mapping[str, Any], latent_frames: int, latent_height: int, latent_width: int,
                         element_bytes: int, *, streamed: bool = True) -> int:
    """The estimated activation peak, in bytes, of decoding latents (1, z_dim, `latent_frames`, `latent_height`,
    `latent_width`) untiled with the AutoencoderKLWan of `config` (its diffusers config) in a dtype of
    `element_bytes` bytes (4: float32, 2: bf16 / fp16): what the decode needs on top of its weights and the latents.

    peak = a x h_lat x w_lat + 3 x latent bytes (+ `OUTPUT_COPIES` x video bytes when not `streamed`), `a` from
    `PEAK_FIT` for the Wan2.1 / Wan2.2 VAEs; for another architecture a = `GENERIC_ACTIVATIONS` x
    last-stage channels x 4 frames x (2 ** upsamplings) ** 2 x 4 bytes whatever the dtype (its norms and
    upsamplers run in float32).

    Raises:
        ValueError: a size below 1, or an element size other than 2 or 4.
    """
    if min(latent_frames, latent_height, latent_width) < 1 or element_bytes not in (2, 4):
        raise ValueError(f"latents {latent_frames}x{latent_height}x{latent_width} of {element_bytes}-byte elements")
    key = architecture_key(config)
    fitted = PEAK_FIT.get(key)
    if fitted is not None:
        per_pixel, intercept = fitted[element_bytes]
    else:
        intercept = 0
        base, _, dim_mult, _, _, _ = key
        up = 2 ** (len(dim_mult) - 1)
        per_pixel = GENERIC_ACTIVATIONS * base * dim_mult[0] * 4 * up * up * 4
    pixels = latent_height * latent_width
    latent_bytes = int(config.get("z_dim", 16)) * latent_frames * pixels * element_bytes
    peak = per_pixel * pixels + intercept + 3 * latent_bytes
    if not streamed:
        ratio = int(config.get("scale_factor_spatial") or 8)
        frames = 1 + (latent_frames - 1) * int(config.get("scale_factor_temporal") or 4)
        peak += OUTPUT_COPIES * 3 * frames * pixels * ratio * ratio * element_bytes
    return peak


@dataclass(frozen=True)
class TilingChoice:
    """What `--vae-tiling` decided for one decode, and why.

    Fields: `mode` as asked ("auto" | "on" | "off"); `tiled` the decision; `estimate` the untiled decode's
    estimated peak and `need` = estimate x SAFETY_FACTOR + RESERVE_BYTES (bytes; None where not estimated);
    `available` the memory it was held against (bytes; None where unread) and `where` what that memory is;
    `weights` the VAE weights still to move onto the device (bytes, in `need`); `reason` the rule that decided
    where no comparison did (e.g. "--vae-tiling on", "the light decoder ...")."""

    mode: str
    tiled: bool
    estimate: int | None = None
    need: int | None = None
    available: int | None = None
    where: str = ""
    weights: int = 0
    reason: str = ""

    def decision(self) -> str:
        """The decision alone: "--vae-tiling MODE: the VAE decodes tiled" (or "untiled")."""
        return f"--vae-tiling {self.mode}: the VAE decodes {'tiled' if self.tiled else 'untiled'}"

    def why(self) -> str:
        """One sentence: the decision and what decided it (estimated peak against the available memory)."""
        if self.need is None or self.available is None:
            return f"{self.decision()} ({self.reason})"
        sign = ">" if self.tiled else "<="
        weights = f" + {_gib(self.weights)} of VAE weights to move" if self.weights else ""
        return (f"{self.decision()}: its estimated peak {_gib(self.estimate)} x {SAFETY_FACTOR:g} + "
                f"{_gib(RESERVE_BYTES)}{weights} = {_gib(self.need)} {sign} {_gib(self.available)} available "
                f"({self.where})")

    def summary(self) -> dict[str, Any]:
        """The run JSON's `vae_tiling_choice`: the fields (bytes as GiB, 3 decimals) and `why`."""
        def gib(b: int | None) -> float | None:
            return None if b is None else round(b / GIB, 3)

        return {"mode": self.mode, "tiled": self.tiled, "estimated_peak_gib": gib(self.estimate),
                "needed_gib": gib(self.need), "available_gib": gib(self.available),
                "available_from": self.where or None, "weights_to_move_gib": gib(self.weights), "why": self.why()}


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.2f} GiB"


def choose_tiling(mode: str, estimate: int, available: int | None, where: str, *, height: int = 0,
                  width: int = 0, weights: int = 0) -> TilingChoice:
    """`--vae-tiling` as a decision for one stock decode (module docstring): `on` / `off` as given; `auto` untiled
    when `estimate` (bytes, `decode_peak_estimate`) x SAFETY_FACTOR + RESERVE_BYTES + `weights` (bytes of VAE
    weights still to move onto the device) fits in `available` (bytes, read from `where`), else tiled; with
    `available` None, tiled when the frame (`height` x `width` pixels) is larger than `AREA_RULE_MAX_AREA`.

    Raises:
        ValueError: `mode` is none of auto, on, off.
    """
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"--vae-tiling must be auto, on or off, got {mode!r}")
    if mode != "auto":
        return TilingChoice(mode, mode == "on", reason=f"--vae-tiling {mode}")
    need = math.ceil(estimate * SAFETY_FACTOR) + RESERVE_BYTES + weights
    if available is None:
        return TilingChoice(mode, encode_tiled(mode, height, width), estimate, need, None, where, weights,
                            reason=f"free memory unknown ({where}): tiled above 480x832 pixels")
    return TilingChoice(mode, need > available, estimate, need, available, where, weights)


def encode_tiled(mode: str, height: int, width: int) -> bool:
    """Whether the VAE's encode of an image-to-video condition runs tiled (the VAE's tiling at load): `on` / `off`
    as given; `auto` tiles frames of more than `AREA_RULE_MAX_AREA` pixels (its peak is not estimated; the decode
    decides again, by memory, when it runs: `decide_decode_tiling`)."""
    if mode == "auto":
        return height * width > AREA_RULE_MAX_AREA
    return mode == "on"


def _meminfo_available() -> int | None:
    """MemAvailable of /proc/meminfo, lowered to the cgroup v2 limit's headroom where a limit is set (bytes)."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
        if limit != "max":
            available = min(available, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return available


def available_bytes(device: Any) -> tuple[int | None, str]:
    """The memory a decode on `device` (a torch.device or its name) can take now, in bytes, and what it is: on CUDA
    the driver's free memory plus the caching allocator's reserved-but-unallocated bytes; on the CPU MemAvailable
    (cgroup-limited). (None, why) where it cannot be read."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        free, _ = torch.cuda.mem_get_info(index)
        cached = torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
        return free + cached, f"cuda:{index} free {_gib(free)} + {_gib(cached)} cached by torch"
    if device.type == "cpu":
        available = _meminfo_available()
        return available, "CPU MemAvailable" if available is not None else "no /proc/meminfo"
    return None, f"no free-memory reading on {device.type}"


def decide_decode_tiling(vae: Any, latents_shape: tuple[int, ...], mode: str, device: Any, *, streamed: bool = True,
                         height: int = 0, width: int = 0) -> TilingChoice:
    """Decide `--vae-tiling` for decoding latents of `latents_shape` (1, z_dim, F_lat, H_lat, W_lat) with `vae`
    (diffusers' AutoencoderKLWan) on `device` (the run's: a torch.device or its name), and set the VAE's tiling
    accordingly (`enable_tiling` / `disable_tiling`). Call it right before the decode, so the memory read is the
    decode's. VAE weights not on `device` yet (`--offload model` moves the VAE there when it decodes) count on top
    of the need. `streamed`: the decode is `vsagen.decode.stream`'s (else `vae.decode`, which also holds the whole
    video). `height` x `width` (pixels) decide where no memory can be read. A VAE with the light decoder attached is
    not estimated: tiled in space for `on` only (its own rule).

    Returns:
        The `TilingChoice` (its `why()` is the run's note, its `summary()` the JSON's `vae_tiling_choice`).
    """
    import torch

    from .decoder_choice import uses_light_decoder

    if uses_light_decoder(vae):
        choice = TilingChoice(mode, mode == "on", reason="the light decoder: its own temporal windows, tiled in "
                                                         "space for --vae-tiling on only")
    else:
        device = torch.device(device)
        params = list(vae.parameters())
        _, _, frames, h, w = latents_shape
        estimate = decode_peak_estimate(vae.config, frames, h, w, params[0].element_size(), streamed=streamed)
        available, where = available_bytes(device) if mode == "auto" else (None, "")
        to_move = sum(p.numel() * p.element_size() for p in params if p.device.type != device.type)
        choice = choose_tiling(mode, estimate, available, where, height=height, width=width, weights=to_move)
    if choice.tiled:
        vae.enable_tiling()
    else:
        vae.disable_tiling()
    return choice


__all__ = ["AREA_RULE_MAX_AREA", "PEAK_FIT", "GENERIC_ACTIVATIONS", "OUTPUT_COPIES", "RESERVE_BYTES",
           "SAFETY_FACTOR", "TilingChoice", "WAN21_VAE", "WAN22_VAE", "architecture_key", "available_bytes",
           "choose_tiling", "decide_decode_tiling", "decode_peak_estimate", "encode_tiled"]
