"""`vsagen.decode.decoder_choice`: the lightweight and the tiny (TAEHV) decoders in a pipeline: attached to the stock
VAE (decode routed, encode kept), their decode as a stream (the light one's temporal windows, the tiny one's latent
frames, each equal to the whole decode; the tiny one fed the latents it takes), the choice (`--vae
auto|light|stock|tiny`: the preset's folder, random weights, a weights file, the Hugging Face cache, a tiny model's
own file), `--vae light` end to end on tiny-ti2v and `--vae tiny` on every tiny family, refusals of other widths and
damaged files, and an interrupt mid-stream."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from test_light_decoder import TINY, randomize
from typer.testing import CliRunner

from vsagen.errors import BadInput, ModelNotFound
from vsagen.decode.light_decoder import LightVaeConfig, LightVaeDecoder, save_folder
from vsagen.decode.decoder_choice import (attach, choose_decoder, decode_channels_last, latent_stats, spatially_tiled,
                                          uses_light_decoder, uses_tiny_decoder, vae_summary)
from vsagen.decode.tiny_decoder import PUBLISHED_WIDTHS, TinyVaeConfig, random_decoder, save_file
from vsagen.decode.tiny_files import TINY_MODEL_WIDTHS
from vsagen.models.presets import load_preset
from vsagen.request.options import VaeSpec

from conftest import one_error_line

# ---- the pipeline ------------------------------------------------------------------------------------------------

def stock_vae():
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(**load_preset("tiny-ti2v").vae).eval()


def test_attach_routes_decode_and_keeps_encode():
    vae = stock_vae()
    d = randomize(LightVaeDecoder(TINY)).eval()
    attach(vae, d)
    assert uses_light_decoder(vae)
    z = torch.randn(1, 48, 3, 2, 2) * 3
    out = vae.decode(z, return_dict=False)[0]
    torch.testing.assert_close(out, d.decode(z).clamp(-1, 1))
    assert vae.decode(z).sample.shape == out.shape
    assert vae.encode(torch.randn(1, 3, 5, 32, 32)).latent_dist.mean.shape == (1, 48, 2, 2, 2)
    vae.enable_tiling()
    assert spatially_tiled(vae)
    vae.light_decoder.follow_vae_tiling = False  # `--vae-tiling auto`: the light decoder stays untiled in space
    assert not spatially_tiled(vae)
    vae.to(torch.float64)
    assert vae.light_decoder.conv_in.conv.weight.dtype == torch.float64
    with pytest.raises(BadInput, match="does not fit"):
        attach(vae, LightVaeDecoder(LightVaeConfig(latent_channels=16, patch_size=4)))


def test_detach_gives_back_the_stock_decode_and_reattach_the_decoder():
    """`vsagen compare --vae stock,light`: a VAE with a light decoder detached decodes as the stock VAE it was (the
    same frames as before the light decoder was attached); reattached, the light decoder's frames again; a stock
    state is a no-op."""
    from vsagen.decode.decoder_choice import detach, reattach

    vae = stock_vae()
    z = torch.randn(1, 48, 1, 1, 1)
    before, names = vae.decode(z, return_dict=False)[0], set(dict(vae.named_parameters()))
    attach(vae, randomize(LightVaeDecoder(TINY)).eval())
    light = vae.decode(z, return_dict=False)[0]
    assert not torch.equal(light, before)
    state = detach(vae)
    assert not uses_light_decoder(vae) and "decode" not in vae.__dict__ and state["light_decoder"] is not None
    assert torch.equal(vae.decode(z, return_dict=False)[0], before)
    assert set(dict(vae.named_parameters())) == names  # no decoder left on it
    stock = detach(vae)
    assert all(v is None for v in stock.values())
    reattach(vae, state)
    assert uses_light_decoder(vae) and torch.equal(vae.decode(z, return_dict=False)[0], light)
    reattach(vae, stock)
    assert not uses_light_decoder(vae) and vae_summary(vae)["vae_decoder"] == "stock"


def conv3d_weights(module):
    return [m.weight for m in module.modules() if isinstance(m, torch.nn.Conv3d)]


def test_channels_last_decode_only_where_measured_and_same_frames():
    """bf16 + CUDA + stock decoder: the decode path's Conv3d weights go channels-last (the encoder's stay), and the
    decode is the same; float32, a CPU run or the light decoder: untouched. (The layout is set on CPU tensors here:
    the device argument is the run's, the weights move there afterwards with their format.)"""
    vae = stock_vae().to(torch.bfloat16)
    z = torch.randn(1, 48, 3, 2, 2, dtype=torch.bfloat16) * 3
    before = vae.decode(z).sample
    assert not decode_channels_last(vae, "cpu") and not decode_channels_last(stock_vae(), "cuda")
    assert decode_channels_last(vae, "cuda:0")
    last = torch.channels_last_3d
    decode_path = conv3d_weights(vae.decoder) + conv3d_weights(vae.post_quant_conv)
    assert decode_path and all(w.is_contiguous(memory_format=last) for w in decode_path)
    assert any(not w.is_contiguous() for w in decode_path)  # converted, not already contiguous both ways
    assert all(w.is_contiguous() for w in conv3d_weights(vae.encoder))
    torch.testing.assert_close(vae.decode(z).sample, before, rtol=0.02, atol=0.02)
    light = stock_vae().to(torch.bfloat16)
    attach(light, randomize(LightVaeDecoder(TINY)).eval().to(torch.bfloat16))
    assert not decode_channels_last(light, "cuda")


def test_random_weights_build_the_presets_architecture():
    """`--random-weights` on hummingbird-xt: its [light_vae] config, random weights, windows of 16 frames every 12."""
    vae, notes = stock_vae(), []
    cfg = SimpleNamespace(source=SimpleNamespace(preset=load_preset("hummingbird-xt"), kind="hub",
                                                 location="amd/HummingbirdXT"),
                          vae_decoder=VaeSpec.parse("auto"), random_weights=True, seed=0, model="hummingbird-xt")
    choose_decoder(cfg, vae, notes)
    light = vae.light_decoder
    assert light.use_framewise_decoding and light.tile_sample_min_num_frames == 16 \
        and light.tile_sample_stride_num_frames == 12
    assert "light decoder (random weights" in notes[0]
    # the released decoder's widths (v1 and v3 config.json on the hub; issue 45), not the assumed 128..512 of before
    assert light.config.decoder_block_out_channels == (32, 64, 256, 512)
    assert not light.follow_vae_tiling  # the request's vae_tiling is not "on"
    cfg.vae_decoder, vae2 = VaeSpec.parse("stock"), stock_vae()
    choose_decoder(cfg, vae2, notes)
    assert not uses_light_decoder(vae2)


def test_missing_folder_auto_notes_light_refuses(tmp_path):
    preset = load_preset("hummingbird-xt")
    cfg = SimpleNamespace(source=SimpleNamespace(preset=preset, kind="dir", location=str(tmp_path)),
                          vae_decoder=VaeSpec.parse("auto"), random_weights=False, seed=0, model=str(tmp_path))
    notes: list[str] = []
    choose_decoder(cfg, stock_vae(), notes)
    assert "no light VAE decoder at vae/wan22_v1_tiling_16_12/" in notes[0] and "stock VAE decoder runs" in notes[0]
    cfg.vae_decoder = VaeSpec.parse("light")
    with pytest.raises(BadInput, match="--vae light: no light VAE decoder"):
        choose_decoder(cfg, stock_vae(), [])
    save_folder(randomize(LightVaeDecoder(TINY)), tmp_path / preset.light_vae.subfolder)
    vae = stock_vae()
    choose_decoder(cfg, vae, notes)
    assert uses_light_decoder(vae) and str(tmp_path) in notes[-1]


runner = CliRunner()


@pytest.mark.slow
def test_t2v_vae_light_end_to_end(ti2v_dir, tmp_path):
    from vsagen.cli.app import app

    common = ["--model", "tiny-ti2v", "--steps", "1", "--frames", "9", "--height", "64", "--width", "64", "--json"]
    res = runner.invoke(app, ["t2v", "a fox", *common, "--vae", "light", "--out", str(tmp_path / "l.mp4")])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["vae_decoder"] == "light" and data["config"]["vae_decoder"] == "light"
    # `--vae-tiling auto` leaves the light decoder to its own rule (untiled in space), not estimated
    assert data["vae_tiling"] is False and data["vae_tiling_choice"]["estimated_peak_gib"] is None
    assert "the light decoder" in data["vae_tiling_choice"]["why"]
    assert (ti2v_dir / "vae" / "light" / "diffusion_pytorch_model.safetensors").is_file()
    res = runner.invoke(app, ["t2v", "a fox", *common, "--out", str(tmp_path / "s.mp4")])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["vae_decoder"] == "stock"  # tiny-ti2v: light only when asked
    res = runner.invoke(app, ["t2v", "a fox", "--model", "tiny", "--vae", "light", "--out", str(tmp_path / "t.mp4")])
    assert "--vae light: --model tiny has no lightweight VAE decoder" in one_error_line(res)
    res = runner.invoke(app, ["t2v", "a fox", "--model", "tiny", "--vae", "bogus", "--out", str(tmp_path / "t.mp4")])
    assert res.exit_code == 2


def test_preset_light_vae_table_is_checked():
    import copy
    import tomllib

    from vsagen.models.presets import _preset_dir, parse_preset

    raw = tomllib.loads((_preset_dir() / "tiny-ti2v.toml").read_text())
    for key, value, match in [("subfolder", "/abs", "relative folder"), ("default", "yes", "true or false"),
                              ("tile_stride", 99, "stride <= frames"), ("bogus", 1, "unknown key")]:
        data = copy.deepcopy(raw)
        data["light_vae"][key] = value
        with pytest.raises(BadInput, match=match):
            parse_preset(data, "x.toml")
    assert load_preset("hummingbird-xt").light_vae.default and not load_preset("tiny-ti2v").light_vae.default


@pytest.mark.parametrize("frames", [1, 3, 6, 7])
def test_the_stream_is_the_windowed_decode_window_by_window(frames):
    """Issue 32: with temporal windows (AMD's 16 every 12, here 8 every 4) `vsagen.decode.stream.decode_chunks` yields
    each window's final frames as soon as it is blended; concatenated they are `vae.decode`'s frames exactly (odd latent
    frame counts, a last window cut short); without windows, one chunk."""
    from vsagen.decode.stream import decode_chunks, streams, unnormalized

    vae = stock_vae()
    attach(vae, randomize(LightVaeDecoder(TINY)).eval())
    z = torch.randn(1, 48, frames, 2, 3)
    assert not streams(vae)  # no windows: decoded whole
    with torch.inference_mode():
        assert len(list(decode_chunks(vae, z))) == 1
    vae.light_decoder.set_temporal_tiling(8, 4)
    assert streams(vae)
    with torch.inference_mode():
        chunks = list(decode_chunks(vae, z))
        whole = vae.decode(unnormalized(vae, z), return_dict=False)[0]
    assert torch.equal(torch.cat(chunks, dim=2), whole) and whole.shape[2] == 4 * (frames - 1) + 1
    assert len(chunks) == (frames - 1 if frames > 2 else 1)  # windows of 3 latent frames every 1; else whole


# ---- the tiny (TAEHV) decoder ------------------------------------------------------------------------------------

NARROW = TinyVaeConfig(16, 1, (16, 8, 8, 8))


def wan21_vae():
    """The tiny model's Wan2.1-style VAE: 16 channels and diffusers' Wan2.1 latents mean / std (not 0 / 1)."""
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(**load_preset("tiny").vae).eval()


@pytest.mark.parametrize("raw", [False, True])
def test_the_tiny_decoder_streams_the_latents_it_takes(raw):
    """Attached: `vae.decode` (un-normalised latents) and the stream (the DiT's latents) both give the decoder the
    latents it takes (the DiT's for taew2_*, z * std + mean for lighttaew2_*), as 2 x - 1; 1 frame then 4 per latent
    frame; encoding stays the VAE's; never spatially tiled; its weights in the summary."""
    from vsagen.decode.stream import decode_chunks, streams, unnormalized

    vae, dec = wan21_vae(), random_decoder(dataclasses.replace(NARROW, raw_latents=raw), seed=1)
    attach(vae, dec)
    assert uses_tiny_decoder(vae) and not uses_light_decoder(vae) and streams(vae)
    latents = torch.randn(1, 16, 3, 2, 3)
    mean, std = latent_stats(vae, latents)
    assert not torch.allclose(std, torch.ones_like(std))
    with torch.inference_mode():
        chunks = list(decode_chunks(vae, latents))
        whole = vae.decode(unnormalized(vae, latents), return_dict=False)[0]
        direct = dec.decode(latents * std + mean if raw else latents) * 2 - 1
    assert [c.shape[2] for c in chunks] == [1, 4, 4] and direct.shape == (1, 3, 9, 16, 24)
    torch.testing.assert_close(torch.cat(chunks, dim=2), direct, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(whole, direct, rtol=1e-5, atol=1e-5)  # through z * std + mean and back
    assert vae.encode(torch.randn(1, 3, 5, 16, 16)).latent_dist.mean.shape == (1, 16, 2, 2, 2)
    vae.enable_tiling()
    assert vae_summary(vae) == {"vae_tiling": False, "vae_decoder": "tiny", "vae_weights": "random weights",
                                "vae_dtype": "fp32"}
    with pytest.raises(BadInput, match="does not fit the model's VAE: it decodes 48-channel latents at 16x"):
        attach(wan21_vae(), random_decoder(TinyVaeConfig(48, 2, (8, 8, 8, 8)), seed=0))


def tiny_cfg(text: str, preset: str = "wan2.1-t2v-1.3b", kind: str = "hub", random_weights: bool = False):
    return SimpleNamespace(vae_decoder=VaeSpec.parse(text), source=SimpleNamespace(kind=kind, preset=load_preset(preset)),
                           random_weights=random_weights, seed=0, model=preset)


def test_choose_tiny_reads_a_file_random_weights_the_hub_or_the_tiny_models_own(vsagen_cache, hub, tmp_path):
    vae, notes = wan21_vae(), []
    choose_decoder(tiny_cfg("tiny", random_weights=True), vae, notes)
    assert vae.tiny_decoder.config == TinyVaeConfig(16, 1, PUBLISHED_WIDTHS)
    assert "tiny decoder (TAEHV, random weights, taew2_1's architecture; the DiT's latents" in notes[-1]
    light = tmp_path / "lighttaew2_1.safetensors"  # LightX2V's name: un-normalised latents
    save_file(random_decoder(NARROW, seed=2), light)
    choose_decoder(tiny_cfg(f"tiny:weights={light}"), vae := wan21_vae(), notes)
    assert vae.tiny_decoder.config.raw_latents and vae_summary(vae)["vae_weights"] == str(light)
    assert "--vae-tiling" not in notes[-1]
    tiled = tiny_cfg(f"tiny:weights={light}")
    tiled.vae_tiling = "on"  # silently ignored before: a new user's finding
    choose_decoder(tiled, wan21_vae(), notes)
    assert notes[-1].endswith("--vae-tiling on does not apply to it (it decodes a frame at a time, untiled)")
    with pytest.raises(ModelNotFound, match="madebyollin/taehv/taew2_1.pth is not in the local Hugging Face cache"):
        choose_decoder(tiny_cfg("tiny"), wan21_vae(), notes)
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    torch.save(random_decoder(NARROW, seed=3).state_dict(), snapshot / "taew2_1.pth")
    hub.store("madebyollin/taehv", snapshot)
    asked = len(hub.asked)
    choose_decoder(tiny_cfg("tiny"), vae := wan21_vae(), notes)
    assert len(hub.asked) == asked  # a cached file is read without asking the hub
    assert vae_summary(vae)["vae_weights"] == "madebyollin/taehv/taew2_1.pth" and not vae.tiny_decoder.config.raw_latents
    cfg = tiny_cfg("tiny", preset="tiny", kind="tiny")  # written beside the tiny checkpoint once, then read
    choose_decoder(cfg, vae := wan21_vae(), notes)
    path = vsagen_cache / "tiny-pipeline" / "vae" / "tiny" / "taew2_1.safetensors"
    assert vae.tiny_decoder.origin == str(path) and vae.tiny_decoder.config.widths == TINY_MODEL_WIDTHS
    written = path.stat().st_mtime_ns
    choose_decoder(cfg, wan21_vae(), notes)
    assert path.stat().st_mtime_ns == written


COMMON = ["--steps", "1", "--frames", "9", "--height", "64", "--width", "64", "--json"]


@pytest.mark.slow
@pytest.mark.parametrize("command,model", [("t2v", "tiny"), ("t2v", "tiny-ti2v"), ("i2v", "tiny-i2v")])
def test_vae_tiny_end_to_end_on_every_family(vsagen_cache, tmp_path, command, model):
    """`--vae tiny` on the Wan2.1-style family (16 channels; image to video: the image encoded by the stock VAE) and
    the Wan2.2-5B-style one (48 channels, 2x2 patch): the tiny model's own TAEHV file, the mp4 of every frame."""
    from vsagen.cli.app import app
    from vsagen.media.video import read_mp4

    from conftest import noise_image

    inputs = [str(noise_image(tmp_path / "in.png")), "a fox"] if command == "i2v" else ["a fox"]
    out = tmp_path / "t.mp4"
    res = runner.invoke(app, [command, *inputs, "--model", model, *COMMON, "--vae", "tiny", "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    name = "taew2_2" if model == "tiny-ti2v" else "taew2_1"
    assert (data["vae_decoder"], data["config"]["vae_decoder"]) == ("tiny", "tiny")
    assert data["vae_weights"] == str(vsagen_cache / f"{model}-pipeline" / "vae" / "tiny" / f"{name}.safetensors")
    assert read_mp4(out).shape == (9, 64, 64, 3)


@pytest.mark.slow
def test_weights_of_another_width_or_damaged_are_one_line_and_write_nothing(vsagen_cache, tmp_path):
    from vsagen.cli.app import app

    wide = tmp_path / "w" / "taew2_2.pth"  # a .pth: read memory-mapped before anything loads
    wide.parent.mkdir()
    torch.save(random_decoder(TinyVaeConfig(48, 2, (8, 8, 8, 8)), seed=0).state_dict(), wide)
    cut = tmp_path / "w" / "cut.safetensors"
    save_file(random_decoder(NARROW, seed=0), cut)
    cut.write_bytes(cut.read_bytes()[:2000])
    out = tmp_path / "out"
    out.mkdir()
    for weights, says in ((wide, "decodes 48-channel latents and --model tiny's VAE makes 16-channel ones"),
                          (cut, "the file is damaged or truncated")):
        res = runner.invoke(app, ["t2v", "a fox", "--model", "tiny", *COMMON, "--vae", f"tiny:weights={weights}",
                                  "--out", str(out / "f.mp4")])
        assert says in one_error_line(res)
    assert list(out.iterdir()) == []


@pytest.mark.slow
def test_an_interrupt_mid_stream_leaves_no_file(vsagen_cache, tmp_path, monkeypatch):
    """Ctrl-C after the tiny decoder's first frames reached the encoder: no video, no JSON, no temporary file."""
    import os
    import signal

    import vsagen.media.video
    from vsagen.cli.app import app

    real = vsagen.media.video.encode_mp4_stream

    def interrupted_midway(chunks, path, *args, **kwargs):
        def first_then_signal():
            yield next(iter(chunks))
            os.kill(os.getpid(), signal.SIGINT)
            yield from chunks
        return real(first_then_signal(), path, *args, **kwargs)

    monkeypatch.setattr(vsagen.media.video, "encode_mp4_stream", interrupted_midway)
    res = runner.invoke(app, ["t2v", "a fox", "--model", "tiny", *COMMON, "--vae", "tiny",
                              "--out", str(tmp_path / "s.mp4")])
    assert res.exit_code == 130, res.output
    assert res.stderr.strip().splitlines()[-1] == "error: interrupted; nothing was written"
    assert list(tmp_path.iterdir()) == []
