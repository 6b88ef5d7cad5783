"""vsagen.attention.sparse_vdit_search (sparse-vdit's offline search): the scores against a float64 reference built
from the oracle masks (random q, k, v on a grid with partial tiles), the scoring backend's averages per step range and
layer, the choice rule (eps, lam extremes, against brute force), non-finite scores, step ranges."""

from __future__ import annotations

import pytest
import torch

from conftest import make_qkv, masked_dense
from vsagen.errors import BadInput, RunFailure
from vsagen.layout import tile_layout
from vsagen.attention.sparse_vdit import SparseVDiTAttention, SparseVDiTOptions
from vsagen.sparsity.patterns import default_catalog, dense, diagonal, oracle_block_map, skip, vertical_stripe
from vsagen.attention.sparse_vdit_search import (DEFAULT_EPS, DEFAULT_LAM, ModeScorer, ScoreOptions, choose_mode,
                                                mode_errors, patterns_from_scores, step_ranges)

# float64 scores of the torch impl against a float64 reference: only summation order differs.
SCORE_RTOL = 1e-9
STEPS = 2  # fewest denoising steps that still exercise the loop
TINY_ARCH = {"layers": 2, "heads": 2, "head_dim": 16, "in_channels": 16, "ffn_dim": 32, "patch_size": [1, 2, 2]}



def reference_errors(q, k, v, modes, lay):
    """(M, H) float64 relative MSEs from the oracle masks, computed directly."""
    n = lay.num_tiles
    full, _ = masked_dense(q, k, v, torch.ones(1, q.shape[2], n, n, dtype=torch.bool), lay)
    ms = full.square().mean(dim=(0, 1, 3))
    rows = []
    for p in modes:
        tiles = oracle_block_map(p, lay.tiles_per_dim)[None, None].expand(1, q.shape[2], n, n)
        out, _ = masked_dense(q, k, v, tiles, lay)
        rows.append((out - full).square().mean(dim=(0, 1, 3)) / ms)
    return torch.stack(rows), full


# ---------------------------------------------------------------------------------------------- scoring


@pytest.mark.parametrize("grid", [(9, 10, 13), (5, 6, 10)])
def test_mode_errors_match_the_oracle_masks(grid):
    lay = tile_layout(grid)
    q, k, v = make_qkv(2, lay.num_tokens, 3, 8, torch.float64, seed=1)
    modes = default_catalog()
    want, full = reference_errors(q, k, v, modes, lay)
    attend = SparseVDiTAttention(SparseVDiTOptions(impl="torch")).attend
    got = mode_errors(q, k, v, full, modes, lay, attend)
    assert got.shape == (len(modes), 3) and got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=SCORE_RTOL, atol=1e-15)
    names = [p.name for p in modes]
    assert got[names.index("dense")].eq(0).all() and got[names.index("skip")].eq(1).all()
    if grid == (9, 10, 13):  # tiles (3, 3, 4): every sparse mode misses some key tile, so errs
        assert (got[2:] > 0).all()


def test_a_mode_covering_every_tile_scores_exactly_zero():
    """multi-diagonal(2) on a 2 x 3 tile slab reaches every tile: it is dense there (err 0, not computed)."""
    lay = tile_layout((5, 6, 10))
    assert oracle_block_map(default_catalog()[3], lay.tiles_per_dim).all()
    q, k, v = make_qkv(1, lay.num_tokens, 2, 8, seed=2)
    calls = []

    def attend(*args):
        calls.append(args[3])
        return SparseVDiTAttention(SparseVDiTOptions(impl="torch")).attend(*args)

    full = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2)
    got = mode_errors(q, k, v, full, default_catalog(), lay, attend)
    assert got[3].eq(0).all()
    assert [m[0].name for m in calls] == ["diagonal", "vertical-stripe", "mixed"]  # dense, skip, full cover: none


def test_scorer_returns_full_attention_and_averages_per_range_and_layer():
    from vsagen.attention.base import AttnContext, ForwardState
    from vsagen.timing import NullTimer

    lay = tile_layout((9, 10, 13))
    scorer = ModeScorer(steps=4, ranges=2, options=ScoreOptions("torch"))
    qkvs = [make_qkv(1, lay.num_tokens, 2, 8, seed=s) for s in range(3)]
    for (q, k, v), step in zip(qkvs, (0, 1, 3)):
        ctx = AttnContext(layout=lay, layer=1, expert="transformer", timer=NullTimer(), forward=ForwardState(step=step))
        out = scorer(q, k, v, ctx)
        full = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)))
        torch.testing.assert_close(out, full.transpose(1, 2))
    assert scorer.counts == {(0, "transformer", 1): 2, (1, "transformer", 1): 1} and scorer.calls == 3
    want = [reference_errors(*x, scorer.modes, lay)[0] for x in qkvs]
    torch.testing.assert_close(scorer.mean_errors("transformer", 1, 0), (want[0] + want[1]) / 2, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(scorer.mean_errors("transformer", 1), sum(want) / 3, rtol=1e-4, atol=1e-6)
    assert scorer.mean_errors("transformer", 0) is None


# ---------------------------------------------------------------------------------------------- the choice


MODES = (dense(), skip(), diagonal(1), vertical_stripe(1, 4))
COSTS = [1.0, 0.0, 0.2, 0.3]


def test_eps_zero_keeps_dense_unless_a_mode_is_exact():
    errors = [0.0, 1.0, 0.01, 0.02]
    assert choose_mode(MODES, errors, COSTS, DEFAULT_LAM, 0.0) == 0
    assert choose_mode(MODES, [0.0, 1.0, 0.0, 0.02], COSTS, DEFAULT_LAM, 0.0) == 2  # exact and cheaper


def test_huge_lam_skips_and_zero_lam_takes_the_lowest_error():
    errors = [0.0, 1.0, 0.01, 0.02]
    assert choose_mode(MODES, errors, COSTS, 1e6, DEFAULT_EPS) == 1
    assert choose_mode(MODES, errors, COSTS, 1e6, 0.5) == 2  # skip (err 1) is over eps: the cheapest allowed one
    assert choose_mode(MODES, errors, COSTS, 0.0, 1e9) == 0  # dense's error is 0
    assert choose_mode(MODES[1:] + (dense(),), errors[1:] + [0.0], COSTS[1:] + [1.0], 0.0, 1e9) == 3
    assert choose_mode(MODES, [0.0, 1.0, 0.0, 0.0], COSTS, 0.0, 1e9) == 2  # ties at err 0: the cheaper one


def test_choose_mode_is_the_brute_force_minimum():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        errors = [0.0, 1.0, *torch.rand(2, generator=g).tolist()]
        lam, eps = float(torch.rand((), generator=g)) * 2, float(torch.rand((), generator=g))
        allowed = [i for i in range(4) if i == 0 or errors[i] <= eps]
        best = min(errors[i] + lam * COSTS[i] for i in allowed)
        got = choose_mode(MODES, errors, COSTS, lam, eps)
        assert got in allowed and errors[got] + lam * COSTS[got] == best


def test_non_finite_errors_write_nothing():
    scorer = ModeScorer(steps=1)
    scorer.architectures["transformer"] = TINY_ARCH
    for layer in range(2):
        scorer.sums[(0, "transformer", layer)] = torch.full((len(scorer.modes), 2), float("nan") if layer else 0.5)
        scorer.counts[(0, "transformer", layer)] = 1
    scorer.calls = 2
    with pytest.raises(RunFailure, match="transformer layer 1 gave NaN"):
        patterns_from_scores(scorer, model="tiny", experts=["transformer"], layers=2, heads=2, grid=(5, 6, 10),
                             height=96, width=160, frames=17, lam=0.5, eps=1.0, prompts=1)


def test_a_catalog_without_dense_is_refused():
    with pytest.raises(ValueError, match="dense"):
        choose_mode(MODES[1:], [1.0, 0.0, 0.0], COSTS[1:], 0.5, 1.0)
    with pytest.raises(ValueError, match="dense"):
        ModeScorer(MODES[1:])




@pytest.mark.parametrize("steps,n,want", [(4, 1, ((0, 4),)), (4, 3, ((0, 1), (1, 2), (2, 4))),
                                          (5, 5, tuple((i, i + 1) for i in range(5))), (50, 3, ((0, 16), (16, 33),
                                                                                                 (33, 50)))])
def test_step_ranges_are_equal_and_cover_the_steps(steps, n, want):
    assert step_ranges(steps, n) == want
    assert ModeScorer(steps=steps, ranges=n).range_of(steps - 1) == n - 1


@pytest.mark.parametrize("n", [0, 5])
def test_step_ranges_without_a_step_are_refused(n):
    with pytest.raises(BadInput, match="--ranges"):
        step_ranges(4, n)


