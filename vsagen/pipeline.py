"""The one orchestrator of every command that runs a Wan pipeline: load -> patch -> denoise (timed).

A `Session` owns one loaded pipeline (`vsagen.models.loading.load_model`), its prompt embeddings and its image-to-video
conditioning. `Session.run(backend, plan, ...)` then runs one configuration on it: patch every transformer through
`vsagen.apply` (one code path for patching, shared with the Python API), `warmup` untimed denoising steps, the
timed steps, optionally the VAE decode, unpatch; it returns the latents and the timer's records. Out of GPU
memory becomes a `RunFailure` naming what ran, with the request's own hints. The drivers add only their part:
`vsagen.commands.generate` (t2v / i2v) decodes, writes the mp4 and the timing JSON; `vsagen.commands.profile`
turns the runs of every backend and tile fit into report rows. A command comparing backends loads one session and runs each
backend on it from the same seed (every run seeds a fresh CPU generator).

Timed regions of a run (see `vsagen.timing`): "total" around the run; "text_encode" when the run encodes the
prompts itself; "denoise" (diffusers' pipeline call), with "image_encode" / "condition_encode" carved out of it for
image to video; "dit", "attn1", "self_attention" and "layout" from the hooks; "vae_decode" when it decodes.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from .architecture import experts
from .attention.dense import check_knobs_fit, every_layer_dense_note
from .cache.cache_spec import no_reuse_note
from .cache.install import expert_steps, install_cache
from .compiling import (compile_breaks, compile_note, compile_transformers, compile_untimed, fused_blocks_apply,
                        fused_blocks_note)
from .errors import RunFailure, out_of_memory_as_failure
from .kernels.runtime_notes import runtime_notes
from .layout import CropPlan, plan_crop
from .media.image import Conditioning  # noqa: F401 - re-exported: the commands build one for Session.load
from .models.loading import LoadedModel, load_model, torch_dtype, truncation_note
from .models.pipeline_weights import check_backend_weights, weights_note
from .request.resolve import Request
from .samplers import NAMED as NAMED_SAMPLERS, Sampler, initial_noise, use_sampler
from .timing import Timer, WarmUp, compile_seconds

def encode_prompts(cfg: Request, model: LoadedModel, do_cfg: bool) -> tuple[Any, Any]:
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


def denoise_plan(cfg: Request, pipe: Any, tile_fit: str, *, patch_size: Sequence[int] | None = None) -> CropPlan:
    """The crop plan of a request under `tile_fit` ("partial" | "crop"): the size that is denoised and the
    latent it is cropped back to (see `vsagen.layout.plan_crop`). `patch_size`: the transformer's (T, H, W) patch
    where no pipeline is at hand (`pipe` None; default: `pipe.transformer`'s)."""
    preset = cfg.source.preset
    patch = tuple(pipe.transformer.config.patch_size) if patch_size is None else tuple(patch_size)
    return plan_crop(cfg.frames, cfg.height, cfg.width, fit=tile_fit,
                     vae_stride_temporal=preset.vae_stride_temporal, vae_stride_spatial=preset.vae_stride_spatial,
                     patch_size=patch, tile=cfg.crop_tile)


def expert_kwargs(pipe: Any, cfg: Request) -> dict[str, Any]:
    """Extra pipeline-call arguments of two-expert pipelines (`guidance_scale_2`); {} for one expert."""
    two_experts = getattr(pipe.config, "boundary_ratio", None) is not None
    return {"guidance_scale_2": cfg.guidance_2} if two_experts and cfg.guidance_2 is not None else {}


def denoise_latents(pipe: Any, plan: CropPlan, pos: Any, neg: Any, *, steps: int, guidance: float, seed: int,
                    extra: dict[str, Any] | None = None, sampler: Sampler | None = None) -> Any:
    """Run diffusers' denoising loop at the plan's denoise size and return the latents, uncropped.

    Args:
        pipe: a Wan pipeline (already patched, if it should be).
        plan: the crop plan; its `denoise_*` sizes are what is denoised.
        pos, neg: prompt embeddings (1, L, text_dim); `neg` None without CFG.
        steps: denoising steps (a re-noise sampler runs its own sigma list instead); guidance: CFG scale (> 1 runs
            two transformer forwards a step; a re-noise sampler runs 1).
        seed: seeds a fresh CPU generator, so the initial latents are the same for every call at one size; a
            re-noise sampler's draws come from a generator seeded `seed + 2` (`vsagen.samplers.use_sampler`).
        extra: more call arguments (`expert_kwargs`, image).
        sampler: how the loop walks (None or `default`: the pipeline's own scheduler for `steps` steps).

    Returns:
        (1, z, F_lat, H_lat, W_lat) latents at the denoise size (as diffusers returns them).
    """
    import torch

    sampler = sampler if sampler is not None else NAMED_SAMPLERS["default"]
    generator = torch.Generator("cpu").manual_seed(seed)
    extra = dict(extra or {})
    if sampler.renoise:
        steps, guidance = len(sampler.sigmas), 1.0
        if sampler.sigmas[0] != 1.0:  # a re-noise sampler starts from sigma_0 x eps (rCM: 0.987654 x eps)
            extra["latents"] = initial_noise(pipe, plan.denoise_frames, plan.denoise_height, plan.denoise_width,
                                             generator) * sampler.sigmas[0]
    with use_sampler(pipe, sampler, seed):
        return pipe(prompt_embeds=pos, negative_prompt_embeds=neg if guidance > 1 else None,
                    height=plan.denoise_height, width=plan.denoise_width, num_frames=plan.denoise_frames,
                    num_inference_steps=steps, guidance_scale=guidance, generator=generator, output_type="latent",
                    return_dict=False, **extra)[0]


@contextlib.contextmanager
def status_after(log: Callable[[str], None], message: str, delay_s: float = 2.0) -> Iterator[None]:
    """Within the block, `log(message)` once if the block is still running after `delay_s` seconds (from a timer
    thread): a slow phase without a progress bar of its own (loading, the text encoder) gets a status line, a quick
    one no noise, and one that fails fast (a model not found) only its one error line."""
    timer = threading.Timer(delay_s, log, args=(message,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def decode_latents(pipe: Any, latents: Any) -> Any:
    """Un-normalise Wan latents and decode them: (1, z, F_lat, H_lat, W_lat) -> (1, 3, F, H, W) in [-1, 1]."""
    from .decode.stream import unnormalized

    return pipe.vae.decode(unnormalized(pipe.vae, latents), return_dict=False)[0]


def video_frames(pipe: Any, video: Any, expected: tuple[int, int, int]) -> Any:
    """A decoded video as the mp4's frames: (1, 3, F, H, W) in [-1, 1] (`decode_latents`) -> (F, H, W, 3) uint8
    numpy, through the pipeline's video processor (NaN, e.g. from random weights, becomes 0).

    Raises:
        RunFailure: the frames are not `expected` (F, H, W).
    """
    import torch

    from .media.video import to_uint8_frames

    with torch.inference_mode():
        frames = pipe.video_processor.postprocess_video(video.float(), output_type="np")[0]
    frames_u8 = to_uint8_frames(frames)
    if frames_u8.shape[:3] != tuple(expected):
        raise RunFailure(f"decoded video is {frames_u8.shape[:3]}, expected {tuple(expected)}")
    return frames_u8


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
    from .wrapping import wrap_method

    undos = []
    for method, region in CONDITION_REGIONS:
        def make(original: Callable, _region: str = region) -> Callable:
            def timed(*args: Any, **kwargs: Any) -> Any:
                with timer.region(_region, apart_from=outer):
                    return original(*args, **kwargs)
            return timed

        undos.append(wrap_method(pipe, method, make))

    def restore() -> None:
        for undo in reversed(undos):
            undo()

    return restore


@dataclass
class Denoised:
    """One `Session.run`.

    Attributes:
        latents: (1, z, F_lat, H_lat, W_lat) float32 final latents, cropped to the plan's requested latent.
        video: (1, 3, F, H, W) in [-1, 1] in the VAE's dtype when the run decoded, else None.
        records: the timer's (name, step, seconds) records (`Timer.finish`), warm-up excluded.
        warmup_s: host seconds of the untimed warm-up steps (0 without warm-up).
        plan: the crop plan that was denoised.
        warmup_parts: where `warmup_s` went (`WarmUp.parts`; empty without warm-up).
        calibration: a MagCache calibration run's (file, JSON text) (`InstalledCache.calibration_file`), for the
            caller to write with its other files (`vsagen t2v`: with the video, or not at all); else None.
    """

    latents: Any
    video: Any
    records: list[tuple[str, int, float]]
    warmup_s: float
    plan: CropPlan
    calibration: tuple[Any, str] | None = None
    warmup_parts: dict[str, float] = field(default_factory=dict)

    @property
    def layout_s(self) -> float:
        """Seconds of tile-order reorderings (region "layout")."""
        return sum(s for n, _, s in self.records if n == "layout")


@dataclass
class _Patched:
    """What `Session.run` put on the pipeline for one run, in the order it went on (`Session._unpatch` takes it off).

    Attributes:
        installed: the sampler's scheduler (an ExitStack around `use_sampler`).
        handle: `vsagen.apply`'s `AppliedBackend`.
        cached: the installed step cache, or None (no `--cache`).
        transformers: the pipeline's transformers (every expert).
        split: CFG parallel's wrappers (`vsagen.parallel.cfg.CfgSplit`), or None.
        unwrap: removes the image-to-video stage timers (`time_condition_stages`; a no-op for text to video).
    """

    installed: contextlib.ExitStack
    handle: Any
    cached: Any
    transformers: list[Any]
    split: Any = None
    unwrap: Callable[[], None] = lambda: None


@dataclass
class Session:
    """A loaded pipeline with its prompt embeddings and conditioning, ready to run backends on (see the module
    docstring). Build it with `Session.load`.

    Attributes:
        request: the validated request (`vsagen.request.resolve.Request`).
        model: the loaded pipeline and its notes.
        conditioning: the image-to-video pictures, or None (text to video).
        fused: whether runs get `vsagen.blocks`' compiled elementwise regions (`fused_blocks_apply`).
        compile_fullgraph: under `--compile`, whether each block is one graph; None without `--compile`.
        load_s: host seconds of `load_model` (loading and placing the weights).
        text_encode_s: host seconds of the one prompt encoding `prompts()` did (0 until then).
        vae_tiling: what `--vae-tiling` decided for the last decode (`decide_vae_tiling`), None before one.
    """

    request: Request
    model: LoadedModel
    conditioning: Conditioning | None = None
    fused: bool = False
    compile_fullgraph: bool | None = None
    load_s: float = 0.0
    text_encode_s: float = 0.0
    vae_tiling: Any = None  # the last decode's `vsagen.decode.tiling.TilingChoice` (None before one)
    _prompts: tuple[Any, Any] | None = field(default=None, repr=False)

    @classmethod
    def load(cls, request: Request, backends: Sequence[Any], *, also_runs: Sequence[Any] = (),
             conditioning: Conditioning | None = None, progress: bool = False,
             log: Callable[[str], None] = lambda m: None) -> "Session":
        """Load the request's pipeline once for runs of `backends`.

        Args:
            request: the validated request.
            backends: the attention backends the session will run (`AttentionBackend` objects); each is prepared
                for the run the request predicts under each of its tile fits (`Request.predicted_run`: device,
                dtype, the preset's architecture and grid) before anything loads, so it refuses what it cannot
                serve first, and again with the loaded transformers before any run starts. With `--offload` their own weights are attached before the weights are placed (group offloading records
                the parameters it manages; each run's `vsagen.apply` then finds them attached); otherwise each run
                attaches them and detaches them after it.
            also_runs: more backends that will run but are not named in the notes (profile's overhead rows);
                they count for `--compile`'s graph breaks.
            conditioning: image-to-video pictures, or None.
            progress: show diffusers' progress bar while denoising.
            log: receives progress lines.

        Raises:
            BadInput: a backend cannot run on this device / dtype, or the model cannot be loaded as asked.
            ModelNotFound: the checkpoint cannot be found or loaded.
        """
        also_notes: list[str] = []  # the request's knobs that leave nothing sparse (said with the load's notes)
        for fit in request.tile_fits:
            run = request.predicted_run(fit)
            for backend in backends:
                backend.prepare(run)  # refusals only: its notes are said once loaded (below)
                check_knobs_fit(backend, run)  # dense_layers past the model's blocks
                if (note := every_layer_dense_note(backend, run)) and note not in also_notes:
                    also_notes.append(note)
        t0 = time.perf_counter()
        with status_after(log, f"loading {request.model} ({'random weights, ' if request.random_weights else ''}"
                               f"{request.device} {request.dtype})"):
            model = load_model(request, log, backends if request.offload != "none" else ())
        load_s = time.perf_counter() - t0
        pipe = model.pipe
        truncated = truncation_note(pipe, request)
        if truncated is not None:
            model.notes.append(truncated)
        model.notes.extend(also_notes)
        from .api import run_info

        # the loaded transformers and the real grids: refused before any run starts, and the backends' notes said
        # now, before a progress bar (the run that binds one gives the same notes: the session keeps each once)
        steps = len(request.sampler.sigmas) if request.sampler.renoise else request.steps
        for fit in request.tile_fits:
            run = run_info(pipe, grid=denoise_plan(request, pipe, fit).denoise_grid, steps=steps, model=request.model)
            for backend in backends:
                model.notes.extend(n for n in backend.prepare(run) or () if n not in model.notes)
        if request.offload == "none":  # (offloaded runs attached them in load_model)
            check_backend_weights(model, backends)
        # on a terminal the bar is cleared when done; in a pipe or file it is left as a line of its own (cleared, it
        # left an unended line there, and the next message was appended to it)
        pipe.set_progress_bar_config(disable=not progress, desc="denoising", unit="step", leave=not sys.stderr.isatty())
        fused = fused_blocks_apply(request.device, request.compile, request.offload, request.fused_blocks)
        if fused:
            model.notes.append(fused_blocks_note(request.warmup))
        fullgraph = None
        if request.compile:  # each run compiles in its warm-up steps
            breaks = compile_breaks([*backends, *also_runs], request.offload)
            compile_transformers(pipe, fullgraph=breaks is None)
            model.notes.append(compile_note(breaks, [b.name for b in backends if b.traceable], request.warmup))
            fullgraph = breaks is None
        return cls(request, model, conditioning, fused, fullgraph, load_s)

    def _check_parallel(self, plan: CropPlan) -> None:
        """Before a multi-process run: refuse a Ulysses degree that does not split every transformer's heads and the
        plan's tokens evenly. (Each run switches the parallelism on after patching and off before unpatching, so a
        session runs any number of them: `vsagen profile --ulysses`.)"""
        import math

        from .parallel.ulysses import check_ulysses_degree

        for _, transformer in experts(self.pipe):
            check_ulysses_degree(self.request.ulysses, int(transformer.config.num_attention_heads),
                                 math.prod(plan.denoise_grid))

    @property
    def pipe(self) -> Any:
        """The diffusers pipeline."""
        return self.model.pipe

    @property
    def notes(self) -> list[str]:
        """The run notes gathered so far (loading, compile, fused blocks, backend weights)."""
        return self.model.notes

    def plan(self, tile_fit: str) -> CropPlan:
        """The crop plan of the request under `tile_fit` (`denoise_plan`)."""
        return denoise_plan(self.request, self.pipe, tile_fit)

    def untimed(self, backend: Any) -> tuple[str, ...]:
        """The regions a run of `backend` cannot time (`compile_untimed` under `--compile`; none otherwise)."""
        return compile_untimed(backend) if self.request.compile and backend is not None else ()

    def encode_prompts(self) -> tuple[Any, Any]:
        """Fresh prompt embeddings (`encode_prompts`; negative None without CFG)."""
        cfg = self.request  # the negative branch is encoded when any run of the request has CFG on
        return encode_prompts(cfg, self.model, cfg.guidance > 1.0 or any(p.guidance > 1.0 for p in cfg.samplers))

    def prompts(self) -> tuple[Any, Any]:
        """The session's prompt embeddings, encoded on first use (host clock into `text_encode_s`) and reused by
        every run that does not encode its own."""
        if self._prompts is None:
            import torch

            t0 = time.perf_counter()
            with torch.inference_mode():
                self._prompts = self.encode_prompts()
            if self.request.device == "cuda":
                torch.cuda.synchronize()
            self.text_encode_s = time.perf_counter() - t0
        return self._prompts

    def run(self, backend: Any, plan: CropPlan, *, steps: int | None = None, warmup: int | None = None,
            timer: Timer | None = None, encode: bool = False, decode: bool = False,
            context: Callable[[], Any] = contextlib.nullcontext, what: str = "generating",
            log: Callable[[str], None] = lambda m: None, sampler: Sampler | None = None,
            guidance: float | None = None, cache: Any = None, warm_decode: bool = False) -> Denoised:
        """Patch, warm up, denoise (timed), optionally decode, unpatch.

        Args:
            backend: an `AttentionBackend` object, or None for the pipeline's own processors (DiT timing only).
            plan: the crop plan (`Session.plan`); its denoise size is what runs, the latents come back cropped.
            steps: timed denoising steps (default the request's); warmup: untimed steps before them, the
                prompt encoding included when `encode` (default the request's). A re-noise sampler runs its own
                sigma list for either (warm-up: one whole pass when `warmup` > 0).
            sampler, guidance: how the loop walks and its CFG scale (default the request's first sampler and
                `guidance`; `vsagen compare` runs several).
            timer: receives the regions (default a new one on the request's device).
            encode: encode the prompts inside the timed run (region "text_encode"), else reuse `prompts()`.
            decode: VAE-decode the cropped latents (region "vae_decode") into `Denoised.video`.
            context: a context manager factory entered around warm-up and timed steps (e.g. SDPA pinning).
            what: names the run in an out-of-memory message ("generating", "profiling vsa (tile fit crop)").
            cache: the step cache (`vsagen.cache.cache_spec.CacheSpec`; default the request's first), installed on every
                expert after the backend and removed before it (`vsagen.cache.install`); MagCache's calibration
                comes back in `Denoised.calibration`, unwritten.
            log: receives a status line before each phase without a progress bar of its own (the VAE decode).
            warm_decode: the warm-up (`warmup` > 0) also decodes its latents' first two latent frames, untimed, for
                a caller that decodes the run's latents afterwards (`decode` does so on its own).

        Returns:
            `Denoised` (latents cropped to `plan.latent`, video if decoded, records, warm-up seconds).

        Raises:
            BadInput: the backend cannot run here, or its weights do not fit.
            RunFailure: out of GPU memory (with the request's `memory_hints`).
        """
        import torch

        cfg = self.request
        steps = cfg.steps if steps is None else steps
        warmup = cfg.warmup if warmup is None else warmup
        timer = Timer(cfg.device) if timer is None else timer
        sampler = cfg.sampler if sampler is None else sampler
        guidance = cfg.guidance if guidance is None else guidance
        pipe = self.pipe
        extra = expert_kwargs(pipe, cfg)
        if self.conditioning is not None:
            extra.update(self.conditioning.arguments(cfg.height, cfg.width, plan))
        if cfg.processes > 1:
            self._check_parallel(plan)
        cache = cfg.cache if cache is None else cache
        n_steps = len(sampler.sigmas) if sampler.renoise else steps
        patched = self._patch(backend, plan, timer, sampler, cache, n_steps)
        self._note_patch(backend, patched)
        patched.unwrap = time_condition_stages(pipe, timer) if self.conditioning is not None else (lambda: None)

        def denoise(pos: Any, neg: Any, n: int) -> Any:
            if patched.split is not None:
                patched.split.negative = neg
            return denoise_latents(pipe, plan, pos, neg, steps=n, guidance=guidance, seed=cfg.seed, extra=extra,
                                   sampler=sampler)

        try:
            with out_of_memory_as_failure(what, cfg.memory_hints()), torch.inference_mode(), context():
                warm = self._warm_up(denoise, warmup, encode, timer, plan, warm_decode or decode)
                latents, video = self._timed_steps(denoise, plan, steps, timer, encode=encode, decode=decode, log=log)
                records = timer.finish()
        finally:
            self._unpatch(patched)
        if (note := no_reuse_note(cache, records, "" if what == "generating" else what)) and note not in self.notes:
            self.notes.append(note)
        self.notes.extend(n for n in runtime_notes() if n not in self.notes)  # a kernel that fell back in the run
        cached = patched.cached
        return Denoised(latents, video, records, warm.seconds, plan,
                        cached.calibration_file(cfg.model, n_steps, sampler.name) if cached is not None else None,
                        warm.parts())

    def _patch(self, backend: Any, plan: CropPlan, timer: Timer, sampler: Sampler, cache: Any,
               n_steps: int) -> "_Patched":
        """Put a run's pieces on the pipeline, in this order: the sampler's scheduler (before `apply`, which counts
        the steps at the pipeline's scheduler), the backend (`vsagen.apply`), the step cache (when enabled) and,
        under several processes, the parallelism. A piece that fails to go on takes the ones before it off again."""
        from .api import apply

        cfg = self.request
        pipe = self.pipe
        installed = contextlib.ExitStack()
        installed.enter_context(use_sampler(pipe, sampler, cfg.seed))
        try:
            handle = apply(pipe, backend, timer=timer, grid=plan.denoise_grid, steps=n_steps, fused_blocks=self.fused,
                           weights_root=self.model.weight_root, model=cfg.model)
        except BaseException:
            installed.close()
            raise
        transformers = [t for _, t in experts(pipe)]
        try:
            cached = install_cache(experts(pipe), cache, timer, steps=expert_steps(pipe, n_steps)) \
                if cache.enabled else None
        except BaseException:
            handle.remove()
            installed.close()
            raise
        patched = _Patched(installed, handle, cached, transformers)
        if cfg.processes > 1:
            from .parallel.launch import enable_parallel

            try:
                patched.split = enable_parallel(transformers, cfg.ulysses, cfg.cfg_parallel, cfg.device, timer)
            except BaseException:
                self._unpatch(patched)
                raise
        return patched

    def _unpatch(self, patched: "_Patched") -> None:
        """Take a run's pieces off the pipeline: CFG parallel's wrappers, the Ulysses parallelism, the image-to-video
        stage timers, the step cache, the backend, the sampler's scheduler (in that order)."""
        if patched.split is not None:
            patched.split.remove()
        self._parallel_off(patched.transformers)
        patched.unwrap()
        if patched.cached is not None:
            patched.cached.remove()
        patched.handle.remove()
        patched.installed.close()

    def _note_patch(self, backend: Any, patched: "_Patched") -> None:
        """Keep what the patch said, once per session however many runs: the layers holding the backend's own
        weights (`LoadedModel.weight_layers`), the backend's notes and the weights note."""
        handle = patched.handle
        if handle.weight_layers:
            self.model.weight_layers[backend.name] = handle.weight_layers
        weights = weights_note(backend, handle.weight_layers, sum(len(t.blocks) for t in patched.transformers)) \
            if backend is not None else None
        for note in (*handle.notes, weights):  # once per session, however many runs
            if note is not None and note not in self.notes:
                self.notes.append(note)

    def _warm_up(self, denoise: Callable[[Any, Any, int], Any], warmup: int, encode: bool, timer: Timer,
                 plan: CropPlan, warm_decode: bool) -> "WarmUp":
        """The untimed warm-up steps (the timer off; the prompts encoded afresh when `encode`), with `warm_decode` the
        first two latent frames of their latents decoded as the run's decode will be (`vsagen.decode.stream.
        warm_decode`), then an idle device; returns where its host seconds went (all 0 without warm-up). The timer is
        on again after."""
        import torch

        timer.enabled = False
        warm = WarmUp(compile_before=compile_seconds())
        t0 = time.perf_counter()
        if warmup:
            latents = denoise(*(self.encode_prompts() if encode else self.prompts()), warmup)
            if self.request.device == "cuda":
                torch.cuda.synchronize()
            warm.denoise = time.perf_counter() - t0
            if warm_decode:  # the decoder's first call too (cuDNN, the kernels' loading), on the decode's own shape
                from .decode.stream import streams, warm_decode as decode_first_frames

                f, h, w = plan.latent
                latents = latents[:, :, :f, :h, :w]
                noted = len(self.notes)
                self.decide_vae_tiling(latents, streamed=streams(self.pipe.vae))
                del self.notes[noted:]  # the timed decode decides again, and notes its decision then
                decode_first_frames(self.pipe.vae, self.pipe.video_processor, latents)
        if self.request.device == "cuda":
            torch.cuda.synchronize()  # the timed steps start on an idle device
        if warmup:
            warm.seconds = time.perf_counter() - t0
            warm.compile = compile_seconds() - warm.compile_before
        timer.enabled = True
        return warm

    def _timed_steps(self, denoise: Callable[[Any, Any, int], Any], plan: CropPlan, steps: int, timer: Timer, *,
                     encode: bool, decode: bool, log: Callable[[str], None]) -> tuple[Any, Any]:
        """The timed run in region "total": the prompts ("text_encode" when `encode`), the denoising steps
        ("denoise", timer steps from 0), the latents cropped to `plan.latent`, the VAE decode ("vae_decode") when
        `decode`. Returns (latents, video or None)."""
        cfg = self.request
        video = None
        with timer.region("total"):
            if encode:
                with timer.region("text_encode"), status_after(log, "encoding the prompt (text encoder)"):
                    pos, neg = self.encode_prompts()
            else:
                pos, neg = self.prompts()
            timer.step = 0
            with timer.region("denoise"):
                latents = denoise(pos, neg, steps)
            timer.step = -1
            f, h, w = plan.latent
            latents = latents[:, :, :f, :h, :w]
            if decode:
                log(f"decoding the video (VAE, {cfg.frames} frame{'s' if cfg.frames != 1 else ''})")
                self.decide_vae_tiling(latents, streamed=False)
                with timer.region("vae_decode"):
                    video = decode_latents(self.pipe, latents)
        return latents, video

    def decide_vae_tiling(self, latents: Any, *, streamed: bool) -> Any:
        """Decide `--vae-tiling` for decoding `latents` (1, z, F_lat, H_lat, W_lat) now and set the VAE's tiling
        (`vsagen.decode.tiling.decide_decode_tiling`: `auto` by the untiled decode's estimated peak against the
        memory free now); `streamed`: `vsagen.decode.stream`'s decode, else `vae.decode`. Under `auto` the reason
        becomes a note of the session, once per decision (tiled / untiled). Returns the `TilingChoice` (also kept
        in `vae_tiling`)."""
        from .decode.tiling import decide_decode_tiling

        cfg = self.request
        choice = decide_decode_tiling(self.pipe.vae, tuple(latents.shape), cfg.vae_tiling, cfg.device,
                                      streamed=streamed, height=cfg.height, width=cfg.width)
        if cfg.vae_tiling == "auto" and not any(n.startswith(choice.decision()) for n in self.notes):
            self.notes.append(choice.why())
        self.vae_tiling = choice
        return choice

    def _parallel_off(self, transformers: Sequence[Any]) -> None:
        """Switch diffusers' context parallelism off again after a `--ulysses` run (before vsagen's patch is removed:
        the hooks went on after it)."""
        if self.request.ulysses > 1:
            from .parallel.launch import disable_ulysses

            for t in transformers:
                disable_ulysses(t)
