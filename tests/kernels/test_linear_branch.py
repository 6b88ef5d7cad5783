"""Tests for kernels/linear_branch.py: SLA*'s global linear-attention branch fused in Triton (`linear_branch_add`,
out = o + Linear(o_l)), forward and backward through the custom ops `vsagen::sla_linear` / `vsagen::sla_linear_bwd`,
`linear_branch_backward` (also adding into given gradients) and `kv_sums`, run under the Triton interpreter on
CPU.

The oracle is the eager branch (`reference.linear_attention_branch`) plus `torch.nn.functional.linear`, in float64
with autograd, on fresh random inputs: every feature map, batch 2, token counts that end in a partial block (37,
150), head dims 16, 128 and 24 (BLOCK_D 32 masked on D), fp32 / bf16 / fp16, strided views of a packed qkv, dO of
any strides, and launches of 1 to 5 chunks. Invariants: an identity projection adds plain linear attention (an
S x S formula written here), a zero projection returns o bitwise, the backward is bitwise deterministic, relu rows
with phi = 0 stay finite.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from conftest import FP32_REL_L2, assert_all_finite, leaves, rel_l2

import vsagen.kernels.linear_branch as lb
import vsagen.kernels.reference as ref
from vsagen.kernels.linear_branch import (DEFAULT_LAUNCH, LinearLaunch, kv_sums, linear_branch_add,
                                          linear_branch_backward)

# One pytest-xdist worker runs the whole file (`--dist loadgroup`, pyproject.toml): the module fixture runs the
# default launch once, not in each worker.
pytestmark = pytest.mark.xdist_group("test_linear_branch")

# bf16 / fp16 inputs: under the interpreter the kernels compute in fp32 and round each output and gradient once
# to the dtype (2^-9 relative for bf16): 3e-3 to 4e-3 relative L2 measured against float64 on the rounded inputs;
# a real bug (a wrong mask, a missing term) is O(1e-1).
LOWP_REL_L2 = 1e-2
NAMES = ("out", "do", "dq", "dk", "dv", "dweight", "dbias")
# Launches whose kernels split each batch-head into one chunk and into several (the interpreter counts 4 SMs;
# B*H = 4 below): (stream_)programs_per_sm 1 -> 1 chunk, 8 -> min(blocks, 8) chunks of whole blocks.
ONE_CHUNK = LinearLaunch(block=32, programs_per_sm=1, stream_programs_per_sm=1)
MANY_CHUNKS = LinearLaunch(block=16, fwd_warps=2, bwd_warps=4, programs_per_sm=8, stream_programs_per_sm=8)


def make_case(b, s, h, d, dtype=torch.float32, seed=0, weight_dtype=torch.float32):
    """Fresh random ((o, q, k, v, weight, bias), dout), never zeros; o and bias at 0.1 scale so that the
    branch is a large part of the output."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0, dt=dtype):
        return (torch.randn(*shape, generator=g) * scale).to(dt)

    o, q, k, v = rand(b, s, h, d, scale=0.1), rand(b, s, h, d), rand(b, s, h, d), rand(b, s, h, d)
    weight, bias = rand(d, d, scale=d ** -0.5, dt=weight_dtype), rand(d, scale=0.1, dt=weight_dtype)
    return (o, q, k, v, weight, bias), rand(b, s, h, d)


def branch_fwd_bwd(args, dout, kind, launch=DEFAULT_LAUNCH, fn=linear_branch_add):
    """fn(o, q, k, v, weight, bias) with autograd on copies of args (each keeps its dtype):
    (out, do, dq, dk, dv, dweight, dbias)."""
    xs = [x.detach().clone().requires_grad_(True) for x in args]
    out = fn(*xs, kind=kind, launch=launch)
    out.backward(dout)
    return (out.detach(), *(x.grad for x in xs))


def branch_reference(args, dout, kind):
    """o + Linear(linear_attention_branch(q, k, v)) in float64 with autograd: (out, do, dq, ..., dbias)."""
    xs = leaves(*args)
    o, q, k, v, weight, bias = xs
    out = o + F.linear(ref.linear_attention_branch(q, k, v, kind=kind), weight, bias)
    out.backward(dout.double())
    return (out.detach(), *(x.grad for x in xs))


def assert_matches(got, want, tol):
    errs = {name: rel_l2(a, b) for name, a, b in zip(NAMES, got, want)}
    assert all(e < tol for e in errs.values()), errs


# ------------------------------------------------------------------------------------ against float64


@pytest.mark.parametrize("kind,dtype,weight_dtype,b,s,h,d", [
    ("softmax", torch.float32, torch.float32, 2, 150, 2, 24),   # odd head dim (BLOCK_D 32), 3 blocks, the last partial
    ("elu", torch.float32, torch.float32, 2, 37, 1, 128),
    ("relu", torch.float32, torch.float32, 2, 150, 1, 16),
    ("softmax", torch.bfloat16, torch.float32, 2, 37, 2, 128),  # sla-star's case: bf16 activations, fp32 proj
    ("elu", torch.bfloat16, torch.bfloat16, 2, 150, 1, 16),
    ("relu", torch.bfloat16, torch.float32, 2, 37, 1, 24),
    ("softmax", torch.float16, torch.float32, 2, 37, 1, 16),
])
def test_matches_float64_reference(kind, dtype, weight_dtype, b, s, h, d):
    args, dout = make_case(b, s, h, d, dtype, seed=s + d, weight_dtype=weight_dtype)
    got = branch_fwd_bwd(args, dout, kind)
    assert_all_finite(*got)
    assert got[0].dtype == dtype and got[0].is_contiguous()
    assert [g.dtype for g in got[1:]] == [x.dtype for x in args]
    assert torch.equal(got[1], dout)  # the gradient of o is dout itself
    assert_matches(got, branch_reference(args, dout, kind), FP32_REL_L2 if dtype == torch.float32 else LOWP_REL_L2)


@pytest.fixture(scope="module")
def variants_case():
    """The launch variants' case (batch 2, 150 tokens: a partial block, 2 heads, D 16, softmax) with its float64
    reference and the default launch's result, both computed once for every variant (the same inputs each
    variant made and ran them on before): (args, dout, reference, default)."""
    args, dout = make_case(2, 150, 2, 16, seed=3)
    return args, dout, branch_reference(args, dout, "softmax"), branch_fwd_bwd(args, dout, "softmax")


@pytest.mark.parametrize("launch", [
    LinearLaunch(block=16, programs_per_sm=1, stream_programs_per_sm=1),
    LinearLaunch(block=32, fwd_warps=8, bwd_warps=4, programs_per_sm=1, stream_programs_per_sm=1),
    LinearLaunch(block=64, programs_per_sm=1, stream_programs_per_sm=1),
    LinearLaunch(block=128, fwd_warps=2, bwd_warps=2, programs_per_sm=8, stream_programs_per_sm=8),
    MANY_CHUNKS,
    LinearLaunch(block=64, programs_per_sm=8, stream_programs_per_sm=1),
    LinearLaunch(block=32, fwd_warps=1, bwd_warps=1, programs_per_sm=1, stream_programs_per_sm=3),
], ids=lambda la: f"block{la.block}-pps{la.programs_per_sm}-stream{la.stream_programs_per_sm}")
def test_launch_variants_give_the_same_result(launch, variants_case):
    args, dout, reference, default = variants_case
    for stream, per_sm in ((False, launch.programs_per_sm), (True, launch.stream_programs_per_sm)):
        n_chunks = lb._chunking(args[1], launch, stream=stream)[1]
        assert (n_chunks == 1) == (per_sm == 1), (stream, n_chunks)
    got = branch_fwd_bwd(args, dout, "softmax", launch)
    assert_matches(got, reference, FP32_REL_L2)
    # against the default launch: fp32 sums in another chunking / block order only
    assert_matches(got, default, 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_views_of_packed_qkv_match_contiguous_inputs(dtype):
    """q, k, v slices of a packed (B, S, 3, H, D) tensor and o a (B, H, S, D) tensor transposed: the same bits as
    contiguous copies, gradients flow into the packed tensor."""
    b, s, h, d = 2, 37, 2, 24
    (o, q, k, v, weight, bias), dout = make_case(b, s, h, d, dtype, seed=5)
    packed = torch.stack([q, k, v], 2).requires_grad_(True)  # (B, S, 3, H, D)
    o_t = o.transpose(1, 2).contiguous().requires_grad_(True)  # (B, H, S, D) storage
    weight, bias = weight.requires_grad_(True), bias.requires_grad_(True)
    views = (o_t.transpose(1, 2), *packed.unbind(2))
    assert not any(x.is_contiguous() for x in views)
    out = linear_branch_add(*views, weight, bias, kind="elu", launch=MANY_CHUNKS)
    out.backward(dout)
    assert out.is_contiguous()
    want = branch_fwd_bwd((o, q, k, v, weight, bias), dout, "elu", MANY_CHUNKS)
    assert torch.equal(out, want[0])
    for got, exp in zip((o_t.grad.transpose(1, 2), *packed.grad.unbind(2), weight.grad, bias.grad), want[1:]):
        assert torch.equal(got, exp)


@pytest.mark.parametrize("layout", ["expanded", "strided_d", "heads_first"])
def test_backward_takes_dout_of_any_strides(layout):
    """Autograd hands the backward dO as the next op made it: `out.sum()` passes ones expanded (strides 0), a
    slice can pass a stride on D other than 1; the gradients are those of the contiguous dO."""
    args, dout = make_case(2, 37, 2, 16, seed=25)
    if layout == "expanded":
        dout = torch.ones(()).expand(dout.shape)
    elif layout == "strided_d":
        dout = torch.stack([dout, -dout], -1).flatten(-2)[..., ::2]
    else:
        dout = dout.transpose(1, 2).contiguous().transpose(1, 2)
    got = branch_fwd_bwd(args, dout, "elu")
    want = branch_fwd_bwd(args, dout.contiguous(), "elu")
    errs = {name: rel_l2(a, b) for name, a, b in zip(NAMES, got, want)}
    assert all(torch.equal(a, b) for a, b in zip(got, want)), errs


def test_backward_adds_into_given_grads():
    """`grads=(dq, dk, dv)` (another part's gradients, here in a (B, H, S, D) layout): the branch's are added in
    place, fp32 sums bitwise those of the fresh gradients, also with dk and dv of different strides."""
    (o, q, k, v, weight, bias), dout = make_case(2, 37, 2, 24, seed=27)
    _, kv, z = lb._forward(o, q, k, v, weight, bias, "softmax", ref.LINEAR_EPS, MANY_CHUNKS)
    fresh = linear_branch_backward(dout, q, k, v, weight, kv, z, "softmax", ref.LINEAR_EPS, MANY_CHUNKS)
    base = [torch.randn(q.transpose(1, 2).shape, generator=torch.Generator().manual_seed(i)).transpose(1, 2)
            for i in range(3)]
    given = [x.clone() for x in base]
    got = linear_branch_backward(dout, q, k, v, weight, kv, z, "softmax", ref.LINEAR_EPS, MANY_CHUNKS,
                                 grads=tuple(given))
    assert all(a is b for a, b in zip(got[:3], given))
    for a, b, f in zip(got[:3], base, fresh[:3]):
        assert torch.equal(a, b + f)
    assert torch.equal(got[3], fresh[3]) and torch.equal(got[4], fresh[4])
    mixed = (given[0].clone(), given[1].clone(), given[2].contiguous())  # dk and dv of different strides
    got = linear_branch_backward(dout, q, k, v, weight, kv, z, "softmax", ref.LINEAR_EPS, MANY_CHUNKS, grads=mixed)
    for a, b, f in zip(got[:3], given, fresh[:3]):
        assert torch.equal(a, b + f)


# ------------------------------------------------------------------------------------ invariants


def plain_linear_attention(q, k, v, kind, eps=ref.LINEAR_EPS):
    """float64 linear attention per (batch, head) from the S x S matrix A = phi(Q) phi(K)^T:
    A V / (eps + row sums of A), phi written out here."""
    phi = {"softmax": lambda x: x.exp() / x.exp().sum(-1, keepdim=True),
           "elu": lambda x: torch.where(x > 0, x + 1, x.exp()),
           "relu": lambda x: x.clamp(min=0)}[kind]
    out = torch.empty(q.shape, dtype=torch.float64)
    for bi in range(q.shape[0]):
        for hi in range(q.shape[2]):
            qq, kk, vv = (x[bi, :, hi].double() for x in (q, k, v))
            a = phi(qq) @ phi(kk).T
            out[bi, :, hi] = a @ vv / (eps + a.sum(1, keepdim=True))
    return out


@pytest.mark.parametrize("kind", ref.FEATURE_MAPS)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, FP32_REL_L2), (torch.bfloat16, LOWP_REL_L2)])
def test_identity_projection_on_zero_o_is_plain_linear_attention(kind, dtype, tol):
    (_, q, k, v, _, _), _ = make_case(2, 37, 2, 16, dtype, seed=7)
    o = torch.zeros_like(q)
    got = linear_branch_add(o, q, k, v, torch.eye(16), torch.zeros(16), kind=kind)
    assert rel_l2(got, plain_linear_attention(q, k, v, kind)) < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zero_projection_returns_o_bitwise(dtype):
    (o, q, k, v, _, _), dout = make_case(2, 37, 2, 24, dtype, seed=9)
    zero = (torch.zeros(24, 24), torch.zeros(24))
    out, do, dq, dk, dv, dweight, _ = branch_fwd_bwd((o, q, k, v, *zero), dout, "softmax")
    assert torch.equal(out, o) and torch.equal(do, dout)
    assert not any(bool(g.any()) for g in (dq, dk, dv))  # W = 0: nothing flows back into the branch's inputs
    assert bool(dweight.any())  # but the projection still learns


def test_backward_is_bitwise_deterministic():
    args, dout = make_case(2, 150, 2, 16, seed=11)
    first = branch_fwd_bwd(args, dout, "elu", MANY_CHUNKS)
    second = branch_fwd_bwd(args, dout, "elu", MANY_CHUNKS)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_relu_rows_with_phi_zero_stay_finite():
    """relu: query rows and key rows with every entry negative (phi = 0: den = eps, o_l = 0), and a head whose
    keys are all negative (KV = 0, z = 0): finite, equal to the reference, o + bias exactly on those query rows."""
    args, dout = make_case(2, 37, 2, 16, seed=13)
    o, q, k, v, weight, bias = args
    q[:, :5] = -q[:, :5].abs() - 0.1
    k[:, 10:20] = -k[:, 10:20].abs() - 0.1
    k[1, :, 0] = -k[1, :, 0].abs() - 0.1
    got = branch_fwd_bwd(args, dout, "relu")
    assert_all_finite(*got)
    assert_matches(got, branch_reference(args, dout, "relu"), FP32_REL_L2)
    out, dq, dk = got[0], got[2], got[3]
    assert torch.equal(out[:, :5], (o + bias)[:, :5]) and torch.equal(out[1, :, 0], (o + bias)[1, :, 0])
    assert not bool(dq[:, :5].any()) and not bool(dk[:, 10:20].any()) and not bool(dk[1, :, 0].any())


@pytest.mark.parametrize("kind", ref.FEATURE_MAPS)
@pytest.mark.parametrize("launch", [ONE_CHUNK, MANY_CHUNKS], ids=["one_chunk", "many_chunks"])
def test_kv_sums_match_einsum(kind, launch):
    b, s, h, d = 2, 150, 2, 24
    (_, _, k, v, _, _), _ = make_case(b, s, h, d, seed=15)
    kv, z = kv_sums(k, v, kind, launch)
    assert kv.shape == (b * h, d, d) and z.shape == (b * h, d) and kv.dtype == z.dtype == torch.float32
    pk = ref.feature_map(k.double(), kind)
    want_kv = torch.einsum("bshd,bshe->bhde", pk, v.double()).reshape(b * h, d, d)
    assert rel_l2(kv, want_kv) < FP32_REL_L2
    assert rel_l2(z, pk.sum(1).reshape(b * h, d)) < FP32_REL_L2


# ------------------------------------------------------------------------------------ ops, compile


def test_no_grad_path_skips_the_op_and_matches_it(monkeypatch):
    args, _ = make_case(2, 37, 1, 16, seed=17)
    with_op = linear_branch_add(*leaves(*args, dtype=torch.float32), kind="softmax")

    def boom(*_):
        raise AssertionError("custom op called without grad")

    monkeypatch.setattr(lb, "_linear_op", boom)
    assert torch.equal(linear_branch_add(*args, kind="softmax"), with_op.detach())
    with torch.no_grad():
        assert torch.equal(linear_branch_add(*leaves(*args, dtype=torch.float32), kind="softmax"), with_op)


def test_custom_ops_pass_opcheck():
    args, dout = make_case(2, 37, 2, 24, seed=19)
    launch = dataclasses.astuple(ONE_CHUNK)
    xs = leaves(*args, dtype=torch.float32)
    torch.library.opcheck(lb._linear_op, (*xs, "elu", 1e-5, *launch))
    _, kv, z = lb._forward(*args, "elu", 1e-5, ONE_CHUNK)
    _, q, k, v, weight, _ = args
    torch.library.opcheck(lb._linear_bwd_op, (dout, q, k, v, weight, kv, z, "elu", 1e-5, *launch),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph_matches_eager():
    args, dout = make_case(2, 37, 2, 24, seed=21)

    def f(o, q, k, v, weight, bias, *, kind, launch):
        return linear_branch_add(o, q, k, v, weight, bias, kind=kind, launch=launch) * 2

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got = branch_fwd_bwd(args, dout, "relu", MANY_CHUNKS, fn=compiled)
    want = branch_fwd_bwd(args, dout, "relu", MANY_CHUNKS, fn=f)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    # without grad the compiled graph still calls the op (the eager fast path is skipped while compiling)
    assert torch.equal(compiled(*args, kind="relu", launch=MANY_CHUNKS), want[0])


# ------------------------------------------------------------------------------------ errors


def test_bad_inputs_raise(monkeypatch):
    (o, q, k, v, weight, bias), _ = make_case(1, 37, 2, 16, seed=23)
    big = torch.randn(1, 2, 1, 257)
    cases = [
        ((o, q, k[:, :36], v, weight, bias), {}, "share one"),
        ((o[0], q[0], k[0], v[0], weight, bias), {}, "share one"),
        ((o, q, k.bfloat16(), v, weight, bias), {}, "share a dtype"),
        ((o.double(), q.double(), k.double(), v.double(), weight, bias), {}, "share a dtype"),
        ((o, q, k, v, weight, bias), {"kind": "tanh"}, "feature map"),
        ((o, q, k, v, weight[:, :8], bias), {}, "weight must be"),
        ((o, q, k, v, weight, bias[:8]), {}, "weight must be"),
        ((o, q, k, v, weight.T.reshape(1, 16, 16), bias), {}, "weight must be"),
        ((big, big, big, big, torch.randn(257, 257), torch.randn(257)), {}, "257 > 256"),
        ((o, torch.randn(1, 37, 2, 32)[..., ::2], k, v, weight, bias), {}, "unit stride"),
        ((o, q, k, v, weight.to("meta"), bias), {}, "one device"),
        ((o[:, :0], q[:, :0], k[:, :0], v[:, :0], weight, bias), {}, "must not be empty"),  # was ZeroDivisionError
        ((o[:0], q[:0], k[:0], v[:0], weight, bias), {}, "must not be empty"),
    ]
    for args, kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            linear_branch_add(*args, **kwargs)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs CUDA"):
        linear_branch_add(o, q, k, v, weight, bias)


@pytest.mark.parametrize("fields,match", [
    ({"block": 8}, "block"), ({"block": 48}, "block"), ({"block": 256}, "block"),
    ({"fwd_warps": 3}, "fwd_warps"), ({"bwd_warps": 32}, "bwd_warps"),
    ({"programs_per_sm": 0}, "programs_per_sm"), ({"stream_programs_per_sm": -2}, "stream_programs_per_sm"),
])
def test_launch_rejects_invalid_fields(fields, match):
    with pytest.raises(ValueError, match=match):
        LinearLaunch(**fields)


# Its kernels' AMD Instinct builds (gfx942, GEMMs on the matrix cores): tests/kernels/test_amd_build.py.
