"""Experiment for the lent GPU (issue 3, not shipped): the block-sparse attention forward in Gluon for Hopper
(sm_90), with the softmax of one key tile running while the tensor cores do the previous tile's P V product.

Result (H200, 2026-11-29, Wan2.1-1.3B 480p shape, 87.5% sparsity, `python3 benchmarks/gluon_fwd.py 1.3b,5b`):
bitwise equal to the shipped Triton kernel, and no faster: 2.75 ms (2 K/V buffers: 3.01; Q in registers and
3 buffers: 2.67; 3 programs per SM via Q in registers, 2 buffers and maxnreg 168: 2.93) against the Triton
kernel's 2.70 ms (5B: 3.35 vs 3.30). See BENCHMARKS.md.

Same function and layout contract as `block_sparse_attn.bsa_fwd` (VSA paper, arXiv 2505.13389, sec. 2, fine stage;
online softmax as in FlashAttention-2). The difference is the schedule inside a program (one 4-warp warpgroup, one
64-row query tile), written out by hand as FlashAttention-3 does (Shah et al., arXiv 2407.08608, sec. 3.2,
"intra-warpgroup overlapping"), which Triton's own pipeliner does not produce for this loop:

    for each listed key tile j >= 1:
        wait for tile j's K / V (TMA, a ring of STAGES buffers filled ahead)
        issue S_j = Q K_j^T                     (async wgmma)
        issue O += P_{j-1} V_{j-1}              (async wgmma)
        wait for S_j only; softmax of S_j       (CUDA cores, while P_{j-1} V_{j-1} runs)
        wait for P_{j-1} V_{j-1}; refill its buffer with tile j-1+STAGES; rescale O

Tiles come by TMA from (B*S, H*D) descriptors in (64, D) boxes; a partial tile's box also covers the next tile's
first rows, which the score mask removes (as in `block_sparse_attn` with TMA loads). Needs: a CUDA device of compute
capability 9.x, bf16 / fp16, D in {64, 128} (`supported`).

Usage: python benchmarks/gluon_fwd.py [1.3b,5b]
"""

from __future__ import annotations

import sys

import torch

from vsagen.kernels.block_sparse_attn import _check_inputs, _tma_layout_ok

try:  # Gluon ships with Triton >= 3.5; the module imports (and reports unsupported) without it
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

BLOCK = 64  # tokens in a full (4, 4, 4) tile: the query and key tile rows
LOG2E = 1.4426950408889634
STAGES = 2  # K / V buffers in flight per program
Q_REG = False
MAXNREG = None


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether `bsa_fwd_gluon` can run on these (B, S, H, D) tensors: Gluon importable, a CUDA device of compute
    capability 9.x, bf16 / fp16, D 64 or 128, and the (B*S, H*D) TMA view (`block_sparse_attn._tma_layout_ok`)."""
    if not HAVE_GLUON or not q.is_cuda or q.shape[-1] not in (64, 128):
        return False
    if torch.cuda.get_device_capability(q.device)[0] != 9:
        return False
    return all(_tma_layout_ok(x) for x in (q, k, v))


if HAVE_GLUON:

    @gluon.jit
    def _key_tile(row_ptr, off_ptr, j):
        """Start row and token count of the j-th listed key tile."""
        kt = gl.load(row_ptr + j)
        start = gl.load(off_ptr + kt)
        return start, gl.load(off_ptr + kt + 1) - start

    @gluon.jit
    def _issue_kv(k_desc, v_desc, k_smem, v_smem, ready, row_ptr, off_ptr, j, cnt, row0, col0,
                  STAGES: gl.constexpr):
        """Start the TMA loads of listed key tile j into buffer j % STAGES (nothing when j >= cnt)."""
        pred = j < cnt
        jj = gl.maximum(gl.minimum(j, cnt - 1), 0)  # a valid entry (K >= 1) even when nothing is loaded
        kt = gl.load(row_ptr + jj)
        start = gl.load(off_ptr + kt)
        s = j % STAGES
        mbarrier.expect(ready.index(s), 2 * k_desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(k_desc, [row0 + start, col0], ready.index(s), k_smem.index(s), pred=pred)
        tma.async_copy_global_to_shared(v_desc, [row0 + start, col0], ready.index(s), v_smem.index(s), pred=pred)

    @gluon.jit
    def _bsa_fwd_gluon_kernel(
        q_desc, k_desc, v_desc, o_ptr, lse_ptr, q2k_ptr, cnt_ptr, off_ptr, q_ptr,
        seq_len, stride_qs, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
        stride_ib, stride_ih, stride_iq, stride_cb, stride_ch,
        num_heads, qk_scale,
        HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, Q_REG: gl.constexpr, num_warps: gl.constexpr,
    ):
        """One program: one query tile of one (batch, head) over the key tiles of its q2k row."""
        BLOCK_M: gl.constexpr = 64
        BLOCK_N: gl.constexpr = 64
        dtype: gl.constexpr = q_desc.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        col_o: gl.constexpr = gl.SliceLayout(0, o_layout)

        pid_t = gl.program_id(0)
        pid_bh = gl.program_id(1)
        b = pid_bh // num_heads
        h = pid_bh % num_heads
        q_start = gl.load(off_ptr + pid_t)
        q_len = gl.load(off_ptr + pid_t + 1) - q_start
        cnt = gl.load(cnt_ptr + b * stride_cb + h * stride_ch + pid_t)
        row_ptr = q2k_ptr + b * stride_ib + h * stride_ih + pid_t * stride_iq
        row0 = b * seq_len
        col0 = h * HEAD_DIM

        q_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)

        if Q_REG:  # Q straight into the registers of the Q K^T operand: no shared memory for it
            offs_qm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, q_layout))
            offs_qd = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, q_layout))
            q_op = gl.load(q_ptr + (row0 + q_start + offs_qm)[:, None] * stride_qs + col0 + offs_qd[None, :],
                           mask=(offs_qm < q_len)[:, None] & (offs_qd < HEAD_DIM)[None, :], other=0.0)
        else:
            q_op = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
            mbarrier.expect(q_bar, q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [row0 + q_start, col0], q_bar, q_op)
        for i in gl.static_range(STAGES):
            _issue_kv(k_desc, v_desc, k_smem, v_smem, ready, row_ptr, off_ptr, i, cnt, row0, col0, STAGES)

        offs_n = gl.arange(0, BLOCK_N, layout=col_s)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_s)
        acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
        s_init = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        p = gl.zeros([BLOCK_M, BLOCK_N], dtype, layout=p_layout)
        if not Q_REG:
            mbarrier.wait(q_bar, 0)

        if cnt > 0:  # tile 0: scores and softmax, no product in flight yet
            _, k_len = _key_tile(row_ptr, off_ptr, 0)
            mbarrier.wait(ready.index(0), 0)
            s = warpgroup_mma(q_op, k_smem.index(0).permute((1, 0)), s_init, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            s = gl.where((offs_n < k_len)[None, :], s * qk_scale, float("-inf"))
            m_i = gl.max(s, axis=1)
            pf = gl.exp2(s - m_i[:, None])
            l_i = gl.sum(pf, axis=1)
            p = gl.convert_layout(pf.to(dtype), p_layout)

        for j in range(1, cnt):
            _, k_len = _key_tile(row_ptr, off_ptr, j)
            st = j % STAGES
            sp = (j - 1) % STAGES
            mbarrier.wait(ready.index(st), (j // STAGES) & 1)
            s = warpgroup_mma(q_op, k_smem.index(st).permute((1, 0)), s_init, use_acc=False, is_async=True)
            acc = warpgroup_mma(p, v_smem.index(sp), acc, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
            s = gl.where((offs_n < k_len)[None, :], s * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            alpha = gl.exp2(m_i - m_new)
            pf = gl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + gl.sum(pf, axis=1)
            p_next = gl.convert_layout(pf.to(dtype), p_layout)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _issue_kv(k_desc, v_desc, k_smem, v_smem, ready, row_ptr, off_ptr, j - 1 + STAGES, cnt, row0, col0,
                      STAGES)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            m_i = m_new
            p = p_next

        if cnt > 0:  # the last tile's product
            acc = warpgroup_mma(p, v_smem.index((cnt - 1) % STAGES), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(i))

        empty = l_i == 0.0  # no selected tile: output 0, LSE -inf
        l_safe = gl.where(empty, 1.0, l_i)
        out = acc / gl.convert_layout(l_safe, row_o)[:, None]
        offs_mo = gl.arange(0, BLOCK_M, layout=row_o)
        offs_d = gl.arange(0, HEAD_DIM, layout=col_o)
        o_mask = (offs_mo < q_len)[:, None] & (offs_d < HEAD_DIM)[None, :]
        o_ptrs = o_ptr + b * stride_ob + h * stride_oh + (q_start + offs_mo)[:, None] * stride_os + offs_d[None, :]
        gl.store(o_ptrs, out.to(dtype), mask=o_mask)
        lse = gl.where(empty, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
        offs_ms = gl.arange(0, BLOCK_M, layout=row_s)
        gl.store(lse_ptr + b * stride_lb + h * stride_lh + q_start + offs_ms, lse, mask=offs_ms < q_len)


def bsa_fwd_gluon(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor, q2k_cnt: torch.Tensor,
                  tile_offsets: torch.Tensor, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The fine-stage forward with the hand-pipelined Gluon kernel (no autograd).

    Args and returns as `block_sparse_attn.bsa_fwd`: q, k, v (B, S, H, D) bf16 / fp16 in tile order; q2k
    (B, H, Q_TILES, K) int32 with K >= 1; q2k_cnt (B, H, Q_TILES) int32; tile_offsets (n_tiles + 1,) int32.
    Returns out (B, S, H, D) like q and lse (B, H, S) fp32 natural log (-inf on rows with no selected tile).

    Raises:
        ValueError: the inputs fail `supported` or `block_sparse_attn`'s input checks, or K == 0.
    """
    _check_inputs(q, k, v, q2k, q2k_cnt, tile_offsets)
    if not supported(q, k, v) or q2k.shape[-1] == 0:
        raise ValueError("bsa_fwd_gluon needs an sm_90 GPU, bf16 / fp16 q, k, v with D 64 or 128 in a "
                         "(B*S, H*D)-viewable layout, and K >= 1")
    b, s, h, d = q.shape
    n_tiles = tile_offsets.numel() - 1
    scale = d ** -0.5 if scale is None else scale
    el = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    layout = gl.NVMMASharedLayout.get_default_for([BLOCK, d], el)
    q_desc, k_desc, v_desc = (TensorDescriptor(x, [b * s, h * d], [x.stride(1), 1], [BLOCK, d], layout)
                              for x in (q, k, v))
    out = torch.empty_like(q)
    lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
    _bsa_fwd_gluon_kernel[(n_tiles, b * h)](
        q_desc, k_desc, v_desc, out, lse, q2k, q2k_cnt, tile_offsets, q,
        s, q.stride(1), out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1),
        q2k.stride(0), q2k.stride(1), q2k.stride(2), q2k_cnt.stride(0), q2k_cnt.stride(1),
        h, scale * LOG2E,
        HEAD_DIM=d, STAGES=STAGES, Q_REG=Q_REG, num_warps=4, **({} if MAXNREG is None else {"maxnreg": MAXNREG}),
    )
    return out, lse


def main(keys: str) -> None:
    """Check against the shipped Triton forward and time both at the given shapes."""
    from vsagen.bench import SHAPES, bench_ms, make_inputs, rel_l2
    from vsagen.kernels import block_sparse_attn as bsa
    from vsagen.kernels import reference as ref
    from vsagen.kernels.coarse import coarse_stage
    from vsagen.layout import tile_layout

    # These experiments vary the plain loop (one selected tile per iteration), so compare against that, not the
    # tile-plan loops the kernels use since (BENCHMARKS.md, fourth session).
    bsa.PACK_PARTIAL_TILES = False

    global STAGES, Q_REG, MAXNREG
    for key in keys.split(","):
        shape = SHAPES[key]
        layout = tile_layout(shape.grid, device="cuda")
        off = layout.tile_offsets_i32
        n = layout.num_tiles
        q, k, v = make_inputs(shape, seed=4)
        c = coarse_stage(q, k, off, ref.top_k_from_sparsity(0.875, n))
        o_ref, lse_ref = bsa.bsa_fwd(q, k, v, c.q2k, c.q2k_cnt, off)
        dense = bench_ms(lambda: torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v))))
        t_tri = bench_ms(lambda: bsa.bsa_fwd(q, k, v, c.q2k, c.q2k_cnt, off))
        flops = 4 * n * c.q2k.shape[-1] * shape.heads * 64 * 64 * shape.head_dim
        print(f"{key}: dense {dense:.3f} ms; triton fine {t_tri:.3f} ms ({flops/t_tri/1e9:.0f} TF/s)", flush=True)
        for stages, qreg, mr in ((3, False, None), (2, True, None), (2, True, 168), (3, True, None), (2, True, 160)):
            STAGES, Q_REG, MAXNREG = stages, qreg, mr
            try:
                o, lse = bsa_fwd_gluon(q, k, v, c.q2k, c.q2k_cnt, off)
                torch.cuda.synchronize()
                t = bench_ms(lambda: bsa_fwd_gluon(q, k, v, c.q2k, c.q2k_cnt, off))
                print(f"  gluon stages {stages} qreg {qreg} maxnreg {mr}: {t:.3f} ms ({flops/t/1e9:.0f} TF/s, {t_tri/t:.3f}x triton, dense/gluon {dense/t:.2f}x) "
                      f"out rel {rel_l2(o, o_ref):.2e} lse rel {rel_l2(lse, lse_ref):.2e} finite {bool(torch.isfinite(o).all())}", flush=True)
            except Exception as e:
                print(f"  gluon stages {stages} failed: {type(e).__name__}: {str(e)[:1500]}", flush=True)
        # partial counts and empty rows
        STAGES, Q_REG, MAXNREG = 2, True, 168
        cnt2 = c.q2k_cnt.clone(); cnt2[..., ::7] = 0; cnt2[..., 3::7] = 1
        o1, l1 = bsa.bsa_fwd(q, k, v, c.q2k, cnt2, off); o2, l2 = bsa_fwd_gluon(q, k, v, c.q2k, cnt2, off)
        fin = torch.isfinite(l1)
        print(f"  short/empty rows: out rel {rel_l2(o2, o1):.2e}, lse -inf agree {bool(torch.equal(fin, torch.isfinite(l2)))}, lse rel {rel_l2(l2[fin], l1[fin]):.2e}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "1.3b")
