"""vsagen.commands.profile and `vsagen profile`: the backend comparison on one loaded tiny model, its
renderings (json, csv, markdown, table, plot), `--kernels`, and bad input.

Runs use the session's private VSAGEN_CACHE (conftest) and the tiny preset: 17 x 96 x 160 -> grid 5 x 6 x 10
(300 tokens, 12 tiles, 2 full) under `partial`, 8 x 8 x 12 (768 tokens) under `crop`; CFG 5.0, so a step
holds two transformer forwards. CPU timings on a shared machine are noisy, so only their signs, counts and
internal consistency are asserted, never their ratios.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import math

import pytest
from conftest import assert_one_error_line
from typer.testing import CliRunner

from vsagen.cli.app import app

runner = CliRunner()
TINY_STEPS = 4  # vsagen/preset_data/tiny.toml [defaults] steps: the projection target
PARTIAL_GRID, CROP_GRID = [5, 6, 10], [8, 8, 12]
ROW_FIELDS = {"backend", "tile_fit", "grid", "tokens", "dit_s_per_step", "dit_per_step_s", "attention_s_per_step",
              "attention_stages_s_per_step", "layout_s_per_step", "attention_share_of_dit", "speedup_vs_full",
              "projected_dit_s", "projected_steps", "attn1_s_per_step", "latents_rel_l2_vs_full"}
# `full` through vsagen's processor vs diffusers' own processor on the same transformer and latents: the same
# ops in the same order (tests/attention/test_processor.py), observed bitwise equal; 1e-6 leaves room for SDPA
# kernel choice.
TOL_STOCK_VS_FULL = 1e-6
# `full` in tile order vs raster: the same dense attention, softmax sums in another order (fp32, 2 layers,
# 2 steps): observed ~5e-7 relative on the latents; 1e-5 is 20x that.
TOL_TILE_ORDER_VS_FULL = 1e-5
# Relative slack for sums of per-step means (float rounding of a few additions).
TOL_SUM = 1e-9


@pytest.fixture
def cli_cache(vsagen_cache, tiny_dir):
    """The private cache with the tiny checkpoint already built."""
    return vsagen_cache


def profile(*args: str):
    return runner.invoke(app, ["profile", *args])


def check_row(r: dict, steps: int, tile_fit: str = "partial") -> None:
    assert ROW_FIELDS <= set(r)
    assert r["tile_fit"] == tile_fit
    assert r["grid"] == (PARTIAL_GRID if tile_fit == "partial" else CROP_GRID)
    assert r["tokens"] == math.prod(r["grid"])
    assert r["steps"] == steps and r["dit_forwards"] == 2 * steps  # CFG: two forwards a step
    assert len(r["dit_per_step_s"]) == steps and all(x > 0 for x in r["dit_per_step_s"])
    assert math.isclose(r["dit_s_per_step"], sum(r["dit_per_step_s"]) / steps, rel_tol=TOL_SUM)
    assert r["dit_s_per_step"] > 0
    assert 0 < r["attention_s_per_step"] <= r["attn1_s_per_step"] <= r["dit_s_per_step"]
    assert 0 < r["attention_share_of_dit"] <= 1
    assert math.isclose(r["attention_share_of_dit"], r["attention_s_per_step"] / r["dit_s_per_step"], rel_tol=1e-6)
    assert sum(r["attention_stages_s_per_step"].values()) <= r["attention_s_per_step"] * (1 + TOL_SUM)
    assert r["projected_steps"] == TINY_STEPS
    assert math.isclose(r["projected_dit_s"], r["dit_s_per_step"] * TINY_STEPS, rel_tol=TOL_SUM)
    assert r["speedup_vs_full"] > 0


# --------------------------------------------------------------------------------------------------------------
# The acceptance run, and the renderings


@pytest.mark.slow
def test_profile_json_one_row_per_backend(cli_cache):
    res = profile("--model", "tiny", "--attn", "full,vsa", "--steps", "2", "--format", "json")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert len(lines) == 1, res.stdout
    data = json.loads(lines[0])
    assert data["model"] == "tiny" and data["steps"] == 2 and data["warmup"] == 1
    rows = data["rows"]
    assert [r["backend"] for r in rows] == ["full", "vsa"]
    for r in rows:
        check_row(r, steps=2)
    full, vsa = rows
    assert full["speedup_vs_full"] == 1.0  # exactly: the baseline against itself
    assert math.isclose(vsa["speedup_vs_full"], full["dit_s_per_step"] / vsa["dit_s_per_step"], rel_tol=1e-12)
    assert full["attention_stages_s_per_step"] == {} and full["layout_s_per_step"] == 0.0
    assert set(vsa["attention_stages_s_per_step"]) == {"coarse", "fine"}
    assert all(v > 0 for v in vsa["attention_stages_s_per_step"].values())
    assert vsa["layout_s_per_step"] > 0 and vsa["sparsity"] == 0.875
    assert full["latents_rel_l2_vs_full"] == 0.0
    assert 0 < vsa["latents_rel_l2_vs_full"] < 1  # sparse attention changes the result, but not into noise
    # vsagen's own overhead: stock diffusers processors and `full` in tile order, on the same transformer
    over = {r["backend"]: r for r in data["overhead"]["rows"]}
    assert set(over) == {"diffusers-sdpa", "full+tile-order"}
    stock, tiled = over["diffusers-sdpa"], over["full+tile-order"]
    assert stock["dit_s_per_step"] > 0 and stock["attention_s_per_step"] is None
    assert stock["dit_forwards"] == 4 and stock["overhead_vs_stock"] == 0.0
    assert tiled["layout_s_per_step"] > 0 and tiled["attention_s_per_step"] > 0
    assert stock["latents_rel_l2_vs_full"] <= TOL_STOCK_VS_FULL
    assert tiled["latents_rel_l2_vs_full"] <= TOL_TILE_ORDER_VS_FULL
    assert math.isclose(data["overhead"]["full_vs_stock"], full["dit_s_per_step"] / stock["dit_s_per_step"] - 1)
    assert full["overhead_vs_stock"] == data["overhead"]["full_vs_stock"]
    assert data["tile_fit_comparison"] == []  # one tile fit
    assert data["settings"]["backends"][1] == {"name": "vsa", "sparsity": 0.875, "impl": "auto",
                                                      "tile": "4x4x4", "query_rows": 64, "precision": "bf16",
                                                      "topk_count": "tiles"}
    assert (full["impl"], vsa["impl"]) == ("sdpa", "torch")  # what ran (CPU: the reference), for every backend
    assert data["load_s"] > 0 and "torch" in data["versions"]


@pytest.mark.slow
@pytest.mark.parametrize("model,frames", [("tiny-i2v", "first frame"), ("tiny-flf2v", "first frame and last frame")])
def test_profile_image_to_video_models_on_synthetic_frames(cli_cache, model, frames):
    """Image-to-video models run as WanImageToVideoPipeline on synthetic condition frames (FLF2V: a last frame
    too, which it requires); rows as for text to video."""
    res = profile("--model", model, "--attn", "full,vsa", "--steps", "1", "--warmup", "0", "--no-stock",
                  "--format", "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert [r["backend"] for r in data["rows"]] == ["full", "vsa"]
    for r in data["rows"]:
        check_row(r, steps=1)
    assert data["rows"][0]["speedup_vs_full"] == 1.0
    assert any(f"synthetic {frames}" in n for n in data["notes"]), data["notes"]


@pytest.mark.slow
def test_profile_csv_and_plot_files(cli_cache, tmp_path):
    """csv and plot written; --out into a folder that does not exist yet creates it (it used to fail after the
    whole run with FileNotFoundError, losing the results)."""
    out, plot = tmp_path / "reports" / "r.csv", tmp_path / "r.png"
    res = profile("--model", "tiny", "--attn", "full,vsa", "--steps", "1", "--warmup", "0", "--format", "csv",
                  "--out", str(out), "--plot", str(plot))
    assert res.exit_code == 0, res.output
    assert res.stdout == ""  # the report went to --out
    assert str(out) in res.stderr and str(plot) in res.stderr
    # the CSV holds the rows only; its notes go to stderr (they were in no output at all)
    assert "note: model 'tiny' has random weights" in res.stderr and "note:" not in out.read_text()
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [(r["backend"], r["kind"]) for r in rows] == [("full", "backend"), ("vsa", "backend"),
                                                        ("diffusers-sdpa", "overhead"), ("full+tile-order", "overhead")]
    assert rows[0]["speedup_vs_full"] == "1.0"
    assert float(rows[1]["stage_coarse_s_per_step"]) > 0 and float(rows[1]["stage_fine_s_per_step"]) > 0
    assert rows[0]["stage_fine_s_per_step"] == ""  # `full` has no stages
    assert all(float(r["dit_s_per_step"]) > 0 for r in rows)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.png", "reports"]  # no temporary files left
    assert [p.name for p in out.parent.iterdir()] == ["r.csv"]


@pytest.mark.slow
def test_profile_markdown_tile_fits_side_by_side(cli_cache, tmp_path):
    out, plot = tmp_path / "r.md", tmp_path / "r.svg"
    res = profile("--model", "tiny", "--attn", "vsa,full", "--sparsity", "0.5", "--tile-fit", "partial,crop",
                  "--steps", "1", "--warmup", "0", "--no-stock", "--format", "markdown", "--out", str(out),
                  "--plot", str(plot))
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "| backend | tile fit |" in text and "| vsa 0.5 | crop |" in text and "| 8x8x12 (768, 12) |" in text
    assert "| full | partial |" in text and "| 5x6x10 (300, 12) |" in text
    assert "tile fit: partial edge tiles vs crop" in text and "| full | 300 | 768 |" in text
    assert "vsagen overhead" not in text  # --no-stock
    lines = [ln for ln in text.splitlines() if ln.startswith("| full | partial")]
    assert len(lines) == 1 and "| 1.00x |" in lines[0]
    assert plot.read_text().lstrip().startswith("<?xml")


@pytest.mark.slow
def test_tile_fit_comparison_labels_rows_as_the_main_table(cli_cache, tmp_path):
    """Two vsa entries that differ in the tile: the partial-vs-crop table named both "vsa 0.875" and its JSON had no
    spec (a new-user trial); now each row and entry carries the main table's label and the spec."""
    out = tmp_path / "r.json"
    res = profile("--model", "tiny", "--attn", "vsa,vsa:tile=4x4x8", "--tile-fit", "partial,crop", "--steps", "1",
                  "--warmup", "0", "--no-stock", "--format", "json", "--out", str(out))
    assert res.exit_code == 0, res.output
    entries = json.loads(out.read_text())["tile_fit_comparison"]
    assert ["tile=4x4x8" in e["spec"] for e in entries] == [False, True]
    labels = [e["label"] for e in entries]
    assert labels == ["vsa 0.875", "vsa 0.875 tile 4x4x8"], labels  # a cube other than 4x4x4 is in the label
    md = profile("--model", "tiny", "--attn", "vsa,vsa:tile=4x4x8", "--tile-fit", "partial,crop", "--steps", "1",
                 "--warmup", "0", "--no-stock", "--format", "markdown")
    comparison = md.stdout.split("tile fit: partial edge tiles vs crop", 1)[1]
    assert all(f"| {label} |" in comparison for label in labels), comparison


@pytest.mark.slow
def test_render_formats_agree(cli_cache):
    """One report, every format: the same numbers; json is strict JSON (no NaN)."""
    from vsagen.commands.profile_config import resolve_profile
    from vsagen.commands.profile import profile_dit
    from vsagen.commands.profile_render import render

    cfg = resolve_profile(model="tiny", attn="full,vsa", steps=1, warmup=0, stock=False, frames=5, height=64,
                          width=64)
    rep = profile_dit(cfg)
    data = json.loads(render(rep, "json"))
    assert [r["backend"] for r in data["rows"]] == ["full", "vsa"] and data["overhead"]["rows"] == []
    assert data["overhead"]["full_vs_stock"] is None
    rows = list(csv.DictReader(io.StringIO(render(rep, "csv"))))
    for r, d in zip(rows, data["rows"]):
        assert float(r["dit_s_per_step"]) == d["dit_s_per_step"]
        assert float(r["projected_dit_s"]) == d["projected_dit_s"]
    md = render(rep, "markdown").splitlines()
    assert [ln.split(" | ")[0] for ln in md if ln.startswith("| full |") or ln.startswith("| vsa ")] == [
        "| full", "| vsa 0.875"]
    assert "**DiT time per backend, tile fit partial: " in md[0]  # one tile fit: in the title, not a column
    table = render(rep, "table", width=220)
    assert "full" in table and "vsa 0.875" in table and "speed-up" in table
    assert "\x1b[" not in table  # plain text, no colour codes


# --------------------------------------------------------------------------------------------------------------
# --kernels


@pytest.mark.slow
def test_profile_kernels_on_cpu(cli_cache):
    res = profile("--model", "tiny", "--kernels", "--format", "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    rows = data["rows"]
    assert [(r["kernel"], r["kind"]) for r in rows] == [
        ("SDPA (torch CPU)", "fwd"), ("full", "fwd"), ("vsa 0.875", "fwd"),
        ("SDPA (torch CPU)", "fwd+bwd"), ("full", "fwd+bwd"), ("vsa 0.875", "fwd+bwd")]
    for r in rows:
        assert r["ms"] > 0 and r["speedup_vs_baseline"] > 0 and r["baseline"] == "SDPA (torch CPU)"
        assert (r["grid"], r["tokens"], r["heads"], r["head_dim"]) == (PARTIAL_GRID, 300, 2, 16)
    assert rows[0]["speedup_vs_baseline"] == 1.0 and rows[3]["speedup_vs_baseline"] == 1.0
    assert any("CUDA" in n for n in data["notes"])


# --------------------------------------------------------------------------------------------------------------
# sparse-vdit: per-layer rows, the pattern file in the report, --kernels over every layer, refusals

SVD_LAYERS = (("dense", "diagonal"), ("skip", "skip"))  # a fused two-mode layer, an all-skip one (no launch)


def tiny_patterns(path, frames=5, grid=(2, 6, 10), layers=SVD_LAYERS):
    """A hand-written pattern file for the tiny preset's architecture (2 layers x 2 heads of 16) at 96x160 with
    `frames` frames (latent grid `grid`)."""
    from vsagen.models.presets import load_preset
    from vsagen.sparsity.files import PatternFile, StepRange, save_patterns
    from vsagen.sparsity.patterns import default_catalog

    t = load_preset("tiny").transformer
    arch = {"layers": t["num_layers"], "heads": t["num_attention_heads"], "head_dim": t["attention_head_dim"],
            "in_channels": t["in_channels"], "ffn_dim": t["ffn_dim"], "patch_size": list(t["patch_size"])}
    save_patterns(PatternFile(model="tiny (hand-written)", architecture=arch, experts=("transformer",), height=96,
                              width=160, frames=frames, grid=grid, steps=4, lam=0.0, eps=0.0, prompts=0,
                              modes={m.name: m for m in default_catalog()},
                              ranges=(StepRange(0, 4, {"transformer": layers}),)), path)
    return path


@pytest.mark.slow
def test_profile_sparse_vdit_reports_each_layer_and_its_file(cli_cache, tmp_path):
    """One run, every rendering: the per-layer rows (launches: 1 for the fused layer, 0 for the all-skip one;
    block densities from the modes on the run's tile grid), the file's path, sha256, density and modes."""
    from vsagen.commands.profile import profile_dit
    from vsagen.commands.profile_config import resolve_profile
    from vsagen.commands.profile_render import render
    from vsagen.sparsity.files import file_hash
    from vsagen.sparsity.patterns import block_density, default_catalog

    path = tiny_patterns(tmp_path / "p.json")
    cfg = resolve_profile(model="tiny", attn=f"full,sparse-vdit:patterns={path}", steps=1, warmup=0, stock=False,
                          frames=5)
    data = json.loads(render(profile_dit(cfg), "json"))
    full, svd = data["rows"]
    assert full["layers"] == [] and full["backend_info"] == {"name": "full", "impl_ran": "sdpa"}
    tiles = (1, 2, 3)  # grid 2x6x10 in 4x4x4 tiles
    d = {m.name: block_density(m, tiles) for m in default_catalog()}
    assert svd["layers"] == [
        {"expert": "transformer", "layer": 0, "heads": 2, "launches": 1, "groups": 2,
         "density": pytest.approx((d["dense"] + d["diagonal"]) / 2), "sdpa_heads": 0,
         "modes": {"dense": 1, "diagonal": 1}},
        {"expert": "transformer", "layer": 1, "heads": 2, "launches": 0, "groups": 1, "density": 0.0,
         "sdpa_heads": 0, "modes": {"skip": 2}}]
    assert svd["launches_per_forward"] == 1
    assert svd["block_density"] == pytest.approx((d["dense"] + d["diagonal"]) / 4)
    info = svd["backend_info"]
    assert info["patterns"] == str(path) and info["patterns_sha256"] == file_hash(path)
    assert info["density"] == pytest.approx(svd["block_density"], abs=1e-6)  # the file's grid is the run's
    assert info["modes"]["skip"] == 2 and info["impl_ran"] == "torch"
    assert svd["speedup_vs_full"] > 0 and 0 < svd["latents_rel_l2_vs_full"]


@pytest.mark.slow
def test_profile_kernels_times_every_layer_of_a_pattern_file(cli_cache, tmp_path):
    path = tiny_patterns(tmp_path / "p.json")
    res = profile("--model", "tiny", "--kernels", "--frames", "5", "--attn", f"full,sparse-vdit:patterns={path}",
                  "--format", "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert [(r["kernel"], r["kind"], r["layers"]) for r in data["rows"]] == [
        (k, p, n) for p in ("fwd", "fwd+bwd") for k, n in (("SDPA (torch CPU)", 1), ("full", 1), ("sparse-vdit", 2))]
    assert all(r["ms"] > 0 for r in data["rows"])  # fwd+bwd too, past the all-skip layer's gradient-free zeros
    assert any(n.startswith("sparse-vdit: timed at every layer of transformer (2 layers)") for n in data["notes"])


SVD_BAD = [
    # (id, model, extra args, file frames/grid, substrings); every one refused before a model loads or a kernel runs
    ("dit-grid", "tiny", ["--frames", "9"], ["searched at 5x96x160", "grid is 3x6x10", "remap=true"]),
    ("kernels-grid", "tiny", ["--kernels", "--frames", "9"], ["grid 2x6x10", "grid is 3x6x10", "remap=true"]),
    ("kernels-grid-crop", "tiny", ["--kernels", "--frames", "5", "--tile-fit", "partial,crop"],
     ["grid is 4x8x12", "remap=true"]),
    ("kernels-architecture", "tiny-i2v", ["--kernels", "--frames", "5"], ["in_channels 16 vs 36", "vsagen search"]),
    ("kernels-expert", "tiny-a14b", ["--kernels", "--frames", "5"], ["covers transformer", "transformer_2"]),
]


@pytest.mark.parametrize("model,args,needles", [b[1:] for b in SVD_BAD], ids=[b[0] for b in SVD_BAD])
def test_mismatched_pattern_file_is_one_line_exit_2(cli_cache, tmp_path, monkeypatch, model, args, needles):
    """A file searched at another size (without remap=true) or on another model: one line, exit 2, and nothing
    timed (the grid is checked before the model loads, --kernels before the dense references are timed)."""
    path = tiny_patterns(tmp_path / "p.json")
    monkeypatch.setattr("vsagen.pipeline.load_model", lambda *a, **k: pytest.fail("loaded despite bad input"))
    monkeypatch.setattr("vsagen.bench.time_attention", lambda *a, **k: pytest.fail("timed despite bad input"))
    res = profile("--model", model, "--attn", f"full,sparse-vdit:patterns={path}", *args)
    assert res.exit_code == 2, res.output
    line = assert_one_error_line(res.stderr, res.stdout)
    assert str(path) in line
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"


# --------------------------------------------------------------------------------------------------------------
# Settings


# --------------------------------------------------------------------------------------------------------------
# Bad input: exit 2, one `error:` line, nothing written, nothing overwritten

BAD = [
    # (id, args, substrings the message must contain)
    ("unknown-backend", ["--attn", "full,nope"], ["--attn", "'nope'", "full, vsa"]),
    ("empty-list", ["--attn", ""], ["--attn is empty"]),
    ("blank-list", ["--attn", " , "], ["--attn", "empty entry"]),
    ("empty-entry", ["--attn", "full,,vsa"], ["empty entry"]),
    ("duplicate", ["--attn", "vsa,full,vsa"], ["'vsa' twice"]),
    ("bad-format", ["--format", "xml"], ["--format", "table, markdown, csv, json", "'xml'"]),
    ("bad-tile-fit", ["--tile-fit", "partial,pad"], ["--tile-fit", "'pad'"]),
    ("sparsity-dense-only", ["--attn", "full", "--sparsity", "0.5"], ["--sparsity", "lists none"]),
    ("sparsity-range", ["--sparsity", "1.0"], ["--sparsity", "[0, 1)"]),
    ("impl-nobody-offers", ["--attn", "full", "--attn-impl", "triton"], ["--attn-impl triton", "auto"]),
    ("impl-unknown", ["--attn-impl", "cuda"], ["--attn-impl cuda"]),
    ("steps", ["--steps", "0"], ["--steps", "[1, 10000]"]),
    ("warmup", ["--warmup", "-1"], ["--warmup", "[0, 10000]"]),
    ("frames", ["--frames", "10"], ["--frames", "9", "13"]),
    ("kernels-steps", ["--kernels", "--steps", "2"], ["--kernels", "--steps"]),
    ("kernels-plot", ["--kernels", "--plot", "{tmp}/p.png"], ["--plot", "--kernels"]),
    ("kernels-too-big-for-cpu", ["--model", "wan2.1-t2v-1.3b", "--kernels", "--device", "cpu"],
     ["--kernels on a CPU", "32760", "smaller"]),
    ("plot-suffix", ["--plot", "{tmp}/p.gif"], ["--plot", ".png"]),
    ("flf2v-one-frame", ["--model", "tiny-flf2v", "--frames", "1"], ["tiny-flf2v", "--frames 5 or more"]),
    ("flf2v-crop-drops-last-frame", ["--model", "tiny-flf2v", "--frames", "5", "--tile-fit", "partial,crop"],
     ["--tile-fit crop", "last frame"]),
    ("out-parent-is-file", ["--out", "{tmp}/afile/r.md"], ["cannot write to", "not a directory"]),
    ("plot-parent-is-file", ["--plot", "{tmp}/afile/p.png"], ["cannot write to", "not a directory"]),
    ("out-is-dir", ["--out", "{tmp}"], ["is a folder", "choose another --out"]),
    ("out-equals-plot", ["--out", "{tmp}/x.png", "--plot", "{tmp}/x.png"], ["same file"]),
    ("empty-prompt", ["--prompt", " "], ["--prompt is empty"]),
    ("kernels-ulysses", ["--kernels", "--ulysses", "2"], ["--kernels", "drop --gpus / --ulysses"]),
    ("ulysses-degree", ["--ulysses", "3"], ["--ulysses 3 does not divide 2 heads", "degrees that do: 1, 2"]),
    ("ulysses-degree-crop", ["--ulysses", "2", "--height", "112", "--width", "176", "--tile-fit", "crop,partial"],
     ["--ulysses 2 does not divide 385 tokens"]),
    ("ulysses-outside-torchrun", ["--ulysses", "2"], ["add --gpus 2 (or start it with torchrun", "-m vsagen profile"]),
    ("cfg-parallel-without-guidance", ["--cfg-parallel", "--guidance", "1"], ["--cfg-parallel", "--guidance 1"]),
    ("kernels-gpus", ["--kernels", "--gpus", "2"], ["--kernels", "drop --gpus"]),
    ("gpus-ulysses", ["--gpus", "2", "--ulysses", "3"], ["--ulysses 3 runs in 3 processes, --gpus 2 starts 2"]),
    ("cache-unknown", ["--cache", "none,teacache"], ["unknown --cache 'teacache'; available: none, first-block"]),
    ("cache-option", ["--cache", "none,first-block:thr=1"],
     ["first-block has no option 'thr'; its options: threshold"]),
    ("cache-twice", ["--cache", "first-block,first-block:threshold=0.05"], ["lists first-block:threshold=0.05 twice"]),
    ("cache-kernels", ["--kernels", "--cache", "none,first-block"], ["--cache reuses", "--kernels times"]),
    ("cache-compile", ["--compile", "--cache", "none,first-block"], ["--cache first-block cannot run with --compile"]),
    ("cache-gpus", ["--gpus", "2", "--cache", "first-block"], ["--cache first-block runs in one process"]),
    ("cache-mag", ["--cache", "none,mag"], ["--cache mag: no calibration file", "mag:calibrate=true"]),
    ("cache-mag-calibrate", ["--cache", "none,mag:calibrate=true"], ["calibrates in a vsagen t2v or i2v run"]),
]


@pytest.mark.parametrize("args,needles", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_exit_2(cli_cache, tmp_path, monkeypatch, args, needles):
    def must_not_run(*a, **k):
        raise AssertionError("the profile ran despite bad input")

    monkeypatch.setattr("vsagen.commands.profile.profile_dit", must_not_run)
    monkeypatch.setattr("vsagen.commands.profile.profile_kernels", must_not_run)
    (tmp_path / "afile").write_text("a file, not a folder")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    res = profile(*(["--model", "tiny"] if "--model" not in args else []), *args)
    assert res.exit_code == 2, res.output
    line = assert_one_error_line(res.stderr, res.stdout)
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"], "something was written"


@pytest.mark.parametrize("flag,name", [("--out", "r.md"), ("--plot", "p.png")])
def test_existing_file_is_kept_without_overwrite(cli_cache, tmp_path, monkeypatch, flag, name):
    target = tmp_path / name
    target.write_text("older")
    monkeypatch.setattr("vsagen.commands.profile.profile_dit", lambda *a, **k: pytest.fail("ran despite bad input"))
    res = profile("--model", "tiny", flag, str(target))
    assert res.exit_code == 2
    line = assert_one_error_line(res.stderr, res.stdout)
    assert str(target) in line and "--overwrite" in line and flag in line
    assert target.read_text() == "older"


@pytest.mark.slow
def test_overwrite_replaces_out_and_plot(cli_cache, tmp_path):
    out, plot = tmp_path / "r.json", tmp_path / "p.png"
    out.write_text("older")
    plot.write_text("older")
    res = profile("--model", "tiny", "--attn", "full", "--steps", "1", "--warmup", "0", "--no-stock", "--frames", "5",
                  "--format", "json", "--out", str(out), "--plot", str(plot), "--overwrite")
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["rows"][0]["speedup_vs_full"] == 1.0
    assert plot.read_bytes()[:4] == b"\x89PNG"
    # the progress line counts its steps in words that agree (a new-user trial: "1 timed steps")
    assert "0 warm-up + 1 timed step\n" in res.stderr and "1 timed steps" not in res.stderr, res.stderr


def test_plot_without_matplotlib_is_one_line(cli_cache, tmp_path, monkeypatch):
    real = importlib.util.find_spec

    def find_spec(name, *a, **k):
        return None if name == "matplotlib" else real(name, *a, **k)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    res = profile("--model", "tiny", "--plot", str(tmp_path / "p.png"))
    assert res.exit_code == 2
    assert "pip install 'vsagen[plot]'" in assert_one_error_line(res.stderr, res.stdout)
    assert list(tmp_path.iterdir()) == []


def test_cuda_fp32_overhead_rows_are_refused_before_loading(monkeypatch):
    """On CUDA the overhead rows pin cuDNN/flash, which take bf16/fp16 only: refused up front, not mid-run."""
    from vsagen.commands.profile_config import resolve_profile
    from vsagen.errors import BadInput
    from vsagen.commands.profile import profile_dit

    cfg = resolve_profile(model="tiny", attn="vsa", attn_impl="torch", dtype="fp32")
    cfg = type(cfg)(**{**{f: getattr(cfg, f) for f in cfg.__dataclass_fields__}, "device": "cuda"})
    monkeypatch.setattr("vsagen.pipeline.load_model", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(BadInput, match="--no-stock"):
        profile_dit(cfg)


@pytest.mark.slow
def test_interpreted_triton_rows_are_flagged(cli_cache):
    """`--attn-impl triton` on a CPU runs the Triton interpreter (conftest sets TRITON_INTERPRET=1): the report
    says its times are the interpreter's (new-user trial: the table gave no hint)."""
    res = profile("--model", "tiny", "--attn", "full,vsa", "--attn-impl", "triton", "--steps", "1", "--warmup", "0",
                  "--no-stock", "--format", "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["rows"][1]["impl"] == "triton"
    assert any(n.startswith("vsa 0.875: the Triton kernels ran under the Triton interpreter") for n in data["notes"])


# --------------------------------------------------------------------------------------------------------------
# --cache: every (backend, cache) pair


@pytest.mark.slow
def test_profile_rows_per_backend_and_cache_count_what_the_hooks_did(cli_cache, monkeypatch):
    """--cache none,first-block at a threshold that reuses every forward after the first step: one row per (backend,
    cache), a backend's caches side by side, labels that say the cache; each row's computed / reused counts equal
    what an independent counter saw in its timed steps (the tail block's forwards, and every forward): reuse only in
    the cached rows; the speed-up against `full` uncached."""
    import vsagen.cache.install as hooks
    from vsagen.commands.profile import profile_dit
    from vsagen.commands.profile_config import resolve_profile
    from vsagen.commands.profile_render import render

    seen: list[dict] = []  # per installed cache: forwards and tail-block forwards of the timed steps
    original = hooks.install_cache

    def counting(transformers, spec, timer, **k):
        installed = original(transformers, spec, timer, **k)
        count = {"forwards": 0, "tail": 0}
        seen.append(count)

        def add(key):
            def hook(*_):  # returns None: the output stays
                if timer.enabled:
                    count[key] += 1
            return hook

        for _, t in transformers:
            handles = [t.register_forward_hook(add("forwards")), t.blocks[-1].attn1.to_q.register_forward_hook(
                add("tail"))]
            installed._undo.extend(h.remove for h in handles)
        return installed

    monkeypatch.setattr("vsagen.pipeline.install_cache", counting)
    cfg = resolve_profile(model="tiny", attn="full,vsa", cache="none,first-block:threshold=1e9", steps=2,
                          stock=True, frames=5, height=64, width=64)
    rep = profile_dit(cfg)
    data = json.loads(render(rep, "json"))
    rows = data["rows"]
    fb = "first-block:threshold=1e+09"
    assert [(r["backend"], r["cache"]) for r in rows] == [("full", "none"), ("full", fb), ("vsa", "none"), ("vsa", fb)]
    assert [r["cache_spec"] for r in rows[:2]] == ["none", "first-block:threshold=1e+09"]
    assert len(seen) == 2  # a hook only where a cache runs (the overhead rows: uncached)
    for r in rows:
        assert r["dit_forwards"] == 4 and r["dit_computed_forwards"] + r["dit_reused_forwards"] == 4
        if r["cache"] == "none":
            assert (r["dit_reused_forwards"], r["dit_reuse_share"], r["dit_per_reused_forward_s"]) == (0, 0.0, None)
            assert r["dit_per_computed_forward_s"] > 0
        else:  # step 0 computed (cond, uncond), step 1 reused
            count = seen.pop(0)
            counted = (count["tail"], count["forwards"] - count["tail"])
            assert (r["dit_computed_forwards"], r["dit_reused_forwards"]) == counted == (2, 2)
            assert r["dit_reuse_share"] == 0.5 and r["dit_per_reused_forward_s"] > 0
    full, full_fb, vsa, vsa_fb = rows
    assert full["speedup_vs_full"] == 1.0 and full["overhead_vs_stock"] is not None
    assert full_fb["overhead_vs_stock"] is None  # the overhead is uncached full's
    for r in (full_fb, vsa, vsa_fb):
        assert math.isclose(r["speedup_vs_full"], full["dit_s_per_step"] / r["dit_s_per_step"], rel_tol=1e-12)
    assert 0 < full_fb["latents_rel_l2_vs_full"] < 1  # the reused step moves the result a little
    assert [r["dit_reused_forwards"] for r in data["overhead"]["rows"]] == [0, 0]
    assert [c["name"] for c in data["settings"]["caches"]] == ["none", "first-block"]
    md = render(rep, "markdown")
    assert "| full + first-block:threshold=1e+09 | " in md and "| vsa 0.875 + first-block:threshold=1e+09 | " in md
    assert "DiT forwards computed / reused" in md and "| 2 / 2 |" in md and "| 4 / 0 |" in md
    overhead = md.split("**vsagen overhead")[1].split("**")[1]  # the overhead table: uncached full only
    assert [ln.split(" | ")[0] for ln in overhead.splitlines() if ln.startswith("| ") and "---" not in ln][1:] == [
        "| diffusers-sdpa", "| full", "| full+tile-order"]
    assert any(n.startswith("cached rows: DiT s/step and its projection") for n in data["notes"])
    table = render(rep, "table", width=400)
    assert "full + first-block:threshold=1e+09" in table and "2 / 2" in table
    rows_csv = list(csv.DictReader(io.StringIO(render(rep, "csv"))))
    assert [(r["cache"], r["dit_reused_forwards"]) for r in rows_csv[:2]] == [("none", "0"),
                                                                            ("first-block:threshold=1e+09", "2")]
