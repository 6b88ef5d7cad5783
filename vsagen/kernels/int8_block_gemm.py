"""Triton int8 GEMM with one float scale per 128 x 128 block of each operand: TurboDiffusion's W8A8 linear
(`turbodiffusion/ops/gemm/kernel.hpp` @aaecff5) as a Triton kernel, so a `-quant` checkpoint runs as int8 GEMMs.

The formula (`vsagen.quant.int8_linear` gives it with its file:line citations): for an output element (m, n),

    y[m, n] = out_dtype( sum over K blocks kb, in order, of
                         float32(int32 dot of xq[m, kb*128 : kb*128+128] and wq[n, same])
                         * (xs[m // 128, kb] * ws[n // 128, kb]) )

accumulated in float32 (their `dequant`, `gemm/utils.hpp:119`: one float accumulator, one int32 partial per
128-wide K tile, the two scales multiplied first), then, with a bias, `out_dtype(that + bias)` (their
`Int8Linear.forward` adds the bias to the bf16 output, `ops/core.py:410-411`; a bf16 + bf16 add rounds once, so
adding in float32 and rounding once is the same value).

One program computes a (BLOCK_M, BLOCK_N) tile of y, walking K 128 at a time (BLOCK_K = 128: one scale pair per
step; the scales of a row / column are gathered by `offs // 128`, so BLOCK_M and BLOCK_N need not be 128). Where
BLOCK_M and BLOCK_N divide 128 (the default 128 x 128) a tile lies in one scale block each way, and each K step
loads two scalars and multiplies the int32 partial by their product (the same value as the gathered outer
product: one multiply per element less in the per-step rescale). The
int8 dot accumulates exactly in int32 (at most 128 * 128 * 128 = 2^21 in magnitude). K need not be a multiple of
128 (their kernel requires it, `kernel.hpp:182`): the loads past K read 0, which adds nothing. Program ids are
grouped GROUP_M row tiles at a time so consecutive programs share weight tiles in L2.

Layout contract:
    xq: (M, K) int8, row stride any, unit column stride;  xs: (cdiv(M, 128), cdiv(K, 128)) float32, contiguous
    wq: (N, K) int8, row stride any, unit column stride;  ws: (cdiv(N, 128), cdiv(K, 128)) float32, contiguous
    bias: (N,) or None;  y: (M, N) out_dtype (bfloat16, float16 or float32), contiguous

Unsupported: autograd (inference only), M * K or N * K or M * N of 2^31 or more (int32 offsets).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

QUANT_BLOCK = 128  # one scale per 128 x 128 block of each operand (TurboDiffusion's BlockSize)


class GemmConfig(NamedTuple):
    """How `int8_block_gemm` launches: the output tile (BLOCK_M x BLOCK_N), GROUP_M row tiles per L2 group, warps
    and software-pipeline stages."""
    block_m: int = 128
    block_n: int = 128
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3


# The default launch; `benchmarks/lowbit_gemm.py` times the candidates below at the Wan DiT's shapes on a GPU.
DEFAULT_CONFIG = GemmConfig()
CANDIDATE_CONFIGS = (
    GemmConfig(128, 128, 8, 8, 3),
    GemmConfig(128, 128, 8, 4, 4),
    GemmConfig(128, 256, 8, 8, 3),
    GemmConfig(256, 128, 8, 8, 3),
)


@triton.jit
def _int8_block_gemm_kernel(X, XS, W, WS, B, Y, M, N, K, KB, stride_xm, stride_wn, stride_ym,
                            HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            GROUP_M: tl.constexpr, SCALAR_SCALES: tl.constexpr):
    QB: tl.constexpr = 128
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, QB)
    in_m = offs_m < M
    in_n = offs_n < N
    x_ptrs = X + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    w_ptrs = W + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    if SCALAR_SCALES:  # the tile inside one scale block each way: one scale pair per K step
        xs_ptrs = XS + (pid_m * BLOCK_M // QB) * KB
        ws_ptrs = WS + (pid_n * BLOCK_N // QB) * KB
    else:
        xs_ptrs = XS + (offs_m // QB) * KB
        ws_ptrs = WS + (offs_n // QB) * KB
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, KB):
        in_k = offs_k < K - kb * QB
        a = tl.load(x_ptrs, mask=in_m[:, None] & in_k[None, :], other=0)
        b = tl.load(w_ptrs, mask=in_k[:, None] & in_n[None, :], other=0)
        part = tl.dot(a, b, out_dtype=tl.int32)
        if SCALAR_SCALES:
            acc += part.to(tl.float32) * (tl.load(xs_ptrs + kb) * tl.load(ws_ptrs + kb))
        else:
            sa = tl.load(xs_ptrs + kb, mask=in_m, other=0.0)
            sb = tl.load(ws_ptrs + kb, mask=in_n, other=0.0)
            acc += part.to(tl.float32) * (sa[:, None] * sb[None, :])
        x_ptrs += QB
        w_ptrs += QB
    out = acc.to(Y.dtype.element_ty)
    if HAS_BIAS:
        bias = tl.load(B + offs_n, mask=in_n, other=0.0).to(tl.float32)
        out = (out.to(tl.float32) + bias[None, :]).to(Y.dtype.element_ty)
    y_ptrs = Y + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, out, mask=in_m[:, None] & in_n[None, :])


def int8_block_gemm(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor,
                    out_dtype: torch.dtype, bias: torch.Tensor | None = None,
                    config: GemmConfig | None = None) -> torch.Tensor:
    """y = xq . wq^T with 128 x 128 block scales (module docstring: formula, layout), plus `bias`.

    Args:
        xq: (M, K) int8 activations; xs: (cdiv(M, 128), cdiv(K, 128)) float32 block scales.
        wq: (N, K) int8 weight; ws: (cdiv(N, 128), cdiv(K, 128)) float32 block scales.
        out_dtype: y's dtype (bfloat16, float16 or float32); bias: (N,) any float dtype, or None.
        config: the launch (None: DEFAULT_CONFIG).

    Returns:
        (M, N) tensor of out_dtype on xq's device.

    Raises:
        ValueError: a dtype, shape or stride outside the contract.
    """
    m, k = xq.shape
    n = wq.shape[0]
    kb = triton.cdiv(k, QUANT_BLOCK)
    if xq.dtype != torch.int8 or wq.dtype != torch.int8 or wq.shape[1] != k:
        raise ValueError(f"int8_block_gemm: xq {tuple(xq.shape)} {xq.dtype}, wq {tuple(wq.shape)} {wq.dtype}: "
                         "expected int8 (M, K) and (N, K)")
    if tuple(xs.shape) != (triton.cdiv(m, QUANT_BLOCK), kb) or tuple(ws.shape) != (triton.cdiv(n, QUANT_BLOCK), kb):
        raise ValueError(f"int8_block_gemm: scales {tuple(xs.shape)} and {tuple(ws.shape)} do not cover "
                         f"({m}, {k}) and ({n}, {k}) in {QUANT_BLOCK} x {QUANT_BLOCK} blocks")
    if xq.stride(1) != 1 or wq.stride(1) != 1:
        raise ValueError("int8_block_gemm: xq and wq need a unit column stride")
    cfg = config or DEFAULT_CONFIG
    xs, ws = xs.float().contiguous(), ws.float().contiguous()
    y = torch.empty(m, n, dtype=out_dtype, device=xq.device)
    if m == 0 or n == 0:
        return y
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    _int8_block_gemm_kernel[grid](
        xq, xs, wq, ws, bias if bias is not None else y, y, m, n, k, kb, xq.stride(0), wq.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, GROUP_M=cfg.group_m,
        SCALAR_SCALES=QUANT_BLOCK % cfg.block_m == 0 and QUANT_BLOCK % cfg.block_n == 0,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return y


@torch.library.custom_op(
    "vsagen::int8_block_gemm", mutates_args=(),
    schema="(Tensor xq, Tensor xs, Tensor wq, Tensor ws, ScalarType out_dtype, Tensor? bias) -> Tensor")
def int8_block_gemm_op(xq, xs, wq, ws, out_dtype, bias):
    """`int8_block_gemm` with DEFAULT_CONFIG as a custom op, so a compiled graph (`--compile`) calls the Triton
    launch as one opaque node rather than tracing the launcher."""
    return int8_block_gemm(xq, xs, wq, ws, out_dtype, bias)


@int8_block_gemm_op.register_fake
def _int8_block_gemm_fake(xq, xs, wq, ws, out_dtype, bias):
    return xq.new_empty((xq.shape[0], wq.shape[0]), dtype=out_dtype)
