"""vsagen.attention.dense_search: the scorer's sums against a float64 reference on fresh random q, k, v (vsa in torch on
a grid with partial tiles, its output computed alone), its output is dense attention's, its refusals; the error matrix's
pooling; the suggestion rule: within the budget, optimal against brute force over every (dense steps, dense layers),
its extremes (budget 0: every erring entry dense; budget >= 1: nothing), bad input."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

import vsagen.kernels  # noqa: F401 - the Triton import (seconds) at collection, not inside the first vsa call
from conftest import make_qkv
from vsagen.attention.base import AttnContext
from vsagen.attention.dense_search import (DenseSuggestion, ErrorScorer, error_matrix, rel_l2, suggest_dense)
from vsagen.attention.vsa import VSAAttention, VSAOptions
from vsagen.layout import tile_layout
from vsagen.timing import Timer


def dense64(q, k, v):
    """float64 softmax(q k^T / sqrt(D)) v per head, (B, S, H, D)."""
    logits = torch.einsum("bshd,bthd->bhst", q.double(), k.double()) / math.sqrt(q.shape[-1])
    return torch.einsum("bhst,bthd->bshd", logits.softmax(-1), v.double())


# ------------------------------------------------------------------------------------------------- the scorer


def test_scorer_sums_match_a_float64_reference_and_it_returns_dense_attention():
    lay = tile_layout((3, 6, 6))  # partial edge tiles
    backend = VSAAttention(VSAOptions(sparsity=0.5, impl="torch"))
    scorer = ErrorScorer(backend)
    timer = Timer("cpu")
    want = {}
    for call, (step, layer) in enumerate([(0, 0), (0, 0), (1, 1)]):  # two calls of one (step, layer): pooled
        q, k, v = make_qkv(1, lay.num_tokens, 2, 16, seed=call)
        timer.step = step
        ctx = AttnContext(layout=lay, layer=layer, expert=None, timer=timer)
        out = scorer(q, k, v, ctx)
        ref = dense64(q, k, v)
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)  # the run goes on with dense attention
        alone = backend(q, k, v, ctx).double()
        d, r = want.get((step, "transformer", layer), (0.0, 0.0))
        want[(step, "transformer", layer)] = (d + float((alone - ref).square().sum()), r + float(ref.square().sum()))
    got = scorer.errors()
    assert list(got) == sorted(want) and scorer.calls == 3
    for key, (d, r) in want.items():
        assert got[key][0] == pytest.approx(d, rel=1e-4) and got[key][1] == pytest.approx(r, rel=1e-5)
        assert 0.05 < rel_l2(*got[key]) < 2  # vsa at 0.5 errs, and not wildly
    assert error_matrix(got, 2, 2)[0][0] == pytest.approx(math.sqrt(want[(0, "transformer", 0)][0]
                                                                    / want[(0, "transformer", 0)][1]), rel=1e-4)


def test_scorer_refuses_a_backend_with_knobs():
    with pytest.raises(ValueError, match="without dense_steps"):
        ErrorScorer(VSAAttention(VSAOptions(dense_steps=1)))


def test_error_matrix_pools_experts_and_leaves_unreached_entries_zero():
    sums = {(0, "transformer", 0): (1.0, 4.0), (0, "transformer_2", 0): (3.0, 12.0), (1, "transformer", 1): (0.0, 0.0)}
    assert error_matrix(sums, 2, 2) == [[0.5, 0.0], [0.0, 0.0]]
    assert rel_l2(1.0, 0.0) == math.inf and rel_l2(0.0, 0.0) == 0.0
    with pytest.raises(ValueError, match="outside"):
        error_matrix(sums, 1, 2)


# ------------------------------------------------------------------------------------------------- the rule


def brute_force(errors, budget):
    """The least dense-entry count of any (k, D) leaving at most budget x total."""
    steps, layers = len(errors), len(errors[0])
    total = math.fsum(e for row in errors for e in row)
    best = None
    for k in range(steps + 1):
        for n in range(layers + 1):
            for chosen in itertools.combinations(range(layers), n):
                left = math.fsum(errors[s][i] for s in range(k, steps) for i in range(layers) if i not in chosen)
                if left <= budget * total + 1e-12:
                    cost = k * layers + n * (steps - k)
                    best = cost if best is None else min(best, cost)
    return best


def residual_of(errors, sug: DenseSuggestion):
    return math.fsum(e for s, row in enumerate(errors) for i, e in enumerate(row) if not sug.is_dense(s, i))


@pytest.mark.parametrize("seed", range(40))
def test_the_suggestion_fits_the_budget_and_is_optimal(seed):
    rng = random.Random(seed)
    steps, layers = rng.randint(1, 4), rng.randint(1, 4)
    errors = [[rng.choice([0.0, rng.random(), 10 * rng.random()]) for _ in range(layers)] for _ in range(steps)]
    budget = rng.choice([0.0, 0.1, 0.3, 0.5, 0.9])
    sug = suggest_dense(errors, budget)
    assert residual_of(errors, sug) == pytest.approx(sug.residual, abs=1e-12)
    assert sug.residual <= budget * sug.total + 1e-12
    assert sug.dense_entries == sum(sug.is_dense(s, i) for s in range(steps) for i in range(layers))
    assert sug.dense_entries == brute_force(errors, budget)
    assert list(sug.dense_layers) == sorted(set(sug.dense_layers)) and 0 <= sug.dense_steps <= steps


def test_budget_zero_runs_every_erring_entry_dense_and_a_large_one_nothing():
    errors = [[0.3, 0.1, 0.0], [0.2, 0.4, 0.0]]
    zero = suggest_dense(errors, 0.0)
    assert zero.residual == 0.0 and all(zero.is_dense(s, i) for s in range(2) for i in range(2))
    assert 2 not in zero.dense_layers or zero.dense_steps == 2  # an exact layer never runs dense for itself
    for budget in (1.0, 5.0):
        none = suggest_dense(errors, budget)
        assert (none.dense_steps, none.dense_layers, none.dense_entries) == (0, (), 0)
        assert none.residual == pytest.approx(1.0) and none.dense_fraction == 0.0


def test_one_bad_layer_is_a_layer_and_early_errors_are_steps():
    assert suggest_dense([[0.1, 2.0, 0.1]] * 5, 0.5).dense_layers == (1,)
    early = suggest_dense([[2.0, 2.0, 2.0]] + [[0.1, 0.1, 0.1]] * 4, 0.5)
    assert (early.dense_steps, early.dense_layers) == (1, ())


@pytest.mark.parametrize("errors,budget", [([[0.1, -1.0]], 0.5), ([[0.1], [0.1, 0.2]], 0.5), ([[math.nan]], 0.5),
                                           ([[0.1]], -0.1), ([[0.1]], math.inf)])
def test_bad_input_raises(errors, budget):
    with pytest.raises(ValueError):
        suggest_dense(errors, budget)
