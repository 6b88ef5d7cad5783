"""vsagen.attention.backend_options: the shipped backends' Options, importable without torch (issue 29: `vsagen
backends`, `vsagen presets` and the checks of `--attn NAME:KEY=VALUE` answer before torch loads), and the same values
as the modules that run them."""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from dataclasses import fields

import pytest

from vsagen.attention import backend_options as opts
from vsagen.errors import BadInput

HEAVY = ("torch", "diffusers", "transformers", "triton", "numpy")


def test_options_specs_and_the_registry_answer_without_torch():
    """In a fresh interpreter: every backend's options, a spec with options resolved, a refused value, the package's
    names, the registry's facts: none of it imports torch (nor a backend module)."""
    probe = (
        "import sys, json\n"
        "from vsagen.attention import backend_names, resolve_spec, uses_sparsity\n"
        "from vsagen.attention.registry import backend_facts, options_of, summary_of\n"
        "from vsagen.attention.spec import option_help, impls_of\n"
        "from vsagen.errors import BadInput\n"
        "out = [resolve_spec('vsa:sparsity=0.9').text(), resolve_spec('sla-star:feature_map=elu').text()]\n"
        "out += [len(option_help(options_of(n))) for n in backend_names()]\n"
        "out += [summary_of(backend_facts(n)) for n in backend_names()] + [list(impls_of('vsa'))]\n"
        "try:\n    resolve_spec('vsa:sparsity=2')\nexcept BadInput as e:\n    out.append(str(e))\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in %r or m in %r)\n"
        "print(json.dumps([out, heavy]))\n" % (HEAVY, ("vsagen.attention.vsa", "vsagen.attention.base"))
    )
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    out, heavy = json.loads(res.stdout)
    assert heavy == []
    assert out[0] == "vsa:sparsity=0.9:impl=auto:tile=4x4x4:query_rows=64" and out[1].startswith("sla-star:sparsity=0.875:impl=auto")
    assert out[-2] == ["auto", "triton", "torch", "fa4"] and "sparsity must be in [0, 1), got 2.0" in out[-1]


def test_the_options_say_what_the_backend_modules_run():
    """The values the options check are the ones the backends' modules use: sla-star's feature maps (the kernels'),
    sparse-vdit's query blocks (its launch table's keys), and each Literal's values."""
    from vsagen.attention.sparse_vdit import QUERY_LAUNCH
    from vsagen.kernels.reference import FEATURE_MAPS

    assert opts.FEATURE_MAPS == FEATURE_MAPS
    assert opts.QUERY_BLOCKS == tuple(QUERY_LAUNCH) and opts.DEFAULT_QUERY_BLOCK in opts.QUERY_BLOCKS
    hints = typing.get_type_hints(opts.SLAStarOptions)
    assert typing.get_args(hints["feature_map"]) == opts.FEATURE_MAPS
    assert typing.get_args(hints["scope"]) == opts.SCOPES
    for cls in (opts.SLAStarOptions, opts.SparseVDiTOptions):
        assert typing.get_args(typing.get_type_hints(cls)["impl"]) == opts.IMPLS
    assert typing.get_args(typing.get_type_hints(opts.VSAOptions)["impl"]) == opts.VSA_IMPLS  # also fa4


@pytest.mark.parametrize("cls", [opts.VSAOptions, opts.ROCmVSAOptions, opts.SLAStarOptions, opts.SparseVDiTOptions])
def test_a_tuning_is_checked_when_given(cls):
    """`tuning` reads `Any` without torch (set from Python only); a value is checked against KernelTuning."""
    from vsagen.attention.spec import text_options
    from vsagen.kernels.tuning import kernel_tuning

    assert "tuning" in [f.name for f in fields(cls)] and "tuning" not in text_options(cls)
    with pytest.raises(BadInput, match="tuning must be a vsagen.kernels.tuning.KernelTuning, got dict"):
        cls(tuning={})
    tuning = kernel_tuning("cpu", 64)
    assert cls(tuning=tuning).tuning is tuning


def test_the_backend_modules_re_export_their_options():
    from vsagen.attention import rocm_vsa, sla_star, sparse_vdit, vsa

    assert (vsa.VSAOptions, rocm_vsa.ROCmVSAOptions, sla_star.SLAStarOptions, sparse_vdit.SparseVDiTOptions) == (
        opts.VSAOptions, opts.ROCmVSAOptions, opts.SLAStarOptions, opts.SparseVDiTOptions)
    assert vsa.VSAAttention.Options is opts.VSAOptions and sla_star.SCOPES == opts.SCOPES


def test_weights_path_option(tmp_path):
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"x")
    assert opts.weights_path_option(str(f), "gate_weights") == f
    with pytest.raises(BadInput, match="not a folder"):
        opts.weights_path_option(str(tmp_path), "gate_weights")
    with pytest.raises(BadInput, match="no such file"):
        opts.weights_path_option(str(tmp_path / "none.safetensors"), "gate_weights")
