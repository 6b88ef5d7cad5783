"""SLA*'s linear-attention branch in the `marginal` scope, in Triton, forward and backward: for a query in tile i
the sums run over the key tiles that tile i did NOT select (the SLA paper, arXiv 2509.24006 sec. 4; SLA's earlier
fused kernel), so the branch covers exactly what the sparse part skipped.

    o_l = phi(q) U_i / (eps + phi(q) . Z_i),  U_i = sum_{j not in q2k(i)} S_j,  Z_i = sum_{j not in q2k(i)} z_j,
    S_j = phi(K_j)^T V_j,  z_j = sum phi(K_j)  (per key tile j),      out = o + o_l W^T + bias

per batch and head (REFERENCE.md, SLA-1: pre-aggregated per-tile sums). The sums over the unselected tiles are one
GEMM per batch-head over the tile grid, U = C S with C = 1 - block map (Q_TILES, KV_TILES) and S the per-tile sums
as a (KV_TILES, D * D) matrix: Q_TILES * KV_TILES * D^2 multiply-adds, 8x fewer than linear attention over the
selected tiles at 87.5% sparsity (two (64, 64, D) GEMMs a selected tile pair; this module's first two versions,
3.3x slower than `vsa` at the Wan 1.3B shape, BENCHMARKS.md), and exact: nothing is taken off a total, so there is
no cancellation (with every tile selected C's row is 0 and o_l is exactly 0; a row of tiles whose unselected keys
have phi = 0 gets o_l = 0 as well).

Kernels (grid (tiles, batch-heads) each, 64-token tiles, partial tiles masked):
* `_tile_sums_kernel`: S_j and z_j of every key tile in one pass over K and V (in the forward S_j W^T: the
  projection folded into the sums, as in `linear_branch`).
* `_apply_kernel`: per query tile, phi(Q_i), the denominator, phi(Q_i) U_i W^T, the bias and the add to `o`.
* `_bwd_q_kernel`: per query tile, dQ through phi(q) U_i and phi(q) . Z_i (added to another part's dQ in place
  when asked), dU_i = phi(Q_i)^T (dO W / den), dZ_i = sum d den phi(q) and o_l (for dW = dO^T o_l); dO W is one
  torch matmul before it (in the kernel a fourth GEMM and W spilled registers in the sm_90 compile).
* `_bwd_k_kernel`: per key tile, dV = phi(K_j) dS_j and dK through phi(K_j)^T V_j and z_j, with dS = C^T dU and
  dz = C^T dZ, the GEMMs of the forward transposed.
The GEMMs over the tile grid and dW are torch matmuls (cuBLAS). The forward saves nothing for the backward: the
backward recomputes S and U (one pass over K and V and one GEMM), which keeps training memory at the global
scope's (U is Q_TILES x D x D per batch-head: 1.9 GB a layer in bf16 at the Wan 14B 720p shape). Batch-heads run
in groups whose (D, D) sums fit `SUMS_BUDGET_BYTES`. No atomics: deterministic.

Precision as `linear_branch`: phi, the denominators and Z in fp32; S, U, dU and dS in the GEMM operand dtype (bf16
for half inputs, summed in fp32 by the GEMMs), fp32 for fp32 inputs (IEEE under the interpreter).

Public: `marginal_branch_add` (custom ops `vsagen::sla_marginal` / `vsagen::sla_marginal_bwd`) and
`marginal_branch_backward`. The eager oracle is `reference.linear_attention_branch(..., block_map=...)`.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from .linear_branch import (_KIND, _LAUNCH_SCHEMA, DEFAULT_LAUNCH, LINEAR_EPS, LinearLaunch, _check, _flags,
                            _load_rows, _load_rows_f32, _load_square, _mm, _operand, _phi, _phi_bwd, _program_ids,
                            _store_grad)

TILE = 64  # tokens of a full tile
# Budget for one group of batch-heads' (D, D) sums, in bytes (two buffers live at once: S or dU, and U or dS).
SUMS_BUDGET_BYTES = 1 << 30


@triton.jit
def _tile_rows(off_ptr, t, offs_m):
    """Token rows (64,) of tile t and their mask (False past the tile's end)."""
    start = tl.load(off_ptr + t)
    return start + offs_m, offs_m < tl.load(off_ptr + t + 1) - start


@triton.jit
def _square_ptrs(ptr, bh, t, n_tiles, offs_d, D):
    """Pointers to tile t's (BLOCK_D, BLOCK_D) entry of a contiguous (group batch-heads, n_tiles, D, D) buffer."""
    return ptr + (bh * n_tiles + t).to(tl.int64) * D * D + offs_d[:, None] * D + offs_d[None, :]


@triton.jit(do_not_specialize=["BH0"])
def _tile_sums_kernel(k_ptr, v_ptr, wt_ptr, s_ptr, z_ptr, do_ptr, db_ptr, off_ptr, H, n_tiles, BH0,
                      sk_b, sk_s, sk_h, sv_b, sv_s, sv_h, sg_b, sg_s, sg_h,
                      D: tl.constexpr, BLOCK_D: tl.constexpr, KIND: tl.constexpr, LOWP: tl.constexpr,
                      IEEE: tl.constexpr, PROJ: tl.constexpr, DB: tl.constexpr):
    """Key tile j of batch-head BH0 + bh: s[bh, j] = phi(K_j)^T V_j (D, D) in s's dtype, or with PROJ
    phi(K_j)^T (V_j W^T) = S_j W^T (wt: W^T (D, D); the projection folded into the sums: the forward's; V_j W^T
    first, a (64, D, D) GEMM, where S_j W^T would be a (D, D, D) one and took 203 registers against 140 in the
    sm_90 compile), and z[bh, j] = sum phi(K_j) (D,) fp32. With DB (the backward's) db[bh, j] = the sum of dO
    (strides `sg_*`) over the tile's rows, dbias's share (torch's column sum of dO took 0.19 ms at the Wan 1.3B
    shape; the dQ and dK / dV kernels have no registers to spare)."""
    j, bh, b, h, offs_m, offs_d, d_ok = _program_ids(H, D, 64, BLOCK_D)
    b, h = ((BH0 + bh) // H).to(tl.int64), (BH0 + bh) % H  # int64: b * stride_b passes 2^31 at B >= 7
    rows, r_ok = _tile_rows(off_ptr, j, offs_m)
    pk = _phi(_load_rows_f32(k_ptr + b * sk_b + h * sk_h, rows, r_ok, sk_s, offs_d, d_ok), r_ok, d_ok, KIND)
    vx = _load_rows(v_ptr + b * sv_b + h * sv_h, rows, r_ok, sv_s, offs_d, d_ok)
    if PROJ:
        vx = _mm(vx, _load_square(wt_ptr, offs_d, d_ok, D), LOWP, IEEE)
    s = _mm(tl.trans(pk), vx, LOWP, IEEE)
    tl.store(_square_ptrs(s_ptr, bh, j, n_tiles, offs_d, D), s.to(s_ptr.dtype.element_ty),
             mask=d_ok[:, None] & d_ok[None, :])
    tl.store(z_ptr + (bh * n_tiles + j).to(tl.int64) * D + offs_d, tl.sum(pk, 0), mask=d_ok)
    if DB:
        dout = _load_rows_f32(do_ptr + b * sg_b + h * sg_h, rows, r_ok, sg_s, offs_d, d_ok)
        tl.store(db_ptr + (bh * n_tiles + j).to(tl.int64) * D + offs_d, tl.sum(dout, 0), mask=d_ok)


@triton.jit(do_not_specialize=["BH0"])
def _apply_kernel(q_ptr, o_ptr, out_ptr, u_ptr, zu_ptr, bias_ptr, off_ptr, H, n_tiles, BH0, eps,
                  sq_b, sq_s, sq_h, so_b, so_s, so_h, sr_b, sr_s, sr_h,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, KIND: tl.constexpr, LOWP: tl.constexpr,
                  IEEE: tl.constexpr):
    """Query tile i of batch-head BH0 + bh: out = o + phi(q) (U_i W^T) / (eps + phi(q) . Z_i) + bias (u holds the
    projected U_i W^T: one GEMM a tile)."""
    i, bh, b, h, offs_m, offs_d, d_ok = _program_ids(H, D, 64, BLOCK_D)
    b, h = ((BH0 + bh) // H).to(tl.int64), (BH0 + bh) % H  # int64: b * stride_b passes 2^31 at B >= 7
    rows, r_ok = _tile_rows(off_ptr, i, offs_m)
    pq = _phi(_load_rows_f32(q_ptr + b * sq_b + h * sq_h, rows, r_ok, sq_s, offs_d, d_ok), r_ok, d_ok, KIND)
    zu = tl.load(zu_ptr + (bh * n_tiles + i).to(tl.int64) * D + offs_d, mask=d_ok, other=0.0)
    inv = 1.0 / (eps + tl.sum(pq * zu[None, :], 1))
    u = tl.load(_square_ptrs(u_ptr, bh, i, n_tiles, offs_d, D), mask=d_ok[:, None] & d_ok[None, :], other=0.0)
    y = _mm(pq, u, LOWP, IEEE) * inv[:, None]
    y += tl.load(bias_ptr + offs_d, mask=d_ok, other=0.0)[None, :]
    y += _load_rows_f32(o_ptr + b * so_b + h * so_h, rows, r_ok, so_s, offs_d, d_ok)
    tl.store(out_ptr + b * sr_b + h * sr_h + rows[:, None] * sr_s + offs_d[None, :], y.to(out_ptr.dtype.element_ty),
             mask=r_ok[:, None] & d_ok[None, :])


@triton.jit(do_not_specialize=["BH0"])
def _bwd_q_kernel(q_ptr, dol_ptr, dq_ptr, ol_ptr, u_ptr, zu_ptr, du_ptr, dzu_ptr, off_ptr, H, n_tiles, BH0,
                  eps, sq_b, sq_s, sq_h, sg_b, sg_s, sg_h, sx_b, sx_s, sx_h, sl_b, sl_s, sl_h,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, KIND: tl.constexpr, LOWP: tl.constexpr,
                  IEEE: tl.constexpr, ACC: tl.constexpr):
    """Query tile i of batch-head BH0 + bh: given d o_l = dO W (dol, strides `sg_*`), with dN = d o_l / den and
    d den = -(d o_l . o_l) / den, dQ through d phi(q) = dN U_i^T + d den Z_i (dq strides `sx_*`, added in place with
    ACC); du[bh, i] = phi(Q_i)^T dN, dzu[bh, i] = sum d den phi(q), and o_l (strides `sl_*`) for dW."""
    i, bh, b, h, offs_m, offs_d, d_ok = _program_ids(H, D, 64, BLOCK_D)
    b, h = ((BH0 + bh) // H).to(tl.int64), (BH0 + bh) % H  # int64: b * stride_b passes 2^31 at B >= 7
    rows, r_ok = _tile_rows(off_ptr, i, offs_m)
    mask = r_ok[:, None] & d_ok[None, :]
    sq_mask = d_ok[:, None] & d_ok[None, :]
    qx = _load_rows_f32(q_ptr + b * sq_b + h * sq_h, rows, r_ok, sq_s, offs_d, d_ok)
    pq = _phi(qx, r_ok, d_ok, KIND)
    zu = tl.load(zu_ptr + (bh * n_tiles + i).to(tl.int64) * D + offs_d, mask=d_ok, other=0.0)
    inv = 1.0 / (eps + tl.sum(pq * zu[None, :], 1))
    u = tl.load(_square_ptrs(u_ptr, bh, i, n_tiles, offs_d, D), mask=sq_mask, other=0.0)
    o_l = _mm(pq, u, LOWP, IEEE) * inv[:, None]
    tl.store(ol_ptr + b * sl_b + h * sl_h + rows[:, None] * sl_s + offs_d[None, :], o_l.to(ol_ptr.dtype.element_ty),
             mask=mask)
    d_ol = _load_rows_f32(dol_ptr + b * sg_b + h * sg_h, rows, r_ok, sg_s, offs_d, d_ok)
    d_num = d_ol * inv[:, None]
    d_den = -tl.sum(d_ol * o_l, 1) * inv
    u_t = tl.load(_square_ptrs(u_ptr, bh, i, n_tiles, offs_d, D).trans(), mask=sq_mask, other=0.0)  # U_i^T, loaded
    d_pq = _mm(d_num, u_t, LOWP, IEEE) + d_den[:, None] * zu[None, :]  # again: u is dead after o_l (fewer registers)
    dq = tl.where(mask, _phi_bwd(qx, pq, d_pq, KIND), 0.0)
    _store_grad(dq_ptr + b * sx_b + h * sx_h + rows[:, None] * sx_s + offs_d[None, :], dq, mask, ACC)
    du = _mm(tl.trans(pq), d_num, LOWP, IEEE)
    tl.store(_square_ptrs(du_ptr, bh, i, n_tiles, offs_d, D), du.to(du_ptr.dtype.element_ty), mask=sq_mask)
    tl.store(dzu_ptr + (bh * n_tiles + i).to(tl.int64) * D + offs_d, tl.sum(d_den[:, None] * pq, 0), mask=d_ok)


@triton.jit(do_not_specialize=["BH0"])
def _bwd_k_kernel(k_ptr, v_ptr, dk_ptr, dv_ptr, ds_ptr, dz_ptr, off_ptr, H, n_tiles, BH0,
                  sk_b, sk_s, sk_h, sv_b, sv_s, sv_h, sx_b, sx_s, sx_h, sw_b, sw_s, sw_h,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, KIND: tl.constexpr, LOWP: tl.constexpr,
                  IEEE: tl.constexpr, ACC: tl.constexpr):
    """Key tile j of batch-head BH0 + bh: dV = phi(K_j) dS_j and dK through d phi(K_j) = V_j dS_j^T + dz_j (dk
    strides `sx_*`, dv `sw_*`, added in place with ACC)."""
    j, bh, b, h, offs_m, offs_d, d_ok = _program_ids(H, D, 64, BLOCK_D)
    b, h = ((BH0 + bh) // H).to(tl.int64), (BH0 + bh) % H  # int64: b * stride_b passes 2^31 at B >= 7
    rows, r_ok = _tile_rows(off_ptr, j, offs_m)
    mask = r_ok[:, None] & d_ok[None, :]
    kx = _load_rows_f32(k_ptr + b * sk_b + h * sk_h, rows, r_ok, sk_s, offs_d, d_ok)
    pk = _phi(kx, r_ok, d_ok, KIND)
    vx = _load_rows(v_ptr + b * sv_b + h * sv_h, rows, r_ok, sv_s, offs_d, d_ok)
    ds = tl.load(_square_ptrs(ds_ptr, bh, j, n_tiles, offs_d, D), mask=d_ok[:, None] & d_ok[None, :], other=0.0)
    dv = _mm(pk, ds, LOWP, IEEE)
    d_pk = _mm(vx, tl.trans(ds), LOWP, IEEE)
    d_pk += tl.load(dz_ptr + (bh * n_tiles + j).to(tl.int64) * D + offs_d, mask=d_ok, other=0.0)[None, :]
    dk = tl.where(mask, _phi_bwd(kx, pk, d_pk, KIND), 0.0)
    _store_grad(dk_ptr + b * sx_b + h * sx_h + rows[:, None] * sx_s + offs_d[None, :], dk, mask, ACC)
    _store_grad(dv_ptr + b * sw_b + h * sw_h + rows[:, None] * sw_s + offs_d[None, :], dv, mask, ACC)


# ------------------------------------------------------------------------------------------------ launchers


def _strides(x: torch.Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


def unselected_map(q2k: torch.Tensor, q2k_cnt: torch.Tensor, n_tiles: int) -> torch.Tensor:
    """C = 1 - block map: (B*H, Q_TILES, n_tiles) bool, True where key tile j is not among the first q2k_cnt
    entries of q2k[b, h, i] (entries past the count are never read)."""
    b, h, nq, k_max = q2k.shape
    used = torch.arange(k_max, device=q2k.device) < q2k_cnt.unsqueeze(-1)
    idx = torch.where(used, q2k.long(), n_tiles)  # unused entries land in a spare column
    sel = torch.zeros((b, h, nq, n_tiles + 1), dtype=torch.bool, device=q2k.device).scatter_(-1, idx, True)
    return ~sel[..., :n_tiles].reshape(b * h, nq, n_tiles)


def _groups(bh: int, n_tiles: int, d: int, elem: int) -> list[tuple[int, int]]:
    """Batch-head ranges [g0, g1) whose two live (group, n_tiles, D, D) buffers fit SUMS_BUDGET_BYTES."""
    per = max(1, SUMS_BUDGET_BYTES // (2 * n_tiles * d * d * elem))
    return [(g0, min(g0 + per, bh)) for g0 in range(0, bh, per)]


def _tile_sums(k: torch.Tensor, v: torch.Tensor, tile_offsets: torch.Tensor, kind: str, g0: int, g1: int,
               launch: LinearLaunch, wt: torch.Tensor | None = None, dout: torch.Tensor | None = None,
               db: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(S (G, n_tiles, D, D) in the GEMM operand dtype, times wt (D, D) when given, and z (G, n_tiles, D) fp32) of
    batch-heads [g0, g1); with dout (B, S, H, D), its per-tile row sums into db (G, n_tiles, D) fp32."""
    _, _, h, d = k.shape
    n_tiles = tile_offsets.numel() - 1
    flags = _flags(k)
    s = torch.empty((g1 - g0, n_tiles, d, d), device=k.device,
                    dtype=torch.bfloat16 if flags["LOWP"] else torch.float32)
    z = torch.empty((g1 - g0, n_tiles, d), device=k.device, dtype=torch.float32)
    dout_ = k if dout is None else dout
    _tile_sums_kernel[(n_tiles, g1 - g0)](
        k, v, s if wt is None else wt, s, z, dout_, z if db is None else db, tile_offsets, h, n_tiles, g0,
        *_strides(k), *_strides(v), *_strides(dout_), D=d, KIND=_KIND[kind], PROJ=wt is not None,
        DB=dout is not None, num_warps=launch.fwd_warps, **flags)
    return s, z


def _over_tiles(cmap: torch.Tensor, sums: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cmap @ sums, cmap @ z) per batch-head: cmap (G, M, N) bool, sums (G, N, D, D) (their dtype, fp32
    accumulation), z (G, N, D) fp32 -> (G, M, D, D), (G, M, D)."""
    g, n, d, _ = sums.shape
    u = torch.bmm(cmap.to(sums.dtype), sums.view(g, n, d * d)).view(g, cmap.shape[1], d, d)
    return u, torch.bmm(cmap.to(torch.float32), z)


def _forward(o, q, k, v, weight, bias, q2k, q2k_cnt, tile_offsets, kind, eps, launch):
    """out = o + proj(o_l) (`marginal_branch_add`)."""
    b, s, h, d = q.shape
    n_tiles = tile_offsets.numel() - 1
    out = torch.empty_like(o, memory_format=torch.contiguous_format)
    cmap = unselected_map(q2k, q2k_cnt, n_tiles)
    wt, bias32, flags = _operand(weight.float().t(), q), bias.float(), _flags(q)
    for g0, g1 in _groups(b * h, n_tiles, d, 2 if flags["LOWP"] else 4):
        u, zu = _over_tiles(cmap[g0:g1], *_tile_sums(k, v, tile_offsets, kind, g0, g1, launch, wt))
        _apply_kernel[(n_tiles, g1 - g0)](
            q, o, out, u, zu, bias32, tile_offsets, h, n_tiles, g0, eps, *_strides(q), *_strides(o),
            *_strides(out), D=d, KIND=_KIND[kind], num_warps=launch.fwd_warps, **flags)
        del u, zu
    return out


def marginal_branch_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             weight: torch.Tensor, q2k: torch.Tensor, q2k_cnt: torch.Tensor,
                             tile_offsets: torch.Tensor, kind: str, eps: float,
                             launch: LinearLaunch = DEFAULT_LAUNCH, grads: tuple[torch.Tensor, ...] | None = None
                             ) -> tuple[torch.Tensor, ...]:
    """The marginal branch's backward: (dq, dk, dv, dweight, dbias); the gradient of `o` is dout itself.

    Recomputes the per-tile sums S, z and their unselected sums U, Z (nothing is saved by the forward), then per
    query tile dQ, dU, dZ and o_l (`_bwd_q_kernel`), dS = C^T dU and dz = C^T dZ, and per key tile dK, dV
    (`_bwd_k_kernel`); dW = dO^T o_l and dbias = sum dO.

    Args:
        dout: (B, S, H, D) the gradient of the output (any strides); the rest as `marginal_branch_add`.
        grads: (dq, dk, dv), tensors like q holding another part's gradients (VSA's): the branch's are added to
            them in place and they are returned; None: new tensors.

    Returns:
        dq, dk, dv like q; dweight (D, D) and dbias (D,) fp32.
    """
    b, s, h, d = q.shape
    n_tiles = tile_offsets.numel() - 1
    dout = dout.contiguous()  # one layout whatever autograd hands on (e.g. the expanded ones of out.sum())
    acc = grads is not None
    dq, dk, dv = grads if acc else (torch.empty_like(q, memory_format=torch.contiguous_format) for _ in range(3))
    o_l = torch.empty_like(dout)
    d_ol = torch.matmul(dout, weight.to(dout.dtype))  # d o_l = dO W: a cuBLAS GEMM, not one more in the kernel
    cmap = unselected_map(q2k, q2k_cnt, n_tiles)
    flags = _flags(q)
    # dbias per tile (`_tile_sums_kernel`), summed by torch
    db = torch.empty((b * h, n_tiles, d), device=q.device, dtype=torch.float32)
    for g0, g1 in _groups(b * h, n_tiles, d, 2 if flags["LOWP"] else 4):
        u, zu = _over_tiles(cmap[g0:g1], *_tile_sums(k, v, tile_offsets, kind, g0, g1, launch, dout=dout,
                                                     db=db[g0:g1]))
        du, dzu = torch.empty_like(u), torch.empty_like(zu)
        _bwd_q_kernel[(n_tiles, g1 - g0)](
            q, d_ol, dq, o_l, u, zu, du, dzu, tile_offsets, h, n_tiles, g0, eps, *_strides(q), *_strides(d_ol),
            *_strides(dq), *_strides(o_l), D=d, KIND=_KIND[kind], ACC=acc, num_warps=launch.bwd_warps, **flags)
        del u, zu
        ds, dz = _over_tiles(cmap[g0:g1].transpose(1, 2), du, dzu)
        del du, dzu
        _bwd_k_kernel[(n_tiles, g1 - g0)](
            k, v, dk, dv, ds, dz, tile_offsets, h, n_tiles, g0, *_strides(k), *_strides(v), *_strides(dk),
            *_strides(dv), D=d, KIND=_KIND[kind], ACC=acc, num_warps=launch.bwd_warps, **flags)
        del ds, dz
    dweight = torch.matmul(dout.view(-1, d).t(), o_l.view(-1, d)).float()
    return dq, dk, dv, dweight, db.sum((0, 1))


# --------------------------------------------------------------------------------------- custom ops, autograd

_SCHEMA_IN = "Tensor q2k, Tensor q2k_cnt, Tensor tile_offsets, str kind, float eps"


@torch.library.custom_op(
    "vsagen::sla_marginal", mutates_args=(),
    schema=f"(Tensor o, Tensor q, Tensor k, Tensor v, Tensor weight, Tensor bias, {_SCHEMA_IN}, {_LAUNCH_SCHEMA}) "
           "-> Tensor")
def _op(o, q, k, v, weight, bias, q2k, q2k_cnt, tile_offsets, kind, eps, *launch):
    """out (`_forward`); the backward recomputes what it needs."""
    return _forward(o, q, k, v, weight, bias, q2k, q2k_cnt, tile_offsets, kind, eps, LinearLaunch(*launch))


@_op.register_fake
def _op_fake(o, q, k, v, weight, bias, q2k, q2k_cnt, tile_offsets, kind, eps, *launch):
    return torch.empty_like(o, memory_format=torch.contiguous_format)


@torch.library.custom_op(
    "vsagen::sla_marginal_bwd", mutates_args=(),
    schema=f"(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor weight, {_SCHEMA_IN}, {_LAUNCH_SCHEMA}) "
           "-> (Tensor, Tensor, Tensor, Tensor, Tensor)")
def _bwd_op(dout, q, k, v, weight, q2k, q2k_cnt, tile_offsets, kind, eps, *launch):
    """`marginal_branch_backward`."""
    return marginal_branch_backward(dout, q, k, v, weight, q2k, q2k_cnt, tile_offsets, kind, eps,
                                    LinearLaunch(*launch))


@_bwd_op.register_fake
def _bwd_op_fake(dout, q, k, v, weight, q2k, q2k_cnt, tile_offsets, kind, eps, *launch):
    d = q.shape[-1]
    dense = {"memory_format": torch.contiguous_format}
    return (torch.empty_like(q, **dense), torch.empty_like(q, **dense), torch.empty_like(q, **dense),
            weight.new_empty((d, d), dtype=torch.float32), weight.new_empty((d,), dtype=torch.float32))


def _setup_context(ctx, inputs, output):
    o, q, k, v, weight, bias, q2k, q2k_cnt, tile_offsets, kind, eps, *launch = inputs
    ctx.save_for_backward(q, k, v, weight, q2k, q2k_cnt, tile_offsets)
    ctx.args = (kind, eps, *launch)
    ctx.bias_dtype = bias.dtype


def _backward(ctx, dout):
    q, k, v, weight, q2k, q2k_cnt, tile_offsets = ctx.saved_tensors
    dq, dk, dv, dweight, dbias = _bwd_op(dout, q, k, v, weight, q2k, q2k_cnt, tile_offsets, *ctx.args)
    return ((dout, dq, dk, dv, dweight.to(weight.dtype), dbias.to(ctx.bias_dtype)) + (None,) * 3
            + (None,) * len(ctx.args))


_op.register_autograd(_backward, setup_context=_setup_context)


# ----------------------------------------------------------------------------------------- public function


def check_selection(q: torch.Tensor, q2k: torch.Tensor, q2k_cnt: torch.Tensor, tile_offsets: torch.Tensor) -> None:
    """The marginal branch's index checks (ValueError): shapes, int32, one device, enough tiles for S."""
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


def marginal_branch_add(o: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight: torch.Tensor,
                        bias: torch.Tensor, q2k: torch.Tensor, q2k_cnt: torch.Tensor, tile_offsets: torch.Tensor, *,
                        kind: str = "softmax", eps: float = LINEAR_EPS,
                        launch: LinearLaunch = DEFAULT_LAUNCH) -> torch.Tensor:
    """o + proj(o_l) with SLA*'s marginal linear branch (module docstring), in Triton.

    Args:
        o, q, k, v, weight, bias, kind, eps, launch: as `linear_branch.linear_branch_add` (launch: only its warp
            counts); q, k, v in tile order.
        q2k: (B, H, Q_TILES, K) int32, the key tiles each query tile selected (VSA's), no repeats; only the first
            q2k_cnt entries of a row are read. q2k_cnt: (B, H, Q_TILES) int32 in [0, K].
        tile_offsets: (n_tiles + 1,) int32 tile starts (at most 64 tokens a tile), the last S.

    Returns:
        (B, S, H, D) like o, contiguous; differentiable in o, q, k, v, weight and bias (custom ops).

    Raises:
        ValueError: as `linear_branch_add`, or index tensors of the wrong shape, dtype or device, or fewer tiles
            than S needs. Index values are not checked (that would synchronize the device): q2k's used entries
            must lie in [0, KV_TILES) (an entry of KV_TILES counts as no tile; one outside [0, KV_TILES] fails in
            torch's scatter), q2k_cnt in [0, K]; repeats count once. Tiles must hold at most 64 tokens and
            tile_offsets end at S, or the kernels read out of bounds / leave rows unwritten.

    Source: SLA arXiv 2509.24006 sec. 4 (the marginal blocks' linear attention from pre-aggregated per-block
    sums); seed 002.
    """
    _check(o, q, k, v, weight, bias, kind)
    check_selection(q, q2k, q2k_cnt, tile_offsets)
    q2k, q2k_cnt = q2k.contiguous(), q2k_cnt.contiguous()
    args = (o, q, k, v, weight.contiguous(), bias.contiguous(), q2k, q2k_cnt, tile_offsets, kind, float(eps))
    grads = torch.is_grad_enabled() and any(x.requires_grad for x in (o, q, k, v, weight, bias))
    if not grads and not torch.compiler.is_compiling():
        return _forward(*args, launch)
    return _op(*args, *dataclasses.astuple(launch))
