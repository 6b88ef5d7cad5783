"""Attention kernels and their eager references; installed as `vsagen.kernels` (no diffusers imports here).

Shape vocabulary: B batch, S tokens (T*Hl*Wl latent tokens after patchify, tile order), H heads, D head dim,
(T, Hl, Wl) latent grid, Q_TILES / KV_TILES tile counts, K top-k.

Contents:
* `reference.py`: the eager PyTorch reference of VSA, both the CPU path of the `vsa` backend and the oracle of
  the Triton kernels' tests, with the torch oracles of the index kernels: `build_k2q` (transpose of q2k lists)
  and `tile_plan_reference` (no triton import).
* `tuning.py`: `KernelTuning`, the frozen value that says how the kernels run (TMA or pointer loads, packed tile
  plans, a second backward stream, the coarse score precision, launch tables, one-pass load hints, the lean index
  walk, AMD compiler options), and `kernel_tuning(device, head_dim, profile)`, the defaults per architecture, head
  dim and backend profile ("vsa", "rocm-vsa"); every launcher takes `tuning=` (None: the "vsa" defaults).
  No triton import.
* `block_sparse_attn.py`: Triton block-sparse flash attention over tiles (VSA's fine stage), forward and
  backward, as the autograd-aware custom op behind `block_sparse_attention`; re-exports the raw launchers
  `bsa_fwd` (`bsa_forward.py`) / `bsa_bwd` (`bsa_backward.py`), whose shared jit helpers, input checks and TMA
  helpers are in `bsa_primitives.py`.
* `bsa_forward_ws.py`: `bsa_fwd_ws`, the same forward as a warp-specialized Gluon kernel for sm_90 (a producer
  warp for the TMA loads, a consumer warpgroup for the arithmetic), which `bsa_fwd` runs where its tuning's
  `fwd_warp_specialized` asks and the kernel can run; `vsa` asks where it measured faster (`ws_forward_pays`).
  `have_gluon` checks the Gluon calls it makes (not Triton's version); a compile that fails anyway falls back to the
  pipelined kernel with a run note.
* `runtime_notes.py`: `runtime_notes()`, the notes kernels gave while running (e.g. that fallback), once per
  process; the run layer says them with a run's notes. No triton import.
* `query_groups.py`: `build_query_groups`, the host-side table of query groups (tiles with equal key lists share a
  program of 64 / 128 query rows, partial query tiles packed) that `block_sparse_attention_grouped` (the forward and
  dQ over groups, the dK/dV loop over packed plans; `sparse-vdit`'s static patterns) runs. No triton import.
* `k2q.py`: `build_k2q_triton`, the q2k transpose in two Triton launches: the one the backward uses.
* `tile_expand.py`: `expand_to_kernel_tiles`, a selection over VSA's larger cubes (128 / 256 tokens) as the same
  selection over their 64-token kernel tiles, the lists the block-sparse kernels take (plain torch: the reference).
* `tile_expand_triton.py`: `expand_to_kernel_tiles_triton`, the same expansion in one Triton launch: the one the
  Triton paths use (`attention.shared.kernel_lists`).
* `tile_plan.py`: `build_tile_plan`, the order in which the forward and dQ loops visit a q2k row (full tiles
  whole, then the partial tiles' tokens packed 64 to an iteration).
* `qk_norm_rope.py`: the fused RMSNorm + RoPE prologue of the attention processor.
* `coarse.py`: Triton coarse stage: `coarse_stage` (fused tile pooling, tile scores, top-k into an int32 q2k
  table; the custom op `vsagen::coarse_stage` under torch.compile, so the graph does not break) and its parts
  `pool_qk`, `tile_mean_pool_triton`, `tile_scores_triton`, `top_k_tiles`, `coarse_output`; its kernels, their
  launchers and launch configuration are in `coarse_triton.py`.
* `linear_branch.py`: SLA*'s global linear-attention branch (`sla-star`), fused: `linear_branch_add` (the sums in
  one pass over K and V, then phi(Q), the division, the projection and the add to the sparse output), its
  backward `linear_branch_backward` (which can add into another part's gradients in place), `kv_sums`,
  `LinearLaunch` (the launch parameters, a value).
* `linear_marginal.py`: the same branch in the marginal scope (over the key tiles a query tile did not select:
  per-tile sums, their sums over each query tile's unselected tiles as one GEMM over the tile grid):
  `marginal_branch_add`, its backward `marginal_branch_backward`, `unselected_map`.
* `amd_build.py`: the AMD build check: every kernel `rocm-vsa` launches compiled for gfx942 / gfx950 on any machine
  (Triton's launch replaced by a compile for the target), with each compiled kernel's registers, LDS, spills,
  occupancy and `nt` (evict-first) loads read from its AMDGCN (`python -m vsagen.kernels.amd_build`).
* `fa4_block_sparse.py`: `fa4_block_sparse_attention`, VSA's fine stage for tile volumes 128 / 256 on
  FlashAttention-4's block-sparse kernels (optional: `pip install 'vsagen[fa4]'`; sm90 / sm100), with its parts:
  the cube-to-FA4 block lists (`fa4_block_sparse_index`; `whole_cube_index` where every cube is whole), cube
  padding, the key-slot `mask_mod`, and `fa4_unavailable` (why it cannot run here). `flash_attn` is imported on
  first call only.
* `sage.py`: the 8-bit fine stage's numerics (SageAttention2 / TurboDiffusion's SageSLA, cited by file and line):
  K smoothing, int8 q / k per token group, fp8 e4m3 v per channel (`quantize_operands`), and the float reference of
  the attention over them (`sage_fine_reference`: the tests' oracle and the CPU path of `precision=int8`). No
  triton import.
* `sage_attn.py`: `sage_block_sparse_attention` / `bsa_fwd_sage`, those formulas on the block-sparse forward
  kernel (its SAGE switch: int8 Q.K^T, fp8 P.V with V stored transposed, one 64-token slot per kernel tile),
  forward only (the custom op `vsagen::sage_block_sparse_attn` under torch.compile).
* `sla_star_attn.py`: `sla_star_attention`, VSA's fine stage and the linear branch (either scope) as one custom op
  with gradients, so the backward sums the two parts' dQ / dK / dV in place.
* `int8_block_gemm.py`: `int8_block_gemm`, an int8 GEMM with one float scale per 128 x 128 block of each operand
  (TurboDiffusion's W8A8 linear; `vsagen.quant.int8_linear` runs it), with its launch `GemmConfig`s.

The Triton names are imported on first use (PEP 562 `__getattr__`), so importing this package, e.g. for the
references or the tuning, needs no triton (a Linux-only dependency) and registers no custom op. No module here
reads the environment at import (TRITON_INTERPRET is read at call time).
"""

import importlib

from .reference import (
    block_map_from_q2k,
    block_sparse_attention_reference,
    build_k2q,
    coarse_attention,
    select_top_k,
    tile_mean_pool,
    tile_plan_reference,
    tile_scores,
    top_k_from_sparsity,
    top_k_from_tokens,
    vsa_reference,
)
from .query_groups import build_query_groups
from .tuning import KernelTuning, kernel_tuning

# Lazily imported public names -> their module.
_TRITON_EXPORTS = {
    "block_sparse_attention": "block_sparse_attn",
    "block_sparse_attention_grouped": "block_sparse_attn",
    "bsa_bwd": "block_sparse_attn",
    "bsa_fwd": "block_sparse_attn",
    "build_k2q_triton": "k2q",
    "build_tile_plan": "tile_plan",
    "CoarseResult": "coarse",
    "coarse_output": "coarse",
    "coarse_stage": "coarse",
    "pool_qk": "coarse",
    "tile_mean_pool_triton": "coarse",
    "tile_scores_triton": "coarse",
    "top_k_tiles": "coarse",
    "kv_sums": "linear_branch",
    "linear_branch_add": "linear_branch",
    "LinearLaunch": "linear_branch",
    "marginal_branch_add": "linear_marginal",
    "sla_star_attention": "sla_star_attn",
    "int8_block_gemm": "int8_block_gemm",
}


def __getattr__(name: str):
    if name in _TRITON_EXPORTS:
        return getattr(importlib.import_module(f".{_TRITON_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CoarseResult",
    "KernelTuning",
    "LinearLaunch",
    "block_map_from_q2k",
    "block_sparse_attention",
    "block_sparse_attention_grouped",
    "block_sparse_attention_reference",
    "bsa_bwd",
    "bsa_fwd",
    "build_k2q",
    "build_k2q_triton",
    "build_query_groups",
    "build_tile_plan",
    "coarse_attention",
    "coarse_output",
    "coarse_stage",
    "int8_block_gemm",
    "kernel_tuning",
    "kv_sums",
    "linear_branch_add",
    "marginal_branch_add",
    "pool_qk",
    "select_top_k",
    "sla_star_attention",
    "tile_mean_pool",
    "tile_mean_pool_triton",
    "tile_plan_reference",
    "tile_scores",
    "tile_scores_triton",
    "top_k_from_sparsity",
    "top_k_from_tokens",
    "top_k_tiles",
    "vsa_reference",
]
