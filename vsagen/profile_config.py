"""`ProfileConfig`: a validated `vsagen profile` request (flag > preset default, as in `vsagen.config.resolve`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .attention import BackendSpec, backend_class, backend_names
from .attention.weights import named_weights_file
from .config import (DEVICES, DTYPES, MAX_STEPS, TILE_FITS, Request, backend_specs, check_backend_entry,
                     check_choice, check_last_frame, check_ulysses, fill_and_check, resolve_device)
from .errors import BadInput
from .paths import check_folder, check_target
from .layout import plan_crop
from .models import DEFAULT_MODEL, attention_dims, resolve_model
from .presets import LAST_IMAGE_REQUIRED

PROFILE_FORMATS = ("table", "markdown", "csv", "json")
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

    Every (backend, tile fit) pair is one configuration, run on one loaded pipeline with the same prompt
    embeddings and seed: `warmup` untimed denoising steps, then `steps` timed ones. `full_steps` is the
    preset's step count, the DiT time is projected to it. `stock` adds the overhead rows (diffusers' own
    processors, and `full` in tile order). `kernels` times the attention alone at the model's shape instead
    (no model is loaded; `heads` x `head_dim` come from the architecture, and are 0 without `kernels`). `fmt`
    is one of PROFILE_FORMATS; `out` (the report in that format) and `plot` (the DiT bar chart) are files, or
    None for stdout / no plot. Profiles keep every weight on the device (offload transfers would swamp the DiT
    time) and never decode: `offload` is "none" and `vae_tiling` "off" (neither is in `summary`). `ulysses` /
    `cfg_parallel` (`Request`) split every configuration across the processes of a torchrun launch.
    """

    backends: tuple[BackendSpec, ...]
    full_steps: int
    tile_fits: tuple[str, ...]
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
        for key in ("source", "offload", "vae_tiling"):
            d.pop(key)
        d["backends"] = [b.summary() for b in self.backends]
        d["tile_fits"] = list(self.tile_fits)
        d["model_source"] = {"kind": self.source.kind, "location": self.source.location,
                             "preset": self.source.preset.name}
        d["out"] = str(self.out) if self.out is not None else None
        d["plot"] = str(self.plot) if self.plot is not None else None
        return d


def _split_list(value: str, flag: str, known: list[str] | tuple[str, ...] | None,
                unknown_msg: str) -> tuple[str, ...]:
    """'a,b' -> ('a', 'b'); every item known (unless `known` is None), none empty or repeated."""
    example = ",".join(known) if known is not None else "full,vsa:sparsity=0.9"
    if not value.strip():
        raise BadInput(f"{flag} is empty; give a comma-separated list (e.g. {example})")
    items = tuple(x.strip() for x in value.split(","))
    for x in items:
        if not x:
            raise BadInput(f"{flag} {value!r} has an empty entry; give a comma-separated list "
                           f"(e.g. {example})")
        if known is not None and x not in known:
            raise BadInput(unknown_msg.format(x=x))
        if items.count(x) > 1:
            raise BadInput(f"{flag} lists {x!r} twice")
    return items


def split_attn_list(attn: str) -> tuple[str, ...]:
    """The entries of a comma-separated `--attn` list (`NAME[:KEY=VALUE...]` each, as `vsagen profile` and
    `vsagen compare` take it), in order; options are not read yet (`attn_list_specs` does, once the model's preset
    is known).

    Raises:
        BadInput: an empty list or entry, an entry written twice, or an unknown backend name.
    """
    attns = _split_list(attn, "--attn", None, "unknown --attn {x!r}; available: " + ", ".join(backend_names()))
    for entry in attns:
        check_backend_entry(entry)
    return attns


def attn_list_specs(entries: tuple[str, ...], attn: str, preset_attention: dict[str, dict[str, Any]],
                    sparsity: float | None, attn_impl: str) -> tuple[BackendSpec, ...]:
    """The `BackendSpec` of each entry of `split_attn_list(attn)`, options filled by precedence (entry >
    `--sparsity` / `--attn-impl` > the preset's [attention.NAME] tables `preset_attention` > the backend's default;
    `vsagen.config.backend_specs`).

    Raises:
        BadInput: an unknown option or value, a flag no backend in the list takes, or two entries that are one
            configuration (e.g. `vsa` and `vsa:sparsity=0.875` where the preset's sparsity is 0.875).
    """
    specs = backend_specs(entries, preset_attention, sparsity, attn_impl, attn)
    for i, spec in enumerate(specs):  # entries written differently can still be one configuration
        if spec in specs[:i]:
            first = entries[specs.index(spec)]
            raise BadInput(f"--attn lists {spec.text()} twice ({first!r} and {entries[i]!r}); give each "
                           "configuration once")
    return specs


def _check_file_flag(path: Path | None, flag: str, overwrite: bool) -> Path | None:
    if path is None:
        return None
    path = Path(path)
    if not path.name or path.name in (".", ".."):
        raise BadInput(f"{flag} {str(path)!r}: give a file name")
    check_target(path, overwrite, flag)
    check_folder(path.parent)
    return path


def resolve_profile(*, model: str = DEFAULT_MODEL, attn: str = "full,vsa", sparsity: float | None = None,
                    attn_impl: str = "auto", height: int | None = None, width: int | None = None,
                    frames: int | None = None, steps: int | None = None, guidance: float | None = None,
                    guidance_2: float | None = None, negative_prompt: str | None = None,
                    prompt: str = PROFILE_PROMPT, seed: int = 0, tile_fit: str = "partial", fmt: str = "table",
                    out: Path | None = None, plot: Path | None = None, overwrite: bool = False,
                    device: str = "auto", dtype: str = "auto", random_weights: bool = False,
                    allow_pickle: bool = False, warmup: int | None = None, stock: bool = True,
                    kernels: bool = False, compile: bool = False, fused_blocks: bool = True, ulysses: int = 1,
                    cfg_parallel: bool = False) -> ProfileConfig:
    """Validate a `vsagen profile` request (flag > preset default, as in `resolve`).

    `attn` and `tile_fit` are comma-separated lists (each entry once). `--sparsity` goes to the sparse backends
    in the list (at least one must be sparse), `--attn-impl` to the backends that offer that implementation (at
    least one must). `steps` defaults to PROFILE_STEPS timed steps (not the preset's count, which is the
    projection target), `warmup` to PROFILE_WARMUP. With `kernels`, `steps`, `warmup` and `plot` do not apply.
    `out` and `plot` must not exist unless `overwrite`, and their folders must be writable; `plot` needs
    matplotlib (`pip install 'vsagen[plot]'`) and a .png, .svg or .pdf name. `ulysses` and `cfg_parallel` are
    checked as `t2v` checks them (`vsagen.config.resolve`), the degree against every tile fit's grid; `kernels`
    (one process, no model) takes neither.

    Raises:
        BadInput: any invalid setting (one message naming the flag and what would be valid), before anything
            is loaded or written.
    """
    attns = split_attn_list(attn)
    tile_fits = _split_list(tile_fit, "--tile-fit", TILE_FITS,
                            "--tile-fit entries must be among " + ", ".join(TILE_FITS) + ", got {x!r}")
    check_choice("--format", fmt, PROFILE_FORMATS)
    check_choice("--dtype", dtype, DTYPES)
    check_choice("--device", device, DEVICES)
    if kernels and compile:
        raise BadInput("--compile compiles the transformer blocks; --kernels times the attention alone (drop one)")
    if kernels and (steps is not None or warmup is not None):
        raise BadInput("--steps and --warmup count denoising steps; --kernels times the attention alone "
                       "(drop them, or drop --kernels)")
    if kernels and plot is not None:
        raise BadInput("--plot draws the DiT time per backend; it does not apply to --kernels")
    if kernels and (ulysses != 1 or cfg_parallel):
        raise BadInput("--kernels times the attention alone in one process; drop --ulysses / --cfg-parallel (they "
                       "split the DiT runs across processes), or drop --kernels")
    if not prompt.strip():
        raise BadInput("--prompt is empty")
    src = resolve_model(model)
    d = src.preset.defaults
    specs = attn_list_specs(attns, attn, d.attention, sparsity, attn_impl)
    for i, spec in enumerate(specs):
        if kernels and named_weights_file(backend_class(spec.name), spec.options) is not None:
            raise BadInput(f"--kernels times the attention on random inputs without trained weights; drop the "
                           f"weights file from --attn {attns[i]!r}, or drop --kernels")
    height, width, frames, steps, guidance, guidance_2 = fill_and_check(
        src, model, height=height, width=width, frames=frames, steps=PROFILE_STEPS if steps is None else steps,
        guidance=guidance, guidance_2=guidance_2, seed=seed, random_weights=random_weights, tile_fits=tile_fits)
    if src.preset.last_image == LAST_IMAGE_REQUIRED and not kernels:
        check_last_frame(src, frames, height, width, tile_fits,
                         f"--model {model} (first/last frame; profiled with a synthetic last frame)")
    for fit in tile_fits:  # the degree against every grid that runs
        check_ulysses(ulysses, src, offload="none", compile=compile, tile_fit=fit, frames=frames, height=height,
                       width=width)
    if cfg_parallel:
        from .parallel.cfg import check_cfg_parallel

        check_cfg_parallel(guidance, offload="none", compile=compile)
    warmup = PROFILE_WARMUP if warmup is None else warmup
    if not 0 <= warmup <= MAX_STEPS:
        raise BadInput(f"--warmup must be in [0, {MAX_STEPS}], got {warmup}")
    dev = resolve_device(device)
    dt = dtype if dtype != "auto" else ("bf16" if dev == "cuda" else "fp32")
    heads, head_dim = attention_dims(src, model) if kernels else (0, 0)
    if kernels and dev == "cpu":
        p = src.preset
        for fit in tile_fits:
            grid = plan_crop(frames, height, width, fit=fit, vae_stride_temporal=p.vae_stride_temporal,
                             vae_stride_spatial=p.vae_stride_spatial, patch_size=p.patch_size).denoise_grid
            if math.prod(grid) > CPU_KERNEL_MAX_TOKENS:
                raise BadInput(f"--kernels on a CPU: {frames}x{height}x{width} is S = {math.prod(grid)} tokens "
                               f"(grid {'x'.join(map(str, grid))}), too many to time the eager paths here (at most "
                               f"{CPU_KERNEL_MAX_TOKENS}); give smaller --frames/--height/--width, or run on CUDA")
    if plot is not None:
        plot = Path(plot)
        if plot.suffix.lower() not in PLOT_SUFFIXES:
            raise BadInput(f"--plot {plot}: give a file name ending in {', '.join(PLOT_SUFFIXES)}")
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise BadInput("--plot needs matplotlib, which is not installed: pip install 'vsagen[plot]'")
    out = _check_file_flag(out, "--out", overwrite)
    plot = _check_file_flag(plot, "--plot", overwrite)
    if out is not None and plot is not None and out.resolve() == plot.resolve():
        raise BadInput(f"--out and --plot name the same file ({out})")
    return ProfileConfig(
        prompt=prompt, negative_prompt=d.negative_prompt if negative_prompt is None else negative_prompt,
        model=model, source=src, backends=specs, height=height, width=width, frames=frames, steps=steps,
        full_steps=d.steps, guidance=guidance, guidance_2=guidance_2, seed=seed, flow_shift=d.flow_shift,
        max_sequence_length=d.max_sequence_length, device=dev, dtype=dt, tile_fits=tile_fits,
        random_weights=random_weights, allow_pickle=allow_pickle, warmup=warmup, stock=stock, kernels=kernels,
        heads=heads, head_dim=head_dim, fmt=fmt, out=out, plot=plot, overwrite=overwrite, compile=compile,
        fused_blocks=fused_blocks, ulysses=ulysses, cfg_parallel=bool(cfg_parallel),
    )
