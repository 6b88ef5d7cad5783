"""The step-cache part of a request: `--cache` parsed once into `vsagen.cache.cache_spec.CacheSpec`s (a `vsagen.cache.cache_spec.CacheList`,
built with its option group, `vsagen.request.options.SamplingOptions`), checked against the rest of the request before anything
loads (one line each), MagCache's calibration file found, and the run notes a cache calls for."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from ..cache.cache_spec import NO_CACHE, CacheList, CacheSpec
from ..errors import BadInput


def default_mag_file(model: str) -> Path:
    """Where `mag:calibrate=true` writes (and `mag` reads) a model's ratios by default:
    `<vsagen cache>/magcache/<model>.json` (the model's name or path, as a file name)."""
    from ..models.tiny import cache_dir

    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model.strip().strip("/")) or "model"
    return cache_dir() / "magcache" / f"{slug}.json"


def run_steps(plan: Any) -> int:
    """The denoising steps a `SamplerPlan` runs: a re-noise sampler's sigma count, else its `steps`."""
    return len(plan.sampler.sigmas) if plan.sampler.renoise else plan.steps


def _same_model(a: str, b: str) -> bool:
    """Whether two `--model` texts name one model: equal (a trailing "/" aside), or paths to one folder."""
    a, b = a.strip().rstrip("/"), b.strip().rstrip("/")
    if a == b:
        return True
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def _mag(spec: CacheSpec, model: str, plans: Sequence[Any],
         experts: Sequence[str] | None) -> tuple[CacheSpec, tuple[str, ...]]:
    """A `mag` spec with its file filled in and checked, and its notes.

    A calibration writes a `.json` file in a folder that takes it, replacing only an earlier calibration (any other
    file there is refused; the note says which calibration is replaced). A run reads the file, which must be the
    model's and hold ratios for each of `experts` (the transformers' component names where the preset describes
    the model, else None: checked once loaded), and is noted where it was calibrated at another step count or
    sampler than a run's (`plans`: the run's `SamplerPlan`s)."""
    from ..cache.install import load_calibration
    from ..media.paths import check_folder

    given = spec.options.file is not None
    path = spec.options.file if given else default_mag_file(model)
    spec = replace(spec, options=replace(spec.options, file=path), implicit=frozenset(() if given else ("file",)))
    if spec.options.calibrate:
        if path.is_dir():
            raise BadInput(f"--cache mag: file={path} is a folder; name a .json file")
        if path.suffix.lower() != ".json":
            raise BadInput(f"--cache mag:calibrate=true: file={path} does not end in .json; name a .json file")
        try:
            check_folder(path.parent)
        except BadInput as e:
            raise BadInput(f"--cache mag:calibrate=true: {e}") from None
        if not path.exists():
            return spec, ()
        try:
            old = load_calibration(path)
        except BadInput:
            raise BadInput(f"--cache mag:calibrate=true: {path} exists and is not a calibration vsagen wrote; name "
                           "another file (a calibration replaces only an earlier calibration)") from None
        return spec, (f"mag: this calibration replaces the one in {path} (--model {old['model']}, {old['steps']} "
                      "steps)",)
    cal = load_calibration(path)
    if not _same_model(cal["model"], model):
        raise BadInput(f"--cache mag: {path} holds the ratios of --model {cal['model']}, not of --model {model}; "
                       f"calibrate {model} with --cache mag:calibrate=true")
    missing = [e for e in experts or () if not cal["ratios"].get(e)]
    if missing:
        raise BadInput(f"--cache mag: {path} has no ratios for {' or '.join(missing)} (it holds "
                       f"{', '.join(cal['ratios'])}); calibrate again with --cache mag:calibrate=true")
    notes = []
    for plan in plans:
        steps, sampler = run_steps(plan), plan.sampler.name
        differ = [(f"{cal['steps']} steps", f"{steps} steps", f"--steps {steps}")
                  if cal["steps"] != steps else None,
                  (f"the {cal['sampler']} sampler", f"the {sampler} sampler", f"--sampler {sampler}")
                  if cal["sampler"] is not None and cal["sampler"] != sampler else None]
        differ = [d for d in differ if d is not None]
        if not differ:
            continue
        how = (f"diffusers resamples its ratios to {steps} steps by nearest neighbour (entries repeated or dropped, "
               "none measured at these steps)" if differ[0][0].endswith("steps") else
               "its ratios were measured along another sampler's steps")
        notes.append(f"mag: calibrated at {' and '.join(d[0] for d in differ)}, run at "
                     f"{' and '.join(d[1] for d in differ)}: {how}; for this run's own ratios, calibrate with "
                     f"--cache mag:calibrate=true {' '.join(d[2] for d in differ)}")
    return spec, tuple(dict.fromkeys(notes))


def resolve_caches(caches: CacheList | None, model: str, placement: Any, plans: Sequence[Any], processes: int,
                   several: bool = False, experts: Sequence[str] | None = None
                   ) -> tuple[tuple[CacheSpec, ...], tuple[str, ...]]:
    """The `--cache` entries (None: `none`) checked against the rest of the request, and the run notes they call for.

    Args:
        caches: `--cache` as parsed (`SamplingOptions.cache`); model: `--model` as given (MagCache's default file);
            placement: the `PlacementOptions`; plans: the `SamplerPlan` of every sampler the command runs (compare:
            several); processes: the run's process count.
        several: the command runs every entry (else one).
        experts: the model's transformers by component name where its preset describes it (a `mag` file must hold
            ratios for each), else None.

    Raises:
        BadInput: several entries where one runs, a cache with `--compile` (diffusers' cache hooks decide on the
            host, under `torch.compiler.disable`, which breaks vsagen's one-graph blocks), with `--offload group` (a
            reused forward skips blocks whose onload hooks order the prefetch), with several processes (each rank
            would decide alone), `mag` without a calibration file of the model (and its experts),
            `mag:calibrate=true` where several run (profile, compare: a calibration is a t2v or i2v run), or a
            calibration into a file other than `.json` or over one that is not a calibration.
    """
    if caches is None:
        return (NO_CACHE,), ()
    specs = caches.specs
    if len(specs) > 1 and not several:
        raise BadInput(f"--cache {caches.text!r}: this command runs one cache")
    on = [s for s in specs if s.enabled]
    if not on:
        return specs, ()
    name = on[0].name
    if placement.compile:
        raise BadInput(f"--cache {name} cannot run with --compile: diffusers' cache hooks decide on the host (outside "
                       "the graph) in every block they wrap, which breaks the one-graph blocks; drop one of them")
    if str(placement.offload) == "group":
        raise BadInput(f"--cache {name} cannot run with --offload group: a reused forward skips blocks whose onload "
                       "hooks drive the prefetch; use --offload model")
    if processes > 1:
        raise BadInput(f"--cache {name} runs in one process (each rank would decide alone what to reuse); drop "
                       "--gpus / --ulysses / --cfg-parallel")
    if several and any(s.name == "mag" and s.options.calibrate for s in specs):
        raise BadInput("--cache mag:calibrate=true calibrates in a vsagen t2v or i2v run, which writes the ratios "
                       "(it skips nothing: nothing to measure); run that first, then list mag here")
    notes: list[str] = []
    resolved = []
    for s in specs:
        if s.name == "mag":
            s, mag_notes = _mag(s, model, plans, experts)
            notes += mag_notes
        resolved.append(s)
    for sampler in dict.fromkeys(p.sampler for p in plans if p.sampler.renoise):  # once per few-step sampler
        notes.append(f"--cache {name} with the {sampler.name} sampler ({len(sampler.sigmas)} steps): a cache may "
                     "reuse a large share of so few steps, each far from the last; measure the cost with vsagen "
                     "compare")
    return tuple(resolved), tuple(dict.fromkeys(notes))
