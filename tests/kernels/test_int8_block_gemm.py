"""vsagen.kernels.int8_block_gemm under the Triton interpreter: the block-scaled int8 GEMM against a float64
re-enactment of TurboDiffusion's formula and against the CPU path of `vsagen.quant.int8_linear`, for partial tiles
in M, N and K, tiles narrower and wider than the 128-row scale blocks, with and without bias, and its input checks."""

from __future__ import annotations

import pytest
import torch

from conftest import block_gemm_reference
from vsagen.kernels.int8_block_gemm import GemmConfig, int8_block_gemm
from vsagen.quant.int8_linear import _cpu_block_matmul, quantize_int8_blocks


@pytest.mark.parametrize("m,n,k,cfg", [
    (70, 40, 300, GemmConfig(32, 32, 2, 4, 1)),     # partial tiles everywhere, tiles narrower than a scale block
    (136, 140, 150, GemmConfig(128, 256, 1, 4, 1)),  # a tile wider than a scale block: scales gathered per column
    (20, 48, 40, GemmConfig(32, 64, 4, 4, 1)),      # K below one block
])
def test_gemm_matches_float64_and_the_cpu_path(m, n, k, cfg):
    torch.manual_seed(m * n)
    xq, xs = quantize_int8_blocks(torch.randn(m, k) * torch.rand(m, 1))
    wq, ws = quantize_int8_blocks(torch.randn(n, k) * 0.1)
    got = int8_block_gemm(xq, xs, wq, ws, torch.float32, config=cfg)
    ref, mag = block_gemm_reference(xq, xs, wq, ws)
    assert got.shape == (m, n) and got.dtype == torch.float32
    assert bool(((got.double() - ref).abs() <= 4e-7 * mag + 1e-30).all())
    assert torch.allclose(got, _cpu_block_matmul(xq, xs, wq, ws), rtol=1e-6, atol=1e-6 * float(mag.max()))


def test_scalar_scales_same_bits_as_gathered():
    """Tiles inside one 128 x 128 scale block (BLOCK_M, BLOCK_N dividing 128) load one scale pair per K step; wider
    tiles gather them per row and column: the same products, the same bits."""
    torch.manual_seed(4)
    xq, xs = quantize_int8_blocks(torch.randn(150, 300) * torch.rand(150, 1))
    wq, ws = quantize_int8_blocks(torch.randn(260, 300) * 0.1)
    scalar = int8_block_gemm(xq, xs, wq, ws, torch.float32, config=GemmConfig(64, 128, 2, 4, 1))
    gathered = int8_block_gemm(xq, xs, wq, ws, torch.float32, config=GemmConfig(64, 256, 2, 4, 1))
    assert torch.equal(scalar, gathered)


def truncated_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """float32 -> bfloat16 by dropping the low 16 bits: what the Triton interpreter's cast does (triton 3.9; a GPU
    rounds to nearest even)."""
    return (x.float().view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)


def test_bias_added_after_the_cast():
    """Their order: the float32 sum cast to the output dtype, then `+ bias` in that dtype (one more rounding)."""
    torch.manual_seed(1)
    xq, xs = quantize_int8_blocks(torch.randn(40, 160))
    wq, ws = quantize_int8_blocks(torch.randn(24, 160))
    bias = torch.randn(24).to(torch.bfloat16)
    cfg = GemmConfig(64, 32, 2, 4, 1)
    acc = int8_block_gemm(xq, xs, wq, ws, torch.float32, None, cfg)
    plain = int8_block_gemm(xq, xs, wq, ws, torch.bfloat16, None, cfg)
    got = int8_block_gemm(xq, xs, wq, ws, torch.bfloat16, bias, cfg)
    assert got.dtype == torch.bfloat16
    assert torch.equal(plain, truncated_to_bf16(acc))
    assert torch.equal(got, truncated_to_bf16(plain.float() + bias.float()))


def test_bad_inputs_refused():
    xq = torch.zeros(20, 64, dtype=torch.int8)
    with pytest.raises(ValueError, match="expected int8"):
        int8_block_gemm(xq.float(), torch.ones(1, 1), xq, torch.ones(1, 1), torch.float32)
    with pytest.raises(ValueError, match="do not cover"):
        int8_block_gemm(xq, torch.ones(2, 1), xq, torch.ones(1, 1), torch.float32)
    with pytest.raises(ValueError, match="unit column stride"):
        int8_block_gemm(xq.t(), torch.ones(1, 1), torch.zeros(20, 20, dtype=torch.int8), torch.ones(1, 1),
                        torch.float32)


def test_custom_op_is_the_launch_and_traces_whole():
    """`vsagen::int8_block_gemm` (what CUDA runs): the launcher's output, its fake tensor's shape and dtype, and one
    node in a fullgraph trace (no graph break at the Triton launch)."""
    from vsagen.kernels.int8_block_gemm import int8_block_gemm_op

    torch.manual_seed(2)
    xq, xs = quantize_int8_blocks(torch.randn(40, 136))
    wq, ws = quantize_int8_blocks(torch.randn(24, 136))
    bias = torch.randn(24)
    want = int8_block_gemm(xq, xs, wq, ws, torch.float32, bias)
    assert torch.equal(int8_block_gemm_op(xq, xs, wq, ws, torch.float32, bias), want)
    traced = torch.compile(lambda *a: int8_block_gemm_op(*a, torch.float32, bias), backend="eager", fullgraph=True)
    assert torch.equal(traced(xq, xs, wq, ws), want)
    torch.library.opcheck(int8_block_gemm_op, (xq, xs, wq, ws, torch.bfloat16, None),
                          test_utils=("test_schema", "test_faketensor"))
