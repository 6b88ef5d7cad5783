"""The 8-bit fine stage on vsagen's Triton block-sparse forward (`bsa_forward`'s SAGE switch): int8 Q.K^T with K
smoothing and per-block scales, fp8 e4m3 P.V, SageSLA's formulas (`sage`'s docstring, with TurboDiffusion's and
SpargeAttn's file:line sources). Forward only: there is no 8-bit backward, and `sage_block_sparse_attention` refuses
inputs that need gradients (ValueError) rather than pair an 8-bit forward with a bf16 backward silently; train with
the bf16 fine stage (`block_sparse_attention`).

The operands are quantized by `quantize_operands_triton` (K's mean and V's per-channel extremes by torch
reductions, then one Triton pass per tensor that reads it once and writes its 1-byte values and scales: the same
arithmetic as `sage.quantize_operands`, bitwise under the interpreter; V written transposed into one 64-token slot
per kernel tile, `sage.v_slots`), then one launch per size class of the block-sparse forward with SAGE on: int8 K
tiles by TMA where the tuning asks and the layout allows (`bsa_primitives.use_tma`), else pointer loads; fp8 V^T
(D, 64) tiles, the P.V dot's K-major B operand through tl.trans (Hopper's fp8 wgmma takes no other order: with V
(S, D) Triton transposed each tile through registers and shared memory, and the 8-bit stage ran at 0.37-0.41x the
bf16 one on an H100, issue 46), key tile t's from slot column 64 t: by TMA boxes wherever the tuning asks (every
box starts at a multiple of 64 tokens, whatever the grid's partial tiles: with V^T token-packed, tile starts
multiples of 4 only kept the 14B grid's boxes off, BENCHMARKS.md 2026-12-07 night), else 64-byte pointer loads; the
tile plans' packed partial tiles gather runs of 8 slot columns. The q2k lists or tile plans and the query-group
launch as the bf16 kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import sage
from .bsa_forward import _launch, _round_e4m3
from .bsa_primitives import PACK_SEG, interpreting
from .tuning import OP_SCHEMA_ARGS, KernelTuning, default_tuning, op_args

__all__ = ["bsa_fwd_sage", "check_sage_operands", "quantize_operands_triton", "sage_block_sparse_attention"]

MAX_GROUP = 128  # the most tokens one scale group may hold (`quantize_operands_triton`)


@triton.jit
def _round_like(x, DTYPE: tl.constexpr):
    """fp32 x rounded to DTYPE (nearest even) and back to fp32. bf16 by bits (the Triton interpreter's fp32 -> bf16
    cast truncates: 484 of 1024 Gaussians off, triton 3.9), fp16 by a cast, fp32 as it is."""
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.int32, bitcast=True)
        x = ((bits + 0x7FFF + ((bits >> 16) & 1)) & -0x10000).to(tl.float32, bitcast=True)
    elif DTYPE == tl.float16:
        x = x.to(tl.float16).to(tl.float32)
    return x


@triton.jit
def _quant_int8_kernel(x_ptr, mean_ptr, out_ptr, scale_ptr, off_ptr, seq_len, num_heads, stride_b, stride_s,
                       stride_h, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_G: tl.constexpr,
                       MEAN: tl.constexpr):  # out: (B, S, H, D) contiguous
    """One token group (program_id(0): tokens off[g] .. off[g + 1] - 1, at most BLOCK_G) of one (batch, head)
    (program_id(1)) of x (B, S, H, D) to int8 (`sage.quantize_int8`'s arithmetic): with MEAN, x - mean[b, h] rounded
    to x's dtype first (K smoothing); scale = max |x| / 127 + 1e-7 in fp32, stored per token at scale_ptr
    ((B, H, S) contiguous); trunc(x / scale + 0.5 sign) into out ((B, S, H, D) contiguous; x: any strides, unit on
    D)."""
    g = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // num_heads
    h = bh % num_heads
    start = tl.load(off_ptr + g)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    ok = offs_g < tl.load(off_ptr + g + 1) - start
    d_ok = offs_d < HEAD_DIM
    rows = (start + offs_g)[:, None].to(tl.int64)
    ptrs = b.to(tl.int64) * stride_b + h * stride_h + rows * stride_s + offs_d[None, :]
    out_ptrs = ((b.to(tl.int64) * seq_len + rows) * num_heads + h) * HEAD_DIM + offs_d[None, :]
    mask = ok[:, None] & d_ok[None, :]
    raw = tl.load(x_ptr + ptrs, mask=mask, other=0.0)
    x = raw.to(tl.float32)
    if MEAN:  # the subtraction in x's dtype, as torch's `k - k.mean(...)`
        m = tl.load(mean_ptr + bh * HEAD_DIM + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        x = tl.where(mask, _round_like(x - m[None, :], raw.dtype), 0.0)
    scale = tl.max(tl.max(tl.abs(x), 1), 0) / 127.0 + 1e-7
    y = x / scale
    y = y + 0.5 * tl.where(y >= 0, 1.0, -1.0)
    tl.store(out_ptr + out_ptrs, y.to(tl.int8), mask=mask)  # the float -> int conversion truncates toward zero
    tl.store(scale_ptr + bh.to(tl.int64) * seq_len + start + offs_g, tl.zeros_like(offs_g).to(tl.float32) + scale,
             mask=ok)


@triton.jit
def _quant_v_kernel(v_ptr, recp_ptr, out_ptr, off_ptr, num_heads, num_tiles, stride_b, stride_s, stride_h,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SLOT: tl.constexpr, EMULATE: tl.constexpr):
    """Kernel tile t (program_id(0): tokens off[t] .. off[t + 1] - 1, at most SLOT) of one (batch, head)
    (program_id(1)) of v (B, S, H, D; any strides, unit on D) to fp8 e4m3, stored transposed into its slot: columns
    t * SLOT .. t * SLOT + SLOT - 1 of out ((B, H, D, T * SLOT) contiguous, `sage.v_slots`), zeros past the tile's
    tokens: v times its channel's 2.25 / max |v| (recp_ptr, (B, H, D) fp32 contiguous), rounded to nearest even
    (`sage.quantize_v_fp8`; EMULATE: rounded by `_round_e4m3` first, for the interpreter's cast). The (SLOT,
    BLOCK_D) tile read row-major is written column-major: one pass, the transposition a layout change in registers /
    shared memory."""
    t = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // num_heads
    h = bh % num_heads
    start = tl.load(off_ptr + t)
    offs_s = tl.arange(0, SLOT)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    mask = (offs_s < tl.load(off_ptr + t + 1) - start)[:, None] & d_ok[None, :]
    rows = (start + offs_s)[:, None].to(tl.int64)
    ptrs = b.to(tl.int64) * stride_b + h * stride_h + rows * stride_s + offs_d[None, :]
    out_ptrs = (bh.to(tl.int64) * HEAD_DIM + offs_d[None, :]) * (num_tiles * SLOT) + t * SLOT + offs_s[:, None]
    recp = tl.load(recp_ptr + bh * HEAD_DIM + offs_d, mask=d_ok, other=0.0)
    y = tl.load(v_ptr + ptrs, mask=mask, other=0.0).to(tl.float32) * recp[None, :]  # 0 past the tile
    if EMULATE:
        y = tl.where(y < 0, -_round_e4m3(-y), _round_e4m3(y))
    tl.store(out_ptr + out_ptrs, y.to(out_ptr.dtype.element_ty), mask=d_ok[None, :])


def _quant_int8(x: torch.Tensor, offsets: torch.Tensor, mean: torch.Tensor | None) -> tuple[torch.Tensor,
                                                                                              torch.Tensor]:
    """`_quant_int8_kernel` over every group of `offsets` and every (batch, head): (int8 like x, scales (B, H, S))."""
    b, s, h, d = x.shape
    out = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    scale = torch.empty((b, h, s), dtype=torch.float32, device=x.device)
    stride = (x.stride(0), x.stride(1), x.stride(2))
    _quant_int8_kernel[(offsets.numel() - 1, b * h)](
        x, x if mean is None else mean, out, scale, offsets, s, h, *stride, HEAD_DIM=d,
        BLOCK_D=triton.next_power_of_2(d), BLOCK_G=MAX_GROUP, MEAN=mean is not None)
    return out, scale


def quantize_operands_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor,
                             k_offsets: torch.Tensor, tile_offsets: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`sage.quantize_operands` (same arithmetic, same values; V in the kernel's slots) with one Triton pass per
    tensor. Bitwise equal under
    the interpreter; on a GPU Triton's fp32 division is div.full.f32 (within 2 ulp, as in SpargeAttn's own Triton
    quantization, utils.py:139-143), so an int8 value may differ by one where x / scale lies that close to a half.

    Args:
        q, k, v: (B, S, H, D) bf16 / fp16 / fp32 (any strides; copied where D's is not 1), on a CUDA device or
            under the interpreter.
        q_offsets, k_offsets: (G + 1,) int32 token group starts, groups of at most MAX_GROUP (128) tokens (not
            checked: that would synchronize the device; VSA's kernel tiles hold <= 64, SLA's blocks 64 / 128).
        tile_offsets: (T + 1,) int32 starts of the kernel's key tiles (1..64 tokens each, not checked), the slots
            of V's layout.

    Returns:
        (q_int8, q_scale, k_int8, k_scale, v_fp8, v_scale) as `sage.quantize_operands`, the same values; q_int8 /
        k_int8 contiguous, v_fp8 (B, H, D, T, 64) in the kernel's slot layout (`sage.v_slots` of
        `sage.quantize_operands`' v_fp8, bitwise), written so by the V quantizer itself (no extra pass; one program
        per (tile, batch-head) writes its whole slot, its stores through a register / shared-memory transposition).
    """
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))  # the kernels take any other strides
    b, s, h, d = q.shape
    mean = k.mean(dim=1).contiguous()  # (B, H, D) in k's dtype, as `sage.smooth_k`
    qi, qs = _quant_int8(q, q_offsets, None)
    ki, ks = _quant_int8(k, k_offsets, mean)
    lo, hi = torch.aminmax(v, dim=1)  # (B, H, D): max |v| without an |v| copy
    amax = torch.maximum(-lo.float(), hi.float())
    amax = torch.where(amax > 0, amax, torch.full_like(amax, sage.V_SCALE_MAX))
    recp = (sage.V_SCALE_MAX / amax).contiguous()
    n_tiles = tile_offsets.numel() - 1
    vt = torch.empty((b, h, d, n_tiles, sage.V_SLOT), dtype=sage.FP8, device=v.device)
    if vt.numel():
        _quant_v_kernel[(n_tiles, b * h)](v, recp, vt, tile_offsets, h, n_tiles, v.stride(0), v.stride(1),
                                          v.stride(2), HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d),
                                          SLOT=sage.V_SLOT, EMULATE=interpreting())
    return qi, qs, ki, ks, vt, (amax / sage.V_SCALE_MAX).contiguous()


def check_sage_operands(qi: torch.Tensor, qs: torch.Tensor, ki: torch.Tensor, ks: torch.Tensor, vf: torch.Tensor,
                        vs: torch.Tensor) -> None:
    """Raise ValueError unless qi, ki (B, S, H, D) are int8 with unit stride on D and vf float8_e4m3fn, either of
    that shape (any layout) or in the kernel's slots ((B, H, D, T, 64) contiguous, `sage.v_slots`; T checked by the
    caller), D <= 256, qs, ks (B, H, S) and vs (B, H, D) contiguous fp32, all on one device."""
    b, s, h, d = qi.shape if qi.dim() == 4 else (None,) * 4
    slots = vf.dim() == 5 and vf.shape[:3] == (b, h, d) and vf.shape[4] == sage.V_SLOT and vf.is_contiguous()
    if qi.dim() != 4 or ki.shape != qi.shape or (vf.shape != qi.shape and not slots):
        raise ValueError(f"q, k must share one (B, S, H, D) shape and v be of it or (B, H, D, T, 64) contiguous, got "
                         f"{tuple(qi.shape)}, {tuple(ki.shape)}, {tuple(vf.shape)}")
    if qi.dtype != torch.int8 or ki.dtype != torch.int8 or vf.dtype != sage.FP8:
        raise ValueError(f"the 8-bit fine stage takes int8 q, k and float8_e4m3fn v, got {qi.dtype}, {ki.dtype}, "
                         f"{vf.dtype}")
    if d > 256 or any(x.stride(-1) != 1 for x in (qi, ki)):
        raise ValueError(f"head dim {d} must be <= 256 with unit stride")
    for name, x, shape in (("q_scale", qs, (b, h, s)), ("k_scale", ks, (b, h, s)), ("v_scale", vs, (b, h, d))):
        if x.shape != shape or x.dtype != torch.float32 or not x.is_contiguous():
            raise ValueError(f"{name} must be a contiguous fp32 {shape}, got {tuple(x.shape)} {x.dtype}")
    if len({x.device for x in (qi, qs, ki, ks, vf, vs)}) != 1:
        raise ValueError("the 8-bit operands must be on one device")


def bsa_fwd_sage(qi: torch.Tensor, qs: torch.Tensor, ki: torch.Tensor, ks: torch.Tensor, vf: torch.Tensor,
                 vs: torch.Tensor, q2k: torch.Tensor, q2k_cnt: torch.Tensor, tile_offsets: torch.Tensor,
                 scale: float | None = None, tuning: KernelTuning | None = None,
                 out_dtype: torch.dtype = torch.bfloat16, groups: torch.Tensor | None = None,
                 group_launch: tuple[int, int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The block-sparse forward with SAGE on (no autograd) over quantized operands.

    Args:
        qi, qs, ki, ks, vf, vs: `sage.quantize_operands`' outputs (checked: `check_sage_operands`); vf best in the
            slot layout `quantize_operands_triton` writes ((B, H, D, T, 64), `sage.v_slots` of these tile_offsets:
            what the kernel reads), else (B, S, H, D) copied into it first (`sage.v_slots`: one more read and write
            of V, e.g. for `sage.quantize_operands`' token-major vf).
        q2k, q2k_cnt, tile_offsets, scale, tuning: as `bsa_forward.bsa_fwd` (the warp-specialized forward does not
            run: it has no 8-bit variant).
        out_dtype: the output's dtype.
        groups, group_launch: as `bsa_forward.bsa_fwd_grouped` (query groups of block_m rows), or None.

    Returns:
        out (B, S, H, D) out_dtype contiguous; lse (B, H, S) fp32 natural log of the dequantized scores' row sums
        (-inf where no tile is selected).

    Raises:
        ValueError: operands outside `check_sage_operands`, index tensors not int32 or of the wrong shape, slots
            not one per tile.
    """
    check_sage_operands(qi, qs, ki, ks, vf, vs)
    b, s, h, d = qi.shape
    n_tiles = tile_offsets.numel() - 1
    if q2k.dim() != 4 or q2k.shape[:3] != (b, h, n_tiles) or q2k_cnt.shape != (b, h, n_tiles) \
            or {q2k.dtype, q2k_cnt.dtype, tile_offsets.dtype} != {torch.int32}:
        raise ValueError(f"q2k must be int32 (B, H, Q_TILES, K) = ({b}, {h}, {n_tiles}, K), q2k_cnt and "
                         f"tile_offsets int32, got {tuple(q2k.shape)} {q2k.dtype}, {tuple(q2k_cnt.shape)}")
    if groups is not None and (groups.dtype != torch.int32 or groups.dim() != 2 or group_launch is None
                               or groups.shape[1] != 2 + group_launch[0] // PACK_SEG):
        raise ValueError("groups must be an int32 (n, 2 + block_m / 8) table with its group_launch")
    if vf.dim() == 5 and vf.shape[3] != n_tiles:
        raise ValueError(f"v in slots must hold one per tile ({n_tiles}), got {vf.shape[3]}")
    out = torch.empty((b, s, h, d), dtype=out_dtype, device=qi.device)
    if b == 0 or s == 0:
        return out, torch.empty((b, h, s), dtype=torch.float32, device=qi.device)
    tuning = default_tuning(qi.device, d) if tuning is None else tuning
    vt = vf if vf.dim() == 5 else sage.v_slots(vf, tile_offsets)
    lse = _launch(qi, ki, vt, q2k, q2k_cnt, tile_offsets, scale, tuning, out, None, groups, group_launch,
                  sage=dict(qs=qs, ks=ks, vs=vs, offset=sage.P_FP8_OFFSET))
    return out, lse


def sage_block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor,
                                q2k_cnt: torch.Tensor, tile_offsets: torch.Tensor, q_offsets: torch.Tensor,
                                k_offsets: torch.Tensor, scale: float | None = None,
                                tuning: KernelTuning | None = None, groups: torch.Tensor | None = None,
                                group_launch: tuple[int, int, int] | None = None) -> torch.Tensor:
    """The 8-bit fine stage on float q, k, v: quantize (`quantize_operands_triton`), then `bsa_fwd_sage`.

    Args:
        q, k, v: (B, S, H, D) bf16 / fp16 / fp32, tile order, unit stride on D.
        q2k, q2k_cnt, tile_offsets, scale, tuning, groups, group_launch: as `bsa_fwd_sage`.
        q_offsets / k_offsets: (G + 1,) integer starts of the token groups that share a q / k int8 scale (VSA: the
            kernel tiles, `tile_offsets`; SageSLA on sm90: raster blocks of 64 / 128 tokens, `sage.block_offsets`).

    Returns:
        out (B, S, H, D) in q's dtype.

    Raises:
        ValueError: inputs that need gradients (forward only: the backward would be bf16's, so train with
            `block_sparse_attention`), or as `bsa_fwd_sage`.

    Source: SageAttention2 (arXiv 2411.10958) and SageSLA (TurboDiffusion); `sage`'s docstring has the formulas.
    """
    sage.check_forward_only(q, k, v)
    scale = float(q.shape[-1] ** -0.5 if scale is None else scale)
    tuning = default_tuning(q.device, q.shape[-1]) if tuning is None else tuning
    if torch.compiler.is_compiling():  # one custom op: torch.compile sees through it without a graph break
        return _sage_op(q, k, v, q2k, q2k_cnt, tile_offsets, q_offsets, k_offsets, groups,
                        list(group_launch or ()), scale, *op_args(tuning))
    ops = quantize_operands_triton(q, k, v, q_offsets, k_offsets, tile_offsets)
    return bsa_fwd_sage(*ops, q2k, q2k_cnt, tile_offsets, scale, tuning, q.dtype, groups, group_launch)[0]


@torch.library.custom_op(
    "vsagen::sage_block_sparse_attn", mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, Tensor q2k, Tensor q2k_cnt, Tensor tile_offsets, Tensor q_offsets, "
           f"Tensor k_offsets, Tensor? groups, int[] group_launch, float scale, {OP_SCHEMA_ARGS}) -> Tensor")
def _sage_op(q, k, v, q2k, q2k_cnt, tile_offsets, q_offsets, k_offsets, groups, group_launch, scale, *tuning):
    """`sage_block_sparse_attention` as a forward-only custom op (no autograd formula: the caller refuses
    gradients first); `tuning` is `tuning.op_args`."""
    ops = quantize_operands_triton(q, k, v, q_offsets, k_offsets, tile_offsets)
    return bsa_fwd_sage(*ops, q2k, q2k_cnt, tile_offsets, scale, KernelTuning.from_op_args(*tuning), q.dtype,
                        groups, tuple(group_launch) or None)[0]


@_sage_op.register_fake
def _sage_op_fake(q, k, v, q2k, q2k_cnt, tile_offsets, q_offsets, k_offsets, groups, group_launch, scale, *tuning):
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)
