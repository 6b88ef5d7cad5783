"""Tests for vsagen.kernels.coarse (VSA coarse stage, Triton) against kernels/reference.py and independent oracles.

The kernels run under the Triton interpreter here (conftest sets TRITON_INTERPRET=1). The oracles: a float64
loop over each tile's rows for pooling, `reference.tile_mean_pool` / `tile_scores` / `select_top_k` for the
chain, and a stable sort (ties by lowest index, the kernel's documented rule) for the top-k on hand-made scores.
Compiled runs on the H200 (torch 2.11, triton 3.6) were checked with the same oracles outside this file. The
launchers of `coarse_triton` are tested directly in test_coarse_triton.py.
"""

from __future__ import annotations

import pytest
import torch

import vsagen.kernels.coarse as coarse
import vsagen.kernels.coarse_triton as coarse_triton
import vsagen.kernels.reference as ref
from conftest import make_qkv
from vsagen.layout import tile_layout

# Pooling: both sides sum at most 128 values in fp32 from exactly representable inputs (bf16/fp16 upcasts are
# exact), so they differ by summation order only: <= n * 2^-24 * mean|x| ~ 1e-5 worst case for n = 128 and
# |x| <= 5; a wrong count or a missed row is O(1e-2) or more.
POOL_ATOL = 1e-5
# Scores: fp32 dot products of <= 256 pooled values (|q_c|, |k_c| <~ 1) scaled by 1/sqrt(D); summation order
# only (the interpreter computes every tl.dot precision in fp32).
SCORE_ATOL = 1e-5
# Index equality with `reference.select_top_k` is asserted only for rows whose K-th and (K+1)-th reference scores
# are further apart than this (ten times the score noise); other rows must pick the same score values.
SELECTION_MARGIN = 10 * SCORE_ATOL

# Grids with partial edge tiles (S never a multiple of 64), a single partial tile, and only full tiles.
GRIDS = [(3, 5, 7), (5, 6, 10), (1, 1, 1), (4, 8, 8)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
B, H, D = 2, 3, 40


def layout_and_offsets(grid, tile=(4, 4, 4)):
    layout = tile_layout(grid, tile)
    return layout, layout.tile_offsets.to(torch.int32)


def loop_pool(x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """(B, S, H, D) tile order -> (B, n_tiles, H, D) float64 means, one slice per tile."""
    bounds = offsets.tolist()
    return torch.stack([x[:, a:b].double().mean(dim=1) for a, b in zip(bounds[:-1], bounds[1:])], dim=1)


def stable_top_k(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """Oracle of the kernel's rule: the K largest, ties by lowest index, then ascending (int64)."""
    order = torch.sort(-scores, dim=-1, stable=True).indices
    return torch.sort(order[..., :top_k], dim=-1).values


def assert_same_selection(q2k: torch.Tensor, scores: torch.Tensor, top_k: int) -> None:
    """q2k picks the top_k tiles of the oracle scores: same score values everywhere, same indices where the
    K-th and (K+1)-th oracle scores are well separated."""
    n_kv = scores.shape[-1]
    assert q2k.dtype == torch.int32 and q2k.shape == (*scores.shape[:-1], top_k)
    idx = q2k.long()
    assert bool(((idx >= 0) & (idx < n_kv)).all())
    assert bool((idx.diff(dim=-1) > 0).all()), "rows must be strictly ascending"
    picked = torch.gather(scores, -1, idx).sort(dim=-1).values
    best = torch.topk(scores, top_k, dim=-1).values.sort(dim=-1).values
    torch.testing.assert_close(picked, best, atol=SCORE_ATOL, rtol=0)
    expected = ref.select_top_k(scores, top_k)
    if top_k < n_kv:
        vals = torch.topk(scores, top_k + 1, dim=-1).values
        clear = (vals[..., top_k - 1] - vals[..., top_k]) > SELECTION_MARGIN
    else:
        clear = torch.ones(scores.shape[:-1], dtype=torch.bool)
    assert bool(clear.float().mean() > 0.5), "test inputs should mostly be free of near-ties"
    assert torch.equal(idx[clear], expected[clear])


# ---------------------------------------------------------------------------------------------- pooling


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_pool_qkv_matches_reference_and_loop(grid, dtype):
    layout, off = layout_and_offsets(grid)
    q, k, v = make_qkv(B, layout.num_tokens, H, D, dtype=dtype, seed=1)
    pooled = coarse.pool_qk(q, k, off, v)
    assert len(pooled) == 3
    for x, x_c in zip((q, k, v), pooled):
        assert x_c.shape == (B, layout.num_tiles, H, D) and x_c.dtype == torch.float32
        torch.testing.assert_close(x_c, ref.tile_mean_pool(x, layout.token_tile, layout.tile_sizes),
                                   atol=POOL_ATOL, rtol=0)
        torch.testing.assert_close(x_c.double(), loop_pool(x, off), atol=POOL_ATOL, rtol=0)


@pytest.mark.parametrize("head_dim", [16, 64, 200, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pool_head_dims(head_dim, dtype):
    layout, off = layout_and_offsets((5, 6, 10) if head_dim <= 64 else (2, 5, 6))
    q, k, _ = make_qkv(B, layout.num_tokens, H, head_dim, dtype=dtype, seed=2)
    q_c, k_c = coarse.pool_qk(q, k, off)
    torch.testing.assert_close(q_c.double(), loop_pool(q, off), atol=POOL_ATOL, rtol=0)
    torch.testing.assert_close(k_c.double(), loop_pool(k, off), atol=POOL_ATOL, rtol=0)


def test_pool_non_contiguous_inputs():
    layout, off = layout_and_offsets((5, 6, 10))
    s = layout.num_tokens
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(B, s, 3, H, D, generator=g).to(torch.bfloat16)  # packed projection output
    q, k, v = qkv.unbind(2)
    assert not q.is_contiguous()
    wide = torch.randn(B, H, s, D + 8, generator=g)[..., :D].transpose(1, 2)  # (B, S, H, D) view, padded rows
    assert wide.stride(-1) == 1 and not wide.is_contiguous()
    for x, x_c in zip((q, k, v), coarse.pool_qk(q, k, off, v)):
        torch.testing.assert_close(x_c.double(), loop_pool(x, off), atol=POOL_ATOL, rtol=0)
    torch.testing.assert_close(coarse.tile_mean_pool_triton(wide, off).double(), loop_pool(wide, off),
                               atol=POOL_ATOL, rtol=0)


def test_pool_tiles_longer_than_one_step():
    # (8, 4, 4) tiles hold up to 128 tokens: the kernel's row loop takes several steps per tile.
    layout, off = layout_and_offsets((9, 6, 7), tile=(8, 4, 4))
    assert int(layout.tile_sizes.max()) == 128 and int(layout.tile_sizes.min()) < 64
    q, k, _ = make_qkv(1, layout.num_tokens, H, D, seed=4)
    q_c, k_c = coarse.pool_qk(q, k, off)
    torch.testing.assert_close(q_c, ref.tile_mean_pool(q, layout.token_tile, layout.tile_sizes), atol=POOL_ATOL, rtol=0)
    torch.testing.assert_close(k_c.double(), loop_pool(k, off), atol=POOL_ATOL, rtol=0)


def test_pool_empty_tile_is_zero():
    # TileLayout never builds an empty tile; hand-made offsets with one must give 0 there, not NaN.
    off = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    x = make_qkv(1, 7, 2, 16, seed=5)[0]
    x_c = coarse.tile_mean_pool_triton(x, off)
    assert bool((x_c[:, 1] == 0).all())
    torch.testing.assert_close(x_c[:, [0, 2]].double(), loop_pool(x, torch.tensor([0, 3, 7])), atol=POOL_ATOL,
                               rtol=0)


# ---------------------------------------------------------------------------------------------- top-k


@pytest.mark.parametrize("n_kv", [1, 5, 16, 17, 100, 640, 700])
def test_top_k_tiles_matches_stable_sort(n_kv):
    g = torch.Generator().manual_seed(n_kv)
    scores = torch.randn(2, 2, 3, n_kv, generator=g)
    for top_k in sorted({1, max(1, n_kv // 8), max(1, n_kv - 1), n_kv}):
        q2k, q2k_cnt = coarse.top_k_tiles(scores, top_k)
        assert q2k.dtype == torch.int32 and q2k_cnt.dtype == torch.int32
        assert torch.equal(q2k.long(), stable_top_k(scores, top_k))
        assert bool((q2k_cnt == top_k).all())


def test_top_k_ties_signs_and_strides():
    scores = torch.zeros(1, 1, 6, 40)
    scores[0, 0, 0] = 1.0                                           # all tied: the lowest indices win
    scores[0, 0, 1] = torch.arange(40).remainder(4).float()          # many ties at the K-th value
    scores[0, 0, 2] = -torch.arange(40).float()                      # negatives only
    scores[0, 0, 3, ::2] = -0.0                                      # -0.0 and +0.0 are equal
    scores[0, 0, 4] = torch.randn(40, generator=torch.Generator().manual_seed(6))
    scores[0, 0, 4, [3, 30]] = float("inf")
    scores[0, 0, 4, [5, 6]] = float("-inf")
    scores[0, 0, 5] = torch.tensor([1e-30, -1e-30, 3e38, -3e38] * 10)  # extreme magnitudes
    for top_k in (1, 7, 13, 39):
        assert torch.equal(coarse.top_k_tiles(scores, top_k)[0].long(), stable_top_k(scores, top_k))
    # A transposed view: the kernel reads through strides.
    scores_t = torch.randn(2, 3, 30, 20, generator=torch.Generator().manual_seed(7)).transpose(-1, -2)
    assert torch.equal(coarse.top_k_tiles(scores_t, 6)[0].long(), stable_top_k(scores_t, 6))


# ---------------------------------------------------------------------------------------------- coarse stage


def reference_chain(q, k, layout, top_k, round_bf16=False):
    q_c = ref.tile_mean_pool(q, layout.token_tile, layout.tile_sizes)
    k_c = ref.tile_mean_pool(k, layout.token_tile, layout.tile_sizes)
    if round_bf16:
        q_c, k_c = q_c.bfloat16().float(), k_c.bfloat16().float()
    return q_c, k_c, ref.tile_scores(q_c, k_c)


@pytest.mark.parametrize("grid", GRIDS)
def test_coarse_stage_matches_reference(grid):
    layout, off = layout_and_offsets(grid)
    n = layout.num_tiles
    q, k, v = make_qkv(B, layout.num_tokens, H, D, seed=8)
    q_c, k_c, scores = reference_chain(q, k, layout, 1)
    for top_k in sorted({1, max(1, n // 3), n}):
        res = coarse.coarse_stage(q, k, off, top_k, v=v if top_k == 1 else None)
        assert res.q2k.shape == (B, H, n, top_k) and res.q2k_cnt.shape == (B, H, n)
        assert res.q2k_cnt.dtype == torch.int32 and bool((res.q2k_cnt == top_k).all())
        assert_same_selection(res.q2k, scores, top_k)
        torch.testing.assert_close(res.scores, scores, atol=SCORE_ATOL, rtol=0)
        torch.testing.assert_close(res.q_c, q_c, atol=POOL_ATOL, rtol=0)
        torch.testing.assert_close(res.k_c, k_c, atol=POOL_ATOL, rtol=0)
        if top_k == 1:
            torch.testing.assert_close(res.v_c, ref.tile_mean_pool(v, layout.token_tile, layout.tile_sizes),
                                       atol=POOL_ATOL, rtol=0)
        else:
            assert res.v_c is None
    # K = n_tiles selects every tile: the fine stage then equals dense attention.
    assert torch.equal(res.q2k.long(), torch.arange(n).expand(B, H, n, n))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_coarse_stage_half_precision_inputs(dtype):
    layout, off = layout_and_offsets((5, 6, 10))
    q, k, _ = make_qkv(B, layout.num_tokens, H, 64, dtype=dtype, seed=9)
    _, _, scores = reference_chain(q, k, layout, 4)
    res = coarse.coarse_stage(q, k, off, 4)
    assert_same_selection(res.q2k, scores, 4)
    torch.testing.assert_close(res.scores, scores, atol=SCORE_ATOL, rtol=0)


def test_coarse_stage_bf16_scores():
    # "bf16" rounds the pooled operands to bf16 and accumulates in fp32: the oracle does the same.
    layout, off = layout_and_offsets((5, 6, 10))
    q, k, _ = make_qkv(B, layout.num_tokens, H, D, seed=10)
    _, _, scores = reference_chain(q, k, layout, 3, round_bf16=True)
    res = coarse.coarse_stage(q, k, off, 3, score_precision="bf16")
    torch.testing.assert_close(res.scores, scores, atol=SCORE_ATOL, rtol=0)
    assert_same_selection(res.q2k, scores, 3)


def test_coarse_stage_gpu_launch_config(monkeypatch):
    # The compiled path's launch configuration (4-row pooling steps, head blocks, one score row per program)
    # run under the interpreter, so that the tests cover it and not only the interpreter's batched config.
    monkeypatch.setattr(coarse_triton, "_interpreting", lambda: False)
    layout, off = layout_and_offsets((3, 5, 7))
    q, k, _ = make_qkv(1, layout.num_tokens, 5, 24, seed=11)
    res = coarse.coarse_stage(q, k, off, 2)  # default "tf32" is computed in fp32 by the interpreter
    q_c, _, scores = reference_chain(q, k, layout, 2)
    torch.testing.assert_close(res.q_c, q_c, atol=POOL_ATOL, rtol=0)
    assert_same_selection(res.q2k, scores, 2)


def test_coarse_output_matches_reference():
    layout, off = layout_and_offsets((3, 5, 7))
    q, k, v = make_qkv(B, layout.num_tokens, H, D, seed=12)
    res = coarse.coarse_stage(q, k, off, 2, v=v)
    expected = ref.coarse_attention(res.q_c, res.k_c, res.v_c)
    torch.testing.assert_close(coarse.coarse_output(res.scores, res.v_c), expected, atol=POOL_ATOL, rtol=0)
    per_token = coarse.coarse_output(res.scores, res.v_c, layout.token_tile)
    torch.testing.assert_close(per_token, expected.index_select(1, layout.token_tile), atol=POOL_ATOL, rtol=0)


# ------------------------------------------------------------------------------------ custom op, autograd


@pytest.mark.parametrize("with_v", [False, True])
def test_custom_op_passes_opcheck(with_v):
    """`vsagen::coarse_stage`: schema, fake impl (shapes, dtypes and the pooled tiles' permuted strides) and
    dispatch agree with the real launch; no autograd formula is registered, so the autograd checks are left out."""
    layout, off = layout_and_offsets((3, 5, 7))
    q, k, v = make_qkv(1, layout.num_tokens, 2, 16, seed=14)
    torch.library.opcheck(coarse._coarse_op, (q, k, v if with_v else None, off, 2, "tf32"),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def test_coarse_stage_compiles_to_the_op_and_matches_eager():
    layout, off = layout_and_offsets((3, 5, 7))
    q, k, v = make_qkv(B, layout.num_tokens, H, D, seed=15)
    compiled = torch.compile(lambda q, k, v: coarse.coarse_stage(q, k, off, 3, v=v), fullgraph=True,
                             backend="aot_eager")
    got, want = compiled(q, k, v), coarse.coarse_stage(q, k, off, 3, v=v)
    for name in ("q2k", "q2k_cnt", "scores", "q_c", "k_c", "v_c"):
        a, b = getattr(got, name), getattr(want, name)
        assert torch.equal(a, b) and a.stride() == b.stride(), name


def test_coarse_stage_outputs_carry_no_history():
    """Inputs that require grad: the outputs are detached, eagerly and compiled (the op gets detached inputs, so
    its missing autograd formula is never needed)."""
    layout, off = layout_and_offsets((3, 5, 7))
    q, k, v = make_qkv(1, layout.num_tokens, 2, 16, seed=16, requires_grad=True)
    compiled = torch.compile(lambda q, k, v: coarse.coarse_stage(q, k, off, 2, v=v), fullgraph=True,
                             backend="aot_eager")
    for res in (coarse.coarse_stage(q, k, off, 2, v=v), compiled(q, k, v)):
        assert not any(t.requires_grad for t in (res.scores, res.q_c, res.k_c, res.v_c))


# ---------------------------------------------------------------------------------------------- errors


def test_bad_inputs_raise():
    layout, off = layout_and_offsets((3, 5, 7))
    q, k, v = make_qkv(1, layout.num_tokens, 2, 16, seed=13)
    n = layout.num_tiles
    cases = [
        lambda: coarse.coarse_stage(q, k, off, 0),
        lambda: coarse.coarse_stage(q, k, off, n + 1),
        lambda: coarse.coarse_stage(q, k, off.long(), 1),
        lambda: coarse.coarse_stage(q.double(), k.double(), off, 1),
        lambda: coarse.coarse_stage(q, k[:, :-1], off, 1),
        lambda: coarse.coarse_stage(q, k.half(), off, 1),
        lambda: coarse.coarse_stage(q, k, off, 1, score_precision="fp8"),
        lambda: coarse.pool_qk(q.transpose(-1, -2).contiguous().transpose(-1, -2), k, off),
        lambda: coarse.pool_qk(q, k, off[None]),
        lambda: coarse.tile_mean_pool_triton(torch.randn(1, layout.num_tokens, 1, 264), off),
        lambda: coarse.tile_scores_triton(torch.randn(1, 4, 2, 16), torch.randn(1, 4, 3, 16)),
        lambda: coarse.tile_scores_triton(torch.randn(1, 4, 2, 16).half(), torch.randn(1, 4, 2, 16).half()),
        lambda: coarse.top_k_tiles(torch.randn(1, 1, 4, 4).double(), 2),
        lambda: coarse.top_k_tiles(torch.randn(1, 1, 4, 4), 5),
        lambda: coarse.coarse_output(torch.randn(1, 2, 4, 4), torch.randn(1, 5, 2, 16)),
    ]
    for i, case in enumerate(cases):
        with pytest.raises(ValueError):
            case()
            pytest.fail(f"case {i} did not raise")
