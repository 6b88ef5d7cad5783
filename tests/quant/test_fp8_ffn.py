"""vsagen.quant.fp8_ffn: a block FFN with both linears in FP8 runs its GELU inside the second linear's quantizer
(the Triton pass under the interpreter here, on the tiny model's blocks in bfloat16), against diffusers' own forward
of the same FP8 layers and against float64; installed once, only where it applies, and back to diffusers' forward
whenever it does not (the swap undone, a dropout that trains)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import make_transformer, rel_l2
from vsagen.quant import fp8_ffn
from vsagen.quant.fp8_ffn import fp8_ffn_forward, fuse_fp8_ffns
from vsagen.quant.swap import put_modules, quantize_transformer


@pytest.fixture
def fp8_model(monkeypatch):
    """(bf16 tiny transformer with fp8 block linears, its float32 original); the fused pass taken on the CPU."""
    monkeypatch.setattr(fp8_ffn, "_fused_here", lambda x: True)
    original = make_transformer()
    t = make_transformer().to(torch.bfloat16)
    quantize_transformer(t, "fp8")
    return t, original


def ffn_input(t, batch=2, tokens=37, seed=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, tokens, t.blocks[0].ffn.net[2].out_features, generator=g).to(torch.bfloat16)


def test_fused_forward_is_the_fp8_ffn_and_close_to_float64(fp8_model):
    t, original = fp8_model
    x = ffn_input(t)
    for block, ref_block in zip(t.blocks, original.blocks):
        ffn = block.ffn
        assert getattr(vars(ffn).get("forward"), "__func__", None) is fp8_ffn_forward
        fused = ffn(x)
        unfused = type(ffn).forward(ffn, x)  # diffusers' forward: the bf16 GELU written, then quantized
        assert fused.shape == unfused.shape == x.shape and fused.dtype == torch.bfloat16
        assert rel_l2(fused.float(), unfused.float()) < 1e-2  # a few GELU values on the neighbouring bf16
        with torch.no_grad():
            exact = ref_block.ffn.double()(x.double())
            ref_block.ffn.float()
        assert rel_l2(fused.double(), exact) < 5e-2
        assert rel_l2(fused.double(), exact) <= 1.05 * rel_l2(unfused.double(), exact) + 1e-4


def test_installed_once_and_only_on_fp8_ffns(fp8_model):
    t, _ = fp8_model
    assert fuse_fp8_ffns(t) == len(t.blocks)  # again: the same forward, not wrapped twice
    ffn = t.blocks[0].ffn
    assert vars(ffn)["forward"].__func__ is fp8_ffn_forward
    assert fuse_fp8_ffns(make_transformer()) == 0  # bf16 linears: nothing installed
    hooked = make_transformer().to(torch.bfloat16)
    quantize_transformer(hooked, "fp8")
    other = lambda x: x  # noqa: E731  (a forward some hook put on the instance)
    hooked.blocks[1].ffn.forward = other
    assert fuse_fp8_ffns(hooked) == len(hooked.blocks) - 1 and hooked.blocks[1].ffn.forward is other


def test_falls_back_to_diffusers_forward_where_the_fusion_does_not_apply(fp8_model):
    t, _ = fp8_model
    x = ffn_input(t, batch=1, tokens=20)
    ffn = t.blocks[0].ffn
    # the swap undone (as a `compare --quant` row does): the bf16 linears run, bitwise diffusers' FFN
    put_modules(t, {"blocks.0.ffn.net.0.proj": nn.Linear(*reversed(ffn.net[0].proj.weight.shape)).to(torch.bfloat16)})
    assert torch.equal(ffn(x), type(ffn).forward(ffn, x))
    ffn = t.blocks[1].ffn
    assert torch.equal(ffn(x.float()), type(ffn).forward(ffn, x.float()))  # float32 input: unfused
    ffn.net[1].p = 0.5
    ffn.train()
    torch.manual_seed(0)
    a = ffn(x)
    torch.manual_seed(0)
    assert torch.equal(a, type(ffn).forward(ffn, x))  # a dropout that trains: diffusers' forward, dropout included
