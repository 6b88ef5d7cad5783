"""`vsagen.apply`: put a vsagen attention backend into a diffusers Wan pipeline you built yourself.

    import vsagen
    handle = vsagen.apply(pipe, "vsa", sparsity=0.875)    # or "vsa:sparsity=0.9", or a BackendSpec
    video = pipe(prompt=..., ...).frames[0]
    print(handle.report().rich_table())                  # DiT vs attention time (vsagen.timing.TimingReport)
    handle.remove()                                      # the pipeline is stock again

`apply` installs one `VsagenAttnProcessor` per `attn1` layer, the tile-order hooks (tiled backends) and the DiT
timers on every transformer of the pipeline (`transformer`, and `transformer_2` of two-expert pipelines; a bare
`WanTransformer3DModel` works too). It is also the only way the `vsagen` commands patch a pipeline
(`vsagen.pipeline.Session.run`).

Steps: the report's per-step DiT times need the denoising step of every transformer forward. `apply` counts steps
at the pipeline's scheduler: it wraps `pipe.scheduler.step` (on that scheduler instance only, undone by
`remove()`), which diffusers' Wan pipelines call once per denoising step, after that step's transformer forwards
(both CFG passes, either expert). Nothing has to be passed to the pipeline call. Consequences: set the scheduler
before `apply` (a scheduler swapped in afterwards is not counted); for the report several pipeline calls count on
(steps 0..n-1, then n..2n-1), while the step a backend sees (`AttnContext.step`) starts at 0 in every call (reset
when the pipeline sets the scheduler's timesteps); a bare transformer has no scheduler, so its forwards stay at
`handle.timer.step` (set it yourself to split them by step). The timer keeps every region until the handle is
removed: for a long-lived handle, turn it off with `handle.timer.enabled = False` or apply again per batch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from pathlib import Path
from typing import Any, Callable

import torch

from .architecture import architecture_of
from .attention import BackendSpec, backend_class
from .attention.base import AttentionBackend, Expert, RunInfo, option_names
from .attention.dense import check_knobs_fit, knob_info, reset_counts
from .attention.spec import convert_option, make_options, no_option, parse_entry, spec_of
from .errors import BadInput
from .kernels.runtime_notes import runtime_notes
from .timing import Timer, TimingReport
from .wrapping import wrap_method

WHERE = "vsagen.apply"  # names the caller in BadInput messages
# The commands' flags in the backends' refusals, and what a Python caller sets instead (`python_words`).
_FLAG_WORDS = ((re.compile(r"--attn-impl (\w+) or [\w-]+:impl=\w+"), r"impl='\1'"),
               (re.compile(r"--attn-impl (\w+)"), r"impl='\1'"),
               (re.compile(r"--dtype (bf16|fp16)(?: or fp16)?"), "a bf16 or fp16 pipeline: pipe.to(torch.bfloat16)"),
               (re.compile(r"--attn ([\w-]+)"), r"\1"))


def python_words(message: str) -> str:
    """A backend's refusal (worded for the commands: `--attn-impl triton`, `--dtype bf16`, `--attn NAME`) in the words
    of `vsagen.apply`'s caller (`impl='triton'`, a bf16 pipeline, NAME), prefixed "vsagen.apply: "."""
    for pattern, words in _FLAG_WORDS:
        message = pattern.sub(words, message)
    return f"{WHERE}: {message}"
SPEC_WHERE = "vsagen.apply backend"  # ... and in those of the spec parser ("unknown vsagen.apply backend 'x'")
# the regions of a whole pipeline call, which `apply` does not time (the commands do): None in its report
OUTER_REGIONS = ("total", "text_encode", "denoise", "vae_decode", "image_encode", "condition_encode")


def _transformers(pipe: Any) -> list[tuple[str | None, Any]]:
    """The Wan transformers of `pipe` by component name, or [(None, pipe)] for a bare transformer.

    Raises:
        BadInput: `pipe` is neither a Wan transformer nor a pipeline with one.
    """
    if _is_wan_transformer(pipe):
        return [(None, pipe)]
    found = [(n, t) for n in ("transformer", "transformer_2") if (t := getattr(pipe, n, None)) is not None]
    if not found or not all(_is_wan_transformer(t) for _, t in found):
        raise BadInput(f"{WHERE}: {type(pipe).__name__} is neither a Wan pipeline with a transformer nor a "
                       "WanTransformer3DModel")
    return found


def _is_wan_transformer(module: Any) -> bool:
    """A diffusers Wan transformer as vsagen patches it: blocks with an `attn1` each, a `rope`, a `proj_out`."""
    blocks = getattr(module, "blocks", None)
    return (isinstance(module, torch.nn.Module) and hasattr(module, "rope") and hasattr(module, "proj_out")
            and isinstance(blocks, torch.nn.ModuleList) and len(blocks) > 0
            and all(hasattr(b, "attn1") for b in blocks))


def _device_of(pipe: Any, transformer: Any) -> torch.device:
    """Where the transformer computes: the pipeline's execution device (which sees through diffusers'
    offloading), else the transformer's parameters' device."""
    device = getattr(pipe, "_execution_device", None) if pipe is not transformer else None
    return torch.device(device) if device is not None else next(transformer.parameters()).device


def _weights_folder(root: Path | None, component: str | None, transformer: Any) -> Path | None:
    """A transformer's folder of backend-owned weights: `<root>/<component>/` (`root` itself for a bare
    transformer); without a root, the local folder the transformer was loaded from (diffusers' `_name_or_path`,
    e.g. `<checkpoint>/transformer`), if there is one."""
    if root is None:
        loaded_from = getattr(getattr(transformer, "config", None), "_name_or_path", None)
        return Path(loaded_from) if isinstance(loaded_from, str) and loaded_from and Path(loaded_from).is_dir() \
            else None
    return Path(root) / component if component is not None else Path(root)


def _typed(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """Option values as the Options fields declare them: a str is read as the text of `NAME:KEY=VALUE` is
    (`sparsity="0.9"` as `vsa:sparsity=0.9`, a path for a Path field); other values pass as given."""
    return {key: convert_option(cls, key, value, WHERE) if isinstance(value, str) else value
            for key, value in values.items()}


def backend_spec(backend: str | BackendSpec, options: dict[str, Any],
                 defaults: dict[str, dict[str, Any]] | None = None) -> BackendSpec:
    """The `BackendSpec` of `apply`'s arguments: a registered name, `NAME[:KEY=VALUE...]` text or a spec, with
    `options` (keyword arguments, typed values) set on top; `defaults`, a preset's per-backend tables ({"vsa":
    {"sparsity": 0.8}}), fill what neither sets (below them, above the backend's own defaults), as for the commands.

    Raises:
        BadInput: an unknown backend (the message lists the registered ones), an unknown option (it lists the
            backend's options), an option given both in the text and as a keyword, or a value the backend's
            Options refuse.
    """
    if isinstance(backend, BackendSpec):
        spec, in_text = backend, set()
    else:
        entry = parse_entry(str(backend.value if isinstance(backend, Enum) else backend), SPEC_WHERE)
        spec, in_text = spec_of(entry, preset=defaults, where=SPEC_WHERE), set(entry.options)
    if not options:
        return spec
    cls = backend_class(spec.name).Options
    known = option_names(cls)
    for key in options:
        if key not in known:
            raise BadInput(f"{WHERE}: {no_option(spec.name, key, known)}")
        if key in in_text:
            raise BadInput(f"{WHERE}: option {key!r} of {spec.name} given in the text and as a keyword")
    current = {f.name: getattr(spec.options, f.name) for f in fields(spec.options)}
    return BackendSpec(spec.name, make_options(spec.name, {**current, **_typed(cls, options)}, SPEC_WHERE))


@dataclass
class AppliedBackend:
    """What `apply` installed on a pipeline (or transformer); `remove()` (or leaving a `with` block) undoes it.

    Attributes:
        backend: the attention backend object the processors call, or None (`apply(pipe, None)`: timing only).
        spec: its `BackendSpec` (name and options), or None.
        timer: receives every region (see `vsagen.timing`); `timer.step` tags the DiT forwards.
        device: where the transformers compute.
        weight_layers: how many layers hold backend-owned weights after this `apply` (0: none attached).
        notes: what the backend said of the run when it was prepared (e.g. sparse-vdit mapping its file's step
            ranges onto `steps`).
        loras: what `apply(..., lora=...)` loaded: file, sha256, scale, expert, components, fused.
    """

    backend: AttentionBackend | None
    spec: BackendSpec | None
    timer: Timer
    device: torch.device
    weight_layers: int = 0
    notes: tuple[str, ...] = ()
    loras: list[dict[str, Any]] = field(default_factory=list)  # one record per LoRA loaded (`vsagen.models.lora`)
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _first_step: int = field(default=0, repr=False)  # timer.step when applied

    def report(self, **extra: Any) -> TimingReport:
        """The time recorded so far (synchronizes once on CUDA; every pipeline call since `apply`, see the module
        docstring): DiT seconds per forward and per step, the attention backend's seconds and stages, the attention
        share of DiT time. The regions of the pipeline call around the DiT (`OUTER_REGIONS`: `total_s`,
        `text_encode_s`, `denoise_s`, `vae_decode_s`, `image_encode_s`, `condition_encode_s`) are None (null in
        the JSON, as is `wait_s`) unless the timer holds them: `apply` does not wrap the pipeline call. `extra` sets
        further report fields (`TimingReport.from_records`)."""
        records = self.timer.finish()
        timed = {name for name, _, _ in records}
        report = replace(TimingReport.from_records(records, self.device.type, **extra),
                         **{f"{region}_s": None for region in OUTER_REGIONS if region not in timed})
        report.notes.extend(runtime_notes())  # a kernel that fell back (once per process: `kernels.runtime_notes`)
        if report.dit_forwards == 0 and self.timer.step > self._first_step:
            report.notes.append(f"the scheduler stepped {self.timer.step - self._first_step} times but no DiT forward "
                                "was timed: torch.compile of the whole transformer runs around vsagen's hooks; "
                                "compile its blocks instead: pipe.transformer.compile_repeated_blocks(fullgraph=True)")
        return report

    def describe(self) -> dict[str, Any]:
        """The backend as the commands' JSON gives it under `backend`: its name and options and, on this device, the
        implementation that ran (`impl_ran`: "triton", "torch", "fa4" (vsa's fine stage on FlashAttention-4) or
        "sdpa"), e.g. {"name": "vsa", "sparsity": 0.875, "impl": "auto", "tile": "4x4x8", "impl_ran": "triton"};
        {"name": None} for `apply(pipe, None)` (timing only)."""
        if self.backend is None:
            return {"name": None}
        return {**self.backend.describe(self.device), **knob_info(self.backend)}

    def remove(self) -> None:
        """Restore the pipeline: the processors it had, no vsagen hooks, its scheduler's own `step`, no weights
        attached by this `apply`, and no LoRA (an unfused one's PEFT layers deleted; a fused one's product
        subtracted from the weights again, as they were up to rounding in their dtype). Calling it again does
        nothing."""
        while self._undo:
            self._undo.pop()()

    def __enter__(self) -> "AppliedBackend":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def _count_steps(pipe: Any, timer: Timer, states: list[Any]) -> Callable[[], None]:
    """Advance `timer.step` after every `pipe.scheduler.step` call (see the module docstring), and each patched
    transformer's `ForwardState.step` (the step within the current pipeline call, reset by
    `scheduler.set_timesteps`). Returns the undo."""
    scheduler = getattr(pipe, "scheduler", None)
    if scheduler is None or not callable(getattr(scheduler, "step", None)):
        return lambda: None
    undos: list[Callable[[], None]] = []

    def wrap(name: str, after: Callable[[], None]) -> None:
        if not callable(getattr(scheduler, name, None)):
            return

        def make(original: Callable) -> Callable:
            def call(*args: Any, **kwargs: Any) -> Any:
                out = original(*args, **kwargs)
                after()
                return out
            return call

        undos.append(wrap_method(scheduler, name, make))

    def stepped() -> None:
        timer.step += 1
        for state in states:
            state.step = (state.step or 0) + 1

    def reset() -> None:
        steps = _scheduler_steps(scheduler)
        for state in states:
            state.step = 0
            state.steps = steps if steps is not None else state.steps

    wrap("step", stepped)
    wrap("set_timesteps", reset)
    reset()

    def undo() -> None:
        for restore in reversed(undos):
            restore()
        for state in states:
            state.step = None

    return undo


def _scheduler_steps(scheduler: Any) -> int | None:
    """The step count of the scheduler's current timesteps (`num_inference_steps`, else the timesteps' length), or
    None before any were set."""
    steps = getattr(scheduler, "num_inference_steps", None)
    if isinstance(steps, int) and not isinstance(steps, bool):
        return steps
    timesteps = getattr(scheduler, "timesteps", None)
    return None if timesteps is None else len(timesteps)


def run_info(pipe: Any, *, grid: tuple[int, int, int] | None = None, steps: int | None = None,
             model: str | None = None) -> RunInfo:
    """The `RunInfo` a backend is prepared with on `pipe` (a Wan pipeline or a bare transformer): the execution
    device, the transformers' dtype, each transformer's component name and architecture, and `grid` / `steps` /
    `model` as given.

    Raises:
        BadInput: `pipe` is neither a Wan transformer nor a pipeline with one.
    """
    transformers = _transformers(pipe)
    first = transformers[0][1]
    return RunInfo(_device_of(pipe, first), first.dtype,
                   tuple(Expert(name, architecture_of(t)) for name, t in transformers),
                   None if grid is None else tuple(grid), steps, model=model)


def apply(pipe: Any, backend: str | BackendSpec | AttentionBackend | None, /, *, timer: Timer | None = None,
          grid: tuple[int, int, int] | None = None, steps: int | None = None, fused_blocks: bool = False,
          weights_root: Path | None = None, attach_weights: bool = True, fused_prologue: str = "auto",
          model: str | None = None, quant: str = "none", lora: Any = None, **options: Any) -> AppliedBackend:
    """Replace the video self-attention (`attn1`) of every transformer in `pipe` by a vsagen backend, and time it.

    This is the one place a backend meets a pipeline: the backend is prepared for the run (`prepare`, with the
    transformers' architectures, device and dtype, and `grid` / `steps` where given), its own weights are attached,
    every `attn1` gets a vsagen processor. torch's compile caches are pointed into vsagen's cache folder where the
    user has not placed them (`vsagen.models.compile_caches.use_compile_caches`).

    Args:
        pipe: a diffusers Wan pipeline (`WanPipeline`, `WanImageToVideoPipeline`, ...; both experts of two-expert
            pipelines are patched) or a bare `WanTransformer3DModel`.
        backend: a registered name ("full", "vsa"), `NAME[:KEY=VALUE...]` text ("vsa:sparsity=0.9"), a
            `BackendSpec`, or a backend object (options then go into the object); None installs only the DiT
            timers and keeps the pipeline's own processors (times stock diffusers). A name or text on a pipeline
            from `vsagen.load_pipeline(preset)` takes the preset's option defaults where neither sets one, as
            the commands do (fastwan2.1-t2v-1.3b's vsa sparsity 0.8; the tiny models' sparse-vdit pattern file).
        timer: where regions go; default a new `Timer` on the pipeline's execution device, its step set to 0.
        grid: the post-patch latent grid (T, Hl, Wl) the pipeline will denoise, if known: a backend tied to one
            (sparse-vdit's pattern file) refuses another here rather than at the first forward.
        steps: denoising steps of each pipeline call, if known (sparse-vdit maps its file's step ranges onto it).
        fused_blocks: also install `vsagen.blocks`' compiled elementwise regions (eager CUDA runs without
            offloading; see `vsagen.compiling.fused_blocks_apply`).
        weights_root: a checkpoint folder whose `<component>/` subfolders (`transformer/`, `transformer_2/`; the
            folder itself for a bare transformer) hold backend-owned weights (VSA's `to_gate_compress`); None: the
            local folder each transformer was loaded from (`from_pretrained` of a local checkpoint), if any. A file
            named by the backend's options (vsa's `gate_weights`) takes precedence. It must be an existing folder.
        attach_weights: attach the backend's own weights (from the options' file or `weights_root`); layers that
            hold them already (from the same source) keep them. `remove()` puts back what the layers had before.
        fused_prologue: the q/k norm + RoPE prologue: "auto" (the fused Triton kernel on CUDA, diffusers'
            arithmetic elsewhere), "on" or "off" (`vsagen.attention.processor.use_fused_prologue`).
        model: the model's name as loaded (a preset name, folder or hub id), if known: for the backend's notes
            (sparse-vdit says when its pattern file was searched on another model of the same architecture).
        quant: the precision of the transformers' block linears (`vsagen.quant`, the CLI's `--quant`): "none",
            "fp8" (FP8 e4m3 W8A8, GPUs of compute capability 8.9+) or "int8" (TurboDiffusion's int8 W8A8 with
            128 x 128 block scales; CPU or sm80+); `remove()` puts the original linears back.
        lora: LoRAs loaded into the transformers first, through diffusers' Wan LoRA loader (`vsagen.models.lora`):
            one or a list of `FILE_OR_HUB_ID[:scale=S][:expert=1|2|both][:fused=false]` texts (the commands'
            `--lora`) or `vsagen.models.lora_spec.LoraSpec`s; fused into the weights by default, before `quant`.
        **options: the backend's options (e.g. sparsity=0.875, impl="torch"), on top of those in `backend`.

    Returns:
        An `AppliedBackend`: `report()`, `remove()`, `backend`, `spec`, `timer`, `notes`; also a context manager.

    Raises:
        BadInput: an unknown backend or option (the message lists the backend's options), a value the backend
            refuses, a backend that cannot run on the transformers' device / dtype or refuses their architecture or
            `grid`, options given with a backend object or None, a pipeline without a Wan transformer, a pipeline
            vsagen has patched already (remove() the earlier handle first), a `weights_root` that is not an
            existing folder, backend weights that do not fit, a `quant` the device cannot run, or a LoRA that
            cannot load (a damaged file, no layer or another shape of this model, expert 2 of a one-expert
            pipeline, unfused with a `quant`).
    """
    from .attention.hooks import is_patched
    from .models.compile_caches import use_compile_caches

    transformers = _transformers(pipe)
    device = _device_of(pipe, transformers[0][1])
    weights_root = _checked_weights_root(weights_root)
    _check_quant(quant, device)
    loras = _lora_files(lora, quant)
    spec, built = _backend_of(pipe, backend, options)
    notes = _prepared(built, pipe, transformers, grid=grid, steps=steps, model=model)  # before anything changes
    timer = _step_zero_timer(device) if timer is None else timer
    if any(is_patched(t) for _, t in transformers):  # before anything is attached: a refusal changes nothing
        raise BadInput(f"{WHERE}: this pipeline is already patched by vsagen: remove() the earlier handle first")
    use_compile_caches()  # the Triton kernels, and the fused blocks' compiled code, kept in vsagen's cache folder
    handle = AppliedBackend(built, spec, timer, device, notes=notes, _first_step=timer.step)
    try:
        _load_loras(handle, pipe, loras)  # before the patch and the low-bit swap
        _install(handle, pipe, transformers, weights_root=weights_root, attach_weights=attach_weights,
                 fused_blocks=fused_blocks, fused_prologue=fused_prologue, steps=steps)
        handle.notes += _quantize(handle, transformers, quant)
    except BaseException:
        handle.remove()
        raise
    return handle


def _prepared(built: AttentionBackend | None, pipe: Any, transformers: list[tuple[str, Any]], *,
              grid: tuple[int, int, int] | None, steps: int | None, model: str | None) -> tuple[str, ...]:
    """Prepare `built` (None: no backend, no notes) for the run `pipe` predicts (`run_info`) and check its quality
    knobs fit it; its notes. Raises BadInput in Python's words (the backends' checks speak the commands' flags)."""
    if built is None:
        return ()
    try:
        run = run_info(pipe, grid=grid, steps=steps, model=model)
        notes = tuple(built.prepare(run) or ())  # (None: none)
        check_knobs_fit(built, run, has_scheduler=pipe is not transformers[0][1])
    except BadInput as exc:
        raise BadInput(python_words(str(exc))) from None
    return notes


def _step_zero_timer(device: torch.device) -> Timer:
    """A new `Timer` on `device`, its step set to 0 (`apply`'s default)."""
    timer = Timer(device)
    timer.step = 0
    return timer


def _load_loras(handle: AppliedBackend, pipe: Any, loras: list[Any]) -> None:
    """Load `loras` (none: nothing) into `pipe`'s transformers, checked whole before anything changes; their
    records to `handle.loras` and their undo to `handle`'s (`remove()` unloads them). Raises BadInput in Python's
    words."""
    if not loras:
        return
    from .models.lora import load_loras

    try:
        handle.loras, undo, _ = load_loras(pipe, loras, undoable=True)
    except BadInput as exc:
        raise BadInput(f"{WHERE}: {str(exc).replace('--lora ', 'lora ')}") from None
    handle._undo.append(undo)


def _check_quant(quant: str, device: torch.device) -> None:
    """BadInput (in Python's words) for an unknown `quant` or one the device cannot run."""
    from .quant.fp8_linear import fp8_unsupported
    from .quant.int8_linear import int8_unsupported
    from .quant.swap import PRECISIONS

    if quant not in PRECISIONS:
        raise BadInput(f"{WHERE}: quant must be one of {', '.join(PRECISIONS)}, got {quant!r}")
    problem = {"none": None, "fp8": fp8_unsupported, "int8": int8_unsupported}[quant]
    problem = problem(device) if problem else None
    if problem:
        raise BadInput(f"{WHERE}: " + problem.replace(f"--quant {quant}", f"quant={quant!r}"))


def _lora_files(lora: Any, quant: str) -> list[Any]:
    """`apply`'s `lora` parsed (`vsagen.models.lora_spec.parse_loras`), fetched and header-checked
    (`vsagen.models.lora.fetch`).

    Raises:
        BadInput: (in Python's words) what the parser or the header check refuses; an unfused LoRA with a quant.
    """
    if lora is None:
        return []
    from .models.lora import fetch
    from .models.lora_spec import parse_loras

    try:
        specs = parse_loras(lora, "lora")
        for spec in specs:
            if not spec.fused and quant != "none":
                raise BadInput(f"lora {spec.source}:fused=false keeps PEFT layers around the linears that "
                               f"quant={quant!r} swaps for low-bit ones: fuse it or use quant='none'")
        return [fetch(spec) for spec in specs]
    except BadInput as exc:
        raise BadInput(f"{WHERE}: {str(exc).replace('--lora ', 'lora ')}") from None


def _quantize(handle: AppliedBackend, transformers: list[tuple[str | None, Any]], quant: str) -> tuple[str, ...]:
    """Swap every transformer's block linears for `quant` ones (`vsagen.quant.swap`), the originals put back by
    `handle.remove()`; the notes."""
    if quant == "none":
        return ()
    from .quant.swap import block_linears, put_modules, quantize_transformer

    notes = []
    for name, t in transformers:
        originals = dict(block_linears(t))
        report = quantize_transformer(t, quant)
        handle._undo.append(lambda t=t, o={n: originals[n] for n in report.swapped}: put_modules(t, o))
        notes.append(f"quant={quant!r}: {name or 'transformer'}: {report.note()}")
    return tuple(notes)


def _checked_weights_root(weights_root: Path | None) -> Path | None:
    """`apply`'s `weights_root`, user-expanded, or None.

    Raises:
        BadInput: it is not an existing folder (a mistyped folder would attach nothing, silently).
    """
    if weights_root is not None:
        given, weights_root = weights_root, Path(weights_root).expanduser()
        if not weights_root.is_dir():
            raise BadInput(f"{WHERE}: weights_root={str(given)!r}: "
                           f"{'not a folder' if weights_root.exists() else 'no such folder'}")
    return weights_root


def _backend_of(pipe: Any, backend: Any, options: dict[str, Any]) -> tuple[BackendSpec | None, Any]:
    """`apply`'s backend argument as (spec, backend object): a name, text or spec is built (with `options` and the
    pipeline's preset defaults, `backend_spec`); an object passes as it is; None is (None, None).

    Raises:
        BadInput: a class instead of an object, something that is no backend, options with an object or None, or
            what `backend_spec` refuses.
    """
    from .attention.registry import missing_members

    if isinstance(backend, type):
        raise BadInput(f"{WHERE}: give a backend object ({backend.__name__}()) or its name, not the class")
    if backend is not None and not isinstance(backend, (str, BackendSpec)) and missing_members(backend):
        raise BadInput(f"{WHERE}: the backend must be a name (e.g. 'vsa'), NAME:KEY=VALUE text, a BackendSpec, an "
                       f"attention backend object or None; got {type(backend).__name__}")
    if backend is None or not isinstance(backend, (str, BackendSpec)):
        if options:
            raise BadInput(f"{WHERE}: options ({', '.join(options)}) need a backend name or spec, not "
                           f"{'None' if backend is None else type(backend).__name__}")
        return (None if backend is None else BackendSpec(backend.name, backend.options)), backend
    spec = backend_spec(backend, options, getattr(pipe, "vsagen_backend_defaults", None))
    return spec, spec.build()


def _install(handle: AppliedBackend, pipe: Any, transformers: list[tuple[str | None, Any]], *,
             weights_root: Path | None, attach_weights: bool, fused_blocks: bool, fused_prologue: str,
             steps: int | None = None) -> None:
    """Put `handle`'s backend on every transformer, each undo on `handle._undo`: the backend's own weights (when it
    has some and `attach_weights`), the processors and hooks (`patch_transformer`; the DiT timers alone,
    `time_transformer`, without a backend), and the scheduler's step counting (pipelines only). The caller removes
    the handle if this raises."""
    from .attention.hooks import patch_transformer, time_transformer
    from .attention.weights import attach_backend_weights

    built, timer = handle.backend, handle.timer
    if built is not None and built.weights is not None and attach_weights:
        attached: list[Callable[[], None]] = []
        handle._undo.append(lambda: [restore() for restore in reversed(attached)])
        handle.weight_layers = sum(attach_backend_weights(t, built, _weights_folder(weights_root, name, t),
                                                          undo=attached)
                                   for name, t in transformers)
    if built is not None:
        reset_counts(built)  # the knobs' dense / sparse call counts of this run
    states = []
    for name, t in transformers:
        patch = (time_transformer(t, timer, expert=name, fused_blocks=fused_blocks) if built is None else
                 patch_transformer(t, built, timer, expert=name, fused_blocks=fused_blocks,
                                   fused_prologue=fused_prologue))
        handle._undo.append(patch.remove)
        patch.forward_state.steps = steps  # the scheduler's count replaces it once the pipeline sets its timesteps
        states.append(patch.forward_state)
    if pipe is not transformers[0][1]:
        handle._undo.append(_count_steps(pipe, timer, states))
