"""vsagen.models.checkpoint_layouts: checkpoints that are not a stock diffusers Wan pipeline, written here from the tiny
models: a FastVideo-style diffusers folder whose model_index.json names `WanDMDPipeline` (a class diffusers does not
have), and a VideoX-Fun "civitai" folder holding the transformer in the original Wan key names (renamed by this
file's own key map, not diffusers' converter). Each resolves, loads (`vsagen.models.loading`) and runs `vsagen t2v`;
damaged ones are one line, exit 2, before anything runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import one_error_line, original_name
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from vsagen.models.checkpoint_layouts import diffusers_config, index_as_stock, is_original_config, stock_pipeline_class
from vsagen.cli.app import app
from vsagen.commands.generate_config import resolve_generate as resolve
from vsagen.errors import BadInput, ModelNotFound
from vsagen.models.sources import resolve_model
from vsagen.models.presets import load_preset

DMD_NOTE = ("model_index.json names WanDMDPipeline (FastVideo's class, not in diffusers): built as WanPipeline from "
            "its components")
EXPAND_NOTE = "model_index.json lacks expand_timesteps: set to true"
CONVERT_NOTE = "transformer converted from the original Wan key names"


def fastvideo_folder(src: Path, dest: Path, drop_expand: bool = False) -> Path:
    """A copy of a saved tiny pipeline whose model_index.json names FastVideo's `WanDMDPipeline` (and, with
    `drop_expand`, lacks `expand_timesteps`, as FastVideo's Wan2.2-TI2V-5B folder does)."""
    shutil.copytree(src, dest)
    index = json.loads((dest / "model_index.json").read_text())
    index["_class_name"] = "WanDMDPipeline"
    if drop_expand:
        index.pop("expand_timesteps", None)
    (dest / "model_index.json").write_text(json.dumps(index))
    return dest


def original_config(preset: str = "tiny") -> dict:
    """The original Wan config.json of a preset's transformer (Wan's WanModel keys)."""
    t = load_preset(preset).transformer
    return {"_class_name": "WanModel", "model_type": "ti2v" if load_preset(preset).expand_timesteps else "t2v",
            "dim": t["num_attention_heads"] * t["attention_head_dim"], "ffn_dim": t["ffn_dim"],
            "num_heads": t["num_attention_heads"], "num_layers": t["num_layers"], "in_dim": t["in_channels"],
            "out_dim": t["out_channels"], "text_len": 512, "text_dim": t["text_dim"], "freq_dim": t["freq_dim"],
            "eps": t["eps"]}


def civitai_folder(tiny_dir: Path, dest: Path, edit=None, preset: str = "tiny") -> tuple[Path, dict]:
    """A VideoX-Fun civitai folder of the tiny transformer: config.json (original keys), its weights in the original
    key names, and original-format .pth files of a text encoder and VAE (which vsagen does not load). `edit(state)`
    changes the renamed state dict before it is saved. Returns (folder, the tiny transformer's diffusers state)."""
    dest.mkdir()
    state = load_file(tiny_dir / "transformer" / "diffusion_pytorch_model.safetensors")
    renamed = {original_name(k): v for k, v in state.items()}
    assert len(renamed) == len(state)
    if edit is not None:
        edit(renamed)
    save_file(renamed, dest / "diffusion_pytorch_model.safetensors")
    (dest / "config.json").write_text(json.dumps(original_config(preset)))
    torch.save({"encoder.weight": torch.zeros(2)}, dest / "models_t5_umt5-xxl-enc-bf16.pth")
    torch.save({"decoder.weight": torch.zeros(2)}, dest / "Wan2.1_VAE.pth")
    return dest, state


# --------------------------------------------------------------------------------------------------------------
# A foreign pipeline class


def test_index_as_stock_maps_a_foreign_class_and_fills_expand_timesteps():
    t2v, ti2v = load_preset("tiny").transformer, load_preset("tiny-ti2v").transformer
    wan = ["diffusers", "WanTransformer3DModel"]
    index = {"_class_name": "WanDMDPipeline", "transformer": wan}
    assert stock_pipeline_class(index, t2v) == "WanPipeline"
    assert stock_pipeline_class(index, load_preset("tiny-i2v").transformer) == "WanImageToVideoPipeline"
    assert stock_pipeline_class({**index, "_class_name": "WanPipeline"}, t2v) is None
    assert stock_pipeline_class({**index, "transformer": ["fastvideo", "X"]}, t2v) is None
    assert index_as_stock(index, t2v) == ({"_class_name": "WanPipeline", "transformer": wan}, [DMD_NOTE])
    stock, notes = index_as_stock(index, ti2v)
    assert stock["expand_timesteps"] is True and notes[1].startswith(EXPAND_NOTE)
    stock, notes = index_as_stock({"_class_name": "WanPipeline", "transformer": wan}, ti2v)  # a stock class too
    assert stock["_class_name"] == "WanPipeline" and stock["expand_timesteps"] is True and len(notes) == 1
    assert index_as_stock({"_class_name": "WanPipeline"}, t2v) == ({"_class_name": "WanPipeline"}, [])
    # a key the index has is kept, true or false
    assert index_as_stock({"_class_name": "WanPipeline", "expand_timesteps": False}, ti2v) == (
        {"_class_name": "WanPipeline", "expand_timesteps": False}, [])


def test_a_fastvideo_folder_loads_as_the_stock_pipeline(vsagen_cache, tiny_dir, ti2v_dir, tmp_path):
    from diffusers import WanPipeline

    from vsagen.models.loading import load_model

    folder = fastvideo_folder(tiny_dir, tmp_path / "FastWan-tiny")
    src = resolve_model(str(folder))
    assert (src.kind, src.pipeline, src.preset.name) == ("dir", "WanPipeline", "tiny")
    model = load_model(resolve("a fox", model=str(folder), out=tmp_path / "a.mp4"), log=lambda m: None)
    assert type(model.pipe) is WanPipeline and model.notes.count(DMD_NOTE) == 1
    assert not model.pipe.config.expand_timesteps
    # FastVideo's Wan2.2-TI2V-5B folder lacks expand_timesteps: the 5B architecture runs with per-token timesteps
    folder = fastvideo_folder(ti2v_dir, tmp_path / "FastWan-ti2v", drop_expand=True)
    src = resolve_model(str(folder))
    assert src.preset.name == "tiny-ti2v" and src.takes_image
    model = load_model(resolve("a fox", model=str(folder), out=tmp_path / "b.mp4"), log=lambda m: None)
    assert model.pipe.config.expand_timesteps is True
    assert [n for n in model.notes if "model_index.json" in n] == [DMD_NOTE, next(
        n for n in model.notes if n.startswith(EXPAND_NOTE))]


def test_a_fastvideo_hub_id_in_the_cache_loads_the_same_way(vsagen_cache, ti2v_dir, tmp_path, monkeypatch):
    """The hub path: a FastVideo-style repository (foreign class, no expand_timesteps) in a private, offline Hugging
    Face cache is read by diffusers' from_pretrained, its model_index.json from the cache afterwards."""
    import huggingface_hub.constants

    from vsagen.models.loading import load_model

    repo = tmp_path / "hub" / "models--org--FastWan-tiny"
    fastvideo_folder(ti2v_dir, repo / "snapshots" / ("a" * 40), drop_expand=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    cfg = resolve("a fox", model="org/FastWan-tiny", out=tmp_path / "a.mp4")
    assert cfg.source.kind == "hub"
    model = load_model(cfg, log=lambda m: None)
    assert type(model.pipe).__name__ == "WanPipeline" and model.pipe.config.expand_timesteps is True
    assert model.notes.count(DMD_NOTE) == 1 and sum(n.startswith(EXPAND_NOTE) for n in model.notes) == 1


@pytest.mark.parametrize("cls,transformer", [("StableDiffusionPipeline", None),
                                             ("WanDMDPipeline", ["fastvideo", "WanTransformer3DModel"])])
def test_classes_diffusers_has_or_foreign_transformers_stay_refused(vsagen_cache, tiny_dir, tmp_path, cls,
                                                                    transformer):
    from vsagen.models.loading import load_model

    folder = fastvideo_folder(tiny_dir, tmp_path / "other")
    index = json.loads((folder / "model_index.json").read_text())
    index["_class_name"] = cls
    if transformer is not None:
        index["transformer"] = transformer
    (folder / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(BadInput, match=f"model_index.json names '{cls}'; vsagen t2v runs WanPipeline checkpoints"):
        load_model(resolve("a fox", model=str(folder), out=tmp_path / "a.mp4"), log=lambda m: None)


# --------------------------------------------------------------------------------------------------------------
# The original Wan key names


def test_diffusers_config_of_an_original_config():
    assert is_original_config(original_config()) and not is_original_config(load_preset("tiny").transformer)
    t = load_preset("tiny").transformer
    got = diffusers_config(original_config(), "x")
    assert all(got[k] == t[k] for k in got)
    assert diffusers_config({**original_config(), "model_type": "flf2v"}, "x")["pos_embed_seq_len"] == 514
    with pytest.raises(BadInput, match="dim 32 is not a multiple of num_heads 3"):
        diffusers_config({**original_config(), "num_heads": 3}, "x")


@pytest.mark.parametrize("preset", ["tiny", "tiny-ti2v"])
def test_a_civitai_folder_converts_to_the_same_transformer(vsagen_cache, tiny_dir, ti2v_dir, tmp_path, preset):
    from vsagen.models.loading import load_model

    folder, state = civitai_folder(tiny_dir if preset == "tiny" else ti2v_dir, tmp_path / "civitai", preset=preset)
    src = resolve_model(str(folder))
    assert (src.kind, src.layout, src.components, src.preset.name) == ("dir", "wan", "", preset)
    model = load_model(resolve("a fox", model=str(folder), out=tmp_path / "a.mp4"), log=lambda m: None)
    got = model.pipe.transformer.state_dict()
    assert got.keys() == state.keys() and all(torch.equal(got[k], v) for k, v in state.items())
    notes = [n for n in model.notes if n.startswith(CONVERT_NOTE)]
    assert len(notes) == 1 and "convert_wan_transformer_to_diffusers" in notes[0] and f"{preset} preset" in notes[0]
    assert model.pipe.text_encoder is not None and model.weight_root is None
    assert model.pipe.config.expand_timesteps == (preset == "tiny-ti2v")  # Wan2.2-TI2V-5B: per-token timesteps


def test_the_converted_transformer_has_the_dtypes_of_a_stock_load(tiny_dir, tmp_path):
    """bf16 as diffusers' from_pretrained gives it: the modules WanTransformer3DModel keeps in float32 (norms,
    modulation, time embedder) stay float32, the rest bf16, every value the stock load's."""
    from diffusers import WanTransformer3DModel

    from vsagen.models.checkpoint_layouts import load_original_transformer, original_wan_folder

    folder, _ = civitai_folder(tiny_dir, tmp_path / "civitai")
    ours, _ = load_original_transformer(original_wan_folder(folder, "x"), load_preset("tiny").transformer,
                                        torch.bfloat16, False, "x")
    stock = WanTransformer3DModel.from_pretrained(tiny_dir / "transformer", torch_dtype=torch.bfloat16).state_dict()
    got = ours.state_dict()
    assert {k: v.dtype for k, v in got.items()} == {k: v.dtype for k, v in stock.items()}
    assert {v.dtype for v in got.values()} == {torch.float32, torch.bfloat16}
    assert all(torch.equal(got[k], v) for k, v in stock.items())


def _drop_one(state):
    del state["blocks.1.ffn.2.weight"]


def _reshape_one(state):
    state["head.head.weight"] = torch.zeros(7, 32)


def _extra_one(state):
    state["blocks.0.self_attn.extra.weight"] = torch.zeros(2)


@pytest.mark.parametrize("edit,match", [
    (_drop_one, "lacks 1 tensor.* e.g. blocks.1.ffn.net.2.weight"),
    (_reshape_one, r"proj_out.weight has shape \(7, 32\), its architecture needs \(64, 32\)"),
    (_extra_one, "holds 1 tensor.* does not have, e.g. blocks.0.attn1.extra.weight"),
])
def test_tensors_that_do_not_fit_are_one_line(vsagen_cache, tiny_dir, tmp_path, monkeypatch, edit, match):
    """Found from the safetensors headers, before the components load (a real text encoder takes a while)."""
    import vsagen.models.loading
    from vsagen.models.loading import load_model

    monkeypatch.setattr(vsagen.models.loading, "_from_pretrained", lambda *a, **kw: pytest.fail("components loaded"))
    folder, _ = civitai_folder(tiny_dir, tmp_path / "bad", edit)
    with pytest.raises(BadInput, match=match) as info:
        load_model(resolve("a fox", model=str(folder), out=tmp_path / "a.mp4"), log=lambda m: None)
    assert "\n" not in str(info.value) and str(info.value).startswith(f"--model {folder}")


def test_pickle_only_transformers_need_allow_pickle_and_load_weights_only(vsagen_cache, tiny_dir, tmp_path,
                                                                         monkeypatch):
    from vsagen.models.loading import load_model

    folder, state = civitai_folder(tiny_dir, tmp_path / "pth")
    weights = folder / "diffusion_pytorch_model.safetensors"
    torch.save(load_file(weights), folder / "wan_dmd.pth")
    weights.unlink()
    with pytest.raises(BadInput, match=r"only pickle weights \(wan_dmd.pth\).*--allow-pickle"):
        load_model(resolve("a fox", model=str(folder), out=tmp_path / "a.mp4"), log=lambda m: None)
    calls = []
    real = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    cfg = resolve("a fox", model=str(folder), out=tmp_path / "a.mp4", allow_pickle=True)
    got = load_model(cfg, log=lambda m: None).pipe.transformer.state_dict()
    assert all(torch.equal(got[k], v) for k, v in state.items())
    assert [c.get("weights_only") for c in calls] == [True]  # the transformer's file only, not the T5 / VAE .pth


def test_folders_that_are_not_the_layout_are_one_line(tiny_dir, tmp_path):
    folder, _ = civitai_folder(tiny_dir, tmp_path / "diffusers-names")
    shutil.copy(tiny_dir / "transformer" / "diffusion_pytorch_model.safetensors", folder)
    with pytest.raises(BadInput, match="does not hold the original Wan key names"):
        resolve_model(str(folder))
    other, _ = civitai_folder(tiny_dir, tmp_path / "other-architecture")
    (other / "config.json").write_text(json.dumps({**original_config(), "num_layers": 3}))
    with pytest.raises(BadInput, match="3 layers, 2 heads x 16, 16 channels.* no preset describes"):
        resolve_model(str(other))
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "diffusion_pytorch_model-00002-of-00002.safetensors"}}))
    with pytest.raises(BadInput, match="diffusion_pytorch_model-00002-of-00002.safetensors is missing"):
        resolve_model(str(folder))
    for f in folder.glob("diffusion_pytorch_model*"):
        f.unlink()
    with pytest.raises(BadInput, match="no weights beside it"):
        resolve_model(str(folder))
    (folder / "config.json").write_text(json.dumps({"num_attention_heads": 2}))
    with pytest.raises(ModelNotFound, match="no model_index.json.* nor a transformer in the original Wan key names"):
        resolve_model(str(folder))


# --------------------------------------------------------------------------------------------------------------
# Through `vsagen t2v`


def test_t2v_runs_both_layouts_and_refuses_a_damaged_one(vsagen_cache, tiny_dir, tmp_path):
    runner = CliRunner()
    common = ["--device", "cpu", "--steps", "1", "--frames", "5", "--height", "64", "--width", "64"]
    for name, folder, note in [("dmd", fastvideo_folder(tiny_dir, tmp_path / "FastWan"), DMD_NOTE),
                               ("civitai", civitai_folder(tiny_dir, tmp_path / "civitai")[0], CONVERT_NOTE)]:
        out = tmp_path / f"{name}.mp4"
        res = runner.invoke(app, ["t2v", "a fox", "--model", str(folder), "--out", str(out), *common])
        assert res.exit_code == 0, res.output
        data = json.loads(out.with_suffix(".json").read_text())
        assert sum(n.startswith(note) for n in data["timing"]["notes"]) == 1
        assert out.stat().st_size > 0
    bad, _ = civitai_folder(tiny_dir, tmp_path / "bad", _reshape_one)
    out = tmp_path / "bad.mp4"
    res = runner.invoke(app, ["t2v", "a fox", "--model", str(bad), "--out", str(out), *common])
    assert "proj_out.weight has shape (7, 32)" in one_error_line(res)
    assert not out.exists() and not out.with_suffix(".json").exists()


def test_a_transformer_layout_preset_is_matched_by_folder_name_and_resolves_as_a_hub_id(tiny_dir, tmp_path,
                                                                                     monkeypatch):
    """A `transformer_layout = "wan"` preset (Hummingbird-XT's kind): a folder named after its repository gets it
    and its `components`; other folders of the architecture get the stock preset; its name and hub id resolve to a
    hub source in that layout. (Its download is not possible here: the folder path is what runs.)"""
    import tomllib

    import vsagen.models.checkpoint_layouts
    import vsagen.models.sources
    import vsagen.models.presets
    from vsagen.models.presets import _preset_dir, parse_preset, preset_names

    data = tomllib.loads((_preset_dir() / "tiny.toml").read_text())
    data.pop("attention")
    data.update(name="tiny-xt", source="hub", hub_id="amd/TinyXT", transformer_layout="wan",
                components="org/tiny-diffusers")
    fake = parse_preset(data, "tiny-xt.toml")
    names = [*preset_names(), "tiny-xt"]
    real = vsagen.models.presets.load_preset
    for module in (vsagen.models.presets, vsagen.models.sources, vsagen.models.checkpoint_layouts):
        monkeypatch.setattr(module, "preset_names", lambda: names)
        monkeypatch.setattr(module, "load_preset", lambda n: fake if n == "tiny-xt" else real(n))
    src = resolve_model(str(civitai_folder(tiny_dir, tmp_path / "TinyXT-main")[0]))
    assert (src.layout, src.components, src.preset.name, src.exact_preset) == ("wan", "org/tiny-diffusers",
                                                                              "tiny-xt", True)
    assert resolve_model(str(civitai_folder(tiny_dir, tmp_path / "other")[0])).preset.name == "tiny"
    for model in ("tiny-xt", "amd/TinyXT"):
        src = resolve_model(model)
        assert (src.kind, src.location, src.layout, src.components) == ("hub", "amd/TinyXT", "wan",
                                                                       "org/tiny-diffusers")
    # a diffusers-layout folder of the architecture never takes the "wan"-layout preset
    assert resolve_model(str(fastvideo_folder(tiny_dir, tmp_path / "TinyXT-diffusers"))).preset.name == "tiny"


def test_published_layouts_run_as_trained_end_to_end(vsagen_cache, tiny_dir, tmp_path):
    """Issue 30's acceptance on tiny checkpoints written in each published layout: a FastVideo folder (model_index
    names WanDMDPipeline, block-level VSA gates) runs vsa by `--attn auto` with every layer's gate loaded; a civitai
    folder (original Wan keys, no sparse weights) runs full; each t2v writes the mp4 and a JSON that says which
    sampler ran (sigmas, timesteps), that CFG was off, the backend and how many layers got its weights."""
    from conftest import block_gated_checkpoint

    gated = block_gated_checkpoint(tiny_dir, tmp_path / "FastWan-gated")
    index = json.loads((gated / "model_index.json").read_text())
    (gated / "model_index.json").write_text(json.dumps({**index, "_class_name": "WanDMDPipeline"}))
    civitai, _ = civitai_folder(tiny_dir, tmp_path / "civitai")
    runner = CliRunner()
    common = ["--device", "cpu", "--frames", "5", "--height", "64", "--width", "64", "--seed", "4"]
    for folder, sampler, backend, layers in [(gated, "dmd", "vsa", 2), (civitai, "dmd-hummingbird", "full", 0)]:
        out = tmp_path / f"{folder.name}.mp4"
        res = runner.invoke(app, ["t2v", "a fox", "--model", str(folder), "--sampler", sampler, "--out", str(out),
                                  *common])
        assert res.exit_code == 0, res.output
        data = json.loads(out.with_suffix(".json").read_text())
        assert data["attn_requested"] == "auto" and data["backend"]["name"] == backend
        assert (data["backend_weight_layers"], data["layers"]) == (layers, 2)
        assert data["sampler"]["name"] == sampler and data["cfg"] is False and data["steps"] == 3
        assert data["timing"]["dit_forwards"] == 3
        assert len(data["sampler"]["sigmas"]) == len(data["sampler"]["timesteps"]) == 3
        notes = data["timing"]["notes"]
        assert any(n.startswith(DMD_NOTE if backend == "vsa" else CONVERT_NOTE) for n in notes), notes
        assert any(n.startswith(f"--attn auto chose {backend}") for n in notes), notes
        assert out.stat().st_size > 0
