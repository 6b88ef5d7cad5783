"""vsagen.models.presets: bundled TOML presets, strict parsing (unknown / missing keys are errors), model-card
values."""

from __future__ import annotations

import copy
import tomllib
from dataclasses import FrozenInstanceError, fields

import pytest

from vsagen.errors import BadInput
from vsagen.models.presets import (LAST_IMAGE_IGNORED, LAST_IMAGE_NONE, LAST_IMAGE_ONE_IMAGE, LAST_IMAGE_OPTIONAL,
                                   LAST_IMAGE_REQUIRED, GenerationDefaults, clip_tokens, load_preset, parse_preset,
                                   preset_for_hub_id, preset_for_transformer_config, preset_names)
from vsagen.models.presets import _preset_dir

BUNDLED = ["fastwan2.1-t2v-1.3b", "fastwan2.1-t2v-14b-480p", "fastwan2.2-ti2v-5b", "fastwan2.2-ti2v-5b-vsa",
           "hummingbird-xt", "lightx2v-wan2.1-t2v-14b", "lightx2v-wan2.2-i2v-a14b", "tiny", "tiny-a14b",
           "tiny-flf2v", "tiny-i2v", "tiny-i2v-a14b", "tiny-ti2v", "turbowan2.1-t2v-1.3b", "turbowan2.1-t2v-1.3b-fv",
           "turbowan2.1-t2v-1.3b-quant", "turbowan2.1-t2v-14b-480p", "turbowan2.1-t2v-14b-720p",
           "turbowan2.1-t2v-14b-fv",
           "turbowan2.2-i2v-a14b", "turbowan2.2-i2v-a14b-fv", "turbowan2.2-i2v-a14b-quant", "wan2.1-flf2v-14b-720p",
           "wan2.1-i2v-14b-480p",
           "wan2.1-i2v-14b-720p", "wan2.1-t2v-1.3b", "wan2.1-t2v-14b", "wan2.1-vsa-t2v-14b-720p", "wan2.2-i2v-a14b",
           "wan2.2-t2v-a14b", "wan2.2-ti2v-5b"]
# attention: filled from [attention.*] tables, not [defaults]; sampler and attn: published checkpoints' presets
OPTIONAL_DEFAULTS = {"guidance_2", "attention", "sampler", "attn", "decode_dtype", "image_size"}


def raw(name: str) -> dict:
    """A bundled preset's parsed TOML (a fresh copy to modify)."""
    return tomllib.loads((_preset_dir() / f"{name}.toml").read_text())


def test_bundled_preset_names():
    assert preset_names() == BUNDLED


@pytest.mark.parametrize("name", BUNDLED)
def test_every_bundled_preset_loads(name):
    p = load_preset(name)
    assert p.name == name
    assert p.pipeline == ("WanImageToVideoPipeline" if "-i2v" in name or "-flf2v" in name else "WanPipeline")
    assert isinstance(p.defaults, GenerationDefaults)
    d = p.defaults
    assert d.frames >= 1 and (d.frames - 1) % p.vae_stride_temporal == 0
    assert d.height % p.pixel_multiple == 0 and d.width % p.pixel_multiple == 0
    assert d.steps >= 1 and d.fps >= 1 and (d.sparsity is None or 0 <= d.sparsity < 1)  # None: sla presets (topk)
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


# Wan's own default negative prompt (Wan-Video/Wan2.1 and Wan2.2, wan/configs/shared_config.py sample_neg_prompt)
WAN_NEGATIVE = ("色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，JPEG压缩残留，丑陋的，残缺的，"
                "多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，手指融合，静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走")


def test_negative_prompts_as_published():
    """Issue 48 item 3: every Wan CFG preset carries Wan's default negative prompt (its generate.py passes it to
    every CFG run), FastVideo's VSA 14B its inference config's English one; few-step presets (CFG off) and the
    tiny models none; a --negative-prompt, "" included, replaces it."""
    from vsagen.request.options import request_options
    from vsagen.request.resolve import NONE, resolve
    from vsagen.models.sources import resolve_model

    for name in preset_names():
        d = load_preset(name).defaults
        if name.startswith("wan2.") and "vsa" not in name:
            assert d.negative_prompt == WAN_NEGATIVE, name
        elif name == "wan2.1-vsa-t2v-14b-720p":
            assert d.negative_prompt.startswith("Bright tones, overexposed, static, blurred details, subtitles, ")
            assert d.negative_prompt.endswith(", three legs, many people in the background, walking backwards")
            assert d.negative_prompt.count(",") == WAN_NEGATIVE.count("，")  # the same 30 terms, translated
        else:
            assert d.negative_prompt == "", name
    source = resolve_model("wan2.1-t2v-1.3b")
    for given, want in ((None, WAN_NEGATIVE), ("", ""), ("rain", "rain")):
        options = request_options(model="wan2.1-t2v-1.3b", negative_prompt=given, random_weights=True)
        assert resolve(source, options, prompt="x", backends=NONE).negative_prompt == want


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


def grid(p):
    """The post-patch latent grid of a preset's default size."""
    d = p.defaults
    return ((d.frames - 1) // p.vae_stride_temporal + 1, d.height // p.pixel_multiple, d.width // p.pixel_multiple)


def test_wan22_ti2v_5b_preset():
    p = load_preset("wan2.2-ti2v-5b")
    d = p.defaults
    assert (d.height, d.width, d.frames, d.steps, d.fps, d.guidance, d.flow_shift) == (704, 1280, 121, 50, 24, 5.0, 5.0)
    assert p.hub_id == "Wan-AI/Wan2.2-TI2V-5B-Diffusers" and p.expand_timesteps and p.experts == 1
    t = p.transformer
    assert (t["num_layers"], t["num_attention_heads"], t["ffn_dim"], t["in_channels"]) == (30, 24, 14336, 48)
    assert p.vae["z_dim"] == 48 and p.vae["decoder_base_dim"] == 256 and p.vae_stride_spatial == 16
    assert p.pixel_multiple == 32 and grid(p) == (31, 22, 40)  # issue 4: the 5B grid at 704x1280x121


@pytest.mark.parametrize("name,size,shift", [("wan2.1-i2v-14b-480p", (480, 832), 3.0),
                                             ("wan2.1-i2v-14b-720p", (720, 1280), 5.0)])
def test_wan21_i2v_presets(name, size, shift):
    p = load_preset(name)
    d = p.defaults
    assert p.image_to_video and p.experts == 1 and (d.height, d.width) == size and d.flow_shift == shift
    assert (d.frames, d.steps, d.fps, d.guidance) == (81, 40, 16, 5.0)
    t = p.transformer
    assert t["in_channels"] == 36 and t["image_dim"] == 1280 and t["added_kv_proj_dim"] == 5120
    assert t["num_layers"] == 40 and t["num_attention_heads"] == 40
    assert p.image_encoder["hidden_size"] == t["image_dim"]  # CLIP ViT-H/14 width feeds the image branch
    assert max(d.max_sequence_length, 512) == 512  # the image branch assumes 512 text tokens


@pytest.mark.parametrize("name,pipeline,ratio,g,g2,shift,in_ch", [
    ("wan2.2-t2v-a14b", "WanPipeline", 0.875, 4.0, 3.0, 12.0, 16),
    ("wan2.2-i2v-a14b", "WanImageToVideoPipeline", 0.9, 3.5, 3.5, 5.0, 36)])
def test_wan22_a14b_presets(name, pipeline, ratio, g, g2, shift, in_ch):
    p = load_preset(name)
    d = p.defaults
    assert p.pipeline == pipeline and p.experts == 2 and p.boundary_ratio == ratio
    assert (d.guidance, d.guidance_2, d.flow_shift, d.steps, d.fps) == (g, g2, shift, 40, 16)
    assert p.transformer == p.transformer_2 and p.transformer["in_channels"] == in_ch
    assert p.transformer.get("image_dim") is None and p.image_encoder is None  # no CLIP branch in Wan2.2 I2V
    assert grid(p) == (21, 45, 80)


def test_wan21_flf2v_preset_is_the_i2v_14b_with_two_clip_images():
    p = load_preset("wan2.1-flf2v-14b-720p")
    d = p.defaults
    assert p.hub_id == "Wan-AI/Wan2.1-FLF2V-14B-720P-Diffusers" and p.image_to_video and p.experts == 1
    assert (d.height, d.width, d.frames, d.steps, d.guidance, d.flow_shift, d.fps) == (720, 1280, 81, 50, 5.0, 16.0, 16)
    i2v = load_preset("wan2.1-i2v-14b-720p")
    assert {k: v for k, v in p.transformer.items() if k != "pos_embed_seq_len"} == i2v.transformer
    assert p.image_encoder == i2v.image_encoder and p.vae == i2v.vae
    assert clip_tokens(p.image_encoder) == 257 and p.transformer["pos_embed_seq_len"] == 2 * 257
    assert preset_for_hub_id(p.hub_id) == p


def test_tiny_flf2v_is_tiny_i2v_with_two_clip_images():
    p, i2v = load_preset("tiny-flf2v"), load_preset("tiny-i2v")
    assert p.source == "tiny" and p.image_to_video
    assert {k: v for k, v in p.transformer.items() if k != "pos_embed_seq_len"} == i2v.transformer
    assert p.image_encoder == i2v.image_encoder and p.defaults == i2v.defaults
    assert clip_tokens(p.image_encoder) == 5 and p.transformer["pos_embed_seq_len"] == 10  # 32 px / 16 px: 4 + 1


def test_tiny_i2v_a14b_is_the_wan22_i2v_family():
    p, real = load_preset("tiny-i2v-a14b"), load_preset("wan2.2-i2v-a14b")
    assert p.source == "tiny" and p.image_to_video and p.experts == 2 and p.transformer == p.transformer_2
    assert p.boundary_ratio == real.boundary_ratio and p.transformer["in_channels"] == 36
    assert p.transformer.get("image_dim") is None and p.image_encoder is None


@pytest.mark.parametrize("name,use", [
    ("tiny", LAST_IMAGE_NONE), ("wan2.2-t2v-a14b", LAST_IMAGE_NONE),
    ("tiny-flf2v", LAST_IMAGE_REQUIRED), ("wan2.1-flf2v-14b-720p", LAST_IMAGE_REQUIRED),
    ("tiny-i2v-a14b", LAST_IMAGE_OPTIONAL), ("wan2.2-i2v-a14b", LAST_IMAGE_OPTIONAL),
    ("tiny-i2v", LAST_IMAGE_ONE_IMAGE), ("wan2.1-i2v-14b-480p", LAST_IMAGE_ONE_IMAGE),
    ("tiny-ti2v", LAST_IMAGE_IGNORED), ("wan2.2-ti2v-5b", LAST_IMAGE_IGNORED)])
def test_which_presets_take_a_last_image(name, use):
    assert load_preset(name).last_image == use


@pytest.mark.parametrize("edit,match", [
    (lambda d: d["transformer"].update(pos_embed_seq_len=514), "2 x the .image_encoder.'s 5 tokens per image = 10"),
    (lambda d: d["transformer"].pop("image_dim"), "image_dim"),
    (lambda d: (d.update(pipeline="WanPipeline"), d.pop("image_encoder")), "WanImageToVideoPipeline"),
], ids=["wrong-token-count", "no-clip-branch", "text-to-video"])
def test_pos_embed_seq_len_is_checked(edit, match):
    data = copy.deepcopy(raw("tiny-flf2v"))
    edit(data)
    with pytest.raises(BadInput, match=match):
        parse_preset(data, "x.toml")


def test_local_flf2v_and_i2v_checkpoints_do_not_match_each_others_preset():
    """The FLF2V transformer is the I2V-14B one plus pos_embed_seq_len: a local checkpoint of either finds its own
    preset, whatever its folder is called."""
    idx = {"_class_name": "WanImageToVideoPipeline", "transformer": ["diffusers", "WanTransformer3DModel"]}
    flf = dict(load_preset("wan2.1-flf2v-14b-720p").transformer)
    i2v = dict(load_preset("wan2.1-i2v-14b-720p").transformer)
    for folder in ("", "Wan2.1-I2V-14B-720P-Diffusers", "Wan2.1-FLF2V-14B-720P-Diffusers"):
        assert preset_for_transformer_config(flf, idx, folder).name == "wan2.1-flf2v-14b-720p"
        # diffusers writes `"pos_embed_seq_len": null` into an I2V checkpoint's config.json
        for config in (i2v, dict(i2v, pos_embed_seq_len=None)):
            assert preset_for_transformer_config(config, idx, folder).name in ("wan2.1-i2v-14b-480p",
                                                                                "wan2.1-i2v-14b-720p")
    assert preset_for_transformer_config(dict(flf, pos_embed_seq_len=2 * 50), idx) is None  # another CLIP size


def test_local_checkpoints_find_their_preset_by_family_and_folder_name():
    """Presets that share a transformer architecture are told apart by model_index.json (pipeline class,
    second expert) and, for identical families (Wan2.1 I2V 480p / 720p), by the download folder's name."""
    t14 = dict(load_preset("wan2.1-t2v-14b").transformer)
    one = {"_class_name": "WanPipeline", "transformer": ["diffusers", "WanTransformer3DModel"]}
    two = dict(one, transformer_2=["diffusers", "WanTransformer3DModel"], boundary_ratio=0.875)
    assert preset_for_transformer_config(t14, one).name == "wan2.1-t2v-14b"
    assert preset_for_transformer_config(t14, two).name == "wan2.2-t2v-a14b"
    i2v = dict(load_preset("wan2.1-i2v-14b-480p").transformer)
    idx = {"_class_name": "WanImageToVideoPipeline", "transformer": ["diffusers", "WanTransformer3DModel"]}
    assert preset_for_transformer_config(i2v, idx, "Wan2.1-I2V-14B-720P-Diffusers").name == "wan2.1-i2v-14b-720p"
    assert preset_for_transformer_config(i2v, idx, "wan2.1-i2v-14b-480p").name == "wan2.1-i2v-14b-480p"
    assert preset_for_transformer_config(i2v, idx, "my-model").name == "wan2.1-i2v-14b-480p"  # first by name
    a14b_i2v = dict(load_preset("wan2.2-i2v-a14b").transformer)
    assert preset_for_transformer_config(a14b_i2v, dict(idx, transformer_2=two["transformer_2"])).name == \
        "wan2.2-i2v-a14b"
    assert preset_for_transformer_config(a14b_i2v, idx) is None  # one expert of that architecture: no preset
    five = dict(load_preset("wan2.2-ti2v-5b").transformer)
    assert preset_for_transformer_config(five, dict(one, expand_timesteps=True)).name == "wan2.2-ti2v-5b"
    assert preset_for_transformer_config(five, one) is None


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


def test_rocm_vsa_takes_vsa_s_table_in_every_bundled_preset():
    """`rocm-vsa` is `vsa` with another kernel profile: every preset that tunes `vsa` gives it the same options
    (a preset that forgot it would run rocm-vsa at the default sparsity)."""
    for name in preset_names():
        tables = load_preset(name).defaults.attention
        if "vsa" in tables:
            assert tables.get("rocm-vsa") == tables["vsa"], name


# Issue 30: what the published sparse / distilled checkpoints' authors run (REFERENCE.md, "Published sparse-attention
# checkpoints": FastVideo @2f3d407, AMD-AGI/HummingbirdXT @63b54d1).
PUBLISHED = {
    "fastwan2.1-t2v-1.3b": ("FastVideo/FastWan2.1-T2V-1.3B-Diffusers", "wan2.1-t2v-1.3b", "dmd", "vsa", 0.8,
                            (480, 832, 81, 16)),
    "fastwan2.1-t2v-14b-480p": ("FastVideo/FastWan2.1-T2V-14B-480P-Diffusers", "wan2.1-t2v-14b", "dmd", "vsa", 0.9,
                                (480, 832, 81, 16)),
    "wan2.1-vsa-t2v-14b-720p": ("FastVideo/Wan2.1-VSA-T2V-14B-720P-Diffusers", "wan2.1-t2v-14b", "default", "vsa",
                                0.9, (720, 1280, 81, 16)),
    "fastwan2.2-ti2v-5b": ("FastVideo/FastWan2.2-TI2V-5B-FullAttn-Diffusers", "wan2.2-ti2v-5b", "dmd", "full", None,
                           (704, 1280, 121, 24)),
    "fastwan2.2-ti2v-5b-vsa": ("FastVideo/FastWan2.2-TI2V-5B-Diffusers", "wan2.2-ti2v-5b", "dmd", "vsa", 0.8,
                               (704, 1280, 121, 24)),
    "hummingbird-xt": ("amd/HummingbirdXT", "wan2.2-ti2v-5b", "dmd-hummingbird", "full", None, (704, 1280, 121, 24)),
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_checkpoint_presets_say_how_their_authors_run_them(name):
    hub_id, base, sampler, attn, sparsity, size = PUBLISHED[name]
    p, b = load_preset(name), load_preset(base)
    d = p.defaults
    assert p.hub_id == hub_id and preset_for_hub_id(hub_id) == p
    assert p.transformer == b.transformer and p.vae == b.vae  # the architecture they were fine-tuned from
    assert (p.expand_timesteps, p.ti2v) == (b.expand_timesteps, b.ti2v)
    assert (d.height, d.width, d.frames, d.fps) == size
    assert (d.sampler, d.attn) == (sampler, attn)
    if sparsity is not None:
        assert d.attention[attn]["sparsity"] == sparsity
    assert p.checkpoint_class == ("WanDMDPipeline" if hub_id.startswith("FastVideo/FastWan") else None)
    if name == "hummingbird-xt":
        assert d.flow_shift == 10.0  # infer/run_t2v.sh: --shift 10
        assert (p.transformer_layout, p.components) == ("wan", "Wan-AI/Wan2.2-TI2V-5B-Diffusers")
    else:
        assert p.transformer_layout == "diffusers"


def test_a_published_distill_never_stands_in_for_a_plain_checkpoint_of_its_architecture():
    """A local 1.3B folder is the Wan release unless its model_index names FastVideo's class or its folder the
    FastWan repository (the distill's preset sorts first by name)."""
    config = dict(load_preset("wan2.1-t2v-1.3b").transformer)
    plain = {"_class_name": "WanPipeline"}
    assert preset_for_transformer_config(config, plain, "my-wan").name == "wan2.1-t2v-1.3b"
    assert preset_for_transformer_config(config, None, "").name == "wan2.1-t2v-1.3b"
    assert preset_for_transformer_config(config, {"_class_name": "WanDMDPipeline"}, "x").name == "fastwan2.1-t2v-1.3b"
    assert preset_for_transformer_config(config, plain, "FastWan2.1-T2V-1.3B-Diffusers").name == "fastwan2.1-t2v-1.3b"
    assert preset_for_transformer_config(config, {"_class_name": "OtherPipeline"}, "x") is None
    # resolve_model reads the index as the stock class it is built as: the class as written still picks FastWan's
    # preset (else a FastWan folder not named after its repository ran the 50-step scheduler)
    assert preset_for_transformer_config(config, plain, "x", checkpoint_class="WanDMDPipeline").name == \
        "fastwan2.1-t2v-1.3b"


def test_the_two_fastwan_5b_folders_get_their_own_presets():
    """FastVideo publishes the 5B distill twice (FullAttn and VSA, both WanDMDPipeline): a folder named after either
    repository gets that one's preset, though one repository name is part of the other's."""
    config = dict(load_preset("wan2.2-ti2v-5b").transformer)
    index = {"_class_name": "WanDMDPipeline", "expand_timesteps": True}
    pick = (lambda folder: preset_for_transformer_config(config, index, folder).name)
    assert pick("FastWan2.2-TI2V-5B-FullAttn-Diffusers") == "fastwan2.2-ti2v-5b"
    assert pick("FastWan2.2-TI2V-5B-Diffusers") == "fastwan2.2-ti2v-5b-vsa"
    assert pick("my-5b") == "fastwan2.2-ti2v-5b"  # a folder named after neither: the first by name
    assert load_preset("fastwan2.2-ti2v-5b-vsa").defaults.attention["vsa"] == {
        "sparsity": 0.8, "tile": "4x4x4", "topk_count": "tokens"}


@pytest.mark.parametrize("table,value,message", [
    ("defaults", {"sampler": "nope"}, "sampler must be one of"),
    ("defaults", {"attn": "nope"}, "attn must name a backend"),
    ("defaults", {"image_size": "nope"}, "image_size must be one of fixed, adaptive"),
    ("top", {"checkpoint_class": ""}, "checkpoint_class must be a pipeline class name")])
def test_bad_sampler_attn_or_checkpoint_class_in_a_preset_is_refused(table, value, message):
    data = raw("fastwan2.1-t2v-1.3b")
    (data["defaults"] if table == "defaults" else data).update(value)
    with pytest.raises(BadInput, match=message):
        parse_preset(data, "x.toml")


def test_a_transformer_layout_preset_names_its_components():
    data = raw("wan2.2-ti2v-5b")
    data.update(name="x", hub_id="amd/HummingbirdXT", transformer_layout="wan",
                components="Wan-AI/Wan2.2-TI2V-5B-Diffusers", transformer_subfolder="hm_2.2_5B")
    p = parse_preset(data, "x.toml")
    assert (p.transformer_layout, p.components, p.transformer_subfolder) == (
        "wan", "Wan-AI/Wan2.2-TI2V-5B-Diffusers", "hm_2.2_5B")
    assert parse_preset(raw("wan2.2-ti2v-5b"), "x.toml").transformer_layout == "diffusers"
    for edit, match in [({"transformer_layout": "comfy"}, "transformer_layout must be 'diffusers' or 'wan'"),
                        ({"components": ""}, "needs components = '<org/name>'"),
                        ({"transformer_layout": "diffusers"}, "go with transformer_layout = 'wan'"),
                        ({"source": "tiny", "text_encoder": raw("tiny")["text_encoder"]}, "one-expert hub presets")]:
        with pytest.raises(BadInput, match=match):
            parse_preset({**data, **edit}, "x.toml")


@pytest.mark.parametrize("key,value", [("vae_dtype", "float32"), ("decode_dtype", "int8"), ("decode_dtype", 16)])
def test_vae_dtypes_are_checked(key, value):
    data = copy.deepcopy(raw("wan2.1-t2v-1.3b"))
    data["defaults"][key] = value
    with pytest.raises(BadInput, match=f"{key} must be one of same, fp32, bf16, fp16"):
        parse_preset(data, "x.toml")


@pytest.mark.parametrize("name", BUNDLED)
def test_decode_dtype_is_bf16_where_measured(name):
    """Issue 32 item 2: the real text-to-video presets decode in bf16 (measured 47-50 dB from float32 on both Wan VAEs,
    BENCHMARKS.md 2026-12-05); image-to-video presets (the VAE encodes too), Hummingbird-XT (its light decoder was
    measured in float32 only) and the tiny models (the pipeline's dtype) have none."""
    p = load_preset(name)
    measured = (p.source == "hub" and p.pipeline == "WanPipeline" and name != "hummingbird-xt")
    assert p.defaults.decode_dtype == ("bf16" if measured else None)
    assert p.defaults.vae_dtype == ("fp32" if p.source == "hub" else "same")
