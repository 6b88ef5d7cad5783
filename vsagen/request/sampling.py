"""The sampler part of a request: `--sampler` entries (`NAME[:KEY=VALUE...]`) as `vsagen.samplers.Sampler`s, and
the step count, CFG scale and flow shift a sampler leaves the run.

Precedence (the request layer's, `vsagen.request.resolve`): `--sampler` > the preset's `sampler` > `default`. A
re-noise sampler fixes the steps (its sigma list) and turns CFG off: `--steps` other than its count, `--guidance`
above 1 or `--flow-shift` with it are refused in one line (they would not do what they say). `default` takes the
steps, CFG scale and shift of its entry or the flags (both at once: refused), else the command's or the preset's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ..errors import BadInput
from ..samplers import (NAMED, NUM_TRAIN_TIMESTEPS, NOISE, RCM_ANGLES, RCM_MAX_STEPS, RCM_SIGMA_MAX, Sampler,
                        check_renoise_lists, rcm_times)
from .bounds import MAX_FLOW_SHIFT, MAX_GUIDANCE, MAX_STEPS

MAX_RCM_SIGMA = 1e6  # rCM's initial EDM sigma: 80 (T2V) and 200 (I2V) published; atan saturates long before this


def _numbers(text: str, what: str, entry: str) -> tuple[float, ...]:
    parts = [p.strip() for p in text.replace("/", ",").split(",")]
    if not parts or any(not p for p in parts):
        raise BadInput(f"--sampler {entry!r}: {what} is a comma-separated list of numbers, e.g. 1.0,0.75,0.5")
    for p in parts:
        try:
            float(p)
        except ValueError:
            raise BadInput(f"--sampler {entry!r}: {what}: {p!r} is not a number (give {what} as numbers, e.g. "
                           "1.0,0.75,0.5)") from None
    values = tuple(float(p) for p in parts)
    if not all(math.isfinite(v) for v in values):
        raise BadInput(f"--sampler {entry!r}: {what} must be finite numbers, got {text!r}")
    return values


def _default_option(key: str, value: str, entry: str) -> Any:
    try:
        number = int(value) if key == "steps" else float(value)
    except ValueError:
        raise BadInput(f"--sampler {entry!r}: {key} must be {'an integer' if key == 'steps' else 'a number'}, "
                       f"got {value!r}") from None
    bounds = {"steps": (1, MAX_STEPS), "guidance": (0, MAX_GUIDANCE), "shift": (0, MAX_FLOW_SHIFT)}[key]
    ok = bounds[0] <= number <= bounds[1] and math.isfinite(number) and not (key == "shift" and number == 0)
    if not ok:
        raise BadInput(f"--sampler {entry!r}: {key} must be in {'(' if key == 'shift' else '['}{bounds[0]}, "
                       f"{bounds[1]}], got {value}")
    return number


def parse_sampler(entry: str) -> Sampler:
    """One `--sampler` entry: `NAME[:KEY=VALUE...]`.

    `default` takes `steps`, `guidance`, `shift`; a sigma list (`dmd`, `dmd-hummingbird`, `lightx2v-4step`) takes
    `sigmas` (comma-separated, each in (0, 1], decreasing), `timesteps` (as many, in [0, 1000], non-increasing;
    default sigma x 1000 when `sigmas` is given) and `noise` (fresh | once | none); `rcm` takes `steps` (1-4),
    `sigma_max` (> 0) and `ode` (true | false).

    Raises:
        BadInput: an unknown name or option, an option given twice, a value out of its bounds (one line naming it).
    """
    text = entry.strip()
    name, _, rest = text.partition(":")
    name = name.strip()
    if name not in NAMED:
        raise BadInput(f"unknown --sampler {name!r}; available: {', '.join(NAMED)} (or dmd:sigmas=1.0,0.75,0.5)")
    if rest is not None and ":" in text and not rest.strip():
        raise BadInput(f"--sampler {text!r}: nothing after the colon; write {name} or {name}:KEY=VALUE")
    base = NAMED[name]
    keys = (("steps", "guidance", "shift") if not base.renoise else ("steps", "sigma_max", "ode")
            if base.sigma_max is not None else ("sigmas", "timesteps", "noise"))
    given: dict[str, str] = {}
    for pair in (p for p in rest.split(":") if rest):
        key, eq, value = (x.strip() for x in pair.partition("="))
        if not eq or not key or not value:
            raise BadInput(f"--sampler {text!r}: options are written NAME:KEY=VALUE, got {pair!r}")
        if key not in keys:
            raise BadInput(f"--sampler {text!r}: {name} takes no option {key!r}; its options: {', '.join(keys)}")
        if key in given:
            raise BadInput(f"--sampler {text!r}: {key} is given twice")
        given[key] = value
    if not base.renoise:
        return replace(base, **{k: _default_option(k, v, text) for k, v in given.items()})
    if base.sigma_max is not None:
        return _rcm(base, given, text)
    if "timesteps" in given and "sigmas" not in given:
        raise BadInput(f"--sampler {text!r}: timesteps need their sigmas (sigmas=...:timesteps=...)")
    sigmas, timesteps = base.sigmas, base.timesteps
    if "sigmas" in given:
        sigmas = _numbers(given["sigmas"], "sigmas", text)
        timesteps = _numbers(given["timesteps"], "timesteps", text) if "timesteps" in given else tuple(
            s * NUM_TRAIN_TIMESTEPS for s in sigmas)
    check_renoise_lists(sigmas, timesteps, text)
    noise = given.get("noise", base.noise)
    if noise not in NOISE:
        raise BadInput(f"--sampler {text!r}: noise must be one of {', '.join(NOISE)}, got {noise!r}")
    custom = "sigmas" in given
    return replace(base, sigmas=sigmas, timesteps=timesteps, noise=noise, custom=custom or noise != base.noise,
                   source=f"a custom sigma list with {name}'s re-noise update" if custom else base.source)


def _rcm(base: Sampler, given: dict[str, str], text: str) -> Sampler:
    """An `rcm` entry's options (`steps`, `sigma_max`, `ode`) as its lists (`vsagen.samplers.rcm_times`)."""
    steps = len(base.sigmas)
    if "steps" in given:
        try:
            steps = int(given["steps"])
        except ValueError:
            raise BadInput(f"--sampler {text!r}: steps must be an integer, got {given['steps']!r}") from None
        if not 1 <= steps <= RCM_MAX_STEPS:
            raise BadInput(f"--sampler {text!r}: rCM runs 1 to {RCM_MAX_STEPS} steps, got {steps}")
    sigma_max = base.sigma_max
    if "sigma_max" in given:
        try:
            sigma_max = float(given["sigma_max"])
        except ValueError:
            raise BadInput(f"--sampler {text!r}: sigma_max must be a number, got {given['sigma_max']!r}") from None
        if not (math.isfinite(sigma_max) and 0 < sigma_max <= MAX_RCM_SIGMA):
            raise BadInput(f"--sampler {text!r}: sigma_max must be in (0, {MAX_RCM_SIGMA:g}], got {given['sigma_max']}")
    if steps > 1 and not math.atan(sigma_max) > RCM_ANGLES[0]:  # the times must fall: atan(sigma_max) > 1.5
        raise BadInput(f"--sampler {text!r}: with {steps} steps sigma_max must be above tan({RCM_ANGLES[0]:g}) = "
                       f"{math.tan(RCM_ANGLES[0]):.4g} (rCM's next angle is {RCM_ANGLES[0]:g}: a lower start would put "
                       f"noise back), got {sigma_max:g}")
    ode = given.get("ode", "false").lower()
    if ode not in ("true", "false"):
        raise BadInput(f"--sampler {text!r}: ode must be true or false, got {given['ode']!r}")
    sigmas, timesteps = rcm_times(steps, sigma_max)
    noise = "none" if ode == "true" else base.noise
    return replace(base, sigmas=sigmas, timesteps=timesteps, sigma_max=sigma_max, noise=noise,
                   custom=(steps, sigma_max, noise) != (len(base.sigmas), base.sigma_max, base.noise))


def split_sampler_list(text: str) -> tuple[str, ...]:
    """The entries of a comma-separated `--sampler` list (`vsagen compare`; one entry elsewhere): a piece that starts
    with a number, or any piece but a sampler's name after an entry ending in `sigmas=` / `timesteps=` (`1.0,abc`:
    `parse_sampler` says 'abc' is not a number), belongs to the sigma or timestep list of the entry before it
    (`dmd:sigmas=1.0,0.8,0.5,default:steps=50` is two entries, `dmd:sigmas=1.0,0.5:timesteps=1000,500` one).

    Raises:
        BadInput: an empty list or entry, or a list that starts with a number.
    """
    entries: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            raise BadInput(f"--sampler {text!r}: an empty entry; write NAME[:KEY=VALUE...] separated by commas")
        try:  # a number, or a number and the entry's next options ("0.5:timesteps=1000"): the list goes on
            float(piece.split(":", 1)[0])
            is_number = True
        except ValueError:
            is_number = False
        in_a_list = bool(entries) and entries[-1].rsplit(":", 1)[-1].startswith(("sigmas=", "timesteps=")) \
            and piece.split(":", 1)[0] not in NAMED  # (a word there is a bad number of the list, not a sampler)
        if is_number or in_a_list:
            if not entries:
                raise BadInput(f"--sampler {text!r}: an entry starts with a sampler name ({', '.join(NAMED)})")
            entries[-1] += "," + piece
        else:
            entries.append(piece)
    return tuple(entries)


@dataclass(frozen=True)
class SamplerList:
    """`--sampler` (or a preset's `sampler`) as parsed once (`parse_sampler_list`): the text as given, each entry as
    written and its `Sampler`, in order. Whether a list is taken is the command's (`vsagen compare` runs several)."""

    text: str
    entries: tuple[str, ...]
    samplers: tuple[Sampler, ...]


def parse_sampler_list(text: str) -> SamplerList:
    """A `--sampler` text (one entry, or `vsagen compare`'s comma-separated list) as its `SamplerList`.

    Raises:
        BadInput: an empty list or entry, a list that starts with a number (`split_sampler_list`), an entry that does
            not parse (`parse_sampler`).
    """
    entries = split_sampler_list(text)
    return SamplerList(text, entries, tuple(parse_sampler(e) for e in entries))


@dataclass(frozen=True)
class SamplerPlan:
    """What a sampler leaves a run: the sampler, its step count, CFG scale and flow shift."""

    sampler: Sampler
    steps: int
    guidance: float
    flow_shift: float


def plan_sampler(sampler: Sampler, *, steps: int | None, guidance: float | None, flow_shift: float | None,
                 default_steps: int, default_guidance: float, default_shift: float, preset: str) -> SamplerPlan:
    """The step count, CFG scale and flow shift of a run with `sampler`.

    Args:
        sampler: the parsed sampler (`--sampler`, else the preset's).
        steps, guidance, flow_shift: the flags as given (None: not given).
        default_steps, default_guidance, default_shift: the command's or the preset's.
        preset: the model preset's name (for messages).

    Raises:
        BadInput: with a re-noise sampler, `--steps` unlike its sigma count, `--guidance` above 1 or `--flow-shift`;
            with `default`, a flag and the entry both setting one value.
    """
    if sampler.renoise:
        n = len(sampler.sigmas)
        sigmas = ", ".join(f"{s:.6g}" for s in sampler.sigmas)
        if steps is not None and steps != n:
            own = ""
            if sampler.sigma_max is not None and 1 <= steps <= RCM_MAX_STEPS:  # rCM takes 1-4 steps itself
                own = (f"use --sampler rcm:steps={steps}" + ("" if sampler.sigma_max == RCM_SIGMA_MAX else
                                                             f":sigma_max={sampler.sigma_max:g}") + ", ")
            raise BadInput(f"--steps {steps}: the {sampler.name} sampler runs {n} step{'s' if n != 1 else ''} (sigma "
                           f"{sigmas}); leave --steps out, {own}or run the checkpoint's scheduler with --sampler "
                           f"default --steps {steps}")
        if guidance is not None and guidance > 1:
            raise BadInput(f"--guidance {guidance:g} turns CFG on, and the {sampler.name} sampler runs without CFG "
                           "(one DiT pass a step, as the checkpoint was distilled); leave --guidance out, or use "
                           "--sampler default")
        if flow_shift is not None:
            raise BadInput(f"--flow-shift does not apply to the {sampler.name} sampler (its sigmas {sigmas} are used "
                           "as given); leave it out, or use --sampler default")
        return SamplerPlan(sampler, n, 1.0 if guidance is None else guidance, default_shift)
    for flag, given, entry, key in (("--steps", steps, sampler.steps, "steps"),
                                    ("--guidance", guidance, sampler.guidance, "guidance"),
                                    ("--flow-shift", flow_shift, sampler.shift, "shift")):
        if given is not None and entry is not None:
            raise BadInput(f"{flag} and --sampler {sampler.text} both set the {key}; say it once")
    pick = lambda given, entry, default: given if given is not None else (entry if entry is not None else default)  # noqa: E731
    return SamplerPlan(sampler, pick(steps, sampler.steps, default_steps),
                       pick(guidance, sampler.guidance, default_guidance),
                       pick(flow_shift, sampler.shift, default_shift))
