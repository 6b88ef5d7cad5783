"""vsagen.request.quantization: `--quant` resolved against the device and the model before anything loads (fp8
refused on the CPU and on GPUs without FP8 in one line naming the GPUs that have it; `auto` int8 for a `-quant`
preset where the device runs int8), and end to end on the tiny model: `t2v --quant int8` on the CPU with the JSON's
record, `--quant fp8` refused with exit 2 and nothing written."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from conftest import one_error_line
from vsagen.cli.app import app
from vsagen.errors import BadInput
from vsagen.models.sources import resolve_model
from vsagen.request.options import Quant
from vsagen.request.quantization import holds_int8_files, resolve_quant

QUANT_PRESET = "turbowan2.1-t2v-1.3b-quant"


def fake_gpu(monkeypatch, capability, name="NVIDIA GPU"):
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: name)


def test_explicit_choices_on_the_cpu():
    tiny = resolve_model("tiny")
    assert resolve_quant(Quant.NONE, "cpu", tiny, False) == ("none", ())
    assert resolve_quant(Quant.INT8, "cpu", tiny, False) == ("int8", ())  # torch._int_mm on the CPU
    assert resolve_quant(Quant.AUTO, "cpu", tiny, False) == ("none", ())
    with pytest.raises(BadInput, match=r"^--quant fp8 needs a GPU with FP8 tensor cores \(compute capability 8.9\+: "
                                       r"L4, L40S, RTX 4090, H100, H200, B200, RTX 5090\); this run is on the CPU; "
                                       r"use --quant none \(or int8\)$"):
        resolve_quant(Quant.FP8, "cpu", tiny, False)


def test_gpus_with_and_without_fp8_or_int8(monkeypatch):
    tiny = resolve_model("tiny")
    fake_gpu(monkeypatch, (8, 0), "NVIDIA A100")
    with pytest.raises(BadInput, match="NVIDIA A100 is sm80; use --quant none"):
        resolve_quant(Quant.FP8, "cuda", tiny, False)
    assert resolve_quant(Quant.INT8, "cuda", tiny, False) == ("int8", ())
    fake_gpu(monkeypatch, (9, 0), "NVIDIA H100")
    assert resolve_quant(Quant.FP8, "cuda", tiny, False) == ("fp8", ())
    fake_gpu(monkeypatch, (7, 5), "Tesla T4")
    with pytest.raises(BadInput, match=r"--quant int8 needs int8 tensor cores .*; Tesla T4 is sm75; use --quant none"):
        resolve_quant(Quant.INT8, "cuda", tiny, False)


def test_auto_runs_a_quant_presets_files_as_int8_where_it_can(monkeypatch):
    src = resolve_model(QUANT_PRESET)
    assert holds_int8_files(src, False) and not holds_int8_files(src, True)
    assert not holds_int8_files(resolve_model("turbowan2.1-t2v-1.3b"), False)
    assert resolve_quant(Quant.AUTO, "cpu", src, False) == ("int8", ())
    assert resolve_quant(Quant.AUTO, "cpu", src, True) == ("none", ())  # random weights: no files
    fake_gpu(monkeypatch, (7, 5), "Tesla T4")
    quant, notes = resolve_quant(Quant.AUTO, "cuda", src, False)
    assert quant == "none" and notes[0].startswith(f"{QUANT_PRESET}'s int8 weights are dequantized at load "
                                                   "(--quant int8 needs int8 tensor cores")


def test_fp8_refused_in_one_line_before_loading(vsagen_cache, tmp_path):
    out = tmp_path / "v.mp4"
    res = CliRunner().invoke(app, ["t2v", "a cat", "--model", "tiny", "--device", "cpu", "--quant", "fp8",
                                   "--out", str(out)])
    assert "--quant fp8 needs a GPU with FP8 tensor cores" in one_error_line(res)
    assert not tmp_path.exists() or not list(tmp_path.iterdir())
    res = CliRunner().invoke(app, ["t2v", "a cat", "--model", "tiny", "--quant", "fp4", "--out", str(out)])
    assert "--quant" in one_error_line(res) and "fp4" in res.stderr


@pytest.mark.slow
def test_t2v_int8_on_the_tiny_model(vsagen_cache, tmp_path):
    """Every block linear runs as TurboDiffusion's int8 W8A8 (torch._int_mm on the CPU); the JSON says so."""
    out = tmp_path / "v.mp4"
    res = CliRunner().invoke(app, ["t2v", "a cat", "--model", "tiny", "--device", "cpu", "--quant", "int8",
                                   "--steps", "1", "--frames", "5", "--height", "64", "--width", "64",
                                   "--guidance", "1",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["quant"] == {"precision": "int8", "transformer": {"int8": 20, "fp8": 0, "dtype": 0}}
    assert data["config"]["quant"] == "int8"
    assert any("20 block linears run as int8 W8A8" in n for n in data["timing"]["notes"])
