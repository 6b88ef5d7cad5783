"""`CompareConfig`: a validated `vsagen compare` request: the shared part (`vsagen.request.resolve.resolve`, a list
of backends, the first the reference) and its own: the attention-error steps, the output folder and its files."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import BadInput
from ..models import resolve_model
from ..paths import check_folder, check_target, default_out, sheet_path
from ..request.backends import split_attn_list
from ..request.options import RequestOptions, request_options
from ..request.resolve import SEVERAL, Request, request_fields, resolve

DEFAULT_ATTN = "full,vsa"
DEFAULT_ERROR_STEPS = "first,middle,last"
COMPARE_WARMUP = 1  # untimed warm-up steps per backend unless --warmup says otherwise (as `vsagen profile`)
SIDE_BY_SIDE, JSON_FILE, CSV_FILE, PLOT_FILE = "side-by-side.mp4", "compare.json", "compare.csv", "compare.png"


@dataclass(frozen=True, kw_only=True)
class CompareConfig(Request):
    """A validated `vsagen compare` request (see `Request` for the shared fields).

    `backends[0]` is the reference. `error_steps` are the 0-based denoising steps whose attention is compared
    with dense attention (sorted, each < steps). `out` is the output folder, `files` the paths written in it.
    `plot` draws compare.png (matplotlib); `sheet` writes each backend's contact sheet beside its mp4. `labels` name
    the backends in tables, panels and the plot.
    """

    fps: int
    out: Path
    error_steps: tuple[int, ...]
    plot: bool
    sheet: bool = False

    @property
    def labels(self) -> list[str]:
        """Each backend's label ("vsa 0.875"), or its spec without default options where a name repeats; a
        backend listed again (a library caller's list) gets " (2)", " (3)", ..."""
        names = [s.name for s in self.backends]
        labels = [s.short_text() if names.count(s.name) > 1 else s.label for s in self.backends]
        return [x if x not in labels[:i] else f"{x} ({labels[:i].count(x) + 1})" for i, x in enumerate(labels)]

    @property
    def backend_files(self) -> list[Path]:
        """Each backend's mp4 in `out`, named after its spec without default options (`file_stem`:
        `vsa-sparsity-0.9.mp4`); a name taken by an earlier backend gets `-<index>`."""
        stems: list[str] = []
        for spec in self.backends:
            stem = file_stem(spec.short_text()) or spec.name
            stems.append(stem if stem not in stems else f"{stem}-{len(stems)}")
        return [self.out / f"{stem}.mp4" for stem in stems]

    @property
    def files(self) -> dict[str, Path]:
        """{what: path} of every file the run writes: each backend's mp4 under its label, then (`sheet`) each
        backend's contact sheet under "<label> sheet", "side-by-side", "plot" (when drawn), "json", "csv"."""
        out = dict(zip(self.labels, self.backend_files))
        if self.sheet:
            out.update({f"{label} sheet": sheet_path(p) for label, p in zip(self.labels, self.backend_files)})
        out["side-by-side"] = self.out / SIDE_BY_SIDE
        if self.plot:
            out["plot"] = self.out / PLOT_FILE
        out.update(json=self.out / JSON_FILE, csv=self.out / CSV_FILE)
        return out

    def memory_hints(self) -> list[str]:
        """`--vae-tiling on` where not given."""
        return [] if self.vae_tiled else ["--vae-tiling on"]

    def summary(self) -> dict[str, Any]:
        """JSON-ready settings (no Path objects, no preset internals)."""
        d = asdict(self)
        d.pop("samplers")
        d["sampler"] = self.sampler.summary()
        for key in ("source", "tile_fits", "attn_requested", "attn_note"):
            d.pop(key)
        d["tile_fit"] = self.tile_fit
        d["backends"] = [b.summary() for b in self.backends]
        d["error_steps"] = list(self.error_steps)
        d["out"] = str(self.out)
        d["model_source"] = {"kind": self.source.kind, "location": self.source.location,
                             "preset": self.source.preset.name}
        return d


def file_stem(spec: str) -> str:
    """A file name stem for a backend spec (`NAME:KEY=VALUE...`): the parts joined by "-", a value's file extension
    left out, every character other than letters, digits, "." and "-" made "-" (`sparse-vdit:patterns=tiny.json`
    -> `sparse-vdit-patterns-tiny`, `vsa:sparsity=0.9` -> `vsa-sparsity-0.9`); "" when nothing is left."""
    parts = []
    for part in spec.split(":"):
        key, eq, value = part.partition("=")
        parts.append(f"{key}-{re.sub(r'[.][A-Za-z][A-Za-z0-9]*$', '', value)}" if eq else part)
    return re.sub(r"-{2,}", "-", re.sub(r"[^A-Za-z0-9.-]+", "-", "-".join(parts))).strip("-.")


def parse_error_steps(text: str, steps: int) -> tuple[int, ...]:
    """`--error-steps`: comma-separated 0-based step indices and the words first (0), middle (steps // 2) and
    last (steps - 1); "none" for no attention error. Returns the sorted distinct steps.

    Raises:
        BadInput: an empty entry, a word or number that is not a step of the run (0 <= step < steps).
    """
    names = {"first": 0, "middle": steps // 2, "last": steps - 1}
    if text.strip().lower() == "none":
        return ()
    out = set()
    for item in (x.strip().lower() for x in text.split(",")):
        if item in names:
            out.add(names[item])
            continue
        try:
            step = int(item)
        except ValueError:
            raise BadInput(f"--error-steps {text!r}: give step indices from 0 and / or first, middle, last "
                           "(comma-separated), or none") from None
        if not 0 <= step < steps:
            raise BadInput(f"--error-steps {text!r}: step {step} is not a step of this run (0 to {steps - 1})")
        out.add(step)
    return tuple(sorted(out))


def resolve_compare_options(prompt: str, options: RequestOptions, *, error_steps: str = DEFAULT_ERROR_STEPS,
                            plot: bool | None = None) -> CompareConfig:
    """Validate a `vsagen compare` request: the shared part (`vsagen.request.resolve.resolve`; `--attn` a list of at
    least two backends as `vsagen profile` takes it, the first the reference) and its own. `warmup` defaults to
    COMPARE_WARMUP. `options.output.out` is a folder (default `vsagen-<model>-compare-seed<seed>`); none of the
    files the run writes there (`CompareConfig.files`) may exist unless `overwrite`.

    Raises:
        BadInput: any invalid setting (one message naming the flag), before anything is loaded or written: fewer
            than two backends, an unknown backend or option, an image-to-video model, a size, frame count or step
            count the model refuses, bad --error-steps, an existing output file without `overwrite`, an
            unwritable folder, `plot=True` without matplotlib (`plot=None`, the default, draws the plot when
            matplotlib is installed and otherwise adds a note).
    """
    if not prompt.strip():
        raise BadInput("the prompt is empty")
    attn = options.attention.attn
    if len(split_attn_list(attn)) < 2:
        raise BadInput(f"--attn {attn!r}: compare needs the reference and at least one backend to compare with it, "
                       "e.g. --attn full,vsa")
    model = options.model.model
    src = resolve_model(model)
    if src.image_to_video:
        raise BadInput(f"--model {model} is an image-to-video model; vsagen compare runs text-to-video models")
    s = options.sampling
    options = dataclasses.replace(options, sampling=dataclasses.replace(
        s, warmup=COMPARE_WARMUP if s.warmup is None else s.warmup))
    req = resolve(src, options, prompt=prompt, backends=SEVERAL)
    if min(req.height, req.width) < 7:
        raise BadInput(f"SSIM needs frames of at least 7 x 7 pixels; got {req.width} x {req.height}")
    chosen = parse_error_steps(error_steps, req.steps)
    notes = req.notes
    if plot is not False:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            if plot:  # asked for by name
                raise BadInput("the plot needs matplotlib, which is not installed: pip install 'vsagen[plot]', or "
                               "pass --no-plot")
            notes += ("no plot (compare.png): matplotlib is not installed (pip install 'vsagen[plot]')",)
        plot = importlib.util.find_spec("matplotlib") is not None
    out = options.output
    folder = out.out if out.out is not None else default_out(model, "compare", req.seed, True).with_suffix("")
    if folder.exists() and not folder.is_dir():
        raise BadInput(f"--out {folder} is a file; give a folder (it is created if missing)")
    cfg = CompareConfig(**{**request_fields(req), "notes": notes}, fps=src.preset.defaults.fps if out.fps is None
                        else out.fps, out=folder, error_steps=chosen, plot=plot, sheet=out.sheet)
    for path in cfg.files.values():
        check_target(path, cfg.overwrite, "--out folder")
    check_folder(folder)
    return cfg


def resolve_compare(prompt: str, *, attn: str = DEFAULT_ATTN, error_steps: str = DEFAULT_ERROR_STEPS,
                    plot: bool | None = None, **flags: Any) -> CompareConfig:
    """`resolve_compare_options` with the shared options as keyword arguments named as the flags
    (`vsagen.request.options.FLAGS`: model, attn, sparsity, height, steps, device, out, ...), for Python callers.

    Raises:
        BadInput: see `resolve_compare_options`.
        TypeError: an unknown keyword.
    """
    return resolve_compare_options(prompt, request_options(attn=attn, **flags), error_steps=error_steps, plot=plot)
