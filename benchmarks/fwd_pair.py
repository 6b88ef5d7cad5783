"""Two experimental schedules of the 64-token fine-stage forward (issue 33 item 3), for the lent GPU (not a test).

The shipped forward (`kernels.bsa_forward._bsa_fwd_kernel`) runs one 64-row query tile per program: each iteration
is a dependent chain (Q K^T, wait, softmax, P V) that the H200 profile of 2026-11-29 found latency-bound. Here one
program takes two neighbouring query tiles (2p, 2p + 1), each with its own key list, and walks both lists in one loop:
the two tiles' chains are independent, so the compiler may issue the second tile's Q K^T while the first one's
softmax runs (what FlashAttention-3 gets from two ping-ponging consumer warpgroups, inside one program). The lists'
common length runs interleaved; the longer list's tail runs alone. The second, "kv2", keeps one query tile per
program and walks its list two entries per iteration: two independent Q K^T products, one softmax update over both
(half the running-max rescales per FLOP), two P V products. Plain lists only (no tile plans): every partial key tile is
masked in the scores, as the shipped kernel's unpacked loop does. Offline sm_90a compiles (triton 3.6): pair 255
registers (4 warps spill 4-24 bytes), 160 KB shared memory at 2 stages; kv2 234 / 211 registers (4 / 8 warps), no
spills, 147 KB at 2 stages: one program per SM for both.

Per shape (the 1.3B grid 21x30x52 with partial tiles, and the same cropped to whole tiles, 20x28x52), 4x4x4 tiles,
87.5% sparsity, random lists, bf16, D=128: the shipped forward (default tuning: TMA, tile plans where tiles are
partial) and both schedules at each `--launches` (num_warps x num_stages), each checked against the shipped output
(relative L2) and timed (`vsagen.bench.bench_ms`) beside dense SDPA cuDNN.

Usage: python benchmarks/fwd_pair.py [--interpret-check]   (the check alone, small shapes, under TRITON_INTERPRET=1)
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton
import triton.language as tl

from vsagen.bench import AttentionShape, bench_ms, make_inputs, rel_l2, sdpa
from vsagen.kernels.block_sparse_attn import block_sparse_attention
from vsagen.kernels.bsa_forward import _softmax_step
from vsagen.kernels.bsa_primitives import BLOCK, LOG2E, interpreting, load_listed_kv_tile, mm, tma_descs, use_tma
from vsagen.kernels.reference import top_k_from_sparsity
from vsagen.layout import tile_layout


@triton.jit
def _epilogue(acc, l_i, m_i, o_ptr, lse_ptr, rows, m_ok, offs_d, d_ok, o_off, l_off, stride_os):
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    tl.store(o_ptr + o_off + rows[:, None] * stride_os + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=m_ok[:, None] & d_ok[None, :])
    tl.store(lse_ptr + l_off + rows, lse, mask=m_ok)


@triton.jit
def _pair_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, q2k_ptr, cnt_ptr, off_ptr, k_desc, v_desc, seq_len,
                     n_tiles, num_heads, qk_scale,
                     stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                     stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ib, stride_ih, stride_iq,
                     stride_cb, stride_ch,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     DOT_FP32: tl.constexpr, IEEE: tl.constexpr, TMA: tl.constexpr, EVICT: tl.constexpr,
                     CACHE: tl.constexpr):  # EVICT / CACHE passed: triton 3.6 fails on a str default
    pid = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    ta = 2 * pid
    has_b = ta + 1 < n_tiles
    tb = tl.minimum(ta + 1, n_tiles - 1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    a_start = tl.load(off_ptr + ta)
    a_ok = offs_m < tl.load(off_ptr + ta + 1) - a_start
    b_start = tl.load(off_ptr + tb)
    b_ok = (offs_m < tl.load(off_ptr + tb + 1) - b_start) & has_b
    q_base = q_ptr + b * stride_qb + h * stride_qh
    qa = tl.load(q_base + (a_start + offs_m)[:, None] * stride_qs + offs_d[None, :], mask=a_ok[:, None] & d_ok[None, :],
                 other=0.0)
    qb = tl.load(q_base + (b_start + offs_m)[:, None] * stride_qs + offs_d[None, :], mask=b_ok[:, None] & d_ok[None, :],
                 other=0.0)
    if DOT_FP32:
        qa = qa.to(tl.float32)
        qb = qb.to(tl.float32)
    ma = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    la = tl.zeros([BLOCK_M], dtype=tl.float32)
    acca = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    mb = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    lb = tl.zeros([BLOCK_M], dtype=tl.float32)
    accb = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    cnt_row = cnt_ptr + b * stride_cb + h * stride_ch
    cnt_a = tl.load(cnt_row + ta)
    cnt_b = tl.load(cnt_row + tb, mask=has_b, other=0)  # (tl.where on scalars does not compile in triton 3.6)
    row_a = q2k_ptr + b * stride_ib + h * stride_ih + ta * stride_iq
    row_b = q2k_ptr + b * stride_ib + h * stride_ih + tb * stride_iq
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    row0 = b * seq_len
    col0 = h * HEAD_DIM
    for i in range(0, tl.minimum(cnt_a, cnt_b)):  # both tiles: two independent chains per iteration
        ka, va, na = load_listed_kv_tile(k_desc, v_desc, k_base, v_base, off_ptr, tl.load(row_a + i), row0, col0,
                                         stride_ks, stride_vs, offs_n, offs_d, d_ok, TMA, DOT_FP32, EVICT, CACHE)
        kb, vb, nb = load_listed_kv_tile(k_desc, v_desc, k_base, v_base, off_ptr, tl.load(row_b + i), row0, col0,
                                         stride_ks, stride_vs, offs_n, offs_d, d_ok, TMA, DOT_FP32, EVICT, CACHE)
        sa = mm(qa, tl.trans(ka), IEEE)
        sb = mm(qb, tl.trans(kb), IEEE)
        ma, la, acca = _softmax_step(sa, na, va, ma, la, acca, qk_scale, IEEE)
        mb, lb, accb = _softmax_step(sb, nb, vb, mb, lb, accb, qk_scale, IEEE)
    for i in range(tl.minimum(cnt_a, cnt_b), cnt_a):  # tails
        ka, va, na = load_listed_kv_tile(k_desc, v_desc, k_base, v_base, off_ptr, tl.load(row_a + i), row0, col0,
                                         stride_ks, stride_vs, offs_n, offs_d, d_ok, TMA, DOT_FP32, EVICT, CACHE)
        ma, la, acca = _softmax_step(mm(qa, tl.trans(ka), IEEE), na, va, ma, la, acca, qk_scale, IEEE)
    for i in range(tl.minimum(cnt_a, cnt_b), cnt_b):
        kb, vb, nb = load_listed_kv_tile(k_desc, v_desc, k_base, v_base, off_ptr, tl.load(row_b + i), row0, col0,
                                         stride_ks, stride_vs, offs_n, offs_d, d_ok, TMA, DOT_FP32, EVICT, CACHE)
        mb, lb, accb = _softmax_step(mm(qb, tl.trans(kb), IEEE), nb, vb, mb, lb, accb, qk_scale, IEEE)
    o_off = b * stride_ob + h * stride_oh
    l_off = b * stride_lb + h * stride_lh
    _epilogue(acca, la, ma, o_ptr, lse_ptr, a_start + offs_m, a_ok, offs_d, d_ok, o_off, l_off, stride_os)
    _epilogue(accb, lb, mb, o_ptr, lse_ptr, b_start + offs_m, b_ok, offs_d, d_ok, o_off, l_off, stride_os)


@triton.jit
def _kv2_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, q2k_ptr, cnt_ptr, off_ptr, k_desc, v_desc, seq_len,
                    n_tiles, num_heads, qk_scale,
                    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                    stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ib, stride_ih, stride_iq,
                    stride_cb, stride_ch,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    DOT_FP32: tl.constexpr, IEEE: tl.constexpr, TMA: tl.constexpr, EVICT: tl.constexpr,
                    CACHE: tl.constexpr):
    """One query tile per program, its key list walked two entries per iteration: two independent Q K^T products,
    one softmax update over both (half the rescales per FLOP), two P V products; an odd list's last entry alone."""
    t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    start = tl.load(off_ptr + t)
    m_ok = offs_m < tl.load(off_ptr + t + 1) - start
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + (start + offs_m)[:, None] * stride_qs + offs_d[None, :],
                mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    cnt = tl.load(cnt_ptr + b * stride_cb + h * stride_ch + t)
    row = q2k_ptr + b * stride_ib + h * stride_ih + t * stride_iq
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    row0 = b * seq_len
    col0 = h * HEAD_DIM
    for i in range(0, cnt // 2):
        k1, v1, n1 = load_listed_kv_tile(k_desc, v_desc, k_base, v_base, off_ptr, tl.load(row + 2 * i), row0, col0,
                                         stride_ks, stride_vs, offs_n, offs_d, d_ok, TMA, DOT_FP32, EVICT, CACHE)
        k2, v2, n2 = load_listed_kv_tile(k_desc, v_desc, k_base, v_base, off_ptr, tl.load(row + 2 * i + 1), row0,
                                         col0, stride_ks, stride_vs, offs_n, offs_d, d_ok, TMA, DOT_FP32, EVICT, CACHE)
        s1 = tl.where(n1[None, :], mm(q, tl.trans(k1), IEEE) * qk_scale, float("-inf"))
        s2 = tl.where(n2[None, :], mm(q, tl.trans(k2), IEEE) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.maximum(tl.max(s1, 1), tl.max(s2, 1)))
        alpha = tl.exp2(m_i - m_new)
        p1 = tl.exp2(s1 - m_new[:, None])
        p2 = tl.exp2(s2 - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p1, 1) + tl.sum(p2, 1)
        acc = acc * alpha[:, None]
        if IEEE:
            acc = tl.dot(p1.to(v1.dtype), v1, acc, input_precision="ieee")
            acc = tl.dot(p2.to(v2.dtype), v2, acc, input_precision="ieee")
        else:
            acc = tl.dot(p1.to(v1.dtype), v1, acc)
            acc = tl.dot(p2.to(v2.dtype), v2, acc)
        m_i = m_new
    if cnt % 2 == 1:
        k1, v1, n1 = load_listed_kv_tile(k_desc, v_desc, k_base, v_base, off_ptr, tl.load(row + cnt - 1), row0, col0,
                                         stride_ks, stride_vs, offs_n, offs_d, d_ok, TMA, DOT_FP32, EVICT, CACHE)
        m_i, l_i, acc = _softmax_step(mm(q, tl.trans(k1), IEEE), n1, v1, m_i, l_i, acc, qk_scale, IEEE)
    _epilogue(acc, l_i, m_i, o_ptr, lse_ptr, start + offs_m, m_ok, offs_d, d_ok, b * stride_ob + h * stride_oh,
              b * stride_lb + h * stride_lh, stride_os)


def _launch(kernel, programs, q, k, v, q2k, cnt, offsets, num_warps, num_stages, tma):
    """(out, lse) of `kernel` over grid (programs, B * H); inputs as `block_sparse_attention`."""
    b, s, h, d = q.shape
    out = torch.empty_like(q)
    lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
    tma = use_tma(k, v, wanted=tma)
    k_desc, v_desc = tma_descs(tma, k, v)
    interp = interpreting()
    q2k = q2k.contiguous()
    kernel[(programs, b * h)](
        q, k, v, out, lse, q2k, cnt, offsets, k_desc, v_desc, s, offsets.numel() - 1, h, d ** -0.5 * LOG2E,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3], lse.stride(0), lse.stride(1),
        q2k.stride(0), q2k.stride(1), q2k.stride(2), cnt.stride(0), cnt.stride(1),
        HEAD_DIM=d, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_M=BLOCK, BLOCK_N=BLOCK,
        DOT_FP32=interp, IEEE=(q.dtype == torch.float32 or interp), TMA=tma, EVICT="", CACHE="", num_warps=num_warps,
        num_stages=num_stages)
    return out, lse


def kv2_fwd(q, k, v, q2k, cnt, offsets, num_warps=4, num_stages=2, tma=True):
    """(out, lse) of the two-key-tiles-per-iteration schedule (one program per query tile)."""
    return _launch(_kv2_fwd_kernel, offsets.numel() - 1, q, k, v, q2k, cnt, offsets, num_warps, num_stages, tma)


def pair_fwd(q, k, v, q2k, cnt, offsets, num_warps=4, num_stages=2, tma=True):
    """(out, lse) of the pair schedule (one program per two query tiles)."""
    return _launch(_pair_fwd_kernel, offsets.numel() // 2, q, k, v, q2k, cnt, offsets, num_warps, num_stages, tma)


def random_lists(b, h, n, top_k, device, seed, ragged=False):
    g = torch.Generator(device=device).manual_seed(seed)
    q2k = torch.rand(b, h, n, n, generator=g, device=device).argsort(-1)[..., :top_k].sort(-1).values.to(torch.int32)
    cnt = (torch.randint(1, top_k + 1, (b, h, n), generator=g, device=device, dtype=torch.int32) if ragged
           else torch.full((b, h, n), top_k, dtype=torch.int32, device=device))
    return q2k, cnt


def interpret_check() -> int:
    """Small shapes on the CPU under TRITON_INTERPRET=1: pair kernel vs the shipped forward (fp32)."""
    worst = 0.0
    cases = (((3, 5, 9), 2, 2, True), ((4, 4, 8), 1, 1, False), ((3, 9, 4), 3, 1, True), ((4, 4, 12), 1, 2, True),
             ((8, 7, 12), 2, 1, True), ((8, 8, 8), 1, 1, False))
    for grid, heads, batch, ragged in cases:
        lay = tile_layout(grid, (4, 4, 4))
        g = torch.Generator().manual_seed(sum(grid))
        q, k, v = (torch.randn(batch, lay.num_tokens, heads, 32, generator=g) for _ in range(3))
        q2k, cnt = random_lists(batch, heads, lay.num_tiles, max(1, lay.num_tiles // 2), "cpu", 1, ragged)
        want, want_lse = block_sparse_attention(q, k, v, q2k, cnt, lay.tile_offsets_i32)
        for name, run in (("pair", pair_fwd), ("kv2", kv2_fwd)):
            got, lse = run(q, k, v, q2k, cnt, lay.tile_offsets_i32, tma=False)
            worst = max(worst, rel_l2(got, want), rel_l2(lse, want_lse))
            print(f"{name} grid {grid} tiles {lay.num_tiles} batch {batch} heads {heads}: out {rel_l2(got, want):.1e} "
                  f"lse {rel_l2(lse, want_lse):.1e}")
    return 0 if worst < 1e-5 else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interpret-check", action="store_true")
    ap.add_argument("--sparsity", type=float, default=0.875)
    ap.add_argument("--launches", default="4x1,4x2,4x3,8x1,8x2,8x3", help="num_warps x num_stages, comma list")
    args = ap.parse_args(argv)
    launches = [tuple(int(x) for x in item.split("x")) for item in args.launches.split(",")]
    if args.interpret_check:
        return interpret_check()
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    print(f"{'grid':10} {'kernel':22} {'fwd ms':>8} {'x cuDNN':>8} {'rel L2':>8}")
    for grid in ((21, 30, 52), (20, 28, 52)):
        shape = AttentionShape("1.3b", grid, 12)
        q, k, v = make_inputs(shape, seed=0, device=device)
        lay = tile_layout(grid, (4, 4, 4), device)
        q2k, cnt = random_lists(1, 12, lay.num_tiles, top_k_from_sparsity(args.sparsity, lay.num_tiles), device, 0)
        dense = bench_ms(lambda: sdpa(q, k, v, torch.nn.attention.SDPBackend.CUDNN_ATTENTION), device=device)
        want = block_sparse_attention(q, k, v, q2k, cnt, lay.tile_offsets_i32)[0]
        name = "x".join(map(str, grid))
        shipped = bench_ms(lambda: block_sparse_attention(q, k, v, q2k, cnt, lay.tile_offsets_i32), device=device)
        print(f"{name:10} {'shipped':22} {shipped:8.3f} {dense / shipped:8.2f} {0.0:8.1e}", flush=True)
        for kind, run in (("pair", pair_fwd), ("kv2", kv2_fwd)):
            for warps, stages in launches:
                try:
                    got = run(q, k, v, q2k, cnt, lay.tile_offsets_i32, warps, stages)[0]
                    ms = bench_ms(lambda: run(q, k, v, q2k, cnt, lay.tile_offsets_i32, warps, stages), device=device)
                    print(f"{name:10} {f'{kind} w{warps} s{stages}':22} {ms:8.3f} {dense / ms:8.2f} "
                          f"{rel_l2(got, want):8.1e}", flush=True)
                except Exception as exc:  # noqa: BLE001 - a launch that does not compile is a result too
                    print(f"{name:10} {kind} w{warps} s{stages}: {type(exc).__name__}: {str(exc)[-300:]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
