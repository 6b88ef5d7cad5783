"""The decoders that replace the stock VAE's decode in a pipeline: Hummingbird-XT's lightweight decoder
(`vsagen.decode.light_decoder`) and the TAEHV family's tiny one (`vsagen.decode.tiny_decoder`), each attached to the
stock Wan VAE (which keeps encoding and its config: latents mean / std, z_dim, scale factors) with its decode as a
stream for `vsagen.decode.stream` (the light one by temporal windows, the tiny one latent frame by latent frame), and
the run's choice of decoder (`--vae auto|light|stock|tiny`, the preset's `[light_vae]`, `vsagen.decode.tiny_files`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import torch

from ..errors import BadInput
from .light_decoder import CONFIG_NAME, WEIGHTS_NAME, LightVaeConfig, LightVaeDecoder, read_folder, save_folder
from .tiny_decoder import PUBLISHED_WIDTHS, TinyVaeConfig, TinyVaeDecoder

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
    return _decoded(torch.cat(list(light_decode_chunks(self, z)), dim=2), return_dict)


def _decoded(frames: torch.Tensor, return_dict: bool) -> Any:
    """`frames` as `AutoencoderKLWan.decode` returns them: diffusers' DecoderOutput, or a 1-tuple."""
    if not return_dict:
        return (frames,)
    from diffusers.models.autoencoders.vae import DecoderOutput

    return DecoderOutput(sample=frames)


def attach(vae: Any, decoder: LightVaeDecoder | TinyVaeDecoder) -> None:
    """Make `vae` (diffusers' AutoencoderKLWan) decode with `decoder`: it becomes the submodule `light_decoder` or
    `tiny_decoder` (moved and cast with the VAE: `.to`, offloading) and `vae.decode` calls it (through diffusers'
    `apply_forward_hook`, so model offloading moves the VAE first). Encoding and the config stay the stock VAE's.

    Raises:
        BadInput: the decoder's latent channels or compression differ from the VAE's.
    """
    import types

    from diffusers.utils.accelerate_utils import apply_forward_hook

    c, v = decoder.config, vae.config
    tiny = isinstance(decoder, TinyVaeDecoder)
    ours = (c.latent_channels, c.spatial_ratio, c.temporal_ratio)
    theirs = (v.z_dim, v.scale_factor_spatial, v.scale_factor_temporal)
    if ours != theirs and tiny:
        raise BadInput(f"the tiny VAE decoder {decoder.origin} does not fit the model's VAE: it decodes {ours[0]}-channel "
                       f"latents at {ours[1]}x spatial compression, the VAE makes {theirs[0]}-channel ones at "
                       f"{theirs[1]}x (taew2_1 / lighttaew2_1: 16 channels, 8x; taew2_2 / lighttaew2_2: 48, 16x)")
    if ours != theirs:
        raise BadInput(f"the light VAE decoder (latent channels, spatial, temporal compression {ours}) does not fit "
                       f"the model's VAE {theirs}")
    placed = decoder.to(device=next(vae.parameters()).device, dtype=next(vae.parameters()).dtype)
    if tiny:
        vae.tiny_decoder = placed
    else:
        vae.light_decoder = placed
    vae.decode = types.MethodType(apply_forward_hook(_tiny_decode if tiny else _light_decode), vae)


# the submodules `attach` gives a VAE
DECODER_MODULES = ("light_decoder", "tiny_decoder")


def detach(vae: Any) -> dict[str, Any]:
    """Take the decoder `attach` gave `vae` off it, so that it decodes with its stock decoder again; returns what was
    taken ({"decode": the bound decode or None, "light_decoder" / "tiny_decoder": the module or None}) for
    `reattach`. A stock VAE gives a state of Nones."""
    state = {"decode": vae.__dict__.pop("decode", None)}
    for name in DECODER_MODULES:
        state[name] = vae._modules.pop(name, None)
    return state


def reattach(vae: Any, state: dict[str, Any]) -> None:
    """Make `vae` decode as it did when `detach` returned `state` (its decoder back, or the stock one)."""
    detach(vae)
    if state["decode"] is not None:
        vae.decode = state["decode"]
    for name in DECODER_MODULES:
        if state[name] is not None:
            vae.add_module(name, state[name])


def decoder_states(cfg: Any, vae: Any, notes: list[str]) -> list[dict[str, Any]]:
    """Every decoder of `cfg.vae_decoders` built once for a VAE loaded with the first (`choose_decoder` of
    `cfg.vae_decoder`, as `vsagen.models.loading.load_model` does): one `detach` state each, in order, to `reattach`
    before a decode. The VAE decodes with the first after. The stock decoder's convolutions are stored as a stock
    load stores them (`decode_channels_last`). Each decoder's note is added to `notes`.

    Raises:
        BadInput, ModelNotFound: see `choose_decoder`.
    """
    import dataclasses

    states = [detach(vae)]
    decode_channels_last(vae, str(cfg.device))  # the stock decoder, as a `--vae stock` load leaves it
    for spec in cfg.vae_decoders[1:]:
        choose_decoder(dataclasses.replace(cfg, vae_decoder=spec), vae, notes)
        states.append(detach(vae))
    reattach(vae, states[0])
    return states


def latent_stats(vae: Any, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE's latents (mean, std), each (1, z_dim, 1, 1, 1) on `like`'s device and dtype."""
    z = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1).to(like.device, like.dtype)
    std = torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1).to(like.device, like.dtype)
    return mean, std


def tiny_decode_chunks(vae: Any, latents: torch.Tensor, normalized: bool = True) -> Iterator[torch.Tensor]:
    """The decode of a VAE with a tiny decoder (`attach`) as a stream: latents (B, z_dim, T, h, w), the DiT's
    normalised ones (`normalized`) or un-normalised (z * std + mean, what `vae.decode` takes), turned into the ones
    the decoder takes (`TinyVaeConfig.raw_latents`) in its dtype -> chunks of frames (B, 3, f, H, W) in [-1, 1]
    (the decoder's [0, 1] as 2 x - 1), one per latent frame (`TinyVaeDecoder.decode_chunks`: 1 frame, then 4 each).
    Concatenated: `vae.decode` of the un-normalised latents."""
    tiny = vae.tiny_decoder
    z = latents.to(next(tiny.parameters()).dtype)
    if tiny.config.raw_latents == normalized:
        mean, std = latent_stats(vae, z)
        z = z * std + mean if normalized else (z - mean) / std
    for frames in tiny.decode_chunks(z):
        yield frames * 2.0 - 1.0


def _tiny_decode(self: Any, z: torch.Tensor, return_dict: bool = True) -> Any:
    """`AutoencoderKLWan.decode` routed to `self.tiny_decoder` (installed by `attach`): un-normalised latents ->
    `tiny_decode_chunks` concatenated, (B, 3, F, H, W) in [-1, 1]."""
    return _decoded(torch.cat(list(tiny_decode_chunks(self, z, normalized=False)), dim=2), return_dict)


def uses_light_decoder(vae: Any) -> bool:
    """Whether `vae` decodes with a light decoder (`attach`)."""
    return isinstance(getattr(vae, "light_decoder", None), LightVaeDecoder)


def uses_tiny_decoder(vae: Any) -> bool:
    """Whether `vae` decodes with a tiny (TAEHV) decoder (`attach`)."""
    return isinstance(getattr(vae, "tiny_decoder", None), TinyVaeDecoder)


def spatially_tiled(vae: Any) -> bool:
    """Whether `vae`'s decode runs in spatial tiles: its tiling on (`enable_tiling`) and, with a light decoder, that
    decoder following it (`choose_decoder`: only for `--vae-tiling on`; AMD's runs decode untiled in space); never
    with a tiny decoder (it has no tiles: its memory is a few frames' activations)."""
    on = bool(getattr(vae, "use_tiling", False)) and not uses_tiny_decoder(vae)
    return (on and vae.light_decoder.follow_vae_tiling) if uses_light_decoder(vae) else on


def vae_summary(vae: Any) -> dict[str, Any]:
    """What decoded a run, as its JSON records it: {"vae_tiling": bool (`spatially_tiled`), "vae_decoder": "tiny" |
    "light" | "stock", "vae_weights": the tiny decoder's weights (a file, "<hub repo>/<file>" of the Hugging Face
    cache, or "random weights ..."; None for the others), "vae_dtype": the VAE's dtype as the CLI names it ("bf16",
    "fp16", "fp32")}."""
    dtype = str(next(vae.parameters()).dtype).removeprefix("torch.")
    tiny = uses_tiny_decoder(vae)
    return {"vae_tiling": spatially_tiled(vae),
            "vae_decoder": "tiny" if tiny else "light" if uses_light_decoder(vae) else "stock",
            "vae_weights": vae.tiny_decoder.origin if tiny else None,
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
    if torch.device(device).type != "cuda" or getattr(torch.version, "hip", None) or uses_light_decoder(vae) \
            or uses_tiny_decoder(vae):
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


# ---- the run's choice (`--vae auto|light|stock|tiny`) --------------------------------------------------------------

def choose_decoder(cfg: Any, vae: Any, notes: list[str]) -> None:
    """Give the pipeline's `vae` the decoder `cfg.vae_decoder` (`vsagen.request.options.VaeSpec`) asks for: "tiny"
    the TAEHV one (`choose_tiny`); the preset's light decoder (`[light_vae]`): "stock" never; "light" always (bad
    input when the folder lacks it); "auto" where the preset's `default` says so and the folder holds it (else a note
    and the stock decoder). With random weights the preset's `config` gets random weights; a tiny preset's folder is
    written beside its checkpoint on first use. One note says which decoder runs.

    Raises:
        BadInput: `--vae light` and no decoder where the preset says, or a damaged folder (`read_folder`); see
            `choose_tiny`.
    """
    if cfg.vae_decoder.kind == "tiny":
        choose_tiny(cfg, vae, notes)
        return
    spec, src, mode = cfg.source.preset.light_vae, cfg.source, cfg.vae_decoder.kind
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


def choose_tiny(cfg: Any, vae: Any, notes: list[str]) -> None:
    """Attach the TAEHV decoder of `--vae tiny` (`vsagen.decode.tiny_files`): `weights=FILE` read (un-normalised
    latents for a `lighttae` file name); with random weights one of the published architecture (a tiny model's:
    `TINY_MODEL_WIDTHS`) drawn from the run's seed; a tiny model's own file, written with seeded random weights on
    first use; else the published file (`name=`, or madebyollin's for the VAE's latent width) from the Hugging Face
    cache, downloaded there when missing. One note says which runs (and, with `--vae-tiling on`, that it runs
    untiled).

    Raises:
        BadInput: a file that is damaged, not a TAEHV decoder (`vsagen.decode.tiny_decoder.read_file`) or of another
            latent width or compression than the VAE's (`attach`).
        ModelNotFound: the published file is not cached and cannot be downloaded.
    """
    from .tiny_decoder import random_decoder, read_file
    from .tiny_files import TINY_MODEL_WIDTHS, download, published_for, raw_latents_file

    spec, src = cfg.vae_decoder, cfg.source
    entry, where = published_for(int(vae.config.z_dim), spec.name), f"--vae {spec.text()}"
    if spec.weights is not None:
        decoder = read_file(spec.weights, where, raw_latents_file(spec.weights))
    elif cfg.random_weights:
        widths = TINY_MODEL_WIDTHS if src.kind == "tiny" else PUBLISHED_WIDTHS
        decoder = random_decoder(_config_of(entry, widths), cfg.seed)
        decoder.origin = f"random weights, {entry.name}'s architecture"
    elif src.kind == "tiny":
        decoder = _tiny_model_decoder(src.preset.name, entry, where)
    else:
        decoder = read_file(download(entry), where, entry.raw_latents)
        decoder.origin = entry.hub_text
    attach(vae, decoder)
    latents = "un-normalised latents" if decoder.config.raw_latents else "the DiT's latents as they are"
    untiled = ("; --vae-tiling on does not apply to it (it decodes a frame at a time, untiled)"
               if getattr(cfg, "vae_tiling", "auto") == "on" else "")
    notes.append(f"VAE decode: the tiny decoder (TAEHV, {decoder.origin}; {latents}); --vae stock for the stock "
                 f"decoder{untiled}")


def _config_of(entry: Any, widths: tuple[int, int, int, int]) -> TinyVaeConfig:
    """The architecture of a published decoder (`tiny_files.TinyVaeFile`) at `widths`."""
    return TinyVaeConfig(entry.latent_channels, entry.patch_size, widths, entry.raw_latents)


def _tiny_model_decoder(preset: str, entry: Any, where: str) -> TinyVaeDecoder:
    """A tiny model's TAEHV decoder of `entry`'s kind from its checkpoint folder, written there first (seeded random
    weights, `TINY_MODEL_WIDTHS`; whole, then renamed into place) when missing."""
    from ..models.tiny import TINY_SEED, cache_dir
    from .tiny_decoder import random_decoder, read_file, save_file
    from .tiny_files import TINY_MODEL_WIDTHS, tiny_model_file

    path = tiny_model_file(cache_dir() / f"{preset}-pipeline", entry)
    if not path.is_file():
        tmp = path.with_name(f".{path.name}-{os.getpid()}")
        save_file(random_decoder(_config_of(entry, TINY_MODEL_WIDTHS), TINY_SEED), tmp)
        os.replace(tmp, path)  # a file another process renamed there first is replaced by the same bytes
    return read_file(path, where, entry.raw_latents)
