"""A Wan block's FFN with both linears in FP8 (`--quant fp8`), its GELU and the second linear's activation
quantization in one pass.

diffusers' `FeedForward` (activation "gelu-approximate", Wan's) runs `net[0]`: `proj` then `F.gelu(h,
approximate="tanh")`, `net[1]`: dropout, `net[2]`: the output linear. With both linears `Fp8Linear`, the GELU writes a
(tokens, 4 x dim) bfloat16 activation that the second linear's quantizer reads straight back: on an H100 at the 1.3B's
32760 x 8960 that quantizer alone took 0.49 ms of the 1.36 ms layer (BENCHMARKS.md, 2026-12-07 evening). Here, in
eager CUDA runs, the GELU is computed inside the quantizer's pass (`vsagen.kernels.act_quant`,
`quantize_fp8_rows(gelu=True)`): it reads the first linear's output and writes the e4m3 codes and row scales, and
the bfloat16 activation is never stored. The arithmetic is the unfused path's: GELU in float32 rounded to bfloat16
(torch's formula; `tanh` by `exp`, so a value may round to the neighbouring bfloat16 where torch's `tanhf` lands
on the other side of a tie), then `fp8_linear`'s row-wise formula. Elsewhere (the CPU, other dtypes, training with
dropout) and under `--compile` (where Inductor fuses the torch formulas itself) the FFN runs its own modules.

`fuse_fp8_ffns` installs the forward on each block's FFN instance; it checks at every call that the FFN still has
both linears in FP8 (a `compare --quant` row puts the bf16 ones back) and otherwise runs diffusers' forward.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from .fp8_linear import Fp8Linear, fp8_matmul, quantize_activations


def _fused_here(x: torch.Tensor) -> bool:
    """Whether the fused Triton pass runs for x: on CUDA (the tests also run it on the CPU under the Triton
    interpreter, by replacing this function)."""
    return x.is_cuda


def _parts(ffn: Any) -> tuple[Fp8Linear, Fp8Linear] | None:
    """(first, second) FP8 linears of a diffusers FeedForward built as Wan's (GELU tanh, dropout, linear), or None."""
    from diffusers.models.activations import GELU

    net = getattr(ffn, "net", None)
    if not isinstance(net, nn.ModuleList) or len(net) != 3:
        return None
    act, drop, out = net
    if not (isinstance(act, GELU) and act.approximate == "tanh" and isinstance(act.proj, Fp8Linear)
            and isinstance(drop, nn.Dropout) and isinstance(out, Fp8Linear)):
        return None
    return act.proj, out


def fp8_ffn_forward(ffn: Any, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """`ffn(hidden_states)` with the GELU fused into the second linear's quantizer where it applies (module
    docstring), else diffusers' own forward.

    Args:
        ffn: diffusers' FeedForward of a Wan block. hidden_states: (B, S, dim), the FFN's input.

    Returns:
        (B, S, dim) in hidden_states' dtype.
    """
    parts = _parts(ffn)
    if (parts is None or args or kwargs or not _fused_here(hidden_states) or hidden_states.dtype != torch.bfloat16
            or torch.compiler.is_compiling() or (ffn.net[1].training and ffn.net[1].p > 0)):
        return type(ffn).forward(ffn, hidden_states, *args, **kwargs)
    from ..kernels.act_quant import gelu_quantize_fp8_rows_op

    first, second = parts
    shape = hidden_states.shape
    x = hidden_states.reshape(-1, shape[-1])
    xq, xs = quantize_activations(x)
    h = fp8_matmul(xq, xs, first.weight_fp8, first.weight_scale, x.dtype, first.bias)
    hq, hs = gelu_quantize_fp8_rows_op(h)
    y = fp8_matmul(hq, hs, second.weight_fp8, second.weight_scale, x.dtype, second.bias)
    return y.reshape(*shape[:-1], second.out_features)


def fuse_fp8_ffns(transformer: Any) -> int:
    """Give each block FFN of `transformer` whose two linears are `Fp8Linear` the fused forward (`fp8_ffn_forward`,
    on the instance; once). An FFN whose forward something else already replaced on the instance (a diffusers hook)
    is left as it is. Returns how many FFNs have the fused forward."""
    n = 0
    for block in getattr(transformer, "blocks", ()):
        ffn = getattr(block, "ffn", None)
        if ffn is None or _parts(ffn) is None:
            continue
        own = vars(ffn).get("forward")
        if own is None:
            ffn.forward = types.MethodType(fp8_ffn_forward, ffn)
        elif getattr(own, "__func__", None) is not fp8_ffn_forward:
            continue
        n += 1
    return n
