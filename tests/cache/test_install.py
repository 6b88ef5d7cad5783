"""vsagen.cache.install: diffusers' caches on every expert after vsagen's attention patch (CPU, tiny models). A cache
that reuses nothing gives the uncached latents exactly; one that reuses is counted from the hooks' own state, and
the counts equal what an independent counter (a hook on the tail block's q projection, which runs only when the
tail block computes) saw; removal leaves the transformers as they were."""

from __future__ import annotations

import json

import pytest
import torch

from vsagen.cache.cache_spec import parse_cache
from vsagen.cache.install import expert_steps, install_cache, load_ratios, save_ratios
from vsagen.errors import BadInput
from vsagen.timing import Timer, TimingReport

# One pytest-xdist worker runs the whole file (`--dist loadgroup`, pyproject.toml): the module fixtures load the tiny
# pipelines once, not in each worker.
pytestmark = pytest.mark.xdist_group("test_cache_hooks")


def _session(model, steps):
    from vsagen.attention import make_backend
    from vsagen.commands.generate_config import resolve_generate
    from vsagen.pipeline import Session

    cfg = resolve_generate("a red fox", model=model, frames=5, height=64, width=64, steps=steps, warmup=0,
                           device="cpu", guidance=5.0, out="unused.mp4")
    vsa = make_backend("vsa", 0.5, "torch")
    return Session.load(cfg, [vsa]), vsa


@pytest.fixture(scope="module")
def tiny(vsagen_cache, tiny_dir):
    return _session("tiny", 4)


@pytest.fixture(scope="module")
def a14b(vsagen_cache, a14b_dir):
    return _session("tiny-a14b", 6)


def run(session, backend, text, **kw):
    """(latents, records, {"forwards", "tail_computed"} counted independently of the cache's state)."""
    from vsagen.architecture import experts

    seen = {"forwards": 0, "tail_computed": 0}
    handles = []
    for _, t in experts(session.pipe):
        handles.append(t.register_forward_hook(lambda *a: seen.__setitem__("forwards", seen["forwards"] + 1)))
        handles.append(t.blocks[-1].attn1.to_q.register_forward_hook(
            lambda *a: seen.__setitem__("tail_computed", seen["tail_computed"] + 1)))
    try:
        timer = Timer("cpu")
        r = session.run(backend, session.plan("partial"), cache=parse_cache(text), timer=timer, **kw)
    finally:
        for h in handles:
            h.remove()
    return r.latents, r.records, seen


def steps_of(records, name):
    return [s for n, s, _ in records if n == name]


def assert_clean(session):
    from vsagen.architecture import experts

    for _, t in experts(session.pipe):
        assert not t.is_cache_enabled
        for m in t.modules():
            assert "forward" not in m.__dict__, type(m).__name__
            registry = getattr(m, "_diffusers_hook", None)
            assert registry is None or not registry.hooks


@pytest.mark.slow
def test_first_block_with_vsa_reuses_nothing_at_threshold_0_and_counts_what_it_reuses(tiny):
    session, vsa = tiny
    base, records, _ = run(session, vsa, "none")
    assert not steps_of(records, "dit_computed")  # no cache: no cache regions
    same, records, seen = run(session, vsa, "first-block:threshold=0")
    assert torch.equal(same, base)
    assert steps_of(records, "dit_computed") == [0, 0, 1, 1, 2, 2, 3, 3] and not steps_of(records, "dit_reused")
    assert seen == {"forwards": 8, "tail_computed": 8}
    lat, records, seen = run(session, vsa, "first-block:threshold=1e9")
    assert steps_of(records, "dit_computed") == [0, 0] and steps_of(records, "dit_reused") == [1, 1, 2, 2, 3, 3]
    assert seen == {"forwards": 8, "tail_computed": 2}
    assert not torch.equal(lat, base) and torch.isfinite(lat).all()
    report = TimingReport.from_records(records, "cpu")
    assert (report.dit_computed_forwards, report.dit_reused_forwards) == (2, 6)
    assert 0.5 * report.dit_s <= report.dit_computed_s + report.dit_reused_s <= report.dit_s * (1 + 1e-9)
    assert_clean(session)


@pytest.mark.slow
def test_the_computed_and_reused_regions_lie_inside_the_dit_regions(tiny, monkeypatch):
    """Each "dit_computed" / "dit_reused" region lies inside a "dit" region, so their sum never exceeds the DiT time:
    the cache's post hook closes its region before the DiT timing hook closes "dit". A slow probe of the cache state
    (20 ms here; a GC pause or a preempted thread in CI) once made the split 35% longer than the DiT time."""
    import time

    import vsagen.cache.install as cache_hooks

    probe = cache_hooks._probe

    def slow_probe(transformer, spec):
        computed, state = probe(transformer, spec)
        return (lambda: (time.sleep(0.02), computed())[1]), state

    monkeypatch.setattr(cache_hooks, "_probe", slow_probe)
    session, vsa = tiny
    timer = Timer("cpu")
    session.run(vsa, session.plan("partial"), cache=parse_cache("first-block:threshold=1e9"), timer=timer)
    dit = [(b, e) for n, _, b, e in timer._records if n == "dit"]
    split = [(b, e) for n, _, b, e in timer._records if n in ("dit_computed", "dit_reused")]
    assert len(split) == len(dit) == 8
    for b, e in split:
        assert any(db <= b and e <= de for db, de in dit), (b, e)
    report = TimingReport.from_records(timer.finish(), "cpu")
    assert report.dit_computed_s + report.dit_reused_s <= report.dit_s * (1 + 1e-9)


@pytest.mark.slow
def test_first_block_runs_after_the_tile_order_pre_hook(tiny):
    """vsa's tile-order pre-hook on blocks[0] is a torch pre-hook, diffusers' head hook replaces blocks[0].forward:
    torch runs the pre-hook first, so the head hook sees the hidden states in tile order (the permuted tensor)."""
    session, vsa = tiny
    from vsagen.api import apply

    seen = {}
    handle = apply(session.pipe, vsa, grid=(2, 8, 8), steps=1)  # 4 tiles: tile order is not raster order
    cached = install_cache([("transformer", session.pipe.transformer)], parse_cache("first-block:threshold=0"),
                           Timer("cpu"), steps={"transformer": 1})
    try:
        block = session.pipe.transformer.blocks[0]
        head = block._diffusers_hook.get_hook("fbc_leader_block_hook")
        original = head.fn_ref.original_forward

        def spy(*args, **kwargs):
            seen["hidden"] = kwargs.get("hidden_states", args[0] if args else None).clone()
            return original(*args, **kwargs)

        head.fn_ref.original_forward = spy
        raw = {}
        h = block.register_forward_pre_hook(lambda m, a, k: raw.__setitem__("hidden", k.get(
            "hidden_states", a[0]).clone()), with_kwargs=True, prepend=True)
        session.pipe(prompt_embeds=session.prompts()[0], height=128, width=128, num_frames=5, num_inference_steps=1,
                     guidance_scale=1.0, output_type="latent")
        h.remove()
        head.fn_ref.original_forward = original
    finally:
        cached.remove()
        handle.remove()
    assert not torch.equal(seen["hidden"], raw["hidden"])  # reordered in between
    assert torch.equal(seen["hidden"].sort(dim=1).values, raw["hidden"].sort(dim=1).values)  # a permutation
    assert_clean(session)


@pytest.mark.slow
def test_taylorseer_on_wan_modules_and_lite(tiny):
    session, vsa = tiny
    base, _, _ = run(session, vsa, "none")
    for text in ("taylorseer:cache_interval=2:disable_cache_before_step=1",
                 "taylorseer:cache_interval=2:disable_cache_before_step=1:lite=true"):
        lat, records, seen = run(session, vsa, text)
        # forwards 0 (warm-up phase) and 2 ((2 - 1 - 1) % 2 == 0) compute; 1 and 3 are predicted
        assert steps_of(records, "dit_computed") == [0, 0, 2, 2] and steps_of(records, "dit_reused") == [1, 1, 3, 3]
        assert seen == {"forwards": 8, "tail_computed": 4}
        assert torch.isfinite(lat).all() and not torch.equal(lat, base)
    lat, records, _ = run(session, vsa, "taylorseer:disable_cache_before_step=100")
    assert torch.equal(lat, base) and not steps_of(records, "dit_reused")
    assert_clean(session)


@pytest.mark.slow
def test_mag_calibrates_two_experts_saves_and_loads(a14b, tmp_path):
    session, vsa = a14b
    assert expert_steps(session.pipe, 6) == {"transformer": 2, "transformer_2": 4}
    base, _, _ = run(session, vsa, "none")
    path = tmp_path / "ratios.json"
    r = session.run(vsa, session.plan("partial"), cache=parse_cache(f"mag:calibrate=true:file={path}"))
    assert torch.equal(r.latents, base) and not steps_of(r.records, "dit_reused")
    assert not path.exists() and r.calibration[0] == path  # the caller writes it (t2v: with the video)
    path.write_text(r.calibration[1])
    data = json.loads(path.read_text())
    assert (data["model"], data["steps"], data["sampler"]) == ("tiny-a14b", 6, "default")
    assert [len(data["ratios"][e]) for e in ("transformer", "transformer_2")] == [2, 4]
    assert data["ratios"]["transformer"][0] == 1.0
    same, records, _ = run(session, vsa, f"mag:file={path}:threshold=0")
    assert torch.equal(same, base) and not steps_of(records, "dit_reused")
    lat, records, seen = run(session, vsa, f"mag:file={path}:threshold=1e9:retention_ratio=0:max_skip_steps=2")
    # each expert computes its first step (no residual yet), then reuses at most 2 in a row
    assert steps_of(records, "dit_computed") == [0, 0, 2, 2, 5, 5]
    assert steps_of(records, "dit_reused") == [1, 1, 3, 3, 4, 4]
    assert seen == {"forwards": 12, "tail_computed": 6}
    assert_clean(session)


def test_ratio_files_round_trip_and_bad_files_are_one_line(tmp_path):
    path = tmp_path / "sub" / "r.json"
    save_ratios(path, "tiny", 3, {"transformer": [1.0, 0.9, 0.8]})
    assert load_ratios(path) == {"transformer": [1.0, 0.9, 0.8]}
    with pytest.raises(BadInput, match="no calibration file .*calibrate=true"):
        load_ratios(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(BadInput, match="is not a MagCache calibration file"):
        load_ratios(tmp_path / "bad.json")
    with pytest.raises(BadInput, match="recorded no ratios"):
        save_ratios(path, "tiny", 3, {})
