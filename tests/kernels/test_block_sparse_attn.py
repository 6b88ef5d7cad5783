"""Tests for kernels/block_sparse_attn.py: the Triton block-sparse attention forward and backward, the k2q
transpose, the custom op and the public function, run under the Triton interpreter on CPU.

Every comparison uses the same tile selection on both sides: full q2k rows go to the eager reference
(`reference.block_sparse_attention_reference`, float64, autograd for gradients); rows shortened by q2k_cnt go to
an explicit float64 masked dense attention built here from the tile map. Shapes stay small (the interpreter is
~50x slower than torch); every grid has partial tiles except (4, 4, 4).
"""

from __future__ import annotations

import math

import pytest
import torch

import vsagen.kernels.block_sparse_attn as bsa
from conftest import make_qkv
from vsagen.kernels.reference import block_sparse_attention_reference
from vsagen.layout import tile_layout

# fp32 inputs, fp32 dots with input_precision="ieee": rounding ~1e-7 relative per operation over at most a few
# hundred keys; measured ~3e-7 relative L2 for out, lse and all gradients (dS = P (dP - delta) cancels a little).
# A masking or indexing error is O(1e-1), so 1e-5 separates the two by four orders of magnitude.
FP32_REL_L2 = 1e-5
# fp16 / bf16 inputs: the eager reference in the same dtype (fp32 softmax, output and gradients rounded to the
# dtype) sets the scale of unavoidable error. The kernel also rounds P and dS to the dtype before the P V,
# dS K and dS^T Q products on the GPU (FlashAttention-2 does the same); that at most doubles the error, so 4x
# the eager error leaves headroom while a real bug (O(1e-1)) stays far outside.
LOWP_FACTOR = 4.0
# Errors are relative L2 against max(||reference||, REF_RMS_FLOOR * sqrt(numel)). With unit-variance inputs
# every output and gradient has RMS of order 0.1..1, except exact cancellations: with one key per query the
# softmax is constant and dq is 0, where the kernel's fp32 dP - delta leaves ~1e-7 noise.
REF_RMS_FLOOR = 0.1
# Garbage written past q2k_cnt in q2k rows: an index far out of range, so reading it would fault or corrupt.
UNUSED = 1_000_000


# ---------------------------------------------------------------------------------------------- helpers


def rel_l2(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.detach().double(), y.detach().double()
    return float((x - y).norm() / max(float(y.norm()), REF_RMS_FLOOR * math.sqrt(y.numel())))


def random_selection(b: int, h: int, n: int, top_k: int, seed: int, *, partial_counts: bool = False):
    """(q2k (B, H, n, K) int32 ascending, q2k_cnt (B, H, n) int32): K distinct random key tiles per row.

    With partial_counts, q2k_cnt is random in [0, K] (the first row 0, the last K) and entries past it hold
    `UNUSED` garbage.
    """
    g = torch.Generator().manual_seed(seed)
    q2k = torch.sort(torch.rand(b, h, n, n, generator=g).argsort(-1)[..., :top_k], -1).values.to(torch.int32)
    if not partial_counts:
        return q2k, torch.full((b, h, n), top_k, dtype=torch.int32)
    cnt = torch.randint(0, top_k + 1, (b, h, n), generator=g, dtype=torch.int32)
    cnt.view(-1)[0] = 0
    cnt.view(-1)[-1] = top_k
    q2k = q2k.masked_fill(torch.arange(top_k) >= cnt.unsqueeze(-1), UNUSED)
    return q2k, cnt


def tile_map(q2k: torch.Tensor, cnt: torch.Tensor, n_kv: int) -> torch.Tensor:
    """Dense (B, H, Q_TILES, KV_TILES) bool map of the used q2k entries, by loops."""
    b, h, n_q, _ = q2k.shape
    out = torch.zeros(b, h, n_q, n_kv, dtype=torch.bool)
    for bi in range(b):
        for hi in range(h):
            for i in range(n_q):
                for r in range(int(cnt[bi, hi, i])):
                    out[bi, hi, i, int(q2k[bi, hi, i, r])] = True
    return out


def k2q_oracle(q2k: torch.Tensor, cnt: torch.Tensor, n_kv: int) -> list:
    """Slow transpose: lists[b][h][j] = ascending query tiles i whose first cnt[i] q2k entries contain j."""
    b, h, n_q, _ = q2k.shape
    lists = [[[[] for _ in range(n_kv)] for _ in range(h)] for _ in range(b)]
    for bi in range(b):
        for hi in range(h):
            for i in range(n_q):  # ascending i keeps every list sorted
                for r in range(int(cnt[bi, hi, i])):
                    lists[bi][hi][int(q2k[bi, hi, i, r])].append(i)
    return lists


def masked_dense(q, k, v, allowed_tiles, lay, scale=None):
    """float64 attention with a token mask from a (B, H, n, n) tile map; empty rows give out 0 and lse -inf.

    Differentiable without NaN: empty rows attend to everything, then their outputs are replaced by 0.
    """
    tt = lay.token_tile
    mask = allowed_tiles[:, :, tt][:, :, :, tt]  # (B, H, S, S)
    empty = ~mask.any(-1)  # (B, H, S)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits = torch.einsum("bshd,bthd->bhst", q.double(), k.double()) * scale
    logits = logits.masked_fill(~(mask | empty.unsqueeze(-1)), float("-inf"))
    lse = torch.logsumexp(logits, -1)
    out = torch.einsum("bhst,bthd->bhsd", torch.softmax(logits, -1), v.double())
    out = out.masked_fill(empty.unsqueeze(-1), 0.0).transpose(1, 2)
    return out, lse.masked_fill(empty, float("-inf"))


def leaves(*xs, dtype=torch.float64):
    return [x.detach().to(dtype).requires_grad_(True) for x in xs]


def kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do, scale=None, dlse=None):
    """block_sparse_attention with autograd: (out, lse, dq, dk, dv)."""
    q, k, v = leaves(q, k, v, dtype=q.dtype)
    out, lse = bsa.block_sparse_attention(q, k, v, q2k, cnt, lay.tile_offsets.to(torch.int32), scale)
    grads = [do] if dlse is None else [do, dlse]
    torch.autograd.backward([out, lse][:len(grads)], grads)
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def reference_fwd_bwd(q, k, v, q2k, lay, do, dtype=torch.float64, scale=None, dlse=None):
    """Eager reference (block_sparse_attention_reference) in `dtype` with autograd: (out, lse, dq, dk, dv)."""
    q, k, v = leaves(q, k, v, dtype=dtype)
    out, lse = block_sparse_attention_reference(q, k, v, q2k.long(), lay.slots, lay.slot_valid, scale)
    grads = [do.to(dtype)] if dlse is None else [do.to(dtype), dlse.to(lse.dtype)]
    torch.autograd.backward([out, lse][:len(grads)], grads)
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def assert_all_finite(*xs):
    for x in xs:
        assert bool(torch.isfinite(x).all()), "non-finite values in a kernel result"


NAMES = ("out", "lse", "dq", "dk", "dv")


@pytest.fixture(params=["one_class", "size_classes"])
def classes(request, monkeypatch):
    """Run every kernel as one launch of 64-row programs, or as three launches by tile size (16, 32 and 64 rows,
    each program exiting unless its tile falls in its class), for every head dim."""
    split = request.param == "size_classes"
    for name in ("FWD_LAUNCH", "BWD_DQ_LAUNCH", "BWD_DKDV_LAUNCH"):
        table = getattr(bsa, name)
        new = {}
        for d, entries in table.items():
            _, warps, stages = max(entries)
            new[d] = ((16, 4, stages), (32, 4, stages), (64, warps, stages)) if split else ((64, warps, stages),)
        monkeypatch.setattr(bsa, name, new)
    return request.param


# ---------------------------------------------------------------------------------------------- k2q


@pytest.mark.parametrize("b,h,n,top_k", [(2, 3, 12, 5), (1, 2, 4, 4), (1, 1, 1, 1), (2, 1, 7, 1)])
def test_build_k2q_matches_loop_oracle(b, h, n, top_k):
    q2k, cnt = random_selection(b, h, n, top_k, seed=n + top_k, partial_counts=True)
    k2q, k2q_cnt = bsa.build_k2q(q2k, cnt, n)
    assert k2q.shape == (b, h, n, n) and k2q.dtype == torch.int32 and k2q.stride(-1) == 1
    assert k2q_cnt.shape == (b, h, n) and k2q_cnt.dtype == torch.int32
    want = k2q_oracle(q2k, cnt, n)
    for bi in range(b):
        for hi in range(h):
            for j in range(n):
                c = int(k2q_cnt[bi, hi, j])
                assert k2q[bi, hi, j, :c].tolist() == want[bi][hi][j]
                assert bool((k2q[bi, hi, j, c:] == 0).all())  # documented filler
    again, again_cnt = bsa.build_k2q(q2k.long(), cnt, n)  # int64 q2k accepted; bitwise deterministic
    assert torch.equal(again, k2q) and torch.equal(again_cnt, k2q_cnt)


def test_build_k2q_all_and_none_selected():
    n = 6
    q2k = torch.arange(n, dtype=torch.int32).expand(2, 2, n, n).contiguous()
    k2q, cnt = bsa.build_k2q(q2k, torch.full((2, 2, n), n, dtype=torch.int32), n)
    assert torch.equal(k2q, q2k) and bool((cnt == n).all())
    k2q, cnt = bsa.build_k2q(q2k, torch.zeros(2, 2, n, dtype=torch.int32), n)
    assert bool((cnt == 0).all()) and bool((k2q == 0).all())


# ---------------------------------------------------------------------------------------------- fwd + bwd


@pytest.mark.parametrize("grid,b,h,d,top_k,scale", [
    ((3, 5, 7), 2, 1, 16, 1, None),      # K = 1, batch 2, partial tiles on every axis
    ((5, 6, 10), 1, 1, 64, 3, None),     # D = 64
    ((5, 6, 10), 1, 2, 40, 5, 0.3),      # odd head dim (BLOCK_D 64 masked on D), custom scale
    ((1, 1, 1), 2, 1, 16, 1, None),      # a single one-token tile
    ((4, 4, 4), 1, 1, 16, 1, None),      # one full tile, no partial rows
])
def test_fp32_matches_reference(grid, b, h, d, top_k, scale, classes):
    lay = tile_layout(grid)
    q, k, v = make_qkv(b, lay.num_tokens, h, d, seed=sum(grid) + d)
    q2k, cnt = random_selection(b, h, lay.num_tiles, top_k, seed=d)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(7))
    got = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do, scale)
    want = reference_fwd_bwd(q, k, v, q2k, lay, do, scale=scale)
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.float32
    assert_all_finite(*got)
    for name, x, y in zip(NAMES, got, want):
        assert x.shape == y.shape
        assert rel_l2(x, y) < FP32_REL_L2, (name, rel_l2(x, y))


@pytest.fixture(params=["pointer", "tma"])
def tile_loads(request, monkeypatch):
    """Fetch the loops' tiles by pointer loads or by TMA descriptors (which the interpreter emulates)."""
    monkeypatch.setattr(bsa, "TMA_LOADS", "on" if request.param == "tma" else "off")
    return request.param


@pytest.mark.parametrize("dtype,grid,d,top_k", [
    (torch.float16, (5, 6, 10), 64, 3),
    (torch.bfloat16, (5, 6, 10), 64, 3),
    (torch.bfloat16, (3, 5, 7), 130, 2),  # BLOCK_D 256, masked on D
])
def test_low_precision_error_bounded_by_eager(dtype, grid, d, top_k, classes, tile_loads):
    lay = tile_layout(grid)
    q, k, v = make_qkv(1, lay.num_tokens, 1, d, dtype=dtype, seed=11)
    q2k, cnt = random_selection(1, 1, lay.num_tiles, top_k, seed=12)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(13)).to(dtype)
    got = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do)
    eager = reference_fwd_bwd(q, k, v, q2k, lay, do, dtype=dtype)
    exact = reference_fwd_bwd(q, k, v, q2k, lay, do)
    assert got[0].dtype == dtype and all(g.dtype == dtype for g in got[2:])
    assert_all_finite(*got)
    for name, x, e, y in zip(NAMES, got, eager, exact):
        bound = LOWP_FACTOR * rel_l2(e, y) if name != "lse" else FP32_REL_L2  # lse is fp32 on both sides
        assert rel_l2(x, y) <= bound, (name, rel_l2(x, y), bound)


def test_every_tile_selected_equals_dense_attention(classes):
    lay = tile_layout((3, 5, 7))
    n = lay.num_tiles
    q, k, v = make_qkv(2, lay.num_tokens, 1, 16, seed=21)
    q2k = torch.arange(n, dtype=torch.int32).expand(2, 1, n, n).contiguous()
    cnt = torch.full((2, 1, n), n, dtype=torch.int32)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(22))
    got = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do)
    q64, k64, v64 = leaves(q, k, v)
    logits = torch.einsum("bshd,bthd->bhst", q64, k64) / math.sqrt(16)
    out = torch.einsum("bhst,bthd->bshd", torch.softmax(logits, -1), v64)
    out.backward(do.double())
    sdpa = torch.nn.functional.scaled_dot_product_attention(*(x.double().transpose(1, 2) for x in (q, k, v)))
    torch.testing.assert_close(out.detach(), sdpa.transpose(1, 2))
    want = (out.detach(), torch.logsumexp(logits.detach(), -1), q64.grad, k64.grad, v64.grad)
    for name, x, y in zip(NAMES, got, want):
        assert rel_l2(x, y) < FP32_REL_L2, (name, rel_l2(x, y))


def test_short_and_empty_rows(classes):
    """q2k_cnt < K with garbage past it; a query tile with cnt 0 gives out 0, lse -inf and zero gradients."""
    lay = tile_layout((5, 6, 10))
    n = lay.num_tiles
    q, k, v = make_qkv(2, lay.num_tokens, 1, 16, seed=31)
    q2k, cnt = random_selection(2, 1, n, 4, seed=32, partial_counts=True)
    cnt[1, 0, 5] = 0  # a second empty tile, in the middle of the sequence
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(33))
    got = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do)
    out, lse, dq, dk, dv = got
    allowed = tile_map(q2k, cnt, n)
    q64, k64, v64 = leaves(q, k, v)
    want_out, want_lse = masked_dense(q64, k64, v64, allowed, lay)
    want_out.backward(do.double())
    assert_all_finite(out, dq, dk, dv)
    empty_q = (cnt == 0)[:, :, lay.token_tile]  # (B, H, S) rows of empty query tiles
    unused_kv = (~allowed.any(2))[:, :, lay.token_tile]  # (B, H, S) keys no query tile selected
    assert bool(empty_q.any()) and bool(unused_kv.any())
    assert bool((lse[empty_q] == float("-inf")).all()) and bool(torch.isfinite(lse[~empty_q]).all())
    for x, rows in ((out, empty_q), (dq, empty_q), (dk, unused_kv), (dv, unused_kv)):
        assert bool((x.transpose(1, 2)[rows] == 0).all())
    assert torch.equal(lse == float("-inf"), want_lse == float("-inf"))
    finite = torch.isfinite(want_lse)
    assert rel_l2(lse[finite], want_lse[finite]) < FP32_REL_L2
    for name, x, y in zip(NAMES[2:], (dq, dk, dv), (q64.grad, k64.grad, v64.grad)):
        assert rel_l2(x, y) < FP32_REL_L2, (name, rel_l2(x, y))
    assert rel_l2(out, want_out.detach()) < FP32_REL_L2


def test_lse_gradient_matches_reference():
    lay = tile_layout((3, 5, 7))
    q, k, v = make_qkv(1, lay.num_tokens, 2, 16, seed=41)
    q2k, cnt = random_selection(1, 2, lay.num_tiles, 2, seed=42)
    g = torch.Generator().manual_seed(43)
    do, dlse = torch.randn(q.shape, generator=g), torch.randn(1, 2, lay.num_tokens, generator=g)
    got = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do, dlse=dlse)
    want = reference_fwd_bwd(q, k, v, q2k, lay, do, dlse=dlse)
    for name, x, y in zip(NAMES, got, want):
        assert rel_l2(x, y) < FP32_REL_L2, (name, rel_l2(x, y))


def test_every_output_element_written(monkeypatch, classes):
    """Launcher allocations come back NaN-filled: any element a kernel skips would stay NaN. Grid (5, 6, 10) has
    tiles of 4, 8, 16, 32 and 64 tokens: every size class gets programs to run."""
    lay = tile_layout((5, 6, 10))
    n = lay.num_tiles
    q, k, v = make_qkv(2, lay.num_tokens, 1, 40, seed=51)
    q2k, cnt = random_selection(2, 1, n, 2, seed=52, partial_counts=True)
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def poison(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: poison(real_empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: poison(real_empty_like(*a, **kw)))
    off = lay.tile_offsets.to(torch.int32)
    out, lse = bsa.bsa_fwd(q, k, v, q2k, cnt, off)
    k2q, k2q_cnt = bsa.build_k2q(q2k, cnt, n)
    grads = bsa.bsa_bwd(torch.randn_like(q).normal_(), q, k, v, out, lse, q2k, cnt, k2q, k2q_cnt, off)
    monkeypatch.undo()
    assert_all_finite(out, *grads)
    assert not bool(torch.isnan(lse).any())  # -inf on empty rows is fine, NaN is not


def test_non_contiguous_inputs_and_gradient():
    """q, k, v as slices of one (B, S, 3, H, D) tensor and a stride-0 dO give the contiguous result bitwise."""
    lay = tile_layout((3, 5, 7))
    s, n = lay.num_tokens, lay.num_tiles
    qkv = torch.randn(2, s, 3, 2, 16, generator=torch.Generator().manual_seed(61))
    q2k, cnt = random_selection(2, 2, n, 3, seed=62)
    off = lay.tile_offsets.to(torch.int32)
    strided = leaves(*qkv.unbind(2), dtype=torch.float32)
    assert not strided[0].detach().is_contiguous()
    out, lse = bsa.block_sparse_attention(*strided, q2k, cnt, off)
    out.sum().backward()  # dO = ones expanded: stride 0 everywhere
    dense = leaves(*(x.contiguous() for x in qkv.unbind(2)), dtype=torch.float32)
    out2, lse2 = bsa.block_sparse_attention(*dense, q2k, cnt, off)
    out2.backward(torch.ones_like(out2))
    assert torch.equal(out, out2) and torch.equal(lse, lse2)
    for a, c in zip(strided, dense):
        assert torch.equal(a.grad, c.grad)


def test_backward_is_deterministic(classes):
    lay = tile_layout((3, 5, 7))
    q, k, v = make_qkv(1, lay.num_tokens, 1, 16, seed=71)
    q2k, cnt = random_selection(1, 1, lay.num_tiles, 3, seed=72)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(73))
    a = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do)
    b = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("dtype,b,h,d", [(torch.bfloat16, 2, 2, 16), (torch.float16, 1, 1, 64)])
def test_tma_loads_give_the_pointer_loads_result_bitwise(dtype, b, h, d, monkeypatch):
    """TMA boxes of partial tiles also read the next tile's rows (or the next batch's, or zeros past the end);
    the masks must make them count for exactly nothing: forward and all gradients equal the pointer-load path
    bitwise. Grid (5, 6, 10) has partial tiles on every axis; batch 2 puts boxes across the batch boundary."""
    lay = tile_layout((5, 6, 10))
    n = lay.num_tiles
    q, k, v = make_qkv(b, lay.num_tokens, h, d, dtype=dtype, seed=91)
    q2k, cnt = random_selection(b, h, n, 3, seed=92, partial_counts=True)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(93)).to(dtype)
    assert bsa._tma_layout_ok(q)
    results = {}
    for mode in ("off", "on"):
        monkeypatch.setattr(bsa, "TMA_LOADS", mode)
        assert bsa.use_tma(q, k, v) == (mode == "on")
        results[mode] = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do)
    assert_all_finite(results["on"][0], *results["on"][2:])
    for name, x, y in zip(NAMES, results["on"], results["off"]):
        assert torch.equal(x, y), name


def test_tma_only_where_the_layout_allows(monkeypatch):
    """TMA needs 16-bit (B*S, H*D)-viewable tensors with D a power of two; anything else takes pointer loads, and
    "auto" takes TMA only on a GPU of compute capability >= 9.0 (never under the interpreter)."""
    monkeypatch.setattr(bsa, "TMA_LOADS", "on")
    x = torch.randn(2, 70, 3, 32, dtype=torch.bfloat16)
    qkv = torch.randn(2, 70, 3, 3, 32, dtype=torch.bfloat16)
    assert bsa.use_tma(x) and bsa.use_tma(qkv[:, :, 1])  # a slice of a packed qkv: token stride 3*H*D
    assert not bsa.use_tma(x.float())  # fp32
    assert not bsa.use_tma(torch.randn(2, 70, 3, 40, dtype=torch.bfloat16))  # D not a power of two
    assert not bsa.use_tma(x.transpose(0, 1).contiguous().transpose(0, 1))  # batches not S tokens apart
    assert not bsa.use_tma(torch.randn(2, 3, 70, 32, dtype=torch.bfloat16).transpose(1, 2))  # heads not packed
    assert not bsa.use_tma(x[..., :16])  # D sliced: heads not packed
    flat = torch.randn(x.numel() + 1, dtype=torch.bfloat16)
    assert not bsa.use_tma(flat[1:].view(x.shape))  # base 2 bytes off a 16-byte boundary
    monkeypatch.setattr(bsa, "_have_tensor_descriptors", lambda: False)  # a Triton older than 3.4
    assert not bsa.use_tma(x)
    monkeypatch.undo()
    monkeypatch.setattr(bsa, "TMA_LOADS", "auto")
    assert not bsa.use_tma(x)  # CPU / interpreter
    monkeypatch.setattr(bsa, "TMA_LOADS", "sometimes")
    with pytest.raises(ValueError, match="TMA_LOADS"):
        bsa.use_tma(x)


# ---------------------------------------------------------------------------------------------- op, API


def test_custom_ops_pass_opcheck():
    lay = tile_layout((3, 5, 7))
    q, k, v = make_qkv(1, lay.num_tokens, 1, 16, seed=81, requires_grad=True)
    q2k, cnt = random_selection(1, 1, lay.num_tiles, 2, seed=82)
    off = lay.tile_offsets.to(torch.int32)
    torch.library.opcheck(bsa._bsa_op, (q, k, v, q2k, cnt, off, 0.25))
    out, lse = bsa.bsa_fwd(q.detach(), k.detach(), v.detach(), q2k, cnt, off, 0.25)
    args = (torch.randn_like(out), torch.randn_like(lse), q.detach(), k.detach(), v.detach(), out, lse, q2k, cnt,
            off, 0.25)
    torch.library.opcheck(bsa._bsa_bwd_op, args, test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph_matches_eager():
    lay = tile_layout((3, 5, 7))
    q, k, v = make_qkv(1, lay.num_tokens, 1, 16, seed=91)
    q2k, cnt = random_selection(1, 1, lay.num_tiles, 2, seed=92)
    off = lay.tile_offsets.to(torch.int32)

    def f(q, k, v):
        out, lse = bsa.block_sparse_attention(q, k, v, q2k, cnt, off)
        return (out * 2).sum() + lse.sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    xs, ys = leaves(q, k, v, dtype=torch.float32), leaves(q, k, v, dtype=torch.float32)
    f(*xs).backward()
    compiled(*ys).backward()
    for a, b in zip(xs, ys):
        assert torch.equal(a.grad, b.grad)


def test_no_grad_fast_path_skips_the_op(monkeypatch):
    lay = tile_layout((1, 1, 1))
    q, k, v = make_qkv(1, 1, 1, 16, seed=95, requires_grad=True)
    q2k, cnt = random_selection(1, 1, 1, 1, seed=96)
    off = lay.tile_offsets.to(torch.int32)
    with_op = bsa.block_sparse_attention(q, k, v, q2k, cnt, off)

    def boom(*args):
        raise AssertionError("custom op called without grad")

    monkeypatch.setattr(bsa, "_bsa_op", boom)
    with torch.no_grad():
        fast = bsa.block_sparse_attention(q, k, v, q2k, cnt, off)
    assert all(torch.equal(a.detach(), b) for a, b in zip(with_op, fast))


def test_fp32_backward_wider_than_128_is_refused_on_gpu(monkeypatch):
    """Compiled, its IEEE-fp32 operands would exceed shared memory: a clear error before the forward runs."""
    lay = tile_layout((1, 1, 1))
    q, k, v = make_qkv(1, 1, 1, 136, seed=97, requires_grad=True)
    q2k, cnt = random_selection(1, 1, 1, 1, seed=98)
    monkeypatch.setattr(bsa, "interpreting", lambda: False)
    with pytest.raises(ValueError, match="fp32 backward"):
        bsa.block_sparse_attention(q, k, v, q2k, cnt, lay.tile_offsets.to(torch.int32))


def _bad_inputs():
    lay = tile_layout((3, 5, 7))
    q, k, v = make_qkv(1, lay.num_tokens, 1, 16)
    q2k, cnt = random_selection(1, 1, lay.num_tiles, 2, seed=0)
    off = lay.tile_offsets.to(torch.int32)
    ok = dict(q=q, k=k, v=v, q2k=q2k, q2k_cnt=cnt, tile_offsets=off)
    return {
        "shape mismatch": {**ok, "k": k[:, :-1]},
        "dtype mismatch": {**ok, "v": v.half()},
        "float64": {**ok, "q": q.double(), "k": k.double(), "v": v.double()},
        "head dim > 256": {**ok, **{x: torch.randn(1, lay.num_tokens, 1, 272) for x in "qkv"}},
        "D not unit stride": {**ok, "q": torch.randn(1, lay.num_tokens, 1, 32)[..., ::2]},
        "int64 q2k": {**ok, "q2k": q2k.long()},
        "q2k rows": {**ok, "q2k": q2k[:, :, :-1]},
        "too few tiles": {**ok, "q2k": q2k[:, :, :1], "q2k_cnt": cnt[:, :, :1], "tile_offsets": off[:2]},
    }


@pytest.mark.parametrize("case", list(_bad_inputs()))
def test_public_function_rejects_bad_inputs(case):
    with pytest.raises(ValueError):
        bsa.block_sparse_attention(**_bad_inputs()[case])


@pytest.mark.skipif(not torch.cuda.is_available() or bsa.interpreting(),
                    reason="the second backward stream exists on CUDA only, without the interpreter")
def test_two_stream_backward_equals_one_stream(monkeypatch):
    """dQ on its own stream beside dK/dV (BWD_TWO_STREAMS) gives the one-stream gradients bitwise (GPU only; the
    interpreter runs one stream)."""
    lay = tile_layout((5, 6, 10), device="cuda")
    q, k, v = (x.cuda() for x in make_qkv(2, lay.num_tokens, 2, 64, dtype=torch.bfloat16, seed=101))
    q2k, cnt = (x.cuda() for x in random_selection(2, 2, lay.num_tiles, 3, seed=102, partial_counts=True))
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(103)).to(torch.bfloat16).cuda()
    results = {}
    for two in (False, True):
        monkeypatch.setattr(bsa, "BWD_TWO_STREAMS", two)
        results[two] = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do)
    for name, x, y in zip(NAMES, results[True], results[False]):
        assert torch.equal(x, y), name
