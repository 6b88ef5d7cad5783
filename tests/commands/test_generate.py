"""vsagen.commands.generate: one t2v / i2v generation end to end (the crop plan, the mp4 and its timing JSON, the summary),
on CPU with the tiny model in the session's private VSAGEN_CACHE.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from vsagen.commands.generate_config import resolve_generate as resolve
from vsagen.errors import BadInput
from vsagen.media.video import read_mp4

# Fewest denoising steps that still exercise the loop (CFG on: two transformer forwards a step).
STEPS = 2


@pytest.mark.slow
@pytest.mark.parametrize("fit", ["crop", "partial"])
def test_tile_fit_gives_exact_requested_size(vsagen_cache, tiny_dir, tmp_path, fit):
    from vsagen.commands.generate import generate

    # frames 9 -> 3 latent frames; 80 x 112 -> 10 x 14 latent -> grid 3 x 5 x 7, no dimension a multiple of 4.
    out = tmp_path / "crop.mp4"
    cfg = resolve("a red fox in the snow", model="tiny", attn="vsa", frames=9, height=80, width=112, steps=STEPS,
                  tile_fit=fit, out=out)
    result = generate(cfg, progress=False)
    frames = read_mp4(out)
    assert frames.shape == (9, 80, 112, 3)
    data = json.loads(result.json_path.read_text())
    assert result.json_path == tmp_path / "crop.json"
    assert (data["frames"], data["height"], data["width"]) == (9, 80, 112)
    den = data["denoised"]
    if fit == "crop":
        assert den["grid"] == [4, 8, 8] and all(g % 4 == 0 for g in den["grid"])
        assert den["latent"] == [4, 16, 16]
        assert (den["frames"], den["height"], den["width"]) == (13, 128, 128)
        assert den["tiles"] == den["full_tiles"] == 4 and den["tokens"] == 256
    else:
        assert den["grid"] == [3, 5, 7] and den["latent"] == [3, 10, 14]
        assert (den["frames"], den["height"], den["width"]) == (9, 80, 112)
        assert den["full_tiles"] == 0 and den["tokens"] == 105
    assert data["tile_fit"] == fit
    assert data["timing"]["dit_forwards"] == 2 * STEPS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crop.json", "crop.mp4"]  # no temporary files left


@pytest.mark.slow
def test_tiny_run_reports_random_weights_but_its_own_prompt_embeddings(vsagen_cache, tmp_path):
    from vsagen.commands.generate import generate

    cfg = resolve("a prompt", model="tiny", steps=1, guidance=1.0, out=tmp_path / "t.mp4")
    result = generate(cfg, progress=False)
    assert result.summary["random_weights"] is True and result.summary["random_prompt_embeddings"] is False
    assert result.summary["timing"]["dit_forwards"] == 1  # guidance 1.0: no CFG, one forward a step


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_vsa_at_sparsity_zero_gives_the_frames_of_full(vsagen_cache, tiny_dir, tmp_path, encoder_frames,
                                                       impl):
    """`--attn vsa --sparsity 0` (every tile selected) must give the frames of `--attn full`.

    The frames are compared as handed to the encoder: the two runs differ by float32 rounding (~1e-7 relative
    at the transformer output), which can move a pixel across a uint8 rounding boundary (at most 1 level);
    H.264 is lossy and may turn such a 1-level change into different encoder decisions, so the mp4 bytes are
    not compared. The Triton kernels run under the interpreter here (conftest sets TRITON_INTERPRET=1); the
    grid 2x5x7 has partial tiles on both spatial axes.
    """
    from vsagen.commands.generate import generate

    frames = encoder_frames
    common = dict(model="tiny", frames=5, height=80, width=112, steps=1, device="cpu")
    generate(resolve("a fox", attn="full", out=tmp_path / "full.mp4", **common), progress=False)
    vsa = generate(resolve("a fox", attn="vsa", sparsity=0.0, attn_impl=impl, out=tmp_path / "vsa.mp4", **common),
                   progress=False)
    assert vsa.summary["backend"] == {"name": "vsa", "sparsity": 0.0, "impl": impl, "tile": "4x4x4",
                                         "impl_ran": impl}
    assert vsa.summary["denoised"]["tiles"] == 4 and vsa.summary["denoised"]["full_tiles"] == 0
    a, b = frames["full"].astype(int), frames["vsa"].astype(int)
    assert a.shape == b.shape == (5, 80, 112, 3)
    assert np.abs(a - b).max() <= 1
    assert (a != b).mean() < 1e-3
    assert read_mp4(vsa.video_path).shape == (5, 80, 112, 3)



@pytest.mark.slow
def test_summary_is_the_json_and_describes_the_request(vsagen_cache, tiny_dir, tmp_path, encoder_frames):
    import vsagen
    from vsagen.commands.generate import RunResult, generate

    lines: list[str] = []
    cfg = resolve("a fox", model="tiny", frames=5, height=64, width=64, steps=1, seed=7, out=tmp_path / "v.mp4",
                  sheet=True)
    result = generate(cfg, log=lines.append, progress=False)
    assert isinstance(result, RunResult)
    assert (result.video_path, result.json_path) == (tmp_path / "v.mp4", tmp_path / "v.json")
    data = json.loads(result.json_path.read_text())
    assert data == json.loads(json.dumps(result.summary))  # the file is the summary
    assert (data["frames"], data["height"], data["width"], data["steps"], data["seed"]) == (5, 64, 64, 1, 7)
    assert data["backend"] == {"name": "full", "impl_ran": "sdpa"}  # what ran, as every backend says it
    assert data["attn"] == "full" and data["model"] == "tiny"
    assert data["experts"] == ["transformer"] and data["guidance_2"] is None and data["boundary_ratio"] is None
    assert data["image"] is None and data["last_image"] is None and data["random_weights"] is True
    assert data["versions"]["vsagen"] == vsagen.__version__
    assert data["timing"] == result.report.to_dict() and result.report.dit_forwards == 2
    assert result.report.write_s > 0 and result.report.load_s > 0
    video = read_mp4(result.video_path)
    assert video.shape == (5, 64, 64, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.json", "v.mp4", "v.sheet.png"]
    # the prompt and settings in the mp4's own metadata
    from vsagen.media.formats import read_metadata

    tags = read_metadata(result.video_path)
    assert tags["title"] == "a fox" and data["format"] == "mp4"
    assert json.loads(tags["comment"]) == {
        "prompt": "a fox", "negative_prompt": cfg.negative_prompt, "model": "tiny", "attn": "full", "cache": "none",
        "sampler": "default", "steps": 1, "seed": 7, "frames": 5, "height": 64, "width": 64, "fps": data["fps"],
        "guidance": data["guidance"], "guidance_2": None, "image": None, "vsagen": vsagen.__version__}
    assert tags["description"] == f"vsagen {vsagen.__version__}: tiny, --attn full, 1 steps default, seed 7, 5x64x64"
    # --sheet: published with the pair, every frame of the 5 as the encoder got it, titled with the run
    from PIL import Image

    from vsagen.media.sheet import sheet_layout

    assert data["sheet"] == str(tmp_path / "v.sheet.png") and any("v.sheet.png" in line for line in lines)
    sheet = np.asarray(Image.open(tmp_path / "v.sheet.png").convert("RGB"))
    layout = sheet_layout(5, 64, 64, data["fps"], "tiny | attn full | 5x64x64 (frames x height x width) | 1 step "
                                                  "| seed 7")
    assert sheet.shape[:2] == (layout.height, layout.width) and layout.indices == [0, 1, 2, 3, 4]
    for index, (x, y) in zip(layout.indices, layout.tiles):
        assert np.array_equal(sheet[y:y + 64, x:x + 64], encoder_frames["v"][index]), index


@pytest.mark.slow
def test_out_gif_writes_an_animated_gif_and_an_unknown_extension_is_refused_before_loading(vsagen_cache, tiny_dir,
                                                                                           tmp_path):
    from PIL import Image
    from typer.testing import CliRunner

    from vsagen.cli.app import app

    common = ["t2v", "a fox", "--model", "tiny", "--frames", "5", "--height", "48", "--width", "80", "--steps", "1"]
    res = CliRunner().invoke(app, [*common, "--out", str(tmp_path / "a.avi")])
    assert res.exit_code == 2 and "loading" not in res.stderr
    assert res.stderr.strip().splitlines() == [f"error: --out {tmp_path / 'a.avi'}: the extension picks the format: "
                                               ".mp4 (H.264), .webm (VP9), .gif (animated) or .png (one PNG per "
                                               "frame); give a path ending in one of them"]
    res = CliRunner().invoke(app, [*common, "--out", str(tmp_path / "p.gif"), "--json"])
    assert res.exit_code == 0, res.output
    gif = Image.open(tmp_path / "p.gif")
    assert (gif.n_frames, gif.size) == (5, (80, 48))
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["format"] == "gif" and data["video"] == str(tmp_path / "p.gif")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.gif", "p.json"]


@pytest.mark.slow
def test_json_that_appears_during_the_run_is_not_replaced(vsagen_cache, tiny_dir, tmp_path, monkeypatch):
    """Without --overwrite a timing JSON that appears while the run writes its video is kept, and the video is not
    published either: the two appear together or not at all."""
    import vsagen.media.video
    from vsagen.commands.generate import generate

    real = vsagen.media.video.encode_mp4_stream

    def write_then_race(chunks, path, *args, **kwargs):
        times = real(chunks, path, *args, **kwargs)
        (tmp_path / "r.json").write_text("another run's report")
        return times

    monkeypatch.setattr(vsagen.media.video, "encode_mp4_stream", write_then_race)
    cfg = resolve("a fox", model="tiny", frames=5, height=64, width=64, steps=1, out=tmp_path / "r.mp4")
    with pytest.raises(BadInput) as info:
        generate(cfg, progress=False)
    msg = str(info.value)
    assert "r.json exists (appeared during the run)" in msg and "--overwrite" in msg and "nothing was written" in msg
    assert "\n" not in msg
    assert (tmp_path / "r.json").read_text() == "another run's report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # no video, no temporary file


@pytest.mark.slow
@pytest.mark.parametrize("signum", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_signal_while_the_mp4_is_written_leaves_no_file(vsagen_cache, tiny_dir, tmp_path, monkeypatch, signum):
    """`vsagen t2v` ended by SIGTERM / SIGHUP / Ctrl-C in the middle of the mp4 encode (a hook sends the signal
    there) leaves neither the video, nor its JSON, nor a temporary file; one line, exit 128 + the signal number."""
    import os
    import signal

    from typer.testing import CliRunner

    import vsagen.media.video
    from vsagen.cli.app import app

    real = vsagen.media.video.encode_mp4_stream

    def interrupted_midway(chunks, path, *args, **kwargs):
        def first_then_signal():
            yield next(iter(chunks))
            assert path.exists()  # the temporary mp4 the encoder thread is writing
            os.kill(os.getpid(), getattr(signal, signum))
            yield from chunks
        return real(first_then_signal(), path, *args, **kwargs)

    monkeypatch.setattr(vsagen.media.video, "encode_mp4_stream", interrupted_midway)
    out = tmp_path / "s.mp4"
    res = CliRunner().invoke(app, ["t2v", "a fox", "--model", "tiny", "--frames", "5", "--height", "64", "--width",
                                   "64", "--steps", "1", "--out", str(out)])
    sig = getattr(signal, signum)
    assert res.exit_code == 128 + int(sig), res.output  # as a shell reports a process ended by the signal
    by = "" if signum == "SIGINT" else f" by {signum}"
    assert res.stderr.strip().splitlines()[-1] == f"error: interrupted{by}; nothing was written"
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))
    # the decode's inference mode ended with it (a generator left suspended inside it kept the thread in inference
    # mode while the result held its traceback: the next tests' autograd failed, in a CI run)
    import torch

    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


def test_a_dmd_run_records_its_sampler_and_runs_one_dit_forward_a_step(vsagen_cache, tiny_dir, tmp_path,
                                                                     encoder_frames):
    """Issue 30: the JSON says which sampler ran with its sigmas and timesteps, that CFG was off, and the timing
    counts one DiT forward per step (3 for dmd, whatever the preset's 4 steps and CFG 5 say)."""
    from vsagen.commands.generate import generate

    cfg = resolve("a fox", model="tiny", frames=5, height=64, width=64, seed=2, sampler="dmd", out=tmp_path / "d.mp4")
    result = generate(cfg, progress=False)
    data = json.loads(result.json_path.read_text())
    assert data["steps"] == 3 and data["guidance"] == 1.0 and data["cfg"] is False
    assert data["sampler"]["name"] == "dmd" and data["sampler"]["timesteps"] == [1000.0, 757.0, 522.0]
    assert [round(s, 6) for s in data["sampler"]["sigmas"]] == [1.0, 0.756757, 0.521739]
    assert data["config"]["sampler"] == data["sampler"]
    assert data["timing"]["dit_forwards"] == 3 and result.report.dit_forwards == 3
    assert len(result.report.dit_per_step_s) == 3  # the steps counted at the installed scheduler


@pytest.mark.slow
def test_each_seed_of_seeds_is_the_video_of_that_seed_alone(vsagen_cache, tiny_dir, tmp_path, encoder_frames):
    """`--seeds 1,2`: one load, one prompt encoding, and each seed's frames bit for bit those of `--seed N` alone
    (compared as handed to the encoder, and decoded). `--random-weights` draws the weights from the seed (a model
    per seed): refused with several seeds."""
    from vsagen.commands.generate import generate, generate_seeds
    from vsagen.commands.generate_config import resolve_runs
    from vsagen.request.options import request_options

    common = dict(model="tiny", frames=5, height=64, width=64, steps=1, device="cpu")
    with pytest.raises(BadInput, match="--random-weights draws the weights from the seed"):
        resolve_runs("a fox", request_options(seeds="1,2", random_weights=True, **common))
    cfgs = resolve_runs("a fox", request_options(seeds="1,2", out=tmp_path / "v.mp4", **common))
    assert [(c.seed, c.out.name, c.json_out.name) for c in cfgs] == [(1, "v-seed1.mp4", "v-seed1.json"),
                                                                    (2, "v-seed2.mp4", "v-seed2.json")]
    published: list = []
    results = generate_seeds(cfgs, progress=False, published=lambda c, r: published.append((c.seed, r)))
    assert [(seed, r.video_path.name) for seed, r in published] == [(1, "v-seed1.mp4"), (2, "v-seed2.mp4")]
    alone = generate(resolve("a fox", seed=2, out=tmp_path / "alone.mp4", **common), progress=False)
    assert np.array_equal(encoder_frames["v-seed2"], encoder_frames["alone"])
    assert not np.array_equal(encoder_frames["v-seed1"], encoder_frames["alone"])
    assert np.array_equal(read_mp4(results[1].video_path), read_mp4(alone.video_path))
    for seed, result in zip((1, 2), results):
        data = json.loads(result.json_path.read_text())
        assert data == json.loads(json.dumps(result.summary))
        assert data["seed"] == seed and data["video"] == str(result.video_path)
        assert data["timing"]["dit_forwards"] == 2  # CFG on: two forwards for its one step, nothing of the other
        encoded_once = [n for n in data["timing"]["notes"] if n.startswith("--seeds: the prompt was encoded once")]
        assert len(encoded_once) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alone.json", "alone.mp4", "v-seed1.json",
                                                          "v-seed1.mp4", "v-seed2.json", "v-seed2.mp4"]


@pytest.mark.slow
def test_an_interrupt_during_a_later_seed_keeps_the_seeds_already_published(vsagen_cache, tiny_dir, tmp_path,
                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default names, each with its seed
    from vsagen.commands.generate import generate_seeds
    from vsagen.commands.generate_config import resolve_runs
    from vsagen.request.options import request_options

    cfgs = resolve_runs("a fox", request_options(model="tiny", frames=5, height=64, width=64, steps=1,
                                                 device="cpu", seeds="4,5,6", sheet=True))
    done: list = []
    with pytest.raises(KeyboardInterrupt):  # an interrupt swallowed while the second seed's files were made
        generate_seeds(cfgs, progress=False, cancelled=lambda: len(done) == 1,
                       published=lambda c, r: done.append(c.seed))
    assert done == [4] and [c.out.name for c in cfgs] == [f"vsagen-tiny-full-seed{n}.mp4" for n in (4, 5, 6)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vsagen-tiny-full-seed4.json", "vsagen-tiny-full-seed4.mp4",
                                                          "vsagen-tiny-full-seed4.sheet.png"]
    assert cfgs[0].out.exists() and cfgs[0].json_out.exists() and cfgs[0].sheet_out.exists()
    assert not any(p.exists() for c in cfgs[1:] for p in (c.out, c.json_out, c.sheet_out))
    for p in tmp_path.iterdir():
        p.unlink()
    import signal

    from vsagen.interrupts import SignalInterrupt, as_interrupt

    with pytest.raises(SignalInterrupt) as info, as_interrupt():  # a real Ctrl-C once seed 4 is in place
        generate_seeds(cfgs, progress=False, published=lambda c, r: signal.raise_signal(signal.SIGINT))
    assert info.value.kept  # (it was dropped: seeds 5 and 6 were made, exit 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vsagen-tiny-full-seed4.json", "vsagen-tiny-full-seed4.mp4",
                                                          "vsagen-tiny-full-seed4.sheet.png"]


@pytest.mark.slow
def test_a_resident_model_makes_the_videos_of_generate_for_each_request(vsagen_cache, tiny_dir, tmp_path):
    """`Resident` (vsagen serve's model, loaded once): each request's mp4 and latents are those `generate` makes of
    it alone, byte for byte, across sizes, frames, steps, seeds and prompts; its JSON keeps the load's notes; a
    request that changes the loaded configuration (here the backend) is refused, naming the field."""
    from vsagen.commands.generate import Resident, generate

    flags = dict(model="tiny", steps=1, height=16, width=16, frames=1, device="cpu", attn="full")
    resident = Resident(resolve("loaded", **flags, out=tmp_path / "loaded.mp4"))
    for i, (prompt, extra) in enumerate([("a fox", {}), ("a cat", dict(height=32, frames=5, steps=2, seed=3))]):
        alone = generate(resolve(prompt, **{**flags, **extra}, out=tmp_path / f"alone{i}.mp4"), progress=False)
        served = resident.generate(resolve(prompt, **{**flags, **extra}, out=tmp_path / f"served{i}.mp4"))
        assert served.video_path.read_bytes() == alone.video_path.read_bytes()
        notes = [[n for n in r.summary["timing"]["notes"] if not n.startswith("--vae-tiling auto")]  # (free memory)
                 for r in (served, alone)]
        assert notes[0] == notes[1] and len(served.summary["timing"]["notes"]) == len(alone.summary["timing"]["notes"])
    with pytest.raises(BadInput, match=r"^this request changes backends of the loaded model"):
        resident.generate(resolve("x", **{**flags, "attn": "vsa"}, out=tmp_path / "vsa.mp4"))


def test_a_resident_model_of_random_weights_keeps_its_seed(vsagen_cache, tmp_path):
    """With random weights the seed drew the weights: a request of another seed differs from the loaded model (a
    request of the same seed, another prompt and size, does not)."""
    from vsagen.commands.generate import LoadedFacts

    flags = dict(model="tiny", steps=1, height=16, width=16, frames=1, device="cpu", attn="full", random_weights=True)
    resident = LoadedFacts(resolve("loaded", **flags, seed=1, out=tmp_path / "a.mp4"), run=None)  # (nothing loaded)
    assert resident.differs(resolve("other", **{**flags, "height": 32}, seed=1, out=tmp_path / "b.mp4")) == []
    assert resident.differs(resolve("other", **flags, seed=2, out=tmp_path / "c.mp4")) == ["seed"]


@pytest.mark.slow
def test_a_resident_image_to_video_model_makes_each_request_s_video_of_its_image(vsagen_cache, i2v_dir, tmp_path):
    """A resident image-to-video model (`images_per_video`: loaded without an image): each request brings its image
    (and fit) and may change its backend's per-run options (vsa's sparsity); the mp4 is byte for byte the one
    `generate` makes of that request alone, its JSON recording the image and the backend that ran; another image
    is another video."""
    import pickle
    from dataclasses import replace

    from conftest import noise_image

    from vsagen.commands.generate import Resident, generate
    from vsagen.commands.generate_config import resolve_run
    from vsagen.request.backends import per_run_spec
    from vsagen.request.options import request_options

    flags = dict(model="tiny-i2v", steps=1, height=32, width=48, frames=1, device="cpu", attn="vsa:impl=torch")
    loaded = resolve_run("loaded", request_options(**flags, out=tmp_path / "loaded.mp4"), images_per_video=True)
    assert loaded.image is None and loaded.image_to_video and loaded.images_per_video
    resident = Resident(loaded)
    image = noise_image(tmp_path / "b.jpg", (64, 40), seed=2)
    alone = generate(resolve("a fox", **{**flags, "attn": "vsa:impl=torch:sparsity=0.5"}, image=image, fit="resize",
                             out=tmp_path / "alone.mp4"), progress=False)
    cfg = resolve("a fox", **flags, image=image, fit="resize", out=tmp_path / "served.mp4")
    cfg = replace(cfg, backends=(per_run_spec(loaded.backend, "vsa:sparsity=0.5", flags["attn"]),))
    assert resident.differs(cfg) == [] and resident.backend_for(cfg) is not resident.backend
    facts = pickle.loads(pickle.dumps(resident.facts))  # (what a `vsagen serve --ray` replica sends its front)
    assert facts.differs(cfg) == [] and facts.backend_for(loaded) is None
    assert facts.backend_for(cfg).describe() == resident.backend_for(cfg).describe()  # its plan from the patch size
    served = resident.generate(cfg)
    assert served.video_path.read_bytes() == alone.video_path.read_bytes()
    assert (served.summary["image"], served.summary["fit"]) == (str(image), "resize")
    assert served.summary["backend"]["sparsity"] == alone.summary["backend"]["sparsity"] == 0.5
    other = noise_image(tmp_path / "a.png", (40, 36), seed=1)
    again = resident.generate(replace(cfg, image=other, out=tmp_path / "other.mp4",
                                      json_out=tmp_path / "other.json"))
    assert again.video_path.read_bytes() != served.video_path.read_bytes() and again.summary["image"] == str(other)


def test_what_a_resident_model_lets_a_request_change(vsagen_cache, tmp_path):
    """The fields a request may not change, by the comparison alone (nothing loaded): an image for a text-to-video
    model, none for an image-to-video one; the backend's per-run options but not its cube nor another backend."""
    from dataclasses import replace

    from conftest import noise_image

    from vsagen.attention.spec import resolve_spec
    from vsagen.commands.generate import LoadedFacts
    from vsagen.commands.generate_config import resolve_run
    from vsagen.request.options import request_options

    image = noise_image(tmp_path / "a.png", (32, 32))
    flags = dict(steps=1, height=16, width=16, frames=1, device="cpu", attn="vsa")
    t2v = LoadedFacts(resolve("loaded", model="tiny", **flags, out=tmp_path / "a.mp4"), run=None)
    i2v = LoadedFacts(resolve_run("loaded", request_options(model="tiny-i2v", **flags, out=tmp_path / "b.mp4"),
                                  images_per_video=True), run=None)
    assert i2v.differs(resolve("x", model="tiny-i2v", **flags, image=image, fit="resize", out=tmp_path / "c.mp4")) == []
    assert i2v.differs(replace(i2v.request, images_per_video=False)) == ["image"]
    with_image = resolve("x", model="tiny-ti2v", **{**flags, "height": 32, "width": 32}, image=image,
                         out=tmp_path / "d.mp4")
    assert "image" in t2v.differs(with_image) and "image" not in t2v.differs(replace(with_image, image=None))
    ti2v = LoadedFacts(resolve("loaded", model="tiny-ti2v", **{**flags, "height": 32, "width": 32},
                               out=tmp_path / "e.mp4"), run=None, takes_images=True)  # loaded for both kinds
    assert ti2v.differs(with_image) == [] and ti2v.differs(replace(with_image, image=None)) == []
    request = t2v.request
    assert t2v.differs(replace(request, backends=(resolve_spec("vsa:sparsity=0.3:precision=int8"),))) == []
    assert t2v.differs(replace(request, backends=(resolve_spec("vsa:tile=4x4x8"),))) == ["backends"]
    assert t2v.differs(replace(request, backends=(resolve_spec("sla"),), attn_requested="sla")) == ["backends"]


@pytest.mark.slow
def test_a_lora_of_the_second_expert_is_recorded_and_a_damaged_one_is_refused_before_loading(vsagen_cache, a14b_dir,
                                                                                             tmp_path):
    import hashlib

    from typer.testing import CliRunner

    from conftest import make_transformer
    from lora_files import write_lora
    from vsagen.cli.app import app

    lora = tmp_path / "l.safetensors"
    write_lora(lora, "kohya", make_transformer())
    (tmp_path / "cut.safetensors").write_bytes(lora.read_bytes()[:100])
    common = ["t2v", "a fox", "--model", "tiny-a14b", "--frames", "5", "--height", "48", "--width", "80", "--steps",
              "2"]
    res = CliRunner().invoke(app, [*common, "--lora", str(tmp_path / "cut.safetensors"), "--out",
                                   str(tmp_path / "x.mp4")])
    assert res.exit_code == 2 and "loading" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "cannot read it as safetensors" in res.stderr
    res = CliRunner().invoke(app, [*common, "--lora", f"{lora}:scale=0.5:expert=2", "--lora", f"{lora}:expert=1",
                                   "--out", str(tmp_path / "v.mp4"), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "v.json").read_text())
    sha = hashlib.sha256(lora.read_bytes()).hexdigest()
    assert data["lora"] == [{"file": str(lora), "sha256": sha, "scale": 0.5, "expert": "2",
                             "components": ["transformer_2"], "fused": True},
                            {"file": str(lora), "sha256": sha, "scale": 1.0, "expert": "1",
                             "components": ["transformer"], "fused": True}]
    assert [s["expert"] for s in data["config"]["loras"]] == ["2", "1"]


def test_a_resident_text_image_to_video_model_makes_the_videos_of_t2v_and_i2v_on_one_load(vsagen_cache, tmp_path,
                                                                                        monkeypatch):
    """A text-image-to-video model loaded once with `images` (vsagen serve's): a request with an image runs a
    WanImageToVideoPipeline over the loaded components, one without the loaded WanPipeline, each mp4 byte for byte
    the one `generate` makes of that request alone (`vsagen i2v` / `vsagen t2v`). Where the two hold the VAE in
    different dtypes (a preset's `decode_dtype`, here given to tiny-ti2v: text decodes in bf16, an image keeps fp32),
    the load keeps the image's VAE and text decodes with a bf16 copy; the transformer is the one object. Random
    weights (their builder, `_random_weights_pipeline`; the checkpoint's load: tests/serve/test_routes.py)."""
    import torch

    from conftest import noise_image

    import vsagen.models.loading as loading
    from vsagen.commands.generate import Resident, generate
    from vsagen.commands.generate_config import resolve_run
    from vsagen.request.options import request_options

    real = loading.resolve_vae_dtype
    monkeypatch.setattr(loading, "resolve_vae_dtype", lambda requested, preset, i2v: real(requested, preset, i2v)
                        if requested != "auto" else ("fp32" if i2v else "bf16"))
    flags = dict(model="tiny-ti2v", steps=1, height=32, width=32, frames=1, device="cpu", seed=2, random_weights=True)
    loaded = resolve_run("loaded", request_options(**flags, out=tmp_path / "loaded.mp4"), images_per_video=True)
    resident = Resident(loaded, images=True)
    assert not loaded.images_per_video and resident.takes_images
    image = noise_image(tmp_path / "a.png", (40, 36), seed=1)
    made = {}
    for kind, extra in (("image", dict(image=image)), ("text", {})):  # the image first: the text run after it
        cfg = resolve("a fox", **flags, **extra, out=tmp_path / f"served-{kind}.mp4")
        assert resident.differs(cfg) == []
        made[kind] = (resident.pipe_for(cfg), resident.generate(cfg),
                      generate(resolve("a fox", **flags, **extra, out=tmp_path / f"alone-{kind}.mp4"), progress=False))
    for kind, (_, served, alone) in made.items():
        assert served.video_path.read_bytes() == alone.video_path.read_bytes(), kind
        assert served.summary["vae_dtype"] == alone.summary["vae_dtype"] == ("fp32" if kind == "image" else "bf16")
    image_pipe, text_pipe = made["image"][0], made["text"][0]
    assert (type(text_pipe).__name__, type(image_pipe).__name__) == ("WanPipeline", "WanImageToVideoPipeline")
    assert image_pipe.transformer is text_pipe.transformer and image_pipe.text_encoder is text_pipe.text_encoder
    assert text_pipe.transformer.dtype == torch.float32 and image_pipe.vae is not text_pipe.vae
    notes = made["text"][1].summary["timing"]["notes"]
    assert any("takes text and image requests on this one load" in n for n in notes)
