"""Forward fine-stage variants for the lent GPU (issue 3 experiments, not a test): what each change buys.

One variant kernel with compile-time switches, timed against the shipped `_bsa_fwd_kernel` at the Wan2.1-1.3B
480p shape (87.5% sparsity, bf16, D = 128), each checked against the shipped kernel's output (relative L2):

* LOAD: 0 = pointer loads of the K / V tile (cp.async, as shipped); 1 = TMA tensor-descriptor loads made on the
  device (one (64, D) box per tile; rows past a partial tile's end are loaded and masked in the scores).
* EXP: 0 = tl.exp2 (ex2.approx.f32 with denormal handling); 1 = ex2.approx.ftz.f32; 2 = packed
  ex2.approx.ftz.bf16x2 on bf16 logits (P comes out in bf16, ready for the P V product; the row sum adds the
  bf16 values).
* WS: 1 = Triton's automatic warp specialization of the key-tile loop (`tl.range(warp_specialize=True)`).

Usage: python benchmarks/fwd_variants.py [--shape 1.3b] [--sparsity 0.875]
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch
import triton
import triton.language as tl

from vsagen.bench import SHAPES, bench_ms, make_inputs, rel_l2
from vsagen.kernels import block_sparse_attn as bsa
from vsagen.kernels import reference as ref
from vsagen.kernels.coarse import coarse_stage
from vsagen.layout import tile_layout


@triton.jit
def _exp2_variant(x, EXP: tl.constexpr):
    """2^x of an fp32 (BLOCK_M, BLOCK_N) block by variant EXP; bf16 result for EXP 2, else fp32."""
    if EXP == 0:
        p = tl.exp2(x)
    elif EXP == 1:
        p = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        p = tl.inline_asm_elementwise("ex2.approx.ftz.bf16x2 $0, $1;", "=r,r", [x.to(tl.bfloat16)],
                                      dtype=tl.bfloat16, is_pure=True, pack=2)
    return p


@triton.jit
def _fwd_variant_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, q2k_ptr, cnt_ptr, off_ptr,
    seq_len, stride_s, stride_h, stride_lh, stride_ih, stride_iq, stride_ch, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    LOAD: tl.constexpr, EXP: tl.constexpr, WS: tl.constexpr,
):
    pid_t = tl.program_id(0)
    h = tl.program_id(1)
    q_start = tl.load(off_ptr + pid_t)
    q_len = tl.load(off_ptr + pid_t + 1) - q_start
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    m_ok = offs_m < q_len
    q = tl.load(q_ptr + h * stride_h + (q_start + offs_m)[:, None] * stride_s + offs_d[None, :],
                mask=m_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    cnt = tl.load(cnt_ptr + h * stride_ch + pid_t)
    row_ptr = q2k_ptr + h * stride_ih + pid_t * stride_iq
    if LOAD == 1:
        k_desc = tl.make_tensor_descriptor(k_ptr + h * stride_h, shape=[seq_len, HEAD_DIM], strides=[stride_s, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
        v_desc = tl.make_tensor_descriptor(v_ptr + h * stride_h, shape=[seq_len, HEAD_DIM], strides=[stride_s, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])
    for i in tl.range(0, cnt * (64 // BLOCK_N), warp_specialize=WS):
        # BLOCK_N < 64: each listed 64-token tile is taken in 64 // BLOCK_N row slices
        kt = tl.load(row_ptr + i // (64 // BLOCK_N))
        k_start = tl.load(off_ptr + kt) + (i % (64 // BLOCK_N)) * BLOCK_N
        k_len = tl.load(off_ptr + kt + 1) - k_start
        n_ok = offs_n < k_len
        if LOAD == 1:
            k = k_desc.load([k_start, 0])
            v = v_desc.load([k_start, 0])
        else:
            rows = (k_start + offs_n)[:, None]
            k = tl.load(k_ptr + h * stride_h + rows * stride_s + offs_d[None, :], mask=n_ok[:, None], other=0.0)
            v = tl.load(v_ptr + h * stride_h + rows * stride_s + offs_d[None, :], mask=n_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k))
        s = tl.where(n_ok[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = _exp2_variant(s - m_new[:, None], EXP)
        l_i = l_i * alpha + tl.sum(p.to(tl.float32), 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    tl.store(o_ptr + h * stride_h + (q_start + offs_m)[:, None] * stride_s + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=m_ok[:, None])
    tl.store(lse_ptr + h * stride_lh + q_start + offs_m, lse, mask=m_ok)


def _alloc(size: int, alignment: int, stream):
    return torch.empty(size, device="cuda", dtype=torch.int8)


def run_variant(q, k, v, q2k, cnt, off, n, *, load, exp, ws, num_warps=4, num_stages=3, block_n=64, maxnreg=None):
    b, s, h, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((b, h, s), device=q.device, dtype=torch.float32)
    _fwd_variant_kernel[(n, h)](
        q, k, v, o, lse, q2k, cnt, off, s, q.stride(1), q.stride(2), lse.stride(1), q2k.stride(1), q2k.stride(2),
        cnt.stride(1), d ** -0.5 * bsa.LOG2E,
        HEAD_DIM=d, BLOCK_M=64, BLOCK_N=block_n, LOAD=load, EXP=exp, WS=ws, num_warps=num_warps,
        num_stages=num_stages, **({} if maxnreg is None else {"maxnreg": maxnreg}))
    return o, lse


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1.3b")
    ap.add_argument("--sparsity", type=float, default=0.875)
    args = ap.parse_args()
    # These experiments vary the plain loop (one selected tile per iteration), so compare against that, not the
    # tile-plan loops the kernels use since (BENCHMARKS.md, fourth session).
    bsa.PACK_PARTIAL_TILES = False
    triton.set_allocator(_alloc)
    shape = SHAPES[args.shape]
    layout = tile_layout(shape.grid, device="cuda")
    off = layout.tile_offsets_i32
    n = layout.num_tiles
    top_k = ref.top_k_from_sparsity(args.sparsity, n)
    q, k, v = make_inputs(shape, seed=4)
    c = coarse_stage(q, k, off, top_k)
    o_ref, lse_ref = bsa.bsa_fwd(q, k, v, c.q2k, c.q2k_cnt, off)
    dense_ms = bench_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
        *(x.transpose(1, 2) for x in (q, k, v))), device="cuda")
    shipped_ms = bench_ms(lambda: bsa.bsa_fwd(q, k, v, c.q2k, c.q2k_cnt, off), device="cuda")
    blocks = n * top_k * shape.heads
    flops = 4 * blocks * 64 * 64 * shape.head_dim
    print(f"# {shape.name}: dense SDPA (default backend) fwd {dense_ms:.3f} ms; shipped fine fwd {shipped_ms:.3f} ms "
          f"({flops / shipped_ms / 1e9:.0f} TFLOP/s)")
    print("| load | exp | block_n | warps | stages | maxnreg | ms | vs shipped | TFLOP/s | rel L2 out vs shipped | rel L2 lse |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    configs = [(0, 0, 64, 4, 3, None), (1, 0, 64, 4, 3, None), (1, 1, 64, 4, 3, None)]
    configs += [(1, 0, 32, 4, st, reg) for st in (2, 3, 4) for reg in (None, 168, 128)]
    configs += [(0, 0, 32, 4, 3, None), (0, 0, 32, 4, 3, 168), (1, 0, 64, 4, 2, 168), (0, 0, 64, 4, 3, None)]
    for ld, ex, bn, nw, ns, reg in configs:
        kw = dict(load=ld, exp=ex, ws=0, num_warps=nw, num_stages=ns, block_n=bn, maxnreg=reg)
        try:
            o, lse = run_variant(q, k, v, c.q2k, c.q2k_cnt, off, n, **kw)
            torch.cuda.synchronize()
            err, err_l = rel_l2(o, o_ref), rel_l2(lse, lse_ref)
            ms = bench_ms(lambda: run_variant(q, k, v, c.q2k, c.q2k_cnt, off, n, **kw), device="cuda")
            print(f"| {ld} | {ex} | {bn} | {nw} | {ns} | {reg} | {ms:.3f} | {shipped_ms / ms:.3f}x | "
                  f"{flops / ms / 1e9:.0f} | {err:.2e} | {err_l:.2e} |", flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on to the next variant
            print(f"| {ld} | {ex} | {bn} | {nw} | {ns} | {reg} | failed: {type(e).__name__}: "
                  f"{str(e).splitlines()[0][:120] if str(e) else ''} |||||", flush=True)
    again = bench_ms(lambda: bsa.bsa_fwd(q, k, v, c.q2k, c.q2k_cnt, off), device="cuda")
    print(f"# shipped fine fwd again at the end: {again:.3f} ms")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
