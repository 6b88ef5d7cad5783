"""vsagen.samplers: the named re-noise samplers against their authors' formulas (float64, CPU), the DMD loop on the
tiny model against an independent float64 re-enactment of the update, and the scheduler seam."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vsagen.layout import plan_crop
from vsagen.pipeline import denoise_latents
from vsagen.models.presets import load_preset
from vsagen.samplers import NAMED, RENOISE_SEED_OFFSET, Sampler, renoise_scheduler, use_sampler


def _flow_table(shift: float, unshifted: np.ndarray) -> np.ndarray:
    """Flow-matching sigmas after the timestep shift sigma' = shift s / (1 + (shift - 1) s) (float64)."""
    return shift * unshifted / (1 + (shift - 1) * unshifted)


def test_dmd_is_fastvideos_list_looked_up_in_its_shift_8_table():
    """FastVideo's DMD stage feeds the transformer timesteps 1000, 757, 522 and takes each one's sigma from a
    FlowMatchEulerDiscreteScheduler(shift=8) table of 1000 training timesteps (nearest entry)."""
    n = 1000
    sigmas = _flow_table(8.0, np.linspace(1, n, n)[::-1] / n)
    table_t = sigmas * n
    want = [float(sigmas[np.argmin(np.abs(table_t - t))]) for t in (1000, 757, 522)]
    dmd = NAMED["dmd"]
    assert dmd.timesteps == (1000.0, 757.0, 522.0)
    assert np.allclose(dmd.sigmas, want, rtol=0, atol=1e-12)
    assert [round(s, 6) for s in dmd.sigmas] == [1.0, 0.756757, 0.521739]  # the published list
    assert (dmd.noise, dmd.cfg, dmd.renoise) == ("fresh", False, True)


def test_dmd_hummingbird_is_amds_warped_list_with_its_bf16_int64_timesteps():
    """Hummingbird-XT: timesteps 1000, 750, 500 index a shift-10 table of 1000 sigmas from 1 down to 0 (sigma_min
    0, one extra step); the transformer gets those table timesteps through a bf16 tensor cast to int64; one noise
    draw serves both re-noises."""
    sigmas = _flow_table(10.0, np.linspace(1.0, 0.0, 1001)[:-1])
    table_t = np.concatenate([sigmas * 1000, [0.0]])
    picked = [1000 - t for t in (1000, 750, 500)]
    want_sigmas = [float(sigmas[i]) for i in picked]
    want_t = [float(torch.tensor(table_t[i], dtype=torch.bfloat16).to(torch.int64)) for i in picked]
    hb = NAMED["dmd-hummingbird"]
    assert np.allclose(hb.sigmas, want_sigmas, rtol=0, atol=1e-12)
    assert [round(s, 6) for s in hb.sigmas] == [1.0, 0.967742, 0.909091]
    assert hb.timesteps == tuple(want_t) == (1000.0, 968.0, 908.0)
    assert hb.noise == "once"


def test_lightx2v_4step_is_their_shift_5_table_at_1000_750_500_250():
    """LightX2V's WanStepDistillScheduler (step_distill/scheduler.py:25-33 @f8aee98): sigmas linspace(1, 0, 1001)[:-1]
    shifted by sample_shift 5, indexed at 1000 - t for denoising_step_list [1000, 750, 500, 250]; timesteps sigma x
    1000. Float64 from their formula; and their float32 torch table is exactly what the installed scheduler holds."""
    picked = [1000 - t for t in (1000, 750, 500, 250)]
    want = _flow_table(5.0, np.linspace(1.0, 0.0, 1001)[:-1])[picked]
    lx = NAMED["lightx2v-4step"]
    assert np.allclose(lx.sigmas, want, rtol=0, atol=1e-15)
    assert np.allclose(lx.timesteps, want * 1000, rtol=0, atol=1e-12)
    assert [round(s, 6) for s in lx.sigmas] == [1.0, 0.9375, 0.833333, 0.625]
    assert (lx.noise, lx.cfg, lx.renoise, lx.sigma_max) == ("none", False, True, None)
    table = torch.linspace(1.0, 0.0, 1001)[:-1]  # their lines 26-29, float32
    table = 5.0 * table / (1 + 4.0 * table)
    s = renoise_scheduler(lx, 0)
    s.set_timesteps(4, device="cpu")
    assert torch.equal(s.sigmas[:4], table[picked]) and torch.equal(s.timesteps, (table * 1000)[picked])
    assert not s.config.stochastic_sampling  # their step_post: x - sigma v + sigma_next v, no fresh noise


def test_the_scheduler_takes_the_list_as_given_and_appends_a_terminal_zero():
    s = renoise_scheduler(NAMED["dmd"], 7)
    s.set_timesteps(50, device="cpu")  # the pipeline's step count does not decide
    assert s.timesteps.tolist() == [1000.0, 757.0, 522.0]
    assert np.allclose(s.sigmas.double().numpy(), [*NAMED["dmd"].sigmas, 0.0], atol=1e-7)
    assert s.config.shift == 1.0 and s.config.stochastic_sampling
    with pytest.raises(ValueError, match="not a re-noise sampler"):
        renoise_scheduler(NAMED["default"], 0)


def _tiny_plan():
    p = load_preset("tiny")
    return plan_crop(9, 64, 96, fit="partial", vae_stride_temporal=p.vae_stride_temporal,
                     vae_stride_spatial=p.vae_stride_spatial, patch_size=p.patch_size)


def _run(pipe, sampler: Sampler, seed: int, guidance: float = 5.0):
    """Denoise on the tiny pipeline, recording each transformer forward's input latents, timestep and output."""
    seen = []

    def record(module, args, kwargs, out):
        seen.append((kwargs["hidden_states"].detach().double().clone(), kwargs["timestep"].detach().clone(),
                     out[0].detach().double().clone()))

    g = torch.Generator("cpu").manual_seed(seed + 100)
    pos = torch.randn(1, 16, pipe.transformer.config.text_dim, generator=g)
    handle = pipe.transformer.register_forward_hook(record, with_kwargs=True)
    try:
        with torch.no_grad():
            latents = denoise_latents(pipe, _tiny_plan(), pos, None, steps=20, guidance=guidance, seed=seed,
                                      sampler=sampler)
    finally:
        handle.remove()
    return latents.double(), seen


@pytest.mark.parametrize("entry", ["dmd", "dmd-hummingbird", "rcm", "rcm:steps=2:sigma_max=200",
                                   "rcm:sigma_max=200:ode=true", "lightx2v-4step"])
def test_the_loop_on_the_tiny_model_equals_a_float64_reenactment_of_the_update(tiny_pipe, entry):
    """x starts as sigma_0 eps; x0 = x - sigma_i v; x_next = (1 - sigma_next) x0 + sigma_next eps (fresh or the same
    eps per the sampler; rCM's ODE, as the TurboWan2.2 I2V presets run it: TurboDiffusion's --ode update
    x_next = x - (t_cur - t_next) v, turbodiffusion/inference/wan2.2_i2v_infer.py:202-203); the last step returns x0;
    one DiT forward a step at the sampler's timesteps, whatever --steps and CFG were asked."""
    from vsagen.request.sampling import parse_sampler

    sampler, seed = parse_sampler(entry), 3
    latents, seen = _run(tiny_pipe, sampler, seed)
    assert len(seen) == len(sampler.sigmas)  # CFG off: one forward a step (guidance 5 was passed)
    # the timesteps as the scheduler's float32 tensor holds them (LightX2V's 833.333 too, as their float32 table)
    held = torch.tensor(sampler.timesteps, dtype=torch.float32).tolist()
    assert [float(t.flatten()[0]) for _, t, _ in seen] == held
    shape = seen[0][0].shape
    eps0 = torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed)).double()  # diffusers' initial noise
    x = sampler.sigmas[0] * eps0
    assert torch.allclose(seen[0][0], x, rtol=1e-6, atol=1e-7)
    noise = torch.Generator("cpu").manual_seed(seed + RENOISE_SEED_OFFSET)
    sig = [*sampler.sigmas, 0.0]
    for i, (x_in, _, v) in enumerate(seen):
        assert torch.allclose(x_in, x, rtol=1e-6, atol=1e-6), i
        if sampler.noise == "none":
            x = x_in - (sig[i] - sig[i + 1]) * v  # their t_cur, t_next
            continue
        x0 = x_in - sig[i] * v
        if sampler.noise == "once":
            noise.manual_seed(seed + RENOISE_SEED_OFFSET)
        eps = torch.randn(shape, generator=noise).double()  # drawn at every step, the last one's unused
        x = (1 - sig[i + 1]) * x0 + sig[i + 1] * eps
    assert torch.allclose(latents, x, rtol=1e-6, atol=1e-6)  # the last step's x0
    assert latents.std() > 0.1  # not a degenerate comparison


@pytest.mark.parametrize("entry,high", [("rcm", 2), ("rcm:sigma_max=200", 2), ("rcm:steps=2", 2), ("rcm:steps=1", 1),
                                        ("dmd", 1), ("lightx2v-4step", 2)])
def test_two_experts_switch_where_turbodiffusion_switches(a14b_dir, entry, high):
    """Wan2.2 A14B under a few-step list: the high-noise expert denoises the steps with t >= 0.9 (TurboDiffusion's
    I2V switches to the low-noise one at t < 0.9; diffusers compares timestep >= boundary_ratio * 1000), the
    low-noise one the rest, one forward a step. LightX2V switches by step index 2 (boundary_step_index,
    wan_distill_runner.py:61 @f8aee98): its first two steps (t 1000, 937.5) are the ones at t >= 0.9."""
    from diffusers import WanPipeline

    from vsagen.request.sampling import parse_sampler

    pipe = WanPipeline.from_pretrained(a14b_dir, use_safetensors=True)
    sampler, ran = parse_sampler(entry), []
    hooks = [getattr(pipe, name).register_forward_hook(lambda *_, n=name: ran.append(n))
             for name in ("transformer", "transformer_2")]
    g = torch.Generator("cpu").manual_seed(1)
    pos = torch.randn(1, 16, pipe.transformer.config.text_dim, generator=g)
    try:
        with torch.no_grad():
            denoise_latents(pipe, _tiny_plan(), pos, None, steps=20, guidance=5.0, seed=0, sampler=sampler)
    finally:
        for h in hooks:
            h.remove()
    want = ["transformer" if t >= 0.9 else "transformer_2" for t in sampler.sigmas]
    assert ran == want and ran.count("transformer") == high


@pytest.mark.parametrize("sigma_max,first", [(80.0, 0.987654), (200.0, 0.995025)])
@pytest.mark.parametrize("steps", [1, 2, 3, 4])
def test_rcm_times_are_turbodiffusions_lists(steps, sigma_max, first):
    """TurboDiffusion's inference: TrigFlow angles [atan(sigma_max), 1.5, 1.4, 1.0][:steps] mapped to the flow time
    t = sin(a) / (cos(a) + sin(a)) = tan(a) / (1 + tan(a)); the published lists (0.987654 / 0.995025, 0.933781,
    0.852895, 0.608979); the transformer's timestep is t x 1000 in a bf16 tensor."""
    from vsagen.request.sampling import parse_sampler

    s = parse_sampler(f"rcm:steps={steps}:sigma_max={sigma_max:g}")
    angles = [np.arctan(sigma_max), 1.5, 1.4, 1.0][:steps]
    want = [np.tan(a) / (1 + np.tan(a)) for a in angles]
    assert np.allclose(s.sigmas, want, rtol=0, atol=1e-12)
    assert [round(t, 6) for t in s.sigmas] == [first, 0.933781, 0.852895, 0.608979][:steps]
    bf16 = (torch.tensor(s.sigmas, dtype=torch.float32).double() * 1000).to(torch.bfloat16).tolist()
    assert list(s.timesteps) == bf16
    assert s.noise == "fresh" and s.sigma_max == sigma_max and not s.cfg


def test_bf16_rounds_as_torch_does():
    from vsagen.samplers import bf16

    values = torch.cat([torch.rand(2000, dtype=torch.float64) * 1000, torch.tensor([967.7419, 909.0909, 1000.0])])
    assert [bf16(float(v)) for v in values.float().double()] == values.float().to(torch.bfloat16).tolist()


def test_the_seed_reproduces_the_video_and_the_pipeline_gets_its_own_scheduler_back(tiny_pipe):
    own = tiny_pipe.scheduler
    a, _ = _run(tiny_pipe, NAMED["dmd"], 5)
    b, _ = _run(tiny_pipe, NAMED["dmd"], 5)
    c, _ = _run(tiny_pipe, NAMED["dmd"], 6)
    assert torch.equal(a, b) and not torch.allclose(a, c)
    assert tiny_pipe.scheduler is own


def test_use_sampler_is_reentrant_and_default_leaves_the_pipelines_scheduler(tiny_pipe):
    own = tiny_pipe.scheduler
    with use_sampler(tiny_pipe, NAMED["default"], 0):
        assert tiny_pipe.scheduler is own
    with use_sampler(tiny_pipe, NAMED["dmd"], 0):
        installed = tiny_pipe.scheduler
        assert installed is not own
        with use_sampler(tiny_pipe, NAMED["dmd"], 0):
            assert tiny_pipe.scheduler is installed  # what `vsagen.apply` counts steps on stays in place
        with use_sampler(tiny_pipe, NAMED["dmd"], 1):
            assert tiny_pipe.scheduler is not installed
        assert tiny_pipe.scheduler is installed
    assert tiny_pipe.scheduler is own


def test_summary_and_entry_text_say_what_ran():
    d = NAMED["dmd"].summary()
    assert d["steps"] == 3 and d["timesteps"] == [1000.0, 757.0, 522.0] and d["initial_noise_scale"] == 1.0
    assert d["entry"] == "dmd" and d["kind"] == "renoise" and "FastVideo" in d["source"]
    # whether CFG ran is the run's (`cfg` beside it): the sampler's record never claims it (a new-user trial found
    # `sampler.cfg: true` next to `cfg: false` for --guidance 1)
    assert "cfg" not in d and "cfg" not in NAMED["default"].summary() and "sigmas" not in NAMED["default"].summary()
