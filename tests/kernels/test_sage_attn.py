"""The 8-bit fine stage on the Triton forward (`vsagen.kernels.sage_attn`, `bsa_forward`'s SAGE switch) under the
interpreter: against the float64 reference of the same formulas (`sage.sage_fine_reference`, tight) and against
float64 attention (loose band), with partial tiles, odd sizes and batch > 1."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from test_sage import masked_attention, random_layout, random_lists, rel_l2
from vsagen.kernels import sage
from vsagen.kernels.bsa_forward import _round_e4m3
from vsagen.kernels.bsa_primitives import TMA_DTYPES, TMA_DTYPES_8BIT, use_tma
from vsagen.kernels.sage_attn import bsa_fwd_sage, sage_block_sparse_attention
from vsagen.kernels.tuning import kernel_tuning


def _case(seed, b=2, s=157, h=2, d=32, k_sel=3):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, s, h, d, generator=gen) for _ in range(3))
    k = k + torch.randn(1, 1, h, d, generator=gen)
    offsets = random_layout(gen, s)
    t = offsets.numel() - 1
    q2k, cnt = random_lists(gen, b, h, t, min(k_sel, t))
    return q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16), q2k, cnt, offsets


def _tuning(d, pack):
    return dataclasses.replace(kernel_tuning("cpu", d), pack_partial_tiles=pack, fwd_launch=((64, 4, 2),))


def test_round_e4m3_matches_torch_cast():
    """The interpreter's rounding helper equals torch's fp32 -> e4m3 cast on [0, 448], carries and subnormals."""
    import triton
    import triton.language as tl

    @triton.jit
    def kern(x_ptr, y_ptr, n):
        offs = tl.arange(0, 1024)
        ok = offs < n
        tl.store(y_ptr + offs, _round_e4m3(tl.load(x_ptr + offs, mask=ok, other=0.0)), mask=ok)

    gen = torch.Generator().manual_seed(7)
    x = torch.cat([torch.rand(600, generator=gen) * 448, torch.rand(200, generator=gen) * 0.03,
                   torch.tensor([127.46, 124.5, 0.0, 2.0 ** -10, 3 * 2.0 ** -10, 447.98, 2.0 ** -6 - 1e-6])])
    y = torch.empty_like(x)
    kern[(1,)](x, y, x.numel())
    assert torch.equal(y, sage.round_fp8(x))


@pytest.mark.parametrize("seed,d,s", [(11, 32, 157), (12, 24, 61)])
def test_kernel_matches_reference_of_same_formulas(seed, d, s):
    q, k, v, q2k, cnt, offsets = _case(seed, s=s, d=d)
    ops = sage.quantize_operands(q, k, v, offsets, offsets)
    out, lse = bsa_fwd_sage(*ops, q2k, cnt, offsets, tuning=_tuning(d, False), out_dtype=torch.float32)
    want, want_lse = sage.sage_fine_reference(*ops, q2k, cnt, offsets)
    assert rel_l2(out, want) < 1e-5  # measured 1.4e-7: fp32 against float64 arithmetic, same fp8 roundings
    ok = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), ok) and torch.allclose(lse[ok].double(), want_lse[ok], atol=1e-4)


def test_packed_tiles_and_sage_sla_geometry():
    """Tile plans (partial tiles packed: another walk, so a slightly different fp8 rounding) and SageSLA's sm90
    blocks (q scales per 64, k per 128 raster tokens), against the same formulas and against float attention."""
    q, k, v, q2k, cnt, _ = _case(13, s=150, h=1)
    offsets = sage.block_offsets(150, 64)
    q2k, cnt = random_lists(torch.Generator().manual_seed(14), 2, 1, 3, 2)
    qo, ko = sage.block_offsets(150, 64), sage.block_offsets(150, 128)
    ops = sage.quantize_operands(q, k, v, qo, ko)
    want = sage.sage_fine_reference(*ops, q2k, cnt, offsets)[0]
    for pack in (False, True):
        out = bsa_fwd_sage(*ops, q2k, cnt, offsets, tuning=_tuning(32, pack), out_dtype=torch.float32)[0]
        assert rel_l2(out, want) < (1e-5 if not pack else 2e-2)  # packed: measured 6e-3
    full = sage_block_sparse_attention(q, k, v, q2k, cnt, offsets, qo, ko, tuning=_tuning(32, True))
    assert full.dtype == torch.bfloat16
    assert rel_l2(full, masked_attention(q.float(), k.float(), v.float(), q2k, cnt, offsets)) < 4.5e-2


def test_query_groups_launch():
    from vsagen.kernels.query_groups import block_query_groups

    q, k, v, _, _, _ = _case(15, b=2, s=256)
    offsets = sage.block_offsets(256, 64)
    q2k, cnt = random_lists(torch.Generator().manual_seed(16), 2, 2, 4, 2)
    q2k[..., 1::2, :], cnt[..., 1::2] = q2k[..., 0::2, :], cnt[..., 0::2]  # tile pairs share a list
    q2k, cnt = q2k[:1].expand(2, -1, -1, -1).contiguous(), cnt[:1].expand(2, -1, -1).contiguous()
    groups = block_query_groups(torch.arange(4) // 2, 2, offsets, 128)
    ops = sage.quantize_operands(q, k, v, offsets, offsets)
    out = bsa_fwd_sage(*ops, q2k, cnt, offsets, tuning=_tuning(32, False), out_dtype=torch.float32,
                       groups=groups, group_launch=(128, 4, 2))[0]
    assert rel_l2(out, sage.sage_fine_reference(*ops, q2k, cnt, offsets)[0]) < 1e-5


def test_refuses_gradients_and_bad_operands():
    q, k, v, q2k, cnt, offsets = _case(17, b=1, s=70, h=1, d=16)
    with pytest.raises(ValueError, match="forward only"):
        sage_block_sparse_attention(q.requires_grad_(), k, v, q2k, cnt, offsets, offsets, offsets)
    ops = list(sage.quantize_operands(q.detach(), k, v, offsets, offsets))
    slots = sage.v_slots(ops[4], offsets)
    ops[4] = v  # bf16 v
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        bsa_fwd_sage(*ops, q2k, cnt, offsets)
    ops[4] = slots[..., 1:, :].contiguous()  # one slot short
    with pytest.raises(ValueError, match="one per tile"):
        bsa_fwd_sage(*ops, q2k, cnt, offsets)


@pytest.mark.parametrize("dtype,d", [(torch.bfloat16, 24), (torch.float32, 32)])
def test_triton_quantization_equals_torch_formulas(dtype, d):
    """`quantize_operands_triton` gives `sage.quantize_operands`' outputs bitwise: groups of 1..128 tokens (SLA's
    128-token key blocks), K smoothed in the input's dtype, a zero V channel, batch 2, odd head dim, strided q, k, v
    (outputs contiguous; V written into the kernel tiles' slots: `sage.v_slots` of the torch formulas' V)."""
    from vsagen.kernels.sage_attn import quantize_operands_triton

    gen = torch.Generator().manual_seed(18)
    qkv = torch.randn(2, 203, 3, 3 * d, generator=gen).to(dtype)  # views of one fused projection: strided tokens
    q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
    k += torch.randn(1, 1, 3, d, generator=gen).to(dtype)
    v[1, :, 2, 3] = 0
    qo, ko = random_layout(gen, 203), sage.block_offsets(203, 128)
    got = quantize_operands_triton(q, k, v, qo, ko, qo)
    want = list(sage.quantize_operands(q, k, v, qo, ko))
    want[4] = sage.v_slots(want[4], qo)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape and a.is_contiguous()
        bits = (lambda x: x.view(torch.uint8) if x.dtype == sage.FP8 else x)  # noqa: E731
        assert torch.equal(bits(a), bits(b))


def test_compiles_as_one_custom_op_without_a_graph_break():
    """Under torch.compile (fullgraph) the 8-bit fine stage is the custom op `vsagen::sage_block_sparse_attn`: the
    same output as the eager call."""
    q, k, v, q2k, cnt, offsets = _case(19, b=2, s=70, h=1, d=16)
    tuning = _tuning(16, False)

    def f(q, k, v):
        return sage_block_sparse_attention(q, k, v, q2k, cnt, offsets, offsets, offsets, tuning=tuning)

    assert torch.equal(torch.compile(f, fullgraph=True, backend="eager")(q, k, v), f(q, k, v))


def test_tma_loads_of_the_1_byte_tiles_equal_pointer_loads():
    """int8 K and fp8 V by TMA (emulated by the interpreter; a partial tile's box covers the next tile's rows, masked
    as the bf16 kernel masks them): bitwise the pointer loads' result, tile plans on and off."""
    q, k, v, q2k, cnt, offsets = _case(20, b=2, s=150, h=1, d=16)
    ops = sage.quantize_operands(q, k, v, offsets, offsets)
    assert use_tma(ops[2], ops[4], wanted=True, dtypes=TMA_DTYPES + TMA_DTYPES_8BIT)  # the TMA path does run
    assert not use_tma(ops[2], ops[4], wanted=True)  # (and only for the 8-bit fine stage)
    for pack in (False, True):
        base = _tuning(16, pack)
        outs = [bsa_fwd_sage(*ops, q2k, cnt, offsets, tuning=dataclasses.replace(base, tma_loads=tma))
                for tma in (False, True)]
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_v_slots_layout_on_unaligned_tile_starts():
    """`sage.v_slots`: tile t's V^T at columns 64 t .. 64 t + size_t of (B, H, D, T * 64), zeros in the rest of each
    slot, tile starts not multiples of 16 (partial tiles, odd S); `v_from_slots` inverts it and
    `v_slot_columns` gives each token's column."""
    gen = torch.Generator().manual_seed(21)
    offsets = random_layout(gen, 157)
    assert any(int(x) % 16 for x in offsets[:-1])
    vf = sage.quantize_v_fp8(torch.randn(2, 157, 3, 24, generator=gen))[0]
    vt = sage.v_slots(vf, offsets)
    t = offsets.numel() - 1
    assert vt.shape == (2, 3, 24, t, 64) and vt.is_contiguous()
    bits, want = vt.view(torch.uint8), vf.view(torch.uint8).permute(0, 2, 3, 1)
    for i in range(t):
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        assert torch.equal(bits[..., i, :hi - lo], want[..., lo:hi]) and not bits[..., i, hi - lo:].any()
    assert torch.equal(sage.v_from_slots(vt, offsets).view(torch.uint8), vf.view(torch.uint8))
    cols = sage.v_slot_columns(offsets, 157).long()
    assert torch.equal(bits.flatten(3)[..., cols], want)


def test_kernel_on_triton_quantized_v_slots():
    """The kernel reading the V^T slots the Triton quantizer writes (no copy) against the float64 reference of the
    same formulas: batch 2, odd S, partial tiles whose starts are not multiples of 16, plain lists / tile plans
    (packed partial-tile gathers of slot columns) / TMA K and V^T boxes, and bitwise the result of the same operands
    in the token-major layout (copied into slots by `bsa_fwd_sage`)."""
    from vsagen.kernels.bsa_primitives import v_t_tma_ok
    from vsagen.kernels.sage_attn import quantize_operands_triton

    q, k, v, q2k, cnt, offsets = _case(22, b=2, s=131, h=1, d=16, k_sel=3)
    assert any(int(x) % 16 for x in offsets[:-1])
    ops = quantize_operands_triton(q, k, v, offsets, offsets, offsets)
    assert ops[4].shape == (2, 1, 16, offsets.numel() - 1, 64) and v_t_tma_ok(ops[4])
    plain = list(ops)
    plain[4] = sage.v_from_slots(ops[4], offsets)  # token-major
    want = sage.sage_fine_reference(*plain, q2k, cnt, offsets)[0]
    got = {}
    for pack, tma in ((False, False), (True, False), (False, True), (True, True)):
        t = dataclasses.replace(_tuning(16, pack), tma_loads=tma)
        out, lse = got[pack, tma] = bsa_fwd_sage(*ops, q2k, cnt, offsets, tuning=t, out_dtype=torch.float32)
        assert rel_l2(out, want) < (1e-5 if not pack else 2e-2)
        out2, lse2 = bsa_fwd_sage(*plain, q2k, cnt, offsets, tuning=t, out_dtype=torch.float32)
        assert torch.equal(out, out2) and torch.equal(lse, lse2)
    for pack in (False, True):  # V^T (and K) boxes: bitwise the pointer loads
        assert all(torch.equal(a, b) for a, b in zip(got[pack, False], got[pack, True]))


def test_v_t_tma_boxes_on_raster_tiles():
    """64-token tiles, the last partial: V^T by TMA boxes of its slots' (B*H*D, T*64) rows (`v_t_tma_ok`; past S
    the last slot's zeros), bitwise the pointer loads' result, batch 2, odd S, and the reference of the same
    formulas."""
    from vsagen.kernels.bsa_primitives import v_t_tma_ok

    q, k, v, _, _, _ = _case(23, b=2, s=179, h=1, d=16)
    offsets = sage.block_offsets(179, 64)
    q2k, cnt = random_lists(torch.Generator().manual_seed(24), 2, 1, 3, 2)
    ops = list(sage.quantize_operands(q, k, v, offsets, offsets))
    want = sage.sage_fine_reference(*ops, q2k, cnt, offsets)[0]
    ops[4] = sage.v_slots(ops[4], offsets)
    assert v_t_tma_ok(ops[4]) and not v_t_tma_ok(ops[4][..., :32])
    outs = [bsa_fwd_sage(*ops, q2k, cnt, offsets, tuning=dataclasses.replace(_tuning(16, False), tma_loads=tma),
                         out_dtype=torch.float32) for tma in (False, True)]
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert rel_l2(outs[1][0], want) < 1e-5
