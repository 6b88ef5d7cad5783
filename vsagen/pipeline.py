"""Load a Wan pipeline (tiny | local directory | hub id | random weights), patch it, run it, crop, write.

Data flow: RunConfig -> diffusers WanPipeline (text to video) or WanImageToVideoPipeline (image to video: the input
image, and a last image for first/last-frame video, fitted to the requested size, CLIP-encoded and VAE-encoded into
the condition by diffusers) -> weights placed on the device, or offloaded (`--offload model|group`, diffusers' own
offloading) -> VAE tiling on or off (`--vae-tiling`) -> patch every transformer (`transformer`, and `transformer_2`
of two-expert pipelines: processor + tile-order hooks + per-expert timers) -> text encoding -> denoising loop
(diffusers' own, with its tqdm bar) at the crop plan's size -> crop the latent back -> VAE decode -> mp4 + timing
JSON.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .config import ProfileConfig, RunConfig
from .errors import BadInput, ModelNotFound, RunFailure
from .layout import CropPlan, plan_crop, tile_layout
from .presets import I2V_PIPELINE, T2V_PIPELINE, Preset
from .timing import Timer, TimingReport

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_ALLOWED_LIBRARIES = {"diffusers", "transformers"}


def torch_dtype(name: str):
    """'bf16' | 'fp16' | 'fp32' -> torch dtype."""
    import torch

    return getattr(torch, _DTYPES[name])


@dataclass
class LoadedModel:
    """A ready pipeline and what the report should say about it."""

    pipe: Any
    random_weights: bool
    notes: list[str]
    weight_root: Path | None = None  # checkpoint root (backend-owned weights are read from <root>/<expert>/)
    weight_layers: dict[str, int] = field(default_factory=dict)  # backend name -> layers that got its weights


def _quiet_libraries() -> None:
    import diffusers
    import transformers

    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def pipeline_class_name(cfg: RunConfig | ProfileConfig) -> str:
    """The diffusers pipeline class a request runs: image to video with an image (or, for `vsagen profile`, an
    image-to-video model: `ProfileConfig.conditioned`), else text to video."""
    return I2V_PIPELINE if image_to_video(cfg) else T2V_PIPELINE


def image_to_video(cfg: RunConfig | ProfileConfig) -> bool:
    """Whether `cfg` runs a WanImageToVideoPipeline: an input image, or a profile of an image-to-video model."""
    return cfg.image is not None or getattr(cfg, "conditioned", False)


def _check_local_checkpoint(path: Path, allow_pickle: bool, pipeline: str = "WanPipeline",
                            ti2v: bool = False) -> None:
    """Refuse pickle-only weights (unless allowed) and components from libraries other than diffusers /
    transformers, before diffusers imports anything named in model_index.json. Every component is checked,
    the second expert (`transformer_2`) of two-expert pipelines included; absent optional components
    (`[null, null]`) are skipped. A text-image-to-video checkpoint (`ti2v`, saved as a WanPipeline) may be
    run as a WanImageToVideoPipeline."""
    index = json.loads((path / "model_index.json").read_text())
    accepted = {pipeline} | ({T2V_PIPELINE} if ti2v and pipeline == I2V_PIPELINE else set())
    if index.get("_class_name") not in accepted:
        command = "vsagen i2v" if pipeline == I2V_PIPELINE else "vsagen t2v"
        raise BadInput(f"--model {path}: model_index.json names {index.get('_class_name')!r}; "
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
        has_pickle = any(f.endswith(_PICKLE_SUFFIXES) for f in files)
        if has_pickle and not has_safe and not allow_pickle:
            raise BadInput(f"--model {path}: {name}/ has only pickle weights; pickle files can run code when "
                           "loaded, so vsagen loads safetensors only; pass --allow-pickle if you trust them")


def _from_pretrained(location: str, cfg: RunConfig | ProfileConfig, dtype: Any) -> Any:
    import diffusers

    pipeline_cls = getattr(diffusers, pipeline_class_name(cfg))
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": False}
    kwargs["use_safetensors"] = None if cfg.allow_pickle else True
    try:
        return pipeline_cls.from_pretrained(location, **kwargs)
    except (OSError, ValueError, EnvironmentError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "safetensors" in str(e).lower() and not cfg.allow_pickle:
            raise BadInput(f"--model {cfg.model}: no safetensors weights ({first}); pass --allow-pickle to "
                           "load pickle weights you trust") from None
        if cfg.source.kind == "hub":
            why = (f"hub id {location!r} is not in the local Hugging Face cache and could not be downloaded "
                   f"({_short(first)})")
        else:
            why = f"directory {location}: {_short(first)}"
        timing_hint = ", time its architecture with --random-weights" if cfg.source.exact_preset else ""
        raise ModelNotFound(
            f"cannot load model {cfg.model!r}: {why}. Download it with `hf download {location} --local-dir DIR` "
            f"and pass --model DIR{timing_hint}, or try --model tiny") from None


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


# `--compile`: dynamo's per-code-object cache must hold the block graphs of every configuration a process runs
# (`vsagen profile` recompiles per backend / tile fit; blocks[0] carries the tile-order pre-hook).
COMPILE_CACHE_SIZE = 64


FUSED_BLOCKS_NOTE = ("eager blocks: each transformer block's elementwise modulation, norm and gated-residual steps "
                     "run as small torch.compile regions (vsagen.blocks; same arithmetic as diffusers; "
                     "VSAGEN_FUSED_BLOCKS=0 in the environment of the vsagen command turns them off), compiled in the "
                     "first step")


def fused_blocks_note(warmup: int) -> str:
    """The run note for `vsagen.blocks`' regions; with no warm-up step their compile time is inside the timed
    first step, and the note says so."""
    if warmup > 0:
        return FUSED_BLOCKS_NOTE + " (a warm-up step)"
    return FUSED_BLOCKS_NOTE + ", which is timed (--warmup 0): pass --warmup 1 to keep the compile time out"


def fused_blocks_apply(device: str, compiled: bool, offload: str = "none", enabled: bool = True) -> bool:
    """Whether a run gets `vsagen.blocks`' compiled elementwise regions: eager (not `--compile`, which compiles
    whole blocks) CUDA runs without offloading (its hooks replace the blocks' forward), when the run's
    `fused_blocks` setting (`enabled`) allows them."""
    return enabled and device.startswith("cuda") and not compiled and offload == "none"


def compile_breaks(backends: Sequence[Any], offload: str = "none") -> str | None:
    """Why `--compile` cannot compile each transformer block as one graph, or None when it can.

    Args:
        backends: the attention backends the compiled blocks will run (`AttentionBackend`s).
        offload: the run's `--offload`.

    Returns:
        None when every backend is `traceable` and nothing else breaks the graph; else the reason, for the
        run's notes: a backend that is not traceable (its call runs eagerly between graphs), or `--offload
        group`, whose per-block onload hook diffusers (0.42.1) keeps out of torch.compile.
    """
    eager = [b.name for b in backends if not b.traceable]
    if eager:
        return f"--attn {', '.join(eager)} cannot be traced, so it runs between the compiled graphs"
    if offload == "group":
        return "--offload group's onload hook on every block is not traceable"
    return None


def compile_untimed(backend: Any) -> tuple[str, ...]:
    """The regions a `--compile` run cannot time with `backend` (`TimingReport.from_records(untimed=...)`):
    "attn1" (the processor is compiled into the block graphs), and "self_attention" when the backend is
    `traceable`, so that it is compiled into them too."""
    return ("attn1", "self_attention") if backend.traceable else ("attn1",)


def compile_note(breaks: str | None, in_graph: Sequence[str], warmup: int) -> str:
    """The run's note on `--compile` (`vsagen t2v` / `i2v` and `vsagen profile` alike).

    Args:
        breaks: `compile_breaks`' reason, or None (each block one graph).
        in_graph: names of the backends compiled into the graphs (`traceable`), so not timed.
        warmup: untimed warm-up steps; 0 means the timed steps include the compilation.
    """
    note = ("--compile: every transformer block is one compiled graph (torch.compile, no graph breaks)"
            if breaks is None else f"--compile: transformer blocks compiled with graph breaks ({breaks})")
    if in_graph:
        note += (f"; the attention backend ({', '.join(in_graph)}) runs inside the graphs, so neither attn1 nor "
                 "the backend and its stages are timed (null in the JSON, '-' in profile tables): `vsagen profile "
                 "--kernels` times the attention alone")
    else:
        note += "; attn1 is inside the graphs and not timed, the attention backend is"
    note += "; layout counts only the reorderings outside the blocks (blocks[0]'s gather is compiled)"
    if not warmup:
        note += "; --warmup 0: the timed steps include the compilation, so their times measure the compiler"
    return note


def compile_transformers(pipe: Any, *, fullgraph: bool) -> None:
    """torch.compile every transformer's repeated blocks (diffusers' `compile_repeated_blocks`, one graph
    shared by all `WanTransformerBlock`s; `dynamic=False`, as the shapes of a run are fixed).

    Args:
        pipe: a Wan pipeline whose transformers are patched (or about to be) with vsagen's processor.
        fullgraph: True (see `compile_breaks`) compiles each block's forward as one graph, the attention backend
            included (its custom ops, e.g. `vsagen::coarse_stage` and `vsagen::block_sparse_attn`, are nodes of
            it), and any graph break is an error at the first forward. False lets the graphs break: around a
            backend that is not `traceable` (`run_backend_eager`), or at diffusers' group-offload hooks.

    Projections, q/k norm and RoPE, the output projection, cross-attention, FFN and modulation are compiled in
    either mode; blocks[0]'s tile-order pre-hook (a gather of the hidden states) is compiled as a graph of its
    own. Regions inside the graphs are not timed (`compile_untimed`). Compilation happens on the first forward
    of each configuration: `--warmup` keeps it out of the timed steps.
    """
    import torch

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, COMPILE_CACHE_SIZE)
    for _, t in experts(pipe):
        t.compile_repeated_blocks(fullgraph=fullgraph, dynamic=False)


def load_model(cfg: RunConfig | ProfileConfig, log: Callable[[str], None], backends: Sequence[Any] = ()) -> LoadedModel:
    """Load (or build) the pipeline for `cfg` with its dtype, placed on its device or offloaded (`cfg.offload`,
    see `place_pipeline`), with VAE tiling as `cfg.vae_tiled` says (`vsagen profile` requests: no offload, no
    image, no tiling: it never decodes). The weights each of `backends` owns (e.g. VSA's trained gates) are
    attached before the weights are placed (`attach_weights`).

    Raises:
        ModelNotFound: the checkpoint cannot be found or loaded (message says how to provide it).
        BadInput: pickle-only weights without --allow-pickle, or a non-Wan / non-diffusers checkpoint.
    """
    import torch
    from diffusers import UniPCMultistepScheduler

    _quiet_libraries()
    torch.manual_seed(cfg.seed)
    dtype = torch_dtype(cfg.dtype)
    preset, src = cfg.source.preset, cfg.source
    notes: list[str] = []
    weight_root: Path | None = None  # checkpoint root: gates are read from <root>/transformer{,_2}/
    if cfg.random_weights:
        # offloaded weights live in CPU memory: build them there (the model may not fit on the GPU at once)
        build_on = cfg.device if cfg.offload == "none" else "cpu"
        pipe = _random_weights_pipeline(preset, dtype, build_on, cfg.flow_shift, image_to_video(cfg))
        notes.append(f"random weights: {preset.name} architecture, random prompt embeddings (timing only)")
    else:
        if src.kind == "tiny":
            from .tiny import ensure_tiny_checkpoint

            try:
                location = str(ensure_tiny_checkpoint(preset))
            except OSError as e:
                raise RunFailure(f"cannot write the tiny model to the vsagen cache ({e.strerror or e}: "
                                 f"{getattr(e, 'filename', '')}); set VSAGEN_CACHE or XDG_CACHE_HOME to a "
                                 "writable folder") from None
            notes.append(f"model {preset.name!r} has random weights: its videos are noise (for plumbing and timing)")
        else:
            location = src.location
        if src.kind in ("tiny", "dir"):
            _check_local_checkpoint(Path(location), cfg.allow_pickle, pipeline_class_name(cfg), preset.ti2v)
            weight_root = Path(location)
        pipe = _from_pretrained(location, cfg, dtype)
        if src.kind == "hub":
            try:
                from huggingface_hub import snapshot_download

                weight_root = Path(snapshot_download(location, allow_patterns=["transformer/*", "transformer_2/*"],
                                                     local_files_only=True))
            except Exception:  # noqa: BLE001 - gates are optional; a missing snapshot means none
                weight_root = None
        pipe.scheduler = UniPCMultistepScheduler.from_config(pipe.scheduler.config, flow_shift=cfg.flow_shift)
    vae_dtype = preset.defaults.vae_dtype
    if vae_dtype != "same":
        pipe.vae.to(torch_dtype(vae_dtype))
    for _, t in experts(pipe):
        t.eval()
    model = LoadedModel(pipe=pipe, random_weights=cfg.random_weights, notes=notes, weight_root=weight_root)
    for backend in backends:
        attach_weights(model, backend)
    place_pipeline(pipe, cfg.offload, cfg.device)  # after backend weights and the VAE dtype (see place_pipeline)
    if cfg.offload != "none":
        notes.append(f"--offload {cfg.offload}: weights live in CPU memory; their transfers to the GPU are inside "
                     "the timed regions that trigger them (text encode, DiT forwards, ...)")
    if cfg.vae_tiled:
        pipe.vae.enable_tiling()
    else:
        pipe.vae.disable_tiling()
    return model


def attach_weights(model: LoadedModel, backend: Any) -> int:
    """Attach the weights `backend` owns to every transformer of the pipeline (`vsagen.attention.weights`), from the
    file its options name or the checkpoint's `<root>/<expert>/` folder, and note how many layers got them.

    Raises:
        BadInput: a weights file that cannot be read or whose shapes do not fit the model (one line naming the
            first mismatch).
    """
    from .attention.weights import attach_backend_weights

    n = sum(attach_backend_weights(t, backend, model.weight_root / name if model.weight_root is not None else None)
            for name, t in experts(model.pipe))
    model.weight_layers[backend.name] = n
    if n and backend.weights is not None:
        model.notes.append(f"loaded trained {backend.name} weights ({backend.weights.attr}) for {n} layers")
    return n


def experts(pipe: Any) -> list[tuple[str, Any]]:
    """The pipeline's transformers by component name: [("transformer", t)] or, for two-expert (A14B-style)
    pipelines, also ("transformer_2", t2)."""
    return [(n, t) for n in ("transformer", "transformer_2") if (t := getattr(pipe, n, None)) is not None]


def encode_prompts(cfg: RunConfig | ProfileConfig, model: LoadedModel, do_cfg: bool) -> tuple[Any, Any]:
    """Prompt embeddings (positive, negative or None without CFG), each (1, max_sequence_length, text_dim) in
    the run's dtype on its device: the text encoder's, or seeded random ones (`seed + 1`) for random weights."""
    import torch

    pipe = model.pipe
    dtype = torch_dtype(cfg.dtype)
    if model.random_weights:
        text_dim = pipe.transformer.config.text_dim
        g = torch.Generator("cpu").manual_seed(cfg.seed + 1)
        shape = (1, cfg.max_sequence_length, text_dim)
        pos = torch.randn(shape, generator=g).to(cfg.device, dtype)
        neg = torch.randn(shape, generator=g).to(cfg.device, dtype) if do_cfg else None
        return pos, neg
    return pipe.encode_prompt(prompt=cfg.prompt, negative_prompt=cfg.negative_prompt,
                              do_classifier_free_guidance=do_cfg, num_videos_per_prompt=1,
                              max_sequence_length=cfg.max_sequence_length, device=torch.device(cfg.device),
                              dtype=dtype)


def denoise_plan(cfg: RunConfig | ProfileConfig, pipe: Any, tile_fit: str) -> CropPlan:
    """The crop plan of a request under `tile_fit` ("partial" | "crop"): the size that is denoised and the
    latent it is cropped back to (see `vsagen.layout.plan_crop`)."""
    preset = cfg.source.preset
    return plan_crop(cfg.frames, cfg.height, cfg.width, fit=tile_fit,
                     vae_stride_temporal=preset.vae_stride_temporal, vae_stride_spatial=preset.vae_stride_spatial,
                     patch_size=tuple(pipe.transformer.config.patch_size))


def expert_kwargs(pipe: Any, cfg: RunConfig | ProfileConfig) -> dict[str, Any]:
    """Extra pipeline-call arguments of two-expert pipelines (`guidance_scale_2`); {} for one expert."""
    two_experts = getattr(pipe.config, "boundary_ratio", None) is not None
    return {"guidance_scale_2": cfg.guidance_2} if two_experts and cfg.guidance_2 is not None else {}


def step_counter(timer: Timer) -> Callable[..., dict]:
    """A diffusers `callback_on_step_end` that sets `timer.step` to the next step's index, so every region
    recorded during step i (counted from 0) is tagged i."""

    def on_step_end(_pipe: Any, i: int, _t: Any, _kw: dict) -> dict:
        timer.step = i + 1
        return {}

    return on_step_end


def denoise_latents(pipe: Any, plan: CropPlan, pos: Any, neg: Any, *, steps: int, guidance: float, seed: int,
                    on_step_end: Callable[..., dict] | None = None, extra: dict[str, Any] | None = None) -> Any:
    """Run diffusers' denoising loop at the plan's denoise size and return the latents, uncropped.

    Args:
        pipe: a Wan pipeline (already patched, if it should be).
        plan: the crop plan; its `denoise_*` sizes are what is denoised.
        pos, neg: prompt embeddings (1, L, text_dim); `neg` None without CFG.
        steps: denoising steps; guidance: CFG scale (> 1 runs two transformer forwards a step).
        seed: seeds a fresh CPU generator, so the initial latents are the same for every call at one size.
        on_step_end: diffusers' `callback_on_step_end`; extra: more call arguments (`expert_kwargs`, image).

    Returns:
        (1, z, F_lat, H_lat, W_lat) latents at the denoise size (float32, as diffusers returns them).
    """
    import torch

    return pipe(prompt_embeds=pos, negative_prompt_embeds=neg, height=plan.denoise_height,
                width=plan.denoise_width, num_frames=plan.denoise_frames, num_inference_steps=steps,
                guidance_scale=guidance, generator=torch.Generator("cpu").manual_seed(seed),
                output_type="latent", callback_on_step_end=on_step_end, return_dict=False, **(extra or {}))[0]


def _decode(pipe: Any, latents: Any) -> Any:
    """Un-normalise Wan latents and decode them: (1, z, F_lat, H_lat, W_lat) -> (1, 3, F, H, W) in [-1, 1]."""
    import torch

    vae = pipe.vae
    latents = latents.to(vae.dtype)
    z = vae.config.z_dim
    mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1).to(latents.device, latents.dtype)
    std = torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1).to(latents.device, latents.dtype)
    return vae.decode(latents * std + mean, return_dict=False)[0]


# Image to video: the pipeline methods timed apart from "denoise", and their regions (see vsagen.timing).
CONDITION_REGIONS = (("encode_image", "image_encode"), ("prepare_latents", "condition_encode"))


def time_condition_stages(pipe: Any, timer: Timer, outer: str = "denoise") -> Callable[[], None]:
    """Time an image-to-video pipeline's `encode_image` (region "image_encode": the CLIP image encoder) and
    `prepare_latents` ("condition_encode": VAE encode of the condition video, plus the initial noise) as regions
    of their own, carved out of the open region `outer` (`Timer.region(apart_from=...)`), by wrapping the two
    methods on this pipeline instance (diffusers' `__call__` looks them up on `self`). A method the pipeline does
    not call (no CLIP encoder: Wan2.2-style image to video) simply records nothing.

    Returns:
        A function that restores the instance (removes the wrappers).
    """
    saved: list[tuple[str, bool, Any]] = []
    for method, region in CONDITION_REGIONS:
        own = method in vars(pipe)
        saved.append((method, own, vars(pipe).get(method)))
        original = getattr(pipe, method)

        def timed(*args: Any, _original: Callable = original, _region: str = region, **kwargs: Any) -> Any:
            with timer.region(_region, apart_from=outer):
                return _original(*args, **kwargs)

        setattr(pipe, method, timed)

    def restore() -> None:
        for method, own, value in saved:
            if own:
                setattr(pipe, method, value)
            else:
                delattr(pipe, method)

    return restore


@dataclass
class RunResult:
    """What a run produced: the files and the JSON-ready summary (also written to `json_path`)."""

    video_path: Path
    json_path: Path
    report: TimingReport
    summary: dict[str, Any]


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


def generate(cfg: RunConfig, *, log: Callable[[str], None] = lambda m: None, progress: bool = True) -> RunResult:
    """Run one text-to-video (or, with `cfg.image`, image-to-video) generation and write the mp4 and its timing
    JSON. Image to video: the image is fitted to the requested size (`cfg.fit`) and handed to diffusers, which
    CLIP-encodes it and VAE-encodes the first-frame condition inside its pipeline call; those two stages are timed
    as "image_encode" and "condition_encode", apart from "denoise" (`time_condition_stages`). A last image
    (`cfg.last_image`, first/last-frame to video) is fitted the same way and handed over as diffusers'
    `last_image`: the condition video ends with it and its mask marks the last frame; a CLIP branch encodes both
    images.
    The weights are placed or offloaded as `cfg.offload` says and the VAE tiled as `cfg.vae_tiled` says
    (`load_model`); the JSON records both.

    Raises:
        BadInput: invalid request found only once the model is known (e.g. backend vs dtype).
        ModelNotFound: the checkpoint cannot be loaded.
        RunFailure: the run itself failed (message names the stage).
    """
    import torch

    from . import __version__
    from .attention.hooks import patch_transformer

    backend = cfg.backend.build()
    backend.check(torch.device(cfg.device), torch_dtype(cfg.dtype))
    t_load = time.perf_counter()
    model = load_model(cfg, log, [backend])
    load_s = time.perf_counter() - t_load
    for note in model.notes:
        log(f"note: {note}")
    pipe = model.pipe
    plan = denoise_plan(cfg, pipe, cfg.tile_fit)
    timer = Timer(cfg.device)
    fused = fused_blocks_apply(cfg.device, cfg.compile, cfg.offload, cfg.fused_blocks)
    patches = [patch_transformer(t, backend, timer, expert=name, fused_blocks=fused) for name, t in experts(pipe)]
    if fused:
        model.notes.append(fused_blocks_note(cfg.warmup))
        log(f"note: {model.notes[-1]}")
    breaks = compile_breaks([backend], cfg.offload) if cfg.compile else None
    if cfg.compile:
        compile_transformers(pipe, fullgraph=breaks is None)
        model.notes.append(compile_note(breaks, [backend.name] if backend.traceable else [], cfg.warmup))
        log(f"note: {model.notes[-1]}")
    do_cfg = cfg.guidance > 1.0  # diffusers decides CFG (both forwards) on the first expert's scale alone
    extra = expert_kwargs(pipe, cfg)
    pipe.set_progress_bar_config(disable=not progress, desc="denoising", unit="step", leave=False)
    on_step_end = step_counter(timer)

    if cfg.image is not None:
        from .image import extend_to, fit_image, open_image

        # --tile-fit crop denoises a larger video whose top-left corner is kept: extend the fitted image to it
        extra["image"] = extend_to(fit_image(open_image(cfg.image), cfg.height, cfg.width, cfg.fit or "crop"),
                                   plan.denoise_height, plan.denoise_width)
        if cfg.last_image is not None:  # first/last frame: diffusers puts it in the condition (and its CLIP input)
            extra["last_image"] = extend_to(fit_image(open_image(cfg.last_image), cfg.height, cfg.width,
                                                      cfg.fit or "crop"), plan.denoise_height, plan.denoise_width)

    def denoise(pos: Any, neg: Any, steps: int) -> Any:
        return denoise_latents(pipe, plan, pos, neg, steps=steps, guidance=cfg.guidance, seed=cfg.seed,
                               on_step_end=on_step_end, extra=extra)

    unwrap = time_condition_stages(pipe, timer) if cfg.image is not None else (lambda: None)
    try:
        with torch.inference_mode():
            warmup_s = 0.0
            if cfg.warmup:
                timer.enabled = False
                t0 = time.perf_counter()
                pos, neg = encode_prompts(cfg, model, do_cfg)
                denoise(pos, neg, cfg.warmup)
                if cfg.device == "cuda":
                    torch.cuda.synchronize()
                warmup_s = time.perf_counter() - t0
                timer.enabled = True
            with timer.region("total"):
                with timer.region("text_encode"):
                    pos, neg = encode_prompts(cfg, model, do_cfg)
                timer.step = 0
                with timer.region("denoise"):
                    latents = denoise(pos, neg, cfg.steps)
                timer.step = -1
                f, h, w = plan.latent
                latents = latents[:, :, :f, :h, :w]
                with timer.region("vae_decode"):
                    video = _decode(pipe, latents)
            records = timer.finish()
            t_write = time.perf_counter()
            frames = pipe.video_processor.postprocess_video(video.float(), output_type="np")[0]
    except torch.cuda.OutOfMemoryError as e:
        hints = ([] if cfg.offload != "none" else ["--offload group (or model)"]) + \
                ([] if cfg.vae_tiled else ["--vae-tiling on"])
        hint = f"; try {' and '.join(hints)}" if hints else ""
        raise RunFailure(f"out of GPU memory while generating ({str(e).splitlines()[0]}){hint}") from e
    finally:
        unwrap()
        for p in patches:
            p.remove()
    from .video import to_uint8_frames, write_json, write_mp4

    frames_u8 = to_uint8_frames(frames)
    if frames_u8.shape[:3] != (cfg.frames, cfg.height, cfg.width):
        raise RunFailure(f"decoded video is {frames_u8.shape[:3]}, expected {(cfg.frames, cfg.height, cfg.width)}")
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    write_mp4(frames_u8, cfg.out, cfg.fps, overwrite=cfg.overwrite)
    write_s = time.perf_counter() - t_write
    report = TimingReport.from_records(records, cfg.device, load_s=load_s, write_s=write_s, warmup_s=warmup_s,
                                       notes=model.notes, untimed=compile_untimed(backend) if cfg.compile else ())
    layout = tile_layout(plan.denoise_grid)
    summary = {
        "video": str(cfg.out), "json": str(cfg.json_out), "model": cfg.model, "attn": cfg.attn,
        "backend": backend.describe(torch.device(cfg.device)),
        "frames": cfg.frames, "height": cfg.height, "width": cfg.width,
        "fps": cfg.fps, "steps": cfg.steps, "guidance": cfg.guidance,
        "guidance_2": extra.get("guidance_scale_2"), "experts": [name for name, _ in experts(pipe)],
        "boundary_ratio": getattr(pipe.config, "boundary_ratio", None),
        "expand_timesteps": bool(getattr(pipe.config, "expand_timesteps", False)),
        "image": str(cfg.image) if cfg.image is not None else None,
        "last_image": str(cfg.last_image) if cfg.last_image is not None else None, "fit": cfg.fit,
        "seed": cfg.seed, "device": cfg.device,
        "dtype": cfg.dtype, "tile_fit": cfg.tile_fit, "random_weights": model.random_weights,
        "offload": cfg.offload, "vae_tiling": bool(pipe.vae.use_tiling),
        "compile_fullgraph": (breaks is None) if cfg.compile else None,
        "denoised": {"frames": plan.denoise_frames, "height": plan.denoise_height, "width": plan.denoise_width,
                     "latent": list(plan.denoise_latent), **layout.summary()},
        "timing": report.to_dict(), "config": cfg.summary(), "versions": {"vsagen": __version__,
                                                                         **versions(cfg.device)},
    }
    try:
        write_json(summary, cfg.json_out, overwrite=cfg.overwrite)
    except BadInput:
        raise BadInput(f"{cfg.json_out} appeared during the run; the video is at {cfg.out}, the timing was not "
                       "written (pass --overwrite)") from None
    return RunResult(cfg.out, cfg.json_out, report, summary)
