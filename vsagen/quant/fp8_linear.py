"""FP8 W8A8 linears: float8 e4m3 weights with one scale per output channel, activations quantized to e4m3 with
one scale per row (token) as they arrive, one scaled GEMM (`torch._scaled_mm`'s row-wise scaling: cuBLASLt /
CUTLASS on sm89+), its float32 result rescaled and cast to the activations' dtype.

The formulas (the row-wise recipe of torchao's float8 inference and of `torch._scaled_mm`):
    amax_m = max(AMAX_FLOOR, max_k |x[m, k]|)                   (float32)
    xq     = e4m3(clamp(x * (448 / amax_m), -448, 448))        (round to nearest even: torch's float32 -> e4m3 cast;
                                                               448 / amax_m is torch's fl(fl(1 / amax_m) * 448))
    xs_m   = amax_m / 448
    the weight the same way along its rows (output channels): wq (N, K), ws_n
    y[m, n] = out_dtype( float32(sum_k xq[m, k] * wq[n, k]) * xs_m * ws_n + bias_n )   (rounded once: the bias in
    the GEMM's epilogue, `_scaled_mm(bias=)`; an add after the GEMM cost a whole pass over the (tokens, out) output,
    0.15 ms of a 0.36 ms 32760x1536x1536 layer on an H100, BENCHMARKS.md 2026-12-07 evening)

On CUDA the activations are quantized by one Triton pass (`vsagen.kernels.act_quant`, the same values bit for
bit) and the product is `torch._scaled_mm(xq, wq.t(), scale_a=xs (M, 1), scale_b=ws (1, N))`, which needs K and N
multiples of 16 and a GPU with FP8 tensor cores (`fp8_unsupported`). Elsewhere `fp8_matmul` emulates it: the
e4m3 values (exact in float32) multiplied in float32 and rescaled; the tests check that emulation, and the
quantizer, against float64, and against torch's own CPU `_scaled_mm` where it exists.

FP8 tensor cores: compute capability 8.9 (Ada: L4, L40S, RTX 4090), 9.0 (Hopper: H100, H200), 10.x / 12.x
(Blackwell: B200, RTX 5090). Not on Ampere (A100, sm80) or older, nor here on ROCm.
"""

from __future__ import annotations

from typing import Any

import torch

from .lowbit import LowBitLinear

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn
AMAX_FLOOR = 1e-12  # a row of zeros gets a tiny scale, not a division by zero
FP8_CAPABILITY = (8, 9)
FP8_GPUS = "FP8 tensor cores (compute capability 8.9+: L4, L40S, RTX 4090, H100, H200, B200, RTX 5090)"


def fp8_unsupported(device: Any) -> str | None:
    """Why FP8 linears cannot run on `device` (a torch.device or its name), or None where they can: a CUDA GPU of
    compute capability 8.9 or more (not ROCm)."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"--quant fp8 needs a GPU with {FP8_GPUS}; this run is on the {device.type.upper()}"
    if torch.version.hip:
        return "--quant fp8 runs on NVIDIA GPUs only (ROCm's FP8 formats are not wired here)"
    cap = torch.cuda.get_device_capability(device)
    if cap < FP8_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return f"--quant fp8 needs {FP8_GPUS}; {name} is sm{cap[0]}{cap[1]}"
    return None


def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) float -> float8_e4m3fn with one float32 scale per row (module docstring: the formula).

    Returns:
        (q, scale): q (rows, cols) float8_e4m3fn; scale (rows, 1) float32; q * scale approximates x.
    """
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True).clamp_min(AMAX_FLOOR)
    q = (xf * (E4M3_MAX / amax)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, amax / E4M3_MAX


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize_fp8_rows` as the forward runs it: in eager CUDA runs the one-pass Triton kernel
    (`vsagen.kernels.act_quant`, the same values bit for bit, compiled by Triton once per dtype and tile shape,
    never per token count); the torch formula elsewhere: on the CPU, for dtypes the kernel does not read, and under
    `--compile`, where the whole block is one graph of static shapes and Inductor can fuse the formula into the
    pass that makes the activation (the modulated LayerNorm before q / k / v and the FFN, the GELU before the
    FFN's second linear) and compute the three q / k / v quantizations of one input once (common subexpressions),
    which an opaque custom op would prevent."""
    if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16, torch.float32) and not torch.compiler.is_compiling():
        from ..kernels.act_quant import quantize_fp8_rows_op

        return quantize_fp8_rows_op(x if x.stride(-1) == 1 else x.contiguous())
    return quantize_fp8_rows(x)


def fp8_matmul(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor,
               out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = out_dtype((xq . wq^T) * xs * ws^T + bias), rounded once (module docstring).

    Args:
        xq: (M, K) float8_e4m3fn; xs: (M, 1) float32. wq: (N, K) float8_e4m3fn; ws: (N, 1) float32.
        out_dtype: y's dtype. bias: (N,) or None.

    Returns:
        (M, N) out_dtype: `torch._scaled_mm` on CUDA, the bias in its epilogue where it is bf16 (row-wise scaling
        writes bf16 only, torch 2.11: another out_dtype is cast from its result, another bias dtype added after in
        float32), the float32 emulation elsewhere.
    """
    if xq.is_cuda:
        fused = bias if bias is not None and bias.dtype == torch.bfloat16 else None
        y = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t(), bias=fused, out_dtype=torch.bfloat16)
        if bias is not None and fused is None:
            return (y.float() + bias.float()).to(out_dtype)
        return y if out_dtype == torch.bfloat16 else y.to(out_dtype)
    y = (xq.float() @ wq.float().t()) * xs * ws.t()
    return (y if bias is None else y + bias.float()).to(out_dtype)


class Fp8Linear(LowBitLinear):
    """A linear layer run as an FP8 W8A8 GEMM (module docstring), in place of an `nn.Linear`.

    Buffers: `weight_fp8` (out, in) float8_e4m3fn, `weight_scale` (out, 1) float32 (both keep their dtype through
    `.to(dtype)`), `bias` (out,) or None. forward: x (..., in) float -> (..., out) in x's dtype.
    """

    kept = ("weight_fp8", "weight_scale")
    quantize_weight = staticmethod(quantize_fp8_rows)
    quantize_input = staticmethod(quantize_activations)

    def __init__(self, weight_fp8: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        if weight_fp8.dtype != torch.float8_e4m3fn or tuple(weight_scale.shape) != (weight_fp8.shape[0], 1):
            raise ValueError(f"Fp8Linear: weight {tuple(weight_fp8.shape)} {weight_fp8.dtype} with scale "
                             f"{tuple(weight_scale.shape)}: expected float8_e4m3fn and one scale per output channel")
        super().__init__(weight_fp8, weight_scale, bias)

    def linear_2d(self, x: torch.Tensor) -> torch.Tensor:
        xq, xs = self.quantized_input(x)
        return fp8_matmul(xq, xs, self.weight_fp8, self.weight_scale, x.dtype, self.bias)

    def dequantized_weight(self, dtype: Any = torch.float32) -> torch.Tensor:
        """The weight the e4m3 values and channel scales stand for, in `dtype` (computed in float32 unless `dtype` is
        float64: an e4m3 value times a float32 scale is then correctly rounded)."""
        work = torch.float64 if dtype == torch.float64 else torch.float32
        return (self.weight_fp8.to(work) * self.weight_scale.to(work)).to(dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 e4m3 W8A8, row-wise scales"
