"""vsagen.presets: bundled TOML presets, strict parsing (unknown / missing keys are errors), model-card values."""

from __future__ import annotations

import copy
import tomllib
from dataclasses import FrozenInstanceError, fields

import pytest

from vsagen.errors import BadInput
from vsagen.presets import (GenerationDefaults, load_preset, parse_preset, preset_for_hub_id,
                            preset_for_transformer_config, preset_names)
from vsagen.presets import _preset_dir

BUNDLED = ["tiny", "tiny-a14b", "tiny-i2v", "tiny-ti2v", "wan2.1-t2v-1.3b", "wan2.1-t2v-14b"]
OPTIONAL_DEFAULTS = {"guidance_2"}


def raw(name: str) -> dict:
    """A bundled preset's parsed TOML (a fresh copy to modify)."""
    return tomllib.loads((_preset_dir() / f"{name}.toml").read_text())


def test_bundled_preset_names():
    assert preset_names() == BUNDLED


@pytest.mark.parametrize("name", BUNDLED)
def test_every_bundled_preset_loads(name):
    p = load_preset(name)
    assert p.name == name
    assert p.pipeline == ("WanImageToVideoPipeline" if name == "tiny-i2v" else "WanPipeline")
    assert isinstance(p.defaults, GenerationDefaults)
    d = p.defaults
    assert d.frames >= 1 and (d.frames - 1) % p.vae_stride_temporal == 0
    assert d.height % p.pixel_multiple == 0 and d.width % p.pixel_multiple == 0
    assert d.steps >= 1 and d.fps >= 1 and 0 <= d.sparsity < 1
    assert d.vae_dtype in ("same", "fp32", "bf16", "fp16")
    assert p.patch_size == (1, 2, 2)
    # The dict round-trips through parse_preset unchanged.
    assert parse_preset(raw(name), f"{name}.toml") == p


@pytest.mark.parametrize("name", BUNDLED)
def test_preset_architectures_build_in_diffusers(name):
    """[transformer] / [vae] are constructor kwargs of diffusers' classes (checked on the meta device)."""
    import torch
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    p = load_preset(name)
    with torch.device("meta"):
        t = WanTransformer3DModel(**p.transformer)
        vae = AutoencoderKLWan(**p.vae)
        if p.transformer_2 is not None:
            WanTransformer3DModel(**p.transformer_2)
    assert len(t.blocks) == p.transformer["num_layers"]
    # the preset's strides are the VAE's own, and the latent channels agree
    assert (vae.config.scale_factor_temporal, vae.config.scale_factor_spatial) == (p.vae_stride_temporal,
                                                                                 p.vae_stride_spatial)
    assert p.transformer["out_channels"] == vae.config.z_dim
    # image to video: noise + (4 mask + z_dim image latent) condition channels
    assert p.transformer["in_channels"] == (2 * vae.config.z_dim + 4 if p.image_to_video else vae.config.z_dim)
    assert len(vae.config.latents_mean) == len(vae.config.latents_std) == vae.config.z_dim


def test_presets_are_frozen():
    p = load_preset("tiny")
    with pytest.raises(FrozenInstanceError):
        p.name = "other"  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        p.defaults.steps = 1  # type: ignore[misc]


def test_wan21_preset_matches_model_card():
    p = load_preset("wan2.1-t2v-1.3b")
    d = p.defaults
    assert (d.height, d.width) == (480, 832)
    assert d.frames == 81 and d.steps == 50
    assert d.guidance == 5.0 and d.flow_shift == 3.0 and d.fps == 16
    assert p.source == "hub" and p.hub_id == "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
    t = p.transformer
    assert t["num_layers"] == 30 and t["num_attention_heads"] == 12 and t["attention_head_dim"] == 128
    assert t["ffn_dim"] == 8960 and t["text_dim"] == 4096 and t["in_channels"] == t["out_channels"] == 16
    assert (p.vae_stride_temporal, p.vae_stride_spatial) == (4, 8) and p.pixel_multiple == 16
    assert p.text_encoder is None


def test_wan21_14b_preset_matches_the_checkpoint_config():
    p = load_preset("wan2.1-t2v-14b")
    d = p.defaults
    assert (d.height, d.width, d.frames, d.steps, d.fps) == (720, 1280, 81, 50, 16)
    assert d.guidance == 5.0 and d.flow_shift == 5.0  # diffusers' Wan examples: shift 5.0 at 720p
    assert p.hub_id == "Wan-AI/Wan2.1-T2V-14B-Diffusers"
    t = p.transformer
    assert (t["num_layers"], t["num_attention_heads"], t["attention_head_dim"], t["ffn_dim"]) == (40, 40, 128, 13824)
    assert t["text_dim"] == 4096 and t["rope_max_seq_len"] == 1024
    # the 720p grid of REFERENCE.md: 21 x 45 x 80 post-patch tokens
    assert ((d.frames - 1) // 4 + 1, d.height // p.pixel_multiple, d.width // p.pixel_multiple) == (21, 45, 80)
    # both hub presets are told apart by their transformer configs
    assert preset_for_transformer_config(dict(t)) == p
    assert preset_for_transformer_config(dict(load_preset("wan2.1-t2v-1.3b").transformer)) != p


def test_tiny_preset_is_offline_and_has_partial_tiles():
    p = load_preset("tiny")
    assert p.source == "tiny" and p.hub_id == "" and p.text_encoder is not None
    d = p.defaults
    grid = ((d.frames - 1) // 4 + 1, d.height // 16, d.width // 16)
    assert grid == (5, 6, 10) and any(g % 4 for g in grid)


def test_lookup_by_hub_id_and_transformer_config():
    wan = load_preset("wan2.1-t2v-1.3b")
    assert preset_for_hub_id("Wan-AI/Wan2.1-T2V-1.3B-Diffusers") == wan
    assert preset_for_hub_id("some-org/some-model") is None
    assert preset_for_transformer_config(dict(wan.transformer)) == wan
    assert preset_for_transformer_config(dict(load_preset("tiny").transformer)) is None  # only hub presets


def test_unknown_preset_name():
    with pytest.raises(BadInput, match="tiny"):
        load_preset("no-such-preset")


# --------------------------------------------------------------------------------------------------------------
# Strict parsing


@pytest.mark.parametrize("table", [None, "defaults", "vae_stride"])
def test_unknown_key_is_an_error(table):
    data = raw("wan2.1-t2v-1.3b")
    (data if table is None else data[table])["surprise_key"] = 1
    with pytest.raises(BadInput, match="unknown key.*surprise_key"):
        parse_preset(data, "x.toml")


def test_misspelled_default_is_an_error_not_ignored():
    data = raw("tiny")
    data["defaults"]["guidence"] = data["defaults"].pop("guidance")
    with pytest.raises(BadInput, match="guidence"):
        parse_preset(data, "x.toml")


@pytest.mark.parametrize("key", sorted({"name", "description", "pipeline", "source", "hub_id", "defaults",
                                        "vae_stride", "transformer", "vae"}))
def test_missing_top_level_key_is_an_error(key):
    data = raw("wan2.1-t2v-1.3b")
    del data[key]
    with pytest.raises(BadInput, match=f"missing key.*{key}"):
        parse_preset(data, "x.toml")


@pytest.mark.parametrize("key", [f.name for f in fields(GenerationDefaults) if f.name not in OPTIONAL_DEFAULTS])
def test_missing_default_is_an_error(key):
    data = raw("tiny")
    del data["defaults"][key]
    with pytest.raises(BadInput, match=f"missing key.*{key}"):
        parse_preset(data, "x.toml")


def test_missing_vae_stride_entry_is_an_error():
    data = raw("tiny")
    del data["vae_stride"]["spatial"]
    with pytest.raises(BadInput, match="spatial"):
        parse_preset(data, "x.toml")


@pytest.mark.parametrize("edit,match", [
    (lambda d: d.update(source="s3"), "source"),
    (lambda d: d.update(pipeline="FluxPipeline"), "pipeline"),
    (lambda d: d.pop("text_encoder"), "text_encoder"),
], ids=["source", "pipeline", "tiny-without-text-encoder"])
def test_invalid_values_are_errors(edit, match):
    data = copy.deepcopy(raw("tiny"))
    edit(data)
    with pytest.raises(BadInput, match=match):
        parse_preset(data, "x.toml")


def test_hub_preset_may_omit_text_encoder():
    data = raw("wan2.1-t2v-1.3b")
    assert "text_encoder" not in data
    assert parse_preset(data, "x.toml").text_encoder is None
