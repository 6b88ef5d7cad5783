"""vsagen.attention.processor: the Wan `attn1` processor (`VsagenAttnProcessor`): q/k/v as diffusers forms them,
RoPE (`apply_rotary`), the fused q/k norm + RoPE prologue, misuse, and its timer regions.

Everything runs the tiny Wan transformer on CPU with fresh random inputs (conftest's tiny transformer helpers:
grid 5 x 6 x 10 with partial tiles). The tile-order hooks are tested in test_hooks.py.
"""

from __future__ import annotations

import pytest
import torch
from conftest import (GRID, LATENT, TOL_REORDER_FP32, diffusers_rope, forward, has_partial_tiles, make_inputs,
                      make_transformer, maxdiff, patched_forward)

from vsagen.attention import make_backend
from vsagen.attention.hooks import patch_transformer
from vsagen.attention.processor import VsagenAttnProcessor, apply_rotary
from vsagen.timing import Timer, TimingReport

# `full` through our processor calls the same SDPA on q/k/v built by the same ops as diffusers' processor; the
# only arithmetic that differs in form is RoPE (stack vs strided stores), which rounds identically in fp32.
# 1e-6 leaves room for a different but equally rounded SDPA kernel choice.
TOL_FULL_FP32 = 1e-6
# apply_rotary vs the complex-number form of the rotation (independent formula): fp32 rounding of 2 products.
TOL_ROPE_COMPLEX_FP32 = 1e-5
# The fused prologue's latent (C, F, H, W): grid 3 x 5 x 7 after the (1, 2, 2) patch.
PROLOGUE_LATENT = (16, 3, 10, 14)


# --------------------------------------------------------------------------------------------------------------
# full through our processor; remove()


def test_full_processor_equals_stock_and_remove_restores():
    t = make_transformer()
    inputs = make_inputs(batch=2, seed=11)
    assert has_partial_tiles(GRID)
    stock = forward(t, inputs)
    stock_procs = [(b.attn1.processor, b.attn2.processor) for b in t.blocks]

    patch = patch_transformer(t, make_backend("full"), Timer("cpu"))
    assert all(isinstance(b.attn1.processor, VsagenAttnProcessor) for b in t.blocks)
    assert all(b.attn2.processor is p2 for b, (_, p2) in zip(t.blocks, stock_procs)), "attn2 must stay stock"
    ours = forward(t, inputs)
    patch.remove()

    assert ours.shape == stock.shape == (2, *LATENT)
    assert maxdiff(ours, stock) <= TOL_FULL_FP32
    # Stock processors and no hooks left; bitwise the same output as before patching.
    assert all(b.attn1.processor is p1 for b, (p1, _) in zip(t.blocks, stock_procs))
    assert not t._forward_pre_hooks and not t._forward_hooks
    assert not t.rope._forward_hooks and not t.blocks[0]._forward_pre_hooks and not t.proj_out._forward_hooks
    assert patch.handles == []
    assert torch.equal(forward(t, inputs), stock)


def test_full_processor_with_fused_qkv_equals_stock():
    t = make_transformer()
    t.fuse_qkv_projections()
    assert all(getattr(b.attn1, "fused_projections", False) for b in t.blocks)
    inputs = make_inputs(batch=2, seed=13)
    stock = forward(t, inputs)
    ours = patched_forward(t, make_backend("full"), inputs)
    assert maxdiff(ours, stock) <= TOL_FULL_FP32


# --------------------------------------------------------------------------------------------------------------
# RoPE


def test_diffusers_rope_oracle_is_current():
    """The RoPE lines copied above (and repeated by vsagen's processor) are those of the installed diffusers."""
    import inspect

    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    src = " ".join(inspect.getsource(WanAttnProcessor.__call__).split())
    for line in ("x1, x2 = hidden_states.unflatten(-1, (-1, 2)).unbind(-1)", "cos = freqs_cos[..., 0::2]",
                 "sin = freqs_sin[..., 1::2]", "out[..., 0::2] = x1 * cos - x2 * sin",
                 "out[..., 1::2] = x1 * sin + x2 * cos", "return out.type_as(hidden_states)"):
        assert line in src, f"diffusers' WanAttnProcessor changed: {line!r} not found"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_apply_rotary_equals_diffusers_formula(dtype):
    g = torch.Generator().manual_seed(21)
    t = make_transformer()
    cos, sin = t.rope(torch.randn(1, *LATENT, generator=g))  # the real tables: (1, S, 1, D) float32
    assert cos.shape == (1, 300, 1, 16) and cos.dtype == torch.float32
    x = torch.randn(2, 300, 2, 16, generator=g).to(dtype)
    ours = apply_rotary(x, cos, sin)
    ref = diffusers_rope(x, cos, sin)
    assert ours.dtype == dtype and ours.shape == x.shape
    assert torch.equal(ours, ref)  # same arithmetic, same single rounding to x's dtype

    # Random angles, against the rotation written as complex multiplication (an independent formula).
    theta = torch.rand(1, 300, 1, 8, generator=g, dtype=torch.float64) * 20.0 - 10.0
    cos_r = theta.cos().repeat_interleave(2, -1).float()
    sin_r = theta.sin().repeat_interleave(2, -1).float()
    ours = apply_rotary(x, cos_r, sin_r)
    assert torch.equal(ours, diffusers_rope(x, cos_r, sin_r))
    if dtype == torch.float32:
        z = torch.view_as_complex(x.double().unflatten(-1, (-1, 2)).contiguous())
        rot = torch.view_as_real(z * torch.polar(torch.ones_like(theta), theta)).flatten(-2)
        assert maxdiff(ours, rot) <= TOL_ROPE_COMPLEX_FP32


# --------------------------------------------------------------------------------------------------------------
# The fused q/k prologue (kernels/qk_norm_rope.py) inside the processor


@pytest.mark.parametrize("attn,sparsity,fused_qkv", [("full", None, False), ("vsa", 0.0, False),
                                                      ("vsa", 0.5, True)], ids=["full", "vsa-0", "vsa-0.5-fused-qkv"])
def test_fused_prologue_equals_the_eager_prologue(monkeypatch, attn, sparsity, fused_qkv):
    """The processor with the fused norm + RoPE kernel (forced on, under the interpreter) against the same
    processor with diffusers' eager arithmetic: raster RoPE tables (full) and tile-order ones (vsa), with and
    without a fused q/k/v projection (strided q, k rows). fp32 on both sides: differences are rounding only. The
    interpreter runs one program per token row: on the grid 3 x 5 x 7 (105 tokens, every axis odd with a partial
    tile), not the default 300."""
    from vsagen.kernels import qk_norm_rope

    t = make_transformer()
    if fused_qkv:
        t.fuse_qkv_projections()
    inputs = make_inputs(batch=2, seed=71, latent=PROLOGUE_LATENT)
    calls = []
    real = qk_norm_rope.rms_norm_rope
    monkeypatch.setattr(qk_norm_rope, "rms_norm_rope", lambda *a: calls.append(1) or real(*a))
    eager = patched_forward(t, make_backend(attn, sparsity), inputs, fused_prologue="off")
    assert calls == []
    fused = patched_forward(t, make_backend(attn, sparsity), inputs, fused_prologue="on")
    assert len(calls) == 2 * len(t.blocks) * 1  # q and k of every attn1, one forward (batch 2 in one call)
    assert maxdiff(fused, eager) <= TOL_REORDER_FP32
    assert eager.abs().max().item() > 0.1


def test_fused_prologue_is_skipped_under_autograd(monkeypatch):
    import vsagen.attention.processor as proc

    t = make_transformer()
    x = torch.randn(1, 4, t.blocks[0].attn1.inner_dim, requires_grad=True)
    rope = (torch.ones(1, 4, 1, 16), torch.zeros(1, 4, 1, 16))
    assert not proc.use_fused_prologue(t.blocks[0].attn1, x, rope, "on")
    with torch.no_grad():
        assert proc.use_fused_prologue(t.blocks[0].attn1, x, rope, "on")
    assert not proc.use_fused_prologue(t.blocks[0].attn1, x.detach(), None, "on")
    assert not proc.use_fused_prologue(t.blocks[0].attn1, x.detach(), rope, "auto")  # CPU tensor: eager under "auto"


# --------------------------------------------------------------------------------------------------------------
# Misuse


def test_processor_raises_without_tile_hooks():
    t = make_transformer()
    inputs = make_inputs(batch=1, seed=71)
    proc = VsagenAttnProcessor(make_backend("vsa", 0.5), Timer("cpu"))
    for b in t.blocks:
        b.attn1.set_processor(proc)
    with pytest.raises(RuntimeError, match="tile"):
        forward(t, inputs)


def test_processor_dense_backend_needs_no_hooks_and_refuses_cross_attention():
    t = make_transformer()
    inputs = make_inputs(batch=1, seed=72)
    stock = forward(t, inputs)
    proc = VsagenAttnProcessor(make_backend("full"), Timer("cpu"))
    for b in t.blocks:
        b.attn1.set_processor(proc)
    assert maxdiff(forward(t, inputs), stock) <= TOL_FULL_FP32
    t.blocks[0].attn2.set_processor(proc)
    with pytest.raises(ValueError, match="self-attention"):
        forward(t, inputs)


# --------------------------------------------------------------------------------------------------------------
# Timing


@pytest.mark.parametrize("attn,sparsity", [("full", None), ("vsa", 0.5)])
def test_timer_regions_per_forward_and_layer(attn, sparsity):
    t = make_transformer()
    inputs = make_inputs(batch=1, seed=81)
    timer = Timer("cpu")
    patch = patch_transformer(t, make_backend(attn, sparsity), timer)
    n_forwards, n_layers = 3, len(t.blocks)
    try:
        for step in range(n_forwards):
            timer.step = step
            forward(t, inputs)
    finally:
        patch.remove()
    timer.step = 99
    forward(t, inputs)  # after remove(): records nothing
    records = timer.finish()
    names = [n for n, _, _ in records]
    assert names.count("dit") == n_forwards
    assert names.count("attn1") == n_forwards * n_layers
    assert names.count("self_attention") == n_forwards * n_layers
    stages = {n for n in names if n.startswith("self_attention/")}
    assert stages == ({"self_attention/coarse", "self_attention/fine"} if attn == "vsa" else set())
    for stage in stages:
        assert names.count(stage) == n_forwards * n_layers
    assert sorted(s for n, s, _ in records if n == "dit") == list(range(n_forwards))  # tagged with the step
    assert all(sec >= 0 for _, _, sec in records)
    total = lambda name: sum(sec for n, _, sec in records if n == name)  # noqa: E731
    assert 0 < total("self_attention") <= total("attn1") <= total("dit")
    report = TimingReport.from_records(records, "cpu")
    assert report.dit_forwards == n_forwards and len(report.dit_per_step_s) == n_forwards
    assert 0 < report.attention_share_of_dit <= 1


