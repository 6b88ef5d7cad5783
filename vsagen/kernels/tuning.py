"""Kernel tuning as data: how the Triton kernels fetch tiles, shape their loops and launch, per device and head dim.

A `KernelTuning` is a frozen value; nothing here is decided at import and no mutable global is read at call time.
The launchers (`bsa_forward.bsa_fwd`, `bsa_backward.bsa_bwd`, `block_sparse_attn.block_sparse_attention`,
`coarse.coarse_stage`, `coarse.tile_scores_triton`) take one explicitly, and `None` means
`kernel_tuning(q.device, D)`: the defaults of the device's architecture (`ARCH_DEFAULTS`) with the launch tables'
row for the head dim (`FWD_LAUNCH`, `BWD_DQ_LAUNCH`, `BWD_DKDV_LAUNCH`). Benchmarks and tests derive variants with
`dataclasses.replace`.

Architectures (`device_arch`): "sm90" (NVIDIA Hopper, compute capability 9.x) and "sm100" (datacenter Blackwell,
10.x) fetch tiles by TMA; "nvidia" (other NVIDIA majors, >= 8) and "nvidia-pre-sm80" by pointer loads; "rocm-cdna3"
(torch.version.hip set and capability 9.4: gfx942, MI300X / MI325X), "rocm-cdna4" (9.5: gfx950, MI350X / MI355X)
and "rocm" (other AMD GPUs) never by TMA, with one backward stream and their own launch tables (`HIP_LAUNCH`); "cpu"
(CPU tensors, or any tensor under the Triton interpreter, TRITON_INTERPRET=1 read at call time) none of these.

Profiles: `kernel_tuning(device, head_dim, profile)` serves the `vsa` backend ("vsa") and `rocm-vsa` ("rocm-vsa":
the ROCm seed's three kernel changes, `ROCM_VSA_CHANGES`, on top of the architecture's defaults).

No triton import here: this module, like `reference`, loads without the Linux-only dependency.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from types import MappingProxyType

import torch

SCORE_PRECISIONS = ("bf16", "tf32", "tf32x3", "ieee")
BLOCK_DS = (16, 32, 64, 128, 256)  # BLOCK_D of a head dim: the next power of two, at least 16
TILE = 64  # tokens of a full tile: the largest size class

# One kernel's launches: (block, num_warps, num_stages) per tile-size class, smallest block first, the last 64.
Launch = tuple[tuple[int, int, int], ...]
# One kernel's AMD compiler options, for every size class: (waves_per_eu, matrix_instr_nonkdim, kpack); () off HIP.
HipOptions = tuple[int, ...]
HIP_OPTION_NAMES = ("waves_per_eu", "matrix_instr_nonkdim", "kpack")

# How the block-sparse loops load the operands they stream once per program (K / V in the forward and dQ loops,
# Q / dO in the dK/dV loop; seed 002's second change). "cached": plain loads. "evict_first":
# eviction_policy="evict_first" (NVIDIA: the L1 / L2 evict-first policy; Triton 3.8's AMD backend drops it: the
# AMDGCN loads are the same as plain ones, checked by compiling for gfx942 / gfx950). "streaming":
# cache_modifier=".cg" (NVIDIA: ld.global.cg, cached in L2 only; AMD: the `nt` non-temporal bit on global_load /
# buffer_load, the form in which an evict-first hint reaches AMD hardware; Triton 3.8 emits nt for ".cg" and
# ".cs" alike, and the H200's Triton 3.6 failed to compile ".cs" loads, so ".cg"). On sm_90 Triton's software
# pipeliner turns these loads into cp.async.cg copies or TMA boxes, which carry neither hint: the PTX is the same in
# all three modes (offline sm_90 compile, triton 3.8), and so were the H200 timings (BENCHMARKS.md, "rocm-vsa").
ONE_PASS_LOADS = ("cached", "evict_first", "streaming")

# ------------------------------------------------------------------------------------------- launch tables
# Launch parameters by BLOCK_D, for bf16 / fp16 inputs: one launch per tile-size class, each entry
# (block, num_warps, num_stages). A class's programs handle the tiles with more than the next smaller class's
# block and at most `block` tokens (the others exit at once), with `block` rows: the forward and dQ kernels split
# query tiles this way, the dK/dV kernel key tiles; the loop inside still takes whole 64-row tiles. The partial
# tiles at grid edges (27% of the Wan2.1-1.3B 480p tiles hold 8, 16 or 32 tokens) then stop paying for 64 rows.
# One class (64, ...) is the plain launch. fp32 inputs from BLOCK_D 128 on take one stage whatever the table says
# (shared memory: `bsa_primitives.FP32_WIDE_NUM_STAGES`).
# Forward, BLOCK_D 128, one class: swept on the H200 at the Wan2.1-1.3B 480p shape, 87.5% sparsity
# (benchmarks/attention.py --sweep): with pointer loads (num_warps, num_stages) (4, 2) / (4, 3) / (4, 4) / (8, 2) /
# (8, 3) took 3.18 / 2.94 / 3.11 / 6.91 / 5.92 ms; with TMA loads (4, 2) / (4, 3) / (4, 4) 3.04 / 2.70 / 3.55 ms and
# 16 / 32 / 64-row classes at (4, 3) 2.78 ms. (4, 3) is the largest pipeline at which two programs share an SM
# (114.7 KB of shared memory each).
FWD_LAUNCH = MappingProxyType({16: ((64, 4, 3),), 32: ((64, 4, 3),), 64: ((64, 4, 3),), 128: ((64, 4, 3),),
                               256: ((64, 4, 3),)})

# Backward, BLOCK_D 128, one class: swept on the H200 (torch 2.11, triton 3.6; benchmarks/attention.py
# --sweep-bwd, Wan2.1-1.3B 480p shape, 87.5% sparsity): with dK/dV at (8, 2) the dQ choices (4, 2) / (4, 3) /
# (8, 2) / (8, 3) gave a whole backward of 14.6 / 15.8 / 18.8 / 17.7 ms; with dQ at (4, 3) the dK/dV choices
# (4, 2) / (4, 3) / (8, 1) / (8, 2) / (8, 3) gave 10.3 / 10.1 / 16.6 / 15.8 / 16.3 ms. So 4 warps win for both,
# although the offline ptxas report showed the 4-warp dK/dV kernel spilling a little. Other BLOCK_D: from the
# offline sm_90 compile (triton 3.8 ptxas register counts): at <= 64 both kernels fit in ~205 registers with 4
# warps; at 256 both spill whatever the warps and one stage keeps the (64, 256) operand tiles within shared
# memory. Not yet timed on a GPU.
# Size classes at BLOCK_D 128 (same sweep, 2026-11-29, whole backward 9.03 ms with one class each): dK/dV with
# (16, 4, 2), (32, 4, 2), (64, 4, 3) took 8.57 ms (with (32, 4, 3), (64, 4, 3): 9.13; (32, 2, 3), (64, 4, 3): 9.71);
# dQ with (16, 4, 2), (32, 4, 2), (64, 4, 2) took 8.95 ms (the others 8.96 - 9.09). The forward gained nothing
# from classes (one class 2.96 ms; 16/32/64 at 4 warps 3.01; fewer warps for the small classes 3.25 - 3.49).
# Re-swept with TMA loads (same day): the whole backward (k2q prebuilt) took 8.18 - 9.02 ms over five dQ and five
# dK/dV tables, the tables below within 0.17 ms of the best (run-to-run spread ~0.15 ms), so they stay.
BWD_DQ_LAUNCH = MappingProxyType({16: ((64, 4, 3),), 32: ((64, 4, 3),), 64: ((64, 4, 3),),
                                  128: ((16, 4, 2), (32, 4, 2), (64, 4, 2)), 256: ((64, 8, 1),)})
BWD_DKDV_LAUNCH = MappingProxyType({16: ((64, 4, 3),), 32: ((64, 4, 3),), 64: ((64, 4, 3),),
                                    128: ((16, 4, 2), (32, 4, 2), (64, 4, 3)), 256: ((64, 8, 1),)})

# ------------------------------------------------------------------------------------------ AMD launch tables
# HIP launch tables (seed 002's first change: forward and backward tuning spaces of their own on AMD) for the
# "rocm-cdna3" (gfx942) / "rocm-cdna4" (gfx950) / "rocm" architectures, one row for every BLOCK_D up to 128 and one
# for 256. Nothing here was timed: no AMD GPU is lent. The choices come from (1) the published HIP configs
# (FastVideo PR #1860 for VSA's Triton kernel on MI355X: MFMA 16x16, kpack 1 / 2, waves_per_eu 1 / 2, 4 or 8 warps,
# 2 stages; seed 002: num_stages tuned per pass) and (2) a sweep of the AMDGCN resource use at D = 128 (Wan's head
# dim) of every (num_warps 4 / 8, num_stages 1 / 2, waves_per_eu 0 / 1 / 2, kpack 1 / 2) config compiled on the CPU
# (`kernels/amd_build.py`, triton 3.8; the table in BENCHMARKS.md). Rules: no spill, LDS within the target, the
# one-pass hints still on the emitted loads, then the most waves per SIMD (512 unified VGPRs per lane), then the
# deeper pipeline. What the sweep showed:
# * forward: 2 stages spill at 4 warps with waves_per_eu 2 (45 VGPRs on gfx942); 8 warps at 2 stages hold 178 VGPRs
#   on gfx942 (2 waves per SIMD, 40 KiB LDS: one 8-wave workgroup per CU, also 2) and 149 on gfx950 (3 waves).
# * dQ: one stage; at 2 stages the 32- and 64-row classes spill or lose their hints on gfx942. At 4 warps the
#   64-row class spills 12-19 SGPRs on gfx942 whatever waves_per_eu and kpack; at 8 warps with kpack 2 it holds
#   256 VGPRs and no spill (2 waves; kpack 1 spills 2 VGPRs). gfx950: 178 VGPRs at 8 warps (2 waves).
# * dK/dV: the 64-row class needs 361-408 VGPRs at 4 warps on gfx942 (one wave) and 205 at 8 warps, kpack 1 (two);
#   kpack 2 spills it (40); one stage (at 2, 300-450 VGPRs or lost hints).
# kpack 2 packs two k-steps per MFMA operand load on CDNA3; Triton 3.8 forces kpack 1 on gfx950 (deprecated there).
# Size classes as on CUDA (the partial tiles' arithmetic saving does not depend on the vendor). The two targets'
# sweeps led to the same launches (their options differ). Also compiled without a spill at D = 64 and 96 (the same
# launches). "rocm" (other AMD GPUs, e.g. gfx90a): the same launches, kpack 1, no waves_per_eu; not checked (a
# gfx90a compile showed a dK/dV spill and no nt loads).
_CDNA_LAUNCH = (((64, 8, 2),), ((16, 4, 1), (32, 4, 1), (64, 8, 1)), ((16, 4, 1), (32, 4, 1), (64, 8, 1)))
# BLOCK_D 256 (not a Wan head dim), every AMD arch: forward, dQ, dK/dV launches and options. No waves_per_eu (at 1
# or 2 the allocator caps a wave at 256 VGPRs: every kernel spilled 46-165 on gfx942 at 8 warps); the forward at 4
# warps (383 VGPRs on gfx942, 256 on gfx950, no spill); the backward kernels spill at every config tried (90-280
# VGPRs at 4 or 8 warps: their (64, 256) fp32 dK / dV or dQ accumulators), as on CUDA (`BWD_DQ_LAUNCH`'s notes).
HIP_WIDE_LAUNCH = (((64, 4, 1),), ((64, 8, 1),), ((64, 8, 1),))
HIP_WIDE_OPTIONS = ((0, 16, 1),) * 3
# arch -> (forward, dQ, dK/dV) launch tables for BLOCK_D <= 128.
HIP_LAUNCH = MappingProxyType({"rocm-cdna3": _CDNA_LAUNCH, "rocm-cdna4": _CDNA_LAUNCH, "rocm": _CDNA_LAUNCH})
# arch -> (forward, dQ, dK/dV) options, each (waves_per_eu, matrix_instr_nonkdim, kpack), for BLOCK_D <= 128.
HIP_OPTIONS = MappingProxyType({
    "rocm-cdna3": ((2, 16, 2), (1, 16, 2), (1, 16, 1)),
    "rocm-cdna4": ((2, 16, 1), (2, 16, 1), (2, 16, 1)),
    "rocm": ((0, 16, 1), (0, 16, 1), (0, 16, 1)),
})

# ------------------------------------------------------------------------------------- per-architecture table
# arch -> (tma_loads, bwd_two_streams, score_precision); every arch takes the launch tables above and
# pack_partial_tiles = True (only the H200 has been timed: the tables and switches are its sweeps' winners).
#
# tma_loads: the loops fetch their 64-token tiles (K / V in the forward and dQ kernels, Q / dO in the dK/dV
# kernel) by TMA (tensor-descriptor boxes) where `bsa_primitives.use_tma` allows the layout, else by pointer
# loads. On the H200 at the Wan2.1-1.3B 480p shape TMA took the fine forward from 2.95 to 2.70 ms
# (benchmarks/fwd_variants.py, 2026-11-29, retired; BENCHMARKS.md): fewer address instructions and registers in
# the loop. Hopper (9.x) and datacenter Blackwell (10.x) have the bulk tensor copy engine; other NVIDIA majors
# take pointer loads. ROCm never: MI300 reports capability 9.4 through torch.cuda but has no TMA.
#
# bwd_two_streams: the backward's dQ and dK/dV kernels are independent (both need only delta): on CUDA the dQ
# launches go on a second stream so that the two kernels' size-class launches overlap (BENCHMARKS.md, "dQ on a
# second stream"). ROCm: HIP streams exist behind torch.cuda.Stream, but the overlap was never measured there, so
# one stream. CPU / the interpreter: one stream (there is no other).
#
# score_precision: tl.dot input precision of the coarse stage's score GEMM: "tf32" (fp32 range, 10-bit mantissa
# operands, fp32 accumulation; the default), "bf16" (operands rounded to bf16: 5 us faster on the H200 but 7x more
# tiles swapped at the top-k boundary), "tf32x3" (three TF32 products, ~fp32 accurate, 8 us more) or "ieee"
# (fp32 FMA, ~1.2 ms at the 1.3B shape: for debugging); fp32 accumulation in all four (coarse_triton.py's docstring
# has the H200 timings and the agreement with the fp32 oracle). NVIDIA before sm_80 has no TF32 and Triton's AMD
# backend allows "tf32" on CDNA3 (gfx942, MI300) only: elsewhere "ieee", the accurate choice there (untimed).
ARCH_DEFAULTS = MappingProxyType({
    "sm90": (True, True, "tf32"),
    "sm100": (True, True, "tf32"),
    "nvidia": (False, True, "tf32"),
    "nvidia-pre-sm80": (False, True, "ieee"),
    "rocm-cdna3": (False, False, "tf32"),
    "rocm-cdna4": (False, False, "ieee"),
    "rocm": (False, False, "ieee"),
    "cpu": (False, False, "tf32"),
})

# Packed tile plans (pack_partial_tiles): the forward and dQ kernels' loops take a tile plan
# (`tile_plan.build_tile_plan`): the full key tiles one per iteration, then the partial key tiles' tokens packed
# 64 to an iteration, instead of one padded 64-column block per selected tile. False: one tile per iteration (the
# q2k lists as they are), as also on layouts whose every tile is full (`bsa_primitives.q2k_lists`). On the H200
# (2026-11-29, 87.5% sparsity, the coarse stage's own selection) the packed loops compute 67% / 84% / 64% of the
# blocks at the 1.3B / 5B / 14B shapes, and the fine forward took 2.65 -> 2.01 ms, 3.30 -> 2.99 ms and
# 50.3 -> 35.5 ms (backward 8.0 -> 6.9, 10.4 -> 9.6, 141 -> 124 ms). The partial-tile loop gathers its rows by
# pointer loads (cp.async, 3 buffers in the sm_90 compile; the full-tile loop keeps 2 TMA buffers, 198 registers
# against the plain kernel's 168). Measured and dropped: finding each row's tile with a (64, 8) compare per
# iteration (1.3B forward 2.55 ms), unmasked gathers (within 1%), launch tables other than (4, 3)
# (benchmarks/attention.py --sweep: 2.03 - 4.43 ms against 2.01).
PACK_PARTIAL_TILES_DEFAULT = True

# Pre-offset k2q entries (lean_index, seed 002's third change) on every architecture: on the H200 (torch 2.11,
# triton 3.6; benchmarks/rocm_ab.py --interleave 7, medians of per-round ratios) the fine stage's forward+backward
# took 1.012x / 1.012x / 1.027x less time at the 1.3B / 5B / 14B shapes, the forward the same (it does not use k2q).
LEAN_INDEX_DEFAULT = True

# ------------------------------------------------------------------------------------------------- profiles
# `rocm-vsa` (seed 002): the architecture's defaults above plus what of the seed's changes they do not hold yet.
# The first (AMD launch tables and options) is every AMD architecture's default, and the third (lean_index) every
# architecture's: `vsa` has them too. The second (one_pass_loads "streaming": the `nt` bit on AMD) is `rocm-vsa`'s on
# AMD only, untimed there. On NVIDIA it changes no instruction on sm_90 (the pipelined loads carry no hint) and the
# H200 timings agreed (benchmarks/rocm_ab.py; BENCHMARKS.md), so it is left out there: `rocm-vsa` on CUDA is `vsa`,
# never slower. "cpu": the interpreter runs the hinted kernels (the hints do nothing there).
PROFILES = ("vsa", "rocm-vsa")
ROCM_VSA_CHANGES = MappingProxyType({
    "rocm-cdna3": MappingProxyType({"one_pass_loads": "streaming"}),
    "rocm-cdna4": MappingProxyType({"one_pass_loads": "streaming"}),
    "rocm": MappingProxyType({"one_pass_loads": "streaming"}),
    "cpu": MappingProxyType({"one_pass_loads": "streaming"}),
})


@dataclasses.dataclass(frozen=True)
class KernelTuning:
    """How the Triton attention kernels run on one device, for one head dim; a frozen, validated value.

    Attributes:
        tma_loads: fetch the block-sparse loops' 64-token tiles by TMA where the layout allows it
            (`bsa_primitives.use_tma` keeps the layout and Triton-version checks); False: pointer loads.
        pack_partial_tiles: the forward and dQ loops walk tile plans (partial tiles' tokens packed 64 to an
            iteration) on layouts with partial tiles; False: one selected tile per iteration.
        bwd_two_streams: the backward's dQ launches run on a second CUDA stream beside dK/dV (CUDA only; ignored
            on other devices and under the interpreter).
        score_precision: tl.dot input precision of the coarse stage's score GEMM, one of `SCORE_PRECISIONS`.
        fwd_launch, bwd_dq_launch, bwd_dkdv_launch: the forward, dQ and dK/dV kernels' launches, one
            (block, num_warps, num_stages) per tile-size class: blocks powers of two in [16, 64], strictly
            ascending, the last 64; num_warps a power of two in [1, 32]; num_stages >= 1. Lists are accepted and
            stored as tuples. They are the row of the head dim the tuning was made for, but any valid launches
            give the same results with any head dim (only the speed differs).
        one_pass_loads: how the loops load the operands they stream once per program, one of `ONE_PASS_LOADS`
            ("cached", "evict_first", "streaming"; seed 002's evict-first hints).
        lean_index: the leaner index traversal (seed 002's third change): the dK/dV loop walks k2q entries that
            carry their query tile's start row and length ((start << 7) | length,
            `k2q.build_k2q_triton(tile_offsets=...)`): one load per iteration where the plain entries (tile ids)
            need three, two of them dependent (tile id, then its two offsets). (The forward and dQ loops already
            walk pre-offset tile plans; reading a pack's group words as one broadcast vector load instead of eight
            scalar loads made the H200 forward 7% slower and was dropped.)
        fwd_warp_specialized: the forward runs on the warp-specialized Gluon kernel (`bsa_forward_ws`: a producer
            warp for the TMA loads, a consumer warpgroup for the arithmetic; no tile plans) where it can run
            (`bsa_forward_ws.ws_unsupported`: sm_90, bf16 / fp16, D 64 or 128, Gluon), else on the pipelined one.
            Off in every default: the `vsa` backend turns it on per call where it measured faster
            (`bsa_forward_ws.ws_forward_pays`: it depends on the cubes, which a tuning does not know).
        hip_fwd, hip_dq, hip_dkdv: AMD compiler options of the three kernels, each () (not on HIP: nothing is
            passed) or (waves_per_eu >= 0, matrix_instr_nonkdim in {0, 16, 32}, kpack in {1, 2}) for every size
            class; all three or none. A launcher refuses them on an NVIDIA device (Triton's NVIDIA backend does
            not know the names); on a CPU (the interpreter, the AMD build check) they are passed on.

    Raises:
        ValueError: naming the field, when a switch is not a bool, score_precision or one_pass_loads is unknown,
            a launch table or HIP option triple is malformed, or only some kernels have HIP options.
    """

    tma_loads: bool
    pack_partial_tiles: bool
    bwd_two_streams: bool
    score_precision: str
    fwd_launch: Launch
    bwd_dq_launch: Launch
    bwd_dkdv_launch: Launch
    one_pass_loads: str = "cached"
    lean_index: bool = False
    fwd_warp_specialized: bool = False
    hip_fwd: HipOptions = ()
    hip_dq: HipOptions = ()
    hip_dkdv: HipOptions = ()

    def __post_init__(self) -> None:
        for name in ("tma_loads", "pack_partial_tiles", "bwd_two_streams", "lean_index", "fwd_warp_specialized"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"KernelTuning.{name} must be a bool, got {getattr(self, name)!r}")
        if self.score_precision not in SCORE_PRECISIONS:
            raise ValueError(f"KernelTuning.score_precision must be one of {SCORE_PRECISIONS}, "
                             f"got {self.score_precision!r}")
        if self.one_pass_loads not in ONE_PASS_LOADS:
            raise ValueError(f"KernelTuning.one_pass_loads must be one of {ONE_PASS_LOADS}, "
                             f"got {self.one_pass_loads!r}")
        for name in ("fwd_launch", "bwd_dq_launch", "bwd_dkdv_launch"):
            object.__setattr__(self, name, _checked_launch(name, getattr(self, name)))
        for name in ("hip_fwd", "hip_dq", "hip_dkdv"):
            object.__setattr__(self, name, _checked_hip(name, getattr(self, name)))
        if len({bool(self.hip_fwd), bool(self.hip_dq), bool(self.hip_dkdv)}) > 1:
            raise ValueError("KernelTuning.hip_fwd, hip_dq and hip_dkdv: all three HIP option triples or none, got "
                             f"{self.hip_fwd!r}, {self.hip_dq!r}, {self.hip_dkdv!r}")

    @classmethod
    def from_op_args(cls, tma_loads: bool, pack_partial_tiles: bool, bwd_two_streams: bool, score_precision: str,
                     fwd_launch: list[int], bwd_dq_launch: list[int], bwd_dkdv_launch: list[int],
                     one_pass_loads: str = "cached", lean_index: bool = False,
                     hip_options: list[int] = (), fwd_warp_specialized: bool = False) -> KernelTuning:
        """The inverse of `op_args` (inside the custom ops). Raises ValueError as the constructor (a flat list
        whose length is not a multiple of 3, or HIP options neither empty nor 9 ints, included)."""
        if len(hip_options) not in (0, 9):
            raise ValueError(f"KernelTuning: flat HIP options hold 0 or 9 ints, got {list(hip_options)}")
        hip = [tuple(hip_options[i:i + 3]) for i in range(0, len(hip_options), 3)] or [(), (), ()]
        launches = []
        for name, flat in (("fwd_launch", fwd_launch), ("bwd_dq_launch", bwd_dq_launch),
                           ("bwd_dkdv_launch", bwd_dkdv_launch)):
            if len(flat) % 3:
                raise ValueError(f"KernelTuning.{name}: a flat launch list holds triples, got {list(flat)}")
            launches.append(tuple(tuple(flat[i:i + 3]) for i in range(0, len(flat), 3)))
        return cls(bool(tma_loads), bool(pack_partial_tiles), bool(bwd_two_streams), score_precision, *launches,
                   one_pass_loads=one_pass_loads, lean_index=bool(lean_index),
                   fwd_warp_specialized=bool(fwd_warp_specialized), hip_fwd=hip[0], hip_dq=hip[1], hip_dkdv=hip[2])


def op_args(tuning: KernelTuning) -> tuple:
    """The tuning as the plain arguments of the `torch.library` custom ops (`OP_SCHEMA_ARGS`): three bools, a str,
    three flat int lists (block, num_warps, num_stages, block, ...), a str, a bool and the HIP options as one flat
    int list (empty, or the three kernels' triples), a bool. A function rather than a method: dynamo traces it on the
    constant that `default_tuning` returns (a method call on that constant would not trace)."""
    hip = [x for opts in (tuning.hip_fwd, tuning.hip_dq, tuning.hip_dkdv) for x in opts]
    return (tuning.tma_loads, tuning.pack_partial_tiles, tuning.bwd_two_streams, tuning.score_precision,
            [x for entry in tuning.fwd_launch for x in entry], [x for entry in tuning.bwd_dq_launch for x in entry],
            [x for entry in tuning.bwd_dkdv_launch for x in entry], tuning.one_pass_loads, tuning.lean_index,
            hip if len(hip) == 9 else [], tuning.fwd_warp_specialized)


# The tuning's part of the custom ops' schemas, in `op_args` order.
OP_SCHEMA_ARGS = ("bool tma_loads, bool pack_partial_tiles, bool bwd_two_streams, str score_precision, "
                  "int[] fwd_launch, int[] bwd_dq_launch, int[] bwd_dkdv_launch, str one_pass_loads, "
                  "bool lean_index, int[] hip_options, bool fwd_warp_specialized")


def _checked_launch(name: str, launch) -> Launch:
    """launch as a tuple of int triples, or ValueError naming the field."""
    try:
        entries = tuple(tuple(entry) for entry in launch)
    except TypeError:
        raise ValueError(f"KernelTuning.{name} must be a sequence of (block, num_warps, num_stages), "
                         f"got {launch!r}") from None
    ok = bool(entries) and all(len(e) == 3 and all(isinstance(x, int) and not isinstance(x, bool) for x in e)
                               for e in entries)
    if ok:
        blocks = [e[0] for e in entries]
        ok = (blocks[-1] == TILE and all(16 <= blk <= TILE and not blk & (blk - 1) for blk in blocks)
              and all(a < c for a, c in zip(blocks, blocks[1:]))
              and all(1 <= w <= 32 and not w & (w - 1) and s >= 1 for _, w, s in entries))
    if not ok:
        raise ValueError(f"KernelTuning.{name} must be (block, num_warps, num_stages) triples with blocks powers of "
                         f"two in [16, {TILE}] ascending and ending with {TILE}, num_warps a power of two in "
                         f"[1, 32] and num_stages >= 1; got {launch!r}")
    return entries


def _checked_hip(name: str, opts) -> HipOptions:
    """opts as () or a (waves_per_eu, matrix_instr_nonkdim, kpack) int triple, or ValueError naming the field."""
    try:
        t = tuple(opts)
    except TypeError:
        t = None
    ok = t == () or (t is not None and len(t) == 3 and all(isinstance(x, int) and not isinstance(x, bool) for x in t)
                     and 0 <= t[0] <= 8 and t[1] in (0, 16, 32) and t[2] in (1, 2))
    if not ok:
        raise ValueError(f"KernelTuning.{name} must be () or (waves_per_eu in [0, 8], matrix_instr_nonkdim in "
                         f"{{0, 16, 32}}, kpack in {{1, 2}}); got {opts!r}")
    return t


def hip_kwargs(opts: HipOptions, device: torch.device) -> dict:
    """A kernel launch's AMD compiler options from a tuning's hip_* triple ({} for ()), for a launch on `device`.

    Raises:
        ValueError: options given for an NVIDIA device (a CUDA device of a torch built without ROCm).
    """
    if opts and device.type == "cuda" and torch.version.hip is None and not interpreting():
        raise ValueError(f"KernelTuning.hip_*: AMD compiler options {dict(zip(HIP_OPTION_NAMES, opts))} cannot "
                         f"launch on an NVIDIA GPU; use kernel_tuning(device, head_dim) for {device}")
    return dict(zip(HIP_OPTION_NAMES, opts))


def load_hints(tuning: KernelTuning) -> dict:
    """The kernels' EVICT / CACHE constexprs (tl.load's eviction_policy and cache_modifier) for the one-pass loads
    of `tuning.one_pass_loads`."""
    return {"cached": dict(EVICT="", CACHE=""), "evict_first": dict(EVICT="evict_first", CACHE=""),
            "streaming": dict(EVICT="", CACHE=".cg")}[tuning.one_pass_loads]


def interpreting() -> bool:
    """True under the Triton CPU interpreter (TRITON_INTERPRET=1, read at call time), where tl.dot on bf16 /
    fp16 is wrong."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def block_d(head_dim: int) -> int:
    """BLOCK_D of a head dim: the next power of two, at least 16 (the kernels' padded head dim)."""
    return max(16, 1 << (max(1, head_dim) - 1).bit_length())


def device_arch(device: torch.device) -> str:
    """The `ARCH_DEFAULTS` key of a device (module docstring); "cpu" for anything under the interpreter and for
    device types other than cuda."""
    if device.type != "cuda" or interpreting():
        return "cpu"
    major, minor = torch.cuda.get_device_capability(device)
    return _arch_of(major, minor, torch.version.hip is not None)


@functools.cache
def _arch_of(major: int, minor: int, hip: bool) -> str:
    if hip:
        return {(9, 4): "rocm-cdna3", (9, 5): "rocm-cdna4"}.get((major, minor), "rocm")
    if major == 9:
        return "sm90"
    if major == 10:
        return "sm100"
    return "nvidia" if major >= 8 else "nvidia-pre-sm80"


def kernel_tuning(device: torch.device | str, head_dim: int, profile: str = "vsa") -> KernelTuning:
    """The default tuning of a device, head dim and backend profile: `ARCH_DEFAULTS[device_arch(device)]` with the
    launch tables' row for block_d(head_dim) (on AMD the HIP tables and options), and for profile "rocm-vsa" the
    architecture's `ROCM_VSA_CHANGES`. Cached on (arch, BLOCK_D, profile) (the arch itself on the device's
    capability), so a call costs a capability lookup and two cache hits.

    Args:
        device: where the kernels run (a torch.device or its string); under TRITON_INTERPRET=1 always "cpu".
        head_dim: D, 1 <= D <= 256.
        profile: "vsa" or "rocm-vsa" (`PROFILES`).

    Returns:
        The KernelTuning (the same object for the same arch, BLOCK_D and profile).

    Raises:
        ValueError: head_dim outside [1, 256], or an unknown profile.
    """
    return arch_tuning(device_arch(torch.device(device)), head_dim, profile)


def arch_tuning(arch: str, head_dim: int, profile: str = "vsa") -> KernelTuning:
    """`kernel_tuning` for an `ARCH_DEFAULTS` key instead of a device (e.g. "rocm-cdna3" on a machine without that
    GPU: the AMD build check compiles with it). Raises ValueError for an unknown arch, head dim or profile."""
    if arch not in ARCH_DEFAULTS:
        raise ValueError(f"arch must be one of {tuple(ARCH_DEFAULTS)}, got {arch!r}")
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or not 1 <= head_dim <= BLOCK_DS[-1]:
        raise ValueError(f"head_dim must be an int in [1, {BLOCK_DS[-1]}], got {head_dim!r}")
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    return _tuning_for(arch, block_d(head_dim), profile)


@functools.cache
def _tuning_for(arch: str, blk_d: int, profile: str = "vsa") -> KernelTuning:
    tma, two_streams, precision = ARCH_DEFAULTS[arch]
    if arch in HIP_OPTIONS:
        launch = HIP_WIDE_LAUNCH if blk_d > 128 else HIP_LAUNCH[arch]
        hip = HIP_WIDE_OPTIONS if blk_d > 128 else HIP_OPTIONS[arch]
    else:
        launch, hip = (FWD_LAUNCH[blk_d], BWD_DQ_LAUNCH[blk_d], BWD_DKDV_LAUNCH[blk_d]), ((), (), ())
    changes = ROCM_VSA_CHANGES.get(arch, {}) if profile == "rocm-vsa" else {}
    return KernelTuning(tma_loads=tma, pack_partial_tiles=PACK_PARTIAL_TILES_DEFAULT, bwd_two_streams=two_streams,
                        score_precision=precision, fwd_launch=launch[0], bwd_dq_launch=launch[1],
                        bwd_dkdv_launch=launch[2], lean_index=LEAN_INDEX_DEFAULT, hip_fwd=hip[0], hip_dq=hip[1],
                        hip_dkdv=hip[2], **changes)


@torch.compiler.assume_constant_result
def default_tuning(device: torch.device, head_dim: int, profile: str = "vsa") -> KernelTuning:
    """`kernel_tuning` for the launchers' `tuning=None`: torch.compile calls it once while tracing and keeps the
    result as a constant (no trace through the caches, no graph break)."""
    return kernel_tuning(device, head_dim, profile)
