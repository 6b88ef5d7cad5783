"""vsagen.commands.profile_config: `resolve_profile` (a `vsagen profile` request: flag > preset default, the backend and
tile-fit lists, formats, output files, `--kernels`) and `ProfileConfig`."""

from __future__ import annotations

import pytest

from vsagen.errors import BadInput
from vsagen.commands.profile_config import PROFILE_FORMATS, ProfileConfig, resolve_profile

TINY_STEPS = 4  # vsagen/preset_data/tiny.toml [defaults] steps: the projection target


def test_resolve_profile_defaults_and_per_backend_settings():
    from vsagen.commands.profile_config import PROFILE_STEPS, PROFILE_WARMUP, resolve_profile

    cfg = resolve_profile(model="tiny")
    assert [b.name for b in cfg.backends] == ["full", "vsa"]
    assert cfg.backends[0].sparsity is None and cfg.backends[1].sparsity == 0.875
    assert (cfg.steps, cfg.warmup, cfg.full_steps) == (PROFILE_STEPS, PROFILE_WARMUP, TINY_STEPS)
    assert cfg.tile_fits == ("partial",) and cfg.fmt == "table" and cfg.stock and not cfg.kernels
    assert (cfg.device, cfg.dtype, cfg.out, cfg.plot) == ("cpu", "fp32", None, None)
    cfg = resolve_profile(model="tiny", attn=" vsa , full", sparsity=0.5, attn_impl="torch", tile_fit="crop,partial")
    assert [(b.name, b.sparsity, b.impl) for b in cfg.backends] == [("vsa", 0.5, "torch"), ("full", None, "auto")]
    assert cfg.tile_fits == ("crop", "partial")
    cfg = resolve_profile(model="wan2.1-t2v-1.3b", kernels=True, device="cpu", frames=9, height=128, width=128)
    assert (cfg.heads, cfg.head_dim, cfg.full_steps) == (12, 128, 50)
    cfg = resolve_profile(model="tiny", ulysses=2, cfg_parallel=True, tile_fit="partial,crop")  # 300 and 768 tokens
    assert cfg.processes == 4 and (cfg.summary()["ulysses"], cfg.summary()["cfg_parallel"]) == (2, True)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(attn="vsa,full,vsa"), "'vsa' twice"), (dict(attn=" , "), "empty entry"), (dict(fmt="xml"), "--format"),
    (dict(tile_fit="partial,pad"), "'pad'"), (dict(kernels=True, steps=2), "--steps"), (dict(steps=0), "--steps"),
    (dict(warmup=-1), "--warmup"), (dict(prompt=" "), "--prompt is empty"),
    (dict(kernels=True, cfg_parallel=True), "drop --gpus / --ulysses / --cfg-parallel"), (dict(ulysses=0), "at least 1"),
    (dict(ulysses=2, compile=True), "--compile"), (dict(cfg_parallel=True, guidance=1.0), "--guidance 1"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_requests_are_one_line(kwargs, needle):
    with pytest.raises(BadInput) as info:
        resolve_profile(model="tiny", **kwargs)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_files_and_summary(tmp_path):
    cfg = resolve_profile(model="tiny", fmt="csv", out=tmp_path / "r.csv", plot=tmp_path / "p.png", steps=1,
                          warmup=0)
    assert cfg.fmt == "csv" and cfg.fmt in PROFILE_FORMATS
    assert (cfg.out, cfg.plot, cfg.steps, cfg.warmup) == (tmp_path / "r.csv", tmp_path / "p.png", 1, 0)
    assert (cfg.offload, cfg.vae_tiling) == ("none", "off") and not cfg.conditioned
    s = cfg.summary()
    assert s["out"] == str(tmp_path / "r.csv") and s["plot"] == str(tmp_path / "p.png")
    assert s["model_source"] == {"kind": "tiny", "location": "", "preset": "tiny", "transformer_files": []}
    assert [b["name"] for b in s["backends"]] == ["full", "vsa"] and s["tile_fits"] == ["partial"]
    assert "offload" not in s and "vae_tiling" not in s and "source" not in s
    assert resolve_profile(model="tiny-i2v").conditioned
    with pytest.raises(ValueError, match="never decodes"):
        ProfileConfig(**{**{f: getattr(cfg, f) for f in cfg.__dataclass_fields__}, "vae_tiling": "on"})


@pytest.mark.parametrize("attn", ["vsa,vsa:sparsity=0.875", "vsa:sparsity=0.5,vsa:sparsity=0.50",
                                  "vsa:sparsity=0.5,vsa: sparsity=0.5", "full,vsa:impl=auto,vsa"])
def test_entries_that_come_to_one_configuration_are_refused(attn):
    """Written differently, the same configuration would be measured twice and the tile-fit comparison would report
    the first one's numbers for both (new-user trial)."""
    with pytest.raises(BadInput, match="twice"):
        resolve_profile(model="tiny", attn=attn)


def test_a_preset_impl_holds_unless_attn_impl_is_given():
    """`--attn-impl auto` is the flag's default, so a preset's [attention.vsa] impl is not overridden by it."""
    import vsagen.request.backends as config
    from vsagen.attention import resolve_spec
    from vsagen.attention.spec import parse_entry

    tables = {"vsa": {"sparsity": 0.875, "impl": "torch"}}
    assert config.backend_specs((parse_entry("vsa"),), tables, None, "auto", "vsa")[0].impl == "torch"
    assert config.backend_specs((parse_entry("vsa"),), tables, None, "triton", "vsa")[0].impl == "triton"
    assert resolve_spec("vsa", preset=tables).impl == "torch"


def test_kernels_refuses_a_weights_file(tmp_path):
    """`--kernels` times the attention on random inputs: a gate file in an entry would be ignored, so it is refused."""
    import torch
    from safetensors.torch import save_file

    f = tmp_path / "g.safetensors"
    save_file({"blocks.0.attn1.to_gate_compress.weight": torch.ones(32, 32)}, f)
    with pytest.raises(BadInput, match="--kernels times the attention on random inputs without trained weights"):
        resolve_profile(model="tiny", attn=f"full,vsa:gate_weights={f}", kernels=True)
