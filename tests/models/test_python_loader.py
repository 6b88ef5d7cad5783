"""vsagen.models.python_loader: `vsagen.load_pipeline`, the Python API's loader: the same load as the commands
(t2v's pipeline, image to video where asked), its refusals in the function's argument names, torch dtypes, pickle
weights refused unless allowed, an uncached hub preset as ModelNotFound; on CPU with the tiny models, in the session's
private VSAGEN_CACHE.
"""

from __future__ import annotations

import re
import shutil
import time
import warnings
from pathlib import Path

import pytest
import torch
from conftest import cached_locally

import vsagen
from vsagen.commands.generate_config import resolve_generate as resolve
from vsagen.errors import BadInput, ModelNotFound
from vsagen.models.python_loader import _as_arguments

# an uncached hub id must fail without waiting on the network (as in test_loading)
HUB_FAIL_FAST_S = 15.0


def _pickle_only_copy(tiny_dir: Path, dest: Path) -> dict:
    """A private copy of the tiny checkpoint whose transformer has only pickle weights; returns its state dict."""
    from safetensors.torch import load_file

    shutil.copytree(tiny_dir, dest)
    tdir = dest / "transformer"
    sd = load_file(tdir / "diffusion_pytorch_model.safetensors")
    torch.save(sd, tdir / "diffusion_pytorch_model.bin")
    (tdir / "diffusion_pytorch_model.safetensors").unlink()
    return sd

@pytest.mark.slow
def test_load_pipeline_loads_as_t2v_does_and_apply_patches_it(vsagen_cache, tiny_dir, tmp_path):
    from diffusers import WanPipeline

    from vsagen.models.loading import load_model
    from vsagen.models.presets import load_preset

    rng = torch.get_rng_state()
    with warnings.catch_warnings():  # issue 29: diffusers 0.42 warns (FutureWarning) on `torch_dtype=`; it takes dtype
        warnings.simplefilter("error", FutureWarning)
        pipe = vsagen.load_pipeline("tiny")
    assert torch.equal(torch.get_rng_state(), rng)  # load_model seeds torch; the caller's state comes back
    assert type(pipe) is WanPipeline
    assert pipe.transformer.dtype == torch.float32 and pipe.device.type == "cpu"  # "auto" without CUDA
    assert pipe.scheduler.config.flow_shift == load_preset("tiny").defaults.flow_shift
    assert not pipe.vae.use_tiling
    assert Path(pipe.transformer.config._name_or_path).parent == tiny_dir  # the private cache's checkpoint
    t2v = load_model(resolve("a prompt", model="tiny", out=tmp_path / "t.mp4"), log=lambda m: None).pipe
    assert type(t2v.scheduler) is type(pipe.scheduler) and t2v.scheduler.config == pipe.scheduler.config
    ours, theirs = pipe.transformer.state_dict(), t2v.transformer.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(v, theirs[k]) for k, v in ours.items())
    stock = [b.attn1.processor for b in pipe.transformer.blocks]
    with vsagen.apply(pipe, "vsa", impl="torch") as handle:
        assert all(type(b.attn1.processor).__name__ == "VsagenAttnProcessor" for b in pipe.transformer.blocks)
        pipe(prompt="a fox", num_frames=9, height=80, width=112, num_inference_steps=1, output_type="latent")
    assert handle.report().dit_forwards == 2  # one step, CFG on
    assert [b.attn1.processor for b in pipe.transformer.blocks] == stock


def test_load_pipeline_gives_the_image_to_video_pipeline(vsagen_cache, i2v_dir, ti2v_dir):
    from diffusers import WanImageToVideoPipeline, WanPipeline

    assert type(vsagen.load_pipeline("tiny-i2v")) is WanImageToVideoPipeline  # the model's own class
    assert type(vsagen.load_pipeline("tiny-ti2v")) is WanPipeline  # text-image to video: text to video by default
    ti2v = vsagen.load_pipeline("tiny-ti2v", image_to_video=True)
    assert type(ti2v) is WanImageToVideoPipeline and ti2v.config.expand_timesteps


@pytest.mark.parametrize("model,kwargs,match", [
    ("nope", {}, "unknown model 'nope'"),
    ("tiny", {"device": "gpu"}, "device must be one of auto, cuda, cpu, got 'gpu'"),
    ("tiny", {"dtype": "int8"}, "dtype must be one of"),
    ("tiny", {"dtype": torch.int8}, "dtype must be one of auto, bf16, fp16, fp32 or torch.bfloat16, torch.float16, "
                                    "torch.float32, got torch.int8"),
    ("some-org/some-model", {"random_weights": True}, "random_weights=True builds a preset's architecture"),
    ("/tmp/nonexistent_dir", {}, "vsagen.load_pipeline: model '/tmp/nonexistent_dir': no such folder"),
    ("tiny", {"image_to_video": True}, "image_to_video=True: tiny is a text-to-video model"),
    ("tiny-i2v", {"image_to_video": False}, "image_to_video=False: tiny-i2v is an image-to-video model"),
    (None, {}, "model must be a preset name, a folder or a hub id, got None"),  # not the default model
    (123, {}, "model must be a preset name, a folder or a hub id, got 123"),
])
def test_load_pipeline_bad_input_is_one_line(vsagen_cache, model, kwargs, match):
    with pytest.raises(BadInput) as exc:
        vsagen.load_pipeline(model, **kwargs)
    msg = str(exc.value)
    assert type(exc.value) is BadInput and msg.startswith("vsagen.load_pipeline: ") and match in msg
    assert "\n" not in msg
    assert not re.search(r"--(model|device|dtype|random-weights)\b", msg)  # the Python arguments, not the flags


def test_load_pipeline_names_its_arguments_not_the_flags():
    """New-user trial: load_pipeline's errors said "--dtype must be one of ..." and "pass --model DIR, or try
    --model tiny"; they name the Python arguments, and leave other tools' flags (hf's --local-dir) alone."""

    assert _as_arguments("--dtype must be one of auto, bf16, fp16, fp32, got 'x'") == \
        "dtype must be one of auto, bf16, fp16, fp32, got 'x'"
    assert _as_arguments("Download it with `hf download o/n --local-dir DIR` and pass --model DIR, time its "
                         "architecture with --random-weights, or try --model tiny") == (
        "Download it with `hf download o/n --local-dir DIR` and pass model=DIR, time its architecture with "
        "random_weights=True, or try model='tiny'")
    assert _as_arguments("--device cuda needs CUDA; pass --device cpu, --allow-pickle or --attn full") == \
        "device='cuda' needs CUDA; pass device='cpu', allow_pickle=True or --attn full"
    assert _as_arguments("--transformer x.pth: --transformer-ish --models") == \
        "transformer x.pth: --transformer-ish --models"


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, "fp32"])
def test_load_pipeline_takes_a_torch_dtype(vsagen_cache, dtype):
    pipe = vsagen.load_pipeline("tiny", device="cpu", dtype=dtype)
    assert pipe.transformer.dtype == (torch.float32 if dtype == "fp32" else dtype)


def test_load_pipeline_refuses_pickle_weights_unless_allowed(vsagen_cache, tiny_dir, tmp_path):
    ckpt = tmp_path / "pickled"
    sd = _pickle_only_copy(tiny_dir, ckpt)
    with pytest.raises(BadInput, match=r"^vsagen.load_pipeline: model .*transformer/ has only pickle weights"):
        vsagen.load_pipeline(ckpt)  # a Path
    state = vsagen.load_pipeline(ckpt, allow_pickle=True).transformer.state_dict()
    assert all(torch.equal(state[k], v) for k, v in sd.items())


def test_load_pipeline_of_a_preset_not_downloadable_here_is_model_not_found(vsagen_cache):
    hub_id = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
    if cached_locally(hub_id):
        pytest.skip(f"{hub_id} is in the local Hugging Face cache")
    t0 = time.perf_counter()
    with pytest.raises(ModelNotFound) as exc:
        vsagen.load_pipeline("wan2.1-t2v-1.3b")
    assert time.perf_counter() - t0 < HUB_FAIL_FAST_S
    msg = str(exc.value)
    assert msg.startswith("vsagen.load_pipeline: cannot load model 'wan2.1-t2v-1.3b'") and hub_id in msg
    assert f"hf download {hub_id}" in msg and "\n" not in msg


