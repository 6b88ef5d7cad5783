"""Shared parts of the block-sparse attention kernels (`bsa_forward`, `bsa_backward`): constants, input checks,
the `@triton.jit` tile loaders, TMA descriptor helpers and the choice of q2k lists or tile plans.

The contract these serve is in `block_sparse_attn`'s docstring. Tile loads: the loops fetch their 64-token tiles
(K / V in the forward and dQ kernels, Q / dO in the dK/dV kernel) by TMA where `KernelTuning.tma_loads` asks for it
and `use_tma` allows the layout: whole (64, D) boxes of the (B*S, H*D) tensor, so a partial tile's box also covers
the next tile's first rows; those are masked in the scores exactly as pointer loads' zero rows are (the results are
bitwise equal, tested under the interpreter). Elsewhere, pointer loads.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import tile_plan
from .tuning import interpreting

BLOCK = 64  # tokens in a full (4, 4, 4) tile
PACK_SEG = tile_plan.SEG  # tokens per group of a tile plan's partial-tile stream
PLAN_MAX_ROWS = 2 ** 27  # tile plans pack token rows as row << 4 into int32: longer sequences use the plain loop
LOG2E = 1.4426950408889634  # log2(e): scores are kept in base 2 for exp2
LN2 = 0.6931471805599453  # ln(2): converts the base-2 LSE back to natural log
# fp32 inputs take IEEE fp32 dots on CUDA cores (a correctness path, not a fast one) with fp32 operands staged
# in shared memory (227 KiB per block on sm_90): one stage from BLOCK_D 128 on (the dQ kernel needs 208 KiB at
# 3 stages, the forward 336 KiB at BLOCK_D 256), and no backward above BLOCK_D 128 on a GPU (its four (64, 256)
# fp32 operands need 256 KiB even at one stage). From the offline sm_90 compile (triton 3.8 ptxas) of the launch
# tables' sweep (`tuning.BWD_DQ_LAUNCH`).
FP32_WIDE_BLOCK_D = 128
FP32_WIDE_NUM_STAGES = 1
FP32_BWD_MAX_BLOCK_D = 128


@triton.jit
def mm(a, b, IEEE: tl.constexpr):
    """a @ b with fp32 accumulation; IEEE fp32 products when IEEE (fp32 inputs, or the interpreter)."""
    if IEEE:
        c = tl.dot(a, b, input_precision="ieee")
    else:
        c = tl.dot(a, b)
    return c


@triton.jit
def _load_kv_tile(k_base, v_base, off_ptr, kt, stride_ks, stride_vs, offs_n, offs_d, d_ok,
                  DOT_FP32: tl.constexpr, EVICT: tl.constexpr = "", CACHE: tl.constexpr = ""):
    """Load key tile `kt` of K and V: (BLOCK_N, BLOCK_D) each, rows past the tile's end zeroed and flagged
    False in n_ok (BLOCK_N,). EVICT / CACHE: tl.load's eviction_policy / cache_modifier (`tuning.load_hints`)."""
    k_start = tl.load(off_ptr + kt)
    k_len = tl.load(off_ptr + kt + 1) - k_start
    n_ok = offs_n < k_len
    rows = (k_start + offs_n)[:, None]
    kv_mask = n_ok[:, None] & d_ok[None, :]
    k = tl.load(k_base + rows * stride_ks + offs_d[None, :], mask=kv_mask, other=0.0, eviction_policy=EVICT,
                cache_modifier=CACHE)
    v = tl.load(v_base + rows * stride_vs + offs_d[None, :], mask=kv_mask, other=0.0, eviction_policy=EVICT,
                cache_modifier=CACHE)
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
def load_listed_kv_tile(k_desc, v_desc, k_base, v_base, off_ptr, kt, row0, col0, stride_ks, stride_vs, offs_n,
                         offs_d, d_ok, TMA: tl.constexpr, DOT_FP32: tl.constexpr, EVICT: tl.constexpr = "",
                         CACHE: tl.constexpr = ""):
    """Key tile `kt` of K and V by TMA (`_load_kv_tile_tma`) or pointer loads (`_load_kv_tile`, with the EVICT /
    CACHE hints): (k, v, n_ok)."""
    if TMA:
        k, v, n_ok = _load_kv_tile_tma(k_desc, v_desc, off_ptr, kt, row0, col0, offs_n, DOT_FP32)
    else:
        k, v, n_ok = _load_kv_tile(k_base, v_base, off_ptr, kt, stride_ks, stride_vs, offs_n, offs_d, d_ok, DOT_FP32,
                                   EVICT, CACHE)
    return k, v, n_ok


@triton.jit
def load_full_kv_tile(k_desc, v_desc, k_base, v_base, k_start, row0, col0, stride_ks, stride_vs, offs_n, offs_d,
                       d_ok, TMA: tl.constexpr, DOT_FP32: tl.constexpr, EVICT: tl.constexpr = "",
                       CACHE: tl.constexpr = ""):
    """Load the full key tile (64 tokens, so no row mask) starting at row k_start of K and V: (BLOCK_N, BLOCK_D)
    each, by TMA from the descriptors at (row0 + k_start, col0) or by pointer loads from k_base / v_base (with
    the EVICT / CACHE hints; TMA loads take none)."""
    if TMA:
        k = k_desc.load([row0 + k_start, col0])
        v = v_desc.load([row0 + k_start, col0])
    else:
        rows = (k_start + offs_n)[:, None]
        k = tl.load(k_base + rows * stride_ks + offs_d[None, :], mask=d_ok[None, :], other=0.0,
                    eviction_policy=EVICT, cache_modifier=CACHE)
        v = tl.load(v_base + rows * stride_vs + offs_d[None, :], mask=d_ok[None, :], other=0.0,
                    eviction_policy=EVICT, cache_modifier=CACHE)
    if DOT_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v


@triton.jit
def plan_counts(cnt_row):
    """(nf, npk, ng) of a tile plan row: full tiles, packs and groups (`tile_plan.build_tile_plan`)."""
    return tl.load(cnt_row), tl.load(cnt_row + 1), tl.load(cnt_row + 2)


@triton.jit
def query_group(qg_ptr, pid, offs_m, BLOCK_M: tl.constexpr, SEG: tl.constexpr):
    """Program pid's query group (`query_groups.build_query_groups`): (head, list tile, rows (BLOCK_M,) int32,
    m_ok (BLOCK_M,) bool) from its table row (head, list tile, BLOCK_M / SEG row segments)."""
    g_row = qg_ptr + pid * (2 + BLOCK_M // SEG)
    rows, m_ok = pack_rows(g_row + 2, 0, BLOCK_M // SEG, 0, offs_m, BLOCK_M, SEG)
    return tl.load(g_row), tl.load(g_row + 1), rows, m_ok


@triton.jit
def pack_rows(plan_row, nf, ng, p, offs_n, BLOCK_N: tl.constexpr, SEG: tl.constexpr):
    """Token rows of pack p of a tile plan row (`tile_plan.build_tile_plan`): the partial tiles' tokens in plan
    groups [p * BLOCK_N / SEG, (p + 1) * BLOCK_N / SEG), as rows (BLOCK_N,) int32 and n_ok (BLOCK_N,) bool (False
    past a group's tokens and past the row's ng groups). The groups are read as BLOCK_N / SEG scalar loads, which
    Triton's software pipeliner prefetches as it does the q2k entries (one vector load of each row's group word
    instead: 7% slower on the H200 forward, BENCHMARKS.md "rocm-vsa")."""
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
def load_rows(base_a, base_b, rows, n_ok, stride_a, stride_b, offs_d, d_ok, DOT_FP32: tl.constexpr,
              EVICT: tl.constexpr = "", CACHE: tl.constexpr = ""):
    """Gather rows (R,) of two (S, BLOCK_D) tensors by pointer loads (EVICT / CACHE hints), zero where n_ok is
    False."""
    mask = n_ok[:, None] & d_ok[None, :]
    a = tl.load(base_a + rows[:, None] * stride_a + offs_d[None, :], mask=mask, other=0.0, eviction_policy=EVICT,
                cache_modifier=CACHE)
    c = tl.load(base_b + rows[:, None] * stride_b + offs_d[None, :], mask=mask, other=0.0, eviction_policy=EVICT,
                cache_modifier=CACHE)
    if DOT_FP32:
        a = a.to(tl.float32)
        c = c.to(tl.float32)
    return a, c



@triton.jit
def load_k_vt(k_desc, v_desc, k_base, v_base, k_start, rows, v_col, v_cols, n_ok, row0, col0, vt_row0, stride_ks,
              stride_vd, offs_d, d_ok, TMA: tl.constexpr, VT_TMA: tl.constexpr, MASK: tl.constexpr,
              DOT_FP32: tl.constexpr, EVICT: tl.constexpr = "", CACHE: tl.constexpr = ""):
    """The 8-bit fine stage's tiles of one key step: K (BLOCK_N, BLOCK_D) as the other loaders load it and V^T
    (BLOCK_D, BLOCK_N) from V in tile slots (`sage.v_slots`: per (batch, head) a (D, T*64) block, tile t's tokens
    at columns 64 t.., zeros past them in the slot, channels stride_vd apart), for the P.V dot as tl.trans(vt): a
    K-major B operand (Hopper's fp8 wgmma takes no other). K: with TMA the box of the (B*S, H*D) descriptor at
    (row0 + k_start, col0) (past a partial tile's end it holds the next tokens: the caller masks them); else
    pointer loads of the tokens `rows` (BLOCK_N,). V^T: with VT_TMA the box of the (B*H*D, T*64) descriptor at
    (vt_row0, v_col) (`tma_descs_v_t`; v_col a slot start, a multiple of 64), else pointer loads of the columns
    v_cols (BLOCK_N,), unmasked along the tokens, so as wide as the caller's hints on v_cols let them be
    (tl.multiple_of / tl.max_contiguous): columns where n_ok is False stay inside a slot (its zeros or its tile's
    tokens), finite values multiplied by P = 0. K's pointer loads zero the tokens where n_ok is False when MASK
    (EVICT / CACHE hints)."""
    if MASK:
        k_mask = n_ok[:, None] & d_ok[None, :]
    else:
        k_mask = d_ok[None, :]
    v_mask = d_ok[:, None]
    if TMA:
        k = k_desc.load([row0 + k_start, col0])
    else:
        k = tl.load(k_base + rows[:, None] * stride_ks + offs_d[None, :], mask=k_mask, other=0.0,
                    eviction_policy=EVICT, cache_modifier=CACHE)
    if VT_TMA:
        vt = v_desc.load([vt_row0, v_col])
    else:
        vt = tl.load(v_base + offs_d[:, None] * stride_vd + v_cols[None, :], mask=v_mask, other=0.0,
                     eviction_policy=EVICT, cache_modifier=CACHE)
    if DOT_FP32:  # the interpreter's dots take fp32 operands (exact for int8 / e4m3 values)
        k, vt = k.to(tl.float32), vt.to(tl.float32)
    return k, vt


# ------------------------------------------------------------------------------------------------ host side


def size_classes(launch: tuple[tuple[int, int, int], ...], block_d: int,
                 dtype: torch.dtype) -> list[tuple[int, int, int, int]]:
    """The launches of one kernel: (block, len_lo, num_warps, num_stages) per size class, from a validated
    `KernelTuning` launch (block, num_warps, num_stages) per class, smallest block first, the last 64 (every tile
    has a class). fp32 inputs from FP32_WIDE_BLOCK_D on take FP32_WIDE_NUM_STAGES stages (shared memory)."""
    entries = sorted(launch)
    fp32_wide = dtype == torch.float32 and block_d >= FP32_WIDE_BLOCK_D
    out, lo = [], 0
    for blk, warps, stages in entries:
        out.append((blk, lo, warps, FP32_WIDE_NUM_STAGES if fp32_wide else stages))
        lo = blk
    return out


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k: torch.Tensor, q2k_cnt: torch.Tensor,
                 tile_offsets: torch.Tensor) -> None:
    """Raise ValueError unless q, k, v (B, S, H, D) share shape and dtype (bf16 / fp16 / fp32), D <= 256 with unit
    stride, q2k (B, H, n_tiles, K) and q2k_cnt (B, H, n_tiles) match, and the index tensors are int32."""
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


TMA_DTYPES = (torch.bfloat16, torch.float16)  # what the bf16 kernels read by TMA
TMA_DTYPES_8BIT = (torch.int8, torch.float8_e4m3fn)  # and the 8-bit fine stage's K / V (`sage_attn`)


def tma_layout_ok(x: torch.Tensor, dtypes: tuple[torch.dtype, ...] = TMA_DTYPES) -> bool:
    """Whether x (B, S, H, D) can be read as the 2D (B*S, H*D) tensor of a TMA descriptor with (64, D) boxes:
    a dtype of `dtypes` (bf16 / fp16 by default), D a power of two >= 16 (no padding columns), heads contiguous
    within a token, batches spaced S tokens apart, a 16-byte aligned base and token stride."""
    b, s, h, d = x.shape
    if x.dtype not in dtypes or d < 16 or d & (d - 1):
        return False
    es = x.element_size()
    return (x.stride(3) == 1 and x.stride(2) == d and x.stride(1) >= h * d
            and (b == 1 or x.stride(0) == s * x.stride(1)) and x.data_ptr() % 16 == 0 and (x.stride(1) * es) % 16 == 0)


def use_tma(*xs: torch.Tensor, wanted: bool, dtypes: tuple[torch.dtype, ...] = TMA_DTYPES) -> bool:
    """Whether the kernels fetch tiles of xs (each (B, S, H, D)) by TMA: only when `wanted` (a tuning's
    `tma_loads`, which says whether the device should), this Triton has host-side tensor descriptors (>= 3.4)
    and the layout allows it (`tma_layout_ok`). Under the interpreter TMA is emulated, so a tuning with
    tma_loads=True runs it on CPU (the tests do). With TMA the box of a partial tile also covers the rows after it
    (the next tile's tokens, or zeros past the tensor's end); the kernels mask them in the scores, so inputs must
    be finite there as everywhere (0 * inf would leak). dtypes: as `tma_layout_ok`."""
    return bool(wanted) and have_tensor_descriptors() and all(tma_layout_ok(x, dtypes) for x in xs)


@functools.cache
def have_tensor_descriptors() -> bool:
    """Whether this Triton has host-side tensor descriptors (`triton.tools.tensor_descriptor`, Triton >= 3.4; the
    project allows 3.2): without them every tile is fetched by pointer loads."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return True


def tma_descs(tma: bool, *xs: torch.Tensor) -> tuple:
    """The kernels' descriptor arguments for xs (each (B, S, H, D)): with `tma`, host-side TMA descriptors of each
    as a (B*S, H*D) tensor with (64, D) boxes (`tma_layout_ok`); else the tensors themselves (unused by the
    kernels' pointer-load path)."""
    if not tma:
        return xs
    from triton.tools.tensor_descriptor import TensorDescriptor

    return tuple(TensorDescriptor(x, shape=[x.shape[0] * x.shape[1], x.shape[2] * x.shape[3]],
                                  strides=[x.stride(1), 1], block_shape=[BLOCK, x.shape[3]]) for x in xs)


def v_t_tma_ok(vt: torch.Tensor) -> bool:
    """Whether the fp8 V in tile slots (`sage.v_slots`, (B, H, D, T, 64) contiguous) can be read by TMA as the 2D
    (B*H*D, T*64) tensor of its storage with (D, 64) boxes: D a power of two in [16, 256], a 16-byte aligned base
    (the row stride T*64 bytes and every box start, a slot start, are multiples of 64 bytes)."""
    d = vt.shape[2]
    return vt.dim() == 5 and vt.shape[4] == BLOCK and vt.is_contiguous() and 16 <= d <= 256 and not d & (d - 1) \
        and vt.data_ptr() % 16 == 0


def tma_descs_v_t(vt: torch.Tensor):
    """The TMA descriptor of the fp8 V in tile slots (`v_t_tma_ok`): (B*H*D, T*64) rows, (D, 64) boxes."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    b, h, d, t, slot = vt.shape
    return TensorDescriptor(vt, shape=[b * h * d, t * slot], strides=[t * slot, 1], block_shape=[d, BLOCK])


def q2k_lists(q2k: torch.Tensor, q2k_cnt: torch.Tensor, tile_offsets: torch.Tensor, seq_len: int, pack: bool
              ) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """What the forward and dQ kernels loop over, and their PACK switch: the tile plans of the q2k rows and their
    (B, H, Q_TILES, 4) counts (`tile_plan.build_tile_plan`) when `pack` (a tuning's pack_partial_tiles), the
    layout has partial tiles (seq_len < 64 * n_tiles, known without reading tile_offsets) and seq_len < 2^27 (the
    plans' packed rows), else q2k and q2k_cnt. With every tile full the packed kernels' full-tile loop is 4-8%
    slower than the plain loop (H200, the 1.3B grid cropped to 20x28x52: 1.56-1.59 against 1.47-1.50 ms), so
    those layouts keep the plain loop."""
    q2k = q2k if q2k.shape[-1] <= 1 or q2k.stride(-1) == 1 else q2k.contiguous()  # the loops read rows as runs
    if not pack or seq_len == BLOCK * (tile_offsets.numel() - 1) or seq_len >= PLAN_MAX_ROWS:
        return q2k, q2k_cnt, False
    plan, plan_cnt = tile_plan.build_tile_plan(q2k, q2k_cnt, tile_offsets)
    return plan, plan_cnt, True


def check_fp32_bwd(q: torch.Tensor) -> None:
    """Raise ValueError for fp32 inputs with D > FP32_BWD_MAX_BLOCK_D on a GPU (the backward's shared memory)."""
    if q.dtype == torch.float32 and q.shape[-1] > FP32_BWD_MAX_BLOCK_D and not interpreting():
        raise ValueError(f"the fp32 backward supports head dims up to {FP32_BWD_MAX_BLOCK_D} on a GPU (shared "
                         f"memory), got {q.shape[-1]}; use bf16 / fp16 inputs")
