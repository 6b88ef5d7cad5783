"""Image to video: the `tiny-i2v` preset (Wan2.1-I2V style: 36-channel transformer, CLIP image branch), its
checkpoint, `vsagen i2v` runs (PNG / JPEG / WebP, both --fit modes, VSA) and bad input; text-image-to-video
(`tiny-ti2v`); first/last frame (`--last-image`: `tiny-flf2v`, `tiny-i2v-a14b`, and the models that refuse it).
CPU, private cache."""

from __future__ import annotations

import copy
import json
import tomllib

import numpy as np
import pytest
import torch
from PIL import Image
from conftest import noise_image, one_error_line
from typer.testing import CliRunner

from vsagen.cli.app import app
from vsagen.errors import BadInput
from vsagen.models.presets import _preset_dir, load_preset, parse_preset
from vsagen.media.video import read_mp4

runner = CliRunner()
# small runs: 5 frames of 64 x 64 (grid 2 x 4 x 4), 1 step, CFG on (two forwards)
SMALL = ["--frames", "5", "--height", "64", "--width", "64", "--steps", "1"]


def i2v(*args: str):
    return runner.invoke(app, ["i2v", *args])


# --------------------------------------------------------------------------------------------------------------
# Preset and checkpoint


def test_i2v_preset_is_the_wan21_i2v_family():
    p = load_preset("tiny-i2v")
    assert p.image_to_video and p.pipeline == "WanImageToVideoPipeline" and p.experts == 1
    assert p.transformer["in_channels"] == 36 and p.transformer["out_channels"] == 16
    assert p.transformer["image_dim"] == p.image_encoder["hidden_size"]
    assert p.defaults.max_sequence_length == 512  # the Wan2.1 I2V image branch assumes 512 text tokens


def test_image_encoder_table_needs_the_i2v_pipeline():
    data = tomllib.loads((_preset_dir() / "tiny-i2v.toml").read_text())
    bad = copy.deepcopy(data)
    bad["pipeline"] = "WanPipeline"
    with pytest.raises(BadInput, match="image_encoder"):
        parse_preset(bad, "x.toml")
    bad = copy.deepcopy(data)
    bad.pop("image_encoder")
    with pytest.raises(BadInput, match="image_encoder"):
        parse_preset(bad, "x.toml")


def test_i2v_checkpoint_round_trips(i2v_dir):
    from diffusers import WanImageToVideoPipeline

    from vsagen.models.tiny import build_tiny_pipeline

    index = json.loads((i2v_dir / "model_index.json").read_text())
    assert index["_class_name"] == "WanImageToVideoPipeline" and index["image_encoder"][1] == "CLIPVisionModel"
    pipe = WanImageToVideoPipeline.from_pretrained(i2v_dir, use_safetensors=True)
    p = load_preset("tiny-i2v")
    assert pipe.transformer.config.in_channels == 36 and pipe.transformer.config.image_dim == 32
    assert pipe.image_encoder.config.image_size == p.image_encoder["image_size"]
    assert pipe.image_processor.crop_size == {"height": 32, "width": 32}
    fresh = build_tiny_pipeline(p)  # deterministic: the saved weights are the built ones
    for name in ("transformer", "image_encoder", "vae"):
        sa, sb = getattr(pipe, name).state_dict(), getattr(fresh, name).state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    # the CLIP features the transformer's image embedder takes: (1, patches + 1, image_dim)
    feats = pipe.encode_image(Image.new("RGB", (64, 48)), torch.device("cpu"))
    assert feats.shape == (1, (32 // 16) ** 2 + 1, 32)


# --------------------------------------------------------------------------------------------------------------
# Fitting the image


# --------------------------------------------------------------------------------------------------------------
# CLI runs


@pytest.mark.parametrize("suffix", ["png", "jpg", "webp"])
def test_i2v_writes_the_requested_video_for_each_format(i2v_dir, tmp_path, suffix):
    img = noise_image(tmp_path / f"in.{suffix}")
    out = tmp_path / "v.mp4"
    res = i2v(str(img), "a fox", "--model", "tiny-i2v", *SMALL, "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert read_mp4(out).shape == (5, 64, 64, 3)
    assert (data["frames"], data["height"], data["width"]) == (5, 64, 64)
    assert data["image"] == str(img) and data["fit"] == "crop"
    assert data["timing"]["dit_forwards"] == 2
    assert sorted(x.name for x in tmp_path.iterdir()) == sorted([img.name, "v.json", "v.mp4"])


@pytest.mark.slow
def test_i2v_without_a_prompt_animates_the_image_and_says_so(i2v_dir, tmp_path):
    """Issue 29: the design card's `vsagen i2v image.png` (no prompt) failed with "Missing argument 'PROMPT'"; the
    image is the content: an empty prompt, one note, and the crop of another aspect said too."""
    from vsagen.commands.generate_config import NO_PROMPT_NOTE

    img = noise_image(tmp_path / "image.png", size=(150, 40))
    out = tmp_path / "v.mp4"
    res = i2v(str(img), "--model", "tiny-i2v", *SMALL, "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert read_mp4(out).shape == (5, 64, 64, 3) and data["config"]["prompt"] == ""
    notes = data["timing"]["notes"]
    assert NO_PROMPT_NOTE in notes and any("loses 73% of its width to the crop" in n for n in notes), notes
    res = runner.invoke(app, ["t2v", " ", "--model", "tiny", "--out", str(tmp_path / "t.mp4")])
    assert res.exit_code == 2 and "the prompt is empty" in res.stderr  # text to video still needs one


@pytest.mark.parametrize("fit", ["crop", "resize"])
def test_both_fits_give_the_size_from_another_aspect(i2v_dir, tmp_path, fit):
    img = noise_image(tmp_path / "wide.png", size=(150, 40))
    out = tmp_path / "f.mp4"
    res = i2v(str(img), "a fox", "--model", "tiny-i2v", "--fit", fit, "--frames", "5", "--height", "48",
              "--width", "96", "--steps", "1", "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["fit"] == fit
    assert read_mp4(out).shape == (5, 48, 96, 3)


def test_i2v_with_vsa_torch(i2v_dir, tmp_path):
    img = noise_image(tmp_path / "in.png")
    out = tmp_path / "s.mp4"
    res = i2v(str(img), "a fox", "--model", "tiny-i2v", "--attn", "vsa", "--attn-impl", "torch", "--sparsity",
              "0.5", *SMALL, "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["backend"] == {"name": "vsa", "sparsity": 0.5, "impl": "torch", "tile": "4x4x4",
                               "impl_ran": "torch"}
    assert set(data["timing"]["self_attention_stages_s"]) == {"coarse", "fine"}
    assert read_mp4(out).shape == (5, 64, 64, 3)


def test_i2v_tile_fit_crop_denoises_larger_and_writes_the_requested_size(i2v_dir, tmp_path):
    img = noise_image(tmp_path / "in.png", size=(80, 48))
    out = tmp_path / "c.mp4"
    res = i2v(str(img), "a fox", "--model", "tiny-i2v", "--tile-fit", "crop", "--frames", "5", "--height", "48",
              "--width", "80", "--steps", "1", "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    den = data["denoised"]  # grid 2 x 3 x 5 rounded up to 4 x 4 x 8 tiles' worth of tokens
    assert (den["frames"], den["height"], den["width"]) == (13, 64, 128) and den["full_tiles"] == den["tiles"]
    assert read_mp4(out).shape == (5, 48, 80, 3)


def test_i2v_random_weights(vsagen_cache, tmp_path):
    img = noise_image(tmp_path / "in.png")
    res = i2v(str(img), "a fox", "--model", "tiny-i2v", "--random-weights", *SMALL, "--out",
              str(tmp_path / "r.mp4"), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["random_weights"] is True


# --------------------------------------------------------------------------------------------------------------
# Bad input: one line, exit 2, nothing written


def test_missing_image(vsagen_cache, tmp_path):
    missing = tmp_path / "nope.png"
    line = one_error_line(i2v(str(missing), "a fox", "--model", "tiny-i2v", "--out", str(tmp_path / "o" / "x.mp4")))
    assert str(missing) in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content", [b"", b"not an image at all"], ids=["empty", "garbage"])
def test_unreadable_image(vsagen_cache, tmp_path, content):
    bad = tmp_path / "bad.png"
    bad.write_bytes(content)
    line = one_error_line(i2v(str(bad), "a fox", "--model", "tiny-i2v", "--out", str(tmp_path / "o" / "x.mp4")))
    assert str(bad) in line
    assert list(tmp_path.iterdir()) == [bad]


def test_decompression_bomb_is_bad_input(vsagen_cache, tmp_path, monkeypatch):
    """An image past PIL's decompression-bomb limit is one error line (exit 2), not PIL's exception; one past
    the warning threshold but under the limit opens without PIL's warning reaching the user."""
    import warnings

    from PIL import Image as PILImage

    from vsagen.media.image import open_image

    img = noise_image(tmp_path / "big.png", size=(48, 40))  # 1,920 pixels
    monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", 1000)  # warning above 1,000, error above 2,000
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert open_image(img).size == (48, 40)
    monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", 500)
    line = one_error_line(i2v(str(img), "a fox", "--model", "tiny-i2v", "--out", str(tmp_path / "o" / "x.mp4")))
    assert "too large" in line and str(img) in line
    assert [p.name for p in tmp_path.iterdir()] == ["big.png"]


def test_image_given_to_a_text_only_model(vsagen_cache, tmp_path):
    img = noise_image(tmp_path / "in.png")
    line = one_error_line(i2v(str(img), "a fox", "--model", "tiny", "--out", str(tmp_path / "o" / "x.mp4")))
    assert "vsagen t2v" in line and "tiny-i2v" in line
    assert list(tmp_path.iterdir()) == [img]


def test_t2v_with_an_i2v_model(vsagen_cache, tmp_path):
    res = runner.invoke(app, ["t2v", "a fox", "--model", "tiny-i2v", "--out", str(tmp_path / "o" / "x.mp4")])
    assert "vsagen i2v IMAGE" in one_error_line(res)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,needle", [
    (["   "], "prompt"),
    (["a fox", "--fit", "stretch"], "--fit"),
], ids=["whitespace-prompt", "bad-fit"])
def test_bad_i2v_options(vsagen_cache, tmp_path, args, needle):
    img = noise_image(tmp_path / "in.png")
    line = one_error_line(i2v(str(img), *args, "--model", "tiny-i2v", "--out", str(tmp_path / "o" / "x.mp4")))
    assert needle in line
    assert list(tmp_path.iterdir()) == [img]


def test_i2v_checkpoint_refused_by_t2v_loader(i2v_dir, tmp_path):
    """A local I2V directory is recognised as image to video (t2v refuses it up front)."""
    res = runner.invoke(app, ["t2v", "a fox", "--model", str(i2v_dir), "--out", str(tmp_path / "x.mp4")])
    assert "vsagen i2v" in one_error_line(res)


# --------------------------------------------------------------------------------------------------------------
# Text-image-to-video (Wan2.2-TI2V-5B style): the `tiny-ti2v` checkpoint (a WanPipeline) animates an image too


def test_ti2v_model_takes_an_image_too(ti2v_dir, tmp_path):
    assert load_preset("tiny-ti2v").takes_image and load_preset("wan2.2-ti2v-5b").takes_image
    img = noise_image(tmp_path / "in.png", size=(90, 60))
    out = tmp_path / "t.mp4"
    res = i2v(str(img), "a fox", "--model", "tiny-ti2v", "--frames", "5", "--height", "64", "--width", "96",
              "--steps", "1", "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["expand_timesteps"] is True and data["image"] == str(img)
    assert read_mp4(out).shape == (5, 64, 96, 3)
    # the saved checkpoint directory (a WanPipeline) runs as image to video too
    res = i2v(str(img), "a fox", "--model", str(ti2v_dir), "--frames", "5", "--height", "64", "--width", "96",
              "--steps", "1", "--out", str(tmp_path / "d.mp4"), "--json")
    assert res.exit_code == 0, res.output


def test_ti2v_image_vsa_at_sparsity_zero_gives_the_frames_of_full(ti2v_dir, tmp_path, encoder_frames):
    """Image to video with per-token timesteps that differ across tokens (the image's first latent frame gets
    t = 0, the rest t): `--attn vsa --sparsity 0` (tile order) gives the frames of `--attn full` (raster
    order), so the timesteps are reordered with the tokens (at most 1 uint8 level apart, as in test_families);
    both implementations against one `full` run."""
    from vsagen.commands.generate_config import resolve_generate as resolve
    from vsagen.commands.generate import generate

    img = noise_image(tmp_path / "in.png", size=(224, 160))
    common = dict(model="tiny-ti2v", frames=5, height=160, width=224, steps=1, device="cpu", image=img)
    generate(resolve("a fox", attn="full", out=tmp_path / "full.mp4", **common), progress=False)
    for impl in ("torch", "triton"):
        vsa = generate(resolve("a fox", attn="vsa", sparsity=0.0, attn_impl=impl, out=tmp_path / f"{impl}.mp4",
                               **common), progress=False)
        assert vsa.summary["denoised"]["grid"] == [2, 5, 7] and vsa.summary["expand_timesteps"] is True
        a, b = encoder_frames["full"].astype(int), encoder_frames[impl].astype(int)
        assert a.shape == b.shape == (5, 160, 224, 3)
        assert np.abs(a - b).max() <= 1, impl
        assert (a != b).mean() < 1e-3, impl


def test_ti2v_random_weights_image_run(vsagen_cache, tmp_path):
    img = noise_image(tmp_path / "in.png")
    res = i2v(str(img), "a fox", "--model", "tiny-ti2v", "--random-weights", "--frames", "5", "--height", "64",
              "--width", "64", "--steps", "1", "--out", str(tmp_path / "r.mp4"), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["random_weights"] is True


# --------------------------------------------------------------------------------------------------------------
# First/last frame (`--last-image`): FLF2V models need it (`tiny-flf2v`: CLIP tokens of both images), image-to-video
# models without a CLIP branch take it (`tiny-i2v-a14b`: the condition alone), the others refuse it


@pytest.fixture
def dit_inputs(monkeypatch):
    """What every transformer forward gets and gives, in call order: `hidden_states` (B, 16 noise + 4 mask + 16
    condition, F, H, W), `encoder_hidden_states_image` (the CLIP features, or None) and its output (the flow)."""
    from diffusers import WanTransformer3DModel

    calls: list[dict] = []
    real = WanTransformer3DModel.forward

    def spy(self, *args, **kwargs):
        image = kwargs.get("encoder_hidden_states_image")
        out = real(self, *args, **kwargs)
        calls.append({"hidden_states": kwargs["hidden_states"].detach().clone(),
                      "image": None if image is None else image.detach().clone(),
                      "output": (out[0] if isinstance(out, tuple) else out.sample).detach().clone()})
        return out

    monkeypatch.setattr(WanTransformer3DModel, "forward", spy)
    return calls


@pytest.fixture
def fits(monkeypatch):
    """The (size, fit) of every `vsagen.media.image.fit_image` call."""
    import vsagen.media.image

    calls: list[tuple] = []
    real = vsagen.media.image.fit_image

    def spy(image, height, width, fit):
        calls.append(((height, width), fit))
        return real(image, height, width, fit)

    monkeypatch.setattr(vsagen.media.image, "fit_image", spy)
    return calls


def mask_of_last_latent_frame(hidden_states):
    """The 4 mask channels of the last latent frame (one per pixel frame it covers), as a list of 0 / 1."""
    return [int(v) for v in hidden_states[0, 16:20, -1].flatten(1).mean(1).round()]


@pytest.mark.parametrize("suffix", ["png", "jpg"])
def test_flf2v_writes_the_video_from_the_first_to_the_last_image(flf2v_dir, tmp_path, dit_inputs, fits, suffix):
    first = noise_image(tmp_path / "first.png", size=(90, 60))
    last = noise_image(tmp_path / f"last.{suffix}", size=(90, 60), seed=1)
    out = tmp_path / "v.mp4"
    res = i2v(str(first), "a fox", "--model", "tiny-flf2v", "--last-image", str(last), "--fit", "resize", *SMALL,
              "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert read_mp4(out).shape == (5, 64, 64, 3)
    assert data["image"] == str(first) and data["last_image"] == str(last) and data["fit"] == "resize"
    assert data["config"]["last_image"] == str(last)
    assert data["timing"]["dit_forwards"] == 2 and data["timing"]["image_encode_s"] > 0
    assert sorted(x.name for x in tmp_path.iterdir()) == sorted([first.name, last.name, "v.json", "v.mp4"])
    assert fits == [((64, 64), "resize")] * 2  # both images fitted alike
    # the transformer gets the CLIP tokens of both images (2 x 5), which its image embedder makes one sequence of
    # 10 with the learned position embedding, and a condition whose mask marks the first and the last frame
    assert dit_inputs[0]["image"].shape == (2, 5, 32)
    assert mask_of_last_latent_frame(dit_inputs[0]["hidden_states"]) == [0, 0, 0, 1]
    assert dit_inputs[0]["hidden_states"][0, 16:20, 0].min() == 1


def test_last_image_goes_into_the_condition_of_a_model_without_clip(i2v_a14b_dir, tmp_path, dit_inputs):
    """Wan2.2-I2V-A14B style (no CLIP branch): the last image is in the condition alone. Its mask marks the last
    frame, its latent is the last condition frame; the first condition frame stays the first image's, and another
    last image (white, then black) changes what the transformer predicts. (The decoded uint8 videos are not
    compared: the tiny random VAE hardly tells images apart; its latents of a white and a black image differ by a
    few 1e-3, less than one uint8 level after denoising and decoding.)"""
    from vsagen.commands.generate_config import resolve_generate as resolve
    from vsagen.commands.generate import generate

    first = noise_image(tmp_path / "first.png")
    lasts = [None, tmp_path / "white.png", tmp_path / "black.jpg"]
    Image.new("RGB", (48, 40), (255, 255, 255)).save(lasts[1])
    Image.new("RGB", (48, 40), (0, 0, 0)).save(lasts[2])
    conditions, outputs = [], []
    for i, last in enumerate(lasts):
        dit_inputs.clear()
        result = generate(resolve("a fox", model="tiny-i2v-a14b", image=first, last_image=last, frames=5, height=64,
                                  width=64, steps=2, device="cpu", out=tmp_path / f"run{i}.mp4"), progress=False)
        assert result.summary["last_image"] == (None if last is None else str(last))
        assert result.summary["experts"] == ["transformer", "transformer_2"]
        assert all(c["image"] is None for c in dit_inputs)  # no CLIP features anywhere
        conditions.append(dit_inputs[0]["hidden_states"])
        outputs.append(torch.stack([c["output"] for c in dit_inputs]))
    assert [mask_of_last_latent_frame(h) for h in conditions] == [[0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 1]]
    latent = [h[0, 20:] for h in conditions]  # the condition latent (after 16 noise and 4 mask channels)
    assert all(torch.equal(latent[0][:, 0], x[:, 0]) for x in latent[1:])  # the first frame: the same image
    assert not torch.allclose(latent[1][:, -1], latent[2][:, -1])  # the last frame: each run's last image
    assert not torch.allclose(latent[0][:, -1], latent[1][:, -1])
    assert outputs[1].shape == (4, 1, 16, 2, 8, 8)  # 2 steps x CFG, one per expert per step
    assert not torch.allclose(outputs[1], outputs[2]) and not torch.allclose(outputs[0], outputs[1])


def test_flf2v_random_weights_with_a_last_image(vsagen_cache, tmp_path):
    first, last = noise_image(tmp_path / "first.png"), noise_image(tmp_path / "last.png", seed=1)
    res = i2v(str(first), "a fox", "--model", "tiny-flf2v", "--random-weights", "--last-image", str(last), *SMALL,
              "--out", str(tmp_path / "r.mp4"), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["random_weights"] is True and data["last_image"] == str(last)


def test_local_flf2v_and_i2v_checkpoints_get_their_own_preset(flf2v_dir, i2v_dir, tmp_path):
    from vsagen.commands.generate_config import resolve_generate as resolve
    from vsagen.models.presets import LAST_IMAGE_ONE_IMAGE, LAST_IMAGE_REQUIRED

    first, last = noise_image(tmp_path / "first.png"), noise_image(tmp_path / "last.png", seed=1)
    cfg = resolve("a fox", model=str(flf2v_dir), image=first, last_image=last, out=tmp_path / "a.mp4")
    assert cfg.source.preset.name == "tiny-flf2v" and cfg.source.last_image == LAST_IMAGE_REQUIRED
    cfg = resolve("a fox", model=str(i2v_dir), image=first, out=tmp_path / "b.mp4")
    assert cfg.source.preset.name == "tiny-i2v" and cfg.source.last_image == LAST_IMAGE_ONE_IMAGE
    with pytest.raises(BadInput, match="--last-image"):
        resolve("a fox", model=str(flf2v_dir), image=first, out=tmp_path / "c.mp4")


@pytest.mark.parametrize("model,last,needles", [
    ("tiny-flf2v", None, ["tiny-flf2v", "FLF2V", "--last-image PATH"]),
    ("wan2.1-flf2v-14b-720p", None, ["FLF2V", "--last-image PATH"]),
    ("tiny-i2v", "last.png", ["CLIP image branch takes one image", "wan2.1-flf2v-14b-720p"]),
    ("wan2.1-i2v-14b-720p", "last.png", ["CLIP image branch takes one image", "wan2.1-flf2v-14b-720p"]),
    ("tiny-ti2v", "last.png", ["text-image-to-video", "ignores a last image"]),
    ("wan2.2-ti2v-5b", "last.png", ["text-image-to-video", "ignores a last image"]),
    ("tiny", "last.png", ["text-to-video model", "vsagen t2v"]),
    ("tiny-i2v-a14b", "missing.png", ["--last-image", "missing.png", "does not exist"]),
    ("tiny-flf2v", "garbage.png", ["--last-image", "garbage.png", "cannot read image"]),
], ids=["flf2v-without", "real-flf2v-without", "clip-one-image", "real-clip-one-image", "ti2v", "real-ti2v",
        "t2v-model", "missing", "unreadable"])
def test_last_image_refusals(vsagen_cache, tmp_path, model, last, needles):
    first = noise_image(tmp_path / "first.png")
    files = [first]
    if last is not None and last != "missing.png":
        files.append(noise_image(tmp_path / last, seed=1))
        if last == "garbage.png":
            files[-1].write_bytes(b"not an image at all")
    extra = [] if last is None else ["--last-image", str(tmp_path / last)]
    line = one_error_line(i2v(str(first), "a fox", "--model", model, *extra, "--out", str(tmp_path / "o" / "x.mp4")))
    assert all(n in line for n in needles), line
    assert sorted(tmp_path.iterdir()) == sorted(files)


def test_last_image_needs_more_than_one_frame(vsagen_cache, tmp_path):
    first, last = noise_image(tmp_path / "first.png"), noise_image(tmp_path / "last.png", seed=1)
    line = one_error_line(i2v(str(first), "a fox", "--model", "tiny-flf2v", "--last-image", str(last), "--frames", "1",
                              "--out", str(tmp_path / "x.mp4")))
    assert "--frames 5 or more" in line
    assert sorted(tmp_path.iterdir()) == sorted([first, last])


def test_last_image_is_for_image_to_video_only(vsagen_cache, tmp_path, monkeypatch, capsys):
    """`vsagen t2v` has no --last-image (the console script's `main()` makes that one error line, exit 2), and the
    library refuses a last image without a first one."""
    import sys

    from vsagen.cli.app import main
    from vsagen.commands.generate_config import resolve_generate as resolve

    last = noise_image(tmp_path / "last.png")
    monkeypatch.setattr(sys, "argv", ["vsagen", "t2v", "a fox", "--model", "tiny", "--last-image", str(last),
                                      "--out", str(tmp_path / "x.mp4")])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    err = capsys.readouterr()
    lines = err.err.strip().splitlines()
    assert err.out == "" and len(lines) == 1 and lines[0].startswith("error: ") and "--last-image" in lines[0]

    with pytest.raises(BadInput, match="vsagen i2v IMAGE PROMPT --last-image"):
        resolve("a fox", model="tiny", last_image=last, out=tmp_path / "x.mp4")
    assert list(tmp_path.iterdir()) == [last]


def test_last_image_with_a_frame_crop_is_refused(vsagen_cache, tmp_path):
    """--tile-fit crop pads frames at the end and crops them off: the last image would be cut away."""
    first, last = noise_image(tmp_path / "a.png"), noise_image(tmp_path / "b.png", seed=1)
    line = one_error_line(i2v(str(first), "a fox", "--model", "tiny-flf2v", "--last-image", str(last),
                              "--tile-fit", "crop", "--frames", "5", "--height", "64", "--width", "64",
                              "--out", str(tmp_path / "o" / "x.mp4")))
    assert "--tile-fit" in line and "--last-image" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.png"]


@pytest.mark.parametrize("model", ["tiny-flf2v", "tiny-i2v-a14b"])
def test_vsa_triton_on_the_first_last_frame_families(flf2v_dir, i2v_a14b_dir, tmp_path, model):
    """`--attn vsa` (Triton kernels under the interpreter) on the FLF2V and the two-expert CLIP-less I2V
    families, with a last image: both experts run and the backend reports its stages."""
    first, last = noise_image(tmp_path / "a.png"), noise_image(tmp_path / "b.png", seed=1)
    res = i2v(str(first), "a fox", "--model", model, "--last-image", str(last), "--attn", "vsa", "--attn-impl",
              "triton", "--sparsity", "0.5", *SMALL, "--out", str(tmp_path / "v.mp4"), "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["backend"] == {"name": "vsa", "sparsity": 0.5, "impl": "triton", "tile": "4x4x4",
                               "impl_ran": "triton"}
    assert set(data["timing"]["self_attention_stages_s"]) == {"coarse", "fine"}
    assert data["last_image"] == str(last)
    assert read_mp4(tmp_path / "v.mp4").shape == (5, 64, 64, 3)
