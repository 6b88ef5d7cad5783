"""vsagen.attention.rocm_vsa: `rocm-vsa` is `vsa` with the ROCm kernel profile: registered, same options, and the
same output and gradients as `vsa` on the same inputs under the Triton interpreter (partial tiles, batch 2, bf16
and fp32), with the CPU profile and with the shipped AMD tunings (whose HIP launch options the interpreter
ignores)."""

from __future__ import annotations

import pytest
import torch

from conftest import attn_ctx as ctx, make_qkv
from vsagen.attention import make_backend
from vsagen.attention.registry import backend_names
from vsagen.attention.rocm_vsa import ROCmVSAAttention, ROCmVSAOptions
from vsagen.attention.vsa import VSAAttention, VSAOptions
from vsagen.errors import BadInput
from vsagen.kernels.tuning import arch_tuning, kernel_tuning
from vsagen.layout import tile_layout
from vsagen.timing import NullTimer


def test_registered_with_vsa_s_options():
    assert "rocm-vsa" in backend_names()
    b = make_backend("rocm-vsa", 0.8, impl="triton")
    assert isinstance(b, ROCmVSAAttention) and b.sparsity == 0.8 and b.tiled and b.weights is VSAAttention.weights
    assert b.describe()["name"] == "rocm-vsa"
    with pytest.raises(BadInput, match="sparsity"):
        make_backend("rocm-vsa", 1.5)


def test_profile_on_the_interpreter_has_the_rocm_changes():
    cpu = kernel_tuning("cpu", 64, "rocm-vsa")
    assert cpu.one_pass_loads == "streaming" and cpu.lean_index and kernel_tuning("cpu", 64).lean_index
    assert ROCmVSAAttention().tuning(torch.zeros(1, 1, 1, 64)) == cpu
    assert VSAAttention().tuning(torch.zeros(1, 1, 1, 64)) == kernel_tuning("cpu", 64)
    t = arch_tuning("rocm-cdna3", 64, "rocm-vsa")
    assert ROCmVSAAttention(ROCmVSAOptions(tuning=t)).tuning(torch.zeros(1, 1, 1, 64)) is t


def _run(backend, q, k, v, lay, gate):
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out = backend(*leaves, ctx(lay, gate, NullTimer()))
    weights = torch.linspace(-1, 1, out.numel()).view(out.shape)
    (out.float() * weights).sum().backward()
    return [out.detach()] + [x.grad for x in leaves]


@pytest.mark.parametrize("dtype,tunings", [(torch.float32, ["cpu-profile", "rocm-cdna4"]),
                                           (torch.bfloat16, ["cpu-profile", "rocm-cdna3"])])
def test_equals_vsa_forward_and_backward(dtype, tunings):
    """Partial tiles on two axes, batch 2, two heads, a gate: every output and gradient bitwise equal to `vsa`'s
    (the changes alter loads and index words, never the arithmetic or its order); `vsa` runs once per dtype and
    each tuning of that dtype is compared with it."""
    lay = tile_layout((3, 6, 9))
    assert lay.num_full_tiles < lay.num_tiles
    q, k, v = (x.to(dtype) for x in make_qkv(2, lay.num_tokens, 2, 16, seed=31))
    gate = torch.rand(2, lay.num_tokens, 2, 16, generator=torch.Generator().manual_seed(32)).to(dtype)
    want = _run(VSAAttention(VSAOptions(0.75, impl="triton")), q, k, v, lay, gate)
    for tuning in tunings:
        t = None if tuning == "cpu-profile" else arch_tuning(tuning, 16, "rocm-vsa")
        got = _run(ROCmVSAAttention(ROCmVSAOptions(0.75, impl="triton", tuning=t)), q, k, v, lay, gate)
        for g, w in zip(got, want):
            assert torch.isfinite(g).all() and g.abs().sum() > 0, tuning
            assert torch.equal(g, w), tuning


def test_describe_names_what_differs_from_vsa():
    """On the interpreter the profile adds the streaming hints (lean_index is vsa's too); with the torch
    implementation nothing about kernels is claimed."""
    cpu = torch.device("cpu")
    assert make_backend("rocm-vsa", impl="triton").describe(cpu)["kernel_changes"] == {"one_pass_loads": "streaming"}
    assert "kernel_changes" not in make_backend("rocm-vsa").describe(cpu)  # impl auto on CPU: the torch reference
