"""`ProfileConfig`: a validated `vsagen profile` request: the shared part (`vsagen.request.resolve.resolve`, several
backends and tile fits) and the report's settings."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..attention.registry import backend_class, named_weights_file
from ..errors import BadInput
from ..models.sources import attention_dims, resolve_model
from ..media.paths import check_folder, check_target
from ..models.presets import LAST_IMAGE_REQUIRED
from ..request.options import Offload, ReportFormat, RequestOptions, VaeTiling, request_options
from ..request.resolve import SEVERAL, Request, check_last_frame, request_fields, resolve

PROFILE_FORMATS = ReportFormat.values()
PROFILE_STEPS = 2  # timed denoising steps per configuration unless --steps says otherwise
PROFILE_WARMUP = 1  # untimed warm-up steps per configuration unless --warmup says otherwise
PROFILE_PROMPT = "a red fox running through fresh snow, cinematic"
PLOT_SUFFIXES = (".png", ".svg", ".pdf")
# `--kernels` on a CPU times the eager reference paths; past this many tokens one dense forward + backward takes
# minutes there (and the VSA reference gathers K*64 keys per query tile), so larger shapes are refused.
CPU_KERNEL_MAX_TOKENS = 8192


@dataclass(frozen=True, kw_only=True)
class ProfileConfig(Request):
    """A validated `vsagen profile` request (see `Request` for the shared fields).

    Every (tile fit, backend, step cache) triple is one configuration (`caches`: the `--cache` list, `none` without
    one), run on one loaded pipeline with the same prompt embeddings and seed: `warmup` untimed denoising steps, then `steps` timed ones. `full_steps` is the
    preset's step count, the DiT time is projected to it. `stock` adds the overhead rows (diffusers' own
    processors, and `full` in tile order). `kernels` times the attention alone at the model's shape instead
    (no model is loaded; `heads` x `head_dim` come from the architecture, and are 0 without `kernels`). `fmt`
    is one of PROFILE_FORMATS; `out` (the report in that format) and `plot` (the DiT bar chart) are files, or
    None for stdout / no plot. Profiles keep every weight on the device (offload transfers would swamp the DiT
    time) and never decode: `offload` is "none" and `vae_tiling` "off" (neither is in `summary`). `ulysses` /
    `cfg_parallel` (`Request`) split every configuration across the processes of a torchrun launch.
    """

    full_steps: int
    stock: bool
    kernels: bool
    heads: int
    head_dim: int
    fmt: str
    out: Path | None
    plot: Path | None

    def __post_init__(self) -> None:
        if self.offload != "none" or self.vae_tiling != "off":
            raise ValueError("a profile keeps its weights on the device and never decodes (offload none, "
                             "vae_tiling off)")

    @property
    def conditioned(self) -> bool:
        """An image-to-video model: loaded as a WanImageToVideoPipeline and conditioned on synthetic frames (the
        DiT's cost does not depend on the picture)."""
        return self.image_to_video

    def summary(self) -> dict[str, Any]:
        """JSON-ready settings (no Path objects, no preset internals)."""
        d = asdict(self)
        d["caches"] = [c.summary() for c in self.caches]
        d.pop("samplers")
        d["sampler"] = self.sampler.summary()
        d["flow_shift"] = self.used_flow_shift  # None: a re-noise sampler's sigmas are used as given
        for key in ("source", "offload", "vae_tiling", "attn_requested", "attn_note"):
            d.pop(key)
        d["backends"] = [b.summary() for b in self.backends]
        d["tile_fits"] = list(self.tile_fits)
        d["vae_decoder"] = self.vae_decoder.text()  # `--vae` as given (a weights file absolute)
        d.pop("vae_decoders")  # (compare's list; this command decodes with `vae_decoder` alone)
        d["model_source"] = {"kind": self.source.kind, "location": self.source.location,
                             "preset": self.source.preset.name,
                             "transformer_files": list(self.transformer_sources)}
        d.pop("transformer_files", None)
        d["out"] = str(self.out) if self.out is not None else None
        d["plot"] = str(self.plot) if self.plot is not None else None
        return d


def _check_file_flag(path: Path | None, flag: str, overwrite: bool) -> Path | None:
    if path is None:
        return None
    path = Path(path)
    if not path.name or path.name in (".", ".."):
        raise BadInput(f"{flag} {str(path)!r}: give a file name")
    check_target(path, overwrite, flag)
    check_folder(path.parent)
    return path


def resolve_profile_options(options: RequestOptions, *, prompt: str = PROFILE_PROMPT,
                            fmt: ReportFormat | str = "table", plot: Path | None = None, stock: bool = True,
                            kernels: bool = False) -> ProfileConfig:
    """Validate a `vsagen profile` request: the shared part (`vsagen.request.resolve.resolve`, several backends and
    tile fits) and its own, the report.

    `options.attention.attn` and `options.model.tile_fits` are lists (each entry once). `--sparsity` goes to the
    sparse backends in the list (at least one must be sparse), `--attn-impl` to the backends that offer that
    implementation (at least one must). `steps` defaults to PROFILE_STEPS timed steps (not the preset's count, which
    is the projection target), `warmup` to PROFILE_WARMUP; a re-noise sampler (`--sampler dmd`) times its whole
    sigma list, which is also the projection target. With `kernels`, `steps`, `warmup` and `plot` do not
    apply. `options.output.out` (the report) and `plot` must not exist unless `overwrite`, and their folders must be
    writable; `plot` needs matplotlib (`pip install 'vsagen[plot]'`) and a .png, .svg or .pdf name. `ulysses` and
    `cfg_parallel` are checked as for `t2v`, the degree against every tile fit's grid; `kernels` (one process, no
    model) takes neither. `--cache` is a list (`vsagen.request.caching.resolve_caches`: each entry once, not with
    `--compile` or several processes, `mag` with its calibration file, not `mag:calibrate=true`); `kernels` takes
    none. A profile keeps its weights on the device and never decodes (offload none, VAE tiling
    off).

    Raises:
        BadInput: any invalid setting (one message naming the flag and what would be valid), before anything
            is loaded or written.
    """
    fmt = ReportFormat.parse(fmt, "--format")
    s, pl = options.sampling, options.placement
    if kernels and pl.compile:
        raise BadInput("--compile compiles the transformer blocks; --kernels times the attention alone (drop one)")
    if kernels and (s.steps is not None or s.warmup is not None):
        raise BadInput("--steps and --warmup count denoising steps; --kernels times the attention alone "
                       "(drop them, or drop --kernels)")
    if kernels and s.cache is not None and any(c.enabled for c in s.cache.specs):
        raise BadInput("--cache reuses DiT forwards across steps; --kernels times the attention alone (drop one)")
    if kernels and plot is not None:
        raise BadInput("--plot draws the DiT time per backend; it does not apply to --kernels")
    if kernels and (pl.ulysses not in (None, 1) or pl.cfg_parallel or pl.gpus not in (None, 1)):
        raise BadInput("--kernels times the attention alone in one process; drop --gpus / --ulysses / --cfg-parallel "
                       "(they split the DiT runs across processes), or drop --kernels")
    if not prompt.strip():
        raise BadInput("--prompt is empty")
    model = options.model.model
    src = resolve_model(model)
    options = dataclasses.replace(
        options, sampling=dataclasses.replace(s, warmup=PROFILE_WARMUP if s.warmup is None else s.warmup),
        placement=dataclasses.replace(pl, offload=Offload.NONE, vae_tiling=VaeTiling.OFF))
    # the report and the plot are checked before `resolve` resolves `--device auto`, which imports torch to ask for
    # CUDA (seconds): a target that cannot be written is refused before anything heavy loads
    if plot is not None:
        plot = Path(plot)
        if plot.suffix.lower() not in PLOT_SUFFIXES:
            raise BadInput(f"--plot {plot}: give a file name ending in {', '.join(PLOT_SUFFIXES)}")
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise BadInput("--plot needs matplotlib, which is not installed: pip install 'vsagen[plot]'")
    overwrite = options.output.overwrite
    out = _check_file_flag(options.output.out, "--out", overwrite)
    plot = _check_file_flag(plot, "--plot", overwrite)
    if out is not None and plot is not None and out.resolve() == plot.resolve():
        raise BadInput(f"--out and --plot name the same file ({out})")
    req = resolve(src, options, prompt=prompt, backends=SEVERAL, several_fits=True, command_steps=PROFILE_STEPS)
    for entry, spec in zip(options.attention.attn.entries, req.backends):
        if kernels and named_weights_file(backend_class(spec.name), spec.options) is not None:
            raise BadInput(f"--kernels times the attention on random inputs without trained weights; drop the "
                           f"weights file from --attn {entry.text!r}, or drop --kernels")
    if src.preset.last_image == LAST_IMAGE_REQUIRED and not kernels:
        check_last_frame(req, f"--model {model} (first/last frame; profiled with a synthetic last frame)")
    heads, head_dim = attention_dims(src, model) if kernels else (0, 0)
    if kernels and req.device == "cpu":
        for fit in req.tile_fits:
            grid = req.plan(fit).denoise_grid
            if math.prod(grid) > CPU_KERNEL_MAX_TOKENS:
                raise BadInput(f"--kernels on a CPU: {req.frames}x{req.height}x{req.width} is S = {math.prod(grid)} "
                               f"tokens (grid {'x'.join(map(str, grid))}), too many to time the eager paths here (at "
                               f"most {CPU_KERNEL_MAX_TOKENS}); give smaller --frames/--height/--width, or run on CUDA")
    full_steps = len(req.sampler.sigmas) if req.sampler.renoise else src.preset.defaults.steps
    return ProfileConfig(**request_fields(req), full_steps=full_steps, stock=stock, kernels=kernels,
                         heads=heads, head_dim=head_dim, fmt=fmt.value, out=out, plot=plot)


def resolve_profile(*, prompt: str = PROFILE_PROMPT, fmt: str = "table", plot: Path | None = None, stock: bool = True,
                    kernels: bool = False, attn: str = "full,vsa", **flags: Any) -> ProfileConfig:
    """`resolve_profile_options` with the shared options as keyword arguments named as the flags
    (`vsagen.request.options.FLAGS`: model, attn, sparsity, tile_fit, steps, device, out, ...), for Python callers.

    Raises:
        BadInput: see `resolve_profile_options`.
        TypeError: an unknown keyword.
    """
    return resolve_profile_options(request_options(attn=attn, **flags), prompt=prompt, fmt=fmt, plot=plot,
                                   stock=stock, kernels=kernels)
