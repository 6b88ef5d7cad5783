"""vsagen.attention.shared: what several backends share (option checks and constants, the cube lists as kernel-tile
lists, the grouped launches, the linear branch's projection), importable without torch as every backend module is
(issue 29: `vsagen backends`, `vsagen presets` and the checks of `--attn NAME:KEY=VALUE` answer before torch loads),
and the same values as the code that runs them."""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from dataclasses import fields

import pytest
import torch

from vsagen.attention import shared
from vsagen.attention.sla import SLAOptions
from vsagen.attention.sla_star import SCOPES, SLAStarOptions
from vsagen.attention.sparse_vdit import SparseVDiTOptions
from vsagen.attention.vsa import VSA_IMPLS, VSAOptions
from vsagen.errors import BadInput

HEAVY = ("torch", "diffusers", "transformers", "triton", "numpy")


def test_options_specs_and_the_registry_answer_without_torch():
    """In a fresh interpreter: every backend's options, a spec with options resolved, a refused value, the package's
    names, the registry's classes: none of it imports torch."""
    probe = (
        "import sys, json\n"
        "from vsagen.attention import backend_names, resolve_spec, uses_sparsity\n"
        "from vsagen.attention.registry import backend_class, options_of, summary_of\n"
        "from vsagen.attention.spec import option_help, impls_of\n"
        "from vsagen.errors import BadInput\n"
        "out = [resolve_spec('vsa:sparsity=0.9').text(), resolve_spec('sla-star:feature_map=elu').text()]\n"
        "out += [len(option_help(options_of(n))) for n in backend_names()]\n"
        "out += [summary_of(backend_class(n)) for n in backend_names()] + [list(impls_of('vsa'))]\n"
        "try:\n    resolve_spec('vsa:sparsity=2')\nexcept BadInput as e:\n    out.append(str(e))\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in %r)\n"
        "print(json.dumps([out, heavy]))\n" % (HEAVY,)
    )
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out, heavy = json.loads(res.stdout)
    assert heavy == []
    assert out[0] == "vsa:sparsity=0.9:impl=auto:tile=4x4x4:query_rows=64:precision=bf16:topk_count=tiles"
    assert out[1].startswith("sla-star:sparsity=0.875:impl=auto")
    assert out[-2] == ["auto", "triton", "torch", "fa4"] and "sparsity must be in [0, 1), got 2.0" in out[-1]


def test_the_options_say_what_the_backend_modules_run():
    """The values the options check are the ones the computation uses: the linear branch's feature maps (the
    kernels'), the query blocks (the grouped launches' keys), and each Literal's values."""
    from vsagen.kernels.reference import FEATURE_MAPS

    assert shared.FEATURE_MAPS == FEATURE_MAPS
    assert shared.QUERY_BLOCKS == tuple(shared.QUERY_LAUNCH) and shared.DEFAULT_QUERY_BLOCK in shared.QUERY_BLOCKS
    hints = typing.get_type_hints(SLAStarOptions)
    assert typing.get_args(hints["feature_map"]) == shared.FEATURE_MAPS == typing.get_args(
        typing.get_type_hints(SLAOptions)["feature_map"])
    assert typing.get_args(hints["scope"]) == SCOPES
    for cls in (SLAStarOptions, SparseVDiTOptions, SLAOptions):
        assert typing.get_args(typing.get_type_hints(cls)["impl"]) == shared.IMPLS
    assert typing.get_args(typing.get_type_hints(VSAOptions)["impl"]) == VSA_IMPLS == shared.IMPLS + ("fa4",)


@pytest.mark.parametrize("cls", [VSAOptions, SLAStarOptions, SLAOptions, SparseVDiTOptions])
def test_a_tuning_is_checked_when_given(cls):
    """`tuning` reads `Any` without torch (set from Python only); a value is checked against KernelTuning."""
    from vsagen.attention.spec import text_options
    from vsagen.kernels.tuning import kernel_tuning

    assert "tuning" in [f.name for f in fields(cls)] and "tuning" not in text_options(cls)
    with pytest.raises(BadInput, match="tuning must be a vsagen.kernels.tuning.KernelTuning, got dict"):
        cls(tuning={})
    tuning = kernel_tuning("cpu", 64)
    assert cls(tuning=tuning).tuning is tuning


def test_the_option_checks():
    assert shared.tile_option((4, 8, 4)) == "4x8x4" and shared.tile_option("4x4x8") == "4x4x8"
    with pytest.raises(BadInput, match="power"):
        shared.tile_option("3x4x4")
    shared.check_impl_option("torch")
    with pytest.raises(BadInput, match=r"^impl must be one of auto, triton, torch, got 'fa4'$"):
        shared.check_impl_option("fa4")
    assert shared.options_dict(VSAOptions(sparsity=0.5)) == {"sparsity": 0.5, "impl": "auto", "tile": "4x4x4",
                                                              "query_rows": 64, "precision": "bf16",
                                                              "topk_count": "tiles"}
    assert shared.option_names(shared.NoOptions) == []


def test_weights_path_option(tmp_path):
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"x")
    assert shared.weights_path_option(str(f), "gate_weights") == f
    with pytest.raises(BadInput, match="not a folder"):
        shared.weights_path_option(str(tmp_path), "gate_weights")
    with pytest.raises(BadInput, match="no such file"):
        shared.weights_path_option(str(tmp_path / "none.safetensors"), "gate_weights")


def test_the_projection_is_a_float32_linear_of_the_trained_tensors():
    """`proj_module` (sla-star's and sla's branch) holds the tensors as given, in float32, bias zero without one;
    `proj_shapes` is (D, D) per head; `random_proj` is one of trained size, seeded."""
    from types import SimpleNamespace

    attn = SimpleNamespace(to_q=SimpleNamespace(weight=torch.empty(6 * 16, 8)), heads=6)
    assert shared.proj_shapes(attn) == {"weight": (16, 16), "bias": (16,)}
    w, b = torch.randn(16, 16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    lin = shared.proj_module({"weight": w, "bias": b}, attn)
    assert lin.weight.dtype == torch.float32 and torch.equal(lin.weight, w.float()) and torch.equal(lin.bias, b.float())
    assert torch.equal(shared.proj_module({"weight": w}, attn).bias, torch.zeros(16))
    x = torch.randn(3, 16)
    assert torch.allclose(lin(x).double(), x.double() @ w.T.float().double() + b.float().double(), atol=1e-5)
    one, two = shared.random_proj(16, torch.device("cpu"), 0), shared.random_proj(16, torch.device("cpu"), 0)
    assert one.weight.shape == (16, 16) and torch.equal(one.weight, two.weight)


@pytest.mark.parametrize("hip,cap,needle", [(None, (8, 0), "this GPU is sm_80"), ("6.2", (9, 4), "not on ROCm"),
                                            (None, (9, 0), None), (None, (8, 9), None)])
def test_int8_refusal_names_the_gpus_with_fp8(monkeypatch, hip, cap, needle):
    """precision=int8's Triton fine stage runs an fp8 e4m3 P.V: refused in one line on NVIDIA before sm_89 and on
    ROCm; never for bf16, the torch formulas or a CPU."""
    import torch

    from vsagen.attention.shared import int8_refusal

    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap)
    why = int8_refusal("vsa", "int8", "triton", torch.device("cuda"))
    assert (why is None) if needle is None else (needle in why and "\n" not in why)
    assert int8_refusal("vsa", "bf16", "triton", torch.device("cuda")) is None
    assert int8_refusal("vsa", "int8", "torch", torch.device("cuda")) is None
    assert int8_refusal("vsa", "int8", "triton", torch.device("cpu")) is None
