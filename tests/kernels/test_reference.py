"""Tests for vsagen.kernels.reference (the eager VSA oracle) against an independent masked dense attention.

The oracle here works in raster order: it computes each token's tile id from the grid with plain loops, pools
each tile with a loop, picks the top-k key tiles per (batch, head, query tile) by sorting, builds an S x S
boolean mask and runs softmax attention in float64. The library runs in tile order; its outputs are mapped back
to raster order with the (separately tested) `TileLayout` before comparing.
"""

from __future__ import annotations

import math

import pytest
import torch

import vsagen.kernels.reference as ref
from conftest import k2q_oracle, make_qkv, random_selection
from vsagen.layout import tile_layout

# fp32 inputs: the reference accumulates in fp32 over at most a few hundred keys (D = 16); the float64 oracle
# differs by float32 rounding only (~1e-7 relative per op), so 1e-5 leaves ample room while catching any
# real masking or pooling error (those are O(1e-1)).
FP32_ATOL = 1e-5
FP32_RTOL = 1e-5
# float64 inputs: both sides compute in float64; only summation order differs.
FP64_ATOL = 1e-12
FP64_RTOL = 1e-10
# bf16 inputs: output rounded to bf16 (2^-8 relative step) after fp32 softmax; relative L2 error bound.
BF16_REL_L2 = 2e-2
# The tile selection must be well separated for an independent oracle to pick the same tiles: minimum gap
# between the K-th and (K+1)-th tile score. The library pools in fp32 for fp32/bf16 inputs (noise ~1e-7) and in
# float64 for float64 inputs (noise ~1e-15).
SELECTION_MARGIN = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 1e-5}

# Grids with partial edge tiles and odd sizes (S never a multiple of 64), plus one of only full tiles.
GRIDS = [(3, 5, 7), (5, 6, 10), (6, 9, 5), (4, 8, 8)]
B, H, D = 2, 3, 16


# ---------------------------------------------------------------------------------------------- oracle


def raster_tile_ids(grid, tile=(4, 4, 4)) -> torch.Tensor:
    """Tile index of each raster token: tiles numbered t-tile, h-tile, w-tile row-major."""
    gt, gh, gw = grid
    ct, ch, cw = tile
    nh, nw = -(-gh // ch), -(-gw // cw)
    ids = []
    for t in range(gt):
        for h in range(gh):
            for w in range(gw):
                ids.append(((t // ct) * nh + h // ch) * nw + w // cw)
    return torch.tensor(ids, dtype=torch.int64)


def pool(x: torch.Tensor, tid: torch.Tensor, n_tiles: int) -> torch.Tensor:
    """(B, S, H, D) raster -> (B, n_tiles, H, D) float64 mean over each tile's real tokens."""
    return torch.stack([x[:, tid == j].double().mean(dim=1) for j in range(n_tiles)], dim=1)


def select(q: torch.Tensor, k: torch.Tensor, tid: torch.Tensor, n_tiles: int, top_k: int, check_margin=True):
    """Top-k key tiles per (b, h, query tile): (B, H, n, n) bool block map from sorted float64 tile scores."""
    qc, kc = pool(q, tid, n_tiles), pool(k, tid, n_tiles)
    scores = torch.einsum("bqhd,bkhd->bhqk", qc, kc) / math.sqrt(q.shape[-1])
    order = torch.argsort(scores, dim=-1, descending=True)
    if check_margin and top_k < n_tiles:
        srt = torch.sort(scores, dim=-1, descending=True).values
        gap = (srt[..., top_k - 1] - srt[..., top_k]).min().item()
        assert gap > SELECTION_MARGIN[q.dtype], f"test input has a near-tie in the tile selection (gap {gap})"
    blocks = torch.zeros_like(scores, dtype=torch.bool)
    blocks.scatter_(-1, order[..., :top_k], True)
    return blocks


def masked_attention(q, k, v, mask, scale=None):
    """Dense attention in float64 with a (B, H, S, S) bool mask; returns (B, S, H, D) out and (B, H, S) lse."""
    qd, kd, vd = (x.double() for x in (q, k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits = torch.einsum("bshd,bthd->bhst", qd, kd) * scale
    logits = logits.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    p = torch.exp(logits - lse.unsqueeze(-1))
    return torch.einsum("bhst,bthd->bshd", p, vd), lse


def oracle_vsa(q, k, v, grid, top_k, gate=None, scale=None):
    """Independent VSA in raster order, float64: (out, lse, blocks)."""
    tid = raster_tile_ids(grid)
    n = int(tid.max()) + 1
    blocks = select(q.detach(), k.detach(), tid, n, top_k)
    mask = blocks[:, :, tid][:, :, :, tid]  # (B, H, S, S): key token allowed for query token
    out, lse = masked_attention(q, k, v, mask, scale)
    if gate is not None:
        out = out + gate.double() * coarse_tokens(q, k, v, tid, n)
    return out, lse, blocks


def coarse_tokens(q, k, v, tid, n):
    """softmax(q_c k_c^T / sqrt(D)) v_c per tile, broadcast to each raster token: (B, S, H, D) float64."""
    qc, kc, vc = pool(q, tid, n), pool(k, tid, n), pool(v, tid, n)
    p = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", qc, kc) / math.sqrt(q.shape[-1]), dim=-1)
    coarse = torch.einsum("bhqk,bkhd->bqhd", p, vc)
    return coarse[:, tid]


def run_lib(q, k, v, lay, top_k, gate=None):
    """Library VSA on raster inputs: tile order in, raster order out. Returns (out raster, q2k)."""
    out, q2k = ref.vsa_reference(
        lay.to_tiles(q), lay.to_tiles(k), lay.to_tiles(v), token_tile=lay.token_tile, tile_sizes=lay.tile_sizes,
        slots=lay.slots, slot_valid=lay.slot_valid, top_k=top_k,
        gate=None if gate is None else lay.to_tiles(gate))
    return lay.to_raster(out), q2k


def tol(dtype):
    return dict(atol=FP64_ATOL, rtol=FP64_RTOL) if dtype == torch.float64 else dict(atol=FP32_ATOL, rtol=FP32_RTOL)


# ---------------------------------------------------------------------------------------------- top-k count


@pytest.mark.parametrize("sparsity,n,expected", [
    (0.875, 624, 78), (0.0, 624, 624), (0.0, 1, 1), (0.0, 7, 7), (0.5, 8, 4), (0.5, 7, 4),
    (0.9, 10, 1), (0.999, 10, 1), (0.99, 1, 1), (0.75, 1920, 480), (0.5, 1, 1),
    # float noise above an integer must not add a tile: (1 - 0.7) * 10 == 3.0000000000000004
    (0.7, 10, 3), (0.7, 100, 30), (0.95, 100, 5), (0.85, 20, 3), (0.9, 30, 3), (0.8, 100, 20),
])
def test_top_k_from_sparsity(sparsity, n, expected):
    assert ref.top_k_from_sparsity(sparsity, n) == expected


@pytest.mark.parametrize("sparsity", [1.0, 1.5, -0.1, float("nan")])
def test_top_k_from_sparsity_rejects_out_of_range(sparsity):
    with pytest.raises(ValueError, match="sparsity"):
        ref.top_k_from_sparsity(sparsity, 10)


def _fastvideo_top_k_before_1517(sparsity: float, tokens: int, tile_volume: int) -> int:
    """FastVideo's VSA count until its PR #1517 (fastvideo/attention/backends/video_sparse_attn.py:269-271
    @9f0ce517c): ceil((1 - sparsity) * (tokens / prod(VSA_TILE_SIZE)))."""
    return math.ceil((1 - sparsity) * (tokens / tile_volume))


@pytest.mark.parametrize("grid,tile,sparsity", [((21, 30, 52), (4, 4, 4), 0.8), ((21, 45, 80), (4, 4, 4), 0.9),
                                                ((21, 30, 52), (4, 4, 8), 0.875), ((5, 6, 10), (4, 4, 4), 0.5),
                                                ((8, 16, 16), (4, 4, 4), 0.9), ((3, 5, 7), (4, 4, 4), 0.0)])
def test_top_k_from_tokens_is_fastvideos_count_before_pr_1517(grid, tile, sparsity):
    """Partial cubes: fewer tiles than today's count (the 1.3B at 480x832x81: 103 of 624 vs 125); whole cubes
    (8x16x16): the same."""
    lay = tile_layout(grid, tile)
    got = ref.top_k_from_tokens(sparsity, lay.num_tokens, lay.tile_volume, lay.num_tiles)
    assert got == min(lay.num_tiles, max(1, _fastvideo_top_k_before_1517(sparsity, lay.num_tokens, lay.tile_volume)))
    today = ref.top_k_from_sparsity(sparsity, lay.num_tiles)
    assert got <= today
    if grid == (21, 30, 52) and tile == (4, 4, 4):
        assert (lay.num_tokens, lay.num_tiles, got, today) == (32760, 624, 103, 125)
    if grid == (8, 16, 16):
        assert got == today
    with pytest.raises(ValueError, match="cannot hold"):
        ref.top_k_from_tokens(sparsity, lay.num_tokens, lay.tile_volume, -(-lay.num_tokens // lay.tile_volume) - 1)


# ---------------------------------------------------------------------------------------------- pooling


@pytest.mark.parametrize("grid", [(3, 5, 7), (5, 6, 10)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_tile_mean_pool_uses_true_counts(grid, dtype):
    lay = tile_layout(grid)
    assert lay.num_full_tiles < lay.num_tiles  # partial tiles present
    x, _, _ = make_qkv(B, lay.num_tokens, H, D, dtype=dtype, seed=3)
    got = ref.tile_mean_pool(lay.to_tiles(x), lay.token_tile, lay.tile_sizes)
    assert got.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    want = pool(x, raster_tile_ids(grid), lay.num_tiles)
    torch.testing.assert_close(got.double(), want, **tol(dtype if dtype == torch.float64 else torch.float32))


def test_select_top_k_sorted_unique():
    g = torch.Generator().manual_seed(4)
    scores = torch.randn(2, 3, 9, 9, generator=g)
    q2k = ref.select_top_k(scores, 4)
    assert q2k.shape == (2, 3, 9, 4) and q2k.dtype == torch.int64
    assert bool((q2k[..., 1:] > q2k[..., :-1]).all())
    want = torch.sort(torch.argsort(scores, dim=-1, descending=True)[..., :4], dim=-1).values
    assert torch.equal(q2k, want)


# ---------------------------------------------------------------------------------------------- forward


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dense_when_top_k_is_all_tiles(grid, dtype):
    """K = n_tiles (sparsity 0) is plain dense attention."""
    lay = tile_layout(grid)
    q, k, v = make_qkv(B, lay.num_tokens, H, D, dtype=dtype, seed=5)
    top_k = ref.top_k_from_sparsity(0.0, lay.num_tiles)
    assert top_k == lay.num_tiles
    out, q2k = run_lib(q, k, v, lay, top_k)
    assert out.dtype == dtype
    assert torch.equal(q2k, torch.arange(lay.num_tiles).expand(B, H, lay.num_tiles, -1))
    want = torch.nn.functional.scaled_dot_product_attention(
        *(x.double().transpose(1, 2) for x in (q, k, v))).transpose(1, 2)
    torch.testing.assert_close(out.double(), want, **tol(dtype))


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sparse_matches_independent_masked_attention(grid, dtype):
    lay = tile_layout(grid)
    q, k, v = make_qkv(B, lay.num_tokens, H, D, dtype=dtype, seed=6)
    top_k = ref.top_k_from_sparsity(0.5, lay.num_tiles)
    assert 1 <= top_k < lay.num_tiles
    want, want_lse, blocks = oracle_vsa(q, k, v, grid, top_k)
    out, q2k = run_lib(q, k, v, lay, top_k)
    assert q2k.shape == (B, H, lay.num_tiles, top_k)
    got_blocks = torch.zeros_like(blocks).scatter_(-1, q2k, True)
    assert torch.equal(got_blocks, blocks)
    torch.testing.assert_close(out.double(), want, **tol(dtype))

    fine, lse = ref.block_sparse_attention_reference(lay.to_tiles(q), lay.to_tiles(k), lay.to_tiles(v), q2k,
                                                     lay.slots, lay.slot_valid)
    assert lse.shape == (B, H, lay.num_tokens)
    assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    torch.testing.assert_close(lay.to_raster(fine).double(), want, **tol(dtype))
    torch.testing.assert_close(lay.to_raster(lse, dim=2).double(), want_lse, **tol(dtype))


@pytest.mark.parametrize("top_k", [1, 2, 5])
def test_block_sparse_any_top_k_and_custom_scale(top_k):
    """K=1 (one key tile), custom scale, q2k rows given in descending order."""
    grid = (5, 6, 10)
    lay = tile_layout(grid)
    q, k, v = make_qkv(B, lay.num_tokens, H, D, dtype=torch.float64, seed=7)
    tid = raster_tile_ids(grid)
    blocks = select(q, k, tid, lay.num_tiles, top_k, check_margin=False)  # selection given, not computed
    q2k = torch.sort(torch.argsort(blocks.to(torch.int8), dim=-1, descending=True, stable=True)[..., :top_k],
                     dim=-1, descending=True).values
    want, want_lse = masked_attention(q, k, v, blocks[:, :, tid][:, :, :, tid], scale=0.3)
    out, lse = ref.block_sparse_attention_reference(lay.to_tiles(q), lay.to_tiles(k), lay.to_tiles(v), q2k,
                                                    lay.slots, lay.slot_valid, scale=0.3)
    torch.testing.assert_close(lay.to_raster(out), want, **tol(torch.float64))
    torch.testing.assert_close(lay.to_raster(lse, dim=2), want_lse, **tol(torch.float64))


@pytest.mark.parametrize("grid,top_k", [((1, 1, 1), 1), ((3, 5, 7), 1), ((5, 6, 10), 1), ((9, 2, 3), 2)])
@pytest.mark.parametrize("b", [1, 3])
def test_edge_cases(grid, top_k, b):
    """K=1, a single-token grid, S not a multiple of 64, batch > 1: every output element written and correct."""
    lay = tile_layout(grid)
    q, k, v = make_qkv(b, lay.num_tokens, H, D, dtype=torch.float32, seed=8)
    out, _ = run_lib(q, k, v, lay, top_k)
    assert out.shape == q.shape
    assert bool(torch.isfinite(out).all())
    want, _, _ = oracle_vsa(q, k, v, grid, top_k)
    torch.testing.assert_close(out.double(), want, **tol(torch.float32))
    if lay.num_tokens == 1:
        torch.testing.assert_close(out, v, **tol(torch.float32))  # one key: the output is its value


def test_rejects_bad_arguments():
    lay = tile_layout((3, 5, 7))
    q, k, v = make_qkv(1, lay.num_tokens, 2, 8, seed=9)
    kw = dict(token_tile=lay.token_tile, tile_sizes=lay.tile_sizes, slots=lay.slots, slot_valid=lay.slot_valid)
    for bad_k in (0, lay.num_tiles + 1):
        with pytest.raises(ValueError, match="top_k"):
            ref.vsa_reference(lay.to_tiles(q), lay.to_tiles(k), lay.to_tiles(v), top_k=bad_k, **kw)
    with pytest.raises(ValueError, match="shape"):
        ref.vsa_reference(q, k[:, :, :1], v, top_k=1, **kw)
    with pytest.raises(ValueError, match="shape"):
        ref.vsa_reference(q[0], k[0], v[0], top_k=1, **kw)


def test_bf16_error_bounded():
    grid = (5, 6, 10)
    lay = tile_layout(grid)
    q, k, v = make_qkv(B, lay.num_tokens, H, D, dtype=torch.bfloat16, seed=10)
    top_k = ref.top_k_from_sparsity(0.5, lay.num_tiles)
    out, _ = run_lib(q, k, v, lay, top_k)
    assert out.dtype == torch.bfloat16
    assert bool(torch.isfinite(out).all())
    want, _, _ = oracle_vsa(q, k, v, grid, top_k)  # float64 of the same bf16 values
    rel = (torch.linalg.vector_norm(out.double() - want) / torch.linalg.vector_norm(want)).item()
    assert rel < BF16_REL_L2


# ---------------------------------------------------------------------------------------------- gate


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("grid", [(3, 5, 7), (6, 9, 5)])
def test_gate_adds_coarse_branch(grid, dtype):
    lay = tile_layout(grid)
    q, k, v = make_qkv(B, lay.num_tokens, H, D, dtype=dtype, seed=11)
    gate = torch.rand(B, lay.num_tokens, H, D, generator=torch.Generator().manual_seed(12)).to(dtype) + 0.5
    top_k = ref.top_k_from_sparsity(0.5, lay.num_tiles)
    out, _ = run_lib(q, k, v, lay, top_k, gate=gate)
    fine, _ = run_lib(q, k, v, lay, top_k)
    tid = raster_tile_ids(grid)
    coarse = coarse_tokens(q, k, v, tid, lay.num_tiles)
    # The coarse branch is large enough that a missing or misplaced gate term would fail.
    assert coarse.abs().mean() > 1e-2
    torch.testing.assert_close(out.double(), fine.double() + gate.double() * coarse, **tol(dtype))
    want, _, _ = oracle_vsa(q, k, v, grid, top_k, gate=gate)
    torch.testing.assert_close(out.double(), want, **tol(dtype))


# ---------------------------------------------------------------------------------------------- backward


@pytest.mark.parametrize("grid", [(3, 5, 7), (5, 6, 10)])
@pytest.mark.parametrize("with_gate", [False, True])
def test_backward_matches_autograd_on_oracle(grid, with_gate):
    """Gradients of q, k, v (and gate) through the reference match autograd through the masked dense oracle."""
    lay = tile_layout(grid)
    top_k = ref.top_k_from_sparsity(0.5, lay.num_tiles)
    q, k, v = make_qkv(B, lay.num_tokens, H, D, dtype=torch.float64, seed=13, requires_grad=True)
    g = torch.Generator().manual_seed(14)
    gate = torch.randn(B, lay.num_tokens, H, D, generator=g, dtype=torch.float64).requires_grad_(with_gate)
    w = torch.randn(B, lay.num_tokens, H, D, generator=g, dtype=torch.float64)
    inputs = (q, k, v, gate) if with_gate else (q, k, v)

    out, _ = run_lib(q, k, v, lay, top_k, gate=gate if with_gate else None)
    got = torch.autograd.grad((out * w).sum(), inputs)
    want_out, _, _ = oracle_vsa(q, k, v, grid, top_k, gate=gate if with_gate else None)
    want = torch.autograd.grad((want_out * w).sum(), inputs)
    for name, a, b in zip("qkvg", got, want):
        assert bool(b.abs().max() > 0), name
        torch.testing.assert_close(a, b, **tol(torch.float64), msg=lambda m, n=name: f"grad {n}: {m}")


# ---------------------------------------------------------------------------------------------- chunking


@pytest.mark.parametrize("budget_tiles", [1, 3])
def test_chunking_does_not_change_result(monkeypatch, budget_tiles):
    """A tiny score budget forces several query-tile chunks (including a ragged last one)."""
    grid = (6, 9, 10)  # 2 x 3 x 3 = 18 tiles
    lay = tile_layout(grid)
    q, k, v = make_qkv(B, lay.num_tokens, H, D, dtype=torch.float64, seed=15)
    top_k = 4
    qt, kt, vt = lay.to_tiles(q), lay.to_tiles(k), lay.to_tiles(v)
    _, q2k = ref.vsa_reference(qt, kt, vt, token_tile=lay.token_tile, tile_sizes=lay.tile_sizes, slots=lay.slots,
                               slot_valid=lay.slot_valid, top_k=top_k)
    base_out, base_lse = ref.block_sparse_attention_reference(qt, kt, vt, q2k, lay.slots, lay.slot_valid)

    calls = []
    real_einsum = torch.einsum

    def counting_einsum(eq, *ops):
        if eq == "bcqd,bckd->bcqk":
            calls.append(ops[0].shape[1])
        return real_einsum(eq, *ops)

    vol = lay.tile_volume
    for chunk in (budget_tiles, budget_tiles + 4):  # 1, 5, 3, 7 query tiles per chunk; 5 and 7 leave a ragged end
        calls.clear()
        monkeypatch.setattr(ref, "_FINE_SCORE_ELEMENTS", B * H * vol * top_k * vol * chunk)
        monkeypatch.setattr(ref.torch, "einsum", counting_einsum)
        out, lse = ref.block_sparse_attention_reference(qt, kt, vt, q2k, lay.slots, lay.slot_valid)
        monkeypatch.setattr(ref.torch, "einsum", real_einsum)
        assert calls == [min(chunk, lay.num_tiles - s) for s in range(0, lay.num_tiles, chunk)]
        torch.testing.assert_close(out, base_out, **tol(torch.float64))
        torch.testing.assert_close(lse, base_lse, **tol(torch.float64))

    tid = raster_tile_ids(grid)
    blocks = torch.zeros(B, H, lay.num_tiles, lay.num_tiles, dtype=torch.bool).scatter_(-1, q2k, True)
    want, want_lse = masked_attention(q, k, v, blocks[:, :, tid][:, :, :, tid])
    torch.testing.assert_close(lay.to_raster(out), want, **tol(torch.float64))
    torch.testing.assert_close(lay.to_raster(lse, dim=2), want_lse, **tol(torch.float64))


# ------------------------------------------------------------------------------------- build_k2q (oracle)


@pytest.mark.parametrize("b,h,n,top_k", [(2, 3, 12, 5), (1, 2, 4, 4), (1, 1, 1, 1), (2, 1, 7, 1)])
def test_build_k2q_matches_loop_oracle(b, h, n, top_k):
    q2k, cnt = random_selection(b, h, n, top_k, seed=n + top_k, partial_counts=True)
    k2q, k2q_cnt = ref.build_k2q(q2k, cnt, n)
    assert k2q.shape == (b, h, n, n) and k2q.dtype == torch.int32 and k2q.stride(-1) == 1
    assert k2q_cnt.shape == (b, h, n) and k2q_cnt.dtype == torch.int32
    want = k2q_oracle(q2k, cnt, n)
    for bi in range(b):
        for hi in range(h):
            for j in range(n):
                c = int(k2q_cnt[bi, hi, j])
                assert k2q[bi, hi, j, :c].tolist() == want[bi][hi][j]
                assert bool((k2q[bi, hi, j, c:] == 0).all())  # documented filler
    again, again_cnt = ref.build_k2q(q2k.long(), cnt, n)  # int64 q2k accepted; bitwise deterministic
    assert torch.equal(again, k2q) and torch.equal(again_cnt, k2q_cnt)


def test_build_k2q_all_and_none_selected():
    n = 6
    q2k = torch.arange(n, dtype=torch.int32).expand(2, 2, n, n).contiguous()
    k2q, cnt = ref.build_k2q(q2k, torch.full((2, 2, n), n, dtype=torch.int32), n)
    assert torch.equal(k2q, q2k) and bool((cnt == n).all())
    k2q, cnt = ref.build_k2q(q2k, torch.zeros(2, 2, n, dtype=torch.int32), n)
    assert bool((cnt == 0).all()) and bool((k2q == 0).all())
