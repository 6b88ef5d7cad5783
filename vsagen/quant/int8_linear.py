"""TurboDiffusion's int8 W8A8 linear, as their authors run their `-quant` checkpoints: the weight and the
activations quantized to int8 with one float scale per 128 x 128 block, an int8 GEMM with int32 partial sums per
128-wide slice of K, rescaled and summed in float32.

Their code (github.com/thu-ml/TurboDiffusion @aaecff5, `turbodiffusion/ops/`; cutlass @e67e63c):

Quantizer, `quant_cuda(x)` (`quant/quant.hpp`), for a 2-D (rows, cols) bf16 / fp16 tensor, one CTA per 128 x 128
block (`get_grid_size`, lines 64-69; `BlockSize = 128`, line 38):
    x read as float32; elements past the edge of a partial block read as 0 (`common/load.hpp:33-36`)
    amax_b  = max(1e-8, max over the block of |x|)                    (`_reduce_amax`, lines 123-154: starts at 1e-8)
    q       = cvt.rni.sat.s8.f32(x * (128 / amax_b))                   (lines 94, 157-163; `int8_max = 128.f`, line 48)
              i.e. round half to even, then saturate to [-128, 127] (cutlass `NumericConverter<int8_t, float,
              round_to_nearest>`, `numeric_conversion.h`); 128 / amax_b is one float32 division, then one product
    scale_b = amax_b / 128, float32, stored at [row_block, col_block]  (line 96; `common/store.hpp:44-46`)
  So the quantization is symmetric, with no zero point; the element of largest magnitude maps to +-128, which
  saturates to 127 when positive. The weight is quantized by the same kernel on its (out, in) matrix
  (`core.py:424-425`, `Int8Linear.from_linear`), which is how the `-quant` files' `<name>.scale` were written.

Linear, `int8_linear(x, w_q, w_s)` + `Int8Linear.forward` (`core.py:28-57, 408-412`):
    x reshaped to (M, K) = (-1, in_features); y = zeros(M, N, dtype=x.dtype)                   (core.py:49-53)
    xq, xs = quant_cuda(x): the activations quantized per 128 tokens x 128 channels block        (core.py:55)
    gemm_cuda(xq, xs, w_q, w_s, y)                                                               (core.py:56)
    out = y + bias, in the bias' dtype (the linear's)                                            (core.py:409-411)
GEMM, `gemm/kernel.hpp` (cute, `SM80_16x8x32_S32S8S8S32_TN`, line 75; TileM = TileN = TileK = 128, lines 37-39):
    for each 128-wide K tile kb, in order: the int32 accumulator gets the int8 dot of the tile (line 407), then
    `dequant` (`gemm/utils.hpp:116-120`) adds float(acc_int32) * (scale_a * scale_b) to a float32 accumulator
    and clears the int32 one, with scale_a = xs[m // 128, kb] and scale_b = ws[n // 128, kb] (lines 391-392,
    424-426); the float32 accumulator is converted to the output dtype at the end (lines 474-476).
    Their kernel needs K % 128 == 0 (`can_implement`, line 182; else it launches nothing and y stays zero).
Layers replaced (`inference/modify_model.py:64-67`): every `nn.Linear` inside `model.blocks` whose name lacks
"proj_l" (SLA's projection); the embeddings, the time projection and the head stay in bf16.

In formulas, with blocks of 128 along M, N and K:
    y[m, n] = out_dtype( sum_kb fl32( float(sum_{k in kb} xq[m, k] * wq[n, k]) * fl32(xs[m/128, kb] * ws[n/128, kb]) ) )
    out     = y + bias                       (a bf16 + bf16 add rounds once: computing it in float32 is the same)

Here: `quantize_int8_blocks` is their quantizer (in torch; on CUDA the one-pass Triton kernel of
`vsagen.kernels.act_quant`, the same values), `int8_block_matmul` their GEMM
(`vsagen.kernels.int8_block_gemm`, a custom op, on CUDA; on the CPU `torch._int_mm` per K slice, or an exact
float32 product where `_int_mm` does not take the shape: every partial sum is an integer below 2^24 in magnitude,
so float32 holds it exactly), `Int8Linear` their module. One extension: K need not be a multiple of 128 (the partial
K block reads zeros past the edge, as the quantizer does), so the tiny test models' 32-wide linears run too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .lowbit import LowBitLinear

QUANT_BLOCK = 128
INT8_MAX = 128.0  # their `int8_max`: amax maps to 128, which saturates to 127
AMAX_FLOOR = 1e-8  # their `_reduce_amax` starts at 1e-8, so an all-zero block gets scale 1e-8 / 128


INT8_CAPABILITY = (8, 0)
INT8_GPUS = ("int8 tensor cores as Triton drives them (compute capability 8.0+: A100, L4, L40S, RTX 3090 / 4090, "
             "H100, H200)")


def int8_unsupported(device: Any) -> str | None:
    """Why int8 linears cannot run on `device` (a torch.device or its name), or None where they can: the CPU
    (`torch._int_mm`, exact float32 otherwise) or a CUDA GPU of compute capability 8.0 or more (not ROCm)."""
    device = torch.device(device)
    if device.type == "cpu":
        return None
    if device.type != "cuda" or torch.version.hip:
        return f"--quant int8 runs on the CPU and on NVIDIA GPUs with {INT8_GPUS}, not on {device.type}"
    cap = torch.cuda.get_device_capability(device)
    if cap < INT8_CAPABILITY:
        return f"--quant int8 needs {INT8_GPUS}; {torch.cuda.get_device_name(device)} is sm{cap[0]}{cap[1]}"
    return None


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


def quantize_int8_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """TurboDiffusion's `quant_cuda` (module docstring): (rows, cols) float -> int8 with one scale per 128 x 128 block.

    Args:
        x: (rows, cols) tensor of any float dtype, any device.

    Returns:
        (q, scale): q (rows, cols) int8 on x's device; scale (cdiv(rows, 128), cdiv(cols, 128)) float32 with
        q * scale of its block approximating x.
    """
    rows, cols = x.shape
    rb, cb = cdiv(rows, QUANT_BLOCK), cdiv(cols, QUANT_BLOCK)
    xf = x.float()
    padded = nn.functional.pad(xf, (0, cb * QUANT_BLOCK - cols, 0, rb * QUANT_BLOCK - rows))
    blocks = padded.view(rb, QUANT_BLOCK, cb, QUANT_BLOCK)
    amax = blocks.abs().amax(dim=(1, 3)).clamp_min(AMAX_FLOOR)  # (rb, cb)
    inv = (INT8_MAX / amax)[:, None, :, None]
    q = torch.round(blocks * inv).clamp(-128.0, 127.0).to(torch.int8)
    q = q.view(rb * QUANT_BLOCK, cb * QUANT_BLOCK)[:rows, :cols]
    return q.contiguous(), amax / INT8_MAX


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_int8_blocks` as the forward runs it: on CUDA the one-pass Triton kernel (`vsagen.kernels.act_quant`,
    one program per 128 x 128 block, the same values bit for bit, one custom op in eager runs and under `--compile`
    alike, never recompiled per token count), the torch formula elsewhere (and for dtypes the kernel does not read)."""
    if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16, torch.float32):
        from ..kernels.act_quant import quantize_int8_blocks_op

        return quantize_int8_blocks_op(x if x.stride(-1) == 1 else x.contiguous())
    return quantize_int8_blocks(x)


def _cpu_block_matmul(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """The float32 accumulator of TurboDiffusion's GEMM on the CPU: per 128-wide K slice the exact integer dot
    (`torch._int_mm` where it takes the shape: more than 16 rows, N a multiple of 8; else float32, exact for
    integers below 2^24), times the slice's scale products, summed in K order in float32. Returns (M, N) float32."""
    m, k = xq.shape
    n = wq.shape[0]
    xs_rows = xs.repeat_interleave(QUANT_BLOCK, 0)[:m]  # (M, KB)
    ws_rows = ws.repeat_interleave(QUANT_BLOCK, 0)[:n]  # (N, KB)
    use_int_mm = m > 16 and n % 8 == 0
    acc = torch.zeros(m, n, dtype=torch.float32, device=xq.device)
    for kb in range(cdiv(k, QUANT_BLOCK)):
        sl = slice(kb * QUANT_BLOCK, min(k, (kb + 1) * QUANT_BLOCK))
        a, b = xq[:, sl], wq[:, sl]
        if use_int_mm and a.shape[1] % 8 == 0:
            part = torch._int_mm(a.contiguous(), b.t().contiguous()).float()
        else:
            part = a.float() @ b.float().t()
        acc += part * (xs_rows[:, kb, None] * ws_rows[None, :, kb])
    return acc


def int8_block_matmul(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor,
                      out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """TurboDiffusion's block-scaled int8 GEMM plus bias (module docstring: the formula).

    Args:
        xq: (M, K) int8; xs: (cdiv(M, 128), cdiv(K, 128)) float32 (from `quantize_int8_blocks`).
        wq: (N, K) int8; ws: (cdiv(N, 128), cdiv(K, 128)) float32.
        out_dtype: the output's dtype; bias: (N,) or None, added after the cast and rounded once more.

    Returns:
        (M, N) tensor of out_dtype. On CUDA the Triton kernel `vsagen.kernels.int8_block_gemm`; elsewhere
        `_cpu_block_matmul` (the same value up to float32 summation order inside the GPU's FMA).
    """
    if xq.is_cuda:
        from ..kernels.int8_block_gemm import int8_block_gemm_op

        return int8_block_gemm_op(xq, xs, wq, ws, out_dtype, bias)
    y = _cpu_block_matmul(xq, xs, wq, ws).to(out_dtype)
    return y if bias is None else (y.float() + bias.float()).to(out_dtype)


class Int8Linear(LowBitLinear):
    """A linear layer run as TurboDiffusion's W8A8 int8 GEMM (module docstring), in place of an `nn.Linear`.

    Buffers as their `Int8Linear` names them (so a `-quant` file's tensors load by name): `int8_weight` (out, in)
    int8, `scale` (cdiv(out, 128), cdiv(in, 128)) float32, `bias` (out,) in the run's dtype or None.
    forward: x (..., in) float -> (..., out) in x's dtype. `scale` stays float32 through `.to(dtype)`.
    """

    kept = ("int8_weight", "scale")
    quantize_weight = staticmethod(quantize_int8_blocks)
    quantize_input = staticmethod(quantize_activations)

    def __init__(self, int8_weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        blocks = tuple(cdiv(n, QUANT_BLOCK) for n in int8_weight.shape)
        if int8_weight.dtype != torch.int8 or int8_weight.dim() != 2 or tuple(scale.shape) != blocks:
            raise ValueError(f"Int8Linear: weight {tuple(int8_weight.shape)} {int8_weight.dtype} with scale "
                             f"{tuple(scale.shape)}: expected int8 and one scale per {QUANT_BLOCK}x{QUANT_BLOCK} block")
        super().__init__(int8_weight, scale, bias)

    def linear_2d(self, x: torch.Tensor) -> torch.Tensor:
        xq, xs = self.quantized_input(x)
        return int8_block_matmul(xq, xs, self.int8_weight, self.scale, x.dtype, self.bias)

    def dequantized_weight(self, dtype: Any = torch.float32) -> torch.Tensor:
        """The weight the int8 values and block scales stand for: int8 x its block's scale, in `dtype` (computed in
        float32 unless `dtype` is float64: the product of an int8 and a float32 scale is then correctly rounded, the
        float32 value float64's cast would give)."""
        work = torch.float64 if dtype == torch.float64 else torch.float32
        s = self.scale.to(work).repeat_interleave(QUANT_BLOCK, 0).repeat_interleave(QUANT_BLOCK, 1)
        return (self.int8_weight.to(work) * s[: self.out_features, : self.in_features]).to(dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 W8A8, 128x128 block scales"
