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


GIB = 2 ** 30


@pytest.mark.parametrize("model", ["tiny", "tiny-i2v", "tiny-flf2v", "tiny-a14b", "wan2.1-t2v-1.3b",
                                   "wan2.1-i2v-14b-480p", "wan2.2-ti2v-5b"])
def test_the_parameter_count_from_the_config_is_the_built_models(model):
    """`transformer_parameters` (counted by hand from the config) against diffusers' transformer built on the meta
    device (no memory): the same count to the parameter, image embedder and position table included."""
    import torch
    from diffusers import WanTransformer3DModel

    from vsagen.estimate import transformer_parameters
    from vsagen.models.presets import load_preset

    preset = load_preset(model)
    for config in (preset.transformer, preset.transformer_2):
        if config is None:
            continue
        with torch.device("meta"):
            built = WanTransformer3DModel(**config)
        assert transformer_parameters(config) == sum(p.numel() for p in built.parameters())


def _free(cpu: float, gpu: float = 0.0):
    """A free-memory reading of `cpu` / `gpu` GiB, as `vsagen.decode.tiling.available_bytes` answers."""
    return lambda device: ((int(cpu * GIB), "CPU MemAvailable") if str(device) == "cpu"
                           else (int(gpu * GIB), "cuda:0 free"))


def test_weights_that_cannot_fit_are_refused_with_the_figures(tmp_path):
    """New-user trial: `--model wan2.1-t2v-14b --random-weights` on a 24 GB CPU machine built for a minute and died
    out of memory. The transformer weights alone (parameters x dtype bytes; random weights built in fp32 first)
    against the free memory of where they go: one line with both figures; tiny and 1.3B models pass; a GPU run of
    real size passes where it fits, and an offload that makes it fit is not refused."""
    from dataclasses import replace

    from vsagen.estimate import weights_refusal

    big = resolve("a fox", model="wan2.1-t2v-14b", random_weights=True, device="cpu", out=tmp_path / "b.mp4")
    line = weights_refusal(big, _free(22.0))
    assert line.startswith("--model wan2.1-t2v-14b: its transformer weights alone take 53.2 GiB (14.29 B parameters "
                           "x 4 bytes, fp32), more than the CPU has free (22.0 GiB, CPU MemAvailable)"), line
    assert "\n" not in line and "--model tiny" in line
    for model in ("tiny", "tiny-a14b", "wan2.1-t2v-1.3b"):
        assert weights_refusal(resolve("a fox", model=model, random_weights=True, device="cpu",
                                       out=tmp_path / "t.mp4"), _free(22.0)) is None, model
    gpu = replace(big, device="cuda", dtype="bf16", random_weights=False)  # 26.6 GiB of bf16 weights
    assert weights_refusal(gpu, _free(500, 79)) is None  # an 80 GB card
    refused = weights_refusal(gpu, _free(500, 20))
    assert "more than the GPU has free (20.0 GiB, cuda:0 free)" in refused and "--offload" in refused
    assert weights_refusal(replace(gpu, offload="group"), _free(500, 20)) is None  # one block at a time on the GPU
    assert "use --offload group" in weights_refusal(replace(gpu, offload="model"), _free(500, 20))
    assert weights_refusal(replace(gpu, offload="model"), _free(500, 30)) is None  # the largest part fits whole
    assert "CPU memory (--offload group)" in weights_refusal(replace(gpu, offload="group"), _free(20, 79))
    a14b = resolve("a fox", model="wan2.2-t2v-a14b", device="cpu", out=tmp_path / "a.mp4")
    assert weights_refusal(replace(a14b, device="cuda", dtype="bf16", offload="model"), _free(500, 30)) is None
    assert weights_refusal(replace(a14b, device="cuda", dtype="bf16"), _free(500, 40)) is not None  # 53 GiB at once
    assert weights_refusal(big, lambda device: (None, "no /proc/meminfo")) is None  # unknown: not refused
    small = resolve("a fox", model="wan2.1-t2v-1.3b", device="cpu", out=tmp_path / "s.mp4")  # 5.3 GiB in fp32
    assert weights_refusal(replace(small, ulysses=2), _free(11.0)) is None
    assert "21.1 GiB (1.42 B parameters x 4 bytes, fp32; x 4 processes, a copy each)" in weights_refusal(
        replace(small, ulysses=2, cfg_parallel=True), _free(11.0))  # four ranks, a copy each


def test_the_command_refuses_before_building(tmp_path, monkeypatch):
    """The CLI: exit 2, one error line with the figures, before any model is built, nothing written."""
    from conftest import one_error_line
    from typer.testing import CliRunner

    import vsagen.decode.tiling as tiling
    import vsagen.models.loading as loading
    from vsagen.cli.app import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tiling, "available_bytes", _free(22.0))
    monkeypatch.setattr(loading, "_random_weights_pipeline", lambda *a, **k: pytest.fail("built"))
    res = CliRunner().invoke(app, ["t2v", "--model", "wan2.1-t2v-14b", "--random-weights", "a fox"])
    line = one_error_line(res)
    assert "53.2 GiB" in line and "22.0 GiB" in line
    assert list(tmp_path.iterdir()) == []
