"""vsagen.request.resolve: ONE resolution of the option groups against the preset (flag > command default > preset >
built-in), the checks that need the preset (frame stride, pixel multiple, RoPE range per tile fit, a second CFG
scale for one expert, random weights without a preset), the device and offload, the notes; every command's config
holds exactly the fields `resolve` gives it."""

from __future__ import annotations

import dataclasses

import pytest

from vsagen.errors import BadInput
from vsagen.models.sources import resolve_model
from vsagen.models.presets import load_preset
from vsagen.request.options import ModelOptions, PlacementOptions, RequestOptions, SamplingOptions, request_options
from vsagen.request.plans import crop_note
from vsagen.request.resolve import (NONE, ONE, SEVERAL, Request, check_last_frame, negative_prompt_note,
                                    request_fields, resolve)


def test_values_given_win_over_the_preset():
    d = load_preset("tiny").defaults
    src = resolve_model("tiny")
    r = resolve(src, RequestOptions(), prompt="p")
    assert (r.height, r.width, r.frames, r.steps, r.guidance, r.flow_shift, r.warmup) == (
        d.height, d.width, d.frames, d.steps, d.guidance, d.flow_shift, 0)
    assert (r.device, r.dtype, r.tile_fits, r.offload, r.vae_tiling) == ("cpu", "fp32", ("partial",), "none", "auto")
    assert [b.name for b in r.backends] == ["full"] and r.attn_requested == "auto" and "chose full" in r.attn_note
    o = request_options(height=64, width=80, frames=9, steps=3, warmup=2, guidance=1.5, flow_shift=2.0, seed=7,
                        tile_fit="partial,crop", attn="full,vsa", sparsity=0.5, negative_prompt="blurry")
    r = resolve(src, o, prompt="p", backends=SEVERAL, several_fits=True)
    assert (r.height, r.width, r.frames, r.steps, r.warmup, r.guidance, r.flow_shift, r.seed) == (
        64, 80, 9, 3, 2, 1.5, 2.0, 7)
    assert r.tile_fits == ("partial", "crop") and [(b.name, b.sparsity) for b in r.backends] == [("full", None),
                                                                                                ("vsa", 0.5)]
    # the one note: what --tile-fit crop denoises (vsagen.request.plans.crop_note)
    assert r.negative_prompt == "blurry" and r.notes == (crop_note(r.plan("crop"), r.crop_tile),) \
        and r.attn_note is None
    assert resolve(src, o, prompt="p", backends=NONE, several_fits=True).backends == ()


@pytest.mark.parametrize("options,needle", [
    (dict(model=ModelOptions(model="tiny", frames=10)), "--frames must be 4k+1"),
    (dict(model=ModelOptions(model="tiny", height=100)), "--height must be a positive multiple of 16"),
    (dict(model=ModelOptions(model="tiny", width=99999)), "--width too large for tiny"),
    (dict(sampling=SamplingOptions(guidance_2=3.0)), "--guidance-2 is the second expert's CFG scale"),
    (dict(model=ModelOptions(model="tiny", random_weights=True)), "--random-weights builds a preset's architecture"),
    (dict(placement=PlacementOptions(offload="group", device="cpu")), "--offload group moves weights"),
    (dict(placement=PlacementOptions(ulysses=3)), "--ulysses 3 does not divide 2 heads"),
    (dict(placement=PlacementOptions(cfg_parallel=True), sampling=SamplingOptions(guidance=1.0)),
     "--cfg-parallel runs the unconditional pass"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_checks_against_the_preset(vsagen_cache, options, needle):
    src = resolve_model("tiny")
    if options.get("model", ModelOptions()).random_weights:  # a folder of the tiny architecture: no exact preset
        from vsagen.models.tiny import ensure_tiny_checkpoint

        src = resolve_model(str(ensure_tiny_checkpoint(load_preset("tiny"))))
    with pytest.raises(BadInput) as info:
        resolve(src, dataclasses.replace(RequestOptions(), **options), prompt="p")
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("size", [dict(frames=127), dict(frames=123), dict(frames=999999999999999999999),
                                  dict(frames=0), dict(frames=-7), dict(height=510), dict(height=513),
                                  dict(width=10 ** 30), dict(width=20)], ids=str)
def test_every_value_a_size_refusal_suggests_is_accepted(size):
    """A trial's `--frames 127` on tiny said "nearest valid: 125 or 129", and 129 was refused next (tiny takes
    125 at most); `--frames 999999999999999999999` suggested values as absurd. The maximum is checked first, and
    every value a refusal suggests (or its bound) resolves."""
    src = resolve_model("tiny")
    (flag, value), = size.items()
    with pytest.raises(BadInput) as info:
        resolve(src, request_options(**size), prompt="p")
    message = str(info.value)
    assert "\n" not in message and f"got {value}" in message, message
    if "nearest valid: " in message:
        suggested = [int(v) for v in message.split("nearest valid: ")[1].split(" or ")]
    else:
        assert "too large for tiny" in message and ", i.e. " in message, message
        suggested = [int(message.split(" <= ")[1].split(";")[0])]
    assert suggested and all(v <= 512 for v in suggested), message
    for v in suggested:
        assert getattr(resolve(src, request_options(**{flag: v}), prompt="p"), flag) == v


def test_notes_and_the_last_frame():
    src = resolve_model("tiny")
    r = resolve(src, request_options(guidance=1.0, negative_prompt="x"), prompt="p")
    assert r.notes == (negative_prompt_note("x", 1.0),) and negative_prompt_note("x", 5.0) is None
    a14b = resolve(resolve_model("tiny-a14b"), request_options(guidance=1.0, guidance_2=4.0), prompt="p")
    assert a14b.guidance_2 == 4.0 and "--guidance-2 4 has no effect" in a14b.notes[0]
    with pytest.raises(BadInput, match="needs --frames 5 or more"):
        check_last_frame(resolve(src, request_options(frames=1), prompt="p"), "a last frame")
    r = resolve(src, request_options(steps=2, attn="vsa:dense_steps=5"), prompt="p")  # every step dense: said
    assert [n for n in r.notes if "dense_steps" in n] == [
        "--attn vsa: dense_steps=5 covers all 2 steps: every step runs full, as --attn full (nothing runs sparse; "
        "fewer dense steps leave some sparse)"]
    assert not [n for n in resolve(src, request_options(steps=6, attn="vsa:dense_steps=5"), prompt="p").notes
                if "dense_steps" in n]


def test_every_command_holds_the_fields_resolve_gives(tmp_path):
    """One resolution: the same flags give the same shared fields in t2v's, profile's, compare's and search's
    configs (each command's own defaults aside: profile's and compare's warm-up, profile's steps)."""
    from vsagen.commands.compare_config import resolve_compare
    from vsagen.commands.generate_config import resolve_generate
    from vsagen.commands.profile_config import resolve_profile
    from vsagen.commands.search import resolve_search

    flags = dict(model="tiny", height=64, width=96, frames=9, steps=2, warmup=0, guidance=4.0, seed=3, device="cpu")
    shared = resolve(resolve_model("tiny"), request_options(**flags, attn="full"), prompt="p")
    configs = [resolve_generate("p", attn="full", out=tmp_path / "a.mp4", **flags),
               resolve_profile(prompt="p", attn="full", **flags),
               resolve_compare("p", attn="full,vsa", out=tmp_path / "c", plot=False, **flags),
               resolve_search(prompt="p", out=tmp_path / "s.json", **flags)]
    keep = {"backends", "attn_requested", "attn_note", "vae_tiling", "overwrite"}  # what each command decides itself
    want = {k: v for k, v in request_fields(shared).items() if k not in keep}
    for cfg in configs:
        assert isinstance(cfg, Request)
        assert {k: v for k, v in request_fields(cfg).items() if k not in keep} == want, type(cfg).__name__
    assert ONE == "one"


def test_resolve_splits_gpus_and_checks_them_before_loading(vsagen_cache, monkeypatch):
    """tiny: 2 heads, CFG on (guidance 5): --gpus 2 runs CFG parallel, --gpus 4 with Ulysses 2 in each half, --gpus
    2 without CFG Ulysses 2; the request holds the split and says so in a note; bad counts are refused."""
    src = resolve_model("tiny")

    def req(**flags):
        return resolve(src, request_options(device="cpu", **flags), prompt="p")

    r = req(gpus=2)
    assert (r.ulysses, r.cfg_parallel, r.gpus, r.processes) == (1, True, 2, 2)
    assert [n for n in r.notes if n.startswith("--gpus")] == [
        "--gpus 2 on the CPU (--device cpu): 2 processes (gloo) share this machine's cores",
        "--gpus 2: the conditional and unconditional CFG passes run on two halves of the processes (as --cfg-parallel)"]
    assert (req(gpus=4).ulysses, req(gpus=4).cfg_parallel) == (2, True)
    assert (req(gpus=2, guidance=1.0).ulysses, req(gpus=2, guidance=1.0).cfg_parallel) == (2, False)
    assert (req(gpus=2, ulysses=2).ulysses, req(gpus=2, ulysses=2).notes[-1:]) == (2, (
        "--gpus 2 on the CPU (--device cpu): 2 processes (gloo) share this machine's cores",))
    assert req().gpus is None and (req().ulysses, req(gpus=1).processes) == (1, 1)
    for flags, needle in [(dict(gpus=2, ulysses=3), "--ulysses 3 runs in 3 processes, --gpus 2 starts 2"),
                          (dict(gpus=3), "give --gpus 2, 4"),
                          (dict(gpus=2, height=112, width=176, guidance=1.0), "--gpus 2 cannot split this run"),
                          (dict(gpus=2, compile=True), "--gpus 2 with --compile is not supported yet")]:
        with pytest.raises(BadInput, match=needle.replace("(", r"\(").replace(")", r"\)")):
            req(**flags)
    import torch  # one CUDA GPU visible: --gpus 2 asks for two

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(BadInput, match=r"--gpus 2: torch sees 1 GPU here \(one process per GPU\); give --gpus 1 or "
                                       "fewer"):
        resolve(src, request_options(device="cuda", gpus=2), prompt="p")
    with pytest.raises(BadInput, match="--gpus 2 cannot run with --offload model"):
        resolve(src, request_options(device="cuda", gpus=2, offload="model"), prompt="p")
