"""Tests for vsagen.kernels.coarse_triton: the coarse stage's launchers `pool_launch`, `scores_launch` and
`top_k_launch`, called directly, against float64 torch references.

The kernels run under the Triton interpreter (conftest sets TRITON_INTERPRET=1), in both launch configurations:
the interpreter's batched one, and the compiled path's (4-row pooling steps, head blocks, one score row per top-k
program) with `_interpreting` patched off. Inputs are fresh random tensors with B = 2 over hand-made tile
boundaries (tiles of 1 to 70 rows: partial 64-row steps and tiles longer than one step). The public functions,
their input checks and the custom op built on these launchers are tested in test_coarse.py.
"""

from __future__ import annotations

import pytest
import torch

import vsagen.kernels.coarse_triton as coarse_triton

B = 2
TILE_SIZES = [1, 64, 70, 5, 63, 33]
# Pooling: the kernel sums at most 70 exactly representable values in fp32 and divides by the count, so it differs
# from the float64 mean by rounding only: <= 70 * 2^-24 * max|x| + 2^-24 |mean| ~ 2e-5 for |x| <= 5 (randn), and
# ~1e-6 in practice. A missed row, a wrong count or a wrong head is O(1e-2) or more.
POOL_ATOL = 2e-5
U32 = 2.0 ** -24  # unit roundoff of fp32


@pytest.fixture(params=["interpreter", "compiled"])
def launch_config(request, monkeypatch):
    """Which launch configuration the launchers pick: the interpreter's, or the compiled path's."""
    if request.param == "compiled":
        monkeypatch.setattr(coarse_triton, "_interpreting", lambda: False)
    return request.param


def tile_mean_f64(x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """(B, S, H, D) -> (B, n_tiles, H, D) float64 means of consecutive row blocks of the given sizes."""
    tile = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    sums = torch.zeros(x.shape[0], len(sizes), *x.shape[2:], dtype=torch.float64).index_add_(1, tile, x.double())
    return sums / torch.tensor(sizes, dtype=torch.float64)[:, None, None]


@pytest.mark.parametrize("heads,head_dim", [(3, 40), (6, 16)])
@pytest.mark.parametrize("num_inputs", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pool_launch_matches_float64_means(heads, head_dim, num_inputs, dtype, launch_config):
    offsets = torch.tensor([0, *torch.tensor(TILE_SIZES).cumsum(0).tolist()], dtype=torch.int32)
    g = torch.Generator().manual_seed(100 * heads + 10 * num_inputs + head_dim)
    packed = torch.randn(B, int(offsets[-1]), 3, heads, head_dim, generator=g).to(dtype)  # strided (B, S, H, D)
    xs = list(packed.unbind(2))[:num_inputs]
    pooled = coarse_triton.pool_launch(xs, offsets)
    assert len(pooled) == num_inputs
    for x, x_c in zip(xs, pooled):
        assert x_c.shape == (B, len(TILE_SIZES), heads, head_dim) and x_c.dtype == torch.float32
        assert x_c.permute(0, 2, 1, 3).is_contiguous(), "a view of (B, H, n_tiles, D) storage"
        torch.testing.assert_close(x_c.double(), tile_mean_f64(x, TILE_SIZES), atol=POOL_ATOL, rtol=0)


# "bf16" in the interpreter's configuration only: the compiled path's bf16 tl.dot is wrong under the interpreter
# (the kernel's DOT_FP32 note).
@pytest.mark.parametrize("launch_config,precision", [("interpreter", "ieee"), ("interpreter", "tf32"),
                                                     ("interpreter", "bf16"), ("compiled", "ieee"),
                                                     ("compiled", "tf32")], indirect=["launch_config"])
@pytest.mark.parametrize("n_q,n_kv", [(70, 70), (5, 9)])
@pytest.mark.parametrize("head_dim", [16, 72])
def test_scores_launch_matches_float64_gemm(n_q, n_kv, head_dim, precision, launch_config):
    heads = 3
    g = torch.Generator().manual_seed(n_q * head_dim)
    # (B, H, n, D) storage seen as (B, n, H, D): the layout pool_launch hands over.
    q_c = torch.randn(B, heads, n_q, head_dim, generator=g).permute(0, 2, 1, 3)
    k_c = torch.randn(B, heads, n_kv, head_dim, generator=g).permute(0, 2, 1, 3)
    scores = coarse_triton.scores_launch(q_c, k_c, precision)
    assert scores.shape == (B, heads, n_q, n_kv) and scores.dtype == torch.float32 and scores.is_contiguous()
    # Oracle: float64 GEMM of the operands as the kernel multiplies them ("bf16": rounded to nearest bf16; the
    # interpreter computes every other precision in fp32).
    q64, k64 = (x.bfloat16().double() if precision == "bf16" else x.double() for x in (q_c, k_c))
    scale = head_dim ** -0.5
    expected = torch.einsum("bqhd,bkhd->bhqk", q64, k64) * scale
    # fp32 accumulation over D products, the scale multiply and the fp32 scale: elementwise rounding bound.
    bound = (head_dim + 2) * U32 * torch.einsum("bqhd,bkhd->bhqk", q64.abs(), k64.abs()) * scale
    err = (scores.double() - expected).abs()
    assert bool((err <= bound + 1e-12).all()), f"max error {float(err.max()):.3e} over the fp32 rounding bound"


@pytest.mark.parametrize("n_kv", [1, 17, 700])
def test_top_k_launch_matches_stable_sort(n_kv, launch_config):
    heads, n_q = 2, 3
    g = torch.Generator().manual_seed(n_kv)
    scores = torch.randn(B, heads, n_q, n_kv, generator=g)
    scores[:, :, 0] = torch.randint(-3, 3, (B, heads, n_kv), generator=g) / 2  # many exact ties at the K-th score
    scores[:, :, 1] = -scores[:, :, 1].abs()  # negatives only
    for top_k in sorted({1, max(1, n_kv // 8), max(1, n_kv - 1), n_kv}):
        q2k, q2k_cnt = coarse_triton.top_k_launch(scores, top_k)
        # Oracle: the K largest of the float64 scores, ties by lowest index, ascending.
        order = torch.sort(-scores.double(), dim=-1, stable=True).indices
        expected = torch.sort(order[..., :top_k], dim=-1).values
        assert q2k.dtype == torch.int32 and q2k.shape == (B, heads, n_q, top_k)
        assert torch.equal(q2k.long(), expected)
        assert q2k_cnt.dtype == torch.int32 and q2k_cnt.shape == (B, heads, n_q)
        assert bool((q2k_cnt == top_k).all())
