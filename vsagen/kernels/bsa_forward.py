"""Block-sparse attention forward over video tiles: the Triton kernel and its launchers `bsa_fwd` and
`bsa_fwd_linear` (SLA*'s global linear branch added in the epilogue; `LinearLaunch.fused_epilogue`); no autograd.

For each (batch, head, query tile), online-softmax attention (FlashAttention-2, arXiv 2307.08691, alg. 1) of the
tile's query tokens over the tokens of the key tiles in its q2k row, or over its tile plan (`tile_plan`) when the
tuning packs partial tiles; the layout contract is in `block_sparse_attn`'s docstring. Launch parameters, tile
loads (TMA or pointers) and packing come from a `tuning.KernelTuning`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .bsa_primitives import (BLOCK, LOG2E, PACK_SEG, TMA_DTYPES_8BIT, check_inputs, interpreting, load_full_kv_tile,
                             load_k_vt, load_listed_kv_tile, load_rows, mm, pack_rows, plan_counts, q2k_lists,
                             query_group, size_classes, tma_descs, tma_descs_v_t, use_tma, v_t_tma_ok)
from .linear_branch import _KIND, _flags, _mm, _phi
from .tuning import KernelTuning, default_tuning, hip_kwargs, load_hints

BRANCH_SPLIT = 2  # `_linear_epilogue`'s column blocks (sm_90 compile, 4 warps, D = 128: 1 block spilled 552 bytes)


@triton.jit
def _linear_epilogue(q, m_ok, d_ok, offs_d, o_ptr, o_rows, sparse_ptr, kvw_ptr, z_ptr, bias_ptr, bh, eps,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, KIND: tl.constexpr, LOWP: tl.constexpr,
                     IEEE: tl.constexpr, SPLIT: tl.constexpr):
    """SLA*'s projected global linear branch of one query tile added to its sparse output (`linear_branch`'s apply
    arithmetic): o[rows] = phi(q) KVW / (eps + phi(q) . z) + bias + sparse[rows], with batch-head bh's KVW = KV W^T
    (D, D) and z (D,), q the tile's (BLOCK_M, BLOCK_D) rows, o_rows (BLOCK_M, 1) their offsets in o and in sparse
    (the sparse output, stored already). In SPLIT column blocks of KVW and o (fewer live registers than one
    (BLOCK_M, BLOCK_D) product beside the sparse kernel's state)."""
    pq = _phi(q.to(tl.float32), m_ok, d_ok, KIND)
    z = tl.load(z_ptr + bh * HEAD_DIM + offs_d, mask=d_ok, other=0.0)
    inv = 1.0 / (eps + tl.sum(pq * z[None, :], 1))
    pq = pq.to(tl.bfloat16) if LOWP else pq
    BLOCK_E: tl.constexpr = BLOCK_D // SPLIT
    kvw_base = kvw_ptr + bh.to(tl.int64) * HEAD_DIM * HEAD_DIM
    for c in tl.static_range(SPLIT):
        offs_e = c * BLOCK_E + tl.arange(0, BLOCK_E)
        e_ok = offs_e < HEAD_DIM
        w = tl.load(kvw_base + offs_d[:, None] * HEAD_DIM + offs_e[None, :], mask=d_ok[:, None] & e_ok[None, :],
                    other=0.0)
        y = _mm(pq, w, LOWP, IEEE) * inv[:, None] + tl.load(bias_ptr + offs_e, mask=e_ok, other=0.0)[None, :]
        mask = m_ok[:, None] & e_ok[None, :]
        rows = o_rows + offs_e[None, :]
        y += tl.load(sparse_ptr + rows, mask=mask, other=0.0).to(tl.float32)
        tl.store(o_ptr + rows, y.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _round_e4m3(p):
    """p (fp32, in [0, 448]) rounded to e4m3's grid, nearest even, kept in fp32: 3 mantissa bits from 2^-6 up (the
    bits below rounded off, a carry moving into the exponent), steps of 2^-9 below 2^-6 (subnormals). The Triton
    interpreter's own fp32 -> fp8e4nv cast (3.9) drops the carry (127.46 -> 64, not 128), so the interpreted SAGE
    kernel rounds with this and multiplies in fp32; the GPU casts (cvt.rn.satfinite)."""
    bits = p.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000  # round to nearest even at mantissa bit 20
    normal = bits.to(tl.float32, bitcast=True)
    sub = (p + 16384.0) - 16384.0  # fp32 ulp at 2^14 is 2^-9: nearest even multiple of 2^-9
    return tl.where(p < 0.015625, sub, normal)


@triton.jit
def _softmax_step(s, n_ok, v, m_i, l_i, acc, qk_scale, IEEE: tl.constexpr, MASK: tl.constexpr = True,
                  SAGE: tl.constexpr = False, P_OFFSET: tl.constexpr = 0.0):
    """One online-softmax update (FlashAttention-2 alg. 1) with scores s (BLOCK_M, BLOCK_N) fp32 unscaled, key
    validity n_ok (BLOCK_N,) (ignored unless MASK), values v (BLOCK_N, BLOCK_D); returns the new (m_i, l_i, acc),
    base 2. qk_scale: a scalar, or SAGE's (BLOCK_M, BLOCK_N) dequantizing scales. SAGE (`sage`'s formulas): P~ =
    exp2(s - m + P_OFFSET) summed unrounded into l_i, rounded to e4m3 (v's dtype, fp8e4nv; fp32 under the
    interpreter: `_round_e4m3`) for the P.V product."""
    if MASK:
        s = tl.where(n_ok[None, :], s * qk_scale, float("-inf"))  # base-2 logits
    else:
        s = s * qk_scale
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    if SAGE:
        p = tl.exp2(s - m_new[:, None] + P_OFFSET)
    else:
        p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if SAGE and IEEE:
        p = _round_e4m3(p)
    if IEEE:  # the accumulator goes into the dot itself (as timed on the H200)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)
    return m_new, l_i, acc


@triton.jit
def _sage_scales(qsc, ks_row, rows, n_ok, SAGE: tl.constexpr, MASK: tl.constexpr = True):
    """The (BLOCK_M, BLOCK_N) dequantizing scales of one key step (SAGE: query scales qsc (BLOCK_M,) with the
    softmax scale folded in, times the keys' per-token scales at ks_row + rows); else qsc, the scalar qk_scale."""
    scales = qsc
    if SAGE:
        if MASK:
            ksc = tl.load(ks_row + rows, mask=n_ok, other=0.0)
        else:
            ksc = tl.load(ks_row + rows)
        scales = qsc[:, None] * ksc[None, :]
    return scales


@triton.jit
def _bsa_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, q2k_ptr, cnt_ptr, off_ptr, k_desc, v_desc, seq_len,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh,
    stride_ib, stride_ih, stride_iq,
    stride_cb, stride_ch,
    num_heads, qk_scale, len_lo, len_hi,
    o_sparse_ptr, kvw_ptr, z_ptr, bias_ptr, eps, qg_ptr, qs_ptr, ks_ptr, vs_ptr, vcol_ptr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_FP32: tl.constexpr, IEEE: tl.constexpr, TMA: tl.constexpr, PACK: tl.constexpr, PACK_SEG: tl.constexpr,
    BRANCH: tl.constexpr = False, SAVE_SPARSE: tl.constexpr = False, KIND: tl.constexpr = 0,
    LOWP: tl.constexpr = False, BRANCH_IEEE: tl.constexpr = False, BRANCH_SPLIT: tl.constexpr = 1,
    EVICT: tl.constexpr = "", CACHE: tl.constexpr = "", QGROUP: tl.constexpr = False,
    SAGE: tl.constexpr = False, P_OFFSET: tl.constexpr = 0.0, VT_TMA: tl.constexpr = False,
):
    """One program: one query tile of one (batch, head), looping over its selected key tiles; exits at once
    unless the tile holds more than len_lo and at most len_hi (<= BLOCK_M) tokens (its size class). TMA: the
    K / V tiles come by TMA from k_desc / v_desc (see `use_tma`), else by pointer loads from k_ptr / v_ptr.
    PACK: q2k_ptr / cnt_ptr are the rows' tile plans (`tile_plan`) and their counts: the full tiles are taken whole
    (TMA or pointer loads, no mask), then the partial tiles' tokens 64 at a time (pointer gathers); else q2k_ptr /
    cnt_ptr are the q2k lists and counts, one tile per iteration. BRANCH: SLA*'s global linear branch is added to
    the output in the epilogue (`_linear_epilogue`, operands kvw_ptr / z_ptr / bias_ptr, feature map KIND, GEMM
    flags LOWP / BRANCH_IEEE as `linear_branch`) to the sparse output rounded to o's dtype (as when the branch runs
    after it), which is stored first (at o_sparse_ptr, o's strides, with SAVE_SPARSE; else at o_ptr) and read back.
    EVICT / CACHE: the K / V loads' hints (`tuning.load_hints`; pointer loads only).
    QGROUP: program_id(0) is a query group (`bsa_fwd_grouped`): row program_id(0) of qg_ptr holds (head, list
    tile, BLOCK_M / PACK_SEG row segments (first row << 4) | rows): BLOCK_M query rows of tiles that share one key
    list, the list of tile `list tile`; program_id(1) is the batch.
    SAGE: the 8-bit fine stage (`sage`'s formulas): q / k int8 with per-token fp32 scales at qs_ptr / ks_ptr
    ((B, H, S) contiguous), v fp8e4nv transposed in tile slots (`sage.v_slots`: key tile t's tokens at columns
    64 t.. of its (D, T*64) block, channel stride stride_vd; VT_TMA: its tiles by TMA from v_desc over (B*H*D,
    T*64), else pointer loads) with per-channel scales at vs_ptr ((B, H, D) contiguous); every key step loads a V^T
    (BLOCK_D, BLOCK_N) tile (`load_k_vt`) and takes tl.trans of it as the P.V dot's B operand (K-major, as Hopper's
    fp8 wgmma needs): with q2k lists tile kt's slot at column kt * 64; with tile plans (which hold token rows) the
    columns from vcol_ptr ((S,) int32, `sage.v_slot_columns`): a full tile's slot start, a packed group's 8
    columns. The scores are int32 dots (fp32 ones of int8 values under the
    interpreter, exact), P.V an fp8 dot (`_softmax_step`), P_OFFSET the exponent offset of P~ (removed from the
    LSE). stride_vd is unused without SAGE."""
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    if QGROUP:
        b = pid_bh
        h, list_t, q_rows, m_ok = query_group(qg_ptr, pid_t, offs_m, BLOCK_M, PACK_SEG)
        pid_bh = b * num_heads + h
    else:
        b = pid_bh // num_heads
        h = pid_bh % num_heads
        list_t = pid_t
        q_start = tl.load(off_ptr + pid_t)
        q_len = tl.load(off_ptr + pid_t + 1) - q_start
        if (q_len <= len_lo) | (q_len > len_hi):
            return
        m_ok = offs_m < q_len
        q_rows = q_start + offs_m
    d_ok = offs_d < HEAD_DIM
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + q_rows[:, None] * stride_qs + offs_d[None, :],
                mask=m_ok[:, None] & d_ok[None, :], other=0.0)  # q: (BLOCK_M, BLOCK_D)
    if DOT_FP32:
        q = q.to(tl.float32)
    if SAGE:  # per-token scales, (B, H, S) contiguous; qsc (BLOCK_M,) with the base-2 softmax scale folded in
        sc_row = pid_bh.to(tl.int64) * seq_len
        qsc = tl.load(qs_ptr + sc_row + q_rows, mask=m_ok, other=0.0) * qk_scale
        ks_row = ks_ptr + sc_row
    else:
        qsc = qk_scale
        ks_row = ks_ptr
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # acc: (BLOCK_M, BLOCK_D) fp32
    row_ptr = q2k_ptr + b * stride_ib + h * stride_ih + list_t * stride_iq
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    if PACK:
        nf, npk, ng = plan_counts(cnt_ptr + b * stride_cb + h * stride_ch + list_t * 4)
        for i in range(0, nf):  # full tiles
            k_start = tl.load(row_ptr + i)
            if SAGE:
                v_col = tl.multiple_of(tl.load(vcol_ptr + k_start), BLOCK_N)  # the tile's slot
                k, vt = load_k_vt(k_desc, v_desc, k_base, v_base, k_start, k_start + offs_n, v_col, v_col + offs_n,
                                  offs_n, b * seq_len, h * HEAD_DIM, pid_bh * HEAD_DIM, stride_ks, stride_vd,
                                  offs_d, d_ok, TMA, VT_TMA, False, DOT_FP32, EVICT, CACHE)
                v = tl.trans(vt)
            else:
                k, v = load_full_kv_tile(k_desc, v_desc, k_base, v_base, k_start, b * seq_len,
                                          h * HEAD_DIM, stride_ks, stride_vs, offs_n, offs_d, d_ok, TMA, DOT_FP32,
                                          EVICT, CACHE)
            s = mm(q, tl.trans(k), IEEE).to(tl.float32)  # s: (BLOCK_M, BLOCK_N) fp32, unscaled
            m_i, l_i, acc = _softmax_step(s, offs_n, v, m_i, l_i, acc,
                                          _sage_scales(qsc, ks_row, k_start + offs_n, offs_n, SAGE, MASK=False),
                                          IEEE, MASK=False, SAGE=SAGE, P_OFFSET=P_OFFSET)
        for p in range(0, npk):  # partial tiles, packed
            rows, n_ok = pack_rows(row_ptr, nf, ng, p, offs_n, BLOCK_N, PACK_SEG)
            if SAGE:  # gathered tokens: pointer loads, runs of PACK_SEG slot columns from a slot start + j PACK_SEG
                within = offs_n % PACK_SEG
                v_cols = tl.load(vcol_ptr + rows - within) + within  # each group's first token's column
                v_cols = tl.max_contiguous(tl.multiple_of(v_cols, PACK_SEG), PACK_SEG)
                k, vt = load_k_vt(k_desc, v_desc, k_base, v_base, 0, rows, 0, v_cols, n_ok, 0, 0, 0, stride_ks,
                                  stride_vd, offs_d, d_ok, False, False, True, DOT_FP32, EVICT, CACHE)
                v = tl.trans(vt)
            else:
                k, v = load_rows(k_base, v_base, rows, n_ok, stride_ks, stride_vs, offs_d, d_ok, DOT_FP32, EVICT,
                                 CACHE)
            s = mm(q, tl.trans(k), IEEE).to(tl.float32)
            m_i, l_i, acc = _softmax_step(s, n_ok, v, m_i, l_i, acc, _sage_scales(qsc, ks_row, rows, n_ok, SAGE),
                                          IEEE, SAGE=SAGE, P_OFFSET=P_OFFSET)
    else:
        cnt = tl.load(cnt_ptr + b * stride_cb + h * stride_ch + list_t)
        for i in range(0, cnt):
            kt = tl.load(row_ptr + i)
            if SAGE:
                k_start = tl.load(off_ptr + kt)
                n_ok = offs_n < tl.load(off_ptr + kt + 1) - k_start
                v_col = kt * BLOCK_N  # the tile's slot
                k, vt = load_k_vt(k_desc, v_desc, k_base, v_base, k_start, k_start + offs_n, v_col, v_col + offs_n,
                                  n_ok, b * seq_len, h * HEAD_DIM, pid_bh * HEAD_DIM, stride_ks, stride_vd, offs_d,
                                  d_ok, TMA, VT_TMA, True, DOT_FP32, EVICT, CACHE)
                v = tl.trans(vt)
            else:
                k, v, n_ok = load_listed_kv_tile(k_desc, v_desc, k_base, v_base, off_ptr, kt,
                                                  b * seq_len, h * HEAD_DIM, stride_ks, stride_vs, offs_n, offs_d,
                                                  d_ok, TMA, DOT_FP32, EVICT, CACHE)  # k, v: (BLOCK_N, BLOCK_D)
            s = mm(q, tl.trans(k), IEEE).to(tl.float32)  # s: (BLOCK_M, BLOCK_N) fp32, unscaled
            ksc = qk_scale
            if SAGE:
                ksc = _sage_scales(qsc, ks_row, k_start + offs_n, n_ok, SAGE)
            m_i, l_i, acc = _softmax_step(s, n_ok, v, m_i, l_i, acc, ksc, IEEE, SAGE=SAGE, P_OFFSET=P_OFFSET)
    empty = l_i == 0.0  # no selected tile: output 0, LSE -inf
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    if SAGE:  # V's per-channel scales
        out = out * tl.load(vs_ptr + pid_bh.to(tl.int64) * HEAD_DIM + offs_d, mask=d_ok, other=0.0)[None, :]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i)) - P_OFFSET) * 0.6931471805599453)
    o_rows = b * stride_ob + h * stride_oh + q_rows[:, None] * stride_os
    if BRANCH:  # the sparse output goes through memory (L2), so its registers are free for the branch's GEMM
        sparse_ptr = o_sparse_ptr if SAVE_SPARSE else o_ptr
        tl.store(sparse_ptr + o_rows + offs_d[None, :], out.to(sparse_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & d_ok[None, :])
        tl.debug_barrier()  # the rows read back are other threads' stores
        _linear_epilogue(q, m_ok, d_ok, offs_d, o_ptr, o_rows, sparse_ptr, kvw_ptr, z_ptr, bias_ptr, pid_bh, eps,
                         HEAD_DIM, BLOCK_D, KIND, LOWP, BRANCH_IEEE, BRANCH_SPLIT)
    else:
        tl.store(o_ptr + o_rows + offs_d[None, :], out.to(o_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
    tl.store(lse_ptr + b * stride_lb + h * stride_lh + q_rows, lse, mask=m_ok)


def bsa_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor, q2k_cnt: torch.Tensor,
            tile_offsets: torch.Tensor, scale: float | None = None, tuning: KernelTuning | None = None, *,
            checked: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel (no autograd; layout contract in `block_sparse_attn`'s docstring).

    Args:
        q, k, v: (B, S, H, D) bf16 / fp16 / fp32, tile order, unit stride on D, D <= 256.
        q2k: (B, H, Q_TILES, K) int32, the first q2k_cnt entries of each row read; q2k_cnt: (B, H, Q_TILES) int32.
        tile_offsets: (n_tiles + 1,) int32 tile starts, at most 64 tokens per tile.
        scale: softmax scale, default 1/sqrt(D).
        tuning: tile loads, packing and the forward's launches; None: `tuning.kernel_tuning(q.device, D)`. With
            `fwd_warp_specialized` the warp-specialized Gluon kernel runs where it can
            (`bsa_forward_ws.ws_unsupported`), this module's kernel elsewhere, and wherever the Gluon kernel fails
            to compile or launch (`bsa_forward_ws.launch_or_fall_back`: a run note, once per process).
        checked: the caller made `check_inputs` on these tensors already (`block_sparse_attn`'s and `sla_star_attn`'s
            public functions and their custom ops do): not made again, so a launch checks its inputs once.

    Returns:
        out (B, S, H, D) like q; lse (B, H, S) fp32 natural log (-inf on rows with no selected tile).

    Raises:
        ValueError: shapes, dtypes, strides or index dtypes outside the contract (`check_inputs`; unless checked).
    """
    if not checked:
        check_inputs(q, k, v, q2k, q2k_cnt, tile_offsets)
    if tuning is not None and tuning.fwd_warp_specialized:
        from .bsa_forward_ws import launch_or_fall_back, ws_unsupported

        # (check_inputs made above: launched without checking again); None: it failed here, the pipelined one runs
        if ws_unsupported(q, k, v) is None and \
                (res := launch_or_fall_back(q, k, v, q2k, q2k_cnt, tile_offsets, scale)) is not None:
            return res
    out = torch.empty_like(q)
    return out, _launch(q, k, v, q2k, q2k_cnt, tile_offsets, scale, tuning, out, None)


def bsa_fwd_linear(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor, q2k_cnt: torch.Tensor,
                   tile_offsets: torch.Tensor, kvw: torch.Tensor, z: torch.Tensor, bias: torch.Tensor, kind: str,
                   eps: float, scale: float | None = None, tuning: KernelTuning | None = None,
                   save_sparse: bool = False, *,
                   checked: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward kernel with SLA*'s projected global linear branch added in its epilogue (no autograd): one
    launch where `bsa_fwd` then `linear_branch`'s apply kernel would read q and the sparse output again and write
    the sum once more (seed 002's SLA*; the branch as `linear_branch.linear_branch_add` computes it).

    Args:
        q, k, v, q2k, q2k_cnt, tile_offsets, scale, tuning, checked: as `bsa_fwd`.
        kvw: (B*H, D, D) KV W^T contiguous, in `linear_branch._operand`'s dtype; z: (B*H, D) fp32 contiguous (the
            sums of `linear_branch.kv_sums`, the projection folded in); bias: (D,) fp32.
        kind: the feature map (`reference.FEATURE_MAPS`); eps: added to the denominator.
        save_sparse: also return the sparse part's output (the backward's input); else an empty tensor.

    Returns:
        out (B, S, H, D) contiguous, q's dtype: o_sparse + phi(q) KVW / (eps + phi(q) . z) + bias, with o_sparse
        rounded to q's dtype first; o_sparse (B, S, H, D) like out, or empty; lse (B, H, S) fp32 as `bsa_fwd`.

    Raises:
        ValueError: as `bsa_fwd`.
    """
    if not checked:
        check_inputs(q, k, v, q2k, q2k_cnt, tile_offsets)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    o_sparse = torch.empty_like(out) if save_sparse else out.new_empty(0)
    branch = dict(o_sparse=o_sparse if save_sparse else out, kvw=kvw, z=z, bias=bias, eps=float(eps),
                  consts=dict(BRANCH=True, SAVE_SPARSE=save_sparse, KIND=_KIND[kind], LOWP=_flags(q)["LOWP"],
                              BRANCH_IEEE=_flags(q)["IEEE"], BRANCH_SPLIT=BRANCH_SPLIT))
    return out, o_sparse, _launch(q, k, v, q2k, q2k_cnt, tile_offsets, scale, tuning, out, branch)


def _launch(q, k, v, q2k, q2k_cnt, tile_offsets, scale, tuning, out, branch, groups=None,
            group_launch=None, sage=None) -> torch.Tensor:
    """The forward kernel's launches into `out` (one per size class; with `groups`, one over the query groups at
    group_launch = (block_m, num_warps, num_stages)); branch: `bsa_fwd_linear`'s operands or None; sage: the
    8-bit fine stage's scales (qs, ks, vs, offset: `sage_attn.bsa_fwd_sage`) or None, and then v is the fp8 V in
    tile slots ((B, H, D, T, 64), `sage.v_slots`). Returns lse."""
    b, s, h, d = q.shape
    tuning = default_tuning(q.device, d) if tuning is None else tuning
    n_tiles = tile_offsets.numel() - 1
    scale = d ** -0.5 if scale is None else scale
    lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
    interp = interpreting()
    block_d = max(16, triton.next_power_of_2(d))
    if sage is None:
        tma = use_tma(k, v, wanted=tuning.tma_loads)
        k_desc, v_desc = tma_descs(tma, k, v)
    else:  # v: the fp8 V in tile slots (`sage.v_slots`): every tile's V^T box starts at a multiple of 64 tokens
        tma = use_tma(k, wanted=tuning.tma_loads, dtypes=TMA_DTYPES_8BIT)
        vt_tma = tma and v_t_tma_ok(v)
        k_desc, v_desc = tma_descs(tma, k)[0], tma_descs_v_t(v) if vt_tma else v
    lists, counts, pack = q2k_lists(q2k, q2k_cnt, tile_offsets, s, tuning.pack_partial_tiles)
    v_strides = (v.stride(0), v.stride(1), v.stride(2), v.stride(3))  # (b, s, h, d); slots: (b, -, h, d)
    vcols = lse
    if sage is not None:
        from .sage import v_slot_columns

        v_strides = (v.stride(0), 1, v.stride(1), v.stride(2))
        vcols = v_slot_columns(tile_offsets, s) if pack else lse
    br = branch or dict(o_sparse=out, kvw=out, z=lse, bias=lse, eps=0.0, consts={})
    scales = (lse, lse, lse) if sage is None else (sage["qs"], sage["ks"], sage["vs"])
    if sage is not None:
        br = dict(br, consts=dict(br["consts"], SAGE=True, P_OFFSET=sage["offset"], VT_TMA=vt_tma))
    if groups is None:
        grid, classes, extra = (n_tiles, b * h), size_classes(tuning.fwd_launch, block_d, q.dtype), {}
    else:
        grid, extra = (groups.shape[0], b), dict(QGROUP=True)
        classes = [(group_launch[0], 0, group_launch[1], group_launch[2])]
    for blk, lo, num_warps, num_stages in classes:
        _bsa_fwd_kernel[grid](
            q, k, v, out, lse, lists, counts, tile_offsets, k_desc, v_desc, s,
            q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2),
            *v_strides,
            out.stride(0), out.stride(1), out.stride(2),
            lse.stride(0), lse.stride(1),
            lists.stride(0), lists.stride(1), lists.stride(2),
            counts.stride(0), counts.stride(1),
            h, scale * LOG2E, lo, blk,
            br["o_sparse"], br["kvw"], br["z"], br["bias"], br["eps"], lse if groups is None else groups, *scales,
            vcols,
            HEAD_DIM=d, BLOCK_D=block_d, BLOCK_M=blk, BLOCK_N=BLOCK,
            DOT_FP32=interp, IEEE=(q.dtype == torch.float32 or interp), TMA=tma,
            PACK=pack, PACK_SEG=PACK_SEG, **load_hints(tuning),
            num_warps=num_warps, num_stages=num_stages, **hip_kwargs(tuning.hip_fwd, q.device), **br["consts"],
            **extra,
        )
    return lse


def bsa_fwd_grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor, q2k_cnt: torch.Tensor,
                    tile_offsets: torch.Tensor, groups: torch.Tensor, block_m: int, num_warps: int, num_stages: int,
                    scale: float | None = None, tuning: KernelTuning | None = None, *,
                    checked: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward kernel over query groups (no autograd): each program takes `block_m` query rows of tiles that
    share one key list (`query_groups.build_query_groups`), so tiles with equal lists share their K / V loads and
    partial query tiles are packed instead of padded to 64 rows. Same result as `bsa_fwd` (the same online softmax
    over the same keys per row).

    Args:
        q, k, v, q2k, q2k_cnt, tile_offsets, scale, tuning, checked: as `bsa_fwd`; q2k's rows of the tiles of one
            group must be equal (the group reads the list of its `list tile`).
        groups: (n_programs, 2 + block_m / 8) int32 contiguous on q's device (`build_query_groups` with this
            block_m): every query row of every head in exactly one program.
        block_m: rows per program (a multiple of 8, a power of two, >= 16); num_warps, num_stages: its launch.

    Returns:
        out (B, S, H, D) like q; lse (B, H, S) fp32 as `bsa_fwd`.

    Raises:
        ValueError: as `bsa_fwd`, or a groups table of the wrong width or dtype (checked either way).
    """
    if not checked:
        check_inputs(q, k, v, q2k, q2k_cnt, tile_offsets)
    if groups.dtype != torch.int32 or groups.dim() != 2 or groups.shape[1] != 2 + block_m // PACK_SEG \
            or not groups.is_contiguous():
        raise ValueError(f"groups must be a contiguous int32 (n, {2 + block_m // PACK_SEG}) table for block_m "
                         f"{block_m}, got {tuple(groups.shape)} {groups.dtype}")
    out = torch.empty_like(q)
    if groups.shape[0] == 0 or q.shape[0] == 0:
        return out, torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    return out, _launch(q, k, v, q2k, q2k_cnt, tile_offsets, scale, tuning, out, None, groups,
                        (block_m, num_warps, num_stages))
