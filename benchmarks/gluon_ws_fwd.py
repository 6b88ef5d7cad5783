"""Experiment for the lent GPU (issue 33 item 3, not shipped): the 64-token fine-stage forward as a warp-specialized
Gluon kernel for Hopper (sm_90): producer warps that only issue the K / V TMA loads into a ring of buffers, and
consumer warpgroups that only compute, optionally two consumers per CTA whose matrix products alternate
("ping-pong", FlashAttention-3, Shah et al., arXiv 2407.08608, sec. 3.1: one warpgroup's softmax runs while the
other's products are on the tensor cores).

Why: Nsight Compute on the shipped Triton forward (BENCHMARKS.md, 2026-12-05 fourth session) shows the tensor pipe
active 48.9% of the time, against 80.5% for FlashAttention-4's warp-specialized kernel on the same lists; the two
Triton programs per SM interleave by chance, not by schedule. Earlier attempts that kept one role per warp (the
FlashAttention-3 intra-warpgroup overlap in Gluon, two query tiles or two key tiles per program in Triton) did not
gain; Triton's automatic warp specialization does not compile this loop.

Variants (`--variants`, each `NCONS:STAGES:PINGPONG`):
  1:S:0   one consumer warpgroup and one producer warp per CTA (two CTAs per SM where shared memory allows),
          S K / V buffers per consumer;
  2:S:P   two consumer warpgroups per CTA, one query tile each (tiles 2t and 2t + 1, each with its own key list
          and its own producer warp and ring of S buffers); P = 1 makes their Q K^T / P V issues alternate;
  2:S:P:s the same two consumers on two kernel tiles of one 128 / 256-token cube, which share the cube's key list:
          one producer warp loads each K / V tile once into one ring both read (FlashAttention-3's CTA, on VSA's
          partial cubes without padding; a cube's lone kernel tile leaves the second consumer's stores masked).
Each consumer runs the FlashAttention-3 intra-warpgroup order of the retired `gluon_fwd.py` (commit 2ff0614): issue
S_j = Q K_j^T and O += P_{j-1} V_{j-1}, wait for S_j only, softmax, wait for the product, release its buffer.

Same function and layout contract as `bsa_forward.bsa_fwd` (VSA paper, arXiv 2505.13389, sec. 2, fine stage; online
softmax as in FlashAttention-2): q, k, v (B, S, H, D) bf16 / fp16 in tile order, D 64 or 128, tiles of at most 64
tokens; a partial tile's TMA box also covers the next tile's first rows, which the score mask removes.

Usage (on the GPU, from the repository root): python3 benchmarks/gluon_ws_fwd.py [--shapes 1.3b]
    [--grids partial,whole] [--tiles 4x4x4,4x4x8,4x8x8] [--variants 1:2:0,...,2:4:1:s] [--compile-only]
Each tile volume on the shape's grid (and with `whole` on that grid rounded up to whole 4x8x8 cubes); cube lists
from vsagen's coarse stage at 87.5% sparsity, expanded to kernel tiles; dense SDPA and the shipped Triton forward
timed first, then each variant in a process of its own (a hang or a broken CUDA context ends only that one, after
`--timeout` seconds), checked against the shipped forward on the same lists (and on lists with empty and
one-cube rows) before it is timed.
`--compile-only` compiles every variant for sm_90a on any machine (Triton 3.6's Gluon) and prints registers and
shared memory, without a GPU. `benchmarks/ws_protocol.py` replays the barrier protocol of these loops on the CPU
(deadlocks, buffers read before they land or overwritten while read, ping-pong order); keep the two in step.
"""

from __future__ import annotations

import argparse
import sys

try:  # Gluon ships with Triton >= 3.5
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

BLOCK = 64  # tokens of a kernel tile: the query and key tile rows
LOG2E = 1.4426950408889634


if HAVE_GLUON:

    @gluon.jit
    def _tile(off_ptr, t):
        """Start row and token count of tile t."""
        start = gl.load(off_ptr + t)
        return start, gl.load(off_ptr + t + 1) - start

    @gluon.jit
    def _query_tile(work_first_ptr, work_count_ptr, q2k_cnt_ptr, b, h, stride_cb, stride_ch, SHARED: gl.constexpr,
                    CI: gl.constexpr):
        """Consumer CI's (query tile, the tile whose key list it walks, that list's length, whether its tile exists)
        in this CTA's work item (`work_items`). Without SHARED a consumer past the item's tiles walks nothing; with
        SHARED it walks the item's one list on its first tile again (its stores masked): both release every buffer."""
        w = gl.program_id(0)
        first = gl.load(work_first_ptr + w)
        valid = CI < gl.load(work_count_ptr + w)
        qt = gl.where(valid, first + CI, first)
        if SHARED:
            lt = first
        else:
            lt = qt
        cnt = gl.load(q2k_cnt_ptr + b * stride_cb + h * stride_ch + lt)
        if not SHARED:
            cnt = gl.where(valid, cnt, 0)
        return qt, lt, cnt, valid

    @gluon.jit
    def _producer(args, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr, SHARED: gl.constexpr,
                  CI: gl.constexpr):
        """Consumer CI's loads: its Q tile, then the K / V tiles of its q2k row into its ring (one warp)."""
        (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty, turn,
         o_ptr, lse_ptr, q2k_ptr, cnt_ptr, off_ptr, work_first, work_count, seq_len, num_heads,
         stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ib, stride_ih, stride_iq, stride_cb, stride_ch,
         qk_scale) = args
        pid_bh = gl.program_id(1)
        b = pid_bh // num_heads
        h = pid_bh % num_heads
        qt, lt, cnt, valid = _query_tile(work_first, work_count, cnt_ptr, b, h, stride_cb, stride_ch, SHARED, CI)
        row0 = b * seq_len
        col0 = h * HEAD_DIM
        if SHARED:  # the one producer loads both consumers' Q tiles (an absent second tile: the first again)
            for c in gl.static_range(2):
                qt_c, _lt, _cnt, _valid = _query_tile(work_first, work_count, cnt_ptr, b, h, stride_cb, stride_ch,
                                                      SHARED, c)
                mbarrier.expect(q_bar.index(c), q_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(q_desc, [row0 + gl.load(off_ptr + qt_c), col0], q_bar.index(c),
                                                q_smem.index(c))
        else:
            q_start = gl.load(off_ptr + qt)
            mbarrier.expect(q_bar.index(CI), q_desc.block_type.nbytes, pred=valid)
            tma.async_copy_global_to_shared(q_desc, [row0 + q_start, col0], q_bar.index(CI), q_smem.index(CI),
                                            pred=valid)
        row_ptr = q2k_ptr + b * stride_ib + h * stride_ih + lt * stride_iq
        RING: gl.constexpr = CI * (1 - SHARED)  # SHARED: one ring for both consumers
        for j in range(cnt):
            s = j % STAGES
            slot = RING * STAGES + s
            mbarrier.wait(empty.index(slot), ((j // STAGES) & 1) ^ 1)  # a fresh barrier passes phase 1
            start = gl.load(off_ptr + gl.load(row_ptr + j))
            mbarrier.expect(ready.index(slot), 2 * k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [row0 + start, col0], ready.index(slot), k_smem.index(slot))
            tma.async_copy_global_to_shared(v_desc, [row0 + start, col0], ready.index(slot), v_smem.index(slot))

    @gluon.jit
    def _consumer(args, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr, SHARED: gl.constexpr,
                  CI: gl.constexpr):
        """Consumer CI (one warpgroup): attention of its query tile over its ring's key tiles; stores O and LSE."""
        (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty, turn,
         o_ptr, lse_ptr, q2k_ptr, cnt_ptr, off_ptr, work_first, work_count, seq_len, num_heads,
         stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ib, stride_ih, stride_iq, stride_cb, stride_ch,
         qk_scale) = args
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

        pid_bh = gl.program_id(1)
        b = pid_bh // num_heads
        h = pid_bh % num_heads
        qt, lt, cnt, valid = _query_tile(work_first, work_count, cnt_ptr, b, h, stride_cb, stride_ch, SHARED, CI)
        RING: gl.constexpr = CI * (1 - SHARED)  # SHARED: one ring for both consumers
        # ping-pong: each consumer has cnt + 1 issue events (scores of tile 0; scores of tile j with the product of
        # tile j - 1; the last product), none without tiles. Consumer 0 goes first: before its event j >= 1 it waits
        # for consumer 1's event j - 1, and consumer 1 before its event j for consumer 0's event j; each arrives on
        # the other's barrier after issuing. A consumer whose events ran out is no longer waited for.
        events_other = 0
        if PINGPONG:
            _o, _l, cnt_other, _v = _query_tile(work_first, work_count, cnt_ptr, b, h, stride_cb, stride_ch, SHARED,
                                                1 - CI)
            events_other = gl.where(cnt_other > 0, cnt_other + 1, 0)
        q_start, q_len = _tile(off_ptr, qt)
        row_ptr = q2k_ptr + b * stride_ib + h * stride_ih + lt * stride_iq
        q_op = q_smem.index(CI)

        offs_n = gl.arange(0, BLOCK_N, layout=col_s)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_s)
        acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
        s_init = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        p = gl.zeros([BLOCK_M, BLOCK_N], dtype, layout=p_layout)
        mbarrier.wait(q_bar.index(CI), 0, pred=valid | (SHARED != 0))

        if cnt > 0:  # event 0: scores and softmax of tile 0, no product in flight yet
            if PINGPONG:
                if CI == 1:
                    mbarrier.wait(turn.index(1), 0, pred=events_other > 0)
            _, k_len = _tile(off_ptr, gl.load(row_ptr))
            st = RING * STAGES
            mbarrier.wait(ready.index(st), 0)
            s = warpgroup_mma(q_op, k_smem.index(st).permute((1, 0)), s_init, use_acc=False, is_async=True)
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - CI), count=1)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            s = gl.where((offs_n < k_len)[None, :], s * qk_scale, float("-inf"))
            m_i = gl.max(s, axis=1)
            pf = gl.exp2(s - m_i[:, None])
            l_i = gl.sum(pf, axis=1)
            p = gl.convert_layout(pf.to(dtype), p_layout)

        for j in range(1, cnt):  # event j: scores of tile j while the product of tile j - 1 runs
            if PINGPONG:
                if CI == 0:
                    mbarrier.wait(turn.index(0), (j - 1) & 1, pred=j - 1 < events_other)
                else:
                    mbarrier.wait(turn.index(1), j & 1, pred=j < events_other)
            _, k_len = _tile(off_ptr, gl.load(row_ptr + j))
            st = RING * STAGES + j % STAGES
            sp = RING * STAGES + (j - 1) % STAGES
            mbarrier.wait(ready.index(st), (j // STAGES) & 1)
            s = warpgroup_mma(q_op, k_smem.index(st).permute((1, 0)), s_init, use_acc=False, is_async=True)
            acc = warpgroup_mma(p, v_smem.index(sp), acc, is_async=True)
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - CI), count=1)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
            s = gl.where((offs_n < k_len)[None, :], s * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            alpha = gl.exp2(m_i - m_new)
            pf = gl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + gl.sum(pf, axis=1)
            p_next = gl.convert_layout(pf.to(dtype), p_layout)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(empty.index(sp), count=1)  # tile j - 1's K and V are read: the producer refills it
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            m_i = m_new
            p = p_next

        if cnt > 0:  # event cnt: the last tile's product
            if PINGPONG:
                if CI == 0:
                    mbarrier.wait(turn.index(0), (cnt - 1) & 1, pred=cnt - 1 < events_other)
                else:
                    mbarrier.wait(turn.index(1), cnt & 1, pred=cnt < events_other)
            sp = RING * STAGES + (cnt - 1) % STAGES
            acc = warpgroup_mma(p, v_smem.index(sp), acc, is_async=True)
            if PINGPONG:
                mbarrier.arrive(turn.index(1 - CI), count=1)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(empty.index(sp), count=1)

        empty_row = l_i == 0.0  # no selected tile: output 0, LSE -inf
        l_safe = gl.where(empty_row, 1.0, l_i)
        out = acc / gl.convert_layout(l_safe, row_o)[:, None]
        offs_mo = gl.arange(0, BLOCK_M, layout=row_o)
        offs_d = gl.arange(0, HEAD_DIM, layout=col_o)
        o_mask = ((offs_mo < q_len) & valid)[:, None] & (offs_d < HEAD_DIM)[None, :]
        o_ptrs = o_ptr + b * stride_ob + h * stride_oh + (q_start + offs_mo)[:, None] * stride_os + offs_d[None, :]
        gl.store(o_ptrs, out.to(dtype), mask=o_mask)
        lse = gl.where(empty_row, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
        offs_ms = gl.arange(0, BLOCK_M, layout=row_s)
        gl.store(lse_ptr + b * stride_lb + h * stride_lh + q_start + offs_ms, lse, mask=(offs_ms < q_len) & valid)

    @gluon.jit
    def _ws_fwd_kernel(
        q_desc, k_desc, v_desc, o_ptr, lse_ptr, q2k_ptr, cnt_ptr, off_ptr, work_first, work_count,
        seq_len, num_heads, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
        stride_ib, stride_ih, stride_iq, stride_cb, stride_ch, qk_scale,
        HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, NCONS: gl.constexpr, PINGPONG: gl.constexpr,
        SHARED: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
    ):
        """One CTA: the work item program_id(0) (up to NCONS query tiles, `work_items`) of one (batch, head)."""
        dtype: gl.constexpr = q_desc.dtype
        RINGS: gl.constexpr = NCONS - SHARED * (NCONS - 1)
        q_smem = gl.allocate_shared_memory(dtype, [NCONS, 64, HEAD_DIM], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [RINGS * STAGES, 64, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [RINGS * STAGES, 64, HEAD_DIM], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [NCONS, 1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [RINGS * STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [RINGS * STAGES, 1], mbarrier.MBarrierLayout())
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NCONS):
            mbarrier.init(q_bar.index(i), count=1)
        for i in gl.static_range(RINGS * STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1 + SHARED)  # SHARED: both consumers release a buffer
        for i in gl.static_range(2):
            mbarrier.init(turn.index(i), count=1)
        args = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty, turn,
                o_ptr, lse_ptr, q2k_ptr, cnt_ptr, off_ptr, work_first, work_count, seq_len, num_heads,
                stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ib, stride_ih, stride_iq, stride_cb,
                stride_ch, qk_scale)
        # each partition's argument tuple is written out in the call: a tuple assigned to a variable first turns its
        # constexprs into tensors (triton 3.6), and the layouts need HEAD_DIM as a constexpr
        if NCONS == 1:
            gl.warp_specialize([(_consumer, (args, HEAD_DIM, STAGES, PINGPONG, SHARED, 0)),
                                (_producer, (args, HEAD_DIM, STAGES, PINGPONG, SHARED, 0))], [1], [24])
        elif SHARED:
            gl.warp_specialize([(_consumer, (args, HEAD_DIM, STAGES, PINGPONG, SHARED, 0)),
                                (_consumer, (args, HEAD_DIM, STAGES, PINGPONG, SHARED, 1)),
                                (_producer, (args, HEAD_DIM, STAGES, PINGPONG, SHARED, 0))],
                               [4, 1], [CONSUMER_REGS, 24])
        else:
            gl.warp_specialize([(_consumer, (args, HEAD_DIM, STAGES, PINGPONG, SHARED, 0)),
                                (_consumer, (args, HEAD_DIM, STAGES, PINGPONG, SHARED, 1)),
                                (_producer, (args, HEAD_DIM, STAGES, PINGPONG, SHARED, 0)),
                                (_producer, (args, HEAD_DIM, STAGES, PINGPONG, SHARED, 1))],
                               [4, 1, 1], [CONSUMER_REGS, 24, 24])


def _variant(text: str) -> tuple[int, int, int, int]:
    """`NCONS:STAGES:PINGPONG[:s]` -> (ncons, stages, pingpong, shared)."""
    parts = text.split(":")
    shared = int(len(parts) == 4 and parts[3] == "s")
    try:
        ncons, stages, ping = (int(x) for x in parts[:3])
    except ValueError:
        ncons = 0
    if (len(parts) not in (3, 4) or (len(parts) == 4 and not shared) or ncons not in (1, 2) or stages < 2
            or ping not in (0, 1) or ((ping or shared) and ncons == 1)):
        raise argparse.ArgumentTypeError(f"variant {text!r}: NCONS:STAGES:PINGPONG[:s], NCONS 1 or 2, STAGES >= 2 "
                                         "(event j reads tiles j and j - 1: `ws_protocol.py`), ping-pong and s "
                                         "(both consumers on one key list) need NCONS 2")
    return ncons, stages, ping, shared


def _launch_options(ncons: int) -> dict:
    """Warps and the launch register cap: one consumer + a producer warp -> 8 warps (two warpgroups), two CTAs per
    SM (128 registers a thread at launch); two consumers + producer warps -> 12 warps, one CTA (168)."""
    return {"num_warps": 4, "maxnreg": 128 if ncons == 1 else 168}


def work_items(n_tiles: int, ncons: int, cube_first=None, cube_count=None, device="cuda"):
    """(first tile, tile count) int32 per CTA: one tile each (ncons 1); two consecutive tiles (ncons 2); with the
    cubes' kernel tiles (`TileLayout.tile_kernel_first` / `tile_kernel_count`), the kernel tiles of each cube in
    pairs, which share the cube's key list (the shared variant)."""
    import torch

    if cube_first is None:
        first = torch.arange(0, n_tiles, ncons, dtype=torch.int32)
        count = torch.clamp(n_tiles - first, max=ncons)
    else:
        pairs = [(int(f) + i, min(2, int(c) - i)) for f, c in zip(cube_first.tolist(), cube_count.tolist())
                 for i in range(0, int(c), 2)]
        first = torch.tensor([p[0] for p in pairs], dtype=torch.int32)
        count = torch.tensor([p[1] for p in pairs], dtype=torch.int32)
    return first.to(device), count.to(torch.int32).to(device)


def ws_fwd(q, k, v, q2k, q2k_cnt, tile_offsets, variant, items, scale=None):
    """The fine-stage forward with the warp-specialized Gluon kernel (no autograd); contract of `bsa_fwd`.

    Args:
        q, k, v: (B, S, H, D) bf16 / fp16 CUDA tensors in tile order, (B*S, H*D)-viewable, D 64 or 128.
        q2k: (B, H, Q_TILES, K) int32, K >= 1; q2k_cnt (B, H, Q_TILES) int32; tile_offsets (n_tiles + 1,) int32
            (kernel tiles of at most 64 tokens).
        variant: (NCONS, STAGES, PINGPONG, SHARED) as in the module docstring.
        items: `work_items` for this variant (shared: from the cubes, whose kernel tiles have equal lists).
        scale: softmax scale, default 1/sqrt(D).

    Returns:
        out (B, S, H, D) like q; lse (B, H, S) fp32 natural log (-inf on rows with no selected tile).
    """
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    ncons, stages, ping, shared = variant
    b, s, h, d = q.shape
    scale = d ** -0.5 if scale is None else scale
    el = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    layout = gl.NVMMASharedLayout.get_default_for([BLOCK, d], el)
    q_desc, k_desc, v_desc = (TensorDescriptor(x, [b * s, h * d], [x.stride(1), 1], [BLOCK, d], layout)
                              for x in (q, k, v))
    out = torch.empty_like(q)
    lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
    first, count = items
    _ws_fwd_kernel[(first.numel(), b * h)](
        q_desc, k_desc, v_desc, out, lse, q2k, q2k_cnt, tile_offsets, first, count,
        s, h, out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1),
        q2k.stride(0), q2k.stride(1), q2k.stride(2), q2k_cnt.stride(0), q2k_cnt.stride(1), scale * LOG2E,
        HEAD_DIM=d, STAGES=stages, NCONS=ncons, PINGPONG=ping, SHARED=shared, CONSUMER_REGS=240,
        **_launch_options(ncons))
    return out, lse


def _resource_usage(cubin: bytes) -> str:
    """Registers, spill stores / loads of a cubin (`cuobjdump --dump-resource-usage` of Triton's bundled tools)."""
    import os
    import re
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", text)
    return f"REG {m.group(1)} STACK {m.group(2)} LOCAL {m.group(4)}" if m else text.strip()[-200:]


def compile_only(variants, head_dim: int = 128) -> None:
    """Compile each variant for sm_90a without a GPU and print its registers, shared memory and warps."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    layout = gl.NVMMASharedLayout.get_default_for([BLOCK, head_dim], gl.bfloat16)
    x = torch.empty(640, 2 * head_dim, dtype=torch.bfloat16)
    desc = mangle_type(TensorDescriptor(x, [640, 2 * head_dim], [2 * head_dim, 1], [BLOCK, head_dim], layout))
    print("descriptor type:", desc)
    names = ["q_desc", "k_desc", "v_desc", "o_ptr", "lse_ptr", "q2k_ptr", "cnt_ptr", "off_ptr", "work_first",
             "work_count", "seq_len", "num_heads", "stride_ob", "stride_os", "stride_oh", "stride_lb", "stride_lh",
             "stride_ib", "stride_ih", "stride_iq", "stride_cb", "stride_ch", "qk_scale"]
    types = [desc, desc, desc, "*bf16", "*fp32", "*i32", "*i32", "*i32", "*i32", "*i32"] + ["i32"] * 12 + ["fp32"]
    for var in variants:
        ncons, stages, ping, shared = var
        sig = dict(zip(names, types))
        consts = {"HEAD_DIM": head_dim, "STAGES": stages, "NCONS": ncons, "PINGPONG": ping, "SHARED": shared,
                  "CONSUMER_REGS": 240, "num_warps": 4}
        sig.update({k: "constexpr" for k in consts})
        params = [p.name for p in _ws_fwd_kernel.params]
        src = GluonASTSource(_ws_fwd_kernel, sig, {(params.index(k),): v for k, v in consts.items()})
        name = _variant_text(var)
        try:
            c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=_launch_options(ncons))
            print(f"variant {name}: compiled, {c.metadata.num_warps} warps, shared {c.metadata.shared} B; "
                  f"{_resource_usage(c.asm['cubin'])}", flush=True)
        except Exception as e:  # report every variant
            print(f"variant {name}: failed: {type(e).__name__}: {str(e)[-3000:]}", flush=True)


def _variant_text(var) -> str:
    return ":".join(map(str, var[:3])) + (":s" if var[3] else "")


def _grids(base, names: str):
    """The shape's grid ("partial", as the model has it) and / or that grid rounded up to whole 4x8x8 cubes."""
    from vsagen.bench import AttentionShape

    out = []
    for name in names.split(","):
        if name == "partial":
            out.append(base)
        elif name == "whole":
            grid = tuple(-(-g // m) * m for g, m in zip(base.grid, (4, 8, 8)))
            out.append(AttentionShape(base.name + " whole 4x8x8 cubes", grid, base.heads, base.head_dim))
        else:
            raise SystemExit(f"--grids: partial and / or whole, got {name!r}")
    return out


def _setups(a):
    """Per (shape, grid, tile): the inputs, the kernel-tile lists (and the short ones) and the shipped outputs."""
    import torch

    from vsagen.attention.vsa import kernel_lists
    from vsagen.bench import SHAPES, make_inputs
    from vsagen.kernels.bsa_forward import bsa_fwd
    from vsagen.kernels.coarse import coarse_stage
    from vsagen.kernels.reference import top_k_from_sparsity
    from vsagen.layout import parse_tile, tile_layout

    for key in a.shapes.split(","):
        for shape in _grids(SHAPES[key], a.grids):
            q, k, v = make_inputs(shape, seed=4)
            for tile in a.tiles.split(","):
                lay = tile_layout(shape.grid, parse_tile(tile), device="cuda")
                c = coarse_stage(q, k, lay.tile_offsets_i32, top_k_from_sparsity(0.875, lay.num_tiles))
                lists, counts, off = kernel_lists(lay, c.q2k, c.q2k_cnt)
                cube_cnt = c.q2k_cnt.clone()  # some cube rows empty, some of one cube: equal for a cube's tiles
                cube_cnt[..., ::7] = 0
                cube_cnt[..., 3::7] = 1
                short_lists, short_counts, _ = kernel_lists(lay, c.q2k, cube_cnt)
                yield dict(shape=shape, tile=tile, lay=lay, q=q, k=k, v=v, lists=lists, counts=counts, off=off,
                           short=(short_lists, short_counts), ref=bsa_fwd(q, k, v, lists, counts, off),
                           ref_short=bsa_fwd(q, k, v, short_lists, short_counts, off))
                torch.cuda.synchronize()


def _baselines(a) -> None:
    """Dense SDPA and the shipped Triton fine stage (rows 64) on each setup."""
    import torch

    from vsagen.bench import bench_ms
    from vsagen.kernels.bsa_forward import bsa_fwd

    dense_of = {}
    for s in _setups(a):
        shape = s["shape"]
        if shape.name not in dense_of:
            qt, kt, vt = (x.transpose(1, 2) for x in (s["q"], s["k"], s["v"]))
            dense_of[shape.name] = bench_ms(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt))
            print(f"{shape.name} {shape.grid}: dense SDPA {dense_of[shape.name]:.3f} ms", flush=True)
        t = bench_ms(lambda: bsa_fwd(s["q"], s["k"], s["v"], s["lists"], s["counts"], s["off"]))
        print(f"  {shape.name} tile {s['tile']}: shipped Triton fine (rows 64) {t:.3f} ms "
              f"({dense_of[shape.name] / t:.2f}x dense)", flush=True)


def _child(a) -> None:
    """Each variant of `a.variants` on each setup: checked against the shipped forward, then timed (ms)."""
    import torch

    from vsagen.bench import bench_ms, rel_l2

    for s in _setups(a):
        n_kt = s["off"].numel() - 1
        o_ref, lse_ref = s["ref"]
        o_short, lse_short = s["ref_short"]
        for var in a.variants:
            name = _variant_text(var)
            if var[3] and s["lay"].kernel_tiles_per_tile == 1:
                continue  # one kernel tile per cube: nothing to share
            items = (work_items(n_kt, 2, s["lay"].tile_kernel_first, s["lay"].tile_kernel_count) if var[3]
                     else work_items(n_kt, var[0]))
            where = f"{s['shape'].name} tile {s['tile']} ws {name}"
            print(f"    launching {where}", flush=True)
            args = (s["q"], s["k"], s["v"], s["lists"], s["counts"], s["off"], var, items)
            o, lse = ws_fwd(*args)
            torch.cuda.synchronize()
            ok = rel_l2(o, o_ref) < 1e-2 and rel_l2(lse, lse_ref) < 1e-3
            o2, l2 = ws_fwd(s["q"], s["k"], s["v"], *s["short"], s["off"], var, items)
            fin = torch.isfinite(lse_short)
            short_ok = (rel_l2(o2, o_short) < 1e-2 and torch.equal(fin, torch.isfinite(l2))
                        and rel_l2(l2[fin], lse_short[fin]) < 1e-3)
            t = bench_ms(lambda: ws_fwd(*args)) if ok and short_ok else float("nan")
            print(f"    {where}: {t:.3f} ms; out rel {rel_l2(o, o_ref):.1e} lse rel {rel_l2(lse, lse_ref):.1e}; "
                  f"short / empty rows {'agree' if short_ok else 'DIFFER'}", flush=True)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="1.3b")
    ap.add_argument("--grids", default="partial", help="partial and / or whole (the grid rounded up to 4x8x8 cubes)")
    ap.add_argument("--tiles", default="4x4x4,4x4x8,4x8x8")
    ap.add_argument("--variants", default="1:2:0,1:3:0,2:2:0,2:3:0:s,2:2:1,2:3:1,2:3:1:s,2:4:1:s",
                    type=lambda t: [_variant(x) for x in t.split(",")])
    ap.add_argument("--timeout", type=float, default=45.0, help="seconds per variant (its own process)")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--head-dims", default="128", help="--compile-only: the head dims to compile (64 and / or 128)")
    ap.add_argument("--child", action="store_true", help="run the variants in this process (no baselines)")
    a = ap.parse_args(argv)
    if not HAVE_GLUON:
        print("Gluon is not importable in this Triton: nothing to run")
        return 1
    if a.compile_only:
        for d in a.head_dims.split(","):
            print(f"head dim {d}:")
            compile_only(a.variants, int(d))
        return 0
    if a.child:
        _child(a)
        return 0
    import subprocess

    import torch

    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", __import__("triton").__version__)
    _baselines(a)
    for var in a.variants:  # each in a process of its own: a hang or a broken context stays there
        cmd = [sys.executable, __file__, "--child", "--shapes", a.shapes, "--grids", a.grids, "--tiles", a.tiles,
               "--variants", _variant_text(var)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
            lines = [x for x in (r.stdout + r.stderr).splitlines() if "Warning" not in x]
            print("\n".join(x for x in lines if r.returncode or "launching" not in x), flush=True)
            if r.returncode:
                print(f"    ws {_variant_text(var)}: exit {r.returncode}", flush=True)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            last = [x for x in out.splitlines() if "launching" in x][-1:]
            print(f"    ws {_variant_text(var)}: no answer in {a.timeout:.0f} s (a hang?); last: {last}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
