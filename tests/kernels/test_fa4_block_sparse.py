"""vsagen.kernels.fa4_block_sparse on a CPU (no flash_attn): FA4's block lists against the cube-level selection, a
float64 emulation of FA4's block-sparse semantics against a token-level masked reference, padding, refusals.

FA4 itself runs on sm90 / sm100 only: benchmarks/fa4_adapter.py checks the real kernel against a float32 reference.
"""

from __future__ import annotations

import sys

import pytest
import torch

from conftest import UNUSED, masked_dense, random_selection, rel_l2, softmax_attention_fp64, tile_map
from fa4_fake import FakeFA4, decode, emulate_fa4
from vsagen.kernels import fa4_block_sparse as fa4
from vsagen.layout import tile_layout

# Grids with full cubes, partial cubes, and (V = 256) cubes of <= 128 tokens whose second key block is empty.
CASES = [  # (grid, tile, query block)
    ((5, 9, 17), (4, 4, 8), 128),
    ((5, 9, 17), (4, 8, 8), 128),
    ((5, 9, 17), (4, 8, 8), 256),
]
IDS = ["V128-q128", "V256-q128", "V256-q256"]


def expected_maps(sel: torch.Tensor, sizes: torch.Tensor, vol: int, q_block: int):
    """The cube map expanded to (B, H, M, N) full / mask block maps, by loops."""
    b, h, n, _ = sel.shape
    kb, qb = vol // 128, vol // q_block
    full = torch.zeros(b, h, n * qb, n * kb, dtype=torch.bool)
    mask = torch.zeros_like(full)
    for m in range(n * qb):
        for nb in range(n * kb):
            cube, part = nb // kb, nb % kb
            tokens = min(128, max(0, int(sizes[cube]) - 128 * part))
            picked = sel[:, :, m // qb, cube]
            full[:, :, m, nb] = picked & (tokens == 128)
            mask[:, :, m, nb] = picked & (0 < tokens < 128)
    return full, mask


@pytest.mark.parametrize("grid,tile,q_block", CASES, ids=IDS)
def test_lists_are_the_cube_selection_expanded(grid, tile, q_block):
    lay = tile_layout(grid, tile)
    n, vol = lay.num_tiles, lay.tile_volume
    q2k, cnt = random_selection(2, 3, n, max(2, n // 3), seed=vol + q_block, partial_counts=True)
    assert int(q2k.max()) == UNUSED  # garbage past the counts is never read
    index = fa4.fa4_block_sparse_index(q2k, cnt, lay.tile_sizes, vol, q_block=q_block)
    m_cnt, m_idx, f_cnt, f_idx = index.fwd
    n_q, n_k = n * vol // q_block, n * vol // 128
    assert index.block_size == (q_block, 128)
    assert m_cnt.shape == f_cnt.shape == (2, 3, n_q) and m_idx.shape[:3] == f_idx.shape[:3] == (2, 3, n_q)
    assert m_idx.shape[3] <= n_k and all(t.dtype == torch.int32 for t in (*index.fwd, *index.bwd))
    full, mask = expected_maps(tile_map(q2k, cnt, n), lay.tile_sizes, vol, q_block)
    tokens = fa4.key_block_tokens(lay.tile_sizes, vol)
    assert (tokens == 128).any() and ((tokens > 0) & (tokens < 128)).any()  # both kinds occur
    if vol == 256:
        assert (tokens == 0).any()  # some cube's second half holds no token: its block is dropped
    got_full, got_mask = decode(f_cnt, f_idx, n_k), decode(m_cnt, m_idx, n_k)
    assert torch.equal(got_full, full) and torch.equal(got_mask, mask)
    assert not (got_full & got_mask).any()
    assert not (got_full | got_mask)[..., tokens == 0].any()
    # Backward: per key block, the query blocks that list it, full and mask as in the forward.
    bm_cnt, bm_idx, bf_cnt, bf_idx = index.bwd
    assert bm_cnt.shape == bf_cnt.shape == (2, 3, n_k) and bm_idx.shape[3] <= n_q and bf_idx.shape[3] <= n_q
    assert torch.equal(decode(bf_cnt, bf_idx, n_q), full.transpose(-1, -2))
    assert torch.equal(decode(bm_cnt, bm_idx, n_q), mask.transpose(-1, -2))
    assert int(bm_cnt.sum()) == int(m_cnt.sum()) and int(bf_cnt.sum()) == int(f_cnt.sum())
    assert int(bm_cnt.max()) == bm_idx.shape[3]  # compact: as wide as the longest list
    assert fa4.fa4_block_sparse_index(q2k, cnt, lay.tile_sizes, vol, q_block=q_block, backward=False).bwd is None


WHOLE = [  # (grid, tile, query block): every cube whole
    ((8, 8, 16), (4, 4, 8), 128),
    ((4, 16, 8), (4, 8, 8), 128),
    ((4, 16, 8), (4, 8, 8), 256),
]


@pytest.mark.parametrize("grid,tile,q_block", WHOLE, ids=["V128-q128", "V256-q128", "V256-q256"])
@pytest.mark.parametrize("heads", [2, 3])
def test_whole_cube_lists_equal_the_dense_map_lists(grid, tile, q_block, heads):
    lay = tile_layout(grid, tile)
    n, vol = lay.num_tiles, lay.tile_volume
    assert fa4.every_cube_full(n, vol, lay.num_tokens)
    top_k = max(2, n // 3)
    q2k, _ = random_selection(2, heads, n, top_k, seed=heads + q_block + vol)
    g = torch.Generator().manual_seed(heads)
    cnt = torch.randint(1, top_k + 1, (2, heads, n), generator=g, dtype=torch.int32)  # ragged, 1 .. K
    cnt.view(-1)[0], cnt.view(-1)[-1] = 1, top_k
    q2k = q2k.masked_fill(torch.arange(top_k) >= cnt.unsqueeze(-1), UNUSED)  # garbage past the counts
    fast = fa4.whole_cube_index(q2k, cnt, n, vol, q_block=q_block)
    ref = fa4.fa4_block_sparse_index(q2k, cnt, lay.tile_sizes, vol, q_block=q_block)
    n_q, n_k = n * vol // q_block, n * vol // 128
    assert fast.block_size == ref.block_size == (q_block, 128)
    for got, want, n_cols in ((fast.fwd, ref.fwd, n_k), (fast.bwd, ref.bwd, n_q)):
        m_cnt, m_idx, f_cnt, f_idx = got
        assert all(t.dtype == torch.int32 and t.is_contiguous() and t.stride(-1) == 1 for t in got)
        assert m_cnt.shape == f_cnt.shape == want[2].shape and f_idx.shape == want[3].shape
        assert m_idx.shape[:3] == want[1].shape[:3] and m_idx.shape[3] >= 1 and int(m_cnt.abs().sum()) == 0
        assert int(want[0].sum()) == 0  # the dense path finds no mask block either
        assert torch.equal(f_cnt, want[2])
        assert torch.equal(decode(f_cnt, f_idx, n_cols), decode(want[2], want[3], n_cols))
    assert fa4.whole_cube_index(q2k, cnt, n, vol, q_block=q_block, backward=False).bwd is None


@pytest.mark.parametrize("backward", [False, True])
def test_whole_cube_lists_keep_stride_one_at_width_one(backward):
    # K = 1 and one selecting cube per key cube: widths of 1 on both sides, from a transposed (strided) q2k.
    n = 4
    q2k = torch.arange(n, dtype=torch.int32).view(1, n, 1, 1).transpose(1, 2).expand(1, 1, n, 1)
    cnt = torch.ones(1, n, 1, dtype=torch.int32).transpose(1, 2)
    index = fa4.whole_cube_index(q2k, cnt, n, 128, backward=backward)
    for t in (*index.fwd, *(index.bwd or ())):
        assert t.dtype == torch.int32 and t.is_contiguous() and t.stride(-1) == 1
    assert index.fwd[3].shape == (1, 1, n, 1) and index.fwd[3].view(-1).tolist() == list(range(n))
    if backward:
        assert index.bwd[3].shape == (1, 1, n, 1) and index.bwd[3].view(-1).tolist() == list(range(n))
    with pytest.raises(ValueError, match="multiple"):
        fa4.whole_cube_index(q2k, cnt, n, 128, q_block=256)


def test_query_block_must_not_span_cubes():
    sizes = torch.full((4,), 128)
    q2k, cnt = random_selection(1, 1, 4, 2, seed=0)
    with pytest.raises(ValueError, match="multiple"):
        fa4.fa4_block_sparse_index(q2k, cnt, sizes, 128, q_block=256)
    with pytest.raises(ValueError, match="multiple"):
        fa4.fa4_block_sparse_index(q2k, cnt, sizes, 64)
    assert fa4.fa4_query_block(9, 128) == 128 and fa4.fa4_query_block(9, 256) == 128
    assert fa4.fa4_query_block(10, 256) == 256
    with pytest.raises(ValueError, match="256-row"):
        fa4.fa4_query_block(10, 128)


def run_emulation(lay, q, k, v, q2k, cnt, q_block, scale=None):
    index = fa4.fa4_block_sparse_index(q2k, cnt, lay.tile_sizes, lay.tile_volume, q_block=q_block)
    qp, kp, vp = (fa4.pad_to_cubes(x, lay.slots, lay.slot_valid) for x in (q, k, v))
    out_p = emulate_fa4(qp, kp, vp, index, lay.slot_valid.reshape(-1).to(torch.int32), scale)
    return fa4.unpad_from_cubes(out_p, lay.slots, lay.slot_valid, q.shape[1])


# 3 heads only (2 ran as well): the same lists, padding and emulation on the same grids, and with batch 2 three heads
# also tell a batch / head mix-up that two would not by shape.
@pytest.mark.parametrize("grid,tile,q_block", CASES, ids=IDS)
@pytest.mark.parametrize("heads", [3])
def test_emulated_fa4_equals_token_masked_attention(grid, tile, q_block, heads):
    lay = tile_layout(grid, tile)
    n = lay.num_tiles
    g = torch.Generator().manual_seed(heads * 7 + q_block)
    q, k, v = (torch.randn(2, lay.num_tokens, heads, 16, generator=g, dtype=torch.float64) for _ in range(3))
    top_k = max(2, n // 3)
    q2k, _ = random_selection(2, heads, n, top_k, seed=heads + q_block)
    cnt = torch.randint(1, top_k + 1, (2, heads, n), generator=g, dtype=torch.int32)
    got = run_emulation(lay, q, k, v, q2k, cnt, q_block, scale=0.3)
    # The reference's mask is built from q2k token by token: query token in cube i sees key token j iff
    # j's cube is among i's first cnt entries.
    ref, _ = masked_dense(q, k, v, tile_map(q2k, cnt, n), lay, scale=0.3)
    assert rel_l2(got, ref) < 1e-12


@pytest.mark.parametrize("grid,tile,q_block", CASES, ids=IDS)
def test_every_cube_selected_is_dense_attention(grid, tile, q_block):
    lay = tile_layout(grid, tile)
    n = lay.num_tiles
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, lay.num_tokens, 2, 16, generator=g, dtype=torch.float64) for _ in range(3))
    q2k = torch.arange(n, dtype=torch.int32).expand(2, 2, n, n).contiguous()
    cnt = torch.full((2, 2, n), n, dtype=torch.int32)
    got = run_emulation(lay, q, k, v, q2k, cnt, q_block)
    assert rel_l2(got, softmax_attention_fp64(q, k, v)) < 1e-12


@pytest.mark.parametrize("tile", [(4, 4, 8), (4, 8, 8)])
def test_pad_unpad_round_trip(tile):
    lay = tile_layout((5, 9, 17), tile)
    x = torch.randn(2, lay.num_tokens, 3, 8, requires_grad=True)
    xp = fa4.pad_to_cubes(x, lay.slots, lay.slot_valid)
    assert xp.shape == (2, lay.num_tiles * lay.tile_volume, 3, 8) and xp.is_contiguous()
    valid = lay.slot_valid.reshape(-1)
    assert not xp[:, ~valid].any()
    assert torch.equal(xp[:, valid], x.detach())  # real tokens fill each cube's first slots, in tile order
    back = fa4.unpad_from_cubes(xp, lay.slots, lay.slot_valid, lay.num_tokens)
    assert torch.equal(back, x)
    back.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def test_reasons(monkeypatch):
    def no_lookup(name, *a):
        raise AssertionError(f"looked up {name}")

    monkeypatch.setattr(fa4.importlib.util, "find_spec", no_lookup)
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    assert "128" in fa4.fa4_unavailable("cpu", 64)
    assert "CUDA" in fa4.fa4_unavailable("cpu", 128)
    assert "flash_attn" not in sys.modules
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "not available" in fa4.fa4_unavailable("cuda:0", 128)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert "9.x or 10.x" in fa4.fa4_unavailable("cuda:0", 256)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    assert "256-row" in fa4.fa4_unavailable("cuda:0", 128)
    monkeypatch.setattr(fa4.importlib.util, "find_spec", lambda name, *a: None)
    for cap in [(9, 0), (10, 0)]:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, cap=cap: cap)
        assert "pip install 'vsagen[fa4]'" in fa4.fa4_unavailable("cuda:0", 256)
    monkeypatch.setattr(fa4, "_fa4_installed", lambda: True)
    assert fa4.fa4_unavailable("cuda:0", 256) is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert fa4.fa4_unavailable("cuda:0", 128) is None


def test_installed_check_wants_the_cute_package(monkeypatch, tmp_path):
    """FA2's flash_attn (no cute/) or a missing cutlass is not FA4."""
    (tmp_path / "flash_attn").mkdir()
    spec = type("Spec", (), {"submodule_search_locations": [str(tmp_path / "flash_attn")]})()
    monkeypatch.setattr(fa4.importlib.util, "find_spec", lambda name, *a: spec)
    assert not fa4._fa4_installed()
    (tmp_path / "flash_attn" / "cute").mkdir()
    (tmp_path / "flash_attn" / "cute" / "interface.py").write_text("")
    assert fa4._fa4_installed()
    monkeypatch.setattr(fa4.importlib.util, "find_spec", lambda name, *a: None if name == "cutlass" else spec)
    assert not fa4._fa4_installed()


def test_attention_refuses_in_one_line_on_cpu():
    lay = tile_layout((5, 9, 17), (4, 4, 8))
    q = torch.zeros(1, lay.num_tokens, 2, 16)
    q2k, cnt = random_selection(1, 2, lay.num_tiles, 2, seed=1)
    with pytest.raises(RuntimeError, match="CUDA") as exc:
        fa4.fa4_block_sparse_attention(q, q, q, q2k, cnt, lay.tile_sizes, lay.slots, lay.slot_valid, 128)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("grid,tile,padded", [
    ((5, 9, 17), (4, 4, 8), True),    # partial cubes: padded, partial key blocks masked
    ((8, 8, 16), (4, 4, 8), False),   # every cube full (a crop fit): as it is, no mask_mod
    ((4, 16, 8), (4, 8, 8), False),
])
@pytest.mark.parametrize("grad", [False, True])  # with grad the backward lists are built and handed over too
def test_the_adapter_pads_and_masks_only_partial_cubes(monkeypatch, grid, tile, padded, grad):
    fake = FakeFA4().install(monkeypatch)
    lay = tile_layout(grid, tile)
    n = lay.num_tiles
    assert fa4.every_cube_full(n, lay.tile_volume, lay.num_tokens) is not padded
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(2, lay.num_tokens, 3, 16, generator=g, dtype=torch.float64).requires_grad_(grad)
               for _ in range(3))
    top_k = max(2, n // 3)
    q2k, _ = random_selection(2, 3, n, top_k, seed=n)
    cnt = torch.randint(1, top_k + 1, (2, 3, n), generator=g, dtype=torch.int32)
    got = fa4.fa4_block_sparse_attention(q, k, v, q2k, cnt, lay.tile_sizes, lay.slots, lay.slot_valid,
                                         lay.tile_volume, scale=0.3)
    ref, _ = masked_dense(q, k, v, tile_map(q2k, cnt, n), lay, scale=0.3)
    assert got.shape == q.shape and rel_l2(got.detach(), ref.detach()) < 1e-12
    assert fake.calls == [{"mask_mod": padded, "tokens": n * lay.tile_volume, "bwd": grad}]
