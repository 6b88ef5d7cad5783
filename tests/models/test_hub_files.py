"""vsagen.models.hub_files: the hub files a preset's run reads, from fake repository listings (no network): the
pipeline's components (safetensors preferred, nothing outside the component folders), a transformer published alone
in place of the checkpoint's own, an original-layout transformer with another checkpoint's components, a light
VAE decoder's folder; tiny presets and files the hub lacks refused."""

from __future__ import annotations

import pytest

from vsagen.models.hub_files import HubFile, components_of, folder_files, preset_files
from vsagen.models.presets import load_preset

INDEX = {"_class_name": "WanPipeline", "scheduler": ["diffusers", "UniPCMultistepScheduler"],
         "text_encoder": ["transformers", "UMT5EncoderModel"], "tokenizer": ["transformers", "T5TokenizerFast"],
         "transformer": ["diffusers", "WanTransformer3DModel"], "transformer_2": [None, None],
         "vae": ["diffusers", "AutoencoderKLWan"]}
PIPELINE = {"model_index.json": 10, "scheduler/scheduler_config.json": 1, "text_encoder/config.json": 2,
            "text_encoder/model.safetensors": 300, "tokenizer/spiece.model": 4, "transformer/config.json": 5,
            "transformer/diffusion_pytorch_model.safetensors": 600, "transformer/diffusion_pytorch_model.bin": 600,
            "vae/config.json": 7, "vae/diffusion_pytorch_model.safetensors": 80, "README.md": 9, "assets/a.png": 9}
NEEDED = sorted(set(PIPELINE) - {"transformer/diffusion_pytorch_model.bin", "README.md", "assets/a.png"})


def paths(files):
    return sorted(f"{f.repo}/{f.path}" for f in files)


def test_components_and_folders():
    assert components_of(INDEX) == ["scheduler", "text_encoder", "tokenizer", "transformer", "vae"]
    listing = {"t/a.safetensors": 1, "t/a.bin": 1, "t/sub/b.safetensors": 1, "u/a.bin": 2}
    assert folder_files("r", listing, "t") == [HubFile("r", "t/a.safetensors", 1)]
    assert folder_files("r", listing, "u") == [HubFile("r", "u/a.bin", 2)]  # no safetensors: what there is
    variants = {"v/m-00001-of-00002.safetensors": 1, "v/m-00002-of-00002.safetensors": 1,
                "v/m.safetensors.index.json": 1, "v/m.fp16-00001-of-00001.safetensors": 1,
                "v/m.safetensors.index.fp16.json": 1, "v/d.bf16.safetensors": 1, "v/config.json": 1}
    assert [f.path for f in folder_files("r", variants, "v")] == [
        "v/config.json", "v/m-00001-of-00002.safetensors", "v/m-00002-of-00002.safetensors",
        "v/m.safetensors.index.json"]
    only = {"w/d.fp16.safetensors": 1}
    assert [f.path for f in folder_files("r", only, "w")] == ["w/d.fp16.safetensors"]  # no plain one: kept


def test_a_diffusers_preset_reads_its_components():
    preset = load_preset("wan2.1-t2v-1.3b")
    files = preset_files(preset, lambda repo: PIPELINE, lambda repo: INDEX)
    assert paths(files) == [f"{preset.hub_id}/{p}" for p in NEEDED]
    assert sum(f.size for f in files) == sum(PIPELINE[p] for p in NEEDED)


def test_a_published_transformer_replaces_the_checkpoints_own():
    preset = load_preset("turbowan2.1-t2v-1.3b")
    repo, names = preset.transformer_files
    listings = {preset.hub_id: PIPELINE, repo: {names[0]: 5000, "README.md": 1, "other.pth": 4000}}
    files = preset_files(preset, listings.__getitem__, lambda r: INDEX)
    assert paths(files) == sorted([f"{preset.hub_id}/{p}" for p in NEEDED if not p.startswith("transformer/")]
                                  + [f"{repo}/{names[0]}"])
    with pytest.raises(ValueError, match=f"the hub lacks {repo}/{names[0]}"):
        preset_files(preset, {preset.hub_id: PIPELINE, repo: {}}.__getitem__, lambda r: INDEX)


def test_an_original_layout_transformer_takes_anothers_components_and_its_light_decoder():
    preset = load_preset("hummingbird-xt")
    sub, light = preset.transformer_subfolder.strip("/"), preset.light_vae.subfolder
    prefix = f"{sub}/" if sub else ""
    own = {f"{prefix}config.json": 1, f"{prefix}model.safetensors": 900, f"{prefix}notes.txt": 1,
           f"{light}/config.json": 2, f"{light}/diffusion_pytorch_model.safetensors": 30, "README.md": 3}
    listings = {preset.hub_id: own, preset.components: PIPELINE}
    files = preset_files(preset, listings.__getitem__, lambda r: INDEX)
    assert paths(files) == sorted(
        [f"{preset.components}/{p}" for p in NEEDED if not p.startswith("transformer/")]
        + [f"{preset.hub_id}/{p}" for p in (f"{prefix}config.json", f"{prefix}model.safetensors",
                                            f"{light}/config.json", f"{light}/diffusion_pytorch_model.safetensors")])


def test_a_tiny_preset_has_nothing_on_the_hub():
    with pytest.raises(ValueError, match="built offline"):
        preset_files(load_preset("tiny"), lambda r: {}, lambda r: {})
