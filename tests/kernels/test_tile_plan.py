"""Tests for kernels/tile_plan.py (the packed visiting order of selected tiles) and for the block-sparse kernels'
packed loops on tiles of every size from 1 to 64 tokens, under the Triton interpreter on CPU."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

import vsagen.kernels.bsa_primitives as primitives
from conftest import (FP32_REL_L2, NAMES, UNUSED, assert_all_finite, kernel_fwd_bwd, make_qkv, masked_dense,
                      random_selection, rel_l2, tile_map)
from vsagen.kernels.reference import tile_plan_reference
from vsagen.kernels.tile_plan import PLAN_WIDTH, SEG, TILE, build_tile_plan
from vsagen.kernels.tuning import kernel_tuning


def odd_tiles(n_tiles: int, seed: int, full_share: float = 0.4) -> types.SimpleNamespace:
    """A tile layout stand-in with tiles of random sizes in [1, 64] (about full_share of them full): tile_offsets
    (n + 1,) int32 and token_tile (S,) long, as `masked_dense` and `kernel_fwd_bwd` read them."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, TILE, (n_tiles,), generator=g)
    lengths[torch.rand(n_tiles, generator=g) < full_share] = TILE
    lengths[0], lengths[-1] = 1, SEG + 1  # a one-token tile; a tile one past a group
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    return types.SimpleNamespace(tile_offsets=offsets.to(torch.int32),
                                 token_tile=torch.repeat_interleave(torch.arange(n_tiles), lengths))


def decode(plan: torch.Tensor, plan_cnt: torch.Tensor) -> tuple[list[int], list[list[int]]]:
    """Rows a kernel visits for one plan row: the full tiles' first rows, and the token rows of each pack."""
    nf, npk, ng, _ = plan_cnt.tolist()
    full = plan[:nf].tolist()
    packs = []
    for p in range(npk):
        rows = []
        for g in range(p * TILE // SEG, (p + 1) * TILE // SEG):
            if g < ng:
                e = int(plan[nf + g])
                rows += [(e >> 4) + i for i in range(e & 15)]
        packs.append(rows)
    return full, packs


@pytest.mark.parametrize("b,h,n,top_k,seed", [(2, 2, 21, 7, 1), (1, 3, 12, 12, 2), (1, 1, 9, 1, 3)])
def test_plan_matches_reference_and_visits_each_selected_token_once(b, h, n, top_k, seed):
    lay = odd_tiles(n, seed)
    q2k, cnt = random_selection(b, h, n, top_k, seed=seed, partial_counts=True)
    plan, plan_cnt = build_tile_plan(q2k, cnt, lay.tile_offsets)
    want, want_cnt = tile_plan_reference(q2k, cnt, lay.tile_offsets)
    assert plan.shape == want.shape == (b, h, n, PLAN_WIDTH * top_k)
    assert torch.equal(plan_cnt, want_cnt)
    off = lay.tile_offsets.tolist()
    for bi in range(b):
        for hi in range(h):
            for r in range(n):
                nf, npk, ng, _ = plan_cnt[bi, hi, r].tolist()
                assert torch.equal(plan[bi, hi, r, : nf + ng], want[bi, hi, r, : nf + ng])
                full, packs = decode(plan[bi, hi, r], plan_cnt[bi, hi, r])
                visited = [t for s in full for t in range(s, s + TILE)] + [t for rows in packs for t in rows]
                tiles = q2k[bi, hi, r, : cnt[bi, hi, r]].tolist()
                selected = [t for j in tiles for t in range(off[j], off[j + 1])]
                assert sorted(visited) == sorted(selected)  # every selected token once, nothing else
                assert all(0 < len(rows) <= TILE for rows in packs)
                lengths = [off[j + 1] - off[j] for j in tiles]
                assert nf == lengths.count(TILE)
                assert ng == sum(-(-n // SEG) for n in lengths if n < TILE)  # each partial tile in whole groups
                assert npk == -(-ng * SEG // TILE)  # packed densely: only the last pack is short of groups


def test_plan_of_empty_and_all_full_rows():
    lay = types.SimpleNamespace(tile_offsets=torch.arange(0, 5 * TILE + 1, TILE, dtype=torch.int32))
    q2k = torch.tensor([[[[0, 2, 4], [UNUSED, UNUSED, UNUSED]]]], dtype=torch.int32)
    cnt = torch.tensor([[[3, 0]]], dtype=torch.int32)
    plan, plan_cnt = build_tile_plan(q2k, cnt, lay.tile_offsets)
    assert plan_cnt.tolist() == [[[[3, 0, 0, 0], [0, 0, 0, 0]]]]
    assert plan[0, 0, 0, :3].tolist() == [0, 2 * TILE, 4 * TILE]  # full tiles: their first rows, list order


def test_plan_rejects_bad_index_tensors():
    off = torch.tensor([0, 64], dtype=torch.int32)
    with pytest.raises(ValueError, match="int32"):
        build_tile_plan(torch.zeros(1, 1, 1, 1, dtype=torch.int64), torch.ones(1, 1, 1, dtype=torch.int32), off)
    strided = torch.zeros(1, 1, 1, 4, dtype=torch.int32)[..., ::2]
    with pytest.raises(ValueError, match="unit stride"):
        build_tile_plan(strided, torch.ones(1, 1, 1, dtype=torch.int32), off)


@pytest.mark.parametrize("pack", [True, False])
def test_kernels_on_tiles_of_every_size(pack):
    """fp32 forward and backward against float64 masked attention on 1- to 64-token tiles (packs spanning up to
    eight tiles, groups with holes: checked below), batch 2, short and empty rows; and the loops without tile plans
    (pack_partial_tiles off: one selected tile per iteration). fp32 takes pointer loads; the bf16 / fp16 tests of
    test_block_sparse_attn.py run the packed loops with TMA loads too."""
    tuning = dataclasses.replace(kernel_tuning(torch.device("cpu"), 16), pack_partial_tiles=pack)
    n = 16
    lay = odd_tiles(n, seed=5, full_share=0.25)
    q, k, v = make_qkv(2, int(lay.tile_offsets[-1]), 1, 16, seed=6)
    q2k, cnt = random_selection(2, 1, n, 8, seed=7, partial_counts=True)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(8))
    if pack:  # the plans really hold packs of many small tiles, with holes (groups of fewer than 8 tokens)
        from vsagen.kernels.tile_plan import build_tile_plan

        plan, plan_cnt = build_tile_plan(q2k, cnt, lay.tile_offsets)
        groups = [int(e) & 15 for r in range(n) for e in plan[0, 0, r, plan_cnt[0, 0, r, 0]:
                                                                     plan_cnt[0, 0, r, 0] + plan_cnt[0, 0, r, 2]]]
        assert max(plan_cnt[..., 2].flatten().tolist()) >= 8 and min(groups) < SEG
    got = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do, tuning=tuning)
    assert_all_finite(got[0], *got[2:])  # lse is -inf on the empty rows
    q64, k64, v64 = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    out, lse = masked_dense(q64, k64, v64, tile_map(q2k, cnt, n), lay)
    out.backward(do.double())
    for name, x, y in zip(NAMES, got, (out.detach(), lse.detach(), q64.grad, k64.grad, v64.grad)):
        x, y = x.double(), y.double()
        both_inf = torch.isinf(x) & torch.isinf(y) & (x == y)  # lse of empty rows
        assert rel_l2(torch.where(both_inf, 0.0, x), torch.where(both_inf, 0.0, y)) < FP32_REL_L2, name


def test_pack_seg_matches_the_plan():
    assert primitives.PACK_SEG == SEG and primitives.BLOCK == TILE
    defaults = tile_plan_reference.__defaults__  # the oracle's (tile, seg)
    assert defaults == (TILE, SEG)


def test_layouts_without_partial_tiles_keep_the_plain_loop(monkeypatch):
    """Every tile full (S = 64 * n_tiles): no plan is built and the kernels take one tile per iteration."""
    import vsagen.kernels.tile_plan as tp

    def no_plan(*args):
        raise AssertionError("a tile plan was built for a layout without partial tiles")

    monkeypatch.setattr(tp, "build_tile_plan", no_plan)
    n = 3
    lay = types.SimpleNamespace(tile_offsets=torch.arange(0, n * TILE + 1, TILE, dtype=torch.int32),
                                token_tile=torch.arange(n).repeat_interleave(TILE))
    q, k, v = make_qkv(1, n * TILE, 1, 16, seed=9)
    q2k, cnt = random_selection(1, 1, n, 2, seed=10)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(11))
    got = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do)
    q64, k64, v64 = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    out, lse = masked_dense(q64, k64, v64, tile_map(q2k, cnt, n), lay)
    out.backward(do.double())
    for name, x, y in zip(NAMES, got, (out.detach(), lse.detach(), q64.grad, k64.grad, v64.grad)):
        assert rel_l2(x, y) < FP32_REL_L2, name


def test_strided_q2k_on_a_layout_without_partial_tiles():
    """A q2k view without unit stride on its last axis (here a transpose) is read by value on the plain-loop path
    too (it was read as if contiguous there: relative error 1.0)."""
    n = 4
    lay = types.SimpleNamespace(tile_offsets=torch.arange(0, n * TILE + 1, TILE, dtype=torch.int32),
                                token_tile=torch.arange(n).repeat_interleave(TILE))
    q, k, v = make_qkv(1, n * TILE, 1, 16, seed=12)
    q2k, cnt = random_selection(1, 1, n, n, seed=13)
    strided = q2k.transpose(2, 3).contiguous().transpose(2, 3)  # same values, last-axis stride n
    assert strided.stride(-1) != 1 and torch.equal(strided, q2k)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(14))
    got = kernel_fwd_bwd(q, k, v, strided, cnt, lay, do)
    want = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do)
    for name, x, y in zip(NAMES, got, want):
        assert torch.equal(x, y), name
