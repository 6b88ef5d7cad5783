"""vsagen.attention.vsa: options validation, VSA on CPU against `full` (sparsity 0) and the eager reference,
the gate, and VSA's timer regions."""

from __future__ import annotations

import pytest
import torch

import vsagen.kernels.reference as ref
from conftest import FP32_ATOL, FP32_RTOL, attn_ctx as ctx, make_qkv, softmax_attention_fp64
from vsagen.attention import make_backend
from vsagen.attention.full import FullAttention
from vsagen.attention.vsa import VSAAttention, VSAOptions
from vsagen.errors import BadInput
from vsagen.layout import tile_layout
from vsagen.timing import NullTimer, Timer

# VSA at sparsity 0 against `full` (both fp32, different kernels and summation orders): same bound.
DENSE_ATOL = 1e-5
DENSE_RTOL = 1e-5

B, H, D = 2, 3, 16


@pytest.mark.parametrize("sparsity", [1.0, -0.1, 2.0, float("nan")])
def test_vsa_rejects_bad_sparsity(sparsity):
    with pytest.raises(BadInput, match="sparsity"):
        VSAAttention(VSAOptions(sparsity))
    with pytest.raises(BadInput, match="sparsity"):
        make_backend("vsa", sparsity)


@pytest.mark.parametrize("grid", [(3, 5, 7), (5, 6, 10)])
def test_vsa_sparsity_zero_equals_full(grid):
    lay = tile_layout(grid)
    assert lay.num_full_tiles < lay.num_tiles
    q, k, v = make_qkv(B, lay.num_tokens, H, D, seed=21)
    qt, kt, vt = lay.to_tiles(q), lay.to_tiles(k), lay.to_tiles(v)
    got = VSAAttention(VSAOptions(0.0))(qt, kt, vt, ctx(lay, None, NullTimer()))
    want = FullAttention()(qt, kt, vt, ctx(None, None, NullTimer()))
    assert got.shape == qt.shape and got.dtype == qt.dtype
    torch.testing.assert_close(got, want, atol=DENSE_ATOL, rtol=DENSE_RTOL)
    torch.testing.assert_close(lay.to_raster(got).double(), softmax_attention_fp64(q, k, v),
                               atol=FP32_ATOL, rtol=FP32_RTOL)


@pytest.mark.parametrize("with_gate", [False, True])
@pytest.mark.parametrize("grid,sparsity,top_k", [((6, 9, 5), 0.5, 6), ((5, 6, 10), 0.75, 3),
                                                  ((5, 6, 10), 0.875, 2), ((9, 13, 5), 0.875, 3)])
def test_vsa_matches_reference(with_gate, grid, sparsity, top_k):
    """The backend is the eager reference at K = ceil((1 - sparsity) * n_tiles), gate included."""
    lay = tile_layout(grid)
    q, k, v = make_qkv(B, lay.num_tokens, H, D, seed=22)
    gate = torch.rand(B, lay.num_tokens, H, D, generator=torch.Generator().manual_seed(23)) if with_gate else None
    got = VSAAttention(VSAOptions(sparsity))(q, k, v, ctx(lay, gate, NullTimer()))
    want, _ = ref.vsa_reference(q, k, v, token_tile=lay.token_tile, tile_sizes=lay.tile_sizes, slots=lay.slots,
                                slot_valid=lay.slot_valid, top_k=top_k, gate=gate)
    torch.testing.assert_close(got, want, atol=FP32_ATOL, rtol=FP32_RTOL)


@pytest.mark.parametrize("with_gate", [False, True])
def test_vsa_records_timer_regions(with_gate):
    lay = tile_layout((3, 5, 7))
    q, k, v = make_qkv(1, lay.num_tokens, 2, 8, seed=24)
    gate = torch.rand_like(q) if with_gate else None
    timer = Timer("cpu")
    out = VSAAttention()(q, k, v, ctx(lay, gate, timer))
    assert bool(torch.isfinite(out).all())
    records = timer.finish()
    names = [name for name, _, _ in records]
    assert names.count("self_attention/coarse") == 1
    assert names.count("self_attention/fine") == 1
    assert all(sec >= 0.0 for _, _, sec in records)


def test_vsa_needs_layout():
    q, k, v = make_qkv(1, 8, 2, 8, seed=25)
    with pytest.raises(RuntimeError, match="TileLayout"):
        VSAAttention()(q, k, v, ctx(None, None, NullTimer()))


def test_vsa_check_accepts_cpu_and_cuda():
    vsa = VSAAttention()
    for dev in (torch.device("cpu"), torch.device("cuda")):
        for dtype in (torch.float32, torch.bfloat16):
            vsa.check(dev, dtype)
