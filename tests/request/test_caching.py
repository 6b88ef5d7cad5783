"""vsagen.request.caching and `--cache` on t2v / i2v: bad names and options, and what a cache cannot run with, are
one line, exit 2, before anything loads and with nothing written; MagCache's file is found (or its absence said)
up front; a run writes the cache and its counts into the JSON, and they equal what an independent counter saw."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from conftest import one_error_line
from PIL import Image
from typer.testing import CliRunner

from vsagen.cache.cache_spec import NO_CACHE, parse_caches
from vsagen.cache.install import save_ratios
from vsagen.cli.app import app
from vsagen.errors import BadInput
from vsagen.request.caching import default_mag_file, resolve_caches
from vsagen.request.sampling import SamplerPlan
from vsagen.samplers import NAMED

runner = CliRunner()
PLACE = SimpleNamespace(compile=False, offload="none")
DEFAULT = [SamplerPlan(NAMED["default"], 2, 5.0, 3.0)]
DMD = [SamplerPlan(NAMED["dmd"], 3, 1.0, 3.0)]


def test_resolve_caches(vsagen_cache, tmp_path):
    assert resolve_caches(None, "tiny", PLACE, DEFAULT, 1) == ((NO_CACHE,), ())
    (spec,), notes = resolve_caches(parse_caches("first-block:threshold=0.1"), "tiny", PLACE, DEFAULT, 1)
    assert spec.options.threshold == 0.1 and notes == ()
    _, notes = resolve_caches(parse_caches("first-block"), "tiny", PLACE, DMD, 1)
    assert len(notes) == 1 and "dmd sampler (3 steps)" in notes[0]
    assert default_mag_file("wan2.1-t2v-1.3b") == vsagen_cache / "magcache" / "wan2.1-t2v-1.3b.json"
    assert default_mag_file("/data/my ckpt/").name == "data_my_ckpt.json"
    (spec,), _ = resolve_caches(parse_caches("mag:calibrate=true"), "tiny", PLACE, DEFAULT, 1)
    assert spec.options.file == default_mag_file("tiny")
    save_ratios(tmp_path / "r.json", "tiny", 2, {"transformer": [1.0, 0.9]})
    (spec,), _ = resolve_caches(parse_caches(f"mag:file={tmp_path / 'r.json'}"), "tiny", PLACE, DEFAULT, 1)
    assert spec.options.file == tmp_path / "r.json"
    specs, _ = resolve_caches(parse_caches("none,first-block"), "tiny", PLACE, DEFAULT, 1, several=True)
    assert [s.name for s in specs] == ["none", "first-block"]
    assert resolve_caches(parse_caches("none"), "tiny", SimpleNamespace(compile=True, offload="group"), DEFAULT, 4)[0] \
        == (NO_CACHE,)  # no cache: nothing to refuse


def test_mag_file_of_another_model_is_refused_before_loading(vsagen_cache, tmp_path):
    save_ratios(tmp_path / "r.json", "tiny-a14b", 2, {"transformer": [1.0, 0.9]}, "default")
    with pytest.raises(BadInput, match=r"^--cache mag: .*r.json holds the ratios of --model tiny-a14b, not of --model "
                                       r"tiny; calibrate tiny with --cache mag:calibrate=true$"):
        resolve_caches(parse_caches(f"mag:file={tmp_path / 'r.json'}"), "tiny", PLACE, DEFAULT, 1)
    res = runner.invoke(app, ["t2v", "a fox", "--model", "tiny", "--device", "cpu", "--cache",
                              f"mag:file={tmp_path / 'r.json'}", "--out", str(tmp_path / "v.mp4")])
    assert res.exit_code == 2 and "holds the ratios of --model tiny-a14b" in one_error_line(res)
    assert not (tmp_path / "v.mp4").exists()


def test_mag_file_of_other_steps_or_sampler_is_noted(vsagen_cache, tmp_path):
    """diffusers' MagCacheConfig resamples a ratio list of another length by nearest neighbour: the note says so."""
    path = tmp_path / "r.json"
    save_ratios(path, "tiny", 2, {"transformer": [1.0, 0.9]}, "default")
    assert resolve_caches(parse_caches(f"mag:file={path}"), "tiny", PLACE, DEFAULT, 1)[1] == ()
    _, notes = resolve_caches(parse_caches(f"mag:file={path}"), "tiny", PLACE, [SamplerPlan(NAMED["default"], 8, 5.0, 3.0)], 1)
    assert notes == ("mag: calibrated at 2 steps, run at 8 steps: diffusers resamples its ratios to 8 steps by "
                     "nearest neighbour (entries repeated or dropped, none measured at these steps); for this run's "
                     "own ratios, calibrate with --cache mag:calibrate=true --steps 8",)
    _, notes = resolve_caches(parse_caches(f"mag:file={path}"), "tiny", PLACE, DMD, 1)
    assert notes[0].startswith("mag: calibrated at 2 steps and the default sampler, run at 3 steps and the dmd "
                               "sampler: diffusers resamples") and notes[0].endswith("--steps 3 --sampler dmd")
    assert "dmd sampler (3 steps): a cache may reuse" in notes[1] and len(notes) == 2
    # compare's samplers: a note per sampler that differs, the few-step note once per re-noise sampler
    _, notes = resolve_caches(parse_caches(f"none,mag:file={path}"), "tiny", PLACE, DEFAULT + DMD + DMD, 1, several=True)
    assert len(notes) == 2 and "dmd sampler" in notes[0] and "a cache may reuse" in notes[1]
    # what diffusers does with a list of another length (the note's words)
    from diffusers.hooks import MagCacheConfig
    cfg = MagCacheConfig(num_inference_steps=4, mag_ratios=[1.0, 0.5])
    assert cfg.mag_ratios.tolist() == [1.0, 1.0, 0.5, 0.5]
    save_ratios(path, "tiny", 2, {"transformer": [1.0, 0.9]})  # an earlier file without its sampler: steps only
    assert resolve_caches(parse_caches(f"mag:file={path}"), "tiny", PLACE, DEFAULT, 1)[1] == ()


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d["ratios"]["transformer"].__setitem__(1, float("nan")), "holds the ratio nan for transformer"),
    (lambda d: d["ratios"]["transformer"].__setitem__(0, -5.0), "holds the ratio -5.0 for transformer"),
    (lambda d: d["ratios"]["transformer"].__setitem__(0, 0.0), "holds the ratio 0.0 for transformer"),
    (lambda d: d.__setitem__("version", 9), "is not a MagCache calibration file of vsagen"),
    (lambda d: d.pop("model"), "is not a MagCache calibration file of vsagen"),
    (lambda d: d.__setitem__("model", ""), "is not a MagCache calibration file of vsagen"),
    (lambda d: d.__setitem__("steps", 0), "is not a MagCache calibration file of vsagen"),
    (lambda d: d.__setitem__("steps", True), "is not a MagCache calibration file of vsagen"),
    (lambda d: d.__setitem__("sampler", 3), "is not a MagCache calibration file of vsagen"),
    (lambda d: d["ratios"].__setitem__("transformer", []), "holds no ratios"),
])
def test_a_calibration_file_vsagen_did_not_write_is_refused(vsagen_cache, tmp_path, mutate, words):
    """A new-user trial ran with NaN / negative ratios, another version, no model (which skipped the model check)
    and 0 steps: each is now one line before loading."""
    path = tmp_path / "r.json"
    save_ratios(path, "tiny", 2, {"transformer": [1.0, 0.9]}, "default")
    data = json.loads(path.read_text())
    mutate(data)
    path.write_text(json.dumps(data))
    with pytest.raises(BadInput, match=words):
        resolve_caches(parse_caches(f"mag:file={path}"), "tiny", PLACE, DEFAULT, 1)


def test_a_calibration_without_an_experts_ratios_is_refused_before_loading(vsagen_cache, tmp_path):
    """The preset names the experts, so a file missing one is refused up front (a new-user trial met it only after
    loading, and in compare / profile after the first run)."""
    path = tmp_path / "r.json"
    save_ratios(path, "tiny", 2, {"transformer_2": [1.0, 0.9]}, "default")
    with pytest.raises(BadInput, match=r"r.json has no ratios for transformer \(it holds transformer_2\)"):
        resolve_caches(parse_caches(f"mag:file={path}"), "tiny", PLACE, DEFAULT, 1, experts=("transformer",))
    save_ratios(path, "tiny-a14b", 2, {"transformer": [1.0, 0.9]}, "default")
    with pytest.raises(BadInput, match="has no ratios for transformer_2"):
        resolve_caches(parse_caches(f"mag:file={path}"), "tiny-a14b", PLACE, DEFAULT, 1, experts=("transformer", "transformer_2"))
    assert resolve_caches(parse_caches(f"mag:file={path}"), "tiny-a14b", PLACE, DEFAULT, 1)[0][0].name == "mag"  # unknown: later
    for command in (["t2v", "a fox"], ["compare", "a fox", "--attn", "full"]):
        save_ratios(path, "tiny", 2, {"transformer_2": [1.0, 0.9]}, "default")
        res = runner.invoke(app, [*command, "--model", "tiny", "--device", "cpu", "--cache",
                                  f"{'none,' if command[0] == 'compare' else ''}mag:file={path}", "--out",
                                  str(tmp_path / ("v.mp4" if command[0] == "t2v" else "cmp"))])
        assert res.exit_code == 2 and "has no ratios for transformer (it holds transformer_2)" in one_error_line(res)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_a_calibration_replaces_only_an_earlier_calibration(vsagen_cache, tmp_path):
    """A new-user trial calibrated into photo.png and into the run's own mp4 / JSON, each replaced silently."""
    photo = tmp_path / "photo.png"
    photo.write_bytes(b"\x89PNG not really")
    with pytest.raises(BadInput, match=r"file=.*photo.png does not end in .json; name a .json file"):
        resolve_caches(parse_caches(f"mag:calibrate=true:file={photo}"), "tiny", PLACE, DEFAULT, 1)
    other = tmp_path / "notes.json"
    other.write_text('{"mine": 1}')
    with pytest.raises(BadInput, match=r"notes.json exists and is not a calibration vsagen wrote; name another file"):
        resolve_caches(parse_caches(f"mag:calibrate=true:file={other}"), "tiny", PLACE, DEFAULT, 1)
    earlier = tmp_path / "r.json"
    save_ratios(earlier, "tiny", 2, {"transformer": [1.0, 0.9]}, "default")
    _, notes = resolve_caches(parse_caches(f"mag:calibrate=true:file={earlier}"), "tiny", PLACE, DEFAULT, 1)
    assert notes == (f"mag: this calibration replaces the one in {earlier} (--model tiny, 2 steps)",)
    assert photo.read_bytes() == b"\x89PNG not really" and other.read_text() == '{"mine": 1}'
    for own in ("v.json", "v.mp4"):
        res = runner.invoke(app, ["t2v", "a fox", "--model", "tiny", "--device", "cpu", "--out",
                                  str(tmp_path / "v.mp4"), "--cache", f"mag:calibrate=true:file={tmp_path / own}"])
        assert res.exit_code == 2, res.output
        line = one_error_line(res)
        assert ("is this run's own output" if own == "v.json" else "does not end in .json") in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.json", "photo.png", "r.json"]


@pytest.mark.parametrize("text, place, processes, words", [
    ("first-block,mag", PLACE, 1, "this command runs one cache"),
    ("first-block", SimpleNamespace(compile=True, offload="none"), 1, "cannot run with --compile"),
    ("mag:calibrate=true", SimpleNamespace(compile=False, offload="group"), 1, "cannot run with --offload group"),
    ("taylorseer", PLACE, 2, "runs in one process"),
    ("mag", PLACE, 1, "--cache mag: no calibration file"),
])
def test_resolve_caches_refuses(vsagen_cache, text, place, processes, words):
    with pytest.raises(BadInput, match=words):
        resolve_caches(parse_caches(text), "tiny", place, DEFAULT, processes)


BAD = [
    (["--cache", "teacache"], "unknown --cache 'teacache'; available: none, first-block, mag, taylorseer"),
    (["--cache", "first-block:thr=1"], "--cache 'first-block:thr=1': first-block has no option 'thr'; its options: "
                                       "threshold"),
    (["--cache", "mag:max_skip_steps=0"], "--cache 'mag:max_skip_steps=0': max_skip_steps must be an integer > 0, "
                                          "got 0"),
    (["--cache", "mag"], "--cache mag: no calibration file"),
    (["--cache", "mag:file="], "--cache 'mag:file=': file='' is not a file path"),
    (["--cache", "none:x=1"], "--cache 'none:x=1': none has no option 'x'; none takes no options"),
    (["--cache", "first-block", "--compile"], "--cache first-block cannot run with --compile"),
    (["--cache", "taylorseer", "--gpus", "2"], "--cache taylorseer runs in one process"),
]


@pytest.mark.parametrize("command", ["t2v", "i2v"])
@pytest.mark.parametrize("args, words", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_cache_is_one_line_before_loading(vsagen_cache, tmp_path, monkeypatch, command, args, words):
    monkeypatch.setattr("vsagen.pipeline.Session.load", lambda *a, **k: pytest.fail("loaded despite bad input"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    Image.new("RGB", (64, 48), (200, 90, 40)).save(tmp_path / "in" / "first.png")
    head = ["i2v", str(tmp_path / "in" / "first.png"), "a fox", "--model", "tiny-i2v"] if command == "i2v" else \
        ["t2v", "a fox", "--model", "tiny"]
    res = runner.invoke(app, [*head, "--device", "cpu", *args])
    assert res.exit_code == 2
    assert one_error_line(res).startswith(f"error: {words}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"], "something was written"


@pytest.mark.slow
def test_t2v_json_counts_equal_an_independent_counter(vsagen_cache, tiny_dir, tmp_path, monkeypatch):
    """first-block at a threshold that reuses every forward after the first step: the JSON's computed / reused
    counts equal the forwards the tail block computed (a hook on its q projection) and those it did not."""
    import vsagen.cache.install as hooks

    seen = {"forwards": 0, "tail": 0}
    original = hooks.install_cache

    def counting(transformers, *a, **k):
        installed = original(transformers, *a, **k)
        for _, t in transformers:
            handles = [t.register_forward_hook(lambda *_: seen.__setitem__("forwards", seen["forwards"] + 1)),
                       t.blocks[-1].attn1.to_q.register_forward_hook(
                           lambda *_: seen.__setitem__("tail", seen["tail"] + 1))]
            installed._undo.extend(h.remove for h in handles)
        return installed

    monkeypatch.setattr("vsagen.pipeline.install_cache", counting)
    out = tmp_path / "v.mp4"
    res = runner.invoke(app, ["t2v", "a fox", "--model", "tiny", "--attn", "vsa", "--cache",
                              "first-block:threshold=1e9", "--steps", "3", "--guidance", "5", "--frames", "5",
                              "--height", "64", "--width", "64", "--device", "cpu", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads((tmp_path / "v.json").read_text())
    t = d["timing"]
    assert d["cache"] == {"name": "first-block", "threshold": 1e9} and d["config"]["cache"] == d["cache"]
    assert (t["dit_computed_forwards"], t["dit_reused_forwards"]) == (seen["tail"], seen["forwards"] - seen["tail"])
    assert (t["dit_computed_forwards"], t["dit_reused_forwards"], t["dit_reused_steps"]) == (2, 4, [1, 2])
    assert t["dit_reuse_share"] == pytest.approx(4 / 6) and out.is_file()
    # nested in the "dit" regions: at most the DiT time, most of it (hook overhead aside)
    assert 0.5 * t["dit_s"] <= t["dit_computed_s"] + t["dit_reused_s"] <= t["dit_s"] * (1 + 1e-9)


@pytest.mark.slow
def test_t2v_that_reused_nothing_shows_its_counts_and_says_why(vsagen_cache, tiny_dir, tmp_path):
    """`t2v --cache first-block:threshold=0`: the table shows computed 4 / reused 0 / share 0% (they were hidden)
    and a note says the threshold was never met."""
    res = runner.invoke(app, ["t2v", "a fox", "--model", "tiny", "--cache", "first-block:threshold=0", "--steps", "2",
                              "--frames", "5", "--height", "64", "--width", "64", "--device", "cpu", "--out",
                              str(tmp_path / "v.mp4")], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    for needle in ("computed: 4 forwards", "reused (cache): 0 forwards", "reuse share 0%",
                   "note: first-block:threshold=0 reused no forward: its threshold 0 was never met; raise it to reuse"):
        assert needle in res.output, needle
    assert "reused no forward" in " ".join(json.loads((tmp_path / "v.json").read_text())["timing"]["notes"])
