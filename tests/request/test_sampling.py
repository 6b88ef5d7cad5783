"""vsagen.request.sampling: `--sampler` entries, the steps / CFG / shift a sampler leaves a run, and the request
resolving them by precedence (flag > preset > default) with one line for every contradiction."""

from __future__ import annotations

import pytest

from vsagen.errors import BadInput
from vsagen.models.sources import resolve_model
from vsagen.request.options import request_options
from vsagen.request.resolve import resolve
from vsagen.request.sampling import (SamplerList, parse_sampler, parse_sampler_list, plan_sampler,
                                     split_sampler_list)
from vsagen.samplers import NAMED, rcm_times


@pytest.mark.parametrize("entry", ["default", "dmd", "dmd-hummingbird", "dmd:noise=once", "dmd:sigmas=1.0,0.75,0.5",
                                   "dmd:sigmas=1.0,0.8:timesteps=1000,800.5:noise=once",
                                   "default:steps=50:guidance=5:shift=8", "rcm", "rcm:steps=2:sigma_max=200",
                                   "rcm:ode=true", "dmd:noise=none"])
def test_entries_round_trip_through_their_text(entry):
    s = parse_sampler(entry)
    assert parse_sampler(s.text) == s


def test_a_custom_list_keeps_the_update_and_derives_timesteps_as_diffusers_does():
    s = parse_sampler("dmd:sigmas=1, 0.6 ,0.25")
    assert s.sigmas == (1.0, 0.6, 0.25) and s.timesteps == (1000.0, 600.0, 250.0) and s.custom
    assert "custom" in s.source and s.noise == "fresh"
    assert parse_sampler("dmd:sigmas=1/0.5").sigmas == (1.0, 0.5)  # "/" separates too


@pytest.mark.parametrize("entry,message", [
    ("nope", "unknown --sampler 'nope'; available: default, dmd, dmd-hummingbird"),
    ("dmd:sigmas=1,1", "sigmas must decrease"),
    ("dmd:sigmas=1.5,0.5", "every sigma must be in (0, 1]"),
    ("dmd:sigmas=0.5,0", "every sigma must be in (0, 1]"),
    ("dmd:sigmas=nan", "finite"),
    ("dmd:sigmas=1,a", "sigmas: 'a' is not a number"),
    ("dmd:sigmas=", "options are written NAME:KEY=VALUE"),
    ("dmd:steps=3", "dmd takes no option 'steps'; its options: sigmas, timesteps, noise"),
    ("dmd:sigmas=1,0.5:timesteps=1000", "give one timestep per sigma (2), got 1"),
    ("dmd:sigmas=1,0.5:timesteps=500,1000", "timesteps must not increase"),
    ("dmd:sigmas=1,0.5:timesteps=1001,0", "timesteps must be in [0, 1000]"),
    ("dmd:timesteps=1000,500", "timesteps need their sigmas"),
    ("dmd:noise=x", "noise must be one of fresh, once"),
    ("dmd:noise=once:noise=fresh", "noise is given twice"),
    (f"dmd:sigmas={','.join(['0.5'] * 51)}", "give 1 to 50 sigmas"),
    ("default:steps=0", "steps must be in [1, 10000]"),
    ("default:steps=2.5", "steps must be an integer"),
    ("default:shift=0", "shift must be in (0"),
    ("default:sigmas=1", "default takes no option 'sigmas'"),
    ("dmd:", "nothing after the colon"),
    ("rcm:steps=5", "rCM runs 1 to 4 steps, got 5"),
    ("rcm:steps=two", "steps must be an integer"),
    ("rcm:sigma_max=0", "sigma_max must be in (0"),
    ("rcm:sigma_max=inf", "sigma_max must be in (0"),
    ("rcm:sigma_max=0.5", "with 4 steps sigma_max must be above tan(1.5) = 14.1 (rCM's next angle is 1.5: a lower "
                          "start would put noise back), got 0.5"),  # a new-user trial: the times rose, exit 0
    ("rcm:steps=2:sigma_max=14.1", "with 2 steps sigma_max must be above tan(1.5)"),
    ("rcm:ode=maybe", "ode must be true or false"),
    ("rcm:sigmas=1,0.5", "rcm takes no option 'sigmas'; its options: steps, sigma_max, ode")])
def test_bad_entries_are_one_line(entry, message):
    with pytest.raises(BadInput) as e:
        parse_sampler(entry)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_rcm_times_fall_at_every_accepted_sigma_max():
    """One step may start anywhere; from 2 steps on the first angle atan(sigma_max) must exceed the next (1.5)."""
    assert parse_sampler("rcm:steps=1:sigma_max=0.5").sigmas == pytest.approx((0.5 / 1.5,))
    for text in ("rcm", "rcm:sigma_max=200", "rcm:steps=2:sigma_max=14.2", "rcm:steps=3:sigma_max=15"):
        sigmas = parse_sampler(text).sigmas
        assert all(a > b for a, b in zip(sigmas, sigmas[1:])), text
    with pytest.raises(ValueError, match="times fall only from sigma_max > tan"):
        rcm_times(2, 14.0)


def test_a_list_splits_on_commas_but_keeps_a_sigma_list_whole():
    assert split_sampler_list("dmd:sigmas=1.0,0.8,0.5,default:steps=50") == ("dmd:sigmas=1.0,0.8,0.5",
                                                                             "default:steps=50")
    # the documented form with options after a list (a new-user trial: "unknown --sampler '0.5'")
    assert split_sampler_list("dmd:sigmas=1.0,0.5:timesteps=1000,500") == ("dmd:sigmas=1.0,0.5:timesteps=1000,500",)
    assert split_sampler_list("dmd:sigmas=1.0,0.5:noise=once,default") == ("dmd:sigmas=1.0,0.5:noise=once", "default")
    assert split_sampler_list("dmd") == ("dmd",)
    # a word in a sigma list is a bad sigma, not a sampler (new-user trial: "unknown --sampler 'abc'")
    assert split_sampler_list("dmd:sigmas=1.0,abc") == ("dmd:sigmas=1.0,abc",)
    assert split_sampler_list("dmd:sigmas=1.0,0.x,rcm") == ("dmd:sigmas=1.0,0.x", "rcm")
    with pytest.raises(BadInput, match=r"^--sampler 'dmd:sigmas=1.0,abc': sigmas: 'abc' is not a number"):
        parse_sampler_list("dmd:sigmas=1.0,abc")
    with pytest.raises(BadInput, match=r"timesteps: '5x' is not a number"):
        parse_sampler_list("dmd:sigmas=1.0,0.5:timesteps=1000,5x,default")
    for bad in ("", "dmd,,default", "0.5,dmd"):
        with pytest.raises(BadInput):
            split_sampler_list(bad)


def test_a_list_is_held_parsed_with_its_text_and_entries():
    """What `--sampler` is held as once its group is built: the text, each entry as written and its sampler."""
    held = parse_sampler_list("dmd:sigmas=1.0,0.5, default:steps=50")
    assert held == SamplerList("dmd:sigmas=1.0,0.5, default:steps=50", ("dmd:sigmas=1.0,0.5", "default:steps=50"),
                               (parse_sampler("dmd:sigmas=1.0,0.5"), parse_sampler("default:steps=50")))
    with pytest.raises(BadInput, match="unknown --sampler 'nope'"):
        parse_sampler_list("default,nope")


DEFAULTS = dict(default_steps=50, default_guidance=5.0, default_shift=3.0, preset="p")


def test_a_renoise_sampler_fixes_steps_and_turns_cfg_off():
    plan = plan_sampler(NAMED["dmd"], steps=None, guidance=None, flow_shift=None, **DEFAULTS)
    assert (plan.steps, plan.guidance) == (3, 1.0)
    assert plan_sampler(NAMED["dmd"], steps=3, guidance=1.0, flow_shift=None, **DEFAULTS).steps == 3  # agrees: fine


@pytest.mark.parametrize("flags,message", [
    (dict(steps=50), "--steps 50: the dmd sampler runs 3 steps (sigma 1, 0.756757, 0.521739); leave --steps out, "
                     "or run the checkpoint's scheduler with --sampler default --steps 50"),
    (dict(guidance=5.0), "--guidance 5 turns CFG on, and the dmd sampler runs without CFG"),
    (dict(flow_shift=8.0), "--flow-shift does not apply to the dmd sampler")])
def test_a_renoise_sampler_refuses_flags_that_would_not_do_what_they_say(flags, message):
    given = {**dict(steps=None, guidance=None, flow_shift=None), **flags}
    with pytest.raises(BadInput) as e:
        plan_sampler(NAMED["dmd"], **given, **DEFAULTS)
    assert message in str(e.value)


@pytest.mark.parametrize("entry,steps,hint", [("rcm", 2, "use --sampler rcm:steps=2, or run"),
                                               ("rcm:sigma_max=200", 1, "use --sampler rcm:steps=1:sigma_max=200, or"),
                                               ("rcm", 8, "leave --steps out, or run")])
def test_rcm_steps_point_to_rcms_own_option(entry, steps, hint):
    """New-user trial: `--sampler rcm --steps 2` pointed away from `rcm:steps=2`, which runs 2 rCM steps."""
    with pytest.raises(BadInput) as e:
        plan_sampler(parse_sampler(entry), steps=steps, guidance=None, flow_shift=None, **DEFAULTS)
    assert hint in str(e.value)


def test_default_takes_its_entry_or_the_flags_but_not_both():
    entry = parse_sampler("default:steps=40:guidance=4:shift=8")
    plan = plan_sampler(entry, steps=None, guidance=None, flow_shift=None, **DEFAULTS)
    assert (plan.steps, plan.guidance, plan.flow_shift) == (40, 4.0, 8.0)
    plan = plan_sampler(NAMED["default"], steps=7, guidance=None, flow_shift=None, **DEFAULTS)
    assert (plan.steps, plan.guidance, plan.flow_shift) == (7, 5.0, 3.0)
    with pytest.raises(BadInput, match="--steps and --sampler default:steps=40:guidance=4:shift=8 both set the "
                                       "steps; say it once"):
        plan_sampler(entry, steps=7, guidance=None, flow_shift=None, **DEFAULTS)


def _resolve(model: str, **flags):
    return resolve(resolve_model(model), request_options(model=model, device="cpu", **flags), prompt="a fox")


def test_a_published_presets_sampler_is_the_default_and_a_flag_overrides_it():
    req = _resolve("fastwan2.1-t2v-1.3b", random_weights=True, attn="full")
    assert req.sampler == NAMED["dmd"] and (req.steps, req.guidance) == (3, 1.0)
    req = _resolve("fastwan2.1-t2v-1.3b", random_weights=True, attn="full", sampler="default")
    assert req.sampler.name == "default" and (req.steps, req.guidance, req.flow_shift) == (50, 5.0, 8.0)
    req = _resolve("hummingbird-xt", random_weights=True, attn="full")
    assert req.sampler == NAMED["dmd-hummingbird"] and req.steps == 3
    req = _resolve("tiny", sampler="dmd:sigmas=1,0.5")
    assert req.steps == 2 and req.guidance == 1.0 and req.samplers[0].sampler.sigmas == (1.0, 0.5)


def test_a_comma_sigma_list_with_options_resolves_for_one_run():
    req = _resolve("tiny", sampler="dmd:sigmas=1.0,0.5:timesteps=1000,500:noise=once")
    assert req.sampler.sigmas == (1.0, 0.5) and req.sampler.timesteps == (1000.0, 500.0) and req.sampler.noise == "once"


def test_two_experts_run_without_cfg_under_a_few_step_sampler():
    """The second expert's CFG scale is 1 too (the JSON said guidance_2 3.0 beside cfg false)."""
    req = _resolve("tiny-a14b", sampler="dmd")
    assert (req.guidance, req.guidance_2) == (1.0, 1.0)


def test_a_wandmdpipeline_folder_no_preset_describes_gets_a_sampler_hint(tiny_dir, tmp_path):
    import json
    import shutil

    folder = tmp_path / "distilled"
    shutil.copytree(tiny_dir, folder)
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "_class_name": "WanDMDPipeline"}))
    hint = "if it is distilled, add --sampler dmd"
    assert any(hint in n for n in _resolve(str(folder)).notes)
    assert not any(hint in n for n in _resolve(str(folder), sampler="default").notes)
    assert not any(hint in n for n in _resolve(str(tiny_dir)).notes)


def test_the_request_refuses_contradictions_in_one_line():
    with pytest.raises(BadInput, match="--steps 50: the dmd sampler runs 3 steps"):
        _resolve("fastwan2.1-t2v-1.3b", random_weights=True, attn="full", steps=50)
    with pytest.raises(BadInput, match="this command runs one sampler"):
        _resolve("tiny", sampler="dmd,default")
    with pytest.raises(BadInput, match="--guidance-2 4 turns CFG on, and the dmd sampler runs without CFG"):
        _resolve("tiny-a14b", sampler="dmd", guidance_2=4.0)
    with pytest.raises(BadInput, match="unknown --sampler"):
        request_options(sampler="dmdx")  # the option group checks it as it is built


def test_a_negative_prompt_note_names_the_sampler_that_runs_without_cfg():
    req = _resolve("tiny", sampler="dmd", negative_prompt="blurry")
    assert any("the dmd sampler runs without CFG" in n for n in req.notes)
