"""Load a Wan pipeline: tiny | local directory | hub id | random weights, in the request's dtype, placed on its
device or offloaded (`--offload model|group`, diffusers' own offloading), VAE tiled or not, and the weights
attention backends own (trained VSA gates) attached.

Safety: only diffusers / transformers components are loaded (remote code is never trusted), and pickle weights
only with `--allow-pickle`.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..architecture import experts
from ..errors import BadInput
from ..request.resolve import Request, torch_dtype  # noqa: F401 - torch_dtype: the run's dtype, for its callers
from .checkpoint_layouts import index_as_stock
from .presets import I2V_PIPELINE, T2V_PIPELINE, Preset
from .sources import PICKLE_SUFFIXES, model_not_loadable

# What a tiny model's random weights make of a video, in its load note (`reworded_notes` for other outputs).
TINY_OUTPUTS = "its videos show nothing of the prompt"

_ALLOWED_LIBRARIES = {"diffusers", "transformers"}


@dataclass
class LoadedModel:
    """A ready pipeline and what the report should say about it."""

    pipe: Any
    random_weights: bool
    notes: list[str]
    weight_root: Path | None = None  # checkpoint root (backend-owned weights are read from <root>/<expert>/)
    weight_layers: dict[str, int] = field(default_factory=dict)  # backend name -> layers that got its weights
    loras: list[dict[str, Any]] = field(default_factory=list)  # one record per --lora (`vsagen.models.lora`)
    # sets the scale of the --lora that lists row scales (`vsagen compare`; `vsagen.models.lora.LoadedLoras`)
    lora_rescale: Callable[[float], None] | None = None


def _quiet_libraries() -> None:
    import diffusers
    import transformers

    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def resolve_vae_dtype(requested: str, preset: Preset, image_to_video: bool) -> str:
    """The VAE's dtype for a run: `--vae-dtype` when given, else (`auto`) the preset's `decode_dtype` where the VAE
    only decodes (text to video) and the preset has one, else its `vae_dtype`.

    Args:
        requested: `--vae-dtype`: "auto", "fp32", "bf16" or "fp16".
        preset: the model's preset (`GenerationDefaults.vae_dtype` / `decode_dtype`).
        image_to_video: the run also encodes an image with the VAE (image to video), whose bf16 encode is unmeasured.

    Returns:
        "same" (the pipeline's dtype), "fp32", "bf16" or "fp16". Source: the decode's fidelity and time in bf16
        against float32 at real size, BENCHMARKS.md 2026-12-05 (issue 32 item 2: the default is what holds the
        frames within 40 dB PSNR of float32).
    """
    if requested != "auto":
        return requested
    d = preset.defaults
    return d.decode_dtype if d.decode_dtype is not None and not image_to_video else d.vae_dtype


def pipeline_class_name(cfg: Request) -> str:
    """The diffusers pipeline class a request runs: image to video (`Request.image_to_video`: an input image, or,
    for `vsagen profile`, an image-to-video model), else text to video."""
    return I2V_PIPELINE if cfg.image_to_video else T2V_PIPELINE


def _check_local_checkpoint(path: Path, allow_pickle: bool, pipeline: str = "WanPipeline",
                            ti2v: bool = False) -> None:
    """Refuse pickle-only weights (unless allowed) and components from libraries other than diffusers /
    transformers, before diffusers imports anything named in model_index.json. Every component is checked,
    the second expert (`transformer_2`) of two-expert pipelines included; absent optional components
    (`[null, null]`) are skipped. A text-image-to-video checkpoint (`ti2v`, saved as a WanPipeline) may be
    run as a WanImageToVideoPipeline. A class diffusers does not have, naming diffusers' WanTransformer3DModel
    (FastVideo's `WanDMDPipeline`), counts as the stock class its transformer calls for
    (`vsagen.models.checkpoint_layouts.stock_pipeline_class`)."""
    import diffusers

    index = json.loads((path / "model_index.json").read_text())
    accepted = {pipeline} | ({T2V_PIPELINE} if ti2v and pipeline == I2V_PIPELINE else set())
    named = index.get("_class_name")
    stock = index_as_stock(index, _json_or_empty(path / "transformer" / "config.json"))[0].get("_class_name")
    if (stock if named != stock and not hasattr(diffusers, str(named)) else named) not in accepted:
        command = "vsagen i2v" if pipeline == I2V_PIPELINE else "vsagen t2v"
        raise BadInput(f"--model {path}: model_index.json names {named!r}; "
                       f"{command} runs {pipeline} checkpoints")
    for name, spec in index.items():
        if name.startswith("_") or not isinstance(spec, list) or spec[0] is None:
            continue
        if spec[0] not in _ALLOWED_LIBRARIES:
            raise BadInput(f"--model {path}: component {name!r} comes from {spec[0]!r}; only diffusers and "
                           "transformers components are loaded (remote code is never trusted)")
        sub = path / name
        if not sub.is_dir() or name in ("scheduler", "tokenizer"):
            continue
        files = [f.name for f in sub.iterdir()]
        has_safe = any(f.endswith(".safetensors") for f in files)
        has_pickle = any(f.endswith(PICKLE_SUFFIXES) for f in files)
        if has_pickle and not has_safe and not allow_pickle:
            raise BadInput(f"--model {path}: {name}/ has only pickle weights; pickle files can run code when "
                           "loaded, so vsagen loads safetensors only; pass --allow-pickle if you trust them")


def _json_or_empty(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _from_pretrained(location: str, cfg: Request, dtype: Any, **components: Any) -> Any:
    """diffusers' from_pretrained of the request's pipeline class (`components`: modules given instead of loaded,
    e.g. a converted transformer); a failure is one line (`model_not_loadable`, or the pickle refusal)."""
    import diffusers

    pipeline_cls = getattr(diffusers, pipeline_class_name(cfg))
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": False}
    kwargs["use_safetensors"] = None if cfg.allow_pickle else True
    verbosity = diffusers.utils.logging.get_verbosity()
    # diffusers logs a failed component load as an error line of its own ("An error occurred while trying to
    # fetch ...") before it raises: the exception becomes vsagen's one line below, so its log says nothing meanwhile
    diffusers.utils.logging.set_verbosity(diffusers.utils.logging.CRITICAL)
    try:
        return pipeline_cls.from_pretrained(location, **kwargs, **components)
    except (OSError, ValueError, EnvironmentError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "safetensors" in str(e).lower() and not cfg.allow_pickle:
            raise BadInput(f"--model {cfg.model}: no safetensors weights ({first}); pass --allow-pickle to "
                           "load pickle weights you trust") from None
        if cfg.source.kind == "hub" or location == cfg.source.components:
            why = f"hub id {location!r} is not in the local Hugging Face cache and could not be downloaded"
            detail = _short(first)
            if "not fully cached" not in detail and "cached locally" not in detail:  # else it says the same again
                why += f" ({detail})"
        else:
            why = f"directory {location}: {_short(first)}"
        raise model_not_loadable(cfg.model, location, why, cfg.source.exact_preset) from None
    finally:
        diffusers.utils.logging.set_verbosity(verbosity)


def _short(msg: str, limit: int = 100) -> str:
    msg = msg.split(" (")[0].strip()
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def _random_weights_pipeline(preset: Preset, dtype: Any, device: str, flow_shift: float,
                             image_to_video: bool = False) -> Any:
    """The preset's real transformer(s) and VAE architectures with random weights, no text encoder; the
    preset's pipeline family (second expert and boundary, per-token timesteps) as a checkpoint would have it,
    as a WanImageToVideoPipeline when `image_to_video` (image-to-video and ti2v presets)."""
    import torch
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel

    with torch.device(device):
        transformer = WanTransformer3DModel(**preset.transformer).to(dtype).eval()
        transformer_2 = (WanTransformer3DModel(**preset.transformer_2).to(dtype).eval()
                         if preset.transformer_2 is not None else None)
        vae = AutoencoderKLWan(**preset.vae).eval()
        encoder = processor = None
        if image_to_video and preset.image_encoder is not None:
            from .tiny import tiny_image_encoder

            encoder, processor = tiny_image_encoder(preset.image_encoder)
            encoder = encoder.to(dtype)
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        flow_shift=flow_shift)
    if image_to_video:
        from diffusers import WanImageToVideoPipeline

        return WanImageToVideoPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler,
                                       image_processor=processor, image_encoder=encoder, transformer=transformer,
                                       transformer_2=transformer_2, boundary_ratio=preset.boundary_ratio,
                                       expand_timesteps=preset.expand_timesteps)
    return WanPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler, transformer=transformer,
                       transformer_2=transformer_2, boundary_ratio=preset.boundary_ratio,
                       expand_timesteps=preset.expand_timesteps)


# `--offload group`: diffusers' group offloading, one transformer block per group (the smallest GPU footprint
# block-level offloading has), on CUDA with a side stream that prefetches the next block while the current one runs
# (diffusers then pins the CPU copies of the weights). Components without ModuleList blocks (the text and image
# encoders) move as one group. The VAE stays on the GPU: its weights are small next to its activations (the Wan2.1
# VAE has 127 M parameters), and diffusers warns that streamed group offloading of an autoencoder may not work when
# its first forward runs tiled (`--vae-tiling`).
GROUP_OFFLOAD = {"offload_type": "block_level", "num_blocks_per_group": 1}
GROUP_OFFLOAD_KEEP_ON_DEVICE = ["vae"]


def place_pipeline(pipe: Any, offload: str, device: str) -> None:
    """Put the pipeline's weights where `offload` says; this replaces `pipe.to(device)`.

    * `none`: every component on `device`.
    * `model`: `pipe.enable_model_cpu_offload()`: components stay in CPU memory and each moves whole to the GPU
      when it runs (text encoder, image encoder, transformer(s), VAE in turn; the previous one goes back).
    * `group`: `pipe.enable_group_offload(...)` with `GROUP_OFFLOAD` (block level, one block per group; a CUDA
      stream prefetches the next block when `device` is CUDA), the VAE kept on the device.

    Offloading installs diffusers' / accelerate's hooks by replacing the modules' `forward`; vsagen's own hooks
    (`patch_transformer`) are torch forward hooks, which `Module.__call__` runs around `forward`, so they run first
    on the way in (before the weights are onloaded) and last on the way out, whichever is installed first.
    Call this after anything that adds or converts weights (trained VSA gates, the VAE dtype): group offloading
    records the parameters it manages when it is enabled.
    `resolve` refuses offloading without CUDA; this function itself also runs with `device="cpu"` (no stream),
    which is how the tests exercise the hooks on a CPU-only machine.
    """
    import torch

    if offload == "none":
        pipe.to(device)
    elif offload == "model":
        pipe.enable_model_cpu_offload(device=torch.device(device))
    elif offload == "group":
        onload = torch.device(device)
        pipe.enable_group_offload(onload_device=onload, offload_device=torch.device("cpu"),
                                  use_stream=onload.type == "cuda", exclude_modules=GROUP_OFFLOAD_KEEP_ON_DEVICE,
                                  **GROUP_OFFLOAD)
    else:
        raise ValueError(f"unknown offload mode {offload!r}")


def image_to_video_pipeline(pipe: Any, vae: Any = None) -> Any:
    """The `WanImageToVideoPipeline` of a loaded text-image-to-video (Wan2.2-TI2V-5B-style) `WanPipeline`, for its
    image requests: the same component objects (tokenizer, text encoder, transformer(s), scheduler and the VAE, or
    `vae` where image requests hold it in another dtype: `decode_vae_copy`), no CLIP branch (the family has none:
    the image's latent replaces the first frame's), the pipeline's `boundary_ratio` and `expand_timesteps`, its
    progress bar's settings. Nothing is copied or loaded. What `vsagen i2v` loads of the same checkpoint is this
    pipeline class over the same weights (`pipeline_class_name`).

    Built by the constructor rather than diffusers' `from_pipe`, which casts every component of the new pipeline
    to one dtype (float32 unless given) and so would convert the shared bf16 transformer in place.
    """
    from diffusers import WanImageToVideoPipeline

    image_pipe = WanImageToVideoPipeline(
        tokenizer=pipe.tokenizer, text_encoder=pipe.text_encoder, vae=pipe.vae if vae is None else vae,
        scheduler=pipe.scheduler, transformer=pipe.transformer, transformer_2=getattr(pipe, "transformer_2", None),
        boundary_ratio=pipe.config.boundary_ratio, expand_timesteps=bool(pipe.config.expand_timesteps))
    image_pipe.set_progress_bar_config(**getattr(pipe, "_progress_bar_config", {}))
    return image_pipe


def decode_vae_copy(vae: Any, vae_dtype: str, device: str) -> Any:
    """A copy of a loaded `vae` in `vae_dtype` ("fp32" | "bf16" | "fp16"), its decode's convolutions channels-last
    where `_prepare_decoder` puts them so (`decode_channels_last`): what a load whose VAE resolves to `vae_dtype`
    would hold, for a text-image-to-video model whose text requests decode in another dtype than its image
    requests encode and decode in (`resolve_vae_dtype`: a preset's `decode_dtype`). The weights are `vae`'s, cast
    (the same values a load in `vae_dtype` casts to); the copy sits where `vae` sits (the device, or the CPU under
    `--offload model`, without `vae`'s offload hook: the caller places it, `place_pipeline`) and takes that much
    memory again in `vae_dtype`."""
    import copy

    from ..decode.decoder_choice import decode_channels_last

    out = copy.deepcopy(vae)
    if hasattr(out, "_hf_hook"):  # accelerate's hook of `--offload model`, copied with the module
        from accelerate.hooks import remove_hook_from_module

        remove_hook_from_module(out, recurse=True)
    out.to(torch_dtype(vae_dtype))
    decode_channels_last(out, device)
    return out


def prepare_model_files(cfg: Request) -> Path | None:
    """Write the files a load of `cfg` needs that vsagen builds itself: the tiny models' checkpoint (in the vsagen
    cache, once); returns its folder, or None for other models. Call it before a process group starts
    (`vsagen.parallel.launch.start`): transformers' `save_pretrained` writes only on rank 0 of an initialized group.

    Raises:
        BadInput: the cache folder is not writable (bad input, as `vsagen.models.tiny.check_tiny_cache` finds it before
            anything loads; here when it became so meanwhile).
    """
    tiny_components = cfg.source.layout == "wan" and not cfg.source.components  # the tiny preset's own checkpoint
    if (cfg.source.kind != "tiny" and not tiny_components) or cfg.random_weights:
        return None
    from .tiny import ensure_tiny_checkpoint, unwritable_cache

    try:
        return ensure_tiny_checkpoint(cfg.source.preset)
    except OSError as e:
        raise unwritable_cache(e) from None


def load_model(cfg: Request, log: Callable[[str], None], backends: Sequence[Any] = ()) -> LoadedModel:
    """Load (or build) the pipeline for `cfg` with its dtype, placed on its device or offloaded (`cfg.offload`,
    see `place_pipeline`), the VAE's tiling on for an image-to-video condition's encode as `cfg.vae_tiling` says
    (`vsagen.decode.tiling.encode_tiled`; the decode decides again, by memory, when it runs) (`vsagen profile`
    requests: no offload, no image, no tiling: it never decodes). The weights each of `backends` owns (e.g. VSA's
    trained gates) are attached before the weights are placed (`vsagen.models.pipeline_weights.attach_weights`).
    The request's LoRAs (`--lora`) are checked before the weights load (`prepare_loras`) and loaded into the
    transformers once they have (`vsagen.models.lora.load_loras`: fused by default), before `--quant` swaps the
    linears; their records go to `LoadedModel.loras`.

    Raises:
        ModelNotFound: the checkpoint cannot be found or loaded (message says how to provide it).
        BadInput: the transformer weights alone cannot fit in the free memory of where they go
            (`vsagen.estimate.weights_refusal`, before anything is built), pickle-only weights without
            --allow-pickle, or a non-Wan / non-diffusers checkpoint, or a light or tiny VAE decoder asked for and
            absent, damaged or of another latent width
            (`vsagen.decode.decoder_choice.choose_decoder`), or a LoRA that cannot load (`prepare_loras`).
    """
    from ..estimate import weights_refusal

    refusal = weights_refusal(cfg)  # before anything is built (a model too big died out of memory a minute later)
    if refusal is not None:
        raise BadInput(refusal)
    import torch

    _quiet_libraries()
    torch.manual_seed(cfg.seed)
    dtype = torch_dtype(cfg.dtype)
    preset = cfg.source.preset
    notes: list[str] = []
    weight_root: Path | None = None  # checkpoint root: gates are read from <root>/transformer{,_2}/
    loras = prepare_loras(cfg)  # fetched and checked against the architecture before the weights load
    if cfg.random_weights:
        # offloaded weights live in CPU memory: build them there (the model may not fit on the GPU at once)
        build_on = cfg.device if cfg.offload == "none" else "cpu"
        pipe = _random_weights_pipeline(preset, dtype, build_on, cfg.flow_shift, cfg.image_to_video)
        notes.append(f"random weights: {preset.name} architecture, random prompt embeddings (timing only)")
    else:
        pipe, weight_root = _checkpoint_pipeline(cfg, dtype, notes)
    _prepare_decoder(cfg, pipe.vae, notes)
    for _, t in experts(pipe):
        t.eval()
    model = LoadedModel(pipe=pipe, random_weights=cfg.random_weights, notes=notes, weight_root=weight_root)
    from ..quant.swap import quantize_pipeline
    from .lora import load_loras
    from .pipeline_weights import attach_weights

    for backend in backends:
        attach_weights(model, backend)
    if cfg.offload != "none":  # group offloading records the modules it manages: fuse and swap before
        model.loras, _, model.lora_rescale = load_loras(pipe, loras, log)
        notes.extend(quantize_pipeline(pipe, cfg.quant))
    place_pipeline(pipe, cfg.offload, cfg.device)  # after backend weights and the VAE dtype (see place_pipeline)
    if cfg.offload == "none":  # on the device: the LoRAs fuse there, then the weights quantize
        model.loras, _, model.lora_rescale = load_loras(pipe, loras, log)
        notes.extend(quantize_pipeline(pipe, cfg.quant))
    if cfg.offload != "none":
        notes.append(f"--offload {cfg.offload}: weights live in CPU memory; their transfers to the GPU are inside "
                     "the timed regions that trigger them (text encode, DiT forwards, ...)")
    return model


def prepare_loras(cfg: Request) -> list[Any]:
    """The request's LoRAs fetched (a hub id downloaded), hashed and checked layer by layer against the model's
    transformers built empty from their configs where these are known without loading (`vsagen.models.lora`).

    Raises:
        BadInput: a LoRA that cannot be fetched, converted, or fits no layer, or another shape.
    """
    if not cfg.loras:
        return []
    from .lora import check_before_load, fetch
    from .sources import transformer_configs

    layers = cfg.source.preset.transformer.get("num_layers") if cfg.source.exact_preset else None
    files = [fetch(spec, layers) for spec in cfg.loras]
    known = cfg.source.exact_preset or cfg.source.kind == "dir"
    check_before_load(files, transformer_configs(cfg.source, cfg.model) if known else [])
    return files


def reworded_notes(notes: list[str], outputs: str) -> list[str]:
    """`notes` with the tiny model's note saying `outputs` in place of `TINY_OUTPUTS` (its videos): for commands
    that make no video (profile, search)."""
    return [n.replace(TINY_OUTPUTS, outputs) for n in notes]


def _checkpoint_pipeline(cfg: Request, dtype: Any, notes: list[str]) -> tuple[Any, Path | None]:
    """The pipeline of `cfg`'s checkpoint (a tiny model's folder, written first; a local folder; a hub id; the
    original Wan layout; transformer-only files over a base) with UniPC at `cfg.flow_shift`, and the root its
    backend weights (gates) are read from (None where there is none). Raises as `load_model`."""
    from diffusers import UniPCMultistepScheduler

    preset, src = cfg.source.preset, cfg.source
    weight_root: Path | None = None
    if src.kind == "tiny":
        location = str(prepare_model_files(cfg))
        notes.append(f"model {preset.name!r} has random weights: {TINY_OUTPUTS} (for plumbing and timing)")
    else:
        location = src.location
    if cfg.transformer_sources:
        pipe, weight_root = _transformer_files_pipeline(cfg, location, dtype, notes)
    elif src.layout == "wan":
        pipe = _original_layout_pipeline(cfg, dtype, notes)
    else:
        if src.kind in ("tiny", "dir"):
            _check_local_checkpoint(Path(location), cfg.allow_pickle, pipeline_class_name(cfg), preset.ti2v)
            weight_root = Path(location)
        pipe = _from_pretrained(location, cfg, dtype)
        notes.extend(as_stock_pipeline(pipe, _model_index(src.kind, location)))
    if src.kind == "hub" and src.layout != "wan" and not cfg.transformer_sources:
        try:
            from huggingface_hub import snapshot_download

            weight_root = Path(snapshot_download(location, allow_patterns=["transformer/*", "transformer_2/*"],
                                                 local_files_only=True))
        except Exception:  # noqa: BLE001 - gates are optional; a missing snapshot means none
            weight_root = None
    pipe.scheduler = UniPCMultistepScheduler.from_config(pipe.scheduler.config, flow_shift=cfg.flow_shift)
    return pipe, weight_root


def _prepare_decoder(cfg: Request, vae: Any, notes: list[str]) -> None:
    """`--vae` (a preset's lightweight decoder or TAEHV's, `choose_decoder`), `--vae-dtype`, channels-last Conv3d
    weights for a bf16 decode on CUDA, and the tiling of an image-to-video condition's encode (`encode_tiled`; the
    decode decides again, by memory, when it runs)."""
    from ..decode.decoder_choice import choose_decoder, decode_channels_last
    from ..decode.tiling import encode_tiled

    choose_decoder(cfg, vae, notes)
    vae_dtype = resolve_vae_dtype(cfg.vae_dtype, cfg.source.preset, cfg.image_to_video)
    if vae_dtype != "same":
        vae.to(torch_dtype(vae_dtype))
    decode_channels_last(vae, cfg.device)
    if encode_tiled(cfg.vae_tiling, cfg.height, cfg.width):
        vae.enable_tiling()
    else:
        vae.disable_tiling()


def _model_index(kind: str, location: str) -> dict[str, Any]:
    """The checkpoint's model_index.json: a local folder's, a hub id's from the Hugging Face cache (where its load
    just put it); {} when it cannot be read."""
    if kind != "hub":
        return _json_or_empty(Path(location) / "model_index.json")
    try:
        from huggingface_hub import hf_hub_download

        return _json_or_empty(Path(hf_hub_download(location, "model_index.json", local_files_only=True)))
    except Exception:  # noqa: BLE001 - not in the cache: nothing to read
        return {}


def as_stock_pipeline(pipe: Any, index: dict[str, Any]) -> list[str]:
    """Make a pipeline loaded from `index` (its model_index.json) run as diffusers' stock Wan pipeline of its components
    would (`vsagen.models.checkpoint_layouts.index_as_stock`), and return the notes saying what differs: a foreign class
    built as the stock one (diffusers' from_pretrained of a stock class loads the components whatever class the index
    names), and per-token timesteps for a Wan2.2-TI2V-5B-architecture transformer whose index lacks `expand_timesteps`
    (diffusers' from_pretrained defaults a key the index lacks to the constructor's false; the pipeline reads
    `config.expand_timesteps` when called, so it is registered here)."""
    stock, notes = index_as_stock(index, dict(pipe.transformer.config))
    if stock.get("expand_timesteps") and not pipe.config.expand_timesteps:
        pipe.register_to_config(expand_timesteps=True)
    return notes


def _original_layout_pipeline(cfg: Request, dtype: Any, notes: list[str]) -> Any:
    """The pipeline of a transformer in the original Wan key names (`vsagen.models.checkpoint_layouts`): the transformer
    converted by diffusers' single-file conversion with its preset's architecture, the other components from the
    stock diffusers checkpoint of that architecture (`ModelSource.components`; the tiny preset's own checkpoint).

    Raises:
        BadInput: see `load_original_transformer`; the transformer's folder no longer as resolved.
        ModelNotFound: the components' checkpoint (or a hub preset's transformer) cannot be found or loaded.
    """
    from .checkpoint_layouts import check_original_transformer, load_original_transformer, original_wan_folder

    src = cfg.source
    folder_path = Path(src.location) if src.kind == "dir" else _hub_transformer_folder(cfg)
    folder = original_wan_folder(folder_path, cfg.model)
    if folder is None:
        raise BadInput(f"--model {cfg.model}: {folder_path} holds no transformer in the original Wan key names")
    architecture = dict(src.preset.transformer)
    check_original_transformer(folder, architecture, cfg.model)  # from the headers: before anything loads
    components = src.components or str(prepare_model_files(cfg))
    if not src.components:
        _check_local_checkpoint(Path(components), cfg.allow_pickle, pipeline_class_name(cfg), src.preset.ti2v)
    # the components first (a download the user may lack fails before the conversion's wait), the transformer as None
    pipe = _from_pretrained(components, cfg, dtype, transformer=None)
    transformer, note = load_original_transformer(folder, architecture, dtype, cfg.allow_pickle, cfg.model)
    pipe.register_modules(transformer=transformer)
    pipe.register_to_config(expand_timesteps=src.preset.expand_timesteps)
    where = src.components or f"the {src.preset.name} preset's checkpoint"
    notes.append(f"{note}; text encoder, tokenizer, VAE and scheduler from {where}")
    return pipe


def _transformer_files_pipeline(cfg: Request, location: str, dtype: Any, notes: list[str]) -> tuple[Any, Path | None]:
    """The pipeline whose transformer(s) come from transformer-only files (`--transformer`, else the preset's
    `[transformer_files]` downloaded: `vsagen.models.transformer_files`), the other components from `location` (the
    model's checkpoint, loaded without its transformers); and the folder of the backend-owned tensors the files held
    (`LoadedModel.weight_root`), or None.

    Raises:
        BadInput: a file that cannot be read or does not fit the architecture (one line naming it).
        ModelNotFound: the base checkpoint or a preset's file cannot be found or downloaded.
    """
    from .transformer_files import backend_weights_root, hub_files, load_transformer_file

    src = cfg.source
    if src.kind == "dir":
        _check_local_checkpoint(Path(location), cfg.allow_pickle, pipeline_class_name(cfg), src.preset.ti2v)
    given = bool(cfg.transformer_files)
    files = [Path(f) for f in cfg.transformer_files] or hub_files(src.preset, cfg.model)
    names = ["transformer", "transformer_2"][: len(files)]
    # The user's own files first: one that cannot be read or does not fit is refused before the components load (or
    # download). A preset's downloaded files after the components: a download the user may lack fails before their
    # wait. The pipeline is built with the transformers as None, then given them.
    pipe = None if given else _from_pretrained(location, cfg, dtype, **{n: None for n in names})
    architectures = [src.preset.transformer, src.preset.transformer_2]
    backend: dict[str, dict[str, Any]] = {}
    transformers: dict[str, Any] = {}
    keep_int8 = cfg.quant == "int8" or cfg.keep_int8_files  # a file's int8 weights run as stored
    for name, path, architecture in zip(names, files, architectures):
        transformers[name], backend[name], note = load_transformer_file(path, dict(architecture), dtype,
                                                                        keep_int8=keep_int8)
        notes.append(note)
    if pipe is None:
        pipe = _from_pretrained(location, cfg, dtype, **{n: None for n in names})
    pipe.register_modules(**transformers)
    notes.append(f"text encoder, tokenizer, VAE and scheduler from {src.location or src.preset.name}")
    return pipe, backend_weights_root(backend)


def _hub_transformer_folder(cfg: Request) -> Path:
    """The folder of a `transformer_layout = "wan"` hub preset's transformer, downloaded into the Hugging Face cache
    (its config.json and safetensors only)."""
    from huggingface_hub import snapshot_download

    sub = cfg.source.preset.transformer_subfolder.strip("/")
    prefix = f"{sub}/" if sub else ""
    try:
        root = snapshot_download(cfg.source.location, allow_patterns=[f"{prefix}config.json",
                                                                       f"{prefix}*.safetensors",
                                                                       f"{prefix}*.safetensors.index.json"])
    except Exception as e:  # noqa: BLE001 - any download failure is the one line below
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        why = f"hub id {cfg.source.location!r} could not be downloaded ({_short(first)})"
        raise model_not_loadable(cfg.model, cfg.source.location, why, True) from None
    return Path(root) / sub


def truncation_note(pipe: Any, request: Request) -> str | None:
    """The run note when the prompt (or the negative prompt, with CFG) has more tokens than the text encoder reads:
    diffusers' Wan pipelines tokenize to `max_sequence_length` tokens (the preset's, 512 for the Wan releases) and
    cut the rest. None when both fit, or without a tokenizer (random weights: random embeddings)."""
    tokenizer = pipe.tokenizer if "tokenizer" in pipe.components else None
    if tokenizer is None:
        return None
    limit = request.max_sequence_length
    texts = [("the prompt", request.prompt)] + ([("--negative-prompt", request.negative_prompt)]
                                                if request.guidance > 1 else [])
    for what, text in texts:
        n = len(tokenizer(text, add_special_tokens=True).input_ids)
        if n > limit:
            return (f"{what} is {n} tokens and the text encoder reads the first {limit}: the rest of it is cut "
                    "(diffusers' Wan pipelines truncate); shorten it so that all of it counts")
    return None


def versions(device: str) -> dict[str, str]:
    """Python, torch, diffusers (and triton, GPU name, CUDA) versions for reports."""
    import diffusers
    import torch

    v = {"python": platform.python_version(), "torch": torch.__version__, "diffusers": diffusers.__version__}
    try:
        import triton

        v["triton"] = triton.__version__
    except ImportError:
        pass
    if device == "cuda":
        v["gpu"] = torch.cuda.get_device_name()
        v["cuda"] = str(torch.version.cuda)
    return v

