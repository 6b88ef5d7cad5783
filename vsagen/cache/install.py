"""Install a `vsagen.cache.cache_spec.CacheSpec` on a pipeline's transformers through diffusers' `enable_cache`, count
what it did, and read MagCache's calibration.

`install_cache(transformers, spec, timer, ...)` runs `transformer.enable_cache(config)` on every expert (after
vsagen's attention patch: the torch hooks vsagen puts on a transformer and on `blocks[0]` run around the forward
that diffusers' hook registry replaces, so blocks[0]'s tile-order pre-hook reorders the hidden states before
FirstBlockCache's head hook sees them, and `proj_out`'s raster restore runs after a TaylorSeer prediction), and a
forward pre/post hook pair on each transformer that records every forward under the timer as region
"dit_computed" or "dit_reused", decided from the cache hooks' own state after the forward (FirstBlockCache's and
MagCache's shared `should_compute`, set by their head hook each forward; TaylorSeer: whether its hooked modules
updated their Taylor factors at this forward, `last_update_step == current_step`). Warm-up forwards (timer off)
are not recorded. `InstalledCache.remove()` runs `disable_cache` and removes the counters.

diffusers keeps one state per cache context; its Wan pipelines call the transformer inside
`cache_context("cond")` / `cache_context("uncond")`, and reset every state at the end of a pipeline call
(`maybe_free_model_hooks`). Verified on diffusers 0.42.1.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import BadInput
from ..timing import Timer
from .cache_spec import WAN_TAYLORSEER_MODULES, CacheSpec

# diffusers' hook names (diffusers.hooks.first_block_cache / mag_cache / taylorseer_cache)
HEAD_HOOKS = {"first-block": "fbc_leader_block_hook", "mag": "mag_cache_leader_block_hook"}
TAYLORSEER_HOOK = "taylorseer_cache"
# MagCache's calibration resets (and prints its ratios) when its step count reaches `num_inference_steps`; while
# calibrating, vsagen gives it a count no run reaches and reads the ratios after every forward instead.
CALIBRATION_STEPS = 10**9
MAG_FILE_VERSION = 1


def diffusers_config(spec: CacheSpec, *, steps: int, dtype: Any, ratios: Sequence[float] | None = None) -> Any:
    """The diffusers config of `spec` for one expert that runs `steps` steps (where the count of
    its `ratios` differs, diffusers' MagCacheConfig resamples them to `steps` by nearest neighbour: entries repeated
    or dropped); `dtype`: the transformer's, for TaylorSeer's factors (diffusers' default bfloat16 would round an fp32
    run's features)."""
    from diffusers.hooks import FirstBlockCacheConfig, MagCacheConfig, TaylorSeerCacheConfig

    o = spec.options
    if spec.name == "first-block":
        return FirstBlockCacheConfig(threshold=o.threshold)
    if spec.name == "mag":
        if o.calibrate:
            return MagCacheConfig(calibrate=True, num_inference_steps=CALIBRATION_STEPS)
        return MagCacheConfig(threshold=o.threshold, max_skip_steps=o.max_skip_steps,
                              retention_ratio=o.retention_ratio, num_inference_steps=steps, mag_ratios=list(ratios))
    if spec.name == "taylorseer":
        return TaylorSeerCacheConfig(cache_interval=o.cache_interval,
                                     disable_cache_before_step=o.disable_cache_before_step, max_order=o.max_order,
                                     taylor_factors_dtype=dtype, use_lite_mode=o.lite,
                                     cache_identifiers=None if o.lite else list(WAN_TAYLORSEER_MODULES))
    raise ValueError(f"no diffusers cache for {spec.name!r}")


def _hook(module: Any, name: str) -> Any:
    registry = getattr(module, "_diffusers_hook", None)
    return registry.get_hook(name) if registry is not None else None


def _probe(transformer: Any, spec: CacheSpec) -> tuple[Callable[[], bool], Callable[[], Any]]:
    """(computed, state) readers for the current forward of `transformer`: whether the cache computed it, and the
    head hook's state (for MagCache's calibration ratios)."""
    if spec.name in HEAD_HOOKS:
        hook = _hook(transformer.blocks[0], HEAD_HOOKS[spec.name])
        if hook is None:
            raise RuntimeError(f"{spec.name}: diffusers put no head hook on blocks[0]")
        state = hook.state_manager.get_state
        return (lambda: bool(state().should_compute)), state
    hooked = [m for m in transformer.modules() if _hook(m, TAYLORSEER_HOOK) is not None]
    if not hooked:
        raise BadInput("--cache taylorseer: its patterns hooked no module of this transformer")
    state = _hook(hooked[0], TAYLORSEER_HOOK).state_manager.get_state

    def computed() -> bool:
        s = state()
        return s.last_update_step == s.current_step

    return computed, state


@dataclass
class InstalledCache:
    """What `install_cache` put on the transformers; `remove()` undoes it.

    Attributes:
        spec: the cache.
        calibration: MagCache calibration only: {expert: {context: ratios}} of the last pipeline call (one ratio
            per step the expert ran in that context, the first 1.0).
    """

    spec: CacheSpec
    calibration: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def remove(self) -> None:
        """`disable_cache` on every transformer, the counters removed. Calling it again does nothing."""
        while self._undo:
            self._undo.pop()()

    def calibration_file(self, model: str, steps: int, sampler: str | None = None) -> tuple[Path, str] | None:
        """While MagCache calibrates: (the spec's `file`, its JSON text: `calibration_text` of `ratios()`, `model`,
        the run's `steps` and `sampler` name), for the caller to write with its other files; else None.

        Raises:
            BadInput: no ratios were recorded.
        """
        if self.spec.name != "mag" or not self.spec.options.calibrate:
            return None
        return self.spec.options.file, calibration_text(model, steps, self.ratios(), sampler)

    def ratios(self) -> dict[str, list[float]]:
        """The calibrated ratios per expert: per step, the mean over the contexts (cond / uncond) that ran it."""
        out = {}
        for expert, by_context in self.calibration.items():
            n = max(len(r) for r in by_context.values())
            rows = [[r[i] for r in by_context.values() if len(r) > i] for i in range(n)]
            out[expert] = [sum(row) / len(row) for row in rows]
        return out


def _drop_bound_forwards(transformer: Any, before: set[int]) -> None:
    """diffusers' `remove_hook` leaves the class's bound `forward` as an instance attribute of each module it hooked;
    drop those (modules that had no instance `forward` before), so the modules are as they were (vsagen.blocks
    installs its forward only where none is set)."""
    for m in transformer.modules():
        fwd = m.__dict__.get("forward")
        if id(m) not in before and getattr(fwd, "__self__", None) is m \
                and getattr(fwd, "__func__", None) is type(m).forward:
            del m.forward


def install_cache(transformers: Sequence[tuple[str, Any]], spec: CacheSpec, timer: Timer, *,
                  steps: dict[str, int], ratios: dict[str, list[float]] | None = None) -> InstalledCache:
    """Enable `spec` on every transformer and count its forwards (module docstring).

    Args:
        transformers: (component name, `WanTransformer3DModel`) of every expert, already patched by vsagen.
        spec: the cache (not `none`).
        timer: receives "dit_computed" / "dit_reused" per forward (tagged with `timer.step`).
        steps: the steps each expert runs in one pipeline call (MagCache's `num_inference_steps`).
        ratios: MagCache's calibrated ratios by expert (not when calibrating; None: read from the spec's `file`).

    Raises:
        BadInput: a cache already enabled on a transformer, a transformer of fewer than 2 blocks (first-block), no
            ratios for an expert (mag), no module TaylorSeer hooks.
    """
    installed = InstalledCache(spec)
    try:
        for name, t in transformers:
            if getattr(t, "is_cache_enabled", False):
                raise BadInput(f"--cache {spec.name}: {name} has a diffusers cache enabled already")
            if spec.name == "first-block" and len(t.blocks) < 2:
                raise BadInput("--cache first-block needs a transformer of at least 2 blocks")
            expert_ratios = None
            if spec.name == "mag" and not spec.options.calibrate:
                if ratios is None:
                    ratios = load_ratios(spec.options.file)
                expert_ratios = ratios.get(name)
                if not expert_ratios:
                    raise BadInput(f"--cache mag: the calibration file has no ratios for {name}; calibrate again "
                                   "(mag:calibrate=true)")
            config = diffusers_config(spec, steps=steps.get(name, 1), dtype=t.dtype, ratios=expert_ratios)
            before = {id(m) for m in t.modules() if "forward" in m.__dict__}
            t.enable_cache(config)
            installed._undo.append(lambda t=t, before=before: (t.disable_cache(), _drop_bound_forwards(t, before)))
            installed._undo.extend(h.remove for h in _count_hooks(t, name, spec, timer, installed))
    except BaseException:
        installed.remove()
        raise
    return installed


def _count_hooks(transformer: Any, expert: str, spec: CacheSpec, timer: Timer, installed: InstalledCache) -> list:
    """The pre/post forward hooks that time each forward as "dit_computed" or "dit_reused" and, while MagCache
    calibrates, copy its ratios."""
    computed, state = _probe(transformer, spec)
    calibrating = spec.name == "mag" and spec.options.calibrate
    tokens: list[int | None] = []

    def pre(module, args, kwargs):
        tokens.append(timer.start("dit_cache"))

    def post(module, args, kwargs, output):
        timer.stop(tokens.pop() if tokens else None, rename="dit_computed" if computed() else "dit_reused")
        if calibrating:
            s = state()
            context = transformer.blocks[0]._diffusers_hook.get_hook(HEAD_HOOKS["mag"]).state_manager.context.name
            installed.calibration.setdefault(expert, {})[context] = list(s.calibration_ratios)

    # the "dit" region's hooks are on the transformer already: the pre hook appended runs after its start and the
    # post hook prepended runs before its stop, so each of these regions lies inside a "dit" region and the split
    # never exceeds the DiT time (appended, the post hook ran after "dit" stopped: the time between the two, a GC
    # pause or a preempted thread on a loaded CPU, was counted in the split only)
    return [transformer.register_forward_pre_hook(pre, with_kwargs=True),
            transformer.register_forward_hook(post, with_kwargs=True, prepend=True)]


def expert_steps(pipe: Any, steps: int) -> dict[str, int]:
    """The steps each expert of `pipe` runs in a call of `steps` steps: all of them for one expert; for two, as
    diffusers' Wan pipelines split them (the first expert while t >= boundary_ratio x num_train_timesteps), on a
    copy of the pipeline's scheduler."""
    names = [n for n in ("transformer", "transformer_2") if getattr(pipe, n, None) is not None]
    ratio = getattr(getattr(pipe, "config", None), "boundary_ratio", None)
    if len(names) < 2 or ratio is None:
        return {n: steps for n in names}
    scheduler = copy.deepcopy(pipe.scheduler)
    scheduler.set_timesteps(steps)
    boundary = ratio * scheduler.config.num_train_timesteps
    high = sum(1 for t in scheduler.timesteps[:steps] if float(t) >= boundary)
    return {names[0]: high, names[1]: steps - high}


def save_ratios(path: Path, model: str, steps: int, ratios: dict[str, list[float]],
                sampler: str | None = None) -> None:
    """Write MagCache's calibrated ratios of `model` to `path` (JSON: version, model, steps, sampler, ratios by
    expert), through a temporary file beside it (`calibration_text`).

    Raises:
        BadInput: no ratios (nothing ran), or the file cannot be written.
    """
    text = calibration_text(model, steps, ratios, sampler)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as e:
        raise BadInput(f"--cache mag: cannot write the calibration file {path} ({e.strerror or e})") from None


def calibration_text(model: str, steps: int, ratios: dict[str, list[float]], sampler: str | None = None) -> str:
    """The calibration file's JSON text: version, `model` (as `--model` named it), the `steps` the run took and
    its `sampler`'s name (what later runs are checked against, `calibration_notes`), the ratios by expert.

    Raises:
        BadInput: no ratios (nothing ran).
    """
    if not ratios:
        raise BadInput("--cache mag:calibrate=true: the run recorded no ratios")
    return json.dumps({"version": MAG_FILE_VERSION, "model": model, "steps": steps, "sampler": sampler,
                       "ratios": ratios}, indent=1) + "\n"


def load_calibration(path: Path) -> dict[str, Any]:
    """A calibration file `save_ratios` wrote: {"model": str, "steps": int, "sampler": str | None, "ratios":
    {expert: [float, ...]}}, checked as `calibration_text` writes it: version `MAG_FILE_VERSION`, a model name,
    steps >= 1, and for each expert a non-empty list of finite ratios > 0 (MagCache's ratios are ratios of
    consecutive steps' residual norms: positive).

    Raises:
        BadInput: no such file, or not such a file (the line says how to make one).
    """
    how = "run once with --cache mag:calibrate=true (same --model) to write it"
    if not path.is_file():
        raise BadInput(f"--cache mag: no calibration file {path}; {how}")
    try:
        data = json.loads(path.read_text())
        ratios = {str(k): [float(x) for x in v] for k, v in data["ratios"].items()}
        model, steps, sampler = data["model"], data["steps"], data.get("sampler")
        if (data.get("version") != MAG_FILE_VERSION or not isinstance(model, str) or not model.strip()
                or isinstance(steps, bool) or not isinstance(steps, int) or steps < 1
                or not (sampler is None or isinstance(sampler, str))):
            raise ValueError
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise BadInput(f"--cache mag: {path} is not a MagCache calibration file of vsagen; {how}") from None
    if not ratios or not all(ratios.values()):
        raise BadInput(f"--cache mag: {path} holds no ratios; {how}")
    bad = next(((e, x) for e, r in ratios.items() for x in r if not (math.isfinite(x) and x > 0)), None)
    if bad is not None:
        raise BadInput(f"--cache mag: {path} holds the ratio {bad[1]!r} for {bad[0]} (ratios are finite and > 0): "
                       f"not a calibration vsagen wrote; {how}")
    return {"model": model, "steps": steps, "sampler": sampler, "ratios": ratios}


def load_ratios(path: Path) -> dict[str, list[float]]:
    """MagCache's ratios by expert from a file `save_ratios` wrote (`load_calibration`'s "ratios").

    Raises:
        BadInput: as `load_calibration`.
    """
    return load_calibration(path)["ratios"]
