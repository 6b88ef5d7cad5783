"""vsagen.models.sources: `--model` (preset name | local diffusers directory | hub id) -> `ModelSource`, without loading
weights: the kind and location, the preset a directory gets, what the model takes (image, last image), and the
attention shape `--kernels` reads."""

from __future__ import annotations

import json
import shutil

import pytest

from vsagen.errors import BadInput, ModelNotFound
from vsagen.commands.generate_config import resolve_generate as resolve
from vsagen.models.sources import DEFAULT_MODEL, ModelSource, attention_dims, resolve_model
from vsagen.models.presets import I2V_PIPELINE, LAST_IMAGE_NONE, LAST_IMAGE_REQUIRED, load_preset


def test_directory_without_model_index_is_refused(vsagen_cache, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFound, match="model_index.json"):
        resolve("a prompt", model=str(tmp_path / "empty"), out=tmp_path / "e.mp4")


def test_preset_names_resolve_to_tiny_or_hub_sources():
    tiny = resolve_model("tiny")
    assert (tiny.kind, tiny.location, tiny.preset.name, tiny.exact_preset) == ("tiny", "", "tiny", True)
    assert tiny.rope_max_seq_len == load_preset("tiny").transformer.get("rope_max_seq_len")
    wan = resolve_model(DEFAULT_MODEL)
    assert (wan.kind, wan.location) == ("hub", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers") and wan.preset.name == DEFAULT_MODEL
    assert not wan.takes_image and not wan.image_to_video and wan.last_image == LAST_IMAGE_NONE
    i2v = resolve_model("tiny-i2v")
    assert i2v.image_to_video and i2v.takes_image and i2v.preset.pipeline == I2V_PIPELINE
    ti2v = resolve_model("tiny-ti2v")
    assert ti2v.takes_image and not ti2v.image_to_video  # text-image-to-video: t2v and i2v both run it


def test_hub_ids_get_their_preset_or_the_default_settings():
    known = resolve_model("Wan-AI/Wan2.1-T2V-1.3B-Diffusers")
    assert known.kind == "hub" and known.preset.name == DEFAULT_MODEL and known.exact_preset
    other = resolve_model("some-org/some-model")
    assert (other.kind, other.location) == ("hub", "some-org/some-model")
    assert other.preset.name == DEFAULT_MODEL and not other.exact_preset  # only the generation defaults


@pytest.mark.parametrize("hub_id,presets", [
    ("loayrashid/TurboWan2.1-T2V-1.3B-Diffusers", "turbowan2.1-t2v-1.3b-fv"),
    ("loayrashid/TurboWan2.1-T2V-14B-Diffusers", "turbowan2.1-t2v-14b-fv"),
    ("loayrashid/TurboWan2.2-I2V-A14B-Diffusers", "turbowan2.2-i2v-a14b-fv"),
    ("TurboDiffusion/TurboWan2.1-T2V-1.3B-480P", "turbowan2.1-t2v-1.3b or turbowan2.1-t2v-1.3b-quant"),
    ("lightx2v/Wan2.1-Distill-Models", "lightx2v-wan2.1-t2v-14b")])
def test_a_repository_of_transformer_files_names_its_presets(hub_id, presets):
    """Such a repository runs beside a base checkpoint through its preset (FastVideo's conversion too: its
    transformer is in FastVideo's module names, which diffusers does not load)."""
    with pytest.raises(BadInput, match=f"through a preset: --model {presets}$"):
        resolve_model(hub_id)


def test_a_local_fastvideo_conversion_is_refused_naming_the_transformer_route(tiny_dir, tmp_path):
    """A downloaded FastVideo conversion (a diffusers folder whose transformer/ holds FastVideo's module names)."""
    import torch
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "TurboWan2.1-T2V-1.3B-Diffusers"
    shutil.copytree(tiny_dir, folder)
    weights = next((folder / "transformer").glob("*.safetensors"))
    state = load_file(str(weights))
    renamed = {k.replace(".attn1.to_q.", ".to_q.") if ".attn1.to_q." in k else k: v for k, v in state.items()}
    save_file({k: v.contiguous() for k, v in renamed.items()}, str(weights))
    with pytest.raises(BadInput, match="transformer/ holds FastVideo's module names .* --transformer "):
        resolve_model(str(folder))
    save_file({k: torch.zeros_like(v) for k, v in state.items()}, str(weights))  # diffusers' names: no refusal
    assert resolve_model(str(folder)).kind == "dir"


def test_a_local_fastvideo_a14b_conversion_is_refused_naming_both_expert_files(i2v_a14b_dir, tmp_path):
    """A downloaded two-expert FastVideo conversion (loayrashid/TurboWan2.2-I2V-A14B-Diffusers' layout: FastVideo's
    names in transformer/ and transformer_2/): the advice names one file per expert, the high-noise one first, as
    --transformer takes them (one file alone is refused for a two-expert model)."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "TurboWan2.2-I2V-A14B-Diffusers"
    shutil.copytree(i2v_a14b_dir, folder)
    for expert in ("transformer", "transformer_2"):
        weights = next((folder / expert).glob("*.safetensors"))
        state = load_file(str(weights))
        save_file({k.replace(".attn1.to_q.", ".to_q."): v.contiguous() for k, v in state.items()}, str(weights))
    with pytest.raises(BadInput) as info:
        resolve_model(str(folder))
    msg = str(info.value)
    assert "transformer/ holds FastVideo's module names" in msg and "run the files over its base model" in msg
    assert msg.endswith(f"--transformer {folder}/transformer/<file>.safetensors,"
                        f"{folder}/transformer_2/<file>.safetensors"), msg


@pytest.mark.parametrize("model", ["no-such-preset", "no_such.name"])
def test_names_that_are_nothing_are_refused_listing_the_presets(model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadInput) as info:
        resolve_model(model)
    msg = str(info.value)
    assert repr(model) in msg and "tiny" in msg and "--model tiny" in msg
    assert not isinstance(info.value, ModelNotFound)


@pytest.mark.parametrize("model", ["org/", "/org/name", "./org/name", "~/org/name", "a/b/c", "./models/Wan2.1",
                                   ".hidden", "~"])
def test_paths_that_are_no_folder_say_so_in_one_line(model, tmp_path, monkeypatch):
    """New-user trial: `--model ./models/Wan2.1` (a mistyped folder) answered "not a preset (" and every preset;
    a value that looks like a path (a separator, a leading . or ~) says there is no such folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # "~" is no folder
    with pytest.raises(BadInput) as info:
        resolve_model(model)
    assert str(info.value) == f"--model {model!r}: no such folder"



@pytest.mark.parametrize("model", ["notes.txt", "./notes.txt", "{tmp}/notes.txt"])
def test_an_existing_file_is_a_file_not_a_folder(model, tmp_path, monkeypatch):
    """New-user trial (issue 44): `--model notes.txt`, an existing file, answered "not a preset" and every preset."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("")
    model = model.replace("{tmp}", str(tmp_path))
    with pytest.raises(BadInput) as info:
        resolve_model(model)
    assert str(info.value) == (f"--model {model!r} is a file, not a folder: --model takes a checkpoint folder, a "
                               "preset name (`vsagen presets` lists them) or a Hugging Face hub id (org/name)")


@pytest.mark.parametrize("model,meant", [("wan2.1-t2v-1.3", "wan2.1-t2v-1.3b"), ("tiny-i2", "tiny-i2v"),
                                         ("Wan2.2-TI2V-5B", "wan2.2-ti2v-5b")])
def test_a_mistyped_preset_gets_a_did_you_mean(model, meant, tmp_path, monkeypatch):
    """New-user trial (issue 44): `--model wan2.1-t2v-1.3` listed all 25 presets with no "did you mean", as a
    mistyped command gets; the presets close to the name are offered, closest first, instead of the list."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadInput) as info:
        resolve_model(model)
    msg = str(info.value)
    assert msg.startswith(f"unknown --model {model!r}: not a preset; did you mean {meant}")
    assert "lists them all" in msg and "tiny-a14b" not in msg


def test_local_directories_of_a_tiny_architecture_get_the_tiny_preset(tiny_dir, i2v_dir, flf2v_dir, tmp_path):
    src = resolve_model(str(tiny_dir))
    assert src.kind == "dir" and src.location == str(tiny_dir.resolve())
    assert src.preset.name == "tiny" and not src.exact_preset  # the tiny presets are not hub architectures
    assert src.pipeline == "WanPipeline" and not src.takes_image
    flf = resolve_model(str(flf2v_dir))
    assert flf.preset.name == "tiny-flf2v" and flf.image_to_video and flf.last_image == LAST_IMAGE_REQUIRED
    assert resolve_model(str(i2v_dir)).preset.name == "tiny-i2v"
    # an architecture no preset describes: the default model's generation settings
    odd = tmp_path / "odd"
    shutil.copytree(tiny_dir, odd)
    cfg = json.loads((odd / "transformer" / "config.json").read_text())
    cfg["num_layers"] = cfg["num_layers"] + 1
    (odd / "transformer" / "config.json").write_text(json.dumps(cfg))
    src = resolve_model(str(odd))
    assert src.kind == "dir" and src.preset.name == DEFAULT_MODEL and not src.exact_preset


@pytest.mark.parametrize("broken", ["transformer-config", "model-index"])
def test_unreadable_configs_of_a_directory_are_model_not_found(tiny_dir, tmp_path, broken):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_dir, ckpt, ignore=shutil.ignore_patterns("*.safetensors"))
    target = ckpt / ("transformer/config.json" if broken == "transformer-config" else "model_index.json")
    target.write_text("{ not json")
    with pytest.raises(ModelNotFound, match="cannot read"):
        resolve_model(str(ckpt))


def test_attention_dims_from_the_preset_or_the_directory(tiny_dir, tmp_path):
    t = load_preset("wan2.1-t2v-1.3b").transformer
    assert attention_dims(resolve_model("wan2.1-t2v-1.3b"), "wan2.1-t2v-1.3b") == (12, 128) == (
        t["num_attention_heads"], t["attention_head_dim"])
    tiny = load_preset("tiny").transformer
    assert attention_dims(resolve_model(str(tiny_dir)), str(tiny_dir)) == (tiny["num_attention_heads"],
                                                                         tiny["attention_head_dim"])
    with pytest.raises(BadInput, match="--kernels needs the attention shape"):
        attention_dims(resolve_model("some-org/some-model"), "some-org/some-model")
    gone = ModelSource("dir", str(tmp_path / "gone"), load_preset("tiny"), exact_preset=False)
    with pytest.raises(ModelNotFound, match="cannot read its transformer config"):
        attention_dims(gone, "gone")


def test_a_checkpoint_with_damaged_or_missing_weights_is_refused_before_loading(tiny_dir, tmp_path):
    """Issue 29: a truncated or overwritten safetensors file and a folder without weights were found by diffusers
    (blamed on pickle, after its own log line); a missing shard too. `resolve_model` reads the headers (no torch)
    and names the file, what is wrong and what to do. Pickle-only folders are left to the loader (--allow-pickle)."""
    from vsagen.models.sources import check_weight_files, safetensors_problem

    ckpt = shutil.copytree(tiny_dir, tmp_path / "ckpt")
    index = json.loads((ckpt / "model_index.json").read_text())
    check_weight_files(ckpt, "ckpt", index)
    weights = ckpt / "transformer" / "diffusion_pytorch_model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) - 10])
    assert safetensors_problem(weights) == "incomplete metadata, file not fully covered"
    with pytest.raises(BadInput, match="^--model ckpt: transformer/diffusion_pytorch_model.safetensors is damaged "
                                       r"or truncated \(incomplete metadata, file not fully covered\); download it "
                                       "again$"):
        check_weight_files(ckpt, "ckpt", index)
    weights.write_bytes(b"\xff" * 8 + whole[8:])  # the header's length overwritten
    with pytest.raises(BadInput, match="is damaged or truncated"):
        resolve_model(str(ckpt))
    weights.unlink()
    with pytest.raises(BadInput, match="transformer/ holds no weights .* download it again"):
        resolve_model(str(ckpt))
    (ckpt / "transformer" / "diffusion_pytorch_model.bin").write_bytes(b"pickle")  # the loader's to refuse
    check_weight_files(ckpt, "ckpt", index)
    shards = {"weight_map": {"a": "diffusion_pytorch_model-00001-of-00002.safetensors",
                             "b": "diffusion_pytorch_model-00002-of-00002.safetensors"}}
    (ckpt / "transformer" / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(shards))
    (ckpt / "transformer" / "diffusion_pytorch_model-00001-of-00002.safetensors").write_bytes(whole)
    with pytest.raises(BadInput, match="transformer/diffusion_pytorch_model-00002-of-00002.safetensors is missing "
                                       r"\(1 of the 2 files"):
        check_weight_files(ckpt, "ckpt", index)


# --------------------------------------------------------------------------------------------------------------
# The Hugging Face cache and hub, asked before anything loads (issue 44: an uncached hub id offline, and plain
# `vsagen t2v fox` with the default preset, printed "loading ..." and failed ~7 s later)


def _refusal(model: str, **kw) -> str:
    from vsagen.models.sources import check_hub_files

    with pytest.raises(ModelNotFound) as info:
        check_hub_files(resolve_model(model), model, **kw)
    msg = str(info.value)
    assert "\n" not in msg and info.value.exit_code == 2
    return msg


def test_an_uncached_hub_model_offline_is_refused_at_once(hub):
    msg = _refusal(DEFAULT_MODEL)
    assert msg.startswith("cannot load model 'wan2.1-t2v-1.3b': hub id 'Wan-AI/Wan2.1-T2V-1.3B-Diffusers' is not in "
                          "the local Hugging Face cache and the hub is off (HF_HUB_OFFLINE is set)")
    assert "hf download Wan-AI/Wan2.1-T2V-1.3B-Diffusers --local-dir DIR" in msg and "--random-weights" in msg
    assert "Download it with `vsagen download wan2.1-t2v-1.3b` or `hf download" in msg  # a preset: its own command
    msg = _refusal("some-org/some-model")
    assert "hub id 'some-org/some-model'" in msg and "--random-weights" not in msg and "vsagen download" not in msg
    assert hub.asked == []  # offline: the hub is not asked


@pytest.mark.parametrize("model,repo,base", [
    ("lightx2v-wan2.1-t2v-14b", "lightx2v/Wan2.1-Distill-Models", "Wan-AI/Wan2.1-T2V-14B-Diffusers"),
    ("turbowan2.1-t2v-1.3b-fv", "loayrashid/TurboWan2.1-T2V-1.3B-Diffusers", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"),
    ("turbowan2.2-i2v-a14b-fv", "loayrashid/TurboWan2.2-I2V-A14B-Diffusers", "Wan-AI/Wan2.2-I2V-A14B-Diffusers")])
def test_a_preset_whose_transformer_is_published_apart_offers_only_its_own_download(hub, model, repo, base):
    """A new-user trial: the line told `hf download <the base repository> --local-dir DIR` and --model DIR, which
    runs the stock model (its transformer, its 50-step CFG sampler), not the preset's distilled transformer."""
    msg = _refusal(model)
    assert f"Download it with `vsagen download {model}` (its transformer from {repo}, the rest of the pipeline " \
           f"from {base}) and run the same command again" in msg
    assert "hf download" not in msg and "--model DIR" not in msg and hub.asked == []


def test_a_cached_hub_model_or_one_the_hub_has_goes_on(hub, tiny_dir, monkeypatch):
    """Nothing to refuse: the pipeline in the cache (offline), or the hub answering for it (the load downloads it);
    random weights read nothing."""
    import huggingface_hub.constants

    from vsagen.models.sources import check_hub_files

    hub.store("org/cached", tiny_dir)
    check_hub_files(resolve_model("org/cached"), "org/cached")
    check_hub_files(resolve_model(DEFAULT_MODEL), DEFAULT_MODEL, random_weights=True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    check_hub_files(resolve_model(DEFAULT_MODEL), DEFAULT_MODEL)
    assert hub.asked == ["Wan-AI/Wan2.1-T2V-1.3B-Diffusers"]  # asked for what the cache lacks only


def test_a_half_cached_pipeline_is_not_cached(hub, tiny_dir, tmp_path):
    """A component the model_index.json names missing (a download cut short), or its weights missing: not in the
    cache; a cached weight file truncated: said as such, to download again."""
    partial = tmp_path / "partial"
    shutil.copytree(tiny_dir, partial)
    shutil.rmtree(partial / "vae")
    hub.store("org/partial", partial)
    assert "hub id 'org/partial' is not in the local Hugging Face cache" in _refusal("org/partial")
    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_dir, damaged)
    weights = next((damaged / "transformer").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-100])
    hub.store("org/damaged", damaged)
    from vsagen.models.sources import check_hub_files

    with pytest.raises(BadInput, match=r"^--model org/damaged: transformer/.* is damaged or truncated"):
        check_hub_files(resolve_model("org/damaged"), "org/damaged")


@pytest.mark.parametrize("answer,why", [
    (OSError("[Errno -2] Name or service not known"), "the hub cannot be reached ([Errno -2] Name or service not"),
    ("RepositoryNotFoundError", "the hub has no such repository (or it is private"),
    ("GatedRepoError", "it is gated: accept its terms on huggingface.co")])
def test_the_hubs_answer_for_an_uncached_model_is_the_reason(hub, monkeypatch, answer, why):
    import huggingface_hub.constants
    from huggingface_hub import errors

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    if isinstance(answer, str):  # the hub's HTTP errors, without the HTTP response their constructor reads
        cls = getattr(errors, answer)
        answer = cls.__new__(cls)
        Exception.__init__(answer, "no")
    hub.answer = answer
    msg = _refusal("some-org/some-model")
    assert f"hub id 'some-org/some-model' is not in the local Hugging Face cache and {why}" in msg, msg
    assert hub.asked == ["some-org/some-model"]


def test_a_presets_transformer_files_and_components_are_checked_too(hub, tiny_dir, tmp_path):
    """A `[transformer_files]` preset whose base checkpoint is cached (its transformers not needed) and whose files
    are not: the files' line, naming them all; `--transformer` files given instead: nothing more to have. An
    original-layout preset: its transformer's repository, then its components' checkpoint."""
    from vsagen.models.sources import check_hub_files

    turbo = "turbowan2.2-i2v-a14b"
    base = tmp_path / "base"
    shutil.copytree(tiny_dir, base)
    shutil.rmtree(base / "transformer")  # not read: the preset's files replace it
    hub.store("Wan-AI/Wan2.2-I2V-A14B-Diffusers", base)
    msg = _refusal(turbo)
    assert msg.startswith(f"cannot load model '{turbo}': TurboDiffusion/TurboWan2.2-I2V-A14B-720P (TurboWan2.2-I2V-"
                          "A14B-high-720P.pth, TurboWan2.2-I2V-A14B-low-720P.pth) is not in the local Hugging Face "
                          "cache and the hub is off"), msg
    check_hub_files(resolve_model(turbo), turbo, transformer_files=True)
    assert "hub id 'amd/HummingbirdXT' is not in the local Hugging Face cache" in _refusal("hummingbird-xt")
    transformer = tmp_path / "hummingbird"
    transformer.mkdir()
    (transformer / "config.json").write_text("{}")
    (transformer / "diffusion_pytorch_model.safetensors").write_bytes(b"")
    hub.store("amd/HummingbirdXT", transformer)
    msg = _refusal("hummingbird-xt")
    assert "its components' checkpoint 'Wan-AI/Wan2.2-TI2V-5B-Diffusers' is not in the local Hugging Face" in msg
