"""Hummingbird-XT's lightweight decoder (`vsagen.decode.light_decoder`) in a pipeline: attached to the stock Wan2.2 VAE
(which keeps encoding and its config: latents mean / std, z_dim, scale factors), its decode as a stream of temporal
windows for `vsagen.decode.stream`, and the run's choice of decoder (`--vae auto|light|stock`, the preset's
`[light_vae]`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import torch

from ..errors import BadInput
from .light_decoder import CONFIG_NAME, WEIGHTS_NAME, LightVaeConfig, LightVaeDecoder, read_folder, save_folder

# ---- attaching it to a pipeline's VAE ------------------------------------------------------------------------------

def light_decode_chunks(vae: Any, z: torch.Tensor) -> Iterator[torch.Tensor]:
    """The decode of a VAE with a light decoder (`attach`) as a stream: z (B, z_dim, T, h, w) un-normalized
    latents -> chunks of frames (B, 3, f, H, W) clamped to [-1, 1] as the stock decode clamps, one per temporal
    window (`LightVaeDecoder.decode_chunks`); `vae.use_tiling` (diffusers' `enable_tiling`) turns on the light
    decoder's spatial tiles. Concatenated: `vae.decode(z)`."""
    light = vae.light_decoder
    light.use_tiling = spatially_tiled(vae)
    for frames in light.decode_chunks(z.to(next(light.parameters()).dtype)):
        yield frames.clamp(-1.0, 1.0)


def _light_decode(self: Any, z: torch.Tensor, return_dict: bool = True) -> Any:
    """`AutoencoderKLWan.decode` routed to `self.light_decoder` (installed by `attach`): `light_decode_chunks`
    concatenated, (B, 3, F, H, W)."""
    frames = torch.cat(list(light_decode_chunks(self, z)), dim=2)
    if not return_dict:
        return (frames,)
    from diffusers.models.autoencoders.vae import DecoderOutput

    return DecoderOutput(sample=frames)


def attach(vae: Any, decoder: LightVaeDecoder) -> None:
    """Make `vae` (diffusers' AutoencoderKLWan) decode with `decoder`: it becomes the submodule `light_decoder`
    (moved and cast with the VAE: `.to`, offloading) and `vae.decode` calls it (through diffusers'
    `apply_forward_hook`, so model offloading moves the VAE first). Encoding and the config stay the stock VAE's.

    Raises:
        BadInput: the decoder's latent channels or compression differ from the VAE's.
    """
    import types

    from diffusers.utils.accelerate_utils import apply_forward_hook

    c, v = decoder.config, vae.config
    ours = (c.latent_channels, c.spatial_ratio, c.temporal_ratio)
    theirs = (v.z_dim, v.scale_factor_spatial, v.scale_factor_temporal)
    if ours != theirs:
        raise BadInput(f"the light VAE decoder (latent channels, spatial, temporal compression {ours}) does not fit "
                       f"the model's VAE {theirs}")
    vae.light_decoder = decoder.to(device=next(vae.parameters()).device, dtype=next(vae.parameters()).dtype)
    vae.decode = types.MethodType(apply_forward_hook(_light_decode), vae)


def uses_light_decoder(vae: Any) -> bool:
    """Whether `vae` decodes with a light decoder (`attach`)."""
    return isinstance(getattr(vae, "light_decoder", None), LightVaeDecoder)


def spatially_tiled(vae: Any) -> bool:
    """Whether `vae`'s decode runs in spatial tiles: its tiling on (`enable_tiling`) and, with a light decoder, that
    decoder following it (`choose_decoder`: only for `--vae-tiling on`; AMD's runs decode untiled in space)."""
    on = bool(getattr(vae, "use_tiling", False))
    return (on and vae.light_decoder.follow_vae_tiling) if uses_light_decoder(vae) else on


def vae_summary(vae: Any) -> dict[str, Any]:
    """What decoded a run, as its JSON records it: {"vae_tiling": bool (`spatially_tiled`), "vae_decoder": "light" |
    "stock", "vae_dtype": the VAE's dtype as the CLI names it ("bf16", "fp16", "fp32")}."""
    dtype = str(next(vae.parameters()).dtype).removeprefix("torch.")
    return {"vae_tiling": spatially_tiled(vae), "vae_decoder": "light" if uses_light_decoder(vae) else "stock",
            "vae_dtype": {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype)}


def decode_channels_last(vae: Any, device: str) -> bool:
    """Store the stock decode path's 3-D convolution weights (`post_quant_conv`, `decoder`) channels-last
    (`torch.channels_last_3d`) where that was measured faster: a bf16 VAE on a CUDA device with the stock decoder.
    cuDNN then runs those convolutions channels-last and their activations follow; the arithmetic is unchanged (same
    PSNR against the float32 decode on the H200, and 1.11x / 1.38x faster decodes at the Wan2.1 / Wan2.2 VAE's sizes:
    BENCHMARKS.md, 2026-12-05 third session). Call it after the VAE's dtype is set and before the pipeline is
    placed (`Module.to` keeps a tensor's memory format). Returns whether it converted anything.

    Args:
        vae: diffusers' `AutoencoderKLWan` (or a stand-in with `decoder` / `post_quant_conv` modules).
        device: the run's device ("cuda", "cuda:1", "cpu", ...).
    """
    if torch.device(device).type != "cuda" or getattr(torch.version, "hip", None) or uses_light_decoder(vae):
        return False
    if next(vae.parameters()).dtype != torch.bfloat16:
        return False
    changed = False
    for part in (getattr(vae, "post_quant_conv", None), getattr(vae, "decoder", None)):
        for module in part.modules() if part is not None else ():
            if isinstance(module, torch.nn.Conv3d):
                module.weight.data = module.weight.data.contiguous(memory_format=torch.channels_last_3d)
                changed = True
    return changed


# ---- the run's choice (`--vae auto|light|stock`) -------------------------------------------------------------------

def choose_decoder(cfg: Any, vae: Any, notes: list[str]) -> None:
    """Give the pipeline's `vae` the preset's light decoder (`[light_vae]`) as `cfg.vae_decoder` asks: "stock" never;
    "light" always (bad input when the folder lacks it); "auto" where the preset's `default` says so and the folder
    holds it (else a note and the stock decoder). With random weights the preset's `config` gets random weights; a
    tiny preset's folder is written beside its checkpoint on first use. One note says which decoder runs.

    Raises:
        BadInput: `--vae light` and no decoder where the preset says, or a damaged folder (`read_folder`).
    """
    spec, src, mode = cfg.source.preset.light_vae, cfg.source, cfg.vae_decoder
    if spec is None or mode == "stock" or (mode == "auto" and not spec.default):
        return
    where = f"--model {cfg.model}"
    if cfg.random_weights:
        with torch.random.fork_rng():
            torch.manual_seed(cfg.seed)
            decoder = LightVaeDecoder(LightVaeConfig.from_dict(spec.config, f"preset {src.preset.name}")).eval()
        origin = "random weights, the preset's architecture"
    else:
        folder = _folder(cfg, spec)
        if folder is None or not (folder / CONFIG_NAME).is_file():
            missing = f"no light VAE decoder at {spec.subfolder}/ of {src.location or src.preset.name}"
            if mode == "light":
                raise BadInput(f"--vae light: {missing}")
            notes.append(f"{missing}: the stock VAE decoder runs")
            return
        decoder, origin = read_folder(folder, where), str(folder)
    decoder.set_temporal_tiling(spec.tile_frames, spec.tile_stride)
    decoder.follow_vae_tiling = getattr(cfg, "vae_tiling", "off") == "on"  # not `auto`: its memory is the point
    attach(vae, decoder)
    windows = (f", windows of {spec.tile_frames} frames every {spec.tile_stride}" if spec.tile_frames else "")
    notes.append(f"VAE decode: the light decoder ({origin}{windows}); --vae stock for the stock decoder")


def _folder(cfg: Any, spec: Any) -> Path | None:
    """The light decoder's folder for a loaded model: a local folder's or the tiny checkpoint's subfolder (a tiny one
    written first with seeded random weights), a hub repository's downloaded (None when it cannot be)."""
    from ..models.tiny import TINY_SEED, cache_dir

    src = cfg.source
    if src.kind == "tiny":
        folder = cache_dir() / f"{src.preset.name}-pipeline" / spec.subfolder
        if not (folder / WEIGHTS_NAME).is_file():
            with torch.random.fork_rng():
                torch.manual_seed(TINY_SEED)
                decoder = LightVaeDecoder(LightVaeConfig.from_dict(spec.config, f"preset {src.preset.name}"))
            tmp = folder.with_name(f".{folder.name}-{os.getpid()}")  # written whole, then renamed into place
            save_folder(decoder, tmp)
            try:
                os.replace(tmp, folder)
            except OSError:  # another process put it there first
                shutil.rmtree(tmp, ignore_errors=True)
        return folder
    if src.kind == "dir":
        return Path(src.location) / spec.subfolder
    try:
        from huggingface_hub import snapshot_download

        root = snapshot_download(src.location, allow_patterns=[f"{spec.subfolder}/{CONFIG_NAME}",
                                                               f"{spec.subfolder}/*.safetensors"])
    except Exception:  # noqa: BLE001 - not downloadable: the caller says so
        return None
    return Path(root) / spec.subfolder
