"""Query groups (`kernels/query_groups.py`) and the grouped forward (`block_sparse_attention_grouped`): the table
covers every query row once, groups only tiles with equal lists, and the grouped forward (and the backward behind
it) equals the per-tile launch on partial-tile layouts, batch 2, with an empty-list head."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vsagen.kernels.block_sparse_attn import block_sparse_attention, block_sparse_attention_grouped
from vsagen.kernels.query_groups import block_query_groups, build_query_groups
from vsagen.layout import tile_layout
from vsagen.sparsity.patterns import dense, diagonal, multi_diagonal, q2k_table, skip, vertical_stripe

# One pytest-xdist worker runs the whole file (`--dist loadgroup`, pyproject.toml): the module fixture runs the
# per-tile launch once, not in each worker.
pytestmark = pytest.mark.xdist_group("test_query_groups")

MODES = (vertical_stripe(1, 2), skip(), diagonal(0), multi_diagonal(0), dense())


def tables(lay):
    parts = [q2k_table(p, lay.tiles_per_dim) for p in MODES]
    width = max(t.shape[1] for t, _ in parts)
    q2k = torch.stack([F.pad(t, (0, width - t.shape[1])) for t, _ in parts])
    return q2k, torch.stack([c for _, c in parts])


@pytest.mark.parametrize("grid", [(5, 6, 10), (9, 7, 5), (4, 4, 4)])
@pytest.mark.parametrize("block_m", [16, 128])
def test_every_row_once_and_groups_share_lists(grid, block_m):
    lay = tile_layout(grid)
    q2k, cnt = tables(lay)
    g = build_query_groups(q2k, cnt, lay.tile_offsets, block_m)
    assert g.dtype == torch.int32 and g.shape[1] == 2 + block_m // 8
    off = lay.tile_offsets.tolist()
    tile_of = lay.token_tile.tolist()
    for head in range(len(MODES)):
        rows = []
        for prog in g[g[:, 0] == head].tolist():
            rep = prog[1]
            for w in prog[2:]:
                start, n = w >> 4, w & 15
                assert 0 <= n <= 8
                for r in range(start, start + n):
                    t = tile_of[r]
                    c = int(cnt[head, t])
                    assert c == int(cnt[head, rep]) and torch.equal(q2k[head, t, :c], q2k[head, rep, :c])
                    rows.append(r)
        assert sorted(rows) == list(range(lay.num_tokens))
    assert all(off[t + 1] - off[t] <= 64 for t in range(lay.num_tiles))


@pytest.mark.parametrize("tile", [(4, 4, 8), (4, 8, 8)])
def test_block_groups_put_each_cubes_rows_in_programs_of_its_own(tile):
    """Issue 33: the kernel tiles of one VSA cube share its key list, so a program holds rows of one cube only, every
    row in exactly one program per head, a 256-token cube in two programs of 128."""
    lay = tile_layout((5, 9, 17), tile)
    g = block_query_groups(lay.kernel_tile_of, 3, lay.kernel_offsets_i32, 128)
    assert g.dtype == torch.int32 and g.shape[1] == 2 + 128 // 8
    cube_of_row = lay.token_tile.tolist()
    for head in range(3):
        rows = []
        for prog in g[g[:, 0] == head].tolist():
            mine = [r for w in prog[2:] for r in range(w >> 4, (w >> 4) + (w & 15))]
            assert {cube_of_row[r] for r in mine} == {int(lay.kernel_tile_of[prog[1]])}
            rows += mine
        assert sorted(rows) == list(range(lay.num_tokens))
    full = int((lay.tile_sizes == lay.tile_volume).sum())
    assert len(g) >= 3 * full * (lay.tile_volume // 128)


def test_bad_block_m():
    lay = tile_layout((4, 4, 4))
    q2k, cnt = tables(lay)
    with pytest.raises(ValueError, match="power of two"):
        build_query_groups(q2k, cnt, lay.tile_offsets, 48)


@pytest.fixture(scope="module")
def per_tile():
    """The per-tile launch on partial tiles along every axis (grid (5, 6, 5), 150 tokens keep the interpreter quick),
    batch 2, one head per mode, with its gradients: computed once, the reference of both grouped launches below
    (the same inputs and the same per-tile kernels each of them ran on its own before)."""
    torch.manual_seed(7)
    lay = tile_layout((5, 6, 5))
    q2k, cnt = tables(lay)
    b = 2
    q, k, v = (torch.randn(b, lay.num_tokens, len(MODES), 16, requires_grad=True) for _ in range(3))
    args = (q, k, v, q2k[None].expand(b, -1, -1, -1), cnt[None].expand(b, -1, -1), lay.tile_offsets_i32)
    out, lse = block_sparse_attention(*args)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    return dict(lay=lay, q2k=q2k, cnt=cnt, args=args, out=out.detach(), lse=lse.detach(), do=do, grads=grads)


@pytest.mark.parametrize("block_m,backward", [(16, False), (128, True)])
def test_grouped_forward_and_backward_equal_the_per_tile_launch(per_tile, block_m, backward):
    lay, args = per_tile["lay"], per_tile["args"]
    groups = build_query_groups(per_tile["q2k"], per_tile["cnt"], lay.tile_offsets, block_m)
    o2, l2 = block_sparse_attention_grouped(*args, groups, (block_m, 4, 2, block_m, 4, 2))
    torch.testing.assert_close(o2, per_tile["out"], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(l2, per_tile["lse"], atol=1e-6, rtol=1e-6)  # -inf rows (the skip head) equal
    assert bool((o2[:, :, 1] == 0).all())
    if not backward:
        return
    g2 = torch.autograd.grad(o2, args[:3], per_tile["do"])
    for a, c in zip(g2, per_tile["grads"]):
        torch.testing.assert_close(a, c, atol=1e-6, rtol=1e-6)


def test_groups_table_checked():
    lay = tile_layout((4, 4, 4))
    q2k, cnt = tables(lay)
    groups = build_query_groups(q2k, cnt, lay.tile_offsets, 16)
    q = torch.randn(1, lay.num_tokens, len(MODES), 16)
    with pytest.raises(ValueError, match="groups must be"):
        block_sparse_attention_grouped(q, q, q, q2k[None], cnt[None], lay.tile_offsets_i32, groups, (128, 4, 2, 128, 4, 2))


def test_grouped_backward_with_tma_loads_matches_the_per_tile_launch():
    """bf16 with TMA loads (emulated by the interpreter): the grouped forward, its dQ over the groups and the
    dK/dV loop over packed k2q plans (full query tiles by TMA boxes, partial ones gathered) agree with the per-tile
    launch to bf16 rounding, and both with a float32 run of the same kernels."""
    import dataclasses

    from vsagen.kernels.tuning import kernel_tuning

    torch.manual_seed(11)
    lay = tile_layout((5, 6, 5))
    q2k, cnt = tables(lay)
    groups = build_query_groups(q2k, cnt, lay.tile_offsets, 64)
    tuning = dataclasses.replace(kernel_tuning("cpu", 16), tma_loads=True)
    base = [torch.randn(1, lay.num_tokens, len(MODES), 16) for _ in range(3)]
    do = torch.randn(1, lay.num_tokens, len(MODES), 16)

    def grads(dtype, grouped):
        q, k, v = (x.to(dtype).requires_grad_() for x in base)
        args = (q, k, v, q2k[None], cnt[None], lay.tile_offsets_i32)
        if grouped:
            o, _ = block_sparse_attention_grouped(*args, groups, (64, 4, 2, 64, 4, 2), tuning=tuning)
        else:
            o, _ = block_sparse_attention(*args, tuning=tuning)
        return [o.float()] + [g.float() for g in torch.autograd.grad(o, (q, k, v), do.to(dtype))]

    ref = grads(torch.float32, False)
    for a, b, r in zip(grads(torch.bfloat16, True), grads(torch.bfloat16, False), ref):
        assert float((a - r).norm() / r.norm()) < 2e-2
        assert float((a - b).norm() / r.norm()) < 2e-2
