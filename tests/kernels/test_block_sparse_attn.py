"""Tests for kernels/block_sparse_attn.py: the Triton block-sparse attention forward and backward (bsa_forward.py,
bsa_backward.py) through the custom ops and the public function, with explicit tunings (launch size classes, TMA
or pointer loads), run under the Triton interpreter on CPU.

Every comparison uses the same tile selection on both sides: full q2k rows go to the eager reference
(`reference.block_sparse_attention_reference`, float64, autograd for gradients); rows shortened by q2k_cnt go to
an explicit float64 masked dense attention built here from the tile map. Shapes stay small (the interpreter is
~50x slower than torch); every grid has partial tiles except (4, 4, 4).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import vsagen.kernels.block_sparse_attn as bsa
import vsagen.kernels.bsa_primitives as primitives
from conftest import (FP32_REL_L2, LOWP_FACTOR, NAMES, assert_all_finite, kernel_fwd_bwd, leaves, make_qkv,
                      masked_dense, random_selection, reference_fwd_bwd, rel_l2, tile_map)
from vsagen.kernels.tuning import KernelTuning, arch_tuning, kernel_tuning, op_args
from vsagen.layout import tile_layout


@pytest.fixture(params=["one_class", "size_classes"])
def classes(request):
    """Run every kernel as one launch of 64-row programs, or as three launches by tile size (16, 32 and 64 rows,
    each program exiting unless its tile falls in its class), for every head dim: a factory
    tuning(d, **changes) -> the CPU KernelTuning of head dim d with those launches (and `changes` replaced)."""
    split = request.param == "size_classes"

    def tuning(d: int, **changes) -> KernelTuning:
        base = kernel_tuning(torch.device("cpu"), d)
        new = {}
        for name in ("fwd_launch", "bwd_dq_launch", "bwd_dkdv_launch"):
            _, warps, stages = max(getattr(base, name))
            new[name] = ((16, 4, stages), (32, 4, stages), (64, warps, stages)) if split else ((64, warps, stages),)
        return dataclasses.replace(base, **new, **changes)

    tuning.param = request.param
    return tuning


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
    got = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do, scale, tuning=classes(d))
    want = reference_fwd_bwd(q, k, v, q2k, lay, do, scale=scale)
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.float32
    assert_all_finite(*got)
    for name, x, y in zip(NAMES, got, want):
        assert x.shape == y.shape
        assert rel_l2(x, y) < FP32_REL_L2, (name, rel_l2(x, y))


@pytest.fixture(params=["pointer", "tma"])
def tile_loads(request):
    """Fetch the loops' tiles by pointer loads or by TMA descriptors (which the interpreter emulates): the
    tuning's tma_loads."""
    return request.param == "tma"


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
    got = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do, tuning=classes(d, tma_loads=tile_loads))
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
    got = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do, tuning=classes(16))
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
    got = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do, tuning=classes(16))
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
    out, lse = bsa.bsa_fwd(q, k, v, q2k, cnt, off, tuning=classes(40))
    k2q, k2q_cnt = bsa.build_k2q(q2k, cnt, n)
    grads = bsa.bsa_bwd(torch.randn_like(q).normal_(), q, k, v, out, lse, q2k, cnt, k2q, k2q_cnt, off,
                        tuning=classes(40))
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
    a = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do, tuning=classes(16))
    b = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do, tuning=classes(16))
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("dtype,b,h,d", [(torch.bfloat16, 2, 2, 16), (torch.float16, 1, 1, 64)])
def test_tma_loads_give_the_pointer_loads_result_bitwise(dtype, b, h, d):
    """TMA boxes of partial tiles also read the next tile's rows (or the next batch's, or zeros past the end);
    the masks must make them count for exactly nothing: forward and all gradients equal the pointer-load path
    bitwise. Grid (5, 5, 7) has a whole and a partial tile along every axis; batch 2 puts boxes across the batch
    boundary."""
    lay = tile_layout((5, 5, 7))
    n = lay.num_tiles
    q, k, v = make_qkv(b, lay.num_tokens, h, d, dtype=dtype, seed=91)
    q2k, cnt = random_selection(b, h, n, 3, seed=92, partial_counts=True)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(93)).to(dtype)
    assert primitives.tma_layout_ok(q)
    results = {}
    for mode in ("off", "on"):
        tuning = dataclasses.replace(kernel_tuning(q.device, d), tma_loads=mode == "on")
        assert bsa.use_tma(q, k, v, wanted=tuning.tma_loads) == (mode == "on")
        results[mode] = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do, tuning=tuning)
    assert_all_finite(results["on"][0], *results["on"][2:])
    for name, x, y in zip(NAMES, results["on"], results["off"]):
        assert torch.equal(x, y), name


@pytest.mark.parametrize("tma,changes", [(False, [("streaming", True), ("streaming", False)]),
                                         (True, [("evict_first", False), ("cached", True)])])
def test_rocm_changes_give_the_plain_result_bitwise(tma, changes):
    """The ROCm seed's load hints and lean index traversal (pre-offset k2q entries) change how operands and
    indices are fetched, never the arithmetic: forward and gradients equal the plain kernels' bitwise (bf16,
    batch 2, partial tiles on every axis, short rows). The plain run of each load kind is computed once and
    compared with each of its changed runs."""
    lay = tile_layout((5, 6, 5))
    q, k, v = make_qkv(2, lay.num_tokens, 2, 16, dtype=torch.bfloat16, seed=95)
    q2k, cnt = random_selection(2, 2, lay.num_tiles, 3, seed=96, partial_counts=True)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(97)).to(torch.bfloat16)
    base = dataclasses.replace(kernel_tuning(q.device, 16), tma_loads=tma, lean_index=False)
    want = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do, tuning=base)
    for one_pass_loads, lean in changes:
        changed = dataclasses.replace(base, one_pass_loads=one_pass_loads, lean_index=lean)
        got = kernel_fwd_bwd(q, k, v, q2k, cnt, lay, do, tuning=changed)
        assert_all_finite(got[0], *got[2:])
        for name, x, y in zip(NAMES, got, want):
            assert torch.equal(x, y), (one_pass_loads, lean, name)


# ---------------------------------------------------------------------------------------------- op, API


def test_custom_ops_pass_opcheck():
    lay = tile_layout((3, 5, 7))
    q, k, v = make_qkv(1, lay.num_tokens, 1, 16, seed=81, requires_grad=True)
    q2k, cnt = random_selection(1, 1, lay.num_tiles, 2, seed=82)
    off = lay.tile_offsets.to(torch.int32)
    tuning = op_args(kernel_tuning(q.device, 16))
    torch.library.opcheck(bsa._bsa_op, (q, k, v, q2k, cnt, off, 0.25, *tuning))
    out, lse = bsa.bsa_fwd(q.detach(), k.detach(), v.detach(), q2k, cnt, off, 0.25)
    args = (torch.randn_like(out), torch.randn_like(lse), q.detach(), k.detach(), v.detach(), out, lse, q2k, cnt,
            off, 0.25, *tuning)
    torch.library.opcheck(bsa._bsa_bwd_op, args, test_utils=("test_schema", "test_faketensor"))
    rocm = op_args(arch_tuning("rocm-cdna3", 16, "rocm-vsa"))  # HIP options and the ROCm changes cross the op
    torch.library.opcheck(bsa._bsa_bwd_op, args[:11] + rocm, test_utils=("test_schema", "test_faketensor"))


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
    monkeypatch.setattr(primitives, "interpreting", lambda: False)
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


def test_a_launch_checks_its_inputs_once_and_bad_input_still_fails_clearly(input_checks):
    """Issue 44: the public function checked its inputs, then the launcher under it again (the backward a third
    time). Now each call checks once: the forward, the forward with its backward, the grouped forward; a launcher
    called directly still checks; and bad input through each path fails with the contract's words."""
    from vsagen.kernels.query_groups import build_query_groups

    lay = tile_layout((3, 5, 7))
    q, k, v = make_qkv(1, lay.num_tokens, 1, 16, seed=61)
    q2k, cnt = random_selection(1, 1, lay.num_tiles, 2, seed=62)
    off = lay.tile_offsets_i32
    bsa.block_sparse_attention(q, k, v, q2k, cnt, off)  # no grad: the fast path
    assert input_checks == {"check_inputs": 1, "check_fp32_bwd": 0}
    xs = leaves(q, k, v, dtype=torch.float32)
    out, lse = bsa.block_sparse_attention(*xs, q2k, cnt, off)  # the custom op, and its backward
    (out.sum() + lse.sum()).backward()
    assert input_checks == {"check_inputs": 2, "check_fp32_bwd": 1}
    groups = build_query_groups(q2k[0], cnt[0], off, 16)
    bsa.block_sparse_attention_grouped(q, k, v, q2k, cnt, off, groups, (16, 4, 1, 16, 4, 1))
    assert input_checks == {"check_inputs": 3, "check_fp32_bwd": 1}
    bsa.bsa_fwd(q, k, v, q2k, cnt, off)  # the launcher, called directly, checks
    assert input_checks == {"check_inputs": 4, "check_fp32_bwd": 1}
    calls = [lambda *a: bsa.block_sparse_attention(*a),
             lambda q, *a: bsa.block_sparse_attention(q.requires_grad_(True), *a),
             lambda *a: bsa.block_sparse_attention_grouped(*a, groups, (16, 4, 1, 16, 4, 1)),
             lambda *a: bsa.bsa_fwd(*a)]
    for call in calls:
        with pytest.raises(ValueError, match="q2k, q2k_cnt and tile_offsets must be int32"):
            call(q.clone(), k, v, q2k.long(), cnt, off)
        with pytest.raises(ValueError, match="q, k, v must share one"):
            call(q.clone(), k[:, :-1], v, q2k, cnt, off)
