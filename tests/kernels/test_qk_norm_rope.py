"""Tests for kernels/qk_norm_rope.py (the fused RMS norm + RoPE q/k prologue), under the Triton interpreter on CPU.

The reference is diffusers' own path, `torch.nn.RMSNorm` followed by vsagen's `apply_rotary` (which
tests/attention/test_processor.py checks against diffusers' `WanAttnProcessor`), run in float64 for the error scale
and in the input dtype for the eager rounding.
"""

from __future__ import annotations

import math

import pytest
import torch

from vsagen.attention.processor import apply_rotary
from vsagen.kernels.qk_norm_rope import rms_norm_rope


def tables(s: int, d: int, seed: int):
    """(1, S, 1, D) float32 cos / sin with each angle repeated for a pair, like WanRotaryPosEmbed."""
    g = torch.Generator().manual_seed(seed)
    ang = torch.rand(s, d // 2, generator=g, dtype=torch.float64) * 2 * math.pi
    ang = ang.repeat_interleave(2, dim=-1)
    return ang.cos().float().view(1, s, 1, d), ang.sin().float().view(1, s, 1, d)


def eager(x, weight, eps, cos, sin, heads, dtype):
    """diffusers' order in `dtype`: RMSNorm over the whole row, split heads, rotate pairs."""
    norm = torch.nn.RMSNorm(x.shape[-1], eps=eps, elementwise_affine=True).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(weight)
        y = norm(x.to(dtype)).unflatten(2, (heads, -1))
    return apply_rotary(y, cos.to(torch.float64) if dtype == torch.float64 else cos,
                        sin.to(torch.float64) if dtype == torch.float64 else sin)


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("b,s,heads,d,dtype", [
    (1, 7, 2, 16, torch.float32),     # N = 32
    (2, 5, 3, 16, torch.float32),     # N = 48: not a power of two (masked lanes), batch 2
    (1, 6, 2, 40, torch.bfloat16),    # odd pair count per block boundary, bf16
    (2, 4, 4, 64, torch.float16),
])
def test_matches_the_eager_prologue(b, s, heads, d, dtype):
    g = torch.Generator().manual_seed(b * 100 + s + d)
    x = (torch.randn(b, s, heads * d, generator=g) * 3 + 0.5).to(dtype)
    weight = (torch.rand(heads * d, generator=g) + 0.5).to(dtype)
    cos, sin = tables(s, d, seed=d)
    got = rms_norm_rope(x, weight, 1e-6, cos, sin, heads)
    assert got.shape == (b, s, heads, d) and got.dtype == dtype and got.is_contiguous()
    exact = eager(x.double(), weight.double(), 1e-6, cos, sin, heads, torch.float64)
    same_dtype = eager(x, weight, 1e-6, cos, sin, heads, dtype)
    # fp16 / bf16: the eager path in the same dtype sets the error scale; the kernel rounds at the same two places.
    # 4x leaves room for the interpreter's bf16 casts (measured 2.5x the eager error here, fp16 within 1x), while
    # a wrong partner, sign or table index is O(1) relative error.
    bound = 1e-6 if dtype == torch.float32 else 4 * rel(same_dtype, exact)
    assert rel(got, exact) <= bound, (rel(got, exact), bound)


def test_strided_rows_of_a_fused_projection():
    """q as a chunk of a fused (B, S, 3 * N) q/k/v projection: row stride 3 * N."""
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(2, 9, 3 * 32, generator=g)
    q = qkv.chunk(3, dim=-1)[0]
    assert not q.is_contiguous()
    w = torch.rand(32, generator=g) + 0.5
    cos, sin = tables(9, 16, seed=1)
    torch.testing.assert_close(rms_norm_rope(q, w, 1e-5, cos, sin, 2), rms_norm_rope(q.contiguous(), w, 1e-5, cos,
                                                                                     sin, 2), rtol=0, atol=0)


def test_rejects_bad_shapes():
    x = torch.randn(1, 4, 30)
    cos, sin = tables(4, 10, 0)
    with pytest.raises(ValueError, match="H \\* D"):
        rms_norm_rope(x, torch.ones(30), 1e-6, cos, sin, 4)
    with pytest.raises(ValueError, match="even head dim"):
        rms_norm_rope(x, torch.ones(30), 1e-6, cos, sin, 2)  # D = 15
    with pytest.raises(ValueError, match="cos and sin"):
        rms_norm_rope(x, torch.ones(30), 1e-6, cos[:, :3], sin[:, :3], 3)
