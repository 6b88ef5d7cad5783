"""Issue 33 item 1 from the user's side: the VSA tile (`vsa`, `rocm-vsa`, `sla-star`: `tile=TxHxW`, `query_rows`,
`impl=fa4`) through the command line on CPU with the tiny model: a run writes its mp4 and JSON with the tile recorded,
`compare` shows a larger tile beside the trained one, and a tile or FA4 request that cannot run is one line, exit 2,
nothing written, before the model loads."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest
from conftest import one_error_line
from typer.testing import CliRunner

from vsagen.cli.app import app
from vsagen.media.video import read_mp4

runner = CliRunner()
# the tiny preset's size (17 x 96 x 160 -> grid 5 x 6 x 10), one step: every tile below has partial cubes
TINY_SHAPE, TINY_GRID = (17, 96, 160, 3), [5, 6, 10]


def _cubes(grid: list[int], tile: list[int]) -> tuple[int, int]:
    """(cubes, full cubes) of `tile` over `grid`, counted here from the definition."""
    return (math.prod(-(-g // t) for g, t in zip(grid, tile)), math.prod(g // t for g, t in zip(grid, tile)))


# (--attn entry, the backend's name, its tile, the implementation that runs)
RUNS = [
    ("vsa:tile=4x4x8", "vsa", [4, 4, 8], "torch"),  # impl auto: torch on the CPU
    ("vsa:tile=4x4x8:impl=triton:query_rows=128", "vsa", [4, 4, 8], "triton"),  # Triton interpreter (~2 s)
    ("sla-star:tile=4x8x8:impl=torch", "sla-star", [4, 8, 8], "torch"),
    ("rocm-vsa:tile=4x4x8:impl=torch", "rocm-vsa", [4, 4, 8], "torch"),
]


@pytest.mark.slow
@pytest.mark.parametrize("entry,name,tile,ran", RUNS, ids=[r[0] for r in RUNS])
def test_t2v_with_a_tile_writes_the_video_and_records_the_tile(vsagen_cache, tiny_dir, tmp_path, entry, name, tile,
                                                               ran):
    out = tmp_path / "v.mp4"
    res = runner.invoke(app, ["t2v", "--model", "tiny", "--attn", entry, "x", "--steps", "1", "--out", str(out),
                              "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data == json.loads((tmp_path / "v.json").read_text())
    assert read_mp4(out).shape == TINY_SHAPE
    assert (data["attn"], data["attn_requested"]) == (name, entry)
    assert data["backend"]["name"] == name and data["backend"]["tile"] == "x".join(map(str, tile))
    assert data["backend"]["impl_ran"] == ran
    assert data["backend"].get("query_rows", 64) == (128 if "query_rows" in entry else 64)
    assert data["config"]["crop_tile"] == tile  # what --tile-fit crop would have rounded to
    den = data["denoised"]
    assert den["grid"] == TINY_GRID and den["tile"] == tile and den["tile_volume"] == math.prod(tile)
    assert (den["tiles"], den["full_tiles"]) == _cubes(TINY_GRID, tile) and den["tokens"] == math.prod(TINY_GRID)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.json", "v.mp4"]


@pytest.mark.slow
def test_tile_fit_crop_denoises_whole_cubes_and_keeps_the_size(vsagen_cache, tiny_dir, tmp_path):
    """`--tile-fit crop` with tile 4x8x8: the 5x6x10 grid is denoised as 8x8x16 (every cube full), and the video has
    the requested size."""
    out = tmp_path / "c.mp4"
    res = runner.invoke(app, ["t2v", "--model", "tiny", "--attn", "vsa:tile=4x8x8", "x", "--steps", "1",
                              "--tile-fit", "crop", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    den = json.loads(res.stdout)["denoised"]
    assert den["grid"] == [8, 8, 16] and den["tile"] == [4, 8, 8] and den["tiles"] == den["full_tiles"] == 4
    assert read_mp4(out).shape == TINY_SHAPE


# (--attn entry, the words of its one line on this CPU machine)
BAD = [
    ("vsa:tile=3x4x4", "tile '3x4x4': each side must be a power of two"),
    ("vsa:tile=4x4", "tile '4x4': write it as TxHxW, e.g. 4x4x4, 4x4x8 or 4x8x8"),
    ("vsa:tile=4x4x2", "tile '4x4x2' holds 32 tokens; the tile volumes are 64, 128, 256"),
    ("rocm-vsa:tile=16x16x16", "tile '16x16x16' holds 4096 tokens; the tile volumes are 64, 128, 256"),
    ("sla-star:tile=4x4x3", "tile '4x4x3': each side must be a power of two"),
    ("vsa:query_rows=128", "query_rows=128 runs the 128 rows of one cube per program and needs a tile of 128 or 256 "
                           "tokens (tile=4x4x8 or 4x8x8), got tile=4x4x4"),
    ("vsa:query_rows=96", "query_rows must be 64 or 128, got 96"),
    ("vsa:impl=fa4", "impl fa4 (--attn-impl fa4 or vsa:impl=fa4): FA4 runs on NVIDIA CUDA GPUs only; this run is on "
                     "cpu; FA4 needs tiles of a multiple of 128 tokens"),  # every reason at once
    ("vsa:tile=4x4x8:impl=fa4", "impl fa4 (--attn-impl fa4 or vsa:impl=fa4): FA4 runs on NVIDIA CUDA GPUs only; "
                                "this run is on cpu"),
    ("rocm-vsa:tile=4x8x8:impl=fa4", "rocm-vsa:impl=fa4): FA4 runs on NVIDIA CUDA GPUs only; this run is on cpu"),
    ("sla-star:impl=fa4", "impl must be one of auto, triton, torch, got 'fa4'"),
]
# each command with the arguments it needs around the entry
COMMANDS = {"t2v": lambda e: ["t2v", "x", "--attn", e], "compare": lambda e: ["compare", "x", "--attn", f"full,{e}"],
            "profile": lambda e: ["profile", "--attn", f"full,{e}"]}
CASES = [(c, e, w) for c in COMMANDS for e, w in BAD]


def _no_loading(monkeypatch, tmp_path) -> None:
    """Loading the model fails the test (`Session.load` prepares every backend first, then calls `load_model`)."""
    monkeypatch.setattr("vsagen.pipeline.load_model", lambda *a, **k: pytest.fail("loaded despite bad input"))
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("command,entry,words", CASES, ids=[f"{c}-{e}" for c, e, _ in CASES])
def test_a_tile_or_fa4_that_cannot_run_is_one_line_before_loading(vsagen_cache, tmp_path, monkeypatch, command, entry,
                                                                  words):
    _no_loading(monkeypatch, tmp_path)
    res = runner.invoke(app, [*COMMANDS[command](entry), "--model", "tiny", "--device", "cpu"])
    line = one_error_line(res)
    assert words in line, line
    assert "--dtype" not in line  # on a CPU (float32 by default) --dtype bf16 would not make FA4 run
    assert list(tmp_path.iterdir()) == [], "something was written"


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("why,dtype,words", [
    ("FA4 is not installed: pip install 'vsagen[fa4]' (flash-attn-4)", "fp32",
     "vsa:impl=fa4): FA4 is not installed: pip install 'vsagen[fa4]'"),
    (None, "fp32", "vsa:impl=fa4): FA4 runs bf16 / fp16, not float32 (--dtype bf16)"),
], ids=["package-missing", "fp32"])
def test_fa4_where_the_gpu_would_do_is_refused_before_loading(vsagen_cache, tmp_path, monkeypatch, command, why, dtype,
                                                              words):
    """The reasons this CPU machine cannot reach on its own (an sm90 GPU without the package; FA4 available but a
    float32 run), through the same path: `fa4_unavailable` stands in for the GPU."""
    _no_loading(monkeypatch, tmp_path)
    monkeypatch.setattr("vsagen.kernels.fa4_block_sparse.fa4_unavailable", lambda device, volume: why)
    res = runner.invoke(app, [*COMMANDS[command]("vsa:tile=4x4x8:impl=fa4"), "--model", "tiny", "--device", "cpu",
                              "--dtype", dtype])
    line = one_error_line(res)
    assert words in line, line
    assert list(tmp_path.iterdir()) == [], "something was written"


@pytest.mark.slow
def test_compare_shows_a_larger_tile_beside_the_trained_one(vsagen_cache, tiny_dir, tmp_path):
    """`vsagen compare --attn vsa,vsa:tile=4x4x8` (what the preset note suggests): one row each, labelled by entry;
    the first is the reference of PSNR / SSIM / latent distance, and both carry their attention error against dense
    attention."""
    out = tmp_path / "out"
    res = runner.invoke(app, ["compare", "x", "--model", "tiny", "--attn", "vsa,vsa:tile=4x4x8", "--steps", "2",
                              "--warmup", "0", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    base, big = data["rows"]
    assert data["reference"] == "vsa" and (base["label"], big["label"]) == ("vsa", "vsa:tile=4x4x8")
    assert (base["backend_info"]["tile"], big["backend_info"]["tile"]) == ("4x4x4", "4x4x8")
    assert base["spec"].endswith("tile=4x4x4:query_rows=64:precision=bf16:topk_count=tiles")
    assert big["spec"].endswith("tile=4x4x8:query_rows=64:precision=bf16:topk_count=tiles")
    assert base["psnr_db"] == "inf" and base["ssim"] == 1.0 and base["latents_rel_l2"] == 0.0
    assert 0 < big["psnr_db"] < 200 and 0 < big["ssim"] < 1 and big["latents_rel_l2"] > 0
    for row in (base, big):  # 87.5% of the cubes skipped on the 5x6x10 grid: both differ from dense attention
        assert 1e-3 < row["attention_rel_l2_mean"] <= row["attention_rel_l2_max"]
        assert len(row["psnr_per_frame_db"]) == len(row["ssim_per_frame"]) == 17
    assert base["attention_rel_l2_mean"] != big["attention_rel_l2_mean"]
    rows = list(csv.DictReader(io.StringIO((out / "compare.csv").read_text())))
    assert [r["label"] for r in rows] == ["vsa", "vsa:tile=4x4x8"]
    assert all(r["psnr_db"] and r["ssim"] and r["attention_rel_l2_max"] for r in rows)
    assert read_mp4(out / "vsa-tile-4x4x8.mp4").shape == TINY_SHAPE
    assert "PSNR / SSIM of vsa:tile=4x4x8 against vsa" in res.stderr
