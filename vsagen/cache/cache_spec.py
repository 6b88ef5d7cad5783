"""Step caching as a value: `--cache NAME[:KEY=VALUE...]`, in the same form as `--attn`.

A `CacheSpec` is a cache name plus an instance of its frozen `Options` dataclass, validated when it is built (one
`BadInput` line). The caches are diffusers' hooks (`../shared/REFERENCE.md`, "Caching hooks"), which act per
transformer block or module and never touch the attention processor, so they compose with every `--attn` backend
(`vsagen.cache.install` installs them on every expert, after vsagen's attention patch):

* `none`: no cache (every DiT forward computed).
* `first-block` (diffusers `FirstBlockCacheConfig`): blocks[0] always runs; when the relative mean change of its
  residual since the last computed forward is at most `threshold`, the other blocks are skipped and their last
  residual is added instead.
* `mag` (diffusers `MagCacheConfig`): skips whole forwards while the accumulated error predicted from per-step
  magnitude ratios stays under `threshold` (at most `max_skip_steps` in a row, never in the first `retention_ratio`
  of the steps). The ratios are the model's: `mag:calibrate=true` runs diffusers' calibration (nothing skipped) and
  saves them per model to `file` (default `<vsagen cache>/magcache/<model>.json`), which later runs load.
* `taylorseer` (diffusers `TaylorSeerCacheConfig`): every `cache_interval` steps (after `disable_cache_before_step`
  computed ones) the hooked modules compute; between, their outputs are predicted by a Taylor series of order
  `max_order`. diffusers' default patterns (`^blocks.*attn`, fullmatch) match no Wan module (Wan's are `attn1` /
  `attn2`), so vsagen names Wan's: each block's `attn1`, `attn2` and `ffn` (`WAN_TAYLORSEER_MODULES`); `lite=true`
  is diffusers' lite mode (whole blocks skipped, `proj_out` predicted), whose patterns do match Wan.

This module imports neither torch nor diffusers (the command line checks `--cache` before anything heavy loads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..attention.shared import option_names, options_dict
from ..attention.spec import convert_option, format_option, no_option, option_pairs, text_options
from ..errors import BadInput

# TaylorSeer's modules on a Wan transformer (regexes, `re.fullmatch` on the module names): the self-attention, the
# cross-attention and the FFN of every block, the features the TaylorSeer paper predicts.
WAN_TAYLORSEER_MODULES = (r"blocks\.\d+\.attn1", r"blocks\.\d+\.attn2", r"blocks\.\d+\.ffn")


def _positive(value: Any, name: str, *, integer: bool = False, zero: bool = False) -> None:
    """Refuse a value that is not a finite number > 0 (>= 0 with `zero`; an integer with `integer`)."""
    kinds = (int,) if integer else (int, float)
    ok = (not isinstance(value, bool) and isinstance(value, kinds) and math.isfinite(value)
          and (value >= 0 if zero else value > 0))
    if not ok:
        what = "an integer" if integer else "a number"
        raise BadInput(f"{name} must be {what} {'>= 0' if zero else '> 0'}, got {value!r}")


@dataclass(frozen=True)
class NoCacheOptions:
    """`none`: no options."""


@dataclass(frozen=True)
class FirstBlockOptions:
    """`first-block`: `threshold` >= 0, the relative mean change of blocks[0]'s residual at or below which the other
    blocks are reused (diffusers' default 0.05; 0 reuses nothing unless the residual is unchanged)."""

    threshold: float = 0.05

    def __post_init__(self) -> None:
        _positive(self.threshold, "threshold", zero=True)


@dataclass(frozen=True)
class MagOptions:
    """`mag`: `threshold` (accumulated error, >= 0), `max_skip_steps` (>= 1 in a row), `retention_ratio` (the first
    share of the steps never skipped, in [0, 1]); `calibrate` runs diffusers' calibration (nothing skipped) and
    writes the ratios to `file`; else they are read from `file` (None: the per-model default the request fills
    in)."""

    threshold: float = 0.06
    max_skip_steps: int = 3
    retention_ratio: float = 0.2
    calibrate: bool = False
    file: Path | None = None

    def __post_init__(self) -> None:
        _positive(self.threshold, "threshold", zero=True)
        _positive(self.max_skip_steps, "max_skip_steps", integer=True)
        if isinstance(self.retention_ratio, bool) or not isinstance(self.retention_ratio, (int, float)) \
                or not 0 <= self.retention_ratio <= 1:
            raise BadInput(f"retention_ratio must be in [0, 1], got {self.retention_ratio!r}")
        if self.file is not None:
            if not str(self.file).strip():
                raise BadInput("file is empty; give a .json file, or leave it out for the per-model default")
            object.__setattr__(self, "file", Path(self.file).expanduser())


@dataclass(frozen=True)
class TaylorSeerOptions:
    """`taylorseer`: `cache_interval` (>= 1: a computed forward every so many), `disable_cache_before_step` (>= 0
    forwards always computed first), `max_order` (>= 0, the Taylor order), `lite` (diffusers' lite mode)."""

    cache_interval: int = 5
    disable_cache_before_step: int = 3
    max_order: int = 1
    lite: bool = False

    def __post_init__(self) -> None:
        _positive(self.cache_interval, "cache_interval", integer=True)
        _positive(self.disable_cache_before_step, "disable_cache_before_step", integer=True, zero=True)
        _positive(self.max_order, "max_order", integer=True, zero=True)
        if not isinstance(self.lite, bool):
            raise BadInput(f"lite must be true or false, got {self.lite!r}")


CACHES: dict[str, type] = {"none": NoCacheOptions, "first-block": FirstBlockOptions, "mag": MagOptions,
                           "taylorseer": TaylorSeerOptions}
NONE = "none"


@dataclass(frozen=True)
class CacheSpec:
    """A cache name (`CACHES`) and its options; `implicit`: options the request filled in, not the user (MagCache's
    per-model default `file`), left out of `short_text` as default options are, kept in `text` and `summary`."""

    name: str
    options: Any
    implicit: frozenset[str] = field(default=frozenset(), compare=False)

    @property
    def enabled(self) -> bool:
        """Whether a cache is installed (not `none`)."""
        return self.name != NONE

    def text(self) -> str:
        """The spec as the command line writes it, every option spelled out."""
        return ":".join([self.name] + [f"{k}={format_option(v)}" for k, v in options_dict(self.options).items()])

    def short_text(self) -> str:
        """The spec with only the options that differ from the defaults and were given (labels, file names, titles);
        a file shows its name only."""
        defaults = options_dict(CACHES[self.name]())
        parts = [self.name]
        for k, v in options_dict(self.options).items():
            if defaults.get(k) != v and k not in self.implicit:
                parts.append(f"{k}={Path(v).name if k == 'file' else format_option(v)}")
        return ":".join(parts)

    def summary(self) -> dict[str, Any]:
        """JSON-ready: {"name", **options}."""
        return {"name": self.name, **options_dict(self.options)}


NO_CACHE = CacheSpec(NONE, NoCacheOptions())


@dataclass(kw_only=True)
class CacheCounts:
    """A base of the rows of `vsagen profile` and `vsagen compare`: what one run's step cache did. `cache` is its
    entry without default options ("none", "first-block:threshold=0.1"), `cache_spec` with every option;
    `dit_computed_forwards` / `dit_reused_forwards` the timed DiT forwards it computed / served from its cache (all
    computed without one), `dit_reuse_share` reused / both, and `dit_per_computed_forward_s` /
    `dit_per_reused_forward_s` the mean DiT seconds of one (None where none ran), `dit_computed_s` / `dit_reused_s`
    their DiT seconds and `dit_reused_steps` the steps with a reused forward (`TIMING_FIELDS`: as t2v's JSON)."""

    cache: str = "none"
    cache_spec: str = "none"
    dit_computed_forwards: int = 0
    dit_reused_forwards: int = 0
    dit_reuse_share: float | None = None
    dit_per_computed_forward_s: float | None = None
    dit_per_reused_forward_s: float | None = None
    dit_computed_s: float = 0.0
    dit_reused_s: float = 0.0
    dit_reused_steps: list[int] = field(default_factory=list)

    @property
    def cached(self) -> bool:
        """Whether the run had a step cache (not `none`)."""
        return self.cache != NONE

    @property
    def cache_suffix(self) -> str:
        """" + <cache>" for a cached run, "" for an uncached one (labels)."""
        return f" + {self.cache}" if self.cached else ""


# The fields `CacheCounts` takes from a run's `vsagen.timing.TimingReport` under the same names (t2v's JSON "timing"
# has them too), besides its `cache_stats()`.
TIMING_FIELDS = ("dit_computed_forwards", "dit_reused_forwards", "dit_computed_s", "dit_reused_s", "dit_reused_steps")


def cache_counts(spec: CacheSpec, timing: Any) -> dict[str, Any]:
    """`CacheCounts`' fields of a run with the cache `spec`, from its `vsagen.timing.TimingReport` `timing`."""
    return {"cache": spec.short_text(), "cache_spec": spec.text(),
            **{k: getattr(timing, k) for k in TIMING_FIELDS}, **timing.cache_stats()}


def no_reuse_note(spec: CacheSpec, records: Any, where: str = "") -> str | None:
    """The run note of a cached run that reused no DiT forward (None when it reused one, had no cache, or calibrated
    MagCache, which never reuses): what kept it computing and which option to change. `records`: the run's
    `Timer.finish` (name, step, seconds) records; `where` names the run among several ("comparing vsa + mag")."""
    names = [r[0] for r in records]
    if not spec.enabled or (spec.name == "mag" and spec.options.calibrate) or "dit_reused" in names \
            or "dit_computed" not in names:
        return None
    o = spec.options
    why = {"first-block": f"its threshold {format_option(getattr(o, 'threshold', 0))} was never met; raise it to "
                          "reuse",
           "mag": f"its predicted error stayed above its threshold {format_option(getattr(o, 'threshold', 0))} "
                  f"after the first {format_option(getattr(o, 'retention_ratio', 0))} of the steps; raise threshold "
                  "(or lower retention_ratio) to reuse",
           "taylorseer": f"no forward fell between two computed ones (cache_interval "
                         f"{getattr(o, 'cache_interval', 0)} after disable_cache_before_step "
                         f"{getattr(o, 'disable_cache_before_step', 0)} computed forwards); lower them to reuse"}
    return f"{spec.short_text()} reused no forward{f' when {where}' if where else ''}: {why[spec.name]}"


def parse_cache(text: str, where: str = "--cache") -> CacheSpec:
    """One `NAME[:KEY=VALUE...]` entry as a `CacheSpec`.

    Raises:
        BadInput: an unknown name (the message lists them), an entry that is not KEY=VALUE, an unknown key (the
            message lists the cache's options), a key given twice, or a value its Options refuse.
    """
    name, *pairs = [p.strip() for p in str(text).strip().split(":")]
    if name not in CACHES:
        raise BadInput(f"unknown {where} {name!r}; available: {', '.join(CACHES)}")
    cls = CACHES[name]
    known = text_options(cls)

    def check_key(key: str) -> None:
        if key not in known:
            raise BadInput(f"{where} {text!r}: {no_option(name, key, known)}")

    raw = option_pairs(text, pairs, where, check_key)
    values = {key: convert_option(cls, key, value, f"{where} {text!r}") for key, value in raw.items()}
    try:
        return CacheSpec(name, cls(**values))
    except BadInput as e:
        raise BadInput(f"{where} {text!r}: {e}") from None


def parse_cache_list(text: str, where: str = "--cache") -> tuple[CacheSpec, ...]:
    """A comma-separated list of entries (`vsagen profile` / `compare`), in order; one entry for the others.

    Raises:
        BadInput: an empty list or entry, an entry that does not parse (`parse_cache`), two entries that are one
            configuration.
    """
    entries = [e.strip() for e in str(text).split(",")]
    if not str(text).strip() or not all(entries):
        raise BadInput(f"{where} {text!r} has an empty entry; give e.g. none,first-block:threshold=0.1")
    specs = tuple(parse_cache(e, where) for e in entries)
    for i, spec in enumerate(specs):
        if spec in specs[:i]:
            raise BadInput(f"{where} lists {spec.text()} twice; give each configuration once")
    return specs


@dataclass(frozen=True)
class CacheList:
    """`--cache` as parsed once (`parse_caches`): the text as given and each entry's `CacheSpec`, in order. Whether a
    list is taken is the command's (`vsagen profile` and `vsagen compare` run several)."""

    text: str
    specs: tuple[CacheSpec, ...]


def parse_caches(text: str, where: str = "--cache") -> CacheList:
    """A `--cache` text (one entry, or a comma-separated list) as its `CacheList`.

    Raises:
        BadInput: see `parse_cache_list`.
    """
    return CacheList(str(text), parse_cache_list(text, where))


def cache_options_help() -> list[tuple[str, list[str]]]:
    """(name, ["KEY=DEFAULT", ...]) of every cache, for help texts and docs."""
    def shown(v: Any) -> str:
        return "none" if v is None else format_option(v)

    return [(name, [f"{k}={shown(getattr(cls(), k))}" for k in option_names(cls)]) for name, cls in CACHES.items()]
