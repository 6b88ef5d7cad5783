"""Tests for kernels/k2q.py: the Triton k2q transpose against the torch `build_k2q` and a loop oracle, under the
Triton interpreter on CPU.

Every comparison is bitwise on whole tensors (k2q including the zeros past each count, and k2q_cnt). Selections
are random per case (seeded), with partial counts and out-of-range garbage past them unless a case says otherwise.
"""

from __future__ import annotations

import pytest
import torch

import vsagen.kernels.k2q as k2q_mod
from conftest import UNUSED, k2q_oracle, random_selection
from vsagen.kernels.reference import build_k2q


def check(q2k: torch.Tensor, cnt: torch.Tensor, n_kv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Run build_k2q_triton; assert it equals build_k2q bitwise and the loop oracle; return its outputs."""
    got, got_cnt = k2q_mod.build_k2q_triton(q2k, cnt, n_kv)
    b, h, n_q, _ = q2k.shape
    assert got.shape == (b, h, n_kv, n_q) and got.dtype == torch.int32 and got.is_contiguous()
    assert got_cnt.shape == (b, h, n_kv) and got_cnt.dtype == torch.int32
    want, want_cnt = build_k2q(q2k, cnt, n_kv)
    assert torch.equal(got, want) and torch.equal(got_cnt, want_cnt)
    lists = k2q_oracle(q2k, cnt, n_kv)
    for bi in range(b):
        for hi in range(h):
            for j in range(n_kv):
                c = int(got_cnt[bi, hi, j])
                assert got[bi, hi, j, :c].tolist() == lists[bi][hi][j]
                assert not got[bi, hi, j, c:].any()
    return got, got_cnt


@pytest.mark.parametrize("b,h,n,top_k,partial", [
    (2, 3, 12, 5, True),    # batch 2, several heads, garbage past partial counts
    (1, 4, 9, 3, False),    # full rows
    (2, 2, 7, 1, True),     # K = 1
    (1, 2, 11, 11, True),   # K = n with partial counts
])
def test_matches_torch_and_oracle(b, h, n, top_k, partial):
    q2k, cnt = random_selection(b, h, n, top_k, seed=100 + n * top_k, partial_counts=partial)
    _, k2q_cnt = check(q2k, cnt, n)
    assert k2q_cnt.sum() == cnt.sum() and len(set(k2q_cnt.flatten().tolist())) > 1  # not a trivial selection


def test_every_tile_and_no_tile_selected():
    n = 6
    q2k = torch.arange(n, dtype=torch.int32).flip(0).expand(2, 3, n, n).contiguous()  # rows need not ascend
    k2q, cnt = check(q2k, torch.full((2, 3, n), n, dtype=torch.int32), n)
    assert torch.equal(k2q, torch.arange(n, dtype=torch.int32).expand(2, 3, n, n)) and bool((cnt == n).all())
    garbage = torch.full((2, 3, n, n), UNUSED, dtype=torch.int32)  # never read: every count is 0
    k2q, cnt = check(garbage, torch.zeros(2, 3, n, dtype=torch.int32), n)
    assert not k2q.any() and not cnt.any()


def test_chunk_loops(monkeypatch):
    """Q_TILES over several compaction chunks (running count carried), key tiles over several groups with a
    partial last group, map rows and q2k rows over several chunks."""
    monkeypatch.setattr(k2q_mod, "CHUNK_Q", 4)
    monkeypatch.setattr(k2q_mod, "KV_GROUP", 4)
    monkeypatch.setattr(k2q_mod, "CHUNK_KV", 8)
    monkeypatch.setattr(k2q_mod, "CHUNK_K", 2)
    q2k, cnt = random_selection(1, 2, 13, 6, seed=7, partial_counts=True)
    check(q2k, cnt, 13)


def test_memset_variant(monkeypatch):
    monkeypatch.setattr(k2q_mod, "ZERO_IN_KERNEL", False)
    q2k, cnt = random_selection(1, 2, 10, 4, seed=3, partial_counts=True)
    check(q2k, cnt, 10)


def test_int64_strided_inputs_and_rectangular():
    """int64 q2k and q2k_cnt, q2k with stride 2 on K and int64 garbage past the counts, 10 query x 7 key tiles."""
    g = torch.Generator().manual_seed(5)
    q2k = torch.rand(1, 2, 10, 7, generator=g).argsort(-1)[..., :4].sort(-1).values.to(torch.int32)
    cnt = torch.randint(0, 5, (1, 2, 10), generator=g, dtype=torch.int32)
    q2k64 = q2k.long().masked_fill(torch.arange(4) >= cnt.unsqueeze(-1), 1 << 40)
    wide = torch.zeros(1, 2, 10, 8, dtype=torch.int64)
    wide[..., ::2] = q2k64
    strided = wide[..., ::2]
    assert strided.stride(-1) == 2
    got, got_cnt = check(strided, cnt.long(), 7)
    want, want_cnt = k2q_mod.build_k2q_triton(q2k, cnt, 7)
    assert torch.equal(got, want) and torch.equal(got_cnt, want_cnt)


def test_out_of_range_entries_dropped():
    """A used entry outside [0, KV_TILES) (a contract violation) is dropped, never written out of bounds."""
    q2k, cnt = random_selection(1, 1, 8, 3, seed=11)
    bad = q2k.clone()
    bad[0, 0, 2, 0] = 8
    bad[0, 0, 5, 1] = -1
    got, got_cnt = k2q_mod.build_k2q_triton(bad, cnt, 8)
    dropped = q2k.clone()  # the same rows with the two entries moved past a shortened count
    dropped[0, 0, 2] = torch.cat([q2k[0, 0, 2, 1:], q2k[0, 0, 2, :1]])
    dropped[0, 0, 5] = torch.cat([q2k[0, 0, 5, :1], q2k[0, 0, 5, 2:], q2k[0, 0, 5, 1:2]])
    short = cnt.clone()
    short[0, 0, 2] = short[0, 0, 5] = 2
    want, want_cnt = build_k2q(dropped, short, 8)
    assert torch.equal(got, want) and torch.equal(got_cnt, want_cnt)


def test_empty_shapes():
    for shape, n_kv in (((1, 2, 0, 3), 5), ((1, 2, 4, 0), 5), ((1, 2, 4, 3), 0)):
        q2k = torch.zeros(shape, dtype=torch.int32)
        cnt = torch.zeros(shape[:3], dtype=torch.int32)
        got, got_cnt = k2q_mod.build_k2q_triton(q2k, cnt, n_kv)
        want, want_cnt = build_k2q(q2k, cnt, n_kv)
        assert got.shape == want.shape and got_cnt.shape == want_cnt.shape
        assert torch.equal(got, want) and torch.equal(got_cnt, want_cnt)


@pytest.mark.parametrize("q2k,cnt,n_kv", [
    (torch.zeros(2, 3, 4, dtype=torch.int32), torch.zeros(2, 3, dtype=torch.int32), 4),       # q2k not 4-D
    (torch.zeros(1, 2, 4, 3, dtype=torch.int32), torch.zeros(1, 2, 5, dtype=torch.int32), 4),  # cnt shape
    (torch.zeros(1, 2, 4, 3, dtype=torch.float32), torch.zeros(1, 2, 4, dtype=torch.int32), 4),  # dtype
    (torch.zeros(1, 2, 4, 3, dtype=torch.int32), torch.zeros(1, 2, 4, dtype=torch.int16), 4),  # cnt dtype
    (torch.zeros(1, 2, 4, 3, dtype=torch.int32), torch.zeros(1, 2, 4, dtype=torch.int32), -1),  # n_kv
])
def test_bad_inputs(q2k, cnt, n_kv):
    with pytest.raises(ValueError):
        k2q_mod.build_k2q_triton(q2k, cnt, n_kv)


def test_pre_offset_entries_carry_each_query_tile_s_start_and_length():
    """With tile_offsets, each entry is (start << 7) | length of the listed query tile (lean_index), in the same
    order and with the same counts as the tile ids; zeros past each count."""
    from vsagen.layout import tile_layout

    lay = tile_layout((5, 6, 9))
    n = lay.num_tiles
    off = lay.tile_offsets.to(torch.int32)
    q2k, cnt = random_selection(2, 2, n, 4, seed=131, partial_counts=True)
    ids, ids_cnt = check(q2k, cnt, n)
    rows, rows_cnt = k2q_mod.build_k2q_triton(q2k, cnt, n, tile_offsets=off)
    assert torch.equal(rows_cnt, ids_cnt)
    used = torch.arange(n)[None, None, None, :] < ids_cnt[..., None]
    want = (off[ids.long()] << 7) | (off[ids.long() + 1] - off[ids.long()])
    assert torch.equal(rows[used], want[used]) and not rows[~used].any()
    assert bool(((rows[used] & 127) < 64).any())  # partial tiles among them
    with pytest.raises(ValueError, match="tile_offsets"):
        k2q_mod.build_k2q_triton(q2k, cnt, n, tile_offsets=off.long())
