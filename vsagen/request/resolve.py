"""ONE resolution of a request: the option groups (`vsagen.request.options`) against the model's preset, into a
validated `Request` that every command's config extends with its own part.

Precedence, for every setting, written here once: a value given in an option group (a flag, or a Python caller's
argument; for a backend option, the `--attn NAME:KEY=VALUE` entry or its dedicated flag `--sparsity` /
`--attn-impl`, both at once refused) > the command's own default (e.g. `vsagen profile` times 2 steps after 1
warm-up step) > the model preset's `[defaults]` and `[attention.NAME]` tables > the built-in default (a backend's
Options dataclass). Every check that needs no weights runs here or in the groups, so bad input fails before anything
heavy loads, with one message naming the flag.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any, Callable

from ..attention.dense import every_step_dense_note
from ..attention.spec import BackendEntry, BackendSpec
from ..cache.cache_spec import NO_CACHE, CacheSpec
from ..decode.tiny_files import check_distinct_decoders, check_tiny_request
from ..errors import BadInput
from ..layout import TILE, CropPlan
from ..models.sources import ModelSource
from ..models.presets import preset_names
from ..models.tiny import check_tiny_cache
from ..attention.auto import AUTO, unused_weights_note
from ..models.transformer_files import auto_evidence, check_transformer_files
from .backends import attention_specs, auto_spec, crop_tile_of, preset_file_notes
from .caching import resolve_caches
from .loras import resolve_loras
from ..models.lora_spec import LoraSpec
from .options import (MAX_STEPS, Device, Dtype, ModelOptions, Offload, PlacementOptions, RequestOptions,
                      SamplingOptions, TileFit, VaeSpec)
from .plans import check_rope_range, crop_note, oversized_tile_note, preset_plan, size_limits
from .processes import check_ulysses, split_request
from .quantization import resolve_quants
from .sampling import SamplerList, SamplerPlan, parse_sampler_list, plan_sampler
from ..samplers import NAMED, Sampler

# What a command does with backends: runs one (t2v, i2v: `auto` allowed), several (profile, compare), or none.
ONE, SEVERAL, NONE = "one", "several", "none"


@dataclass(frozen=True, kw_only=True)
class Request:
    """What every command that loads a Wan pipeline and denoises asks for, validated: sizes in pixels and frames,
    CFG scales, seed, scheduler shift, device ("cuda" | "cpu") and dtype ("bf16" | "fp16" | "fp32") resolved,
    the backends to run and the tile fits to run them under. The orchestrator (`vsagen.pipeline.Session`) reads
    only these fields and properties; each command's config (t2v / i2v, profile, compare, search) extends it with
    its own part.

    `offload` (none | model | group) and `vae_tiling` (auto | on | off) say how the weights are placed and the
    VAE runs; requests that never offload nor decode keep the defaults. `notes` are the request's own notes for
    the run, found while it was resolved (e.g. a negative prompt that has no effect without CFG). `attn_requested`
    is the `--attn` text as given and `attn_note` why `--attn auto` chose its backend (None otherwise).
    """

    prompt: str
    negative_prompt: str
    model: str
    source: ModelSource
    height: int
    width: int
    frames: int
    steps: int
    guidance: float
    guidance_2: float | None  # CFG scale of the second expert (two-expert models); None for one-expert models
    seed: int
    flow_shift: float
    max_sequence_length: int
    device: str
    dtype: str
    random_weights: bool
    allow_pickle: bool
    warmup: int
    overwrite: bool
    offload: str = "none"  # none | model | group (CUDA only); see vsagen.models.loading.place_pipeline
    vae_tiling: str = "off"  # auto | on | off, as asked; decided at decode (vsagen.decode.tiling)
    vae_decoder: VaeSpec = VaeSpec()  # --vae parsed (vsagen.decode.decoder_choice.choose_decoder)
    # every decoder the command decodes with, `vae_decoder` first (compare: one per --vae entry; else that one)
    vae_decoders: tuple[VaeSpec, ...] = ()
    vae_dtype: str = "auto"  # --vae-dtype auto (the preset's) | fp32 | bf16 | fp16
    compile: bool = False  # torch.compile the transformer blocks (vsagen.compiling.compile_transformers)
    quant: str = "none"  # none | fp8 | int8: the blocks' linears (vsagen.request.quantization.resolve_quant)
    # every precision the command runs, `quant` first (compare: one per --quant entry; else that one)
    quants: tuple[str, ...] = ()
    # load a transformer file's int8 weights (a `-quant` file's) as int8 linears whatever `quant` says, nothing else
    # quantized at load (compare's load with several precisions: `vsagen.commands.compare_quant.load_request`)
    keep_int8_files: bool = False
    fused_blocks: bool = True  # vsagen.blocks' compiled regions where they apply (vsagen.compiling.fused_blocks_apply)
    ulysses: int = 1  # ranks the transformer's sequence is split across (vsagen.parallel.launch; torchrun)
    cfg_parallel: bool = False  # the CFG branches on two halves of the ranks (vsagen.parallel.cfg; torchrun)
    gpus: int | None = None  # processes vsagen starts itself (--gpus; vsagen.parallel.spawn), = `processes`
    notes: tuple[str, ...] = ()  # what the inputs will not do as the user may expect (run notes)
    tile_fits: tuple[str, ...] = ("partial",)  # every tile fit the command runs ("partial" | "crop")
    backends: tuple[BackendSpec, ...] = ()  # every backend the command runs, in order
    # the cube `--tile-fit crop` rounds the grid up to: the backends' VSA tiles covered (`layout.covering_tile`)
    crop_tile: tuple[int, int, int] = TILE
    attn_requested: str = ""  # the --attn text as given ("auto": the backend was chosen, see attn_note)
    attn_note: str | None = None  # why --attn auto chose the backend, and the alternative (a note of the run)
    # how the denoising walks, one per run (t2v / i2v, profile: one; compare: one per --sampler entry); the first's
    # steps, CFG scale and flow shift are `steps`, `guidance`, `flow_shift`
    samplers: tuple[SamplerPlan, ...] = ()
    # `--transformer`: the transformer-only files replacing the model's transformer(s), absolute paths, one per expert
    # (a `[transformer_files]` preset without them downloads its own: `transformer_sources`)
    transformer_files: tuple[str, ...] = ()
    caches: tuple[CacheSpec, ...] = ()  # --cache: the step cache of each run (t2v / i2v: one; none: no cache)
    # --lora: the LoRAs loaded into the transformers, experts resolved (vsagen.request.loras.resolve_loras)
    loras: tuple[LoraSpec, ...] = ()

    @property
    def cache(self) -> CacheSpec:
        """The (first) step cache (`none` for a request built without one)."""
        return self.caches[0] if self.caches else NO_CACHE

    @property
    def transformer_sources(self) -> tuple[str, ...]:
        """The transformer files the run loads, for reports: `transformer_files`, else a `[transformer_files]`
        preset's as "<repo>/<file>" (none with random weights)."""
        hub = self.source.preset.transformer_files if self.source.exact_preset else None
        if self.transformer_files or self.random_weights or hub is None:
            return self.transformer_files
        return tuple(f"{hub[0]}/{name}" for name in hub[1])

    @property
    def sampler(self) -> Sampler:
        """The (first) sampler (`default` for a request built without one)."""
        return self.samplers[0].sampler if self.samplers else NAMED["default"]

    @property
    def used_flow_shift(self) -> float | None:
        """The flow shift the (first) run's sampler uses, for reports: `flow_shift` with the checkpoint's scheduler,
        None with a re-noise sampler, whose sigmas are used as given (the preset's shift then applies to nothing)."""
        return None if self.sampler.renoise else self.flow_shift

    @property
    def tile_fit(self) -> str:
        """The (first) tile fit."""
        return self.tile_fits[0]

    @property
    def processes(self) -> int:
        """How many processes the run takes: `ulysses`, twice that with `cfg_parallel`."""
        return self.ulysses * (2 if self.cfg_parallel else 1)

    @property
    def image_to_video(self) -> bool:
        """Whether the request runs a WanImageToVideoPipeline (the model's own pipeline class by default)."""
        return self.source.image_to_video

    def plan(self, tile_fit: str | None = None) -> CropPlan:
        """The crop plan under `tile_fit` (default the first) with the preset's strides and patch size (the
        model's own for a model a preset describes)."""
        return preset_plan(self.source, self.frames, self.height, self.width, tile_fit or self.tile_fit,
                           self.crop_tile)

    def predicted_run(self, tile_fit: str | None = None) -> Any:
        """The run this request predicts before anything loads (`RunInfo`, `predicted=True`), for a backend's
        `prepare`: the device and dtype, the transformers' architectures where they are known without loading (a
        preset that describes the model, or a local checkpoint's `<component>/config.json`; none for a hub id no
        preset describes), the post-patch grid under `tile_fit` (default the first) where the preset's strides
        are the model's, and the step count.

        Raises:
            ModelNotFound: a local checkpoint's transformer config cannot be read.
        """
        import torch

        from ..architecture import architecture_from_config
        from ..attention.base import Expert, RunInfo
        from ..models.sources import transformer_configs

        src = self.source
        known = src.exact_preset or src.kind == "dir"
        experts = tuple(Expert(name, architecture_from_config(c)) for name, c in transformer_configs(src, self.model)) \
            if known else ()
        grid = tuple(self.plan(tile_fit).denoise_grid) if src.exact_preset else None
        return RunInfo(torch.device(self.device), torch_dtype(self.dtype), experts, grid, self.steps, predicted=True,
                       model=self.model)

    def memory_hints(self) -> list[str]:
        """Flags of this command that lower GPU memory use and are not in use yet (for an out-of-memory message)."""
        return []


def torch_dtype(name: str) -> Any:
    """'bf16' | 'fp16' | 'fp32' -> the torch dtype."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def request_fields(request: Request) -> dict[str, Any]:
    """{field: value} of the `Request` part of `request` (to build a command's config from it)."""
    return {f.name: getattr(request, f.name) for f in fields(Request)}


def nearest_valid_frames(frames: int, stride: int) -> tuple[int, int]:
    """The valid frame counts (stride*k + 1) just below and above `frames`."""
    lo = max(1, (frames - 1) // stride * stride + 1)
    return lo, lo + stride


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' if available else 'cpu' ('cpu' without importing torch). Raises BadInput for 'cuda' without
    CUDA."""
    device = Device.parse(device, "--device")
    if device == Device.CPU:
        return "cpu"
    import torch

    has_cuda = torch.cuda.is_available()
    if device == Device.CUDA and not has_cuda:
        raise BadInput("--device cuda: CUDA is not available here (torch "
                       f"{torch.__version__}); use --device cpu")
    return "cuda" if device == Device.AUTO and has_cuda else ("cpu" if device == Device.AUTO else device.value)


def _check_sizes(src: ModelSource, frames: int, height: int, width: int) -> None:
    """Frames of the preset's temporal stride (4k+1), sizes multiples of its pixel multiple, within its RoPE range
    (checked first, so that every value a message suggests is one the model takes).

    Raises:
        BadInput: the first invalid one, with the nearest valid values."""
    p = src.preset
    stride_t, mult = p.vae_stride_temporal, p.pixel_multiple
    tops = size_limits(src)
    for name, v in (("--frames", frames), ("--height", height), ("--width", width)):
        if name in tops and v > tops[name]:
            raise BadInput(f"{name} too large for {p.name}: its position tables cover {src.rope_max_seq_len} latent "
                           f"positions per axis, i.e. {name} <= {tops[name]}; got {v}")

    def nearest(lo: int, hi: int, top: int | None) -> str:
        return f"nearest valid: {lo} or {hi}" if top is None or hi <= top else f"nearest valid: {lo}"

    if frames < 1 or (frames - 1) % stride_t:
        lo, hi = nearest_valid_frames(max(frames, 1), stride_t)
        raise BadInput(f"--frames must be {stride_t}k+1 (1, {1 + stride_t}, {1 + 2 * stride_t}, ...); got {frames}, "
                       + nearest(lo, hi, tops.get("--frames")))
    for name, v in (("--height", height), ("--width", width)):
        if v < mult or v % mult:
            lo = max(mult, v // mult * mult)
            raise BadInput(f"{name} must be a positive multiple of {mult} for {p.name}; got {v}, "
                           + nearest(lo, lo + mult, tops.get(name)) if v >= mult else
                           f"{name} must be a positive multiple of {mult} for {p.name}; got {v}")


def check_last_frame(request: Request, what: str) -> None:
    """A last-frame condition needs a second frame, and a crop that keeps the requested last frame last.

    Raises:
        BadInput: --frames 1, or a tile fit `crop` under which the video is denoised longer and cropped back
            (which would drop the last frame); `what` names the condition in the message.
    """
    if request.frames < 2:
        raise BadInput(f"{what} needs --frames {1 + request.source.preset.vae_stride_temporal} or more (with "
                       "--frames 1 the first frame is the last)")
    if "crop" in request.tile_fits:
        plan = request.plan("crop")
        if plan.denoise_frames != request.frames:
            raise BadInput(f"{what} with --tile-fit crop: {request.frames} frames are denoised as "
                           f"{plan.denoise_frames} and cropped back, which would drop the last frame; use --tile-fit "
                           f"partial, or --frames {plan.denoise_frames}")


def negative_prompt_note(negative_prompt: str | None, guidance: float, sampler: Sampler | None = None) -> str | None:
    """A note for the run when a negative prompt was given (not None, not blank) but CFG is off (`guidance` <= 1,
    the first expert's scale: diffusers' Wan pipelines then run no unconditional pass for any expert), so it has
    no effect; else None."""
    if negative_prompt is None or not negative_prompt.strip() or guidance > 1:
        return None
    if sampler is not None and sampler.renoise:
        return (f"--negative-prompt has no effect: the {sampler.name} sampler runs without CFG (one DiT pass a step, "
                "without the negative branch)")
    return (f"--negative-prompt has no effect: CFG is off (--guidance {guidance:g} <= 1 runs one DiT pass a step, "
            "without the negative branch); use --guidance above 1 (e.g. 5) for it to steer the video")


def distilled_class_note(source: ModelSource, sampler: SamplerList | None) -> str | None:
    """A note when a local checkpoint's model_index names FastVideo's `WanDMDPipeline` (its DMD-distilled
    checkpoints) but no preset of a published checkpoint describes it and no `--sampler` was given: it then runs the
    preset's sampler, which may not be the one it was distilled for."""
    if source.index_class != "WanDMDPipeline" or sampler is not None or source.preset.defaults.sampler != "default":
        return None
    return ("model_index.json names WanDMDPipeline, FastVideo's class for DMD-distilled checkpoints, and no preset "
            "describes this one: it runs the checkpoint's scheduler; if it is distilled, add --sampler dmd (3 steps, "
            "CFG off)")


def sampler_plans(source: ModelSource, options: RequestOptions, several: bool = False,
                  command_steps: int | None = None) -> tuple[SamplerPlan, ...]:
    """The sampler of each run (`--sampler` as its option group parsed it, else the preset's) with the steps, CFG
    scale and flow shift it leaves the run (`vsagen.request.sampling.plan_sampler`); `command_steps` is a command's
    own step default (`vsagen profile` times 2 steps) for the checkpoint's scheduler, below the flags and the entry.

    Raises:
        BadInput: several entries where the command runs one, an entry written twice, a flag the sampler refuses, a
            preset's sampler that does not parse.
    """
    s, d = options.sampling, source.preset.defaults
    chosen = s.sampler if s.sampler is not None else parse_sampler_list(d.sampler)
    text = chosen.text
    if len(chosen.samplers) > 1 and not several:
        raise BadInput(f"--sampler {text!r}: this command runs one sampler (`vsagen compare` runs several)")
    seen: dict[str, str] = {}
    for entry, x in zip(chosen.entries, chosen.samplers):  # written differently, may run the same (dmd, dmd:noise=fresh)
        if x.text in seen:
            same = "is written twice" if seen[x.text] == entry else f"runs the same sampler as {seen[x.text]!r}"
            raise BadInput(f"--sampler {text!r}: {entry!r} {same}")
        seen[x.text] = entry
    steps = d.steps if command_steps is None else command_steps
    return tuple(plan_sampler(x, steps=s.steps, guidance=s.guidance, flow_shift=s.flow_shift, default_steps=steps,
                              default_guidance=d.guidance, default_shift=d.flow_shift, preset=source.preset.name)
                 for x in chosen.samplers)


def _entries(options: RequestOptions, backends: str, several_fits: bool) -> tuple[BackendEntry, ...]:
    """The `--attn` entries the command runs (ONE: one, `auto` allowed; SEVERAL: a list; NONE: none), after the
    tile-fit count (a command that runs one fit takes one).

    Raises:
        BadInput: several tile fits where one runs; see `AttnList.one` and `AttnList.several`.
    """
    fits = options.model.tile_fits
    if len(fits) > 1 and not several_fits:
        raise BadInput(f"--tile-fit must be one of {', '.join(TileFit.values())}, got "
                       f"{','.join(f.value for f in fits)!r} (this command runs one tile fit; `vsagen profile` "
                       "runs several)")
    attn = options.attention.attn
    return () if backends == NONE else attn.several() if backends == SEVERAL else (attn.one(),)


def request_size(source: ModelSource, m: ModelOptions) -> tuple[int, int, int]:
    """(height, width, frames): the flags (the model group `m`), else the preset's, checked against the model
    (`_check_sizes`); what `resolve` takes, for a command's own checks that need the size and not the device.

    Raises:
        BadInput: see `_check_sizes`."""
    d = source.preset.defaults
    height = d.height if m.height is None else m.height
    width = d.width if m.width is None else m.width
    frames = d.frames if m.frames is None else m.frames
    _check_sizes(source, frames, height, width)
    return height, width, frames


def _guidance_2(source: ModelSource, s: SamplingOptions, plan: SamplerPlan) -> float | None:
    """The second expert's CFG scale: None with one expert; 1 under a few-step sampler; else `--guidance-2`, the
    preset's, or the first expert's scale."""
    d = source.preset.defaults
    if source.preset.experts < 2:
        return None
    if plan.sampler.renoise:
        return 1.0  # a few-step sampler runs both experts without CFG
    return s.guidance_2 if s.guidance_2 is not None else (d.guidance_2 if d.guidance_2 is not None else plan.guidance)


def _model_files(source: ModelSource, m: ModelOptions) -> tuple[str, ...]:
    """The `--transformer` files checked against the preset (absolute paths), after `--random-weights` (a preset's
    architecture) and the tiny model's cache (writable) are.

    Raises:
        BadInput: random weights of a model no preset describes, a transformer file that does not fit, an unwritable
            vsagen cache for the tiny model.
    """
    if m.random_weights and not source.exact_preset:
        raise BadInput(f"--random-weights builds a preset's architecture, and no preset describes --model {m.model}; "
                       f"use a preset name ({', '.join(preset_names())})")
    files = check_transformer_files(m.transformer, source.preset, m.model, m.random_weights) if m.transformer else ()
    if source.kind == "tiny" and not m.random_weights:  # built once into the vsagen cache: it must be writable
        check_tiny_cache(source.preset)
    return files


def _check_few_step(plan: SamplerPlan, s: SamplingOptions, pl: PlacementOptions) -> None:
    """Refuse what a few-step (re-noise) sampler, which runs without CFG, cannot honour: `--cfg-parallel`, a
    `--guidance-2` above 1."""
    if plan.sampler.renoise and pl.cfg_parallel:
        raise BadInput(f"--cfg-parallel runs the unconditional pass on other processes, and the "
                       f"{plan.sampler.name} sampler runs without CFG; drop --cfg-parallel (--gpus N splits the "
                       "sequence with Ulysses instead)")
    if plan.sampler.renoise and s.guidance_2 is not None and s.guidance_2 > 1:
        raise BadInput(f"--guidance-2 {s.guidance_2:g} turns CFG on, and the {plan.sampler.name} sampler runs "
                       "without CFG; leave it out, or use --sampler default")


def _run_notes(source: ModelSource, s: SamplingOptions, plan: SamplerPlan, size: tuple[int, int, int],
               fits: tuple[str, ...], specs: tuple[BackendSpec, ...], crop_tile: tuple[int, int, int]
               ) -> tuple[str, ...]:
    """The notes of the sampling and size settings: a negative prompt without CFG, a checkpoint distilled for
    another sampler, what `--tile-fit crop` costs, a chosen cube larger than the grid, a second CFG scale without
    CFG."""
    height, width, frames = size
    guidance = plan.guidance
    notes = tuple(n for n in (negative_prompt_note(s.negative_prompt, guidance, plan.sampler),
                              distilled_class_note(source, s.sampler),
                              crop_note(preset_plan(source, frames, height, width, "crop", crop_tile), crop_tile)
                              if "crop" in fits else None)
                  if n is not None)
    if "partial" in fits:  # a cube the user chose (crop rounds the grid up to whole cubes: crop_note's cost)
        grid = preset_plan(source, frames, height, width, "partial").grid
        chosen = sorted({sp.tile for sp in specs if sp.tile is not None and sp.tile != TILE})
        notes += tuple(n for n in (oversized_tile_note(grid, t) for t in chosen) if n is not None)
    if s.guidance_2 is not None and guidance <= 1 < s.guidance_2:  # diffusers: the first scale decides
        notes += (f"--guidance-2 {s.guidance_2:g} has no effect: CFG is off for both experts (--guidance "
                  f"{guidance:g} <= 1 turns it off, as diffusers decides); use --guidance above 1 too",)
    return notes


def _device_dtype(pl: PlacementOptions) -> tuple[str, str]:
    """The run's device ("cuda" | "cpu") and dtype ("bf16" | "fp16" | "fp32"), `auto` resolved.

    Raises:
        BadInput: `--device cuda` without CUDA, `--offload` on the CPU.
    """
    device = resolve_device(pl.device)
    if pl.offload != Offload.NONE and device != "cuda":
        how = "--device cpu" if pl.device == Device.CPU else "--device auto found no CUDA"
        raise BadInput(f"--offload {pl.offload} moves weights between CPU and GPU memory and needs CUDA, but this run "
                       f"is on the CPU ({how}); use --offload none")
    return device, pl.dtype.value if pl.dtype != Dtype.AUTO else ("bf16" if device == "cuda" else "fp32")


def _chosen_backends(source: ModelSource, options: RequestOptions, specs: tuple[BackendSpec, ...], auto: bool,
                     files: tuple[str, ...], device: Callable[[], str]
                     ) -> tuple[tuple[BackendSpec, ...], str | None, tuple[str, ...]]:
    """(specs, attn_note, notes): `--attn auto`'s choice for the checkpoint and why (`auto_spec`), or the specs as
    given with a note for trained weights in `--transformer` files that none of them uses; `device` gives the run's
    device, asked only once the choice is checked (see `auto_spec`)."""
    m, d = options.model, source.preset.defaults
    if auto:
        trained_for = (d.attn, source.preset.name) if d.attn is not None and source.exact_preset else None
        evidence = auto_evidence(files, source.preset, m.random_weights) if source.exact_preset or files else None
        spec, attn_note = auto_spec(source.kind, source.location, options.attention, d.attention, m.random_weights,
                                    device, trained_for, evidence)
        return (spec,), attn_note, ()
    if files and specs:
        unused = unused_weights_note(auto_evidence(files, source.preset, m.random_weights) or [],
                                     [s.name for s in specs])
        return specs, None, (unused,) if unused is not None else ()
    return specs, None, ()


def _check_placement(request: Request) -> None:
    """What needs the whole request: the lightweight decoder exists, a tiny decoder named or given as safetensors
    decodes the model's latent width (`check_tiny_request`), no two `--vae` entries are one decoder
    (`check_distinct_decoders`), the Ulysses degree divides every grid that runs, CFG parallelism has CFG to split.

    Raises:
        BadInput: `--vae light` without one, `--vae tiny` of another width or a damaged file, one decoder listed
            twice, a degree or a CFG split the run cannot take.
    """
    source = request.source
    for vae in request.vae_decoders or (request.vae_decoder,):
        if vae.kind == "light" and source.preset.light_vae is None:
            raise BadInput(f"--vae light: --model {request.model} has no lightweight VAE decoder (hummingbird-xt has "
                           "one; tiny-ti2v a tiny one)")
        check_tiny_request(vae, source, request.model)
    check_distinct_decoders(request.vae_decoders, source, request.model)
    for fit in request.tile_fits:  # the degree against every grid that runs
        check_ulysses(request.ulysses, source, offload=request.offload, compile=request.compile, tile_fit=fit,
                      frames=request.frames, height=request.height, width=request.width, tile=request.crop_tile)
    if request.cfg_parallel:
        from ..parallel.cfg import check_cfg_parallel

        check_cfg_parallel(request.guidance, offload=request.offload, compile=request.compile)


def _check_guidance_2(source: ModelSource, s: Any) -> None:
    """BadInput for `--guidance-2` (in the sampling group `s`) on a model of one transformer."""
    if s.guidance_2 is not None and source.preset.experts < 2:
        raise BadInput(f"--guidance-2 is the second expert's CFG scale, and {source.preset.name} has one "
                       "transformer; use --guidance")


def _quant_loras(source: ModelSource, m: ModelOptions, quants: tuple[str, ...],
                 several_loras: bool) -> tuple[LoraSpec, ...]:
    """`--lora` resolved (`resolve_loras`) under each of the run's precisions `quants`, each refusing what it cannot
    run with the LoRAs (an unfused one, int8 files); BadInput for several precisions with several LoRA scales (the
    low-bit linears are built from the weights with the LoRA fused at one scale)."""
    loras: tuple[LoraSpec, ...] = ()
    for quant in quants:
        loras = resolve_loras(m.lora, source, m.model, quant, m.random_weights, several_loras)
    if len(quants) > 1 and any(spec.scales for spec in loras):
        raise BadInput("--quant with several precisions and a LoRA with several scales: the low-bit linears are "
                       "built from the weights with the LoRA fused at one scale; compare one list at a time")
    return loras


def resolve(source: ModelSource, options: RequestOptions, *, prompt: str, backends: str = ONE,
            several_fits: bool = False, several_samplers: bool = False, several_vaes: bool = False,
            several_quants: bool = False, several_loras: bool = False,
            command_steps: int | None = None) -> Request:
    """Resolve a request against the model's preset (precedence: module docstring) and check everything that
    needs no weights. The option groups hold `--attn`, `--sampler` and `--cache` parsed; nothing here reads their
    text again.

    Args:
        source: the model (`vsagen.models.sources.resolve_model` of `options.model.model`).
        options: the option groups; a command puts its own defaults (e.g. profile's 2 timed steps) into them.
        prompt: the (first) prompt, already checked by the command.
        backends: ONE (`--attn` is one entry, `auto` allowed: chosen from the checkpoint's weights), SEVERAL (a
            comma-separated list) or NONE (the command runs its own backend: `vsagen search`).
        several_fits: the command runs every tile fit of `options.model.tile_fits` (`vsagen profile`); otherwise it
            takes one.
        several_samplers: the command runs every `--sampler` entry (`vsagen compare`); otherwise it takes one.
        several_vaes: the command decodes with every `--vae` entry (`vsagen compare`); otherwise it takes one.
        several_quants: the command runs every `--quant` precision (`vsagen compare`); otherwise it takes one.
        several_loras: the command runs a row per scale of a `--lora FILE:scale=S1,S2,...` (`vsagen compare`);
            otherwise each LoRA takes one scale (not both lists at once: the low-bit linears are built from the
            weights with the LoRA fused at one scale).
        command_steps: the command's own step count for the checkpoint's scheduler (below `--steps`, above the
            preset's; a re-noise sampler's list decides its own).

    Returns:
        The `Request`: every size, step count, CFG scale, the device and dtype resolved; `backends` the specs
        with their options filled; `notes` the request's own notes (a negative prompt without CFG, a second CFG
        scale without CFG).

    Raises:
        BadInput: the first invalid setting, in one message naming the flag and what would be valid (`--seeds`
            among them: one request is one seed).
    """
    m, s, pl, at = options.model, options.sampling, options.placement, options.attention
    if s.seeds is not None:  # `vsagen t2v` / `i2v` resolve each seed's request (`resolve_runs`)
        raise BadInput("--seeds is taken by vsagen t2v and vsagen i2v only; give --seed")
    entries = _entries(options, backends, several_fits)
    vaes = pl.vae.several() if several_vaes else (pl.vae.one(),)
    asked_quants = pl.quant.several() if several_quants else (pl.quant.one(),)
    d = source.preset.defaults
    auto = len(entries) == 1 and entries[0].name == AUTO  # chosen once the device is known (`_chosen_backends`)
    specs = attention_specs(entries, at, d.attention) if entries and not auto else ()
    notes = preset_file_notes(entries, specs, d.attention, source.preset.name) if specs else ()
    height, width, frames = size = request_size(source, m)
    _check_guidance_2(source, s)
    plans = sampler_plans(source, options, several_samplers, command_steps)
    files = _model_files(source, m)
    fits = tuple(f.value for f in m.tile_fits)
    crop_tile = crop_tile_of(specs, d.attention)
    for fit in fits:
        check_rope_range(source, preset_plan(source, frames, height, width, fit, crop_tile), fit, crop_tile)
    _check_few_step(plans[0], s, pl)
    notes += _run_notes(source, s, plans[0], size, fits, specs, crop_tile)
    # `--attn auto`'s choice checked before `--device auto` asks torch for CUDA (an import of seconds): a flag the
    # chosen backend does not take is refused before anything heavy loads
    placement = functools.cache(lambda: _device_dtype(pl))
    specs, attn_note, backend_notes = _chosen_backends(source, options, specs, auto, files, lambda: placement()[0])
    device, dtype = placement()
    ulysses, cfg_parallel, split_notes = split_request(pl, source, device, plans[0].guidance, frames, height, width,
                                                        fits, crop_tile)
    caches, cache_notes = resolve_caches(s.cache, m.model, pl, plans, ulysses * (1 + cfg_parallel),
                                         several=backends == SEVERAL,
                                         experts=("transformer", "transformer_2")[:source.preset.experts]
                                         if source.exact_preset else None)
    backend_notes += tuple(dict.fromkeys(n for spec in specs for plan in plans  # (dict: each note once)
                                         if (n := every_step_dense_note(spec.name, spec.options, plan.steps))))
    quants, quant_notes = resolve_quants(asked_quants, device, source, m.random_weights)
    loras = _quant_loras(source, m, quants, several_loras)
    request = Request(
        prompt=prompt, negative_prompt=d.negative_prompt if s.negative_prompt is None else s.negative_prompt,
        model=m.model, source=source, height=height, width=width, frames=frames,
        steps=plans[0].steps, guidance=plans[0].guidance, guidance_2=_guidance_2(source, s, plans[0]),
        seed=0 if s.seed is None else s.seed,
        flow_shift=plans[0].flow_shift, max_sequence_length=d.max_sequence_length, samplers=plans,
        device=device, dtype=dtype, random_weights=m.random_weights, allow_pickle=m.allow_pickle,
        warmup=0 if s.warmup is None else s.warmup, overwrite=options.output.overwrite, offload=pl.offload.value,
        vae_tiling=pl.vae_tiling.value, vae_decoder=vaes[0], vae_decoders=vaes, vae_dtype=pl.vae_dtype.value, compile=pl.compile,
        quant=quants[0], quants=quants, fused_blocks=pl.fused_blocks, ulysses=ulysses, cfg_parallel=cfg_parallel, gpus=pl.gpus,
        notes=notes + split_notes + cache_notes + backend_notes + quant_notes, tile_fits=fits, backends=specs,
        crop_tile=crop_tile,
        attn_requested=at.attn.text if backends != NONE else "", attn_note=attn_note, transformer_files=files,
        caches=caches, loras=loras)
    _check_placement(request)
    return request

__all__ = ["MAX_STEPS", "NONE", "ONE", "Request", "SEVERAL", "check_last_frame",
           "negative_prompt_note", "nearest_valid_frames", "preset_plan", "request_fields", "request_size",
           "resolve", "resolve_device", "sampler_plans", "torch_dtype"]
