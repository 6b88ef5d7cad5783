"""vsagen.kernels.act_quant under the Triton interpreter: the one-pass activation quantizers bit for bit against the
torch formulas of `vsagen.quant` (themselves checked against float64 in tests/quant), on rounding ties, zero and
-0.0 rows, partial blocks, a row stride, the two-walk FP8 path; their input checks; and, as custom ops under
torch.compile, one graph for every token count after the second (no recompile per M)."""

from __future__ import annotations

import pytest
import torch

from vsagen.kernels.act_quant import (BlockQuantConfig, RowQuantConfig, quantize_fp8_rows, quantize_fp8_rows_op,
                                      quantize_int8_blocks, quantize_int8_blocks_op)
from vsagen.quant import fp8_linear, int8_linear


def same_fp8(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype == torch.float8_e4m3fn and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def fp8_rows_input(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """Gaussian rows of varied magnitude, a zero row, a -0.0 row, and a row whose amax is 256 (x * 448 / 256 =
    1.75 x exactly) holding values that land on e4m3 rounding ties: 0.75 * 2^e -> 1.3125 * 2^e (between 1.25 and
    1.375), 2^-8 -> 7 * 2^-10 (between subnormals 3 and 4 * 2^-9)."""
    g = torch.Generator().manual_seed(rows * cols)
    x = torch.randn(rows, cols, generator=g) * torch.rand(rows, 1, generator=g) * 30
    x[1] = 0.0
    x[2] = -0.0
    ties = [s * 0.75 * 2.0 ** e for e in range(-6, 8) for s in (1, -1)]
    ties = torch.tensor([256.0] + ties + [2.0 ** -8, -2.0 ** -8])
    x[3, : min(cols, ties.numel())] = ties[:cols]
    return x.to(dtype)


@pytest.mark.parametrize("rows,cols,dtype,cfg", [
    (37, 45, torch.bfloat16, None),                         # one tile per row block, partial row block, odd K
    (9, 150, torch.float32, RowQuantConfig(4, 64, 4, 64)),  # K walked twice in 64-wide tiles, partial last tile
    (6, 33, torch.float16, RowQuantConfig(2, 16, 1, 16)),
])
def test_fp8_rows_bitwise_as_the_torch_formula(rows, cols, dtype, cfg):
    x = fp8_rows_input(rows, cols, dtype)
    q, scale = quantize_fp8_rows(x, cfg)
    want_q, want_scale = fp8_linear.quantize_fp8_rows(x)
    assert same_fp8(q, want_q) and torch.equal(scale, want_scale) and scale.shape == (rows, 1)
    assert q[2].view(torch.uint8).eq(0x80).all()  # -0.0 stays -0.0, as torch's cast keeps it
    if cols >= 31:  # the tie row: nearest even
        assert q[3, 1].float() == 1.25 * 2.0 ** -6 and q[3, 29].float() == 2.0 ** -7


def test_fp8_rows_reads_a_row_stride():
    wide = fp8_rows_input(20, 96, torch.bfloat16)
    x = wide[:, 8:72]  # (20, 64), row stride 96
    q, scale = quantize_fp8_rows(x)
    want_q, want_scale = fp8_linear.quantize_fp8_rows(x)
    assert same_fp8(q, want_q) and torch.equal(scale, want_scale) and q.is_contiguous()


@pytest.mark.parametrize("rows,cols,dtype,cfg", [
    (130, 300, torch.bfloat16, None),                   # the block in registers
    (129, 140, torch.float32, BlockQuantConfig(32, 4)),  # 32 rows at a time, walked twice
])
def test_int8_blocks_bitwise_as_the_torch_formula(rows, cols, dtype, cfg):
    """Partial blocks on both edges, a zero block (the 1e-8 floor), and a block whose amax is 128 (x * 128 / amax
    = x exactly) holding half-integers: ties to even, 127.5 saturating to 127."""
    g = torch.Generator().manual_seed(rows + cols)
    wide = torch.randn(rows, cols + 8, generator=g) * torch.rand(rows, 1, generator=g) * 20
    x = wide[:, 5: 5 + cols]  # a row stride
    x[:128, 128:256] = 0.0
    halves = torch.tensor([128.0, 2.5, -2.5, 3.5, -3.5, 0.5, -0.5, 127.5, -127.5, 126.5])
    x[0:128, 0:128] = (torch.rand(128, 128, generator=g) - 0.5) * 200
    x[0, :10] = halves
    x = x.to(dtype)
    q, scale = quantize_int8_blocks(x, cfg)
    want_q, want_scale = int8_linear.quantize_int8_blocks(x)
    assert torch.equal(q, want_q) and torch.equal(scale, want_scale)
    assert q[0, :10].tolist() == [127, 2, -2, 4, -4, 0, 0, 127, -128, 126]
    assert scale[0, 1] == torch.tensor(1e-8) / 128 and not q[:128, 128:256].any()


def test_bad_inputs_refused():
    with pytest.raises(ValueError, match="unit column stride"):
        quantize_fp8_rows(torch.randn(8, 16).t())
    with pytest.raises(ValueError, match="2-D bfloat16"):
        quantize_int8_blocks(torch.randn(2, 8, 16))
    with pytest.raises(ValueError, match="2-D bfloat16"):
        quantize_int8_blocks(torch.zeros(8, 16, dtype=torch.int32))


def test_custom_ops_compile_once_for_every_token_count():
    """Under torch.compile the quantizers are one node each; token counts 40, 70, 131, 300 give two graphs (the
    first static, then one with M symbolic), never one per M, and the same values as eager."""
    from torch._dynamo.utils import counters

    def both(x):
        return quantize_fp8_rows_op(x), quantize_int8_blocks_op(x)

    torch._dynamo.reset()
    compiled = torch.compile(both, backend="eager")
    before = counters["stats"]["unique_graphs"]
    for m in (40, 70, 131, 300):
        x = torch.randn(m, 136).to(torch.bfloat16)
        (q8, s8), (qi, si) = compiled(x)
        assert same_fp8(q8, quantize_fp8_rows(x)[0]) and torch.equal(qi, quantize_int8_blocks(x)[0])
        assert s8.shape == (m, 1) and si.shape == (-(-m // 128), 2)
    assert counters["stats"]["unique_graphs"] - before == 2


@pytest.mark.parametrize("rows,cols,cfg", [
    (37, 45, None),                         # one tile per row block, partial row block, odd K
    (9, 150, RowQuantConfig(4, 64, 4, 64)),  # K walked twice (GELU computed on each walk), partial last tile
])
def test_fp8_rows_with_gelu_is_gelu_in_bf16_then_the_formula(rows, cols, cfg):
    """`gelu=True`: the codes and scales of `quantize_fp8_rows(F.gelu(x, approximate="tanh"))` for a bfloat16 x (what
    the unfused FFN hands its second linear), up to the GELU's own rounding: its tanh (by exp here, tanhf in torch)
    can put a value on the neighbouring bfloat16, so a code may differ by one e4m3 step and a row's scale by one
    bfloat16 ulp of its amax. Against float64: the same error as the unfused path's."""
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(rows + cols)
    x = (torch.randn(rows, cols, generator=g) * torch.rand(rows, 1, generator=g) * 4 - 0.5).to(torch.bfloat16)
    x[1] = 0.0  # a zero row: GELU(0) = 0, the floor scale
    q, scale = quantize_fp8_rows(x, cfg, gelu=True)
    want_q, want_scale = fp8_linear.quantize_fp8_rows(F.gelu(x, approximate="tanh"))
    assert q.shape == x.shape and scale.shape == (rows, 1)
    assert torch.allclose(scale, want_scale, rtol=2.0 ** -7, atol=0)
    codes, want_codes = q.float(), want_q.float()
    assert (codes != want_codes).float().mean() <= 0.01
    assert ((codes - want_codes).abs() <= want_codes.abs().clamp_min(2.0 ** -6) * 2.0 ** -2).all()
    x64 = x.double()
    exact = 0.5 * x64 * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x64 + 0.044715 * x64 ** 3)))
    err = ((codes.double() * scale.double() - exact).norm() / exact.norm()).item()
    want_err = ((want_codes.double() * want_scale.double() - exact).norm() / exact.norm()).item()
    assert err <= 1.05 * want_err + 1e-6 and err < 3e-2


def test_fp8_rows_with_gelu_reads_bf16_only():
    with pytest.raises(ValueError, match="bfloat16 only"):
        quantize_fp8_rows(torch.randn(4, 32), gelu=True)
