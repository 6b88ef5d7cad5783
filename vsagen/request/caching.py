"""The step-cache part of a request: `--cache` entries as `vsagen.cache.CacheSpec`s, checked against the rest of the
request before anything loads (one line each), MagCache's calibration file found, and the run notes a cache calls
for."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..cache import NO_CACHE, CacheSpec, parse_cache_list
from ..errors import BadInput


def default_mag_file(model: str) -> Path:
    """Where `mag:calibrate=true` writes (and `mag` reads) a model's ratios by default:
    `<vsagen cache>/magcache/<model>.json` (the model's name or path, as a file name)."""
    from ..tiny import cache_dir

    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model.strip().strip("/")) or "model"
    return cache_dir() / "magcache" / f"{slug}.json"


def _mag(spec: CacheSpec, model: str) -> CacheSpec:
    """A `mag` spec with its file filled in and checked: the ratios readable (a run that reads them), or a folder
    that takes the file (a calibration)."""
    from ..paths import check_folder

    path = spec.options.file if spec.options.file is not None else default_mag_file(model)
    spec = replace(spec, options=replace(spec.options, file=path))
    if spec.options.calibrate:
        if path.is_dir():
            raise BadInput(f"--cache mag: file={path} is a folder; name a .json file")
        try:
            check_folder(path.parent)
        except BadInput as e:
            raise BadInput(f"--cache mag:calibrate=true: {e}") from None
        return spec
    from ..cache_hooks import load_ratios

    load_ratios(path)
    return spec


def resolve_caches(text: str | None, model: str, placement: Any, sampler: Any, processes: int,
                   several: bool = False) -> tuple[tuple[CacheSpec, ...], tuple[str, ...]]:
    """The `--cache` entries (None: `none`) as specs, and the run notes they call for.

    Args:
        text: the `--cache` text; model: `--model` as given (MagCache's default file); placement: the
            `PlacementOptions`; sampler: the run's (first) `Sampler`; processes: the run's process count.
        several: the command runs every entry (else one).

    Raises:
        BadInput: an entry that does not parse, several where one runs, a cache with `--compile` (diffusers' cache
            hooks decide on the host, under `torch.compiler.disable`, which breaks vsagen's one-graph blocks), with
            `--offload group` (a reused forward skips blocks whose onload hooks order the prefetch), with several
            processes (each rank would decide alone), `mag` without a calibration file, or `mag:calibrate=true` where
            several run (profile, compare: a calibration is a t2v or i2v run).
    """
    if text is None:
        return (NO_CACHE,), ()
    specs = parse_cache_list(text)
    if len(specs) > 1 and not several:
        raise BadInput(f"--cache {text!r}: this command runs one cache")
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
    specs = tuple(_mag(s, model) if s.name == "mag" else s for s in specs)
    notes: tuple[str, ...] = ()
    if sampler.renoise:
        notes += (f"--cache {name} with the {sampler.name} sampler ({len(sampler.sigmas)} steps): a cache may reuse a "
                  "large share of so few steps, each far from the last; measure the cost with vsagen compare",)
    return specs, notes
