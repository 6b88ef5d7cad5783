"""`RunConfig`: one generation request, fully resolved and validated before anything heavy is loaded.

Precedence, implemented once in `resolve`: a CLI flag (any value other than None) > the model preset's
`[defaults]`. Every check that does not need the model's weights runs here, so bad input fails in well
under a second with one message and nothing written.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from .attention import BackendSpec, backend_class, backend_names, resolve_spec
from .attention.auto import AUTO, choose_backend
from .attention.spec import check_flags_apply, check_flags_not_repeated, impls_of
from .attention.weights import check_weights_file, named_weights_file
from .errors import BadInput
from .layout import plan_crop
from .models import DEFAULT_MODEL, ModelSource, resolve_model
from .paths import check_output, default_out
from .presets import LAST_IMAGE_IGNORED, LAST_IMAGE_NONE, LAST_IMAGE_ONE_IMAGE, LAST_IMAGE_REQUIRED, preset_names

# Upper bounds that turn absurd requests into bad input before anything loads: diffusers' schedulers train on
# 1000 timesteps (runs past a few thousand steps only repeat them; huge counts fail inside numpy); CFG scales past
# ~20 already saturate pictures and far larger ones overflow the latents into black frames; flow shifts of the
# Wan family are 3..16.
MAX_STEPS = 10_000
MAX_GUIDANCE = 100.0
MAX_FLOW_SHIFT = 1000.0
DEVICES = ("auto", "cuda", "cpu")
DTYPES = ("auto", "bf16", "fp16", "fp32")
TILE_FITS = ("partial", "crop")
OFFLOADS = ("none", "model", "group")
VAE_TILINGS = ("auto", "on", "off")
# `--vae-tiling auto` tiles the VAE when a frame has more pixels than Wan2.1-1.3B's native 480p (480 x 832), so
# the 1.3B's default size keeps diffusers' default (untiled) decode. The criterion is the frame area, not
# pixels x frames: diffusers' AutoencoderKLWan decodes one latent frame at a time (a causal feature cache carries
# the rest), so its activation peak grows with height x width, and its tiling splits frames spatially only
# (256 px tiles, 192 px stride). So 720p (2.3x the area) and Wan2.2-5B's 704 x 1280 are tiled, 480p and smaller
# are not. The memory saved and the time tiling costs were not measured for this choice.
VAE_TILING_AUTO_MAX_AREA = 480 * 832


@dataclass(frozen=True, kw_only=True)
class Request:
    """What every command that loads a Wan pipeline and denoises asks for (`RunConfig` for `vsagen t2v` /
    `vsagen i2v`, `vsagen.profile_config.ProfileConfig` for `vsagen profile`), validated: sizes in pixels and
    frames, CFG scales, seed, scheduler shift, device ("cuda" | "cpu") and dtype ("bf16" | "fp16" | "fp32")
    resolved. The orchestrator (`vsagen.pipeline.Session`) reads only these fields and properties.

    `offload` (none | model | group) and `vae_tiling` (auto | on | off) say how the weights are placed and the
    VAE runs; requests that never offload nor decode keep the defaults. `notes` are the request's own notes for
    the run, found while it was resolved (e.g. a negative prompt that has no effect without CFG).
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
    offload: str = "none"  # none | model | group (CUDA only); see vsagen.loading.place_pipeline
    vae_tiling: str = "off"  # auto | on | off, as asked; `vae_tiled` is the decision
    compile: bool = False  # torch.compile the transformer blocks (vsagen.pipeline.compile_transformers)
    fused_blocks: bool = True  # vsagen.blocks' compiled regions where they apply (vsagen.pipeline.fused_blocks_apply)
    ulysses: int = 1  # ranks the transformer's sequence is split across (vsagen.parallel.launch; torchrun)
    cfg_parallel: bool = False  # the CFG branches on two halves of the ranks (vsagen.parallel.cfg; torchrun)
    notes: tuple[str, ...] = ()  # what the inputs will not do as the user may expect (`input_notes`; run notes)

    @property
    def processes(self) -> int:
        """How many processes the run takes: `ulysses`, twice that with `cfg_parallel`."""
        return self.ulysses * (2 if self.cfg_parallel else 1)

    @property
    def image_to_video(self) -> bool:
        """Whether the request runs a WanImageToVideoPipeline (the model's own pipeline class by default)."""
        return self.source.image_to_video

    @property
    def vae_tiled(self) -> bool:
        """Whether the VAE runs tiled (`vae_tiling`, `auto` resolved by `vae_tiling_enabled`)."""
        return vae_tiling_enabled(self.vae_tiling, self.height, self.width)

    def memory_hints(self) -> list[str]:
        """Flags of this command that lower GPU memory use and are not in use yet (for an out-of-memory message)."""
        return []


@dataclass(frozen=True, kw_only=True)
class RunConfig(Request):
    """A validated `vsagen t2v` / `vsagen i2v` request (see `Request` for the shared fields). `image` (i2v only)
    is the input image's path and `fit` how it is brought to height x width; `last_image` (optional) the last
    frame's path, fitted the same way (first/last-frame to video); `out` / `json_out` the mp4 and its JSON."""

    backend: BackendSpec
    fps: int
    out: Path
    json_out: Path
    tile_fit: str
    image: Path | None = None
    fit: str | None = None
    vae_tiling: str = "auto"
    last_image: Path | None = None
    attn_requested: str = ""  # the --attn entry as given ("auto": the backend was chosen, see attn_note)
    attn_note: str | None = None  # why --attn auto chose the backend, and the alternative (a note of the run)

    @property
    def image_to_video(self) -> bool:
        """An input image makes it image to video (`resolve` refuses image-to-video models without one)."""
        return self.image is not None

    def memory_hints(self) -> list[str]:
        """`--offload` and `--vae-tiling on`, where not given."""
        return (([] if self.offload != "none" else ["--offload group (or model)"])
                + ([] if self.vae_tiled else ["--vae-tiling on"]))

    @property
    def attn(self) -> str:
        """The backend's name (`--attn`)."""
        return self.backend.name

    @property
    def sparsity(self) -> float | None:
        """The backend's sparsity (sparse backends), else None."""
        return self.backend.sparsity

    @property
    def attn_impl(self) -> str:
        """The backend's `impl` option ("auto" for backends without one)."""
        return self.backend.impl

    def summary(self) -> dict[str, Any]:
        """JSON-ready settings (no Path objects, no preset internals)."""
        d = asdict(self)
        d.pop("source")
        d["backend"] = self.backend.summary()
        d.update(attn=self.attn, sparsity=self.sparsity, attn_impl=self.attn_impl)
        d["model_source"] = {"kind": self.source.kind, "location": self.source.location,
                             "preset": self.source.preset.name}
        d["out"], d["json_out"] = str(self.out), str(self.json_out)
        d["image"] = str(self.image) if self.image is not None else None
        d["last_image"] = str(self.last_image) if self.last_image is not None else None
        return d


def vae_tiling_enabled(mode: str, height: int, width: int) -> bool:
    """`--vae-tiling` as a decision: `on` / `off` as given; `auto` tiles frames of more than
    `VAE_TILING_AUTO_MAX_AREA` pixels (more than Wan2.1's 480 x 832; see the constant for why the frame area)."""
    if mode == "auto":
        return height * width > VAE_TILING_AUTO_MAX_AREA
    return mode == "on"


def nearest_valid_frames(frames: int, stride: int) -> tuple[int, int]:
    """The valid frame counts (stride*k + 1) just below and above `frames`."""
    lo = max(1, (frames - 1) // stride * stride + 1)
    return lo, lo + stride


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' if available else 'cpu'. Raises BadInput for 'cuda' without CUDA."""
    import torch

    check_choice("--device", device, DEVICES)
    has_cuda = torch.cuda.is_available()
    if device == "cuda" and not has_cuda:
        raise BadInput("--device cuda: CUDA is not available here (torch "
                       f"{torch.__version__}); use --device cpu")
    return "cuda" if device == "auto" and has_cuda else ("cpu" if device == "auto" else device)


def _check_rope_range(src: ModelSource, frames: int, height: int, width: int, tile_fit: str) -> None:
    """The transformer's RoPE tables cover `rope_max_seq_len` post-patch positions per grid axis; a larger grid
    (after --tile-fit crop rounding) would fail deep inside diffusers, so refuse it here."""
    limit = src.rope_max_seq_len
    if not limit:
        return
    p = src.preset
    plan = plan_crop(frames, height, width, fit=tile_fit, vae_stride_temporal=p.vae_stride_temporal,
                     vae_stride_spatial=p.vae_stride_spatial, patch_size=p.patch_size)
    pt, ph, pw = p.patch_size
    most = {"--frames": (limit * pt - 1) * p.vae_stride_temporal + 1, "--height": limit * ph * p.vae_stride_spatial,
            "--width": limit * pw * p.vae_stride_spatial}
    for (flag, top), g in zip(most.items(), plan.denoise_grid):
        if g > limit:
            extra = " with --tile-fit crop rounding" if tile_fit == "crop" else ""
            raise BadInput(f"{flag} too large for {p.name}: its position tables cover {limit} latent positions "
                           f"per axis, i.e. {flag} <= {top}{extra}")


def check_choice(flag: str, value: str, choices: tuple[str, ...]) -> None:
    """Raise BadInput naming `flag` and its valid values unless `value` is one of `choices`."""
    if value not in choices:
        raise BadInput(f"{flag} must be one of {', '.join(choices)}, got {value!r}")


def check_backend_entry(text: str) -> None:
    """Refuse an unknown backend name early (before the model is resolved), naming the registered ones."""
    if text.split(":", 1)[0].strip() not in backend_names():
        raise BadInput(f"unknown --attn {text.split(':', 1)[0].strip()!r}; available: {', '.join(backend_names())}")


def _known_impls() -> list[str]:
    """Every implementation some registered backend offers ("auto" included)."""
    return sorted({"auto"} | {i for name in backend_names() for i in impls_of(name)})


def backend_specs(entries: tuple[str, ...], preset_tables: dict[str, dict[str, Any]], sparsity: float | None,
                  attn_impl: str, attn: str) -> tuple[BackendSpec, ...]:
    """The `BackendSpec` of each `--attn` entry (`NAME[:KEY=VALUE...]`), options filled by precedence (entry >
    `--sparsity` / `--attn-impl` > the preset's [attention.NAME] table > the backend's default; see
    `vsagen.attention.spec`). `--attn-impl auto` (its default) counts as not given.

    Raises:
        BadInput: an unknown backend or option, a value a backend refuses, a flag no backend in the list takes,
            or a flag and an entry that both set one option (say it once).
    """
    _check_sparsity(sparsity)
    known_impls = _known_impls()
    if attn_impl not in known_impls:
        raise BadInput(f"--attn-impl {attn_impl} is not an implementation any backend has; choose from "
                       f"{', '.join(known_impls)}")
    flags = {"--sparsity": sparsity, "--attn-impl": None if attn_impl == "auto" else attn_impl}
    names = [e.split(":", 1)[0].strip() for e in entries]
    check_flags_apply(names, flags, attn)
    check_flags_not_repeated(entries, flags)
    specs = tuple(resolve_spec(e, preset=preset_tables, flags=flags) for e in entries)
    for spec in specs:  # a weights file named in the options: readable and holding the backend's keys, now
        named = named_weights_file(backend_class(spec.name), spec.options)
        if named is not None:
            check_weights_file(named, backend_class(spec.name).weights)
    return specs


def _check_sparsity(sparsity: float | None) -> None:
    """Raise BadInput unless `sparsity` is None or in [0, 1)."""
    if sparsity is not None and not 0.0 <= sparsity < 1.0:
        raise BadInput(f"--sparsity must be in [0, 1), got {sparsity}")


def check_last_frame(src: ModelSource, frames: int, height: int, width: int, tile_fits: tuple[str, ...],
                     what: str) -> None:
    """A last-frame condition needs a second frame, and a crop that keeps the requested last frame last.

    Raises:
        BadInput: --frames 1, or a tile fit `crop` under which the video is denoised longer and cropped back
            (which would drop the last frame); `what` names the condition in the message.
    """
    if frames < 2:
        raise BadInput(f"{what} needs --frames {1 + src.preset.vae_stride_temporal} or more (with --frames 1 "
                       "the first frame is the last)")
    if "crop" in tile_fits:
        p = src.preset
        plan = plan_crop(frames, height, width, fit="crop", vae_stride_temporal=p.vae_stride_temporal,
                         vae_stride_spatial=p.vae_stride_spatial, patch_size=p.patch_size)
        if plan.denoise_frames != frames:
            raise BadInput(f"{what} with --tile-fit crop: {frames} frames are denoised as {plan.denoise_frames} "
                           "and cropped back, which would drop the last frame; use --tile-fit partial, or --frames "
                           f"{plan.denoise_frames}")


def fill_and_check(src: ModelSource, model: str, *, height: int | None, width: int | None, frames: int | None,
                   steps: int | None, guidance: float | None, guidance_2: float | None, seed: int,
                   random_weights: bool, tile_fits: tuple[str, ...]) -> tuple[int, int, int, int, float, float | None]:
    """Fill unset sizes, steps and CFG scales from the preset's defaults and check them (shared by `resolve`
    and `resolve_profile`, in this order: frames, height/width, steps, guidance, guidance_2, seed,
    --random-weights, the RoPE range under every tile fit in `tile_fits`).

    Returns:
        (height, width, frames, steps, guidance, guidance_2); guidance_2 is None for one-expert models.

    Raises:
        BadInput: the first invalid setting.
    """
    d = src.preset.defaults
    height = d.height if height is None else height
    width = d.width if width is None else width
    frames = d.frames if frames is None else frames
    steps = d.steps if steps is None else steps
    guidance = d.guidance if guidance is None else guidance
    stride_t, mult = src.preset.vae_stride_temporal, src.preset.pixel_multiple
    if frames < 1 or (frames - 1) % stride_t:
        lo, hi = nearest_valid_frames(max(frames, 1), stride_t)
        raise BadInput(f"--frames must be {stride_t}k+1 (1, {1 + stride_t}, {1 + 2 * stride_t}, ...); got {frames}, "
                       f"nearest valid: {lo} or {hi}")
    limit = src.rope_max_seq_len
    for name, v, patch in (("--height", height, src.preset.patch_size[1]), ("--width", width,
                                                                         src.preset.patch_size[2])):
        top = limit * patch * src.preset.vae_stride_spatial if limit else None
        if top is not None and v > top:  # before the stride check: its nearest sizes would be too large too
            raise BadInput(f"{name} too large for {src.preset.name}: its position tables cover {limit} latent "
                           f"positions per axis, i.e. {name} <= {top}; got {v}")
        if v < mult or v % mult:
            lo = max(mult, v // mult * mult)
            raise BadInput(f"{name} must be a positive multiple of {mult} for {src.preset.name}; got {v}, "
                           f"nearest valid: {lo} or {lo + mult}" if v >= mult else
                           f"{name} must be a positive multiple of {mult} for {src.preset.name}; got {v}")
    if not 1 <= steps <= MAX_STEPS:
        raise BadInput(f"--steps must be in [1, {MAX_STEPS}], got {steps}")
    if not math.isfinite(guidance) or not 0 <= guidance <= MAX_GUIDANCE:
        raise BadInput(f"--guidance must be a number in [0, {MAX_GUIDANCE:g}], got {guidance}")
    experts = src.preset.experts
    if guidance_2 is not None and experts < 2:
        raise BadInput(f"--guidance-2 is the second expert's CFG scale, and {src.preset.name} has one transformer; "
                       "use --guidance")
    if experts >= 2:
        guidance_2 = guidance_2 if guidance_2 is not None else (d.guidance_2 if d.guidance_2 is not None
                                                                  else guidance)
        if not math.isfinite(guidance_2) or not 0 <= guidance_2 <= MAX_GUIDANCE:
            raise BadInput(f"--guidance-2 must be a number in [0, {MAX_GUIDANCE:g}], got {guidance_2}")
    if not 0 <= seed < 2**63:
        raise BadInput(f"--seed must be in [0, 2^63), got {seed}")
    if random_weights and not src.exact_preset:
        raise BadInput(f"--random-weights builds a preset's architecture, and no preset describes --model {model}; "
                       f"use a preset name ({', '.join(preset_names())})")
    for tile_fit in tile_fits:
        _check_rope_range(src, frames, height, width, tile_fit)
    return height, width, frames, steps, guidance, guidance_2


def _check_last_image(model: str, src: ModelSource, image: Path | None,
                      last_image: Path | None) -> tuple[Path | None, tuple[int, int] | None]:
    """`--last-image` against what the model does with a last frame (`ModelSource.last_image`): an FLF2V model
    needs one; a model whose CLIP branch takes one image, a text-image-to-video model (diffusers would ignore the
    last image) and a text-to-video request refuse one; the image must be readable. Returns it as a Path, and its
    (width, height) (None, None without one)."""
    use = src.last_image
    if last_image is None:
        if image is not None and use == LAST_IMAGE_REQUIRED:
            raise BadInput(f"--model {model} is a first/last-frame-to-video (FLF2V) model and needs the last frame "
                           "too: add --last-image PATH")
        return None, None
    if image is None or use == LAST_IMAGE_NONE:
        raise BadInput("--last-image is the last frame of image to video: use `vsagen i2v IMAGE PROMPT --last-image "
                       "PATH` with a model that takes one (e.g. --model wan2.1-flf2v-14b-720p)")
    if use == LAST_IMAGE_ONE_IMAGE:
        raise BadInput(f"--last-image: --model {model} is a Wan2.1 image-to-video model whose CLIP image branch takes "
                       "one image; for first/last-frame video use an FLF2V model (e.g. --model wan2.1-flf2v-14b-720p, "
                       "or tiny-flf2v offline)")
    if use == LAST_IMAGE_IGNORED:
        raise BadInput(f"--last-image: --model {model} is a text-image-to-video model (Wan2.2-TI2V-5B style, "
                       "per-token timesteps) and diffusers ignores a last image for it; use an FLF2V model (e.g. "
                       "--model wan2.1-flf2v-14b-720p) or wan2.2-i2v-a14b")
    from .image import open_image

    last_image = Path(last_image)
    try:
        size = open_image(last_image).size  # readable now, or one message naming the path
    except BadInput as e:
        raise BadInput(f"--last-image: {e}") from None
    return last_image, size


def resolve(prompt: str, *, model: str = DEFAULT_MODEL, attn: str = AUTO, sparsity: float | None = None,
            attn_impl: str = "auto",
            height: int | None = None, width: int | None = None, frames: int | None = None,
            steps: int | None = None, guidance: float | None = None, guidance_2: float | None = None,
            flow_shift: float | None = None, negative_prompt: str | None = None,
            seed: int = 0, fps: int | None = None, out: Path | None = None, overwrite: bool = False,
            device: str = "auto", dtype: str = "auto", tile_fit: str = "partial", random_weights: bool = False,
            allow_pickle: bool = False, warmup: int = 0, image: Path | None = None,
            fit: str = "crop", offload: str = "none", vae_tiling: str = "auto", compile: bool = False,
            last_image: Path | None = None, fused_blocks: bool = True, ulysses: int = 1,
            cfg_parallel: bool = False) -> RunConfig:
    """Validate a request and fill unset settings from the model's preset (flag > preset default).

    `guidance` is the CFG scale of the (first) transformer; `guidance_2` that of the second expert of a
    two-expert model (flag > preset `guidance_2` > `guidance`); giving it for a one-expert model is an error.
    `image` (a PNG / JPEG / WebP path) makes it an image-to-video request: the model must be an image-to-video
    one (and the reverse); `fit` (crop | resize, see `vsagen.image`) says how the image is brought to the size.
    `last_image` (with `image`) makes it first/last-frame to video: the video ends at that image, fitted like
    `image`. Only where diffusers does it (`vsagen.presets.last_image_use`): FLF2V models need it, image-to-video
    models without a CLIP branch (Wan2.2-I2V-A14B style) take it optionally, others refuse it.
    `offload` (none | model | group) keeps weights in CPU memory and moves them to the GPU as they are needed
    (diffusers' model / group offloading; CUDA only). `vae_tiling` (auto | on | off) tiles the VAE
    (`vae_tiling_enabled` says when `auto` does). `ulysses` (>= 1) splits the sequence across that many ranks
    of a torchrun launch (`vsagen.parallel.launch`); not with `offload` or `compile`, and for a model of the
    preset's architecture the heads and the denoised tokens must split evenly (checked here, before loading).
    `cfg_parallel` runs the conditional and unconditional passes on two halves of the ranks
    (`vsagen.parallel.cfg`): it needs guidance > 1, and not `offload` or `compile`.

    Raises:
        BadInput: any invalid setting (one message naming the flag and what would be valid).
    """
    if not prompt.strip():
        raise BadInput("the prompt is empty")
    attn = str(getattr(attn, "value", attn)).strip()
    auto = attn.split(":", 1)[0].strip() == AUTO
    if auto and attn != AUTO:
        raise BadInput(f"--attn auto takes no options (got {attn!r}): name the backend to set its options, e.g. "
                       "--attn vsa:sparsity=0.9")
    if not auto:
        check_backend_entry(attn)
    check_choice("--tile-fit", tile_fit, TILE_FITS)
    check_choice("--dtype", dtype, DTYPES)
    check_choice("--device", device, DEVICES)
    check_choice("--offload", offload, OFFLOADS)
    check_choice("--vae-tiling", vae_tiling, VAE_TILINGS)
    _check_sparsity(sparsity)
    src = resolve_model(model)
    if image is not None and not src.takes_image:
        raise BadInput(f"--model {model} is a text-to-video model and takes no image; use `vsagen t2v PROMPT`, "
                       "or an image-to-video model (e.g. --model tiny-i2v)")
    if image is None and src.image_to_video:
        raise BadInput(f"--model {model} is an image-to-video model; use `vsagen i2v IMAGE PROMPT`")
    image_size = None
    if image is not None:
        from .image import FITS, open_image

        if fit not in FITS:
            raise BadInput(f"--fit must be one of {', '.join(FITS)}, got {fit!r}")
        image = Path(image)
        image_size = open_image(image).size  # readable now, or one message naming the path
    last_image, last_image_size = _check_last_image(model, src, image, last_image)
    d = src.preset.defaults
    spec = None if auto else backend_specs((attn,), d.attention, sparsity, attn_impl, attn)[0]
    given_guidance_2 = guidance_2
    height, width, frames, steps, guidance, guidance_2 = fill_and_check(
        src, model, height=height, width=width, frames=frames, steps=steps, guidance=guidance,
        guidance_2=guidance_2, seed=seed, random_weights=random_weights, tile_fits=(tile_fit,))
    fps = d.fps if fps is None else fps
    flow_shift = d.flow_shift if flow_shift is None else flow_shift
    if not math.isfinite(flow_shift) or not 0 < flow_shift <= MAX_FLOW_SHIFT:
        raise BadInput(f"--flow-shift must be a number in (0, {MAX_FLOW_SHIFT:g}], got {flow_shift}")
    if last_image is not None:
        check_last_frame(src, frames, height, width, (tile_fit,), "--last-image")
    notes = input_notes(negative_prompt, guidance, height, width, fit,
                         [("image", image, image_size),
                          ("--last-image", last_image, last_image_size)])
    if given_guidance_2 is not None and guidance <= 1 < given_guidance_2:  # diffusers: the first scale decides
        notes += (f"--guidance-2 {given_guidance_2:g} has no effect: CFG is off for both experts (--guidance "
                  f"{guidance:g} <= 1 turns it off, as diffusers decides); use --guidance above 1 too",)
    if not 1 <= fps <= MAX_FPS:
        raise BadInput(f"--fps must be an integer in [1, {MAX_FPS}], got {fps}")
    if not 0 <= warmup <= MAX_STEPS:
        raise BadInput(f"--warmup must be in [0, {MAX_STEPS}], got {warmup}")
    dev = resolve_device(device)
    if offload != "none" and dev != "cuda":
        how = "--device cpu" if device == "cpu" else "--device auto found no CUDA"
        raise BadInput(f"--offload {offload} moves weights between CPU and GPU memory and needs CUDA, but this run is "
                       f"on the CPU ({how}); use --offload none")
    dt = dtype if dtype != "auto" else ("bf16" if dev == "cuda" else "fp32")
    attn_note = None
    if auto:
        spec, attn_note = _auto_spec(src, d.attention, sparsity, attn_impl, random_weights, dev)
    check_ulysses(ulysses, src, offload=offload, compile=compile, tile_fit=tile_fit, frames=frames, height=height,
                   width=width)
    if cfg_parallel:
        from .parallel.cfg import check_cfg_parallel

        check_cfg_parallel(guidance, offload=offload, compile=compile)
    out = Path(out) if out is not None else default_out(model, spec.name, seed, overwrite)
    json_out = check_output(out, overwrite)
    return RunConfig(
        prompt=prompt, model=model, source=src, backend=spec,
        height=height, width=width,
        frames=frames, steps=steps, guidance=guidance, guidance_2=guidance_2,
        negative_prompt=d.negative_prompt if negative_prompt is None else negative_prompt, seed=seed, fps=fps,
        flow_shift=flow_shift, max_sequence_length=d.max_sequence_length, out=out, json_out=json_out,
        overwrite=overwrite, device=dev, dtype=dt, tile_fit=tile_fit, random_weights=random_weights,
        allow_pickle=allow_pickle, warmup=warmup, image=image, fit=fit if image is not None else None,
        offload=offload, vae_tiling=vae_tiling, last_image=last_image, compile=compile, fused_blocks=fused_blocks,
        ulysses=ulysses, cfg_parallel=bool(cfg_parallel), attn_requested=attn, attn_note=attn_note, notes=notes,
    )


MAX_FPS = 240  # frames per second of the mp4 (ffmpeg writes an empty file for rates it cannot parse)


def negative_prompt_note(negative_prompt: str | None, guidance: float) -> str | None:
    """A note for the run when a negative prompt was given (not None, not blank) but CFG is off (`guidance` <= 1,
    the first expert's scale: diffusers' Wan pipelines then run no unconditional pass for any expert), so it has
    no effect; else None."""
    if negative_prompt is None or not negative_prompt.strip() or guidance > 1:
        return None
    return (f"--negative-prompt has no effect: CFG is off (--guidance {guidance:g} <= 1 runs one DiT pass a step, "
            "without the negative branch); use --guidance above 1 (e.g. 5) for it to steer the video")


def input_notes(negative_prompt: str | None, guidance: float, height: int, width: int, fit: str | None = None,
                images: Sequence[tuple[str, Path | None, tuple[int, int] | None]] = ()) -> tuple[str, ...]:
    """The notes (and refusals) about the request's inputs once the size is known: a negative prompt without CFG
    (`negative_prompt_note`), an image too small or blown up by its fit (`vsagen.image.check_image_size`);
    `images` holds (flag, path or None, (width, height))."""
    from .image import check_image_size

    notes = [negative_prompt_note(negative_prompt, guidance)]
    notes += [check_image_size(path, size, height, width, fit, flag) for flag, path, size in images
              if path is not None]
    return tuple(n for n in notes if n is not None)


def _auto_spec(src: ModelSource, tables: dict[str, dict[str, Any]], sparsity: float | None, attn_impl: str,
               random_weights: bool, device: str) -> tuple[BackendSpec, str]:
    """`--attn auto`: the backend the checkpoint was trained for (`vsagen.attention.auto`), its spec and the note.

    Raises:
        BadInput: a flag the chosen backend does not take (e.g. --sparsity when auto chose full), naming the
            choice and how to pick a backend."""
    name, note = choose_backend(src.kind, src.location, random_weights, device)
    try:
        return backend_specs((name,), tables, sparsity, attn_impl, name)[0], note
    except BadInput as e:
        raise BadInput(f"{e} (--attn auto chose {name} for this checkpoint: name a backend, e.g. --attn vsa)") \
            from None


def check_ulysses(ulysses: int, src: ModelSource, *, offload: str, compile: bool, tile_fit: str, frames: int,
                   height: int, width: int) -> None:
    """Refuse a `--ulysses` that cannot run (before loading; `t2v`, `i2v` and `profile`, once per tile fit): it must be
    at least 1; not with --offload (diffusers #12533) nor --compile (not tested together); for a model of its
    preset's architecture, a degree that splits the heads and the tokens of the grid denoised under `tile_fit`.

    Raises:
        BadInput: one of these, in one line (the degree's: with the degrees that do divide).
    """
    if isinstance(ulysses, bool) or not isinstance(ulysses, int) or ulysses < 1:
        raise BadInput(f"--ulysses must be an integer of at least 1, got {ulysses!r}")
    if ulysses == 1:
        return
    if offload != "none":
        raise BadInput(f"--ulysses {ulysses} cannot run with --offload {offload} (diffusers' context parallelism "
                       "and offloading do not work together, diffusers #12533); use --offload none")
    if compile:
        raise BadInput(f"--ulysses {ulysses} with --compile is not supported yet; drop --compile")
    if src.exact_preset:
        from .layout import plan_crop
        from .parallel.ulysses import check_ulysses_degree

        p = src.preset
        grid = plan_crop(frames, height, width, fit=tile_fit, vae_stride_temporal=p.vae_stride_temporal,
                         vae_stride_spatial=p.vae_stride_spatial, patch_size=p.patch_size).denoise_grid
        check_ulysses_degree(ulysses, int(p.transformer["num_attention_heads"]), math.prod(grid))
