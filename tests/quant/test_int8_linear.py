"""vsagen.quant.int8_linear: TurboDiffusion's block quantizer and block-scaled int8 GEMM against float64
re-enactments of their formulas (random inputs, partial blocks, batch > 1, 3-D inputs), the CPU GEMM's two exact
paths (`torch._int_mm` and float32) against each other, and the error of the W8A8 linear against the unquantized
one, stated as a bound."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from conftest import block_gemm_reference
from vsagen.quant.int8_linear import (Int8Linear, _cpu_block_matmul, int8_block_matmul, quantize_activations,
                                      quantize_int8_blocks)


def quantize_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Their quantizer in float64, element by element of its formula: amax per 128 x 128 block (floored at 1e-8),
    q = round-half-even(x * 128 / amax) saturated to [-128, 127], scale = amax / 128. Also returns the distance
    of each x * 128 / amax from a rounding tie (where float32's single rounding of the product may go the other
    way)."""
    xd = x.double()
    rows, cols = xd.shape
    amax = torch.empty(math.ceil(rows / 128), math.ceil(cols / 128), dtype=torch.float64)
    q = torch.empty(rows, cols, dtype=torch.float64)
    tie = torch.empty(rows, cols, dtype=torch.float64)
    for i in range(amax.shape[0]):
        for j in range(amax.shape[1]):
            blk = xd[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            a = max(float(blk.abs().max()), 1e-8)
            amax[i, j] = a
            y = blk * 128.0 / a
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = torch.round(y).clamp(-128, 127)
            tie[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = ((y - y.floor()) - 0.5).abs()
    return q, amax / 128.0, tie


@pytest.mark.parametrize("rows,cols,dtype", [(200, 300, torch.float32), (128, 256, torch.bfloat16),
                                             (37, 45, torch.float16)])
def test_quantizer_matches_their_formula(rows, cols, dtype):
    torch.manual_seed(rows)
    x = (torch.randn(rows, cols) * torch.rand(rows, 1) * 3).to(dtype)
    q, scale = quantize_int8_blocks(x)
    want_q, want_scale, tie = quantize_reference(x.float())
    assert q.dtype == torch.int8 and q.shape == x.shape and scale.dtype == torch.float32
    assert torch.equal(scale.double(), want_scale.float().double())  # amax exact, / 128 exact
    off = (q.double() - want_q).abs()
    assert off.max() <= 1 and bool((off[off > 0] >= 0).all())
    assert bool((tie[off > 0] < 1e-5).all())  # a difference only at a rounding tie, by one
    assert (off > 0).float().mean() < 1e-3


def test_quantizer_saturates_and_floors():
    x = torch.randn(130, 140)
    x[5, 7] = 50.0  # the block's amax, positive: 128 saturates to 127
    x[129, 139] = -9.0  # a partial block's amax, negative: -128 is in range
    x[:128, 128:] = 0.0  # an all-zero block: amax floored at 1e-8
    q, scale = quantize_int8_blocks(x)
    assert q[5, 7] == 127 and q[129, 139] == -128
    assert scale[0, 0] == torch.tensor(50.0 / 128) and scale[1, 1] == torch.tensor(9.0 / 128)
    assert scale[0, 1] == torch.tensor(1e-8 / 128) and not q[:128, 128:].any()


@pytest.mark.parametrize("m,n,k", [(40, 24, 300), (200, 136, 256), (9, 20, 130)])
def test_cpu_gemm_matches_float64(m, n, k):
    torch.manual_seed(m + n)
    xq, xs = quantize_int8_blocks(torch.randn(m, k))
    wq, ws = quantize_int8_blocks(torch.randn(n, k) * 0.05)
    got = _cpu_block_matmul(xq, xs, wq, ws)
    ref, mag = block_gemm_reference(xq, xs, wq, ws)
    assert got.dtype == torch.float32
    assert bool(((got.double() - ref).abs() <= 4e-7 * mag + 1e-30).all())


def test_int_mm_and_float32_paths_agree_bitwise(monkeypatch):
    """`torch._int_mm` (M > 16, N % 8 == 0) and the float32 product give the same integers, so the same output."""
    torch.manual_seed(3)
    xq, xs = quantize_int8_blocks(torch.randn(48, 264))  # K blocks of 128, 128 and 8
    wq, ws = quantize_int8_blocks(torch.randn(32, 264))
    calls = []
    real = torch._int_mm
    monkeypatch.setattr(torch, "_int_mm", lambda a, b: calls.append(tuple(a.shape)) or real(a, b))
    with_int_mm = _cpu_block_matmul(xq, xs, wq, ws)
    assert calls == [(48, 128), (48, 128), (48, 8)]
    float_path = _cpu_block_matmul(xq[:16].contiguous(), xs, wq, ws)  # 16 rows: the float32 product
    assert len(calls) == 3
    assert torch.equal(float_path, with_int_mm[:16])


@pytest.mark.parametrize("shape,bias", [((2, 70, 96), True), ((33, 160), False), ((3, 5, 17, 64), True)])
def test_int8_linear_forward_against_float64(shape, bias):
    """The module: activations quantized per 128 x 128 block of the flattened (tokens, in) matrix, GEMM, bias added
    after the cast (their order), output in the input's dtype."""
    torch.manual_seed(len(shape))
    lin = nn.Linear(shape[-1], 48, bias=bias)
    layer = Int8Linear.from_linear(lin)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(*shape).to(dtype)
        got = layer(x)
        assert got.shape == (*shape[:-1], 48) and got.dtype == dtype
        xq, xs = quantize_int8_blocks(x.reshape(-1, shape[-1]))
        ref, mag = block_gemm_reference(xq, xs, layer.int8_weight, layer.scale)
        y = ref.to(dtype).double() if dtype != torch.float32 else ref
        if bias:
            y = y + lin.bias.detach().to(dtype).double()
        ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -22
        tol = ulp * (y.abs() + mag) + 1e-6 * mag
        assert bool(((got.reshape(y.shape).double() - y).abs() <= tol).all())


def test_int8_linear_error_against_the_unquantized_linear():
    """W8A8 int8 with 128 x 128 block scales on Gaussian inputs and weights: within 2% relative L2 of the float64
    linear (measured 0.98% here, bf16 0.29%: each operand's rounding is uniform over a step of about
    4.5 sigma / 128)."""
    torch.manual_seed(11)
    lin = nn.Linear(384, 200).double()
    x = torch.randn(2, 150, 384, dtype=torch.float64)
    ref = lin(x).detach()
    got = Int8Linear.from_linear(lin.float())(x.float()).double()
    err = float((got - ref).norm() / ref.norm())
    assert 3e-3 < err < 2e-2


def test_weight_scale_keeps_float32_through_to_dtype():
    torch.manual_seed(2)
    lin = nn.Linear(64, 200)
    layer = Int8Linear.from_linear(lin)
    scale = layer.scale.clone()
    layer.to(torch.bfloat16)
    assert layer.scale.dtype == torch.float32 and torch.equal(layer.scale, scale)
    assert layer.int8_weight.dtype == torch.int8 and layer.bias.dtype == torch.bfloat16
    w = layer.dequantized_weight(torch.float64)
    step = scale.repeat_interleave(128, 0)[:200, :1].double()  # one column block: K = 64
    off = (w - lin.weight.double()).abs().detach() / step
    saturated = lin.weight.detach().double() > step * 127.5  # up to +amax: 128 saturates to 127, up to a step off
    assert bool((off[~saturated] <= 0.5 + 1e-6).all()) and bool((off[saturated] <= 1 + 1e-6).all())
    assert saturated.sum() >= 1


def test_bad_weights_refused():
    with pytest.raises(ValueError, match="one scale per 128x128 block"):
        Int8Linear(torch.zeros(200, 64, dtype=torch.int8), torch.ones(1, 1), None)
    with pytest.raises(ValueError, match="expected int8"):
        Int8Linear(torch.zeros(20, 64), torch.ones(1, 1), None)


def test_cpu_dispatch_is_the_cpu_path():
    torch.manual_seed(5)
    xq, xs = quantize_activations(torch.randn(20, 40))
    wq, ws = quantize_int8_blocks(torch.randn(24, 40))
    b = torch.randn(24)
    got = int8_block_matmul(xq, xs, wq, ws, torch.float32, b)
    assert torch.equal(got, _cpu_block_matmul(xq, xs, wq, ws) + b)


def test_traces_whole_under_torch_compile():
    """The layer (quantizer, CPU GEMM, bias) traces as one graph (`--compile`'s fullgraph blocks), same values."""
    torch.manual_seed(6)
    layer = Int8Linear.from_linear(nn.Linear(160, 48))
    x = torch.randn(2, 20, 160)
    assert torch.equal(torch.compile(layer, backend="eager", fullgraph=True)(x), layer(x))
