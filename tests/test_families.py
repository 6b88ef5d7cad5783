"""The tiny Wan2.2 families: `tiny-ti2v` (TI2V-5B style: 48-channel VAE, 16x spatial, per-token timesteps) and
`tiny-a14b` (A14B style: two experts split at a boundary timestep). Presets, checkpoints, CLI runs, VSA on both,
per-expert timing, size checks. All on CPU in the session's private VSAGEN_CACHE.
"""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from vsagen.cli.app import app
from vsagen.commands.generate_config import resolve_generate as resolve
from vsagen.errors import BadInput
from vsagen.models.presets import _preset_dir, load_preset, parse_preset
from vsagen.media.video import read_mp4

runner = CliRunner()
# Steps of the short runs: with flow shift 3.0 and boundary 0.875, 2 steps are t = 999 (first expert) and
# t = 750 (second expert); CFG on: 2 forwards a step.
STEPS = 2


def raw(name: str) -> dict:
    """A bundled preset's parsed TOML (a fresh copy to modify)."""
    import tomllib

    return tomllib.loads((_preset_dir() / f"{name}.toml").read_text())


def t2v(*args: str):
    return runner.invoke(app, ["t2v", *args])


# --------------------------------------------------------------------------------------------------------------
# Presets


def test_ti2v_preset_is_the_5b_family():
    p = load_preset("tiny-ti2v")
    assert p.source == "tiny" and p.expand_timesteps and p.experts == 1 and p.boundary_ratio is None
    assert p.vae["z_dim"] == 48 and p.vae["is_residual"] and p.vae["scale_factor_spatial"] == 16
    assert p.transformer["in_channels"] == p.transformer["out_channels"] == 48
    assert (p.vae_stride_temporal, p.vae_stride_spatial, p.pixel_multiple) == (4, 16, 32)
    d = p.defaults
    grid = ((d.frames - 1) // 4 + 1, d.height // 32, d.width // 32)
    assert grid == (5, 5, 7) and all(g % 4 for g in grid)  # partial tiles on every axis


def test_a14b_preset_has_two_experts_of_one_architecture():
    p = load_preset("tiny-a14b")
    assert p.experts == 2 and p.transformer_2 == p.transformer and 0 < p.boundary_ratio < 1
    assert p.defaults.guidance_2 is not None and not p.expand_timesteps


@pytest.mark.parametrize("edit,match", [
    (lambda d: d.pop("boundary_ratio"), "boundary_ratio"),
    (lambda d: d.pop("transformer_2"), "transformer_2"),
    (lambda d: d.update(boundary_ratio=1.5), "boundary_ratio"),
    (lambda d: d.update(boundary_ratio="high"), "boundary_ratio"),
    (lambda d: d.update(transformer_2="yes"), "transformer_2"),
    (lambda d: d.update(expand_timesteps="yes"), "expand_timesteps"),
    (lambda d: d["defaults"].update(guidance_2="x"), "guidance_2"),
], ids=["transformer_2-without-boundary", "boundary-without-transformer_2", "boundary-range", "boundary-type",
        "transformer_2-type", "expand-type", "guidance_2-type"])
def test_family_keys_are_checked(edit, match):
    data = copy.deepcopy(raw("tiny-a14b"))
    edit(data)
    with pytest.raises(BadInput, match=match):
        parse_preset(data, "x.toml")


def test_guidance_2_needs_a_second_expert():
    data = copy.deepcopy(raw("tiny"))
    data["defaults"]["guidance_2"] = 3.0
    with pytest.raises(BadInput, match="guidance_2.*transformer_2"):
        parse_preset(data, "x.toml")


def test_transformer_2_table_gives_its_own_architecture():
    data = copy.deepcopy(raw("tiny-a14b"))
    data["transformer_2"] = {**data["transformer"], "num_layers": 1}
    p = parse_preset(data, "x.toml")
    assert p.transformer_2["num_layers"] == 1 and p.transformer["num_layers"] == 2
    data["transformer_2"] = False
    data.pop("boundary_ratio")
    data["defaults"].pop("guidance_2")
    assert parse_preset(data, "x.toml").experts == 1


# --------------------------------------------------------------------------------------------------------------
# Checkpoints: built deterministically, saved in the diffusers layout, loaded back


def test_checkpoints_load_back_with_their_family(ti2v_dir, a14b_dir):
    from diffusers import WanPipeline

    ti2v = WanPipeline.from_pretrained(ti2v_dir, use_safetensors=True)
    assert ti2v.config.expand_timesteps and ti2v.config.boundary_ratio is None and ti2v.transformer_2 is None
    assert ti2v.vae_scale_factor_spatial == 16 and ti2v.vae.config.z_dim == 48
    a14b = WanPipeline.from_pretrained(a14b_dir, use_safetensors=True)
    assert a14b.config.boundary_ratio == load_preset("tiny-a14b").boundary_ratio
    assert a14b.transformer_2 is not None and not a14b.config.expand_timesteps
    assert list((a14b_dir / "transformer_2").glob("*.safetensors"))
    # two experts: same architecture, different (seeded) weights
    w1, w2 = a14b.transformer.proj_out.weight, a14b.transformer_2.proj_out.weight
    assert w1.shape == w2.shape and not torch.equal(w1, w2)


def test_local_directory_of_a_family_gets_its_preset_and_checks_transformer_2(a14b_dir, ti2v_dir, tmp_path):
    from vsagen.pipeline import load_model

    ckpt = tmp_path / "a14b"
    shutil.copytree(a14b_dir, ckpt)
    cfg = resolve("a prompt", model=str(ckpt), out=tmp_path / "d.mp4")
    assert cfg.source.kind == "dir" and cfg.source.preset.name == "tiny-a14b"
    assert cfg.guidance_2 == load_preset("tiny-a14b").defaults.guidance_2
    assert resolve("a prompt", model=str(ti2v_dir), out=tmp_path / "t.mp4").source.preset.name == "tiny-ti2v"
    model = load_model(cfg, log=lambda m: None)
    assert model.pipe.transformer_2 is not None
    # pickle-only weights of the second expert are refused like the first's
    from safetensors.torch import load_file

    tdir = ckpt / "transformer_2"
    st = tdir / "diffusion_pytorch_model.safetensors"
    torch.save(load_file(st), tdir / "diffusion_pytorch_model.bin")
    st.unlink()
    with pytest.raises(BadInput, match="transformer_2.*--allow-pickle"):
        load_model(cfg, log=lambda m: None)


@pytest.mark.parametrize("name", ["tiny-ti2v", "tiny-a14b"])
def test_random_weights_build_the_family(vsagen_cache, tmp_path, name):
    from vsagen.pipeline import load_model

    p = load_preset(name)
    cfg = resolve("x", model=name, random_weights=True, out=tmp_path / "r.mp4")
    pipe = load_model(cfg, log=lambda m: None).pipe
    assert (pipe.transformer_2 is not None) == (p.experts == 2)
    assert pipe.config.boundary_ratio == p.boundary_ratio
    assert bool(pipe.config.expand_timesteps) == p.expand_timesteps
    assert pipe.vae_scale_factor_spatial == p.vae_stride_spatial


# --------------------------------------------------------------------------------------------------------------
# CLI runs


@pytest.mark.slow
@pytest.mark.parametrize("name,extra,shape", [
    ("tiny-ti2v", [], (17, 160, 224)),
    ("tiny-a14b", [], (17, 96, 160)),
    ("tiny-ti2v", ["--frames", "9", "--height", "96", "--width", "128"], (9, 96, 128)),
], ids=["ti2v-defaults", "a14b-defaults", "ti2v-sized"])
def test_family_cli_run_writes_the_requested_video(ti2v_dir, a14b_dir, tmp_path, name, extra, shape):
    out = tmp_path / "v.mp4"
    res = t2v("a fox", "--model", name, "--steps", str(STEPS), "--out", str(out), "--json", *extra)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert read_mp4(out).shape == (*shape, 3)
    assert (data["frames"], data["height"], data["width"]) == shape
    timing = data["timing"]
    assert timing["dit_forwards"] == 2 * STEPS and len(timing["dit_per_step_s"]) == STEPS
    p = load_preset(name)
    assert data["expand_timesteps"] == p.expand_timesteps and data["boundary_ratio"] == p.boundary_ratio
    assert data["experts"] == (["transformer", "transformer_2"] if p.experts == 2 else ["transformer"])
    assert data["guidance_2"] == p.defaults.guidance_2
    assert sorted(x.name for x in tmp_path.iterdir()) == ["v.json", "v.mp4"]


@pytest.mark.slow
def test_two_expert_timing_shows_both_experts(a14b_dir, tmp_path):
    out = tmp_path / "e.mp4"
    res = t2v("a fox", "--model", "tiny-a14b", "--steps", str(STEPS), "--guidance-2", "2.5", "--out", str(out))
    assert res.exit_code == 0, res.output
    # the table has one line per expert
    assert "expert transformer " in res.stdout and "expert transformer_2 " in res.stdout
    data = json.loads((tmp_path / "e.json").read_text())
    timing = data["timing"]
    assert data["guidance_2"] == 2.5 and data["config"]["guidance_2"] == 2.5
    by_s, by_n = timing["dit_by_expert_s"], timing["dit_forwards_by_expert"]
    assert set(by_s) == set(by_n) == {"transformer", "transformer_2"}
    assert all(v > 0 for v in by_s.values())
    assert by_n == {"transformer": 2, "transformer_2": 2}  # t = 999 >= 875 and t = 750 < 875, CFG on
    assert sum(by_n.values()) == timing["dit_forwards"] == 2 * STEPS
    assert sum(by_s.values()) == pytest.approx(timing["dit_s"], rel=0.05)


@pytest.mark.slow
def test_flow_shift_moves_the_expert_switch(a14b_dir, tmp_path):
    """--flow-shift reaches the scheduler: with shift 100 the second of 2 steps stays at t >= 875 (sigma 0.99),
    so only the high-noise expert runs; the default shift 3.0 gives one step each (test above)."""
    res = t2v("a fox", "--model", "tiny-a14b", "--steps", str(STEPS), "--flow-shift", "100",
              "--out", str(tmp_path / "s.mp4"), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["config"]["flow_shift"] == 100
    assert data["timing"]["dit_forwards_by_expert"] == {"transformer": 4}


@pytest.mark.slow
def test_one_expert_timing_names_its_transformer(ti2v_dir, tmp_path):
    res = t2v("a fox", "--model", "tiny-ti2v", "--steps", "1", "--frames", "5", "--height", "64", "--width", "64",
              "--out", str(tmp_path / "o.mp4"))
    assert res.exit_code == 0, res.output
    assert "expert transformer" not in res.stdout  # no per-expert lines with a single transformer
    timing = json.loads((tmp_path / "o.json").read_text())["timing"]
    assert timing["dit_forwards_by_expert"] == {"transformer": 2}
    assert timing["dit_by_expert_s"]["transformer"] == pytest.approx(timing["dit_s"], rel=0.05)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny-ti2v", "tiny-a14b"])
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_vsa_runs_on_each_family(ti2v_dir, a14b_dir, tmp_path, name, impl):
    # tiny sizes (the Triton kernels run under the interpreter): grid 2 x 2 x 3 for both families
    size = ["--height", "64", "--width", "96"] if name == "tiny-ti2v" else ["--height", "32", "--width", "48"]
    out = tmp_path / "s.mp4"
    res = t2v("a fox", "--model", name, "--attn", "vsa", "--attn-impl", impl, "--sparsity", "0.5",
              "--frames", "5", *size, "--steps", str(STEPS), "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["backend"] == {"name": "vsa", "sparsity": 0.5, "impl": impl, "tile": "4x4x4",
                               "impl_ran": impl}
    assert data["denoised"]["grid"] == [2, 2, 3]
    assert set(data["timing"]["self_attention_stages_s"]) == {"coarse", "fine"}
    assert data["timing"]["dit_forwards"] == 2 * STEPS
    if name == "tiny-a14b":
        assert set(data["timing"]["dit_forwards_by_expert"]) == {"transformer", "transformer_2"}
    assert read_mp4(out).shape == (5, int(size[1]), int(size[3]), 3)


@pytest.mark.slow
def test_ti2v_tile_fit_crop(ti2v_dir, tmp_path):
    out = tmp_path / "c.mp4"
    res = t2v("a fox", "--model", "tiny-ti2v", "--attn", "vsa", "--tile-fit", "crop", "--frames", "9",
              "--height", "96", "--width", "160", "--steps", "1", "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    den = json.loads(res.stdout)["denoised"]
    # 9 x 96 x 160 -> latent 3 x 6 x 10 -> grid 3 x 3 x 5, rounded up to 4 x 4 x 8
    assert den["grid"] == [4, 4, 8] and den["latent"] == [4, 8, 16]
    assert (den["frames"], den["height"], den["width"]) == (13, 128, 256)
    assert read_mp4(out).shape == (9, 96, 160, 3)


@pytest.mark.slow
def test_ti2v_vsa_at_sparsity_zero_gives_the_frames_of_full(ti2v_dir, tmp_path, encoder_frames):
    """Per-token timesteps through the tile-order hooks, end to end: `--attn vsa --sparsity 0` (tile order, every
    tile selected) gives the frames of `--attn full` (raster order), compared as handed to the encoder (at most
    1 uint8 level apart; see test_pipeline.test_vsa_at_sparsity_zero_gives_the_frames_of_full); both
    implementations against one `full` run."""
    from vsagen.commands.generate import generate

    frames = encoder_frames
    # grid 2 x 5 x 7: partial tiles on every axis
    common = dict(model="tiny-ti2v", frames=5, height=160, width=224, steps=1, device="cpu")
    generate(resolve("a fox", attn="full", out=tmp_path / "full.mp4", **common), progress=False)
    for impl in ("torch", "triton"):
        vsa = generate(resolve("a fox", attn="vsa", sparsity=0.0, attn_impl=impl, out=tmp_path / f"{impl}.mp4",
                               **common), progress=False)
        assert vsa.summary["expand_timesteps"] is True
        assert vsa.summary["denoised"]["grid"] == [2, 5, 7] and vsa.summary["denoised"]["full_tiles"] == 0
        a, b = frames["full"].astype(int), frames[impl].astype(int)
        assert a.shape == b.shape == (5, 160, 224, 3)
        assert np.abs(a - b).max() <= 1, impl
        assert (a != b).mean() < 1e-3, impl


def test_ti2v_transformer_reorders_a_non_uniform_per_token_timestep(ti2v_dir):
    """The pipeline's T2V per-token timestep is the same for every token, so the end-to-end test above cannot
    tell a missing reorder; here each token gets its own timestep, and a shuffled one is the negative control."""
    from diffusers import WanTransformer3DModel

    from vsagen.attention import make_backend
    from vsagen.attention.hooks import patch_transformer
    from vsagen.timing import Timer

    tr = WanTransformer3DModel.from_pretrained(ti2v_dir / "transformer", use_safetensors=True).eval()
    g = torch.Generator().manual_seed(3)
    hs = torch.randn(1, 48, 2, 10, 14, generator=g)  # grid 2 x 5 x 7
    ts = torch.rand(1, 2 * 5 * 7, generator=g) * 999.0
    enc = torch.randn(1, 9, 32, generator=g)

    def run(attn, sparsity, timestep):
        patch = patch_transformer(tr, make_backend(attn, sparsity, "torch" if attn == "vsa" else "auto"),
                                  Timer("cpu"))
        try:
            with torch.no_grad():
                return tr(hidden_states=hs, timestep=timestep, encoder_hidden_states=enc, return_dict=False)[0]
        finally:
            patch.remove()

    full = run("full", None, ts)
    vsa = run("vsa", 0.0, ts)
    assert (full - vsa).abs().max().item() < 1e-4
    shuffled = run("full", None, ts[:, torch.randperm(ts.shape[1], generator=g)])
    assert (full - shuffled).abs().max().item() > 1e-2  # the per-token timestep matters


# --------------------------------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize("args,needles", [
    (["--model", "tiny-ti2v", "--height", "48"], ["--height", "32", "tiny-ti2v", "64"]),
    (["--model", "tiny-ti2v", "--width", "100"], ["--width", "96", "128"]),
    (["--model", "tiny-ti2v", "--height", "16"], ["--height", "32"]),
    (["--model", "tiny-a14b", "--guidance-2", "nan"], ["--guidance-2", "nan"]),
    (["--model", "tiny-a14b", "--guidance-2=-1"], ["--guidance-2", "-1"]),
    (["--model", "tiny", "--guidance-2", "3"], ["--guidance-2", "tiny"]),
], ids=["ti2v-height-48", "ti2v-width-100", "ti2v-height-16", "guidance-2-nan", "guidance-2-negative",
        "guidance-2-one-expert"])
def test_bad_family_input_exit_2(vsagen_cache, tmp_path, args, needles):
    res = t2v("a fox", *args, "--out", str(tmp_path / "o" / "x.mp4"))
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and res.stdout == ""
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    assert list(tmp_path.iterdir()) == []


def test_guidance_precedence_for_two_experts(vsagen_cache, tmp_path):
    d = load_preset("tiny-a14b").defaults
    cfg = resolve("a fox", model="tiny-a14b", guidance=7.0, out=tmp_path / "a.mp4")
    assert cfg.guidance == 7.0 and cfg.guidance_2 == d.guidance_2  # --guidance is the first expert's
    assert resolve("a fox", model="tiny-a14b", guidance_2=1.5, out=tmp_path / "a.mp4").guidance_2 == 1.5
    assert resolve("a fox", model="tiny", out=tmp_path / "a.mp4").guidance_2 is None
