"""Block-sparse attention forward with warp specialization (Gluon, NVIDIA Hopper sm_90 only): `bsa_fwd_ws`.

Same function and layout contract as `bsa_forward.bsa_fwd` (VSA's fine stage, arXiv 2505.13389 sec. 2; online
softmax as FlashAttention-2, arXiv 2307.08691 alg. 1): q, k, v (B, S, H, D) bf16 / fp16 in tile order, kernel
tiles of at most 64 tokens, out (B, S, H, D) and lse (B, H, S). One CTA per (query tile, batch x head) with two
roles (FlashAttention-3, Shah et al., arXiv 2407.08608, sec. 3.1): a producer warp that only issues the TMA loads
(the query tile, then the K / V tiles of its q2k row into a ring of `STAGES` buffers) and one consumer warpgroup
that only computes, in FlashAttention-3's intra-warpgroup order: issue S_j = Q K_j^T and O += P_{j-1} V_{j-1}
(wgmma, asynchronous), wait for S_j alone, softmax, wait for the product, hand its buffer back to the producer.
A partial tile's TMA box also covers the next tile's first rows (zeros past the tensor's end): the score mask
removes those keys, and those query rows are never stored.

Why it exists: on the H100 the pipelined Triton forward keeps the tensor pipe busy 48.9% of the time (Nsight
Compute, BENCHMARKS.md 2026-12-05 fourth session); with the loads on their own warp this kernel is faster where
the key lists hold few partial tiles (BENCHMARKS.md 2026-12-06, 87.5% sparsity, time of the pipelined forward over
this one's on the same lists, H200 / H100): 4x8x8 cubes 1.038 / 1.07 on the Wan2.1-1.3B grid and 1.077 / 1.14 at
14B 720p; grids of whole cubes 1.03-1.15 at every volume (4x4x8 on the H200 only). It is slower where many
partial key tiles sit in the lists (4x4x4 on the models' grids: 0.76-0.82), which the pipelined kernel packs
(`tile_plan`) and this one walks one per iteration, and about even at 4x4x8 there (0.94-0.99). `ws_forward_pays`
encodes that choice. Two consumers per CTA, ping-pong, a shared ring and deeper rings measured slower (the
retired experiment benchmarks/gluon_ws_fwd.py, source at commit 86581d0).

No autograd: `bsa_fwd` dispatches here when its tuning asks (`KernelTuning.fwd_warp_specialized`) and
`ws_unsupported` finds nothing against it; the backward (`bsa_backward`) takes the out / lse of either kernel.
Gluon does not run under the Triton interpreter: the CPU tests compile this kernel for sm_90a and check the
dispatch; its numbers are checked on the GPU (`benchmarks/fwd_ws.py`, against float64 and the pipelined kernel).
"""

from __future__ import annotations

import functools
import types

import torch

from .bsa_primitives import BLOCK, LOG2E, check_inputs, tma_layout_ok
from .runtime_notes import add_note
from .tuning import interpreting

STAGES = 3  # K / V buffers of the ring: at D = 128, 115 KB of shared memory, two CTAs per SM (4 stages: one, slower)
HEAD_DIMS = (64, 128)  # compiled without spills at the launch's 128-register cap (sm_90a, triton 3.6, 3.8, 3.9)
MAX_REGS = 128  # launch cap per thread: two CTAs of 8 warps fit an SM's 64K registers


# The Gluon API this kernel calls, checked by name and calling convention (not by Triton's version): (module, name,
# how many arguments the kernel passes by position, the keywords it passes). "tma_load" is `tma.async_load` (Triton
# >= 3.7), else `tma.async_copy_global_to_shared` (3.6; 3.9 keeps that name only to raise "call async_load").
GLUON_API = (
    ("gl", "warp_specialize", 3, ()),  # a list of (function, args) partitions (3.5 took the default one apart)
    ("gl", "allocate_shared_memory", 3, ()),
    ("gl", "NVMMADistributedLayout", 0, ("version", "warps_per_cta", "instr_shape")),
    ("gl", "DotOperandLayout", 0, ("operand_index", "parent", "k_width")),
    ("gl", "SliceLayout", 2, ()),
    ("gl", "convert_layout", 2, ()),
    ("gl", "static_range", 1, ()),
    ("gl.NVMMASharedLayout", "get_default_for", 2, ()),
    ("mbarrier", "MBarrierLayout", 0, ()),
    ("mbarrier", "init", 1, ("count",)),
    ("mbarrier", "expect", 2, ()),
    ("mbarrier", "wait", 2, ()),
    ("mbarrier", "arrive", 1, ("count",)),
    ("tma", "tma_load", 4, ()),
    ("hopper", "warpgroup_mma", 3, ("use_acc", "is_async")),
    ("hopper", "warpgroup_mma_wait", 0, ("num_outstanding", "deps")),
    ("host", "TensorDescriptor", 5, ()),
)


def _accepts(fn, positional: int, keywords: tuple[str, ...]) -> bool:
    """Whether fn takes `positional` arguments by position and `keywords` by name as named parameters (a stand-in
    taking *args / **kwargs, like Triton 3.9's removed `async_copy_global_to_shared`, does not). A jit-wrapped
    function (Triton's `ConstexprFunction`) is judged by the function it wraps."""
    import inspect

    try:
        params = inspect.signature(getattr(fn, "fn", fn)).parameters
    except (TypeError, ValueError):
        return False
    by_position = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(by_position) < positional:
        return False
    named = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if not set(keywords) <= named:
        return False
    rest = [p for p in by_position[positional:] if p.name not in keywords and not p.name.startswith("_")]
    rest += [p for p in params.values() if p.kind == p.KEYWORD_ONLY and p.name not in keywords
             and not p.name.startswith("_")]
    return all(p.default is not p.empty for p in rest)  # nothing else required


def tma_load(tma):
    """The TMA global-to-shared copy of this Triton's Gluon `tma` module, (desc, coord, barrier, smem, pred=True):
    `async_load` (Triton >= 3.7), else `async_copy_global_to_shared` (3.6)."""
    return getattr(tma, "async_load", None) or getattr(tma, "async_copy_global_to_shared", None)


def missing_gluon_api() -> list[str]:
    """The Gluon names of `GLUON_API` this Triton lacks or whose calling convention differs from the kernel's calls
    (e.g. ["tma.tma_load"]); ["triton.experimental.gluon"] where Gluon does not import."""
    try:
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia import hopper
        from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
        from triton.experimental.gluon.nvidia import hopper as host
    except ImportError:
        return ["triton.experimental.gluon"]
    spaces = {"gl": gl, "gl.NVMMASharedLayout": getattr(gl, "NVMMASharedLayout", None), "mbarrier": mbarrier,
              "tma": types.SimpleNamespace(tma_load=tma_load(tma)), "hopper": hopper, "host": host}
    return [f"{space}.{name}" for space, name, positional, keywords in GLUON_API
            if (fn := getattr(spaces[space], name, None)) is None or not _accepts(fn, positional, keywords)]


@functools.cache
def have_gluon() -> bool:
    """Whether this Triton ships the Gluon API this kernel is written in (`triton.experimental.gluon`): every call of
    `GLUON_API` present and taking the kernel's arguments (`missing_gluon_api` is empty). Where it is not, `bsa_fwd`
    runs the pipelined kernel. Checked on Triton 3.6, 3.8 and 3.9 (3.5's `warp_specialize` is refused)."""
    return not missing_gluon_api()


def ws_forward_pays(tile_volume: int, every_cube_whole: bool) -> bool:
    """Whether this kernel measured faster than the pipelined Triton forward for VSA cubes of `tile_volume` tokens
    (module docstring; H200 and H100): 256-token cubes on any grid, any cube where every cube is whole. On grids
    with partial 64- or 128-token cubes the pipelined kernel, which packs the partial key tiles, stays."""
    return tile_volume == 256 or every_cube_whole


FAILED: list[str] = []  # why the kernel failed to compile or launch in this process (`launch_or_fall_back`)


def ws_unsupported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Why `bsa_fwd_ws` cannot take q, k, v (each (B, S, H, D)), in a few words, or None when it can: the kernel
    failed to compile or launch earlier in this process (`launch_or_fall_back`), not a CUDA sm_90 device (or under
    the Triton interpreter), a Triton without the Gluon API the kernel calls (`missing_gluon_api`), a dtype other
    than bf16 / fp16, D not in `HEAD_DIMS`, or a layout TMA cannot read (`bsa_primitives.tma_layout_ok`). Plain
    checks, no device sync."""
    if FAILED:
        return f"it failed on this Triton earlier in this process ({FAILED[0]})"
    if q.device.type != "cuda" or interpreting() or torch.version.hip is not None:
        return "not an NVIDIA GPU (or the Triton interpreter)"
    if torch.cuda.get_device_capability(q.device)[0] != 9:
        return "not sm_90 (its wgmma and TMA are Hopper's)"
    if not have_gluon():
        return f"this Triton lacks the Gluon API the kernel calls ({', '.join(missing_gluon_api())})"
    if q.shape[-1] not in HEAD_DIMS:
        return f"head dim {q.shape[-1]} not in {HEAD_DIMS}"
    if not all(tma_layout_ok(x) for x in (q, k, v)):
        return "bf16 / fp16 tensors TMA can read as (B*S, H*D) are needed"
    return None


if have_gluon():
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

    _tma_load = tma_load(tma)  # (desc, coord, barrier, smem): async_load, or 3.6's async_copy_global_to_shared

    @gluon.jit
    def _tile(off_ptr, t):
        """Start row and token count of kernel tile t."""
        start = gl.load(off_ptr + t)
        return start, gl.load(off_ptr + t + 1) - start

    @gluon.jit
    def _producer(args, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
        """The loads (one warp): the query tile, then the K / V tiles of its q2k row into the ring."""
        (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty, o_ptr, lse_ptr, q2k_ptr, cnt_ptr,
         off_ptr, seq_len, num_heads, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ib, stride_ih,
         stride_iq, stride_cb, stride_ch, qk_scale) = args
        qt = gl.program_id(0)
        pid_bh = gl.program_id(1)
        b = pid_bh // num_heads
        h = pid_bh % num_heads
        row0 = b * seq_len
        col0 = h * HEAD_DIM
        cnt = gl.load(cnt_ptr + b * stride_cb + h * stride_ch + qt)
        mbarrier.expect(q_bar.index(0), q_desc.block_type.nbytes)
        _tma_load(q_desc, [row0 + gl.load(off_ptr + qt), col0], q_bar.index(0), q_smem)
        row_ptr = q2k_ptr + b * stride_ib + h * stride_ih + qt * stride_iq
        for j in range(cnt):
            s = j % STAGES
            mbarrier.wait(empty.index(s), ((j // STAGES) & 1) ^ 1)  # a fresh barrier passes phase 1
            start = gl.load(off_ptr + gl.load(row_ptr + j))
            mbarrier.expect(ready.index(s), 2 * k_desc.block_type.nbytes)
            _tma_load(k_desc, [row0 + start, col0], ready.index(s), k_smem.index(s))
            _tma_load(v_desc, [row0 + start, col0], ready.index(s), v_smem.index(s))

    @gluon.jit
    def _consumer(args, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
        """The arithmetic (one warpgroup): the query tile's attention over the ring's key tiles; stores O and LSE."""
        (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty, o_ptr, lse_ptr, q2k_ptr, cnt_ptr,
         off_ptr, seq_len, num_heads, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ib, stride_ih,
         stride_iq, stride_cb, stride_ch, qk_scale) = args
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

        qt = gl.program_id(0)
        pid_bh = gl.program_id(1)
        b = pid_bh // num_heads
        h = pid_bh % num_heads
        cnt = gl.load(cnt_ptr + b * stride_cb + h * stride_ch + qt)
        q_start, q_len = _tile(off_ptr, qt)
        row_ptr = q2k_ptr + b * stride_ib + h * stride_ih + qt * stride_iq

        offs_n = gl.arange(0, BLOCK_N, layout=col_s)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_s)
        acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
        s_init = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        p = gl.zeros([BLOCK_M, BLOCK_N], dtype, layout=p_layout)
        mbarrier.wait(q_bar.index(0), 0)

        if cnt > 0:  # key tile 0: scores and softmax, no product in flight yet
            _, k_len = _tile(off_ptr, gl.load(row_ptr))
            mbarrier.wait(ready.index(0), 0)
            s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_init, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            s = gl.where((offs_n < k_len)[None, :], s * qk_scale, float("-inf"))
            m_i = gl.max(s, axis=1)
            pf = gl.exp2(s - m_i[:, None])
            l_i = gl.sum(pf, axis=1)
            p = gl.convert_layout(pf.to(dtype), p_layout)

        for j in range(1, cnt):  # the scores of key tile j while the product of tile j - 1 runs
            _, k_len = _tile(off_ptr, gl.load(row_ptr + j))
            st = j % STAGES
            sp = (j - 1) % STAGES
            mbarrier.wait(ready.index(st), (j // STAGES) & 1)
            s = warpgroup_mma(q_smem, k_smem.index(st).permute((1, 0)), s_init, use_acc=False, is_async=True)
            acc = warpgroup_mma(p, v_smem.index(sp), acc, is_async=True)
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

        if cnt > 0:  # the last tile's product
            sp = (cnt - 1) % STAGES
            acc = warpgroup_mma(p, v_smem.index(sp), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(empty.index(sp), count=1)

        empty_row = l_i == 0.0  # no selected tile: output 0, LSE -inf
        l_safe = gl.where(empty_row, 1.0, l_i)
        out = acc / gl.convert_layout(l_safe, row_o)[:, None]
        offs_mo = gl.arange(0, BLOCK_M, layout=row_o)
        offs_d = gl.arange(0, HEAD_DIM, layout=col_o)
        o_mask = (offs_mo < q_len)[:, None] & (offs_d < HEAD_DIM)[None, :]
        o_ptrs = o_ptr + b * stride_ob + h * stride_oh + (q_start + offs_mo)[:, None] * stride_os + offs_d[None, :]
        gl.store(o_ptrs, out.to(dtype), mask=o_mask)
        lse = gl.where(empty_row, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
        offs_ms = gl.arange(0, BLOCK_M, layout=row_s)
        gl.store(lse_ptr + b * stride_lb + h * stride_lh + q_start + offs_ms, lse, mask=offs_ms < q_len)

    @gluon.jit
    def _bsa_fwd_ws_kernel(q_desc, k_desc, v_desc, o_ptr, lse_ptr, q2k_ptr, cnt_ptr, off_ptr, seq_len, num_heads,
                           stride_ob, stride_os, stride_oh, stride_lb, stride_lh, stride_ib, stride_ih, stride_iq,
                           stride_cb, stride_ch, qk_scale, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                           num_warps: gl.constexpr):
        """One CTA: query tile program_id(0) of batch x head program_id(1)."""
        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [64, HEAD_DIM], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, 64, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, 64, HEAD_DIM], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar.index(0), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        args = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty, o_ptr, lse_ptr, q2k_ptr,
                cnt_ptr, off_ptr, seq_len, num_heads, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                stride_ib, stride_ih, stride_iq, stride_cb, stride_ch, qk_scale)
        # the partitions' argument tuples are written out in the call: a tuple assigned to a variable first turns
        # its constexprs into tensors (triton 3.6), and the layouts need HEAD_DIM as a constexpr
        gl.warp_specialize([(_consumer, (args, HEAD_DIM, STAGES)), (_producer, (args, HEAD_DIM, STAGES))],
                           [1], [24])  # the producer warp keeps 24 registers a thread, the rest go to the consumer


def _smem_layout(head_dim: int, dtype: torch.dtype):
    el = gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    return gl.NVMMASharedLayout.get_default_for([BLOCK, head_dim], el)


def index_operands(q2k: torch.Tensor, q2k_cnt: torch.Tensor, tile_offsets: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q2k, q2k_cnt, tile_offsets as the kernel reads them: a q2k row, a count row and the offsets as runs of unit
    stride (copies only where a view has another stride, e.g. a sliced or transposed q2k)."""
    q2k = q2k if q2k.shape[-1] <= 1 or q2k.stride(-1) == 1 else q2k.contiguous()
    q2k_cnt = q2k_cnt if q2k_cnt.shape[-1] <= 1 or q2k_cnt.stride(-1) == 1 else q2k_cnt.contiguous()
    return q2k, q2k_cnt, tile_offsets.contiguous()


def bsa_fwd_ws(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor, q2k_cnt: torch.Tensor,
               tile_offsets: torch.Tensor, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The fine-stage forward on the warp-specialized kernel (no autograd; contract of `bsa_forward.bsa_fwd`).

    Args:
        q, k, v: (B, S, H, D) bf16 / fp16 on an sm_90 GPU, tile order, D in `HEAD_DIMS`, a layout TMA reads.
        q2k: (B, H, Q_TILES, K) int32 key tiles per query tile (its first q2k_cnt entries read); q2k_cnt:
            (B, H, Q_TILES) int32; tile_offsets: (n_tiles + 1,) int32 starts of kernel tiles of at most 64 tokens.
        scale: softmax scale, default 1/sqrt(D).

    Returns:
        out (B, S, H, D) like q; lse (B, H, S) fp32 natural log (-inf on rows with no selected tile,
        whose output is 0).

    Raises:
        ValueError: the inputs break `bsa_primitives.check_inputs`, or `ws_unsupported` names a reason.
    """
    check_inputs(q, k, v, q2k, q2k_cnt, tile_offsets)
    why = ws_unsupported(q, k, v)
    if why:
        raise ValueError(f"bsa_fwd_ws: {why}")
    return launch_ws(q, k, v, q2k, q2k_cnt, tile_offsets, scale)


def launch_ws(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor, q2k_cnt: torch.Tensor,
              tile_offsets: torch.Tensor, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`bsa_fwd_ws` without its checks, for a caller that made them (`bsa_forward.bsa_fwd`: `check_inputs`, then
    `ws_unsupported` is None). Same arguments and returns."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    q2k, q2k_cnt, tile_offsets = index_operands(q2k, q2k_cnt, tile_offsets)
    b, s, h, d = q.shape
    scale = d ** -0.5 if scale is None else float(scale)
    layout = _smem_layout(d, q.dtype)
    q_desc, k_desc, v_desc = (TensorDescriptor(x, [b * s, h * d], [x.stride(1), 1], [BLOCK, d], layout)
                              for x in (q, k, v))
    out = torch.empty_like(q)  # q's strides where q is dense (as `bsa_fwd`), else contiguous; unit stride on D
    lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
    n_tiles = q2k.shape[2]
    if n_tiles and b * h:
        _bsa_fwd_ws_kernel[(n_tiles, b * h)](
            q_desc, k_desc, v_desc, out, lse, q2k, q2k_cnt, tile_offsets, s, h,
            out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1),
            q2k.stride(0), q2k.stride(1), q2k.stride(2), q2k_cnt.stride(0), q2k_cnt.stride(1), scale * LOG2E,
            HEAD_DIM=d, STAGES=STAGES, num_warps=4, maxnreg=MAX_REGS)
    return out, lse


def launch_or_fall_back(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor, q2k_cnt: torch.Tensor,
                        tile_offsets: torch.Tensor, scale: float | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`launch_ws` (same arguments and returns), or None where the kernel fails to compile or launch on this Triton
    although `have_gluon` found its API (a compiler change, registers or shared memory it cannot get): the caller
    runs the pipelined kernel instead (`bsa_forward.bsa_fwd`). The first failure is kept in `FAILED`, so
    `ws_unsupported` names it and no later call tries again, and said once as a run note
    (`runtime_notes.add_note`). Out of memory is raised as it is."""
    try:
        return launch_ws(q, k, v, q2k, q2k_cnt, tile_offsets, scale)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 -- any failure of the optional kernel: the pipelined one runs
        import triton

        why = failure_text(exc)
        FAILED.append(why)
        add_note(f"the warp-specialized Gluon forward of vsa's fine stage failed on Triton {triton.__version__} "
                 f"({why}); the pipelined Triton forward runs instead in this process (the same attention; the "
                 "warp-specialized one measured 3-15% faster where vsa picks it)")
        return None


def failure_text(exc: BaseException) -> str:
    """One line for an exception of a Triton compile or launch: the innermost cause's type and message (a
    CompilationError's message without its source excerpt), at most 240 characters."""
    while exc.__cause__ is not None:  # a compile error wraps the callee's, down to the API's own
        exc = exc.__cause__
    text = getattr(exc, "error_message", None) or str(exc)
    lines = [line.strip() for line in str(text).splitlines() if line.strip() not in ("", "^")]
    return f"{type(exc).__name__}: {lines[-1] if lines else 'no message'}"[:240]
