"""Attention kernels and their eager references; installed as `vsagen.kernels` (no diffusers imports here).

Shape vocabulary: B batch, S tokens (T*Hl*Wl latent tokens after patchify, tile order), H heads, D head dim,
(T, Hl, Wl) latent grid, Q_TILES / KV_TILES tile counts, K top-k.

Contents:
* `reference.py`: the eager PyTorch reference of VSA, both the CPU path of the `vsa` backend and the oracle of
  the Triton kernels' tests (no triton import).
* `block_sparse_attn.py`: Triton block-sparse flash attention over tiles (VSA's fine stage), forward and
  backward, as the autograd-aware custom op behind `block_sparse_attention`; `build_k2q` transposes q2k lists
  in torch (the oracle of `k2q.py`); `bsa_fwd` / `bsa_bwd` are the raw launchers.
* `k2q.py`: `build_k2q_triton`, the same transpose in two Triton launches: the one the backward uses.
* `tile_plan.py`: `build_tile_plan`, the order in which the forward and dQ loops visit a q2k row (full tiles
  whole, then the partial tiles' tokens packed 64 to an iteration); `tile_plan_reference` is its torch oracle.
* `coarse.py`: Triton coarse stage: `coarse_stage` (fused tile pooling, tile scores, top-k into an int32 q2k
  table; the custom op `vsagen::coarse_stage` under torch.compile, so the graph does not break) and its parts
  `pool_qk`, `tile_mean_pool_triton`, `tile_scores_triton`, `top_k_tiles`, `coarse_output`.

The Triton names are imported on first use (PEP 562 `__getattr__`), so importing this package, e.g. for the
references, needs no triton (a Linux-only dependency) and registers no custom op.
"""

import importlib

from .reference import (
    block_map_from_q2k,
    block_sparse_attention_reference,
    coarse_attention,
    select_top_k,
    tile_mean_pool,
    tile_scores,
    top_k_from_sparsity,
    vsa_reference,
)

# Lazily imported public names -> their module.
_TRITON_EXPORTS = {
    "block_sparse_attention": "block_sparse_attn",
    "bsa_bwd": "block_sparse_attn",
    "bsa_fwd": "block_sparse_attn",
    "build_k2q": "block_sparse_attn",
    "build_k2q_triton": "k2q",
    "build_tile_plan": "tile_plan",
    "tile_plan_reference": "tile_plan",
    "CoarseResult": "coarse",
    "coarse_output": "coarse",
    "coarse_stage": "coarse",
    "pool_qk": "coarse",
    "tile_mean_pool_triton": "coarse",
    "tile_scores_triton": "coarse",
    "top_k_tiles": "coarse",
}


def __getattr__(name: str):
    if name in _TRITON_EXPORTS:
        return getattr(importlib.import_module(f".{_TRITON_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CoarseResult",
    "block_map_from_q2k",
    "block_sparse_attention",
    "block_sparse_attention_reference",
    "bsa_bwd",
    "bsa_fwd",
    "build_k2q",
    "build_k2q_triton",
    "build_tile_plan",
    "coarse_attention",
    "coarse_output",
    "coarse_stage",
    "pool_qk",
    "select_top_k",
    "tile_mean_pool",
    "tile_mean_pool_triton",
    "tile_plan_reference",
    "tile_scores",
    "tile_scores_triton",
    "top_k_from_sparsity",
    "top_k_tiles",
    "vsa_reference",
]
