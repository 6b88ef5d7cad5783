"""vsagen.kernels.raster_blocks: SLA's block selection over raster token blocks against its formulas recomputed in
float64 (smoothed K, block means with a partial last block, unscaled scores, the int(topk * n) rule), with the
rounding SLA does in bf16, ties, every block size pair; the tile lists the kernels read (partial last key blocks);
and the float reference of the sparse part against dense masked attention."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_qkv

from vsagen.kernels import raster_blocks as rb


def formula_scores(q, k, block_q, block_k, dtype=None):
    """SLA's block scores in float64 from the formulas: k minus its mean over tokens, block means (the last block
    over the tokens it has), pooled q . pooled k. With `dtype`, rounded where SLA's code stores in the run's dtype
    (the smoothed k, the pooled blocks, the scores)."""
    s = q.shape[1]
    rnd = (lambda x: x.to(dtype).double()) if dtype is not None else (lambda x: x)
    qd, kd = q.double().transpose(1, 2), k.double().transpose(1, 2)  # (B, H, S, D)
    ks = rnd(kd - rnd(kd.mean(dim=2, keepdim=True)))

    def pool(x, blk):
        return torch.stack([x[:, :, i * blk:(i + 1) * blk].mean(dim=2) for i in range(math.ceil(s / blk))], dim=2)

    return rnd(rnd(pool(qd, block_q)) @ rnd(pool(ks, block_k)).transpose(-1, -2))


def assert_top_k(scores, lut, n_sel):
    """lut selects n_sel distinct blocks per row, every block scoring above the row's n_sel-th best is in, and the
    rest are blocks tied with it (any tie resolution passes here)."""
    assert lut.shape[-1] == n_sel
    chosen = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, lut, True)
    assert chosen.sum(-1).eq(n_sel).all()  # no repeats
    kth = scores.topk(n_sel, dim=-1).values[..., -1:]
    assert (chosen | (scores <= kth)).all(), "a block scoring above the threshold was left out"
    assert (~chosen | (scores >= kth)).all(), "a block scoring below the threshold was chosen"


@pytest.mark.parametrize("blocks", [(128, 64), (64, 128), (64, 64), (128, 128)])
@pytest.mark.parametrize("s", [300, 384])  # a partial last block of every size / none
def test_block_map_equals_the_formula_in_float64(blocks, s):
    """fp32 inputs, batch 2: the selected sets equal the float64 formula's (random inputs: no near-ties at this
    size; checked below by the gap at each row's threshold)."""
    bq, bk = blocks
    q, k, _ = make_qkv(2, s, 3, 64, seed=s + bq)
    lut = rb.sla_block_map(q, k, 0.3, bq, bk)
    ref = formula_scores(q, k, bq, bk)
    n_sel = rb.selected_blocks(0.3, math.ceil(s / bk))
    assert lut.shape == (2, 3, math.ceil(s / bq), n_sel)
    top = ref.topk(n_sel + 1, dim=-1).values
    assert (top[..., -2] - top[..., -1]).min() > 1e-4  # the threshold is clear of rounding
    assert_top_k(ref, lut, n_sel)


def test_block_map_in_bf16_rounds_where_sla_rounds():
    """bf16 inputs: the scores are those of the formula rounded where SLA stores in bf16 (smoothed k, pooled blocks,
    scores), ties included (bf16 scores tie often): a valid top-k of those scores."""
    q, k, _ = make_qkv(1, 1000, 4, 128, dtype=torch.bfloat16, seed=3)
    scores = rb.block_scores(q, k, 128, 64)
    ref = formula_scores(q, k, 128, 64, dtype=torch.bfloat16)
    assert scores.dtype == torch.bfloat16
    assert (scores.double() - ref).abs().max() <= 2 ** -7 * ref.abs().max()  # at most an ulp or so apart
    lut = rb.sla_block_map(q, k, 0.1, 128, 64)
    assert_top_k(scores.double(), lut, rb.selected_blocks(0.1, 16))


def test_ties_go_as_torch_topk_resolves_them():
    """Key blocks 1 and 3 hold the same tokens, so their scores tie exactly for every query block; with the
    threshold on the tie one of the two is taken, exactly as SLA's own call (torch.topk, unsorted, on the same
    scores) takes it."""
    q, k, _ = make_qkv(2, 320, 2, 64, seed=9)
    k[:, 192:256] = k[:, 64:128]
    scores = rb.block_scores(q, k, 64, 64)
    assert torch.equal(scores[..., 1], scores[..., 3])
    for n_sel in range(1, 6):
        topk = n_sel / 5
        lut = rb.sla_block_map(q, k, topk, 64, 64)
        assert torch.equal(lut, torch.topk(scores, n_sel, dim=-1, sorted=False).indices)
        assert_top_k(scores.double(), lut, n_sel)


def test_selected_blocks_is_slas_rule_but_at_least_one():
    assert rb.selected_blocks(0.1, 512) == 51  # the 1.3B 480p sequence, 64-token key blocks
    assert rb.selected_blocks(0.15, 512) == 76
    assert rb.selected_blocks(1.0, 7) == 7
    assert rb.selected_blocks(0.1, 5) == 1  # SLA's int(0.5) = 0 would select nothing


@pytest.mark.parametrize("blocks", [(128, 64), (64, 128), (128, 128)])
def test_tile_lists_expand_blocks_into_raster_tiles(blocks):
    """Each 64-token query tile lists, ascending, the 64-token tiles of its query block's key blocks; a partial
    last key block of 128 tokens holding at most 64 has one tile, so its rows are shorter (q2k_cnt)."""
    bq, bk = blocks
    s = 300  # 5 tiles, the last of 44 tokens; key blocks of 128: the last holds 44 tokens, one tile
    q, k, _ = make_qkv(2, s, 2, 32, seed=1)
    lut = rb.sla_block_map(q, k, 0.7, bq, bk)
    q2k, cnt = rb.tile_lists(lut, s, bq, bk)
    n_tiles = 5
    assert q2k.dtype == cnt.dtype == torch.int32 and q2k.shape[:3] == (2, 2, n_tiles)
    for b in range(2):
        for h in range(2):
            for t in range(n_tiles):
                blocks_of_row = lut[b, h, t * 64 // bq].tolist()
                want = sorted(x for j in blocks_of_row for x in range(j * bk // 64, (j + 1) * bk // 64)
                              if x < n_tiles)
                assert q2k[b, h, t, :cnt[b, h, t]].tolist() == want
    if bk == 128:
        assert (cnt < q2k.shape[-1]).any()  # rows holding the partial last key block


def test_tile_lists_refuse_what_the_kernels_cannot_run():
    lut = torch.zeros(1, 1, 3, 1, dtype=torch.int64)
    with pytest.raises(ValueError, match="block sizes"):
        rb.tile_lists(lut, 300, 96, 64)
    with pytest.raises(ValueError, match="query blocks"):
        rb.tile_lists(lut, 300, 64, 64)


def test_raster_tile_offsets():
    assert rb.raster_tile_offsets(130).tolist() == [0, 64, 128, 130]
    assert rb.raster_tile_offsets(128).tolist() == [0, 64, 128]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_block_sparse_reference_equals_dense_masked_attention(dtype):
    """Against softmax(q k^T / sqrt(D) masked to the listed tiles) v in float64, batch 2, a partial last tile, rows
    of different lengths; forward and backward."""
    s, d = 200, 24
    q, k, v = make_qkv(2, s, 2, d, dtype=dtype, seed=4, requires_grad=True)
    g = torch.Generator().manual_seed(5)
    n_tiles = 4
    q2k = torch.stack([torch.randperm(n_tiles, generator=g)[:3].sort().values for _ in range(2 * 2 * n_tiles)])
    q2k = q2k.view(2, 2, n_tiles, 3).to(torch.int32)
    cnt = torch.randint(1, 4, (2, 2, n_tiles), generator=g, dtype=torch.int32)
    out = rb.block_sparse_reference(q, k, v, q2k, cnt)
    allowed = torch.zeros(2, 2, n_tiles, n_tiles, dtype=torch.bool)
    for idx in torch.cartesian_prod(*(torch.arange(n) for n in (2, 2, n_tiles))).tolist():
        b, h, t = idx
        allowed[b, h, t, q2k[b, h, t, :cnt[b, h, t]].long()] = True
    tt = torch.arange(s) // 64
    mask = allowed[:, :, tt][..., tt]
    qd, kd, vd = (x.detach().double().transpose(1, 2).requires_grad_() for x in (q, k, v))
    logits = (qd @ kd.transpose(-1, -2)) / math.sqrt(d)
    want = (torch.softmax(logits.masked_fill(~mask, -math.inf), -1) @ vd).transpose(1, 2)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert (out.double() - want).norm() / want.norm() < tol
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    out.backward(dout.to(dtype))
    want.backward(dout)
    for got, ref in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        assert (got.double() - ref.transpose(1, 2)).norm() / ref.norm() < tol * 10
