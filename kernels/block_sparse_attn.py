"""Block-sparse flash attention over video tiles (VSA's fine stage), Triton forward and backward.

Computes, for each (batch, head, query tile), softmax attention of the tile's query tokens over the tokens of
the key tiles listed in its q2k row (VSA paper, arXiv 2505.13389, sec. 2; online softmax as in
FlashAttention-2). Tokens are in tile order (`vsagen.layout.TileLayout`): tile j occupies rows
[tile_offsets[j], tile_offsets[j+1]) and holds at most BLOCK = 64 tokens, fewer at grid edges (partial tiles);
rows past a tile's end are masked exactly (scores set to -inf, outputs not stored).

The backward follows FlashAttention-2 (Dao, arXiv 2307.08691, alg. 2) with the forward's LSE: a preprocess
computes delta = rowsum(dO * O) (minus the LSE's incoming gradient), one kernel walks each query tile's q2k
list for dQ, another walks each key tile's k2q list (the transposed lists, `build_k2q`) for dK and dV. Every
gradient row is written by exactly one program: no atomics, bitwise deterministic.

Layout contract:
    q, k, v: (B, S, H, D) bf16 / fp16 / fp32, tile order, any strides with unit stride on D, D <= 256
    q2k: (B, H, Q_TILES, K) int32, the first q2k_cnt entries of each row used (ascending by convention,
         no repeats, each in [0, KV_TILES)); entries past q2k_cnt are never read
    q2k_cnt: (B, H, Q_TILES) int32 in [0, K]
    k2q: (B, H, KV_TILES, Q_TILES) int32, the transpose of q2k (`build_k2q`); k2q_cnt: (B, H, KV_TILES) int32
    tile_offsets: (n_tiles + 1,) int32, tile_offsets[0] = 0 and tile_offsets[-1] = S; Q_TILES = KV_TILES = n_tiles
    returns: out (B, S, H, D) like q; lse (B, H, S) fp32, natural-log log-sum-exp of each query row
             (-inf for a row with no selected tile, whose output is 0 and whose gradients are 0)

On layouts with partial tiles the forward and dQ loops walk a tile plan of each q2k row
(`tile_plan.build_tile_plan`, one small launch per call) rather than the row itself: first the full tiles, one per
iteration and unmasked, then the partial tiles' tokens packed 64 to an iteration (gathered rows, masked), so a
partial tile no longer costs a whole 64-column block (`PACK_PARTIAL_TILES`). The dK/dV loop still takes one query
tile of its k2q row per iteration.

The loops fetch their 64-token tiles (K / V in the forward and dQ kernels, Q / dO in the dK/dV kernel) by TMA
on Hopper and later GPUs (`use_tma`, `TMA_LOADS`): whole (64, D) boxes of the (B*S, H*D) tensor, so a partial
tile's box also covers the next tile's first rows; those are masked in the scores exactly as pointer loads'
zero rows are (the results are bitwise equal, tested under the interpreter). Elsewhere, pointer loads.

`block_sparse_attention` (the public function) runs the kernels through the `torch.library` custom ops
`vsagen::block_sparse_attn` / `vsagen::block_sparse_attn_bwd`, so autograd and torch.compile (no graph break)
see through them.

Unsupported: tiles of more than 64 tokens, causal masks, dropout, different q / kv tile layouts, gradients
with respect to the index tensors (they are integers), the fp32 backward with D > 128 on a GPU (shared memory),
double backward.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
import triton
import triton.language as tl

BLOCK = 64  # tokens in a full (4, 4, 4) tile
_PACK_SEG = 8  # tokens per group of a tile plan's partial-tile stream (tile_plan.SEG)
_PLAN_MAX_ROWS = 2 ** 27  # tile plans pack token rows as row << 4 into int32: longer sequences use the plain loop
LOG2E = 1.4426950408889634  # log2(e): scores are kept in base 2 for exp2
LN2 = 0.6931471805599453  # ln(2): converts the base-2 LSE back to natural log

# Launch parameters by BLOCK_D, for bf16 / fp16 inputs: one launch per tile-size class, each entry
# (block, num_warps, num_stages). A class's programs handle the tiles with more than the next smaller class's
# block and at most `block` tokens (the others exit at once), with `block` rows: the forward and dQ kernels split
# query tiles this way, the dK/dV kernel key tiles; the loop inside still takes whole 64-row tiles. The partial
# tiles at grid edges (27% of the Wan2.1-1.3B 480p tiles hold 8, 16 or 32 tokens) then stop paying for 64 rows.
# One class (64, ...) is the plain launch.
# Forward, BLOCK_D 128, one class: swept on the H200 at the Wan2.1-1.3B 480p shape, 87.5% sparsity
# (benchmarks/attention.py --sweep): with pointer loads (num_warps, num_stages) (4, 2) / (4, 3) / (4, 4) / (8, 2) /
# (8, 3) took 3.18 / 2.94 / 3.11 / 6.91 / 5.92 ms; with TMA loads (4, 2) / (4, 3) / (4, 4) 3.04 / 2.70 / 3.55 ms and
# 16 / 32 / 64-row classes at (4, 3) 2.78 ms. (4, 3) is the largest pipeline at which two programs share an SM
# (114.7 KB of shared memory each).
FWD_LAUNCH = {16: ((64, 4, 3),), 32: ((64, 4, 3),), 64: ((64, 4, 3),), 128: ((64, 4, 3),), 256: ((64, 4, 3),)}

# Backward, BLOCK_D 128, one class: swept on the H200 (torch 2.11, triton 3.6; benchmarks/attention.py
# --sweep-bwd, Wan2.1-1.3B 480p shape, 87.5% sparsity): with dK/dV at (8, 2) the dQ choices (4, 2) / (4, 3) /
# (8, 2) / (8, 3) gave a whole backward of 14.6 / 15.8 / 18.8 / 17.7 ms; with dQ at (4, 3) the dK/dV choices
# (4, 2) / (4, 3) / (8, 1) / (8, 2) / (8, 3) gave 10.3 / 10.1 / 16.6 / 15.8 / 16.3 ms. So 4 warps win for both,
# although the offline ptxas report showed the 4-warp dK/dV kernel spilling a little. Other BLOCK_D: from the
# offline sm_90 compile (triton 3.8 ptxas register counts): at <= 64 both kernels fit in ~205 registers with 4
# warps; at 256 both spill whatever the warps and one stage keeps the (64, 256) operand tiles within shared
# memory. Not yet timed on a GPU.
# Size classes at BLOCK_D 128 (same sweep, 2026-11-29, whole backward 9.03 ms with one class each): dK/dV with
# (16, 4, 2), (32, 4, 2), (64, 4, 3) took 8.57 ms (with (32, 4, 3), (64, 4, 3): 9.13; (32, 2, 3), (64, 4, 3): 9.71);
# dQ with (16, 4, 2), (32, 4, 2), (64, 4, 2) took 8.95 ms (the others 8.96 - 9.09). The forward gained nothing
# from classes (one class 2.96 ms; 16/32/64 at 4 warps 3.01; fewer warps for the small classes 3.25 - 3.49).
# Re-swept with TMA loads (same day): the whole backward (k2q prebuilt) took 8.18 - 9.02 ms over five dQ and five
# dK/dV tables, the tables below within 0.17 ms of the best (run-to-run spread ~0.15 ms), so they stay.
BWD_DQ_LAUNCH = {16: ((64, 4, 3),), 32: ((64, 4, 3),), 64: ((64, 4, 3),),
                 128: ((16, 4, 2), (32, 4, 2), (64, 4, 2)), 256: ((64, 8, 1),)}
BWD_DKDV_LAUNCH = {16: ((64, 4, 3),), 32: ((64, 4, 3),), 64: ((64, 4, 3),),
                   128: ((16, 4, 2), (32, 4, 2), (64, 4, 3)), 256: ((64, 8, 1),)}
# fp32 inputs take IEEE fp32 dots on CUDA cores (a correctness path, not a fast one) with fp32 operands staged
# in shared memory (227 KiB per block on sm_90): one stage from BLOCK_D 128 on (the dQ kernel needs 208 KiB at
# 3 stages, the forward 336 KiB at BLOCK_D 256), and no backward above BLOCK_D 128 on a GPU (its four (64, 256)
# fp32 operands need 256 KiB even at one stage). Same offline compile as above.
FP32_WIDE_BLOCK_D = 128
FP32_WIDE_NUM_STAGES = 1
FP32_BWD_MAX_BLOCK_D = 128
# The delta preprocess is a streaming row reduction: one warp group is plenty.
PRE_NUM_WARPS = 4

# How the loops fetch their 64-token tiles (K / V in the forward and dQ kernels, Q / dO in the dK/dV kernel):
# "auto" by TMA (tensor-descriptor boxes) on GPUs of compute capability >= 9.0 when `use_tma` allows it, else by
# pointer loads; "on" by TMA wherever the layout allows it (also under the interpreter: the tests use it);
# "off" never. On the H200 at the Wan2.1-1.3B 480p shape TMA took the fine forward from 2.95 to 2.70 ms
# (benchmarks/fwd_variants.py, 2026-11-29): fewer address instructions and registers in the loop.
TMA_LOADS = "auto"
TMA_MODES = ("auto", "on", "off")
# The forward and dQ kernels' loops take a tile plan (`tile_plan.build_tile_plan`): the full key tiles one per
# iteration, then the partial key tiles' tokens packed 64 to an iteration, instead of one padded 64-column block
# per selected tile. False: one tile per iteration (the q2k lists as they are), as also on layouts whose every
# tile is full (`_q2k_lists`). On the H200 (2026-11-29, 87.5% sparsity, the coarse stage's own selection) the
# packed loops compute 67% / 84% / 64% of the blocks at the 1.3B / 5B / 14B shapes, and the fine forward took
# 2.65 -> 2.01 ms, 3.30 -> 2.99 ms and 50.3 -> 35.5 ms (backward 8.0 -> 6.9, 10.4 -> 9.6, 141 -> 124 ms). The
# partial-tile loop gathers its rows by pointer loads (cp.async, 3 buffers in the sm_90 compile; the full-tile
# loop keeps 2 TMA buffers, 198 registers against the plain kernel's 168). Measured and dropped: finding each
# row's tile with a (64, 8) compare per iteration (1.3B forward 2.55 ms), unmasked gathers (within 1%), launch
# tables other than (4, 3) (benchmarks/attention.py --sweep: 2.03 - 4.43 ms against 2.01).
PACK_PARTIAL_TILES = True
# The backward's dQ and dK/dV kernels are independent (both need only delta): on CUDA the dQ launches go on a
# second stream so that the two kernels' size-class launches overlap.
BWD_TWO_STREAMS = True


def interpreting() -> bool:
    """True under the Triton CPU interpreter (TRITON_INTERPRET=1), where tl.dot on bf16/fp16 is wrong."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _mm(a, b, IEEE: tl.constexpr):
    """a @ b with fp32 accumulation; IEEE fp32 products when IEEE (fp32 inputs, or the interpreter)."""
    if IEEE:
        c = tl.dot(a, b, input_precision="ieee")
    else:
        c = tl.dot(a, b)
    return c


@triton.jit
def _load_kv_tile(k_base, v_base, off_ptr, kt, stride_ks, stride_vs, offs_n, offs_d, d_ok,
                  DOT_FP32: tl.constexpr):
    """Load key tile `kt` of K and V: (BLOCK_N, BLOCK_D) each, rows past the tile's end zeroed and flagged
    False in n_ok (BLOCK_N,)."""
    k_start = tl.load(off_ptr + kt)
    k_len = tl.load(off_ptr + kt + 1) - k_start
    n_ok = offs_n < k_len
    rows = (k_start + offs_n)[:, None]
    kv_mask = n_ok[:, None] & d_ok[None, :]
    k = tl.load(k_base + rows * stride_ks + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_base + rows * stride_vs + offs_d[None, :], mask=kv_mask, other=0.0)
    if DOT_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v, n_ok


@triton.jit
def _load_kv_tile_tma(k_desc, v_desc, off_ptr, kt, row0, col0, offs_n, DOT_FP32: tl.constexpr):
    """`_load_kv_tile` by TMA: key tile `kt` of K and V as whole (BLOCK_N, BLOCK_D) boxes of the (B*S, H*D)
    descriptors at (row0 + tile start, col0). Rows past a partial tile's end hold the next tile's tokens (zeros
    past the tensor's end): they are flagged False in n_ok and must be masked by the caller."""
    k_start = tl.load(off_ptr + kt)
    n_ok = offs_n < tl.load(off_ptr + kt + 1) - k_start
    k = k_desc.load([row0 + k_start, col0])
    v = v_desc.load([row0 + k_start, col0])
    if DOT_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v, n_ok


@triton.jit
def _load_listed_kv_tile(k_desc, v_desc, k_base, v_base, off_ptr, kt, row0, col0, stride_ks, stride_vs, offs_n,
                         offs_d, d_ok, TMA: tl.constexpr, DOT_FP32: tl.constexpr):
    """Key tile `kt` of K and V by TMA (`_load_kv_tile_tma`) or pointer loads (`_load_kv_tile`): (k, v, n_ok)."""
    if TMA:
        k, v, n_ok = _load_kv_tile_tma(k_desc, v_desc, off_ptr, kt, row0, col0, offs_n, DOT_FP32)
    else:
        k, v, n_ok = _load_kv_tile(k_base, v_base, off_ptr, kt, stride_ks, stride_vs, offs_n, offs_d, d_ok, DOT_FP32)
    return k, v, n_ok


@triton.jit
def _load_full_kv_tile(k_desc, v_desc, k_base, v_base, k_start, row0, col0, stride_ks, stride_vs, offs_n, offs_d,
                       d_ok, TMA: tl.constexpr, DOT_FP32: tl.constexpr):
    """Load the full key tile (64 tokens, so no row mask) starting at row k_start of K and V: (BLOCK_N, BLOCK_D)
    each, by TMA from the descriptors at (row0 + k_start, col0) or by pointer loads from k_base / v_base."""
    if TMA:
        k = k_desc.load([row0 + k_start, col0])
        v = v_desc.load([row0 + k_start, col0])
    else:
        rows = (k_start + offs_n)[:, None]
        k = tl.load(k_base + rows * stride_ks + offs_d[None, :], mask=d_ok[None, :], other=0.0)
        v = tl.load(v_base + rows * stride_vs + offs_d[None, :], mask=d_ok[None, :], other=0.0)
    if DOT_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v


@triton.jit
def _plan_counts(cnt_row):
    """(nf, npk, ng) of a tile plan row: full tiles, packs and groups (`tile_plan.build_tile_plan`)."""
    return tl.load(cnt_row), tl.load(cnt_row + 1), tl.load(cnt_row + 2)


@triton.jit
def _pack_rows(plan_row, nf, ng, p, offs_n, BLOCK_N: tl.constexpr, SEG: tl.constexpr):
    """Token rows of pack p of a tile plan row (`tile_plan.build_tile_plan`): the partial tiles' tokens in plan
    groups [p * BLOCK_N / SEG, (p + 1) * BLOCK_N / SEG), as rows (BLOCK_N,) int32 and n_ok (BLOCK_N,) bool (False
    past a group's tokens and past the row's ng groups). The groups are read as BLOCK_N / SEG scalar loads, which
    Triton's software pipeliner prefetches as it does the q2k entries."""
    within = offs_n % SEG
    slot = offs_n // SEG
    rows = tl.zeros_like(offs_n)
    n_ok = offs_n < 0
    for j in tl.static_range(BLOCK_N // SEG):
        g = p * (BLOCK_N // SEG) + j
        group = tl.load(plan_row + nf + g, mask=g < ng, other=0)  # (first row << 4) | tokens
        rows = tl.where(slot == j, (group >> 4) + within, rows)
        n_ok = tl.where(slot == j, within < (group & 15), n_ok)
    return rows, n_ok


@triton.jit
def _load_rows(base_a, base_b, rows, n_ok, stride_a, stride_b, offs_d, d_ok, DOT_FP32: tl.constexpr):
    """Gather rows (R,) of two (S, BLOCK_D) tensors by pointer loads, zero where n_ok is False."""
    mask = n_ok[:, None] & d_ok[None, :]
    a = tl.load(base_a + rows[:, None] * stride_a + offs_d[None, :], mask=mask, other=0.0)
    c = tl.load(base_b + rows[:, None] * stride_b + offs_d[None, :], mask=mask, other=0.0)
    if DOT_FP32:
        a = a.to(tl.float32)
        c = c.to(tl.float32)
    return a, c


@triton.jit
def _softmax_step(s, n_ok, v, m_i, l_i, acc, qk_scale, IEEE: tl.constexpr, MASK: tl.constexpr = True):
    """One online-softmax update (FlashAttention-2 alg. 1) with scores s (BLOCK_M, BLOCK_N) fp32 unscaled, key
    validity n_ok (BLOCK_N,) (ignored unless MASK), values v (BLOCK_N, BLOCK_D); returns the new (m_i, l_i, acc),
    base 2."""
    if MASK:
        s = tl.where(n_ok[None, :], s * qk_scale, float("-inf"))  # base-2 logits
    else:
        s = s * qk_scale
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if IEEE:  # the accumulator goes into the dot itself (as timed on the H200)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)
    return m_new, l_i, acc


@triton.jit
def _bsa_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, q2k_ptr, cnt_ptr, off_ptr, k_desc, v_desc, seq_len,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh,
    stride_ib, stride_ih, stride_iq,
    stride_cb, stride_ch,
    num_heads, qk_scale, len_lo, len_hi,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_FP32: tl.constexpr, IEEE: tl.constexpr, TMA: tl.constexpr, PACK: tl.constexpr, PACK_SEG: tl.constexpr,
):
    """One program: one query tile of one (batch, head), looping over its selected key tiles; exits at once
    unless the tile holds more than len_lo and at most len_hi (<= BLOCK_M) tokens (its size class). TMA: the
    K / V tiles come by TMA from k_desc / v_desc (see `use_tma`), else by pointer loads from k_ptr / v_ptr.
    PACK: q2k_ptr / cnt_ptr are the rows' tile plans (`tile_plan`) and their counts: the full tiles are taken whole
    (TMA or pointer loads, no mask), then the partial tiles' tokens 64 at a time (pointer gathers); else q2k_ptr /
    cnt_ptr are the q2k lists and counts, one tile per iteration."""
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    q_start = tl.load(off_ptr + pid_t)
    q_len = tl.load(off_ptr + pid_t + 1) - q_start
    if (q_len <= len_lo) | (q_len > len_hi):
        return
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < q_len
    d_ok = offs_d < HEAD_DIM
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + (q_start + offs_m)[:, None] * stride_qs + offs_d[None, :],
                mask=m_ok[:, None] & d_ok[None, :], other=0.0)  # q: (BLOCK_M, BLOCK_D)
    if DOT_FP32:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # acc: (BLOCK_M, BLOCK_D) fp32
    row_ptr = q2k_ptr + b * stride_ib + h * stride_ih + pid_t * stride_iq
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    if PACK:
        nf, npk, ng = _plan_counts(cnt_ptr + b * stride_cb + h * stride_ch + pid_t * 4)
        for i in range(0, nf):  # full tiles
            k, v = _load_full_kv_tile(k_desc, v_desc, k_base, v_base, tl.load(row_ptr + i), b * seq_len,
                                      h * HEAD_DIM, stride_ks, stride_vs, offs_n, offs_d, d_ok, TMA, DOT_FP32)
            s = _mm(q, tl.trans(k), IEEE)  # s: (BLOCK_M, BLOCK_N) fp32, unscaled
            m_i, l_i, acc = _softmax_step(s, offs_n, v, m_i, l_i, acc, qk_scale, IEEE, MASK=False)
        for p in range(0, npk):  # partial tiles, packed
            rows, n_ok = _pack_rows(row_ptr, nf, ng, p, offs_n, BLOCK_N, PACK_SEG)
            k, v = _load_rows(k_base, v_base, rows, n_ok, stride_ks, stride_vs, offs_d, d_ok, DOT_FP32)
            s = _mm(q, tl.trans(k), IEEE)
            m_i, l_i, acc = _softmax_step(s, n_ok, v, m_i, l_i, acc, qk_scale, IEEE)
    else:
        cnt = tl.load(cnt_ptr + b * stride_cb + h * stride_ch + pid_t)
        for i in range(0, cnt):
            k, v, n_ok = _load_listed_kv_tile(k_desc, v_desc, k_base, v_base, off_ptr, tl.load(row_ptr + i),
                                              b * seq_len, h * HEAD_DIM, stride_ks, stride_vs, offs_n, offs_d, d_ok,
                                              TMA, DOT_FP32)  # k, v: (BLOCK_N, BLOCK_D)
            s = _mm(q, tl.trans(k), IEEE)  # s: (BLOCK_M, BLOCK_N) fp32, unscaled
            m_i, l_i, acc = _softmax_step(s, n_ok, v, m_i, l_i, acc, qk_scale, IEEE)
    empty = l_i == 0.0  # no selected tile: output 0, LSE -inf
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + (q_start + offs_m)[:, None] * stride_os + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
    tl.store(lse_ptr + b * stride_lb + h * stride_lh + q_start + offs_m, lse, mask=m_ok)


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
    s = _mm(q, tl.trans(k), IEEE)
    if MASK:
        s = tl.where(n_ok[None, :], s * qk_scale, float("-inf"))  # s: (BLOCK_M, BLOCK_N), base-2 logits
    else:
        s = s * qk_scale
    p = tl.exp2(s - lse2[:, None])  # p: (BLOCK_M, BLOCK_N) fp32, the forward's softmax
    dp = _mm(do, tl.trans(v), IEEE)  # dp: (BLOCK_M, BLOCK_N) fp32, dO V^T
    ds = p * (dp - delta[:, None])
    return dq + _mm(ds.to(k.dtype), k, IEEE)


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
    num_heads, sm_scale, qk_scale, len_lo, len_hi,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_FP32: tl.constexpr, IEEE: tl.constexpr, TMA: tl.constexpr, PACK: tl.constexpr, PACK_SEG: tl.constexpr,
):
    """One program: dQ of one query tile of one (batch, head), looping over the key tiles of its q2k row; exits
    at once outside its size class (len_lo, len_hi]. TMA: K / V tiles by TMA, PACK: the row's tile plan, as in
    the forward."""
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
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
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + q_rows * stride_qs + offs_d[None, :],
                mask=q_mask, other=0.0)  # q: (BLOCK_M, BLOCK_D)
    do = tl.load(do_ptr + b * stride_dob + h * stride_doh + q_rows * stride_dos + offs_d[None, :],
                 mask=q_mask, other=0.0)  # do: (BLOCK_M, BLOCK_D)
    row = b * stride_lb + h * stride_lh + q_start + offs_m
    lse = tl.load(lse_ptr + row, mask=m_ok, other=float("inf"))
    # Base-2 LSE; +inf on rows past the tile's end and on rows with no selected tile, so their P is exactly 0.
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)  # log2(e)
    delta = tl.load(delta_ptr + row, mask=m_ok, other=0.0)  # delta: (BLOCK_M,) fp32
    if DOT_FP32:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # dq: (BLOCK_M, BLOCK_D) fp32
    row_ptr = q2k_ptr + b * stride_ib + h * stride_ih + pid_t * stride_iq
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    if PACK:
        nf, npk, ng = _plan_counts(cnt_ptr + b * stride_cb + h * stride_ch + pid_t * 4)
        for i in range(0, nf):  # full tiles
            k, v = _load_full_kv_tile(k_desc, v_desc, k_base, v_base, tl.load(row_ptr + i), b * seq_len,
                                      h * HEAD_DIM, stride_ks, stride_vs, offs_n, offs_d, d_ok, TMA, DOT_FP32)
            dq = _dq_step(q, do, k, v, offs_n, lse2, delta, dq, qk_scale, IEEE, MASK=False)
        for p in range(0, npk):  # partial tiles, packed
            rows, n_ok = _pack_rows(row_ptr, nf, ng, p, offs_n, BLOCK_N, PACK_SEG)
            k, v = _load_rows(k_base, v_base, rows, n_ok, stride_ks, stride_vs, offs_d, d_ok, DOT_FP32)
            dq = _dq_step(q, do, k, v, n_ok, lse2, delta, dq, qk_scale, IEEE)
    else:
        cnt = tl.load(cnt_ptr + b * stride_cb + h * stride_ch + pid_t)
        for i in range(0, cnt):
            k, v, n_ok = _load_listed_kv_tile(k_desc, v_desc, k_base, v_base, off_ptr, tl.load(row_ptr + i),
                                              b * seq_len, h * HEAD_DIM, stride_ks, stride_vs, offs_n, offs_d, d_ok,
                                              TMA, DOT_FP32)  # k, v: (BLOCK_N, BLOCK_D)
            dq = _dq_step(q, do, k, v, n_ok, lse2, delta, dq, qk_scale, IEEE)
    dq = dq * sm_scale
    tl.store(dq_ptr + b * stride_dqb + h * stride_dqh + q_rows * stride_dqs + offs_d[None, :],
             dq.to(dq_ptr.dtype.element_ty), mask=q_mask)


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
):
    """One program: dK and dV of one key tile of one (batch, head), looping over the query tiles of its k2q row;
    exits at once outside its size class (len_lo, len_hi]. TMA: the Q / dO tiles by TMA from q_desc / do_desc
    (rows past a partial query tile's end then hold the next tile's tokens; their LSE is +inf, so P^T is 0).

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
    cnt = tl.load(cnt_ptr + b * stride_cb + h * stride_ch + pid_t)
    row_ptr = k2q_ptr + b * stride_jb + h * stride_jh + pid_t * stride_jk
    q_base = q_ptr + b * stride_qb + h * stride_qh
    do_base = do_ptr + b * stride_dob + h * stride_doh
    lse_base = lse_ptr + b * stride_lb + h * stride_lh
    delta_base = delta_ptr + b * stride_lb + h * stride_lh
    for i in range(0, cnt):
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
            q = tl.load(q_base + rows * stride_qs + offs_d[None, :], mask=q_mask, other=0.0)  # (BLOCK_M, BLOCK_D)
            do = tl.load(do_base + rows * stride_dos + offs_d[None, :], mask=q_mask, other=0.0)
        lse = tl.load(lse_base + q_start + offs_m, mask=m_ok, other=float("inf"))
        # Base-2 LSE; +inf on rows past the query tile's end (and, defensively, on empty rows): P^T = 0 there.
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)  # log2(e)
        delta = tl.load(delta_base + q_start + offs_m, mask=m_ok, other=0.0)
        if DOT_FP32:
            q = q.to(tl.float32)
            do = do.to(tl.float32)
        st = _mm(k, tl.trans(q), IEEE)  # st: (BLOCK_N, BLOCK_M) fp32, S^T unscaled
        pt = tl.exp2(st * qk_scale - lse2[None, :])  # pt: (BLOCK_N, BLOCK_M) fp32, P^T
        dv += _mm(pt.to(do.dtype), do, IEEE)
        dpt = _mm(v, tl.trans(do), IEEE)  # dpt: (BLOCK_N, BLOCK_M) fp32, (dO V^T)^T
        dst = pt * (dpt - delta[None, :])
        dk += _mm(dst.to(q.dtype), q, IEEE)
    dk = dk * sm_scale
    tl.store(dk_ptr + b * stride_dkb + h * stride_dkh + k_rows * stride_dks + offs_d[None, :],
             dk.to(dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptr + b * stride_dvb + h * stride_dvh + k_rows * stride_dvs + offs_d[None, :],
             dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


def _size_classes(table: dict[int, tuple[tuple[int, int, int], ...]], block_d: int,
                  dtype: torch.dtype) -> list[tuple[int, int, int, int]]:
    """The launches of one kernel: (block, len_lo, num_warps, num_stages) per size class, smallest block first,
    the last class's block 64 (every tile has a class). fp32 inputs from FP32_WIDE_BLOCK_D on take
    FP32_WIDE_NUM_STAGES stages (shared memory)."""
    entries = sorted(table[block_d])
    if entries[-1][0] != BLOCK or any(blk < 16 or blk & (blk - 1) for blk, _, _ in entries):
        raise ValueError(f"size classes {entries} must be powers of two >= 16 ending with block {BLOCK}")
    fp32_wide = dtype == torch.float32 and block_d >= FP32_WIDE_BLOCK_D
    out, lo = [], 0
    for blk, warps, stages in entries:
        out.append((blk, lo, warps, FP32_WIDE_NUM_STAGES if fp32_wide else stages))
        lo = blk
    return out


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor, q2k_cnt: torch.Tensor,
                  tile_offsets: torch.Tensor) -> None:
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must share one (B, S, H, D) shape, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if q.dtype not in (torch.bfloat16, torch.float16, torch.float32) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share a dtype among bf16, fp16, fp32, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] > 256:
        raise ValueError(f"head dim {q.shape[-1]} > 256 is not supported")
    if any(x.stride(-1) != 1 for x in (q, k, v)):
        raise ValueError("q, k, v need unit stride on the head dim")
    b, _, h, _ = q.shape
    n_tiles = tile_offsets.numel() - 1
    if q2k.dim() != 4 or q2k.shape[:3] != (b, h, n_tiles) or q2k_cnt.shape != (b, h, n_tiles):
        raise ValueError(f"q2k must be (B, H, Q_TILES, K) = ({b}, {h}, {n_tiles}, K) and q2k_cnt (B, H, Q_TILES); "
                         f"got {tuple(q2k.shape)} and {tuple(q2k_cnt.shape)}")
    if q2k.dtype != torch.int32 or q2k_cnt.dtype != torch.int32 or tile_offsets.dtype != torch.int32:
        raise ValueError("q2k, q2k_cnt and tile_offsets must be int32")


# ----------------------------------------------------------------------------------------------- launchers


def _tma_layout_ok(x: torch.Tensor) -> bool:
    """Whether x (B, S, H, D) can be read as the 2D (B*S, H*D) tensor of a TMA descriptor with (64, D) boxes:
    bf16 / fp16, D a power of two >= 16 (no padding columns), heads contiguous within a token, batches spaced
    S tokens apart, a 16-byte aligned base and token stride."""
    b, s, h, d = x.shape
    if x.dtype not in (torch.bfloat16, torch.float16) or d < 16 or d & (d - 1):
        return False
    es = x.element_size()
    return (x.stride(3) == 1 and x.stride(2) == d and x.stride(1) >= h * d and (b == 1 or x.stride(0) == s * x.stride(1))
            and x.data_ptr() % 16 == 0 and (x.stride(1) * es) % 16 == 0)


def use_tma(*xs: torch.Tensor) -> bool:
    """Whether the kernels fetch tiles of xs (each (B, S, H, D)) by TMA: `TMA_LOADS` ("auto", "on", "off"), this
    Triton's host-side tensor descriptors (>= 3.4) and the layout (`_tma_layout_ok`). With TMA the box of a
    partial tile also covers the rows after it (the next tile's tokens, or zeros past the tensor's end); the
    kernels mask them in the scores, so inputs must be finite there as everywhere (0 * inf would leak).

    Raises:
        ValueError: TMA_LOADS is not one of TMA_MODES.
    """
    if TMA_LOADS not in TMA_MODES:
        raise ValueError(f"TMA_LOADS must be one of {TMA_MODES}, got {TMA_LOADS!r}")
    if TMA_LOADS == "off" or not _have_tensor_descriptors() or not all(_tma_layout_ok(x) for x in xs):
        return False
    if TMA_LOADS == "on":
        return True
    dev = xs[0].device
    return dev.type == "cuda" and not interpreting() and torch.cuda.get_device_capability(dev)[0] >= 9


@functools.cache
def _have_tensor_descriptors() -> bool:
    """Whether this Triton has host-side tensor descriptors (`triton.tools.tensor_descriptor`, Triton >= 3.4; the
    project allows 3.2): without them every tile is fetched by pointer loads."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return True


def _tma_descs(tma: bool, *xs: torch.Tensor) -> tuple:
    """The kernels' descriptor arguments for xs (each (B, S, H, D)): with `tma`, host-side TMA descriptors of each
    as a (B*S, H*D) tensor with (64, D) boxes (`_tma_layout_ok`); else the tensors themselves (unused by the
    kernels' pointer-load path)."""
    if not tma:
        return xs
    from triton.tools.tensor_descriptor import TensorDescriptor

    return tuple(TensorDescriptor(x, shape=[x.shape[0] * x.shape[1], x.shape[2] * x.shape[3]],
                                  strides=[x.stride(1), 1], block_shape=[BLOCK, x.shape[3]]) for x in xs)


def bsa_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor, q2k_cnt: torch.Tensor,
            tile_offsets: torch.Tensor, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel (no autograd; see the module docstring for the layout contract).

    Returns:
        out (B, S, H, D) like q; lse (B, H, S) fp32 natural log.
    """
    _check_inputs(q, k, v, q2k, q2k_cnt, tile_offsets)
    b, s, h, d = q.shape
    n_tiles = tile_offsets.numel() - 1
    scale = d ** -0.5 if scale is None else scale
    out = torch.empty_like(q)
    lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
    interp = interpreting()
    block_d = max(16, triton.next_power_of_2(d))
    tma = use_tma(k, v)
    k_desc, v_desc = _tma_descs(tma, k, v)
    lists, counts, pack = _q2k_lists(q2k, q2k_cnt, tile_offsets, s)
    for blk, lo, num_warps, num_stages in _size_classes(FWD_LAUNCH, block_d, q.dtype):
        _bsa_fwd_kernel[(n_tiles, b * h)](
            q, k, v, out, lse, lists, counts, tile_offsets, k_desc, v_desc, s,
            q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            lse.stride(0), lse.stride(1),
            lists.stride(0), lists.stride(1), lists.stride(2),
            counts.stride(0), counts.stride(1),
            h, scale * LOG2E, lo, blk,
            HEAD_DIM=d, BLOCK_D=block_d, BLOCK_M=blk, BLOCK_N=BLOCK,
            DOT_FP32=interp, IEEE=(q.dtype == torch.float32 or interp), TMA=tma,
            PACK=pack, PACK_SEG=_PACK_SEG,
            num_warps=num_warps, num_stages=num_stages,
        )
    return out, lse


def _q2k_lists(q2k: torch.Tensor, q2k_cnt: torch.Tensor, tile_offsets: torch.Tensor, seq_len: int
               ) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """What the forward and dQ kernels loop over, and their PACK switch: the tile plans of the q2k rows and their
    (B, H, Q_TILES, 4) counts (`tile_plan.build_tile_plan`) when PACK_PARTIAL_TILES and the layout has partial
    tiles (seq_len < 64 * n_tiles, known without reading tile_offsets) and seq_len < 2^27 (the plans' packed
    rows), else q2k and q2k_cnt. With every tile full the packed kernels' full-tile loop is 4-8% slower than the
    plain loop (H200, the 1.3B grid cropped to 20x28x52: 1.56-1.59 against 1.47-1.50 ms), so those layouts keep
    the plain loop."""
    q2k = q2k if q2k.shape[-1] <= 1 or q2k.stride(-1) == 1 else q2k.contiguous()  # the loops read rows as runs
    if not PACK_PARTIAL_TILES or seq_len == BLOCK * (tile_offsets.numel() - 1) or seq_len >= _PLAN_MAX_ROWS:
        return q2k, q2k_cnt, False
    from .tile_plan import build_tile_plan

    plan, plan_cnt = build_tile_plan(q2k, q2k_cnt, tile_offsets)
    return plan, plan_cnt, True


def _check_fp32_bwd(q: torch.Tensor) -> None:
    if q.dtype == torch.float32 and q.shape[-1] > FP32_BWD_MAX_BLOCK_D and not interpreting():
        raise ValueError(f"the fp32 backward supports head dims up to {FP32_BWD_MAX_BLOCK_D} on a GPU (shared "
                         f"memory), got {q.shape[-1]}; use bf16 / fp16 inputs")


def build_k2q(q2k: torch.Tensor, q2k_cnt: torch.Tensor, num_kv_tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Transpose the q2k lists: for each key tile, the query tiles that selected it, ascending.

    Exact and deterministic, on q2k's device, with plain torch ops; runs once per backward. The selection is
    scattered into a (B, H, Q_TILES, KV_TILES) bool block map (4.7 MB at the Wan2.1-1.3B 480p shape), whose
    transpose is compacted row by row with a cumulative sum: a few elementwise passes, where the previous version
    sorted all B*H*Q_TILES*K selected pairs (0.61 ms on the H200 at that shape).

    Args:
        q2k: (B, H, Q_TILES, K) int32 (or int64), the first q2k_cnt entries of each row used, each in
            [0, num_kv_tiles), no repeats within a row (not checked); entries past q2k_cnt are ignored.
        q2k_cnt: (B, H, Q_TILES) int32 in [0, K].
        num_kv_tiles: KV_TILES.

    Returns:
        k2q: (B, H, KV_TILES, Q_TILES) int32; row j lists ascending every query tile i whose first q2k_cnt[i]
            entries contain j, and holds 0 past k2q_cnt[j]. A view of a padded buffer (unit stride on the last
            axis only).
        k2q_cnt: (B, H, KV_TILES) int32.
    """
    b, h, n_q, top_k = q2k.shape
    dev = q2k.device
    # One spare column per row receives what is not kept (unused q2k entries, then unselected pairs).
    out = torch.zeros(b, h, num_kv_tiles, n_q + 1, dtype=torch.int32, device=dev)
    if top_k == 0 or n_q == 0:
        return out[..., :-1], torch.zeros(b, h, num_kv_tiles, dtype=torch.int32, device=dev)
    used = torch.arange(top_k, device=dev) < q2k_cnt.unsqueeze(-1)                      # (B, H, Q, K) bool
    kv = torch.where(used, q2k.long(), num_kv_tiles)                                    # unused -> spare column
    block_map = torch.zeros(b, h, n_q, num_kv_tiles + 1, dtype=torch.bool, device=dev)
    block_map.scatter_(-1, kv, True)
    sel = block_map[..., :num_kv_tiles].transpose(2, 3)                                # (B, H, KV, Q) bool
    k2q_cnt = sel.sum(-1, dtype=torch.int32)
    place = torch.cumsum(sel, dim=-1, dtype=torch.int32) - 1                            # rank within row j
    dest = torch.where(sel, place, n_q).long()                                          # unselected -> spare
    queries = torch.arange(n_q, dtype=torch.int32, device=dev).expand(b, h, num_kv_tiles, n_q)
    out.scatter_(-1, dest, queries)  # only the dropped spare column receives several writes
    return out[..., :-1], k2q_cnt


def bsa_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
            lse: torch.Tensor, q2k: torch.Tensor, q2k_cnt: torch.Tensor, k2q: torch.Tensor, k2q_cnt: torch.Tensor,
            tile_offsets: torch.Tensor, scale: float | None = None,
            dlse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward kernels (no autograd; see the module docstring for the layout contract).

    Args:
        do: (B, S, H, D) gradient of out, any strides (copied if the head dim is not unit stride).
        q, k, v, out, lse, q2k, q2k_cnt, tile_offsets, scale: the forward's inputs and outputs.
        k2q, k2q_cnt: the transpose of (q2k, q2k_cnt), from `build_k2q`.
        dlse: optional (B, H, S) gradient of lse.

    Returns:
        dq, dk, dv: (B, S, H, D) like q, k, v.
    """
    _check_inputs(q, k, v, q2k, q2k_cnt, tile_offsets)
    b, s, h, d = q.shape
    n_tiles = tile_offsets.numel() - 1
    if k2q.dim() != 4 or k2q.shape[:3] != (b, h, n_tiles) or k2q_cnt.shape != (b, h, n_tiles):
        raise ValueError(f"k2q must be (B, H, KV_TILES, Q_TILES) and k2q_cnt (B, H, KV_TILES) with "
                         f"(B, H, KV_TILES) = ({b}, {h}, {n_tiles}); got {tuple(k2q.shape)}, {tuple(k2q_cnt.shape)}")
    if k2q.dtype != torch.int32 or k2q_cnt.dtype != torch.int32 or k2q.stride(-1) != 1:
        raise ValueError("k2q and k2q_cnt must be int32, k2q with unit stride on its last axis")
    if do.shape != q.shape or out.shape != q.shape or lse.shape != (b, h, s):
        raise ValueError(f"do and out must be {tuple(q.shape)} and lse ({b}, {h}, {s}); got {tuple(do.shape)}, "
                         f"{tuple(out.shape)}, {tuple(lse.shape)}")
    _check_fp32_bwd(q)
    scale = d ** -0.5 if scale is None else scale
    do = do.to(q.dtype)
    do = do if do.stride(-1) == 1 and (_tma_layout_ok(do) or not _tma_layout_ok(q)) else do.contiguous()
    out = out if out.stride(-1) == 1 else out.contiguous()
    lse = lse.float().contiguous()
    dlse = None if dlse is None else dlse.float().contiguous()
    delta = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    block_d = max(16, triton.next_power_of_2(d))
    interp = interpreting()
    _bsa_bwd_preprocess_kernel[(triton.cdiv(s, BLOCK), b * h)](
        out, do, lse, lse if dlse is None else dlse, delta,
        out.stride(0), out.stride(1), out.stride(2),
        do.stride(0), do.stride(1), do.stride(2),
        lse.stride(0), lse.stride(1),
        s, h,
        HEAD_DIM=d, BLOCK_D=block_d, BLOCK_M=BLOCK, HAS_DLSE=dlse is not None, num_warps=PRE_NUM_WARPS,
    )
    tma_kv, tma_qdo = use_tma(k, v), use_tma(q, do)
    k_desc, v_desc = _tma_descs(tma_kv, k, v)
    q_desc, do_desc = _tma_descs(tma_qdo, q, do)
    meta = dict(HEAD_DIM=d, BLOCK_D=block_d, DOT_FP32=interp, IEEE=(q.dtype == torch.float32 or interp))
    grid = (n_tiles, b * h)
    side = _side_stream(q.device) if BWD_TWO_STREAMS and q.is_cuda and not interp else None
    if side is not None:  # dQ on a second stream, beside dK/dV: their launches fill each other's tails
        side.wait_stream(torch.cuda.current_stream(q.device))
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        lists, counts, pack = _q2k_lists(q2k, q2k_cnt, tile_offsets, s)
        _launch_dq(grid, block_d, q, k, v, do, dq, lse, delta, lists, counts, tile_offsets, k_desc, v_desc, s, h,
                   scale, dict(meta, PACK=pack), tma_kv)
    for blk, lo, num_warps, num_stages in _size_classes(BWD_DKDV_LAUNCH, block_d, q.dtype):
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
            h, scale, scale * LOG2E, lo, blk, **meta, BLOCK_M=BLOCK, BLOCK_N=blk, TMA=tma_qdo,
            num_warps=num_warps, num_stages=num_stages,
        )
    if side is not None:
        torch.cuda.current_stream(q.device).wait_stream(side)
    return dq, dk, dv


def _launch_dq(grid, block_d, q, k, v, do, dq, lse, delta, q2k, q2k_cnt, tile_offsets, k_desc, v_desc, s, h,
               scale, meta, tma_kv) -> None:
    """The dQ kernel's size-class launches (on the current stream); q2k / q2k_cnt and meta's PACK from
    `_q2k_lists`."""
    for blk, lo, num_warps, num_stages in _size_classes(BWD_DQ_LAUNCH, block_d, q.dtype):
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
            h, scale, scale * LOG2E, lo, blk, **meta, BLOCK_M=blk, BLOCK_N=BLOCK, TMA=tma_kv,
            PACK_SEG=_PACK_SEG, num_warps=num_warps, num_stages=num_stages,
        )


_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """One extra CUDA stream per device for the backward's dQ launches."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SIDE_STREAMS:
        _SIDE_STREAMS[idx] = torch.cuda.Stream(device=idx)
    return _SIDE_STREAMS[idx]


# --------------------------------------------------------------------------------------- custom ops, autograd
# Explicit schemas: the kernels' Python signatures use postponed annotations, which schema inference across
# torch versions does not always resolve.


@torch.library.custom_op(
    "vsagen::block_sparse_attn", mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, Tensor q2k, Tensor q2k_cnt, Tensor tile_offsets, float scale) "
           "-> (Tensor, Tensor)")
def _bsa_op(q, k, v, q2k, q2k_cnt, tile_offsets, scale):
    """Forward custom op: `bsa_fwd` (inputs validated by `block_sparse_attention`)."""
    return bsa_fwd(q, k, v, q2k, q2k_cnt, tile_offsets, scale)


@_bsa_op.register_fake
def _bsa_op_fake(q, k, v, q2k, q2k_cnt, tile_offsets, scale):
    b, s, h, _ = q.shape
    return torch.empty_like(q), q.new_empty((b, h, s), dtype=torch.float32)


@torch.library.custom_op(
    "vsagen::block_sparse_attn_bwd", mutates_args=(),
    schema="(Tensor dout, Tensor? dlse, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor q2k, "
           "Tensor q2k_cnt, Tensor tile_offsets, float scale) -> (Tensor, Tensor, Tensor)")
def _bsa_bwd_op(dout, dlse, q, k, v, out, lse, q2k, q2k_cnt, tile_offsets, scale):
    """Backward custom op: k2q lists from `k2q.build_k2q_triton` (two Triton launches, 23 us on the H200 at the
    1.3B shape against 260 us for the torch `build_k2q`, which stays as its oracle), then `bsa_bwd`."""
    from .k2q import build_k2q_triton

    k2q, k2q_cnt = build_k2q_triton(q2k, q2k_cnt, tile_offsets.numel() - 1)
    return bsa_bwd(dout, q, k, v, out, lse, q2k, q2k_cnt, k2q, k2q_cnt, tile_offsets, scale, dlse=dlse)


@_bsa_bwd_op.register_fake
def _bsa_bwd_op_fake(dout, dlse, q, k, v, out, lse, q2k, q2k_cnt, tile_offsets, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _bsa_setup_context(ctx, inputs, output):
    q, k, v, q2k, q2k_cnt, tile_offsets, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, q2k, q2k_cnt, tile_offsets)
    ctx.scale = scale


def _bsa_backward(ctx, dout, dlse):
    q, k, v, out, lse, q2k, q2k_cnt, tile_offsets = ctx.saved_tensors
    dq, dk, dv = _bsa_bwd_op(dout, dlse, q, k, v, out, lse, q2k, q2k_cnt, tile_offsets, ctx.scale)
    return dq, dk, dv, None, None, None, None


_bsa_op.register_autograd(_bsa_backward, setup_context=_bsa_setup_context)


# ----------------------------------------------------------------------------------------- public function


def block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor,
                           q2k_cnt: torch.Tensor, tile_offsets: torch.Tensor,
                           scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-sparse attention over tiles (VSA's fine stage), differentiable in q, k, v (and through lse).

    Args:
        q, k, v: (B, S, H, D) bf16 / fp16 / fp32 (one dtype), tile order (`vsagen.layout.TileLayout`), any
            strides with unit stride on D, D <= 256.
        q2k: (B, H, Q_TILES, K) int32 key tiles of each query tile, ascending, no repeats, each in
            [0, KV_TILES); only the first q2k_cnt entries of a row are read.
        q2k_cnt: (B, H, Q_TILES) int32 in [0, K]; 0 leaves the tile's rows empty (output 0, lse -inf, zero
            gradients).
        tile_offsets: (n_tiles + 1,) int32 tile starts in tile order, tile_offsets[0] = 0,
            tile_offsets[-1] = S, at most 64 tokens per tile; Q_TILES = KV_TILES = n_tiles.
        scale: softmax scale, default 1/sqrt(D).

    Returns:
        out: (B, S, H, D) like q (q's strides when q is dense, else contiguous).
        lse: (B, H, S) fp32 natural-log log-sum-exp of each query row's selected scores (-inf when empty).

    Raises:
        ValueError: mismatched shapes, dtypes or devices, D > 256, a head dim without unit stride, index
            tensors that are not int32, fewer than ceil(S / 64) tiles, or fp32 inputs with D > 128 that need
            gradients on a GPU (shared memory; the forward alone is fine). Index values are not checked (that
            would synchronize the device): out-of-range entries read out of bounds.

    Memory: on layouts with partial tiles each call (and the backward's dQ) first builds a tile plan of the q2k
    rows (`tile_plan.build_tile_plan`): a transient int32 (B, H, Q_TILES, 8 K) tensor, 8x q2k (19 MB at the
    Wan2.1-1.3B 480p shape, 330 MB at 14B 720p, both at 87.5% sparsity).

    Gradients: dq, dk, dv by the FlashAttention-2 backward recomputing P from lse (deterministic, no atomics);
    none for the index tensors. Without grad (or under torch.no_grad) the forward kernel runs directly.

    Source: VSA paper (arXiv 2505.13389) sec. 2, fine stage; FlashAttention-2 (arXiv 2307.08691) alg. 1 and 2.
    """
    _check_inputs(q, k, v, q2k, q2k_cnt, tile_offsets)
    devices = {x.device for x in (q, k, v, q2k, q2k_cnt, tile_offsets)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(str(d) for d in devices)}")
    if tile_offsets.dim() != 1 or (tile_offsets.numel() - 1) * BLOCK < q.shape[1]:
        raise ValueError(f"tile_offsets must be (n_tiles + 1,) with n_tiles * {BLOCK} >= S = {q.shape[1]}, "
                         f"got {tuple(tile_offsets.shape)}")
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if needs_grad:
        _check_fp32_bwd(q)
    if not needs_grad and not torch.compiler.is_compiling():
        return bsa_fwd(q, k, v, q2k, q2k_cnt, tile_offsets, scale)  # fast path: no dispatcher, nothing saved
    return _bsa_op(q, k, v, q2k, q2k_cnt, tile_offsets, scale)
