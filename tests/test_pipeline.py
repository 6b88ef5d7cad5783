"""vsagen.pipeline: the orchestrator. `Session` (load once, run backends from one seed, unpatch after each run),
the condition-stage timers of image to video, out-of-memory errors, `Conditioning`'s call arguments, the expert
arguments, and which runs get the fused block regions / what the compile notes say.

CPU, tiny model, the session's private VSAGEN_CACHE.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from vsagen.errors import RunFailure
from vsagen.layout import plan_crop
from vsagen.errors import out_of_memory_as_failure
from vsagen.pipeline import Conditioning, Denoised, expert_kwargs


def test_condition_stage_wrappers_are_removed_and_time_apart(vsagen_cache):
    """`time_condition_stages` wraps the two methods on the instance only, times them apart from the open outer
    region, passes arguments and results through, and `restore` leaves the instance as it was."""
    from vsagen.pipeline import time_condition_stages
    from vsagen.timing import Timer

    class Pipe:
        def encode_image(self, image, device=None):
            time.sleep(0.005)
            return ("embeds", image, device)

        def prepare_latents(self, *args, **kwargs):
            time.sleep(0.005)
            return ("latents", args, kwargs)

    pipe, timer = Pipe(), Timer("cpu")
    restore = time_condition_stages(pipe, timer)
    assert {"encode_image", "prepare_latents"} <= set(vars(pipe))
    with timer.region("denoise"):
        assert pipe.encode_image("img", "cpu") == ("embeds", "img", "cpu")
        assert pipe.prepare_latents(1, k=2) == ("latents", (1,), {"k": 2})
    restore()
    assert vars(pipe) == {}
    names = [n for n, _, _ in timer.finish()]
    assert names.count("image_encode") == names.count("condition_encode") == 1
    assert names.count("denoise") == 3  # before, between and after the two carved-out stages


# --------------------------------------------------------------------------------------------------------------
# Session: one load, several runs


@pytest.fixture
def tiny_session(vsagen_cache, tiny_dir, tmp_path):
    """A Session on the tiny model at 5 x 64 x 64 (grid 2 x 4 x 4), one step, CFG on, CPU."""
    from vsagen.attention import make_backend
    from vsagen.commands.generate_config import resolve_generate as resolve
    from vsagen.pipeline import Session

    cfg = resolve("a red fox", model="tiny", frames=5, height=64, width=64, steps=1, warmup=0, device="cpu",
                  out=tmp_path / "s.mp4")
    full, vsa = make_backend("full"), make_backend("vsa", 0.5, "torch")
    return Session.load(cfg, [full, vsa]), full, vsa


@pytest.mark.slow
def test_session_runs_repeat_from_the_seed_and_unpatch(tiny_session):
    from vsagen.attention.processor import VsagenAttnProcessor

    session, full, vsa = tiny_session
    plan = session.plan("partial")
    assert plan.latent == (2, 8, 8) and plan.denoise_grid == (2, 4, 4)
    stock = [type(b.attn1.processor) for b in session.pipe.transformer.blocks]
    a = session.run(full, plan)
    prompts = session._prompts
    b = session.run(full, plan)
    assert session._prompts is prompts  # encoded once, reused by every run that does not encode its own
    assert a.latents.shape == (1, 16, *plan.latent) and a.video is None and a.warmup_s == 0.0
    assert torch.equal(a.latents, b.latents)  # every run seeds a fresh CPU generator
    sparse = session.run(vsa, plan)
    assert not torch.equal(sparse.latents, a.latents)  # sparsity 0.5 on 2 x 4 x 4: another result
    assert [type(b.attn1.processor) for b in session.pipe.transformer.blocks] == stock
    assert VsagenAttnProcessor not in stock
    for run in (a, sparse):
        names = [n for n, _, _ in run.records]
        assert names.count("total") == names.count("denoise") == 1 and "text_encode" not in names
        assert names.count("dit") == 2  # one step, CFG: two forwards
        assert names.count("self_attention") == 2 * len(session.pipe.transformer.blocks)
    assert sparse.layout_s > 0 and a.layout_s == 0.0  # `full` runs in raster order: no reordering


@pytest.mark.slow
def test_session_run_with_encode_decode_and_warmup(tiny_session):
    session, full, _ = tiny_session
    plan = session.plan("partial")
    decoded = []  # latent frames a decoder call: the warm-up's first two, untimed, then the run's decode
    original = session.pipe.vae.decoder.forward
    session.pipe.vae.decoder.forward = lambda x, *a, **k: decoded.append(x.shape[2]) or original(x, *a, **k)
    try:
        run = session.run(full, plan, warmup=1, encode=True, decode=True)
    finally:
        del session.pipe.vae.decoder.forward
    assert decoded == [1] * (2 + plan.latent[0])
    names = [n for n, _, _ in run.records]
    assert {"total", "text_encode", "denoise", "vae_decode"} <= set(names)
    assert names.count("dit") == 2  # the warm-up step's forwards are not recorded
    assert run.warmup_s > 0
    parts = run.warmup_parts  # the warm-up step and the decoder's first call, nothing compiled here
    assert set(parts) == {"denoise", "compile", "decode"} and parts["denoise"] > 0 and parts["decode"] > 0
    assert parts["denoise"] + parts["decode"] == pytest.approx(run.warmup_s) and parts["compile"] == 0
    assert run.video.shape == (1, 3, 5, 64, 64)
    assert float(run.video.min()) >= -1.0 - 1e-3 and float(run.video.max()) <= 1.0 + 1e-3
    # without a backend: the pipeline's own processors, DiT timing only
    stock = session.run(None, plan)
    names = [n for n, _, _ in stock.records]
    assert names.count("dit") == 2 and "attn1" not in names and "self_attention" not in names


@pytest.mark.slow
def test_a_backends_notes_are_the_sessions_once_loaded_and_once_after_runs(vsagen_cache, tiny_dir, tmp_path,
                                                                          monkeypatch):
    """A backend's `prepare` notes (vsa's query_rows=128 under the torch reference) are in the session's notes once
    the model is loaded, so `vsagen t2v` says them before the denoising bar (they came after the run before), and a
    run that binds the backend adds them no second time. A kernel's run note (`kernels.runtime_notes`, e.g. the
    Gluon forward falling back) joins them after the run, once (issue 44)."""
    import vsagen.kernels.runtime_notes as kernel_notes
    from vsagen.attention import make_backend
    from vsagen.commands.generate_config import resolve_generate as resolve
    from vsagen.pipeline import Session

    monkeypatch.setattr(kernel_notes, "_NOTES", [])

    cfg = resolve("a red fox", model="tiny", frames=5, height=64, width=64, steps=1, warmup=0, device="cpu",
                  out=tmp_path / "s.mp4")
    vsa = make_backend("vsa", None, "torch", tile="4x4x8", query_rows=128)
    session = Session.load(cfg, [vsa])
    said = [n for n in session.notes if "query_rows=128 has no effect" in n]
    assert len(said) == 1
    kernel_notes.add_note("a kernel fell back")  # as a launch in the run would
    session.run(vsa, session.plan("partial"))
    session.run(vsa, session.plan("partial"))
    assert [n for n in session.notes if "query_rows=128 has no effect" in n] == said
    assert session.notes.count("a kernel fell back") == 1


# --------------------------------------------------------------------------------------------------------------
# Helpers of a run


def test_out_of_memory_becomes_a_run_failure_with_the_hints():
    with pytest.raises(RunFailure) as info:
        hints = ["--offload group (or model)", "--vae-tiling on"]
        with out_of_memory_as_failure("profiling vsa (tile fit crop)", hints):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
    msg = str(info.value)
    assert msg == ("out of GPU memory while profiling vsa (tile fit crop) (CUDA out of memory. Tried to allocate "
                   "2.00 GiB); try --offload group (or model) and --vae-tiling on")
    assert info.value.exit_code == 1 and isinstance(info.value.__cause__, torch.cuda.OutOfMemoryError)
    with pytest.raises(RunFailure, match=r"while generating \(CUDA out of memory\)$"):
        with out_of_memory_as_failure("generating"):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
    with pytest.raises(ValueError, match="not memory"):  # anything else passes through unchanged
        with out_of_memory_as_failure("generating"):
            raise ValueError("not memory")
    with out_of_memory_as_failure("generating"):
        pass


def _picture(h, w, seed):
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


@pytest.mark.parametrize("tile_fit", ["partial", "crop"])
def test_conditioning_arguments_fit_then_extend_to_the_denoised_size(tile_fit):
    from vsagen.media.image import fit_image

    plan = plan_crop(5, 80, 112, fit=tile_fit, vae_stride_temporal=4, vae_stride_spatial=8, patch_size=(1, 2, 2))
    first, last = _picture(50, 90, 0), _picture(70, 40, 1)
    args = Conditioning(first, last, "crop").arguments(80, 112, plan)
    assert set(args) == {"image", "last_image"}
    for key, src in (("image", first), ("last_image", last)):
        got = np.asarray(args[key])
        assert got.shape == (plan.denoise_height, plan.denoise_width, 3)
        want = np.asarray(fit_image(src, 80, 112, "crop"))
        assert np.array_equal(got[:80, :112], want)  # the requested picture in the top-left corner
    assert (plan.denoise_height, plan.denoise_width) == ((80, 112) if tile_fit == "partial" else (128, 128))
    # one picture only, already at the size (fit None): passed on as it is when nothing is extended
    only = Conditioning(_picture(80, 112, 2), None, None)
    args = only.arguments(80, 112, plan)
    assert set(args) == {"image"}
    if tile_fit == "partial":
        assert args["image"] is only.image


def test_synthetic_conditioning_is_seeded_and_sized():
    a = Conditioning.synthetic(48, 80, 3, last=True)
    b = Conditioning.synthetic(48, 80, 3, last=False)
    assert a.fit is None and b.last_image is None
    assert a.image.size == a.last_image.size == (80, 48)
    assert np.array_equal(np.asarray(a.image), np.asarray(b.image))
    assert not np.array_equal(np.asarray(a.image), np.asarray(a.last_image))  # seed + 1 for the last frame


def test_expert_kwargs_only_for_two_experts():
    from types import SimpleNamespace

    two = SimpleNamespace(config=SimpleNamespace(boundary_ratio=0.875))
    one = SimpleNamespace(config=SimpleNamespace(boundary_ratio=None))
    assert expert_kwargs(two, SimpleNamespace(guidance_2=3.5)) == {"guidance_scale_2": 3.5}
    assert expert_kwargs(two, SimpleNamespace(guidance_2=None)) == {}
    assert expert_kwargs(one, SimpleNamespace(guidance_2=3.5)) == {}
    assert expert_kwargs(SimpleNamespace(config=SimpleNamespace()), SimpleNamespace(guidance_2=3.5)) == {}


def test_denoised_layout_seconds_add_the_layout_regions():
    records = [("layout", 0, 0.25), ("dit", 0, 1.0), ("layout", 0, 0.5), ("layout/x", 0, 9.0)]
    d = Denoised(torch.zeros(1), None, records, 0.0, None)
    assert d.layout_s == 0.75
    assert Denoised(torch.zeros(1), None, [], 0.0, None).layout_s == 0


def test_status_after_speaks_only_for_a_slow_phase():
    import time

    from vsagen.pipeline import status_after

    lines: list[str] = []
    with status_after(lines.append, "loading x", delay_s=0.05):
        pass  # quick: nothing said
    time.sleep(0.1)
    assert lines == []
    with status_after(lines.append, "loading x", delay_s=0.05):
        time.sleep(0.3)  # slow: one line
    time.sleep(0.1)
    assert lines == ["loading x"]
    with pytest.raises(ValueError), status_after(lines.append, "loading y", delay_s=0.05):
        raise ValueError  # fails fast: only its own error
    time.sleep(0.1)
    assert lines == ["loading x"]
