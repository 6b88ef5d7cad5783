"""Block-sparse flash attention over video tiles (VSA's fine stage), Triton.

Computes, for each (batch, head, query tile), softmax attention of the tile's query tokens over the tokens of
the key tiles listed in its q2k row (VSA paper, arXiv 2505.13389, sec. 2; online softmax as in
FlashAttention-2). Tokens are in tile order (`vsagen.layout.TileLayout`): tile j occupies rows
[tile_offsets[j], tile_offsets[j+1]) and holds at most BLOCK = 64 tokens, fewer at grid edges (partial tiles);
rows past a tile's end are masked exactly (scores set to -inf, outputs not stored).

Layout contract:
    q, k, v: (B, S, H, D) bf16 / fp16 / fp32, tile order, any strides with unit stride on D
    q2k: (B, H, Q_TILES, K) int32, the first q2k_cnt entries of each row used (ascending by convention)
    q2k_cnt: (B, H, Q_TILES) int32
    tile_offsets: (n_tiles + 1,) int32
    returns: out (B, S, H, D) like q; lse (B, H, S) fp32, natural-log log-sum-exp of each query row
             (-inf for a row with no selected tile, whose output is 0)

Unsupported: tiles of more than 64 tokens, causal masks, dropout, different q / kv tile layouts.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

BLOCK = 64  # tokens in a full (4, 4, 4) tile
LOG2E = 1.4426950408889634  # log2(e): scores are kept in base 2 for exp2
LN2 = 0.6931471805599453  # ln(2): converts the base-2 LSE back to natural log

# Launch parameters. (num_warps, num_stages) = (4, 3) is the usual Hopper choice for a 64 x 128 query block
# with head dim 128 (one warpgroup per 64 rows); to be swept on the H200 by benchmarks/attention.py.
FWD_NUM_WARPS = 4
FWD_NUM_STAGES = 3


def interpreting() -> bool:
    """True under the Triton CPU interpreter (TRITON_INTERPRET=1), where tl.dot on bf16/fp16 is wrong."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _bsa_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, q2k_ptr, cnt_ptr, off_ptr,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh,
    stride_ib, stride_ih, stride_iq,
    stride_cb, stride_ch,
    num_heads, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_FP32: tl.constexpr, IEEE: tl.constexpr,
):
    """One program: one query tile of one (batch, head), looping over its selected key tiles."""
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    q_start = tl.load(off_ptr + pid_t)
    q_len = tl.load(off_ptr + pid_t + 1) - q_start
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
    cnt = tl.load(cnt_ptr + b * stride_cb + h * stride_ch + pid_t)
    row_ptr = q2k_ptr + b * stride_ib + h * stride_ih + pid_t * stride_iq
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    for i in range(0, cnt):
        kt = tl.load(row_ptr + i)
        k_start = tl.load(off_ptr + kt)
        k_len = tl.load(off_ptr + kt + 1) - k_start
        n_ok = offs_n < k_len
        rows = (k_start + offs_n)[:, None]
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + rows * stride_ks + offs_d[None, :], mask=kv_mask, other=0.0)  # (BLOCK_N, BLOCK_D)
        v = tl.load(v_base + rows * stride_vs + offs_d[None, :], mask=kv_mask, other=0.0)
        if DOT_FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(n_ok[None, :], s * qk_scale, float("-inf"))  # s: (BLOCK_M, BLOCK_N), base-2 logits
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if IEEE:
            acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    empty = l_i == 0.0  # no selected tile: output 0, LSE -inf
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + (q_start + offs_m)[:, None] * stride_os + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
    tl.store(lse_ptr + b * stride_lb + h * stride_lh + q_start + offs_m, lse, mask=m_ok)


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
    grid = (n_tiles, b * h)
    _bsa_fwd_kernel[grid](
        q, k, v, out, lse, q2k, q2k_cnt, tile_offsets,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        lse.stride(0), lse.stride(1),
        q2k.stride(0), q2k.stride(1), q2k.stride(2),
        q2k_cnt.stride(0), q2k_cnt.stride(1),
        h, scale * LOG2E,
        HEAD_DIM=d, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_M=BLOCK, BLOCK_N=BLOCK,
        DOT_FP32=interp, IEEE=(q.dtype == torch.float32 or interp),
        num_warps=FWD_NUM_WARPS, num_stages=FWD_NUM_STAGES,
    )
    return out, lse
