"""vsagen.estimate: the DiT's FLOP per step against a count by hand, and the CPU warning of a real-size run: said for
real sizes only, counting the warm-up steps and every run (issue 29: `profile` and `compare` started hours of work
without it, and t2v's left out the warm-up step)."""

from __future__ import annotations

import pytest

from vsagen.commands.generate_config import resolve_generate as resolve
from vsagen.estimate import cpu_time_estimate, dit_step_flops


def test_cpu_estimate_warns_for_a_real_size_model_only(tmp_path):
    t = {"num_layers": 30, "num_attention_heads": 12, "attention_head_dim": 128, "ffn_dim": 8960}
    # by hand: per token per layer 2 (4 C^2 + 2 C^2 + 2 C F) + 4 S C + 4 T C, C = 1536
    c, f, s, text = 1536, 8960, 32760, 512
    want = 2 * 30 * s * (2 * (6 * c * c + 2 * c * f) + 4 * s * c + 4 * text * c)
    assert dit_step_flops(t, s, text, 2) == pytest.approx(want)
    big = resolve("a fox", model="wan2.1-t2v-1.3b", random_weights=True, device="cpu", steps=50,
                  out=tmp_path / "b.mp4")
    line = cpu_time_estimate(big)
    assert line is not None and line.startswith("warning: wan2.1-t2v-1.3b (81x480x832) on the CPU: at least ")
    assert "for 50 steps" in line and "--model tiny" in line and "\n" not in line
    tiny = resolve("a fox", model="tiny", device="cpu", out=tmp_path / "t.mp4")
    assert cpu_time_estimate(tiny) is None
    assert cpu_time_estimate(big, threshold_s=float("inf")) is None


def test_the_estimate_counts_warm_up_steps_and_runs(tmp_path):
    big = resolve("a fox", model="wan2.1-t2v-1.3b", random_weights=True, device="cpu", steps=2, warmup=1,
                  out=tmp_path / "b.mp4")
    one = cpu_time_estimate(big)
    assert "for 3 steps (1 warm-up + 2);" in one
    several = cpu_time_estimate(big, runs=4, runs_of="configurations")
    assert "for 12 steps (4 configurations of 1 warm-up + 2);" in several
