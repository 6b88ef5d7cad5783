"""Fused q/k prologue of Wan's self-attention: RMS norm across heads, then RoPE on interleaved pairs, in one pass.

diffusers' `WanAttnProcessor` (0.42.1) normalises the projected query / key over the whole inner dim (H * D,
`torch.nn.RMSNorm`, fp32 statistics, output in the activation dtype), splits heads, and rotates each head's
interleaved pairs (x[2i], x[2i+1]) by float32 (cos, sin) tables in about eight elementwise passes over float32
copies. This kernel reads each token row once, computes the same two steps in float32 registers and writes the
rotated row once in the activation dtype: one read and one write of (B, S, H * D) instead of ~16 passes.

Rounding follows the eager path: the normalised row is rounded to the activation dtype (as `RMSNorm` returns
it) before the rotation, whose result is rounded once more. RoFormer (Su et al., arXiv 2104.09864) sec. 3.4 for
the rotation; Wan's tables repeat each angle for both members of a pair, and the pair (2i, 2i+1) uses
cos[2i] and sin[2i+1] as diffusers does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_rope_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr,
    seq_len, stride_xb, stride_xs, stride_cs, stride_ss, stride_ob, stride_os, eps,
    N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
):
    """One program: one token row of N = H * HEAD_DIM features."""
    row = tl.program_id(0)
    b = row // seq_len
    s = row % seq_len
    offs = tl.arange(0, BLOCK)
    ok = offs < N
    partner = offs ^ 1  # the other member of the pair (N and HEAD_DIM are even)
    x_row = x_ptr + b * stride_xb + s * stride_xs
    x = tl.load(x_row + offs, mask=ok, other=0.0).to(tl.float32)
    xp = tl.load(x_row + partner, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    wp = tl.load(w_ptr + partner, mask=ok, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, 0) / N + eps)  # RMS over the whole row (all heads)
    dt = out_ptr.dtype.element_ty
    y = (x * r * w).to(dt).to(tl.float32)  # the normalised row as RMSNorm returns it
    yp = (xp * r * wp).to(dt).to(tl.float32)
    d = offs % HEAD_DIM
    pair = d - d % 2
    c = tl.load(cos_ptr + s * stride_cs + pair, mask=ok, other=0.0)
    sn = tl.load(sin_ptr + s * stride_ss + pair + 1, mask=ok, other=0.0)
    even = (offs % 2) == 0
    out = tl.where(even, y * c - yp * sn, yp * sn + y * c)
    tl.store(out_ptr + b * stride_ob + s * stride_os + offs, out.to(dt), mask=ok)


def rms_norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                  heads: int) -> torch.Tensor:
    """RMS norm over the last dim of `x` (all heads together) times `weight`, then RoPE per head.

    Args:
        x: (B, S, H * D) bf16 / fp16 / fp32 projected query or key, unit stride on the last dim (a chunk of a
            fused q/k/v projection is fine).
        weight: (H * D,) the RMSNorm weight (any float dtype).
        eps: the RMSNorm epsilon.
        cos, sin: (1, S, 1, D) float32 RoPE tables (raster or tile order: row s of x uses row s of the tables),
            each angle repeated for both members of a pair, unit stride on D.
        heads: H.

    Returns:
        (B, S, H, D) contiguous, x's dtype: the rotated, normalised heads.

    Raises:
        ValueError: mismatched shapes, an odd head dim, or strides the kernel cannot take.

    Source: diffusers 0.42.1 `WanAttnProcessor` (norm_q / norm_k, then `apply_rotary_emb`), fused.
    """
    if x.dim() != 3 or x.shape[-1] % heads:
        raise ValueError(f"x must be (B, S, H * D) with H = {heads}, got {tuple(x.shape)}")
    b, s, n = x.shape
    d = n // heads
    if d % 2 or weight.shape != (n,):
        raise ValueError(f"need an even head dim and a ({n},) weight, got D = {d}, weight {tuple(weight.shape)}")
    if cos.shape != (1, s, 1, d) or sin.shape != (1, s, 1, d):
        raise ValueError(f"cos and sin must be (1, {s}, 1, {d}), got {tuple(cos.shape)}, {tuple(sin.shape)}")
    if x.stride(-1) != 1 or cos.stride(-1) != 1 or sin.stride(-1) != 1 or not weight.is_contiguous():
        raise ValueError("x, cos, sin need unit stride on their last dim and weight must be contiguous")
    cos, sin = cos.float(), sin.float()
    out = torch.empty((b, s, n), dtype=x.dtype, device=x.device)
    block = triton.next_power_of_2(n)
    _rms_norm_rope_kernel[(b * s,)](
        x, weight, cos, sin, out,
        s, x.stride(0), x.stride(1), cos.stride(1), sin.stride(1), out.stride(0), out.stride(1), float(eps),
        N=n, HEAD_DIM=d, BLOCK=block, num_warps=min(16, max(4, block // 512)),
    )
    return out.view(b, s, heads, d)
