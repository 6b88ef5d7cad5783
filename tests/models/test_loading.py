"""vsagen.models.loading: loading a pipeline (local directory, pickle weights, foreign libraries, trained VSA gates, hub
ids that are not cached, random weights), `vsagen.load_pipeline` (the same load from Python) and placing it
(`place_pipeline`: diffusers' offload APIs), all on CPU with the tiny model.

Every generation here runs in the session's private VSAGEN_CACHE (conftest's `vsagen_cache`), never ~/.cache.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import warnings
from pathlib import Path

import pytest
import conftest
from conftest import cached_locally
import torch

import vsagen
from vsagen.commands.generate_config import resolve_generate as resolve
from vsagen.errors import BadInput, ModelNotFound
from vsagen.media.video import read_mp4

# Loading a hub id that is not cached must fail without waiting on the network (no hub access here, and a
# user without network must not wait either). Observed ~0.1 s in-process; 15 s would mean a retry loop.
HUB_FAIL_FAST_S = 15.0
# Gated vs gate-free vsa outputs of the tiny transformer: the coarse branch with random gates adds terms of
# order 1 to every token; anything above 1e-3 shows the gates are used (observed ~1).
GATE_EFFECT_MIN = 1e-3
# Fewest denoising steps that still exercise the loop (CFG on: two transformer forwards a step).
STEPS = 2


def _log_sink(lines: list[str]):
    return lines.append


def copy_checkpoint(tiny_dir: Path, dest: Path) -> Path:
    """A private copy of the tiny checkpoint (the session's copy is shared by other tests)."""
    shutil.copytree(tiny_dir, dest)
    return dest


def transformer_inputs(seed: int = 5):
    """Fresh random inputs for the tiny transformer: latent (1, 16, 5, 12, 20) (grid 5x6x10, partial tiles)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 16, 5, 12, 20, generator=g), torch.rand(1, generator=g) * 999.0 + 0.5,
            torch.randn(1, 9, 32, generator=g))


def patched_output(transformer, attn: str, sparsity, inputs):
    from vsagen.attention import make_backend

    return conftest.patched_output(transformer, make_backend(attn, sparsity), inputs)


# --------------------------------------------------------------------------------------------------------------
# Local checkpoints: safetensors, pickle, foreign libraries


@pytest.mark.slow
def test_commands_without_videos_reword_the_tiny_note():
    """New-user trial: `vsagen search` said the tiny model's "videos show nothing of the prompt"; it makes none."""
    from vsagen.commands.search import SEARCHED
    from vsagen.models.loading import TINY_OUTPUTS, reworded_notes

    note = f"model 'tiny' has random weights: {TINY_OUTPUTS} (for plumbing and timing)"
    assert reworded_notes([note, "other"], SEARCHED) == [
        "model 'tiny' has random weights: its attention is not a trained model's, so what the search finds means "
        "nothing (for plumbing and timing)", "other"]


def test_local_checkpoint_directory_loads(vsagen_cache, tiny_pipe, tmp_path):
    from vsagen.commands.generate import generate

    ckpt = tmp_path / "my-wan"
    tiny_pipe.save_pretrained(ckpt, safe_serialization=True)
    cfg = resolve("a prompt", model=str(ckpt), steps=1, out=tmp_path / "dir.mp4")
    assert cfg.source.kind == "dir" and cfg.source.location == str(ckpt.resolve())
    assert cfg.source.preset.name == "tiny"  # the tiny architecture takes the tiny preset's settings
    result = generate(cfg, progress=False)
    assert result.summary["model"] == str(ckpt)
    assert result.summary["config"]["model_source"]["kind"] == "dir"
    assert read_mp4(result.video_path).shape == (17, 96, 160, 3)


def _make_pickle_only(ckpt: Path) -> dict:
    from safetensors.torch import load_file

    tdir = ckpt / "transformer"
    sd = load_file(tdir / "diffusion_pytorch_model.safetensors")
    torch.save(sd, tdir / "diffusion_pytorch_model.bin")
    (tdir / "diffusion_pytorch_model.safetensors").unlink()
    assert not list(tdir.glob("*.safetensors"))
    return sd


def test_pickle_only_weights_need_allow_pickle(vsagen_cache, tiny_dir, tmp_path):
    from vsagen.models.loading import load_model

    ckpt = copy_checkpoint(tiny_dir, tmp_path / "pickled")
    sd = _make_pickle_only(ckpt)
    cfg = resolve("a prompt", model=str(ckpt), out=tmp_path / "p.mp4")
    with pytest.raises(BadInput, match="--allow-pickle") as exc:
        load_model(cfg, log=lambda m: None)
    assert "transformer" in str(exc.value)
    # With --allow-pickle diffusers loads the .bin, and the weights are the ones that were saved.
    cfg = resolve("a prompt", model=str(ckpt), out=tmp_path / "p.mp4", allow_pickle=True)
    model = load_model(cfg, log=lambda m: None)
    state = model.pipe.transformer.state_dict()
    assert set(sd) <= set(state)
    assert all(torch.equal(state[k], v) for k, v in sd.items())


def test_pickle_refusal_through_generate_writes_nothing(vsagen_cache, tiny_dir, tmp_path):
    from vsagen.commands.generate import generate

    ckpt = copy_checkpoint(tiny_dir, tmp_path / "pickled")
    _make_pickle_only(ckpt)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    cfg = resolve("a prompt", model=str(ckpt), out=out_dir / "p.mp4")
    with pytest.raises(BadInput, match="--allow-pickle"):
        generate(cfg, progress=False)
    assert list(out_dir.iterdir()) == []


@pytest.mark.parametrize("edit", ["foreign-library", "foreign-pipeline"])
def test_foreign_components_are_refused(vsagen_cache, tiny_dir, tmp_path, edit):
    from vsagen.models.loading import load_model

    ckpt = copy_checkpoint(tiny_dir, tmp_path / "foreign")
    index_path = ckpt / "model_index.json"
    index = json.loads(index_path.read_text())
    if edit == "foreign-library":
        index["scheduler"] = ["evil_remote_code", "EvilScheduler"]
        match = "evil_remote_code"
    else:
        index["_class_name"] = "StableDiffusionPipeline"  # a class diffusers has (one it lacks is built as Wan's)
        match = "StableDiffusionPipeline"
    index_path.write_text(json.dumps(index))
    cfg = resolve("a prompt", model=str(ckpt), out=tmp_path / "f.mp4")
    with pytest.raises(BadInput, match=match):
        load_model(cfg, log=lambda m: None)


# --------------------------------------------------------------------------------------------------------------
# Trained VSA gates


@pytest.mark.slow
def test_trained_gates_are_loaded_and_used(vsagen_cache, tiny_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    from vsagen.commands.generate import generate
    from vsagen.models.loading import load_model

    ckpt = copy_checkpoint(tiny_dir, tmp_path / "gated")
    weights = ckpt / "transformer" / "diffusion_pytorch_model.safetensors"
    sd = load_file(weights)
    cfg_t = json.loads((ckpt / "transformer" / "config.json").read_text())
    dim = cfg_t["num_attention_heads"] * cfg_t["attention_head_dim"]
    g = torch.Generator().manual_seed(7)
    gates = {}
    for i in range(cfg_t["num_layers"]):
        gates[f"blocks.{i}.attn1.to_gate_compress.weight"] = torch.randn(dim, dim, generator=g) / dim ** 0.5
        gates[f"blocks.{i}.attn1.to_gate_compress.bias"] = torch.randn(dim, generator=g)
    save_file({**sd, **gates}, weights)

    cfg_gated = resolve("a prompt", model=str(ckpt), attn="vsa", sparsity=0.5, steps=1, out=tmp_path / "g.mp4")
    gated = load_model(cfg_gated, log=lambda m: None, backends=[cfg_gated.backend.build()])
    assert gated.weight_layers["vsa"] == cfg_t["num_layers"]
    assert any("gate" in n for n in gated.notes)
    for i, block in enumerate(gated.pipe.transformer.blocks):
        lin = block.attn1.to_gate_compress
        assert isinstance(lin, torch.nn.Linear) and (lin.in_features, lin.out_features) == (dim, dim)
        assert torch.equal(lin.weight, gates[f"blocks.{i}.attn1.to_gate_compress.weight"])
        assert torch.equal(lin.bias, gates[f"blocks.{i}.attn1.to_gate_compress.bias"])
        assert not hasattr(block.attn2, "to_gate_compress")

    cfg_plain = resolve("a prompt", model="tiny", attn="vsa", sparsity=0.5, steps=1, out=tmp_path / "n.mp4")
    plain = load_model(cfg_plain, log=lambda m: None, backends=[cfg_plain.backend.build()])
    assert plain.weight_layers["vsa"] == 0 and not any(hasattr(b.attn1, "to_gate_compress")
                                              for b in plain.pipe.transformer.blocks)

    # Weights loaded from the two files sit at differently aligned (memory-mapped) addresses, and CPU matmul
    # kernels may round differently for different alignments (observed 5e-7). Fresh copies make both
    # transformers' weights equally aligned, so the comparison below can be exact.
    for t in (gated.pipe.transformer, plain.pipe.transformer):
        for p in t.parameters():
            p.data = p.data.clone()
    inputs = transformer_inputs()
    vsa_gated = patched_output(gated.pipe.transformer, "vsa", 0.5, inputs)
    vsa_plain = patched_output(plain.pipe.transformer, "vsa", 0.5, inputs)
    assert (vsa_gated - vsa_plain).abs().max().item() > GATE_EFFECT_MIN
    # The dense backend ignores the gates: bitwise the gate-free output.
    full_gated = patched_output(gated.pipe.transformer, "full", None, inputs)
    full_plain = patched_output(plain.pipe.transformer, "full", None, inputs)
    assert torch.equal(full_gated, full_plain)

    # The run's notes (log and JSON) say the gates were loaded.
    lines: list[str] = []
    result = generate(cfg_gated, log=_log_sink(lines), progress=False)
    assert any("gate" in n for n in result.summary["timing"]["notes"])
    assert any("gate" in line for line in lines)
    assert any("gate" in n for n in json.loads(result.json_path.read_text())["timing"]["notes"])


# --------------------------------------------------------------------------------------------------------------
# Hub ids that are not available here


@pytest.mark.parametrize("model,hub_id", [("some-org/some-model", "some-org/some-model"),
                                          ("wan2.1-t2v-1.3b", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers")])
def test_missing_hub_model_fails_fast(vsagen_cache, tmp_path, model, hub_id):
    from vsagen.commands.generate import generate

    if cached_locally(hub_id):
        pytest.skip(f"{hub_id} is in the local Hugging Face cache")
    cfg = resolve("a prompt", model=model, out=tmp_path / "hub.mp4", steps=1)
    assert cfg.source.kind == "hub" and cfg.source.location == hub_id
    t0 = time.perf_counter()
    with pytest.raises(ModelNotFound) as exc:
        generate(cfg, progress=False)
    elapsed = time.perf_counter() - t0
    msg = str(exc.value)
    assert model in msg and hub_id in msg
    assert "--model tiny" in msg
    # the installed huggingface_hub ships `hf`, not `huggingface-cli`; only preset architectures can be timed
    assert f"hf download {hub_id}" in msg and "huggingface-cli" not in msg
    assert ("--random-weights" in msg) == (model == "wan2.1-t2v-1.3b")
    assert "\n" not in msg
    assert exc.value.exit_code == 2
    assert elapsed < HUB_FAIL_FAST_S, f"took {elapsed:.1f} s"
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------------------------------
# Random weights


@pytest.mark.slow
def test_random_weights_on_tiny_preset(vsagen_cache, tmp_path):
    from vsagen.commands.generate import generate
    from vsagen.models.loading import load_model

    cfg = resolve("ignored prompt", model="tiny", random_weights=True, steps=STEPS, out=tmp_path / "rw.mp4")
    model = load_model(cfg, log=lambda m: None)
    assert model.random_weights and model.pipe.text_encoder is None and model.pipe.tokenizer is None
    result = generate(cfg, progress=False)
    data = json.loads(result.json_path.read_text())
    assert data["random_weights"] is True and result.summary["random_weights"] is True
    assert any("random weights" in n for n in data["timing"]["notes"])
    assert data["timing"]["dit_forwards"] == 2 * STEPS
    assert read_mp4(result.video_path).shape == (17, 96, 160, 3)


# --------------------------------------------------------------------------------------------------------------
# Placing the weights: which diffusers offload API is called


class _FakePipe:
    def __init__(self):
        self.calls = []

    def to(self, device):
        self.calls.append(("to", (device,), {}))

    def enable_model_cpu_offload(self, **kw):
        self.calls.append(("enable_model_cpu_offload", (), kw))

    def enable_group_offload(self, **kw):
        self.calls.append(("enable_group_offload", (), kw))


def test_place_pipeline_uses_diffusers_offload_apis():
    from vsagen.models.loading import place_pipeline

    expected = {
        "none": ("to", ("cuda",), {}),
        "model": ("enable_model_cpu_offload", (), {"device": torch.device("cuda")}),
        "group": ("enable_group_offload", (), {
            "onload_device": torch.device("cuda"), "offload_device": torch.device("cpu"),
            "offload_type": "block_level", "num_blocks_per_group": 1, "use_stream": True,
            "exclude_modules": ["vae"]}),
    }
    for mode, call in expected.items():
        pipe = _FakePipe()
        place_pipeline(pipe, mode, "cuda")
        assert pipe.calls == [call], mode
    pipe = _FakePipe()
    place_pipeline(pipe, "group", "cpu")  # no CUDA stream off CUDA (diffusers refuses streams on the CPU)
    assert pipe.calls[0][2]["use_stream"] is False
    with pytest.raises(ValueError):
        place_pipeline(_FakePipe(), "disk", "cuda")


@pytest.mark.slow
def test_a_prompt_past_the_encoder_s_length_is_a_note(vsagen_cache, tmp_path):
    """Issue 29: diffusers cut prompts past `max_sequence_length` tokens without a word."""
    from vsagen.commands.generate_config import resolve_generate
    from vsagen.models.loading import truncation_note

    pipe = vsagen.load_pipeline("tiny")  # ByT5: one token a byte, plus the end token
    long = resolve_generate("a" * 600, model="tiny", out=tmp_path / "a.mp4")
    assert long.max_sequence_length == 512
    assert truncation_note(pipe, long) == ("the prompt is 601 tokens and the text encoder reads the first 512: the "
                                           "rest of it is cut (diffusers' Wan pipelines truncate); shorten it so "
                                           "that all of it counts")
    assert truncation_note(pipe, resolve_generate("a" * 511, model="tiny", out=tmp_path / "b.mp4")) is None
    negative = resolve_generate("a fox", model="tiny", negative_prompt="b" * 700, out=tmp_path / "c.mp4")
    assert truncation_note(pipe, negative).startswith("--negative-prompt is 701 tokens")
    no_cfg = resolve_generate("a fox", model="tiny", negative_prompt="b" * 700, guidance=1.0, out=tmp_path / "d.mp4")
    assert truncation_note(pipe, no_cfg) is None  # without CFG the negative prompt is not encoded



def test_a_tiny_cache_that_cannot_be_written_is_bad_input(vsagen_cache, tmp_path, monkeypatch):
    """Issue 29: `prepare_model_files` exited 1 (RunFailure) for a cache it cannot write; it is bad input (exit 2),
    one line naming the folder (here the cache turns into a path under a file after the request was resolved)."""
    from vsagen.models.loading import prepare_model_files

    cfg = resolve("a prompt", model="tiny", out=tmp_path / "x.mp4")
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("VSAGEN_CACHE", str(tmp_path / "a-file" / "cache"))
    with pytest.raises(BadInput, match="cannot write the tiny model to the vsagen cache .*a-file.*; set VSAGEN_CACHE") \
            as info:
        prepare_model_files(cfg)
    assert info.value.exit_code == 2


def test_diffusers_says_nothing_of_its_own_when_a_load_fails(vsagen_cache, tiny_dir, tmp_path, capfd):
    """Issue 29: a folder without transformer weights printed diffusers' own "An error occurred while trying to
    fetch ..." line before vsagen's. `vsagen.models.sources` now refuses such a folder before loading; should diffusers
    still fail, its log is silent during the call and the exception is vsagen's one line."""
    from vsagen.models.loading import _from_pretrained

    ckpt = copy_checkpoint(tiny_dir, tmp_path / "ckpt")
    cfg = resolve("a prompt", model=str(ckpt), out=tmp_path / "x.mp4")
    (ckpt / "transformer" / "diffusion_pytorch_model.safetensors").unlink()  # after the request's own check
    capfd.readouterr()
    with pytest.raises(BadInput):
        _from_pretrained(str(ckpt), cfg, torch.float32)
    err = capfd.readouterr().err
    assert "An error occurred" not in err and "ckpt/transformer" not in err


@pytest.mark.parametrize("model,asked,image_to_video,want", [
    ("wan2.1-t2v-1.3b", "auto", False, "bf16"), ("wan2.1-t2v-1.3b", "fp32", False, "fp32"),
    ("wan2.2-ti2v-5b", "auto", False, "bf16"), ("wan2.2-ti2v-5b", "auto", True, "fp32"),
    ("wan2.1-i2v-14b-480p", "auto", True, "fp32"), ("hummingbird-xt", "auto", False, "fp32"),
    ("tiny", "auto", False, "same"), ("tiny", "fp16", False, "fp16"),
    ("tiny-i2v", "auto", True, "same")])  # the tiny models' VAE follows --dtype, image to video too (docs say so)
def test_vae_dtype_auto_decodes_text_to_video_in_the_presets_decode_dtype(model, asked, image_to_video, want):
    """`--vae-dtype auto` (issue 32 item 2): bf16 where the VAE only decodes and the preset measured it, the preset's
    float32 where the VAE also encodes an image (and for Hummingbird-XT's light decoder); a given dtype wins."""
    from vsagen.models.loading import resolve_vae_dtype
    from vsagen.models.presets import load_preset

    assert resolve_vae_dtype(asked, load_preset(model), image_to_video) == want


@pytest.mark.parametrize("asked,want", [("auto", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_vae_dtype_is_the_presets_unless_asked(vsagen_cache, tiny_dir, tmp_path, asked, want):
    """`--vae-dtype` (issue 32 item 2): auto keeps the preset's (the tiny model's: the pipeline's, fp32 on CPU);
    bf16 / fp16 cast the VAE alone, the transformer keeps the run's dtype; the JSON's config records it; an unknown
    value is one line."""
    from vsagen.models.loading import load_model

    cfg = resolve("a prompt", model="tiny", steps=1, vae_dtype=asked, out=tmp_path / "v.mp4")
    pipe = load_model(cfg, log=lambda m: None).pipe
    assert pipe.vae.dtype == want and pipe.transformer.dtype == torch.float32
    assert cfg.summary()["vae_dtype"] == asked
    with pytest.raises(BadInput, match="--vae-dtype"):
        resolve("a prompt", model="tiny", vae_dtype="int8", out=tmp_path / "w.mp4")


def test_a_lora_is_fused_before_the_linears_go_int8(vsagen_cache, tiny_dir, tmp_path):
    """`--lora` with `--quant int8`: the int8 weights are those of the fused weights (the LoRA fused first), and the
    LoRA's record reaches the loaded model."""
    from lora_files import expected_delta, write_lora
    from vsagen.models.loading import load_model

    plain = load_model(resolve("p", model="tiny", out=tmp_path / "a.mp4"), log=lambda m: None)
    factors = write_lora(tmp_path / "l.safetensors", "original", plain.pipe.transformer, seed=3)
    cfg = resolve("p", model="tiny", quant="int8", device="cpu", lora=[f"{tmp_path / 'l.safetensors'}:scale=0.6"],
                  out=tmp_path / "b.mp4")
    model = load_model(cfg, log=lambda m: None)
    assert model.loras[0]["scale"] == 0.6 and model.loras[0]["fused"] is True
    linear = model.pipe.transformer.blocks[1].attn1.to_k
    fused = plain.pipe.transformer.blocks[1].attn1.to_k.weight.double() + expected_delta(factors, 1, "attn1.to_k", 0.6)
    err = (linear.dequantized_weight(torch.float64) - fused).abs().max()
    assert type(linear).__name__ == "Int8Linear" and err <= fused.abs().max() / 127  # int8 rounding of the sum
    moved = (linear.dequantized_weight(torch.float64) - plain.pipe.transformer.blocks[1].attn1.to_k.weight).abs().max()
    assert moved > 10 * fused.abs().max() / 127  # the LoRA's product is in the int8 weights, far above their rounding


def test_a_ti2v_pipeline_s_image_to_video_pipeline_shares_its_components_and_casts_nothing(ti2v_dir):
    """`image_to_video_pipeline`: the loaded WanPipeline's components as the same objects (a bf16 transformer
    stays bf16 beside an fp32 VAE: diffusers' `from_pipe` would cast both to one dtype), its per-token timesteps and
    progress bar settings; `decode_vae_copy`: the VAE's weights cast as a load in that dtype casts them (equal to
    `vae.to(bf16)`, value for value), the original untouched."""
    from diffusers import WanPipeline

    from vsagen.models.loading import decode_vae_copy, image_to_video_pipeline

    pipe = WanPipeline.from_pretrained(ti2v_dir, use_safetensors=True)
    pipe.transformer.to(torch.bfloat16)
    pipe.set_progress_bar_config(disable=True, desc="denoising")
    image = image_to_video_pipeline(pipe)
    assert type(image).__name__ == "WanImageToVideoPipeline" and image.image_encoder is None
    for name in ("transformer", "text_encoder", "tokenizer", "vae", "scheduler"):
        assert getattr(image, name) is getattr(pipe, name), name
    assert image.transformer.dtype == torch.bfloat16 and image.vae.dtype == torch.float32
    assert image.config.expand_timesteps is True
    assert image._progress_bar_config == {"disable": True, "desc": "denoising"}
    copy = decode_vae_copy(pipe.vae, "bf16", "cpu")
    assert copy is not pipe.vae and copy.dtype == torch.bfloat16 and pipe.vae.dtype == torch.float32
    reference = {k: v.to(torch.bfloat16) for k, v in pipe.vae.state_dict().items()}
    assert all(torch.equal(v, reference[k]) for k, v in copy.state_dict().items())
