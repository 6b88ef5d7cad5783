"""Tests for kernels/sla_star_attn.py: `sla_star_attention`, VSA's block-sparse fine stage plus SLA*'s projected linear
branch (global and marginal scopes), with gradients one custom op (`vsagen::sla_star_attn`, backward
`vsagen::sla_star_attn_bwd` adding the branch's dQ / dK / dV into the block-sparse backward's buffers in place),
without gradients the two public functions one after the other; run under the Triton interpreter on CPU.

The oracle is float64 with autograd on the same (rounded) inputs: the block-sparse part from the tile map of the
used q2k entries (`masked_dense`, which takes rows shortened by q2k_cnt) plus F.linear of
`reference.linear_attention_branch` (with the tile map for `marginal`). Inputs are fresh random, batch 2, on the
grid (3, 5, 6) whose four tiles (48, 24, 12, 6 tokens) are all partial, with a random selection per (batch, head,
query tile): random counts, one row empty, one row of every tile, garbage past the counts. The fused op must equal
`block_sparse_attention` followed by `linear_branch_add` or `marginal_branch_add` (bitwise in fp32, where the
in-place sum is the same fp32 addition autograd does; within one bf16 rounding in bf16), also without gradients and
under torch.compile; its backward is bitwise deterministic and takes dO of any strides. Every case runs also with
the global branch in the sparse forward's epilogue (`LinearLaunch.fused_epilogue`), whose output is within fp32
reordering of the two launches.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
import torch.nn.functional as F
from conftest import FP32_REL_L2, UNUSED, assert_all_finite, leaves, masked_dense, rel_l2, tile_map

import vsagen.kernels.reference as ref
import vsagen.kernels.sla_star_attn as ssa
from vsagen.kernels.block_sparse_attn import block_sparse_attention
from vsagen.kernels.linear_branch import LinearLaunch, linear_branch_add
from vsagen.kernels.linear_marginal import marginal_branch_add
from vsagen.kernels.tuning import kernel_tuning, op_args
from vsagen.layout import tile_layout

# One pytest-xdist worker runs the whole file (`--dist loadgroup`, pyproject.toml): the module fixture runs each
# case's kernels once, not in each worker.
pytestmark = pytest.mark.xdist_group("test_sla_star_attn")

NAMES = ("out", "dq", "dk", "dv", "dweight", "dbias")
LAY = tile_layout((3, 5, 6))  # 4 tiles of 48, 24, 12 and 6 tokens: S = 90, every tile partial
SMALL = tile_layout((2, 4, 5))  # 2 tiles of 32 and 8 tokens: S = 40, for the tests that only compare runs
# Several chunks per batch-head in every linear-branch kernel (the interpreter counts 4 SMs), not the default
# launch: a launch that did not reach the kernels would change the fp32 sums and show in bitwise comparisons.
LAUNCH = LinearLaunch(block=16, fwd_warps=2, bwd_warps=2, programs_per_sm=8, stream_programs_per_sm=8)
# bf16 inputs: the interpreter computes in fp32 and rounds each part's output and gradients to bf16 (2^-9
# relative), then the sum once more: 5e-3 to 6e-3 measured against float64 on the rounded inputs; a real bug (a
# wrong mask, a missing part) is O(1e-1).
LOWP_REL_L2 = 1.5e-2
# The fused bf16 dq / dk / dv round the sparse part's bf16 gradient plus the branch's fp32 one once; the separate
# functions round the branch's gradient to bf16 first, then the sum: three half-ulp roundings (2^-9 relative each)
# apart at most, 4e-3 measured.
BF16_ROUNDINGS_REL_L2 = 2 ** -7
# Two fp32 computations of one GEMM in other blocks (the fused forward's epilogue against the apply kernel): 3e-8
# measured.
FP32_REORDER_REL_L2 = 1e-6

# (dtype, kind, scale, eps, head dim): every argument off its default in one case or the other
CASES = {
    "fp32": (torch.float32, "elu", 0.3, 1e-3, 16),
    "bf16": (torch.bfloat16, "softmax", None, ref.LINEAR_EPS, 24),  # odd head dim: BLOCK_D 32, masked on D
}


def varied_selection(b: int, h: int, n: int, seed: int):
    """(q2k (B, H, n, n), q2k_cnt (B, H, n)) int32: each row a random set of random size of the n key tiles,
    ascending, `UNUSED` past the count; the first row empty, the last every tile."""
    g = torch.Generator().manual_seed(seed)
    cnt = torch.randint(0, n + 1, (b, h, n), generator=g, dtype=torch.int32)
    cnt.view(-1)[0], cnt.view(-1)[-1] = 0, n
    q2k = torch.full((b, h, n, n), UNUSED, dtype=torch.int32)
    for idx in itertools.product(range(b), range(h), range(n)):
        c = int(cnt[idx])
        q2k[idx][:c] = torch.randperm(n, generator=g)[:c].sort().values
    return q2k, cnt


def make_case(lay, b, h, d, dtype=torch.float32, seed=0):
    """Fresh random ((q, k, v, weight, bias), (q2k, q2k_cnt), dout); weight and bias fp32 as `sla-star` keeps
    them, bias at 0.1 scale."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(b, lay.num_tokens, h, d, generator=g).to(dtype) for _ in range(4))
    weight, bias = torch.randn(d, d, generator=g) * d ** -0.5, torch.randn(d, generator=g) * 0.1
    return (q, k, v, weight, bias), varied_selection(b, h, lay.num_tiles, seed), dout


def fused(args, sel, lay, **kw):
    """sla_star_attention(q, k, v, q2k, q2k_cnt, tile_offsets, weight, bias, **kw)."""
    q, k, v, weight, bias = args
    return ssa.sla_star_attention(q, k, v, *sel, lay.tile_offsets_i32, weight, bias, **kw)


def separate(args, sel, lay, *, scope="global", kind="softmax", eps=ref.LINEAR_EPS, scale=None, tuning=None,
             launch=LAUNCH):
    """The same as two public functions: block_sparse_attention, then linear_branch_add (global) or
    marginal_branch_add (marginal)."""
    q, k, v, weight, bias = args
    o_s, _ = block_sparse_attention(q, k, v, *sel, lay.tile_offsets_i32, scale=scale, tuning=tuning)
    if scope == "marginal":
        return marginal_branch_add(o_s, q, k, v, weight, bias, *sel, lay.tile_offsets_i32, kind=kind, eps=eps,
                                   launch=launch)
    return linear_branch_add(o_s, q, k, v, weight, bias, kind=kind, eps=eps, launch=launch)


def fwd_bwd(args, sel, lay, dout, fn=fused, **kw):
    """fn(args, sel, lay, **kw) with autograd on copies of args: (out, dq, dk, dv, dweight, dbias); dout None:
    out.sum().backward() (autograd hands the backward ones expanded, strides 0)."""
    xs = [x.detach().clone().requires_grad_(True) for x in args]
    out = fn(xs, sel, lay, **kw)
    if dout is None:
        out.sum().backward()
    else:
        out.backward(dout)
    return (out.detach(), *(x.grad for x in xs))


def oracle(args, sel, lay, dout, *, scope, kind, eps, scale):
    """float64 masked dense attention over the used tiles + F.linear(linear_attention_branch) (over every key,
    or for `marginal` the tiles not used), with autograd."""
    xs = leaves(*args)
    q, k, v, weight, bias = xs
    block_map = tile_map(*sel, lay.num_tiles)
    o_s, _ = masked_dense(q, k, v, block_map, lay, scale)
    marginal = dict(block_map=block_map, slots=lay.slots, slot_valid=lay.slot_valid) if scope == "marginal" else {}
    out = o_s + F.linear(ref.linear_attention_branch(q, k, v, kind=kind, eps=eps, **marginal), weight, bias)
    out.backward(dout.double())
    return (out.detach(), *(x.grad for x in xs))


def errors(got, want) -> dict:
    return {name: rel_l2(a, b) for name, a, b in zip(NAMES, got, want)}


def assert_bitwise(got, want):
    assert all(torch.equal(a, b) for a, b in zip(got, want)), errors(got, want)


@pytest.fixture(scope="module", params=[f"{name}-{variant}" for name in CASES
                                        for variant in ("global", "epilogue", "marginal")])
def case(request):
    """One fused forward and backward per dtype and scope on LAY, batch 2, 2 heads, shared by the tests below
    ("epilogue": `global` with the branch in the sparse forward's epilogue, `LinearLaunch.fused_epilogue`):
    a dict of args, sel, dout, kw (sla_star_attention's keywords) and got (out and every gradient)."""
    name, variant = request.param.split("-")
    dtype, kind, scale, eps, d = CASES[name]
    args, sel, dout = make_case(LAY, 2, 2, d, dtype, seed=d)
    launch = dataclasses.replace(LAUNCH, fused_epilogue=variant == "epilogue")
    kw = dict(scope="global" if variant == "epilogue" else variant, kind=kind, eps=eps, scale=scale,
              tuning=kernel_tuning("cpu", d), launch=launch)
    return dict(dtype=dtype, args=args, sel=sel, dout=dout, kw=kw, got=fwd_bwd(args, sel, LAY, dout, **kw))


# ------------------------------------------------------------------------------------ against float64


def test_matches_float64_oracle(case):
    got, dtype, kw = case["got"], case["dtype"], case["kw"]
    assert_all_finite(*got)
    assert got[0].dtype == dtype and got[0].shape == case["args"][0].shape and got[0].is_contiguous()
    assert [g.dtype for g in got[1:]] == [x.dtype for x in case["args"]]
    want = oracle(case["args"], case["sel"], LAY, case["dout"], scope=kw["scope"], kind=kw["kind"], eps=kw["eps"],
                  scale=kw["scale"])
    errs = errors(got, want)
    assert all(e < (FP32_REL_L2 if dtype == torch.float32 else LOWP_REL_L2) for e in errs.values()), errs


def test_empty_query_tile_gets_only_the_branch(case):
    """The row with count 0 (batch 0, head 0, tile 0): out = proj(o_l) alone, the sparse part adds nothing (with
    nothing selected the marginal branch is the global one)."""
    (q, k, v, weight, bias), got = case["args"], case["got"]
    rows = slice(0, int(LAY.tile_offsets[1]))
    o_l = ref.linear_attention_branch(q.double(), k.double(), v.double(), kind=case["kw"]["kind"],
                                      eps=case["kw"]["eps"])
    branch = F.linear(o_l, weight.double(), bias.double())
    tol = FP32_REL_L2 if case["dtype"] == torch.float32 else LOWP_REL_L2
    assert rel_l2(got[0][0, rows, 0], branch[0, rows, 0]) < tol


# ------------------------------------------------------------------------------------ against the two functions


@pytest.fixture(scope="module")
def separate_runs():
    """The two public functions' fwd_bwd per (dtype, scope), run once for a `global` case and its `epilogue` twin:
    they have the same inputs (`case` seeds by head dim) and the same launches (`linear_branch_add` has no fused
    epilogue; `LinearLaunch.fused_epilogue` is read by `sla_star_attn` only)."""
    return {}


def test_equals_the_two_public_functions(case, separate_runs):
    """fp32: the fused in-place sums are the fp32 additions autograd does, so every gradient is bitwise equal; bf16:
    the projection's gradients bitwise, dq / dk / dv within bf16 rounding (BF16_ROUNDINGS_REL_L2). out: bitwise
    (the same launches), except with the branch in the sparse forward's epilogue, whose GEMM runs in column blocks
    of the (D, D) operand: within fp32 reordering (FP32_REORDER_REL_L2), and in bf16 one rounding of that."""
    key = (case["dtype"], case["kw"]["scope"])
    if key not in separate_runs:
        separate_runs[key] = fwd_bwd(case["args"], case["sel"], LAY, case["dout"], fn=separate, **case["kw"])
    want = separate_runs[key]
    got, errs = case["got"], errors(case["got"], want)
    if not case["kw"]["launch"].fused_epilogue:
        assert torch.equal(got[0], want[0]), errs
    else:
        assert errs["out"] < (FP32_REORDER_REL_L2 if case["dtype"] == torch.float32 else 2 ** -8), errs
    if case["dtype"] == torch.float32:
        assert_bitwise(got[1:], want[1:])
    else:
        assert_bitwise(got[4:], want[4:])
        assert all(errs[name] < BF16_ROUNDINGS_REL_L2 for name in ("dq", "dk", "dv")), errs


def test_no_grad_path_skips_the_op_and_gives_the_same_forward(case, monkeypatch):
    """Without gradients: the two public functions (with the epilogue: the op's forward, called directly)."""
    def boom(*_):
        raise AssertionError("custom op called without grad")

    monkeypatch.setattr(ssa, "_op", boom)
    assert torch.equal(fused(case["args"], case["sel"], LAY, **case["kw"]), case["got"][0])
    if case["dtype"] != torch.float32:  # whether gradients are needed does not depend on the dtype: fp32's scopes
        return
    with torch.no_grad():  # inputs that require grad, under no_grad: the same
        xs = [x.detach().requires_grad_(True) for x in case["args"]]
        assert torch.equal(fused(xs, case["sel"], LAY, **case["kw"]), case["got"][0])


def test_tuning_reaches_both_kernels(monkeypatch):
    """The block-sparse forward (also with the global branch in its epilogue) and backward inside the ops get the
    given tuning, not the default."""
    tuning = dataclasses.replace(kernel_tuning("cpu", 16), pack_partial_tiles=False, tma_loads=True)
    seen = []
    for name in ("bsa_fwd", "bsa_fwd_linear", "bsa_bwd"):
        real = getattr(ssa, name)

        def spy(*a, _real=real, _name=name, **kw):
            seen.append((_name, kw["tuning"]))
            return _real(*a, **kw)

        monkeypatch.setattr(ssa, name, spy)
    args, sel, dout = make_case(SMALL, 2, 1, 16, seed=3)
    fwd_bwd(args, sel, SMALL, dout, tuning=tuning)
    assert seen == [("bsa_fwd", tuning), ("bsa_bwd", tuning)]
    seen.clear()
    fwd_bwd(args, sel, SMALL, dout, tuning=tuning, launch=dataclasses.replace(LAUNCH, fused_epilogue=True))
    assert seen == [("bsa_fwd_linear", tuning), ("bsa_bwd", tuning)]


# ------------------------------------------------------------------------------------ backward


def test_backward_is_bitwise_deterministic_and_takes_expanded_dout():
    """Two runs with out.sum().backward() (dO ones expanded, strides 0) agree bitwise, and with a dense dO of
    ones."""
    args, sel, _ = make_case(SMALL, 2, 2, 16, seed=5)
    first = fwd_bwd(args, sel, SMALL, None, kind="relu")
    assert_bitwise(fwd_bwd(args, sel, SMALL, None, kind="relu"), first)
    assert_bitwise(fwd_bwd(args, sel, SMALL, torch.ones_like(args[0]), kind="relu"), first)


def test_strided_views_of_packed_qkv_match_contiguous_inputs():
    """q, k, v slices of one (B, S, 3, H, D) tensor: the contiguous copies' result bitwise, gradients flow into
    the packed tensor."""
    (q, k, v, weight, bias), sel, dout = make_case(SMALL, 2, 2, 16, seed=7)
    packed = torch.stack([q, k, v], 2).requires_grad_(True)
    weight, bias = weight.requires_grad_(True), bias.requires_grad_(True)
    views = packed.unbind(2)
    assert not views[0].is_contiguous()
    out = fused((*views, weight, bias), sel, SMALL, kind="elu")
    out.backward(dout)
    got = (out.detach(), *packed.grad.unbind(2), weight.grad, bias.grad)
    assert_bitwise(got, fwd_bwd((q, k, v, weight, bias), sel, SMALL, dout, kind="elu"))


def test_only_the_projection_requiring_grad_takes_the_op():
    """q, k, v frozen, the projection trained: the op runs and gives the projection the same gradients."""
    args, sel, dout = make_case(SMALL, 2, 1, 16, seed=9)
    weight, bias = (x.clone().requires_grad_(True) for x in args[3:])
    out = fused((*args[:3], weight, bias), sel, SMALL)
    out.backward(dout)
    want = fwd_bwd(args, sel, SMALL, dout)
    assert_bitwise((out.detach(), weight.grad, bias.grad), (want[0], *want[4:]))


def test_k_and_v_of_different_layouts():
    """v a (B, H, S, D) tensor transposed, k contiguous: the result of contiguous v."""
    (q, k, v, weight, bias), sel, dout = make_case(SMALL, 2, 2, 16, seed=15)
    v_heads_first = v.transpose(1, 2).contiguous().transpose(1, 2)
    want = fwd_bwd((q, k, v, weight, bias), sel, SMALL, dout)
    assert_bitwise(fwd_bwd((q, k, v_heads_first, weight, bias), sel, SMALL, dout), want)


# ------------------------------------------------------------------------------------ ops, compile


@pytest.mark.parametrize("scope,epilogue", [("global", False), ("global", True), ("marginal", False)])
def test_custom_ops_pass_opcheck(scope, epilogue):
    (q, k, v, weight, bias), (q2k, cnt), dout = make_case(SMALL, 1, 1, 16, seed=11)
    off, tuning = SMALL.tile_offsets_i32, op_args(kernel_tuning("cpu", 16))
    launch = dataclasses.astuple(dataclasses.replace(LAUNCH, fused_epilogue=epilogue))
    q, k, v, weight, bias = leaves(q, k, v, weight, bias, dtype=torch.float32)
    rest = (scope, "elu", 1e-5, *launch, *tuning)
    torch.library.opcheck(ssa._op, (q, k, v, q2k, cnt, off, 0.25, weight, bias, *rest))
    q, k, v, weight, bias = (x.detach() for x in (q, k, v, weight, bias))
    _, o_s, lse, kv, z = ssa._op(q, k, v, q2k, cnt, off, 0.25, weight, bias, *rest)
    torch.library.opcheck(
        ssa._bwd_op, (dout, q, k, v, o_s, lse, q2k, cnt, off, 0.25, weight, kv, z, *rest),
        test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("epilogue", [False, True])
def test_torch_compile_fullgraph_matches_eager(epilogue):
    args, sel, dout = make_case(SMALL, 2, 2, 16, seed=13)
    launch = dataclasses.replace(LAUNCH, fused_epilogue=epilogue)

    def f(xs, sel, lay, **kw):
        return fused(xs, sel, lay, **kw) * 2

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    want = fwd_bwd(args, sel, SMALL, dout, fn=f, kind="softmax", launch=launch)
    assert_bitwise(fwd_bwd(args, sel, SMALL, dout, fn=compiled, kind="softmax", launch=launch), want)
    with torch.no_grad():  # the no-grad path traced: both public functions' ops (with the epilogue: the op)
        assert torch.equal(compiled(args, sel, SMALL, kind="softmax", launch=launch), want[0])


# ------------------------------------------------------------------------------------ errors


def _bad_inputs():
    (q, k, v, weight, bias), (q2k, cnt), _ = make_case(SMALL, 1, 1, 16)
    off = SMALL.tile_offsets_i32
    ok = dict(q=q, k=k, v=v, q2k=q2k, q2k_cnt=cnt, tile_offsets=off, weight=weight, bias=bias)
    return {
        "k shape": ({**ok, "k": k[:, :-1]}, {}, "share one"),
        "v dtype": ({**ok, "v": v.bfloat16()}, {}, "share a dtype"),
        "q2k rows": ({**ok, "q2k": q2k[:, :, :-1]}, {}, "q2k must be"),
        "q2k_cnt shape": ({**ok, "q2k_cnt": cnt[0]}, {}, "q2k must be"),
        "int64 q2k": ({**ok, "q2k": q2k.long()}, {}, "int32"),
        "too few tiles": ({**ok, "q2k": q2k[:, :, :0], "q2k_cnt": cnt[:, :, :0], "tile_offsets": off[:1]}, {},
                          "tile_offsets must be"),
        "weight shape": ({**ok, "weight": weight[:, :8]}, {}, "weight must be"),
        "bias shape": ({**ok, "bias": bias[:8]}, {}, "weight must be"),
        "unknown kind": (ok, {"kind": "tanh"}, "feature map"),
        "unknown scope": (ok, {"scope": "local"}, "scope must be"),
        "marginal, 2-D tile_offsets": ({**ok, "tile_offsets": off.view(1, -1)}, {"scope": "marginal"},
                                       r"tile_offsets must be \(n_tiles \+ 1,\)"),
    }


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("name", list(_bad_inputs()))
def test_bad_inputs_raise(name, grad):
    """Refused with ValueError on both paths (no gradients: by the public function that gets the input)."""
    inputs, kw, match = _bad_inputs()[name]
    inputs = {key: x.requires_grad_(grad) if x.is_floating_point() else x for key, x in inputs.items()}
    with pytest.raises(ValueError, match=match):
        ssa.sla_star_attention(**inputs, **kw)


@pytest.mark.parametrize("scope,epilogue", [("global", True), ("global", False), ("marginal", False)])
def test_a_call_checks_the_block_sparse_inputs_once(scope, epilogue, input_checks):
    """Issue 44: `sla_star_attention` checked q, k, v and the lists, then `block_sparse_attention` under it again,
    then its launcher a third time. Now once per call, with or without gradients (the backward adds none), and a
    bad index dtype still fails with the contract's words."""
    args, sel, _ = make_case(SMALL, 1, 1, 16, seed=9)
    launch = dataclasses.replace(LAUNCH, fused_epilogue=epilogue)
    fused(args, sel, SMALL, scope=scope, launch=launch)
    assert input_checks == {"check_inputs": 1, "check_fp32_bwd": 0}
    fwd_bwd(args, sel, SMALL, None, scope=scope, launch=launch)
    assert input_checks == {"check_inputs": 2, "check_fp32_bwd": 1}
    with pytest.raises(ValueError, match="q2k, q2k_cnt and tile_offsets must be int32"):
        fused(args, (sel[0].long(), sel[1]), SMALL, scope=scope, launch=launch)
