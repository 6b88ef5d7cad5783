"""The Triton kernels of VSA's coarse stage, their launchers and their launch configuration (with its tuning notes).

The launchers (callers: `coarse.py`'s public functions and its custom op `vsagen::coarse_stage`, which check the
inputs first; the layout contract is in `coarse.py`'s docstring):
    pool_launch    q_c, k_c[, v_c] = mean of each tile's real tokens, one fused pass over q, k[, v]  (_tile_pool_kernel)
    scores_launch  scores = q_c k_c^T / sqrt(D), batched tl.dot GEMM, fp32 out                    (_tile_scores_kernel)
    top_k_launch   q2k[b, h, i] = the K key tiles of largest scores[b, h, i], ascending; q2k_cnt = K   (_top_k_kernel)
Under the Triton interpreter (TRITON_INTERPRET=1, read at call time) the launch configuration batches work.

Design choices:
* Pooled tiles are fp32 whatever the input dtype: they are small (n_tiles * H * D * 4 B = 3.8 MB per tensor at
  the Wan2.1-1.3B shape, ~1 us of HBM writes), they are exact means of the input (fp32 sums divided by the true
  count), and the precision of the scores is then chosen in one place, the score GEMM.
* Scores: a Triton GEMM whose tl.dot input precision is a parameter (`KernelTuning.score_precision`, default per
  architecture in `tuning.ARCH_DEFAULTS`): "tf32" on NVIDIA from sm_80 (fp32 range, 10-bit mantissa operands,
  fp32 accumulation). "bf16" is 5 us faster but swaps 7x more tiles at
  the top-k boundary; "tf32x3" matches the fp32 oracle for 8 us more. torch.matmul was not used: in fp32 it
  ran at 61 us (no tensor cores), and in bf16 it returns bf16 scores (massive ties at the K-th score).
* Top-k: an exact radix select per row on the fp32 bit patterns (counting passes over the row held in
  registers, most significant bit first, stopping as soon as a bit prefix isolates exactly K tiles: 15.5
  passes on average at the 1.3B shape), then a stream compaction with one tl.cumsum. Rows come out ascending
  and int32 with no sort and no dense block map; exact ties at the K-th score keep the lowest tile indices
  (torch.topk keeps an arbitrary subset). torch.topk + sort + cast measured 337 us.

Cost on the H200 (torch 2.11, triton 3.6; CUDA-graph replay, i.e. GPU time only) at the Wan2.1-1.3B 480p shape
(B=1, S=32,760, H=12, D=128, bf16, 624 tiles, K=78); the budget is ~130 us:
    pool_qk: reads 2 * 32,760 * 12 * 128 * 2 B = 201 MB, writes 7.7 MB: 52 us (3.9 TB/s; a q+k copy moving
             402 MB takes 99 us); with v: 302 MB, 77 us
    scores: 2 * 12 * 624^2 * 128 = 1.2 GFLOP, writes 18.7 MB: bf16 14 us, tf32 18.5 us, tf32x3 26 us
    top-k: reads 18.7 MB, writes 2.3 MB; 7,488 rows x 15.5 passes x 640 lanes: 27 us (compute bound)
    coarse_stage: tf32 (default) 103 us, bf16 98 us, tf32x3 111 us; with v (gate path) +24 us
    Selection vs the fp32 oracle on random inputs: tf32 97.7% of rows identical and 99.97% of the tiles in
    common, bf16 84.6% / 99.80%, tf32x3 100% / 100% (the swapped tiles are near-ties at the K-th score).
    Host side: one call costs ~155 us of CPU (validation, three Triton launches): hidden while the CPU runs
    ahead of the GPU, gone under CUDA graphs.
    For the record, Wan2.1-14B 720p (S=75,600, H=40, 1,440 tiles, K=180): 1.19 ms (pool 374 us, scores 211-
    284 us, top-k 624 us).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .tuning import interpreting

# Tuning. Configurations were ranked on the H200 (torch 2.11, triton 3.6) at the 1.3B shape with
# triton.testing.do_bench (launch overhead included, so absolute numbers ran high); the chosen ones were then
# timed with CUDA graphs (module docstring).
# Pooling: one program per (tile, batch, block of BLOCK_H heads) walks the tile POOL_BLOCK_T rows at a time over
# BLOCK_H * BLOCK_D <= POOL_COLS columns, one warp per POOL_COLS_PER_WARP columns, so that each thread loads 16 B
# (8 bf16) per row and the sum over rows stays inside the thread. BLOCK_H is the power of two that pads the
# fewest heads (4 for H = 12: 512 columns, 2 warps, 1,872 programs). 2-16 rows per step ranked alike; 16 heads
# per program was up to 20% slower; warps split across rows (e.g. 8 warps over 512 columns) 2.5-7x slower.
POOL_BLOCK_T = 4
POOL_COLS = 512
POOL_COLS_PER_WARP = 256
# Scores: (BLOCK_M, BLOCK_N) output blocks of each head's Q_TILES x KV_TILES logits, BLOCK_K of D per step.
# 64 x 64 x 128 with 4 warps ranked first or tied for bf16 and tf32x3 among 8 shapes (128 x 128 was slower;
# tf32 was not swept).
SCORE_BLOCK_M = 64
SCORE_BLOCK_N = 64
SCORE_BLOCK_K = 128
SCORE_NUM_WARPS = 4
# The tl.dot input precision of the score GEMM is a tuning field (`KernelTuning.score_precision`; the choices
# and their cost in `tuning.ARCH_DEFAULTS`'s notes). Speed and agreement with the fp32 oracle: module docstring.
# Top-k: one program per score row (TOPK_ROWS), one warp per TOPK_LANES_PER_WARP padded lanes (640 lanes for
# 624 tiles: one warp, 20 keys per thread). The counting passes are compute bound: a second warp only adds a
# shared-memory reduction per pass (+15%), and one 1,024-lane chunk instead of 512 + 128 lanes cost +50%.
TOPK_LANES_PER_WARP = 2048
TOPK_ROWS = 1
# The interpreter pays per operation, not per element: there, rows are batched and the pooling takes whole
# 64-row steps. This changes only the fp32 summation order of the pooling, not the selection rule.
TOPK_ROWS_INTERPRETER = 64
POOL_BLOCK_T_INTERPRETER = 64


@triton.jit
def _round_to_bf16(x):
    """fp32 -> the nearest bf16 value (ties to even), kept in fp32; finite inputs."""
    u = x.to(tl.uint32, bitcast=True)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.to(tl.float32, bitcast=True)


@triton.jit
def _tile_pool_kernel(
    x0_ptr, x1_ptr, x2_ptr, o0_ptr, o1_ptr, o2_ptr, off_ptr,
    stride_x0b, stride_x0s, stride_x0h,
    stride_x1b, stride_x1s, stride_x1h,
    stride_x2b, stride_x2s, stride_x2h,
    stride_o0b, stride_o0t, stride_o0h,
    stride_o1b, stride_o1t, stride_o1h,
    stride_o2b, stride_o2t, stride_o2h,
    num_heads,
    NUM_INPUTS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program: the mean of one tile over BLOCK_H heads of one batch, for each of NUM_INPUTS (1-3) tensors."""
    tl.static_assert(NUM_INPUTS >= 1 and NUM_INPUTS <= 3)
    tl.static_assert(BLOCK_D >= HEAD_DIM)
    pid_t = tl.program_id(0)
    b = tl.program_id(1)
    h0 = tl.program_id(2) * BLOCK_H
    t_start = tl.load(off_ptr + pid_t)
    t_len = tl.load(off_ptr + pid_t + 1) - t_start
    offs_t = tl.arange(0, BLOCK_T)
    # Columns enumerate (head, d) pairs of the head block: head h0 + offs_c // BLOCK_D, element offs_c % BLOCK_D.
    offs_c = tl.arange(0, BLOCK_H * BLOCK_D)
    offs_h = h0 + offs_c // BLOCK_D
    offs_d = offs_c % BLOCK_D
    c_ok = (offs_h < num_heads) & (offs_d < HEAD_DIM)
    x0_cols = x0_ptr + b * stride_x0b + offs_h * stride_x0h + offs_d  # (BLOCK_H * BLOCK_D,) pointers of row 0
    x1_cols = x1_ptr + b * stride_x1b + offs_h * stride_x1h + offs_d
    x2_cols = x2_ptr + b * stride_x2b + offs_h * stride_x2h + offs_d
    acc0 = tl.full([BLOCK_H * BLOCK_D], 0.0, dtype=tl.float32)  # acc*: (BLOCK_H * BLOCK_D,) fp32 running sums
    acc1 = tl.full([BLOCK_H * BLOCK_D], 0.0, dtype=tl.float32)
    acc2 = tl.full([BLOCK_H * BLOCK_D], 0.0, dtype=tl.float32)
    # The three inputs are written out rather than sharing a @triton.jit helper: every nested jit call costs
    # milliseconds under the interpreter, which would dominate the CPU tests.
    for r0 in range(0, t_len, BLOCK_T):
        rows = (t_start + r0 + offs_t)[:, None]
        mask = (offs_t < t_len - r0)[:, None] & c_ok[None, :]
        x0 = tl.load(x0_cols[None, :] + rows * stride_x0s, mask=mask, other=0.0)  # (BLOCK_T, BLOCK_H * BLOCK_D)
        acc0 += tl.sum(x0.to(tl.float32), axis=0)
        if NUM_INPUTS > 1:
            x1 = tl.load(x1_cols[None, :] + rows * stride_x1s, mask=mask, other=0.0)
            acc1 += tl.sum(x1.to(tl.float32), axis=0)
        if NUM_INPUTS > 2:
            x2 = tl.load(x2_cols[None, :] + rows * stride_x2s, mask=mask, other=0.0)
            acc2 += tl.sum(x2.to(tl.float32), axis=0)
    count = tl.maximum(t_len, 1).to(tl.float32)  # an empty tile (never built by TileLayout) pools to 0, not NaN
    tl.store(o0_ptr + b * stride_o0b + pid_t * stride_o0t + offs_h * stride_o0h + offs_d, acc0 / count, mask=c_ok)
    if NUM_INPUTS > 1:
        tl.store(o1_ptr + b * stride_o1b + pid_t * stride_o1t + offs_h * stride_o1h + offs_d, acc1 / count,
                 mask=c_ok)
    if NUM_INPUTS > 2:
        tl.store(o2_ptr + b * stride_o2b + pid_t * stride_o2t + offs_h * stride_o2h + offs_d, acc2 / count,
                 mask=c_ok)


@triton.jit
def _tile_scores_kernel(
    q_ptr, k_ptr, s_ptr,
    stride_qb, stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_sb, stride_sh, stride_sq, stride_sk,
    num_heads, num_q_tiles, num_kv_tiles, scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr, DOT_FP32: tl.constexpr,
):
    """One program: a (BLOCK_M, BLOCK_N) block of q_c k_c^T * scale for one (batch, head)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_bh = tl.program_id(2)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < num_q_tiles
    n_ok = offs_n < num_kv_tiles
    q_rows = q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qt
    k_rows = k_ptr + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kt
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)  # acc: (BLOCK_M, BLOCK_N) fp32
    for d0 in tl.static_range(0, HEAD_DIM, BLOCK_K):
        k_ok = (d0 + offs_k) < HEAD_DIM
        q = tl.load(q_rows + d0 + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)  # (M, K) fp32
        k = tl.load(k_rows + d0 + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)  # (N, K) fp32
        if PRECISION == "bf16":
            if DOT_FP32:
                # Interpreter: its bf16 tl.dot is wrong and its fp32 -> bf16 cast truncates, so round to nearest
                # even by hand and stay in fp32 (bf16 x bf16 products are exact in fp32).
                q = _round_to_bf16(q)
                k = _round_to_bf16(k)
            else:
                q = q.to(tl.bfloat16)
                k = k.to(tl.bfloat16)
            acc = tl.dot(q, tl.trans(k), acc)
        else:
            acc = tl.dot(q, tl.trans(k), acc, input_precision=PRECISION)
    tl.store(s_ptr + b * stride_sb + h * stride_sh + offs_m[:, None] * stride_sq + offs_n[None, :] * stride_sk,
             acc * scale, mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _top_k_kernel(
    s_ptr, q2k_ptr, cnt_ptr,
    stride_sb, stride_sh, stride_sq, stride_sk,
    stride_ib, stride_ih, stride_iq,
    stride_cb, stride_ch,
    num_heads, num_q_tiles, num_kv_tiles, top_k,
    BLOCK_R: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr,
):
    """One program: for BLOCK_R query-tile rows of one (batch, head), the tile indices of the top_k largest scores,
    ascending.

    Each row is held as two power-of-two chunks, lanes [0, BLOCK_A) and [BLOCK_A, BLOCK_A + BLOCK_B)
    (512 + 128 for 624 tiles instead of 1,024 padded lanes: the counting passes are compute bound).
    """
    pid_r = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = offs_r < num_q_tiles
    offs_a = tl.arange(0, BLOCK_A)
    offs_b = BLOCK_A + tl.arange(0, BLOCK_B)
    ok_a = r_ok[:, None] & (offs_a < num_kv_tiles)[None, :]
    ok_b = r_ok[:, None] & (offs_b < num_kv_tiles)[None, :]
    rows_ptr = (s_ptr + b * stride_sb + h * stride_sh + offs_r * stride_sq)[:, None]
    x_a = tl.load(rows_ptr + offs_a[None, :] * stride_sk, mask=ok_a, other=0.0)  # (BLOCK_R, BLOCK_A) fp32 scores
    x_b = tl.load(rows_ptr + offs_b[None, :] * stride_sk, mask=ok_b, other=0.0)  # (BLOCK_R, BLOCK_B) fp32 scores
    # -0.0 -> +0.0 so that the two compare equal as in torch; then an order-preserving map fp32 -> uint32
    # (negatives get all bits flipped, non-negatives only the sign bit). Padding lanes get key 0, below all.
    u_a = tl.where(x_a == 0.0, 0.0, x_a).to(tl.uint32, bitcast=True)
    u_b = tl.where(x_b == 0.0, 0.0, x_b).to(tl.uint32, bitcast=True)
    key_a = tl.where(ok_a, u_a ^ tl.where((u_a >> 31) == 1, 0xFFFFFFFF, 0x80000000), 0)
    key_b = tl.where(ok_b, u_b ^ tl.where((u_b >> 31) == 1, 0xFFFFFFFF, 0x80000000), 0)
    # Radix select, most significant bit first: each row's thr grows to the largest value with
    # count(key >= thr) >= top_k, i.e. the row's top_k-th largest key. The loop stops once a bit prefix isolates
    # exactly top_k keys in every row (15.5 passes on average at the 1.3B shape instead of 32).
    thr = tl.full([BLOCK_R], 0, dtype=tl.uint32)
    n_ge = tl.full([BLOCK_R], 0, dtype=tl.int32) + num_kv_tiles  # (BLOCK_R,) count(key >= thr)
    bit = tl.full([], 0x80000000, dtype=tl.uint32)
    while (bit != 0) & (tl.max(((n_ge != top_k) & r_ok).to(tl.int32), axis=0) != 0):
        cand = thr | bit
        n_cand = (tl.sum((key_a >= cand[:, None]).to(tl.int32), axis=1)
                  + tl.sum((key_b >= cand[:, None]).to(tl.int32), axis=1))
        take = n_cand >= top_k
        thr = tl.where(take, cand, thr)
        n_ge = tl.where(take, n_cand, n_ge)
        bit = bit >> 1
    # Selection: every key above thr, then the keys equal to thr in index order until top_k are taken.
    # One inclusive scan counts both: low 16 bits the keys above, high 16 bits the keys equal (< 65,536 tiles).
    above_a = key_a > thr[:, None]
    above_b = key_b > thr[:, None]
    flags_a = above_a.to(tl.int32) + ((ok_a & (key_a == thr[:, None])).to(tl.int32) << 16)
    flags_b = above_b.to(tl.int32) + ((ok_b & (key_b == thr[:, None])).to(tl.int32) << 16)
    need = (top_k - tl.sum(above_a.to(tl.int32), axis=1) - tl.sum(above_b.to(tl.int32), axis=1))[:, None]
    incl_a = tl.cumsum(flags_a, axis=1)
    incl_b = tl.cumsum(flags_b, axis=1) + tl.sum(flags_a, axis=1)[:, None]
    sel_a = above_a | (((flags_a >> 16) == 1) & ((incl_a >> 16) <= need))
    sel_b = above_b | (((flags_b >> 16) == 1) & ((incl_b >> 16) <= need))
    # Output slot = selected tiles up to this one - 1: the keys above, plus at most `need` ties.
    pos_a = (incl_a & 0xFFFF) + tl.minimum(incl_a >> 16, need) - 1
    pos_b = (incl_b & 0xFFFF) + tl.minimum(incl_b >> 16, need) - 1
    out_ptr = (q2k_ptr + b * stride_ib + h * stride_ih + offs_r * stride_iq)[:, None]
    tl.store(out_ptr + pos_a, offs_a[None, :] + tl.zeros_like(pos_a), mask=sel_a)
    tl.store(out_ptr + pos_b, offs_b[None, :] + tl.zeros_like(pos_b), mask=sel_b)
    tl.store(cnt_ptr + b * stride_cb + h * stride_ch + offs_r, tl.full([BLOCK_R], 0, dtype=tl.int32) + top_k,
             mask=r_ok)


def _interpreting() -> bool:
    """True under the Triton CPU interpreter (`tuning.interpreting`, TRITON_INTERPRET=1 read at call time), where
    tl.dot on bf16 is wrong; the launch configuration then batches work (tests monkeypatch this name)."""
    return interpreting()


def _pool_config(num_heads: int, block_d: int) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_H, num_warps) of the pooling kernel; see the tuning notes at the top."""
    if _interpreting():  # one program per (tile, batch), whole 64-row steps: fewest interpreted operations
        return POOL_BLOCK_T_INTERPRETER, triton.next_power_of_2(num_heads), 1
    cap = max(1, POOL_COLS // block_d)
    # Power-of-two head block <= cap that pads the fewest heads, the largest on ties (4 for 12 heads).
    block_h = min((1 << i for i in range(cap.bit_length())),
                  key=lambda bh: (triton.cdiv(num_heads, bh) * bh, -bh))
    return POOL_BLOCK_T, block_h, max(1, block_h * block_d // POOL_COLS_PER_WARP)


def pool_launch(xs: list[torch.Tensor], tile_offsets: torch.Tensor) -> list[torch.Tensor]:
    """Launch the fused pooling kernel over 1 to 3 tensors; returns (B, n_tiles, H, D) fp32 views."""
    b, _, h, d = xs[0].shape
    n_tiles = tile_offsets.numel() - 1
    # (B, H, n_tiles, D) storage: each head's pooled tiles are one contiguous matrix for the score GEMM.
    outs = [torch.empty((b, h, n_tiles, d), dtype=torch.float32, device=xs[0].device).permute(0, 2, 1, 3)
            for _ in xs]
    xs3 = xs + [xs[0]] * (3 - len(xs))  # unused slots repeat the first tensor; NUM_INPUTS skips them
    os3 = outs + [outs[0]] * (3 - len(outs))
    block_d = max(16, triton.next_power_of_2(d))
    block_t, block_h, num_warps = _pool_config(h, block_d)
    _tile_pool_kernel[(n_tiles, b, triton.cdiv(h, block_h))](
        *xs3, *os3, tile_offsets,
        *(s for x in xs3 for s in (x.stride(0), x.stride(1), x.stride(2))),
        *(s for o in os3 for s in (o.stride(0), o.stride(1), o.stride(2))),
        h,
        NUM_INPUTS=len(xs), HEAD_DIM=d, BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_D=block_d,
        num_warps=num_warps,
    )
    return outs


def scores_launch(q_c: torch.Tensor, k_c: torch.Tensor, precision: str) -> torch.Tensor:
    """Launch the score kernel; returns (B, H, Q_TILES, KV_TILES) fp32 contiguous."""
    b, n_q, h, d = q_c.shape
    n_kv = k_c.shape[1]
    scores = torch.empty((b, h, n_q, n_kv), dtype=torch.float32, device=q_c.device)
    grid = (triton.cdiv(n_q, SCORE_BLOCK_M), triton.cdiv(n_kv, SCORE_BLOCK_N), b * h)
    _tile_scores_kernel[grid](
        q_c, k_c, scores,
        q_c.stride(0), q_c.stride(1), q_c.stride(2),
        k_c.stride(0), k_c.stride(1), k_c.stride(2),
        scores.stride(0), scores.stride(1), scores.stride(2), scores.stride(3),
        h, n_q, n_kv, d ** -0.5,
        HEAD_DIM=d, BLOCK_M=SCORE_BLOCK_M, BLOCK_N=SCORE_BLOCK_N,
        BLOCK_K=min(SCORE_BLOCK_K, max(16, triton.next_power_of_2(d))), PRECISION=precision, DOT_FP32=_interpreting(),
        num_warps=SCORE_NUM_WARPS,
    )
    return scores


def _row_chunks(n: int) -> tuple[int, int]:
    """Two power-of-two chunk sizes (>= 16 each) covering n lanes with little padding: 624 -> (512, 128)."""
    a = max(16, 1 << (n.bit_length() - 1))  # largest power of two <= n
    return a, max(16, triton.next_power_of_2(max(1, n - a)))


def top_k_launch(scores: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the top-k kernel; returns q2k (B, H, Q_TILES, K) int32 ascending and q2k_cnt (B, H, Q_TILES) int32."""
    b, h, n_q, n_kv = scores.shape
    q2k = torch.empty((b, h, n_q, top_k), dtype=torch.int32, device=scores.device)
    q2k_cnt = torch.empty((b, h, n_q), dtype=torch.int32, device=scores.device)
    block_a, block_b = _row_chunks(n_kv)
    block_r = min(TOPK_ROWS_INTERPRETER if _interpreting() else TOPK_ROWS, triton.next_power_of_2(n_q))
    _top_k_kernel[(triton.cdiv(n_q, block_r), b * h)](
        scores, q2k, q2k_cnt,
        scores.stride(0), scores.stride(1), scores.stride(2), scores.stride(3),
        q2k.stride(0), q2k.stride(1), q2k.stride(2),
        q2k_cnt.stride(0), q2k_cnt.stride(1),
        h, n_q, n_kv, top_k,
        BLOCK_R=block_r, BLOCK_A=block_a, BLOCK_B=block_b,
        num_warps=triton.cdiv(block_a + block_b, TOPK_LANES_PER_WARP),
    )
    return q2k, q2k_cnt
