"""Samplers: how the denoising walks from noise to the video, as a part of the request (`--sampler`).

Two kinds:

* `default`: the checkpoint's own multistep scheduler (diffusers' UniPC flow-matching scheduler from the
  checkpoint's scheduler config, with the request's flow shift) for `--steps` steps, CFG as `--guidance` says. Its
  entry may carry `steps`, `guidance` and `shift` (what `vsagen compare` needs to run a 50-step CFG reference beside a
  distilled run: `default:steps=50:guidance=5`).
* re-noise samplers of few-step distilled checkpoints (DMD distillation: FastVideo's FastWan, AMD's Hummingbird-XT):
  an explicit sigma list and the transformer timesteps their authors feed. Each step predicts the flow v at
  (x, sigma_i), takes x0 = x - sigma_i * v and, except after the last step, re-noises it to the next sigma:
  x = (1 - sigma_{i+1}) * x0 + sigma_{i+1} * eps with Gaussian eps; the last step returns x0. CFG is off (one DiT
  pass a step) and the flow shift does not apply (the sigmas are used as given). This is exactly diffusers'
  `FlowMatchEulerDiscreteScheduler(stochastic_sampling=True, shift=1.0)` after `set_timesteps(sigmas=...,
  timesteps=...)` (a terminal sigma 0 is appended); `use_sampler` installs it on a pipeline for one call. diffusers'
  `WanPipeline.__call__` takes no sigma list (it calls `scheduler.set_timesteps(num_inference_steps)`), so the
  installed scheduler answers that call with the sampler's lists, and hands its own seeded generator to `step`
  (the pipeline passes none), so a seed makes the video reproducible.

Named samplers (sources read 2026-12-03; see the references in each entry):
* `dmd`: FastVideo's DMD stage (`fastvideo/pipelines/stages/denoising.py`, `DmdDenoisingStage`, @2f3d407):
  transformer timesteps 1000, 757, 522 (int64), looked up in a FlowMatchEulerDiscreteScheduler(shift=8) table of
  1000 training timesteps: sigma = 1, 28/37 (0.756757), 12/23 (0.521739); fresh noise at each re-noise.
* `dmd-hummingbird`: AMD Hummingbird-XT's 3-step list (`infer/videox_fun/pipeline/pipeline_wan2_2_ti2v.py`,
  @63b54d1): training timesteps 1000, 750, 500 warped through its shift-10 table: sigma = 1, 30/31 (0.967742), 10/11
  (0.909091); the transformer gets those timesteps after a bf16 round trip and an int64 cast (1000, 968, 908); both
  re-noises draw the same noise (one seeded generator, reseeded each step).

* `rcm`: TurboDiffusion's rCM (`turbodiffusion/inference/wan2.1_t2v_infer.py`, @aaecff5): 1-4 steps at the
  TrigFlow angles atan(sigma_max), 1.5, 1.4, 1.0 (the first `steps`), each mapped to the flow time
  t = sin(a) / (cos(a) + sin(a)): 0.987654, 0.933781, 0.852895, 0.608979 for sigma_max 80 (T2V; their I2V uses 200,
  first t 0.995025); the transformer gets t x 1000 through a bf16 tensor (988, 932, 852, 608); fresh noise at each
  re-noise; `ode=true` (their I2V `--ode`, wan2.2_i2v_infer.py:202-203, which their I2V script passes: the
  TurboWan2.2 I2V presets' default) takes the Euler step x - (t - t_next) v instead of re-noising.

* `lightx2v-4step`: LightX2V's 4-step distilled Wan models (`lightx2v/Wan2.1-Distill-Models`,
  `lightx2v/Wan2.2-Distill-Models`; ModelTC/LightX2V @f8aee98, `WanStepDistillScheduler`,
  `lightx2v/models/schedulers/wan/step_distill/scheduler.py:25-49`, with `denoising_step_list` [1000, 750, 500, 250]
  and `sample_shift` 5 from `configs/distill/wan21/wan_t2v_distill_model_4step_cfg.json` and
  `configs/distill/wan22/wan_moe_i2v_distill_model.json`): a float32 table of 1000 sigmas linspace(1, 0, 1001)[:-1]
  shifted by 5 (sigma' = 5 s / (1 + 4 s)), indexed at 1000 - t: sigma = 1, 15/16, 5/6, 5/8, timesteps sigma x 1000
  (1000, 937.5, 833.333, 625). Its step is the Euler ODE step x + (sigma_next - sigma) v, x - sigma v at the last
  (no re-noise: `noise="none"`), from pure noise. The Wan2.2 A14B experts switch at step index 2
  (`boundary_step_index`, `lightx2v/models/runners/wan/wan_distill_runner.py:61`), which the base checkpoint's
  boundary_ratio 0.9 gives (timesteps 1000 and 937.5 >= 900 run the high-noise expert).

Every re-noise sampler starts from sigma_0 x eps (a flow latent at sigma_0 with the clean part's mean, 0): pure
noise for the DMD lists (sigma_0 = 1), 0.987654 x eps for rCM, as TurboDiffusion starts.

Custom lists: `dmd:sigmas=1.0,0.75,0.5` (timesteps default to sigma x 1000, as diffusers derives them),
`dmd:sigmas=...:timesteps=1000,750,500`, `:noise=fresh|once|none` (none: the Euler ODE step, no re-noise).
"""

from __future__ import annotations

import contextlib
import math
import struct
from dataclasses import dataclass
from typing import Any, Iterator

from .errors import BadInput

NUM_TRAIN_TIMESTEPS = 1000  # Wan's flow-matching schedulers: timestep = sigma x 1000
MAX_SAMPLER_STEPS = 50  # the longest sigma list a re-noise sampler takes
NOISE = ("fresh", "once", "none")  # a new draw at each re-noise | the same draw each time | no re-noise (Euler ODE)
RCM_ANGLES = (1.5, 1.4, 1.0)  # rCM's TrigFlow angles after atan(sigma_max), the first steps - 1 of them
RCM_SIGMA_MAX = 80.0  # TurboDiffusion's T2V default (its Wan2.2 I2V: 200)
RCM_MAX_STEPS = 1 + len(RCM_ANGLES)
RENOISE_SEED_OFFSET = 2  # the re-noise generator's seed is the run's seed + 2 (the initial noise takes the seed)


@dataclass(frozen=True)
class Sampler:
    """One sampler of a request.

    Attributes:
        name: "default" or a re-noise sampler's name ("dmd", "dmd-hummingbird").
        sigmas: the re-noise sigma list, each in (0, 1], strictly decreasing (empty for `default`).
        timesteps: the transformer timesteps of each sigma, in [0, NUM_TRAIN_TIMESTEPS], non-increasing, as many
            as `sigmas` (empty for `default`).
        noise: "fresh" (a new draw at each re-noise), "once" (the same draw each time) or "none" (no re-noise: the
            Euler step x + (sigma_next - sigma) v of the flow ODE).
        sigma_max: rCM's initial EDM sigma (None for the other samplers).
        steps, guidance, shift: `default` only: the step count, CFG scale and flow shift its entry sets (None:
            the request's flags, else the preset's).
        custom: the entry set its own lists (`dmd:sigmas=...`).
        source: who runs it so (for `vsagen presets` and the JSON).
    """

    name: str
    sigmas: tuple[float, ...] = ()
    timesteps: tuple[float, ...] = ()
    noise: str = "fresh"
    sigma_max: float | None = None
    steps: int | None = None
    guidance: float | None = None
    shift: float | None = None
    custom: bool = False
    source: str = ""

    @property
    def renoise(self) -> bool:
        """A few-step re-noise sampler (its own sigma list, CFG off)."""
        return bool(self.sigmas)

    @property
    def cfg(self) -> bool:
        """Whether CFG may run (False for re-noise samplers: one DiT pass a step)."""
        return not self.renoise

    @property
    def text(self) -> str:
        """The entry that gives this sampler back (`parse_sampler(s.text) == s`)."""
        if not self.renoise:
            opts = [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in (("steps", self.steps), ("guidance", self.guidance), ("shift", self.shift))
                    if v is not None]
            return ":".join([self.name, *opts])
        named = NAMED[self.name]
        opts = []
        if self.sigma_max is not None:  # rCM: its steps, sigma_max and ODE flag give its lists
            opts += [f"steps={len(self.sigmas)}"] if len(self.sigmas) != len(named.sigmas) else []
            opts += [f"sigma_max={self.sigma_max:g}"] if self.sigma_max != named.sigma_max else []
            opts += ["ode=true"] if self.noise == "none" else []
            return ":".join([self.name, *opts])
        if self.sigmas != named.sigmas or self.timesteps != named.timesteps:
            opts.append(f"sigmas={','.join(str(s) for s in self.sigmas)}")
            if self.timesteps != tuple(s * NUM_TRAIN_TIMESTEPS for s in self.sigmas):
                opts.append(f"timesteps={','.join(f'{t:g}' if t == int(t) else str(t) for t in self.timesteps)}")
        if self.noise != named.noise:
            opts.append(f"noise={self.noise}")
        return ":".join([self.name, *opts])

    def summary(self) -> dict[str, Any]:
        """JSON-ready: name, entry text, kind, sigmas and timesteps (re-noise), noise, source. (Whether CFG ran is
        the run's `cfg`: `default` runs it when the CFG scale is above 1.)"""
        d: dict[str, Any] = {"name": self.name, "entry": self.text,
                             "kind": "renoise" if self.renoise else "scheduler"}
        if self.renoise:
            d.update(steps=len(self.sigmas), sigmas=list(self.sigmas), timesteps=list(self.timesteps),
                     noise=self.noise, initial_noise_scale=self.sigmas[0])
        if self.sigma_max is not None:
            d["sigma_max"] = self.sigma_max
        if self.source:
            d["source"] = self.source
        return d


def bf16(x: float) -> float:
    """`x` rounded to bfloat16 (through float32, round to nearest even), as a float: what a value becomes in a bf16
    tensor (`torch.tensor(x).to(torch.bfloat16)`), without importing torch."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def rcm_times(steps: int, sigma_max: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """rCM's flow times and transformer timesteps for `steps` (1-4) steps from `sigma_max` (TurboDiffusion's
    inference scripts): angles atan(sigma_max), then the first steps - 1 of RCM_ANGLES; t = sin(a) / (cos(a) + sin(a))
    (float64); timestep = bf16(float32(t) x 1000), the value their bf16 transformer input holds.

    Raises:
        ValueError: steps outside [1, RCM_MAX_STEPS], sigma_max <= 0, or with 2 steps or more a sigma_max whose
            angle is not above RCM_ANGLES[0] (the times would rise).
    """
    if not 1 <= steps <= RCM_MAX_STEPS or not sigma_max > 0:
        raise ValueError(f"rCM takes 1 to {RCM_MAX_STEPS} steps and sigma_max > 0, got {steps}, {sigma_max}")
    if steps > 1 and not math.atan(sigma_max) > RCM_ANGLES[0]:
        raise ValueError(f"rCM's times fall only from sigma_max > tan({RCM_ANGLES[0]}), got {sigma_max}")
    angles = (math.atan(sigma_max), *RCM_ANGLES[: steps - 1])
    times = tuple(math.sin(a) / (math.cos(a) + math.sin(a)) for a in angles)
    float32 = (lambda x: struct.unpack("<f", struct.pack("<f", x))[0])
    return times, tuple(bf16(float32(t) * 1000) for t in times)


# LightX2V's 4-step list (see the module docstring): shift 5 at the training timesteps 1000, 750, 500, 250
LIGHTX2V_SIGMAS = (1.0, 15 / 16, 5 / 6, 5 / 8)

NAMED: dict[str, Sampler] = {
    "default": Sampler("default", source="the checkpoint's scheduler config (UniPC multistep, flow shift)"),
    "dmd": Sampler("dmd", sigmas=(1.0, 28 / 37, 12 / 23), timesteps=(1000.0, 757.0, 522.0), noise="fresh",
                   source="FastVideo FastWan DMD (DmdDenoisingStage): timesteps 1000, 757, 522 at shift 8"),
    "dmd-hummingbird": Sampler("dmd-hummingbird", sigmas=(1.0, 30 / 31, 10 / 11), timesteps=(1000.0, 968.0, 908.0),
                               noise="once", source="AMD Hummingbird-XT: timesteps 1000, 750, 500 at shift 10"),
    "rcm": Sampler("rcm", *rcm_times(RCM_MAX_STEPS, RCM_SIGMA_MAX), noise="fresh", sigma_max=RCM_SIGMA_MAX,
                   source="TurboDiffusion rCM: TrigFlow angles atan(sigma_max), 1.5, 1.4, 1.0"),
    "lightx2v-4step": Sampler("lightx2v-4step", sigmas=LIGHTX2V_SIGMAS,
                              timesteps=tuple(s * NUM_TRAIN_TIMESTEPS for s in LIGHTX2V_SIGMAS), noise="none",
                              source="LightX2V 4-step distill: timesteps 1000, 750, 500, 250 at shift 5, Euler steps"),
}
DEFAULT_SAMPLER = "default"


def sampler_names() -> list[str]:
    """The named samplers, `default` first."""
    return list(NAMED)


def check_renoise_lists(sigmas: tuple[float, ...], timesteps: tuple[float, ...], entry: str) -> None:
    """Refuse a re-noise sigma / timestep list that cannot run (`entry` names it in the one line).

    Raises:
        BadInput: 0 or more than MAX_SAMPLER_STEPS sigmas, a sigma outside (0, 1], sigmas that do not decrease, a
            timestep count unlike the sigmas', a timestep outside [0, NUM_TRAIN_TIMESTEPS], increasing timesteps.
    """
    if not 1 <= len(sigmas) <= MAX_SAMPLER_STEPS:
        raise BadInput(f"--sampler {entry!r}: give 1 to {MAX_SAMPLER_STEPS} sigmas, got {len(sigmas)}")
    if any(not 0 < s <= 1 for s in sigmas):
        raise BadInput(f"--sampler {entry!r}: every sigma must be in (0, 1] (1 is pure noise), got "
                       f"{', '.join(f'{s:g}' for s in sigmas)}")
    if any(b >= a for a, b in zip(sigmas, sigmas[1:])):
        raise BadInput(f"--sampler {entry!r}: sigmas must decrease from step to step, got "
                       f"{', '.join(f'{s:g}' for s in sigmas)}")
    if len(timesteps) != len(sigmas):
        raise BadInput(f"--sampler {entry!r}: give one timestep per sigma ({len(sigmas)}), got {len(timesteps)}")
    if any(not 0 <= t <= NUM_TRAIN_TIMESTEPS for t in timesteps):
        raise BadInput(f"--sampler {entry!r}: timesteps must be in [0, {NUM_TRAIN_TIMESTEPS}], got "
                       f"{', '.join(f'{t:g}' for t in timesteps)}")
    if any(b > a for a, b in zip(timesteps, timesteps[1:])):
        raise BadInput(f"--sampler {entry!r}: timesteps must not increase from step to step")


def renoise_scheduler(sampler: Sampler, generator_seed: int) -> Any:
    """diffusers' `FlowMatchEulerDiscreteScheduler(stochastic_sampling=True, shift=1.0)` set to the sampler's lists
    for any `set_timesteps` call, with a CPU generator seeded `generator_seed` handed to every `step` (reseeded before
    each step for `noise="once"`; `noise="none"`: `stochastic_sampling=False`, diffusers' Euler step).

    Args:
        sampler: a re-noise sampler.
        generator_seed: the seed of the re-noise draws.

    Returns:
        The scheduler; its `sigmas` after `set_timesteps` are the sampler's plus a terminal 0 (float32), its
        `timesteps` the sampler's (float32).
    """
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler

    if not sampler.renoise:
        raise ValueError(f"{sampler.name} is not a re-noise sampler")
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=NUM_TRAIN_TIMESTEPS, shift=1.0,
                                                stochastic_sampling=sampler.noise != "none")
    set_timesteps, step = scheduler.set_timesteps, scheduler.step
    generator = torch.Generator("cpu").manual_seed(generator_seed)

    def set_sampler_timesteps(num_inference_steps: int | None = None, device: Any = None, **_: Any) -> None:
        # the pipeline asks for num_inference_steps steps; the sampler's list decides (the caller passes its length).
        # Each pipeline call starts the re-noise draws afresh, so a video does not depend on the calls before it.
        generator.manual_seed(generator_seed)
        set_timesteps(device=device, sigmas=list(sampler.sigmas), timesteps=list(sampler.timesteps))

    def step_with_generator(*args: Any, **kwargs: Any) -> Any:
        if sampler.noise == "once":
            generator.manual_seed(generator_seed)
        kwargs.setdefault("generator", generator)
        return step(*args, **kwargs)

    scheduler.set_timesteps = set_sampler_timesteps  # type: ignore[method-assign]
    scheduler.step = step_with_generator  # type: ignore[method-assign]
    scheduler.vsagen_sampler = (sampler, generator_seed)  # `use_sampler` finds it installed already
    return scheduler


@contextlib.contextmanager
def use_sampler(pipe: Any, sampler: Sampler, seed: int) -> Iterator[None]:
    """Within the block, `pipe` denoises with `sampler`: a re-noise sampler's scheduler (`renoise_scheduler`, its
    draws seeded `seed + RENOISE_SEED_OFFSET` at every pipeline call) replaces the pipeline's for the block;
    `default` leaves the pipeline's own. Re-entrant: inside a block that installed the same sampler and seed, nothing
    changes (install it before `vsagen.apply`, which counts steps at the scheduler it finds). The caller passes
    `num_inference_steps=len(sampler.sigmas)` and `guidance_scale=1` (CFG off)."""
    if not sampler.renoise or getattr(pipe.scheduler, "vsagen_sampler", None) == (sampler,
                                                                                 seed + RENOISE_SEED_OFFSET):
        yield
        return
    own = pipe.scheduler
    pipe.scheduler = renoise_scheduler(sampler, seed + RENOISE_SEED_OFFSET)
    try:
        yield
    finally:
        pipe.scheduler = own


def initial_noise(pipe: Any, frames: int, height: int, width: int, generator: Any) -> Any:
    """The initial latents diffusers' Wan pipelines draw from `generator` for a video of frames x height x width
    (float32, on the CPU generator's stream, then on the pipeline's device): (1, z, F_lat, H_lat, W_lat) standard
    normal, what a re-noise sampler scales by its first sigma."""
    import torch
    from diffusers.utils.torch_utils import randn_tensor

    shape = (1, pipe.vae.config.z_dim, (frames - 1) // pipe.vae_scale_factor_temporal + 1,
             height // pipe.vae_scale_factor_spatial, width // pipe.vae_scale_factor_spatial)
    return randn_tensor(shape, generator=generator, device=pipe._execution_device, dtype=torch.float32)
