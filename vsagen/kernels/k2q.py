"""Triton transpose of VSA's tile selection: per-key-tile query lists (k2q) from per-query-tile key lists (q2k).

The block-sparse backward (`block_sparse_attn.bsa_bwd`) computes dK and dV one key tile at a time, as
FlashAttention-2's backward does (Dao, arXiv 2307.08691, alg. 2: the outer loop runs over key blocks), so each key
tile needs the list of query tiles that selected it: the transpose of the forward's q2k lists (VSA paper,
arXiv 2505.13389, sec. 2, fine stage). `build_k2q_triton` builds it in two launches, a drop-in for the torch
`reference.build_k2q` (about ten launches; 0.37 ms on the H200 at the Wan2.1-1.3B 480p shape inside the
backward, 0.26 ms of GPU time alone, below):

    _k2q_map_kernel      one program per (b, h, query tile i): writes row i of a (B, H, Q_TILES, KV_TILES) uint8
                         block map: zeros over the whole row, a CTA barrier, then 1 at each of the first q2k_cnt[i]
                         entries of q2k row i. Each row belongs to one program, so no memset launch is needed and
                         no two programs write one byte.
    _k2q_compact_kernel  one program per (b, h, group of KV_GROUP key tiles): reads the group's columns of the map
                         CHUNK_Q query tiles at a time (KV_GROUP contiguous bytes per map row), ranks the selected
                         query tiles with tl.cumsum down each column (carrying the running count across chunks),
                         stores each selected i at k2q[j, rank], then the count, then zeros over positions
                         [k2q_cnt[j], Q_TILES).

Bytes at the Wan2.1-1.3B 480p shape (B=1, H=12, 624 tiles, K=78, so 584,064 selected pairs): the map kernel reads
2.3 MB of q2k (used entries only) and writes the 4.7 MB map (plus the 0.6 MB of ones, scattered within each
row); the compaction kernel reads the 4.7 MB map (L2-resident) and writes the 18.7 MB k2q (every entry once:
the selected ones at their rank, zeros past the count) and 30 KB of counts. The torch version also writes an
int64 destination tensor (37 MB) and a cumsum over the transposed map.

Cost on the H200 (torch 2.11, triton 3.6; do_bench_cudagraph, i.e. GPU time only; `benchmarks/k2q.py` reruns the
1.3B case). Wan2.1-1.3B 480p: 23.4 us against 260.5 us for the torch `build_k2q` in the same run. With the earlier
(KV_GROUP 8, CHUNK_Q 512) compaction (26.7 us in all) the profiler split it into 6.1 us for the map kernel and
20.4 us for the compaction, which is latency- rather than bandwidth-bound at this size (its 23 MB of traffic
would take ~7 us at 3.5 TB/s). At that same earlier configuration: Wan2.1-14B 720p (B=1, H=40, 1,440 tiles,
K=180) 288 us against 4,234 us; 4,096 tiles (B=1, H=12, K=512) 675 us against 9,806 us (about twice the time
the bytes need there: an 83 / 201 MB map that no longer fits in L2, written and read once, and a 332 / 805 MB
k2q). With launch overhead (triton.testing.do_bench) the two Triton launches measured 35 - 110 us across
configurations against 281 us for torch's ten: on that host the Python launch cost, not the GPU, sets the
do_bench figure.

Layout contract (as `reference.build_k2q`):
    q2k: (B, H, Q_TILES, K) int32 or int64, any strides; the first q2k_cnt[b, h, i] entries of row i used, each in
         [0, KV_TILES), no repeats (repeats are harmless here: they set the same map byte); entries past
         q2k_cnt are never read
    q2k_cnt: (B, H, Q_TILES) int32 or int64, any strides, in [0, K] (values outside are clamped to it, as the
             torch version's `arange(K) < q2k_cnt` mask does)
    k2q: (B, H, KV_TILES, Q_TILES) int32, contiguous; row j lists ascending every query tile i whose first
         q2k_cnt[i] entries contain j, then 0 up to the end of the row
    k2q_cnt: (B, H, KV_TILES) int32, contiguous

Differences from `build_k2q`: k2q is a contiguous tensor (the torch version returns a view of a (.., Q_TILES + 1)
padded buffer); values and shapes are identical, so torch.equal holds. A used q2k entry outside [0, KV_TILES) is
dropped here (never written out of bounds), where the torch version raises (CPU) or trips a device assert (CUDA);
it is a contract violation either way.

Unsupported: autograd (integer outputs), Q_TILES * KV_TILES of 2^31 or more (int32 offsets within one (b, h);
the (b, h) offsets are int64).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Tuning: ranked on the H200 (torch 2.11, triton 3.6) at the Wan2.1-1.3B 480p shape with
# triton.testing.do_bench_cudagraph (GPU time; whole build_k2q_triton). Compaction (KV_GROUP, CHUNK_Q, warps):
# (16, 256, 4) 23.4 us, (8, 512, 4) 26.7, (4, 1024, 4) 27.3, (8, 512, 2) 27.6, (1, 1024, 4) 41.2, (32, 256, 8) 41.8.
# Map kernel at 1 warp instead of 4: 26.9 vs 26.7 us. Zeroing the map with torch.zeros instead of in the map
# kernel: 29.0 vs 26.7 us. The torch build_k2q took 260.5 us in the same run.
#
# Compaction: one program per (b, h, KV_GROUP key tiles), walking the query tiles CHUNK_Q at a time (both powers
# of two; a (CHUNK_Q, KV_GROUP) int32 tile lives in registers, so their product bounds register use).
# Q_TILES <= CHUNK_Q is one chunk; longer videos loop with the running count carried. The tests monkeypatch
# CHUNK_Q small to exercise the loop.
KV_GROUP = 16
CHUNK_Q = 256
COMPACT_NUM_WARPS = 4
# Map kernel: a row of the block map is zeroed CHUNK_KV bytes at a time and the q2k row read CHUNK_K entries at a
# time (both powers of two).
CHUNK_KV = 4096
CHUNK_K = 1024
MAP_NUM_WARPS = 4
# True: each map program zeroes its own row before scattering (one launch, a CTA barrier in between); False: the
# map is zeroed by torch.zeros (a memset launch) and the map kernel only scatters. Kept as a switch for timing.
ZERO_IN_KERNEL = True


@triton.jit
def _k2q_map_kernel(
    q2k_ptr, cnt_ptr, map_ptr,
    stride_ib, stride_ih, stride_iq, stride_ik,
    stride_cb, stride_ch, stride_cq,
    num_heads, num_q_tiles, num_kv_tiles, top_k,
    BLOCK_K: tl.constexpr, BLOCK_KV: tl.constexpr, ZERO_ROW: tl.constexpr,
):
    """One program: row i of the (B, H, Q_TILES, KV_TILES) uint8 block map of one (batch, head): 1 at the key tiles
    among the first q2k_cnt[i] entries of q2k row i, 0 elsewhere (the zeros only when ZERO_ROW)."""
    pid_q = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    row = map_ptr + (pid_bh.to(tl.int64) * num_q_tiles + pid_q) * num_kv_tiles
    if ZERO_ROW:
        offs_kv = tl.arange(0, BLOCK_KV)
        for c in range(0, num_kv_tiles, BLOCK_KV):
            tl.store(row + c + offs_kv, tl.zeros([BLOCK_KV], dtype=tl.uint8), mask=c + offs_kv < num_kv_tiles)
        # Every zero of this row is stored before any of its ones (threads of the program write both).
        tl.debug_barrier()
    cnt = tl.load(cnt_ptr + b.to(tl.int64) * stride_cb + h * stride_ch + pid_q * stride_cq).to(tl.int32)
    cnt = tl.minimum(tl.maximum(cnt, 0), top_k)
    q2k_row = q2k_ptr + b.to(tl.int64) * stride_ib + h * stride_ih + pid_q.to(tl.int64) * stride_iq
    offs_k = tl.arange(0, BLOCK_K)
    for r in range(0, cnt, BLOCK_K):
        used = r + offs_k < cnt
        kv = tl.load(q2k_row + (r + offs_k) * stride_ik, mask=used, other=0)  # (BLOCK_K,) int32 / int64
        ok = used & (kv >= 0) & (kv < num_kv_tiles)  # checked before any narrowing
        tl.store(row + kv, tl.full([BLOCK_K], 1, dtype=tl.uint8), mask=ok)


@triton.jit
def _k2q_compact_kernel(
    map_ptr, k2q_ptr, k2q_cnt_ptr, off_ptr,
    num_q_tiles, num_kv_tiles,
    BLOCK_Q: tl.constexpr, BLOCK_J: tl.constexpr, ROWS: tl.constexpr = False,
):
    """One program: rows j0 .. j0 + BLOCK_J - 1 of k2q and k2q_cnt of one (batch, head), from the same columns of
    the block map (k2q and k2q_cnt contiguous). ROWS: each entry is (start << 7) | length of the query tile (from
    the tile offsets at off_ptr), else its id."""
    pid_j = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    offs_j = pid_j * BLOCK_J + tl.arange(0, BLOCK_J)
    j_ok = offs_j < num_kv_tiles
    offs_q = tl.arange(0, BLOCK_Q)
    map_base = map_ptr + pid_bh * num_q_tiles * num_kv_tiles
    out_rows = k2q_ptr + pid_bh * num_kv_tiles * num_q_tiles + offs_j * num_q_tiles  # (BLOCK_J,) row starts
    run = tl.zeros([BLOCK_J], dtype=tl.int32)  # (BLOCK_J,) selected query tiles so far, per key tile
    for c in range(0, num_q_tiles, BLOCK_Q):
        qs = c + offs_q
        ok = (qs < num_q_tiles)[:, None] & j_ok[None, :]
        sel = tl.load(map_base + qs[:, None] * num_kv_tiles + offs_j[None, :], mask=ok, other=0)
        sel = (sel != 0).to(tl.int32)  # (BLOCK_Q, BLOCK_J)
        rank = tl.cumsum(sel, axis=0) + (run - 1)[None, :]  # (BLOCK_Q, BLOCK_J) slot in row j, if selected
        if ROWS:
            start = tl.load(off_ptr + qs, mask=qs < num_q_tiles, other=0)
            entry = (start << 7) | (tl.load(off_ptr + qs + 1, mask=qs < num_q_tiles, other=0) - start)
        else:
            entry = qs
        tl.store(out_rows[None, :] + rank, entry[:, None] + tl.zeros_like(rank), mask=sel != 0)
        run += tl.sum(sel, axis=0)
    tl.store(k2q_cnt_ptr + pid_bh * num_kv_tiles + offs_j, run, mask=j_ok)
    # Zeros past the count, as the torch version leaves there (stored row-major: unit stride along axis 1).
    for c in range(0, num_q_tiles, BLOCK_Q):
        ps = c + offs_q
        tail = j_ok[:, None] & (ps[None, :] >= run[:, None]) & (ps < num_q_tiles)[None, :]  # (BLOCK_J, BLOCK_Q)
        tl.store(out_rows[:, None] + ps[None, :], tl.zeros([BLOCK_J, BLOCK_Q], dtype=tl.int32), mask=tail)


def _check_k2q_inputs(q2k: torch.Tensor, q2k_cnt: torch.Tensor, num_kv_tiles: int) -> None:
    if q2k.dim() != 4 or q2k_cnt.shape != q2k.shape[:3]:
        raise ValueError(f"q2k must be (B, H, Q_TILES, K) and q2k_cnt (B, H, Q_TILES); got {tuple(q2k.shape)} "
                         f"and {tuple(q2k_cnt.shape)}")
    if q2k.dtype not in (torch.int32, torch.int64) or q2k_cnt.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"q2k and q2k_cnt must be int32 or int64, got {q2k.dtype} and {q2k_cnt.dtype}")
    if q2k.device != q2k_cnt.device:
        raise ValueError(f"q2k and q2k_cnt must be on one device, got {q2k.device} and {q2k_cnt.device}")
    if not isinstance(num_kv_tiles, int) or num_kv_tiles < 0:
        raise ValueError(f"num_kv_tiles must be a non-negative int, got {num_kv_tiles!r}")
    if q2k.shape[2] * num_kv_tiles >= 1 << 31:
        raise ValueError(f"Q_TILES * KV_TILES = {q2k.shape[2] * num_kv_tiles} must stay below 2^31")


def build_k2q_triton(q2k: torch.Tensor, q2k_cnt: torch.Tensor, num_kv_tiles: int,
                     tile_offsets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Transpose the q2k lists in Triton: for each key tile, the query tiles that selected it, ascending.

    Same contract and values as `reference.build_k2q` (exact, deterministic: no atomics, every output
    entry written by one program), in two launches on q2k's device plus three allocations (module docstring).

    Args:
        q2k: (B, H, Q_TILES, K) int32 or int64, any strides; the first q2k_cnt entries of each row used, each in
            [0, num_kv_tiles), no repeats within a row (not checked; a repeat is harmless); entries past
            q2k_cnt are never read. An entry out of range is dropped.
        q2k_cnt: (B, H, Q_TILES) int32 or int64 in [0, K] (clamped to it).
        num_kv_tiles: KV_TILES >= 0.
        tile_offsets: optional (Q_TILES + 1,) int32 tile starts (at most 64 tokens per tile, fewer than 2^24
            tokens): then each entry is the query tile's (start row << 7) | length instead of its id (the
            pre-offset entries of `KernelTuning.lean_index`: the dK/dV loop reads one word per query tile).

    Returns:
        k2q: (B, H, KV_TILES, Q_TILES) int32, contiguous; row j lists ascending every query tile i whose first
            q2k_cnt[i] entries contain j (its id, or its (start << 7) | length with tile_offsets), and holds 0
            past k2q_cnt[j].
        k2q_cnt: (B, H, KV_TILES) int32, contiguous.

    Raises:
        ValueError: q2k not 4-D, q2k_cnt not (B, H, Q_TILES), dtypes other than int32 / int64, tensors on two
            devices, a negative or non-int num_kv_tiles, Q_TILES * KV_TILES >= 2^31, or tile_offsets not an
            int32 (Q_TILES + 1,) tensor.

    Source: the dK / dV pass of FlashAttention-2's backward (arXiv 2307.08691, alg. 2) walks key blocks, so VSA's
    block-sparse backward (arXiv 2505.13389, sec. 2) needs each key tile's query list.
    """
    _check_k2q_inputs(q2k, q2k_cnt, num_kv_tiles)
    b, h, n_q, top_k = q2k.shape
    if tile_offsets is not None and (tile_offsets.dtype != torch.int32 or tile_offsets.shape != (n_q + 1,)):
        raise ValueError(f"tile_offsets must be int32 ({n_q + 1},), got {tile_offsets.dtype} "
                         f"{tuple(tile_offsets.shape)}")
    dev = q2k.device
    k2q = torch.empty((b, h, num_kv_tiles, n_q), dtype=torch.int32, device=dev)
    k2q_cnt = torch.empty((b, h, num_kv_tiles), dtype=torch.int32, device=dev)
    if b * h * num_kv_tiles == 0:
        return k2q, k2q_cnt
    if n_q == 0:
        return k2q, k2q_cnt.zero_()
    alloc = torch.empty if ZERO_IN_KERNEL else torch.zeros
    block_map = alloc((b, h, n_q, num_kv_tiles), dtype=torch.uint8, device=dev)
    _k2q_map_kernel[(n_q, b * h)](
        q2k, q2k_cnt, block_map,
        q2k.stride(0), q2k.stride(1), q2k.stride(2), q2k.stride(3),
        q2k_cnt.stride(0), q2k_cnt.stride(1), q2k_cnt.stride(2),
        h, n_q, num_kv_tiles, top_k,
        BLOCK_K=min(CHUNK_K, triton.next_power_of_2(max(top_k, 1))),
        BLOCK_KV=min(CHUNK_KV, triton.next_power_of_2(num_kv_tiles)), ZERO_ROW=ZERO_IN_KERNEL,
        num_warps=MAP_NUM_WARPS,
    )
    block_j = min(KV_GROUP, triton.next_power_of_2(num_kv_tiles))
    _k2q_compact_kernel[(triton.cdiv(num_kv_tiles, block_j), b * h)](
        block_map, k2q, k2q_cnt, k2q_cnt if tile_offsets is None else tile_offsets, n_q, num_kv_tiles,
        BLOCK_Q=min(CHUNK_Q, triton.next_power_of_2(n_q)), BLOCK_J=block_j, ROWS=tile_offsets is not None,
        num_warps=COMPACT_NUM_WARPS,
    )
    return k2q, k2q_cnt
