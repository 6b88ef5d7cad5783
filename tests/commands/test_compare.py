"""vsagen.commands.compare and `vsagen compare`: the attention probe and the timing correction on random inputs
against independent computations, one shared tiny run through the CLI (full, vsa at sparsity 0, vsa), one of three
samplers with two backends against plain t2v runs, and one through the library (full twice). (The request and bad
input: test_compare_config.py.)

The tiny runs use the smallest useful size: 5 x 64 x 128 -> grid 2 x 4 x 8 (64 tokens, 2 tiles, so vsa at its
0.875 sparsity keeps 1 of 2 key tiles), 2 steps, no warm-up, CFG 5 (two transformer forwards a step).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_qkv
from typer.testing import CliRunner

from vsagen.attention.base import AttnContext
from vsagen.attention.full import FullAttention
from vsagen.cli.app import app
from vsagen.commands.compare import PROBE_REGION, AttentionProbe, video_metrics, without_region, write_outputs
from vsagen.commands.compare_config import resolve_compare
from vsagen.layout import tile_layout
from vsagen.timing import Timer, TimingReport

# One pytest-xdist worker runs the whole file (`--dist loadgroup`, pyproject.toml): three module fixtures run compare
# once, not in each worker.
pytestmark = pytest.mark.xdist_group("test_compare")

runner = CliRunner()
SMALL = ["--frames", "5", "--height", "64", "--width", "128", "--steps", "2", "--warmup", "0"]
# vsa at sparsity 0 selects every key tile, so its fine stage is dense attention over the same keys in another
# summation order (fp32): observed 2.6e-7 relative L2 on the worst layer's attention output, 5.5e-7 on the final
# latents after 2 steps, and identical 8-bit frames (PSNR inf). Bounds: 1e-5 relative L2 (attention and latents:
# ~20-40x the rounding seen, while vsa at 0.875 is ~1e-2 on the latents and ~0.4 on the attention), PSNR >= 60 dB
# (a level off in one value of 1000 would be 78 dB) and SSIM >= 0.999, leaving room for a 1-level rounding flip.
FP32_ATTN_REL_L2 = 1e-5
FP32_LATENTS_REL_L2 = 1e-5
FP32_MIN_PSNR_DB = 60.0
FP32_MIN_SSIM = 0.999


# --------------------------------------------------------------------------------------------------------------
# The parts, on random inputs


def ctx_at(step: int, layer: int, layout=None, enabled: bool = True) -> AttnContext:
    timer = Timer("cpu")
    timer.step, timer.enabled = step, enabled
    return AttnContext(layout=layout, layer=layer, expert=None, timer=timer)


class Scaled(FullAttention):
    """Dense attention times (1 + eps): its relative L2 against dense attention is exactly eps."""

    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps

    def __call__(self, q, k, v, ctx):
        return super().__call__(q, k, v, ctx) * (1 + self.eps)


def test_probe_measures_a_known_perturbation_per_step_and_layer():
    probe = AttentionProbe(Scaled(0.03), steps=(0, 2))
    qkv = make_qkv(2, 40, 2, 16, seed=5)
    dense = FullAttention()(*qkv, None)
    for step in range(3):
        for layer in range(2):
            for _ in range(2):  # two CFG passes
                out = probe(*qkv, ctx_at(step, layer))
                assert torch.equal(out, dense * 1.03)  # the backend's output, unchanged
    probe(*qkv, ctx_at(0, 0, enabled=False))  # a warm-up step: not measured
    per_step, per_layer = probe.errors()
    assert [(x["step"], x["layer"]) for x in per_step] == [(0, 0), (0, 1), (2, 0), (2, 1)]
    for x in per_step + per_layer:
        assert x["expert"] == "transformer" and x["rel_l2"] == pytest.approx(0.03, rel=1e-5)
    assert probe.errors() == ([], [])  # read once


def test_probe_of_full_is_exactly_zero_and_vsa_at_sparsity_zero_is_fp32_noise():
    from vsagen.attention.vsa import VSAAttention, VSAOptions

    layout = tile_layout((2, 4, 8))
    qkv = make_qkv(1, layout.num_tokens, 2, 16, seed=6)
    full = AttentionProbe(FullAttention(), steps=(0,))
    vsa = AttentionProbe(VSAAttention(VSAOptions(sparsity=0.0, impl="torch")), steps=(0,))
    vsa_sparse = AttentionProbe(VSAAttention(VSAOptions(sparsity=0.875, impl="torch")), steps=(0,))
    for probe in (full, vsa, vsa_sparse):
        probe(*qkv, ctx_at(0, 0, layout))
    assert full.errors()[1][0]["rel_l2"] == 0.0
    assert vsa.errors()[1][0]["rel_l2"] <= FP32_ATTN_REL_L2
    assert vsa_sparse.errors()[1][0]["rel_l2"] > 100 * FP32_ATTN_REL_L2
    assert (vsa.name, vsa.tiled, vsa.options.sparsity) == ("vsa", True, 0.0)  # the rest is the backend's


def test_without_region_takes_the_probe_out_of_the_enclosing_regions():
    records = [("total", -1, 9.0), ("dit", 0, 1.0), ("dit/transformer", 0, 1.0), ("attn1", 0, 0.5),
               ("self_attention", 0, 0.4), ("self_attention/fine", 0, 0.2), (PROBE_REGION, 0, 0.1),
               ("dit", 0, 1.0), ("dit/transformer", 0, 1.0), ("attn1", 0, 0.5), ("self_attention", 0, 0.4),
               (PROBE_REGION, 0, 0.1), ("dit", 1, 0.8), ("dit/transformer", 1, 0.8), ("self_attention", 1, 0.3)]
    out, removed = without_region(records, PROBE_REGION)
    assert removed == pytest.approx(0.2)
    before = TimingReport.from_records(records, "cpu")
    after = TimingReport.from_records(out, "cpu")
    assert after.dit_s == pytest.approx(before.dit_s - 0.2)
    assert after.dit_per_step_s == pytest.approx([2.0 - 0.2, 0.8])
    assert after.dit_by_expert_s["transformer"] == pytest.approx(2.8 - 0.2)
    assert after.attn1_s == pytest.approx(1.0 - 0.2) and after.self_attention_s == pytest.approx(1.1 - 0.2)
    assert after.self_attention_stages_s == {"fine": 0.2} and after.total_s == 9.0  # not enclosing / not reported
    assert after.dit_forwards == before.dit_forwards == 3


def test_without_region_takes_each_probe_out_of_the_cached_forward_it_ran_in():
    """A step cache's per-forward regions (dit_computed / dit_reused, several a step) each lose the probe calls that
    ended since the previous one: the computed cond pass its 0.1, the reused uncond pass (blocks[0] still runs, and
    its attention is probed) its 0.02, in records in the order the regions ended."""
    records = [(PROBE_REGION, 0, 0.1), ("dit", 0, 1.0), ("dit_computed", 0, 1.0), (PROBE_REGION, 0, 0.02),
               ("dit", 0, 0.3), ("dit_reused", 0, 0.3), ("dit", 1, 0.9), ("dit_computed", 1, 0.9)]
    out, removed = without_region(records, PROBE_REGION)
    assert removed == pytest.approx(0.12)
    t = TimingReport.from_records(out, "cpu")
    assert (t.dit_computed_s, t.dit_reused_s) == (pytest.approx(0.9 + 0.9), pytest.approx(0.28))
    assert (t.dit_computed_forwards, t.dit_reused_forwards) == (2, 1)
    assert t.dit_s == pytest.approx(2.2 - 0.12)


def test_video_metrics_of_a_known_perturbation():
    """PSNR computed here from the definition: every value of the last frame one level up (no clipping)."""
    ref = np.random.default_rng(0).integers(0, 255, (3, 16, 24, 3), dtype=np.uint8)
    x = ref.copy()
    x[2] += 1
    m = video_metrics(ref, x)
    assert m["psnr_db"] == pytest.approx(10 * math.log10(255**2 / (1 / 3)), rel=1e-12)
    assert m["psnr_per_frame_db"][:2] == [math.inf, math.inf]
    assert m["psnr_per_frame_db"][2] == pytest.approx(20 * math.log10(255), rel=1e-12)
    assert m["ssim_per_frame"][:2] == [1.0, 1.0] and 0.9 < m["ssim_per_frame"][2] < 1.0
    same = video_metrics(ref, ref)
    assert same["psnr_db"] == math.inf and same["ssim"] == 1.0


# --------------------------------------------------------------------------------------------------------------
# One shared tiny run through the CLI, one through the library


@pytest.fixture(scope="module")
def cli_run(vsagen_cache, tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("compare") / "out"
    res = runner.invoke(app, ["compare", "a prompt", "--model", "tiny", "--attn", "full,vsa:sparsity=0,vsa", *SMALL,
                              "--out", str(out), "--json", "--sheet"])
    assert res.exit_code == 0, res.output
    return out, json.loads(res.stdout), res


@pytest.mark.slow
def test_compare_writes_every_file_atomically(cli_run):
    from vsagen.media.video import read_mp4

    out, data, res = cli_run
    names = ["full.mp4", "vsa-sparsity-0.mp4", "vsa.mp4", "full.sheet.png", "vsa-sparsity-0.sheet.png",
             "vsa.sheet.png", "side-by-side.mp4", "compare.png", "compare.json", "compare.csv"]
    assert sorted(p.name for p in out.iterdir()) == sorted(names)  # no temporary files left
    assert list(data["files"].values()) == [str(out / n) for n in names]
    for n in names[:3]:
        assert read_mp4(out / n).shape == (5, 64, 128, 3)
    assert read_mp4(out / "side-by-side.mp4").shape == (5, 64, 3 * 128, 3)
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "compare.json").read_text()) == data
    # what decoded the runs, resolved (compare.json had only the request's "auto": a new-user trial)
    assert (data["vae_dtype"], data["vae_decoder"], data["vae_tiling"]) == ("fp32", "stock", False)
    choice = data["vae_tiling_choice"]  # `--vae-tiling auto`, decided by memory before each (whole) decode: the last
    assert (choice["mode"], choice["tiled"]) == ("auto", False)
    said = "--vae-tiling auto: the VAE decodes untiled: its estimated peak "
    assert choice["why"].startswith(said) and sum(n.startswith(said) for n in data["notes"]) == 1  # 3 decodes, 1 note
    assert choice["estimated_peak_gib"] < choice["needed_gib"] <= choice["available_gib"]
    assert data["settings"]["vae_dtype"] == "auto"
    rows = list(csv.DictReader(io.StringIO((out / "compare.csv").read_text())))
    assert [r["label"] for r in rows] == ["full", "vsa:sparsity=0", "vsa"]
    assert rows[0]["psnr_db"] == "inf" and float(rows[2]["psnr_db"]) == pytest.approx(data["rows"][2]["psnr_db"])
    assert "[1/3] full (reference)" in res.stderr and "wrote" in res.stderr
    assert list(data["files"])[3:6] == ["full sheet", "vsa:sparsity=0 sheet", "vsa sheet"]


@pytest.mark.slow
def test_compare_writes_a_contact_sheet_per_backend(cli_run):
    """--sheet: one PNG per backend beside its mp4, each tile that backend's frame (within H.264's error of the
    decoded mp4: the sheet is drawn from the frames before encoding), titled with the backend and the reference."""
    from PIL import Image

    from vsagen.media.sheet import sheet_layout
    from vsagen.media.video import read_mp4

    out, data, _ = cli_run
    for label, name in (("full", "full"), ("vsa:sparsity=0", "vsa-sparsity-0"), ("vsa", "vsa")):
        sheet = np.asarray(Image.open(out / f"{name}.sheet.png").convert("RGB")).astype(int)
        video = read_mp4(out / f"{name}.mp4").astype(int)
        layout = sheet_layout(5, 64, 128, data["settings"]["fps"], f"tiny | attn {label} | 5x64x128 (frames x "
                              "height x width) | 2 steps | seed 0 | compare, reference full")
        assert sheet.shape[:2] == (layout.height, layout.width) and layout.indices == [0, 1, 2, 3, 4]
        for index, (x, y) in zip(layout.indices, layout.tiles):
            err = np.abs(sheet[y:y + 64, x:x + 128] - video[index]).mean()
            assert err < 12, (name, index, err)


@pytest.mark.slow
def test_compare_rows(cli_run):
    _, data, _ = cli_run
    full, vsa0, vsa = data["rows"]
    assert data["reference"] == "full" and data["error_steps"] == [0, 1] and data["steps"] == 2
    # the reference against itself: infinite PSNR ("inf" in the JSON), SSIM 1, zero errors
    assert full["psnr_db"] == "inf" and full["psnr_per_frame_db"] == ["inf"] * 5
    assert full["ssim"] == 1.0 and full["latents_rel_l2"] == 0.0 and full["speedup_vs_reference"] == 1.0
    assert full["attention_rel_l2_mean"] == full["attention_rel_l2_max"] == 0.0
    assert [(x["step"], x["layer"], x["rel_l2"]) for x in full["attention_rel_l2"]] == [
        (s, layer, 0.0) for s in (0, 1) for layer in (0, 1)]
    # every tile selected: dense attention in fp32, up to rounding
    assert vsa0["attention_rel_l2_max"] <= FP32_ATTN_REL_L2
    assert vsa0["latents_rel_l2"] <= FP32_LATENTS_REL_L2
    assert vsa0["psnr_db"] == "inf" or vsa0["psnr_db"] >= FP32_MIN_PSNR_DB
    assert vsa0["ssim"] >= FP32_MIN_SSIM
    # half the tiles: a real difference, reported consistently
    assert vsa["attention_rel_l2_max"] > 1e-2 and vsa["latents_rel_l2"] > 1e-4 and vsa["psnr_db"] < FP32_MIN_PSNR_DB
    assert vsa["ssim"] < 1.0 and len(vsa["psnr_per_frame_db"]) == len(vsa["ssim_per_frame"]) == 5
    assert vsa["attention_rel_l2_max"] == max(x["rel_l2"] for x in vsa["attention_rel_l2_per_layer"])
    for r in data["rows"]:
        assert r["dit_s_per_step"] > 0 and len(r["dit_per_step_s"]) == 2 and r["probe_s"] > 0
        assert r["speedup_vs_reference"] == pytest.approx(full["dit_s_per_step"] / r["dit_s_per_step"], rel=1e-12)
    assert vsa["spec"] == "vsa:sparsity=0.875:impl=auto:tile=4x4x4:query_rows=64:precision=bf16:topk_count=tiles"
    assert vsa["impl"] == "torch"
    assert any("random weights" in n for n in data["notes"])


@pytest.mark.slow
def test_reference_twice_through_the_library(vsagen_cache, tiny_dir, tmp_path):
    """Two separate runs of `full` (the library takes a list the CLI refuses): the same seed and noise give
    the same video on the CPU, so the second is infinite PSNR, SSIM 1, zero latent distance."""
    from vsagen.commands.compare import compare

    cfg = resolve_compare("a prompt", model="tiny", attn="full,vsa", frames=5, height=64, width=128, steps=2,
                          warmup=0, out=tmp_path / "twice", plot=False, error_steps="last")
    cfg = dataclasses.replace(cfg, backends=(cfg.backends[0], cfg.backends[0]))
    report = compare(cfg, progress=False)
    a, b = report.rows
    assert (a.label, b.label) == ("full", "full (2)")
    assert b.psnr_db == math.inf and b.ssim == 1.0 and b.latents_rel_l2 == 0.0
    assert b.attention_rel_l2_max == 0.0 and [x["step"] for x in b.attention_rel_l2] == [1, 1]
    assert sorted(p.name for p in (tmp_path / "twice").iterdir()) == [
        "compare.csv", "compare.json", "full-1.mp4", "full.mp4", "side-by-side.mp4"]


@pytest.mark.slow
def test_each_decoder_decodes_the_same_latents_of_one_dit_run(vsagen_cache, tiny_dir, tmp_path, monkeypatch):
    """--attn full --vae stock,tiny, and stock again (the library takes a list the CLI refuses): the DiT runs once and
    every decode gets its final latents (the same tensor); the stock decoder after the tiny one gives the reference's
    frames exactly (PSNR inf, SSIM 1: the decoder swap leaves the stock decode as it was), the tiny one other frames.
    The rows and compare.json carry each decoder, its weights and its decode seconds; every video is written."""
    import vsagen.commands.compare as compare_module
    import vsagen.pipeline
    from vsagen.commands.compare import compare
    from vsagen.decode.decoder_choice import vae_summary

    decoded, videos = [], []
    original_decode, original_write = vsagen.pipeline.decode_latents, compare_module.write_outputs

    def decode(pipe, latents):
        decoded.append((latents, vae_summary(pipe.vae)["vae_decoder"]))
        return original_decode(pipe, latents)

    def keep(cfg, report, frames, **k):
        videos.extend(frames)
        return original_write(cfg, report, frames, **k)

    monkeypatch.setattr(vsagen.pipeline, "decode_latents", decode)
    monkeypatch.setattr(compare_module, "write_outputs", keep)
    out = tmp_path / "out"
    cfg = resolve_compare("a prompt", model="tiny", attn="full", vae="stock,tiny", frames=5, height=64, width=64,
                          steps=1, warmup=0, out=out, plot=False, error_steps="none")
    cfg = dataclasses.replace(cfg, vae_decoders=(*cfg.vae_decoders, cfg.vae_decoders[0]))
    report = compare(cfg, progress=False)
    assert [kind for _, kind in decoded] == ["stock", "tiny", "stock"]  # one decode each (no --warmup)
    assert all(latents is decoded[0][0] for latents, _ in decoded)
    stock, tiny, again = report.rows
    assert [r.label for r in report.rows] == ["full / stock VAE", "full / tiny VAE", "full / stock VAE (2)"]
    assert np.array_equal(videos[2], videos[0]) and again.psnr_db == math.inf and again.ssim == 1.0
    assert not np.array_equal(videos[1], videos[0]) and math.isfinite(tiny.psnr_db) and tiny.ssim < 1.0
    for r in report.rows:  # one DiT run: its times, no latent distance
        assert r.dit_s_per_video == stock.dit_s_per_video and r.latents_rel_l2 == 0.0 and r.speedup_vs_reference == 1
        assert r.decode_s > 0 and r.decode_saved_s == stock.decode_s - r.decode_s
    assert (stock.vae_decoder, stock.vae_weights, tiny.vae_decoder) == ("stock", None, "tiny")
    assert tiny.vae_weights.endswith("taew2_1.safetensors") and tiny.decode_speedup_vs_reference == pytest.approx(
        stock.decode_s / tiny.decode_s)
    data = json.loads((out / "compare.json").read_text())
    assert [(r["vae_decoder"], r["vae_weights"], r["decode_s"]) for r in data["rows"]] == [
        (r.vae_decoder, r.vae_weights, r.decode_s) for r in report.rows]
    assert data["vae_decoder"] == "stock" and data["settings"]["vae_decoders"] == ["stock", "tiny", "stock"]
    assert any("the tiny decoder (TAEHV" in n for n in data["notes"])
    assert sorted(p.name for p in out.iterdir()) == ["compare.csv", "compare.json", "full-vae-stock-2.mp4",
                                                     "full-vae-stock.mp4", "full-vae-tiny.mp4", "side-by-side.mp4"]


def test_an_interrupted_write_leaves_no_file(tmp_path, monkeypatch):
    """Files are written only after every run; an interrupt while writing removes those already written, and the
    folder this run created."""
    import vsagen.commands.compare_render

    cfg = resolve_compare("a prompt", model="tiny", attn="full,vsa", frames=5, height=64, width=128, steps=1,
                          out=tmp_path / "out")

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(vsagen.commands.compare_render, "write_plot", interrupted)
    videos = [np.zeros((5, 64, 128, 3), np.uint8)] * 2
    with pytest.raises(KeyboardInterrupt):
        write_outputs(cfg, None, videos)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def overwrite_run(cli_run, tmp_path_factory):
    """A second compare into a copy of `cli_run`'s folder, with --overwrite, other backends, no plot, no sheet, and
    a file of the user's in the folder, at COLUMNS=80: (folder, result)."""
    import shutil

    folder = tmp_path_factory.mktemp("again") / "out"
    shutil.copytree(cli_run[0], folder)
    (folder / "notes.txt").write_text("mine")
    res = runner.invoke(app, ["compare", "a prompt", "--model", "tiny", "--attn", "full,vsa", "--frames", "5",
                              "--height", "64", "--width", "64", "--steps", "1", "--warmup", "0", "--error-steps",
                              "none", "--no-plot", "--out", str(folder), "--overwrite"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    return folder, res


@pytest.mark.slow
def test_notes_are_said_once_on_stderr(overwrite_run):
    """Issue 29: compare printed its notes on stderr as it began and again on stdout after the table (the random
    weights note twice); a note is said once, on stderr, as t2v says its notes."""
    _, res = overwrite_run
    said = [line for line in res.stderr.splitlines() if line.startswith("note: ")]
    assert said and len(said) == len(set(said)), res.stderr
    assert any("PSNR, SSIM" in n for n in said) and "note: " not in res.stdout and "files: " in res.stdout
    # at COLUMNS=80 (issue 29): the table fits, a note longer than a line goes on under its text, never mid-word
    assert max(len(line) for line in res.stdout.splitlines()) <= 80
    assert max(len(line) for line in res.stderr.splitlines() if not line.startswith("\r")) <= 80
    assert any(line.startswith(" " * 6) and line.strip() for line in res.stderr.splitlines())


@pytest.mark.slow
def test_overwrite_removes_the_older_backends_files_it_listed(overwrite_run):
    """Issue 29: `compare --overwrite` with other backends kept the older backends' files. The first run's files that
    the second does not write again are gone (its vsa:sparsity=0 mp4, its sheets, its plot), a file of the user's
    stays."""
    folder, res = overwrite_run
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["full.mp4", "vsa.mp4", "side-by-side.mp4", "compare.json", "compare.csv", "notes.txt"])
    assert "removed" in res.stderr and "compare.png" in res.stderr


def test_stale_outputs_are_only_files_an_earlier_compare_listed_in_its_folder(tmp_path):
    """Issue 29: `compare --overwrite` with other backends kept the older backends' mp4s. What it removes: the
    files the folder's compare.json lists (by name, in the folder), of the kinds compare writes, that this run does
    not write; never a file the JSON does not list, one outside the folder, a folder or a symlink."""
    from vsagen.commands.compare import stale_outputs

    folder = tmp_path / "cmp"
    folder.mkdir()
    (tmp_path / "outside.mp4").write_text("not the folder's")
    for name in ("full.mp4", "vsa.mp4", "vsa.sheet.png", "mine.mp4", "notes.txt", "compare.json"):
        (folder / name).write_text(name)
    (folder / "sub.mp4").mkdir()
    (folder / "link.mp4").symlink_to(tmp_path / "outside.mp4")
    listed = {"full": "cmp/full.mp4", "vsa": "cmp/vsa.mp4", "vsa sheet": "/elsewhere/cmp/vsa.sheet.png",
              "gone": "cmp/gone.mp4", "up": "../outside.mp4", "sub": "cmp/sub.mp4", "link": "cmp/link.mp4",
              "text": "cmp/notes.txt", "json": "cmp/compare.json"}
    (folder / "compare.json").write_text(json.dumps({"command": "compare", "files": listed}))
    keep = [folder / "full.mp4", folder / "compare.json"]
    assert stale_outputs(folder, keep) == [folder / "vsa.mp4", folder / "vsa.sheet.png"]
    (folder / "compare.json").write_text(json.dumps({"command": "profile", "files": listed}))  # not compare's
    assert stale_outputs(folder, keep) == []
    (folder / "compare.json").write_text("{not json")
    assert stale_outputs(folder, keep) == [] and stale_outputs(tmp_path / "missing", keep) == []


# --------------------------------------------------------------------------------------------------------------
# Several samplers: the distilled few-step sampler against the checkpoint's scheduler, in one command

SAMPLERS = "dmd,default:steps=2:guidance=3,default:steps=2:shift=5"
SAMPLER_SIZE = ["--frames", "5", "--height", "64", "--width", "128"]


@pytest.fixture(scope="module")
def sampler_run(vsagen_cache, tiny_dir, tmp_path_factory):
    """`compare --attn full,vsa --sampler SAMPLERS` (six runs, one warm-up each: a whole pass for dmd; the tiny
    preset's flow shift 3 is loaded, so the shift-5 runs swap the scheduler), and of the same seed and size
    `t2v --attn full --sampler dmd` and `t2v --attn full --steps 2 --flow-shift 5`: (folder, JSON, {name: t2v mp4})."""
    tmp = tmp_path_factory.mktemp("samplers")
    res = runner.invoke(app, ["compare", "a prompt", "--model", "tiny", "--attn", "full,vsa", "--sampler", SAMPLERS,
                              *SAMPLER_SIZE, "--no-plot", "--out", str(tmp / "out"), "--json"])
    assert res.exit_code == 0, res.output
    t2v = {"dmd": ["--sampler", "dmd"], "shift5": ["--steps", "2", "--flow-shift", "5"]}
    for name, args in t2v.items():
        done = runner.invoke(app, ["t2v", "a prompt", "--model", "tiny", "--attn", "full", *args, *SAMPLER_SIZE,
                                   "--out", str(tmp / f"{name}.mp4")])
        assert done.exit_code == 0, done.output
    return tmp / "out", json.loads(res.stdout), {name: tmp / f"{name}.mp4" for name in t2v}


@pytest.mark.slow
def test_samplers_run_with_every_backend_and_write_every_file(sampler_run):
    from vsagen.media.video import read_mp4

    out, data, _ = sampler_run
    stems = [f"{b}-{s}" for s in ("dmd", "default-2-steps-cfg-3-shift-3", "default-2-steps-cfg-5-shift-5")
             for b in ("full", "vsa")]
    names = [f"{x}.mp4" for x in stems] + ["side-by-side.mp4", "compare.json", "compare.csv"]
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    assert list(data["files"].values()) == [str(out / n) for n in names]
    assert [r["label"] for r in data["rows"]] == [f"{b} / {s}" for s in ("dmd", "default 2 steps CFG 3 shift 3",
                                                                         "default 2 steps CFG 5 shift 5")
                                                  for b in ("full", "vsa 0.875")]
    assert read_mp4(out / "side-by-side.mp4").shape == (5, 64, 6 * 128, 3)
    rows = list(csv.DictReader(io.StringIO((out / "compare.csv").read_text())))
    assert [(r["sampler"], r["steps"], r["dit_forwards"]) for r in rows] == [
        ("dmd", "3", "3"), ("dmd", "3", "3"), ("default:steps=2:guidance=3", "2", "4"),
        ("default:steps=2:guidance=3", "2", "4"), ("default:steps=2:shift=5", "2", "4"),
        ("default:steps=2:shift=5", "2", "4")]


@pytest.mark.slow
def test_each_run_records_its_sampler_and_dit_seconds_per_video(sampler_run):
    """dmd: 3 steps, one DiT forward each (CFG off, no flow shift); default 2 steps with CFG: 4 forwards. DiT s per
    video is the sum of the timed steps, s/step its mean, the speed-up the reference's s/video over the run's."""
    _, data, _ = sampler_run
    rows = data["rows"]
    ref = rows[0]
    assert data["reference"] == "full / dmd" and data["speedup_of"] == "dit_s_per_video"
    expected = [("dmd", 3, 1.0, None, 3, [0, 1, 2])] * 2 + [("default", 2, 3.0, 3.0, 4, [0, 1])] * 2 + [
        ("default", 2, 5.0, 5.0, 4, [0, 1])] * 2
    for r, (name, steps, guidance, shift, forwards, at) in zip(rows, expected):
        assert (r["sampler"]["name"], r["steps"], r["guidance"], r["flow_shift"], r["dit_forwards"],
                r["error_steps"]) == (name, steps, guidance, shift, forwards, at), r["label"]
        assert len(r["dit_per_step_s"]) == steps and r["dit_s_per_video"] == pytest.approx(sum(r["dit_per_step_s"]))
        assert r["dit_s_per_step"] == pytest.approx(r["dit_s_per_video"] / steps, rel=1e-12)
        assert r["speedup_vs_reference"] == pytest.approx(ref["dit_s_per_video"] / r["dit_s_per_video"], rel=1e-12)
        assert {x["step"] for x in r["attention_rel_l2"]} == set(at) and r["probe_s"] > 0
    assert rows[0]["sampler"]["sigmas"] == pytest.approx([1.0, 28 / 37, 12 / 23])
    assert ref["psnr_db"] == "inf" and ref["latents_rel_l2"] == 0.0 and ref["speedup_vs_reference"] == 1.0
    assert all(r["latents_rel_l2"] > 1e-3 for r in rows[1:])  # another backend or sampler: another video
    assert [x["label"] for x in data["samplers"]] == ["dmd", "default 2 steps CFG 3 shift 3",
                                                      "default 2 steps CFG 5 shift 5"]


@pytest.mark.slow
def test_a_sampler_s_run_is_the_plain_t2v_run_of_that_sampler(sampler_run):
    """The same frames as `vsagen t2v` of the same seed: dmd (its warm-up pass leaves no trace), and the scheduler at
    flow shift 5 although the session loaded shift 3 (the scheduler swapped for the run)."""
    from vsagen.media.video import read_mp4

    out, _, t2v = sampler_run
    assert np.array_equal(read_mp4(out / "full-dmd.mp4"), read_mp4(t2v["dmd"]))
    assert np.array_equal(read_mp4(out / "full-default-2-steps-cfg-5-shift-5.mp4"), read_mp4(t2v["shift5"]))


def test_flow_shift_swaps_the_scheduler_for_the_block_only():
    from types import SimpleNamespace

    from diffusers import UniPCMultistepScheduler

    from vsagen.commands.compare import flow_shift

    own = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    pipe = SimpleNamespace(scheduler=own)
    for shift in (None, 3.0):
        with flow_shift(pipe, shift):
            assert pipe.scheduler is own
    with flow_shift(pipe, 5.0):
        assert type(pipe.scheduler) is UniPCMultistepScheduler and pipe.scheduler.config.flow_shift == 5.0
        pipe.scheduler.set_timesteps(2)
        own.set_timesteps(2)
        assert pipe.scheduler.sigmas[1] > own.sigmas[1]  # a larger shift keeps the second step at higher noise
    assert pipe.scheduler is own and own.config.flow_shift == 3.0


@pytest.mark.slow
def test_overwrite_with_other_samplers_removes_the_runs_it_did_not_write(sampler_run, tmp_path):
    import shutil

    folder = tmp_path / "out"
    shutil.copytree(sampler_run[0], folder)
    res = runner.invoke(app, ["compare", "a prompt", "--model", "tiny", "--attn", "full", "--sampler",
                              "dmd,default:steps=1", *SAMPLER_SIZE, "--warmup", "0", "--error-steps", "none",
                              "--no-plot", "--out", str(folder), "--overwrite"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["full-dmd.mp4", "full-default-1-step-cfg-5.mp4", "side-by-side.mp4", "compare.json", "compare.csv"])
    assert res.stderr.count("removed ") == 5


# --------------------------------------------------------------------------------------------------------------
# --cache: every backend with every cache


@pytest.mark.slow
def test_caches_that_reuse_nothing_leave_every_frame_as_uncached(vsagen_cache, tiny_dir, tmp_path, monkeypatch):
    """--cache none,first-block:threshold=0 --attn full,vsa: four runs (full; full + first-block; vsa; vsa +
    first-block), the reference full uncached. At threshold 0 first-block reuses nothing (blocks[0]'s residual
    changes every step), so each cached run's frames equal its backend's uncached frames exactly (full + first-block:
    PSNR inf against the reference); the JSON and CSV rows say the cache and count 4 computed, 0 reused forwards."""
    import vsagen.commands.compare as compare_module

    videos = []
    original = compare_module.write_outputs

    def keep(cfg, report, frames, **k):
        videos.extend(frames)
        return original(cfg, report, frames, **k)

    monkeypatch.setattr(compare_module, "write_outputs", keep)
    out = tmp_path / "out"
    res = runner.invoke(app, ["compare", "a prompt", "--model", "tiny", "--attn", "full,vsa", "--cache",
                              "none,first-block:threshold=0", *SMALL, "--error-steps", "none", "--no-plot",
                              "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    rows = data["rows"]
    labels = ["full", "full + first-block:threshold=0", "vsa 0.875", "vsa 0.875 + first-block:threshold=0"]
    assert [r["label"] for r in rows] == labels and data["reference"] == "full"
    assert [r["cache"] for r in rows] == ["none", "first-block:threshold=0"] * 2
    assert [c["name"] for c in data["caches"]] == ["none", "first-block"]
    for r in rows:
        assert (r["dit_forwards"], r["dit_computed_forwards"], r["dit_reused_forwards"]) == (4, 4, 0)
        assert r["dit_reuse_share"] == 0.0 and r["dit_per_reused_forward_s"] is None
        assert r["dit_per_computed_forward_s"] > 0 and r["speedup_vs_reference"] > 0
        # as t2v's JSON: the seconds of each kind and the steps with a reused forward
        assert (r["dit_reused_s"], r["dit_reused_steps"]) == (0.0, [])
        assert r["dit_computed_s"] == pytest.approx(r["dit_s_per_video"], rel=0.2)  # its hooks time a bit more
    assert sum("reused no forward when comparing" in n for n in data["notes"]) == 2  # full's and vsa's cached runs
    assert np.array_equal(videos[1], videos[0]) and np.array_equal(videos[3], videos[2])
    assert rows[1]["psnr_db"] == "inf" and rows[1]["latents_rel_l2"] == 0.0
    assert rows[3]["psnr_per_frame_db"] == rows[2]["psnr_per_frame_db"] and rows[3]["latents_rel_l2"] == rows[2][
        "latents_rel_l2"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["full.mp4", "full-first-block-threshold-0.mp4", "vsa.mp4", "vsa-first-block-threshold-0.mp4",
         "side-by-side.mp4", "compare.json", "compare.csv"])
    assert list(data["files"])[:4] == labels  # the side-by-side panels are labelled as the runs
    csv_rows = list(csv.DictReader(io.StringIO((out / "compare.csv").read_text())))
    assert [(r["cache"], r["dit_computed_forwards"], r["dit_reused_forwards"]) for r in csv_rows] == [
        ("none", "4", "0"), ("first-block:threshold=0", "4", "0")] * 2
    for r, row in zip(csv_rows, rows):  # the CSV carries the seconds and reused steps the JSON rows do
        assert float(r["dit_computed_s"]) == pytest.approx(row["dit_computed_s"]) and r["dit_reused_s"] == "0.0"
        assert r["dit_reused_steps"] == ""


@pytest.mark.slow
def test_every_backend_runs_with_every_cache(vsagen_cache, tiny_dir, tmp_path):
    """Issue 34's acceptance on the tiny model: every registered backend with every cache (first-block, taylorseer,
    mag from a calibration file), each at settings that reuse, in one compare run: a mp4 per run, each row's
    computed + reused forwards add up to its DiT forwards, the cached rows reuse, the uncached ones do not."""
    from vsagen.attention import backend_names
    from vsagen.cache.install import save_ratios

    ratios = tmp_path / "mag.json"
    save_ratios(ratios, "tiny", 2, {"transformer": [1.0, 1.0]})
    caches = ["none", "first-block:threshold=1e9", "taylorseer:cache_interval=2:disable_cache_before_step=1",
              f"mag:file={ratios}:threshold=1"]
    out = tmp_path / "out"
    attn = ",".join(n + (":remap=true" if n == "sparse-vdit" else "") for n in backend_names())  # its file: any grid
    res = runner.invoke(app, ["compare", "a prompt", "--model", "tiny", "--attn", attn, "--cache", ",".join(caches),
                              *SMALL, "--error-steps", "none", "--no-plot", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert len(rows) == len(backend_names()) * len(caches)
    assert {r["backend"] for r in rows} == set(backend_names())
    for r in rows:
        assert (out / Path(r["file"]).name).is_file(), r["label"]
        assert r["dit_computed_forwards"] + r["dit_reused_forwards"] == r["dit_forwards"] == 4, r["label"]
        assert (r["dit_reused_forwards"] > 0) == (r["cache"] != "none"), r["label"]
        assert (len(r["dit_reused_steps"]) > 0) == (r["cache"] != "none"), r["label"]
        # the split is timed inside each DiT forward (its regions nest in the "dit" ones): at most the DiT time,
        # and most of it (the rest is hook overhead; on this CPU a forward takes ~3 ms, and under the suite's
        # parallel workers the gap reached 24% once, so a 20% band was flaky: 2026-12-05). Before the regions
        # nested, CI once saw the split 35% above the DiT time (sla + first-block).
        split = r["dit_computed_s"] + r["dit_reused_s"]
        assert 0.5 * r["dit_s_per_video"] <= split <= r["dit_s_per_video"] * (1 + 1e-9), r["label"]
        assert r["psnr_db"] == "inf" or math.isfinite(r["psnr_db"]), r["label"]


@pytest.mark.slow
def test_rows_over_a_lora_s_scales_run_on_one_loaded_model(vsagen_cache, tiny_dir, tmp_path):
    """--lora FILE:scale=1,0,1: a row per scale, rescaled in place between runs: the scale-0 row moves away from the
    reference (scale 1) and the third row, at scale 1 again, is the reference's video."""
    from lora_files import tiny_lora
    from vsagen.commands.compare import compare

    lora = tiny_lora(tmp_path)
    cfg = resolve_compare("a prompt", model="tiny", attn="full", lora=[f"{lora}:scale=1,0,0.5"], frames=5, height=64,
                          width=64, steps=1, warmup=0, out=tmp_path / "c", plot=False)
    cfg = dataclasses.replace(cfg, loras=(dataclasses.replace(cfg.loras[0], scale=1.0, scales=(1.0, 0.0, 1.0)),))
    report = compare(cfg, progress=False)
    assert [r.label for r in report.rows] == ["full / LoRA 1", "full / LoRA 0", "full / LoRA 1 (2)"]
    assert [r.lora_scale for r in report.rows] == [1.0, 0.0, 1.0] and report.lora[0]["scale"] == [1.0, 0.0, 1.0]
    assert report.rows[1].latents_rel_l2 > 1e-3 and report.rows[2].latents_rel_l2 < 1e-5
    assert Path(report.rows[1].file).name == "full-lora-0.mp4"
