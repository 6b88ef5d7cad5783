"""Tests for kernels/linear_marginal.py: SLA*'s `marginal` linear-attention branch in Triton (`marginal_branch_add`,
out = o + Linear(o_l) with o_l, for a query in tile i, linear attention over the key tiles that tile i did NOT
select), forward and backward through the custom ops `vsagen::sla_marginal` / `vsagen::sla_marginal_bwd`, and
`marginal_branch_backward` adding into given gradients; run under the Triton interpreter on CPU.

The oracle is float64 with autograd on the same (rounded) inputs: `reference.linear_attention_branch` with the
block map of the used q2k entries (`tile_map`) plus F.linear. Inputs are fresh random: every feature map in fp32 and
in bf16, batch 2, grids whose tiles are all partial ((3, 5, 6): 48, 24, 12, 6 tokens; (2, 4, 5): 32, 8), head dims
16, 24 (BLOCK_D 32, masked on D) and 128, selections drawn per (batch, head, query tile) with every count from none to
all tiles (q2k rows of n entries, and top-k rows of K < n), garbage past the counts. Invariants: a query tile that
selected every tile gets o + bias exactly and, when every tile did, no gradient reaches q, k, v; with nothing
selected the branch is the global one (`linear_branch_add`); the order of a q2k row does not matter; the backward
is bitwise deterministic, takes dO of any strides and adds into given gradients; relu rows with phi = 0 stay
finite.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
import torch.nn.functional as F
from conftest import FP32_REL_L2, UNUSED, assert_all_finite, leaves, random_selection, rel_l2, tile_map

import vsagen.kernels.linear_marginal as lm
import vsagen.kernels.reference as ref
from vsagen.kernels.linear_branch import LINEAR_EPS, LinearLaunch, linear_branch_add
from vsagen.kernels.linear_marginal import marginal_branch_add, marginal_branch_backward
from vsagen.layout import tile_layout

NAMES = ("out", "do", "dq", "dk", "dv", "dweight", "dbias")
LAY = tile_layout((3, 5, 6))  # 4 tiles of 48, 24, 12 and 6 tokens: S = 90, every tile partial
SMALL = tile_layout((2, 4, 5))  # 2 tiles of 32 and 8 tokens: S = 40, for the tests that only compare runs
# Other warp counts than the default (the marginal kernels take only a LinearLaunch's warps)
SPLIT = LinearLaunch(block=16, fwd_warps=2, bwd_warps=2, programs_per_sm=8)
# bf16 inputs: the interpreter computes in fp32 but rounds o_l and dO W / den (saved for the backward) to bf16 as
# well as every output and gradient, and its fp32 -> bf16 casts truncate (up to 2^-8 relative, not 2^-9): up to
# 6e-3 relative L2 measured against float64 on the rounded inputs; a real bug (a wrong tile, a missing term) is
# O(1e-1).
LOWP_REL_L2 = 1e-2
# Two fp32 computations of the same branch that sum in another order (the global kernels fold W into KV, the
# marginal ones sum the per-tile sums over the unselected tiles): measured up to 3e-7.
REORDER_REL_L2 = 2e-6


def block_map_selection(block_map: torch.Tensor):
    """(q2k (B, H, n, n), q2k_cnt (B, H, n)) int32 listing each row's True tiles ascending, `UNUSED` past them."""
    cnt = block_map.sum(-1, dtype=torch.int32)
    q2k = (~block_map).to(torch.uint8).argsort(dim=-1, stable=True).to(torch.int32)
    return q2k.masked_fill(torch.arange(block_map.shape[-1]) >= cnt.unsqueeze(-1), UNUSED), cnt


def random_block_map(b: int, h: int, n: int, seed: int) -> torch.Tensor:
    """(B, H, n, n) bool, each row a random set of a random density; the first row empty, the last every tile."""
    g = torch.Generator().manual_seed(seed)
    bm = torch.rand(b, h, n, n, generator=g) < torch.rand(b, h, n, 1, generator=g)
    bm.view(-1, n)[0], bm.view(-1, n)[-1] = False, True
    return bm


def shuffled(q2k: torch.Tensor, cnt: torch.Tensor, seed: int):
    """The same selection with each row's used entries in random order (the garbage stays past the count)."""
    keys = torch.rand(q2k.shape, generator=torch.Generator().manual_seed(seed))
    keys = keys.masked_fill(torch.arange(q2k.shape[-1]) >= cnt.unsqueeze(-1), 2.0)
    return q2k.gather(-1, keys.argsort(-1)), cnt


def make_case(lay, b, h, d, dtype=torch.float32, seed=0, weight_dtype=torch.float32):
    """Fresh random ((o, q, k, v, weight, bias), dout); o and bias at 0.1 scale, so the branch is a large part of
    out."""
    g = torch.Generator().manual_seed(seed)
    o, q, k, v, dout = (torch.randn(b, lay.num_tokens, h, d, generator=g).to(dtype) for _ in range(5))
    weight = (torch.randn(d, d, generator=g) * d ** -0.5).to(weight_dtype)
    bias = (torch.randn(d, generator=g) * 0.1).to(weight_dtype)
    return (o * 0.1, q, k, v, weight, bias), dout


def run(args, sel, lay, dout, fn=marginal_branch_add, **kw):
    """fn(o, q, k, v, weight, bias, q2k, q2k_cnt, tile_offsets, **kw) with autograd on copies of args: (out, do,
    dq, dk, dv, dweight, dbias); dout None: out.sum().backward() (autograd hands on ones expanded, strides 0)."""
    xs = [x.detach().clone().requires_grad_(True) for x in args]
    out = fn(*xs, *sel, lay.tile_offsets_i32, **kw)
    torch.autograd.backward(out.sum() if dout is None else out, dout)
    return (out.detach(), *(x.grad for x in xs))


def global_branch(o, q, k, v, weight, bias, q2k, q2k_cnt, tile_offsets, **kw):
    """`linear_branch_add` with `run`'s signature (the selection unused)."""
    return linear_branch_add(o, q, k, v, weight, bias, **kw)


def oracle(args, sel, lay, dout, *, kind, eps=LINEAR_EPS):
    """o + F.linear(marginal linear_attention_branch) in float64 with autograd: (out, do, dq, ..., dbias)."""
    xs = leaves(*args)
    o, q, k, v, weight, bias = xs
    o_l = ref.linear_attention_branch(q, k, v, kind=kind, eps=eps, block_map=tile_map(*sel, lay.num_tiles),
                                      slots=lay.slots, slot_valid=lay.slot_valid)
    out = o + F.linear(o_l, weight, bias)
    torch.autograd.backward(out, dout.double())
    return (out.detach(), *(x.grad for x in xs))


def errors(got, want) -> dict:
    return {name: rel_l2(a, b) for name, a, b in zip(NAMES, got, want)}


def assert_bitwise(got, want):
    assert all(torch.equal(a, b) for a, b in zip(got, want)), errors(got, want)


def assert_rounded_once(got: torch.Tensor, exact: torch.Tensor):
    """got is the fp32 `exact` rounded once to got's dtype: to nearest (torch, the GPU) or toward zero (the Triton
    interpreter's fp32 -> bf16 casts truncate); for fp32, exact itself."""
    ok = got == exact.to(got.dtype)
    if got.dtype == torch.bfloat16:
        ok |= got == (exact.view(torch.int32) & -(1 << 16)).view(torch.float32).to(got.dtype)
    assert bool(ok.all())


def tile_rows(lay, i: int) -> slice:
    return slice(int(lay.tile_offsets[i]), int(lay.tile_offsets[i + 1]))


# name: (layout, dtype, kind, head dim, selection, weight dtype, eps, launch); every feature map in both dtypes
CASES = {
    "fp32-softmax": (LAY, torch.float32, "softmax", 16, "map", torch.float32, LINEAR_EPS, lm.DEFAULT_LAUNCH),
    "fp32-elu": (LAY, torch.float32, "elu", 24, "top_k", torch.float32, 1e-3, SPLIT),
    "fp32-relu": (SMALL, torch.float32, "relu", 24, "map", torch.float32, LINEAR_EPS, SPLIT),
    "bf16-softmax": (LAY, torch.bfloat16, "softmax", 24, "map", torch.float32, LINEAR_EPS, SPLIT),
    "bf16-elu": (SMALL, torch.bfloat16, "elu", 16, "map", torch.bfloat16, LINEAR_EPS, lm.DEFAULT_LAUNCH),
    "bf16-relu": (LAY, torch.bfloat16, "relu", 16, "top_k", torch.float32, 1e-3, lm.DEFAULT_LAUNCH),
    "fp32-softmax-d128": (SMALL, torch.float32, "softmax", 128, "top_k", torch.float32, LINEAR_EPS, SPLIT),
}


@functools.cache
def computed(name: str) -> dict:
    """One forward and backward of CASES[name] (batch 2, 2 heads), shared by the tests: a dict of lay, dtype,
    args, sel, dout, kw (marginal_branch_add's keywords) and got (out and every gradient)."""
    lay, dtype, kind, d, how, weight_dtype, eps, launch = CASES[name]
    n = lay.num_tiles
    sel = (block_map_selection(random_block_map(2, 2, n, seed=d)) if how == "map"
           else random_selection(2, 2, n, n // 2, seed=d, partial_counts=True))
    args, dout = make_case(lay, 2, 2, d, dtype, seed=n + d, weight_dtype=weight_dtype)
    kw = dict(kind=kind, eps=eps, launch=launch)
    return dict(lay=lay, dtype=dtype, args=args, sel=sel, dout=dout, kw=kw, got=run(args, sel, lay, dout, **kw))


@pytest.fixture(params=list(CASES))
def case(request):
    return computed(request.param)


# ------------------------------------------------------------------------------------ against float64


def test_selections_cover_every_count():
    """The map selections hold every count from 0 to n (rows of n entries); the top-k ones 0 to K < n."""
    for name in ("fp32-softmax", "bf16-elu"):
        q2k, cnt = computed(name)["sel"]
        assert set(cnt.unique().tolist()) == set(range(q2k.shape[-1] + 1)), name
    q2k, cnt = computed("fp32-elu")["sel"]
    assert q2k.shape[-1] < LAY.num_tiles and set(cnt.unique().tolist()) == set(range(q2k.shape[-1] + 1))


def test_matches_float64_oracle(case):
    got, dtype, args = case["got"], case["dtype"], case["args"]
    assert_all_finite(*got)
    assert got[0].dtype == dtype and got[0].shape == args[0].shape and got[0].is_contiguous()
    assert [g.dtype for g in got[1:]] == [x.dtype for x in args]
    assert torch.equal(got[1], case["dout"])  # the gradient of o is dout itself
    want = oracle(args, case["sel"], case["lay"], case["dout"], kind=case["kw"]["kind"], eps=case["kw"]["eps"])
    errs = errors(got, want)
    assert all(e < (FP32_REL_L2 if dtype == torch.float32 else LOWP_REL_L2) for e in errs.values()), errs


def test_query_tile_that_selected_every_tile_gets_o_plus_bias_exactly(case):
    """Rows whose count is n (the map selections' last row, at least): o_l is exactly 0."""
    (o, _, _, _, _, bias), (q2k, cnt), out = case["args"], case["sel"], case["got"][0]
    full = (cnt == case["lay"].num_tiles).nonzero().tolist()
    assert full or q2k.shape[-1] < case["lay"].num_tiles
    for b, h, i in full:
        rows = tile_rows(case["lay"], i)
        assert_rounded_once(out[b, rows, h], o[b, rows, h].float() + bias.float())


def test_no_grad_path_skips_the_op_and_matches_it(case, monkeypatch):
    def boom(*_):
        raise AssertionError("custom op called without grad")

    monkeypatch.setattr(lm, "_op", boom)
    args, sel, lay = case["args"], case["sel"], case["lay"]
    assert torch.equal(marginal_branch_add(*args, *sel, lay.tile_offsets_i32, **case["kw"]), case["got"][0])
    with torch.no_grad():  # inputs that require grad, under no_grad: the same
        xs = [x.detach().requires_grad_(True) for x in args]
        assert torch.equal(marginal_branch_add(*xs, *sel, lay.tile_offsets_i32, **case["kw"]), case["got"][0])


# ------------------------------------------------------------------------------------ invariants


@pytest.mark.parametrize("dtype,kind", [(torch.float32, "softmax"), (torch.bfloat16, "elu")])
def test_every_tile_selected_gives_o_plus_bias_and_no_qkv_gradient(dtype, kind):
    """Every query tile selected every key tile (rows in random order): out = o + bias exactly; q, k, v get
    exactly zero gradient, the projection dW = 0 and dbias = sum dO."""
    n = LAY.num_tiles
    sel = shuffled(*block_map_selection(torch.ones(2, 1, n, n, dtype=torch.bool)), seed=1)
    args, dout = make_case(LAY, 2, 1, 24, dtype, seed=3)
    out, do, dq, dk, dv, dweight, dbias = run(args, sel, LAY, dout, kind=kind)
    o, bias = args[0], args[5]
    assert_rounded_once(out, o.float() + bias.float())
    assert torch.equal(do, dout)
    assert not any(bool(g.any()) for g in (dq, dk, dv, dweight))
    assert rel_l2(dbias, dout.double().sum((0, 1, 2))) < FP32_REL_L2


@pytest.mark.parametrize("kind", ref.FEATURE_MAPS)
def test_empty_selection_is_the_global_branch(kind):
    """No tile selected anywhere: the marginal branch is the global one, forward and backward, within fp32
    rounding (q2k rows of garbage only)."""
    n = SMALL.num_tiles
    sel = (torch.full((2, 2, n, n), UNUSED, dtype=torch.int32), torch.zeros(2, 2, n, dtype=torch.int32))
    args, dout = make_case(SMALL, 2, 2, 24, seed=5)
    got = run(args, sel, SMALL, dout, kind=kind, launch=SPLIT)
    errs = errors(got, run(args, sel, SMALL, dout, fn=global_branch, kind=kind))
    assert all(e < REORDER_REL_L2 for e in errs.values()), errs


def test_batch_head_groups_give_the_one_group_result(monkeypatch):
    """A sums budget for groups of 1 and of 4 batch-heads (B=2, H=3: a group of 4 splits the second batch):
    bitwise the one-group result, forward and backward."""
    args, dout = make_case(SMALL, 2, 3, 16, seed=25)
    sel = block_map_selection(random_block_map(2, 3, SMALL.num_tiles, seed=25))
    want = run(args, sel, SMALL, dout, kind="softmax")
    n = SMALL.num_tiles
    for per in (1, 4):
        monkeypatch.setattr(lm, "SUMS_BUDGET_BYTES", 2 * n * 16 * 16 * 4 * per)  # fp32 sums under the interpreter
        assert len(lm._groups(6, n, 16, 4)) == -(-6 // per)
        assert_bitwise(run(args, sel, SMALL, dout, kind="softmax"), want)


def test_q2k_row_order_does_not_matter():
    """The fp32 softmax case with every q2k row shuffled: the same result up to the order of the fp32 sums."""
    case = computed("fp32-softmax")
    sel = shuffled(*case["sel"], seed=7)
    assert not torch.equal(sel[0], case["sel"][0])
    errs = errors(run(case["args"], sel, LAY, case["dout"], **case["kw"]), case["got"])
    assert all(e < REORDER_REL_L2 for e in errs.values()), errs


def test_relu_rows_with_phi_zero_stay_finite():
    """relu: query rows with every entry negative (phi = 0: o_l = 0, out = o + bias exactly, dq = 0), key rows
    likewise (dk = 0), and a head whose keys are all negative (every sum 0): finite and equal to the oracle."""
    args, dout = make_case(LAY, 2, 2, 16, seed=9)
    o, q, k, v, weight, bias = args
    q[:, :5] = -q[:, :5].abs() - 0.1
    k[:, 10:20] = -k[:, 10:20].abs() - 0.1
    k[1, :, 0] = -k[1, :, 0].abs() - 0.1
    sel = block_map_selection(random_block_map(2, 2, LAY.num_tiles, seed=9))
    got = run(args, sel, LAY, dout, kind="relu")
    assert_all_finite(*got)
    errs = errors(got, oracle(args, sel, LAY, dout, kind="relu"))
    assert all(e < FP32_REL_L2 for e in errs.values()), errs
    out, dq, dk = got[0], got[2], got[3]
    assert torch.equal(out[:, :5], (o + bias)[:, :5]) and torch.equal(out[1, :, 0], (o + bias)[1, :, 0])
    assert not bool(dq[:, :5].any()) and not bool(dk[:, 10:20].any()) and not bool(dk[1, :, 0].any())


def test_relu_unselected_keys_all_zero_give_o_plus_bias():
    """relu, tile 1's keys all negative, both query tiles selected tile 0 only: the unselected share is exactly
    zero, so o_l = 0 and out = o + bias (the oracle's value), and the branch passes no gradient to q, k, v, W
    (a regression test: the total minus the selected part once left an O(1) o_l from rounding)."""
    args, dout = make_case(SMALL, 1, 1, 16, seed=11)
    o, q, k, v, weight, bias = args
    k[:, tile_rows(SMALL, 1)] = -k[:, tile_rows(SMALL, 1)].abs() - 0.1
    sel = (torch.zeros(1, 1, 2, 1, dtype=torch.int32), torch.ones(1, 1, 2, dtype=torch.int32))
    leaves = [x.clone().requires_grad_(True) for x in args]
    out = marginal_branch_add(*leaves, *sel, SMALL.tile_offsets_i32, kind="relu")
    assert torch.equal(out, o + bias)
    out.backward(dout)
    assert all(not bool(x.grad.any()) for x in leaves[1:5])  # q, k, v, weight: no branch left


# ------------------------------------------------------------------------------------ backward


def test_backward_is_bitwise_deterministic_and_takes_dout_of_any_strides():
    """out.sum().backward() (dO ones expanded, strides 0) twice: bitwise equal, and equal to a dense dO of ones;
    a dO strided on D and one in a (B, H, S, D) layout: bitwise the gradients of their contiguous copies."""
    args, _ = make_case(SMALL, 2, 2, 16, seed=13)
    sel = block_map_selection(random_block_map(2, 2, SMALL.num_tiles, seed=13))
    first = run(args, sel, SMALL, None, kind="elu")
    assert_bitwise(run(args, sel, SMALL, None, kind="elu"), first)
    assert_bitwise(run(args, sel, SMALL, torch.ones_like(args[0]), kind="elu"), first)
    dout = torch.randn(args[0].shape, generator=torch.Generator().manual_seed(13))
    want = run(args, sel, SMALL, dout, kind="elu")
    for strided in (torch.stack([dout, -dout], -1).flatten(-2)[..., ::2],
                    dout.transpose(1, 2).contiguous().transpose(1, 2)):
        assert not strided.is_contiguous()
        assert_bitwise(run(args, sel, SMALL, strided, kind="elu"), want)


def test_backward_adds_into_given_grads():
    """`grads=(dq, dk, dv)` (another part's gradients; dq and dk in a (B, H, S, D) layout, dv contiguous: dk and dv
    of different strides): the branch's are added in place, bitwise the fp32 sums with the fresh gradients."""
    (o, q, k, v, weight, bias), dout = make_case(SMALL, 2, 2, 24, seed=15)
    sel = block_map_selection(random_block_map(2, 2, SMALL.num_tiles, seed=15))
    off, kw = SMALL.tile_offsets_i32, ("softmax", LINEAR_EPS, SPLIT)
    saved = (q, k, v, weight, *sel, off, *kw)
    fresh = marginal_branch_backward(dout, *saved)
    g = torch.Generator().manual_seed(15)
    base = [torch.randn(q.transpose(1, 2).shape, generator=g).transpose(1, 2) for _ in range(2)]
    base.append(torch.randn(q.shape, generator=g))
    given = tuple(x.clone() for x in base)
    got = marginal_branch_backward(dout, *saved, grads=given)
    assert all(a is b for a, b in zip(got[:3], given))
    assert all(torch.equal(a, b + f) for a, b, f in zip(got[:3], base, fresh[:3]))
    assert_bitwise(got[3:], fresh[3:])


def test_strided_views_of_packed_qkv_match_contiguous_inputs():
    """q and k slices of a packed (B, S, 2, H, D) tensor, v contiguous (other strides than k), o a (B, H, S, D)
    tensor transposed: the contiguous copies' result bitwise, gradients flow into the packed tensor."""
    (o, q, k, v, weight, bias), dout = make_case(SMALL, 2, 2, 16, seed=17)
    sel = block_map_selection(random_block_map(2, 2, SMALL.num_tiles, seed=17))
    packed = torch.stack([q, k], 2).requires_grad_(True)
    o_t = o.transpose(1, 2).contiguous().requires_grad_(True)
    v, weight, bias = (x.clone().requires_grad_(True) for x in (v, weight, bias))
    out = marginal_branch_add(o_t.transpose(1, 2), *packed.unbind(2), v, weight, bias, *sel,
                              SMALL.tile_offsets_i32, kind="softmax")
    out.backward(dout)
    got = (out.detach(), o_t.grad.transpose(1, 2), *packed.grad.unbind(2), v.grad, weight.grad, bias.grad)
    assert_bitwise(got, run((o, q, k, v, weight, bias), sel, SMALL, dout, kind="softmax"))


# ------------------------------------------------------------------------------------ ops, compile


def test_custom_ops_pass_opcheck():
    (o, q, k, v, weight, bias), dout = make_case(SMALL, 1, 1, 16, seed=19)
    sel = block_map_selection(random_block_map(1, 1, SMALL.num_tiles, seed=19))
    rest = (*sel, SMALL.tile_offsets_i32, "elu", 1e-5, *dataclasses.astuple(SPLIT))
    xs = leaves(o, q, k, v, weight, bias, dtype=torch.float32)
    torch.library.opcheck(lm._op, (*xs, *rest),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    torch.library.opcheck(lm._bwd_op, (dout, q, k, v, weight, *rest),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph_matches_eager():
    args, dout = make_case(SMALL, 2, 2, 16, seed=21)
    sel = block_map_selection(random_block_map(2, 2, SMALL.num_tiles, seed=21))

    def f(*xs, **kw):
        return marginal_branch_add(*xs, **kw) * 2

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    want = run(args, sel, SMALL, dout, fn=f, kind="relu")
    assert_bitwise(run(args, sel, SMALL, dout, fn=compiled, kind="relu"), want)
    # without grad the compiled graph still calls the op (the eager fast path is skipped while compiling)
    assert torch.equal(compiled(*args, *sel, SMALL.tile_offsets_i32, kind="relu"), want[0])


# ------------------------------------------------------------------------------------ errors


def test_bad_inputs_raise():
    (o, q, k, v, weight, bias), _ = make_case(LAY, 1, 1, 16, seed=23)
    q2k, cnt = random_selection(1, 1, LAY.num_tiles, 2, seed=23)
    off = LAY.tile_offsets_i32
    good = dict(o=o, q=q, k=k, v=v, weight=weight, bias=bias, q2k=q2k, q2k_cnt=cnt, tile_offsets=off)
    bad = [
        ({"q2k": q2k[0]}, "q2k must be"),  # 3-d
        ({"q2k": q2k[:, :, :-1]}, "q2k must be"),  # a query tile short
        ({"q2k_cnt": cnt[..., :-1]}, "q2k must be"),
        ({"q2k": q2k.long()}, "int32"),
        ({"q2k_cnt": cnt.long()}, "int32"),
        ({"tile_offsets": off.long()}, "int32"),
        ({"q2k": q2k[:, :, :1], "q2k_cnt": cnt[:, :, :1], "tile_offsets": off[:2]}, "cannot hold S = 90"),
        ({"kind": "tanh"}, "feature map"),
        ({"k": k[:, :-1]}, "share one"),
        ({"weight": weight[:, :8]}, "weight must be"),
        ({"tile_offsets": off.view(1, -1)}, r"tile_offsets must be \(n_tiles \+ 1,\)"),  # review: was accepted
        ({"q2k_cnt": cnt.to("meta")}, "on q's device"),
    ]
    for change, match in bad:
        with pytest.raises(ValueError, match=match):
            marginal_branch_add(**{**good, **change})
        with pytest.raises(ValueError, match=match):  # the op path checks the same
            marginal_branch_add(**{**good, **change, "v": v.clone().requires_grad_(True)})


# Its kernels' AMD Instinct builds (gfx942, GEMMs on the matrix cores): tests/kernels/test_amd_build.py.
