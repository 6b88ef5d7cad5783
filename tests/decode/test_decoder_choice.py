"""`vsagen.decode.decoder_choice`: the lightweight decoder in a pipeline: attached to the stock VAE (decode routed,
encode kept), its decode as a stream of temporal windows equal to the whole decode, the preset's choice (`--vae
auto|light|stock`, random weights, a missing folder), and `--vae light` end to end on the tiny-ti2v model."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from test_light_decoder import TINY, randomize
from typer.testing import CliRunner

from vsagen.errors import BadInput
from vsagen.decode.light_decoder import LightVaeConfig, LightVaeDecoder, save_folder
from vsagen.decode.decoder_choice import (attach, choose_decoder, decode_channels_last, spatially_tiled,
                                          uses_light_decoder)
from vsagen.models.presets import load_preset

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
                          vae_decoder="auto", random_weights=True, seed=0, model="hummingbird-xt")
    choose_decoder(cfg, vae, notes)
    light = vae.light_decoder
    assert light.use_framewise_decoding and light.tile_sample_min_num_frames == 16 \
        and light.tile_sample_stride_num_frames == 12
    assert "light decoder (random weights" in notes[0]
    # the released decoder's widths (v1 and v3 config.json on the hub; issue 45), not the assumed 128..512 of before
    assert light.config.decoder_block_out_channels == (32, 64, 256, 512)
    assert not light.follow_vae_tiling  # the request's vae_tiling is not "on"
    cfg.vae_decoder, vae2 = "stock", stock_vae()
    choose_decoder(cfg, vae2, notes)
    assert not uses_light_decoder(vae2)


def test_missing_folder_auto_notes_light_refuses(tmp_path):
    preset = load_preset("hummingbird-xt")
    cfg = SimpleNamespace(source=SimpleNamespace(preset=preset, kind="dir", location=str(tmp_path)),
                          vae_decoder="auto", random_weights=False, seed=0, model=str(tmp_path))
    notes: list[str] = []
    choose_decoder(cfg, stock_vae(), notes)
    assert "no light VAE decoder at vae/wan22_v1_tiling_16_12/" in notes[0] and "stock VAE decoder runs" in notes[0]
    cfg.vae_decoder = "light"
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
