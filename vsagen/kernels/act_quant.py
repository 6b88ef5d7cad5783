"""One-pass Triton quantizers for the low-bit linears' activations (`--quant`): each reads its input once (the two-walk
launches read a row block twice, the second time meant to hit L2) and writes the codes and scales, in place of the
torch formulas of `vsagen.quant` (which they reproduce bit for bit; the tests compare them under the interpreter).

* `quantize_fp8_rows`: FP8 e4m3 with one float32 scale per row (`vsagen.quant.fp8_linear`'s formula):
      amax_m = max(1e-12, max_k |x[m, k]|);  inv_m = fl(fl(1 / amax_m) * 448)   (torch's `448 / amax`: reciprocal,
      then the product);  q = e4m3_rne(clamp(fl(x * inv_m), -448, 448));  scale_m = amax_m / 448 (IEEE division)
  One program per BLOCK_M rows: the row block held in registers when K fits one BLOCK_K tile, else two walks over K
  (amax, then codes). With `gelu=True` the same of GELU(x) rounded to bfloat16 (the FFN's activation, computed on
  each walk from the FFN's first linear's output): the (tokens, 4 x dim) activation is never written in bfloat16.
* `quantize_int8_blocks`: TurboDiffusion's `quant_cuda` (`vsagen.quant.int8_linear`'s formula, one scale per
  128 x 128 block): amax_b = max(1e-8, max over the block of |x|); q = clamp(rne(fl(x * fl(fl(1 / amax_b) * 128))),
  -128, 127); scale_b = amax_b / 128. One program per block, held in registers (or walked twice in row chunks).

Rounding without libdevice (the interpreter has none) and the same on the GPU: e4m3 by bits (`bsa_forward`'s
`_round_e4m3` on |v|, the sign put back, then a cast of a value already on the grid, exact everywhere: the
interpreter's own fp32 -> e4m3 cast drops carries), int8 by the float32 magic constant 1.5 * 2^23 (v + C - C rounds
to the nearest integer, ties to even, for |v| < 2^22). The clamp runs before the rounding (equal, the bounds being
integers on the grid) so no product feeds the addition directly: nothing can be contracted into an FMA, which would
round the unrounded product. The divisions are `div_rn` (Triton's `/` may lower to an approximate division; the
PTX for sm_90 has div.rn.f32, no fma, and the magic addition kept, checked with triton 3.9).

Layout contract: x (M, K) bfloat16 / float16 / float32, unit column stride, any row stride; codes (M, K) contiguous;
scales contiguous float32, (M, 1) (fp8) or (cdiv(M, 128), cdiv(K, 128)) (int8); the row stride and K below 2^24
(int32 offsets inside a block). M is not specialized (no recompile per token count). Unsupported: NaN / Inf
inputs (the maximum ignores NaN, torch's propagates it).

They are custom ops (`vsagen::quantize_fp8_rows`, `vsagen::gelu_quantize_fp8_rows`, `vsagen::quantize_int8_blocks`)
with fake implementations, so
`--compile` keeps each one node in the graph, and an eager run compiles nothing (no torch.compile, no dynamo guards).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .bsa_forward import _round_e4m3

QUANT_BLOCK = 128  # int8: one scale per 128 x 128 block (TurboDiffusion's BlockSize)
_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


class RowQuantConfig(NamedTuple):
    """How `quantize_fp8_rows` launches: rows per program, K tile (a power of two), warps. `one_tile_k`: the
    largest K held whole in registers (one load); past it the row block is walked twice."""
    block_m: int = 2
    block_k: int = 1024
    num_warps: int = 4
    one_tile_k: int = 2048


class BlockQuantConfig(NamedTuple):
    """How `quantize_int8_blocks` launches: rows of the 128 x 128 block loaded at a time (128: the block held in
    registers, one read; fewer: two walks, the second from L2, more programs resident), warps."""
    chunk_rows: int = 128
    num_warps: int = 16


DEFAULT_ROW_CONFIG = RowQuantConfig()
DEFAULT_BLOCK_CONFIG = BlockQuantConfig()
# what `benchmarks/quant_layers_gpu.py` times at the Wan DiT's shapes
ROW_CANDIDATES = (RowQuantConfig(2, 1024, 4, 2048), RowQuantConfig(4, 1024, 4, 2048), RowQuantConfig(8, 512, 4, 0),
                  RowQuantConfig(1, 1024, 16, 16384), RowQuantConfig(1, 1024, 8, 16384))
BLOCK_CANDIDATES = (BlockQuantConfig(128, 16), BlockQuantConfig(128, 8), BlockQuantConfig(32, 4),
                    BlockQuantConfig(64, 8))


@triton.jit
def _e4m3_signed(v):
    """fp32 v in [-448, 448] rounded to e4m3's grid (nearest even), sign kept (-0.0 stays -0.0), as fp32."""
    r = _round_e4m3(tl.abs(v))
    return tl.where(v.to(tl.int32, bitcast=True) < 0, -r, r)


@triton.jit
def _gelu_tanh_bf16(x):
    """fp32 x -> GELU with the tanh approximation (torch's `gelu(approximate="tanh")` formula, in fp32:
    0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), tanh(u) = 1 - 2 / (exp(2u) + 1)), rounded to bfloat16's grid
    (nearest even, by bits: the interpreter's casts do not round), returned as fp32."""
    u = 0.7978845608028654 * (x + 0.044715 * (x * x * x))
    u = tl.minimum(tl.maximum(u, -20.0), 20.0)  # tanh is +-1 in fp32 past |u| = 9.01; exp(2u) stays finite
    g = 0.5 * x * (1.0 + (1.0 - 2.0 / (tl.exp(2.0 * u) + 1.0)))
    bits = g.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit(do_not_specialize=["M"])
def _fp8_rows_kernel(X, Q, S, M, K, stride_xm, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                     ONE_TILE: tl.constexpr, GELU: tl.constexpr = False):
    first = tl.program_id(0) * BLOCK_M
    rows = tl.arange(0, BLOCK_M)  # offsets inside the row block: int32, the block's base pointer int64
    in_m = first + rows < M
    x_rows = X + first.to(tl.int64) * stride_xm + rows[:, None] * stride_xm
    q_rows = Q + first.to(tl.int64) * K + rows[:, None] * K
    cols = tl.arange(0, BLOCK_K)
    if ONE_TILE:
        mask = in_m[:, None] & (cols < K)[None, :]
        x = tl.load(x_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if GELU:
            x = _gelu_tanh_bf16(x)
        amax = tl.max(tl.abs(x), 1)
    else:
        amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            mask = in_m[:, None] & (k0 + cols < K)[None, :]
            x = tl.load(x_rows + (k0 + cols)[None, :], mask=mask, other=0.0).to(tl.float32)
            if GELU:
                x = _gelu_tanh_bf16(x)
            amax = tl.maximum(amax, tl.max(tl.abs(x), 1))
    amax = tl.maximum(amax, 1e-12)
    inv = tl.math.div_rn(tl.full((BLOCK_M,), 1.0, tl.float32), amax) * 448.0
    tl.store(S + first + rows, tl.math.div_rn(amax, tl.full((BLOCK_M,), 448.0, tl.float32)), mask=in_m)
    if ONE_TILE:
        v = tl.minimum(tl.maximum(x * inv[:, None], -448.0), 448.0)
        tl.store(q_rows + cols[None, :], _e4m3_signed(v).to(Q.dtype.element_ty), mask=mask)
    else:
        for k0 in range(0, K, BLOCK_K):
            mask = in_m[:, None] & (k0 + cols < K)[None, :]
            x = tl.load(x_rows + (k0 + cols)[None, :], mask=mask, other=0.0).to(tl.float32)
            if GELU:
                x = _gelu_tanh_bf16(x)
            v = tl.minimum(tl.maximum(x * inv[:, None], -448.0), 448.0)
            tl.store(q_rows + (k0 + cols)[None, :], _e4m3_signed(v).to(Q.dtype.element_ty), mask=mask)


@triton.jit
def _int8_codes(x, inv):
    """fp32 x times inv, clamped to [-128, 127] (integer bounds: the same as clamping after the rounding, and no
    product feeds the addition), rounded to an integer, ties to even (1.5 * 2^23 added and taken away), as int8."""
    v = tl.minimum(tl.maximum(x * inv, -128.0), 127.0)
    return ((v + 12582912.0) - 12582912.0).to(tl.int8)


@triton.jit(do_not_specialize=["M"])
def _int8_blocks_kernel(X, Q, S, M, K, stride_xm, CHUNK: tl.constexpr):
    QB: tl.constexpr = 128
    cb = tl.program_id(0)
    rb = tl.program_id(1)
    r = tl.arange(0, CHUNK)  # offsets inside the block: int32, the block's base pointer int64
    c = tl.arange(0, QB)
    c_ok = (cb * QB + c < K)[None, :]
    x_block = X + (rb * QB).to(tl.int64) * stride_xm + cb * QB
    q_block = Q + (rb * QB).to(tl.int64) * K + cb * QB
    if CHUNK == QB:  # the block held in registers: one read
        mask = (rb * QB + r < M)[:, None] & c_ok
        x = tl.load(x_block + r[:, None] * stride_xm + c[None, :], mask=mask, other=0.0).to(tl.float32)
        amax = tl.max(tl.max(tl.abs(x), 1), 0)
    else:  # CHUNK rows at a time, twice (the second read from L2)
        amax = 0.0
        for r0 in range(0, QB, CHUNK):
            mask = (rb * QB + r0 + r < M)[:, None] & c_ok
            x = tl.load(x_block + (r0 + r)[:, None] * stride_xm + c[None, :], mask=mask, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.max(tl.abs(x), 1), 0))
    amax = tl.maximum(amax, 1e-8)
    inv = tl.math.div_rn(1.0, amax) * 128.0
    if CHUNK == QB:
        tl.store(q_block + r[:, None] * K + c[None, :], _int8_codes(x, inv), mask=mask)
    else:
        for r0 in range(0, QB, CHUNK):
            mask = (rb * QB + r0 + r < M)[:, None] & c_ok
            x = tl.load(x_block + (r0 + r)[:, None] * stride_xm + c[None, :], mask=mask, other=0.0).to(tl.float32)
            tl.store(q_block + (r0 + r)[:, None] * K + c[None, :], _int8_codes(x, inv), mask=mask)
    tl.store(S + rb * tl.num_programs(0) + cb, tl.math.div_rn(amax, 128.0))


def _check(x: torch.Tensor, who: str) -> None:
    if x.dim() != 2 or x.dtype not in _FLOATS or (x.shape[1] > 1 and x.stride(1) != 1):
        raise ValueError(f"{who}: x {tuple(x.shape)} {x.dtype} stride {x.stride()}: expected a 2-D bfloat16, "
                         "float16 or float32 tensor with a unit column stride")


def quantize_fp8_rows(x: torch.Tensor, config: RowQuantConfig | None = None, *,
                      gelu: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) -> (q (M, K) float8_e4m3fn, scale (M, 1) float32), one scale per row (module docstring: formula).

    Args:
        x: (M, K) bfloat16 / float16 / float32 on the GPU (any device under TRITON_INTERPRET=1), unit column stride.
        config: the launch (None: DEFAULT_ROW_CONFIG).
        gelu: quantize GELU(x) instead (tanh approximation, rounded to bfloat16 first, as diffusers' FFN hands its
            second linear `F.gelu(x, approximate="tanh")` of a bfloat16 x), in the same pass: the FFN's activation
            never written in bfloat16. bfloat16 x only.

    Raises:
        ValueError: x not 2-D floating point with a unit column stride; `gelu` with x not bfloat16.
    """
    _check(x, "quantize_fp8_rows")
    if gelu and x.dtype != torch.bfloat16:
        raise ValueError(f"quantize_fp8_rows(gelu=True): x is {x.dtype}; the fused GELU reads bfloat16 only")
    cfg = config or DEFAULT_ROW_CONFIG
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    if m == 0:
        return q, scale
    one_tile = k <= cfg.one_tile_k
    block_k = triton.next_power_of_2(k) if one_tile else cfg.block_k
    block_m = max(1, min(64, cfg.block_m * cfg.block_k // block_k)) if one_tile else cfg.block_m
    _fp8_rows_kernel[(triton.cdiv(m, block_m),)](x, q, scale, m, k, x.stride(0), BLOCK_M=block_m, BLOCK_K=block_k,
                                                 ONE_TILE=one_tile, GELU=gelu, num_warps=cfg.num_warps)
    return q, scale


def quantize_int8_blocks(x: torch.Tensor, config: BlockQuantConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) -> (q (M, K) int8, scale (cdiv(M, 128), cdiv(K, 128)) float32), one scale per 128 x 128 block
    (module docstring: TurboDiffusion's formula).

    Args:
        x: (M, K) bfloat16 / float16 / float32 on the GPU (any device under TRITON_INTERPRET=1), unit column stride.
        config: the launch (None: DEFAULT_BLOCK_CONFIG; chunk_rows a power of two dividing 128).

    Raises:
        ValueError: x not 2-D floating point with a unit column stride.
    """
    _check(x, "quantize_int8_blocks")
    cfg = config or DEFAULT_BLOCK_CONFIG
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.int8, device=x.device)
    scale = torch.empty(triton.cdiv(m, QUANT_BLOCK), triton.cdiv(k, QUANT_BLOCK), dtype=torch.float32,
                        device=x.device)
    if m and k:
        _int8_blocks_kernel[(scale.shape[1], scale.shape[0])](x, q, scale, m, k, x.stride(0), CHUNK=cfg.chunk_rows,
                                                              num_warps=cfg.num_warps)
    return q, scale


@torch.library.custom_op("vsagen::quantize_fp8_rows", mutates_args=(), schema="(Tensor x) -> (Tensor, Tensor)")
def quantize_fp8_rows_op(x):
    """`quantize_fp8_rows` with DEFAULT_ROW_CONFIG as a custom op (one opaque node under torch.compile)."""
    return quantize_fp8_rows(x)


@quantize_fp8_rows_op.register_fake
def _quantize_fp8_rows_fake(x):
    return x.new_empty(x.shape, dtype=torch.float8_e4m3fn), x.new_empty((x.shape[0], 1), dtype=torch.float32)


@torch.library.custom_op("vsagen::gelu_quantize_fp8_rows", mutates_args=(), schema="(Tensor x) -> (Tensor, Tensor)")
def gelu_quantize_fp8_rows_op(x):
    """`quantize_fp8_rows(x, gelu=True)` with DEFAULT_ROW_CONFIG as a custom op: the FFN's GELU and its
    quantization in one pass."""
    return quantize_fp8_rows(x, gelu=True)


gelu_quantize_fp8_rows_op.register_fake(_quantize_fp8_rows_fake)


@torch.library.custom_op("vsagen::quantize_int8_blocks", mutates_args=(), schema="(Tensor x) -> (Tensor, Tensor)")
def quantize_int8_blocks_op(x):
    """`quantize_int8_blocks` as a custom op (one opaque node under torch.compile)."""
    return quantize_int8_blocks(x)


@quantize_int8_blocks_op.register_fake
def _quantize_int8_blocks_fake(x):
    m, k = x.shape
    blocks = ((m + QUANT_BLOCK - 1) // QUANT_BLOCK, (k + QUANT_BLOCK - 1) // QUANT_BLOCK)
    return x.new_empty((m, k), dtype=torch.int8), x.new_empty(blocks, dtype=torch.float32)
