"""`--compile`: the transformer blocks under torch.compile (inductor on CPU here), the attention backend between
the compiled graphs. The tiny model, small sizes; each test pays one compilation (tens of seconds on CI)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import assert_one_error_line
from typer.testing import CliRunner

from vsagen.cli import app

runner = CliRunner()
SMALL = ["--frames", "5", "--height", "64", "--width", "64", "--steps", "2"]


@pytest.mark.slow
def test_compiled_t2v_gives_the_frames_of_eager_and_times_the_backend(tiny_dir, tmp_path, encoder_frames):
    """vsa (torch reference) with and without --compile: same frames (compiled fp32 arithmetic rounds a little
    differently: at most 1 uint8 level apart), the backend still timed with its stages, and no recompilation
    in the timed steps (the warm-up step pays the compilation: timed steps are far below it)."""
    common = ["--model", "tiny", "--attn", "vsa", "--attn-impl", "torch", "--warmup", "1", *SMALL, "--json"]
    eager = runner.invoke(app, ["t2v", "a fox", *common, "--out", str(tmp_path / "eager.mp4")])
    assert eager.exit_code == 0, eager.output
    res = runner.invoke(app, ["t2v", "a fox", *common, "--compile", "--out", str(tmp_path / "comp.mp4")])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    t = data["timing"]
    assert data["config"]["compile"] is True and json.loads(eager.stdout)["config"]["compile"] is False
    assert t["self_attention_s"] > 0 and set(t["self_attention_stages_s"]) == {"coarse", "fine"}
    assert t["attn1_s"] == 0.0  # inside the compiled graphs: not timed (said in the notes)
    assert any("--compile" in n for n in t["notes"])
    assert t["warmup_s"] > 3 * max(t["dit_per_step_s"])  # compilation stayed in the warm-up
    a, b = encoder_frames["eager"].astype(int), encoder_frames["comp"].astype(int)
    assert a.shape == b.shape == (5, 64, 64, 3)
    assert np.abs(a - b).max() <= 1


@pytest.mark.slow
def test_compiled_profile_rows(tiny_dir):
    res = runner.invoke(app, ["profile", "--model", "tiny", "--attn", "full,vsa", "--steps", "1", "--no-stock",
                              "--compile", "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["settings"]["compile"] is True
    full, vsa = data["rows"]
    assert full["speedup_vs_full"] == 1.0 and vsa["speedup_vs_full"] > 0
    assert vsa["attention_s_per_step"] > 0 and full["dit_s_per_step"] > 0
    assert 0 < vsa["latents_rel_l2_vs_full"] < 1


def test_compile_with_kernels_is_refused(tiny_dir):
    res = runner.invoke(app, ["profile", "--model", "tiny", "--kernels", "--compile"])
    assert res.exit_code == 2
    assert "--compile" in assert_one_error_line(res.stderr, res.stdout)
