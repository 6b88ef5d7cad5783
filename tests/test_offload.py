"""`--offload`, `--vae-tiling` and the image-to-video timing regions (issue 4). CPU, tiny models, private cache.

This machine has no CUDA, and offloading is CUDA only: the CLI refuses it on the CPU (tested here). The offload
code path itself (`place_pipeline`, diffusers' / accelerate's offload hooks under vsagen's tile-order hooks and
timers) is exercised on the CPU by handing `generate` a RunConfig with `offload` set (which `resolve` would
refuse), the CPU standing in for the GPU: model offload through accelerate's hooks, group offload through
diffusers' hooks without a CUDA stream. The CUDA-stream prefetch path (`use_stream=True`) cannot run here; only
the arguments vsagen hands diffusers for it are checked (monkeypatched methods).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from conftest import noise_image, one_error_line
from typer.testing import CliRunner

from vsagen.cli.app import app
from vsagen.commands.generate_config import resolve_generate as resolve
from vsagen.media.video import read_mp4

runner = CliRunner()
# Small runs: 5 frames of 64 x 64 (grid 2 x 4 x 4), CFG on (two forwards a step).
SMALL = dict(frames=5, height=64, width=64, steps=2, device="cpu")
SMALL_ARGS = ["--frames", "5", "--height", "64", "--width", "64", "--steps", "1"]
# A frame wider than diffusers' VAE tile (256 px), so `--vae-tiling on` really splits it; 288 / 16 = 18 post-patch
# positions, inside the tiny transformer's RoPE range (32).
WIDE_ARGS = ["--frames", "5", "--height", "64", "--width", "288", "--steps", "1"]
# Sums of disjoint perf_counter intervals vs their enclosing one: equal up to float rounding of the sum.
SUM_SLACK_S = 1e-9


@pytest.fixture
def recorder(monkeypatch):
    """Replaces vsagen.commands.generate.generate: records the RunConfig the CLI resolved."""
    configs = []

    def fake(cfg, *, log=None, progress=True, writer=True, cancelled=None):
        configs.append(cfg)

        class Result:
            summary = {"video": str(cfg.out)}

        return Result()

    monkeypatch.setattr("vsagen.commands.generate.generate", fake)
    return configs


@pytest.fixture
def placed(monkeypatch):
    """Spies on vsagen.models.loading.place_pipeline (the real one still runs): [(pipe, offload, device)]."""
    import vsagen.models.loading

    calls = []
    real = vsagen.models.loading.place_pipeline

    def spy(pipe, offload, device):
        real(pipe, offload, device)
        calls.append((pipe, offload, device))

    monkeypatch.setattr(vsagen.models.loading, "place_pipeline", spy)
    return calls


# --------------------------------------------------------------------------------------------------------------
# Flags: parsing, defaults, validation


def test_flags_reach_the_config_with_their_defaults(recorder, tmp_path, monkeypatch):
    res = runner.invoke(app, ["t2v", "p", "--model", "tiny", "--out", str(tmp_path / "a.mp4"), "--json"])
    assert res.exit_code == 0, res.output
    assert (recorder[-1].offload, recorder[-1].vae_tiling) == ("none", "auto")  # decided at decode, by memory
    res = runner.invoke(app, ["t2v", "p", "--model", "tiny", "--out", str(tmp_path / "b.mp4"), "--json",
                              "--vae-tiling", "on"])
    assert res.exit_code == 0, res.output
    assert recorder[-1].vae_tiling == "on"
    assert recorder[-1].summary()["vae_tiling"] == "on" and recorder[-1].summary()["offload"] == "none"
    img = noise_image(tmp_path / "in.png")
    res = runner.invoke(app, ["i2v", str(img), "p", "--model", "tiny-i2v", "--out", str(tmp_path / "c.mp4"),
                              "--json", "--vae-tiling", "off"])
    assert res.exit_code == 0, res.output
    assert recorder[-1].vae_tiling == "off"
    # With CUDA (faked: nothing runs, generate is the recorder) every offload mode is accepted, for both commands.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for mode in ("model", "group"):
        res = runner.invoke(app, ["t2v", "p", "--model", "tiny", "--out", str(tmp_path / f"t-{mode}.mp4"), "--json",
                                  "--offload", mode])
        assert res.exit_code == 0, res.output
        assert (recorder[-1].offload, recorder[-1].device) == (mode, "cuda")
        res = runner.invoke(app, ["i2v", str(img), "p", "--model", "tiny-i2v", "--out", str(tmp_path / f"i-{mode}.mp4"),
                                  "--json", "--offload", mode, "--device", "cuda"])
        assert res.exit_code == 0, res.output
        assert (recorder[-1].offload, recorder[-1].device) == (mode, "cuda")


BAD = [
    ("offload-value", ["--offload", "disk"], ["--offload", "none, model, group", "disk"]),
    ("vae-tiling-value", ["--vae-tiling", "maybe"], ["--vae-tiling", "auto, on, off", "maybe"]),
    ("offload-model-cpu", ["--offload", "model", "--device", "cpu"], ["--offload model", "CUDA", "--offload none"]),
    ("offload-group-cpu", ["--offload", "group", "--device", "cpu"], ["--offload group", "CUDA", "--device cpu"]),
    ("offload-auto-no-cuda", ["--offload", "group"], ["--offload group", "CUDA", "--device auto"]),
]


@pytest.mark.parametrize("command", ["t2v", "i2v"])
@pytest.mark.parametrize("case_id,extra,needles", BAD, ids=[b[0] for b in BAD])
def test_bad_flags_one_error_line_exit_2(vsagen_cache, tmp_path, command, case_id, extra, needles):
    if case_id == "offload-auto-no-cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is available here: --device auto resolves to cuda")
    img = noise_image(tmp_path / "in.png")
    before = sorted(p.name for p in tmp_path.iterdir())
    out = ["--out", str(tmp_path / "o" / "x.mp4")]
    args = (["t2v", "a fox", "--model", "tiny"] if command == "t2v"
            else ["i2v", str(img), "a fox", "--model", "tiny-i2v"])
    line = one_error_line(runner.invoke(app, [*args, *extra, *out]))
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "something was written"


# --------------------------------------------------------------------------------------------------------------
# Offload: which diffusers API is called, and that its hooks compose with vsagen's


@pytest.mark.parametrize("order", ["offload-then-patch", "patch-then-offload"])
def test_tile_order_hooks_compose_with_group_offload_hooks(order):
    """vsagen's hooks are torch forward hooks, diffusers' group offloading replaces `forward`: the patched,
    offloaded transformer gives the patched transformer's output exactly, whichever is installed first, with the
    tile order applied once per forward (one "dit" region per forward, every layer timed)."""
    from diffusers import WanTransformer3DModel
    from diffusers.hooks import apply_group_offloading

    from vsagen.attention import make_backend
    from vsagen.attention.hooks import patch_transformer
    from vsagen.models.presets import load_preset
    from vsagen.timing import Timer

    def build():
        torch.manual_seed(0)
        return WanTransformer3DModel(**load_preset("tiny").transformer).eval()

    g = torch.Generator().manual_seed(3)
    inputs = dict(hidden_states=torch.randn(1, 16, 5, 12, 20, generator=g),
                  timestep=torch.rand(1, generator=g) * 999.0, encoder_hidden_states=torch.randn(1, 9, 32, generator=g),
                  return_dict=False)
    backend = make_backend("vsa", 0.5, "torch")
    ref_t = build()
    ref_patch = patch_transformer(ref_t, backend, Timer("cpu"))
    with torch.no_grad():
        ref = ref_t(**inputs)[0]
    ref_patch.remove()

    t, timer = build(), Timer("cpu")
    offload = lambda: apply_group_offloading(t, onload_device=torch.device("cpu"),  # noqa: E731
                                             offload_type="block_level", num_blocks_per_group=1)
    if order == "offload-then-patch":
        offload()
        patch = patch_transformer(t, backend, timer)
    else:
        patch = patch_transformer(t, backend, timer)
        offload()
    assert t.blocks[0]._diffusers_hook.get_hook("group_offloading") is not None
    with torch.no_grad():
        out = t(**inputs)[0]
    patch.remove()
    assert torch.equal(out, ref)
    names = [n for n, _, _ in timer.finish()]
    assert names.count("dit") == 1 and names.count("attn1") == len(t.blocks)


def _offload_hooks(pipe, mode: str) -> None:
    """Assert the offload mode's hooks are on the pipeline's transformer(s) (and the VAE as the mode says)."""
    for name in ("transformer", "transformer_2"):
        t = getattr(pipe, name, None)
        if t is None:
            continue
        if mode == "model":
            assert hasattr(t, "_hf_hook"), name
        else:
            assert t.blocks[0]._diffusers_hook.get_hook("group_offloading") is not None, name
    if mode == "group":  # the VAE is kept on the device, without group offloading
        assert getattr(pipe.vae, "_diffusers_hook", None) is None or \
            pipe.vae._diffusers_hook.get_hook("group_offloading") is None


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-a14b", "tiny-ti2v", "tiny-i2v"])
def test_offloaded_runs_give_the_frames_of_the_plain_run(vsagen_cache, tmp_path, encoder_frames, placed, model):
    """Each family (two experts; per-token timesteps; image to video with CLIP and a VAE-encoded condition), run
    with VSA (tile order) under no, model and group offload on the CPU: the same frames, bit for bit, the same
    number of DiT forwards and attention stages, and offload recorded in the JSON."""
    from vsagen.commands.generate import generate

    image = noise_image(tmp_path / "in.png") if model == "tiny-i2v" else None
    summaries = {}
    for mode in ("none", "model", "group"):
        cfg = resolve("a fox", model=model, attn="vsa", sparsity=0.5, attn_impl="torch", image=image,
                      out=tmp_path / f"{mode}.mp4", **SMALL)
        result = generate(dataclasses.replace(cfg, offload=mode), progress=False)
        pipe, got_mode, device = placed[-1]
        assert (got_mode, device) == (mode, "cpu")
        if mode != "none":
            _offload_hooks(pipe, mode)
        assert "encode_image" not in vars(pipe) and "prepare_latents" not in vars(pipe)  # wrappers removed
        summaries[mode] = result.summary
        data = json.loads(result.json_path.read_text())
        assert data["offload"] == data["config"]["offload"] == mode
    for mode in ("model", "group"):
        assert np.array_equal(encoder_frames[mode], encoder_frames["none"]), mode
        for key in ("dit_forwards", "dit_forwards_by_expert"):
            assert summaries[mode]["timing"][key] == summaries["none"]["timing"][key]
        assert set(summaries[mode]["timing"]["self_attention_stages_s"]) == {"coarse", "fine"}
    assert read_mp4(tmp_path / "group.mp4").shape == (5, 64, 64, 3)


@pytest.mark.parametrize("mode", ["model", "group"])
def test_an_offloaded_resident_ti2v_model_takes_text_and_image_requests(vsagen_cache, tmp_path, monkeypatch, placed,
                                                                        mode):
    """vsagen serve's text-image-to-video model (`Resident(images=True)`) offloaded: the image requests' pipeline over
    the loaded components under the text pipeline's hooks, and the text requests' VAE copy (its dtype split from the
    image's, as a preset's `decode_dtype` splits it) placed as the load placed the rest (under model offload, the text
    pipeline placed again with it: `place_pipeline` twice); each video that of `generate` alone, the two kinds
    alternating (the mp4s byte for byte)."""
    import vsagen.models.loading as loading
    from vsagen.commands.generate import Resident, generate
    from vsagen.commands.generate_config import resolve_run
    from vsagen.request.options import request_options

    real = loading.resolve_vae_dtype
    monkeypatch.setattr(loading, "resolve_vae_dtype", lambda requested, preset, i2v: real(requested, preset, i2v)
                        if requested != "auto" else ("fp32" if i2v else "bf16"))
    flags = dict(model="tiny-ti2v", steps=1, height=32, width=32, frames=1, device="cpu", random_weights=True)
    loaded = resolve_run("loaded", request_options(**flags, out=tmp_path / "loaded.mp4"), images_per_video=True)
    resident = Resident(dataclasses.replace(loaded, offload=mode), images=True)
    assert [m for _, m, _ in placed] == [mode] * (2 if mode == "model" else 1)
    image = noise_image(tmp_path / "in.png", (40, 36))
    for i, extra in enumerate([dict(image=image), {}, dict(image=image), {}]):
        cfg = resolve("a fox", **flags, **extra, out=tmp_path / f"served{i}.mp4")
        resident.generate(dataclasses.replace(cfg, offload=mode))
        if i < 2:
            generate(dataclasses.replace(cfg, out=tmp_path / f"alone{i}.mp4", json_out=tmp_path / f"alone{i}.json"),
                     progress=False)
        assert (tmp_path / f"served{i}.mp4").read_bytes() == (tmp_path / f"alone{i % 2}.mp4").read_bytes(), i


# --------------------------------------------------------------------------------------------------------------
# VAE tiling end to end


@pytest.mark.slow
def test_vae_tiling_on_and_off_end_to_end(vsagen_cache, tiny_dir, tmp_path, monkeypatch):
    """`on` / `off` as given; `auto` untiled where the estimated peak fits the free memory (this machine's), tiled
    where it does not (the free memory faked to 0.5 GiB, below the 1 GiB reserve alone); the JSON's
    `vae_tiling_choice` and the run's notes say which and why."""
    import vsagen.decode.stream as decode_stream
    import vsagen.decode.tiling as tiling

    tiled_calls = []
    real = decode_stream._tiled  # t2v decodes as a stream: diffusers' tiled_decode, one latent frame at a time

    def spy(vae, z):
        tiled_calls.append(z.shape)
        return real(vae, z)

    monkeypatch.setattr(decode_stream, "_tiled", spy)
    real_available = tiling.available_bytes
    for mode, tiled, free in (("on", True, None), ("off", False, None), ("auto", False, None),
                              ("auto", True, tiling.GIB // 2)):
        monkeypatch.setattr(tiling, "available_bytes",
                            real_available if free is None else (lambda device, free=free: (free, "faked")))
        out = tmp_path / f"{mode}-{tiled}.mp4"
        res = runner.invoke(app, ["t2v", "a fox", "--model", "tiny", *WIDE_ARGS, "--vae-tiling", mode,
                                  "--out", str(out), "--json"])
        assert res.exit_code == 0, res.output
        data = json.loads(res.stdout)
        assert data["vae_tiling"] is tiled and data["config"]["vae_tiling"] == mode
        choice = data["vae_tiling_choice"]
        assert (choice["mode"], choice["tiled"]) == (mode, tiled)
        if mode == "auto":
            said = "tiled" if tiled else "untiled"
            assert choice["why"].startswith(f"--vae-tiling auto: the VAE decodes {said}: its estimated peak ")
            assert choice["why"] in data["timing"]["notes"] and choice["why"] in res.stderr
            assert (choice["needed_gib"] > choice["available_gib"]) is tiled
            assert choice["available_from"] == ("faked" if free else "CPU MemAvailable")
        else:
            assert choice["why"] == f"--vae-tiling {mode}: the VAE decodes {'tiled' if tiled else 'untiled'} " \
                                    f"(--vae-tiling {mode})"
            assert not any(n.startswith("--vae-tiling") for n in data["timing"]["notes"])
        assert len(tiled_calls) == (1 if tiled else 0), mode  # the decode really ran tiled (or not)
        tiled_calls.clear()
        assert read_mp4(out).shape == (5, 64, 288, 3)
        assert data["timing"]["image_encode_s"] == data["timing"]["condition_encode_s"] == 0.0  # t2v


@pytest.mark.slow
def test_vae_tiling_tiles_the_i2v_condition_encode_too(vsagen_cache, i2v_dir, tmp_path, monkeypatch):
    """`--vae-tiling` tiles the VAE's encode of the condition image as well as the decode (diffusers' `_encode`
    takes `tiled_encode` under `enable_tiling`): --help said so, docs/commands.md said decode only (a new-user
    trial); this holds them to the code."""
    from conftest import noise_image
    from diffusers import AutoencoderKLWan

    encodes = []
    real = AutoencoderKLWan.tiled_encode

    def spy(self, x):
        encodes.append(x.shape)
        return real(self, x)

    monkeypatch.setattr(AutoencoderKLWan, "tiled_encode", spy)
    img = noise_image(tmp_path / "in.png", size=(288, 64))
    for mode, tiled in (("on", True), ("off", False)):
        res = runner.invoke(app, ["i2v", str(img), "a fox", "--model", "tiny-i2v", *WIDE_ARGS, "--vae-tiling", mode,
                                  "--out", str(tmp_path / f"{mode}.mp4"), "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["vae_tiling"] is tiled
        assert len(encodes) == (1 if tiled else 0), mode  # the one encode of the condition video, tiled or not
        encodes.clear()


# --------------------------------------------------------------------------------------------------------------
# Image to video: CLIP image encode and condition encode timed apart from the denoising loop


@pytest.mark.slow
def test_i2v_timing_has_image_and_condition_encode_apart_from_denoise(vsagen_cache, tmp_path):
    img = noise_image(tmp_path / "in.png")
    res = runner.invoke(app, ["i2v", str(img), "a fox", "--model", "tiny-i2v", *SMALL_ARGS, "--warmup", "1",
                              "--out", str(tmp_path / "v.mp4"), "--json"])
    assert res.exit_code == 0, res.output
    t = json.loads(res.stdout)["timing"]
    assert t["image_encode_s"] > 0 and t["condition_encode_s"] > 0
    assert t["dit_forwards"] == 2  # one step with CFG; the warm-up's forwards (and encodes) are not counted
    assert 0 < t["dit_s"] <= t["denoise_s"]
    # disjoint regions inside "total": nothing is counted twice
    parts = t["text_encode_s"] + t["image_encode_s"] + t["condition_encode_s"] + t["denoise_s"] + t["vae_decode_s"]
    assert parts <= t["total_s"] + SUM_SLACK_S
    assert t["denoise_s"] + t["image_encode_s"] + t["condition_encode_s"] <= t["total_s"]
    # the table shows both regions
    res = runner.invoke(app, ["i2v", str(img), "a fox", "--model", "tiny-i2v", *SMALL_ARGS,
                              "--out", str(tmp_path / "w.mp4")])
    assert res.exit_code == 0, res.output
    assert "image encode (CLIP)" in res.stdout and "condition encode (VAE)" in res.stdout


