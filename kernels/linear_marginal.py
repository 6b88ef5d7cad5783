"""SLA*'s linear-attention branch in the `marginal` scope, in Triton, forward and backward: for a query in tile i
the sums run over the key tiles that tile i did NOT select (the SLA paper, arXiv 2509.24006 sec. 4; SLA's earlier
fused kernel), so the branch covers exactly what the sparse part skipped.

    o_l = phi(q) H_i / (eps + phi(q) . zeta_i),  H_i = KV - sum_{j in q2k(i)} phi(K_j)^T V_j,
                                                  zeta_i = z - sum_{j in q2k(i)} sum phi(K_j)
    out = o + o_l W^T + bias

with KV, z the sums over every key (`linear_branch.kv_sums`). The selected tiles' share is taken off per query
row as linear attention over those tiles: phi(q) phi(K_j)^T V_j and the row sums of phi(q) phi(K_j)^T, two GEMMs a
selected tile (the block-sparse forward's shapes, no softmax), instead of gathering (D, D) per-tile sums (as many
bytes a tile as K_j and V_j). A query row gets o_l = 0 exactly where nothing is left: its tile selected every
tile, or the denominator's unselected part is at most `_min_share` of its total (1e-3 with bf16 GEMM operands,
1e-6 in fp32), within the cancellation error of total minus selected (e.g. relu features that are 0 on every
unselected key, where the exact o_l is 0 too).

Kernels: `_fwd_kernel` (grid (Q_TILES, B*H): walks q2k; with gradients it also saves o_l and the denominator's
unselected part), `_bwd_q_kernel` (grid (Q_TILES, B*H): dQ, walking q2k again; saves dN = d o_l / den and
d den), `linear_branch._kv_sums_kernel` with row weights (dKV = sum phi(q)^T dN and dz = sum d den phi(q) over
every query), `_bwd_k_kernel` (grid (KV_TILES, B*H): dK, dV, walking the k2q lists, `k2q.build_k2q_triton`).
dW = dO^T o_l and dbias = sum dO are torch reductions. No atomics: deterministic. The pair loops read phi(K)
(forward, dQ) and phi(Q) (dK / dV) precomputed once per call in the GEMM operand dtype (`_features`): recomputing
phi of a 64-token tile for every (query tile, key tile) pair made the first version slower than the PyTorch
branch on the H200 (BENCHMARKS.md).

Precision as `linear_branch` (bf16 GEMM operands for half inputs, fp32 accumulation). Taking the selected share
off the total loses relative precision as the unselected share shrinks: at 87.5% sparsity (12.5% selected) the
forward is within ~2e-3 of float32 at the Wan 1.3B shape; with nearly every tile selected the branch is small
and its relative error large (it is exact, zero, with every tile selected).

Public: `marginal_branch_add` (custom ops `vsagen::sla_marginal` / `vsagen::sla_marginal_bwd`). The eager oracle
is `reference.linear_attention_branch(..., block_map=...)`.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from . import reference as ref
from .k2q import build_k2q_triton
from .linear_branch import (_KIND, _LAUNCH_SCHEMA, DEFAULT_LAUNCH, LINEAR_EPS, LinearLaunch, _check, _flags,
                            _load_rows, _load_rows_f32, _load_square, _mm, _operand, _phi, _phi_bwd, _program_ids, _store_grad,
                            kv_sums)

TILE = 64  # tokens of a full tile


@triton.jit
def _tile_rows(off_ptr, t, offs_m):
    """Token rows (64,) of tile t and their mask (False past the tile's end)."""
    start = tl.load(off_ptr + t)
    return start + offs_m, offs_m < tl.load(off_ptr + t + 1) - start


@triton.jit
def _fwd_kernel(q_ptr, pk_ptr, v_ptr, o_ptr, out_ptr, ol_ptr, den_ptr, kv_ptr, z_ptr, wt_ptr, bias_ptr,
                q2k_ptr, cnt_ptr, off_ptr, S, H, n_tiles, K_MAX, eps,
                sq_b, sq_s, sq_h, sp_b, sp_s, sp_h, sk_b, sk_s, sk_h, so_b, so_s, so_h, sr_b, sr_s, sr_h,
                D: tl.constexpr, BLOCK_D: tl.constexpr, KIND: tl.constexpr, LOWP: tl.constexpr,
                IEEE: tl.constexpr, SAVE: tl.constexpr, MIN_SHARE: tl.constexpr):
    """Query tile i of (b, h): out = o + o_l W^T + bias over the unselected keys (pk: phi(K) precomputed, strides
    `sp_*`; v: `sk_*`; with SAVE, o_l into `ol` (dense (B, S, H, D), `sr_*` strides as out) and the denominator's
    unselected part into den (B*H, S))."""
    i, bh, b, h, offs_m, offs_d, d_ok = _program_ids(H, D, 64, BLOCK_D)
    rows, r_ok = _tile_rows(off_ptr, i, offs_m)
    pq = _phi(_load_rows_f32(q_ptr + b * sq_b + h * sq_h, rows, r_ok, sq_s, offs_d, d_ok), r_ok, d_ok, KIND)
    num = _mm(pq, _load_square(kv_ptr + bh.to(tl.int64) * D * D, offs_d, d_ok, D), LOWP, IEEE)
    z = tl.load(z_ptr + bh * D + offs_d, mask=d_ok, other=0.0)
    if LOWP:  # the GEMMs below see phi(q) in bf16: the total must too, or rounding alone leaves a share
        den_all = tl.sum(pq.to(tl.bfloat16).to(tl.float32) * z[None, :], 1)
    else:
        den_all = tl.sum(pq * z[None, :], 1)
    den0 = den_all
    pk_base = pk_ptr + b * sp_b + h * sp_h
    v_base = v_ptr + b * sk_b + h * sk_h
    row = bh * n_tiles + i
    cnt = tl.load(cnt_ptr + row)
    for t in range(cnt):
        k_rows, n_ok = _tile_rows(off_ptr, tl.load(q2k_ptr + row.to(tl.int64) * K_MAX + t), offs_m)
        pk = _load_rows(pk_base, k_rows, n_ok, sp_s, offs_d, d_ok)
        a = _mm(pq, tl.trans(pk), LOWP, IEEE)  # (64, 64) phi(q) . phi(k) over tile j's keys
        num -= _mm(a, _load_rows(v_base, k_rows, n_ok, sk_s, offs_d, d_ok), LOWP, IEEE)
        den0 -= tl.sum(a, 1)
    # no unselected share: every tile selected, or what is left is within the cancellation error (e.g. relu
    # features that are 0 on every unselected key): o_l = 0, and den0 = 0 tells the backward
    none_left = (cnt >= n_tiles) | (den0 <= MIN_SHARE * den_all)
    num = tl.where(none_left[:, None], 0.0, num)
    den0 = tl.where(none_left, 0.0, den0)
    o_l = num / (eps + den0)[:, None]
    y = _mm(o_l, _load_square(wt_ptr, offs_d, d_ok, D), LOWP, IEEE)
    y += tl.load(bias_ptr + offs_d, mask=d_ok, other=0.0)[None, :]
    y += _load_rows_f32(o_ptr + b * so_b + h * so_h, rows, r_ok, so_s, offs_d, d_ok)
    mask = r_ok[:, None] & d_ok[None, :]
    r_rows = b * sr_b + h * sr_h + rows[:, None] * sr_s + offs_d[None, :]
    tl.store(out_ptr + r_rows, y.to(out_ptr.dtype.element_ty), mask=mask)
    if SAVE:
        tl.store(ol_ptr + r_rows, o_l.to(ol_ptr.dtype.element_ty), mask=mask)
        tl.store(den_ptr + bh.to(tl.int64) * S + rows, den0, mask=r_ok)


@triton.jit
def _bwd_q_kernel(q_ptr, pk_ptr, v_ptr, do_ptr, ol_ptr, den_ptr, dq_ptr, dn_ptr, dden_ptr, kv_t_ptr, z_ptr, w_ptr,
                  q2k_ptr, cnt_ptr, off_ptr, S, H, n_tiles, K_MAX, eps,
                  sq_b, sq_s, sq_h, sp_b, sp_s, sp_h, sk_b, sk_s, sk_h, sg_b, sg_s, sg_h, sx_b, sx_s, sx_h,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, KIND: tl.constexpr, LOWP: tl.constexpr,
                  IEEE: tl.constexpr, ACC: tl.constexpr):
    """Query tile i of (b, h): dN = dO W / den and d den (saved: dn dense like o_l with `sg_*` strides as do and
    ol, dden (B*H, S)), and dQ through phi(q) H_i and phi(q) . zeta_i (dq: `sx_*` strides)."""
    i, bh, b, h, offs_m, offs_d, d_ok = _program_ids(H, D, 64, BLOCK_D)
    rows, r_ok = _tile_rows(off_ptr, i, offs_m)
    mask = r_ok[:, None] & d_ok[None, :]
    qx = _load_rows_f32(q_ptr + b * sq_b + h * sq_h, rows, r_ok, sq_s, offs_d, d_ok)
    pq = _phi(qx, r_ok, d_ok, KIND)
    g_off = b * sg_b + h * sg_h
    d_ol = _mm(_load_rows(do_ptr + g_off, rows, r_ok, sg_s, offs_d, d_ok), _load_square(w_ptr, offs_d, d_ok, D),
               LOWP, IEEE)
    o_l = _load_rows(ol_ptr + g_off, rows, r_ok, sg_s, offs_d, d_ok)
    den0 = tl.load(den_ptr + bh.to(tl.int64) * S + rows, mask=r_ok, other=0.0)
    row = bh * n_tiles + i
    cnt = tl.load(cnt_ptr + row)
    inv = tl.where(den0 > 0, 1.0 / (eps + den0), 0.0)  # den0 = 0: no unselected share, o_l = 0
    d_num = d_ol * inv[:, None]
    d_den = tl.where(den0 > 0, -tl.sum(d_ol * o_l, 1) * inv, 0.0)
    tl.store(dn_ptr + g_off + rows[:, None] * sg_s + offs_d[None, :], d_num.to(dn_ptr.dtype.element_ty), mask=mask)
    tl.store(dden_ptr + bh.to(tl.int64) * S + rows, d_den, mask=r_ok)
    z = tl.load(z_ptr + bh * D + offs_d, mask=d_ok, other=0.0)
    d_pq = _mm(d_num, _load_square(kv_t_ptr + bh.to(tl.int64) * D * D, offs_d, d_ok, D), LOWP, IEEE)
    d_pq += d_den[:, None] * z[None, :]
    pk_base = pk_ptr + b * sp_b + h * sp_h
    v_base = v_ptr + b * sk_b + h * sk_h
    for t in range(cnt):
        k_rows, n_ok = _tile_rows(off_ptr, tl.load(q2k_ptr + row.to(tl.int64) * K_MAX + t), offs_m)
        pk = _load_rows(pk_base, k_rows, n_ok, sp_s, offs_d, d_ok)
        vx = _load_rows(v_base, k_rows, n_ok, sk_s, offs_d, d_ok)
        bmat = _mm(d_num, tl.trans(vx), LOWP, IEEE) + d_den[:, None]  # (64, 64); pk's padding rows are 0
        d_pq -= _mm(bmat, pk, LOWP, IEEE)
    dq = tl.where(mask, _phi_bwd(qx, pq, d_pq, KIND), 0.0)
    _store_grad(dq_ptr + b * sx_b + h * sx_h + rows[:, None] * sx_s + offs_d[None, :], dq, mask, ACC)


@triton.jit
def _bwd_k_kernel(pq_ptr, k_ptr, v_ptr, dn_ptr, dden_ptr, dk_ptr, dv_ptr, dkv_ptr, dkv_t_ptr, dz_ptr,
                  k2q_ptr, cnt_ptr, off_ptr, S, H, n_tiles,
                  sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sg_b, sg_s, sg_h, sx_b, sx_s, sx_h, sw_b, sw_s, sw_h,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, KIND: tl.constexpr, LOWP: tl.constexpr,
                  IEEE: tl.constexpr, ACC: tl.constexpr):
    """Key tile j of (b, h): dV = phi(K_j) dKV - sum_i A_ij^T dN_i and dK through dphi(K_j) = V_j dKV^T + dz -
    sum_i (V_j dN_i^T + d den_i) phi(q_i), i over the query tiles that selected j (k2q; pq: phi(Q) precomputed,
    strides `sq_*`; dk `sx_*` strides, dv `sw_*`)."""
    j, bh, b, h, offs_m, offs_d, d_ok = _program_ids(H, D, 64, BLOCK_D)
    k_rows, n_ok = _tile_rows(off_ptr, j, offs_m)
    mask = n_ok[:, None] & d_ok[None, :]
    kx = _load_rows_f32(k_ptr + b * sk_b + h * sk_h, k_rows, n_ok, sk_s, offs_d, d_ok)
    vx = _load_rows(v_ptr + b * sk_b + h * sk_h, k_rows, n_ok, sk_s, offs_d, d_ok)
    pk = _phi(kx, n_ok, d_ok, KIND)
    dv = _mm(pk, _load_square(dkv_ptr + bh.to(tl.int64) * D * D, offs_d, d_ok, D), LOWP, IEEE)
    d_pk = _mm(vx, _load_square(dkv_t_ptr + bh.to(tl.int64) * D * D, offs_d, d_ok, D), LOWP, IEEE)
    d_pk += tl.load(dz_ptr + bh * D + offs_d, mask=d_ok, other=0.0)[None, :]
    pq_base = pq_ptr + b * sq_b + h * sq_h
    g_off = b * sg_b + h * sg_h
    row = bh * n_tiles + j
    for t in range(tl.load(cnt_ptr + row)):
        q_rows, m_ok = _tile_rows(off_ptr, tl.load(k2q_ptr + row.to(tl.int64) * n_tiles + t), offs_m)
        pq = _load_rows(pq_base, q_rows, m_ok, sq_s, offs_d, d_ok)
        d_num = _load_rows(dn_ptr + g_off, q_rows, m_ok, sg_s, offs_d, d_ok)
        d_den = tl.load(dden_ptr + bh.to(tl.int64) * S + q_rows, mask=m_ok, other=0.0)
        a_t = _mm(pk, tl.trans(pq), LOWP, IEEE)  # (64 keys, 64 queries)
        dv -= _mm(a_t, d_num, LOWP, IEEE)
        b_t = _mm(vx, tl.trans(d_num), LOWP, IEEE) + d_den[None, :]  # pq's padding rows are 0
        d_pk -= _mm(b_t, pq, LOWP, IEEE)
    dk = tl.where(mask, _phi_bwd(kx, pk, d_pk, KIND), 0.0)
    _store_grad(dk_ptr + b * sx_b + h * sx_h + k_rows[:, None] * sx_s + offs_d[None, :], dk, mask, ACC)
    _store_grad(dv_ptr + b * sw_b + h * sw_h + k_rows[:, None] * sw_s + offs_d[None, :], dv, mask, ACC)


# ------------------------------------------------------------------------------------------------ launchers


def _min_share(x: torch.Tensor) -> float:
    """The unselected share of a row's denominator below which the forward takes it for none (o_l = 0): above
    the cancellation error of the total minus the selected part (bf16 GEMM operands: ~1e-4 of the total)."""
    return 1e-3 if _flags(x)["LOWP"] else 1e-6


def _features(x: torch.Tensor, kind: str) -> torch.Tensor:
    """phi(x) (B, S, H, D) contiguous, in the GEMM operand dtype (`linear_branch._operand`): the pair loops read it
    instead of recomputing phi of a 64-token tile for every (query tile, key tile) pair."""
    return ref.feature_map(x.float(), kind).to(torch.bfloat16 if _flags(x)["LOWP"] else torch.float32)


def _strides(x: torch.Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


def _kv(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v with one set of strides (the kernels take one)."""
    if k.stride() == v.stride():
        return k, v
    return k.contiguous(), v.contiguous()


def _forward(o, q, k, v, weight, bias, q2k, q2k_cnt, tile_offsets, kind, eps, launch, save):
    """(out, kv, z, o_l, den0): the marginal forward; o_l and den0 only when `save` (else empty)."""
    b, s, h, d = q.shape
    n_tiles = tile_offsets.numel() - 1
    k, v = _kv(k, v)
    kv, z = kv_sums(k, v, kind, launch)
    out = torch.empty_like(o, memory_format=torch.contiguous_format)
    o_l = torch.empty_like(out) if save else out.new_empty(0)
    den0 = torch.empty((b * h, s), device=q.device, dtype=torch.float32) if save else kv.new_empty(0)
    pk = _features(k, kind)
    _fwd_kernel[(n_tiles, b * h)](
        q, pk, v, o, out, o_l, den0, _operand(kv, q), z, _operand(weight.float().t(), q), bias.float(), q2k,
        q2k_cnt, tile_offsets, s, h, n_tiles, q2k.shape[-1], eps, *_strides(q), *_strides(pk), *_strides(v),
        *_strides(o),
        *_strides(out), D=d, KIND=_KIND[kind], SAVE=save, MIN_SHARE=_min_share(q), num_warps=launch.fwd_warps,
        **_flags(q))
    return out, kv, z, o_l, den0


def marginal_branch_backward(dout, q, k, v, weight, q2k, q2k_cnt, tile_offsets, kv, z, o_l, den0, kind, eps,
                             launch=DEFAULT_LAUNCH, grads=None):
    """The marginal branch's backward: (dq, dk, dv, dweight, dbias), added into `grads` (dq, dk, dv) in place when
    given (as `linear_branch.linear_branch_backward`); the gradient of `o` is dout itself.

    Args: as `marginal_branch_add`, plus the forward's kv (B*H, D, D), z (B*H, D) fp32, o_l (B, S, H, D) and
    den0 (B*H, S) fp32 (the denominator's unselected part).
    """
    b, s, h, d = q.shape
    n_tiles = tile_offsets.numel() - 1
    k, v = _kv(k, v)
    dout = dout if dout.stride() == o_l.stride() else dout.contiguous()
    o_l = o_l if o_l.stride() == dout.stride() else o_l.contiguous()
    acc = grads is not None
    dq, dk, dv = grads if acc else (torch.empty_like(q, memory_format=torch.contiguous_format) for _ in range(3))
    flags = _flags(q)
    d_num = torch.empty_like(o_l)
    d_den = torch.empty((b * h, s), device=q.device, dtype=torch.float32)
    pk = _features(k, kind)
    _bwd_q_kernel[(n_tiles, b * h)](
        q, pk, v, dout, o_l, den0, dq, d_num, d_den, _operand(kv.transpose(1, 2), q), z, _operand(weight.float(), q),
        q2k, q2k_cnt, tile_offsets, s, h, n_tiles, q2k.shape[-1], eps, *_strides(q), *_strides(pk), *_strides(v),
        *_strides(dout), *_strides(dq), D=d, KIND=_KIND[kind], ACC=acc, num_warps=launch.bwd_warps, **flags)
    dkv, dz = kv_sums(q, d_num, kind, launch, row_weights=d_den)  # over every query: the totals' gradients
    k2q, k2q_cnt = build_k2q_triton(q2k, q2k_cnt, n_tiles)
    del pk
    pq = _features(q, kind)
    _bwd_k_kernel[(n_tiles, b * h)](
        pq, k, v, d_num, d_den, dk, dv, _operand(dkv, q), _operand(dkv.transpose(1, 2), q), dz, k2q, k2q_cnt,
        tile_offsets, s, h, n_tiles, *_strides(pq), *_strides(k), *_strides(d_num), *_strides(dk), *_strides(dv), D=d,
        KIND=_KIND[kind], ACC=acc, num_warps=launch.bwd_warps, **flags)
    dout2, o_l2 = dout.reshape(-1, d), o_l.reshape(-1, d)
    dweight = torch.matmul(dout2.t(), o_l2).float()
    return dq, dk, dv, dweight, dout2.sum(0, dtype=torch.float32)


# --------------------------------------------------------------------------------------- custom ops, autograd

_SCHEMA_IN = "Tensor q2k, Tensor q2k_cnt, Tensor tile_offsets, str kind, float eps"


@torch.library.custom_op(
    "vsagen::sla_marginal", mutates_args=(),
    schema=f"(Tensor o, Tensor q, Tensor k, Tensor v, Tensor weight, Tensor bias, {_SCHEMA_IN}, {_LAUNCH_SCHEMA}) "
           "-> (Tensor, Tensor, Tensor, Tensor, Tensor)")
def _op(o, q, k, v, weight, bias, q2k, q2k_cnt, tile_offsets, kind, eps, *launch):
    """(out, kv, z, o_l, den0) with the saved tensors the backward needs."""
    return _forward(o, q, k, v, weight, bias, q2k, q2k_cnt, tile_offsets, kind, eps, LinearLaunch(*launch), True)


@_op.register_fake
def _op_fake(o, q, k, v, weight, bias, q2k, q2k_cnt, tile_offsets, kind, eps, *launch):
    b, s, h, d = q.shape
    out = torch.empty_like(o, memory_format=torch.contiguous_format)
    return (out, q.new_empty((b * h, d, d), dtype=torch.float32), q.new_empty((b * h, d), dtype=torch.float32),
            torch.empty_like(out), q.new_empty((b * h, s), dtype=torch.float32))


@torch.library.custom_op(
    "vsagen::sla_marginal_bwd", mutates_args=(),
    schema="(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor weight, Tensor kv, Tensor z, Tensor o_l, "
           f"Tensor den0, {_SCHEMA_IN}, {_LAUNCH_SCHEMA}) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
def _bwd_op(dout, q, k, v, weight, kv, z, o_l, den0, q2k, q2k_cnt, tile_offsets, kind, eps, *launch):
    """`marginal_branch_backward`."""
    return marginal_branch_backward(dout, q, k, v, weight, q2k, q2k_cnt, tile_offsets, kv, z, o_l, den0, kind, eps,
                                    LinearLaunch(*launch))


@_bwd_op.register_fake
def _bwd_op_fake(dout, q, k, v, weight, kv, z, o_l, den0, q2k, q2k_cnt, tile_offsets, kind, eps, *launch):
    d = q.shape[-1]
    dense = {"memory_format": torch.contiguous_format}
    return (torch.empty_like(q, **dense), torch.empty_like(q, **dense), torch.empty_like(q, **dense),
            weight.new_empty((d, d), dtype=torch.float32), weight.new_empty((d,), dtype=torch.float32))


def _setup_context(ctx, inputs, output):
    o, q, k, v, weight, bias, q2k, q2k_cnt, tile_offsets, kind, eps, *launch = inputs
    _, kv, z, o_l, den0 = output
    ctx.save_for_backward(q, k, v, weight, kv, z, o_l, den0, q2k, q2k_cnt, tile_offsets)
    ctx.args = (kind, eps, *launch)
    ctx.bias_dtype = bias.dtype


def _backward(ctx, dout, *_unused):
    q, k, v, weight, kv, z, o_l, den0, q2k, q2k_cnt, tile_offsets = ctx.saved_tensors
    dq, dk, dv, dweight, dbias = _bwd_op(dout, q, k, v, weight, kv, z, o_l, den0, q2k, q2k_cnt, tile_offsets,
                                         *ctx.args)
    return ((dout, dq, dk, dv, dweight.to(weight.dtype), dbias.to(ctx.bias_dtype)) + (None,) * 3
            + (None,) * len(ctx.args))


_op.register_autograd(_backward, setup_context=_setup_context)


# ----------------------------------------------------------------------------------------- public function


def marginal_branch_add(o: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight: torch.Tensor,
                        bias: torch.Tensor, q2k: torch.Tensor, q2k_cnt: torch.Tensor, tile_offsets: torch.Tensor, *,
                        kind: str = "softmax", eps: float = LINEAR_EPS,
                        launch: LinearLaunch = DEFAULT_LAUNCH) -> torch.Tensor:
    """o + proj(o_l) with SLA*'s marginal linear branch (module docstring), in Triton.

    Args:
        o, q, k, v, weight, bias, kind, eps, launch: as `linear_branch.linear_branch_add`; q, k, v in tile order.
        q2k: (B, H, Q_TILES, K) int32, the key tiles each query tile selected (VSA's), no repeats; only the first
            q2k_cnt entries of a row are read. q2k_cnt: (B, H, Q_TILES) int32 in [0, K].
        tile_offsets: (n_tiles + 1,) int32 tile starts (at most 64 tokens a tile), the last S.

    Returns:
        (B, S, H, D) like o, contiguous; differentiable in o, q, k, v, weight and bias (custom ops).

    Raises:
        ValueError: as `linear_branch_add`, or index tensors of the wrong shape, dtype or device, or fewer tiles
            than S needs. Index values are not checked (that would synchronize the device), as in
            `block_sparse_attn.block_sparse_attention`: q2k entries must lie in [0, KV_TILES), q2k_cnt in [0, K],
            tiles hold at most 64 tokens and tile_offsets end at S; otherwise the kernels read out of bounds.

    Source: SLA arXiv 2509.24006 sec. 4 (marginal blocks by linear attention); seed 002.
    """
    _check(o, q, k, v, weight, bias, kind)
    b, s, h, _ = q.shape
    n_tiles = tile_offsets.numel() - 1
    if q2k.dim() != 4 or q2k.shape[:3] != (b, h, n_tiles) or q2k_cnt.shape != (b, h, n_tiles):
        raise ValueError(f"q2k must be (B, H, Q_TILES, K) = ({b}, {h}, {n_tiles}, K) and q2k_cnt (B, H, Q_TILES), "
                         f"got {tuple(q2k.shape)} and {tuple(q2k_cnt.shape)}")
    if any(x.dtype != torch.int32 for x in (q2k, q2k_cnt, tile_offsets)):
        raise ValueError("q2k, q2k_cnt and tile_offsets must be int32")
    if tile_offsets.dim() != 1:
        raise ValueError(f"tile_offsets must be (n_tiles + 1,), got {tuple(tile_offsets.shape)}")
    if any(x.device != q.device for x in (q2k, q2k_cnt, tile_offsets)):
        raise ValueError(f"q2k, q2k_cnt and tile_offsets must be on q's device {q.device}")
    if n_tiles * TILE < s:
        raise ValueError(f"{n_tiles} tiles of at most {TILE} tokens cannot hold S = {s}")
    q2k, q2k_cnt = q2k.contiguous(), q2k_cnt.contiguous()
    args = (o, q, k, v, weight.contiguous(), bias.contiguous(), q2k, q2k_cnt, tile_offsets, kind, float(eps))
    grads = torch.is_grad_enabled() and any(x.requires_grad for x in (o, q, k, v, weight, bias))
    if not grads and not torch.compiler.is_compiling():
        return _forward(*args, launch, False)[0]
    return _op(*args, *dataclasses.astuple(launch))[0]
