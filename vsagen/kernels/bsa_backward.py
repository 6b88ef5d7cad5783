"""Block-sparse attention backward over video tiles: the Triton kernels and their launcher `bsa_bwd` (no autograd).

FlashAttention-2's backward (Dao, arXiv 2307.08691, alg. 2) with the forward's LSE: a preprocess computes
delta = rowsum(dO * O) (minus the LSE's incoming gradient), one kernel walks each query tile's q2k list (or its
tile plan) for dQ, another walks each key tile's k2q list (the transposed lists, `k2q.build_k2q_triton` or
`reference.build_k2q`) for dK and dV. Every gradient row is written by exactly one program: no atomics, bitwise
deterministic. With a tuning's bwd_two_streams the dQ launches go on a second CUDA stream beside dK/dV. The layout
contract is in `block_sparse_attn`'s docstring.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import triton
import triton.language as tl

from .bsa_primitives import (BLOCK, LOG2E, PACK_SEG, PLAN_MAX_ROWS, check_fp32_bwd, check_inputs, interpreting,
                             load_full_kv_tile, load_listed_kv_tile, load_rows, mm, pack_rows, plan_counts,
                             q2k_lists, query_group, size_classes, tma_descs, tma_layout_ok, use_tma)
from . import tile_plan  # noqa: E402 (after the primitives, which import it too)
from .k2q import build_k2q_triton
from .tuning import KernelTuning, default_tuning, hip_kwargs, load_hints

# The delta preprocess is a streaming row reduction: one warp group is plenty.
PRE_NUM_WARPS = 4


@triton.jit
def _bsa_bwd_preprocess_kernel(
    o_ptr, do_ptr, lse_ptr, dlse_ptr, delta_ptr,
    stride_ob, stride_os, stride_oh,
    stride_dob, stride_dos, stride_doh,
    stride_lb, stride_lh,
    seq_len, num_heads,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, HAS_DLSE: tl.constexpr,
):
    """One program: delta = rowsum(dO * O) - dLSE for BLOCK_M rows of one (batch, head); 0 on rows with LSE -inf."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < seq_len
    mask = m_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    o = tl.load(o_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :],
                mask=mask, other=0.0).to(tl.float32)  # o: (BLOCK_M, BLOCK_D)
    do = tl.load(do_ptr + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dos + offs_d[None, :],
                 mask=mask, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, 1)  # delta: (BLOCK_M,) fp32
    row = b * stride_lb + h * stride_lh + offs_m
    if HAS_DLSE:
        # d lse_i / d s_ij = P_ij folds into dS = P * (dP - delta) as delta - dlse.
        delta -= tl.load(dlse_ptr + row, mask=m_ok, other=0.0)
    lse = tl.load(lse_ptr + row, mask=m_ok, other=0.0)
    tl.store(delta_ptr + row, tl.where(lse == float("-inf"), 0.0, delta), mask=m_ok)


@triton.jit
def _dq_step(q, do, k, v, n_ok, lse2, delta, dq, qk_scale, IEEE: tl.constexpr, MASK: tl.constexpr = True):
    """dQ += dS K for one key block (FlashAttention-2 alg. 2), P recomputed from the base-2 LSE lse2 (BLOCK_M,);
    keys flagged False in n_ok (BLOCK_N,) are masked unless MASK is False. Returns dq (BLOCK_M, BLOCK_D) fp32,
    unscaled."""
    s = mm(q, tl.trans(k), IEEE)
    if MASK:
        s = tl.where(n_ok[None, :], s * qk_scale, float("-inf"))  # s: (BLOCK_M, BLOCK_N), base-2 logits
    else:
        s = s * qk_scale
    p = tl.exp2(s - lse2[:, None])  # p: (BLOCK_M, BLOCK_N) fp32, the forward's softmax
    dp = mm(do, tl.trans(v), IEEE)  # dp: (BLOCK_M, BLOCK_N) fp32, dO V^T
    ds = p * (dp - delta[:, None])
    return dq + mm(ds.to(k.dtype), k, IEEE)


@triton.jit
def _bsa_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, dq_ptr, lse_ptr, delta_ptr, q2k_ptr, cnt_ptr, off_ptr, k_desc, v_desc, seq_len,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh,
    stride_dqb, stride_dqs, stride_dqh,
    stride_lb, stride_lh,
    stride_ib, stride_ih, stride_iq,
    stride_cb, stride_ch,
    num_heads, sm_scale, qk_scale, len_lo, len_hi, qg_ptr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_FP32: tl.constexpr, IEEE: tl.constexpr, TMA: tl.constexpr, PACK: tl.constexpr, PACK_SEG: tl.constexpr,
    EVICT: tl.constexpr = "", CACHE: tl.constexpr = "", QGROUP: tl.constexpr = False,
):
    """One program: dQ of one query tile of one (batch, head), looping over the key tiles of its q2k row; exits
    at once outside its size class (len_lo, len_hi]. TMA: K / V tiles by TMA, PACK: the row's tile plan, EVICT /
    CACHE: the K / V loads' hints, as in the forward. QGROUP: program_id(0) is a query group of qg_ptr and
    program_id(1) the batch, as in the forward (`bsa_forward.bsa_fwd_grouped`)."""
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    if QGROUP:
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        b = pid_bh
        h, list_t, row_ids, m_ok = query_group(qg_ptr, pid_t, offs_m, BLOCK_M, PACK_SEG)
        d_ok = offs_d < HEAD_DIM
        q_mask = m_ok[:, None] & d_ok[None, :]
        q_rows = row_ids[:, None]
        row = b * stride_lb + h * stride_lh + row_ids
    else:  # one query tile (the original prologue, unchanged: its AMD register allocation is checked)
        b = pid_bh // num_heads
        h = pid_bh % num_heads
        list_t = pid_t
        q_start = tl.load(off_ptr + pid_t)
        q_len = tl.load(off_ptr + pid_t + 1) - q_start
        if (q_len <= len_lo) | (q_len > len_hi):
            return
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        m_ok = offs_m < q_len
        d_ok = offs_d < HEAD_DIM
        q_mask = m_ok[:, None] & d_ok[None, :]
        q_rows = (q_start + offs_m)[:, None]
        row = b * stride_lb + h * stride_lh + q_start + offs_m
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + q_rows * stride_qs + offs_d[None, :],
                mask=q_mask, other=0.0)  # q: (BLOCK_M, BLOCK_D)
    do = tl.load(do_ptr + b * stride_dob + h * stride_doh + q_rows * stride_dos + offs_d[None, :],
                 mask=q_mask, other=0.0)  # do: (BLOCK_M, BLOCK_D)
    lse = tl.load(lse_ptr + row, mask=m_ok, other=float("inf"))
    # Base-2 LSE; +inf on rows past the tile's end and on rows with no selected tile, so their P is exactly 0.
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)  # log2(e)
    delta = tl.load(delta_ptr + row, mask=m_ok, other=0.0)  # delta: (BLOCK_M,) fp32
    if DOT_FP32:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # dq: (BLOCK_M, BLOCK_D) fp32
    row_ptr = q2k_ptr + b * stride_ib + h * stride_ih + list_t * stride_iq
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    if PACK:
        nf, npk, ng = plan_counts(cnt_ptr + b * stride_cb + h * stride_ch + list_t * 4)
        for i in range(0, nf):  # full tiles
            k, v = load_full_kv_tile(k_desc, v_desc, k_base, v_base, tl.load(row_ptr + i), b * seq_len,
                                      h * HEAD_DIM, stride_ks, stride_vs, offs_n, offs_d, d_ok, TMA, DOT_FP32,
                                      EVICT, CACHE)
            dq = _dq_step(q, do, k, v, offs_n, lse2, delta, dq, qk_scale, IEEE, MASK=False)
        for p in range(0, npk):  # partial tiles, packed
            rows, n_ok = pack_rows(row_ptr, nf, ng, p, offs_n, BLOCK_N, PACK_SEG)
            k, v = load_rows(k_base, v_base, rows, n_ok, stride_ks, stride_vs, offs_d, d_ok, DOT_FP32, EVICT, CACHE)
            dq = _dq_step(q, do, k, v, n_ok, lse2, delta, dq, qk_scale, IEEE)
    else:
        cnt = tl.load(cnt_ptr + b * stride_cb + h * stride_ch + list_t)
        for i in range(0, cnt):
            k, v, n_ok = load_listed_kv_tile(k_desc, v_desc, k_base, v_base, off_ptr, tl.load(row_ptr + i),
                                              b * seq_len, h * HEAD_DIM, stride_ks, stride_vs, offs_n, offs_d, d_ok,
                                              TMA, DOT_FP32, EVICT, CACHE)  # k, v: (BLOCK_N, BLOCK_D)
            dq = _dq_step(q, do, k, v, n_ok, lse2, delta, dq, qk_scale, IEEE)
    dq = dq * sm_scale
    tl.store(dq_ptr + b * stride_dqb + h * stride_dqh + q_rows * stride_dqs + offs_d[None, :],
             dq.to(dq_ptr.dtype.element_ty), mask=q_mask)


@triton.jit
def _dkdv_step(k, v, q, do, lse, delta, dk, dv, qk_scale, DOT_FP32: tl.constexpr, IEEE: tl.constexpr):
    """dK, dV += one query block's contribution (FlashAttention-2 alg. 2 on S^T = K Q^T), P^T recomputed from the
    natural-log LSE lse (BLOCK_M,) (+inf on rows past a tile's end or a pack's rows: P^T = 0 there)."""
    # Base-2 LSE; +inf on rows past the query tile's end (and, defensively, on empty rows): P^T = 0 there.
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)  # log2(e)
    if DOT_FP32:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    st = mm(k, tl.trans(q), IEEE)  # st: (BLOCK_N, BLOCK_M) fp32, S^T unscaled
    pt = tl.exp2(st * qk_scale - lse2[None, :])  # pt: (BLOCK_N, BLOCK_M) fp32, P^T
    dv += mm(pt.to(do.dtype), do, IEEE)
    dpt = mm(v, tl.trans(do), IEEE)  # dpt: (BLOCK_N, BLOCK_M) fp32, (dO V^T)^T
    dst = pt * (dpt - delta[None, :])
    dk += mm(dst.to(q.dtype), q, IEEE)
    return dk, dv


@triton.jit
def _bsa_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, dk_ptr, dv_ptr, lse_ptr, delta_ptr, k2q_ptr, cnt_ptr, off_ptr, q_desc, do_desc,
    seq_len,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh,
    stride_dkb, stride_dks, stride_dkh,
    stride_dvb, stride_dvs, stride_dvh,
    stride_lb, stride_lh,
    stride_jb, stride_jh, stride_jk,
    stride_cb, stride_ch,
    num_heads, sm_scale, qk_scale, len_lo, len_hi,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_FP32: tl.constexpr, IEEE: tl.constexpr, TMA: tl.constexpr,
    EVICT: tl.constexpr = "", CACHE: tl.constexpr = "", K2Q_ROWS: tl.constexpr = False,
    PACK_Q: tl.constexpr = False, PACK_SEG: tl.constexpr = 8,
):
    """One program: dK and dV of one key tile of one (batch, head), looping over the query tiles of its k2q row;
    exits at once outside its size class (len_lo, len_hi]. TMA: the Q / dO tiles by TMA from q_desc / do_desc
    (rows past a partial query tile's end then hold the next tile's tokens; their LSE is +inf, so P^T is 0).
    EVICT / CACHE: the Q / dO loads' hints (pointer loads only). K2Q_ROWS: the k2q entries are (start << 7) |
    length of each query tile (`k2q.build_k2q_triton(tile_offsets=...)`), one load per iteration; else tile ids,
    whose start and length are read from off_ptr.

    PACK_Q: k2q_ptr / cnt_ptr are the tile plans of the k2q rows (`tile_plan.build_tile_plan` of k2q lists of
    tile ids) and their counts: the full query tiles one per iteration (TMA or pointer loads, as above), then the
    partial query tiles' rows packed PACK_SEG at a time, BLOCK_M per iteration (pointer gathers of Q, dO, LSE and
    delta), so a partial query tile no longer costs a whole 64-row iteration.

    Works on transposed scores S^T = K Q^T so that no (BLOCK_N, BLOCK_M) tile needs a register transpose. Rows
    past the key tile's end see zero keys; their dK / dV rows are computed but never stored.
    """
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    k_start = tl.load(off_ptr + pid_t)
    k_len = tl.load(off_ptr + pid_t + 1) - k_start
    if (k_len <= len_lo) | (k_len > len_hi):
        return
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    n_ok = offs_n < k_len
    d_ok = offs_d < HEAD_DIM
    kv_mask = n_ok[:, None] & d_ok[None, :]
    k_rows = (k_start + offs_n)[:, None]
    k = tl.load(k_ptr + b * stride_kb + h * stride_kh + k_rows * stride_ks + offs_d[None, :],
                mask=kv_mask, other=0.0)  # k: (BLOCK_N, BLOCK_D)
    v = tl.load(v_ptr + b * stride_vb + h * stride_vh + k_rows * stride_vs + offs_d[None, :],
                mask=kv_mask, other=0.0)  # v: (BLOCK_N, BLOCK_D)
    if DOT_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)  # dk: (BLOCK_N, BLOCK_D) fp32
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)  # dv: (BLOCK_N, BLOCK_D) fp32
    row_ptr = k2q_ptr + b * stride_jb + h * stride_jh + pid_t * stride_jk
    q_base = q_ptr + b * stride_qb + h * stride_qh
    do_base = do_ptr + b * stride_dob + h * stride_doh
    lse_base = lse_ptr + b * stride_lb + h * stride_lh
    delta_base = delta_ptr + b * stride_lb + h * stride_lh
    if PACK_Q:
        nf, npk, ng = plan_counts(cnt_ptr + b * stride_cb + h * stride_ch + pid_t * 4)
        for i in range(0, nf):  # full query tiles
            q_start = tl.load(row_ptr + i)
            rows = (q_start + offs_m)[:, None]
            if TMA:
                q = q_desc.load([b * seq_len + q_start, h * HEAD_DIM])  # (BLOCK_M, BLOCK_D)
                do = do_desc.load([b * seq_len + q_start, h * HEAD_DIM])
            else:
                q_mask = d_ok[None, :] & (offs_m >= 0)[:, None]
                q = tl.load(q_base + rows * stride_qs + offs_d[None, :], mask=q_mask, other=0.0,
                            eviction_policy=EVICT, cache_modifier=CACHE)
                do = tl.load(do_base + rows * stride_dos + offs_d[None, :], mask=q_mask, other=0.0,
                             eviction_policy=EVICT, cache_modifier=CACHE)
            lse = tl.load(lse_base + q_start + offs_m)
            delta = tl.load(delta_base + q_start + offs_m)
            dk, dv = _dkdv_step(k, v, q, do, lse, delta, dk, dv, qk_scale, DOT_FP32, IEEE)
        for p in range(0, npk):  # partial query tiles, packed
            prow, m_ok = pack_rows(row_ptr, nf, ng, p, offs_m, BLOCK_M, PACK_SEG)
            q_mask = m_ok[:, None] & d_ok[None, :]
            q = tl.load(q_base + prow[:, None] * stride_qs + offs_d[None, :], mask=q_mask, other=0.0,
                        eviction_policy=EVICT, cache_modifier=CACHE)
            do = tl.load(do_base + prow[:, None] * stride_dos + offs_d[None, :], mask=q_mask, other=0.0,
                         eviction_policy=EVICT, cache_modifier=CACHE)
            lse = tl.load(lse_base + prow, mask=m_ok, other=float("inf"))
            delta = tl.load(delta_base + prow, mask=m_ok, other=0.0)
            dk, dv = _dkdv_step(k, v, q, do, lse, delta, dk, dv, qk_scale, DOT_FP32, IEEE)
    else:
        cnt = tl.load(cnt_ptr + b * stride_cb + h * stride_ch + pid_t)
        for i in range(0, cnt):
            if K2Q_ROWS:
                entry = tl.load(row_ptr + i)
                q_start = entry >> 7
                q_len = entry & 127
            else:
                qt = tl.load(row_ptr + i)
                q_start = tl.load(off_ptr + qt)
                q_len = tl.load(off_ptr + qt + 1) - q_start
            m_ok = offs_m < q_len
            rows = (q_start + offs_m)[:, None]
            if TMA:
                q = q_desc.load([b * seq_len + q_start, h * HEAD_DIM])  # (BLOCK_M, BLOCK_D)
                do = do_desc.load([b * seq_len + q_start, h * HEAD_DIM])
            else:
                q_mask = m_ok[:, None] & d_ok[None, :]
                q = tl.load(q_base + rows * stride_qs + offs_d[None, :], mask=q_mask, other=0.0,
                            eviction_policy=EVICT, cache_modifier=CACHE)  # (BLOCK_M, BLOCK_D)
                do = tl.load(do_base + rows * stride_dos + offs_d[None, :], mask=q_mask, other=0.0,
                             eviction_policy=EVICT, cache_modifier=CACHE)
            lse = tl.load(lse_base + q_start + offs_m, mask=m_ok, other=float("inf"))
            delta = tl.load(delta_base + q_start + offs_m, mask=m_ok, other=0.0)
            dk, dv = _dkdv_step(k, v, q, do, lse, delta, dk, dv, qk_scale, DOT_FP32, IEEE)
    dk = dk * sm_scale
    tl.store(dk_ptr + b * stride_dkb + h * stride_dkh + k_rows * stride_dks + offs_d[None, :],
             dk.to(dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptr + b * stride_dvb + h * stride_dvh + k_rows * stride_dvs + offs_d[None, :],
             dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


def _launch_dq(grid, block_d, q, k, v, do, dq, lse, delta, q2k, q2k_cnt, tile_offsets, k_desc, v_desc, s, h,
               scale, meta, tma_kv, launch, hip, groups=None, group_launch=None) -> None:
    """The dQ kernel's size-class launches (`launch`, a tuning's bwd_dq_launch; `hip` its HIP options) on the
    current stream; q2k / q2k_cnt and meta's PACK from `q2k_lists`. With `groups` (a query-group table,
    `query_groups.build_query_groups`), one launch over its programs at group_launch (block_m, warps, stages)."""
    classes = size_classes(launch, block_d, q.dtype)
    extra = {}
    if groups is not None:
        classes = [(group_launch[0], 0, group_launch[1], group_launch[2])]
        grid = (groups.shape[0], q.shape[0])
        extra = dict(QGROUP=True)
    for blk, lo, num_warps, num_stages in classes:
        _bsa_bwd_dq_kernel[grid](
            q, k, v, do, dq, lse, delta, q2k, q2k_cnt, tile_offsets, k_desc, v_desc, s,
            q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            do.stride(0), do.stride(1), do.stride(2),
            dq.stride(0), dq.stride(1), dq.stride(2),
            lse.stride(0), lse.stride(1),
            q2k.stride(0), q2k.stride(1), q2k.stride(2),
            q2k_cnt.stride(0), q2k_cnt.stride(1),
            h, scale, scale * LOG2E, lo, blk, lse if groups is None else groups, **meta, BLOCK_M=blk,
            BLOCK_N=BLOCK, TMA=tma_kv, PACK_SEG=PACK_SEG, num_warps=num_warps, num_stages=num_stages,
            **hip_kwargs(hip, q.device), **extra,
        )


K2Q_ROWS_MAX_TOKENS = 2 ** 24  # pre-offset k2q entries pack the start row as start << 7 into int32


def k2q_lists(q2k: torch.Tensor, q2k_cnt: torch.Tensor, tile_offsets: torch.Tensor, seq_len: int,
              tuning: KernelTuning) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The dK/dV loop's k2q lists and `bsa_bwd`'s k2q_rows flag: `k2q.build_k2q_triton` with pre-offset entries
    ((start << 7) | length) when the tuning has lean_index and seq_len < 2^24, else with tile ids."""
    rows = tuning.lean_index and seq_len < K2Q_ROWS_MAX_TOKENS
    k2q, k2q_cnt = build_k2q_triton(q2k, q2k_cnt, tile_offsets.numel() - 1, tile_offsets if rows else None)
    return k2q, k2q_cnt, rows


@functools.cache
def _side_stream(idx: int) -> torch.cuda.Stream:
    """One extra CUDA stream per device index for the backward's dQ launches."""
    return torch.cuda.Stream(device=idx)


def bsa_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
            lse: torch.Tensor, q2k: torch.Tensor, q2k_cnt: torch.Tensor, k2q: torch.Tensor, k2q_cnt: torch.Tensor,
            tile_offsets: torch.Tensor, scale: float | None = None, dlse: torch.Tensor | None = None,
            tuning: KernelTuning | None = None, k2q_rows: bool = False, groups: torch.Tensor | None = None,
            group_launch: tuple[int, int, int] | None = None,
            pack_dkdv: bool = False, *, checked: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward kernels (no autograd; layout contract in `block_sparse_attn`'s docstring).

    Args:
        do: (B, S, H, D) gradient of out, any strides (copied if the head dim is not unit stride).
        q, k, v, out, lse, q2k, q2k_cnt, tile_offsets, scale: the forward's inputs and outputs (lse (B, H, S)).
        k2q, k2q_cnt: (B, H, KV_TILES, Q_TILES) / (B, H, KV_TILES) int32, the transpose of (q2k, q2k_cnt), from
            `k2q.build_k2q_triton` or `reference.build_k2q`; k2q with unit stride on its last axis. With
            k2q_rows, the entries are (start row << 7) | length of each query tile instead of its id
            (`k2q.build_k2q_triton(..., tile_offsets=tile_offsets)`, for a tuning with lean_index).
        dlse: optional (B, H, S) gradient of lse.
        tuning: tile loads, packing, the second stream and the dQ / dK-dV launches; None:
            `tuning.kernel_tuning(q.device, D)`.
        groups, group_launch: a query-group table (`query_groups.build_query_groups`; q2k the same for every batch
            entry) and the (block_m, num_warps, num_stages) of the dQ launch over it; None: dQ per query tile.
        pack_dkdv: with k2q lists of tile ids (k2q_rows False) on a layout with partial tiles, the dK/dV loop walks
            tile plans of the k2q rows (`tile_plan.build_tile_plan`, one more small launch): partial query tiles
            packed 64 rows to an iteration instead of one padded tile each.
        checked: the forward's public function made `check_inputs` and `check_fp32_bwd` on q, k, v and the index
            tensors (the custom ops' backward): not made again; k2q, do, out and lse are checked either way.

    Returns:
        dq, dk, dv: (B, S, H, D) like q, k, v.

    Raises:
        ValueError: inputs outside the contract (`check_inputs`), k2q / do / out / lse of the wrong shape or
            dtype, or fp32 inputs with D > 128 on a GPU.
    """
    if not checked:
        check_inputs(q, k, v, q2k, q2k_cnt, tile_offsets)
        check_fp32_bwd(q)
    b, s, h, d = q.shape
    n_tiles = tile_offsets.numel() - 1
    _check_bwd_inputs(q, do, out, lse, k2q, k2q_cnt, n_tiles)
    scale = d ** -0.5 if scale is None else scale
    tuning = default_tuning(q.device, d) if tuning is None else tuning
    do = do.to(q.dtype)
    do = do if do.stride(-1) == 1 and (tma_layout_ok(do) or not tma_layout_ok(q)) else do.contiguous()
    out = out if out.stride(-1) == 1 else out.contiguous()
    lse = lse.float().contiguous()
    dlse = None if dlse is None else dlse.float().contiguous()
    delta = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    block_d = max(16, triton.next_power_of_2(d))
    interp = interpreting()
    _launch_preprocess(out, do, lse, dlse, delta, block_d)
    tma_kv, tma_qdo = use_tma(k, v, wanted=tuning.tma_loads), use_tma(q, do, wanted=tuning.tma_loads)
    k_desc, v_desc = tma_descs(tma_kv, k, v)
    q_desc, do_desc = tma_descs(tma_qdo, q, do)
    meta = dict(HEAD_DIM=d, BLOCK_D=block_d, DOT_FP32=interp, IEEE=(q.dtype == torch.float32 or interp),
                **load_hints(tuning))
    grid = (n_tiles, b * h)
    side = _dq_stream(q, tuning, interp)
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        lists, counts, pack = q2k_lists(q2k, q2k_cnt, tile_offsets, s, tuning.pack_partial_tiles)
        _launch_dq(grid, block_d, q, k, v, do, dq, lse, delta, lists, counts, tile_offsets, k_desc, v_desc, s, h,
                   scale, dict(meta, PACK=pack), tma_kv, tuning.bwd_dq_launch, tuning.hip_dq, groups, group_launch)
    pack_q = pack_dkdv and not k2q_rows and s != BLOCK * n_tiles and s < PLAN_MAX_ROWS
    if pack_q:  # the dK/dV loop over tile plans of the k2q rows: partial query tiles packed
        k2q, k2q_cnt = tile_plan.build_tile_plan(k2q, k2q_cnt, tile_offsets)
    _launch_dkdv(grid, block_d, q, k, v, do, dk, dv, lse, delta, k2q, k2q_cnt, tile_offsets, q_desc, do_desc, scale,
                 meta, tma_qdo, k2q_rows, pack_q, tuning)
    if side is not None:
        torch.cuda.current_stream(q.device).wait_stream(side)
    return dq, dk, dv


def _check_bwd_inputs(q: torch.Tensor, do: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, k2q: torch.Tensor,
                      k2q_cnt: torch.Tensor, n_tiles: int) -> None:
    """`bsa_bwd`'s own input checks (k2q / k2q_cnt, do, out, lse against q's (B, S, H, D) and `n_tiles`).

    Raises:
        ValueError: a shape, dtype or stride outside the contract (one message per group, as listed).
    """
    b, s, h, _ = q.shape
    if k2q.dim() != 4 or k2q.shape[:3] != (b, h, n_tiles) or k2q_cnt.shape != (b, h, n_tiles):
        raise ValueError(f"k2q must be (B, H, KV_TILES, Q_TILES) and k2q_cnt (B, H, KV_TILES) with "
                         f"(B, H, KV_TILES) = ({b}, {h}, {n_tiles}); got {tuple(k2q.shape)}, {tuple(k2q_cnt.shape)}")
    if k2q.dtype != torch.int32 or k2q_cnt.dtype != torch.int32 or k2q.stride(-1) != 1:
        raise ValueError("k2q and k2q_cnt must be int32, k2q with unit stride on its last axis")
    if do.shape != q.shape or out.shape != q.shape or lse.shape != (b, h, s):
        raise ValueError(f"do and out must be {tuple(q.shape)} and lse ({b}, {h}, {s}); got {tuple(do.shape)}, "
                         f"{tuple(out.shape)}, {tuple(lse.shape)}")


def _launch_preprocess(out: torch.Tensor, do: torch.Tensor, lse: torch.Tensor, dlse: torch.Tensor | None,
                       delta: torch.Tensor, block_d: int) -> None:
    """The preprocess launch on the current stream: delta (B, H, S) float32 = rowsum(dO * O), minus `dlse` if
    given; out / do (B, S, H, D) with unit stride on D, lse / dlse (B, H, S) contiguous float32."""
    b, s, h, d = out.shape
    _bsa_bwd_preprocess_kernel[(triton.cdiv(s, BLOCK), b * h)](
        out, do, lse, lse if dlse is None else dlse, delta,
        out.stride(0), out.stride(1), out.stride(2),
        do.stride(0), do.stride(1), do.stride(2),
        lse.stride(0), lse.stride(1),
        s, h,
        HEAD_DIM=d, BLOCK_D=block_d, BLOCK_M=BLOCK, HAS_DLSE=dlse is not None, num_warps=PRE_NUM_WARPS,
    )


def _dq_stream(q: torch.Tensor, tuning: KernelTuning, interp: bool) -> torch.cuda.Stream | None:
    """The second stream the dQ launches go on (a tuning's bwd_two_streams, on CUDA, not interpreting), made to
    wait for the current stream's work; None: dQ on the current stream."""
    if not (tuning.bwd_two_streams and q.is_cuda and not interp):
        return None
    # dQ on a second stream, beside dK/dV: their launches fill each other's tails
    side = _side_stream(q.device.index if q.device.index is not None else torch.cuda.current_device())
    side.wait_stream(torch.cuda.current_stream(q.device))
    return side


def _launch_dkdv(grid, block_d, q, k, v, do, dk, dv, lse, delta, k2q, k2q_cnt, tile_offsets, q_desc, do_desc,
                 scale, meta, tma_qdo, k2q_rows, pack_q, tuning) -> None:
    """The dK/dV kernel's size-class launches (a tuning's bwd_dkdv_launch, its hip_dkdv options) on the current
    stream, over the k2q lists (or their tile plans, `pack_q`)."""
    s, h = q.shape[1], q.shape[2]
    for blk, lo, num_warps, num_stages in size_classes(tuning.bwd_dkdv_launch, block_d, q.dtype):
        _bsa_bwd_dkdv_kernel[grid](
            q, k, v, do, dk, dv, lse, delta, k2q, k2q_cnt, tile_offsets, q_desc, do_desc, s,
            q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            do.stride(0), do.stride(1), do.stride(2),
            dk.stride(0), dk.stride(1), dk.stride(2),
            dv.stride(0), dv.stride(1), dv.stride(2),
            lse.stride(0), lse.stride(1),
            k2q.stride(0), k2q.stride(1), k2q.stride(2),
            k2q_cnt.stride(0), k2q_cnt.stride(1),
            h, scale, scale * LOG2E, lo, blk, **meta, BLOCK_M=BLOCK, BLOCK_N=blk, TMA=tma_qdo, K2Q_ROWS=k2q_rows,
            PACK_Q=pack_q, PACK_SEG=PACK_SEG, num_warps=num_warps, num_stages=num_stages,
            **hip_kwargs(tuning.hip_dkdv, q.device),
        )
